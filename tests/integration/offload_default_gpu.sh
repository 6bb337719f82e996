#!/bin/bash
# Offload by default on a cuda ztd (docs/spec.md "Offload by default"): a job with no "offload"
# object that does not fit --gpu-mem-limit is offloaded (offload auto, checkpointing auto) and
# trains with losses bitwise those of the same job on a daemon without the limit (fp32: the CPU
# AdamW gives the cuda AdamW's bits, as train.sh's offloaded job); its plan says why and stays
# within the limit; "offload": false is refused with the numbers and the change that fits.
# Skips (77) without a GPU.
. "$(dirname "$0")/lib.sh"

n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "${n:-0}" -lt 1 ]; then
  echo "SKIP: needs a GPU"
  exit 77
fi
make_tokens "$ZT_TMP/gpl.zt"
job() { # OUT [OFFLOAD_JSON]
  spec "$1" "$ZT_TMP/gpl.zt" 12
  python3 - "$1" "${2:-}" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["model"].update(n_layers=6, d_model=64, n_heads=4)
s["train"].update(grad_accum=2)
if sys.argv[2]:
    s["offload"] = json.loads(sys.argv[2])
json.dump(s, open(sys.argv[1], "w"))
PY
}
job "$ZT_TMP/one.json"
job "$ZT_TMP/off.json" false

start_ztd --backend cuda --gpus 0
need=$(ztctl --json plan "$ZT_TMP/one.json" | json_get backend_bytes) || fail "plan"
ref=$(submit "$ZT_TMP/one.json")
wait_end "$ref" done 300
ref_show=$(ztctl --json show "$ref")
stop_ztd

limit=$((need * 6 / 10))
SOCK="$ZT_TMP/limited.sock"
STATE="$ZT_TMP/limited-state"
start_ztd --backend cuda --gpus 0 --gpu-mem-limit "$limit"
plan=$(ztctl --json plan "$ZT_TMP/one.json") || fail "plan under the limit: $plan"
printf '%s\n' "$plan" | python3 -c '
import json, sys
p, limit = json.loads(sys.stdin.read()), int(sys.argv[1])
assert "job needs" in p["offloaded_by_default"], p
assert p["offload"]["device_bytes"] <= limit, (p["offload"], limit)' "$limit" || fail "plan: $plan"
expect_fail 1 "on the cuda backend (activations " ztctl submit "$ZT_TMP/off.json"
expect_fail 1 'fits with the "offload": false left out (offloaded by default)' \
  ztctl submit "$ZT_TMP/off.json"
j=$(submit "$ZT_TMP/one.json")
wait_end "$j" done 300
python3 - "$ref_show" "$(ztctl --json show "$j")" "$limit" <<'PY' || fail "losses under the limit"
import json, sys
a, b, limit = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
assert "offload" not in a["spec"] and b["spec"]["offload"]["gpu_budget"] == limit, b["spec"]
assert len(a["losses"]) == 12 and a["losses"] == b["losses"], (a["losses"], b["losses"])
PY
stop_ztd
echo "offload_default_gpu: ok (limit $limit of $need bytes)"
