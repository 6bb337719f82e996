#!/bin/bash
# The dashboard (ztd --http, engine/server/web) in a real browser, Debian's headless chromium: the
# page loads, shows the running job in its table and the job's steps advancing between two
# loads, and its held-out evaluations (data.eval: the table's eval column, the summary's eval
# loss, their count growing); on a listener beyond loopback it asks for the data with the token of its URL's fragment
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
python3 - "$ZT_TMP/job.json" "$ZT_TMP/gpl.zt" <<'PY' || fail "adding data.eval"
import json, sys
s = json.load(open(sys.argv[1]))
s["data"]["eval"] = {"path": sys.argv[2], "every": 1, "batches": 1}
json.dump(s, open(sys.argv[1], "w"))
PY
job=$(submit "$ZT_TMP/job.json")
wait_step "$job" 2

url="http://127.0.0.1:$port/#token=a-dashboard-bearer-token-0123456789"
first=$(dump "$url") || fail "chromium: $(tail -n 5 "$ZT_TMP/chromium.log")"
grep -q "<tr data-job=\"$job\"" <<<"$first" || fail "the jobs table lacks $job: $first"
grep -q "<td class=\"state-running\">running</td>" <<<"$first" || fail "$job is not shown running"
[ "$(summary "$first" job)" = "$job" ] || fail "the page does not show $job's steps: $first"
step1=$(summary "$first" step)
[ "${step1:-0}" -ge 2 ] && [ "$(summary "$first" points)" -ge 2 ] || fail "no steps shown: $first"
evals1=$(summary "$first" evals)
[ "${evals1:-0}" -ge 1 ] || fail "no evaluations shown: $first"
grep -q 'id="job-summary"[^>]*>[^<]* · eval loss [0-9.]* (step [0-9]*)' <<<"$first" ||
  fail "the summary lacks the eval loss: $first"
grep -q "<tr data-job=\"$job\"[^>]*>\(<td[^>]*>[^<]*</td>\)\{5\}<td class=\"num\">[0-9.]*</td><td class=\"num\">[0-9.]*</td>" <<<"$first" ||
  fail "the jobs table shows no eval loss for $job: $first"
sleep 1
second=$(dump "$url&job=$job") || fail "chromium (second load)"
step2=$(summary "$second" step)
[ "${step2:-0}" -gt "$step1" ] || fail "the steps did not advance: $step1, then $step2"
evals2=$(summary "$second" evals)
[ "${evals2:-0}" -gt "$evals1" ] || fail "the evaluations did not advance: $evals1, then $evals2"
echo "ok: the dashboard shows $job at step $step1 ($evals1 evaluations), then $step2 ($evals2)"

# without the token: the table stays empty and the page says why
bare=$(dump "http://127.0.0.1:$port/") || fail "chromium (no token)"
grep -q '<p id="error">.*401' <<<"$bare" || fail "the page does not show the refusal: $bare"
grep -q "<tr data-job=" <<<"$bare" && fail "jobs shown without the token"
ztctl cancel "$job" >/dev/null || fail "cancel"
stop_ztd
echo "dashboard: ok"
