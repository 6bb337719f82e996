"""The Python binding against a real ztd (python_client.sh starts it): status, a stream job
submitted as a dict, batches pushed from Python (a list, an array('i') and raw bytes), its
events watched until it ends, show, export to safetensors and to a Hugging Face directory, and
a bad spec refused with the field named."""
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
