#!/bin/bash
# Held-out evaluation through ztd (data.eval): a job evaluates its eval file's first batches at
# every data.eval.every steps and at the end, once a step: "eval" events (submit --watch
# --json), lines of metrics.jsonl and TensorBoard's "eval/loss" (read by tensorboard's own
# reader), show/jobs (--json and text), watch's summary, plot's second curve, /metrics (read by
# prometheus-client's parser) and the dashboard's JSON, the checkpoints' trainer.json. The
# training's losses and memory are bitwise those of the job without data.eval; an offloaded
# job's evaluations are bitwise the plain job's; a stream job evaluates too; a job killed
# mid-run and resumed has each evaluation once everywhere; the final eval loss of a job packed
# by documents is, bit for bit, the first step's loss of a job started from its weights on the
# same rows (a separate forward); a job of two ranks evaluates, training as without it. Bad
# eval files (another vocabulary, a FIFO, missing, not a token file), bad fields and a job
# spanning daemons are refused at submit naming the field, the daemon and the other jobs
# untouched.
. "$(dirname "$0")/lib.sh"

python_with tensorboard
TB_PY=$PY
HTTP=${ZT_HAVE_HTTP:-0}
if [ "$HTTP" = 1 ]; then
  python_with prometheus_client
  start_ztd --cpu-ranks 2 --http 0
  port=$(sed -n 's/.*http listening on [^ ]*:\([0-9]*\).*/\1/p' "$ZTD_LOG" | tail -n 1)
  [ -n "$port" ] || fail "no 'http listening' line in the log"
else
  start_ztd --cpu-ranks 2
fi

make_tokens "$ZT_TMP/gpl.zt"
ztctl tokenize --bytes "$(dirname "$0")/../../README.md" "$ZT_TMP/held.zt" >/dev/null ||
  fail "tokenize the held-out text"
# documents with a loss mask (the prompt's tokens not counted)
python3 - "$ZT_TMP/docs.jsonl" <<'PY'
import json, random, sys
r = random.Random(7)
with open(sys.argv[1], "w") as f:
    for d in range(40):
        n = r.randint(4, 30)
        ids = [r.randrange(256) for _ in range(n)]
        mask = [0 if i < n // 3 else 1 for i in range(n)]
        f.write(json.dumps({"input_ids": ids, "loss_mask": mask}) + "\n")
PY
ztctl pack "$ZT_TMP/docs.jsonl" "$ZT_TMP/docs.tok" --vocab 256 >/dev/null || fail "pack"

# job SPEC_OUT STEPS DATA_EXTRA [TOP_EXTRA]: the tiny spec on gpl.zt, data.eval etc. in DATA_EXTRA
job_spec() {
  spec "$1" "$ZT_TMP/gpl.zt" "$2" "${4:-\"offload\": false}"
  python3 - "$1" "$3" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["data"].update(json.loads("{" + sys.argv[2] + "}"))
json.dump(s, open(sys.argv[1], "w"))
PY
}
EVAL="\"eval\": {\"path\": \"$ZT_TMP/held.zt\", \"every\": 5, \"batches\": 2}"

# ---- refusals at submit, naming data.eval's fields ----------------------------------------
ztctl pack "$ZT_TMP/docs.jsonl" "$ZT_TMP/v300.tok" --vocab 300 >/dev/null || fail "pack 300"
mkfifo "$ZT_TMP/fifo"
printf 'not tokens at all\n' >"$ZT_TMP/text.txt"
for bad in "v300.tok|: token vocabulary 300 is larger than model.vocab 256" \
           "fifo| is a FIFO, not a regular file" "missing.zt|: No such file or directory" \
           "text.txt|: not a token file"; do
  job_spec "$ZT_TMP/bad.json" 5 "\"eval\": {\"path\": \"$ZT_TMP/${bad%%|*}\"}"
  expect_fail 1 "data.eval.path: $ZT_TMP/${bad%%|*}${bad#*|}" ztctl submit "$ZT_TMP/bad.json"
done
out=$(ztctl submit "$ZT_TMP/bad.json" 2>&1)
case "$out" in *"not tokens"*) fail "the refusal echoes the file's bytes: $out" ;; esac
job_spec "$ZT_TMP/bad.json" 5 "\"eval\": {\"path\": \"$ZT_TMP/held.zt\", \"every\": -1}"
expect_fail 1 "data.eval.every" ztctl submit "$ZT_TMP/bad.json"
job_spec "$ZT_TMP/bad.json" 5 "\"eval\": {\"path\": \"$ZT_TMP/held.zt\", \"batches\": 0}"
expect_fail 1 "data.eval.batches" ztctl submit "$ZT_TMP/bad.json"
job_spec "$ZT_TMP/bad.json" 5 "\"eval\": {\"path\": \"$ZT_TMP/held.zt\", \"often\": 1}"
expect_fail 1 "often" ztctl submit "$ZT_TMP/bad.json"
job_spec "$ZT_TMP/bad.json" 5 "\"eval\": {\"path\": \"held.zt\"}"
expect_fail 1 "data.eval.path" ztctl submit "$ZT_TMP/bad.json"
job_spec "$ZT_TMP/bad.json" 5 "$EVAL" '"offload": false, "parallel": {"gpus": 1, "peers": ["127.0.0.1:9"]}'
expect_fail 1 "data.eval with 2 ranks (parallel.gpus 1 on each of 2 daemons) is not supported yet" \
  ztctl submit "$ZT_TMP/bad.json"
