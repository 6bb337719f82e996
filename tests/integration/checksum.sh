#!/bin/bash
# Checkpoints are verified: 16 bytes flipped in a tensor's data of a job's newest checkpoint,
# then ztd killed and restarted: the job resumes from the checkpoint before it, its log and a
# "resume" event say why (the word checksum), the corrupt one is moved aside; an export of a
# checkpoint that fails its checksums is refused naming the tensor.
. "$(dirname "$0")/lib.sh"

# flip FILE: 16 bytes of its first tensor's data XORed with 0xff.
flip() {
  python3 - "$1" <<'PY'
import struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
at = 8 + struct.unpack("<Q", b[:8])[0] + 4
for i in range(16):
    b[at + i] ^= 0xFF
open(p, "wb").write(b)
PY
}

start_ztd --cpu-ranks 2
make_tokens "$ZT_TMP/gpl.zt"
spec "$ZT_TMP/long.json" "$ZT_TMP/gpl.zt" 1000000
blocker=$(submit "$ZT_TMP/long.json")
job=$(submit "$ZT_TMP/long.json")
wait_status "$job" '"checkpoint_step": (2|3|4|5|6|7|8|9)[0-9]' 120
kill -KILL "$ZTD_PID"
wait "$ZTD_PID" 2>/dev/null
ZTD_PID=
ckpts=$(ls "$STATE/jobs/$job/checkpoints" | grep -E '^step-[0-9]{8}$' | sort)
newest=$(printf '%s\n' "$ckpts" | tail -n 1)
previous=$(printf '%s\n' "$ckpts" | tail -n 2 | head -n 1)
[ "$newest" != "$previous" ] || fail "job $job has one checkpoint: $ckpts"
flip "$STATE/jobs/$job/checkpoints/$newest/model.safetensors"
echo "flipped 16 bytes of $newest/model.safetensors; $previous is intact"

# one rank now: the blocker (the lower id) runs first and the job waits, so its watcher is there
# when it resumes
start_ztd --cpu-ranks 1
wait_state "$blocker" running
[ "$(state "$job")" = queued ] || fail "job $job is not queued behind $blocker"
ztctl --json watch "$job" >"$ZT_TMP/watch.out" 2>&1 &
watcher=$!
sleep 0.5
ztctl cancel "$blocker" >/dev/null || fail "cancel $blocker"
wait_state "$job" running
prev_step=$((10#${previous#step-}))
for i in $(seq 1 100); do grep -q '"resume"' "$ZT_TMP/watch.out" && break; sleep 0.1; done
grep '"resume"' "$ZT_TMP/watch.out" | grep -q checksum ||
  fail "no resume event with the word checksum: $(head -c 2000 "$ZT_TMP/watch.out")"
grep -q "checksum mismatch" "$STATE/jobs/$job/log" || fail "the job's log does not say checksum: $(cat "$STATE/jobs/$job/log")"
grep -q "resumes from .*$previous (step $prev_step)" "$STATE/jobs/$job/log" ||
  fail "job $job did not resume from $previous: $(cat "$STATE/jobs/$job/log")"
[ -d "$STATE/jobs/$job/checkpoints/$newest.corrupt" ] || fail "$newest was not moved aside"
echo "ok: $(grep checksum "$STATE/jobs/$job/log" | tail -n 1)"
ztctl cancel "$job" >/dev/null || fail "cancel $job"
wait "$watcher" 2>/dev/null

# an export of a corrupt checkpoint is refused
spec "$ZT_TMP/short.json" "$ZT_TMP/gpl.zt" 20
short=$(submit "$ZT_TMP/short.json")
wait_end "$short" done 120
last=$(ls "$STATE/jobs/$short/checkpoints" | grep -E '^step-[0-9]{8}$' | sort | tail -n 1)
flip "$STATE/jobs/$short/checkpoints/$last/model.safetensors"
expect_fail 1 "checksum mismatch" ztctl export "$short" "$ZT_TMP/out.safetensors"
flip "$STATE/jobs/$short/checkpoints/$last/model.safetensors"
ztctl export "$short" "$ZT_TMP/out.safetensors" >/dev/null || fail "export of the restored checkpoint"
stop_ztd
echo "checksum: ok"
