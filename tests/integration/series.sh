#!/bin/bash
# A job's series on disk: metrics.jsonl (a line per step, the losses show --json reports) and,
# with "log": {"tensorboard": true}, event files TensorBoard's own reader reads (the tensorboard
# package from PyPI, in ZT_TEST_PYTHON's venv: tools/test.sh) with every scalar of every step; a
# job killed mid-run and resumed from its checkpoint has each step once in both (the steps after
# the checkpoint are trained again); ztctl plot draws the loss curve within 80 columns.
. "$(dirname "$0")/lib.sh"

python_with tensorboard

# check JOB STEPS: metrics.jsonl and the event files against show --json
check() {
  ztctl --json show "$1" >"$ZT_TMP/show.json" || fail "show $1"
  "$PY" - "$STATE/jobs/$1" "$2" "$ZT_TMP/show.json" <<'PY' || fail "the series of $1"
import glob, json, struct, sys
from tensorboard.backend.event_processing import event_accumulator

d, steps, show = sys.argv[1], int(sys.argv[2]), json.load(open(sys.argv[3]))
lines = [json.loads(l) for l in open(d + "/metrics.jsonl")]
assert [l["step"] for l in lines] == list(range(1, steps + 1)), [l["step"] for l in lines]
assert all(l["kind"] == "step" for l in lines)
# the losses show reports (losses.log; libztclient's JSON has 15 significant digits)
assert [float("%.15g" % l["loss"]) for l in lines] == show["losses"], (lines[:2], show["losses"][:2])
for l in lines:
    assert l["tokens"] == 4 * 16 and l["tokens_per_s"] > 0 and 0 < l["mfu"] < 1, l
    assert l["memory"]["device"] > 0 and l["lr"] > 0, l
assert glob.glob(d + "/tb/events.out.tfevents.*"), "no event file"
acc = event_accumulator.EventAccumulator(d + "/tb")
acc.Reload()
tags = set(acc.Tags()["scalars"])
want = {"loss", "lr", "grad_norm", "tokens_per_s", "step_s", "mfu", "memory/device",
        "memory/host_pinned", "memory/nvme"}
assert want <= tags, tags
f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]
for tag, key in [("loss", "loss"), ("lr", "lr"), ("grad_norm", "grad_norm")]:
    ev = acc.Scalars(tag)
    assert [e.step for e in ev] == list(range(1, steps + 1)), (tag, [e.step for e in ev])
    assert [e.value for e in ev] == [f32(l[key]) for l in lines], tag
mem = acc.Scalars("memory/device")
assert [e.value for e in mem] == [f32(l["memory"]["device"]) for l in lines]
print(f"{d}: {steps} steps in metrics.jsonl and in TensorBoard's reader")
PY
}

start_ztd
make_tokens "$ZT_TMP/gpl.zt"
spec "$ZT_TMP/job.json" "$ZT_TMP/gpl.zt" 30 '"log": {"tensorboard": true}'
job=$(submit "$ZT_TMP/job.json")
wait_end "$job" done
check "$job" 30
ztctl --json show "$job" | json_get spec.log.tensorboard | grep -qx True || fail "spec.log not stored"

# the plot: the curve within 80 columns, falling
plot=$(ztctl plot "$job") || fail "plot"
printf '%s\n' "$plot"
[ "$(printf '%s\n' "$plot" | awk '{ if (length($0) > m) m = length($0) } END { print m }')" -le 80 ] ||
  fail "the plot is wider than 80 columns"
[ "$(printf '%s\n' "$plot" | grep -c '\*')" -ge 4 ] || fail "no curve in the plot"
head -n 1 <<<"$plot" | grep -q "^$job tiny: loss over 30 steps" || fail "plot's title"
# the first step's loss is the top row's
printf '%s\n' "$plot" | sed -n 2p | grep -q '|\*' || fail "the curve does not start at the top"
expect_fail 2 "plot takes 1 argument" ztctl plot

# killed after a checkpoint and before the end, resumed: each step once. 1000 steps, so that a
# fast machine is still mid-run when the kill comes.
spec "$ZT_TMP/long.json" "$ZT_TMP/gpl.zt" 1000 '"log": {"tensorboard": true}'
job2=$(submit "$ZT_TMP/long.json")
wait_status "$job2" '"checkpoint_step": [1-9]0,'
ck=$(json_get checkpoint_step <"$STATE/jobs/$job2/status.json")
wait_step "$job2" $((ck + 3))
kill -KILL "$ZTD_PID"
wait "$ZTD_PID" 2>/dev/null
ZTD_PID=
grep -q '"state": "running"' "$STATE/jobs/$job2/status.json" ||
  fail "$job2 was not mid-run at the kill: $(cat "$STATE/jobs/$job2/status.json")"
lines=$(wc -l <"$STATE/jobs/$job2/metrics.jsonl")
[ "$lines" -ge $((ck + 3)) ] || fail "only $lines lines before the kill, checkpoint $ck"
start_ztd
wait_end "$job2" done
check "$job2" 1000
[ "$(ls "$STATE/jobs/$job2/tb" | wc -l)" -ge 2 ] || fail "the resumed run did not start an event file"
stop_ztd
echo "series: ok"
