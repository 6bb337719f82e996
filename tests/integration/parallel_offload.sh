#!/bin/bash
# Offload with several ranks through ztd (engine/train/dp/dp.h "Offload", engine/job/
# dp_placement.c) on a cpu daemon of two simulated ranks: ZeRO stages 1-3 with each rank's
# optimizer on the host (all units, or all but the leading ones; stage 3 with the parameters on
# the host too) train with losses bitwise those of the same job on the device; the stored spec
# and plan say the placement; offload.gpu_budget per rank picks it ("auto": everything on the
# device, dropping the offload, when it fits, else the most units' optimizer on the device, else
# every block recomputed, else stage 3's parameters on the host, else refused with the numbers);
# placements ranks cannot take are refused naming the field. Optimizer nvme (each rank's
# masters, m and v in its own files under the job's directory in nvme_dir): stages 1 and 3 (with
# the parameters on the host) train bitwise as on the device, the plan says each rank's NVMe
# bytes, nvme_dir is empty after the jobs, a directory that is not there is refused, and an
# injected read error fails the job naming the rank's file. Host and NVMe together
# (offload.host_units with optimizer nvme: the units after the device ones on the host, the rest
# in files): a stage 2 job trains bitwise as on the device, its plan moves bytes from NVMe to the
# host tier, and host_units without optimizer nvme or past the model's units is refused. Params
# nvme (stage 3, optimizer nvme: each rank reads its chunks of the NVMe units' parameters from
# its master files before each gather): a job trains bitwise as on the device (also under a
# gpu_budget that auto resolves), its plan says
# params nvme with the files of optimizer nvme and the device bytes of params host, and fewer
# host bytes than params host; below stage 3 or without optimizer nvme it is refused.
# offload.order unit (grad_accum 3, gpt and an untied llama, stages 1-3): bitwise micro order
# (the llama's: micro order's stage 1), the plan and the stored spec saying the order, auto
# picking unit under a budget that holds it.
. "$(dirname "$0")/lib.sh"

start_ztd --cpu-ranks 2
make_tokens "$ZT_TMP/gpl.zt"
NVME="$ZT_TMP/nvme"
mkdir -p "$NVME"

# ospec OUT STAGE OFFLOAD [STEPS]: a 2-rank job of the tiny model with grad_accum 2, clipping
# and that "offload" object (empty: none)
ospec() {
  pspec "$1" "${4:-20}" 2 "{\"gpus\": 2, \"zero_stage\": $2}"
  python3 - "$1" "$3" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["train"]["grad_clip"] = 0.5
if sys.argv[2]:
    s["offload"] = json.loads(sys.argv[2])
json.dump(s, open(sys.argv[1], "w"))
PY
}

# Refusals, at submit and plan alike.
ospec "$ZT_TMP/pn2.json" 2 '{"optimizer": "nvme", "params": "nvme", "nvme_dir": "/tmp"}'
ospec "$ZT_TMP/pnh.json" 3 '{"optimizer": "host", "params": "nvme", "nvme_dir": "/tmp"}'
ospec "$ZT_TMP/nodir.json" 2 "{\"optimizer\": \"nvme\", \"nvme_dir\": \"$ZT_TMP/missing\"}"
ospec "$ZT_TMP/ph2.json" 2 '{"optimizer": "host", "params": "host"}'
ospec "$ZT_TMP/grads.json" 1 '{"optimizer": "host", "grads": "gpu"}'
ospec "$ZT_TMP/units.json" 1 '{"optimizer": "host", "gpu_units": 9}'
ospec "$ZT_TMP/hauto.json" 2 '{"optimizer": "auto", "host_units": 1}'
ospec "$ZT_TMP/hmany.json" 2 "{\"optimizer\": \"nvme\", \"gpu_units\": 1, \"host_units\": 4, \"nvme_dir\": \"$NVME\"}"
for op in submit plan; do
  expect_fail 1 "offload.params: nvme with parallel.gpus 2 needs parallel.zero_stage 3 and \
offload.optimizer nvme" ztctl "$op" "$ZT_TMP/pn2.json"
  expect_fail 1 "offload.params: nvme needs offload.optimizer nvme" ztctl "$op" "$ZT_TMP/pnh.json"
  expect_fail 1 "offload.nvme_dir: $ZT_TMP/missing: No such file or directory" \
    ztctl "$op" "$ZT_TMP/nodir.json"
  expect_fail 1 "offload.params: host with parallel.gpus 2 needs parallel.zero_stage 3" \
    ztctl "$op" "$ZT_TMP/ph2.json"
  expect_fail 1 "offload.grads gpu with parallel.gpus 2 is not supported" \
    ztctl "$op" "$ZT_TMP/grads.json"
  expect_fail 1 "offload.gpu_units must be in [0, 4]" ztctl "$op" "$ZT_TMP/units.json"
  expect_fail 1 "offload.host_units with parallel.gpus 2 needs offload.optimizer nvme" \
    ztctl "$op" "$ZT_TMP/hauto.json"
  expect_fail 1 "offload.host_units is 4; after 1 unit(s) on the device the model has 3" \
    ztctl "$op" "$ZT_TMP/hmany.json"
