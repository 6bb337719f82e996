/* defines: the registry of ztd's jobs, on the loop thread: zt_jobs_open / zt_jobs_close and
 * zt_job_state_name (jobs.h; called by engine/server), and for the folder's other files the
 * jobs table (zt__jobs_find, zt__jobs_add), a job's lifetime (zt__job_new, zt__job_free) and
 * its state's names (internal.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "engine/job/internal.h"
#include "engine/job/store.h"
#include "engine/base/log.h"

static const char *const g_state_names[] = {NULL, "queued", "running", "done", "failed",
                                            "cancelled"};

const char *zt_job_state_name(zt_job_state s) {
  return s >= ZT_JOB_QUEUED && s <= ZT_JOB_CANCELLED ? g_state_names[s] : "unknown";
}

int zt__job_state_parse(const char *s, zt_job_state *out) {
  for (int i = ZT_JOB_QUEUED; i <= ZT_JOB_CANCELLED; i++) {
    if (s && strcmp(s, g_state_names[i]) == 0) {
      *out = (zt_job_state)i;
      return 0;
    }
  }
  return -EINVAL;
}

int zt__job_state_terminal(zt_job_state s) { return s >= ZT_JOB_DONE; }

int64_t zt__now(void) { return (int64_t)time(NULL); }

double zt__mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The job of that id; NULL with the message of -ENOENT if there is none. */
zt__job *zt__jobs_find(zt_jobs *jobs, const char *id, char *err, size_t errlen) {
  for (int i = 0; i < jobs->n_all; i++)
    if (strcmp(jobs->all[i]->id, id) == 0) return jobs->all[i];
  snprintf(err, errlen, "no job %s", id);
  return NULL;
}

zt_job_state zt__job_state_of(zt__job *job) {
  pthread_mutex_lock(&job->jobs->mu);
  zt_job_state s = job->state;
  pthread_mutex_unlock(&job->jobs->mu);
  return s;
}

void zt__job_free(zt__job *job) {
  json_decref(job->memory);
  while (job->pushes) {
    zt__pending_push *p = job->pushes;
    job->pushes = p->next;
    free(p->tokens);
    free(p->marks);
    free(p);
  }
  while (job->ckpt_requests) {
    zt__ckpt_request *q = job->ckpt_requests;
    job->ckpt_requests = q->next;
    free(q);
  }
  zt__batch_ring_free(&job->ring);
  free(job->producers);
  pthread_cond_destroy(&job->cond);
  json_decref(job->spec_json);
  free(job);
}

int zt__job_new(zt_jobs *jobs, const char *id, const zt_job_spec *spec, zt__job **out) {
  zt__job *job = calloc(1, sizeof *job);
  if (!job) return -ENOMEM;
  job->jobs = jobs;
  snprintf(job->id, sizeof job->id, "%s", id);
  snprintf(job->dir, sizeof job->dir, "%s/jobs/%s", jobs->state_dir, id);
  job->spec = *spec;
  job->micro_tokens =
      (size_t)spec->train.micro_batch * ((size_t)spec->model.seq_len + 1);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&job->cond, &ca);
  pthread_condattr_destroy(&ca);
  job->spec_json = zt__job_spec_to_json(spec);
  int rc = job->spec_json ? 0 : -ENOMEM;
  if (rc == 0 && spec->source == ZT_DATA_STREAM) {
    uint32_t depth = jobs->cfg.batch_queue_depth ? jobs->cfg.batch_queue_depth : 1;
    rc = zt__batch_ring_init(&job->ring, depth, job->micro_tokens);
  }
  if (rc < 0) {
    zt__job_free(job);
    return rc;
  }
  *out = job;
  return 0;
}

int zt_jobs_rm(zt_jobs *jobs, const char *id, char *err, size_t errlen) {
  zt__job *job = zt__jobs_find(jobs, id, err, errlen);
  if (!job) return -ENOENT;
  zt_job_state s = zt__job_state_of(job);
  /* a cancelled job's runner may still be on its way out; a worker may still look at it */
  if (!zt__job_state_terminal(s) || job->has_thread || job->checking) {
    snprintf(err, errlen, "job %s is %s; only a job that ended (done, failed, cancelled) is "
             "removed%s", id, zt__job_state_terminal(s) ? "still stopping" : zt_job_state_name(s),
             zt__job_state_terminal(s) ? "" : " (ztctl cancel it first)");
    return -EBUSY;
  }
  /* the id stays taken: a restart must not give it to a new job (zt__store_ids) */
  int rc = zt__store_ids_record(jobs->state_dir, jobs->next_id, err, errlen);
  if (rc < 0) return rc;
  if ((rc = zt__store_remove_tree(job->dir)) < 0) {
    snprintf(err, errlen, "%s: %s", job->dir, strerror(-rc));
    return rc;
  }
  for (int i = 0; i < jobs->n_all; i++)
    if (jobs->all[i] == job) {
      memmove(jobs->all + i, jobs->all + i + 1, (size_t)(jobs->n_all - i - 1) * sizeof *jobs->all);
      jobs->n_all--;
      break;
    }
  ZT_LOGI("job", "%s removed (it was %s)", id, zt_job_state_name(s));
  zt__job_free(job);
  return 0;
}

