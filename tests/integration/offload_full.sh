#!/bin/bash
# A full NVMe directory through ztd (offload optimizer nvme, alone and with params nvme).
# The files are reserved in full when a job starts, so a full disk shows:
#   - at submit (and plan): refused with ENOSPC, naming nvme_dir, its free bytes and the bytes
#     the job needs;
#   - at the start of a job queued while there was room: the job fails with that message;
#   - at the start, from the file that cannot be reserved (RLIMIT_FSIZE here): the job fails
#     naming the file, "File too large" and the bytes the whole tier needs;
#   - mid-run only where the reservation is lost: a filesystem without fallocate leaves the files
#     sparse. Simulated by punching holes into the running job's files and filling the disk; a
#     file size limit (RLIMIT_FSIZE lowered on the running ztd) fails the writes the same way.
#     The job fails naming the file and "No space left on device" / "File too large".
# After each failure the job's last checkpoint is bitwise what it was, ztd keeps serving (a job
# initialised from that checkpoint runs to the end), and the job's NVMe directory is gone, as it
# is after a cancelled and after a finished job.
# The disk is a small tmpfs mounted in a private mount namespace (this script re-runs itself in
# one); where mounting is not allowed those parts are skipped. RLIMIT_FSIZE needs prlimit(1).

# Re-run in a private mount namespace (as root, else as root of a new user namespace), before
# lib.sh makes its temp dir: the mount goes away with the namespace.
if [ -z "${ZT_MOUNT_NS:-}" ]; then
  for how in "-m" "-Urm"; do
    if ZT_MOUNT_NS=1 unshare $how --propagation private true 2>/dev/null; then
      ZT_MOUNT_NS=1 exec unshare $how --propagation private "$0" "$@"
    fi
  done
  export ZT_MOUNT_NS=none
fi
. "$(dirname "$0")/lib.sh"

NVME="$ZT_TMP/nvme"
mkdir -p "$NVME"
tmpfs=0
# 1 MiB: room for one job of the tiny model (432 KiB of files) and some.
if [ "$ZT_MOUNT_NS" = 1 ] && mount -t tmpfs -o size=1m tmpfs "$NVME" 2>/dev/null; then
  tmpfs=1
  trap 'umount -l "$NVME"; cleanup' EXIT # lazily: ztd may still hold files there
else
  echo "SKIP (ENOSPC parts): cannot mount a tmpfs here"
fi
fsize=0
if command -v prlimit >/dev/null; then fsize=1; else echo "SKIP (EFBIG parts): no prlimit(1)"; fi
[ "$tmpfs$fsize" != 00 ] || { echo "SKIP: neither a small tmpfs nor RLIMIT_FSIZE can be used here"; exit 77; }

# The tiny job of lib.sh, its offload as given; a stream job unless a token file is given.
offload_spec() { # OUT OFFLOAD_JSON [TOKENS] [STEPS]
  spec "$1" "${3:-stream}" "${4:-100}" "\"offload\": $2"
}
OPT='{"optimizer": "nvme"}'
PARAMS='{"params": "nvme", "optimizer": "nvme"}'
offload_spec "$ZT_TMP/opt.json" "$OPT"
offload_spec "$ZT_TMP/params.json" "$PARAMS"
# With clipping the updates run after the backward, without they overlap it: the two paths of
# the step that report an update's failure.
python3 - "$ZT_TMP/params.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["train"]["grad_clip"] = 1.0
json.dump(s, open(sys.argv[1], "w"))
PY

