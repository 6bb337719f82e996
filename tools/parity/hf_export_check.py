#!/usr/bin/env python3
"""Checks a directory written by `ztctl export JOB DIR --hf` with transformers itself, on the
GPU machine (transformers 4.x or 5.x, PyTorch):

  - AutoModelForCausalLM.from_pretrained(DIR) loads it as config.json's class, with no missing
    (but a tied head), unexpected or mismatched weights;
  - every parameter of the loaded model is, bit for bit, the tensor of that name in the
    exported safetensors files (in the export's dtype), a tied lm_head the embedding;
  - AutoTokenizer.from_pretrained(DIR) loads when tokenizer files are there (and encodes as the
    source directory's tokenizer does, given --source);
  - a forward of ROWS x SEQ tokens (from --tokens, a zt token file, else a fixed sequence) gives
    finite logits and a loss, equal to --expect-loss (zt's loss of the same tokens and weights)
    within --rtol when given; generate() runs a few greedy tokens.

  python3 tools/parity/hf_export_check.py DIR [--source SRC] [--tokens FILE] [--rows B]
          [--seq T] [--expect-loss L] [--rtol 1e-4] [--device cuda|cpu]

Prints one line per check and ends with "OK" (exit 0) or "FAIL: ..." (exit 1)."""
import argparse
import json
import math
import os
import struct
import sys


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def exported_tensors(d):
    """{name: tensor} of the export's weights, read with safetensors itself."""
    from safetensors.torch import load_file

    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        files = sorted(set(json.load(open(index))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for f in files:
        out.update(load_file(os.path.join(d, f)))
    return out


def token_rows(path, rows, seq, vocab):
    """rows x (seq + 1) tokens: the token file's first, or a fixed sequence."""
    n = rows * (seq + 1)
    if path:
        with open(path, "rb") as f:
            head = f.read(24)
            if head[:8] != b"ZTTOKENS":
                fail("%s is not a zt token file" % path)
            _, width, _, _ = struct.unpack("<4I", head[8:24])
            raw = f.read(n * width)
        if len(raw) < n * width:
            fail("%s holds fewer than %d tokens" % (path, n))
        ids = list(struct.unpack("<%d%s" % (n, "H" if width == 2 else "I"), raw))
    else:
        ids = [(i * 7 + i // 5) % vocab for i in range(n)]
    return [ids[r * (seq + 1):(r + 1) * (seq + 1)] for r in range(rows)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--source", help="the Hugging Face directory the job started from")
    ap.add_argument("--tokens", help="a zt token file; its first rows x (seq + 1) tokens")
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--expect-loss", type=float)
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--device", default=None)
    a = ap.parse_args()

    import torch
    import transformers

    dev = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cfg = json.load(open(os.path.join(a.dir, "config.json")))
    dtypes = {"bfloat16": torch.bfloat16, "float32": torch.float32}
    if cfg.get("torch_dtype") not in dtypes or cfg.get("dtype") != cfg["torch_dtype"]:
        fail("config.json: torch_dtype %r, dtype %r" % (cfg.get("torch_dtype"), cfg.get("dtype")))
    dt = dtypes[cfg["torch_dtype"]]
    print("transformers %s, torch %s, %s; %s in %s" % (transformers.__version__, torch.__version__,
                                                      dev, cfg["architectures"][0], dt))

    # 4.x takes torch_dtype=, 5.x dtype= (and warns about the other)
    kw = {"dtype": dt} if int(transformers.__version__.split(".")[0]) >= 5 else {"torch_dtype": dt}
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        a.dir, output_loading_info=True, **kw)
    model = model.to(dev).eval()
    if type(model).__name__ != cfg["architectures"][0]:
        fail("loaded as %s, config.json says %s" % (type(model).__name__, cfg["architectures"][0]))
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    missing = [k for k in info.get("missing_keys", [])
               if not (tied and k.endswith("lm_head.weight"))]
    for what in ("unexpected_keys", "mismatched_keys", "error_msgs"):
        if info.get(what):
            fail("from_pretrained: %s %s" % (what, list(info[what])[:8]))
    if missing:
        fail("from_pretrained: missing_keys %s" % missing[:8])
    print("loaded: %d parameters, no missing or unexpected weights" %
          sum(p.numel() for p in model.parameters()))

    # every parameter, as the files hold it
    files = exported_tensors(a.dir)
    params = dict(model.named_parameters(remove_duplicate=False))
    for name, t in files.items():
        if name not in params:
            fail("%s in the files is no parameter of %s" % (name, type(model).__name__))
        p = params[name].detach().cpu()
        if t.dtype != dt or p.dtype != dt or p.shape != t.shape or not torch.equal(p, t):
            fail("parameter %s differs from the file's (%s %s vs %s %s)" %
                 (name, p.dtype, tuple(p.shape), t.dtype, tuple(t.shape)))
    for name, p in params.items():
        if name in files:
            continue
        emb = model.get_input_embeddings().weight
        if not (tied and name.endswith("lm_head.weight") and p.data_ptr() == emb.data_ptr()):
            fail("parameter %s is not in the exported files" % name)
    print("parameters: all %d tensors of the files bitwise%s" %
          (len(files), ", lm_head tied to the embedding" if tied else ""))

    # the tokenizer, when the export has one
    if any(os.path.exists(os.path.join(a.dir, f)) for f in
           ("tokenizer.json", "tokenizer.model", "vocab.json")):
        tok = transformers.AutoTokenizer.from_pretrained(a.dir)
        text = "zt exported this model; transformers reads it back."
        ids = tok(text)["input_ids"]
        if a.source:
            ref = transformers.AutoTokenizer.from_pretrained(a.source)(text)["input_ids"]
            if ids != ref:
                fail("the exported tokenizer encodes otherwise than the source's")
        print("tokenizer: %s, %d tokens for the sample text" % (type(tok).__name__, len(ids)))
    if a.source:
        src = json.load(open(os.path.join(a.source, "config.json")))
        for k in ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "intermediate_size", "vocab_size", "n_embd", "n_layer"):
            if k in src and src[k] != cfg.get(k):
                fail("config.json: %s %r, the source's %r" % (k, cfg.get(k), src[k]))
        print("config.json: the source's dimensions")

    # a forward, the loss as zt computes it (the mean over every next-token target)
    vocab = model.config.vocab_size
    rows = token_rows(a.tokens, a.rows, a.seq, vocab)
    x = torch.tensor(rows, device=dev)
    with torch.no_grad():
        logits = model(input_ids=x[:, :-1]).logits.float()
    if not torch.isfinite(logits).all():
        fail("the forward gave non-finite logits")
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), x[:, 1:].reshape(-1)).item()
    print("forward: %d x %d tokens, loss %.10g" % (a.rows, a.seq, loss))
    if a.expect_loss is not None:
        rel = abs(loss - a.expect_loss) / abs(a.expect_loss)
        if not math.isfinite(loss) or rel > a.rtol:
            fail("loss %.10g, zt's %.10g: relative difference %.3g over %g" %
                 (loss, a.expect_loss, rel, a.rtol))
        print("loss: within %.3g of zt's %.10g" % (rel, a.expect_loss))
    with torch.no_grad():
        out = model.generate(x[:1, :8], max_new_tokens=4, do_sample=False)
    if out.shape[1] < 9:
        fail("generate() made no token")
    print("generate: %d greedy tokens" % (out.shape[1] - 8))
    print("OK")


if __name__ == "__main__":
    main()
