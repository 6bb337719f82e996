#!/usr/bin/env python3
"""PyTorch reference runs for zt's two architectures, and the parity check against ztrain.

For each arch (gpt, encoder) this builds the model in plain PyTorch with exactly the parameter
names zt reads (GPT-2 with Hugging Face's names, HF Conv1D weights stored (in, out); the encoder
as nn.Embedding -> nn.TransformerEncoder(nn.TransformerEncoderLayer) -> nn.Linear), trains it on
the CPU in fp32 for 20 steps, and writes into OUT/<arch>/:

  init.safetensors  the initial weights (BF16, to keep the files small; the PyTorch run starts
                    from exactly these rounded values, and zt converts BF16 to fp32 exactly)
  batches.bin       steps * grad_accum micro-batches of B rows of T+1 int32 tokens (little
                    endian); a few rows end in -1 padding (input reads row 0, target ignored)
  spec.json         {"model": {...}, "train": {...}} for ztrain --spec
  losses.json       {"losses": [per-step loss], "torch": version}

The recipe is zt's (transformers' Trainer's since 4.46): per micro-batch the cross-entropy summed
over its non-padding targets, backward of that sum / the step's counted targets (every
micro-batch's), the printed step loss the step's sum over its counted targets; clip_grad_norm_
(1.0); AdamW (betas 0.9, 0.95, eps 1e-8, weight decay 0.1 on tensors with ndim >= 2, none on
biases and norms); lr warmup 5 steps from 0 then cosine to 1e-4 at step 20.

Weights are not PyTorch's default init: matrices and embeddings N(0, 0.02), residual projections
N(0, 0.02 / sqrt(2 L)), and, unlike GPT-2, biases N(0, 0.02) and norm gains 1 + N(0, 0.1), so
a bias or gain handled wrongly shows in the losses.

Usage: pytorch_parity.py OUT [--zt PATH_TO_ztrain]
With --zt it also runs ztrain on each arch's files and prints the largest relative per-step loss
difference (exit status 1 if it exceeds 1e-4). No packages beyond torch are needed.
"""
import argparse
import json
import math
import os
import struct
import subprocess
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

MODELS = {
    "gpt": dict(arch="gpt", vocab=256, seq_len=32, d_model=64, n_heads=4, n_layers=2, d_ff=0),
    "encoder": dict(arch="encoder", vocab=512, seq_len=32, d_model=64, n_heads=4, n_layers=2,
                    d_ff=128),
}
TRAIN = dict(steps=20, micro_batch=4, grad_accum=2, lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8,
             weight_decay=0.1, schedule="cosine", warmup_steps=5, min_lr=1e-4, grad_clip=1.0,
             seed=0)
TOLERANCE = 1e-4


def job_spec(cfg):
    """The ztd job spec (docs/spec.md) of cfg and TRAIN; ztrain reads it, data from --batches."""
    t = TRAIN
    return {"model": dict(cfg, init={"seed": 0}),
            "train": {"steps": t["steps"], "micro_batch": t["micro_batch"],
                      "grad_accum": t["grad_accum"],
                      "optimizer": {"name": "adamw", "lr": t["lr"],
                                    "betas": [t["beta1"], t["beta2"]], "eps": t["eps"],
                                    "weight_decay": t["weight_decay"]},
                      "schedule": {"name": t["schedule"], "warmup_steps": t["warmup_steps"],
                                   "min_lr": t["min_lr"]},
                      "grad_clip": t["grad_clip"], "seed": t["seed"]},
            "data": {"source": "stream"}}


# ---- models -------------------------------------------------------------------------------

class Conv1D(nn.Module):
    """Hugging Face's Conv1D: weight (in, out), y = x @ W + b."""

    def __init__(self, nin, nout):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nin, nout))
        self.bias = nn.Parameter(torch.zeros(nout))

    def forward(self, x):
        return x @ self.weight + self.bias


