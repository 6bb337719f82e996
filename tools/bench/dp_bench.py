#!/usr/bin/env python3
"""Data-parallel scaling on two GPUs against PyTorch FSDP2 with two ranks, side by side in one run
on the 2-GPU machine (issue 6's benchmark).

    python3 tools/bench/dp_bench.py --build build-gpu [--json OUT.json] [--steps N]
        [--warmup N] [--model gpt2-1.5b|gpt2-124m] [--sides zt1,zt2,zt2off,fsdp2] [--stages 3,2]

GPT-2 (tools/bench/offload_bench.py's CONFIGS: vocab 50304, T 1024, B 8 per rank), bf16 compute
with fp32 master weights, AdamW lr 1e-4 (betas 0.9/0.999, eps 1e-8, weight decay 0.01 on both
sides), a budget of 24 GiB per GPU. Sides:
- zt1: zt on one GPU at its best under the budget: the offloaded step with the planner,
  "offload": {"params": "auto", "optimizer": "auto", "gpu_budget": "24GiB", "prefetch": 2},
  "activation_checkpointing": {"every": "auto"}.
- zt2: zt on two GPUs, "parallel": {"gpus": 2, "zero_stage": Z} for each Z of --stages, without
  offload, "activation_checkpointing": {"every": "auto"} (ztd admits the least recompute that fits
  the GPU). `ztctl plan` runs first; a stage that does not fit is printed with ztd's numbers and
  skipped.
- zt2off: the same with "offload": {"optimizer": "host", "gpu_units": 0}: each rank's masters,
  AdamW state and gradients on the host, updated by the CPU AdamW (ZeRO-Offload per rank, the
  configuration of FSDP2's CPUOffloadPolicy below).
- fsdp2: PyTorch FSDP2 on two ranks (torch.multiprocessing, NCCL, a GPU each) configured as
  offload_bench.py's FSDP2 side: fully_shard per block and on the root with
  CPUOffloadPolicy(pin_memory=True), MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32),
  torch.optim.AdamW(fused=True) on the CPU-resident parameters, torch.utils.checkpoint per block
  (offload_bench.py's GPT.forward), each rank with cpus / 2 threads; random tokens.
Both zt sides run as jobs of one ztd (`ztd --backend cuda --gpus 0,1 --gpu-mem-limit 24GiB`,
measured the same way), on a token file of the repository's own text (`ztctl tokenize --bytes`;
the content does not matter for throughput). A job's figures come from its step events
(`ztctl --json watch`): each step's tokens_per_s (the tokens of all ranks over the trainer's step
time), the device memory per GPU (the larger of its peak allocation and its reserved block /
arena); the job is cancelled after WARMUP + STEPS steps, before it would write a checkpoint.
Reported per side: mean step time over the STEPS after WARMUP, tokens/s, TFLOPS by 6 * N * tokens
(all GPUs together), peak GiB per GPU; then zt2 / zt1 tokens/s (target >= 1.8) and zt2 / fsdp2
(target >= 2.4), zt2 being the fastest 2-GPU side that ran, and the same for the fastest zt2off. Each side fails alone: its error is
printed and the others still report.
"""
import argparse
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
try:
    import numpy as np
    # CONFIGS, and GPT with per-block torch.utils.checkpoint (importing it patches GPT.forward)
    import offload_bench as ob  # noqa: E402
except ImportError as e:
    sys.exit(f"dp_bench: needs numpy and PyTorch (tools/bench/offload_bench.py): {e}")

WORLD = 2
BUDGET = "24GiB"
LR = 1e-4
GIB = float(1 << 30)
TARGET_SCALING, TARGET_FSDP2 = 1.8, 2.4


def log(msg):
    print(msg, flush=True)


# ---- zt: one ztd, jobs through ztctl ------------------------------------------------------------

