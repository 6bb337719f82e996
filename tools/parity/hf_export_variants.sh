#!/usr/bin/env bash
# Exports for hf_export_check.py: a ztd of BUILD (any backend; the cpu one is exact) trains tiny
# models of each Hugging Face class zt writes and exports them with `ztctl export --hf`:
#   llama-src   a Llama as a download has it (tests/integration/hf_files.py make-llama: two BF16
#               shards, a byte-level tokenizer), 3 steps; fp32, bf16 and 20 KB shards
#   qwen2       random init, q/k/v biases, tied, linear RoPE     -> Qwen2ForCausalLM
#   qwen3       random init, q/k norms, head_dim 6 != 32 / 4      -> Qwen3ForCausalLM
#   llama3      random init, Llama 3.1's RoPE scaling, untied     -> LlamaForCausalLM
#   gpt2        random init GPT-2                                 -> GPT2LMHeadModel
# For each fp32 export, a second job started from it gives zt's loss of one batch on those
# weights: OUT/checks.txt has a line of hf_export_check.py arguments per export, with that
# batch as a token file and its loss as --expect-loss (bf16 exports: no loss to compare), paths
# relative to OUT, so that OUT may be checked on another machine.
#   tools/parity/hf_export_variants.sh BUILD OUT     make the exports
#   tools/parity/hf_export_variants.sh --check OUT   run hf_export_check.py on each line (the GPU
#                                                    machine: transformers and torch)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
if [ "$1" = --check ]; then
  cd "$2"
  status=0
  while read -r line; do
    echo "== $line"
    # shellcheck disable=SC2086
    python3 "$HERE/hf_export_check.py" $line || status=1
  done <checks.txt
  exit $status
fi
BUILD=$(cd "$1" && pwd)
mkdir -p "$2"
OUT=$(cd "$2" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
ZTCTL="$BUILD/client/ztctl/ztctl --socket $OUT/ztd.sock"
PUSH="$BUILD/tests/integration/push_batches"
rm -rf "$OUT/state" "$OUT"/checks.txt
"$BUILD/engine/server/ztd" --socket "$OUT/ztd.sock" --state-dir "$OUT/state" --cpu-threads 2 \
  >"$OUT/ztd.log" 2>&1 &
ZTD=$!
trap 'kill $ZTD 2>/dev/null || true' EXIT
for i in $(seq 1 100); do $ZTCTL status >/dev/null 2>&1 && break; sleep 0.1; done

python3 "$ROOT/tests/integration/hf_files.py" make-llama "$OUT/src"
$ZTCTL tokenize --bytes "$ROOT/docs/spec.md" "$OUT/text.zt" >/dev/null
TRAIN='"train": {"steps": 3, "micro_batch": 2, "optimizer": {"lr": 0.003}, "seed": 1}'
DATA="\"data\": {\"source\": \"file\", \"path\": \"$OUT/text.zt\"}"

# run NAME MODEL_JSON SEQ: trains it, exports fp32 (and bf16), adds the checks
run() {
  local name=$1 model=$2 seq=$3 job
  echo "{\"name\": \"$name\", \"model\": $model, $TRAIN, $DATA}" >"$OUT/$name.json"
  job=$($ZTCTL submit "$OUT/$name.json")
  $ZTCTL watch "$job" >/dev/null
  $ZTCTL export "$job" "$OUT/$name-fp32" --hf --dtype fp32 >/dev/null
  $ZTCTL export "$job" "$OUT/$name-bf16" --hf >/dev/null
  # zt's loss of batch 0 (push_batches' tokens) on the exported weights
  echo "{\"name\": \"$name-back\", \"model\": {\"hf\": \"$OUT/$name-fp32\", \"seq_len\": $seq},
    \"train\": {\"steps\": 1, \"micro_batch\": 2, \"optimizer\": {\"lr\": 0.003}},
    \"data\": {\"source\": \"stream\"}}" >"$OUT/$name-back.json"
  local back
  back=$($ZTCTL submit "$OUT/$name-back.json")
  "$PUSH" "$OUT/ztd.sock" "$back" 1 0
  $ZTCTL watch "$back" >/dev/null
  local loss
  loss=$(awk '$1 == 1 { print $2 }' "$OUT/state/jobs/$back/losses.log")
  python3 - "$OUT/$name-fp32/config.json" "$OUT/$name.tok" "$seq" <<'PY'
import json, struct, sys
vocab = json.load(open(sys.argv[1]))["vocab_size"]
T, B = int(sys.argv[3]), 2
ids = [(0 * 131 + i * 7 + i // 5) % vocab for i in range(B * (T + 1))]  # push_batches' batch 0
with open(sys.argv[2], "wb") as f:
    f.write(b"ZTTOKENS" + struct.pack("<4I", 1, 4, vocab, 0) + struct.pack("<%dI" % len(ids), *ids))
PY
  local src=""
  [ "$name" = llama-src ] && src="--source src" && SRC_JOB=$job
  echo "$name-fp32 $src --tokens $name.tok --rows 2 --seq $seq --expect-loss $loss" \
    >>"$OUT/checks.txt"
  echo "$name-bf16 $src --tokens $name.tok --rows 2 --seq $seq" >>"$OUT/checks.txt"
}

LL='"arch": "llama", "vocab": 256, "seq_len": 32, "d_model": 32, "n_heads": 4, "n_layers": 2'
run llama-src "{\"hf\": \"$OUT/src\", \"seq_len\": 32}" 32
run qwen2 "{$LL, \"n_kv_heads\": 2, \"qkv_bias\": true, \"tie_embeddings\": true,
  \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}, \"rms_eps\": 1e-6}" 32
run qwen3 "{$LL, \"n_kv_heads\": 2, \"head_dim\": 6, \"qk_norm\": true, \"rope_theta\": 1000000}" 32
run llama3 "{$LL, \"n_kv_heads\": 1, \"rope_theta\": 500000,
  \"rope_scaling\": {\"type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,
  \"original_max_position_embeddings\": 16}}" 32
run gpt2 '{"arch": "gpt", "vocab": 256, "seq_len": 16, "d_model": 32, "n_heads": 2,
  "n_layers": 2}' 15
$ZTCTL export "$SRC_JOB" "$OUT/llama-src-shards" --hf --dtype fp32 --max-shard-size 20KB >/dev/null
echo "llama-src-shards --source src --tokens llama-src.tok --rows 2 --seq 32" \
  "$(grep -o -- '--expect-loss .*' "$OUT/checks.txt" | head -1)" >>"$OUT/checks.txt"
$ZTCTL shutdown >/dev/null
wait $ZTD || true
trap - EXIT
echo "exports in $OUT; check them with: $0 --check $OUT"
