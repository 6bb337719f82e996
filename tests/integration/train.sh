#!/bin/bash
# Training through ztd: a file job learns; stream jobs learn fed by libztclient and by
# `ztctl submit --data`; a watcher and a submitter work at once; cancel (queued and running).
. "$(dirname "$0")/lib.sh"

mkdir -p "$ZT_TMP/nvme"
start_ztd --nvme-dir "$ZT_TMP/nvme"
make_tokens "$ZT_TMP/gpl.zt"

backend=$(ztctl --json status | json_get backend)
spec "$ZT_TMP/tiny-budget.json" "$ZT_TMP/gpl.zt" 20 \
  '"offload": {"params": "nvme", "optimizer": "nvme", "gpu_budget": 1000, "prefetch": 1}'
# Offload through the daemon (cpu or cuda): a budget too small is refused at submit with the
# numbers; at the smallest budget that fits, params and optimizer state live on NVMe (ztd's
# --nvme-dir), units stream through the budget, and the losses are bitwise those of the same job
# without offload (the CPU AdamW gives the cuda AdamW's bits too).
spec "$ZT_TMP/ref.json" "$ZT_TMP/gpl.zt" 20
out=$(ztctl submit "$ZT_TMP/tiny-budget.json" 2>&1) && fail "a 1000-byte gpu_budget was accepted"
case "$out" in *ENOMEM*"streaming needs at least"*) ;; *) fail "budget refusal: $out" ;; esac
need=$(printf '%s' "$out" | sed -n 's/.*streaming needs at least [^(]* (\([0-9]*\) bytes.*/\1/p')
spec "$ZT_TMP/off.json" "$ZT_TMP/gpl.zt" 20 \
  "\"offload\": {\"params\": \"nvme\", \"optimizer\": \"nvme\", \"gpu_budget\": $need, \"prefetch\": 1}"
# plan sizes without queueing: the same refusal, and for the job that fits its tiers.
out=$(ztctl plan "$ZT_TMP/tiny-budget.json" 2>&1) && fail "plan accepted a 1000-byte gpu_budget"
case "$out" in *ENOMEM*"streaming needs at least "*"($need bytes"*) ;; *) fail "plan refusal: $out" ;; esac
ztctl --json plan "$ZT_TMP/off.json" | python3 -c '
import json, sys
p = json.loads(sys.stdin.read())
o = p["offload"]
assert p["backend"] == sys.argv[2] and p["params"] > 0, p
assert o["device_bytes"] == p["backend_bytes"] == int(sys.argv[1]), p
assert o["host_bytes"] > 0 and o["nvme_bytes"] > 0 and o["units"] > o["gpu_units"] == 0, p
assert o["device_bytes"] == o["act_bytes"] + o["gpu_unit_bytes"] + o["dsum_bytes"] + o["arena_bytes"], p
assert (o["grads"] == "gpu") == (o["dsum_bytes"] > 0) and o["grads"] in ("gpu", "host"), p
assert o["params"] == "nvme" and o["ckpt_every"] == 0 and o["est_step_s"] > 0, p' "$need" "$backend" || fail "plan of the offloaded job: $(ztctl --json plan "$ZT_TMP/off.json")"
# the human form says the same: the device side by part, the tiers, the plan's choices
ztctl plan "$ZT_TMP/off.json" | grep -q "^offload: device .* = activations .* + 0 of [0-9]* units with their optimizer on the device .* + gradient sums .* + streaming arena" ||
  fail "ztctl plan: $(ztctl plan "$ZT_TMP/off.json")"
ztctl plan "$ZT_TMP/off.json" | grep -Eq "parameters between uses on the nvme; the step's gradient sums on the (host|device); activation checkpointing none; estimated .* s/step" ||
  fail "ztctl plan: $(ztctl plan "$ZT_TMP/off.json")"
