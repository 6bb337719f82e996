#!/bin/bash
# Jobs survive ztd: after a restart finished jobs are listed and export works (a valid
# safetensors file); a file job stopped gracefully mid-run resumes and completes.
. "$(dirname "$0")/lib.sh"

# valid_safetensors FILE: header length, JSON header, and tensors that tile the data exactly.
valid_safetensors() {
  python3 - "$1" <<'PY' || fail "$1 is not a valid safetensors file"
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
data = len(b) - 8 - n
spans = sorted(v["data_offsets"] for k, v in h.items() if k != "__metadata__")
assert spans, "no tensors"
end = 0
for s, e in spans:
    assert s == end and e > s, "gap or overlap at %d" % s
    end = e
assert end == data, "tensors cover %d of %d bytes" % (end, data)
assert all(v["dtype"] == "F32" for k, v in h.items() if k != "__metadata__")
print("safetensors: %d tensors, %d bytes" % (len(spans), data))
PY
}

start_ztd
make_tokens "$ZT_TMP/gpl.zt"
spec "$ZT_TMP/short.json" "$ZT_TMP/gpl.zt" 20
done_job=$(submit "$ZT_TMP/short.json")
wait_state "$done_job" done
# A job long enough to be stopped mid-run: about 1 s on the cpu backend; on a GPU, where 120
# steps of it take about 0.2 s (the time between seeing it run and stopping ztd), 2000 steps.
steps=120
[ "$(ztctl --json status | json_get backend)" = cpu ] || steps=2000
spec "$ZT_TMP/long.json" "$ZT_TMP/gpl.zt" $steps
python3 - "$ZT_TMP/long.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["model"].update(seq_len=32, d_model=64, n_heads=4)
s["train"]["micro_batch"] = 8
json.dump(s, open(sys.argv[1], "w"))
PY
job=$(submit "$ZT_TMP/long.json")
wait_state "$job" running

# Graceful stop mid-run: the running job checkpoints.
before=$(ztctl --json show "$job")
[ "$(printf '%s' "$before" | json_get state)" = running ] || fail "job $job is not running: $before"
stop_ztd
start_ztd
ztctl --json jobs | python3 -c '
import json, sys
jobs = {j["job"]: j for j in json.loads(sys.stdin.read())["jobs"]}
assert sys.argv[1] in jobs and jobs[sys.argv[1]]["state"] == "done", "finished job not listed"
assert sys.argv[2] in jobs, "interrupted job not listed"' "$done_job" "$job" ||
  fail "jobs after restart: $(ztctl --json jobs)"

ztctl export "$done_job" "$ZT_TMP/done.safetensors" >/dev/null || fail "export of $done_job"
valid_safetensors "$ZT_TMP/done.safetensors"

# The interrupted job resumes from its checkpoint and completes all its steps.
wait_state "$job" done
grep -q "$job resumes from" "$ZTD_LOG" || fail "job $job did not resume from a checkpoint"
# The job's own log tells the story: stopped by the shutdown, resumed, done.
for line in "running on the" "by the daemon's shutdown" "resumes from" "done at step $steps"; do
  grep -q "$line" "$STATE/jobs/$job/log" || fail "jobs/$job/log lacks '$line': $(cat "$STATE/jobs/$job/log")"
done
step=$(ztctl --json show "$job" | json_get step)
[ "$step" -eq $steps ] || fail "resumed job ended at step $step, expected $steps"
n=$(ztctl --json show "$job" | python3 -c 'import json, sys; print(len(json.load(sys.stdin)["losses"]))')
[ "$n" -eq $steps ] || fail "resumed job has $n losses, expected one per step ($steps)"
check_learned "$job"
ztctl export "$job" "$ZT_TMP/resumed.safetensors" >/dev/null || fail "export of $job"
valid_safetensors "$ZT_TMP/resumed.safetensors"

# A shutdown request stops ztd as SIGTERM does.
ztctl shutdown >/dev/null || fail "shutdown request"
rc=0
wait "$ZTD_PID" || rc=$?
ZTD_PID=
[ "$rc" -eq 0 ] || fail "ztd exited $rc after a shutdown request"
[ ! -e "$SOCK" ] || fail "socket left after a shutdown request"
echo "restart: ok"
