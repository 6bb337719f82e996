#!/bin/bash
# Refusals that say what to do (docs/spec.md "Checks against the machine"): a job that does not
# fit is refused with its sizes in KiB/MiB/GiB, its two consumers named (activations, and
# parameters, gradients and AdamW state) and the first change that fits with the field's full
# path and what a device then holds: checkpointing "auto", a smaller micro-batch with the
# grad_accum that keeps the step's tokens; an offloaded job's budget refusals in sizes too.
. "$(dirname "$0")/lib.sh"

start_ztd --backend cpu --host-mem-limit 40MiB
make_tokens "$ZT_TMP/gpl.zt"
# rspec OUT TRAIN_JSON [OFFLOAD_JSON]: a 4-layer model of 256 tokens a row whose activations
# dominate
rspec() {
  spec "$1" "$ZT_TMP/gpl.zt" 3
  python3 - "$@" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["model"].update(n_layers=4, d_model=64, seq_len=256)
s["train"].update(json.loads(sys.argv[2]))
if len(sys.argv) > 3:
    s["offload"] = json.loads(sys.argv[3])
json.dump(s, open(sys.argv[1], "w"))
PY
}
rspec "$ZT_TMP/ck.json" '{"micro_batch": 8}'
rspec "$ZT_TMP/mb.json" '{"micro_batch": 32, "activation_checkpointing": {"every": 1}}'
rspec "$ZT_TMP/budget.json" '{"micro_batch": 1}' '{"gpu_budget": 1000}'
for op in submit plan; do
  expect_fail 1 "MiB on the cpu backend (activations " ztctl "$op" "$ZT_TMP/ck.json"
  expect_fail 1 " + parameters, gradients and AdamW state " ztctl "$op" "$ZT_TMP/ck.json"
  expect_fail 1 'host limit 40 MiB; fits with train.activation_checkpointing.every "auto" (' \
    ztctl "$op" "$ZT_TMP/ck.json"
  expect_fail 1 "; fits with train.micro_batch 8 and train.grad_accum 4 (" \
    ztctl "$op" "$ZT_TMP/mb.json"
  expect_fail 1 "offload.gpu_budget is 1000 B; streaming needs at least " \
    ztctl "$op" "$ZT_TMP/budget.json"
done
# each advice fits as said
python3 - "$ZT_TMP/ck.json" "$ZT_TMP/mb.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["train"]["activation_checkpointing"] = {"every": "auto"}
json.dump(s, open(sys.argv[1], "w"))
s = json.load(open(sys.argv[2]))
s["train"].update(micro_batch=8, grad_accum=4)
json.dump(s, open(sys.argv[2], "w"))
PY
ztctl plan "$ZT_TMP/ck.json" >/dev/null || fail "the checkpointing advised does not fit"
ztctl plan "$ZT_TMP/mb.json" >/dev/null || fail "the micro-batch advised does not fit"
stop_ztd
echo "refusals: ok"
