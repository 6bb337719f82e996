#!/bin/bash
# train.batch_tokens (docs/spec.md): with micro_batch and grad_accum left out or "auto", ztd
# splits the step's tokens into the micro-batches the cost model finds fastest within the
# memory (here a host limit under which the whole step in one micro-batch needs checkpointing
# and two micro-batches of half the rows do not); plan and the stored spec say the split (also
# after a restart), and the job trains bitwise as the same split given by hand. A batch_tokens
# no split gives is refused naming the nearest ones; "auto" without batch_tokens, a split that
# does not multiply to batch_tokens, are refused naming the fields.
. "$(dirname "$0")/lib.sh"

start_ztd --backend cpu --host-mem-limit 40MiB
make_tokens "$ZT_TMP/gpl.zt"
# bspec OUT TRAIN_JSON: a 4-layer model of 256 tokens a row whose activations dominate
bspec() {
  spec "$1" "$ZT_TMP/gpl.zt" 3
  python3 - "$@" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["model"].update(n_layers=4, d_model=64, seq_len=256)
del s["train"]["micro_batch"]
s["train"].update(json.loads(sys.argv[2]))
json.dump(s, open(sys.argv[1], "w"))
PY
}
bspec "$ZT_TMP/auto.json" '{"batch_tokens": 2048}'
bspec "$ZT_TMP/autos.json" '{"batch_tokens": 2048, "micro_batch": "auto", "grad_accum": "auto"}'
bspec "$ZT_TMP/hand.json" '{"micro_batch": 4, "grad_accum": 2}'
bspec "$ZT_TMP/odd.json" '{"batch_tokens": 2000}'
bspec "$ZT_TMP/odd3.json" '{"batch_tokens": 2048, "micro_batch": 3}'
bspec "$ZT_TMP/noauto.json" '{"micro_batch": "auto"}'
bspec "$ZT_TMP/wrong.json" '{"batch_tokens": 2048, "micro_batch": 2, "grad_accum": 2}'

for op in submit plan; do
  expect_fail 1 "train.batch_tokens 2000 does not split into whole micro-batches of 1 rank(s) x \
model.seq_len 256 = 256 tokens: the nearest that do are 1792 and 2048" ztctl "$op" "$ZT_TMP/odd.json"
  expect_fail 1 "x model.seq_len 256 x train.micro_batch 3 = 768 tokens: the nearest that do \
are 1536 and 2304" ztctl "$op" "$ZT_TMP/odd3.json"
  expect_fail 1 'train.micro_batch must be an integer in [1, 65536] ("auto" needs train.batch_tokens)' \
    ztctl "$op" "$ZT_TMP/noauto.json"
  expect_fail 1 "train.batch_tokens 2048 is not train.micro_batch 2 x train.grad_accum 2 x 1 \
rank(s) x model.seq_len 256 = 1024 tokens" ztctl "$op" "$ZT_TMP/wrong.json"
done

# one micro-batch of 8 rows needs 61.7 MiB (checkpointing would fit it), 4 rows 32.6 MiB
for f in auto autos; do
  out=$(ztctl plan "$ZT_TMP/$f.json") || fail "plan $f: $out"
  case "$out" in *"batch: 2048 tokens a step = train.micro_batch 4 x train.grad_accum 2 x 1 rank(s) x model.seq_len 256"*) ;;
    *) fail "plan of $f: $out" ;; esac
done
a=$(submit "$ZT_TMP/auto.json")
h=$(submit "$ZT_TMP/hand.json")
wait_end "$a" done 300
wait_end "$h" done 300
check() {
  python3 - "$(ztctl --json show "$a")" "$(ztctl --json show "$h")" <<'PY' || fail "$1"
import json, sys
a, h = (json.loads(x) for x in sys.argv[1:])
t = a["spec"]["train"]
assert (t["micro_batch"], t["grad_accum"], t["batch_tokens"]) == (4, 2, 2048), t
assert t["activation_checkpointing"]["every"] == 0, t
assert len(a["losses"]) == 3 and a["losses"] == h["losses"], (a["losses"], h["losses"])
print("batch_tokens 2048: micro_batch 4 x grad_accum 2, no checkpointing; losses bitwise the "
      "split given by hand")
PY
}
check "the planned split"
stop_ztd
start_ztd --backend cpu --host-mem-limit 40MiB
check "the planned split after a restart"
stop_ztd
echo "batch_tokens: ok"
