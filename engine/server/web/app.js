// The dashboard: polls ztd's /api/jobs and /api/jobs/ID/metrics and draws the jobs table, the
// selected job's loss (and its held-out evaluations' loss), tokens/s and memory per tier over
// its steps, and its last step's timeline. No framework and nothing fetched from elsewhere. On
// a listener that wants the token open the page as http://HOST:PORT/#token=TOKEN (the fragment
// never leaves the browser; it is sent as an Authorization header with every request for
// data); #job=ID selects a job.
"use strict";

const REFRESH_MS = 2000;
const params = new URLSearchParams(location.hash.slice(1));
if (params.get("token")) sessionStorage.setItem("zt-token", params.get("token"));
const token = sessionStorage.getItem("zt-token");

let selected = params.get("job");  // the job shown below the table
let points = [];                    // its points, oldest first
let evals = [];                     // its held-out evaluations' points (data.eval), oldest first
let pointsOf = null;                // the job they belong to

const $ = (id) => document.getElementById(id);

async function api(path) {
  const headers = token ? { Authorization: "Bearer " + token } : {};
  const r = await fetch(path, { headers, cache: "no-store" });
  if (!r.ok) throw new Error(path + ": " + r.status + " " + (await r.text()).trim());
  return r.json();
}

function fmtBytes(b) {
  if (b == null) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let u = 0;
  while (b >= 1024 && u < units.length - 1) { b /= 1024; u++; }
  return (u ? b.toFixed(1) : b.toFixed(0)) + " " + units[u];
}

function fmtNum(v, digits) {
  if (v == null || !isFinite(v)) return "-";
  return Number(v.toPrecision(digits || 4)).toString();
}

function fmtRate(v) {
  if (v == null) return "-";
  if (v >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (v >= 1e3) return (v / 1e3).toFixed(1) + "k";
  return v.toFixed(0);
}

function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
}

function renderJobs(r) {
  $("server").textContent = r.server + " · backend " + r.backend;
  $("queue").textContent = r.queue.running + " running, " + r.queue.queued + " queued";
  const devs = (r.memory && r.memory.devices) || [];
  $("memory").textContent = devs.map((d) => d.kind + " " + d.device + ": " +
                                      fmtBytes(d.allocated)).join(", ");
  $("updated").textContent = "updated " + new Date().toLocaleTimeString();
  const body = document.querySelector("#jobs tbody");
  body.textContent = "";
  $("no-jobs").hidden = r.jobs.length > 0;
  // newest first
  for (const j of r.jobs.slice().reverse()) {
    const tr = document.createElement("tr");
    tr.dataset.job = j.job;
    if (j.job === selected) tr.className = "selected";
    cell(tr, j.job);
    cell(tr, j.name || "");
    cell(tr, j.state, "state-" + j.state);
    cell(tr, j.arch);
    cell(tr, j.step + "/" + j.steps, "num step");
    cell(tr, fmtNum(j.loss, 5), "num");
    cell(tr, j.eval_loss != null ? fmtNum(j.eval_loss, 5) : "-", "num");
    cell(tr, j.state === "running" ? fmtRate(j.tokens_per_s) : "-", "num");
    cell(tr, j.state === "running" && j.mfu != null ? fmtNum(100 * j.mfu, 2) + "%" : "-", "num");
    cell(tr, j.created ? new Date(j.created * 1000).toLocaleString() : "-");
    tr.addEventListener("click", () => { selected = j.job; refresh(); });
    body.appendChild(tr);
  }
  if (!selected && r.jobs.length) {
    // the newest running job, else the newest
    const running = r.jobs.filter((j) => j.state === "running");
    selected = (running.length ? running[running.length - 1] : r.jobs[r.jobs.length - 1]).job;
  }
}

// A line chart of series [{label, color, xy: [[x, y], ...]}] with its range on the axes (from 0
// when fromZero: sizes).
function drawChart(canvas, series, fmtY, fromZero) {
  const ctx = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height, L = 64, R = 8, T = 8, B = 22;
  ctx.clearRect(0, 0, W, H);
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
  for (const s of series)
    for (const [x, y] of s.xy) {
      if (y == null || !isFinite(y)) continue;
      x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y);
    }
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillStyle = "#5a6272";
  if (x0 === Infinity) { ctx.fillText("no steps yet", L, H / 2); return; }
  if (fromZero) y0 = Math.min(y0, 0);
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y1 += Math.abs(y1) * 0.05 || 1; y0 -= Math.abs(y0) * 0.05 || 1; }
  const px = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
  const py = (y) => T + (y1 - y) / (y1 - y0) * (H - T - B);
  ctx.strokeStyle = "#c9ced8";
  ctx.strokeRect(L, T, W - L - R, H - T - B);
  ctx.textAlign = "right";
  ctx.fillText(fmtY(y1), L - 4, T + 10);
  ctx.fillText(fmtY(y0), L - 4, H - B);
  ctx.textAlign = "left";
  ctx.fillText("step " + x0, L, H - 6);
  ctx.textAlign = "right";
  ctx.fillText("step " + x1, W - R, H - 6);
  let lx = L + 6;
  for (const s of series) {
    ctx.strokeStyle = s.color;
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    let pen = false;
    for (const [x, y] of s.xy) {
      if (y == null || !isFinite(y)) { pen = false; continue; }
      if (pen) ctx.lineTo(px(x), py(y)); else ctx.moveTo(px(x), py(y));
      pen = true;
    }
    ctx.stroke();
    // a sparse series (the evaluations) gets a mark at each point: one alone draws no line
    if (s.marks) {
      ctx.fillStyle = s.color;
      for (const [x, y] of s.xy)
        if (y != null && isFinite(y)) ctx.fillRect(px(x) - 2.5, py(y) - 2.5, 5, 5);
    }
    if (series.length > 1) {
      ctx.fillStyle = s.color;
      ctx.textAlign = "left";
      ctx.fillText(s.label, lx, T + 12);
      lx += ctx.measureText(s.label).width + 12;
    }
  }
}