class Ztd:
    """A ztd on a socket and state directory of its own under tmp, driven with ztctl --json."""

    def __init__(self, build, tmp):
        self.ztd = os.path.join(build, "engine", "server", "ztd")
        self.ztctl = os.path.join(build, "client", "ztctl", "ztctl")
        for b in (self.ztd, self.ztctl):
            if not os.access(b, os.X_OK):
                raise RuntimeError(f"{b} is missing or not executable "
                                   "(build it with tools/gpu_build.sh)")
        self.tmp = tmp
        self.sock = os.path.join(tmp, "ztd.sock")
        self.state = os.path.join(tmp, "state")
        self.log_path = os.path.join(tmp, "ztd.log")
        self.proc = None
        self.cmd = [self.ztd, "--backend", "cuda", "--gpus", "0,1", "--gpu-mem-limit", BUDGET,
                    "--socket", self.sock, "--state-dir", self.state]

    def log_tail(self, n=30):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def ctl(self, *args, check=True, timeout=120):
        p = subprocess.run([self.ztctl, "--socket", self.sock, "--json", *args],
                           capture_output=True, text=True, errors="replace", timeout=timeout)
        if check and p.returncode:
            raise RuntimeError(f"ztctl {' '.join(args)}: exit {p.returncode}: "
                               f"{(p.stderr or p.stdout).strip()}")
        return p

    def start(self):
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(self.cmd, stdout=logf, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ztd exited {self.proc.returncode} during startup:\n"
                                   f"{self.log_tail()}")
            if (os.path.exists(self.sock) and
                    self.ctl("status", check=False, timeout=10).returncode == 0):
                return
            time.sleep(0.2)
        raise RuntimeError(f"ztd did not answer within 60 s:\n{self.log_tail()}")

    def stop(self):
        """SIGTERM (no job is running by now, so nothing checkpoints), SIGKILL after 60 s."""
        if not self.proc or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            log("ztd did not stop within 60 s of SIGTERM: killed")
            self.proc.kill()
            self.proc.wait()

    def plan(self, spec_path):
        """The plan's reply, or (None, ztd's refusal) when the job does not fit."""
        p = self.ctl("plan", spec_path, check=False)
        if p.returncode:
            return None, (p.stderr or p.stdout).strip()
        return json.loads(p.stdout.strip().splitlines()[-1]), None

    def run_job(self, spec_path, warmup, timed, timeout):
        """Submits the job and watches it; after warmup + timed steps cancels it. Returns the
        job's id, its normalised spec as stored and the timed steps' events."""
        out = self.ctl("submit", spec_path).stdout
        job = json.loads(out.strip().splitlines()[-1])["job"]
        stored = json.loads(self.ctl("show", job).stdout.strip().splitlines()[-1])["spec"]
        w = subprocess.Popen([self.ztctl, "--socket", self.sock, "--json", "watch", job],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             errors="replace")
        lines = queue.Queue()

        def pump():
            for line in w.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        steps, end, cancelled, gave_up = {}, None, False, False
        t_end = time.monotonic() + timeout
        try:
            while True:
                try:
                    line = lines.get(timeout=max(0.1, t_end - time.monotonic()))
                except queue.Empty:
                    if gave_up:
                        break
                    # too slow: stop it and wait a while longer for its end
                    self.ctl("cancel", job, check=False)
                    gave_up, t_end = True, time.monotonic() + 120
                    continue
                if line is None:
                    break
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                kind = ev.get("event")
                if kind == "step":
                    steps[ev["step"]] = ev
                    if not cancelled and sum(1 for s in steps if s > warmup) >= timed:
                        self.ctl("cancel", job, check=False)
                        cancelled = True
                elif kind == "end":
                    end = ev
                    break
        finally:
            if end is None:  # whatever went wrong here, the job must not hold the GPUs
                self.ctl("cancel", job, check=False)
            if w.poll() is None:
                w.kill()
            w.wait()
        got = [steps[s] for s in sorted(steps) if s > warmup][:timed]
        if end is None:
            why = f"no end event within {timeout} s" if gave_up else \
                f"ztctl watch ended without an end event: {w.stderr.read().strip()}"
            raise RuntimeError(f"job {job}: {why}; steps seen {sorted(steps)}\n{self.log_tail()}")
        if end.get("state") == "failed":
            raise RuntimeError(f"job {job} failed: {end.get('error')}\n{self.log_tail()}")
        if len(got) < timed:
            raise RuntimeError(f"job {job} ended {end.get('state')} after steps {sorted(steps)}, "
                               f"before {warmup} + {timed}" +
                               (f" (timed out after {timeout} s)" if gave_up else ""))
        return job, stored, got