# nvme_free: bytes available in $NVME; fill BYTES_LEFT: a filler file leaves that many free.
nvme_free() { stat -f -c '%a %S' "$NVME" | awk '{print $1 * $2}'; }
fill() {
  local n=$(($(nvme_free) - $1))
  if [ "$n" -gt 0 ]; then fallocate -l "$n" "$NVME/filler" || fail "fallocate $n bytes in $NVME"; fi
  [ "$(nvme_free)" -eq "$1" ] || fail "$NVME has $(nvme_free) bytes free, wanted $1"
}
# no_job_files: nothing but the filler under $NVME.
no_job_files() {
  local left
  left=$(find "$NVME" -mindepth 1 -not -name filler)
  [ -z "$left" ] || fail "$1: files left in nvme_dir: $left"
}
# ckpt_sum JOB STEP: the checksums of that checkpoint's files.
ckpt_sum() {
  local d="$STATE/jobs/$1/checkpoints/step-$(printf %08d "$2")"
  [ -d "$d" ] || fail "job $1 has no checkpoint at step $2"
  (cd "$d" && sha256sum model.safetensors optimizer.safetensors trainer.json)
}
# run_to_checkpoint SPEC: a stream job fed 10 micro-batches: it checkpoints at step 10 and then
# waits for data. Sets $job and $sums (its checkpoint's checksums).
run_to_checkpoint() {
  job=$(new_job "$1") || exit 1
  "$ZT_TEST_BIN_DIR/push_batches" "$SOCK" "$job" 10 || fail "pushing into $job"
  wait_status "$job" '"checkpoint_step": 10'
  grep -q '"state": "running"' "$STATE/jobs/$job/status.json" || fail "job $job ended at its checkpoint"
  sums=$(ckpt_sum "$job" 10)
}
# fails_mid_run WHAT: one more micro-batch fails the job at step 11: the message names a file
# of the job's NVMe directory and WHAT; the checkpoint is unchanged; the directory is removed.
fails_mid_run() {
  "$ZT_TEST_BIN_DIR/push_batches" "$SOCK" "$job" 1 10 || fail "pushing into $job"
  wait_end "$job" failed
  local err
  err=$(ztctl --json show "$job" | json_get error)
  case "$err" in
    "step 11: "*"$NVME/ztd-$job."*"/zt-offload."*": write of "*"$1"*) echo "$job failed: $err" ;;
    *) fail "job $job: the error does not name the file and '$1': $err" ;;
  esac
  [ "$(ckpt_sum "$job" 10)" = "$sums" ] || fail "job $job: its checkpoint changed"
  [ "$(ls "$STATE/jobs/$job/checkpoints")" = step-00000010 ] ||
    fail "job $job: checkpoints $(ls "$STATE/jobs/$job/checkpoints")"
  grep -q "failed: step 11: .*$1" "$STATE/jobs/$job/log" || fail "jobs/$job/log: $(cat "$STATE/jobs/$job/log")"
  no_job_files "failed job $job"
  last_failed=$job
}

start_ztd --nvme-dir "$NVME"
backend=$(ztctl --json status | json_get backend)
[ "$backend" = cpu ] || { echo "SKIP: the offloaded step runs on the cpu backend (ztd runs $backend)"; exit 77; }
need=$(ztctl --json plan "$ZT_TMP/opt.json" | json_get offload.nvme_bytes)
[ "$need" -gt 0 ] && [ "$need" -lt 512000 ] || fail "plan: nvme_bytes $need"
[ "$(ztctl --json plan "$ZT_TMP/params.json" | json_get offload.nvme_bytes)" = "$need" ] ||
  fail "params nvme takes no files of its own: $(ztctl --json plan "$ZT_TMP/params.json")"

