/* defines: the FIFO queue and the device set, on the loop thread: which queued job starts
 * when (zt__jobs_maybe_start), a runner's start and the loop side of its messages (runner.c
 * posts them with zt__jobs_post, zt__jobs_on_async reads them), a job failed before or at its
 * start (zt__job_fail); zt_jobs_cancel and zt_jobs_shutdown (jobs.h; called by engine/server). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine/job/internal.h"
#include "engine/job/store.h"
#include "engine/base/log.h"
#include "engine/plan/plan_file.h"

void zt__jobs_post(zt__job *job, zt__msg_kind kind, json_t *obj, int rc, uint64_t gen,
                   const char *text) {
  zt_jobs *jobs = job->jobs;
  zt__msg *m = calloc(1, sizeof *m);
  if (!m) {
    /* Nothing sensible is left to do with the message; the registry stays consistent because
     * the runner's own fields are already updated under mu. */
    ZT_LOGE("job", "%s: out of memory posting a message", job->id);
    json_decref(obj);
    return;
  }
  m->job = job;
  m->kind = kind;
  m->obj = obj;
  m->rc = rc;
  m->gen = gen;
  if (text) snprintf(m->text, sizeof m->text, "%s", text);
  pthread_mutex_lock(&jobs->mu);
  if (jobs->msgs_tail)
    jobs->msgs_tail->next = m;
  else
    jobs->msgs = m;
  jobs->msgs_tail = m;
  pthread_mutex_unlock(&jobs->mu);
  uv_async_send(jobs->async);
}

/* The "state" and "end" events of a job that ends on the loop thread, without a runner (the
 * runner posts its own): error only for a failed one. */
static void emit_end(zt_jobs *jobs, zt__job *job, const char *state, const char *error) {
  json_t *ev = zt__job_event(job, "state");
  json_object_set_new(ev, "state", json_string(state));
  if (error) json_object_set_new(ev, "error", json_string(error));
  zt__jobs_emit(jobs, job, ev);
  ev = zt__job_event(job, "end");
  json_object_set_new(ev, "state", json_string(state));
  json_object_set_new(ev, "step", json_integer(job->step));
  if (error) json_object_set_new(ev, "error", json_string(error));
  zt__jobs_emit(jobs, job, ev);
}

void zt__job_fail(zt_jobs *jobs, zt__job *job, const char *error) {
  pthread_mutex_lock(&jobs->mu);
  job->state = ZT_JOB_FAILED;
  job->ended = zt__now();
  snprintf(job->error, sizeof job->error, "%s", error);
  pthread_mutex_unlock(&jobs->mu);
  char err[ZT__ERR_MAX];
  if (zt__job_write_status(job, err, sizeof err) < 0) ZT_LOGE("job", "%s: %s", job->id, err);
  zt__job_log(job, ZT_LOG_ERROR, "failed: %s", error);
  emit_end(jobs, job, "failed", error);
  char msg[ZT__ERR_MAX + 64];
  snprintf(msg, sizeof msg, "job %s failed: %s", job->id, error);
  zt__job_fail_pending(job, -EINVAL, msg);
}

int zt__jobs_free_devices(const zt_jobs *jobs) {
  int n = 0;
  for (int i = 0; i < jobs->n_dev; i++) n += !jobs->holder[i];
  return n;
}

/* The host memory the running jobs take. */
static double host_in_use(const zt_jobs *jobs) {
  double b = 0;
  for (int i = 0; i < jobs->n_all; i++)
    if (jobs->all[i]->has_thread) b += (double)jobs->all[i]->needs.host_bytes;
  return b;
}

static void release_devices(zt_jobs *jobs, zt__job *job) {
  for (int i = 0; i < jobs->n_dev; i++)
    if (jobs->holder[i] == job) jobs->holder[i] = NULL;
  job->n_held = 0;
}

/* "GPUs 0,1", "GPU 2", "ranks 0,1" (the cpu backend's are simulated) */
static void held_text(const zt_jobs *jobs, const zt__job *job, char *out, size_t outlen) {
  int cuda = strcmp(jobs->cfg.backend, "cuda") == 0;
  size_t n = (size_t)snprintf(out, outlen, "%s%s ", cuda ? "GPU" : "rank",
                              job->n_held > 1 ? "s" : "");
  for (int i = 0; i < job->n_held && n < outlen; i++)
    n += (size_t)snprintf(out + n, outlen - n, "%s%d", i ? "," : "", job->held[i]);
}

