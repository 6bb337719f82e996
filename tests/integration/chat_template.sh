#!/bin/bash
# Chat examples to a fine-tuning job: chat_template.py packs them with a Hugging Face tokenizer
# through ztclient.chat_documents (the assistant turns the targets, checked token by token) and
# write_tokens; a job on the file trains through ztd. Needs tokenizers and transformers (no
# torch): tools/test.sh's venv (ZT_TEST_PYTHON) has them.
. "$(dirname "$0")/lib.sh"
python_with transformers
python_with tokenizers
[ -r "$TEXT" ] || TEXT=$(dirname "$0")/../../docs/spec.md
out=$(PYTHONPATH=$(dirname "$0")/../../client/python "$PY" "$(dirname "$0")/chat_template.py" \
  "$TEXT" "$ZT_TMP/chat.tok") || fail "chat_template.py: $out"
printf '%s\n' "$out" | head -n 1
vocab=$(printf '%s\n' "$out" | tail -n 1)
start_ztd --backend cpu
cat >"$ZT_TMP/chat.json" <<JSON
{"name": "chat", "model": {"arch": "llama", "vocab": $vocab, "seq_len": 64, "d_model": 32,
 "n_heads": 2, "n_layers": 1, "init": {"seed": 1}},
 "train": {"steps": 20, "micro_batch": 2, "optimizer": {"lr": 0.01}},
 "data": {"source": "file", "path": "$ZT_TMP/chat.tok"}}
JSON
job=$(new_job "$ZT_TMP/chat.json") || exit 1
wait_end "$job" done 300
check_learned "$job"
stop_ztd
echo "chat_template: ok"
