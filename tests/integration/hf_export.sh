#!/usr/bin/env bash
# The way back to Hugging Face (ztctl export --hf): a tiny Llama as a download has it (config.json
# in transformers 5's form, two BF16 shards and their index, tokenizer files) trains through ztd
# on the cpu backend; its checkpoint exported as fp32, bf16 and in small shards: config.json in
# the hub's form with the source's fields, the tokenizer files copied, the tensors bitwise the
# checkpoint's (bf16: each rounded to nearest even), the shards and index consistent. The fp32
# directory loads back into a new job bitwise: that job's step-0 checkpoint is the first job's,
# its own export is the first export byte for byte, and its first step's loss is the first
# job's loss of the step after the checkpoint, on the same batch. A GPT-2 job the same way
# (GPT2LMHeadModel's names). And the refusals: no checkpoint yet, a bad dtype or format, an
# export that was replaced (ESTALE).
source "$(dirname "$0")/lib.sh"
HF="python3 $(dirname "$0")/hf_files.py"
PUSH="$ZT_TEST_BIN_DIR/push_batches"
REQ="$ZT_TEST_BIN_DIR/request"

start_ztd
make_tokens "$ZT_TMP/text.zt"
SRC=$ZT_TMP/src
$HF make-llama "$SRC" || fail "making the source directory"

# hf_spec OUT DIR SEQ_LEN: a stream job of DIR's model, 4 steps, a checkpoint every 3 (the
# newest kept)
hf_spec() {
  cat >"$1" <<JSON
{"name": "hf", "model": {"hf": "$2", "seq_len": $3},
 "train": {"steps": 4, "micro_batch": 2, "optimizer": {"lr": 0.001}, "seed": 3},
 "data": {"source": "stream"}, "checkpoint": {"every": 3, "keep": 1}}
JSON
}
# show_field JOB FIELD
show_field() { ztctl --json show "$1" | json_get "$2"; }
# wait_ckpt JOB STEP: until the job's newest checkpoint is STEP
wait_ckpt() {
  local i
  for i in $(seq 1 600); do
    [ "$(show_field "$1" checkpoint_step 2>/dev/null)" = "$2" ] && return 0
    sleep 0.1
  done
  fail "job $1 has no checkpoint at step $2"
}
# loss JOB STEP: the loss of step STEP as the job's losses.log has it (every digit)
loss() { awk -v s="$2" '$1 == s { print $2 }' "$STATE/jobs/$1/losses.log"; }

# ---- a Llama from a Hugging Face directory ---------------------------------------------------
hf_spec "$ZT_TMP/a.json" "$SRC" 32
a=$(new_job "$ZT_TMP/a.json") || exit 1
expect_fail 1 "has no checkpoint yet" ztctl export "$a" "$ZT_TMP/none" --hf
"$PUSH" "$SOCK" "$a" 3 || fail "pushing into $a"
wait_ckpt "$a" 3
# the job now waits for step 4's batch, its newest checkpoint step 3's
ztctl export "$a" "$ZT_TMP/a3.safetensors" >/dev/null || fail "single-file export of $a"
out=$(ztctl export "$a" "$ZT_TMP/d32" --hf --dtype fp32) || fail "export --hf fp32: $out"
case "$out" in *"step 3 exported to $ZT_TMP/d32 (Hugging Face, fp32, 6 files"*) ;;
  *) fail "export --hf said: $out" ;; esac
# two clients asking at once for the same export: both get it
ztctl export "$a" "$ZT_TMP/d16" --hf >/dev/null & p1=$!
ztctl export "$a" "$ZT_TMP/d16c" --hf >/dev/null || fail "export --hf (bf16), the second client"
wait $p1 || fail "export --hf (bf16)"
diff -r "$ZT_TMP/d16" "$ZT_TMP/d16c" || fail "two clients got two exports"
listing=$(ztctl --json export "$a" "$ZT_TMP/d32s" --hf --dtype fp32 --max-shard-size 20KB) ||
  fail "export --hf in 20 KB shards: $listing"
[ "$(printf '%s' "$listing" | json_get step)" = 3 ] || fail "listing: $listing"

$HF config "$ZT_TMP/d32" llama float32 "$SRC" || fail "d32's config.json"
$HF config "$ZT_TMP/d16" llama bfloat16 "$SRC" || fail "d16's config.json"
for f in tokenizer.json tokenizer_config.json special_tokens_map.json generation_config.json; do
  cmp "$SRC/$f" "$ZT_TMP/d32/$f" || fail "$f not copied as it is"
done
[ -f "$ZT_TMP/d32/model.safetensors" ] && [ ! -e "$ZT_TMP/d32/model.safetensors.index.json" ] ||
  fail "d32 is not one model.safetensors"
ls "$ZT_TMP/d32" | grep -q tmp && fail "a temporary file left in d32: $(ls "$ZT_TMP/d32")"
$HF same "$ZT_TMP/a3.safetensors" "$ZT_TMP/d32" || fail "d32's tensors are not the checkpoint's"
$HF bf16 "$ZT_TMP/a3.safetensors" "$ZT_TMP/d16" || fail "d16's tensors"
$HF sharded "$ZT_TMP/d32s" 20000 || fail "d32s's shards"
$HF same "$ZT_TMP/d32" "$ZT_TMP/d32s" || fail "d32s's tensors are not d32's"
echo "ok: step 3 of $a exported: fp32, bf16, 20 KB shards"