ztctl plan "$ZT_TMP/off.json" | grep -q "^offload: expected per step: .* to the device, .* to the host, .* of NVMe I/O" ||
  fail "ztctl plan: $(ztctl plan "$ZT_TMP/off.json")"
[ "$(ztctl --json jobs | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["jobs"]))')" = 0 ] ||
  fail "plan queued a job"
ref=$(submit "$ZT_TMP/ref.json")
events=$(ztctl --json submit "$ZT_TMP/off.json" --watch) || fail "offloaded job: $events"
off=$(printf '%s\n' "$events" | head -n 1 | json_get job)
wait_state "$ref" done
# Step events report the tiers: the arena within its budget, NVMe traffic.
printf '%s\n' "$events" | python3 -c '
import json, sys
steps = [e for e in map(json.loads, sys.stdin) if e.get("event") == "step"]
o = steps[-1]["memory"]["offload"]
assert len(steps) == 20 and o["arena_peak"] <= o["arena_budget"], o
assert o["nvme_bytes_read"] > 0 and o["nvme_bytes_written"] > 0 and o["bytes_h2d"] > 0, o
# the timeline of each step: busy fractions of its wall time
t = o["timeline"]
assert t["step_s"] > 0 and 0 < t["compute"] <= 1 and t["nvme"] > 0, t
assert all(0 <= t[k] <= 1 for k in ("h2d", "d2h", "optimizer", "nvme")), t' ||
  fail "offload step events: $events"
python3 - "$(ztctl --json show "$ref")" "$(ztctl --json show "$off")" <<'PY' || fail "offloaded losses differ"
import json, sys
ref, off = (json.loads(a) for a in sys.argv[1:3])
assert ref["losses"] == off["losses"] and len(ref["losses"]) == 20, (ref["losses"], off["losses"])
assert off["spec"]["offload"]["nvme_dir"], off["spec"]
print("offload: 20 losses bitwise equal to the job without offload")
PY
[ -z "$(ls -A "$ZT_TMP/nvme")" ] || fail "the offloaded job left files in --nvme-dir: $(ls "$ZT_TMP/nvme")"

# offload.order unit (an untied llama: its backward unit-major too), streamed within the
# smallest budget with checkpointing: the plan says so, and the losses of 3 micro-batches a
# step are bitwise the job's without offload.
ARCH=llama pspec "$ZT_TMP/um-ref.json" 12 3 ""
ARCH=llama pspec "$ZT_TMP/um.json" 12 3 ""
python3 - "$ZT_TMP/um.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["train"]["activation_checkpointing"] = {"every": 1}
s["offload"] = {"params": "host", "order": "unit", "gpu_budget": 1000}
json.dump(s, open(sys.argv[1], "w"))
PY
out=$(ztctl plan "$ZT_TMP/um.json" 2>&1) && fail "unit-major: a 1000-byte gpu_budget was accepted"
um_need=$(printf '%s' "$out" | sed -n 's/.*streaming needs at least [^(]* (\([0-9]*\) bytes.*/\1/p')
[ -n "$um_need" ] || fail "unit-major budget refusal: $out"
sed -i "s/\"gpu_budget\": 1000/\"gpu_budget\": $um_need/" "$ZT_TMP/um.json"
ztctl --json plan "$ZT_TMP/um.json" | python3 -c '
import json, sys
o = json.loads(sys.stdin.read())["offload"]
assert o["order"] == "unit" and o["ckpt_every"] == 1 and o["params"] == "host", o' ||
  fail "unit-major plan: $(ztctl --json plan "$ZT_TMP/um.json")"
um_ref=$(submit "$ZT_TMP/um-ref.json")
um=$(submit "$ZT_TMP/um.json")
wait_state "$um_ref" done
wait_state "$um" done
python3 - "$(ztctl --json show "$um_ref")" "$(ztctl --json show "$um")" <<'PY' || fail "unit-major losses differ"
import json, sys
ref, um = (json.loads(a) for a in sys.argv[1:3])
assert ref["losses"] == um["losses"] and len(ref["losses"]) == 12, (ref["losses"], um["losses"])
print("offload.order unit: 12 losses bitwise equal to the job without offload")
PY

