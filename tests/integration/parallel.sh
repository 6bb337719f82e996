#!/bin/bash
# Jobs of several ranks on a cpu ztd of four simulated ranks (--cpu-ranks 4): a "parallel":
# {"gpus": 2} job learns at ZeRO stages 1, 2 and 3 with the losses of a one-rank job with
# grad_accum 2 on the same file (1e-6 relative), one of them resumed from its checkpoint after
# the daemon was killed (the steps trained again bitwise); plan reports the bytes of each rank;
# more ranks than the daemon has are refused with the numbers; two 2-rank jobs run side by side
# while a 3-rank job queues, and cancelling them releases the ranks to it; a job that fails
# releases its ranks to the job queued behind it.
. "$(dirname "$0")/lib.sh"

start_ztd --cpu-ranks 4
make_tokens "$ZT_TMP/gpl.zt"

# wait_lines JOB N: polls until the job's losses.log has N steps (cheaper than show: the test
# runs on 2 cores beside its jobs).
wait_lines() {
  local i
  for i in $(seq 1 1200); do
    [ "$(wc -l 2>/dev/null <"$STATE/jobs/$1/losses.log" || echo 0)" -ge "$2" ] && return 0
    sleep 0.05
  done
  fail "job $1 did not reach step $2"
}


# Refusals, at submit and plan alike.
pspec "$ZT_TMP/wide.json" 30 1 '{"gpus": 5}'
for op in submit plan; do
  out=$(ztctl "$op" "$ZT_TMP/wide.json" 2>&1) && fail "$op accepted 5 ranks on a 4-rank daemon"
  case "$out" in
    *EINVAL*"parallel.gpus 5 is more than the 4 simulated ranks of this cpu daemon"*) ;;
    *) fail "$op refusal of 5 ranks: $out" ;;
  esac
done

# plan: the bytes of each rank, falling with the stage where the parameters outweigh the
# activations (the tiny jobs below are the other way round); nothing is queued.
for stage in 1 2 3; do
  pspec "$ZT_TMP/s$stage.json" 20 1 "{\"gpus\": 2, \"zero_stage\": $stage}"
  python3 - "$ZT_TMP/s$stage.json" "$ZT_TMP/big$stage.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["model"].update(d_model=256, n_heads=4, n_layers=8)
s["train"]["micro_batch"] = 1
json.dump(s, open(sys.argv[2], "w"))
PY
done
pspec "$ZT_TMP/ref.json" 20 2 ''
python3 - "$(ztctl --json plan "$ZT_TMP/big1.json")" "$(ztctl --json plan "$ZT_TMP/big2.json")" \
  "$(ztctl --json plan "$ZT_TMP/big3.json")" "$(ztctl --json plan "$ZT_TMP/s1.json")" \
  "$(ztctl --json plan "$ZT_TMP/ref.json")" <<'PY' || fail "plan"
import json, sys
plans = [json.loads(a) for a in sys.argv[1:]]
prev = None
for stage, p in enumerate(plans[:3], 1):
    par = p["parallel"]
    rb = par["rank_bytes"]
    assert par["gpus"] == 2 and par["zero_stage"] == stage, p
    assert len(rb) == 2 and rb[0] == rb[1] and p["backend_bytes"] == 2 * rb[0], p
    assert prev is None or rb[0] < prev, (stage, rb[0], prev)
    prev = rb[0]
tiny, ref = plans[3:]
assert tiny["backend_bytes"] == 2 * tiny["parallel"]["rank_bytes"][0], tiny
assert ref["parallel"] == {"gpus": 1, "zero_stage": 1, "world": 1, "rank_bytes": [ref["backend_bytes"]]}, ref
print("plan: rank bytes by stage", [p["parallel"]["rank_bytes"][0] for p in plans[:3]])
PY
ztctl plan "$ZT_TMP/big3.json" | grep -q "parallel: 2 ranks, ZeRO stage 3, .* on each" ||
  fail "ztctl plan does not print the ranks: $(ztctl plan "$ZT_TMP/big3.json")"