function bar(parent, label, share, wait) {
  const row = document.createElement("div");
  row.className = wait ? "bar wait" : "bar";
  const name = document.createElement("span");
  name.className = "label";
  name.textContent = label;
  const track = document.createElement("span");
  track.className = "track";
  const fill = document.createElement("span");
  fill.className = "fill";
  fill.style.display = "block";
  fill.style.width = Math.max(0, Math.min(100, 100 * share)) + "%";
  track.appendChild(fill);
  const pct = document.createElement("span");
  pct.className = "pct";
  pct.textContent = (100 * share).toFixed(0) + "%";
  row.append(name, track, pct);
  parent.appendChild(row);
}

function renderTimeline(p) {
  const el = $("timeline");
  el.textContent = "";
  const tl = p && p.timeline;
  if (!tl) {
    el.textContent = "only offloaded jobs report a timeline";
    return;
  }
  const gpu = $("server").textContent.includes("cuda") ? "gpu" : "compute";
  bar(el, gpu, tl.compute);
  bar(el, "copies to device", tl.h2d);
  bar(el, "copies to host", tl.d2h);
  bar(el, "cpu adam", tl.optimizer);
  bar(el, "nvme i/o", tl.nvme);
  if (tl.waits) {
    bar(el, "waited on copies", tl.waits.copy, true);
    bar(el, "waited on adam", tl.waits.optimizer, true);
    bar(el, "waited on nvme", tl.waits.nvme, true);
  }
  const s = document.createElement("div");
  s.textContent = "step time " + fmtNum(tl.step_s, 3) + " s";
  el.appendChild(s);
}

function renderDetail(m) {
  $("detail").hidden = false;
  $("job-title").textContent = m.job + (m.name ? " · " + m.name : "") + " · " + m.state;
  const last = points.length ? points[points.length - 1] : null;
  const summary = $("job-summary");
  summary.dataset.job = m.job;
  summary.dataset.step = last ? last.step : 0;
  summary.dataset.points = points.length;
  summary.dataset.evals = evals.length;
  summary.textContent = "step " + m.step + " of " + m.steps +
      (last && last.loss != null ? " · loss " + fmtNum(last.loss, 5) : "") +
      (evals.length ? " · eval loss " + fmtNum(evals[evals.length - 1].eval_loss, 5) +
                      " (step " + evals[evals.length - 1].step + ")" : "") +
      (last && last.tokens_per_s != null ? " · " + fmtRate(last.tokens_per_s) + " tokens/s" : "") +
      (last && last.mfu != null ? " · MFU " + fmtNum(100 * last.mfu, 2) + "%" : "");
  const xy = (f) => points.map((p) => [p.step, f(p)]);
  const loss = [{ label: "loss", color: "#3b6fd8", xy: xy((p) => p.loss) }];
  if (evals.length)
    loss.push({ label: "eval loss", color: "#d8733b", marks: true,
                xy: evals.map((e) => [e.step, e.eval_loss]) });
  drawChart($("chart-loss"), loss, (v) => fmtNum(v, 4));
  drawChart($("chart-rate"), [{ label: "tokens/s", color: "#1a7f37",
                                xy: xy((p) => p.tokens_per_s) }], fmtRate);
  const mem = (k) => xy((p) => (p.memory ? p.memory[k] : null));
  drawChart($("chart-memory"), [
    { label: "device", color: "#3b6fd8", xy: mem("device") },
    { label: "pinned host", color: "#d8733b", xy: mem("host_pinned") },
    { label: "nvme", color: "#7b3bd8", xy: mem("nvme") },
  ], fmtBytes, true);
  renderTimeline(last);
}

async function refresh() {
  clearTimeout(refresh.timer);
  try {
    renderJobs(await api("/api/jobs"));
    if (selected) {
      if (pointsOf !== selected) { points = []; evals = []; pointsOf = selected; }
      const since = points.length ? points[points.length - 1].step : 0;
      const m = await api("/api/jobs/" + encodeURIComponent(selected) + "/metrics?since=" + since);
      // the points sent replace any the page had of the same steps on
      const first = m.points.length ? m.points[0].step : Infinity;
      points = points.filter((p) => p.step < first).concat(m.points);
      const efirst = m.evals.length ? m.evals[0].step : Infinity;
      evals = evals.filter((e) => e.step < efirst).concat(m.evals);
      renderDetail(m);
    }
    $("error").hidden = true;
  } catch (e) {
    $("error").hidden = false;
    $("error").textContent = String(e.message || e);
  }
  refresh.timer = setTimeout(refresh, REFRESH_MS);
}

refresh();
