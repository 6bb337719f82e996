# Shared by the integration tests: a real ztd on a temp socket and a temp state dir, killed on
# exit whatever happens. Sourced by each test; the test's meson entry passes the binaries:
#   ZTD, ZTCTL (paths) and ZT_TEST_BIN_DIR (the C helpers of this folder).
set -u

: "${ZTD:?ZTD must name the ztd binary}"
: "${ZTCTL:?ZTCTL must name the ztctl binary}"

ZT_TMP=$(mktemp -d "${TMPDIR:-/tmp}/zt-it.XXXXXX")
SOCK="$ZT_TMP/ztd.sock"
STATE="$ZT_TMP/state"
ZTD_PID=
ZTD_LOG="$ZT_TMP/ztd.log"
# Text that exists on any Debian machine; the fallback keeps the test running elsewhere.
TEXT=/usr/share/common-licenses/GPL-3

cleanup() {
  if [ -n "$ZTD_PID" ] && kill -0 "$ZTD_PID" 2>/dev/null; then
    kill -KILL "$ZTD_PID" 2>/dev/null
    wait "$ZTD_PID" 2>/dev/null
  fi
  [ -n "$ZT_KEEP" ] || rm -rf "$ZT_TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() {
  echo "FAIL: $*" >&2
  if [ -f "$ZTD_LOG" ]; then
    echo "---- ztd log (last 60 lines) ----" >&2
    tail -n 60 "$ZTD_LOG" >&2
  fi
  exit 1
}

# python_with MODULE: sets PY to a python that imports MODULE. ZT_TEST_PYTHON (tools/test.sh's
# venv) must have it, so a venv that went missing fails instead of skipping; without it the
# system's python3 is tried and the test skips when it lacks the module.
python_with() {
  PY=${ZT_TEST_PYTHON:-python3}
  "$PY" -c "import $1" 2>/dev/null && return 0
  [ -z "${ZT_TEST_PYTHON:-}" ] || fail "ZT_TEST_PYTHON=$ZT_TEST_PYTHON does not import $1"
  echo "no $1: tools/test.sh installs it"
  exit 77
}

# start_ztd [extra ztd flags...]: starts ztd and waits until it answers status.
start_ztd() {
  "$ZTD" --socket "$SOCK" --state-dir "$STATE" --cpu-threads 1 --log-level info "$@" \
    >>"$ZTD_LOG" 2>&1 &
  ZTD_PID=$!
  local i
  for i in $(seq 1 300); do
    if [ -S "$SOCK" ] && "$ZTCTL" --socket "$SOCK" status >/dev/null 2>&1; then return 0; fi
    kill -0 "$ZTD_PID" 2>/dev/null || fail "ztd exited during startup"
    sleep 0.1
  done
  fail "ztd did not answer within 30 s"
}

# stop_ztd: graceful stop by SIGTERM; fails unless ztd exits 0 and removes its socket.
stop_ztd() {
  kill -TERM "$ZTD_PID"
  local rc=0
  wait "$ZTD_PID" || rc=$?
  ZTD_PID=
  [ "$rc" -eq 0 ] || fail "ztd exited $rc after SIGTERM"
  [ ! -e "$SOCK" ] || fail "ztd left its socket behind"
}

ztctl() { "$ZTCTL" --socket "$SOCK" "$@"; }

# expect_fail WANT_RC NEEDLE CMD...: CMD exits WANT_RC and its output mentions NEEDLE.
expect_fail() {
  local want=$1 needle=$2 out rc=0
  shift 2
  out=$("$@" 2>&1) || rc=$?
  [ "$rc" -eq "$want" ] || fail "'$*' exited $rc, expected $want: $out"
  case "$out" in *"$needle"*) ;; *) fail "'$*' output lacks '$needle': $out" ;; esac
  echo "ok: $* -> $(printf '%s' "$out" | head -n 1)"
}

# json_get FIELD: reads one JSON object on stdin and prints the field (a.b for nesting).
json_get() {
  python3 -c '
import json, sys
v = json.loads(sys.stdin.read().strip().splitlines()[-1])
for k in sys.argv[1].split("."):
    v = v[k]
print(v if not isinstance(v, (dict, list)) else json.dumps(v))' "$1"
}

# job_id_of: the job id in ztctl --json output on stdin (its first JSON object with a "job").
job_id_of() {
  python3 -c '
import json, sys
for line in sys.stdin:
    try:
        j = json.loads(line)
    except ValueError:
        continue
    if isinstance(j, dict) and "job" in j:
        print(j["job"]); break'
}

# submit SPEC_FILE [ztctl submit args...]: prints the new job id.
submit() {
  local out
  out=$(ztctl --json submit "$@") || fail "submit $1 failed: $out"
  printf '%s\n' "$out" | json_get job
}

