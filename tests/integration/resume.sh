#!/bin/bash
# Continued training (ztctl resume, the resume op): a done job resumed to N steps, and a cancelled
# one, train bitwise the losses of an uninterrupted N-step run (constant schedule: the horizon's
# change alters nothing else); the new steps survive a restart; refusals name the cause: an
# unknown job, a running one, N not above the job's step, a job with no checkpoint, a TCP client
# naming a job submitted over the Unix socket. model.init.job starts a job from another's newest
# weights, as a file of them would, with the same refusals.
. "$(dirname "$0")/lib.sh"

port=$((20000 + RANDOM % 20000))
printf '%s\n' an-integration-test-token-0123456789 >"$ZT_TMP/token"
chmod 600 "$ZT_TMP/token"
tcp() { "$ZTCTL" --tcp "127.0.0.1:$port" --token-file "$ZT_TMP/token" "$@"; }
mkdir -p "$ZT_TMP/data"
make_tokens "$ZT_TMP/data/gpl.zt"
start_ztd --tcp "127.0.0.1:$port" --token-file "$ZT_TMP/token" --data-root "$ZT_TMP/data"

spec "$ZT_TMP/30.json" "$ZT_TMP/data/gpl.zt" 30
spec "$ZT_TMP/17.json" "$ZT_TMP/data/gpl.zt" 17
spec "$ZT_TMP/long.json" "$ZT_TMP/data/gpl.zt" 100000
full=$(new_job "$ZT_TMP/30.json") || exit 1
short=$(new_job "$ZT_TMP/17.json") || exit 1
wait_end "$full" done
wait_end "$short" done

# done at 17 (its final checkpoint at 17): to 30
out=$(ztctl resume "$short" --steps 30) || fail "resume $short: $out"
grep -q "queued to train to step 30 from its checkpoint at step 17" <<<"$out" || fail "resume said: $out"
wait_end "$short" done
cmp "$STATE/jobs/$full/losses.log" "$STATE/jobs/$short/losses.log" ||
  fail "done job resumed to 30 steps differs from 30 steps straight"
[ "$(ztctl --json show "$short" | json_get steps)" = 30 ] || fail "show's steps after the resume"
grep -q "resumed (it was done at step 17 of 17)" "$STATE/jobs/$short/log" || fail "the job's log lacks the resume"

# cancelled after its checkpoint at 10 (or later): from there to 30
job=$(new_job "$ZT_TMP/long.json") || exit 1
wait_status "$job" '"checkpoint_step": [1-9][0-9]'
ztctl cancel "$job" >/dev/null || fail "cancel $job"
wait_end "$job" cancelled
at=$(ztctl --json show "$job" | json_get step)
expect_fail 1 "EINVAL" ztctl resume "$job" --steps "$at"
expect_fail 1 "is not in ($at, " ztctl resume "$job" --steps 1
ztctl resume "$job" --steps 100001 >/dev/null || fail "resume of the cancelled $job"
wait_step "$job" 31
ztctl cancel "$job" >/dev/null
wait_end "$job" cancelled
head -n 30 "$STATE/jobs/$job/losses.log" | cmp - "$STATE/jobs/$full/losses.log" ||
  fail "cancelled job resumed differs from 30 steps straight"
grep -q '"steps": 100001' "$STATE/jobs/$job/spec.json" || fail "spec.json lacks the new steps"

# refusals
expect_fail 1 "ENOENT: no job j999999" ztctl resume j999999 --steps 5
running=$(new_job "$ZT_TMP/long.json") || exit 1
wait_state "$running" running
expect_fail 1 "EBUSY" ztctl resume "$running" --steps 200000
expect_fail 1 "is running; only a job that ended done or cancelled is resumed" ztctl resume "$running" --steps 200000
ztctl cancel "$running" >/dev/null
wait_end "$running" cancelled
# a queued job cancelled before it ran: no checkpoint (the queue is held by a running job)
blocker=$(new_job "$ZT_TMP/long.json") || exit 1
wait_state "$blocker" running
none=$(new_job "$ZT_TMP/30.json") || exit 1
ztctl cancel "$none" >/dev/null || fail "cancel queued $none"
ztctl cancel "$blocker" >/dev/null
wait_end "$blocker" cancelled
expect_fail 1 "job $none has no checkpoint to resume from" ztctl resume "$none" --steps 40
expect_fail 1 "ENOENT" ztctl resume "$none" --steps 40
expect_fail 2 "resume takes JOB --steps N" ztctl resume "$full"

