#!/bin/bash
# A job's log through the logs request (ztctl logs, -f following it to the job's end; pieces
# that cut a UTF-8 sequence, bytes that are none), ztd --log-file reopened on SIGHUP after a
# rotation, ztctl --version, and ztctl's conventions: the global options after the command,
# show's local times and numbers without float noise.
. "$(dirname "$0")/lib.sh"

"$ZTCTL" --version | grep -Eq '^ztctl [0-9]+\.[0-9]+\.[0-9]+ \(protocol 1\)$' || fail "ztctl --version"
"$ZTD" --version | grep -q "^ztd " || fail "ztd --version"

daemon_log="$ZT_TMP/daemon.log"
start_ztd --log-file "$daemon_log"
grep -q "serving $SOCK" "$daemon_log" || fail "--log-file has no 'serving' line"
make_tokens "$ZT_TMP/gpl.zt"
spec "$ZT_TMP/job.json" "$ZT_TMP/gpl.zt" 40
job=$(submit "$ZT_TMP/job.json")

# -f prints what the log holds and what comes until the job ends, then exits
out=$(timeout 120 "$ZTCTL" --socket "$SOCK" logs "$job" -f) || fail "logs -f: $out"
for want in "queued: tiny" "running on the cpu backend" "ready to train" "first step (1) done" \
    "checkpoint at step 40" "done at step 40"; do
  grep -q "$want" <<<"$out" || fail "logs -f lacks '$want': $out"
done
[ "$out" = "$(cat "$STATE/jobs/$job/log")" ] || fail "logs -f is not the log file"

# pieces (16 KiB): a file of 40 KiB with a 2-byte character across the first boundary and bytes
# that are not UTF-8 comes out whole, the latter as \xNN
pad=$((16383 - $(stat -c %s "$STATE/jobs/$job/log")))
{ head -c "$pad" /dev/zero | tr '\0' a; printf '\xc3\xa9\n'; head -c 24000 /dev/zero | tr '\0' b
  printf '\nbad \xff\xfe end\n'; } >>"$STATE/jobs/$job/log"
ztctl logs "$job" >"$ZT_TMP/got.log" || fail "logs"
sed 's/\xff/\\xff/; s/\xfe/\\xfe/' "$STATE/jobs/$job/log" | cmp - "$ZT_TMP/got.log" ||
  fail "logs differs from the file"
pieces=$(ztctl --json logs "$job" | wc -l)
[ "$pieces" -ge 3 ] || fail "a 40 KiB log came in $pieces pieces"
ztctl --json logs "$job" | python3 -c '
import json, sys
r = [json.loads(l) for l in sys.stdin]
# the first piece stops before the character its last byte would cut
assert r[0]["offset"] == 16383 == len(r[0]["data"].encode()), r[0]["offset"]
assert r[-1]["offset"] == r[-1]["size"] and r[-1]["state"] == "done", r[-1]' || fail "logs pieces"
expect_fail 1 "ENOENT" ztctl logs j999999

# README's `ztctl show JOB --json`; show's times in local time, the spec's float32 fields as set
[ "$("$ZTCTL" show "$job" --json --socket "$SOCK" | json_get state)" = done ] || fail "show JOB --json"
human=$(ztctl show "$job") || fail "show"
created=$(ztctl --json show "$job" | json_get created)
grep -qx "created: $(date -d "@$created" '+%Y-%m-%d %H:%M:%S %Z')" <<<"$human" || fail "show's created: $human"
grep -q '"lr":0.01,' <<<"$human" || fail "show's spec has float noise: $human"
err=$(ztctl show j999999 --json 2>&1 >/dev/null)
[ "$(json_get error.code <<<"$err")" = ENOENT ] || fail "--json error: $err"
expect_fail 2 "logs takes 1 argument" ztctl logs

# rotation: the old file is moved away, SIGHUP opens a new one at the same path
mv "$daemon_log" "$daemon_log.1"
kill -HUP "$ZTD_PID"
for i in $(seq 1 50); do [ -s "$daemon_log" ] && break; sleep 0.1; done
grep -q "log file reopened" "$daemon_log" || fail "no new log file after SIGHUP"
job2=$(submit "$ZT_TMP/job.json")
wait_end "$job2" done
grep -q "$job2 submitted" "$daemon_log" || fail "the new log file lacks the new job"
grep -q "$job2" "$daemon_log.1" && fail "the rotated file still grows"
stop_ztd
echo "logs: ok"
