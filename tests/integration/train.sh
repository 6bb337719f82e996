#!/bin/bash
# Training through ztd: a file job learns; stream jobs learn fed by libztclient and by
# `ztctl submit --data`; a watcher and a submitter work at once; cancel (queued and running).
. "$(dirname "$0")/lib.sh"

start_ztd
make_tokens "$ZT_TMP/gpl.zt"

# A file job learns.
spec "$ZT_TMP/file.json" "$ZT_TMP/gpl.zt" 40
job=$(submit "$ZT_TMP/file.json")
# Two clients at once: a watcher of the job while another client submits and reads.
ztctl watch "$job" >"$ZT_TMP/watch.out" 2>&1 &
watcher=$!
spec "$ZT_TMP/file2.json" "$ZT_TMP/gpl.zt" 20
job2=$(submit "$ZT_TMP/file2.json")
ztctl jobs >/dev/null || fail "jobs while a watcher waits"
wait "$watcher" || fail "watch of $job exited non-zero: $(cat "$ZT_TMP/watch.out")"
[ "$(state "$job")" = done ] || fail "job $job is not done after its watch ended"
check_learned "$job"
wait_state "$job2" done

# The encoder architecture trains through the daemon too.
ARCH=encoder spec "$ZT_TMP/enc.json" "$ZT_TMP/gpl.zt" 40
enc=$(submit "$ZT_TMP/enc.json")
wait_state "$enc" done
check_learned "$enc"

# Stream data pushed by a libztclient program.
spec "$ZT_TMP/stream.json" stream 40
"$ZT_TEST_BIN_DIR/stream_push" "$SOCK" "$ZT_TMP/stream.json" "$ZT_TMP/gpl.zt" ||
  fail "stream job through libztclient"

# Stream data pushed by ztctl.
out=$(ztctl --json submit "$ZT_TMP/stream.json" --data "$ZT_TMP/gpl.zt" --wait) ||
  fail "ztctl submit --data --wait: $out"
sjob=$(printf '%s\n' "$out" | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        j = json.loads(line)
    except ValueError:
        continue
    if isinstance(j, dict) and "job" in j:
        print(j["job"]); break')
[ -n "$sjob" ] || fail "no job id in: $out"
[ "$(state "$sjob")" = done ] || fail "stream job $sjob is not done"
check_learned "$sjob"

# Cancel: a running job and one queued behind it.
spec "$ZT_TMP/long.json" "$ZT_TMP/gpl.zt" 100000
long=$(submit "$ZT_TMP/long.json")
queued=$(submit "$ZT_TMP/long.json")
wait_state "$long" running
[ "$(state "$queued")" = queued ] || fail "second job is $(state "$queued"), expected queued"
ztctl cancel "$queued" >/dev/null || fail "cancel queued job"
[ "$(state "$queued")" = cancelled ] || fail "queued job not cancelled"
ztctl cancel "$long" >/dev/null || fail "cancel running job"
wait_state "$long" cancelled 30
ztctl cancel "$long" >/dev/null 2>&1 && fail "cancelling a cancelled job succeeded"

ztctl status >/dev/null || fail "status at the end"
stop_ztd
echo "train: ok"