def make_tokens(zt, tmp):
    """A token file of the repository's text (sources and docs), one token per byte."""
    text = os.path.join(tmp, "text.txt")
    size = 0
    with open(text, "wb") as out:
        for top in ("README.md", "docs", "engine", "offload", "proto", "client", "tools", "tests"):
            path = os.path.join(ROOT, top)
            files = [path] if os.path.isfile(path) else sorted(
                os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs
                if f.endswith((".md", ".c", ".h", ".cu", ".py", ".sh")))
            for f in files:
                with open(f, "rb") as src:
                    size += out.write(src.read())
    tok = os.path.join(tmp, "text.zt")
    p = subprocess.run([zt.ztctl, "tokenize", "--bytes", text, tok], capture_output=True,
                       text=True, errors="replace")
    if p.returncode:
        raise RuntimeError(f"ztctl tokenize: {(p.stderr or p.stdout).strip()}")
    return tok, size


def zt_spec(cfg, name, steps, data, extra):
    spec = {"name": name,
            "model": {**{k: cfg[k] for k in ("arch", "vocab", "seq_len", "d_model", "n_heads",
                                             "n_layers", "d_ff")}, "init": {"seed": 0}},
            "train": {"steps": steps, "micro_batch": cfg["B"], "grad_accum": 1,
                      "precision": "bf16", "optimizer": {"name": "adamw", "lr": LR},
                      "activation_checkpointing": {"every": "auto"}},
            "data": {"source": "file", "path": data},
            "checkpoint": {"every": 0, "keep": 1}}
    spec.update(extra)
    return spec


def device_peaks(ev):
    """Bytes per GPU from a step event: the larger of the peak allocation and the reserved block
    (an offloaded job's arena included), by device."""
    return {d["device"]: max(d["peak"], d["reserved"]) for d in ev["memory"]["devices"]}


def zt_result(side, config, cfg, ranks, job, stored, events, params):
    tokens = cfg["B"] * cfg["seq_len"] * ranks
    step_s = sum(tokens / ev["tokens_per_s"] for ev in events) / len(events)
    peaks = device_peaks(events[-1])
    return dict(side=side, config=config, job=job, spec=stored, params=params, gpus=ranks,
                tokens_per_step=tokens, step_s=step_s, tokens_per_s=tokens / step_s,
                tflops=6 * params * tokens / step_s / 1e12,
                peak_bytes_per_gpu={str(k): v for k, v in sorted(peaks.items())},
                peak_gib_per_gpu=max(peaks.values()) / GIB,
                losses=[ev["loss"] for ev in events], memory=events[-1]["memory"])


