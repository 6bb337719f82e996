#!/bin/bash
# Jobs of several GPUs on a cuda ztd that owns two (--gpus 0,1), over NCCL: a "parallel":
# {"gpus": 2} job learns at ZeRO stages 1, 2 and 3 with the losses of a one-GPU job with
# grad_accum 2 on the same file (the first bitwise, the next 7 within 1e-5 relative: NCCL adds
# the two GPUs' gradients where one GPU adds two micro-batches, as tests/gpu/test_cuda_dp.c),
# and so do stage 2 with the optimizer on the host and stage 3 with the parameters there too;
# plan gives each GPU's bytes; two one-GPU jobs run side by side while a two-GPU job waits;
# three GPUs are refused. Skips (77) without two GPUs.
. "$(dirname "$0")/lib.sh"

n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "${n:-0}" -lt 2 ]; then
  echo "SKIP: needs 2 GPUs (found ${n:-0})"
  exit 77
fi
start_ztd --backend cuda --gpus 0,1
[ "$(ztctl --json status | json_get backend)" = cuda ] || fail "ztd is not on the cuda backend"
make_tokens "$ZT_TMP/gpl.zt"


pspec "$ZT_TMP/wide.json" 20 1 '{"gpus": 3}'
out=$(ztctl submit "$ZT_TMP/wide.json" 2>&1) && fail "3 GPUs accepted on a 2-GPU daemon"
case "$out" in *EINVAL*"parallel.gpus 3 is more than the 2 GPUs this daemon owns"*) ;;
  *) fail "refusal of 3 GPUs: $out" ;; esac

pspec "$ZT_TMP/ref.json" 20 2 ''
for stage in 1 2 3; do
  pspec "$ZT_TMP/s$stage.json" 20 1 "{\"gpus\": 2, \"zero_stage\": $stage}"
  ztctl --json plan "$ZT_TMP/s$stage.json" | python3 -c '
import json, sys
p = json.loads(sys.stdin.read())
par = p["parallel"]
assert p["backend"] == "cuda" and par["gpus"] == 2 and par["zero_stage"] == int(sys.argv[1]), p
assert len(par["rank_bytes"]) == 2 and p["backend_bytes"] == sum(par["rank_bytes"]), p' "$stage" ||
    fail "plan of stage $stage: $(ztctl --json plan "$ZT_TMP/s$stage.json")"
done

# Offloaded (engine/train/dp/dp.h "Offload"): stage 2 with the optimizer of all but the first
# unit on the host, stage 3 with the parameters on the host too.
python3 - "$ZT_TMP" <<'PY'
import json, sys
for stage, off in ((2, {"optimizer": "host", "gpu_units": 1}),
                   (3, {"optimizer": "host", "params": "host"})):
    s = json.load(open("%s/s%d.json" % (sys.argv[1], stage)))
    s["offload"] = off
    json.dump(s, open("%s/o%d.json" % (sys.argv[1], stage), "w"))
PY

# FIFO on two GPUs: the reference (one GPU) first, then the stages one after the other.
ref=$(new_job "$ZT_TMP/ref.json") || exit 1
stages=()
for s in s1 s2 s3 o2 o3; do
  j=$(new_job "$ZT_TMP/$s.json") || exit 1
  stages+=("$j")
done
for j in "$ref" "${stages[@]}"; do wait_end "$j" done 300; done
grep -q "running on the cuda backend (GPUs 0,1)" "$STATE/jobs/${stages[0]}/log" ||
  fail "log of ${stages[0]}: $(cat "$STATE/jobs/${stages[0]}/log")"
python3 - "$STATE/jobs/$ref/losses.log" "${stages[@]/#/$STATE/jobs/}" <<'PY' || fail "losses of the stages"
import sys
def losses(d):
    return [float(l.split()[1]) for l in open(d if d.endswith(".log") else d + "/losses.log")]
ref = losses(sys.argv[1])
assert len(ref) == 20, ref
for stage, d in zip((1, 2, 3, "2 offloaded", "3 offloaded"), sys.argv[2:]):
    l = losses(d)
    assert len(l) == 20, (stage, l)
    assert l[0] == ref[0], (stage, l[0], ref[0])
    worst = max(abs(a - b) / abs(b) for a, b in zip(l[:8], ref[:8]))
    assert worst <= 1e-5, (stage, worst, l, ref)
    print("stage %s: first loss bitwise, 8 within %.2g of one GPU with grad_accum 2" % (stage, worst))
PY
for j in "$ref" "${stages[@]}"; do check_learned "$j"; done

# Two one-GPU jobs side by side, a two-GPU job queued behind them; cancels release the GPUs.
pspec "$ZT_TMP/one.json" 1000 1 '' stream
pspec "$ZT_TMP/two.json" 1000 1 '{"gpus": 2}' stream
a=$(new_job "$ZT_TMP/one.json") || exit 1
b=$(new_job "$ZT_TMP/one.json") || exit 1
c=$(new_job "$ZT_TMP/two.json") || exit 1
wait_status "$a" '"state": "running"'
wait_status "$b" '"state": "running"'
ztctl --json status | python3 -c '
import json, sys
s = json.loads(sys.stdin.read())
assert [(g["index"], g["job"]) for g in s["gpus"]] == [(0, sys.argv[1]), (1, sys.argv[2])], s
assert s["queue"]["running"] == 2 and s["queue"]["queued"] == 1, s' "$a" "$b" ||
  fail "status with two one-GPU jobs: $(ztctl --json status)"
ztctl cancel "$a" >/dev/null && ztctl cancel "$b" >/dev/null || fail "cancel"
wait_status "$c" '"state": "running"'
ztctl --json show "$c" | python3 -c '
import json, sys
assert json.loads(sys.stdin.read())["gpus"] == [0, 1]' || fail "show $c: $(ztctl --json show "$c")"
ztctl cancel "$c" >/dev/null || fail "cancel $c"
wait_end "$c" cancelled
stop_ztd
echo "parallel_gpu: ok"
