#!/bin/bash
# Memory figures through ztd: the step events, `show` and `status` carry what the jobs hold on
# their backends (allocated, peak, reserved, host pinned), per device and in all.
#   - a job without offload takes its buffers from one reserved block of its exact estimate at
#     the start: allocated equals its backend bytes in every step event, within the block, and no
#     step allocates;
#   - a running job's figures are in show and status before its first step (a stream job waiting
#     for data), and its allocations are back to 0 in both once it ends, its peak kept;
#   - an offloaded job adds its device arena to reserved and its pinned host tier to host_pinned,
#     its NVMe tier's size, and each step's timeline as busy fractions in [0, 1];
#   - ztctl prints them: status per device and for the host, show and the watch line per job.
. "$(dirname "$0")/lib.sh"

mkdir -p "$ZT_TMP/nvme"
# the cpu backend everywhere: the figures asserted are the cpu backend's (tests/gpu/test_cuda_mem.c
# checks the cuda backend's)
start_ztd --backend cpu --nvme-dir "$ZT_TMP/nvme"
make_tokens "$ZT_TMP/gpl.zt"

# Nothing ran yet: a device with nothing allocated, the host with a limit.
ztctl --json status | python3 -c '
import json, sys
m = json.loads(sys.stdin.read())["memory"]
assert m["devices"] and all(d["allocated"] == d["peak"] == d["reserved"] == 0 for d in m["devices"]), m
assert m["host"]["pinned"] == 0 and m["host"]["allocated"] == 0 and m["host"]["limit"] > 0, m' ||
  fail "status before any job: $(ztctl --json status)"

# Without offload: the figures of every step event.
spec "$ZT_TMP/file.json" "$ZT_TMP/gpl.zt" 8
events=$(ztctl --json submit "$ZT_TMP/file.json" --watch) || fail "file job: $events"
job=$(printf '%s\n' "$events" | head -n 1 | json_get job)
peak=$(printf '%s\n' "$events" | python3 -c '
import json, sys
steps = [e for e in map(json.loads, sys.stdin) if e.get("event") == "step"]
assert len(steps) == 8, len(steps)
for e in steps:
    m = e["memory"]
    assert m["allocated"] == m["backend_bytes"] > 0 and m["peak"] >= m["allocated"], m
    # the block: the estimate plus alignment room, every buffer within it
    assert m["allocated"] <= m["reserved"] <= m["allocated"] + 16 * 256 + 255, m
    assert m["allocations"] == 5 and m["host_pinned"] == 0 and "offload" not in m, m
    d = m["devices"]
    assert len(d) == 1 and d[0]["allocated"] == m["allocated"] and d[0]["peak"] == m["peak"], m
# nothing allocated in the step loop
assert len({e["memory"]["allocations_total"] for e in steps}) == 1, [e["memory"] for e in steps]
print(steps[-1]["memory"]["peak"])') || fail "step events of $job: $events"
ztctl --json show "$job" | python3 -c '
import json, sys
m = json.loads(sys.stdin.read())["memory"]
assert m["allocated"] == 0 and m["reserved"] == 0 and m["allocations"] == 0, m
assert m["peak"] == int(sys.argv[1]) and m["backend_bytes"] == 0, m' "$peak" ||
  fail "show of the ended job $job: $(ztctl --json show "$job")"

# A running job before its first step (stream: it waits for data), then cancelled.
spec "$ZT_TMP/stream.json" stream 10
sjob=$(submit "$ZT_TMP/stream.json")
wait_state "$sjob" running
for i in $(seq 1 100); do
  a=$(ztctl --json show "$sjob" | python3 -c 'import json,sys; print(json.load(sys.stdin)["memory"].get("allocated", 0))')
  [ "$a" -gt 0 ] && break
  sleep 0.1
done
python3 - "$(ztctl --json show "$sjob")" "$(ztctl --json status)" <<'PY' || fail "running job $sjob"
import json, sys
show, status = (json.loads(a) for a in sys.argv[1:3])
m = show["memory"]
assert m["allocated"] == m["backend_bytes"] > 0 and m["reserved"] >= m["allocated"], m
s = status["memory"]
d = s["devices"][0]
assert d["allocated"] == m["allocated"] and d["reserved"] == m["reserved"], s
assert d["peak"] >= d["allocated"] and s["host"]["allocated"] == m["allocated"], s
assert s["backend_bytes"] == m["backend_bytes"], s
PY
out=$(ztctl status) || fail "ztctl status"
case "$out" in *"cpu rank 0: "*" allocated by jobs, peak "*"host: "*" pinned by jobs"*) ;;
  *) fail "ztctl status memory lines: $out" ;; esac
