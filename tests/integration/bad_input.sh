#!/bin/bash
# Bad input never crashes ztd nor disturbs another client: malformed frames (bad_frames),
# invalid specs, a second daemon on the same socket, an unusable state dir, bad flags, a wrong
# TCP token. Afterwards ztd still answers and a job submitted before all this completes.
. "$(dirname "$0")/lib.sh"

port=$((20000 + RANDOM % 20000))
printf 'an-integration-test-token-0123456789\n' >"$ZT_TMP/token"
chmod 600 "$ZT_TMP/token"
start_ztd --tcp "127.0.0.1:$port" --token-file "$ZT_TMP/token"
make_tokens "$ZT_TMP/gpl.zt"

# The bystander: a job of another client that must finish untouched.
spec "$ZT_TMP/victim.json" "$ZT_TMP/gpl.zt" 40
victim=$(submit "$ZT_TMP/victim.json")

"$ZT_TEST_BIN_DIR/bad_frames" "$SOCK" || fail "bad frames"

# Specs that must be refused, with the field named.
bad_spec() { # NAME JQ-LIKE-PYTHON-EDIT NEEDLE
  python3 - "$ZT_TMP/victim.json" "$ZT_TMP/bad-$1.json" "$2" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
exec(sys.argv[3])
json.dump(s, open(sys.argv[2], "w"))
PY
  expect_fail 1 "$3" "$ZTCTL" --socket "$SOCK" submit "$ZT_TMP/bad-$1.json"
  # plan validates exactly as submit does
  expect_fail 1 "$3" "$ZTCTL" --socket "$SOCK" plan "$ZT_TMP/bad-$1.json"
}
bad_spec zero-dmodel 's["model"]["d_model"] = 0' d_model
bad_spec negative-layers 's["model"]["n_layers"] = -2' n_layers
bad_spec huge-vocab 's["model"]["vocab"] = 1 << 40' vocab
bad_spec huge-steps 's["train"]["steps"] = 10**15' steps
bad_spec heads 's["model"]["n_heads"] = 3' n_heads
bad_spec string-dim 's["model"]["seq_len"] = "16"' seq_len
bad_spec no-data 's["data"]["path"] = sys.argv[1] + ".missing"' missing
bad_spec offload-place 's["offload"] = {"params": "tape"}' offload.params
bad_spec gpu-units 's["offload"] = {"gpu_units": -1}' offload.gpu_units
bad_spec gpu-units-type 's["offload"] = {"gpu_units": "2"}' offload.gpu_units
bad_spec gpu-units-many 's["offload"] = {"gpu_units": 99}' offload.gpu_units
bad_spec host-units 's["offload"] = {"optimizer": "nvme", "host_units": -2, "nvme_dir": "/tmp"}' offload.host_units
bad_spec host-units-type 's["offload"] = {"host_units": "2"}' offload.host_units
bad_spec grad-slots 's["offload"] = {"grad_slots": 2}' offload.grad_slots
bad_spec host-budget 's["offload"] = {"host_budget": "lots"}' offload.host_budget
bad_spec nvme-budget 's["offload"] = {"nvme_budget": -5}' offload.nvme_budget
bad_spec host-budget-small 's["offload"] = {"optimizer": "host", "host_budget": 4096}' offload.host_budget
bad_spec delayed-type 's["offload"] = {"delayed_update": 1}' offload.delayed_update
bad_spec delayed-params-nvme 's["offload"] = {"delayed_update": True, "params": "nvme", "optimizer": "nvme", "nvme_dir": "/tmp"}' offload.delayed_update
bad_spec delayed-dp 's["offload"] = {"delayed_update": True}; s["parallel"] = {"gpus": 2}' offload.delayed_update
bad_spec order-word 's["offload"] = {"order": "units"}' offload.order
bad_spec order-dp 's["offload"] = {"order": "unit"}; s["parallel"] = {"gpus": 2}; s["train"]["grad_accum"] = 65' 'offload.order: unit walks at most 64'
bad_spec order-many 's["offload"] = {"order": "unit"}; s["train"]["grad_accum"] = 65' offload.order
bad_spec grads-gpu-dp 's["offload"] = {"grads": "gpu"}; s["parallel"] = {"gpus": 2}' offload.grads
bad_spec grads-nvme 's["offload"] = {"grads": "nvme"}' offload.grads
bad_spec ckpt-word 's["train"]["activation_checkpointing"] = {"every": "often"}' 'integer or "auto"'
bad_spec zero-stage 's["parallel"] = {"gpus": 1, "zero_stage": 4}' parallel.zero_stage
bad_spec gpus-word 's["parallel"] = {"gpus": "many"}' parallel.gpus
bad_spec parallel-key 's["parallel"] = {"ranks": 2}' parallel
printf '{"model": ' >"$ZT_TMP/truncated.json"
expect_fail 1 "" "$ZTCTL" --socket "$SOCK" submit "$ZT_TMP/truncated.json"