/* Gives the job parallel.gpus free devices (the caller checked there are) and starts its
 * runner; a runner that cannot start fails the job. */
void zt__jobs_start(zt_jobs *jobs, zt__job *job) {
  char err[ZT__ERR_MAX];
  for (int i = 0; i < jobs->n_dev && job->n_held < job->spec.gpus; i++) {
    if (jobs->holder[i]) continue;
    jobs->holder[i] = job;
    job->held[job->n_held++] = jobs->dev[i];
  }
  pthread_mutex_lock(&jobs->mu);
  job->state = ZT_JOB_RUNNING;
  if (!job->started) job->started = zt__now();
  job->backend_bytes = job->needs.backend_bytes;
  job->stop = ZT__STOP_NONE;
  /* a stream job's wait for a producer counts while it holds its devices */
  if (!job->n_producers) job->idle_since = zt__mono();
  pthread_mutex_unlock(&jobs->mu);
  int rc = -pthread_create(&job->thread, NULL, zt__runner_main, job);
  if (rc < 0) {
    release_devices(jobs, job);
    snprintf(err, sizeof err, "cannot start the runner thread: %s", strerror(-rc));
    zt__job_fail(jobs, job, err);
    return;
  }
  job->has_thread = 1;
  jobs->running++;
  char held[ZT_JOBS_MAX_GPUS * 4 + 16];
  held_text(jobs, job, held, sizeof held);
  if (job->part.member)
    zt__job_log(job, ZT_LOG_INFO, "running ranks %d..%d of %d for %s on the %s backend (%s)",
                job->part.rank0, job->part.rank0 + job->spec.gpus - 1, zt__job_world(&job->spec),
                job->part.coordinator, jobs->cfg.backend, held);
  else
    zt__job_log(job, ZT_LOG_INFO, "running on the %s backend (%s)", jobs->cfg.backend, held);
  json_t *ev = zt__job_event(job, "state");
  json_object_set_new(ev, "state", json_string("running"));
  zt__jobs_emit(jobs, job, ev);
}

/* The machine checked for a queued job about to start (its files, its devices, its memory), on
 * a worker: a job queued before a restart was validated by another daemon (its files may be
 * gone, the daemon may own fewer devices), and a file may have changed since the submit. The
 * job is found again by its id when the check ends: it may have been cancelled meanwhile. */
typedef struct start_check {
  zt__work w;
  char id[ZT_JOB_ID_MAX];
  char dir[ZT__JOB_DIR_MAX];
  zt_job_spec spec;
  int tcp;
  zt__job_needs needs;
  int rc;
  char err[ZT__ERR_MAX];
  char note[2 * ZT__ERR_MAX]; /* for the job's log: its plan reused or made again, and why */
} start_check;

/* A single-rank offloaded job's plan.json reused where this daemon's limits still admit it
 * (the plan checked, not searched); else, or where it is missing or not a plan (a job from
 * before plan.json), planned again under this daemon's device budget (which lowers
 * offload.gpu_budget as at a submit) and written over it. The stored spec is left as it was. */
static int start_plan(start_check *c, const zt_jobs_config *cfg) {
  zt_offload_placement stored;
  char why[ZT__ERR_MAX], plan[512];
  int rc = zt__store_plan_read(c->dir, &stored, why, sizeof why);
  int unread = rc < 0;
  if (rc == 0 &&
      (rc = zt__job_spec_check_plan(&c->spec, cfg, &stored, &c->needs, why, sizeof why)) == 0) {
    zt_offload_plan_describe(&c->needs.plan, plan, sizeof plan);
    snprintf(c->note, sizeof c->note, ZT__PLAN_FILE " reused (it fits this daemon): %s", plan);
    return 0;
  }
  const char *what;
  double budget = zt__jobs_device_budget(cfg, &what);
  zt_offload_cfg *oc = &c->spec.offload;
  if (budget > 0 && (!oc->gpu_budget || (double)oc->gpu_budget > budget))
    oc->gpu_budget = (size_t)budget;
  char again[ZT__ERR_MAX];
  if ((rc = zt__job_spec_check_resources(&c->spec, cfg, &c->needs, again, sizeof again)) < 0 ||
      (rc = zt__store_plan_write(c->dir, &c->needs.plan, again, sizeof again)) < 0) {
    snprintf(c->err, sizeof c->err, "%.900s: planned again: %.1100s", why, again);
    return rc;
  }
  zt_offload_plan_describe(&c->needs.plan, plan, sizeof plan);
  snprintf(c->note, sizeof c->note, "%s%.1500s%s: planned again: %s",
           unread ? "" : ZT__PLAN_FILE " no longer fits this daemon (", why, unread ? "" : ")",
           plan);
  return 0;
}

