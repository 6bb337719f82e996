#!/bin/bash
# A job spanning two daemons on one machine, each owning one GPU, with NCCL forced onto sockets
# (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1: the cross-host path): ztd A coordinates, ztd B runs
# the part. ZeRO stages 1, 2 and 3, and pushed data (A forwards B its ranks' micro-batches), give
# the losses of one daemon with both GPUs (2 ranks: every sum has two terms, so bitwise); a
# cancel on A stops both; a graceful stop of A checkpoints (per rank: B sees A's directory, so
# each daemon's rank writes its own file) and the job resumes when A restarts, starting a new
# part on B, with the losses of the uninterrupted run; a killed B fails A's job naming the
# peer, and A serves on; the stop's checkpoint resumed by one daemon owning both GPUs (the same
# world, each rank its own file) gives the uninterrupted run's losses too. Skips (77) without
# two GPUs.
. "$(dirname "$0")/lib.sh"

n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "${n:-0}" -lt 2 ]; then
  echo "SKIP: needs 2 GPUs (found ${n:-0})"
  exit 77
fi
export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
port_a=$((20000 + RANDOM % 20000))
port_b=$((port_a + 1))
printf 'a-two-daemon-test-token-0123456789\n' >"$ZT_TMP/token"
chmod 600 "$ZT_TMP/token"
B_SOCK="$ZT_TMP/b.sock"
B_STATE="$ZT_TMP/b-state"
B_PID=
trap 'if [ -n "$B_PID" ]; then kill -KILL "$B_PID" 2>/dev/null; wait "$B_PID" 2>/dev/null; fi; cleanup' EXIT

# a part's spec comes over TCP: its token file must lie inside the daemon's --data-root
start_a() {
  start_ztd --backend cuda --gpus 0 --tcp "127.0.0.1:$port_a" --token-file "$ZT_TMP/token" \
    --data-root "$ZT_TMP"
}
start_b() {
  "$ZTD" --socket "$B_SOCK" --state-dir "$B_STATE" --backend cuda --gpus 1 \
    --tcp "127.0.0.1:$port_b" --token-file "$ZT_TMP/token" --data-root "$ZT_TMP" --log-level info \
    >>"$ZT_TMP/b.log" 2>&1 &
  B_PID=$!
  local i
  for i in $(seq 1 300); do
    "$ZTCTL" --socket "$B_SOCK" status >/dev/null 2>&1 && return 0
    kill -0 "$B_PID" 2>/dev/null || fail "ztd B exited during startup: $(tail -n 20 "$ZT_TMP/b.log")"
    sleep 0.1
  done
  fail "ztd B did not answer"
}
b_jobs() { "$ZTCTL" --socket "$B_SOCK" --json jobs; }
# the newest part on B and its state
b_last() { b_jobs | python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"]; print(j[-1]["job"], j[-1]["state"]) if j else print("none none")'; }
wait_b_end() { # STATE: B's newest part ends so
  local i s
  for i in $(seq 1 600); do
    s=$(b_last | cut -d' ' -f2)
    case "$s" in done | failed | cancelled) [ "$s" = "$1" ] && return 0
      fail "B's part ended $s, expected $1: $(tail -n 20 "$ZT_TMP/b.log")" ;; esac
    sleep 0.1
  done
  fail "B's part did not end"
}
losses() { cut -d' ' -f2 "$1/losses.log"; }

start_a
start_b
make_tokens "$ZT_TMP/gpl.zt"
peer="\"peers\": [\"127.0.0.1:$port_b\"]"

# the three stages across the daemons (data from a file every daemon reads)
two=()
for stage in 1 2 3; do
  pspec "$ZT_TMP/two$stage.json" 20 1 "{\"gpus\": 1, \"zero_stage\": $stage, $peer}"
  j=$(new_job "$ZT_TMP/two$stage.json") || exit 1
  wait_end "$j" done 300
  wait_b_end done
  two+=("$j")
  read -r part _ < <(b_last)
  "$ZTCTL" --socket "$B_SOCK" --json show "$part" | python3 -c '
