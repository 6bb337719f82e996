#!/usr/bin/env python3
"""Golden data for the Llama family, made by transformers itself (not a model written here).

For each variant below this builds a small model with transformers' own classes
(LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM), saves it with
save_pretrained in bfloat16, sharded (max_shard_size small, so the index and several shards are
exercised), reloads it in float32 and trains it 20 steps on the CPU in fp32 with torch's AdamW,
writing into OUT/<variant>/:

  hf/              config.json, model-0000K-of-0000N.safetensors, model.safetensors.index.json
                   (what save_pretrained writes); the run starts from exactly these bf16 values
  batches.bin      steps * grad_accum micro-batches of B rows of T+1 int32 tokens (little
                   endian), no padding (every target counted, so the per-micro-batch mean and the
                   mean over the step's targets are the same normaliser)
  spec.json        a ztd job spec: {"model": {"hf": "hf", "seq_len": T}, "train": ..., "data":
                   {"source": "stream"}}; "hf" is relative to this directory (the test makes it
                   absolute)
  losses.json      {"losses": [per-step loss], "torch": ..., "transformers": ...}

The recipe is zt's (as tools/parity/pytorch_parity.py): per micro-batch the mean cross-entropy
of its targets, backward of loss / grad_accum, the step's loss the mean of the micro-batch
losses; clip_grad_norm_(1.0); AdamW (betas 0.9, 0.95, eps 1e-8, weight decay 0.1 on matrices
and embeddings, none on norms and biases), foreach=False; lr warmup 5 steps from 0 then cosine to
1e-4 at step 20. Weights: transformers' init (N(0, 0.02) matrices and embeddings), then norm
gains 1 + N(0, 0.1) and biases N(0, 0.02), so a gain or bias handled wrongly shows.

Variants: GQA 4:2 and 8:2, tied and untied heads, rope_scaling llama3 and linear, qkv bias
(Qwen2), per-head q/k RMSNorm with head_dim != hidden / heads (Qwen3), Mistral.

Usage: hf_parity.py OUT [--zt PATH_TO_ztrain]   (needs torch and transformers)
With --zt it also runs ztrain on each variant and prints the largest relative per-step loss
difference (exit status 1 above 1e-4).
"""
import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys

import torch
import torch.nn.functional as F
import transformers

TRAIN = dict(steps=20, micro_batch=4, grad_accum=2, lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8,
             weight_decay=0.1, warmup_steps=5, min_lr=1e-4, grad_clip=1.0, seed=0)
SEQ = 32
VOCAB = 256
TOLERANCE = 1e-4

BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            max_position_embeddings=64, rms_norm_eps=1e-5, initializer_range=0.02)
VARIANTS = {
    # Llama: GQA 4:2, untied, plain RoPE
    "llama_gqa42": ("LlamaForCausalLM", "LlamaConfig",
                    dict(BASE, num_attention_heads=4, num_key_value_heads=2,
                         tie_word_embeddings=False), dict(rope_theta=10000.0)),
    # Llama 3.x: GQA 8:2, tied (as Llama-3.2-1B/3B), rope_scaling llama3 with a short original
    # context so that the scaling changes the frequencies the 32 positions use
    "llama3_gqa82_tied": ("LlamaForCausalLM", "LlamaConfig",
                          dict(BASE, num_attention_heads=8, num_key_value_heads=2,
                               tie_word_embeddings=True),
                          dict(rope_theta=500000.0, rope_type="llama3", factor=8.0,
                               low_freq_factor=1.0, high_freq_factor=4.0,
                               original_max_position_embeddings=16)),
    # linear rope scaling
    "llama_linear": ("LlamaForCausalLM", "LlamaConfig",
                     dict(BASE, num_attention_heads=4, num_key_value_heads=4,
                          tie_word_embeddings=False),
                     dict(rope_theta=10000.0, rope_type="linear", factor=2.0)),
    # Mistral: GQA 4:1, no sliding window
    "mistral": ("MistralForCausalLM", "MistralConfig",
                dict(BASE, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                     sliding_window=None, tie_word_embeddings=False), dict(rope_theta=1e6)),
    # Qwen2: q/k/v biases, GQA 4:2, tied (as Qwen2.5-0.5B)
    "qwen2_bias": ("Qwen2ForCausalLM", "Qwen2Config",
                   dict(BASE, num_attention_heads=4, num_key_value_heads=2,
                        tie_word_embeddings=True, use_sliding_window=False),
                   dict(rope_theta=1e6)),
    # Qwen3: per-head q/k RMSNorm, head_dim 32 != 64 / 4
    "qwen3_qknorm": ("Qwen3ForCausalLM", "Qwen3Config",
                     dict(BASE, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                          tie_word_embeddings=False, use_sliding_window=False,
                          attention_bias=False), dict(rope_theta=1e6)),
}


def make_config(cls_name, kw, rope):
    cls = getattr(transformers, cls_name)
    rope = dict(rope)
    theta = rope.pop("rope_theta")
    if "rope_parameters" in cls().to_dict():  # transformers >= 5
        params = dict(rope_theta=theta, rope_type=rope.pop("rope_type", "default"), **rope)
        return cls(**kw, rope_parameters=params)
    scaling = None
    if rope:
        scaling = dict(rope, rope_type=rope.pop("rope_type"))
    return cls(**kw, rope_theta=theta, rope_scaling=scaling)


