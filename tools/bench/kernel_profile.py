#!/usr/bin/env python3
"""Where a training step's GPU time goes, zt against PyTorch eager, kernel by kernel: both run a
few steps of the same model under Nsight Compute (one metric, gpu__time_duration, so no replay;
clocks left alone), and the kernels' times per step are summed by kind (matmul, attention,
layernorm, ...) and listed by name. The step time of gpu_step_bench.py minus the kernel sum is
what the GPU spends idle (launches, host syncs).

    python3 tools/bench/kernel_profile.py --ztrain build-gpu/tools/ztrain \
        [--config gpt2-124m] [--precision bf16] [--steps 3] [--top 12]
    python3 tools/bench/kernel_profile.py --ztrain build-gpu/tools/ztrain --llama 1b:1:0
        (zt alone: llama_bench.py's Llama-3.2 shape SHAPE, B rows of T 4096, checkpointing
        every CKPT blocks, bf16)

Needs ncu (Nsight Compute) on PATH or --ncu; the PyTorch side runs this script with --torch-child
under ncu, profiling only its timed steps (cudaProfilerStart/Stop).
"""
import argparse
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

KINDS = [  # first match wins
    ("attention", r"fa_|flash|fmha|sdpa|attention|softmax_warp|cudnn"),
    ("matmul", r"gemm|xmma|cutlass|nvjet|sm90_|sm80_|cublas|splitK|matmul"),
    ("layernorm", r"layer_?norm|ln_"),
    ("gelu", r"gelu"),
    ("loss", r"cross_?entropy|nll|log_softmax|crossent|loss"),
    ("adamw", r"adam|multi_tensor|foreach"),
    ("embedding", r"embedding|encoder_|wte|indexSelect|index_select|scatter|gather"),
    ("reduce/norm", r"reduce|norm|sum_sq|sumsq|nonfinite|amax"),
    ("cast/copy", r"cast|copy|convert|to_bf16|to_f32|fill|memset|elementwise"),
]


def kind_of(name):
    for k, pat in KINDS:
        if re.search(pat, name, re.I):
            return k
    return "other"


def run_ncu(ncu, argv, env=None):
    cmd = [ncu, "--csv", "--metrics", "gpu__time_duration.sum", "--clock-control", "none",
           "--print-units", "base", "--target-processes", "all"] + argv
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    start = out.find('"ID"')
    if start < 0:
        raise RuntimeError("ncu printed no kernel table:\n" + out[-2000:])
    per = {}
    for row in csv.DictReader(io.StringIO(out[start:])):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = row["Kernel Name"]
        per[name] = per.get(name, 0.0) + float(row["Metric Value"].replace(",", "")) * 1e-9
    return per


def zt_profile(ncu, ztrain, cfg, precision, steps):
    with tempfile.TemporaryDirectory() as d:
        spec = {"model": {k: cfg[k] for k in ("arch", "vocab", "seq_len", "d_model", "n_heads",
                                                "n_layers", "d_ff")},
                "train": {"steps": steps, "micro_batch": cfg["B"], "grad_accum": 1,
                          "optimizer": {"lr": 1e-4},
                          "precision": "bf16" if precision == "bf16" else "fp32",
                          "tf32": precision == "tf32"},
                "data": {"source": "stream"}}
        with open(os.path.join(d, "spec.json"), "w") as f:
            json.dump(spec, f)
        import numpy as np
        rng = np.random.default_rng(0)
        rng.integers(0, cfg["vocab"], size=(steps, cfg["B"], cfg["seq_len"] + 1),
                     dtype=np.int32).astype("<i4").tofile(os.path.join(d, "batches.bin"))
        return run_ncu(ncu, [ztrain, "--spec", os.path.join(d, "spec.json"), "--batches",
                             os.path.join(d, "batches.bin"), "--backend", "cuda", "--json"])


