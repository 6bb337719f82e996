#!/usr/bin/env python3
"""The largest GPT zt trains within a GPU budget using host + NVMe (issue 5's benchmark), run
straight through the trainer (tools/ztrain, no daemon: a job's final checkpoint would need the
whole state in host memory once more).

    python3 tools/bench/largest_gpt.py --ztrain build-gpu/tools/ztrain --nvme-dir DIR
        [--d-model 5120] [--layers 32] [--heads 40] [--steps 3] [--gpu-budget 24GiB]
        [--host-budget 110GiB] [--nvme-budget 55GB] [--json OUT.json]

GPT (vocab 50304, T 1024, B 1), bf16 compute with fp32 masters, AdamW, no clipping (so each
unit's update overlaps the backward and the host keeps no flat gradient buffer), activation
checkpointing every block, "offload": {"optimizer": "auto", "params": "auto", gpu_budget,
host_budget, nvme_budget, nvme_dir}: the planner keeps what fits on the GPU, the host units'
optimizer in pinned host memory and the rest on NVMe. Random tokens. Prints the plan's split, each
step's loss, the mean step time after the first, tokens/s, TFLOPS by 6 * N * tokens, the
process's peak RSS and the NVMe traffic.
"""
import argparse
import json
import os
import random
import resource
import struct
import subprocess
import sys
import tempfile
import time

VOCAB, SEQ = 50304, 1024


def size(text):
    units = {"GiB": 1 << 30, "MiB": 1 << 20, "GB": 10**9, "TB": 10**12, "TiB": 1 << 40}
    for u, m in units.items():
        if text.endswith(u):
            return int(float(text[: -len(u)]) * m)
    return int(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ztrain", required=True)
    ap.add_argument("--nvme-dir", required=True, help="a directory on the disk for the NVMe tier")
    ap.add_argument("--d-model", type=int, default=5120)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=40)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--gpu-budget", default="24GiB")
    ap.add_argument("--host-budget", default="110GiB")
    ap.add_argument("--nvme-budget", default="55GB")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--backend", default="cuda", help="cuda; cpu to try the script on a tiny model")
    args = ap.parse_args()
    C, L = args.d_model, args.layers
    params = VOCAB * C + SEQ * C + L * (12 * C * C + 13 * C) + 2 * C
    spec = {
        "model": {"arch": "gpt", "vocab": VOCAB, "seq_len": SEQ, "d_model": C,
                  "n_heads": args.heads, "n_layers": L, "init": {"seed": 1}},
        "train": {"steps": args.steps, "micro_batch": 1, "grad_accum": 1,
                  "optimizer": {"lr": 1e-4, "weight_decay": 0.01}, "grad_clip": 0,
                  "precision": "bf16",
                  "activation_checkpointing": {"every": 1}},
        "offload": {"optimizer": "auto", "params": "auto", "gpu_budget": size(args.gpu_budget),
                    "host_budget": size(args.host_budget),
                    "nvme_budget": size(args.nvme_budget), "nvme_dir": args.nvme_dir},
        "data": {"source": "stream"},
    }
    tmp = tempfile.mkdtemp(prefix="zt-big.")
    spec_path, tok_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "tokens.bin")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    rng = random.Random(7)
    with open(tok_path, "wb") as f:
        n = args.steps * (SEQ + 1)
        f.write(struct.pack(f"<{n}i", *(rng.randrange(VOCAB) for _ in range(n))))
    print(f"largest_gpt: GPT d_model {C}, {L} layers, {args.heads} heads: {params / 1e9:.2f} B "
          f"parameters; budgets GPU {args.gpu_budget}, host {args.host_budget}, NVMe "
          f"{args.nvme_budget} in {args.nvme_dir}", flush=True)
    t0 = time.monotonic()
    p = subprocess.run([args.ztrain, "--spec", spec_path, "--batches", tok_path, "--backend",
                        args.backend, "--json"], capture_output=True, text=True)
    wall = time.monotonic() - t0
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    sys.stderr.write(p.stderr)
    if p.returncode:
        print(f"largest_gpt: ztrain failed ({p.returncode}) after {wall:.0f} s")
        sys.exit(1)
    r = json.loads(p.stdout.strip().splitlines()[-1])
    o = r["offload"]
    tokens_s = r["tokens_per_s"]
    out = dict(params=r["params"], step_s=r["step_ms"] / 1e3, tokens_per_s=tokens_s,
               tflops=6 * r["params"] * tokens_s / 1e12, losses=r["losses"], wall_s=wall,
               peak_rss=rss, device_bytes=o["device_budget"],
               host_bytes=o["host_bytes"], gpu_units=o["gpu_units"],
               nvme_read=o["nvme_bytes_read"], nvme_written=o["nvme_bytes_written"],
               timeline=o["timeline"], spec=spec)
    print(f"trained {len(r['losses'])} steps in {wall:.0f} s (open included): losses "
          f"{', '.join(f'{x:.4f}' for x in r['losses'])}")
    print(f"{r['params'] / 1e9:.2f} B parameters: {out['step_s']:.2f} s/step after the first, "
          f"{tokens_s:.0f} tokens/s, {out['tflops']:.1f} TFLOPS; device "
          f"{out['device_bytes'] / 2**30:.2f} GiB ({o['gpu_units']} units' optimizer on the GPU), "
          f"host tier {o['host_bytes'] / 2**30:.2f} GiB, peak RSS {rss / 2**30:.2f} GiB, NVMe "
          f"{o['nvme_bytes_read'] / 1e9:.1f} GB read, {o['nvme_bytes_written'] / 1e9:.1f} GB "
          f"written; timeline {json.dumps(o['timeline'])}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