# Precisions: on cuda, bf16 and fp16 jobs learn, with activation checkpointing on and off; on
# cpu they are refused at submit, naming the field.
for prec in bf16 fp16; do
  for every in 0 1; do
    spec "$ZT_TMP/$prec-$every.json" "$ZT_TMP/gpl.zt" 40
    python3 - "$ZT_TMP/$prec-$every.json" "$prec" "$every" <<'PY'
import json, sys
path, prec, every = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = json.load(open(path))
s["train"]["precision"] = prec
s["train"]["activation_checkpointing"] = {"every": every}
json.dump(s, open(path, "w"))
PY
    if [ "$backend" = cuda ]; then
      pjob=$(submit "$ZT_TMP/$prec-$every.json")
      wait_state "$pjob" done
      check_learned "$pjob"
    else
      out=$(ztctl submit "$ZT_TMP/$prec-$every.json" 2>&1) && fail "$prec accepted on $backend"
      case "$out" in *train.precision*) ;; *) fail "$prec refusal on $backend: $out" ;; esac
    fi
  done
done

# A file job learns.
spec "$ZT_TMP/file.json" "$ZT_TMP/gpl.zt" 40
job=$(submit "$ZT_TMP/file.json")
# Two clients at once: a watcher of the job while another client submits and reads.
ztctl watch "$job" >"$ZT_TMP/watch.out" 2>&1 &
watcher=$!
spec "$ZT_TMP/file2.json" "$ZT_TMP/gpl.zt" 20
job2=$(submit "$ZT_TMP/file2.json")
ztctl jobs >/dev/null || fail "jobs while a watcher waits"
wait "$watcher" || fail "watch of $job exited non-zero: $(cat "$ZT_TMP/watch.out")"
[ "$(state "$job")" = done ] || fail "job $job is not done after its watch ended"
check_learned "$job"
wait_state "$job2" done

# The encoder architecture trains through the daemon too.
ARCH=encoder spec "$ZT_TMP/enc.json" "$ZT_TMP/gpl.zt" 40
enc=$(submit "$ZT_TMP/enc.json")
wait_state "$enc" done
check_learned "$enc"

# Stream data pushed by a libztclient program.
spec "$ZT_TMP/stream.json" stream 40
"$ZT_TEST_BIN_DIR/stream_push" "$SOCK" "$ZT_TMP/stream.json" "$ZT_TMP/gpl.zt" ||
  fail "stream job through libztclient"

# Stream data pushed by ztctl.
out=$(ztctl --json submit "$ZT_TMP/stream.json" --data "$ZT_TMP/gpl.zt" --wait) ||
  fail "ztctl submit --data --wait: $out"
sjob=$(printf '%s\n' "$out" | job_id_of)
[ -n "$sjob" ] || fail "no job id in: $out"
[ "$(state "$sjob")" = done ] || fail "stream job $sjob is not done"
check_learned "$sjob"

# Cancel: a running job and one queued behind it.
spec "$ZT_TMP/long.json" "$ZT_TMP/gpl.zt" 100000
long=$(submit "$ZT_TMP/long.json")
queued=$(submit "$ZT_TMP/long.json")
wait_state "$long" running
[ "$(state "$queued")" = queued ] || fail "second job is $(state "$queued"), expected queued"
ztctl cancel "$queued" >/dev/null || fail "cancel queued job"
[ "$(state "$queued")" = cancelled ] || fail "queued job not cancelled"
ztctl cancel "$long" >/dev/null || fail "cancel running job"
wait_state "$long" cancelled 30
ztctl cancel "$long" >/dev/null 2>&1 && fail "cancelling a cancelled job succeeded"

ztctl status >/dev/null || fail "status at the end"
stop_ztd
echo "train: ok"
