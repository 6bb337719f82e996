#!/bin/bash
# The time from a job's start to its first step through ztd (issue 17 item 7): a random-init
# GPT-2 1.5B (bf16, all on the GPU) or a Llama-3-shaped 8B (bf16, optimizer on the host), one
# micro-batch of 1024 tokens, 2 steps. Prints the job log's lines: "ready to train S s" (devices,
# the init, every buffer: the target is 5 s for 1.5b, 20 s for 8b) and "first step (1) done S s"
# (that plus the model's own first step), and ztd's "open in" line (where the open's time went).
# usage: tools/bench/first_step.sh BUILD_DIR 124m|1.5b|8b [ztd flags...]   (e.g. --backend cuda);
# SEQ=N sets seq_len (default 1024; a smaller one keeps a cpu run of 124m short), PRECISION the
# precision (default bf16; the cpu backend takes fp32 only), STATE_DTYPE AdamW's moments (fp32
# or bf16: train.optimizer.state_dtype; the 8b's optimizer on the host needs 128 GB with fp32
# moments, 96 GB with bf16).
set -euo pipefail
build=$1 model=$2
shift 2
tmp=$(mktemp -d /tmp/zt-first-step.XXXXXX)
ztd_pid=
trap '[ -n "$ztd_pid" ] && kill "$ztd_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' EXIT
sock=$tmp/ztd.sock
ztctl() { "$build/client/ztctl/ztctl" --socket "$sock" "$@"; }
"$build/engine/server/ztd" --socket "$sock" --state-dir "$tmp/state" "$@" >"$tmp/ztd.log" 2>&1 &
ztd_pid=$!
for _ in $(seq 1 100); do ztctl status >/dev/null 2>&1 && break; sleep 0.1; done
ztctl tokenize --bytes "$(dirname "$0")/../../docs/spec.md" "$tmp/tok.zt" >/dev/null
seq=${SEQ:-1024}
case $model in
124m) m='"arch": "gpt", "vocab": 50304, "seq_len": '$seq', "d_model": 768, "n_heads": 12, "n_layers": 12'
      off='' ;;
1.5b) m='"arch": "gpt", "vocab": 50304, "seq_len": '$seq', "d_model": 1600, "n_heads": 25, "n_layers": 48'
      off='' ;;
8b)   m='"arch": "llama", "vocab": 128256, "seq_len": '$seq', "d_model": 4096, "n_heads": 32,
         "n_kv_heads": 8, "n_layers": 32, "d_ff": 14336, "rope_theta": 500000'
      off=', "offload": {"params": "gpu", "optimizer": "host"}' ;;
*) echo "model: 124m, 1.5b or 8b" >&2; exit 2 ;;
esac
cat >"$tmp/job.json" <<JSON
{"name": "first-step-$model", "model": {$m, "init": {"seed": 1}},
 "train": {"steps": 2, "micro_batch": 1, "precision": "${PRECISION:-bf16}", "optimizer": {"lr": 1e-4, "state_dtype": "${STATE_DTYPE:-fp32}"}},
 "data": {"source": "file", "path": "$tmp/tok.zt"}, "checkpoint": {"every": 0}$off}
JSON
job=$(ztctl submit "$tmp/job.json") || { cat "$tmp/ztd.log" >&2; exit 1; }
ztctl watch "$job" >/dev/null || { cat "$tmp/ztd.log" >&2; exit 1; }
grep -E "ready to train|first step|done at step|failed" "$tmp/state/jobs/$job/log"
grep -E "open in" "$tmp/ztd.log" || true
