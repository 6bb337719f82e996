#!/bin/bash
# Before hello nothing but a small hello is read: frames over the pre-hello limit, silent
# connections, the cap on connections before hello, wrong TCP tokens (with backoff), invalid
# UTF-8 quoted in a reply and a half-closed checkpoint request (tests/integration/preauth.c),
# while a job of another client trains on untouched.
. "$(dirname "$0")/lib.sh"

port=$((20000 + RANDOM % 20000))
token=an-integration-test-token-0123456789
printf '%s\n' "$token" >"$ZT_TMP/token"
chmod 600 "$ZT_TMP/token"
start_ztd --tcp "127.0.0.1:$port" --token-file "$ZT_TMP/token"
make_tokens "$ZT_TMP/gpl.zt"
spec "$ZT_TMP/job.json" "$ZT_TMP/gpl.zt" 100000
job=$(submit "$ZT_TMP/job.json")
wait_state "$job" running
"$ZT_TEST_BIN_DIR/preauth" "$SOCK" "$port" "$token" "$job" || fail "preauth"
grep -q "refused for 1000 ms" "$ZTD_LOG" || fail "the backoff was not logged"
[ "$(grep -c 'wrong tokens; its hellos are refused' "$ZTD_LOG")" -eq 1 ] ||
  fail "the backoff was logged more than once"
ztctl cancel "$job" >/dev/null || fail "cancel"
stop_ztd
echo "preauth: ok"