import json, sys
s = json.load(sys.stdin)
assert s["part"]["rank0"] == 1 and s["part"]["world"] == 2, s["part"]
assert s["step"] == 20, s["step"]' || fail "B's part of stage $stage"
done
grep -q "ranks 1..1 of 2" "$B_STATE/jobs/$part/log" || fail "part log: $(cat "$B_STATE/jobs/$part/log")"
echo "three stages trained across two daemons"

# pushed data: the coordinator takes every rank's micro-batches and forwards the part its own
stream_job() { # SPEC: submits it with the token file pushed by ztctl, waits for done, prints the id
  local out
  out=$(ztctl --json submit "$1" --data "$ZT_TMP/gpl.zt" --wait) || fail "stream job $1: $out"
  printf '%s\n' "$out" | job_id_of
}
pspec "$ZT_TMP/two_stream.json" 20 1 "{\"gpus\": 1, \"zero_stage\": 2, $peer}" stream
two_stream=$(stream_job "$ZT_TMP/two_stream.json")
[ -n "$two_stream" ] || fail "no id of the stream job"
wait_b_end done
echo "pushed data trained across two daemons"

# cancel on the coordinator: both stop after the same step
pspec "$ZT_TMP/long.json" 100000 1 "{\"gpus\": 1, \"zero_stage\": 2, $peer}"
j=$(new_job "$ZT_TMP/long.json") || exit 1
wait_step "$j" 3
ztctl cancel "$j" >/dev/null || fail "cancel"
wait_end "$j" cancelled 60
wait_b_end cancelled
echo "cancel on the coordinator stopped both"

# graceful stop of A mid-job: checkpoint, the part ends, A resumes it with a new part
# (long enough that the stop lands mid-job on a fast GPU)
pspec "$ZT_TMP/resume.json" 2000 1 "{\"gpus\": 1, \"zero_stage\": 3, $peer}"
python3 - "$ZT_TMP/resume.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["checkpoint"] = {"every": 100000, "keep": 2}
json.dump(s, open(sys.argv[1], "w"))
PY
full=$(new_job "$ZT_TMP/resume.json") || exit 1
wait_end "$full" done 300
wait_b_end done
j=$(new_job "$ZT_TMP/resume.json") || exit 1
wait_step "$j" 12
stop_ztd
wait_b_end cancelled
# the stop's checkpoint: per rank, rank 1's file written by B into A's directory
ck=$(ls -d "$STATE/jobs/$j/checkpoints"/step-* 2>/dev/null | tail -n 1)
[ -n "$ck" ] || fail "no checkpoint after the stop: $(ls "$STATE/jobs/$j/checkpoints")"
for f in manifest.json model.safetensors rank-0.safetensors rank-1.safetensors; do
  [ -s "$ck/$f" ] || fail "$ck lacks $f: $(ls "$ck")"
done
[ ! -e "$ck/optimizer.safetensors" ] || fail "$ck is flat: $(ls "$ck")"
python3 - "$ck" <<'PY' || fail "the manifest of $ck"
import json, os, sys
d = sys.argv[1]
m = json.load(open(os.path.join(d, "manifest.json")))
assert m["layout"] == "per-rank" and m["world"] == 2 and m["zero_stage"] == 3, m
assert [e["file"] for e in m["ranks"]] == ["rank-0.safetensors", "rank-1.safetensors"], m["ranks"]
for e in m["ranks"]:
    assert os.path.getsize(os.path.join(d, e["file"])) == e["bytes"], e
