#!/bin/bash
# A stream job without a producer does not hold its device for ever: with data.stream_timeout 2
# and no producer it fails after about 2 s saying so (a checkpoint kept when it had trained).
# ztctl under Ctrl-C (SIGINT): submit --data F --watch cancels the stream job it fed; with
# --detach the job keeps running (and then times out) and ztctl says how to cancel it; a plain
# watch only stops watching.
. "$(dirname "$0")/lib.sh"

# interrupt PID OUT: SIGINT to a backgrounded ztctl; it must exit 130.
interrupt() {
  kill -INT "$1"
  local rc=0
  wait "$1" || rc=$?
  [ "$rc" -eq 130 ] || fail "ztctl exited $rc after SIGINT, expected 130: $(cat "$2")"
  echo "ok: SIGINT: $(grep interrupted "$2" | head -n 1)"
}

start_ztd
make_tokens "$ZT_TMP/gpl.zt"
spec "$ZT_TMP/stream.json" stream 100000
sed -i 's/"source": "stream"}/"source": "stream", "stream_timeout": 2}/' "$ZT_TMP/stream.json"
grep -q stream_timeout "$ZT_TMP/stream.json" || fail "no stream_timeout in the spec"

# no producer ever: it fails after 2 s of waiting
t0=$(date +%s)
idle=$(submit "$ZT_TMP/stream.json")
wait_end "$idle" failed 30
grep -q 'no producer has been connected to push data for 2 s (data.stream_timeout): stopped at step 0' \
  "$STATE/jobs/$idle/status.json" || fail "job $idle: $(cat "$STATE/jobs/$idle/status.json")"
[ $(($(date +%s) - t0)) -ge 2 ] || fail "job $idle failed before its stream_timeout"
echo "ok: $idle: $(grep -o 'no producer[^"]*' "$STATE/jobs/$idle/status.json")"

# Ctrl-C while feeding and watching: the job is cancelled
"$ZTCTL" --socket "$SOCK" submit "$ZT_TMP/stream.json" --data "$ZT_TMP/gpl.zt" --watch >"$ZT_TMP/a.out" 2>&1 &
pid=$!
for i in $(seq 1 100); do job=$(head -n 1 "$ZT_TMP/a.out"); [ -n "$job" ] && break; sleep 0.1; done
wait_step "$job" 2
interrupt "$pid" "$ZT_TMP/a.out"
grep -q "interrupted: cancelled $job" "$ZT_TMP/a.out" || fail "ztctl did not say it cancelled $job"
wait_end "$job" cancelled 30

# with --detach the job keeps running, then runs out of its stream_timeout with its checkpoint
"$ZTCTL" --socket "$SOCK" submit "$ZT_TMP/stream.json" --data "$ZT_TMP/gpl.zt" --detach --watch >"$ZT_TMP/b.out" 2>&1 &
pid=$!
for i in $(seq 1 100); do job=$(head -n 1 "$ZT_TMP/b.out"); [ -n "$job" ] && break; sleep 0.1; done
wait_step "$job" 2
interrupt "$pid" "$ZT_TMP/b.out"
grep -q "ztctl cancel $job" "$ZT_TMP/b.out" || fail "ztctl did not say how to cancel $job: $(cat "$ZT_TMP/b.out")"
[ "$(state "$job")" = running ] || fail "job $job is not running after a detached Ctrl-C"
wait_end "$job" failed 30
grep -q 'data.stream_timeout): stopped at step [1-9][0-9]*, its checkpoint kept' "$STATE/jobs/$job/status.json" ||
  fail "job $job: $(cat "$STATE/jobs/$job/status.json")"
ls "$STATE/jobs/$job/checkpoints" | grep -q '^step-' || fail "job $job kept no checkpoint"

# a plain watch: Ctrl-C stops the watching, not the job
spec "$ZT_TMP/long.json" "$ZT_TMP/gpl.zt" 100000
job=$(submit "$ZT_TMP/long.json")
wait_state "$job" running
"$ZTCTL" --socket "$SOCK" watch "$job" >"$ZT_TMP/c.out" 2>&1 &
pid=$!
sleep 1
interrupt "$pid" "$ZT_TMP/c.out"
grep -q "stopped watching $job" "$ZT_TMP/c.out" || fail "watch did not say it stopped: $(cat "$ZT_TMP/c.out")"
[ "$(state "$job")" = running ] || fail "job $job is not running after a watch's Ctrl-C"
ztctl cancel "$job" >/dev/null || fail "cancel $job"
stop_ztd
echo "stream_timeout: ok"
