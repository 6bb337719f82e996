#!/bin/bash
# ztrain reads ztd job specs (one JSON reader for ztd and ztrain): it trains one, twice to the
# same bits; the trainer's old flat config is refused naming its first unknown field; a multi-rank
# job spec is refused (ztrain runs one rank) and a broken file is named.
. "$(dirname "$0")/lib.sh"

spec "$ZT_TMP/job.json" stream 4
python3 - "$ZT_TMP" <<'PY'
import json, random, struct, sys
d = sys.argv[1]
job = json.load(open(f"{d}/job.json"))
m, t = job["model"], job["train"]
flat = {"model": {"arch": m["arch"], "vocab": m["vocab"], "seq_len": m["seq_len"],
                  "d_model": m["d_model"], "n_heads": m["n_heads"], "n_layers": m["n_layers"],
                  "init_seed": m["init"]["seed"]},
        "train": {"steps": t["steps"], "micro_batch": t["micro_batch"], "grad_accum": 1,
                  "lr": t["optimizer"]["lr"], "seed": t["seed"]}}
json.dump(flat, open(f"{d}/flat.json", "w"))
job["parallel"] = {"gpus": 2}
json.dump(job, open(f"{d}/two.json", "w"))
tokens = json.loads(json.dumps(job))
del tokens["parallel"]
tokens["train"]["batch_tokens"] = t["micro_batch"] * m["seq_len"]
del tokens["train"]["micro_batch"]
json.dump(tokens, open(f"{d}/tokens.json", "w"))
random.seed(5)
n = t["steps"] * t["micro_batch"] * (m["seq_len"] + 1)
open(f"{d}/tok.bin", "wb").write(struct.pack(f"<{n}i", *(random.randrange(m["vocab"]) for _ in range(n))))
open(f"{d}/bad.json", "w").write('{"model": ')
PY
a=$("$ZTRAIN" --spec "$ZT_TMP/job.json" --batches "$ZT_TMP/tok.bin" --json) || fail "ztrain job spec: $a"
b=$("$ZTRAIN" --spec "$ZT_TMP/job.json" --batches "$ZT_TMP/tok.bin" --json) || fail "ztrain again: $b"
python3 - "$a" "$b" <<'PY' || fail "the same spec trains differently"
import json, sys
a, b = (json.loads(x) for x in sys.argv[1:3])
assert a["losses"] == b["losses"] and len(a["losses"]) == 4, (a["losses"], b["losses"])
print("ztrain: a job spec trains, twice alike:", a["losses"])
PY
out=$("$ZTRAIN" --spec "$ZT_TMP/flat.json" --batches "$ZT_TMP/tok.bin" 2>&1) && fail "flat config accepted"
case "$out" in *"unknown field 'model.init_seed'"*) ;; *) fail "flat config: $out" ;; esac
out=$("$ZTRAIN" --spec "$ZT_TMP/two.json" --batches "$ZT_TMP/tok.bin" 2>&1) && fail "2 ranks accepted"
case "$out" in *"parallel.gpus 2: ztrain runs one rank"*) ;; *) fail "refusal: $out" ;; esac
out=$("$ZTRAIN" --spec "$ZT_TMP/tokens.json" --batches "$ZT_TMP/tok.bin" 2>&1) && fail "batch_tokens split"
case "$out" in *"train.batch_tokens without train.micro_batch and train.grad_accum: ztd's planner splits it"*) ;;
  *) fail "batch_tokens refusal: $out" ;; esac
out=$("$ZTRAIN" --spec "$ZT_TMP/bad.json" --batches "$ZT_TMP/tok.bin" 2>&1) && fail "bad JSON accepted"
case "$out" in *bad.json*) ;; *) fail "bad JSON: $out" ;; esac
echo "ztrain: ok"
