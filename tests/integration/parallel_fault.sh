#!/bin/bash
# A rank that fails mid-step (ZT_FAULT_COMM makes rank 1's 40th collective fail with EIO, as a
# lost GPU or a NCCL error would) fails its 2-rank job with that rank's message, within the
# step, without hanging the other rank; every rank is released (a 2-rank job queued behind it
# starts, and fails the same way, the fault being armed for every group), and ztd keeps serving:
# a 1-rank job (no communicator) trains to the end.
. "$(dirname "$0")/lib.sh"

ZT_FAULT_COMM=1:40 start_ztd --cpu-ranks 2
make_tokens "$ZT_TMP/gpl.zt"
pspec "$ZT_TMP/two.json" 30 1 '{"gpus": 2, "zero_stage": 2}'
spec "$ZT_TMP/one.json" "$ZT_TMP/gpl.zt" 10
a=$(new_job "$ZT_TMP/two.json") || exit 1
b=$(new_job "$ZT_TMP/two.json") || exit 1
wait_end "$a" failed 120
err=$(ztctl --json show "$a" | json_get error)
case "$err" in *"rank 1"*"injected by ZT_FAULT_COMM"*) ;; *) fail "the failed job's error: $err" ;; esac
# the ranks went back: the queued 2-rank job ran (and met the same armed fault)
wait_end "$b" failed 120
c=$(new_job "$ZT_TMP/one.json") || exit 1
wait_end "$c" done 120
ztctl --json status | python3 -c '
import json, sys
s = json.load(sys.stdin)
assert all(g.get("job") is None for g in s["gpus"]), s["gpus"]' ||
  fail "ranks still held: $(ztctl --json status)"
stop_ztd
echo "parallel_fault: ok ($err)"