def run_zt(args, cfg, tmp, results, errors):
    steps = args.warmup + args.steps + 20  # cancelled long before: no final checkpoint
    zt = None
    try:
        zt = Ztd(args.build, tmp)
        zt.start()
        log(f"ztd: {' '.join(zt.cmd)}")
        data, size = make_tokens(zt, tmp)
        log(f"data: {data}, {size} bytes of the repository's text as byte tokens")
        if "zt1" in args.sides:
            try:
                spec = zt_spec(cfg, "dp-bench-1gpu", steps, data,
                               {"offload": {"params": "auto", "optimizer": "auto",
                                            "gpu_budget": BUDGET, "prefetch": 2}})
                path = os.path.join(tmp, "zt1.json")
                with open(path, "w") as f:
                    json.dump(spec, f)
                log(f"zt 1 GPU spec: {json.dumps(spec)}")
                plan, refused = zt.plan(path)
                if refused:
                    raise RuntimeError(f"refused by plan: {refused}")
                o = plan.get("offload", {})
                log(f"zt 1 GPU plan: {o.get('gpu_units')} of {o.get('units')} units' optimizer "
                    f"on the GPU, params {o.get('params')}, checkpointing every "
                    f"{o.get('ckpt_every')}, device {o.get('device_bytes', 0) / GIB:.2f} GiB, "
                    f"host {o.get('host_bytes', 0) / GIB:.2f} GiB, estimated "
                    f"{o.get('est_step_s', 0) * 1e3:.0f} ms a step")
                job, stored, events = zt.run_job(path, args.warmup, args.steps, args.timeout)
                mo = events[-1]["memory"].get("offload", {})
                config = (f"offload params {mo.get('params')}, {mo.get('gpu_units')} of "
                          f"{o.get('units')} units' optimizer on the GPU, checkpointing every "
                          f"{mo.get('ckpt_every')}, gpu_budget {BUDGET}")
                r = zt_result("zt 1 GPU", config, cfg, 1, job, stored, events, plan["params"])
                r["plan"] = plan
                results.append(r)
                log(f"zt 1 GPU ({job}): {r['step_s'] * 1e3:.1f} ms/step, "
                    f"{r['tokens_per_s']:.0f} tok/s; {config}")
            except Exception as e:  # noqa: BLE001  (one side fails alone)
                errors["zt 1 GPU"] = str(e)
                log(f"zt 1 GPU: FAILED: {e}")
        variants = [(s, v) for v in ("zt2", "zt2off") if v in args.sides for s in args.stages]
        for stage, variant in variants:
            off = variant == "zt2off"
            side = f"zt 2 GPUs ZeRO-{stage}" + (" offloaded" if off else "")
            try:
                extra = {"parallel": {"gpus": WORLD, "zero_stage": stage}}
                if off:
                    # ZeRO-Offload per rank, as FSDP2's CPUOffloadPolicy: every unit's masters,
                    # AdamW state and gradients on the host
                    extra["offload"] = {"optimizer": "host", "gpu_units": 0}
                spec = zt_spec(cfg, f"dp-bench-2gpu-z{stage}{'-off' if off else ''}", steps,
                               data, extra)
                path = os.path.join(tmp, f"zt2-z{stage}{'-off' if off else ''}.json")
                with open(path, "w") as f:
                    json.dump(spec, f)
                log(f"{side} spec: {json.dumps(spec)}")
                plan, refused = zt.plan(path)
                if refused:
                    log(f"{side}: does not fit, skipped: {refused}")
                    errors[side] = f"skipped, refused by plan: {refused}"
                    continue
                rb = plan["parallel"]["rank_bytes"]
                log(f"{side} plan: " + ", ".join(f"{b / GIB:.2f}" for b in rb) + " GiB per GPU")
                job, stored, events = zt.run_job(path, args.warmup, args.steps, args.timeout)
                every = stored["train"]["activation_checkpointing"]["every"]
                config = (f"ZeRO-{stage}, {'optimizer on the host' if off else 'no offload'}, "
                          f"checkpointing every {every} (auto), plan {max(rb) / GIB:.2f} GiB "
                          f"per GPU")
                r = zt_result(side, config, cfg, WORLD, job, stored, events, plan["params"])
                r["plan"] = plan
                r["zero_stage"] = stage
                results.append(r)
                log(f"{side} ({job}): {r['step_s'] * 1e3:.1f} ms/step, "
                    f"{r['tokens_per_s']:.0f} tok/s; {config}")
            except Exception as e:  # noqa: BLE001
                errors[side] = str(e)
                log(f"{side}: FAILED: {e}")
    except Exception as e:  # noqa: BLE001  (ztd or the data file: no zt side can run)
        errors["zt"] = str(e)
        log(f"zt: FAILED: {e}")
    finally:
        if zt:
            zt.stop()


# ---- PyTorch FSDP2 on two ranks -----------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fsdp2_rank(rank, world, port, cfg, warmup, timed, out_dir):
    """One rank (a process of its own on GPU `rank`): writes its figures, or its traceback, to
    out_dir/rank<rank>.json."""
    out = os.path.join(out_dir, f"rank{rank}.json")
    try:
        res = _fsdp2_rank_run(rank, world, port, cfg, warmup, timed)
    except BaseException:
        with open(out, "w") as f:
            json.dump({"error": traceback.format_exc()[-3000:]}, f)
        raise
    with open(out, "w") as f:
        json.dump(res, f)