int zt__jobs_add(zt_jobs *jobs, zt__job *job) {
  if (jobs->n_all == jobs->cap_all) {
    int cap = jobs->cap_all ? 2 * jobs->cap_all : 16;
    zt__job **all = realloc(jobs->all, (size_t)cap * sizeof *all);
    zt__job **queue = realloc(jobs->queue, (size_t)cap * sizeof *queue);
    if (all) jobs->all = all;
    if (queue) jobs->queue = queue;
    if (!all || !queue) return -ENOMEM;
    jobs->cap_all = cap;
  }
  jobs->all[jobs->n_all++] = job;
  return 0;
}

int zt_jobs_open(zt_jobs **out, const zt_jobs_config *cfg, char *err, size_t errlen) {
  int rc = 0;
  *out = NULL;
  if (!cfg->backend || (strcmp(cfg->backend, "cpu") != 0 && strcmp(cfg->backend, "cuda") != 0)) {
    snprintf(err, errlen, "backend '%s': expected cpu or cuda", cfg->backend ? cfg->backend : "");
    return -EINVAL;
  }
  if (!cfg->state_dir || strlen(cfg->state_dir) >= ZT__STATE_DIR_MAX) {
    snprintf(err, errlen, "state dir is missing or longer than %d bytes", ZT__STATE_DIR_MAX - 1);
    return -EINVAL;
  }
  if (cfg->n_gpus < 0 || cfg->n_gpus > ZT_JOBS_MAX_GPUS || cfg->cpu_ranks < 0 ||
      cfg->cpu_ranks > ZT_JOBS_MAX_GPUS) {
    snprintf(err, errlen, "a daemon schedules at most %d GPUs or simulated ranks",
             ZT_JOBS_MAX_GPUS);
    return -EINVAL;
  }
  zt_jobs *jobs = calloc(1, sizeof *jobs);
  if (!jobs) return -ENOMEM;
  jobs->cfg = *cfg;
  jobs->lock_fd = -1;
  jobs->next_id = 1;
  snprintf(jobs->state_dir, sizeof jobs->state_dir, "%s", cfg->state_dir);
  jobs->cfg.state_dir = jobs->state_dir;
  jobs->cfg.backend = strcmp(cfg->backend, "cuda") == 0 ? "cuda" : "cpu";
  jobs->n_dev = zt__jobs_devices(&jobs->cfg, jobs->dev);
  pthread_mutex_init(&jobs->mu, NULL);
  if ((rc = zt__store_open(jobs->state_dir, &jobs->lock_fd, err, errlen)) < 0) goto out;
  jobs->async = malloc(sizeof *jobs->async);
  if (!jobs->async) {
    rc = -ENOMEM;
    goto out;
  }
  if ((rc = uv_async_init(cfg->loop, jobs->async, zt__jobs_on_async)) < 0) {
    free(jobs->async);
    jobs->async = NULL;
    snprintf(err, errlen, "uv_async_init: %s", uv_strerror(rc));
    goto out;
  }
  jobs->async->data = jobs;
  if ((rc = zt__jobs_scan(jobs, err, errlen)) < 0) goto out;
  ZT_LOGI("job", "state dir %s: %d jobs, %d queued", jobs->state_dir, jobs->n_all,
          jobs->n_queue);
  zt__jobs_maybe_start(jobs);
out:
  if (rc < 0) {
    zt_jobs_close(jobs);
    return rc;
  }
  *out = jobs;
  return 0;
}

static void free_async(uv_handle_t *h) { free(h); }

void zt_jobs_close(zt_jobs *jobs) {
  if (!jobs) return;
  for (int i = 0; i < jobs->n_all; i++) {
    zt__job *job = jobs->all[i];
    pthread_mutex_lock(&jobs->mu);
    job->stop = ZT__STOP_ABORT;
    pthread_cond_broadcast(&job->cond);
    /* a rank waiting for another daemon's ranks would wait forever */
    zt__runner_interrupt(job, "the daemon is closing");
    pthread_mutex_unlock(&jobs->mu);
  }
  for (int i = 0; i < jobs->n_all; i++)
    if (jobs->all[i]->has_thread) pthread_join(jobs->all[i]->thread, NULL);
  while (jobs->msgs) {
    zt__msg *m = jobs->msgs;
    jobs->msgs = m->next;
    json_decref(m->obj);
    free(m);
  }
  zt__exports_close(jobs);
  for (int i = 0; i < jobs->n_all; i++) zt__job_free(jobs->all[i]);
  free(jobs->all);
  free(jobs->queue);
  jobs->all = NULL;
  jobs->queue = NULL;
  jobs->n_all = jobs->n_queue = 0;
  if (jobs->async) uv_close((uv_handle_t *)jobs->async, free_async);
  if (jobs->lock_fd >= 0) close(jobs->lock_fd);
  jobs->lock_fd = -1;
  /* tasks a worker still runs finish into nothing; the last one frees what is left */
  if (!zt__jobs_work_closed(jobs)) zt__jobs_free(jobs);
}

void zt__jobs_free(zt_jobs *jobs) {
  pthread_mutex_destroy(&jobs->mu);
  free(jobs);
}