# state JOB: prints the job's state.
state() { ztctl --json show "$1" | json_get state; }

# wait_state JOB STATE [SECONDS]: polls until the job reaches STATE.
wait_state() {
  local s i limit=$((${3:-120} * 10))
  for i in $(seq 1 "$limit"); do
    s=$(state "$1") || fail "show $1 failed"
    [ "$s" = "$2" ] && return 0
    case "$s" in done | failed | cancelled) fail "job $1 ended $s, expected $2" ;; esac
    sleep 0.1
  done
  fail "job $1 is $s after ${3:-120} s, expected $2"
}

# wait_status JOB REGEX [SECONDS]: polls the job's status.json (rewritten at each state change
# and checkpoint) until a line matches; fails when ztd dies meanwhile.
wait_status() {
  local i
  for i in $(seq 1 $((${3:-120} * 20))); do
    grep -Eq "$2" "$STATE/jobs/$1/status.json" && return 0
    if ! kill -0 "$ZTD_PID" 2>/dev/null; then
      local rc=0
      wait "$ZTD_PID" || rc=$?
      ZTD_PID=
      fail "ztd died (exit status $rc) while job $1 ran"
    fi
    sleep 0.05
  done
  fail "job $1: no '$2' in its status.json: $(cat "$STATE/jobs/$1/status.json")"
}
# wait_end JOB STATE [SECONDS]: waits for the job to end and checks it ended in STATE.
wait_end() {
  wait_status "$1" '"state": "(done|failed|cancelled)"' "${3:-120}"
  grep -q "\"state\": \"$2\"" "$STATE/jobs/$1/status.json" ||
    fail "job $1 ended otherwise than $2: $(cat "$STATE/jobs/$1/status.json")"
}
# new_job SPEC: submits it and prints the id, as submit does but without a JSON parser per call
# (call it as `job=$(new_job SPEC) || exit 1`).
new_job() { ztctl submit "$1" || fail "submit $1"; }

# wait_step JOB N: polls until the job has completed at least N steps (while running).
wait_step() {
  local i s
  for i in $(seq 1 1200); do
    s=$(ztctl --json show "$1" | json_get step) || fail "show $1 failed"
    [ "$s" -ge "$2" ] && return 0
    sleep 0.1
  done
  fail "job $1 did not reach step $2"
}

# check_learned JOB: the mean of the last 10 losses is well below the first loss.
check_learned() {
  ztctl --json show "$1" | python3 -c '
import json, sys
j = json.loads(sys.stdin.read())
# a loss, or a [step, loss] pair
l = [x[-1] if isinstance(x, list) else x for x in j["losses"]]
assert len(l) >= 20, "only %d losses" % len(l)
first, last = l[0], sum(l[-10:]) / 10
print("losses: first %.4f, mean of last 10 %.4f" % (first, last))
sys.exit(0 if last < 0.85 * first else 1)' || fail "job $1 did not learn"
}

# make_tokens OUT: a byte-level token file of the text.
make_tokens() {
  # Elsewhere (the GPU machine's image has no licence texts): the project's own docs.
  [ -r "$TEXT" ] || TEXT=$(dirname "${BASH_SOURCE[0]}")/../../docs/spec.md
  [ -r "$TEXT" ] || { echo "no text to tokenize" >&2; exit 77; }
  ztctl tokenize --bytes "$TEXT" "$1" >/dev/null || fail "tokenize failed"
}

# spec OUT SOURCE STEPS [extra JSON members of the top level]: a tiny job spec, GPT unless
# ARCH is set in the environment. SOURCE is a token file path or "stream".
spec() {
  local data
  if [ "$2" = stream ]; then data='{"source": "stream"}'; else data="{\"source\": \"file\", \"path\": \"$2\"}"; fi
  cat >"$1" <<JSON
{"name": "tiny", "model": {"arch": "${ARCH:-gpt}", "vocab": 256, "seq_len": 16, "d_model": 32,
 "n_heads": 2, "n_layers": 2, "init": {"seed": 1}},
 "train": {"steps": $3, "micro_batch": 4, "optimizer": {"lr": 0.01}, "seed": 1},
 "data": $data, "checkpoint": {"every": 10, "keep": 2}${4:+, $4}}
JSON
}

# pspec OUT STEPS GRAD_ACCUM PARALLEL [SOURCE]: the tiny spec above with grad_accum and, when
# PARALLEL (a JSON object) is not empty, that "parallel" member; SOURCE defaults to the token
# file $ZT_TMP/gpl.zt.
pspec() {
  spec "$1" "${5:-$ZT_TMP/gpl.zt}" "$2"
  python3 - "$@" <<'PY'
import json, sys
path, steps, accum, par = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
s = json.load(open(path))
s["train"]["grad_accum"] = accum
if par:
    s["parallel"] = json.loads(par)
json.dump(s, open(path, "w"))
PY
}
