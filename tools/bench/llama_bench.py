#!/usr/bin/env python3
"""Step time and peak memory of zt's llama arch against transformers' LlamaForCausalLM, side by
side in one run on the GPU machine (issue 15 item 7).

    python3 tools/bench/llama_bench.py --ztrain build-gpu/tools/ztrain [--json OUT.json]
        [--runs 1b:4:0,1b:4:1,3b:2:0,3b:2:1,3b:4:1]

A run is SHAPE:B:CKPT: the Llama-3.2-1B or -3B shape (vocab 128256, tied, llama3 RoPE), B rows
of T 4096, zt's activation checkpointing every CKPT blocks (0: none); transformers runs each
SHAPE:B once, as it comes (SDPA attention, bf16 autocast over fp32 weights, torch's fused
AdamW), which is what people run. Both sides: bf16, grad clip 1.0, AdamW lr 1e-4, the same
random batches, WARMUP + STEPS steps, the mean of the timed ones. TFLOPS by 6 * N * tokens.
zt's memory is every byte it allocates on the device (ztrain's backend_bytes: one block taken
at the start); transformers' is torch.cuda.max_memory_allocated. An out-of-memory on either
side is reported as such.
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

SHAPES = {
    "1b": dict(hidden=2048, layers=16, heads=32, kv=8, ffn=8192),
    "3b": dict(hidden=3072, layers=28, heads=24, kv=8, ffn=8192),
}
VOCAB, SEQ = 128256, 4096
ROPE = dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
            original_max_position_embeddings=8192)
THETA = 500000.0
RUNS = "1b:4:0,1b:4:1,3b:2:0,3b:2:1,3b:4:1"
WARMUP, STEPS = 2, 8


def n_params(sh):
    C, L, F, hs = sh["hidden"], sh["layers"], sh["ffn"], sh["hidden"] // sh["heads"]
    attn = C * (sh["heads"] + 2 * sh["kv"]) * hs + sh["heads"] * hs * C
    return VOCAB * C + L * (attn + 3 * C * F + 2 * C) + C


def llama_spec(sh, B, ckpt, steps):
    """The ztd job spec of the shape at B rows, checkpointing every ckpt blocks, bf16."""
    return {"model": {"arch": "llama", "vocab": VOCAB, "seq_len": SEQ, "d_model": sh["hidden"],
                      "n_heads": sh["heads"], "n_kv_heads": sh["kv"], "n_layers": sh["layers"],
                      "d_ff": sh["ffn"], "rms_eps": 1e-5, "rope_theta": THETA,
                      "rope_scaling": {"type": "llama3", "factor": ROPE["factor"],
                                       "low_freq_factor": ROPE["low_freq_factor"],
                                       "high_freq_factor": ROPE["high_freq_factor"],
                                       "original_max_position_embeddings":
                                           ROPE["original_max_position_embeddings"]},
                      "tie_embeddings": True, "init": {"seed": 1}},
            "train": {"steps": steps, "micro_batch": B, "precision": "bf16",
                      "optimizer": {"lr": 1e-4}, "grad_clip": 1.0,
                      "activation_checkpointing": {"every": ckpt}},
            "data": {"source": "stream"}}


def zt_run(ztrain, sh, B, ckpt, batches):
    spec = llama_spec(sh, B, ckpt, WARMUP + STEPS)
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "spec.json"), "w") as f:
            json.dump(spec, f)
        batches.astype("<i4").tofile(os.path.join(d, "batches.bin"))
        p = subprocess.run([ztrain, "--spec", os.path.join(d, "spec.json"), "--batches",
                            os.path.join(d, "batches.bin"), "--backend", "cuda", "--json"],
                           capture_output=True, text=True)
    if p.returncode:
        return None, p.stderr.strip()[-400:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    return r, None


def torch_run(sh, B, batches):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=sh["hidden"], intermediate_size=sh["ffn"],
                      num_hidden_layers=sh["layers"], num_attention_heads=sh["heads"],
                      num_key_value_heads=sh["kv"], max_position_embeddings=131072,
                      rms_norm_eps=1e-5, tie_word_embeddings=True,
                      rope_parameters=dict(ROPE, rope_theta=THETA), attn_implementation="sdpa")
    dev = torch.device("cuda")
    try:
        model = LlamaForCausalLM(cfg).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        rows = torch.from_numpy(batches).to(dev).long()
        torch.cuda.reset_peak_memory_stats()
        times = []
        for s in range(WARMUP + STEPS):
            x, y = rows[s, :, :-1], rows[s, :, 1:]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(input_ids=x).logits
                loss = F.cross_entropy(logits.reshape(-1, VOCAB).float(), y.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            torch.cuda.synchronize()
            if s >= WARMUP:
                times.append(time.perf_counter() - t0)
        return sum(times) / len(times), torch.cuda.max_memory_allocated(), None
    except torch.cuda.OutOfMemoryError as e:
        return None, None, "out of memory: " + str(e).split("\n")[0][:160]
    finally:
        model = opt = None
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ztrain", required=True)
    ap.add_argument("--json")
    ap.add_argument("--runs", default=RUNS)
    args = ap.parse_args()
    import numpy as np
    rng = np.random.default_rng(0)
    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__} on "
          f"{torch.cuda.get_device_name()}", flush=True)
    results, torch_done = [], {}
    for run in args.runs.split(","):
        shape, B, ckpt = run.split(":")
        B, ckpt, sh = int(B), int(ckpt), SHAPES[shape]
        batches = rng.integers(0, VOCAB, size=(WARMUP + STEPS, B, SEQ + 1), dtype=np.int32)
        P, tokens = n_params(sh), B * SEQ
        zr, zerr = zt_run(args.ztrain, sh, B, ckpt, batches)
        if (shape, B) not in torch_done:
            torch_done[(shape, B)] = torch_run(sh, B, batches)
        t_s, t_peak, terr = torch_done[(shape, B)]
        row = dict(shape=shape, B=B, ckpt=ckpt, params=P, tokens=tokens)
        line = f"llama-{shape} B{B} T{SEQ} ckpt {ckpt}: "
        if zr:
            z_s = zr["step_ms"] / 1e3
            row.update(zt_ms=z_s * 1e3, zt_tflops=6 * P * tokens / z_s / 1e12,
                       zt_bytes=zr["backend_bytes"])
            line += (f"zt {z_s * 1e3:8.1f} ms {row['zt_tflops']:6.1f} TFLOPS "
                     f"{zr['backend_bytes'] / 2**30:6.2f} GiB")
        else:
            row["zt_error"] = zerr
            line += f"zt FAILED ({zerr})"
        if t_s:
            row.update(torch_ms=t_s * 1e3, torch_tflops=6 * P * tokens / t_s / 1e12,
                       torch_peak_bytes=t_peak)
            line += (f" | transformers {t_s * 1e3:8.1f} ms {row['torch_tflops']:6.1f} TFLOPS "
                     f"{t_peak / 2**30:6.2f} GiB")
            if zr:
                row.update(time_ratio=z_s / t_s, memory_ratio=zr["backend_bytes"] / t_peak)
                line += (f" | zt/transformers time {row['time_ratio']:.2f} memory "
                         f"{row['memory_ratio']:.2f}")
        else:
            row["torch_error"] = terr
            line += f" | transformers {terr}"
        print(line, flush=True)
        results.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