# a bf16 export replaced by an fp32 one: the bf16 one is gone (ESTALE); a bad dtype and format
old=$(ztctl --json export "$a" "$ZT_TMP/d16b" --hf | json_get export) || fail "bf16 again"
ztctl export "$a" "$ZT_TMP/d32b" --hf --dtype fp32 >/dev/null || fail "fp32 again"
r=$("$REQ" "$SOCK" "{\"op\": \"export\", \"job\": \"$a\", \"export\": \"$old\",
    \"file\": \"config.json\"}")
case "$r" in *'"code":"ESTALE"'*"ask for its files again"*) ;;
  *) fail "a replaced export: $r" ;; esac
r=$("$REQ" "$SOCK" "{\"op\": \"export\", \"job\": \"$a\", \"format\": \"hf\", \"dtype\": \"fp16\"}")
case "$r" in *'"code":"EINVAL"'*'dtype must be'*) ;; *) fail "dtype fp16: $r" ;; esac
r=$("$REQ" "$SOCK" "{\"op\": \"export\", \"job\": \"$a\", \"format\": \"onnx\"}")
case "$r" in *'"code":"EINVAL"'*'format must be'*) ;; *) fail "format onnx: $r" ;; esac
r=$("$REQ" "$SOCK" "{\"op\": \"export\", \"job\": \"$a\", \"export\": \"../../x\",
    \"file\": \"y\"}")
case "$r" in *'"code":"EINVAL"'*) ;; *) fail "export ../../x: $r" ;; esac
expect_fail 2 "--dtype is bf16 or fp32" ztctl export "$a" "$ZT_TMP/x" --hf --dtype fp16
expect_fail 2 "--dtype goes with --hf" ztctl export "$a" "$ZT_TMP/x" --dtype fp32

"$PUSH" "$SOCK" "$a" 1 3 || fail "pushing step 4's batch into $a"
wait_end "$a" done
loss_a4=$(loss "$a" 4)
# the final checkpoint pruned step 3's, and its export with it
[ -d "$STATE/jobs/$a/export" ] && [ -z "$(ls -A "$STATE/jobs/$a/export")" ] ||
  fail "step 3's export outlived its checkpoint: $(ls -A "$STATE/jobs/$a/export")"

# ---- the fp32 export as a new job's model ---------------------------------------------------
hf_spec "$ZT_TMP/b.json" "$ZT_TMP/d32" 32
b=$(new_job "$ZT_TMP/b.json") || exit 1
wait_state "$b" running
ztctl checkpoint "$b" >/dev/null || fail "a step-0 checkpoint of $b"
ztctl export "$b" "$ZT_TMP/b0.safetensors" >/dev/null || fail "single-file export of $b"
$HF same "$ZT_TMP/a3.safetensors" "$ZT_TMP/b0.safetensors" ||
  fail "the new job's weights are not the first job's"
ztctl export "$b" "$ZT_TMP/db" --hf --dtype fp32 >/dev/null || fail "export --hf of $b"
diff -r "$ZT_TMP/d32" "$ZT_TMP/db" || fail "the new job's export is not the first's"
# step 4's batch again: the new job's first step is the first job's fourth
"$PUSH" "$SOCK" "$b" 1 3 || fail "pushing into $b"
wait_step "$b" 1
loss_b1=$(loss "$b" 1)
[ -n "$loss_a4" ] && [ "$loss_b1" = "$loss_a4" ] ||
  fail "the new job's first loss $loss_b1 is not the first job's fourth $loss_a4"
echo "ok: the export loads back bitwise (loss $loss_b1 both)"
ztctl cancel "$b" >/dev/null || fail "cancel $b"

# ---- GPT-2 ----------------------------------------------------------------------------------
ARCH=gpt spec "$ZT_TMP/g.json" "$ZT_TMP/text.zt" 3
g=$(new_job "$ZT_TMP/g.json") || exit 1
wait_end "$g" done
ztctl export "$g" "$ZT_TMP/g.safetensors" >/dev/null || fail "single-file export of $g"
ztctl export "$g" "$ZT_TMP/g32" --hf --dtype fp32 >/dev/null || fail "export --hf of $g"
$HF config "$ZT_TMP/g32" gpt2 float32 || fail "g32's config.json"
$HF same "$ZT_TMP/g.safetensors" "$ZT_TMP/g32" transformer. || fail "g32's tensors"
cat >"$ZT_TMP/h.json" <<JSON
{"name": "gpt-back", "model": {"hf": "$ZT_TMP/g32", "seq_len": 16},
 "train": {"steps": 2, "micro_batch": 4, "optimizer": {"lr": 0.01}}, "data": {"source": "stream"}}
JSON
h=$(new_job "$ZT_TMP/h.json") || exit 1
wait_state "$h" running
ztctl checkpoint "$h" >/dev/null || fail "a step-0 checkpoint of $h"
ztctl export "$h" "$ZT_TMP/h0.safetensors" >/dev/null || fail "single-file export of $h"
$HF same "$ZT_TMP/g.safetensors" "$ZT_TMP/h0.safetensors" || fail "GPT-2 back: not bitwise"
ztctl cancel "$h" >/dev/null || fail "cancel $h"
echo "ok: GPT-2 exported as GPT2LMHeadModel and loaded back bitwise"

stop_ztd
echo "hf_export: ok"