out=$(ztctl show "$sjob") || fail "ztctl show $sjob"
case "$out" in *"memory: "*" allocated, peak "*", reserved "*) ;; *) fail "ztctl show: $out" ;; esac
ztctl cancel "$sjob" >/dev/null || fail "cancel $sjob"
wait_state "$sjob" cancelled 30
python3 - "$(ztctl --json show "$sjob")" "$(ztctl --json status)" "$peak" <<'PY' || fail "after the cancel: $(ztctl --json show "$sjob") $(ztctl --json status)"
import json, sys
show, status = (json.loads(a) for a in sys.argv[1:3])
m = show["memory"]
assert m["allocated"] == 0 and m["peak"] > 0, m
s = status["memory"]
d = s["devices"][0]
assert d["allocated"] == d["reserved"] == 0 and s["host"]["allocated"] == 0, s
# the device's peak: the highest any job reached on it
assert d["peak"] == max(m["peak"], int(sys.argv[3])), s
PY

# Offloaded (NVMe optimizer and parameters): the arena, the pinned host tier, the NVMe tier and
# the timeline of each step.
spec "$ZT_TMP/off.json" "$ZT_TMP/gpl.zt" 6 \
  '"offload": {"params": "nvme", "optimizer": "nvme", "prefetch": 1}'
events=$(ztctl --json submit "$ZT_TMP/off.json" --watch) || fail "offloaded job: $events"
ojob=$(printf '%s\n' "$events" | head -n 1 | json_get job)
printf '%s\n' "$events" | python3 -c '
import json, sys
steps = [e for e in map(json.loads, sys.stdin) if e.get("event") == "step"]
assert len(steps) == 6, len(steps)
for e in steps:
    m = e["memory"]
    o = m["offload"]
    assert m["peak"] >= m["allocated"] > 0 and m["reserved"] >= o["arena_budget"] > 0, m
    assert m["host_pinned"] >= o["host_pinned"] and o["nvme_bytes"] > 0, m
    t = o["timeline"]
    assert t["step_s"] > 0, t
    assert all(0 <= t[k] <= 1 for k in ("compute", "h2d", "d2h", "optimizer", "nvme")), t
    assert all(t["waits"][k] >= 0 for k in ("copy", "optimizer", "nvme")), t
assert len({e["memory"]["allocations_total"] for e in steps}) == 1, [e["memory"] for e in steps]' ||
  fail "offloaded step events: $events"
ztctl --json show "$ojob" | python3 -c '
import json, sys
m = json.loads(sys.stdin.read())["memory"]
assert m["allocated"] == 0 and m["host_pinned"] == 0 and m["peak"] > 0, m' ||
  fail "show of the ended offloaded job: $(ztctl --json show "$ojob")"
[ -z "$(ls -A "$ZT_TMP/nvme")" ] || fail "the offloaded job left files: $(ls "$ZT_TMP/nvme")"
# The watch line of the last step (printed off a terminal too) and show, as people read them.
out=$(ztctl submit "$ZT_TMP/off.json" --watch) || fail "offloaded job with ztctl watch: $out"
case "$out" in *"step 6/6 "*" mem "*" (peak "*", reserved "*"  device "*", host "*" pinned), nvme "*"  compute "*"% h2d "*"% cpu-adam "*"% nvme "*) ;;
  *) fail "watch line of an offloaded job: $out" ;; esac
out=$(ztctl show "$ojob") || fail "ztctl show $ojob"
case "$out" in *"offload: device "*"timeline of the last step: compute "*"; waited on copies "*"% cpu-adam "*) ;;
  *) fail "ztctl show of an offloaded job: $out" ;; esac

stop_ztd
echo "memory: ok"
