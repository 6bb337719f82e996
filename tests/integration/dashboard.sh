#!/bin/bash
# The dashboard (ztd --http, engine/server/web) in a real browser, Debian's headless chromium: the
# page loads, shows the running job in its table and the job's steps advancing between two
# loads; on a listener beyond loopback it asks for the data with the token of its URL's fragment
# (#token=...), and without it says it was refused.
. "$(dirname "$0")/lib.sh"

[ "${ZT_HAVE_HTTP:-0}" = 1 ] || { echo "built without the HTTP listener"; exit 77; }
command -v chromium >/dev/null || { echo "no chromium: tools/test.sh installs it"; exit 77; }

# dump URL: the DOM after the page's scripts ran (3 s of the page's time)
dump() {
  timeout 90 chromium --headless --no-sandbox --disable-gpu --user-data-dir="$ZT_TMP/chromium" \
    --virtual-time-budget=3000 --dump-dom "$1" 2>>"$ZT_TMP/chromium.log"
}
# field HTML ATTR: the job summary's data-ATTR
summary() { sed -n "s/.*id=\"job-summary\"[^>]*data-$2=\"\([^\"]*\)\".*/\1/p" <<<"$1" | head -n 1; }

printf 'a-dashboard-bearer-token-0123456789\n' >"$ZT_TMP/token"
chmod 600 "$ZT_TMP/token"
start_ztd --http 0.0.0.0:0 --token-file "$ZT_TMP/token"
port=$(sed -n 's/.*http listening on [^ ]*:\([0-9]*\).*/\1/p' "$ZTD_LOG" | head -n 1)
[ -n "$port" ] || fail "no port in the log"
make_tokens "$ZT_TMP/gpl.zt"
spec "$ZT_TMP/job.json" "$ZT_TMP/gpl.zt" 100000 '"offload": {"optimizer": "host"}'
job=$(submit "$ZT_TMP/job.json")
wait_step "$job" 2

url="http://127.0.0.1:$port/#token=a-dashboard-bearer-token-0123456789"
first=$(dump "$url") || fail "chromium: $(tail -n 5 "$ZT_TMP/chromium.log")"
grep -q "<tr data-job=\"$job\"" <<<"$first" || fail "the jobs table lacks $job: $first"
grep -q "<td class=\"state-running\">running</td>" <<<"$first" || fail "$job is not shown running"
[ "$(summary "$first" job)" = "$job" ] || fail "the page does not show $job's steps: $first"
step1=$(summary "$first" step)
[ "${step1:-0}" -ge 2 ] && [ "$(summary "$first" points)" -ge 2 ] || fail "no steps shown: $first"
sleep 1
second=$(dump "$url&job=$job") || fail "chromium (second load)"
step2=$(summary "$second" step)
[ "${step2:-0}" -gt "$step1" ] || fail "the steps did not advance: $step1, then $step2"
echo "ok: the dashboard shows $job at step $step1, then $step2"

# without the token: the table stays empty and the page says why
bare=$(dump "http://127.0.0.1:$port/") || fail "chromium (no token)"
grep -q '<p id="error">.*401' <<<"$bare" || fail "the page does not show the refusal: $bare"
grep -q "<tr data-job=" <<<"$bare" && fail "jobs shown without the token"
ztctl cancel "$job" >/dev/null || fail "cancel"
stop_ztd
echo "dashboard: ok"