def _fsdp2_rank_run(rank, world, port, cfg, warmup, timed):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    threads = max(1, len(os.sched_getaffinity(0)) // world)
    torch.set_num_threads(threads)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)  # the same full model on every rank before it is sharded
        kw = {k: cfg[k] for k in ("vocab", "seq_len", "d_model", "n_heads", "n_layers", "d_ff")}
        model = ob.GPT(**kw)
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.02)
        params = sum(p.numel() for p in model.parameters())
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        off = CPUOffloadPolicy(pin_memory=True)
        for b in model.h:
            fully_shard(b, mp_policy=mp, offload_policy=off)
        fully_shard(model, mp_policy=mp, offload_policy=off)
        opt = torch.optim.AdamW(model.parameters(), lr=LR, fused=True)
        rng = np.random.default_rng(rank)
        rows = torch.from_numpy(rng.integers(0, cfg["vocab"], size=(
            warmup + timed, cfg["B"], cfg["seq_len"] + 1))).long()
        torch.cuda.reset_peak_memory_stats()
        times, losses = [], []
        for s in range(warmup + timed):
            x, y = rows[s, :, :-1].cuda(), rows[s, :, 1:].cuda()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, cfg["vocab"]).float(), y.reshape(-1))
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
            if s >= warmup:
                times.append(time.perf_counter() - t0)
                losses.append(loss.item())
        return dict(rank=rank, times=times, losses=losses, params=params, threads=threads,
                    peak=torch.cuda.max_memory_allocated(),
                    reserved=torch.cuda.max_memory_reserved(), torch=torch.__version__)
    finally:
        dist.destroy_process_group()


def run_fsdp2(args, cfg, results, errors):
    side = "FSDP2 2 ranks"
    try:
        import torch.multiprocessing as mp
        port = free_port()
        with tempfile.TemporaryDirectory(prefix="zt-fsdp2.") as d:
            ctx = mp.start_processes(fsdp2_rank,
                                     args=(WORLD, port, cfg, args.warmup, args.steps, d),
                                     nprocs=WORLD, join=False, start_method="spawn")
            deadline = time.monotonic() + args.timeout
            try:
                while not ctx.join(timeout=5):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"not done within {args.timeout} s")
            finally:
                for p in ctx.processes:
                    if p.is_alive():
                        p.terminate()
                for p in ctx.processes:
                    p.join(30)
            ranks = []
            for r in range(WORLD):
                with open(os.path.join(d, f"rank{r}.json")) as f:
                    ranks.append(json.load(f))
        tokens = WORLD * cfg["B"] * cfg["seq_len"]
        step_s = max(sum(r["times"]) / len(r["times"]) for r in ranks)
        params = ranks[0]["params"]
        config = (f"fully_shard per block + root, CPUOffloadPolicy(pin_memory=True), "
                  f"MixedPrecisionPolicy(bf16, reduce fp32), AdamW(fused=True) on CPU, "
                  f"checkpoint per block, {ranks[0]['threads']} threads a rank, "
                  f"torch {ranks[0]['torch']}")
        r = dict(side=side, config=config, params=params, gpus=WORLD, tokens_per_step=tokens,
                 step_s=step_s, tokens_per_s=tokens / step_s,
                 tflops=6 * params * tokens / step_s / 1e12,
                 peak_bytes_per_gpu={str(x["rank"]): x["peak"] for x in ranks},
                 reserved_bytes_per_gpu={str(x["rank"]): x["reserved"] for x in ranks},
                 peak_gib_per_gpu=max(x["peak"] for x in ranks) / GIB,
                 losses=ranks[0]["losses"], rank_step_s=[sum(x["times"]) / len(x["times"])
                                                         for x in ranks])
        results.append(r)
        log(f"{side}: {step_s * 1e3:.1f} ms/step, {tokens / step_s:.0f} tok/s; {config}")
    except Exception as e:  # noqa: BLE001
        errors[side] = str(e)[-3000:]
        log(f"{side}: FAILED: {str(e)[-3000:]}")


# ---- the report ---------------------------------------------------------------------------------