[ -z "$(ls "$STATE/jobs" 2>/dev/null)" ] || fail "a refused job left a directory: $(ls "$STATE/jobs")"

# ---- plain with and without data.eval, offloaded with it ----------------------------------
job_spec "$ZT_TMP/a.json" 20 "$EVAL" '"offload": false, "log": {"tensorboard": true}'
job_spec "$ZT_TMP/b.json" 20 ""
job_spec "$ZT_TMP/c.json" 20 "$EVAL" '"offload": {"optimizer": "host", "params": "host"}'
ztctl --json submit --watch "$ZT_TMP/a.json" >"$ZT_TMP/a.events" || fail "job a: $(tail -n 3 "$ZT_TMP/a.events")"
a=$(job_id_of <"$ZT_TMP/a.events")
b=$(new_job "$ZT_TMP/b.json") || exit 1
c=$(new_job "$ZT_TMP/c.json") || exit 1
wait_end "$a" done
wait_end "$b" done
wait_end "$c" done
ztctl --json show "$a" >"$ZT_TMP/a.show" || fail "show $a"
ztctl --json jobs >"$ZT_TMP/jobs.json" || fail "jobs"

"$TB_PY" - "$STATE/jobs" "$a" "$b" "$c" "$ZT_TMP/a.events" "$ZT_TMP/a.show" "$ZT_TMP/jobs.json" <<'PY' || fail "job $a's evaluations"
import json, struct, sys
from tensorboard.backend.event_processing import event_accumulator
jobs, a, b, c = sys.argv[1:5]
events = [json.loads(l) for l in open(sys.argv[5]) if l.startswith("{")]
show, listed = json.load(open(sys.argv[6])), json.load(open(sys.argv[7]))

# libztclient's JSON (ztctl --json) carries 15 significant digits
r15 = lambda x: float("%.15g" % x)

def log(job, name):
    return [l.split() for l in open(f"{jobs}/{job}/{name}")]

evals = log(a, "evals.log")
assert [int(s) for s, _ in evals] == [5, 10, 15, 20], evals
loss = {int(s): float(v) for s, v in evals}
assert len(set(loss.values())) == 4, loss
# training with data.eval is bitwise training without it; offloaded, the evaluations too
assert log(a, "losses.log") == log(b, "losses.log"), "data.eval changed the training's losses"
assert log(c, "losses.log") == log(b, "losses.log"), "offload changed the training's losses"
assert log(c, "evals.log") == evals, (log(c, "evals.log"), evals)
# the events: every evaluation the watch saw, each once, the end's too
ev = [e for e in events if e.get("event") == "eval"]
assert ev and [e["step"] for e in ev] == [5, 10, 15, 20][-len(ev):], ev
for e in ev:
    assert e["eval_loss"] == r15(loss[e["step"]]) and e["batches"] == 2 and e["tokens"] > 0, e
    assert e["steps"] == 20 and e["eval_s"] >= 0, e
end = [e for e in events if e.get("event") == "end"][-1]
assert end["eval_loss"] == r15(loss[20]), end
# metrics.jsonl: a line per step and one per evaluation, after its step's
lines = [json.loads(l) for l in open(f"{jobs}/{a}/metrics.jsonl")]
el = [l for l in lines if l["kind"] == "eval"]
assert [l["step"] for l in el] == [5, 10, 15, 20] and all(l["eval_loss"] == loss[l["step"]] for l in el), el
assert [l["step"] for l in lines if l["kind"] == "step"] == list(range(1, 21))
assert lines.index(el[0]) == 5, "the first evaluation's line does not follow step 5's"
# the evaluations take no memory of their own: every step's figures are the job's without them
bl = [json.loads(l) for l in open(f"{jobs}/{b}/metrics.jsonl")]
assert [l["memory"] for l in lines if l["kind"] == "step"] == [l["memory"] for l in bl], "memory differs"
# TensorBoard: eval/loss at each evaluation's step
acc = event_accumulator.EventAccumulator(f"{jobs}/{a}/tb")
acc.Reload()
f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]
sc = acc.Scalars("eval/loss")
assert [(s.step, s.value) for s in sc] == [(k, f32(loss[k])) for k in (5, 10, 15, 20)], sc
# show and jobs
assert show["eval_step"] == 20 and show["eval_loss"] == r15(loss[20]), show
assert show["evals"] == [[k, r15(loss[k])] for k in (5, 10, 15, 20)], show["evals"]
assert show["spec"]["data"]["eval"] == {"path": show["spec"]["data"]["eval"]["path"], "every": 5, "batches": 2}
entry = {j["job"]: j for j in listed["jobs"]}
assert entry[a]["eval_loss"] == r15(loss[20]) and entry[a]["eval_step"] == 20, entry[a]
assert "eval_loss" not in entry[b], entry[b]
# the checkpoints' record
for step in (10, 20):
    rec = json.load(open(f"{jobs}/{a}/checkpoints/step-{step:08d}/trainer.json"))
    assert rec["eval"] == {"step": step, "loss": loss[step]}, rec.get("eval")
