#!/bin/bash
# Checkpoint and Hugging Face directory I/O through ztd against the disk's raw rate (issue 17
# item 7): a 150M GPT (vocab 256, d 1024, 12 layers, fp32: a 1.8 GB checkpoint) trains one step
# and writes its final checkpoint; its files are dropped from the page cache
# (posix_fadvise DONTNEED, or drop_caches where allowed) and the job resumes; a Llama directory
# of ~320 MB of BF16 (2 shards) is dropped likewise and a job opens on it. Then dd with O_DIRECT
# reads the same files and writes as many bytes. Prints the job logs' lines (checkpoint written
# S GB in T s; resumes ... loaded S GB in T s), ztd's "open in" lines (an HF job's "initial
# weights in T s") and dd's rates.
# usage: tools/bench/ckpt_io.sh BUILD_DIR [DIR]   (DIR: where the state goes, default /tmp; the
# disk measured is DIR's)
set -euo pipefail
build=$1
tmp=$(mktemp -d "${2:-/tmp}/zt-ckpt-io.XXXXXX")
ztd_pid=
trap '[ -n "$ztd_pid" ] && kill "$ztd_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' EXIT
sock=$tmp/ztd.sock
ztctl() { "$build/client/ztctl/ztctl" --socket "$sock" "$@"; }
# evict FILE...: out of the page cache, so that the next read comes from the disk
evict() {
  sync
  echo 3 2>/dev/null >/proc/sys/vm/drop_caches || true
  python3 -c 'import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' "$@"
}
"$build/engine/server/ztd" --socket "$sock" --state-dir "$tmp/state" >"$tmp/ztd.log" 2>&1 &
ztd_pid=$!
for _ in $(seq 1 100); do ztctl status >/dev/null 2>&1 && break; sleep 0.1; done
ztctl tokenize --bytes "$(dirname "$0")/../../docs/spec.md" "$tmp/tok.zt" >/dev/null
cat >"$tmp/gpt.json" <<JSON
{"name": "ckpt-io", "model": {"arch": "gpt", "vocab": 256, "seq_len": 64, "d_model": 1024,
 "n_heads": 16, "n_layers": 12, "init": {"seed": 1}},
 "train": {"steps": 1, "micro_batch": 1, "precision": "fp32", "optimizer": {"lr": 1e-4}},
 "data": {"source": "file", "path": "$tmp/tok.zt"}, "checkpoint": {"every": 1, "keep": 1}}
JSON
job=$(ztctl submit "$tmp/gpt.json")
ztctl watch "$job" >/dev/null
ck=$(ls -d "$tmp/state/jobs/$job/checkpoints/"step-* | tail -n 1)
evict "$ck"/*
ztctl resume "$job" --steps 2 >/dev/null
ztctl watch "$job" >/dev/null
echo "== gpt 150M job log"
grep -E "checkpoint at step|resumes from|ready to train" "$tmp/state/jobs/$job/log"
# the Llama directory: random BF16 values of a small range, as a download holds them
python3 - "$tmp/hf" <<'PY'
import json, os, random, struct, sys
d = sys.argv[1]; os.makedirs(d)
V, C, NH, NKV, HS, F, L = 32000, 1024, 16, 8, 64, 2816, 8
json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V,
           "hidden_size": C, "intermediate_size": F, "num_attention_heads": NH,
           "num_key_value_heads": NKV, "head_dim": HS, "num_hidden_layers": L,
           "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "hidden_act": "silu",
           "tie_word_embeddings": False, "rope_theta": 10000.0, "torch_dtype": "bfloat16"},
          open(os.path.join(d, "config.json"), "w"))
rng = random.Random(7)
pool = b"".join(struct.pack("<f", rng.gauss(0, 0.02))[2:] for _ in range(1 << 16))
def data(n):
    reps = (2 * n + len(pool) - 1) // len(pool)
    return (pool * reps)[:2 * n]
ts = [("model.embed_tokens.weight", [V, C])]
for i in range(L):
    p = "model.layers.%d." % i
    ts += [(p + "input_layernorm.weight", [C]), (p + "post_attention_layernorm.weight", [C]),
           (p + "self_attn.q_proj.weight", [NH * HS, C]), (p + "self_attn.k_proj.weight", [NKV * HS, C]),
           (p + "self_attn.v_proj.weight", [NKV * HS, C]), (p + "self_attn.o_proj.weight", [C, NH * HS]),
           (p + "mlp.gate_proj.weight", [F, C]), (p + "mlp.up_proj.weight", [F, C]),
           (p + "mlp.down_proj.weight", [C, F])]
ts += [("model.norm.weight", [C]), ("lm_head.weight", [V, C])]
half = len(ts) // 2
wm, total = {}, 0
for k, part in enumerate([ts[:half], ts[half:]]):
    name = "model-%05d-of-00002.safetensors" % (k + 1)
    hdr, off = {}, 0
    for n, shape in part:
        numel = 1
        for s in shape: numel *= s
        hdr[n] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + 2 * numel]}
        off += 2 * numel; wm[n] = name
    total += off
    h = json.dumps(hdr).encode(); h += b" " * (-len(h) % 8)
    with open(os.path.join(d, name), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for n, shape in part:
            numel = 1
            for s in shape: numel *= s
            f.write(data(numel))
json.dump({"metadata": {"total_size": total}, "weight_map": wm},
          open(os.path.join(d, "model.safetensors.index.json"), "w"))
PY
evict "$tmp/hf"/*.safetensors
cat >"$tmp/hf.json" <<JSON
{"name": "hf-io", "model": {"hf": "$tmp/hf", "seq_len": 64},
 "train": {"steps": 1, "micro_batch": 1, "precision": "fp32", "optimizer": {"lr": 1e-4}},
 "data": {"source": "file", "path": "$tmp/tok.zt"}, "checkpoint": {"every": 0}}
JSON
hjob=$(ztctl submit "$tmp/hf.json")
ztctl watch "$hjob" >/dev/null || true
echo "== hf job: $(du -cb "$tmp/hf"/*.safetensors | tail -n 1 | cut -f1) bytes of safetensors"
grep -E "ready to train|failed" "$tmp/state/jobs/$hjob/log"
echo "== ztd open lines"
grep -E "open in" "$tmp/ztd.log" || true
echo "== dd O_DIRECT of the same files (evicted first) and a write of the checkpoint's size"
ck=$(ls -d "$tmp/state/jobs/$job/checkpoints/"step-* | tail -n 1)
evict "$ck"/* "$tmp/hf"/*.safetensors
for f in "$ck"/*.safetensors "$tmp/hf"/*.safetensors; do
  printf '%s: ' "${f##*/}"; dd if="$f" of=/dev/null bs=8M iflag=direct 2>&1 | tail -n 1
done
bytes=$(du -cb "$ck"/* | tail -n 1 | cut -f1)
printf 'write %s bytes: ' "$bytes"
dd if=/dev/zero of="$tmp/dd.out" bs=8M count=$(( (bytes + (8 << 20) - 1) / (8 << 20) )) oflag=direct conv=fsync 2>&1 | tail -n 1