class Attention(nn.Module):
    def __init__(self, C, nh):
        super().__init__()
        self.nh = nh
        self.c_attn = Conv1D(C, 3 * C)
        self.c_proj = Conv1D(C, C)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.nh
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, C, F_):
        super().__init__()
        self.c_fc = Conv1D(C, F_)
        self.c_proj = Conv1D(F_, C)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, C, nh, F_):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C)
        self.attn = Attention(C, nh)
        self.ln_2 = nn.LayerNorm(C)
        self.mlp = MLP(C, F_)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2 with the LM head tied to wte (state_dict: HF names without "transformer.")."""

    def __init__(self, vocab, seq_len, d_model, n_heads, n_layers, d_ff):
        super().__init__()
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        self.h = nn.ModuleList(Block(d_model, n_heads, d_ff or 4 * d_model)
                               for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for b in self.h:
            x = b(x)
        return self.ln_f(x) @ self.wte.weight.t()


class Encoder(nn.Module):
    """nn.Embedding -> nn.TransformerEncoder (post-LN, ReLU, no mask, no positions) -> nn.Linear."""

    def __init__(self, vocab, seq_len, d_model, n_heads, n_layers, d_ff):
        super().__init__()
        self.embedding = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(d_model, n_heads, dim_feedforward=d_ff or 2048,
                                           dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.decoder = nn.Linear(d_model, vocab)

    def forward(self, idx):
        return self.decoder(self.encoder(self.embedding(idx)))


def build(cfg, gen):
    kw = {k: cfg[k] for k in ("vocab", "seq_len", "d_model", "n_heads", "n_layers", "d_ff")}
    model = (GPT if cfg["arch"] == "gpt" else Encoder)(**kw)
    resid = 0.02 / math.sqrt(2 * cfg["n_layers"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                projection = name.endswith(("c_proj.weight", "out_proj.weight", "linear2.weight"))
                p.copy_(torch.randn(p.shape, generator=gen) * (resid if projection else 0.02))
            elif "ln" in name or "norm" in name:
                if name.endswith("weight"):
                    p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
                else:
                    p.copy_(0.02 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.02 * torch.randn(p.shape, generator=gen))
            # the run starts from exactly the BF16 values stored in init.safetensors
            p.copy_(p.to(torch.bfloat16).float())
    return model


# ---- files ----------------------------------------------------------------------------------

def write_safetensors_bf16(path, named):
    header, blobs, off = {}, [], 0
    for name, t in named:
        bits = t.detach().contiguous().to(torch.bfloat16).view(torch.int16).flatten().tolist()
        blob = struct.pack("<%dh" % len(bits), *bits)
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def make_batches(cfg, gen):
    """Token streams from a sparse random Markov chain (so the loss falls), some rows padded."""
    V, T = cfg["vocab"], cfg["seq_len"]
    n_rows = TRAIN["steps"] * TRAIN["grad_accum"] * TRAIN["micro_batch"]
    succ = torch.randint(0, V, (V, 4), generator=gen)
    rows = torch.empty(n_rows, T + 1, dtype=torch.int32)
    for r in range(n_rows):
        tok = int(torch.randint(0, V, (1,), generator=gen))
        for j in range(T + 1):
            rows[r, j] = tok
            tok = int(succ[tok, int(torch.randint(0, 4, (1,), generator=gen))])
        if r % 3 == 1:  # padding at the end of every third row
            rows[r, T + 1 - (r % 7 + 1):] = -1
    return rows.view(TRAIN["steps"], TRAIN["grad_accum"], TRAIN["micro_batch"], T + 1)


def lr_at(step):
    """zt_train_lr: linear warmup from 0, then cosine to min_lr (computed in double)."""
    lr, min_lr, w, n = TRAIN["lr"], TRAIN["min_lr"], TRAIN["warmup_steps"], TRAIN["steps"]
    if w > 0 and step <= w:
        return lr * step / w
    p = min(max((step - w) / (n - w), 0.0), 1.0)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * p))


# ---- training -------------------------------------------------------------------------------

def train(model, batches, vocab):
    decay = [p for _, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for _, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": TRAIN["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=TRAIN["lr"], betas=(TRAIN["beta1"], TRAIN["beta2"]),
                            eps=TRAIN["eps"], foreach=False)
    model.train()
    losses = []
    ga = TRAIN["grad_accum"]
    for step in range(1, TRAIN["steps"] + 1):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        counted = int((batches[step - 1, :, :, 1:] >= 0).sum())
        for k in range(ga):
            rows = batches[step - 1, k].long()
            x, y = rows[:, :-1].clone(), rows[:, 1:]
            x[x < 0] = 0
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1), ignore_index=-1,
                                   reduction="sum")
            (loss / counted).backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), TRAIN["grad_clip"])
        opt.step()
        losses.append(total / counted)
    return losses


def run_zt(ztrain, d):
    out = subprocess.run([ztrain, "--spec", os.path.join(d, "spec.json"), "--batches",
                          os.path.join(d, "batches.bin"), "--init",
                          os.path.join(d, "init.safetensors"), "--json"],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["losses"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="output directory (gets gpt/ and encoder/)")
    ap.add_argument("--zt", metavar="ZTRAIN", help="path to ztrain: also compare its losses")
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)
    worst_all = 0.0
    for i, (name, cfg) in enumerate(MODELS.items()):
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        gen = torch.Generator().manual_seed(1000 + i)
        model = build(cfg, gen)
        batches = make_batches(cfg, gen)
        write_safetensors_bf16(os.path.join(d, "init.safetensors"), model.state_dict().items())
        with open(os.path.join(d, "batches.bin"), "wb") as f:
            flat = batches.flatten().tolist()
            f.write(struct.pack("<%di" % len(flat), *flat))
        with open(os.path.join(d, "spec.json"), "w") as f:
            json.dump(job_spec(cfg), f, indent=2)
        losses = train(model, batches, cfg["vocab"])
        with open(os.path.join(d, "losses.json"), "w") as f:
            json.dump({"losses": losses, "torch": torch.__version__}, f, indent=2)
        print("%s: %d params, loss %.4f -> %.4f" % (name, sum(p.numel() for p in model.parameters()),
                                                    losses[0], losses[-1]))
        if args.zt:
            zl = run_zt(args.zt, d)
            worst = max(abs(a - b) / abs(a) for a, b in zip(losses, zl))
            worst_all = max(worst_all, worst)
            print("%s: max relative per-step loss difference zt vs PyTorch %.3g" % (name, worst))
    if args.zt and worst_all > TOLERANCE:
        print("parity FAILED: %.3g > %g" % (worst_all, TOLERANCE))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