done

# gpu_budget per rank: what auto picks as the budget shrinks (stage 3, "auto" checkpointing).
budget_plan() {
  ospec "$ZT_TMP/b.json" 3 "{\"gpu_budget\": $1}"
  python3 - "$ZT_TMP/b.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["train"]["activation_checkpointing"] = {"every": "auto"}
json.dump(s, open(sys.argv[1], "w"))
PY
  ztctl --json plan "$ZT_TMP/b.json"
}
python3 - "$(budget_plan 1100000)" "$(budget_plan 1000000)" "$(budget_plan 850000)" \
  "$(budget_plan 750000)" <<'PY' || fail "placements by budget"
import json, sys
plans = [json.loads(a) for a in sys.argv[1:]]
# all on the device: no offload left
got = [(p["offload"]["optimizer"], p["offload"]["params"], p["offload"]["gpu_units"],
        p["offload"]["ckpt_every"]) if "offload" in p else "no offload" for p in plans]
print("\n".join("budget plan: %s, %d bytes per rank" % (g, p["parallel"]["rank_bytes"][0])
                for g, p in zip(got, plans)))
for p, b in zip(plans, [1100000, 1000000, 850000, 750000]):
    assert p["parallel"]["rank_bytes"][0] <= b, (p, b)
# the tiny model's activations outweigh its state: all on the device, then 1 unit's optimizer
# on the device, then every block recomputed, then the parameters on the host too
assert got == ["no offload", ("host", "gpu", 1, 0), ("host", "gpu", 1, 1),
               ("host", "host", 0, 1)], got
assert 0 < plans[1]["offload"]["host_bytes_per_rank"] < plans[3]["offload"]["host_bytes_per_rank"]
PY
expect_fail 1 "offload.gpu_budget 683.59 KiB per GPU is too small for parallel.gpus 2: with the \
optimizer of 0 unit(s) on the GPU and the rest's on the host, the parameters on the host and \
every block recomputed a rank needs 728.94 KiB" budget_plan 700000
ospec "$ZT_TMP/h3.json" 3 '{"optimizer": "host", "params": "host", "gpu_units": 1}'
ospec "$ZT_TMP/n3.json" 3 "{\"optimizer\": \"nvme\", \"gpu_units\": 1, \"nvme_dir\": \"$NVME\"}"
python3 - "$(ztctl --json plan "$ZT_TMP/n3.json")" <<'PY' || fail "nvme plan"
import json, sys
o = json.loads(sys.argv[1])["offload"]
print("nvme plan: %s" % json.dumps(o))
assert o["optimizer"] == "nvme" and o["gpu_units"] == 1 and o["nvme_bytes_per_rank"] > 0, o
PY
ztctl plan "$ZT_TMP/n3.json" | grep -q "offload: each rank keeps the optimizer of 1 of 4 units on its GPU and the rest's in a host tier of .* and NVMe files of 180.0 KiB; parameters on the gpu" ||
  fail "ztctl plan: $(ztctl plan "$ZT_TMP/n3.json")"
