#!/usr/bin/env bash
# The 1.5 B job as a user submits it (issue 17's benchmark "through ztd, not only ztrain"): GPT-2
# 1.5B (B 8 x T 1024, bf16, grad_clip 1.0, weight decay 0.1) with no "offload" object to a ztd
# whose device is limited (--gpu-mem-limit), so the daemon offloads it by its own plan. Prints
# the plan (its pick and estimate, ztctl plan) and the mean step time of steps 3.. from the
# job's metrics.jsonl (step_s), the figure to set beside the forced placements of
# tools/bench/cost_sweep.sh.
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
cat "$docs"/*.md "$docs"/../README.md >"$tmp/text"
ztctl tokenize --bytes "$tmp/text" "$tmp/tok.zt" >/dev/null
cat >"$tmp/job.json" <<JSON
{"name": "gpt2-1.5b-ztd", "model": {"arch": "gpt", "vocab": 50304, "seq_len": 1024,
  "d_model": 1600, "n_heads": 25, "n_layers": 48, "init": {"seed": 1}},
 "train": {"steps": $steps, "micro_batch": 8, "precision": "bf16", "grad_clip": 1.0,
           "optimizer": {"lr": 1e-4, "weight_decay": 0.1}},
 "data": {"source": "file", "path": "$tmp/tok.zt", "packing": "windows"},
 "checkpoint": {"every": 0}}
JSON
ztctl plan "$tmp/job.json" | grep -E "^offload|^plan" || { cat "$tmp/ztd.log" >&2; exit 1; }
job=$(ztctl submit "$tmp/job.json") || { cat "$tmp/ztd.log" >&2; exit 1; }
ztctl watch "$job" >/dev/null || { cat "$tmp/ztd.log" >&2; exit 1; }
python3 - "$tmp/state/jobs/$job/metrics.jsonl" <<'PY'
import json, sys
s = [json.loads(l) for l in open(sys.argv[1])]
t = [p["step_s"] for p in s if p.get("step", 0) >= 3 and "step_s" in p]
print(f"ztd: {len(t)} steps after two, mean {sum(t) / len(t) * 1e3:.1f} ms a step "
      f"(min {min(t) * 1e3:.1f}, max {max(t) * 1e3:.1f})")
PY
