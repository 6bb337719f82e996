/* defines: zt_jobs_resume (jobs.h; called by engine/server): a job that ended done or cancelled
 * queued again with a new train.steps, to continue from its newest checkpoint (the runner's own
 * resume: weights, AdamW moments and step, loss scale; the data position is the step). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine/job/internal.h"
#include "engine/job/store.h"
#include "engine/plan/recipe.h"

/* Why the job cannot be resumed now, or 0. */
static int resumable(zt_jobs *jobs, const zt__job *job, int64_t steps, int tcp, int *from,
                     char *err, size_t errlen) {
  zt_job_state s = job->state;
  if (jobs->shutting_down) {
    snprintf(err, errlen, "the daemon is shutting down");
    return -ESHUTDOWN;
  }
  if (s == ZT_JOB_QUEUED || s == ZT_JOB_RUNNING || job->has_thread || job->checking) {
    snprintf(err, errlen, "job %s is %s; only a job that ended done or cancelled is resumed",
             job->id, zt__job_state_terminal(s) ? "still stopping" : zt_job_state_name(s));
    return -EBUSY;
  }
  if (s == ZT_JOB_FAILED) {
    snprintf(err, errlen, "job %s failed (ztctl show %s says why); only a job that ended done "
             "or cancelled is resumed", job->id, job->id);
    return -EINVAL;
  }
  if (job->part.member) {
    snprintf(err, errlen, "job %s is a part of %s's job; resume that job there", job->id,
             job->part.coordinator);
    return -EINVAL;
  }
  /* a Unix-socket client's job reads its files anywhere: a TCP client may not start it again */
  if (tcp && !job->tcp) {
    snprintf(err, errlen, "job %s was submitted over the Unix socket; a TCP client resumes only "
             "jobs submitted over TCP", job->id);
    return -EACCES;
  }
  if (steps <= job->step || steps > ZT_TRAIN_MAX_STEPS) {
    snprintf(err, errlen, "steps %lld is not in (%d, %d]: the job is at step %d", (long long)steps,
             job->step, ZT_TRAIN_MAX_STEPS, job->step);
    return -EINVAL;
  }
  int newest = zt__store_newest_checkpoint(job->dir);
  if (newest <= 0) {
    snprintf(err, errlen, "job %s has no checkpoint to resume from", job->id);
    return -ENOENT;
  }
  if (jobs->cfg.max_queued && jobs->n_queue >= jobs->cfg.max_queued) {
    snprintf(err, errlen, "%d jobs are queued, ztd --max-queued %d: wait for them to start, or "
             "cancel some", jobs->n_queue, jobs->cfg.max_queued);
    return -EBUSY;
  }
  *from = newest;
  return 0;
}

int zt_jobs_resume(zt_jobs *jobs, const char *id, int64_t steps, int tcp, json_t **reply,
                   char *err, size_t errlen) {
  zt__job *job = zt__jobs_find(jobs, id, err, errlen);
  int from = 0, rc;
  *reply = NULL;
  if (!job) return -ENOENT;
  if ((rc = resumable(jobs, job, steps, tcp, &from, err, errlen)) < 0) return rc;
  zt_job_state was = job->state;
  int was_steps = job->spec.train.steps, was_epochs = job->spec.train.epochs;
  /* the new horizon is the spec's: a cosine schedule spans the N steps from now on; train.epochs
   * no longer says where the data ends (its rows go on into the next epochs) */
  json_t *train = json_object_get(job->spec_json, "train");
  if (!train || json_object_set_new(train, "steps", json_integer(steps)) < 0) {
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  json_object_del(train, "epochs");
  if ((rc = zt__store_write_json(job->dir, "spec.json", job->spec_json, err, errlen)) < 0) {
    json_object_set_new(train, "steps", json_integer(was_steps));
    if (was_epochs) json_object_set_new(train, "epochs", json_integer(was_epochs));
    return rc;
  }
  pthread_mutex_lock(&jobs->mu);
  job->spec.train.steps = (int)steps;
  job->spec.train.epochs = 0;
  job->state = ZT_JOB_QUEUED;
  job->ended = 0;
  job->error[0] = 0;
  job->stop = ZT__STOP_NONE;
  pthread_mutex_unlock(&jobs->mu);
  /* the machine is checked again at the queue's head, as for any queued job */
  job->has_needs = 0;
  if ((rc = zt__job_write_status(job, err, errlen)) < 0) {
    pthread_mutex_lock(&jobs->mu);
    job->spec.train.steps = was_steps;
    job->spec.train.epochs = was_epochs;
    job->state = was;
    pthread_mutex_unlock(&jobs->mu);
    json_object_set_new(train, "steps", json_integer(was_steps));
    if (was_epochs) json_object_set_new(train, "epochs", json_integer(was_epochs));
    zt__store_write_json(job->dir, "spec.json", job->spec_json, NULL, 0);
    return rc;
  }
  zt__jobs_enqueue(jobs, job);
  zt__job_log(job, ZT_LOG_INFO, "resumed (it was %s at step %d of %d): queued to train to step "
              "%lld from its checkpoint at step %d", zt_job_state_name(was), job->step, was_steps,
              (long long)steps, from);
  json_t *ev = zt__job_event(job, "state");
  json_object_set_new(ev, "state", json_string(zt_job_state_name(ZT_JOB_QUEUED)));
  zt__jobs_emit(jobs, job, ev);
  *reply = json_pack("{s:s, s:s, s:I, s:i}", "job", job->id, "state", "queued", "steps",
                     (json_int_t)steps, "from_step", from);
  zt__jobs_maybe_start(jobs);
  return 0;
}
