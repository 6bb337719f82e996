#!/usr/bin/env bash
# The cost model against the machine (issue 17 item 4): the benchmark rows and a sweep of forced
# placements of GPT-2 1.5B in 24 GiB, each row's measured step beside the planner's estimate
# (offload_bench.py prints both, and each queue's busy time measured and estimated), and auto's
# pick among them. Run on the GPU machine:
#   tools/bench/cost_sweep.sh build-gpu/tools/ztrain OUT [RATES]
# OUT gets one JSON file per group (offload_bench.py --json); RATES (h200, or the state dir's
# rates.json that `ztd --calibrate` wrote) is what the plans are ranked and estimated by.
set -euo pipefail
ztrain=$1 out=$2 rates=${3:-h200}
mkdir -p "$out"
bench() { python3 "$(dirname "$0")/offload_bench.py" --ztrain "$ztrain" --no-torch --rates "$rates" "$@"; }
# 1.5B, no clipping: auto, then forced placements (params home, units with their optimizer on
# the GPU, checkpointing, prefetch)
bench --steps 8 --json "$out/noclip.json" --runs \
gpt2-1.5b:auto:auto:auto,gpt2-1.5b:host:auto:1:gu=38,gpt2-1.5b:gpu:auto:1:gu=28,\
gpt2-1.5b:gpu:auto:1:gu=35,gpt2-1.5b:host:auto:1:gu=30,gpt2-1.5b:host:host:1,\
gpt2-1.5b:host:auto:2,gpt2-1.5b:host:auto:1:gu=38:pf=4,gpt2-124m:auto:auto:auto,\
gpt2-124m:none:none:0,gpt2-1.5b:none:none:0
# with clipping (the recipe users run)
bench --steps 8 --clip 1.0 --json "$out/clip.json" --runs \
gpt2-1.5b:auto:auto:auto,gpt2-1.5b:host:auto:1:gu=38,gpt2-1.5b:gpu:auto:1:gu=35
# four micro-batches a step, clipping: the orders and where the sums are kept
bench --steps 4 --grad-accum 4 --clip 1.0 --json "$out/ga4.json" --runs \
gpt2-1.5b:host:host:1:micro,gpt2-1.5b:host:host:1:unit,gpt2-1.5b:auto:auto:auto,\
gpt2-1.5b:host:auto:1:grads=host,gpt2-1.5b:host:auto:1:grads=gpu