def report(results, errors, args):
    log("")
    log(f"{'side':<22} {'step ms':>9} {'tokens/s':>10} {'TFLOPS':>8} {'peak GiB/GPU':>13}  config")
    for r in results:
        log(f"{r['side']:<22} {r['step_s'] * 1e3:>9.1f} {r['tokens_per_s']:>10.0f} "
            f"{r['tflops']:>8.1f} {r['peak_gib_per_gpu']:>13.2f}  {r['config']}")
    for side, e in errors.items():
        log(f"{side:<22} {'-':>9} {'-':>10} {'-':>8} {'-':>13}  {e.splitlines()[0][:200]}")
    log(f"(mean of {args.steps} steps after {args.warmup}; TFLOPS = 6 * N * tokens / s over all "
        f"GPUs; zt peak = max(peak allocation, reserved block or arena) per GPU from the step "
        f"events, FSDP2 peak = torch.cuda.max_memory_allocated per rank)")
    one = next((r for r in results if r["side"] == "zt 1 GPU"), None)
    fsdp = next((r for r in results if r["side"] == "FSDP2 2 ranks"), None)
    ratios = {}
    # the fastest zt 2-GPU side, and the fastest with the optimizer on the host
    for key, pick in (("zt2", lambda side: True), ("zt2off", lambda side: "offloaded" in side)):
        twos = [r for r in results if r["side"].startswith("zt 2 GPUs") and pick(r["side"])]
        two = max(twos, key=lambda r: r["tokens_per_s"]) if twos else None
        for base, name, target in ((one, "zt1", TARGET_SCALING), (fsdp, "fsdp2", TARGET_FSDP2)):
            if not (two and base):
                continue
            x = two["tokens_per_s"] / base["tokens_per_s"]
            ratios[f"{key}_over_{name}"] = dict(value=x, target=target, zt2=two["side"],
                                                met=x >= target)
            log(f"{two['side']} / {base['side']} tokens/s: {x:.2f}x (target >= {target}): "
                f"{'met' if x >= target else 'missed'}")
    return ratios


def gpu_names():
    try:
        p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    except OSError:
        return []
    if p.returncode:
        return []
    return [ln for ln in p.stdout.splitlines() if ln.startswith("GPU ")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True, help="zt's build directory (build-gpu)")
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per side (default 5)")
    ap.add_argument("--warmup", type=int, default=3, help="steps before them (default 3)")
    ap.add_argument("--model", default="gpt2-1.5b", choices=sorted(ob.CONFIGS))
    ap.add_argument("--sides", default="zt1,zt2,zt2off,fsdp2",
                    help="of zt1, zt2, zt2off, fsdp2")
    ap.add_argument("--stages", default="3,2", help="ZeRO stages of the zt2 side, in order")
    ap.add_argument("--timeout", type=int, default=240, help="seconds per side (default 240)")
    args = ap.parse_args()
    args.sides = args.sides.split(",")
    if args.steps < 1 or args.warmup < 0 or set(args.sides) - {"zt1", "zt2", "zt2off", "fsdp2"}:
        ap.error("--steps >= 1, --warmup >= 0, --sides of zt1, zt2, zt2off, fsdp2")
    try:
        stages = [int(s) for s in args.stages.split(",")]
    except ValueError:
        stages = []
    if not stages or any(s not in (1, 2, 3) for s in stages):
        ap.error(f"--stages: a comma-separated list of 1, 2, 3 (got '{args.stages}')")
    args.stages = stages
    gpus = gpu_names()
    if len(gpus) < WORLD:
        log(f"SKIP: dp_bench needs {WORLD} GPUs (nvidia-smi -L lists {len(gpus)})")
        sys.exit(77)
    # a timeout's SIGTERM unwinds through the finally blocks: the job cancelled, ztd stopped,
    # the FSDP2 ranks ended
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # NVLink SHARP multicast stays off on these machines (ztd sets it for itself; torch reads it)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    cfg = ob.CONFIGS[args.model]
    log(f"dp_bench: {args.model} B {cfg['B']} per rank, T {cfg['seq_len']}, bf16, AdamW lr {LR}, "
        f"budget {BUDGET} per GPU; {args.warmup} warm-up + {args.steps} timed steps per side")
    log(f"machine: {'; '.join(gpus)}; {len(os.sched_getaffinity(0))} cpus; torch "
        f"{ob.torch.__version__}; NCCL_NVLS_ENABLE={os.environ['NCCL_NVLS_ENABLE']}")
    results, errors = [], {}
    tmp = tempfile.mkdtemp(prefix="zt-dp.")
    try:
        if {"zt1", "zt2", "zt2off"} & set(args.sides):
            run_zt(args, cfg, tmp, results, errors)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if "fsdp2" in args.sides:
        run_fsdp2(args, cfg, results, errors)
    ratios = report(results, errors, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(model=args.model, config=cfg, budget=BUDGET, lr=LR,
                           warmup=args.warmup, steps=args.steps, gpus=gpus, runs=results,
                           errors=errors, ratios=ratios), f, indent=1)
    sys.exit(1 if errors and not results else 0)


if __name__ == "__main__":
    main()
