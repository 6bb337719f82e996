"""The Python binding against a real ztd (python_client.sh starts it): status, a plan for another
machine (a target) and a bad target refused by the field, a stream job submitted as a dict,
batches pushed from Python (a list, an array('i') and raw bytes), its events watched until it
ends, show, export to safetensors and to a Hugging Face directory, and a bad spec refused with
the field named."""
import array
import json
import os
import struct
import sys
import threading

import ztclient

sock, out_dir = sys.argv[1], sys.argv[2]
V, T, B, STEPS = 64, 16, 2, 6
spec = {"name": "py", "model": {"arch": "gpt", "vocab": V, "seq_len": T, "d_model": 32,
                                "n_heads": 2, "n_layers": 2, "init": {"seed": 3}},
        "train": {"steps": STEPS, "micro_batch": B, "grad_accum": 1,
                  "optimizer": {"name": "adamw", "lr": 0.01}},
        "data": {"source": "stream"}}

with ztclient.connect(socket=sock) as c:
    st = c.status()
    assert st["backend"] in ("cpu", "cuda"), st
    # a plan for another machine: bf16 on a cuda one, whatever this daemon runs
    target = {"backend": "cuda", "gpu_mem_limit": "24GiB", "host_mem_limit": 64 << 30,
              "rates": "h200"}
    p = c.plan(dict(spec, train=dict(spec["train"], precision="bf16")), target)
    assert p["backend"] == "cuda" and p["target"]["gpu_mem_limit"] == 24 << 30, p
    try:
        c.plan(spec, dict(target, backend="tpu"))
    except ztclient.ZtError as e:
        assert e.code == "EINVAL" and "target.backend" in e.message, (e.code, e.message)
    else:
        raise AssertionError("a target of backend tpu was accepted")
    try:
        c.submit(dict(spec, model=dict(spec["model"], n_heads=3)))
    except ztclient.ZtError as e:
        assert e.code == "EINVAL" and "n_heads" in e.message, (e.code, e.message)
    else:
        raise AssertionError("a spec with n_heads 3 for d_model 32 was accepted")
    job = c.submit(spec)
    per = B * (T + 1)
    rows = [[(7 * i + 3 * s) % V for i in range(per)] for s in range(STEPS)]

    def push():
        # a connection of its own: pushing blocks while the job's queue is full
        with ztclient.connect(socket=sock) as p:
            for s, row in enumerate(rows):
                if s % 3 == 0:
                    p.push_batch(job, row)
                elif s % 3 == 1:
                    p.push_batch(job, array.array("i", row))
                else:
                    p.push_batch(job, struct.pack(f"<{per}i", *row))

    pusher = threading.Thread(target=push)
    pusher.start()
    events = []
    c.watch(job, events.append)
    pusher.join()
    steps = [e for e in events if e.get("event") == "step"]
    assert len(steps) == STEPS and steps[-1]["step"] == STEPS, events
    show = c.show(job)
    assert show["state"] == "done" and len(show["losses"]) == STEPS, show
    assert all(l == l and l > 0 for l in show["losses"]), show["losses"]
    path = os.path.join(out_dir, "py.safetensors")
    c.export(job, path)
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    assert "wte.weight" in header and header["wte.weight"]["shape"] == [V, 32], header.keys()
    hf_dir = os.path.join(out_dir, "py-hf")
    listing = c.export_hf(job, hf_dir, dtype="fp32")
    names = sorted(f["name"] for f in listing["files"])
    assert listing["step"] == STEPS and names == ["config.json", "model.safetensors"], listing
    with open(os.path.join(hf_dir, "config.json")) as f:
        assert json.load(f)["architectures"] == ["GPT2LMHeadModel"]
    try:
        c.resume(job, STEPS)
    except ztclient.ZtError as e:
        assert e.code == "EINVAL" and f"steps {STEPS} is not in" in e.message, (e.code, e.message)
    else:
        raise AssertionError("a resume to the step the job is at was accepted")
    r = c.resume(job, STEPS + 1)
    assert r == {"job": job, "state": "queued", "steps": STEPS + 1, "from_step": STEPS}, r
    c.cancel(job)  # it would wait for a pushed batch
print(f"python client: job {job} trained {STEPS} steps, losses {show['losses'][0]:.4f} -> "
      f"{show['losses'][-1]:.4f}, exported {len(header) - ('__metadata__' in header)} tensors")

# Pushed documents: a loss mask of ones is no mask (the same losses, bitwise); a row split into
# two documents and a masked prompt train otherwise; a mask byte other than 0 or 1 is refused
# naming the row and index, and the job goes on with the next batch.
def run_stream(c, masks):
    j = c.submit(spec)
    for row, (mask, starts) in zip(rows, masks):
        c.push_batch(j, row, loss_mask=mask, doc_starts=starts)
    ended = []
    c.watch(j, ended.append)
    s = c.show(j)
    assert s["state"] == "done", s
    return j, s["losses"]


with ztclient.connect(socket=sock) as c:
    ones = [1] * per
    _, plain = run_stream(c, [(None, None)] * STEPS)
    _, masked_ones = run_stream(c, [(ones, None)] * STEPS)
    assert plain == masked_ones, (plain, masked_ones)
    split = [0] * per
    for r in range(B):
        split[r * (T + 1) + T // 2] = 1
    prompt = [0 if i % (T + 1) < 5 else 1 for i in range(per)]
    _, docs = run_stream(c, [(prompt, split)] * STEPS)
    assert len(docs) == STEPS and docs != plain, (docs, plain)
    j = c.submit(spec)
    bad = list(ones)
    bad[(T + 1) + 3] = 2
    try:
        c.push_batch(j, rows[0], loss_mask=bad)
    except ztclient.ZtError as e:
        assert e.code == "EINVAL" and "batch loss_mask row 1 index 3: 2 is neither 0 nor 1" in \
            e.message, (e.code, e.message)
    else:
        raise AssertionError("a loss_mask byte of 2 was accepted")
    for row in rows:
        c.push_batch(j, row)
    c.watch(j, lambda e: None)
    assert c.show(j)["state"] == "done"
print(f"python client: pushed documents and loss masks (plain {plain[-1]:.4f}, split documents "
      f"with masked prompts {docs[-1]:.4f}); a bad mask refused, the job went on")
