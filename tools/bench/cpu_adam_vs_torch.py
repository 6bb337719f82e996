#!/usr/bin/env python3
"""zt's CPU AdamW (offload/cpu_adam: SIMD path on a pinned worker pool) against PyTorch's fused
CPU AdamW on the same machine, same sizes, one step timed as the best of 3 (after a warm-up).

    python3 tools/bench/cpu_adam_vs_torch.py --bench build-gpu/tests/unit/offload/bench_cpu_adam \
        [--sizes 250000000,1500000000] [--threads N]

GB/s counts 32 bytes per parameter (p, g, m, v read; p, m, v written: the convention of issue 5).
"""
import argparse
import os
import re
import subprocess
import time

import torch


def torch_fused(n, threads):
    torch.set_num_threads(threads)
    p = torch.full((n,), 0.5)
    p.grad = torch.full((n,), 0.01)
    opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, fused=True)
    opt.step()  # warm-up: creates the state
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        opt.step()
        best = min(best, time.perf_counter() - t0)
    del opt, p
    return best


def zt_pool(bench, n):
    out = subprocess.run([bench, str(n)], check=True, capture_output=True, text=True).stdout
    line = next(l for l in out.splitlines() if "pool x" in l)
    mps = float(re.search(r"([0-9.]+) Mparams/s", line).group(1))
    return n / (mps * 1e6), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--sizes", default="250000000,1500000000")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {args.threads} threads")
    for n in (int(s) for s in args.sizes.split(",")):
        zt_s, out = zt_pool(args.bench, n)
        print(out.rstrip())
        t_s = torch_fused(n, args.threads)
        print(f"adamw {n/1e6:.0f}M params: zt {n/zt_s/1e9:.2f} G params/s ({32*n/zt_s/1e9:.1f} GB/s)"
              f"  torch fused {n/t_s/1e9:.2f} G params/s ({32*n/t_s/1e9:.1f} GB/s)"
              f"  zt/torch speed {t_s/zt_s:.2f}x", flush=True)


if __name__ == "__main__":
    main()