def build(arch_name, config, gen):
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    model = getattr(transformers, arch_name)(config).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.02 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.02 * torch.randn(p.shape, generator=gen))
    return model


def make_batches(gen):
    """Token streams from a sparse random Markov chain (so the loss falls), no padding."""
    n_rows = TRAIN["steps"] * TRAIN["grad_accum"] * TRAIN["micro_batch"]
    succ = torch.randint(0, VOCAB, (VOCAB, 4), generator=gen)
    rows = torch.empty(n_rows, SEQ + 1, dtype=torch.int32)
    for r in range(n_rows):
        tok = int(torch.randint(0, VOCAB, (1,), generator=gen))
        for j in range(SEQ + 1):
            rows[r, j] = tok
            tok = int(succ[tok, int(torch.randint(0, 4, (1,), generator=gen))])
    return rows.view(TRAIN["steps"], TRAIN["grad_accum"], TRAIN["micro_batch"], SEQ + 1)


def lr_at(step):
    """zt_train_lr: linear warmup from 0, then cosine to min_lr (computed in double)."""
    lr, min_lr, w, n = TRAIN["lr"], TRAIN["min_lr"], TRAIN["warmup_steps"], TRAIN["steps"]
    if w > 0 and step <= w:
        return lr * step / w
    p = min(max((step - w) / (n - w), 0.0), 1.0)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * p))


def train(model, batches):
    named = list(model.named_parameters())
    decay = [p for n, p in named if p.dim() >= 2]
    no_decay = [p for n, p in named if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": TRAIN["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=TRAIN["lr"], betas=(TRAIN["beta1"], TRAIN["beta2"]),
                            eps=TRAIN["eps"], foreach=False)
    model.train()
    losses, ga = [], TRAIN["grad_accum"]
    for step in range(1, TRAIN["steps"] + 1):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for k in range(ga):
            rows = batches[step - 1, k].long()
            x, y = rows[:, :-1], rows[:, 1:]
            logits = model(input_ids=x).logits.float()
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
            (loss / ga).backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), TRAIN["grad_clip"])
        opt.step()
        losses.append(total / ga)
    return losses


def job_spec():
    t = TRAIN
    return {"model": {"hf": "hf", "seq_len": SEQ},
            "train": {"steps": t["steps"], "micro_batch": t["micro_batch"],
                      "grad_accum": t["grad_accum"],
                      "optimizer": {"name": "adamw", "lr": t["lr"],
                                    "betas": [t["beta1"], t["beta2"]], "eps": t["eps"],
                                    "weight_decay": t["weight_decay"]},
                      "schedule": {"name": "cosine", "warmup_steps": t["warmup_steps"],
                                   "min_lr": t["min_lr"]},
                      "grad_clip": t["grad_clip"], "seed": t["seed"]},
            "data": {"source": "stream"}}


def run_zt(ztrain, d):
    spec = job_spec()
    spec["model"]["hf"] = os.path.abspath(os.path.join(d, "hf"))
    path = os.path.join(d, "spec.abs.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    out = subprocess.run([ztrain, "--spec", path, "--batches", os.path.join(d, "batches.bin"),
                          "--json"], check=True, capture_output=True, text=True).stdout
    os.unlink(path)
    return json.loads(out.strip().splitlines()[-1])["losses"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--zt", metavar="ZTRAIN", help="path to ztrain: also compare its losses")
    ap.add_argument("--only", help="comma-separated variants")
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    worst_all = 0.0
    names = args.only.split(",") if args.only else list(VARIANTS)
    for i, name in enumerate(names):
        arch, cfg_cls, kw, rope = VARIANTS[name]
        d = os.path.join(args.out, name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        gen = torch.Generator().manual_seed(2000 + i)
        config = make_config(cfg_cls, dict(kw, attn_implementation="eager"), rope)
        model = build(arch, config, gen)
        model.to(torch.bfloat16).save_pretrained(os.path.join(d, "hf"), max_shard_size="100KB")
        # the run starts from exactly the bf16 values saved
        model = getattr(transformers, arch).from_pretrained(
            os.path.join(d, "hf"), dtype=torch.float32, attn_implementation="eager")
        batches = make_batches(gen)
        with open(os.path.join(d, "batches.bin"), "wb") as f:
            flat = batches.flatten().tolist()
            f.write(struct.pack("<%di" % len(flat), *flat))
        with open(os.path.join(d, "spec.json"), "w") as f:
            json.dump(job_spec(), f, indent=2)
        losses = train(model, batches)
        with open(os.path.join(d, "losses.json"), "w") as f:
            json.dump({"losses": losses, "torch": torch.__version__,
                       "transformers": transformers.__version__}, f, indent=2)
        shards = sorted(os.listdir(os.path.join(d, "hf")))
        print("%s: %d params, loss %.4f -> %.4f, files %s" % (
            name, sum(p.numel() for p in model.parameters()), losses[0], losses[-1], shards))
        if args.zt:
            zl = run_zt(args.zt, d)
            worst = max(abs(a - b) / abs(a) for a, b in zip(losses, zl))
            worst_all = max(worst_all, worst)
            print("%s: max relative per-step loss difference zt vs transformers %.3g" % (name, worst))
    if args.zt and worst_all > TOLERANCE:
        print("parity FAILED: %.3g > %g" % (worst_all, TOLERANCE))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
