#!/bin/bash
# Planning for a machine one is not on (docs/protocol.md "plan", target): a cpu ztd plans a bf16
# GPT-2-small-shaped job as a cuda ztd with --gpu-mem-limit and --host-mem-limit would, with
# the cost model's rates named (h200) or sent from a file: under 24 GiB offloaded by default
# within the limit with its estimate, under 80 GiB plain; a larger model with too little host
# and no NVMe refused with the advice, with a disk of --nvme-bytes planned onto NVMe or refused
# for its size; without a target the bf16 job is refused as ever on the cpu daemon; bad targets
# are refused naming the field; submit takes none; nothing is left in the daemon's state.
. "$(dirname "$0")/lib.sh"

REQ="$ZT_TEST_BIN_DIR/request"
start_ztd --backend cpu
# gspec OUT MICRO_BATCH [PYTHON updating s]: GPT-2 small's shape in bf16 with clipping, a plan
# only (a stream job: nothing trains)
gspec() {
  python3 - "$@" <<'PY'
import json, sys
s = {"name": "gpt2-small", "model": {"arch": "gpt", "vocab": 50257, "seq_len": 1024,
     "d_model": 768, "n_heads": 12, "n_layers": 12, "init": {"seed": 1}},
     "train": {"steps": 10, "micro_batch": int(sys.argv[2]), "precision": "bf16",
               "grad_clip": 1.0, "optimizer": {"lr": 3e-4}},
     "data": {"source": "stream"}}
if len(sys.argv) > 3:
    exec(sys.argv[3])
json.dump(s, open(sys.argv[1], "w"))
PY
}
gspec "$ZT_TMP/small.json" 64
cuda24=(--backend cuda --gpu-mem-limit 24GiB --host-mem-limit 64GiB)

expect_fail 1 'train.precision "bf16" needs the cuda backend; this daemon runs the cpu backend' \
  ztctl plan "$ZT_TMP/small.json"

# 24 GiB: offloaded by default, the device side within it, estimated by h200's rates
p24=$(ztctl --json plan "$ZT_TMP/small.json" "${cuda24[@]}" --rates h200) || fail "plan: $p24"
printf '%s\n' "$p24" | python3 -c '
import json, sys
p = json.loads(sys.stdin.read())
t = p["target"]
assert t == {"backend": "cuda", "gpus": 1, "gpu_mem_limit": 24 << 30,
             "host_mem_limit": 64 << 30, "rates": "h200"}, t
assert p["backend"] == "cuda" and p["rates"] == "h200", p
assert "GPU limit 24 GiB" in p["offloaded_by_default"], p
o = p["offload"]
assert 0 < o["device_bytes"] <= 24 << 30 and p["backend_bytes"] == o["device_bytes"], o
assert o["est_step_s"] > 0, o
print("24 GiB: offloaded, device %.1f GiB, %.3f s a step (h200)" %
      (o["device_bytes"] / 2**30, o["est_step_s"]))' || fail "plan under 24 GiB: $p24"
est=$(printf '%s\n' "$p24" | json_get offload.est_step_s)
out=$(ztctl plan "$ZT_TMP/small.json" "${cuda24[@]}" --rates h200) || fail "ztctl plan: $out"
for want in "planned for: cuda, 1 GPU of 24.0 GiB, host 64.0 GiB, rates h200" \
  "on the cuda backend" "offloaded by default" "estimated "; do
  case "$out" in *"$want"*) ;; *) fail "ztctl plan lacks '$want': $out" ;; esac
done
# a rates file, read by ztctl and sent inline: a device of 0.1 TFLOP/s is estimated slower
printf '{"name": "slow-gpu", "flops_bf16": 1e11}\n' >"$ZT_TMP/slow.json"
slow=$(ztctl --json plan "$ZT_TMP/small.json" "${cuda24[@]}" --rates "$ZT_TMP/slow.json") ||
  fail "plan with a rates file: $slow"
[ "$(printf '%s\n' "$slow" | json_get target.rates)" = slow-gpu ] || fail "rates file: $slow"
python3 -c 'import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if b > 5 * a else 1)' "$est" \
  "$(printf '%s\n' "$slow" | json_get offload.est_step_s)" || fail "slow-gpu: $slow, h200: $est s"

# 80 GiB: the job as given
p80=$(ztctl --json plan "$ZT_TMP/small.json" --backend cuda --gpu-mem-limit 80GiB \
  --host-mem-limit 64GiB) || fail "plan under 80 GiB: $p80"
printf '%s\n' "$p80" | python3 -c '
import json, sys
p = json.loads(sys.stdin.read())
assert "offload" not in p and "offloaded_by_default" not in p, p
assert 24 << 30 < p["backend_bytes"] <= 80 << 30, p["backend_bytes"]
assert p["target"]["gpu_mem_limit"] == 80 << 30 and p["rates"] == "default", p
print("80 GiB: plain, %.1f GiB" % (p["backend_bytes"] / 2**30))' || fail "plan: $p80"

