"""The checks of tests/integration/http.sh against a ztd --http on 127.0.0.1:PORT.

    http_check.py local PORT JOB          a loopback listener, JOB running (offloaded)
    http_check.py remote PORT JOB TOKEN   a listener that wants TOKEN as a bearer header
"""
import http.client
import json
import socket
import sys
import time

from prometheus_client.parser import text_string_to_metric_families


def get(port, path, method="GET", headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request(method, path, headers=headers or {})
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, dict(r.getheaders()), body


def metrics(port, headers=None):
    status, hdrs, body = get(port, "/metrics", headers=headers)
    assert status == 200, (status, body)
    assert hdrs["Content-Type"].startswith("text/plain; version=0.0.4"), hdrs
    # the parser raises on anything the format does not allow
    fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
    return fams


def samples(fams, family, **labels):
    return [s for s in fams[family].samples
            if all(s.labels.get(k) == v for k, v in labels.items())]


def check_local(port, job):
    fams = metrics(port)
    for name in ["zt_build_info", "zt_queue_jobs", "zt_connections", "zt_device_allocated_bytes",
                 "zt_host_pinned_bytes", "zt_job_info", "zt_job_step", "zt_job_loss",
                 "zt_job_lr", "zt_job_grad_norm", "zt_job_tokens_per_second",
                 "zt_job_step_seconds", "zt_job_mfu_ratio", "zt_job_memory_bytes",
                 "zt_job_step_moved_bytes", "zt_job_timeline_busy_ratio",
                 "zt_job_timeline_wait_ratio"]:
        assert name in fams, (name, sorted(fams))
    assert samples(fams, "zt_queue_jobs", state="running")[0].value == 1
    assert samples(fams, "zt_connections", listener="http")[0].value >= 1
    assert samples(fams, "zt_job_info", job=job, state="running", name="tiny")
    step = samples(fams, "zt_job_step", job=job)[0].value
    assert step >= 3, step
    assert 0 < samples(fams, "zt_job_mfu_ratio", job=job)[0].value < 1
    assert samples(fams, "zt_job_tokens_per_second", job=job)[0].value > 0
    assert samples(fams, "zt_job_step_seconds", job=job)[0].value > 0
    tiers = {s.labels["tier"]: s.value for s in samples(fams, "zt_job_memory_bytes", job=job)}
    assert tiers["device"] > 0 and tiers["host_pinned"] > 0 and tiers["nvme"] == 0, tiers
    moved = {s.labels["link"]: s.value for s in samples(fams, "zt_job_step_moved_bytes", job=job)}
    # parameters on the host: every step copies them to the device and the gradients back
    assert moved["h2d"] > 0 and moved["d2h"] > 0 and moved["nvme_read"] == 0, moved
    busy = {s.labels["resource"]: s.value for s in samples(fams, "zt_job_timeline_busy_ratio", job=job)}
    assert set(busy) == {"compute", "h2d", "d2h", "optimizer", "nvme"}, busy
    assert all(0 <= v <= 1 for v in busy.values()), busy
    dev = samples(fams, "zt_device_allocated_bytes", device="0", kind="cpu")
    assert dev and dev[0].value > 0, dev

    # the dashboard's JSON
    status, hdrs, body = get(port, "/api/jobs")
    assert status == 200 and hdrs["Content-Type"] == "application/json", (status, hdrs)
    assert hdrs["Cache-Control"] == "no-store"
    r = json.loads(body)
    assert r["queue"]["running"] == 1 and r["backend"] == "cpu", r
    j = [x for x in r["jobs"] if x["job"] == job][0]
    assert j["state"] == "running" and j["tokens_per_s"] > 0 and 0 < j["mfu"] < 1, j
    status, _, body = get(port, f"/api/jobs/{job}/metrics")
    assert status == 200, body
    m = json.loads(body)
    pts = m["points"]
    steps = [p["step"] for p in pts]
    assert steps == sorted(steps) and steps[0] == 1 and len(pts) >= 3, steps
    p = pts[-1]
    for k in ["loss", "lr", "grad_norm", "tokens_per_s", "step_s", "mfu", "memory", "moved",
              "timeline", "time"]:
        assert k in p, (k, p)
    # only the points after a step; a step far ahead gives none
    status, _, body = get(port, f"/api/jobs/{job}/metrics?since=2")
    assert status == 200 and all(p["step"] > 2 for p in json.loads(body)["points"])
    status, _, body = get(port, f"/api/jobs/{job}/metrics?since=99999999")
    assert status == 200 and json.loads(body)["points"] == []
    assert get(port, f"/api/jobs/{job}/metrics?since=x")[0] == 400
    assert get(port, "/api/jobs/j999999/metrics")[0] == 404
    assert get(port, "/api/jobs/../metrics")[0] == 404
    assert get(port, "/nothing")[0] == 404
    # the dashboard's own files
    status, hdrs, body = get(port, "/")
    assert status == 200 and b"<script src=\"/app.js\">" in body, status
    assert "connect-src 'self'" in hdrs["Content-Security-Policy"], hdrs
    status, hdrs, body = get(port, "/app.js")
    assert status == 200 and hdrs["Content-Type"].startswith("text/javascript"), hdrs
    # GET and HEAD only; HEAD has the headers alone
    status, hdrs, body = get(port, "/metrics", method="POST")
    assert status == 405 and hdrs["Allow"] == "GET, HEAD", (status, hdrs)
    status, hdrs, body = get(port, "/metrics", method="HEAD")
    assert status == 200 and body == b"", (status, body)

    # a request whose headers do not fit the connection's pool is refused, not read on
    status, _, _ = get(port, "/metrics", headers={"X-Big": "a" * 32768})
    assert status in (413, 414, 431), status
    # connections per address are capped (16): the ones over it are closed unread
    held = []
    for _ in range(16):
        s = socket.create_connection(("127.0.0.1", port))
        held.append(s)
    time.sleep(0.3)
    extra = socket.create_connection(("127.0.0.1", port), timeout=5)
    extra.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    try:
        data = extra.recv(100)
    except ConnectionResetError:
        data = b""
    assert data == b"", data
    extra.close()
    # an idle connection is closed after the timeout (10 s)
    t0 = time.monotonic()
    held[0].settimeout(20)
    try:
        assert held[0].recv(100) == b""
    except ConnectionResetError:
        pass
    waited = time.monotonic() - t0
    assert 8 < waited < 16, waited
    for s in held:
        s.close()
    time.sleep(0.3)
    # and it serves on
    assert metrics(port)["zt_job_step"]


def check_remote(port, job, token):
    good = {"Authorization": "Bearer " + token}
    # the data wants the token; the dashboard's files do not (they hold none)
    assert samples(metrics(port, good), "zt_job_info", job=job)
    assert get(port, "/api/jobs", headers=good)[0] == 200
    # the job ran before this daemon started: its points are its losses.log's
    status, _, body = get(port, f"/api/jobs/{job}/metrics", headers=good)
    pts = json.loads(body)["points"]
    assert status == 200 and len(pts) >= 3, (status, body[:200])
    assert [p["step"] for p in pts] == list(range(1, len(pts) + 1)), pts[:3]
    assert all(set(p) == {"kind", "step", "loss"} for p in pts), pts[0]
    assert get(port, "/")[0] == 200 and get(port, "/style.css")[0] == 200
    status, hdrs, body = get(port, "/metrics")
    assert status == 401 and hdrs["WWW-Authenticate"].startswith("Bearer"), (status, hdrs)
    # wrong or missing tokens are answered 401; after the fourth the address backs off for 1 s
    # (429 with Retry-After), the right token too
    for bad in ({"Authorization": "Bearer nope"}, {"Authorization": "Basic " + token},
                {"Authorization": "Bearer " + token[:-1]}):
        assert get(port, "/api/jobs", headers=bad)[0] == 401
    status, hdrs, _ = get(port, "/metrics", headers=good)
    assert status == 429 and hdrs["Retry-After"] == "1", (status, hdrs)
    time.sleep(1.2)
    assert get(port, "/metrics", headers=good)[0] == 200


def main():
    mode, port, job = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if mode == "local":
        check_local(port, job)
    else:
        check_remote(port, job, sys.argv[4])
    print(f"http_check {mode}: ok")


if __name__ == "__main__":
    main()
