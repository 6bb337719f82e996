#!/bin/bash
# Offload by default (docs/spec.md "Offload by default") on cpu daemons, whose --gpu-mem-limit is
# the budget of each simulated device: a job with no "offload" object that does not fit that
# budget is planned offloaded (offload auto, checkpointing auto) and trains with losses bitwise
# those of the same job on a daemon without the limit, one rank and two; its plan and its log say
# why, its stored spec records the offload object with the daemon's budget, its device side
# stays within the limit; "offload": false keeps the refusal with the numbers, and a
# gpu_budget above the daemon's is refused naming both.
. "$(dirname "$0")/lib.sh"

make_tokens "$ZT_TMP/gpl.zt"
# job OUT GPUS [OFFLOAD_JSON]: a 6-layer tiny model with clipping and two micro-batches, so
# that streaming holds far less than the whole model
job() {
  pspec "$1" 12 2 "{\"gpus\": $2, \"zero_stage\": 1}"
  python3 - "$1" "${3:-}" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["model"].update(n_layers=6, d_model=64, n_heads=4)
s["train"]["grad_clip"] = 1.0
if sys.argv[2]:
    s["offload"] = json.loads(sys.argv[2])
json.dump(s, open(sys.argv[1], "w"))
PY
}
job "$ZT_TMP/one.json" 1
job "$ZT_TMP/two.json" 2
job "$ZT_TMP/off.json" 1 false
job "$ZT_TMP/big.json" 1 '{"gpu_budget": "1GiB"}'

# The same jobs on a daemon without a device limit: not offloaded.
start_ztd --backend cpu --cpu-ranks 2
need1=$(ztctl --json plan "$ZT_TMP/one.json" | json_get parallel.rank_bytes) || fail "plan one"
need2=$(ztctl --json plan "$ZT_TMP/two.json" | json_get parallel.rank_bytes) || fail "plan two"
need1=${need1//[\[\] ]/}
need2=${need2//[\[\] ]/}
need2=${need2%%,*}
ref1=$(submit "$ZT_TMP/one.json")
ref2=$(submit "$ZT_TMP/two.json")
wait_end "$ref1" done 300
wait_end "$ref2" done 300
ref1_show=$(ztctl --json show "$ref1")
ref2_show=$(ztctl --json show "$ref2")
stop_ztd

# A device budget neither job fits: 60% of the smaller of the two ranks' needs.
limit=$(( (need1 < need2 ? need1 : need2) * 6 / 10 ))
SOCK="$ZT_TMP/limited.sock"
STATE="$ZT_TMP/limited-state"
start_ztd --backend cpu --cpu-ranks 2 --gpu-mem-limit "$limit"
plan=$(ztctl --json plan "$ZT_TMP/one.json") || fail "plan under the limit: $plan"
printf '%s\n' "$plan" | python3 -c '
import json, sys
p, limit = json.loads(sys.stdin.read()), int(sys.argv[1])
assert "job needs" in p["offloaded_by_default"], p
o = p["offload"]
assert o["device_bytes"] <= limit, (o["device_bytes"], limit)
print("one rank: offloaded by default, device %d of %d bytes, ckpt_every %d, params %s" %
      (o["device_bytes"], limit, o["ckpt_every"], o["params"]))' "$limit" || fail "plan: $plan"
out=$(ztctl plan "$ZT_TMP/one.json") || fail "ztctl plan: $out"
case "$out" in *'offloaded by default ("offload": false opts out): job needs'*) ;;
  *) fail "ztctl plan does not say it offloads: $out" ;; esac
plan2=$(ztctl --json plan "$ZT_TMP/two.json") || fail "plan two ranks under the limit: $plan2"
printf '%s\n' "$plan2" | python3 -c '
import json, sys
p, limit = json.loads(sys.stdin.read()), int(sys.argv[1])
assert "offloaded_by_default" in p and "offload" in p, p
assert p["parallel"]["rank_bytes"][0] <= limit, (p["parallel"]["rank_bytes"], limit)
print("two ranks: offloaded by default, %d bytes a rank" % p["parallel"]["rank_bytes"][0])' \
  "$limit" || fail "plan of two ranks: $plan2"
for op in submit plan; do
  expect_fail 1 "per device on the cpu backend (activations " ztctl "$op" "$ZT_TMP/off.json"
  expect_fail 1 'MiB; fits with the "offload": false left out (offloaded by default) (' \
    ztctl "$op" "$ZT_TMP/off.json"
  expect_fail 1 "offload.gpu_budget 1 GiB is more than this daemon's device budget (GPU limit" \
    ztctl "$op" "$ZT_TMP/big.json"
done
j1=$(submit "$ZT_TMP/one.json")
j2=$(submit "$ZT_TMP/two.json")
wait_end "$j1" done 300
wait_end "$j2" done 300
grep -q "offloaded by default (\"offload\": false opts out): job needs" "$STATE/jobs/$j1/log" ||
  fail "the job's log does not say it was offloaded: $(cat "$STATE/jobs/$j1/log")"
python3 - "$limit" "$ref1_show" "$(ztctl --json show "$j1")" "$ref2_show" \
  "$(ztctl --json show "$j2")" <<'PY' || fail "losses under the limit"
import json, sys
limit = int(sys.argv[1])
a1, b1, a2, b2 = (json.loads(x) for x in sys.argv[2:])
for a, b, what in ((a1, b1, "one rank"), (a2, b2, "two ranks")):
    assert "offload" not in a["spec"], a["spec"]
    assert b["spec"]["offload"]["gpu_budget"] == limit, b["spec"]["offload"]
    assert len(a["losses"]) == 12 and a["losses"] == b["losses"], (a["losses"], b["losses"])
    print("%s: offloaded by default, losses bitwise those without the limit" % what)
assert b1["spec"]["train"]["activation_checkpointing"]["every"] == "auto", b1["spec"]["train"]
PY
stop_ztd
echo "offload_default: ok (limit $limit bytes; needs $need1 and $need2 a rank without offload)"
