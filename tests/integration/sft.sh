#!/bin/bash
# Supervised fine-tuning through ztd on the CPU backend: each document is a random prompt then a
# fixed answer. With the prompt masked (labels -100, `ztctl pack`) the loss is the answer's and
# falls below 0.05 within 200 steps of a tiny model; without the mask the loss counts the prompt
# too and stays above its share of the prompt's entropy. Then a job on shuffled documents killed
# mid-run (SIGKILL) resumes from its checkpoint with the batches it would have seen: its losses
# are bitwise those of the uninterrupted run.
. "$(dirname "$0")/lib.sh"

PROMPT=12 VOCAB_PROMPT=48
python3 - "$ZT_TMP" "$PROMPT" "$VOCAB_PROMPT" <<'PY'
import json, random, sys
out, P, V = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(7)
answer = list(range(51, 59)) + [60]
with open(out + "/masked.jsonl", "w") as m, open(out + "/plain.jsonl", "w") as p:
    for _ in range(1000):
        ids = [2 + rng.randrange(V) for _ in range(P)] + [1] + answer
        m.write(json.dumps({"input_ids": ids, "labels": [-100] * (P + 1) + ids[P + 1:]}) + "\n")
        p.write(json.dumps({"input_ids": ids}) + "\n")
PY
ztctl pack "$ZT_TMP/masked.jsonl" "$ZT_TMP/masked.tok" --vocab 64 >/dev/null || fail "pack masked"
ztctl pack "$ZT_TMP/plain.jsonl" "$ZT_TMP/plain.tok" --vocab 64 >/dev/null || fail "pack plain"

# sft_spec OUT FILE STEPS [extra data members]
sft_spec() {
  cat >"$1" <<JSON
{"name": "sft", "model": {"arch": "gpt", "vocab": 64, "seq_len": 32, "d_model": 32,
 "n_heads": 2, "n_layers": 2, "init": {"seed": 1}},
 "train": {"steps": $3, "micro_batch": 8, "optimizer": {"lr": 0.01}, "seed": 3},
 "data": {"source": "file", "path": "$2"${4:-}}, "checkpoint": {"every": 10, "keep": 2}}
JSON
}

start_ztd --backend cpu
sft_spec "$ZT_TMP/masked.json" "$ZT_TMP/masked.tok" 200
sft_spec "$ZT_TMP/plain.json" "$ZT_TMP/plain.tok" 200
masked=$(new_job "$ZT_TMP/masked.json") || exit 1
plain=$(new_job "$ZT_TMP/plain.json") || exit 1
wait_end "$masked" done 600
wait_end "$plain" done 600
python3 - "$(ztctl --json show "$masked")" "$(ztctl --json show "$plain")" "$PROMPT" "$VOCAB_PROMPT" <<'PY' || fail "the SFT task"
import json, math, sys
m, p = (json.loads(a) for a in sys.argv[1:3])
P, V = int(sys.argv[3]), int(sys.argv[4])
lm = [x[-1] if isinstance(x, list) else x for x in m["losses"]]
lp = [x[-1] if isinstance(x, list) else x for x in p["losses"]]
assert len(lm) == len(lp) == 200, (len(lm), len(lp))
# the unmasked loss counts P - 1 random prompt targets of the P + 9 a document has
floor = (P - 1) * math.log(V) / (P + 9)
end_m, end_p = sum(lm[-10:]) / 10, sum(lp[-10:]) / 10
first = next(i for i, x in enumerate(lm) if x < 0.05) + 1 if min(lm) < 0.05 else None
print("masked: first %.3f, last 10 %.4f (below 0.05 from step %s); unmasked: last 10 %.3f, "
      "the prompt's share of its entropy %.3f" % (lm[0], end_m, first, end_p, floor))
assert end_m < 0.05, end_m
assert end_p > 0.9 * floor, (end_p, floor)
PY

# shuffled documents, killed at step 13 (a checkpoint at 10), resumed: the same 40 losses
sft_spec "$ZT_TMP/shuf.json" "$ZT_TMP/masked.tok" 40 ', "shuffle": true'
ref=$(new_job "$ZT_TMP/shuf.json") || exit 1
wait_end "$ref" done 300
ev="$ZT_TMP/events" re='"event": *"step".*"step": *13[,}]'
while IFS= read -r line; do
  printf '%s\n' "$line" >>"$ev"
  if [[ $line =~ $re ]]; then
    kill -KILL "$ZTD_PID"
    break
  fi
done < <(ztctl --json submit "$ZT_TMP/shuf.json" --watch)
wait "$ZTD_PID" 2>/dev/null
ZTD_PID=
grep -Eq "$re" "$ev" || fail "the shuffled job ended without reaching step 13: $(cat "$ev")"
job=$(head -n 1 "$ev" | json_get job) || fail "no job id: $(cat "$ev")"
start_ztd --backend cpu
wait_end "$job" done 300
grep -q "resumes from .*step-000000[1-3]0 (step [1-3]0)" "$STATE/jobs/$job/log" ||
  fail "job $job did not resume from a checkpoint: $(cat "$STATE/jobs/$job/log")"
python3 - "$(ztctl --json show "$ref")" "$(ztctl --json show "$job")" <<'PY' || fail "losses after the resume differ"
import json, sys
ref, job = (json.loads(a) for a in sys.argv[1:3])
assert ref["spec"]["data"]["shuffle"] is True, ref["spec"]
assert len(ref["losses"]) == 40 and job["losses"] == ref["losses"], (ref["losses"], job["losses"])
print("shuffled documents: 40 losses of the resumed job bitwise equal to the uninterrupted run")
PY
stop_ztd
echo "sft: ok"