def torch_child(config, precision, steps):
    """Runs under ncu: warm-up steps, then `steps` profiled ones."""
    import torch
    import torch.nn.functional as F
    from gpu_step_bench import CONFIGS
    from torch_models import GPT, Encoder
    cfg = CONFIGS[config]
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    kw = {k: cfg[k] for k in ("vocab", "seq_len", "d_model", "n_heads", "n_layers", "d_ff")}
    model = (GPT if cfg["arch"] == "gpt" else Encoder)(**kw).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    rows = torch.randint(0, cfg["vocab"], (cfg["B"], cfg["seq_len"] + 1), device="cuda")
    for s in range(3 + steps):
        if s == 3:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = model(rows[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, cfg["vocab"]).float(),
                                   rows[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def report(label, per, steps, top):
    total = sum(per.values()) / steps
    kinds = {}
    for name, t in per.items():
        kinds[kind_of(name)] = kinds.get(kind_of(name), 0.0) + t / steps
    print(f"{label}: {total * 1e3:.2f} ms of kernels per step")
    for k, t in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f"  {k:12s} {t * 1e3:8.2f} ms  {100 * t / total:5.1f}%")
    print(f"  top {top} kernels (ms per step):")
    for name, t in sorted(per.items(), key=lambda kv: -kv[1])[:top]:
        print(f"    {t / steps * 1e3:8.3f}  {name[:110]}")
    return total, kinds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ztrain")
    ap.add_argument("--config", default="gpt2-124m")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--ncu", default=shutil.which("ncu") or "ncu")
    ap.add_argument("--json")
    ap.add_argument("--torch-child", action="store_true")
    ap.add_argument("--llama", metavar="SHAPE:B:CKPT")
    a = ap.parse_args()
    if a.llama:
        import numpy as np
        from llama_bench import SHAPES, SEQ, VOCAB, llama_spec
        shape, B, ckpt = a.llama.split(":")
        spec = llama_spec(SHAPES[shape], int(B), int(ckpt), a.steps)
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "spec.json"), "w") as f:
                json.dump(spec, f)
            np.random.default_rng(0).integers(0, VOCAB, size=(a.steps, int(B), SEQ + 1),
                dtype=np.int32).astype("<i4").tofile(os.path.join(d, "batches.bin"))
            zt = run_ncu(a.ncu, [a.ztrain, "--spec", os.path.join(d, "spec.json"), "--batches",
                                 os.path.join(d, "batches.bin"), "--backend", "cuda", "--json"])
        print(f"llama-{shape} B{B} T{SEQ} ckpt {ckpt} bf16, {a.steps} steps, ncu gpu__time_duration")
        report("zt", zt, a.steps, a.top)
        return
    if a.torch_child:
        torch_child(a.config, a.precision, a.steps)
        return
    from gpu_step_bench import CONFIGS
    cfg = CONFIGS[a.config]
    print(f"{a.config} {a.precision}, {a.steps} steps each, ncu gpu__time_duration")
    zt = zt_profile(a.ncu, a.ztrain, cfg, a.precision, a.steps)
    pt = run_ncu(a.ncu, ["--profile-from-start", "off", sys.executable, os.path.abspath(__file__),
                         "--torch-child", "--config", a.config, "--precision", a.precision,
                         "--steps", str(a.steps)])
    zt_total, zt_kinds = report("zt", zt, a.steps, a.top)
    pt_total, pt_kinds = report("PyTorch", pt, a.steps, a.top)
    print(f"kernels per step: zt / PyTorch = {zt_total / pt_total:.2f}")
    for k in sorted(set(zt_kinds) | set(pt_kinds), key=lambda k: -zt_kinds.get(k, 0)):
        print(f"  {k:12s} zt {zt_kinds.get(k, 0) * 1e3:8.2f} ms  PyTorch "
              f"{pt_kinds.get(k, 0) * 1e3:8.2f} ms")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"zt": {k: v / a.steps for k, v in zt.items()},
                       "torch": {k: v / a.steps for k, v in pt.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
