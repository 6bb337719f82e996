#!/bin/bash
# train.epochs through ztd: the steps made at admission from the token file (documents packed by
# docs/spec.md's rules, computed here independently; windows; with batch_tokens), printed by
# plan and show, the cosine's horizon, kept by the stored spec; a job killed mid-run resumes to
# the losses of the uninterrupted run bit for bit; resume --steps trains past the epochs on real
# rows; epochs with steps, with a stream, out of range are refused naming the fields, and by
# ztrain.
. "$(dirname "$0")/lib.sh"

# 30 documents of 2..40 tokens (the longer ones split across rows of 16)
python3 - "$ZT_TMP/docs.jsonl" <<'PY'
import json, random, sys
rng = random.Random(5)
with open(sys.argv[1], "w") as f:
    for i in range(30):
        n = rng.randrange(2, 41)
        f.write(json.dumps({"input_ids": [rng.randrange(0, 256) for _ in range(n)]}) + "\n")
PY
ztctl pack "$ZT_TMP/docs.jsonl" "$ZT_TMP/docs.tok" --vocab 256 >/dev/null || fail "pack"

# rows of E epochs of documents (seq_len 16, train.seed 1; shuffled or not), as docs/spec.md
# defines the packing and the shuffle: expected ROWS_PER_STEP SHUFFLE EPOCHS prints the steps
expected() {
  python3 - "$ZT_TMP/docs.jsonl" "$@" <<'PY'
import json, sys
lens = [len(json.loads(l)["input_ids"]) for l in open(sys.argv[1])]
per_step, shuffle, epochs = int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
M = (1 << 64) - 1
def splitmix64(x):
    z = (x + 0x9E3779B97F4A7C15) & M
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
    return z ^ (z >> 31)
def order(e):
    o = list(range(len(lens)))
    if shuffle:
        key = splitmix64(1 ^ (((e + 1) * 0xD1B54A32D192ED03) & M))
        for i in range(len(o) - 1, 0, -1):
            j = splitmix64(key ^ ((i * 0x9E3779B97F4A7C15) & M)) % (i + 1)
            o[i], o[j] = o[j], o[i]
    return o
def rows(o, T=16):
    n, k, off = 0, 0, 0
    while k < len(o):
        n, at = n + 1, 0
        while at < T and k < len(o):
            rest = lens[o[k]] - off
            take = rest
            if rest > T - at:
                if at > 0:
                    break
                take = T
            at += take
            k, off = (k + 1, 0) if take == rest else (k, off + take)
    return n
r = sum(rows(order(e)) for e in range(epochs))
print(-(-r // per_step))
PY
}

# SPEC OUT EPOCHS [python statements on s]: the tiny spec on docs.tok with train.epochs
espec() {
  spec "$1" "$ZT_TMP/docs.tok" 1
  python3 - "$1" "$2" "${3:-}" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
del s["train"]["steps"]
s["train"]["epochs"] = int(sys.argv[2])
s["checkpoint"]["every"] = 5
exec(sys.argv[3])
json.dump(s, open(sys.argv[1], "w"))
PY
}

start_ztd --backend cpu
want=$(expected 4 1 2)
espec "$ZT_TMP/ep.json" 2 's["data"]["shuffle"] = True; s["train"]["schedule"] = {"name": "cosine", "warmup_steps": 2}'
out=$(ztctl plan "$ZT_TMP/ep.json") || fail "plan: $out"
case "$out" in *"steps: $want (train.epochs 2 of data.path"*) ;; *) fail "plan said: $out" ;; esac
ref=$(new_job "$ZT_TMP/ep.json") || exit 1
wait_end "$ref" done 300
ztctl show "$ref" | grep -qx "steps: $want" || fail "show: $(ztctl show "$ref")"
python3 - "$(ztctl --json show "$ref")" "$want" "$STATE/jobs/$ref/metrics.jsonl" <<'PY' || fail "the epochs job"
import json, math, sys
j, want = json.loads(sys.argv[1]), int(sys.argv[2])
t = j["spec"]["train"]
assert t["epochs"] == 2 and t["steps"] == want and j["steps"] == want == j["step"], (t, j["step"])
assert len(j["losses"]) == want and all(math.isfinite(x) for x in j["losses"]), j["losses"]
# the cosine's horizon is the steps the epochs made: its floor (min_lr 0) at the last one
lr = [json.loads(l)["lr"] for l in open(sys.argv[3])]
assert len(lr) == want and lr[-1] == 0 and lr[-2] > 0 and abs(lr[1] - 0.01) < 1e-8, lr  # float32
print("epochs: 2 shuffled epochs of 30 documents in %d steps of 4 rows" % want)
PY