print(f"{a}: evaluations at {sorted(loss)} in every place; {b}, {c} agree bitwise")
PY

# the text forms
ztctl jobs | grep -E "^$a .* [0-9]+\.[0-9]{4} +[0-9]+\.[0-9]{4} " >/dev/null || fail "jobs lacks $a's eval loss: $(ztctl jobs)"
ztctl jobs | grep -E "^$b .* - " >/dev/null || fail "jobs shows an eval loss for $b"
ztctl show "$a" | grep -q "^evals: 4, last after step 20, loss " || fail "show: $(ztctl show "$a")"
ztctl show "$a" | grep -q "^eval_loss" || fail "show lacks eval_loss"
ztctl watch "$a" | grep -q "final loss [0-9.]*, eval loss [0-9.]* (step 20)" ||
  fail "watch's summary: $(ztctl watch "$a")"
plot=$(ztctl plot "$a") || fail "plot"
printf '%s\n' "$plot"
head -n 1 <<<"$plot" | grep -q "o: eval loss of 4 evaluations" || fail "plot's title"
[ "$(printf '%s\n' "$plot" | tail -n +2 | grep -o 'o' | wc -l)" -eq 4 ] || fail "plot: not 4 evaluations"
[ "$(printf '%s\n' "$plot" | awk '{ if (length($0) > m) m = length($0) } END { print m }')" -le 80 ] ||
  fail "the plot is wider than 80 columns"

if [ "$HTTP" = 1 ]; then
  "$PY" - "$port" "$a" "$STATE/jobs/$a/evals.log" <<'PY' || fail "/metrics and the dashboard's JSON"
import json, sys, urllib.request
from prometheus_client.parser import text_string_to_metric_families
port, job = sys.argv[1], sys.argv[2]
loss = {int(s): float(v) for s, v in (l.split() for l in open(sys.argv[3]))}
get = lambda path: urllib.request.urlopen(f"http://127.0.0.1:{port}{path}").read().decode()
fams = {f.name: f for f in text_string_to_metric_families(get("/metrics"))}
ev = [s for s in fams["zt_job_eval_loss"].samples if s.labels["job"] == job]
assert len(ev) == 1 and ev[0].value == loss[20], ev
st = [s for s in fams["zt_job_eval_step"].samples if s.labels["job"] == job]
assert st[0].value == 20, st
j = [x for x in json.loads(get("/api/jobs"))["jobs"] if x["job"] == job][0]
assert j["eval_loss"] == loss[20], j
m = json.loads(get(f"/api/jobs/{job}/metrics"))
assert [(p["step"], p["eval_loss"]) for p in m["evals"]] == sorted(loss.items()), m["evals"]
assert [p["step"] for p in json.loads(get(f"/api/jobs/{job}/metrics?since=15"))["evals"]] == [15, 20]
print("/metrics: zt_job_eval_loss", ev[0].value, "; the dashboard's evals", len(m["evals"]))
PY
fi

# ---- two ranks (ZeRO stage 3): the world evaluates, its training as without data.eval ------
job_spec "$ZT_TMP/p1.json" 10 "$EVAL" '"offload": false, "parallel": {"gpus": 2, "zero_stage": 3}'
job_spec "$ZT_TMP/p2.json" 10 "" '"offload": false, "parallel": {"gpus": 2, "zero_stage": 3}'
p1=$(new_job "$ZT_TMP/p1.json") || exit 1
wait_end "$p1" done
p2=$(new_job "$ZT_TMP/p2.json") || exit 1
wait_end "$p2" done
cmp -s "$STATE/jobs/$p1/losses.log" "$STATE/jobs/$p2/losses.log" ||
  fail "data.eval changed the losses of a job of two ranks"
[ "$(awk '{ print $1 }' "$STATE/jobs/$p1/evals.log" | tr '\n' ' ')" = "5 10 " ] ||
  fail "the job of two ranks $p1's evaluations: $(cat "$STATE/jobs/$p1/evals.log")"
