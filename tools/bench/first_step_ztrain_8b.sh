#!/usr/bin/env bash
# Time to the first step of a random-init Llama-3-shaped 8 B (bf16, AdamW's moments in bf16, the
# parameters resident on the GPU, the optimizer on the host: 83 GiB of pinned host tier) through
# ztrain, which writes no checkpoint: through ztd (tools/bench/first_step.sh) the H200 machine's
# 64 GiB disk cannot hold the job's checkpoints, which admission counts. Prints ztrain's open
# line (the open's phases) and its open_s and first_step_s.
#   tools/bench/first_step_ztrain_8b.sh [BUILD_DIR]   (default build-gpu)
set -euo pipefail
build=${1:-build-gpu}
d=$(mktemp -d /tmp/zt-first-8b.XXXXXX)
trap 'rm -rf "$d"' EXIT
python3 - "$d" <<'PY'
import json, sys
import numpy as np
d = sys.argv[1]
s = {"model": {"arch": "llama", "vocab": 128256, "seq_len": 1024, "d_model": 4096, "n_heads": 32,
               "n_kv_heads": 8, "n_layers": 32, "d_ff": 14336, "rope_theta": 500000,
               "init": {"seed": 1}},
     "train": {"steps": 2, "micro_batch": 1, "precision": "bf16",
               "optimizer": {"lr": 1e-4, "state_dtype": "bf16"}},
     "offload": {"params": "gpu", "optimizer": "host"}, "data": {"source": "stream"}}
json.dump(s, open(f"{d}/spec.json", "w"))
rng = np.random.default_rng(0)
rng.integers(0, 128256, size=(2, 1, 1025), dtype=np.int32).astype("<i4").tofile(f"{d}/b.bin")
PY
"$build/tools/ztrain" --spec "$d/spec.json" --batches "$d/b.bin" --backend cuda --json \
  >"$d/out.json" 2>"$d/err.txt" || { tail -5 "$d/err.txt" >&2; exit 1; }
grep -E "open in" "$d/err.txt" | head -1
python3 -c 'import json, sys; j = json.loads(open(sys.argv[1]).read().splitlines()[-1]);
print({k: j[k] for k in ("open_s", "first_step_s", "step_ms")})' "$d/out.json"
