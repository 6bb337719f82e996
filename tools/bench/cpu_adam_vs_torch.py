#!/usr/bin/env python3
"""zt's CPU AdamW (offload/cpu_adam: SIMD path on a pinned worker pool) against PyTorch's fused
CPU AdamW on the same machine, same sizes, same thread count, one step timed as the best of 3
(after a warm-up), and both against the host memory bandwidth that bench_cpu_adam measures on its
pool in the same run.

    python3 tools/bench/cpu_adam_vs_torch.py --bench build-gpu/tests/unit/offload/bench_cpu_adam \
        [--sizes 250000000,1500000000] [--threads N]

GB/s counts 32 bytes per parameter (p, g, m, v read; p, m, v written: the convention of issue 5).
The memory bandwidth is the in-place pattern p, m, v += g (AdamW's accesses without its
arithmetic, counted the same way), so "of memory" is the fraction of the most an AdamW could
move; the STREAM triad is printed beside it (its count omits write-allocate reads).
"""
import argparse
import json
import os
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


def zt_pool(bench, n, threads):
    """The pool's step time in s, bench_cpu_adam's JSON figures and its whole output."""
    out = subprocess.run([bench, str(n), str(threads)], check=True, capture_output=True,
                         text=True).stdout
    res = json.loads(next(l for l in reversed(out.splitlines()) if l.startswith("{")))
    return 32 * n / (res["pool_gbs"] * 1e9), res, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--sizes", default="250000000,1500000000")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {args.threads} threads")
    for n in (int(s) for s in args.sizes.split(",")):
        zt_s, res, out = zt_pool(args.bench, n, args.threads)
        print(out.rstrip())
        t_s = torch_fused(n, args.threads)
        mem, triad = res["inplace_gbs"], res["triad_gbs"]
        zt_gbs, t_gbs = 32 * n / zt_s / 1e9, 32 * n / t_s / 1e9
        print(f"adamw {n/1e6:.0f}M params: zt {n/zt_s/1e9:.2f} G params/s ({zt_gbs:.1f} GB/s)"
              f"  torch fused {n/t_s/1e9:.2f} G params/s ({t_gbs:.1f} GB/s)"
              f"  zt/torch speed {t_s/zt_s:.2f}x", flush=True)
        print(f"  host memory ({res['threads']} threads): in place {mem:.1f} GB/s, STREAM triad "
              f"{triad:.1f} GB/s; zt moves {zt_gbs/mem:.3f} of memory ({zt_gbs/triad:.3f} of "
              f"triad), torch {t_gbs/mem:.3f} ({t_gbs/triad:.3f})", flush=True)


if __name__ == "__main__":
    main()