[ "$(ztctl --json jobs | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["jobs"]))')" = 0 ] ||
  fail "plan or a refusal queued a job"

# The one-rank reference and the three stages on the same file. FIFO on 4 ranks: ref (1) and
# stage 1 (2) start, stage 2 waits for two free ranks and stage 3 behind it. Stage 2 runs until
# cancelled (the learning rate is constant: its first 20 steps are those of a 20-step job), so
# that the daemon is certainly killed while it runs; its checkpoints every 5 steps resume it, and
# the steps after the newest are trained again bitwise. Later steps of such a tiny model drift
# apart by more than 1e-6: AdamW turns the rounding of a near-zero gradient into a whole step
# of either sign (with the init drawn from both Box-Muller branches, at step 14), so the first
# 12 steps are held to 1e-6.
python3 - "$ZT_TMP/s2.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["train"]["steps"] = 1000000
s["checkpoint"]["every"] = 5
json.dump(s, open(sys.argv[1], "w"))
PY
ref=$(new_job "$ZT_TMP/ref.json") || exit 1
j1=$(new_job "$ZT_TMP/s1.json") || exit 1
j2=$(new_job "$ZT_TMP/s2.json") || exit 1
j3=$(new_job "$ZT_TMP/s3.json") || exit 1
wait_lines "$j2" 22
cp "$STATE/jobs/$j2/losses.log" "$ZT_TMP/before.log"
kill -KILL "$ZTD_PID"
wait "$ZTD_PID" 2>/dev/null
ZTD_PID=
start_ztd --cpu-ranks 4
for j in "$ref" "$j1" "$j3"; do wait_end "$j" done; done
before=$(wc -l <"$ZT_TMP/before.log")
wait_lines "$j2" $((before + 2))
grep -q "resumes from" "$STATE/jobs/$j2/log" || fail "job $j2 did not resume: $(cat "$STATE/jobs/$j2/log")"
grep -q "running on the cpu backend (ranks " "$STATE/jobs/$j2/log" ||
  fail "job $j2's log does not name its ranks: $(cat "$STATE/jobs/$j2/log")"
ztctl cancel "$j2" >/dev/null || fail "cancel $j2"
wait_end "$j2" cancelled
python3 - "$ZT_TMP/before.log" "$STATE/jobs/$j2/losses.log" "$(ztctl --json show "$ref")" \
  "$(ztctl --json show "$j1")" "$(ztctl --json show "$j2")" "$(ztctl --json show "$j3")" \
  <<'PY' || fail "the parallel jobs' losses"
import json, sys
# losses.log holds every bit of them (17 digits)
before, after = (open(f).read().splitlines() for f in sys.argv[1:3])
assert len(after) > len(before) and after[:len(before)] == before, (before, after)
print("stage 2: %d losses before the kill, the same after the resume" % len(before))
ref, *par = (json.loads(a) for a in sys.argv[3:])
r = ref["losses"]
assert len(r) == 20, len(r)
for stage, j in enumerate(par, 1):
    l = j["losses"]
    assert j["spec"]["parallel"] == {"gpus": 2, "zero_stage": stage}, j["spec"]
    assert len(l) == 20 or stage == 2, (stage, len(l))
    l = l[:20]
    # the first step adds the same micro-batches in the same order: bitwise
    assert l[0] == r[0], (stage, l[0], r[0])
    worst = max(abs(a - b) / abs(b) for a, b in zip(l[:12], r[:12]))
    assert worst <= 1e-6, (stage, worst, l, r)
    print("stage %d: 12 losses within %.2g of grad_accum 2 on one rank" % (stage, worst))
PY
for j in "$ref" "$j1" "$j2" "$j3"; do check_learned "$j"; done

