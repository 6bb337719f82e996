#!/bin/bash
# A FIFO named by a job never freezes ztd: while a plan and a submit name one (as data.path, as
# model.init.safetensors) other clients are answered within a second and the request itself is
# refused naming the FIFO; a queued job whose token file became a FIFO before a restart does not
# stop the restarted daemon from serving, and fails naming it.
. "$(dirname "$0")/lib.sh"

# status_fast: a status answered within 1 s (ztd's loop is not blocked).
status_fast() {
  timeout 1 "$ZTCTL" --socket "$SOCK" status >/dev/null 2>&1 || fail "status not answered within 1 s ($1)"
  echo "ok: status answered within 1 s ($1)"
}

# refused_naming CMD_OUT_FILE PID WHAT: the backgrounded request PID ended, refused, naming WHAT.
refused_naming() {
  local i
  for i in $(seq 1 50); do kill -0 "$2" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$2" 2>/dev/null && { kill "$2"; fail "the request naming the FIFO is still waiting"; }
  local rc=0
  wait "$2" || rc=$?
  [ "$rc" -eq 1 ] || fail "the request naming the FIFO exited $rc: $(cat "$1")"
  grep -q "$3" "$1" || fail "the refusal does not say '$3': $(cat "$1")"
  echo "ok: refused: $(head -n 1 "$1")"
}

start_ztd
make_tokens "$ZT_TMP/gpl.zt"
mkfifo "$ZT_TMP/fifo"
spec "$ZT_TMP/data-fifo.json" "$ZT_TMP/fifo" 10
spec "$ZT_TMP/init-fifo.json" "$ZT_TMP/gpl.zt" 10
sed -i "s|\"init\": {\"seed\": 1}|\"init\": {\"safetensors\": \"$ZT_TMP/fifo\"}|" "$ZT_TMP/init-fifo.json"
grep -q safetensors "$ZT_TMP/init-fifo.json" || fail "the init spec was not written"

for s in data-fifo init-fifo; do
  for cmd in plan submit; do
    ztctl "$cmd" "$ZT_TMP/$s.json" >"$ZT_TMP/out" 2>&1 &
    pid=$!
    sleep 0.3
    status_fast "$cmd $s"
    refused_naming "$ZT_TMP/out" "$pid" "$ZT_TMP/fifo is a FIFO, not a regular file"
  done
done
[ -z "$(ls "$STATE/jobs")" ] || fail "a refused submit left a job: $(ls "$STATE/jobs")"

# A restart: a running job and one queued behind it, whose token files are then replaced by
# FIFOs: the restarted daemon serves while both fail naming theirs.
cp "$ZT_TMP/gpl.zt" "$ZT_TMP/long.zt"
cp "$ZT_TMP/gpl.zt" "$ZT_TMP/later.zt"
spec "$ZT_TMP/long.json" "$ZT_TMP/long.zt" 100000
spec "$ZT_TMP/later.json" "$ZT_TMP/later.zt" 10
long=$(submit "$ZT_TMP/long.json")
wait_state "$long" running
later=$(submit "$ZT_TMP/later.json")
[ "$(state "$later")" = queued ] || fail "job $later is not queued"
stop_ztd
for f in long later; do
  rm "$ZT_TMP/$f.zt"
  mkfifo "$ZT_TMP/$f.zt"
done
"$ZTD" --socket "$SOCK" --state-dir "$STATE" --cpu-threads 1 --log-level info >>"$ZTD_LOG" 2>&1 &
ZTD_PID=$!
for i in $(seq 1 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
sleep 0.5
status_fast "after a restart with the queued jobs' token files FIFOs"
for j in "$long:long" "$later:later"; do
  wait_end "${j%%:*}" failed 30
  grep -q "${j#*:}.zt is a FIFO, not a regular file" "$STATE/jobs/${j%%:*}/status.json" ||
    fail "the failure does not name the FIFO: $(cat "$STATE/jobs/${j%%:*}/status.json")"
done
stop_ztd
echo "fifo: ok"
