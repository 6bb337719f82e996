#!/usr/bin/env python3
"""Hugging Face directories for hf_export.sh, in plain Python (CI has neither numpy nor torch):
a generator of a tiny Llama as a download has it, and the checks of an export's files.

  hf_files.py make-llama DIR             config.json (transformers 5's rope_parameters), two BF16
                                         shards and their index, tokenizer and generation files
  hf_files.py config DIR KIND DTYPE [SRC]  config.json of an export: KIND llama or gpt2, DTYPE
                                         float32 or bfloat16, SRC the directory it came from
  hf_files.py same A B [PREFIX]          A's tensors (a file or a directory) are B's, bitwise,
                                         B's names PREFIX + A's, and B has no other
  hf_files.py bf16 A B                   B (BF16) holds A's F32 tensors rounded to nearest even
  hf_files.py sharded DIR CAP            DIR's shards: more than one, each at most CAP bytes of
                                         tensors unless it holds one, the index maps each tensor
                                         to its shard, total_size their sum
Exit status 0, or 1 with what differs on stderr."""
import json
import os
import random
import struct
import sys

SIZES = {"F32": 4, "BF16": 2, "F16": 2}


def read_file(path):
    """{name: (dtype, shape, raw bytes)} of a safetensors file, and its __metadata__."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", None)
    out = {}
    for name, t in header.items():
        b, e = t["data_offsets"]
        out[name] = (t["dtype"], t["shape"], blob[8 + n + b:8 + n + e])
    return out, meta


def read(path):
    """A file's tensors, or a directory's: its model.safetensors or the shards of its index."""
    if not os.path.isdir(path):
        return read_file(path)[0]
    index = os.path.join(path, "model.safetensors.index.json")
    files = ["model.safetensors"]
    if os.path.exists(index):
        files = sorted(set(json.load(open(index))["weight_map"].values()))
    out = {}
    for f in files:
        t, meta = read_file(os.path.join(path, f))
        if meta != {"format": "pt"}:
            raise SystemExit("%s/%s: metadata %r, not {'format': 'pt'} (transformers needs it)"
                             % (path, f, meta))
        out.update(t)
    return out


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def bf16_of(f32_bytes):
    """torch's (and zt's) round to nearest even, NaN to 0x7fc0."""
    out = bytearray()
    for (u,) in struct.iter_unpack("<I", f32_bytes):
        if (u & 0x7FFFFFFF) > 0x7F800000:
            h = 0x7FC0
        else:
            h = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
        out += struct.pack("<H", h)
    return bytes(out)


def write_file(path, tensors):
    """tensors: [(name, dtype, shape, raw bytes)] as one safetensors file."""
    header, at = {}, 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(raw)]}
        at += len(raw)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for t in tensors:
            f.write(t[3])


def byte_tokenizer():
    """tokenizer.json of GPT-2's byte-level alphabet as the whole vocabulary."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    vocab = {chr(c): b for b, c in zip(bs, cs)}
    level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
            "normalizer": None, "pre_tokenizer": dict(type="ByteLevel", **level),
            "post_processor": None, "decoder": dict(type="ByteLevel", **level),
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": []}}


def make_llama(d):
    """A tiny Llama 3 style model as save_pretrained writes it: GQA 4:2, head_dim 8, untied."""
    os.makedirs(d, exist_ok=True)
    V, C, NH, NKV, HS, F, L = 256, 32, 4, 2, 8, 64, 2
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V,
        "hidden_size": C, "intermediate_size": F, "num_attention_heads": NH,
        "num_key_value_heads": NKV, "head_dim": HS, "num_hidden_layers": L,
        "max_position_embeddings": 64, "rms_norm_eps": 1e-05, "hidden_act": "silu",
        "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None, "dtype": "bfloat16",
        "initializer_range": 0.02, "transformers_version": "5.0.0", "use_cache": True,
    }
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
    rng = random.Random(7)

    def mat(*shape, ones=False):
        n = 1
        for s in shape:
            n *= s
        vals = [1.0] * n if ones else [rng.gauss(0, 0.02) for _ in range(n)]
        return bf16_of(struct.pack("<%df" % n, *vals))

    shards = [[("model.embed_tokens.weight", "BF16", [V, C], mat(V, C))], []]
    for i in range(L):
        p = "model.layers.%d." % i
        shards[i].extend([
            (p + "input_layernorm.weight", "BF16", [C], mat(C, ones=True)),
            (p + "post_attention_layernorm.weight", "BF16", [C], mat(C, ones=True)),
            (p + "self_attn.q_proj.weight", "BF16", [NH * HS, C], mat(NH * HS, C)),
            (p + "self_attn.k_proj.weight", "BF16", [NKV * HS, C], mat(NKV * HS, C)),
            (p + "self_attn.v_proj.weight", "BF16", [NKV * HS, C], mat(NKV * HS, C)),
            (p + "self_attn.o_proj.weight", "BF16", [C, NH * HS], mat(C, NH * HS)),
            (p + "mlp.gate_proj.weight", "BF16", [F, C], mat(F, C)),
            (p + "mlp.up_proj.weight", "BF16", [F, C], mat(F, C)),
            (p + "mlp.down_proj.weight", "BF16", [C, F], mat(C, F)),
        ])
    shards[1].append(("model.norm.weight", "BF16", [C], mat(C, ones=True)))
    shards[1].append(("lm_head.weight", "BF16", [V, C], mat(V, C)))
    wm, total = {}, 0
    for k, ts in enumerate(shards):
        name = "model-%05d-of-%05d.safetensors" % (k + 1, len(shards))
        write_file(os.path.join(d, name), ts)
        for t in ts:
            wm[t[0]] = name
            total += len(t[3])
    json.dump({"metadata": {"total_size": total}, "weight_map": wm},
              open(os.path.join(d, "model.safetensors.index.json"), "w"), indent=2)
    # what a download has beside the weights: a byte-level BPE without merges (a token per
    # byte, as the 256-token vocabulary), which the tokenizers library loads
    extra = {
        "tokenizer.json": byte_tokenizer(),
        "tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast",
                                  "model_max_length": 64, "clean_up_tokenization_spaces": False},
        "special_tokens_map.json": {},
        "generation_config.json": {"bos_token_id": 1, "eos_token_id": 2, "do_sample": False},
    }
    for name, obj in extra.items():
        json.dump(obj, open(os.path.join(d, name), "w"), indent=2)


