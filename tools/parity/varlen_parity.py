#!/usr/bin/env python3
"""Packed documents against transformers: the loss of a packed batch in zt (positions restarting
at every document, attention inside documents) against transformers' own model run on each
document separately, with the same weights.

For each architecture (GPT-2 with learned positions, Llama with GQA and RoPE, Qwen2 with q/k/v
biases) this builds a small model with transformers' classes, perturbs its norm gains and
biases (so a mishandled one shows) and scales its matrices up fivefold (so the loss depends
markedly on the context and the positions: a leak across documents shows), saves it with save_pretrained (fp32 safetensors) into
OUT/<arch>/hf, and packs B rows of T tokens with documents of 1 to 40 tokens; a document that
does not fit the rest of a row is split there and its tail starts the next row (positions
restarting at 0, as zt's packer writes them). Targets are each token's successor (the last of
a row's fragment targets the next row's first token, as in a stream), about a fifth of them
masked out (-1). OUT/<arch>/batch.bin holds the batch in varlen_forward's format.

The reference is transformers' forward of every fragment alone (input_ids of that fragment
only, positions 0..n-1), the cross-entropy summed over its counted targets, the sum over all
fragments divided by their number. zt's is tools/parity/varlen_forward (built with zt) on the
packed rows. Also printed: transformers on the packed rows with position_ids but plain causal
attention across documents, which is what a packer without boundaries would train on; it must
differ, so the comparison has teeth.

Usage: varlen_parity.py OUT --zt BUILD/tools/varlen_forward [--backend cpu|cuda]
                        [--device cpu|cuda] [--rtol 1e-5]
(needs torch and transformers). Exits 1 when a loss differs by more than rtol (relative) or the
boundary-less loss does not differ by more than 100 rtol.
"""
import argparse
import os
import random
import struct
import subprocess
import sys

import torch
import torch.nn.functional as F
import transformers

B, T, VOCAB = 4, 64, 256

ARCHS = {
    "gpt2": ("GPT2LMHeadModel", "GPT2Config",
             dict(vocab_size=VOCAB, n_positions=T, n_embd=64, n_layer=2, n_head=4,
                  activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                  attn_pdrop=0.0, layer_norm_epsilon=1e-5, tie_word_embeddings=True)),
    "llama": ("LlamaForCausalLM", "LlamaConfig",
              dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   max_position_embeddings=2 * T, rms_norm_eps=1e-5, rope_theta=10000.0,
                   tie_word_embeddings=False)),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config",
              dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   max_position_embeddings=2 * T, rms_norm_eps=1e-6, rope_theta=10000.0,
                   tie_word_embeddings=True, use_sliding_window=False)),
}


def packed_batch(rng):
    """tokens, targets, positions (B*T each) and the fragments [(start, end)] in flat indices."""
    tok = [rng.randrange(VOCAB) for _ in range(B * T + 1)]
    pos, frags = [0] * (B * T), []
    left = 0  # tokens of a split document still to place at the next row's start
    for b in range(B):
        t = 0
        while t < T:
            n = left if left else rng.randint(1, 40)
            left = 0
            if n > T - t:
                left = n - (T - t)
                n = T - t
            frags.append((b * T + t, b * T + t + n))
            for j in range(n):
                pos[b * T + t + j] = j
            t += n
    tgt = [tok[i + 1] if rng.random() > 0.2 else -1 for i in range(B * T)]
    return tok[:B * T], tgt, pos, frags


def build(arch, out, seed):
    cls, cfg_cls, kw = ARCHS[arch]
    torch.manual_seed(seed)
    cfg = getattr(transformers, cfg_cls)(**kw)
    model = getattr(transformers, cls)(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2:  # 5x the init: the loss then leans on context and positions
                p.mul_(5.0)
            elif p.ndim == 1 and ("norm" in name or "ln_" in name) and name.endswith("weight"):
                p.add_(0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.02 * torch.randn_like(p))
    d = os.path.join(out, arch, "hf")
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d)  # safetensors, the default
    return model, d


def ce_sum(logits, targets):
    t = torch.tensor(targets, device=logits.device)
    return F.cross_entropy(logits.double(), t, ignore_index=-1, reduction="sum").item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--zt", required=True, help="zt's tools/varlen_forward")
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--device", default="cpu", help="where transformers runs")
    ap.add_argument("--rtol", type=float, default=1e-5)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print("torch %s transformers %s, zt on %s, transformers on %s" %
          (torch.__version__, transformers.__version__, a.backend, a.device))
    worst, fails = 0.0, 0
    for k, arch in enumerate(ARCHS):
        rng = random.Random(1000 + k)
        model, d = build(arch, a.out, 1000 + k)
        model.to(a.device)
        tok, tgt, pos, frags = packed_batch(rng)
        batch = os.path.join(a.out, arch, "batch.bin")
        with open(batch, "wb") as f:
            f.write(struct.pack("<2i", B, T))
            f.write(struct.pack("<%di" % (3 * B * T), *(tok + tgt + pos)))
        counted = sum(1 for y in tgt if y >= 0)
        with torch.no_grad():
            ref = 0.0
            for s, e in frags:
                x = torch.tensor([tok[s:e]], device=a.device)
                ref += ce_sum(model(input_ids=x).logits[0], tgt[s:e])
            x = torch.tensor([tok], device=a.device).view(B, T)
            p = torch.tensor([pos], device=a.device).view(B, T)
            cross = ce_sum(model(input_ids=x, position_ids=p).logits.reshape(B * T, -1), tgt)
        ref /= counted
        cross /= counted
        r = subprocess.run([a.zt, d, batch, a.backend], capture_output=True, text=True)
        if r.returncode != 0:
            print("FAIL %s: varlen_forward: %s" % (arch, r.stderr.strip()))
            fails += 1
            continue
        f = r.stdout.split()
        zt_loss, zt_counted = float(f[5]), int(f[3])
        rel = abs(zt_loss - ref) / abs(ref)
        worst = max(worst, rel)
        ok = rel <= a.rtol and zt_counted == counted and abs(cross - ref) / ref > 100 * a.rtol
        print("%-6s %d fragments, %d targets: transformers (each document alone) %.9f, zt packed"
              " %.9f, |diff| %.3e (relative %.3e); across documents %.9f  %s" %
              (arch, len(frags), counted, ref, zt_loss, abs(zt_loss - ref), rel, cross,
               "ok" if ok else "FAIL"))
        fails += not ok
    print("max relative loss difference %.3e (rtol %.1e)" % (worst, a.rtol))
    print("FAIL" if fails else "OK")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