# killed at step 7 (a checkpoint at 5), resumed: the same losses, the same steps
ev="$ZT_TMP/events" re='"event": *"step".*"step": *7[,}]'
while IFS= read -r line; do
  printf '%s\n' "$line" >>"$ev"
  if [[ $line =~ $re ]]; then
    kill -KILL "$ZTD_PID"
    break
  fi
done < <(ztctl --json submit "$ZT_TMP/ep.json" --watch)
wait "$ZTD_PID" 2>/dev/null
ZTD_PID=
grep -Eq "$re" "$ev" || fail "the epochs job ended without reaching step 7: $(cat "$ev")"
job=$(head -n 1 "$ev" | json_get job) || fail "no job id: $(cat "$ev")"
start_ztd --backend cpu
wait_end "$job" done 300
grep -q "resumes from .*(step 5)" "$STATE/jobs/$job/log" ||
  fail "job $job did not resume from its checkpoint: $(cat "$STATE/jobs/$job/log")"
[ "$(ztctl --json show "$job" | json_get losses)" = "$(ztctl --json show "$ref" | json_get losses)" ] ||
  fail "the resumed epochs job's losses differ from the uninterrupted run's"

# resume --steps goes on past the epochs on rows of the next ones: every loss finite, none 0
out=$(ztctl resume "$ref" --steps $((want + 3))) || fail "resume: $out"
wait_end "$ref" done 300
python3 - "$(ztctl --json show "$ref")" "$want" <<'PY' || fail "resumed past the epochs"
import json, math, sys
j, want = json.loads(sys.argv[1]), int(sys.argv[2])
assert "epochs" not in j["spec"]["train"] and j["step"] == want + 3, j["spec"]["train"]
assert all(math.isfinite(x) and x > 0 for x in j["losses"][want:]), j["losses"]
PY

# unshuffled, one epoch; windows: floor((N - 1) / 16) rows an epoch; batch_tokens 128: 8 rows
espec "$ZT_TMP/one.json" 1
ztctl plan "$ZT_TMP/one.json" | grep -q "^steps: $(expected 4 0 1) (train.epochs 1" ||
  fail "plan of one epoch: $(ztctl plan "$ZT_TMP/one.json")"
espec "$ZT_TMP/win.json" 3 's["data"]["packing"] = "windows"'
n=$(python3 -c 'import json, sys; print(sum(len(json.loads(l)["input_ids"]) for l in open(sys.argv[1])))' \
  "$ZT_TMP/docs.jsonl")
wsteps=$(( (3 * ((n - 1) / 16) + 3) / 4 ))
ztctl plan "$ZT_TMP/win.json" | grep -q "^steps: $wsteps (" ||
  fail "plan of windows epochs ($n tokens): $(ztctl plan "$ZT_TMP/win.json")"
win=$(new_job "$ZT_TMP/win.json") || exit 1
wait_end "$win" done 300
[ "$(wc -l <"$STATE/jobs/$win/losses.log")" -eq "$wsteps" ] || fail "windows epochs: $(ztctl show "$win")"
espec "$ZT_TMP/bt.json" 2 's["train"]["batch_tokens"] = 128; del s["train"]["micro_batch"]'
out=$(ztctl plan "$ZT_TMP/bt.json") || fail "plan with batch_tokens: $out"
case "$out" in *"steps: $(expected 8 0 2) (train.epochs 2"*) ;; *) fail "plan with batch_tokens: $out" ;; esac

# refusals, naming the fields; nothing queued
spec "$ZT_TMP/both.json" "$ZT_TMP/docs.tok" 10
sed -i 's|"steps": 10,|"steps": 10, "epochs": 2,|' "$ZT_TMP/both.json"
expect_fail 1 "train.epochs and train.steps: give one" ztctl submit "$ZT_TMP/both.json"
spec "$ZT_TMP/stream.json" stream 10
sed -i 's|"steps": 10,|"epochs": 2,|' "$ZT_TMP/stream.json"
expect_fail 1 'train.epochs counts passes over data.path' ztctl submit "$ZT_TMP/stream.json"
espec "$ZT_TMP/zero.json" 0
expect_fail 1 "train.epochs must be a positive integer" ztctl submit "$ZT_TMP/zero.json"
espec "$ZT_TMP/warm.json" 1 's["train"]["schedule"] = {"warmup_steps": 1000}'
expect_fail 1 "train.schedule.warmup_steps 1000 is more than the $(expected 4 0 1) steps that train.epochs 1 makes" \
  ztctl submit "$ZT_TMP/warm.json"
stop_ztd
# ztrain runs the steps given, not the daemon's count of a file it does not read
out=$("$ZTRAIN" --spec "$ZT_TMP/one.json" --batches "$ZT_TMP/docs.tok" 2>&1) &&
  fail "ztrain ran train.epochs"
case "$out" in *"train.epochs without train.steps: ztd makes them steps"*) ;;
  *) fail "ztrain said: $out" ;; esac
echo "epochs: ok"