# TCP: a job submitted over the Unix socket is not the TCP client's to restart; its own is
expect_fail 1 "job $full was submitted over the Unix socket; a TCP client resumes only jobs submitted over TCP" \
  tcp resume "$full" --steps 40
expect_fail 1 "EACCES" tcp resume "$full" --steps 40
mine=$(tcp submit "$ZT_TMP/17.json") || fail "TCP submit: $mine"
wait_end "$mine" done
tcp resume "$mine" --steps 30 >/dev/null || fail "TCP resume of its own job"
wait_end "$mine" done
cmp "$STATE/jobs/$full/losses.log" "$STATE/jobs/$mine/losses.log" || fail "TCP resume differs"

# model.init.job: a new job from another's newest weights (a new optimizer) trains as one from
# those weights exported to a file, its first loss well below the source's first on the same
# rows (the file's first: one document packed in order)
ztctl export "$full" "$ZT_TMP/data/full.safetensors" >/dev/null || fail "export $full"
spec "$ZT_TMP/from-job.json" "$ZT_TMP/data/gpl.zt" 12 
sed -i "s|\"init\": {\"seed\": 1}|\"init\": {\"job\": \"$full\"}|" "$ZT_TMP/from-job.json"
spec "$ZT_TMP/from-file.json" "$ZT_TMP/data/gpl.zt" 12
sed -i "s|\"init\": {\"seed\": 1}|\"init\": {\"safetensors\": \"$ZT_TMP/data/full.safetensors\"}|" \
  "$ZT_TMP/from-file.json"
from_job=$(new_job "$ZT_TMP/from-job.json") || exit 1
from_file=$(new_job "$ZT_TMP/from-file.json") || exit 1
wait_end "$from_job" done
wait_end "$from_file" done
cmp "$STATE/jobs/$from_job/losses.log" "$STATE/jobs/$from_file/losses.log" ||
  fail "init.job differs from init.safetensors of the exported weights"
first=$(head -n 1 "$STATE/jobs/$from_job/losses.log" | cut -d' ' -f2)
seeded=$(head -n 1 "$STATE/jobs/$full/losses.log" | cut -d' ' -f2)
python3 -c "import sys; a, b = map(float, sys.argv[1:]); assert a < b - 0.5, (a, b)" "$first" "$seeded" ||
  fail "init.job's first loss $first is not below the seeded source's first $seeded"
grep -q "\"job\": \"$full\"" "$STATE/jobs/$from_job/spec.json" || fail "spec.json lacks init.job"
grep -q "starts from the weights of job $full" "$STATE/jobs/$from_job/log" || fail "log lacks init.job"
expect_fail 1 "model.init.job: no job j999999" ztctl submit <(sed "s/$full/j999999/" "$ZT_TMP/from-job.json")
expect_fail 1 "model.init.job: job $none has no checkpoint yet" \
  ztctl submit <(sed "s/$full/$none/" "$ZT_TMP/from-job.json")
expect_fail 1 "model.init.job must be a job id" ztctl plan <(sed "s/\"$full\"/\"x1\"/" "$ZT_TMP/from-job.json")
expect_fail 1 "model.init takes exactly one of seed, safetensors or job" \
  ztctl plan <(sed "s/\"job\": \"$full\"/\"job\": \"$full\", \"seed\": 1/" "$ZT_TMP/from-job.json")
expect_fail 1 "model.init.job: job $full was submitted over the Unix socket" tcp submit "$ZT_TMP/from-job.json"
sed "s/$full/$mine/" "$ZT_TMP/from-job.json" >"$ZT_TMP/from-mine.json"
from_mine=$(tcp submit "$ZT_TMP/from-mine.json") || fail "TCP init.job of its own job: $from_mine"
wait_end "$from_mine" done
# its weights are its own: the source removed, it still resumes after a restart
ztctl rm "$full" >/dev/null || fail "rm $full"

# the new horizon survives a restart
stop_ztd
start_ztd
[ "$(ztctl --json show "$short" | json_get steps)" = 30 ] || fail "steps after a restart"
[ "$(state "$short")" = done ] || fail "state after a restart"
ztctl resume "$from_job" --steps 14 >/dev/null || fail "resume of the init.job job after a restart"
wait_end "$from_job" done
echo "resume: ok"
