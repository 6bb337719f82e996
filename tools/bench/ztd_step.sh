#!/usr/bin/env bash
# The 1.5 B job as a user submits it (issue 17's benchmark "through ztd, not only ztrain"): GPT-2
# 1.5B (B 8 x T 1024, bf16, grad_clip 1.0, weight decay 0.1) with no "offload" object to a ztd
# whose device is limited (--gpu-mem-limit), so the daemon offloads it by its own plan. Prints
# the plan (its pick and estimate, ztctl plan) and the mean step time of steps 3.. from the
# job's metrics.jsonl (step_s), the figure to set beside the forced placements of
# tools/bench/cost_sweep.sh. ZT_BENCH_MODEL=llama3-8b: the Llama-3-8B shape instead (issue 18's
# row: train.batch_tokens 131072 at seq 2048 split by the plan, bf16, AdamW's moments in bf16,
# clip 1.0, weight decay 0.1, checkpoint.keep 0 so that its one 64 GB checkpoint fits a 64 GiB
# disk), also printing the open's phases from the job's log.
#   tools/bench/ztd_step.sh BUILD_DIR [STEPS] [ztd flags...]  (default: --backend cuda
#   --gpu-mem-limit 24GiB)
set -euo pipefail
build=$1 steps=${2:-10}
shift $(( $# >= 2 ? 2 : 1 ))
flags=("$@")
[ ${#flags[@]} -gt 0 ] || flags=(--backend cuda --gpu-mem-limit 24GiB)
tmp=$(mktemp -d /tmp/zt-ztd-step.XXXXXX)
ztd_pid=
trap '[ -n "$ztd_pid" ] && kill "$ztd_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' EXIT
sock=$tmp/ztd.sock
ztctl() { "$build/client/ztctl/ztctl" --socket "$sock" "$@"; }
"$build/engine/server/ztd" --socket "$sock" --state-dir "$tmp/state" "${flags[@]}" \
  >"$tmp/ztd.log" 2>&1 &
ztd_pid=$!
for _ in $(seq 1 100); do ztctl status >/dev/null 2>&1 && break; sleep 0.1; done
docs=$(dirname "$0")/../../docs
for _ in 1 2 3 4 5 6; do cat "$docs"/*.md "$docs"/../README.md; done >"$tmp/text"
ztctl tokenize --bytes "$tmp/text" "$tmp/tok.zt" >/dev/null
if [ "${ZT_BENCH_MODEL:-}" = llama3-8b ]; then
cat >"$tmp/job.json" <<JSON
{"name": "llama3-8b-ztd", "model": {"arch": "llama", "vocab": 128256, "seq_len": 2048,
  "d_model": 4096, "n_heads": 32, "n_kv_heads": 8, "n_layers": 32, "d_ff": 14336,
  "rope_theta": 500000, "init": {"seed": 1}},
 "train": {"steps": $steps, "batch_tokens": 131072, "precision": "bf16", "grad_clip": 1.0,
           "optimizer": {"lr": 1e-4, "weight_decay": 0.1, "state_dtype": "bf16"}},
 "data": {"source": "file", "path": "$tmp/tok.zt", "packing": "windows"},
 "checkpoint": {"every": 0, "keep": 0}}
JSON
else
cat >"$tmp/job.json" <<JSON
{"name": "gpt2-1.5b-ztd", "model": {"arch": "gpt", "vocab": 50304, "seq_len": 1024,
  "d_model": 1600, "n_heads": 25, "n_layers": 48, "init": {"seed": 1}},
 "train": {"steps": $steps, "micro_batch": 8, "precision": "bf16", "grad_clip": 1.0,
           "optimizer": {"lr": 1e-4, "weight_decay": 0.1}},
 "data": {"source": "file", "path": "$tmp/tok.zt", "packing": "windows"},
 "checkpoint": {"every": 0}}
JSON
fi
ztctl plan "$tmp/job.json" | grep -E "^offload|^plan|^batch" || { cat "$tmp/ztd.log" >&2; exit 1; }
job=$(ztctl submit "$tmp/job.json") || { cat "$tmp/ztd.log" >&2; exit 1; }
ztctl watch "$job" >/dev/null || { cat "$tmp/ztd.log" >&2; exit 1; }
grep -E "open in|checkpoint at step" "$tmp/state/jobs/$job/log" || true
python3 - "$tmp/state/jobs/$job/metrics.jsonl" <<'PY'
import json, sys
s = [json.loads(l) for l in open(sys.argv[1])]
t = [p["step_s"] for p in s if p.get("step", 0) >= 3 and "step_s" in p]
print(f"ztd: {len(t)} steps after two, mean {sum(t) / len(t) * 1e3:.1f} ms a step "
      f"(min {min(t) * 1e3:.1f}, max {max(t) * 1e3:.1f})")
PY
