#!/bin/bash
# ztd --calibrate (docs/offload.md "Rates"): measures every rate of the cost model on this
# machine, a line each, into the state dir's rates.json (name "calibrated", when, the backend),
# which a ztd started there plans by; the NVMe tier's file goes to --nvme-dir (else the state
# dir) and is removed after; a state dir that is a file, an NVMe dir it cannot write, or a
# state dir a ztd holds are refused naming the path, leaving the rates there as they were.
. "$(dirname "$0")/lib.sh"

fields="flops_bf16 flops_fp32 h2d_bytes d2h_bytes adamw_params adamw_alone_params sumsq_bytes
        nvme_read_bytes nvme_write_bytes hbm_bytes"
check_rates() { # FILE BACKEND: every rate a positive number, the name and the record
  python3 - "$1" "$2" $fields <<'PY' || fail "rates.json: $(cat "$1")"
import json, re, sys
r = json.load(open(sys.argv[1]))
assert r["name"] == "calibrated", r["name"]
assert r["backend"] == sys.argv[2], r["backend"]
assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", r["measured"]), r["measured"]
for f in sys.argv[3:]:
    assert isinstance(r[f], (int, float)) and r[f] > 0, f
# the width the flops rate halves at: 0 where the narrower model ran no slower
assert isinstance(r["flops_knee"], (int, float)) and r["flops_knee"] >= 0, r["flops_knee"]
assert len(r) == 4 + len(sys.argv[3:]), sorted(r)
PY
}

out=$("$ZTD" --calibrate --backend cpu --cpu-threads 1 --state-dir "$STATE" 2>"$ZT_TMP/err") ||
  fail "ztd --calibrate exited $?: $out $(cat "$ZT_TMP/err")"
echo "$out"
for f in $fields flops_knee; do
  echo "$out" | grep -Eq "^$f +[0-9.]+e[+-][0-9]+ [A-Za-z/]+ +[0-9.]+ s  [^ ]" ||
    fail "no line for $f"
done
check_rates "$STATE/rates.json" cpu
case "$out" in *"NVMe store: 1 GiB written to $STATE/zt-calibrate-"*) ;;
  *) fail "the NVMe file is not the state dir's 1 GiB: $out" ;; esac
ls "$STATE" | grep -Eq 'zt-calibrate|\.tmp$' && fail "left behind: $(ls -a "$STATE")"

# a ztd on that state dir plans by them
make_tokens "$ZT_TMP/gpl.zt"
spec "$ZT_TMP/off.json" "$ZT_TMP/gpl.zt" 3 '"offload": {"params": "host"}'
start_ztd --backend cpu
[ "$(ztctl --json plan "$ZT_TMP/off.json" | json_get rates)" = calibrated ] ||
  fail "plan's rates: $(ztctl --json plan "$ZT_TMP/off.json")"
grep -q "cost model rates \"calibrated\" from $STATE/rates.json" "$ZTD_LOG" ||
  fail "ztd does not log the calibrated rates"
expect_fail 1 "state dir $STATE is in use by a running ztd" \
  "$ZTD" --calibrate-quick --backend cpu --state-dir "$STATE"
stop_ztd

# the NVMe tier in --nvme-dir, small sizes
mkdir "$ZT_TMP/nvme"
cp "$STATE/rates.json" "$ZT_TMP/before.json"
out=$("$ZTD" --calibrate-quick --backend cpu --cpu-threads 1 --state-dir "$STATE" \
  --nvme-dir "$ZT_TMP/nvme" 2>&1) || fail "ztd --calibrate-quick --nvme-dir: $out"
case "$out" in *"written to $ZT_TMP/nvme/zt-calibrate-"*) ;; *) fail "not in --nvme-dir: $out" ;; esac
[ -z "$(ls -A "$ZT_TMP/nvme")" ] || fail "left in the NVMe dir: $(ls -A "$ZT_TMP/nvme")"
check_rates "$STATE/rates.json" cpu
cp "$STATE/rates.json" "$ZT_TMP/before.json"

# refusals name the path and leave the rates as they were
touch "$ZT_TMP/file"
expect_fail 1 "state dir $ZT_TMP/file: not a directory" \
  "$ZTD" --calibrate-quick --backend cpu --state-dir "$ZT_TMP/file"
if [ "$(id -u)" -eq 0 ]; then
  ro=/proc # root writes through a mode of 555; nobody creates files in /proc
else
  ro="$ZT_TMP/ro"
  mkdir "$ro"
  chmod 555 "$ro"
fi
expect_fail 1 "NVMe dir $ro is not writable" \
  "$ZTD" --calibrate-quick --backend cpu --state-dir "$STATE" --nvme-dir "$ro"
cmp -s "$STATE/rates.json" "$ZT_TMP/before.json" || fail "a refused calibration changed rates.json"
expect_fail 2 "--nvme-dir $ZT_TMP/none: not a directory" \
  "$ZTD" --calibrate --backend cpu --state-dir "$STATE" --nvme-dir "$ZT_TMP/none"
echo "calibrate: ok"
