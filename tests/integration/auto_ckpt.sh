#!/bin/bash
# "activation_checkpointing": {"every": "auto"} without offload: under a memory limit the job
# that does not fit without checkpointing is admitted with the least recompute that fits, runs,
# and its stored spec records the choice; one that fits anyway is not checkpointed; one that
# fits in no way is refused with the numbers.
. "$(dirname "$0")/lib.sh"

start_ztd --backend cpu --host-mem-limit 40MiB
make_tokens "$ZT_TMP/gpl.zt"
# every OUT EVERY SEQ: a 4-layer model whose activations dominate at SEQ tokens
every() {
  spec "$1" "$ZT_TMP/gpl.zt" 3
  python3 - "$@" <<'PY'
import json, sys
path, every, seq = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = json.load(open(path))
s["model"].update(n_layers=4, d_model=64, seq_len=seq)
s["train"]["micro_batch"] = 8
s["train"]["activation_checkpointing"] = {"every": every if every == "auto" else int(every)}
json.dump(s, open(path, "w"))
PY
}
every "$ZT_TMP/none.json" 0 256
every "$ZT_TMP/auto.json" auto 256
every "$ZT_TMP/small.json" auto 32
every "$ZT_TMP/huge.json" auto 4096
out=$(ztctl plan "$ZT_TMP/none.json" 2>&1) && fail "the job fits without checkpointing: $out"
case "$out" in *ENOMEM*"host memory"*|*ENOMEM*"job needs"*) ;; *) fail "refusal: $out" ;; esac
job=$(submit "$ZT_TMP/auto.json")
wait_state "$job" done
k=$(ztctl --json show "$job" | json_get spec.train.activation_checkpointing.every)
[ "$k" -ge 1 ] || fail "auto resolved to every $k under the limit"
job=$(submit "$ZT_TMP/small.json")
wait_state "$job" done
[ "$(ztctl --json show "$job" | json_get spec.train.activation_checkpointing.every)" = 0 ] ||
  fail "a job that fits was checkpointed"
out=$(ztctl submit "$ZT_TMP/huge.json" 2>&1) && fail "a job that cannot fit was accepted: $out"
case "$out" in *ENOMEM*) ;; *) fail "refusal of the huge job: $out" ;; esac
stop_ztd
echo "auto_ckpt: ok (every $k under 40 MiB)"