PY
echo "the stop's checkpoint $(basename "$ck") is per rank: $(ls "$ck" | tr '\n' ' ')"
# the job as it stopped, for one daemon owning both GPUs to resume (below)
stopped=$j
mkdir -p "$ZT_TMP/one-state/jobs"
cp -a "$STATE/jobs/$j" "$ZT_TMP/one-state/jobs/$j" || fail "copying job $j"
start_a
wait_end "$j" done 300
wait_b_end done
grep -q "resumes from" "$STATE/jobs/$j/log" || fail "no resume in $(cat "$STATE/jobs/$j/log")"
cmp <(losses "$STATE/jobs/$full") <(losses "$STATE/jobs/$j") ||
  fail "resumed losses differ from the uninterrupted run"
echo "$(grep -o 'stopped at step [0-9]*' "$STATE/jobs/$j/log" | head -1), resumed: 2000 losses bitwise equal to the uninterrupted run"

# a peer that dies: the coordinator's job fails naming it, and A serves on
j=$(new_job "$ZT_TMP/long.json") || exit 1
wait_step "$j" 3
kill -KILL "$B_PID"
wait "$B_PID" 2>/dev/null
B_PID=
wait_end "$j" failed 120
err=$(ztctl --json show "$j" | json_get error)
case "$err" in *"127.0.0.1:$port_b"*) ;; *) fail "peer death: $err" ;; esac
echo "peer killed: $err"
stop_ztd

# the same three stages on one daemon owning both GPUs (NCCL within the process)
start_ztd --backend cuda --gpus 0,1
one=()
for stage in 1 2 3; do
  pspec "$ZT_TMP/one$stage.json" 20 1 "{\"gpus\": 2, \"zero_stage\": $stage}"
  j=$(new_job "$ZT_TMP/one$stage.json") || exit 1
  wait_end "$j" done 300
  one+=("$j")
done
pspec "$ZT_TMP/one_stream.json" 20 1 '{"gpus": 2, "zero_stage": 2}' stream
one_stream=$(stream_job "$ZT_TMP/one_stream.json")
two+=("$two_stream")
one+=("$one_stream")
for i in 0 1 2 3; do
  python3 - "$ZT_TMP/state/jobs/${two[$i]}/losses.log" "$STATE/jobs/${one[$i]}/losses.log" "$((i + 1))" <<'PY' || fail "run $((i + 1)): two daemons differ from one"
import sys
a = [float(l.split()[1]) for l in open(sys.argv[1])]
b = [float(l.split()[1]) for l in open(sys.argv[2])]
assert len(a) == len(b) == 20, (len(a), len(b))
worst = max(abs(x - y) / abs(y) for x, y in zip(a, b))
print("run %s (stages 1-3, then pushed data): 20 losses of two daemons vs one daemon with both GPUs: %s" %
      (sys.argv[3], "bitwise equal" if a == b else "max relative difference %.3g" % worst))
assert worst <= 1e-6, worst
PY
done
stop_ztd

# the two-daemon checkpoint of the stop resumed by one daemon owning both GPUs: the same world
# (its spec's gpus 2 without peers), each rank reading its own file, the losses bitwise the
# uninterrupted two-daemon run's
python3 - "$ZT_TMP/one-state/jobs/$stopped/spec.json" <<'PY' || fail "editing the copied spec"
import json, sys
s = json.load(open(sys.argv[1]))
s["parallel"] = {"gpus": 2, "zero_stage": s["parallel"]["zero_stage"]}
json.dump(s, open(sys.argv[1], "w"))
PY
STATE="$ZT_TMP/one-state"
start_ztd --backend cuda --gpus 0,1
wait_end "$stopped" done 300
grep -q "resumes from .*$(basename "$ck")" "$STATE/jobs/$stopped/log" ||
  fail "no resume from $(basename "$ck") in $(cat "$STATE/jobs/$stopped/log")"
cmp <(losses "$ZT_TMP/state/jobs/$full") <(losses "$STATE/jobs/$stopped") ||
  fail "one daemon's resume of the two-daemon checkpoint differs from the uninterrupted run"
echo "the two-daemon checkpoint resumed by one daemon with both GPUs: 2000 losses bitwise equal to the uninterrupted run"
stop_ztd
echo "two_daemons: ok"
