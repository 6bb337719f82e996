#!/bin/bash
# Jobs spanning daemons (parallel.peers) refused or failed cleanly, with the cause named: specs a
# daemon cannot run (no token to reach peers, a cpu daemon), a peer that does not
# answer, and join requests (the coordinator's call to a peer) with bad parts. ztd keeps serving
# and its devices are free afterwards. The two-daemon training itself is two_daemons.sh (GPUs).
. "$(dirname "$0")/lib.sh"

# edit IN OUT PYTHON: a copy of the spec IN with the python statement applied to s
edit() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
exec(sys.argv[3])
json.dump(s, open(sys.argv[2], "w"))
PY
}

port=$((20000 + RANDOM % 20000))
printf 'an-integration-test-token-0123456789\n' >"$ZT_TMP/token"
chmod 600 "$ZT_TMP/token"
# a part's spec comes over TCP: its token file must lie inside the daemon's --data-root
start_ztd --tcp "127.0.0.1:$port" --token-file "$ZT_TMP/token" --data-root "$ZT_TMP"
make_tokens "$ZT_TMP/gpl.zt"
backend=$(ztctl --json status | json_get backend)
spec "$ZT_TMP/plain.json" "$ZT_TMP/gpl.zt" 20
pspec "$ZT_TMP/peers.json" 20 1 '{"gpus": 1, "zero_stage": 2, "peers": ["127.0.0.1:1"]}'

# the shape of parallel.peers
for bad in '"nohost"' '"host:0"' '":7070"' '7070'; do
  edit "$ZT_TMP/peers.json" "$ZT_TMP/bad.json" "s['parallel']['peers'] = [$bad]"
  expect_fail 1 "parallel.peers" "$ZTCTL" --socket "$SOCK" submit "$ZT_TMP/bad.json"
done
edit "$ZT_TMP/peers.json" "$ZT_TMP/bad.json" "s['parallel']['peers'] = ['h:1', 'h:1']"
expect_fail 1 "named twice" "$ZTCTL" --socket "$SOCK" submit "$ZT_TMP/bad.json"
edit "$ZT_TMP/peers.json" "$ZT_TMP/bad.json" "s['parallel']['gpus'] = 'all'"
expect_fail 1 'parallel.gpus "all"' "$ZTCTL" --socket "$SOCK" plan "$ZT_TMP/bad.json"

if [ "$backend" = cpu ]; then
  expect_fail 1 "needs a cuda ztd" "$ZTCTL" --socket "$SOCK" submit "$ZT_TMP/peers.json"
else
  ztctl --json plan "$ZT_TMP/peers.json" | python3 -c '
import json, sys
par = json.load(sys.stdin)["parallel"]
assert par["gpus"] == 1 and par["world"] == 2 and par["peers"] == ["127.0.0.1:1"], par
assert len(par["rank_bytes"]) == 2, par' || fail "plan of a job spanning daemons"
  # admitted; at its start the peer does not answer: the job fails naming it
  job=$(submit "$ZT_TMP/peers.json")
  wait_end "$job" failed 60
  err=$(ztctl --json show "$job" | json_get error)
  case "$err" in *"peer 127.0.0.1:1"*ECONNREFUSED*) ;; *) fail "unreachable peer: $err" ;; esac
  echo "ok: unreachable peer: $err"
fi

# join requests with bad parts, each refused naming the field
J() { "$ZT_TEST_BIN_DIR/join_part" "127.0.0.1:$port" "$ZT_TMP/token" "$@"; }
id=$(printf '%0256d' 0)
part() { # WORLD RANK0 NCCL_ID RESUME COORDINATOR
  printf '{"world": %s, "rank0": %s, "nccl_id": "%s", "resume_step": %s, "coordinator": "%s"}' "$@"
}
expect_fail 1 "not a job spanning daemons" J "$ZT_TMP/plain.json" "$(part 2 1 "$id" 0 peers.sh)"
expect_fail 1 "part.world" J "$ZT_TMP/peers.json" "$(part 3 1 "$id" 0 peers.sh)"
expect_fail 1 "part.rank0" J "$ZT_TMP/peers.json" "$(part 2 0 "$id" 0 peers.sh)"
expect_fail 1 "part.nccl_id" J "$ZT_TMP/peers.json" "$(part 2 1 zz 0 peers.sh)"
expect_fail 1 "part.resume_step" J "$ZT_TMP/peers.json" "$(part 2 1 "$id" -1 peers.sh)"
expect_fail 1 "part.coordinator" J "$ZT_TMP/peers.json" "$(part 2 1 "$id" 0 '')"
expect_fail 1 "EINVAL" J "$ZT_TMP/peers.json" '{"world": "two"}'
printf 'a-wrong-token-of-enough-length-000000\n' >"$ZT_TMP/wrong"
expect_fail 1 "EACCES" "$ZT_TEST_BIN_DIR/join_part" "127.0.0.1:$port" "$ZT_TMP/wrong" \
  "$ZT_TMP/peers.json" "$(part 2 1 "$id" 0 peers.sh)"
if [ "$backend" = cpu ]; then
  expect_fail 1 "needs a cuda ztd" J "$ZT_TMP/peers.json" "$(part 2 1 "$id" 0 peers.sh)"
else
  # a part whose rank 0 never comes: it ends when the coordinator's connection closes
  out=$(J "$ZT_TMP/peers.json" "$(part 2 1 "$id" 0 peers.sh)" --hold 3) || fail "join: $out"
  member=${out#job }
  wait_end "$member" failed 60
  echo "ok: part left alone: $(ztctl --json show "$member" | json_get error)"
fi

# the daemon serves on, with its devices free
job=$(submit "$ZT_TMP/plain.json")
wait_end "$job" done 120
stop_ztd

# a daemon without a token cannot reach peers
start_ztd
expect_fail 1 "--token-file" "$ZTCTL" --socket "$SOCK" submit "$ZT_TMP/peers.json"
stop_ztd
echo "peers: ok"
