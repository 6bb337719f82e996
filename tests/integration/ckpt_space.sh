#!/bin/bash
# The checkpoints' bytes against the state dir's free space at admission (docs/spec.md "Checks
# against the machine"): on a 2 MiB state dir, a job whose checkpoint.keep + 1 checkpoints do
# not fit is refused at submit and plan with the sizes and what to change, and ztd keeps
# serving: a smaller job on the same disk is admitted and trains; a job with room for one
# checkpoint but not two is refused at keep 1 and trains at keep 0, one checkpoint at a time. The disk is a tmpfs mounted in
# a private mount namespace (this script re-runs itself in one); skipped where mounting is not
# allowed.
if [ -z "${ZT_MOUNT_NS:-}" ]; then
  for how in "-m" "-Urm"; do
    if ZT_MOUNT_NS=1 unshare $how --propagation private true 2>/dev/null; then
      ZT_MOUNT_NS=1 exec unshare $how --propagation private "$0" "$@"
    fi
  done
  export ZT_MOUNT_NS=none
fi
. "$(dirname "$0")/lib.sh"

mkdir -p "$STATE"
if [ "$ZT_MOUNT_NS" != 1 ] || ! mount -t tmpfs -o size=2m tmpfs "$STATE" 2>/dev/null; then
  echo "SKIP: cannot mount a small tmpfs here"
  exit 77
fi
trap 'umount -l "$STATE"; cleanup' EXIT
start_ztd --backend cpu
make_tokens "$ZT_TMP/gpl.zt"
spec "$ZT_TMP/small.json" "$ZT_TMP/gpl.zt" 3
spec "$ZT_TMP/big.json" "$ZT_TMP/gpl.zt" 3
python3 - "$ZT_TMP/big.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["model"].update(n_layers=6, d_model=64, n_heads=4)
json.dump(s, open(sys.argv[1], "w"))
PY
for op in submit plan; do
  expect_fail 1 "checkpoint: the job's checkpoints take " ztctl "$op" "$ZT_TMP/big.json"
  expect_fail 1 "3 at once with checkpoint.keep 2: " ztctl "$op" "$ZT_TMP/big.json"
  expect_fail 1 "; the state dir $STATE has " ztctl "$op" "$ZT_TMP/big.json"
  expect_fail 1 "free: lower checkpoint.keep (0: one at a time) or free space" ztctl "$op" \
    "$ZT_TMP/big.json"
done
# bf16 moments: 8 bytes a parameter, and the refusal says which
python3 - "$ZT_TMP/big.json" "$ZT_TMP/big16.json" <<'PY' || fail "the bf16-state spec"
import json, sys
s = json.load(open(sys.argv[1]))
s["train"].setdefault("optimizer", {})["state_dtype"] = "bf16"
json.dump(s, open(sys.argv[2], "w"))
PY
size_of() { "$ZTCTL" --socket "$SOCK" plan "$1" 2>&1 | sed -n 's/.*checkpoints take \([0-9.]*\) .*/\1/p'; }
expect_fail 1 "AdamW's m and v in bf16), " ztctl plan "$ZT_TMP/big16.json"
# 8 bytes a parameter against 12, and the same headers
python3 -c 'import sys; a, b = map(float, sys.argv[1:]); sys.exit(not 0.6 < b / a < 0.75)' \
  "$(size_of "$ZT_TMP/big.json")" "$(size_of "$ZT_TMP/big16.json")" ||
  fail "bf16 moments' checkpoint: $(size_of "$ZT_TMP/big16.json") against $(size_of "$ZT_TMP/big.json")"
job=$(submit "$ZT_TMP/small.json")
wait_end "$job" done 120
# about 1 MiB a checkpoint: one fits beside the small job's, two do not
python3 - "$ZT_TMP/small.json" "$ZT_TMP/one.json" <<'PY' || fail "the keep-0 spec"
import json, sys
s = json.load(open(sys.argv[1]))
s["model"].update(n_layers=4, d_model=40, n_heads=4)
s["train"]["steps"] = 5
s["checkpoint"] = {"every": 2, "keep": 1}
json.dump(s, open(sys.argv[2], "w"))
PY
expect_fail 1 "2 at once with checkpoint.keep 1: " ztctl submit "$ZT_TMP/one.json"
python3 - "$ZT_TMP/one.json" <<'PY' || fail "keep 0"
import json, sys
s = json.load(open(sys.argv[1]))
s["checkpoint"]["keep"] = 0
json.dump(s, open(sys.argv[1], "w"))
PY
job=$(submit "$ZT_TMP/one.json")
wait_end "$job" done 120
# the checkpoints at steps 2 and 4 each went before the next: the final one alone is left
[ "$(ls "$STATE/jobs/$job/checkpoints")" = "$(printf 'step-%08d' 5)" ] ||
  fail "keep 0 left: $(ls "$STATE/jobs/$job/checkpoints" | tr '\n' ' ')"
ztctl export "$job" "$ZT_TMP/one.safetensors" >/dev/null || fail "export of the keep-0 job"
stop_ztd
echo "ckpt_space: ok"
