#!/bin/bash
# The cost model's rates as data (docs/offload.md "Rates"): ztd reads rates.json from its state
# dir at start; plan names the rates it ranked by and estimates by them (an offloaded plan's
# step is slower under a slower device); a bad file stops ztd at start naming the file and the
# field, without its bytes; no file is the built-in default.
. "$(dirname "$0")/lib.sh"

make_tokens "$ZT_TMP/gpl.zt"
spec "$ZT_TMP/off.json" "$ZT_TMP/gpl.zt" 3 '"offload": {"params": "host"}'
est() { ztctl --json plan "$ZT_TMP/off.json" | json_get "$1"; }

start_ztd --backend cpu
[ "$(est rates)" = default ] || fail "rates without a file: $(est rates)"
fast=$(est offload.est_step_s)
stop_ztd

mkdir -p "$STATE"
printf '{"name": "slow-box", "flops_fp32": 1e9}\n' >"$STATE/rates.json"
start_ztd --backend cpu
[ "$(est rates)" = slow-box ] || fail "rates from the state dir: $(est rates)"
slow=$(est offload.est_step_s)
python3 -c 'import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if b > 10 * a else 1)' \
  "$fast" "$slow" || fail "estimate $fast s by default, $slow s under a 1 GFLOP/s device"
grep -q 'cost model rates "slow-box" from' "$ZTD_LOG" || fail "ztd does not log its rates"
stop_ztd

printf '{"name": "x", "flops_fp32": "very-secret-fast"}\n' >"$STATE/rates.json"
out=$("$ZTD" --socket "$SOCK" --state-dir "$STATE" --backend cpu 2>&1) && fail "ztd started: $out"
case "$out" in *"$STATE/rates.json: flops_fp32 must be a positive number"*) ;;
  *) fail "bad rates file: $out" ;; esac
case "$out" in *very-secret*) fail "the refusal echoes the file: $out" ;; esac
echo "rates: ok (GPT-2 tiny offloaded: $fast s a step by default, $slow s slow-box)"
