#!/bin/bash
# ztd --max-queued N and --max-state-bytes SIZE refuse a submit over them with the numbers;
# ztctl rm removes a job that ended and its directory, refuses a queued or running one, and the
# removed job's id is never given again (also after a restart).
. "$(dirname "$0")/lib.sh"

make_tokens "$ZT_TMP/gpl.zt"
spec "$ZT_TMP/long.json" "$ZT_TMP/gpl.zt" 100000
spec "$ZT_TMP/short.json" "$ZT_TMP/gpl.zt" 10

start_ztd --max-queued 1
running=$(submit "$ZT_TMP/long.json")
wait_state "$running" running
queued=$(submit "$ZT_TMP/short.json")
[ "$(state "$queued")" = queued ] || fail "job $queued is not queued"
expect_fail 1 "EBUSY: 1 jobs are queued, ztd --max-queued 1" ztctl submit "$ZT_TMP/short.json"
expect_fail 1 "EBUSY: job $running is running; only a job that ended" ztctl rm "$running"
expect_fail 1 "EBUSY: job $queued is queued" ztctl rm "$queued"
expect_fail 1 "ENOENT" ztctl rm j999999
ztctl cancel "$queued" >/dev/null || fail "cancel $queued"
ztctl rm "$queued" >/dev/null || fail "rm $queued"
[ ! -e "$STATE/jobs/$queued" ] || fail "rm left $STATE/jobs/$queued"
expect_fail 1 "ENOENT" ztctl show "$queued"
ztctl --json jobs | grep -q "$queued" && fail "jobs still lists $queued"
# a slot is free again; the removed id is not reused, before or after a restart
again=$(submit "$ZT_TMP/short.json")
[ "$again" != "$queued" ] || fail "the id of the removed $queued was given again"
ztctl cancel "$again" >/dev/null
ztctl rm "$again" >/dev/null || fail "rm $again"
ztctl cancel "$running" >/dev/null || fail "cancel $running"
wait_end "$running" cancelled 60
ztctl rm "$running" >/dev/null || fail "rm $running"
stop_ztd

start_ztd --max-state-bytes 64KiB
next=$(submit "$ZT_TMP/short.json")
[ "${next#j}" -gt "${again#j}" ] || fail "after a restart the new job $next reuses an id up to $again"
wait_end "$next" done 120
expect_fail 1 "ENOSPC: the state dir's jobs hold" ztctl submit "$ZT_TMP/short.json"
out=$(ztctl submit "$ZT_TMP/short.json" 2>&1)
case "$out" in *"ztd --max-state-bytes 64 KiB (65536 bytes)"*) ;; *) fail "no numbers: $out" ;; esac
ztctl rm "$next" >/dev/null || fail "rm $next"
job=$(submit "$ZT_TMP/short.json")
wait_end "$job" done 120
stop_ztd
echo "quotas: ok"