static void start_check_run(zt__work *w) {
  start_check *c = (start_check *)w;
  const zt_jobs_config *cfg = &w->jobs->cfg;
  if ((c->rc = zt__job_spec_check_files(&c->spec, cfg, c->tcp, c->err, sizeof c->err)) < 0)
    return;
  if (c->spec.has_offload && zt__job_world(&c->spec) == 1)
    c->rc = start_plan(c, cfg);
  else
    c->rc = zt__job_spec_check_resources(&c->spec, cfg, &c->needs, c->err, sizeof c->err);
}

static void start_check_finish(zt__work *w) {
  start_check *c = (start_check *)w;
  zt_jobs *jobs = w->jobs;
  char none[ZT__ERR_MAX];
  zt__job *job = zt__jobs_find(jobs, c->id, none, sizeof none);
  if (job) job->checking = 0;
  if (job && zt__job_state_of(job) == ZT_JOB_QUEUED) {
    if (c->rc < 0) {
      for (int i = 0; i < jobs->n_queue; i++)
        if (jobs->queue[i] == job) {
          memmove(jobs->queue + i, jobs->queue + i + 1,
                  (size_t)(jobs->n_queue - i - 1) * sizeof *jobs->queue);
          jobs->n_queue--;
          break;
        }
      zt__job_fail(jobs, job, c->err);
    } else {
      job->needs = c->needs;
      job->has_needs = 1;
      job->has_plan = c->needs.has_plan;
      job->plan = c->needs.plan;
      if (c->note[0]) zt__job_log(job, ZT_LOG_INFO, "%s", c->note);
    }
  }
  zt__jobs_maybe_start(jobs);
}

static void start_check_release(zt__work *w) { free(w); }

static void start_check_begin(zt_jobs *jobs, zt__job *job) {
  start_check *c = calloc(1, sizeof *c);
  if (!c) {
    memmove(jobs->queue, jobs->queue + 1, (size_t)(--jobs->n_queue) * sizeof *jobs->queue);
    zt__job_fail(jobs, job, "out of memory checking the job before its start");
    return;
  }
  snprintf(c->id, sizeof c->id, "%s", job->id);
  snprintf(c->dir, sizeof c->dir, "%s", job->dir);
  c->spec = job->spec;
  c->tcp = job->tcp;
  c->w.run = start_check_run;
  c->w.finish = start_check_finish;
  c->w.release = start_check_release;
  job->checking = 1;
  zt__jobs_work(jobs, &c->w);
}

/* Starts queued jobs in FIFO order. The head starts when parallel.gpus devices are free (it
 * takes the first free ones), the machine has been checked for it (start_check) and its host
 * memory fits beside the running jobs'; nothing overtakes a head that waits, so narrow jobs
 * cannot starve a wide one (they queue behind it instead of filling the devices it waits
 * for). */
void zt__jobs_maybe_start(zt_jobs *jobs) {
  while (!jobs->shutting_down && jobs->n_queue > 0) {
    zt__job *job = jobs->queue[0];
    /* a job wider than the device set is failed by the check rather than waiting forever */
    if (job->spec.gpus <= jobs->n_dev && zt__jobs_free_devices(jobs) < job->spec.gpus) return;
    if (!job->has_needs) {
      if (!job->checking) start_check_begin(jobs, job);
      return;
    }
    /* alone it fits (admission checked that); beside others it waits for them */
    const char *what;
    double cap = zt__jobs_host_limit(&jobs->cfg, &what);
    if (jobs->running > 0 && cap > 0 && host_in_use(jobs) + (double)job->needs.host_bytes > cap)
      return;
    memmove(jobs->queue, jobs->queue + 1, (size_t)(--jobs->n_queue) * sizeof *jobs->queue);
    zt__jobs_start(jobs, job);
  }
}

static void check_shutdown(zt_jobs *jobs) {
  if (jobs->shutting_down && jobs->running == 0 && !jobs->shutdown_notified) {
    jobs->shutdown_notified = 1;
    if (jobs->shutdown_done) jobs->shutdown_done(jobs->shutdown_user);
  }
}