# host_units 2 of the 3 units after the device one: their state moves from the files to the host
ospec "$ZT_TMP/s3.json" 3 "{\"optimizer\": \"nvme\", \"gpu_units\": 1, \"host_units\": 2, \"nvme_dir\": \"$NVME\"}"
python3 - "$(ztctl --json plan "$ZT_TMP/n3.json")" "$(ztctl --json plan "$ZT_TMP/s3.json")" <<'PY' || fail "split plan"
import json, sys
n, s = (json.loads(a)["offload"] for a in sys.argv[1:])
print("split plan: %s" % json.dumps(s))
assert s["optimizer"] == "nvme" and s["gpu_units"] == 1, s
assert 0 < s["nvme_bytes_per_rank"] < n["nvme_bytes_per_rank"], (n, s)
assert s["host_bytes_per_rank"] > n["host_bytes_per_rank"], (n, s)
assert s["device_bytes_per_rank"] == n["device_bytes_per_rank"], (n, s)
PY
# params nvme: the files of optimizer nvme and the device bytes of params host; its host tier
# holds two stagings of the largest chunk instead of the NVMe units' parameters, which saves
# host memory once there are more than two blocks (8 here)
ospec "$ZT_TMP/hn3.json" 3 "{\"optimizer\": \"nvme\", \"params\": \"host\", \"gpu_units\": 1, \"nvme_dir\": \"$NVME\"}"
ospec "$ZT_TMP/p3.json" 3 "{\"optimizer\": \"nvme\", \"params\": \"nvme\", \"gpu_units\": 1, \"nvme_dir\": \"$NVME\"}"
for f in hn3 p3; do
  python3 - "$ZT_TMP/$f.json" "$ZT_TMP/${f}l8.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["model"]["n_layers"] = 8
json.dump(s, open(sys.argv[2], "w"))
PY
done
python3 - "$(ztctl --json plan "$ZT_TMP/hn3.json")" "$(ztctl --json plan "$ZT_TMP/p3.json")" \
  "$(ztctl --json plan "$ZT_TMP/hn3l8.json")" "$(ztctl --json plan "$ZT_TMP/p3l8.json")" <<'PY' || fail "params nvme plan"
import json, sys
h, p, h8, p8 = (json.loads(a)["offload"] for a in sys.argv[1:])
print("params nvme plan: %s" % json.dumps(p))
print("host bytes per rank, 8 blocks: params host %d, params nvme %d" %
      (h8["host_bytes_per_rank"], p8["host_bytes_per_rank"]))
for a, b in ((h, p), (h8, p8)):
    assert b["optimizer"] == "nvme" and b["params"] == "nvme" and b["gpu_units"] == 1, b
    assert b["nvme_bytes_per_rank"] == a["nvme_bytes_per_rank"] > 0, (a, b)
    assert b["device_bytes_per_rank"] == a["device_bytes_per_rank"], (a, b)
assert 0 < p8["host_bytes_per_rank"] < h8["host_bytes_per_rank"], (h8, p8)
PY
ztctl plan "$ZT_TMP/p3.json" | grep -q "offload: each rank keeps the optimizer of 1 of 4 units on its GPU and the rest's in a host tier of .* and NVMe files of 180.0 KiB; parameters on the nvme" ||
  fail "ztctl plan: $(ztctl plan "$ZT_TMP/p3.json")"
ztctl plan "$ZT_TMP/h3.json" | grep -q "offload: each rank keeps the optimizer of 1 of 4 units on its GPU and the rest's in a host tier of .*; parameters on the host" ||
  fail "ztctl plan: $(ztctl plan "$ZT_TMP/h3.json")"