echo "ok: $p1 (two ranks) evaluated after steps 5 and 10, its losses $p2's"

# ---- a stream job evaluates its eval file packed as the file's version says (documents) --------
spec "$ZT_TMP/s.json" stream 8 '"offload": false'
python3 - "$ZT_TMP/s.json" "$ZT_TMP/docs.tok" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["data"]["eval"] = {"path": sys.argv[2], "every": 4, "batches": 3}
json.dump(s, open(sys.argv[1], "w"))
PY
out=$(ztctl --json submit "$ZT_TMP/s.json" --data "$ZT_TMP/gpl.zt" --wait) || fail "stream job: $out"
sj=$(printf '%s\n' "$out" | job_id_of)
[ "$(awk '{ print $1 }' "$STATE/jobs/$sj/evals.log" | tr '\n' ' ')" = "4 8 " ] ||
  fail "stream job $sj's evaluations: $(cat "$STATE/jobs/$sj/evals.log")"
echo "ok: stream job $sj evaluated after steps 4 and 8"

# ---- killed mid-run and resumed: each evaluation once, carried by the checkpoints -----------
job_spec "$ZT_TMP/long.json" 400 "\"eval\": {\"path\": \"$ZT_TMP/held.zt\", \"every\": 10}" \
  '"offload": false, "log": {"tensorboard": true}'
long=$(new_job "$ZT_TMP/long.json") || exit 1
wait_status "$long" '"checkpoint_step": [1-9]0,'
ck=$(json_get checkpoint_step <"$STATE/jobs/$long/status.json")
wait_step "$long" $((ck + 12))
kill -KILL "$ZTD_PID"
wait "$ZTD_PID" 2>/dev/null
ZTD_PID=
grep -q '"state": "running"' "$STATE/jobs/$long/status.json" ||
  fail "$long was not mid-run at the kill: $(cat "$STATE/jobs/$long/status.json")"
if [ "$HTTP" = 1 ]; then start_ztd --cpu-ranks 2 --http 0; else start_ztd --cpu-ranks 2; fi
wait_end "$long" done 300
"$TB_PY" - "$STATE/jobs/$long" <<'PY' || fail "the resumed job $long's evaluations"
import json, sys
from tensorboard.backend.event_processing import event_accumulator
d = sys.argv[1]
want = list(range(10, 401, 10))
ev = [int(l.split()[0]) for l in open(d + "/evals.log")]
assert ev == want, ev
lines = [json.loads(l) for l in open(d + "/metrics.jsonl")]
assert [l["step"] for l in lines if l["kind"] == "eval"] == want
acc = event_accumulator.EventAccumulator(d + "/tb")
acc.Reload()
assert [s.step for s in acc.Scalars("eval/loss")] == want, [s.step for s in acc.Scalars("eval/loss")]
rec = json.load(open(d + "/checkpoints/step-00000400/trainer.json"))
assert rec["eval"]["step"] == 400, rec["eval"]
print(f"{d}: {len(want)} evaluations, each once, after the restart")
PY

# ---- a separate forward of the same rows ----------------------------------------------------
# d trains on the documents and evaluates its first batch of them at the end; e starts from d's
# weights and trains one step on the same documents: that step's rows are the batch d
# evaluated (documents in the file's order), its loss their forward with d's final weights.
spec "$ZT_TMP/d.json" "$ZT_TMP/docs.tok" 6 '"offload": false'
python3 - "$ZT_TMP/d.json" "$ZT_TMP/docs.tok" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["data"]["eval"] = {"path": sys.argv[2]}
json.dump(s, open(sys.argv[1], "w"))
PY
d=$(new_job "$ZT_TMP/d.json") || exit 1
wait_end "$d" done
spec "$ZT_TMP/e.json" "$ZT_TMP/docs.tok" 1 '"offload": false'
python3 - "$ZT_TMP/e.json" "$d" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["model"]["init"] = {"job": sys.argv[2]}
json.dump(s, open(sys.argv[1], "w"))
PY
e=$(new_job "$ZT_TMP/e.json") || exit 1
wait_end "$e" done
want=$(awk '{ print $2 }' "$STATE/jobs/$d/evals.log")
got=$(awk '$1 == 1 { print $2 }' "$STATE/jobs/$e/losses.log")
[ "$(wc -l <"$STATE/jobs/$d/evals.log")" -eq 1 ] || fail "$d: not one evaluation: $(cat "$STATE/jobs/$d/evals.log")"
[ -n "$want" ] && [ "$want" = "$got" ] ||
  fail "$d's final eval loss $want; the forward of the same rows with its weights ($e) $got"
echo "ok: $d's eval loss $want is $e's forward of the same rows"

stop_ztd
echo "eval: ok"
