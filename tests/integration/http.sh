#!/bin/bash
# ztd --http: /metrics in the Prometheus text format as a real parser reads it (prometheus-client's,
# from PyPI: tools/test.sh puts it in ZT_TEST_PYTHON's venv), a running offloaded job's figures in
# it, the dashboard's JSON, the listener's bounds (a request's size, connections per address,
# idle connections, methods) and, on an address beyond loopback, the bearer token with its
# backoff (tests/integration/http_check.py). A build without the listener refuses the flag.
. "$(dirname "$0")/lib.sh"

if [ "${ZT_HAVE_HTTP:-0}" != 1 ]; then
  expect_fail 2 "built without its HTTP listener" "$ZTD" --http 9090
  exit 0
fi
python_with prometheus_client

# the port the kernel picked, from the log
http_port() {
  local i p
  for i in $(seq 1 100); do
    p=$(sed -n 's/.*http listening on [^ ]*:\([0-9]*\).*/\1/p' "$ZTD_LOG" | tail -n 1)
    [ -n "$p" ] && { echo "$p"; return 0; }
    sleep 0.1
  done
  fail "no 'http listening' line in the log"
}

expect_fail 2 "expected [HOST:]PORT" "$ZTD" --http 1.2.3.4:x
start_ztd --http 0
port=$(http_port)
make_tokens "$ZT_TMP/gpl.zt"
spec "$ZT_TMP/job.json" "$ZT_TMP/gpl.zt" 100000 '"offload": {"optimizer": "host", "params": "host"}'
job=$(submit "$ZT_TMP/job.json")
wait_step "$job" 3
"$PY" "$(dirname "$0")/http_check.py" local "$port" "$job" || fail "http checks (loopback)"
ztctl cancel "$job" >/dev/null || fail "cancel"
stop_ztd

# Beyond loopback (listening on every address; the checks connect through loopback only).
printf 'an-http-bearer-token-0123456789\n' >"$ZT_TMP/token"
chmod 600 "$ZT_TMP/token"
ZTD_LOG_BEFORE=$(wc -l <"$ZTD_LOG")
expect_fail 1 "needs --token-file" "$ZTD" --socket "$SOCK" --state-dir "$STATE" --http 0.0.0.0:0
start_ztd --http 0.0.0.0:0 --token-file "$ZT_TMP/token"
port=$(tail -n +"$ZTD_LOG_BEFORE" "$ZTD_LOG" | sed -n 's/.*http listening on [^ ]*:\([0-9]*\) (bearer token).*/\1/p' | tail -n 1)
[ -n "$port" ] || fail "the listener does not say it wants the token"
"$PY" "$(dirname "$0")/http_check.py" remote "$port" "$job" an-http-bearer-token-0123456789 ||
  fail "http checks (bearer token)"
stop_ztd
echo "http: ok"