# Training: each stage on the device and offloaded, one after the other on the two ranks.
jobs=()
for cfg in "1 " '1 {"optimizer": "host"}' "2 " '2 {"optimizer": "host", "gpu_units": 2}' \
  "3 " '3 {"optimizer": "host", "params": "host", "gpu_units": 1}' \
  '3 {"optimizer": "auto"}' "1 {\"optimizer\": \"nvme\", \"nvme_dir\": \"$NVME\"}" \
  "3 {\"optimizer\": \"nvme\", \"params\": \"host\", \"gpu_units\": 1, \"nvme_dir\": \"$NVME\"}" \
  "2 {\"optimizer\": \"nvme\", \"gpu_units\": 1, \"host_units\": 2, \"nvme_dir\": \"$NVME\"}" \
  "3 {\"optimizer\": \"nvme\", \"params\": \"nvme\", \"nvme_dir\": \"$NVME\"}"; do
  ospec "$ZT_TMP/t${#jobs[@]}.json" "${cfg%% *}" "${cfg#* }"
  jobs+=("$(new_job "$ZT_TMP/t${#jobs[@]}.json")") || exit 1
done
# params nvme under a gpu_budget per rank: auto resolves the device units and the checkpointing
ospec "$ZT_TMP/t11.json" 3 "{\"optimizer\": \"nvme\", \"params\": \"nvme\", \"gpu_budget\": 750000, \"nvme_dir\": \"$NVME\"}"
python3 - "$ZT_TMP/t11.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["train"]["activation_checkpointing"] = {"every": "auto"}
json.dump(s, open(sys.argv[1], "w"))
PY
jobs+=("$(new_job "$ZT_TMP/t11.json")") || exit 1
for j in "${jobs[@]}"; do wait_end "$j" done 300; done
shows=()
for j in "${jobs[@]}"; do shows+=("$(ztctl --json show "$j")"); done
python3 - "${shows[@]}" <<'PY' || fail "offloaded losses"
import json, sys
j = [json.loads(a) for a in sys.argv[1:]]
pairs = [(0, 1), (2, 3), (4, 5), (4, 6), (0, 7), (4, 8), (2, 9), (4, 10), (4, 11)]
for a, b in pairs:
    la, lb = j[a]["losses"], j[b]["losses"]
    assert len(la) == 20 and la == lb, (a, b, la, lb)
    print("stage %d: %s bitwise the job on the device" %
          (j[b]["spec"]["parallel"]["zero_stage"], json.dumps(j[b]["spec"]["offload"])))
# the stored spec records the placement as resolved
assert j[1]["spec"]["offload"]["optimizer"] == "host" and j[1]["spec"]["offload"]["gpu_units"] == 0
assert j[6]["spec"]["offload"]["optimizer"] == "host" and j[6]["spec"]["offload"]["params"] == "gpu"
assert j[8]["spec"]["offload"]["optimizer"] == "nvme" and j[8]["spec"]["offload"]["gpu_units"] == 1
assert j[9]["spec"]["offload"]["optimizer"] == "nvme" and j[9]["spec"]["offload"]["host_units"] == 2
assert j[10]["spec"]["offload"]["params"] == "nvme" and j[10]["spec"]["offload"]["gpu_units"] == 0
o = j[11]["spec"]["offload"]
assert o["params"] == "nvme" and o["optimizer"] == "nvme" and o["gpu_units"] >= 0, o
print("params nvme in 750000 bytes a rank: %d unit(s)' optimizer on the device, checkpointing "
      "every %s" % (o["gpu_units"], j[11]["spec"]["train"]["activation_checkpointing"]))
PY
[ -z "$(ls -A "$NVME")" ] || fail "files left in nvme_dir: $(find "$NVME")"
for j in "${jobs[@]}"; do check_learned "$j"; done

# offload.order unit across the ranks (engine/train/dp/dp.h "Unit-major"), grad_accum 3: the
# gpt's head reads the embedding, so its backward stays micro-major and every stage trains
# bitwise as in micro order; an untied llama's backward is unit-major too (each unit's
# micro-batches summed, then reduced once), bitwise micro order's stage 1, which also sums
# before its one reduction. The plan and the stored spec say the order; auto under a budget
# that holds both picks unit for stage 3 (it gathers each unit once a pass).
ujobs=()
for cfg in "gpt 1 micro" "gpt 1 unit" "gpt 2 micro" "gpt 2 unit" "gpt 3 micro" "gpt 3 unit" \
  "llama 1 micro" "llama 3 unit" "llama 2 unit"; do
  set -- $cfg
  f="$ZT_TMP/u${#ujobs[@]}.json"
  ARCH=$1 pspec "$f" 20 3 "{\"gpus\": 2, \"zero_stage\": $2}"
  python3 - "$f" "$3" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["offload"] = {"optimizer": "host", "order": sys.argv[2]}
if s["parallel"]["zero_stage"] == 3:
    s["offload"].update(params="host", gpu_units=1)
json.dump(s, open(sys.argv[1], "w"))
PY
  ujobs+=("$(new_job "$f")") || exit 1
done
python3 - "$(ztctl --json plan "$ZT_TMP/u5.json")" "$(ztctl --json plan "$ZT_TMP/u4.json")" <<'PY' || fail "unit order plan"
import json, sys
u, m = (json.loads(a) for a in sys.argv[1:])
assert u["offload"]["order"] == "unit" and m["offload"]["order"] == "micro", (u, m)
# every micro-batch's activations held: more device bytes a rank
assert u["parallel"]["rank_bytes"][0] > m["parallel"]["rank_bytes"][0], (u, m)
PY
ztctl plan "$ZT_TMP/u5.json" | grep -q "^offload: each rank .*; micro-batches walked unit by unit$" ||
  fail "plan's text lacks the unit order: $(ztctl plan "$ZT_TMP/u5.json")"
ztctl plan "$ZT_TMP/u4.json" | grep -q "unit by unit" && fail "micro order's plan says unit order"
ARCH=llama pspec "$ZT_TMP/uauto.json" 12 3 '{"gpus": 2, "zero_stage": 3}'
python3 - "$ZT_TMP/uauto.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["offload"] = {"optimizer": "host", "gpu_budget": 100000000}
json.dump(s, open(sys.argv[1], "w"))
PY
python3 - "$(ztctl --json plan "$ZT_TMP/uauto.json")" <<'PY' || fail "auto order plan"
import json, sys
p = json.loads(sys.argv[1])
assert p["offload"]["order"] == "unit", p
PY
for j in "${ujobs[@]}"; do wait_end "$j" done 300; done
ushows=()
for j in "${ujobs[@]}"; do ushows+=("$(ztctl --json show "$j")"); done
python3 - "${ushows[@]}" <<'PY' || fail "unit order losses"
import json, sys
j = [json.loads(a) for a in sys.argv[1:]]
for a, b in [(0, 1), (2, 3), (4, 5), (6, 7), (6, 8)]:
    la, lb = j[a]["losses"], j[b]["losses"]
    assert len(la) == 20 and la == lb, (a, b, la, lb)
    sb = j[b]["spec"]
    assert sb["offload"]["order"] == "unit", sb["offload"]
    print("%s stage %d order unit: bitwise %s stage %d order micro" %
          (sb["model"]["arch"], sb["parallel"]["zero_stage"], j[a]["spec"]["model"]["arch"],
           j[a]["spec"]["parallel"]["zero_stage"]))
PY
for j in "${ujobs[@]}"; do check_learned "$j"; done
stop_ztd

# A device error on a rank's NVMe files (ZT_FAULT_NVME arms every rank's store): the tiny gpt's
# 4 units make 12 files a rank, written once at the start and read once a step, so read request
# 30 is in step 3. The job fails naming the file; its NVMe directory is removed.
ZT_FAULT_NVME="eio:read:30" start_ztd --cpu-ranks 2
ospec "$ZT_TMP/eio.json" 2 "{\"optimizer\": \"nvme\", \"nvme_dir\": \"$NVME\"}"
job=$(new_job "$ZT_TMP/eio.json") || exit 1
wait_end "$job" failed
err=$(ztctl --json show "$job" | json_get error)
case "$err" in
  "step 3: rank "*"$NVME/ztd-$job."*"/zt-offload."*"/rank-"*": read of "*"Input/output error (injected by ZT_FAULT_NVME)"*) ;;
  *) fail "nvme fault: the error does not name the file and the cause: $err" ;;
esac
echo "nvme fault: $job failed: $err"
[ -z "$(ls -A "$NVME")" ] || fail "files left in nvme_dir: $(find "$NVME")"
stop_ztd
echo "parallel_offload: ok"
