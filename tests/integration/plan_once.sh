#!/bin/bash
# One plan a job (issue 17 item 3, docs/offload.md "The stored plan"): an offloaded job's plan is
# made at submit and stored as jobs/<id>/plan.json; the runner opens the trainer with it (the
# figures the job reports are its figures); a daemon restarted with the same limits reuses it, one
# restarted with a smaller --gpu-mem-limit that the plan no longer fits plans again and says why in
# the job's log, and a missing or corrupt plan.json is planned again with a log line. Every run
# trains with losses bitwise those of the same job without offload (cpu backend). A job is kept
# queued across a restart behind a stream job that holds the daemon's one simulated device.
. "$(dirname "$0")/lib.sh"

make_tokens "$ZT_TMP/gpl.zt"
# 6 layers, clipping, two micro-batches: streaming holds far less than the whole model
pspec "$ZT_TMP/plain.json" 12 2 ""
python3 - "$ZT_TMP/plain.json" "$ZT_TMP/off.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["model"].update(n_layers=6, d_model=64, n_heads=4)
s["train"]["grad_clip"] = 1.0
json.dump(s, open(sys.argv[1], "w"))
s["offload"] = {}
json.dump(s, open(sys.argv[2], "w"))
PY
spec "$ZT_TMP/hold.json" stream 100000 '"parallel": {"gpus": 1}'

# the reference: no offload, no limit
start_ztd --backend cpu
ref=$(submit "$ZT_TMP/plain.json")
wait_end "$ref" done 300
ztctl --json show "$ref" >"$ZT_TMP/ref.json" || fail "show $ref"
resident=$(ztctl --json plan "$ZT_TMP/off.json" | json_get offload.device_bytes) ||
  fail "plan of the offloaded job"
stop_ztd

# same_losses JOB: its losses are the reference's, bitwise
same_losses() {
  ztctl --json show "$1" >"$ZT_TMP/show-$1.json" || fail "show $1"
  python3 - "$ZT_TMP/ref.json" "$ZT_TMP/show-$1.json" <<'PY' || fail "losses of $1"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
assert len(a["losses"]) == 12 and a["losses"] == b["losses"], (a["losses"], b["losses"])
PY
}
# plan_of JOB: plan.json's choices and device figure, in a line
plan_of() {
  python3 - "$STATE/jobs/$1/plan.json" <<'PY' || fail "plan.json of $1"
import json, sys
p = json.load(open(sys.argv[1]))
print("params %s gpu_units %d grads %s ckpt_every %d device %d budget %d" % (
    p["params"], p["gpu_units"], p["grads"], p["ckpt_every"], p["estimate"]["device_bytes"],
    p["budgets"]["gpu"]))
PY
}
# logged JOB TEXT: the job's log has the line
logged() {
  grep -qF "$2" "$STATE/jobs/$1/log" || fail "job $1's log has no '$2': $(cat "$STATE/jobs/$1/log")"
}
# queued_behind_hold SPEC: a stream job holding the one device, then SPEC's job queued; prints
# the queued job's id
queued_behind_hold() {
  local h j
  h=$(submit "$ZT_TMP/hold.json")
  wait_state "$h" running
  j=$(submit "$1")
  [ "$(state "$j")" = queued ] || fail "job $j is not queued behind $h"
  echo "$j"
}

# (a) submit: plan.json next to spec.json at once, and what the runner opened is that plan
big=$((2 * resident))
start_ztd --backend cpu --gpu-mem-limit "$big"
ztctl --json plan "$ZT_TMP/off.json" >"$ZT_TMP/plan-reply.json" || fail "plan under $big"
out=$(ztctl plan "$ZT_TMP/off.json") || fail "ztctl plan: $out"
case "$out" in *"plan (stored as plan.json, reused by the runner and after a restart): "*) ;;
  *) fail "ztctl plan does not say the plan: $out" ;; esac
a=$(submit "$ZT_TMP/off.json")
[ -f "$STATE/jobs/$a/plan.json" ] || fail "no plan.json after the submit of $a"
wait_end "$a" done 300
same_losses "$a"
logged "$a" "plan.json reused (it fits this daemon): "
out=$(ztctl show "$a") || fail "ztctl show $a"
case "$out" in *"plan.gpu_units"*) ;; *) fail "ztctl show does not say the plan: $out" ;; esac
python3 - "$STATE/jobs/$a/plan.json" "$ZT_TMP/show-$a.json" "$big" "$ZT_TMP/plan-reply.json" \
  <<'PY' || fail "the runner's plan"