# Two 2-rank jobs side by side; a 3-rank job waits for three free ranks; cancelling releases.
spec "$ZT_TMP/stream2.json" stream 1000 '"parallel": {"gpus": 2}'
spec "$ZT_TMP/stream3.json" stream 1000 '"parallel": {"gpus": 3}'
a=$(new_job "$ZT_TMP/stream2.json") || exit 1
b=$(new_job "$ZT_TMP/stream2.json") || exit 1
c=$(new_job "$ZT_TMP/stream3.json") || exit 1
wait_status "$a" '"state": "running"'
wait_status "$b" '"state": "running"'
# holders [a, a, b, b], two running, one queued: all in one status reply
check_status() {
  ztctl --json status | python3 -c '
import json, sys
s = json.loads(sys.stdin.read())
want_running, want_queued = int(sys.argv[1]), int(sys.argv[2])
holders = [g["job"] for g in s["gpus"]]
assert [g["index"] for g in s["gpus"]] == [0, 1, 2, 3], s["gpus"]
assert s["queue"]["running"] == want_running and s["queue"]["queued"] == want_queued, s["queue"]
assert holders == [h if h != "-" else None for h in sys.argv[3:]], holders' "$@"
}
check_status 2 1 "$a" "$a" "$b" "$b" || fail "status with two 2-rank jobs: $(ztctl --json status)"
[ "$(state "$c")" = queued ] || fail "the 3-rank job is $(state "$c"), expected queued"
ztctl status | grep -q "ranks: 0 $a, 1 $a, 2 $b, 3 $b" || fail "ztctl status: $(ztctl status)"
ztctl --json show "$b" | python3 -c '
import json, sys
assert json.loads(sys.stdin.read())["gpus"] == [2, 3]' || fail "show $b: $(ztctl --json show "$b")"
ztctl cancel "$a" >/dev/null || fail "cancel $a"
wait_end "$a" cancelled
[ "$(state "$c")" = queued ] || fail "the 3-rank job started on 2 free ranks"
ztctl cancel "$b" >/dev/null || fail "cancel $b"
wait_status "$c" '"state": "running"'
check_status 1 0 "$c" "$c" "$c" - || fail "status after the cancels: $(ztctl --json status)"
ztctl cancel "$c" >/dev/null || fail "cancel $c"
wait_end "$c" cancelled
for i in $(seq 1 100); do check_status 0 0 - - - - 2>/dev/null && break; sleep 0.1; done
check_status 0 0 - - - - || fail "ranks still held: $(ztctl --json status)"

# A job that fails mid-run (its checkpoint cannot be written) releases its ranks: the job
# queued behind it starts, and ztd serves on.
python3 - "$ZT_TMP/s3.json" "$ZT_TMP/fail.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["train"]["steps"] = 1000000
s["checkpoint"]["every"] = 5
json.dump(s, open(sys.argv[2], "w"))
PY
f=$(new_job "$ZT_TMP/fail.json") || exit 1
q=$(new_job "$ZT_TMP/stream3.json") || exit 1
wait_lines "$f" 2
mv "$STATE/jobs/$f/checkpoints" "$STATE/jobs/$f/checkpoints.old"
: >"$STATE/jobs/$f/checkpoints"
wait_end "$f" failed
err=$(ztctl --json show "$f" | json_get error)
# "Not a directory", or, when the move caught a checkpoint being written, the rename in it
case "$err" in *"$STATE/jobs/$f/checkpoints/"*"Not a directory"* | \
  *"$STATE/jobs/$f/checkpoints/"*"No such file or directory"*) ;;
  *) fail "the failed job's error: $err" ;; esac
wait_status "$q" '"state": "running"'
check_status 1 0 "$q" "$q" "$q" - || fail "status after the failure: $(ztctl --json status)"
ztctl cancel "$q" >/dev/null || fail "cancel $q"
wait_end "$q" cancelled
stop_ztd
echo "parallel: ok"