if [ "$tmpfs" = 1 ]; then
  # Submit and plan refuse a job whose files do not fit, with the numbers.
  fill $((need - 4096))
  for op in submit plan; do
    out=$(ztctl "$op" "$ZT_TMP/opt.json" 2>&1) && fail "$op accepted a job that does not fit $NVME"
    case "$out" in
      *ENOSPC*"offload.nvme_dir: $NVME has "*"($((need - 4096)) bytes)"*"needs"*"($need bytes)"*) ;;
      *) fail "$op refusal: $out" ;;
    esac
  done
  echo "submit refused: $out"
  rm "$NVME/filler"

  # A job queued while there was room fails at its start once there is none.
  spec "$ZT_TMP/block.json" stream 100
  blocker=$(new_job "$ZT_TMP/block.json") || exit 1
  wait_status "$blocker" '"state": "running"'
  queued=$(new_job "$ZT_TMP/opt.json") || exit 1
  grep -q '"state": "queued"' "$STATE/jobs/$queued/status.json" || fail "job $queued is not queued"
  fill 0
  ztctl cancel "$blocker" >/dev/null || fail "cancel $blocker"
  wait_end "$queued" failed
  err=$(ztctl --json show "$queued" | json_get error)
  case "$err" in
    "offload.nvme_dir: $NVME has 0 B free (0 bytes); the job's NVMe tier needs "*"($need bytes)") ;;
    *) fail "start refusal: $err" ;;
  esac
  echo "start refused: $err"
  no_job_files "refused job $queued"
  rm "$NVME/filler"

  # Mid-run: the reservation lost (holes punched into the job's files), the disk full.
  for s in opt params; do
    run_to_checkpoint "$ZT_TMP/$s.json"
    files=$(find "$NVME/ztd-$job".*/zt-offload.* -type f)
    [ "$(printf '%s\n' "$files" | wc -l)" -ge 12 ] || fail "job $job has files: $files"
    for f in $files; do fallocate -p -o 0 -l "$(stat -c %s "$f")" "$f" || fail "punch $f"; done
    fill 0
    fails_mid_run "No space left on device"
    rm "$NVME/filler"
  done
fi

if [ "$fsize" = 1 ]; then
  # A file size limit below the job's largest file, on the running daemon (which ignores
  # SIGXFSZ): the reservation at the start fails naming the file...
  soft=$(prlimit --pid "$ZTD_PID" --fsize --output SOFT --noheadings | tr -d ' ')
  prlimit --pid "$ZTD_PID" --fsize=16384: || fail "prlimit"
  early=$(new_job "$ZT_TMP/opt.json") || exit 1
  wait_status "$early" '"state": "(done|failed|cancelled)"'
  prlimit --pid "$ZTD_PID" --fsize="$soft": || fail "prlimit"
  wait_end "$early" failed
  err=$(ztctl --json show "$early" | json_get error)
  case "$err" in
    "offload.nvme_dir: $NVME/ztd-$early."*"/zt-offload."*": cannot reserve "*"File too large (the job's NVMe tier needs "*"$need bytes, in offload.nvme_dir $NVME)") ;;
    *) fail "start failure under RLIMIT_FSIZE: $err" ;;
  esac
  echo "$early failed: $err"
  no_job_files "failed job $early"
  # ...and mid-run the writes behind the AdamW fail.
  run_to_checkpoint "$ZT_TMP/opt.json"
  prlimit --pid "$ZTD_PID" --fsize=16384: || fail "prlimit"
  fails_mid_run "File too large"
  prlimit --pid "$ZTD_PID" --fsize="$soft": || fail "prlimit"
fi

# ztd serves on: a file job initialised from the last failed job's checkpoint runs to the end,
# its NVMe files removed when it is done.
make_tokens "$ZT_TMP/gpl.zt"
offload_spec "$ZT_TMP/next.json" "$PARAMS" "$ZT_TMP/gpl.zt" 5
python3 - "$ZT_TMP/next.json" "$STATE/jobs/$last_failed/checkpoints/step-00000010/model.safetensors" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["model"]["init"] = {"safetensors": sys.argv[2]}
json.dump(s, open(sys.argv[1], "w"))
PY
next=$(new_job "$ZT_TMP/next.json") || exit 1
wait_end "$next" done
no_job_files "finished job $next"
# A cancelled job's files go too.
cancelled=$(new_job "$ZT_TMP/opt.json") || exit 1
"$ZT_TEST_BIN_DIR/push_batches" "$SOCK" "$cancelled" 2 || fail "pushing into $cancelled"
for i in $(seq 1 600); do
  ls -d "$NVME/ztd-$cancelled."*/zt-offload.* >/dev/null 2>&1 && break
  sleep 0.05
done
ls -d "$NVME/ztd-$cancelled."*/zt-offload.* >/dev/null || fail "running job $cancelled has no NVMe directory"
ztctl cancel "$cancelled" >/dev/null || fail "cancel $cancelled"
wait_end "$cancelled" cancelled
no_job_files "cancelled job $cancelled"
stop_ztd
echo "offload_full: ok"