void zt__jobs_on_async(uv_async_t *h) {
  zt_jobs *jobs = h->data;
  pthread_mutex_lock(&jobs->mu);
  zt__msg *m = jobs->msgs;
  jobs->msgs = jobs->msgs_tail = NULL;
  pthread_mutex_unlock(&jobs->mu);
  while (m) {
    zt__msg *next = m->next;
    zt__job *job = m->job;
    switch (m->kind) {
    case ZT__MSG_EVENT:
      zt__jobs_emit(jobs, job, m->obj);
      m->obj = NULL;
      break;
    case ZT__MSG_CONSUMED:
      zt__job_refill(job);
      break;
    case ZT__MSG_CHECKPOINT:
      zt__job_answer_checkpoints(job, m);
      break;
    case ZT__MSG_EXIT: {
      pthread_join(job->thread, NULL);
      job->has_thread = 0;
      jobs->running--;
      release_devices(jobs, job);
      zt_job_state s = zt__job_state_of(job);
      char msg[ZT__ERR_MAX];
      if (zt__job_state_terminal(s)) {
        snprintf(msg, sizeof msg, "job %s is %s", job->id, zt_job_state_name(s));
        zt__job_fail_pending(job, -EINVAL, msg);
      } else {
        snprintf(msg, sizeof msg, "job %s stopped: the daemon is shutting down", job->id);
        zt__job_fail_pending(job, -ESHUTDOWN, msg);
      }
      break;
    }
    }
    json_decref(m->obj);
    free(m);
    m = next;
  }
  zt__jobs_maybe_start(jobs);
  check_shutdown(jobs);
}

/* Queue capacity equals the registry's, so enqueueing a registered job cannot fail. */
void zt__jobs_enqueue(zt_jobs *jobs, zt__job *job) { jobs->queue[jobs->n_queue++] = job; }

int zt_jobs_cancel(zt_jobs *jobs, const char *id, char *err, size_t errlen) {
  zt__job *job = zt__jobs_find(jobs, id, err, errlen);
  if (!job) return -ENOENT;
  zt_job_state s = zt__job_state_of(job);
  if (zt__job_state_terminal(s)) {
    snprintf(err, errlen, "job %s is already %s", id, zt_job_state_name(s));
    return -EINVAL;
  }
  if (job->has_thread) {
    pthread_mutex_lock(&jobs->mu);
    job->stop = ZT__STOP_CANCEL;
    pthread_cond_broadcast(&job->cond);
    pthread_mutex_unlock(&jobs->mu);
    return 0;
  }
  /* Queued: it leaves the queue now. */
  for (int i = 0; i < jobs->n_queue; i++) {
    if (jobs->queue[i] != job) continue;
    memmove(jobs->queue + i, jobs->queue + i + 1,
            (size_t)(jobs->n_queue - i - 1) * sizeof *jobs->queue);
    jobs->n_queue--;
    break;
  }
  pthread_mutex_lock(&jobs->mu);
  job->state = ZT_JOB_CANCELLED;
  job->ended = zt__now();
  pthread_mutex_unlock(&jobs->mu);
  zt__job_log(job, ZT_LOG_INFO, "cancelled while queued");
  int rc = zt__job_write_status(job, err, errlen);
  emit_end(jobs, job, "cancelled", NULL);
  char msg[ZT__ERR_MAX];
  snprintf(msg, sizeof msg, "job %s is cancelled", id);
  zt__job_fail_pending(job, -EINVAL, msg);
  /* it may have been the head that the others waited behind */
  zt__jobs_maybe_start(jobs);
  return rc;
}

void zt_jobs_shutdown(zt_jobs *jobs, void (*done)(void *user), void *user) {
  jobs->shutting_down = 1;
  jobs->shutdown_done = done;
  jobs->shutdown_user = user;
  pthread_mutex_lock(&jobs->mu);
  for (int i = 0; i < jobs->n_all; i++) {
    zt__job *job = jobs->all[i];
    if (job->has_thread && job->stop == ZT__STOP_NONE) job->stop = ZT__STOP_SHUTDOWN;
    pthread_cond_broadcast(&job->cond);
  }
  pthread_mutex_unlock(&jobs->mu);
  /* done runs from the loop, never inside this call, even when nothing is running. */
  uv_async_send(jobs->async);
}