import json, sys
p, show, big = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), int(sys.argv[3])
def same(a, b):
    # the estimate crosses the client as JSON of 15 digits (client/lib/conn.c)
    a, b = json.loads(json.dumps(a)), json.loads(json.dumps(b))
    ea, eb = a["estimate"].pop("step_s"), b["estimate"].pop("step_s")
    return a == b and abs(ea - eb) <= 1e-13 * abs(eb)
assert same(show["plan"], p), (show["plan"], p)
assert same(json.load(open(sys.argv[4]))["plan"], p), "ztctl plan's plan is not the stored one"
o = show["memory"]["offload"]
for k in ("params", "gpu_units", "ckpt_every", "grads"):
    assert o[k] == p[k], (k, o[k], p[k])
assert o["arena_budget"] == p["estimate"]["arena_bytes"], (o, p)
assert o["device_budget"] == p["estimate"]["device_bytes"] <= big, (o, p)
assert p["budgets"]["gpu"] == big, p
print("(a) the runner opened plan.json's plan:",
      {k: p[k] for k in ("params", "gpu_units", "grads")})
PY

# (b) a restart with the same limits reuses it
b=$(queued_behind_hold "$ZT_TMP/off.json")
cp "$STATE/jobs/$b/plan.json" "$ZT_TMP/b-plan.json"
before_b=$(plan_of "$b")
stop_ztd
start_ztd --backend cpu --gpu-mem-limit "$big"
wait_end "$b" done 300
same_losses "$b"
logged "$b" "plan.json reused (it fits this daemon): "
cmp -s "$STATE/jobs/$b/plan.json" "$ZT_TMP/b-plan.json" || fail "plan.json of $b was rewritten"
echo "(b) reused after a restart: $before_b"

# (c) a restart with a smaller device limit that the plan does not fit: planned again
c=$(queued_behind_hold "$ZT_TMP/off.json")
before_c=$(plan_of "$c")
device_c=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["estimate"]
  ["device_bytes"])' "$STATE/jobs/$c/plan.json") || fail "plan.json of $c"
small=$((device_c * 6 / 10))
stop_ztd
start_ztd --backend cpu --gpu-mem-limit "$small"
wait_end "$c" done 300
same_losses "$c"
logged "$c" "plan.json no longer fits this daemon (job needs "
logged "$c" "): planned again: "
after_c=$(plan_of "$c")
python3 - "$STATE/jobs/$c/plan.json" "$ZT_TMP/show-$c.json" "$small" <<'PY' || fail "the new plan of $c"
import json, sys
p, show, small = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), int(sys.argv[3])
assert p["budgets"]["gpu"] == small and p["estimate"]["device_bytes"] <= small, p
assert show["memory"]["offload"]["device_budget"] <= small, show["memory"]["offload"]
# the stored spec records what it recorded: the budget of the daemon that admitted it
assert show["spec"]["offload"]["gpu_budget"] > small, show["spec"]["offload"]
PY
echo "(c) under --gpu-mem-limit $small: planned again: $before_c -> $after_c"

# (d) a corrupt plan.json and a missing one (a job from before plan.json): planned again
h=$(submit "$ZT_TMP/hold.json")
wait_state "$h" running
d=$(submit "$ZT_TMP/off.json")
e=$(submit "$ZT_TMP/off.json")
stop_ztd
printf '{"version": 1, "params": "host"' >"$STATE/jobs/$d/plan.json"
rm "$STATE/jobs/$e/plan.json"
start_ztd --backend cpu --gpu-mem-limit "$small"
wait_end "$d" done 300
wait_end "$e" done 300
same_losses "$d"
same_losses "$e"
logged "$d" "plan.json: "
logged "$d" ": planned again: "
logged "$e" "plan.json is missing: planned again: "
plan_of "$d" >/dev/null
plan_of "$e" >/dev/null
stop_ztd
echo "plan_once: ok (limits $big and $small bytes)"
