#!/bin/bash
# An NVMe device error through ztd: ZT_FAULT_NVME (offload/nvme_store.h) makes one write (job
# with params and optimizer nvme), then one read (optimizer nvme), of the job's NVMe store fail
# with EIO mid-run. The job fails naming the file and "Input/output error"; its last checkpoint
# is bitwise that of the same training without offload and loads as a model's init; ztd serves
# the next jobs; the job's NVMe directory is removed.
. "$(dirname "$0")/lib.sh"

NVME="$ZT_TMP/nvme"
mkdir -p "$NVME"
make_tokens "$ZT_TMP/gpl.zt"

# The tiny gpt of lib.sh has 4 units, so 12 NVMe files (master, exp_avg, exp_avg_sq of each).
# The job's start writes each once; every step reads and writes each once; a checkpoint reads
# each once. Request 101 of a kind is then the 5th of its kind in step 8, after the checkpoint
# at step 5: 12 + 7 * 12 writes before it, or 7 * 12 + 12 reads.
N=101
spec "$ZT_TMP/base.json" "$ZT_TMP/gpl.zt" 20

# The write fault with the updates overlapping the backward (grad_clip 0), the read fault with
# them after it (clipping): the two paths of the step that report an update's failure.
for kind in write read; do
  if [ "$kind" = write ]; then
    off='{"params": "nvme", "optimizer": "nvme"}' clip=0
  else
    off='{"optimizer": "nvme"}' clip=1
  fi
  # $kind.json: the job; ref-$kind.json: its first 5 steps without offload.
  python3 - "$ZT_TMP" "$kind" "$off" "$clip" <<'PY'
import json, sys
d, kind, off, clip = sys.argv[1:5]
s = json.load(open(d + "/base.json"))
s["train"]["grad_clip"] = float(clip)
s["checkpoint"] = {"every": 5, "keep": 3}
ref = json.loads(json.dumps(s))
ref["train"]["steps"] = 5
json.dump(ref, open("%s/ref-%s.json" % (d, kind), "w"))
s["offload"] = json.loads(off)
json.dump(s, open("%s/%s.json" % (d, kind), "w"))
PY
  # the cpu backend everywhere: the fault counts assume its I/O pattern (the step's NVMe traffic
  # is the same on cuda; tests/gpu covers the GPU side of offload)
  ZT_FAULT_NVME="eio:$kind:$N" start_ztd --backend cpu --nvme-dir "$NVME"
  job=$(new_job "$ZT_TMP/$kind.json") || exit 1
  wait_end "$job" failed
  err=$(ztctl --json show "$job" | json_get error)
  case "$err" in
    "step 8: "*"$NVME/ztd-$job."*"/zt-offload."*": $kind of "*"Input/output error (injected by ZT_FAULT_NVME)"*) ;;
    *) fail "$kind fault: the error does not name the file and the cause: $err" ;;
  esac
  echo "$kind fault: $job failed: $err"
  grep -q "ZT_FAULT_NVME=eio:$kind:$N: $kind request $N will fail" "$ZTD_LOG" ||
    fail "no warning of the armed fault in the daemon's log"
  [ "$(ls "$STATE/jobs/$job/checkpoints")" = step-00000005 ] ||
    fail "job $job: checkpoints $(ls "$STATE/jobs/$job/checkpoints")"
  [ -z "$(ls -A "$NVME")" ] || fail "files left in nvme_dir: $(find "$NVME")"

  # ztd serves on: the same training without offload (no NVMe store, no fault) checkpoints the
  # same bytes at step 5, and a job initialised from the failed job's checkpoint runs.
  ref=$(new_job "$ZT_TMP/ref-$kind.json") || exit 1
  wait_end "$ref" done
  for f in model.safetensors optimizer.safetensors; do
    cmp "$STATE/jobs/$ref/checkpoints/step-00000005/$f" "$STATE/jobs/$job/checkpoints/step-00000005/$f" ||
      fail "$kind fault: $f of the failed job's checkpoint differs from the run without offload"
  done
  python3 - "$ZT_TMP/ref-$kind.json" "$ZT_TMP/init.json" "$STATE/jobs/$job/checkpoints/step-00000005/model.safetensors" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["model"]["init"] = {"safetensors": sys.argv[3]}
s["train"]["steps"] = 2
json.dump(s, open(sys.argv[2], "w"))
PY
  init=$(new_job "$ZT_TMP/init.json") || exit 1
  wait_end "$init" done
  stop_ztd
done
echo "offload_eio: ok"
