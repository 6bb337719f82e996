#!/usr/bin/env python3
"""zt's offloaded step against PyTorch FSDP2 with CPU offload at its best, side by side in one run
on the GPU machine (issue #5's benchmark).

    python3 tools/bench/offload_bench.py --ztrain build-gpu/tools/ztrain [--json OUT.json]
        [--runs gpt2-1.5b:host:host:1,gpt2-124m:auto:auto:auto,gpt2-124m:none:none:0]
        [--budget-gib 24] [--steps 6] [--rates RATES.json]

Both sides train the same GPT-2 (tools/parity/pytorch_parity.py's model, SDPA attention) on the
same batches, bf16 compute with fp32 master weights, AdamW:
- zt: ztrain --backend cuda with "offload": {"params": PARAMS, "optimizer": OPTIMIZER,
  "gpu_budget": BUDGET} and "activation_checkpointing": {"every": CKPT}; a run is
  MODEL:PARAMS:OPTIMIZER:CKPT (params gpu: every unit's compute copy resident, host: streamed,
  auto: the planner's choice; optimizer host: every update on the CPU, auto: the planner puts
  the leading units that fit the budget on the GPU; CKPT an integer or auto). PARAMS none: no
  offload object and no budget, the plain step on the GPU (the "no-budget time"). Further
  fields: `delayed` adds "delayed_update": true (the optimizer one step behind); `unit` or
  `micro` sets "order" (the micro-batches' order with --grad-accum > 1; else the planner's).
  A field KEY=VALUE forces a choice the planner would make: gu=N offload.gpu_units, pf=N
  offload.prefetch, grads=gpu|host offload.grads (a sweep against auto's pick); B=N sets the
  micro-batch (train.micro_batch) in place of the model's default. Each row prints
  the cost model's estimate and its queues' busy times beside the measured timeline's.
  MODEL llama3-8b: Llama-3-8B's shape (zt only: --no-torch). --clip sets train.grad_clip,
  --host-budget-gib and --nvme-dir the host tier's limit and where the rest goes.
- FSDP2: fully_shard per block and on the root with CPUOffloadPolicy(pin_memory=True),
  MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), torch.optim.AdamW(fused=True) on
  the CPU-resident params, torch.utils.checkpoint per block (it needs it to stay near the
  budget at 1.5 B); one rank.
Reported per side: mean step time after WARMUP steps, tokens/s, TFLOPS by 6*N*tokens, peak
device memory (zt: its device budget as taken, activations + device units + arena; torch:
max_memory_allocated), the ratio FSDP2 time / zt time (the speed-up), and zt's timeline: the
fraction of the step each resource was busy (compute, H2D, D2H, the CPU AdamW pool per thread,
NVMe) and the link rates its copies reached.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import GPT  # noqa: E402  (GPT attention through SDPA)

CONFIGS = {
    "gpt2-124m": dict(arch="gpt", vocab=50304, seq_len=1024, d_model=768, n_heads=12,
                      n_layers=12, d_ff=0, B=8),
    "gpt2-1.5b": dict(arch="gpt", vocab=50304, seq_len=1024, d_model=1600, n_heads=25,
                      n_layers=48, d_ff=0, B=8),
    "llama3-8b": dict(arch="llama", vocab=128256, seq_len=2048, d_model=4096, n_heads=32,
                      n_layers=32, d_ff=14336, B=4,
                      extra=dict(n_kv_heads=8, rms_eps=1e-5, rope_theta=500000.0)),
}
WARMUP = 2


def _checkpointed_forward(self, idx):
    """GPT.forward with each block recomputed in backward; a method, so that FSDP2's root
    hooks (which unshard wte, wpe and ln_f) run around it."""
    pos = torch.arange(idx.shape[1], device=idx.device)
    x = self.wte(idx) + self.wpe(pos)
    for b in self.h:
        x = checkpoint(b, x, use_reentrant=False)
    return self.ln_f(x) @ self.wte.weight.t()


GPT.forward = _checkpointed_forward


def fsdp2_step_time(cfg, batches, steps):
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    kw = {k: cfg[k] for k in ("vocab", "seq_len", "d_model", "n_heads", "n_layers", "d_ff")}
    model = GPT(**kw)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    off = CPUOffloadPolicy(pin_memory=True)
    for b in model.h:
        fully_shard(b, mp_policy=mp, offload_policy=off)
    fully_shard(model, mp_policy=mp, offload_policy=off)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    rows = torch.from_numpy(batches).long()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for s in range(steps):
        x, y = rows[s, :, :-1].cuda(), rows[s, :, 1:].cuda()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, cfg["vocab"]).float(), y.reshape(-1))
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if s >= WARMUP:
            times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated()
    params = sum(p.numel() for p in model.parameters())
    del model, opt
    torch.cuda.empty_cache()
    return sum(times) / len(times), peak, params


def zt_step_time(cfg, batches, ztrain, params, optimizer, ckpt, budget, steps, grad_accum,
                 delayed=False, order=None, clip=0.0, host_budget=0, nvme_dir=None, fixed=None,
                 rates=None, state_dtype="fp32"):
    with tempfile.TemporaryDirectory() as d:
        spec = {"model": {k: cfg[k] for k in ("arch", "vocab", "seq_len", "d_model", "n_heads",
                                                "n_layers", "d_ff")},
                "train": {"steps": steps, "micro_batch": cfg["B"], "grad_accum": grad_accum,
                          "optimizer": {"lr": 1e-4, "state_dtype": state_dtype},
                          "precision": "bf16", "grad_clip": clip,
                          "activation_checkpointing": {"every": ckpt if ckpt == "auto"
                                                       else int(ckpt)}},
                "data": {"source": "stream"}}
        spec["model"].update(cfg.get("extra", {}))
        if params != "none":
            spec["offload"] = {"params": params, "optimizer": optimizer, "gpu_budget": budget,
                               "prefetch": 2, "delayed_update": delayed}
            if order:
                spec["offload"]["order"] = order
            if host_budget:
                spec["offload"]["host_budget"] = host_budget
            if nvme_dir:
                spec["offload"]["nvme_dir"] = nvme_dir
            spec["offload"].update(fixed or {})
        with open(os.path.join(d, "spec.json"), "w") as f:
            json.dump(spec, f)
        batches.astype("<i4").tofile(os.path.join(d, "batches.bin"))
        p = subprocess.run([ztrain, "--spec", os.path.join(d, "spec.json"), "--batches",
                            os.path.join(d, "batches.bin"), "--backend", "cuda", "--json"] +
                           (["--rates", rates] if rates else []),
                           capture_output=True, text=True)
        if p.returncode:
            raise RuntimeError(p.stderr.strip()[-800:])
    r = json.loads(p.stdout.strip().splitlines()[-1])
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ztrain", required=True)
    ap.add_argument("--json")
    ap.add_argument("--runs", default="gpt2-1.5b:host:host:1,gpt2-1.5b:host:auto:1,"
                                      "gpt2-1.5b:auto:auto:auto,gpt2-124m:auto:auto:auto,"
                                      "gpt2-124m:none:none:0")
    ap.add_argument("--budget-gib", type=float, default=24)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--grad-accum", type=int, default=1,
                    help="zt only (the FSDP2 baseline runs without accumulation: use --no-torch)")
    ap.add_argument("--clip", type=float, default=0.0, help="train.grad_clip of zt's runs")
    ap.add_argument("--host-budget-gib", type=float, default=0)
    ap.add_argument("--nvme-dir")
    ap.add_argument("--state-dtype", default="fp32", choices=["fp32", "bf16"],
                    help="train.optimizer.state_dtype of zt's runs (AdamW's moments)")
    ap.add_argument("--rates", help="the cost model's rates ztrain plans by (h200 or a file, "
                    "e.g. the state dir's rates.json that `ztd --calibrate` wrote)")
    args = ap.parse_args()
    if args.grad_accum > 1 and not args.no_torch:
        ap.error("--grad-accum > 1 needs --no-torch (the FSDP2 baseline does not accumulate)")
    budget = int(args.budget_gib * (1 << 30))
    rng = np.random.default_rng(0)
    results, torch_done = [], {}
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}, {os.cpu_count()} cpus; "
          f"gpu_budget {args.budget_gib} GiB")
    for run in args.runs.split(","):
        name, params, optimizer, ckpt, *rest = run.split(":")
        delayed = "delayed" in rest
        order = "unit" if "unit" in rest else "micro" if "micro" in rest else None
        # gu=N (offload.gpu_units), pf=N (offload.prefetch), grads=gpu|host (offload.grads):
        # a placement forced, for a sweep against the planner's auto
        keys = {"gu": "gpu_units", "pf": "prefetch", "grads": "grads"}
        fixed = {keys[k]: int(v) if v.isdigit() else v
                 for k, v in (r.split("=", 1) for r in rest if "=" in r) if k != "B"}
        micro = [int(r[2:]) for r in rest if r.startswith("B=")]
        placement = f"params {params}, optimizer {optimizer}, checkpointing {ckpt}" + \
            (", delayed update" if delayed else "") + (f", order {order}" if order else "") + \
            "".join(f", {k} {v}" for k, v in fixed.items()) + \
            (f", clip {args.clip:g}" if args.clip else "") + (f", B {micro[0]}" if micro else "")
        cfg = dict(CONFIGS[name], **({"B": micro[0]} if micro else {}))
        tokens = cfg["B"] * cfg["seq_len"] * args.grad_accum
        batches = rng.integers(0, cfg["vocab"],
                               size=(args.steps * args.grad_accum, cfg["B"], cfg["seq_len"] + 1),
                               dtype=np.int32)
        try:
            z = zt_step_time(cfg, batches, args.ztrain, params, optimizer, ckpt, budget,
                             args.steps, args.grad_accum, delayed, order, args.clip,
                             int(args.host_budget_gib * (1 << 30)), args.nvme_dir, fixed,
                             args.rates, args.state_dtype)
        except RuntimeError as e:
            print(f"{name} zt params {placement}: FAILED: {e}", flush=True)
            continue
        n = z["params"]
        zs = z["step_ms"] / 1e3
        if "offload" not in z:
            print(f"{name} zt without offload or budget: {zs * 1e3:.1f} ms/step, "
                  f"{tokens / zs:.0f} tok/s, device {z['backend_bytes'] / 2**30:.2f} GiB", flush=True)
            results.append(dict(model=name, placement="none", params=n, zt_s=zs))
            continue
        row = dict(model=name, placement=placement, params=n, zt_s=zs,
                   zt_tok_s=tokens / zs, zt_tflops=6 * n * tokens / zs / 1e12,
                   zt_device_bytes=z["offload"]["device_budget"], zt_offload=z["offload"],
                   zt_losses=z["losses"])
        o, tl = z["offload"], z["offload"]["timeline"]
        busy = {k: tl[k] / tl["step"] for k in ("compute", "h2d", "d2h", "nvme")}
        busy["adam"] = tl["adam"] / tl["step"] / tl["adam_threads"]
        waits = {k: tl["wait_" + k] / tl["step"] for k in ("copy", "adam", "nvme")}
        row["timeline"] = busy
        row["waits"] = waits
        row["h2d_gb_s"] = o["bytes_h2d"] / tl["h2d"] / 1e9 if tl["h2d"] else 0
        row["d2h_gb_s"] = o["bytes_d2h"] / tl["d2h"] / 1e9 if tl["d2h"] else 0
        print(f"{name} zt ({placement}): {zs * 1e3:.1f} ms/step, {tokens / zs:.0f} tok/s, "
              f"{6 * n * tokens / zs / 1e12:.1f} TFLOPS, device {z['offload']['device_budget'] / 2**30:.2f} GiB "
              f"(arena peak {z['offload']['arena_peak'] / 2**30:.2f} of {z['offload']['arena_budget'] / 2**30:.2f}), "
              f"host {z['offload']['host_bytes'] / 2**30:.2f} GiB, {o['gpu_units']} units' optimizer "
              f"on the GPU ({o['gpu_unit_bytes'] / 2**30:.2f} GiB); plan: params {o['params']}, "
              f"gradient sums {o['grads']} ({o['dsum_bytes'] / 2**30:.2f} GiB), "
              f"checkpointing every {o['ckpt_every']}, order {o['order']}, "
              f"estimated {o['est_step_s'] * 1e3:.0f} ms; H2D {o['bytes_h2d'] / 2**30:.2f} GiB, "
              f"D2H {o['bytes_d2h'] / 2**30:.2f} GiB over the run, "
              f"{o['adam_landed']} updates landed behind the next forward",
              flush=True)
        print("    waited on: " + ", ".join(f"{k} {v:.0%}" for k, v in waits.items()), flush=True)
        print("    busy: " + ", ".join(f"{k} {v:.0%}" for k, v in busy.items()) +
              f"; H2D {row['h2d_gb_s']:.1f} GB/s, D2H {row['d2h_gb_s']:.1f} GB/s while copying",
              flush=True)
        # the cost model's queues beside the timeline's, per step
        e = o["est"]
        row["est_busy"] = {k: e[k] / o["est_step_s"] for k in e}
        print(f"    per step: measured {zs * 1e3:.1f} ms, estimated {o['est_step_s'] * 1e3:.1f} ms "
              f"({o['est_step_s'] / zs - 1:+.1%}); busy measured / estimated: " +
              ", ".join(f"{k} {busy[k] * zs * 1e3:.0f} / {e[k] * 1e3:.0f} ms"
                        for k in ("compute", "h2d", "d2h", "adam", "nvme")) +
              f", runner - / {e['runner'] * 1e3:.0f} ms", flush=True)
        if not args.no_torch and cfg["arch"] == "gpt":
            if name not in torch_done:
                try:
                    torch_done[name] = fsdp2_step_time(cfg, batches, args.steps)
                except RuntimeError as e:
                    print(f"{name} FSDP2: FAILED: {str(e)[-500:]}", flush=True)
                    torch_done[name] = None
            if torch_done[name]:
                ts, peak, _ = torch_done[name]
                row.update(fsdp2_s=ts, fsdp2_tok_s=tokens / ts, fsdp2_peak=peak,
                           speedup=ts / zs)
                print(f"{name} FSDP2: {ts * 1e3:.1f} ms/step, {tokens / ts:.0f} tok/s, "
                      f"{6 * n * tokens / ts / 1e12:.1f} TFLOPS, peak {peak / 2**30:.2f} GiB; "
                      f"zt speed-up {ts / zs:.2f}x", flush=True)
        results.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
