#!/bin/bash
# An offloaded file job (optimizer nvme, then optimizer host) outlives ztd killed by SIGKILL
# mid-run: the restarted daemon resumes it from its last checkpoint, and its losses are bitwise
# those of the same spec run without interruption. The NVMe files the killed run left behind are
# removed when ztd restarts.
. "$(dirname "$0")/lib.sh"

mkdir -p "$ZT_TMP/nvme"
# the cpu backend everywhere, so the same losses are compared on every machine
start_ztd --backend cpu --nvme-dir "$ZT_TMP/nvme"
make_tokens "$ZT_TMP/gpl.zt"

# 40 steps with a checkpoint every 10: killed at step 13, a job resumes from step 10.
refs=()
for opt in nvme host; do
  spec "$ZT_TMP/$opt.json" "$ZT_TMP/gpl.zt" 40 "\"offload\": {\"optimizer\": \"$opt\"}"
  ref=$(new_job "$ZT_TMP/$opt.json") || exit 1
  refs+=("$ref")
done

# kill_mid_run OPT: submits OPT's spec and kills ztd (SIGKILL) the moment the job reports step
# 13, three steps past its first checkpoint (the events are read by this shell itself, so the
# job is barely further); the job's id goes to $job.
kill_mid_run() {
  local ev="$ZT_TMP/events.$1" line re='"event": *"step".*"step": *13[,}]'
  while IFS= read -r line; do
    printf '%s\n' "$line" >>"$ev"
    if [[ $line =~ $re ]]; then
      kill -KILL "$ZTD_PID"
      break
    fi
  done < <(ztctl --json submit "$ZT_TMP/$1.json" --watch)
  wait "$ZTD_PID" 2>/dev/null
  ZTD_PID=
  grep -Eq "$re" "$ev" || fail "the $1 job ended without reaching step 13: $(cat "$ev")"
  job=$(head -n 1 "$ev" | json_get job) || fail "no job id in the events of the $1 job: $(cat "$ev")"
}

i=0
for opt in nvme host; do
  ref=${refs[$i]}
  i=$((i + 1))
  kill_mid_run "$opt"
  # Killed mid-run: running on disk, a checkpoint taken, steps left.
  python3 - "$STATE/jobs/$job" "$opt" <<'PY' || fail "$opt job $job was not killed mid-run: $(cat "$STATE/jobs/$job/status.json")"
import json, sys
s = json.load(open(sys.argv[1] + "/status.json"))
assert s["state"] == "running" and 10 <= s["checkpoint_step"] < 40, s
n = len(open(sys.argv[1] + "/losses.log").readlines())
print("%s: killed after step %d, checkpoint at step %d" % (sys.argv[2], n, s["checkpoint_step"]))
PY
  if [ "$opt" = nvme ]; then
    ls -d "$ZT_TMP/nvme/ztd-$job."* >/dev/null 2>&1 || fail "the killed $opt job left no NVMe directory to remove: $(ls -A "$ZT_TMP/nvme")"
  else
    # A record naming a directory that is not this job's is dropped, the directory left alone.
    decoy="$ZT_TMP/ztd-j999999.AbCdEf"
    mkdir -p "$decoy" && touch "$decoy/keep"
    printf '{"dir": "%s"}\n' "$decoy" >"$STATE/jobs/$job/nvme.json"
  fi
  start_ztd --backend cpu --nvme-dir "$ZT_TMP/nvme"
  if [ "$opt" = host ]; then
    [ -f "$decoy/keep" ] || fail "the restart removed $decoy, which is not job $job's"
    [ ! -e "$STATE/jobs/$job/nvme.json" ] || fail "jobs/$job/nvme.json was kept"
    grep -q "$job: NVMe files of an interrupted run: .*no job NVMe directory" "$ZTD_LOG" ||
      fail "no warning of the foreign nvme.json of $job"
  fi
  [ "$opt" != nvme ] || grep -q "removed $ZT_TMP/nvme/ztd-$job\..*left by the interrupted run" "$STATE/jobs/$job/log" ||
    fail "jobs/$job/log does not tell of the NVMe files removed: $(cat "$STATE/jobs/$job/log")"
  wait_end "$ref" done
  wait_end "$job" done
  grep -q "resumes from .*step-000000[1-3]0 (step [1-3]0)" "$STATE/jobs/$job/log" ||
    fail "$opt job $job did not resume from a checkpoint: $(cat "$STATE/jobs/$job/log")"
  python3 - "$opt" "$(ztctl --json show "$ref")" "$(ztctl --json show "$job")" <<'PY' || fail "$opt: losses after the resume differ"
import json, sys
opt, ref, job = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
assert len(ref["losses"]) == 40 and job["losses"] == ref["losses"], (ref["losses"], job["losses"])
print("%s: 40 losses of the resumed job bitwise equal to the uninterrupted run" % opt)
PY
  [ -z "$(ls -A "$ZT_TMP/nvme")" ] || fail "files left in --nvme-dir: $(ls -A "$ZT_TMP/nvme")"
done
stop_ztd
echo "offload_resume: ok"