# A second daemon on the same socket is refused; the first keeps serving.
expect_fail 1 "another ztd is serving" "$ZTD" --socket "$SOCK" --state-dir "$ZT_TMP/state2"
# The state dir is in use by the first daemon, so a second one there is refused too.
expect_fail 1 "another ztd" "$ZTD" --socket "$ZT_TMP/other.sock" --state-dir "$STATE"
ztctl status >/dev/null || fail "the first ztd stopped answering"

# Unusable state dirs (a path under a regular file fails even for root).
expect_fail 1 "state dir" "$ZTD" --socket "$ZT_TMP/s1.sock" --state-dir /dev/null/x
touch "$ZT_TMP/plainfile"
expect_fail 1 "state dir" "$ZTD" --socket "$ZT_TMP/s2.sock" --state-dir "$ZT_TMP/plainfile"
expect_fail 1 "state dir" "$ZTD" --socket "$ZT_TMP/s3.sock" --state-dir "$ZT_TMP/plainfile/sub"
[ ! -e "$ZT_TMP/s1.sock" ] || fail "a refused ztd left its socket"

# Flags.
expect_fail 2 "--max-frame" "$ZTD" --max-frame lots
expect_fail 2 "--max-frame" "$ZTD" --max-frame 1KiB
expect_fail 2 "--gpu-mem-limit" "$ZTD" --gpu-mem-limit 24XB
expect_fail 2 "--host-mem-limit" "$ZTD" --host-mem-limit -5
expect_fail 2 "--gpus" "$ZTD" --gpus 0,0
expect_fail 2 "the cpu backend has no GPUs" "$ZTD" --backend cpu --gpus 0
expect_fail 2 "--cpu-ranks" "$ZTD" --cpu-ranks 0
expect_fail 2 "--cpu-ranks" "$ZTD" --cpu-ranks 65
expect_fail 2 "--cpu-threads" "$ZTD" --cpu-threads many
expect_fail 2 "--log-level" "$ZTD" --log-level loud
expect_fail 2 "--backend" "$ZTD" --backend tpu
# Without a GPU (CI) --backend cuda is refused with the reason.
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  expect_fail 1 "--backend cuda" "$ZTD" --backend cuda
fi
expect_fail 2 "--token-file" "$ZTD" --tcp 127.0.0.1:1
expect_fail 2 "--tcp" "$ZTD" --tcp nohost --token-file "$ZT_TMP/token"
expect_fail 2 "--bogus" "$ZTD" --bogus
chmod 644 "$ZT_TMP/token"
expect_fail 2 "chmod" "$ZTD" --socket "$ZT_TMP/s4.sock" --tcp 127.0.0.1:1 --token-file "$ZT_TMP/token"
chmod 600 "$ZT_TMP/token"
printf 'short\n' >"$ZT_TMP/short-token"
chmod 600 "$ZT_TMP/short-token"
expect_fail 2 "16" "$ZTD" --socket "$ZT_TMP/s5.sock" --tcp 127.0.0.1:1 --token-file "$ZT_TMP/short-token"
"$ZTD" --version | grep -q "ztd" || fail "--version"
"$ZTD" --help | grep -q -- "--max-frame" || fail "--help"

# TCP: the right token is served, a wrong one gets EACCES.
"$ZTCTL" --tcp "127.0.0.1:$port" --token-file "$ZT_TMP/token" status >/dev/null ||
  fail "status over TCP with the right token"
printf 'a-wrong-token-of-enough-length-000000\n' >"$ZT_TMP/wrong"
chmod 600 "$ZT_TMP/wrong"
expect_fail 1 "EACCES" "$ZTCTL" --tcp "127.0.0.1:$port" --token-file "$ZT_TMP/wrong" status

# Status carries the flags' memory settings and the queue.
ztctl --json status | python3 -c '
import json, sys
s = json.loads(sys.stdin.read())
for k in ("version", "backend", "devices", "memory", "queue"):
    assert k in s, k
assert s["devices"][0]["kind"] == "cpu"
# cuda is picked only where a GPU is listed
assert s["backend"] == "cpu" or any(d["kind"] == "cuda" for d in s["devices"])
assert s["queue"]["running"] + s["queue"]["queued"] >= 0 and s["memory"]["nvme_dir"] is None' || fail "status reply: $(ztctl --json status)"

# After all of that: ztd answers and the bystander's job completes and learned.
ztctl status >/dev/null || fail "status after the bad input"
wait_state "$victim" done
check_learned "$victim"
stop_ztd
echo "bad_input: ok"