def check_config(d, kind, dtype, src=None):
    c = json.load(open(os.path.join(d, "config.json")))
    want = {"llama": ("llama", "LlamaForCausalLM"), "gpt2": ("gpt2", "GPT2LMHeadModel")}[kind]
    if (c.get("model_type"), c.get("architectures")) != (want[0], [want[1]]):
        fail("%s: model_type %r, architectures %r" % (d, c.get("model_type"),
                                                     c.get("architectures")))
    if c.get("torch_dtype") != dtype or c.get("dtype") != dtype:
        fail("%s: torch_dtype %r, dtype %r, expected %s" % (d, c.get("torch_dtype"),
                                                            c.get("dtype"), dtype))
    if kind == "llama":
        s = json.load(open(os.path.join(src, "config.json")))
        if "rope_parameters" in c or c.get("rope_theta") != s["rope_parameters"]["rope_theta"] \
                or c.get("rope_scaling") is not None:
            fail("%s: RoPE not in the hub's form (rope_theta, rope_scaling): %r" % (d, c))
        for k in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "num_hidden_layers", "rms_norm_eps",
                  "tie_word_embeddings", "max_position_embeddings", "bos_token_id",
                  "eos_token_id", "hidden_act", "initializer_range"):
            if c.get(k) != s.get(k):
                fail("%s: %s is %r, the source's %r" % (d, k, c.get(k), s.get(k)))
    else:
        for k, v in (("n_embd", 32), ("n_head", 2), ("n_layer", 2), ("vocab_size", 256),
                     ("n_positions", 16), ("n_ctx", 16), ("activation_function", "gelu_new"),
                     ("layer_norm_epsilon", 1e-05), ("tie_word_embeddings", True),
                     ("scale_attn_weights", True)):
            if c.get(k) != v:
                fail("%s: %s is %r, expected %r" % (d, k, c.get(k), v))


def same(a, b, prefix=""):
    ta, tb = read(a), read(b)
    want = {prefix + k: v for k, v in ta.items()}
    if set(want) != set(tb):
        fail("%s and %s: tensors %s" % (a, b, sorted(set(want) ^ set(tb))))
    for k, v in want.items():
        if v != tb[k]:
            fail("%s: tensor %s differs from %s's (dtype %s/%s, shape %s/%s)"
                 % (b, k, a, v[0], tb[k][0], v[1], tb[k][1]))


def bf16(a, b):
    ta, tb = read(a), read(b)
    if set(ta) != set(tb):
        fail("%s and %s: tensors %s" % (a, b, sorted(set(ta) ^ set(tb))))
    for k, (dt, shape, raw) in ta.items():
        if dt != "F32" or tb[k][:2] != ("BF16", shape) or tb[k][2] != bf16_of(raw):
            fail("%s: tensor %s is not %s's rounded to BF16" % (b, k, a))


def sharded(d, cap):
    index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    wm = index["weight_map"]
    files = sorted(set(wm.values()))
    if len(files) < 2 or os.path.exists(os.path.join(d, "model.safetensors")):
        fail("%s: %d shards (and a model.safetensors beside them?)" % (d, len(files)))
    total = 0
    for i, f in enumerate(files):
        if f != "model-%05d-of-%05d.safetensors" % (i + 1, len(files)):
            fail("%s: shard %s" % (d, f))
        t, _ = read_file(os.path.join(d, f))
        size = sum(len(v[2]) for v in t.values())
        total += size
        if size > cap and len(t) > 1:
            fail("%s: %s holds %d bytes in %d tensors, over %d" % (d, f, size, len(t), cap))
        for name in t:
            if wm.get(name) != f:
                fail("%s: the index maps %s to %s, not %s" % (d, name, wm.get(name), f))
    if index["metadata"]["total_size"] != total or len(wm) != len(read(d)):
        fail("%s: total_size %d, the tensors' %d" % (d, index["metadata"]["total_size"], total))


def main(argv):
    cmd, args = argv[1], argv[2:]
    if cmd == "make-llama":
        make_llama(*args)
    elif cmd == "config":
        check_config(*args)
    elif cmd == "same":
        same(*args)
    elif cmd == "bf16":
        bf16(*args)
    elif cmd == "sharded":
        sharded(args[0], int(args[1]))
    else:
        fail("unknown command %s" % cmd)


if __name__ == "__main__":
    main(sys.argv)