# a 6.6 B model: too little host and no NVMe, refused with the advice; a disk of the target's
gspec "$ZT_TMP/big.json" 1 's["model"].update(vocab=32000, seq_len=2048, d_model=4096, n_heads=32, n_layers=32)'
expect_fail 1 'host limit 16 GiB: set offload.nvme_dir (and offload.host_budget) to keep on NVMe' \
  ztctl plan "$ZT_TMP/big.json" --backend cuda --gpu-mem-limit 24GiB --host-mem-limit 16GiB
gspec "$ZT_TMP/nvme.json" 1 's["model"].update(vocab=32000, seq_len=2048, d_model=4096, n_heads=32, n_layers=32); s["offload"] = {"nvme_dir": "/nvme/zt", "host_budget": "48GiB"}'
nv=$(ztctl --json plan "$ZT_TMP/nvme.json" "${cuda24[@]}" --nvme-bytes 500GB --rates h200) ||
  fail "plan onto NVMe: $nv"
printf '%s\n' "$nv" | python3 -c '
import json, sys
p = json.loads(sys.stdin.read())
o = p["offload"]
assert p["target"]["nvme_bytes"] == 500 * 10**9, p["target"]
assert 0 < o["nvme_bytes"] <= 500 * 10**9 and o["host_bytes"] <= 48 << 30, o
assert o["device_bytes"] <= 24 << 30, o
print("6.6 B: NVMe %.1f GiB, host %.1f GiB, %.1f s a step" %
      (o["nvme_bytes"] / 2**30, o["host_bytes"] / 2**30, o["est_step_s"]))' ||
  fail "plan onto NVMe: $nv"
expect_fail 1 "offload.nvme_dir: the target has 46.57 GiB free (target.nvme_bytes 50000000000)" \
  ztctl plan "$ZT_TMP/nvme.json" "${cuda24[@]}" --nvme-bytes 50GB

# bad targets, by the field
expect_fail 1 'target.backend must be "cpu" or "cuda"' \
  ztctl plan "$ZT_TMP/small.json" --backend tpu --host-mem-limit 64GiB
expect_fail 1 'target.gpu_mem_limit must be a byte count or a size such as' \
  ztctl plan "$ZT_TMP/small.json" --backend cuda --gpu-mem-limit lots --host-mem-limit 64GiB
expect_fail 1 'target.gpus must be a positive integer' \
  ztctl plan "$ZT_TMP/small.json" "${cuda24[@]}" --gpus 0
expect_fail 1 'target.rates: no built-in rates named "a100" (the sets: default, h200)' \
  ztctl plan "$ZT_TMP/small.json" "${cuda24[@]}" --rates a100
expect_fail 1 'target.gpu_mem_limit is required with target.backend "cuda"' \
  ztctl plan "$ZT_TMP/small.json" --backend cuda --host-mem-limit 64GiB
expect_fail 1 'target.backend is required' ztctl plan "$ZT_TMP/small.json" --gpu-mem-limit 8GiB
printf '{"flops_bf16": "quick"}\n' >"$ZT_TMP/bad-rates.json"
expect_fail 1 'target.rates: flops_bf16 must be a positive number' \
  ztctl plan "$ZT_TMP/small.json" "${cuda24[@]}" --rates "$ZT_TMP/bad-rates.json"
spec_text=$(python3 -c 'import json, sys; print(json.dumps(json.dumps(json.load(open(sys.argv[1])))))' \
  "$ZT_TMP/small.json")
r=$("$REQ" "$SOCK" "{\"op\": \"plan\", \"spec_json\": $spec_text, \"target\": {\"backend\": \"cuda\",
  \"gpu_mem_limit\": 25769803776, \"host_mem_limit\": \"64GiB\", \"colour\": \"red\"}}")
case "$r" in *"unknown field 'target.colour'"*) ;; *) fail "an unknown target field: $r" ;; esac
r=$("$REQ" "$SOCK" "{\"op\": \"plan\", \"spec_json\": $spec_text, \"target\": {\"backend\": \"cuda\",
  \"gpu_mem_limit\": 25769803776, \"host_mem_limit\": \"64GiB\"}}")
case "$r" in *'"ok":true'*'"gpu_mem_limit":25769803776'*) ;; *) fail "sizes as integers: $r" ;; esac
r=$("$REQ" "$SOCK" "{\"op\": \"submit\", \"spec_json\": $spec_text, \"target\": {\"backend\": \"cuda\"}}")
case "$r" in *"target: only plan takes a target"*) ;; *) fail "submit took a target: $r" ;; esac

# the daemon's own machine is as it was: a cpu daemon without jobs
[ "$(ztctl --json status | json_get backend)" = cpu ] || fail "status: $(ztctl --json status)"
[ "$(ztctl --json jobs | json_get jobs)" = "[]" ] || fail "jobs: $(ztctl --json jobs)"
stop_ztd
echo "plan_target: ok"
