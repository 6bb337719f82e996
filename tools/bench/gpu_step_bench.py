#!/usr/bin/env python3
"""Step time of zt's CUDA backend against PyTorch eager on the same model, batches and optimizer,
measured side by side in one run on the GPU machine.

    python3 tools/bench/gpu_step_bench.py --ztrain build-gpu/tools/ztrain [--json OUT.json]
        [--runs encoder:fp32,encoder:tf32,...]

Precisions are compared like with like: fp32 (TF32 off on both sides), tf32 (zt "tf32": true
against torch.backends.cuda.matmul.allow_tf32), bf16 (zt "precision": "bf16" against
torch.autocast(bfloat16) with fp32 master weights). AdamW on both sides (torch:
fused=True, its fastest), the models of tools/parity/pytorch_parity.py (the same tensor
layout as zt) with GPT attention through F.scaled_dot_product_attention (the encoder's
nn.MultiheadAttention uses it already). Each run
does WARMUP + STEPS steps; the mean of the timed steps is reported, with tokens/s, TFLOPS by
6*N*tokens (+ attention) and peak device memory. Ratio = zt time / PyTorch time.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import GPT, Encoder  # noqa: E402  (GPT attention through SDPA)

CONFIGS = {
    # The model people write when they first meet OOM (issue 4's first benchmark).
    "encoder": dict(arch="encoder", vocab=10000, seq_len=128, d_model=512, n_heads=8, n_layers=6,
                    d_ff=0, B=32),
    # GPT-2 124M and 1.5B (vocab padded to 50304 as llm.c does).
    "gpt2-124m": dict(arch="gpt", vocab=50304, seq_len=1024, d_model=768, n_heads=12,
                      n_layers=12, d_ff=0, B=8),
    "gpt2-1.5b": dict(arch="gpt", vocab=50304, seq_len=1024, d_model=1600, n_heads=25,
                      n_layers=48, d_ff=0, B=8),
}
RUNS = "encoder:fp32,encoder:tf32,encoder:bf16,gpt2-124m:fp32,gpt2-124m:bf16,gpt2-1.5b:bf16"
WARMUP, STEPS = 3, 20


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def flops_per_step(cfg, params):
    B, T, C, L = cfg["B"], cfg["seq_len"], cfg["d_model"], cfg["n_layers"]
    return 6 * params * B * T + 12 * L * B * T * T * C  # matmuls + attention scores/values


def torch_step_time(cfg, batches, precision):
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    dev = torch.device("cuda")
    kw = {k: cfg[k] for k in ("vocab", "seq_len", "d_model", "n_heads", "n_layers", "d_ff")}
    model = (GPT if cfg["arch"] == "gpt" else Encoder)(**kw).to(dev)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    rows = torch.from_numpy(batches).to(dev).long()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for s in range(WARMUP + STEPS):
        x, y = rows[s, :, :-1], rows[s, :, 1:]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, cfg["vocab"]).float(), y.reshape(-1))
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if s >= WARMUP:
            times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated()
    params = n_params(model)
    del model, opt
    torch.cuda.empty_cache()
    return sum(times) / len(times), peak, params


def zt_step_time(cfg, batches, ztrain, precision):
    with tempfile.TemporaryDirectory() as d:
        spec = {"model": {k: cfg[k] for k in ("arch", "vocab", "seq_len", "d_model", "n_heads",
                                                "n_layers", "d_ff")},
                "train": {"steps": WARMUP + STEPS, "micro_batch": cfg["B"], "grad_accum": 1,
                          "optimizer": {"lr": 1e-4},
                          "precision": "bf16" if precision == "bf16" else "fp32",
                          "tf32": precision == "tf32"},
                "data": {"source": "stream"}}
        with open(os.path.join(d, "spec.json"), "w") as f:
            json.dump(spec, f)
        batches.astype("<i4").tofile(os.path.join(d, "batches.bin"))
        out = subprocess.run([ztrain, "--spec", os.path.join(d, "spec.json"), "--batches",
                              os.path.join(d, "batches.bin"), "--backend", "cuda", "--json"],
                             check=True, capture_output=True, text=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return r["step_ms"] / 1e3, r["backend_bytes"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ztrain", required=True)
    ap.add_argument("--json")
    ap.add_argument("--runs", default=RUNS)
    args = ap.parse_args()
    import numpy as np
    rng = np.random.default_rng(0)
    results = []
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    for run in args.runs.split(","):
        name, precision = run.split(":")
        cfg = CONFIGS[name]
        batches = rng.integers(0, cfg["vocab"], size=(WARMUP + STEPS, cfg["B"], cfg["seq_len"] + 1),
                               dtype=np.int32)
        try:
            zt_s, zt_bytes = zt_step_time(cfg, batches, args.ztrain, precision)
            pt_s, pt_peak, params = torch_step_time(cfg, batches, precision)
        except (subprocess.CalledProcessError, RuntimeError) as e:
            detail = getattr(e, "stderr", None) or str(e)
            print(f"{name:10s} {precision:5s} FAILED: {detail.strip()[-500:]}", flush=True)
            continue
        tokens = cfg["B"] * cfg["seq_len"]
        fl = flops_per_step(cfg, params)
        row = dict(config=name, precision=precision, params=params, zt_ms=zt_s * 1e3, torch_ms=pt_s * 1e3,
                   ratio=zt_s / pt_s, zt_tok_s=tokens / zt_s, torch_tok_s=tokens / pt_s,
                   zt_tflops=fl / zt_s / 1e12, torch_tflops=fl / pt_s / 1e12,
                   zt_bytes=zt_bytes, torch_peak_bytes=pt_peak)
        results.append(row)
        print(f"{name:10s} {precision:5s} {params/1e6:7.1f}M  zt {row['zt_ms']:8.2f} ms  torch {row['torch_ms']:8.2f} ms"
              f"  ratio {row['ratio']:.2f}  zt {row['zt_tflops']:.1f} TFLOPS  torch {row['torch_tflops']:.1f}"
              f"  zt mem {zt_bytes/2**30:.2f} GiB  torch peak {pt_peak/2**30:.2f} GiB", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
