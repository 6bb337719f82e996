/* The registry and FIFO queue, on the loop thread: submit, list, show, cancel, batches,
 * checkpoint requests, export, shutdown; and the loop side of the runners' messages. */
#include "engine/job/jobs.h"

#include <dirent.h>
#include <stdarg.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "engine/job/internal.h"
#include "engine/job/store.h"
#include "engine/kernels/backend.h"
#include "engine/base/log.h"

/* Largest chunk zt_jobs_export_chunk reads in one call (a frame must hold it). */
#define EXPORT_CHUNK_MAX (16u << 20)

static const char *const g_state_names[] = {NULL, "queued", "running", "done", "failed",
                                            "cancelled"};

const char *zt_job_state_name(zt_job_state s) {
  return s >= ZT_JOB_QUEUED && s <= ZT_JOB_CANCELLED ? g_state_names[s] : "unknown";
}

static int state_parse(const char *s, zt_job_state *out) {
  for (int i = ZT_JOB_QUEUED; i <= ZT_JOB_CANCELLED; i++) {
    if (s && strcmp(s, g_state_names[i]) == 0) {
      *out = (zt_job_state)i;
      return 0;
    }
  }
  return -EINVAL;
}

static int is_terminal(zt_job_state s) { return s >= ZT_JOB_DONE; }

int64_t zt__now(void) { return (int64_t)time(NULL); }

json_t *zt__job_event(const zt__job *job, const char *kind) {
  return json_pack("{s:s, s:s}", "event", kind, "job", job->id);
}

void zt__job_log(const zt__job *job, zt_log_level level, const char *fmt, ...) {
  char msg[ZT__ERR_MAX + 128];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  zt_log(level, "job", "%s %s", job->id, msg);
  /* Appends are atomic per line with O_APPEND; a job log that cannot be written is not worth
   * failing the job over (the daemon's log has the line). */
  char path[ZT__JOB_DIR_MAX + 8];
  snprintf(path, sizeof path, "%s/log", job->dir);
  FILE *f = fopen(path, "ae");
  if (!f) return;
  time_t now = time(NULL);
  struct tm tm;
  char stamp[32];
  gmtime_r(&now, &tm);
  strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &tm);
  static const char *const names[] = {"error", "warn", "info", "debug"};
  fprintf(f, "%s %-5s %s\n", stamp, names[level], msg);
  fclose(f);
}

static json_t *time_or_null(int64_t t) { return t ? json_integer(t) : json_null(); }

int zt__job_write_status(zt__job *job, char *err, size_t errlen) {
  pthread_mutex_lock(&job->jobs->mu);
  json_t *st = json_pack(
      "{s:s, s:i, s:i, s:o, s:o, s:o, s:o, s:o, s:o}", "state", zt_job_state_name(job->state),
      "step", job->step, "steps", job->spec.train.steps, "loss",
      job->has_loss ? json_real(job->loss) : json_null(), "error",
      job->error[0] ? json_string(job->error) : json_null(), "created",
      time_or_null(job->created), "started", time_or_null(job->started), "ended",
      time_or_null(job->ended), "checkpoint_step",
      job->has_ckpt ? json_integer(job->ckpt_step) : json_null());
  pthread_mutex_unlock(&job->jobs->mu);
  int rc = zt__store_write_json(job->dir, "status.json", st, err, errlen);
  json_decref(st);
  return rc;
}

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

/* ---- loop side ------------------------------------------------------------------------------ */

static void emit(zt_jobs *jobs, zt__job *job, json_t *ev) {
  if (jobs->cfg.on_event) jobs->cfg.on_event(jobs->cfg.user, job->id, ev);
  json_decref(ev);
}

static zt__job *find(zt_jobs *jobs, const char *id) {
  for (int i = 0; i < jobs->n_all; i++)
    if (strcmp(jobs->all[i]->id, id) == 0) return jobs->all[i];
  return NULL;
}

static zt_job_state state_of(zt__job *job) {
  pthread_mutex_lock(&job->jobs->mu);
  zt_job_state s = job->state;
  pthread_mutex_unlock(&job->jobs->mu);
  return s;
}

static void credit(zt_jobs_done_cb done, void *owner, uint32_t queued) {
  json_t *reply = json_pack("{s:i}", "queued", (int)queued);
  done(owner, 0, reply, NULL);
  json_decref(reply);
}

/* Moves pending pushes into the ring while it has room and grants their credit. */
static void refill(zt__job *job) {
  zt_jobs *jobs = job->jobs;
  for (;;) {
    pthread_mutex_lock(&jobs->mu);
    zt__pending_push *p = job->pushes;
    if (!p || job->ring.count == job->ring.cap) {
      pthread_mutex_unlock(&jobs->mu);
      return;
    }
    zt__batch_ring_put(&job->ring, p->tokens);
    uint32_t queued = job->ring.count;
    pthread_cond_signal(&job->cond);
    job->pushes = p->next;
    if (!job->pushes) job->pushes_tail = NULL;
    pthread_mutex_unlock(&jobs->mu);
    zt_jobs_done_cb done = p->done;
    void *owner = p->owner;
    free(p->tokens);
    free(p);
    credit(done, owner, queued);
  }
}

/* Answers every pending push and checkpoint request of a job that will not serve them. */
static void fail_pending(zt__job *job, int rc, const char *message) {
  while (job->pushes) {
    zt__pending_push *p = job->pushes;
    job->pushes = p->next;
    zt_jobs_done_cb done = p->done;
    void *owner = p->owner;
    free(p->tokens);
    free(p);
    done(owner, rc, NULL, message);
  }
  job->pushes_tail = NULL;
  while (job->ckpt_requests) {
    zt__ckpt_request *q = job->ckpt_requests;
    job->ckpt_requests = q->next;
    zt_jobs_done_cb done = q->done;
    void *owner = q->owner;
    free(q);
    done(owner, rc, NULL, message);
  }
}

static void answer_checkpoints(zt__job *job, const zt__msg *m) {
  zt__ckpt_request **pp = &job->ckpt_requests;
  while (*pp) {
    zt__ckpt_request *q = *pp;
    if (q->gen > m->gen) {
      pp = &q->next;
      continue;
    }
    *pp = q->next;
    zt_jobs_done_cb done = q->done;
    void *owner = q->owner;
    free(q);
    if (m->rc < 0)
      done(owner, m->rc, NULL, m->text);
    else
      done(owner, 0, m->obj, NULL);
  }
}

static void fail_job(zt_jobs *jobs, zt__job *job, const char *error) {
  pthread_mutex_lock(&jobs->mu);
  job->state = ZT_JOB_FAILED;
  job->ended = zt__now();
  snprintf(job->error, sizeof job->error, "%s", error);
  pthread_mutex_unlock(&jobs->mu);
  char err[ZT__ERR_MAX];
  if (zt__job_write_status(job, err, sizeof err) < 0) ZT_LOGE("job", "%s: %s", job->id, err);
  zt__job_log(job, ZT_LOG_ERROR, "failed: %s", error);
  json_t *ev = zt__job_event(job, "state");
  json_object_set_new(ev, "state", json_string("failed"));
  json_object_set_new(ev, "error", json_string(error));
  emit(jobs, job, ev);
  ev = zt__job_event(job, "end");
  json_object_set_new(ev, "state", json_string("failed"));
  json_object_set_new(ev, "step", json_integer(job->step));
  json_object_set_new(ev, "error", json_string(error));
  emit(jobs, job, ev);
  char msg[ZT__ERR_MAX + 64];
  snprintf(msg, sizeof msg, "job %s failed: %s", job->id, error);
  fail_pending(job, -EINVAL, msg);
}

static int free_devices(const zt_jobs *jobs) {
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
static void start_job(zt_jobs *jobs, zt__job *job) {
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
  pthread_mutex_unlock(&jobs->mu);
  int rc = -pthread_create(&job->thread, NULL, zt__runner_main, job);
  if (rc < 0) {
    release_devices(jobs, job);
    snprintf(err, sizeof err, "cannot start the runner thread: %s", strerror(-rc));
    fail_job(jobs, job, err);
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
  emit(jobs, job, ev);
}

/* Starts queued jobs in FIFO order. The head starts when parallel.gpus devices are free (it
 * takes the first free ones) and its host memory fits beside the running jobs'; nothing
 * overtakes a head that waits, so narrow jobs cannot starve a wide one (they queue behind it
 * instead of filling the devices it waits for). The machine is checked again here because a
 * job queued before a restart was validated by another daemon (its files may be gone, the
 * daemon may own fewer devices). */
static void maybe_start(zt_jobs *jobs) {
  while (!jobs->shutting_down && jobs->n_queue > 0) {
    zt__job *job = jobs->queue[0];
    char err[ZT__ERR_MAX];
    int rc;
    /* a job wider than the device set is failed by the check rather than waiting forever */
    if (job->spec.gpus <= jobs->n_dev && free_devices(jobs) < job->spec.gpus) return;
    if (!job->has_needs) {
      rc = zt__job_spec_check_resources(&job->spec, &jobs->cfg, &job->needs, err, sizeof err);
      if (rc < 0) {
        memmove(jobs->queue, jobs->queue + 1, (size_t)(--jobs->n_queue) * sizeof *jobs->queue);
        fail_job(jobs, job, err);
        continue;
      }
      job->has_needs = 1;
    }
    /* alone it fits (admission checked that); beside others it waits for them */
    const char *what;
    double cap = zt__jobs_host_limit(&jobs->cfg, &what);
    if (jobs->running > 0 && cap > 0 && host_in_use(jobs) + (double)job->needs.host_bytes > cap)
      return;
    memmove(jobs->queue, jobs->queue + 1, (size_t)(--jobs->n_queue) * sizeof *jobs->queue);
    start_job(jobs, job);
  }
}

static void check_shutdown(zt_jobs *jobs) {
  if (jobs->shutting_down && jobs->running == 0 && !jobs->shutdown_notified) {
    jobs->shutdown_notified = 1;
    if (jobs->shutdown_done) jobs->shutdown_done(jobs->shutdown_user);
  }
}

static void on_async(uv_async_t *h) {
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
      emit(jobs, job, m->obj);
      m->obj = NULL;
      break;
    case ZT__MSG_CONSUMED:
      refill(job);
      break;
    case ZT__MSG_CHECKPOINT:
      answer_checkpoints(job, m);
      break;
    case ZT__MSG_EXIT: {
      pthread_join(job->thread, NULL);
      job->has_thread = 0;
      jobs->running--;
      release_devices(jobs, job);
      zt_job_state s = state_of(job);
      char msg[ZT__ERR_MAX];
      if (is_terminal(s)) {
        snprintf(msg, sizeof msg, "job %s is %s", job->id, zt_job_state_name(s));
        fail_pending(job, -EINVAL, msg);
      } else {
        snprintf(msg, sizeof msg, "job %s stopped: the daemon is shutting down", job->id);
        fail_pending(job, -ESHUTDOWN, msg);
      }
      break;
    }
    }
    json_decref(m->obj);
    free(m);
    m = next;
  }
  maybe_start(jobs);
  check_shutdown(jobs);
}

/* ---- jobs ----------------------------------------------------------------------------------- */

static void job_free(zt__job *job) {
  json_decref(job->memory);
  while (job->pushes) {
    zt__pending_push *p = job->pushes;
    job->pushes = p->next;
    free(p->tokens);
    free(p);
  }
  while (job->ckpt_requests) {
    zt__ckpt_request *q = job->ckpt_requests;
    job->ckpt_requests = q->next;
    free(q);
  }
  zt__batch_ring_free(&job->ring);
  pthread_cond_destroy(&job->cond);
  json_decref(job->spec_json);
  free(job);
}

static int job_new(zt_jobs *jobs, const char *id, const zt_job_spec *spec, zt__job **out) {
  zt__job *job = calloc(1, sizeof *job);
  if (!job) return -ENOMEM;
  job->jobs = jobs;
  snprintf(job->id, sizeof job->id, "%s", id);
  snprintf(job->dir, sizeof job->dir, "%s/jobs/%s", jobs->state_dir, id);
  job->spec = *spec;
  job->micro_tokens =
      (size_t)spec->train.micro_batch * ((size_t)spec->model.seq_len + 1);
  pthread_cond_init(&job->cond, NULL);
  job->spec_json = zt__job_spec_to_json(spec);
  int rc = job->spec_json ? 0 : -ENOMEM;
  if (rc == 0 && spec->source == ZT_DATA_STREAM) {
    uint32_t depth = jobs->cfg.batch_queue_depth ? jobs->cfg.batch_queue_depth : 1;
    rc = zt__batch_ring_init(&job->ring, depth, job->micro_tokens);
  }
  if (rc < 0) {
    job_free(job);
    return rc;
  }
  *out = job;
  return 0;
}

static int add_job(zt_jobs *jobs, zt__job *job) {
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

/* Queue capacity equals the registry's, so enqueueing a registered job cannot fail. */
static void enqueue(zt_jobs *jobs, zt__job *job) { jobs->queue[jobs->n_queue++] = job; }

static int64_t status_time(const json_t *st, const char *key) {
  const json_t *v = json_object_get(st, key);
  return json_is_integer(v) ? (int64_t)json_integer_value(v) : 0;
}

/* Loads jobs/<id>/; a job whose files cannot be read is skipped with a warning (its id still
 * counts, so it is never reused). */
static int load_job(zt_jobs *jobs, const char *id) {
  char dir[ZT__JOB_DIR_MAX], err[ZT__ERR_MAX];
  zt_job_spec spec;
  zt__job *job = NULL;
  json_t *sj = NULL, *st = NULL;
  int rc = 0;
  snprintf(dir, sizeof dir, "%s/jobs/%s", jobs->state_dir, id);
  if (!(sj = zt__store_read_json(dir, "spec.json", err, sizeof err)) ||
      zt__job_spec_parse(sj, &spec, err, sizeof err) < 0 ||
      !(st = zt__store_read_json(dir, "status.json", err, sizeof err))) {
    ZT_LOGW("job", "skipping %s: %s", dir, err);
    goto out;
  }
  zt_job_state state;
  if (state_parse(json_string_value(json_object_get(st, "state")), &state) < 0) {
    ZT_LOGW("job", "skipping %s: status.json has no valid state", dir);
    goto out;
  }
  if ((rc = job_new(jobs, id, &spec, &job)) < 0) goto out;
  /* A runner that never ended (the daemon was killed) left its NVMe files: they take the space
   * the job needs to start again. */
  char nvme_dir[ZT_PATH_MAX];
  int swept = zt__store_nvme_sweep(dir, id, nvme_dir, sizeof nvme_dir, err, sizeof err);
  if (swept < 0) ZT_LOGW("job", "%s: NVMe files of an interrupted run: %s", id, err);
  if (swept > 0) zt__job_log(job, ZT_LOG_INFO, "removed %s, left by the interrupted run", nvme_dir);
  job->state = state;
  const json_t *v;
  if (json_is_integer(v = json_object_get(st, "step"))) job->step = (int)json_integer_value(v);
  if (json_is_number(v = json_object_get(st, "loss"))) {
    job->has_loss = 1;
    job->loss = json_number_value(v);
  }
  if (json_is_string(v = json_object_get(st, "error")))
    snprintf(job->error, sizeof job->error, "%s", json_string_value(v));
  if (json_is_integer(v = json_object_get(st, "checkpoint_step"))) {
    job->has_ckpt = 1;
    job->ckpt_step = (int)json_integer_value(v);
  }
  job->created = status_time(st, "created");
  job->started = status_time(st, "started");
  job->ended = status_time(st, "ended");
  if ((rc = add_job(jobs, job)) < 0) goto out;
  zt__job *added = job;
  job = NULL;
  char why[ZT__ERR_MAX];
  json_t *part = zt__store_read_json(dir, "part.json", why, sizeof why);
  if (part) {
    added->part.member = 1;
    added->part.rank0 = (int)json_integer_value(json_object_get(part, "rank0"));
    snprintf(added->part.coordinator, sizeof added->part.coordinator, "%s",
             json_string_value(json_object_get(part, "coordinator")) ?: "?");
    json_decref(part);
  }
  if ((state == ZT_JOB_RUNNING || state == ZT_JOB_QUEUED) && added->part.member) {
    fail_job(jobs, added, "interrupted by daemon restart; a part runs only while its "
             "coordinator holds it: the coordinator starts a new part when the job resumes");
  } else if (state == ZT_JOB_RUNNING && spec.source == ZT_DATA_STREAM) {
    fail_job(jobs, added, "interrupted by daemon restart; stream data cannot be replayed");
  } else if (state == ZT_JOB_RUNNING || state == ZT_JOB_QUEUED) {
    added->state = ZT_JOB_QUEUED;
    enqueue(jobs, added);
  }
out:
  if (job) job_free(job);
  json_decref(sj);
  json_decref(st);
  return rc;
}

static int cmp_id(const void *a, const void *b) {
  long x = atol(*(char *const *)a + 1), y = atol(*(char *const *)b + 1);
  return (x > y) - (x < y);
}

static int is_job_id(const char *s) {
  size_t n = strlen(s);
  return s[0] == 'j' && n >= 7 && n < 16 && strspn(s + 1, "0123456789") == n - 1;
}

static int scan(zt_jobs *jobs, char *err, size_t errlen) {
  char path[ZT__JOB_DIR_MAX];
  char **ids = NULL;
  int n = 0, cap = 0, rc = 0;
  snprintf(path, sizeof path, "%s/jobs", jobs->state_dir);
  DIR *d = opendir(path);
  if (!d) {
    rc = -errno;
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return rc;
  }
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!is_job_id(e->d_name)) continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 64;
      char **nids = realloc(ids, (size_t)cap * sizeof *ids);
      if (!nids) {
        rc = -ENOMEM;
        goto out;
      }
      ids = nids;
    }
    if (!(ids[n] = strdup(e->d_name))) {
      rc = -ENOMEM;
      goto out;
    }
    n++;
  }
  if (n) qsort(ids, (size_t)n, sizeof *ids, cmp_id);
  for (int i = 0; i < n && rc == 0; i++) {
    long num = atol(ids[i] + 1);
    if (num >= jobs->next_id) jobs->next_id = num + 1;
    rc = load_job(jobs, ids[i]);
  }
  if (rc < 0) snprintf(err, errlen, "%s: %s", path, strerror(-rc));
out:
  closedir(d);
  for (int i = 0; i < n; i++) free(ids[i]);
  free(ids);
  return rc;
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
  if ((rc = uv_async_init(cfg->loop, jobs->async, on_async)) < 0) {
    free(jobs->async);
    jobs->async = NULL;
    snprintf(err, errlen, "uv_async_init: %s", uv_strerror(rc));
    goto out;
  }
  jobs->async->data = jobs;
  if ((rc = scan(jobs, err, errlen)) < 0) goto out;
  ZT_LOGI("job", "state dir %s: %d jobs, %d queued", jobs->state_dir, jobs->n_all,
          jobs->n_queue);
  maybe_start(jobs);
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
  for (int i = 0; i < jobs->n_all; i++) job_free(jobs->all[i]);
  free(jobs->all);
  free(jobs->queue);
  if (jobs->async) uv_close((uv_handle_t *)jobs->async, free_async);
  if (jobs->lock_fd >= 0) close(jobs->lock_fd);
  pthread_mutex_destroy(&jobs->mu);
  free(jobs);
}

static json_int_t mem_int(const json_t *o, const char *key) {
  return json_integer_value(json_object_get(o, key));
}

/* The daemon's memory figures from what the runners published (job->memory, under mu): per
 * device of the set, what running jobs have allocated and reserved on it now and the highest
 * any job's allocations there reached since the daemon started (a device holds one job at a
 * time), with the driver's total and free on cuda; on the host, what running jobs pin, their
 * allocations on the cpu backend (host memory) and the limit jobs are admitted against. */
static int add_memory_figures(zt_jobs *jobs, json_t *mem) {
  int cuda = strcmp(jobs->cfg.backend, "cuda") == 0, n_info = 0;
  zt_device_info info[ZT_MAX_DEVICES];
  if (cuda) n_info = zt_backend_cuda_devices(info, ZT_MAX_DEVICES);
  json_int_t alloc[ZT_JOBS_MAX_GPUS] = {0}, peak[ZT_JOBS_MAX_GPUS] = {0},
             reserved[ZT_JOBS_MAX_GPUS] = {0}, pinned = 0, host_alloc = 0;
  pthread_mutex_lock(&jobs->mu);
  for (int i = 0; i < jobs->n_all; i++) {
    const json_t *m = jobs->all[i]->memory;
    int running = jobs->all[i]->state == ZT_JOB_RUNNING;
    if (!m) continue;
    if (running) pinned += mem_int(m, "host_pinned");
    if (running && !cuda) host_alloc += mem_int(m, "allocated");
    size_t k;
    const json_t *d;
    json_array_foreach(json_object_get(m, "devices"), k, d) {
      for (int j = 0; j < jobs->n_dev; j++) {
        if (jobs->dev[j] != mem_int(d, "device")) continue;
        if (running) alloc[j] += mem_int(d, "allocated");
        if (running) reserved[j] += mem_int(d, "reserved");
        if (mem_int(d, "peak") > peak[j]) peak[j] = mem_int(d, "peak");
      }
    }
  }
  pthread_mutex_unlock(&jobs->mu);
  json_t *devs = json_array();
  for (int j = 0; devs && j < jobs->n_dev; j++) {
    json_t *d = json_pack("{s:i, s:s, s:I, s:I, s:I}", "device", jobs->dev[j], "kind",
                          cuda ? "cuda" : "cpu", "allocated", alloc[j], "peak", peak[j],
                          "reserved", reserved[j]);
    if (d && cuda && jobs->dev[j] < n_info && jobs->dev[j] < ZT_MAX_DEVICES) {
      json_object_set_new(d, "total", json_integer((json_int_t)info[jobs->dev[j]].mem_total));
      json_object_set_new(d, "free", json_integer((json_int_t)info[jobs->dev[j]].mem_free));
    }
    if (json_array_append_new(devs, d) < 0) {
      json_decref(devs);
      devs = NULL;
    }
  }
  const char *what;
  json_t *host = json_pack("{s:I, s:I, s:I}", "pinned", pinned, "allocated", host_alloc, "limit",
                           (json_int_t)zt__jobs_host_limit(&jobs->cfg, &what));
  if (!devs || !host) {
    json_decref(devs);
    json_decref(host);
    return -ENOMEM;
  }
  /* both calls run: each takes its reference */
  return json_object_set_new(mem, "devices", devs) | json_object_set_new(mem, "host", host)
             ? -ENOMEM : 0;
}

json_t *zt_jobs_status(zt_jobs *jobs) {
  size_t bytes = 0;
  pthread_mutex_lock(&jobs->mu);
  for (int i = 0; i < jobs->n_all; i++)
    if (jobs->all[i]->state == ZT_JOB_RUNNING) bytes += jobs->all[i]->backend_bytes;
  pthread_mutex_unlock(&jobs->mu);
  json_t *gpus = json_array();
  for (int i = 0; gpus && i < jobs->n_dev; i++) {
    const zt__job *h = jobs->holder[i];
    if (json_array_append_new(gpus, json_pack("{s:i, s:o}", "index", jobs->dev[i], "job",
                                              h ? json_string(h->id) : json_null())) < 0) {
      json_decref(gpus);
      gpus = NULL;
    }
  }
  if (!gpus) return NULL;
  json_t *st = json_pack("{s:i, s:i, s:i, s:{s:s, s:I, s:I}, s:o}", "queued", jobs->n_queue,
                         "running", jobs->running, "jobs", jobs->n_all, "memory", "backend",
                         jobs->cfg.backend, "backend_bytes", (json_int_t)bytes, "host_mem_limit",
                         (json_int_t)jobs->cfg.host_mem_limit, "gpus", gpus);
  if (st && add_memory_figures(jobs, json_object_get(st, "memory")) < 0) {
    json_decref(st);
    return NULL;
  }
  return st;
}

/* The devices a running job holds, [] otherwise. */
static json_t *held_json(const zt__job *job) {
  json_t *a = json_array();
  for (int i = 0; a && i < job->n_held; i++)
    if (json_array_append_new(a, json_integer(job->held[i])) < 0) {
      json_decref(a);
      return NULL;
    }
  return a;
}

/* "activation_checkpointing": {"every": "auto"} without offload (or with several ranks and no
 * gpu_budget): the least recompute that fits the device (the offload planner decides it with
 * its plan otherwise). No checkpointing first,
 * then the fewest blocks recomputed (every L blocks recomputes 1, every L-1 2, ... every 1 all
 * L); the job is refused with the numbers of every block recomputed when even that does not
 * fit. The stored spec records the choice, so a restart runs the same. */
static int resolve_auto_ckpt(zt_jobs *jobs, zt_job_spec *spec, zt__job_needs *needs, char *err,
                             size_t errlen) {
  int L = spec->model.n_layers, rc = 0;
  for (int i = 0; i <= L; i++) {
    spec->train.ckpt_every = i == 0 ? 0 : L + 1 - i;
    rc = zt__job_spec_check_resources(spec, &jobs->cfg, needs, err, errlen);
    if (rc != -ENOMEM) return rc;
  }
  return rc;
}

/* What submit and plan share: the operator's defaults filled in, the spec validated and sized
 * against this daemon's backend and limits. */
static int admit(zt_jobs *jobs, const json_t *spec_in, zt_job_spec *spec, zt__job_needs *needs,
                 char *err, size_t errlen) {
  /* The operator's --nvme-dir is where an offloaded job keeps its NVMe tier unless the spec
   * names a directory; the stored spec records the one used. */
  json_t *filled = NULL;
  const json_t *off = json_is_object(spec_in) ? json_object_get(spec_in, "offload") : NULL;
  if (jobs->cfg.nvme_dir && json_is_object(off) && !json_object_get(off, "nvme_dir")) {
    filled = json_deep_copy(spec_in);
    if (!filled) {
      snprintf(err, errlen, "out of memory");
      return -ENOMEM;
    }
    json_object_set_new(json_object_get(filled, "offload"), "nvme_dir",
                        json_string(jobs->cfg.nvme_dir));
    spec_in = filled;
  }
  int rc = zt__job_spec_parse(spec_in, spec, err, errlen);
  json_decref(filled);
  if (rc < 0) return rc;
  /* the stored spec records the count, so that a restart resumes the same split of the data */
  if (spec->gpus == ZT_JOB_GPUS_ALL) spec->gpus = jobs->n_dev;
  if ((rc = zt__job_resolve_dp_offload(spec, zt_backend_ops_of(jobs->cfg.backend), err,
                                       errlen)) < 0)
    return rc;
  /* an offloaded job of one rank has it from its planner, of several from its gpu_budget
   * (zt__job_resolve_dp_offload) */
  if ((!spec->has_offload || zt__job_world(spec) > 1) && spec->train.ckpt_every == ZT_CKPT_AUTO)
    return resolve_auto_ckpt(jobs, spec, needs, err, errlen);
  return zt__job_spec_check_resources(spec, &jobs->cfg, needs, err, errlen);
}

json_t *zt_jobs_plan(zt_jobs *jobs, const json_t *spec_in, int *rc, char *err, size_t errlen) {
  zt_job_spec spec;
  zt__job_needs needs = {0};
  zt_model *m = NULL;
  if ((*rc = admit(jobs, spec_in, &spec, &needs, err, errlen)) < 0 ||
      (*rc = zt_model_create(&m, &spec.model, err, errlen)) < 0)
    return NULL;
  json_t *ranks = json_array();
  for (int i = 0; ranks && i < zt__job_world(&spec); i++)
    if (json_array_append_new(ranks, json_integer((json_int_t)needs.rank_bytes)) < 0) {
      json_decref(ranks);
      ranks = NULL;
    }
  json_t *j = ranks ? json_pack("{s:s, s:s, s:I, s:I, s:{s:i, s:i, s:o}}", "backend",
                                jobs->cfg.backend, "arch", zt_arch_name(spec.model.arch),
                                "params", (json_int_t)zt_model_num_params(m), "backend_bytes",
                                (json_int_t)needs.backend_bytes, "parallel", "gpus", spec.gpus,
                                "zero_stage", spec.zero_stage, "rank_bytes", ranks)
                    : NULL;
  json_t *par = json_object_get(j, "parallel");
  if (par) json_object_set_new(par, "world", json_integer(zt__job_world(&spec)));
  if (par && spec.n_peers) {
    json_t *peers = json_array();
    for (int i = 0; peers && i < spec.n_peers; i++)
      json_array_append_new(peers, json_string(spec.peers[i]));
    json_object_set_new(par, "peers", peers);
  }
  int units = zt_model_num_units(m);
  zt_model_destroy(m);
  zt_offload_plan p;
  if (j && spec.has_offload && zt__job_world(&spec) > 1) {
    /* each rank's placement as resolved (engine/job/dp_placement.c) */
    zt_train_cfg tc = zt__job_rank_train_cfg(&spec);
    zt_dp_cfg dc = zt__job_dp_cfg(&spec, 0, 0);
    json_object_set_new(
        j, "offload",
        json_pack("{s:s, s:s, s:i, s:i, s:i, s:I, s:I, s:I}", "optimizer",
                  zt_offload_place_name(dc.optimizer), "params",
                  zt_offload_place_name(dc.params), "units", units, "gpu_units",
                  dc.optimizer == ZT_PLACE_HOST || dc.optimizer == ZT_PLACE_NVME ? dc.gpu_units
                                                                                 : units,
                  "ckpt_every", tc.ckpt_every, "host_bytes_per_rank",
                  (json_int_t)zt_dp_estimate_host_bytes(&spec.model, &tc, &dc),
                  "device_bytes_per_rank", (json_int_t)needs.rank_bytes, "nvme_bytes_per_rank",
                  (json_int_t)zt_dp_estimate_nvme_bytes(&spec.model, &tc, &dc)));
  } else if (j && spec.has_offload &&
      zt_offload_estimate(&spec.model, &spec.train, &spec.offload,
                          zt_backend_ops_of(jobs->cfg.backend), &p, err, errlen) == 0)
    json_object_set_new(
        j, "offload",
        json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:i, s:i, s:i, s:i, s:i, s:s, s:s, s:I, s:f, "
                  "s:I, s:I, s:I}",
                  "host_bytes",
                  (json_int_t)p.host_bytes, "device_bytes", (json_int_t)p.device_bytes,
                  "nvme_bytes", (json_int_t)p.nvme_bytes, "act_bytes", (json_int_t)p.act_bytes,
                  "gpu_unit_bytes", (json_int_t)p.gpu_unit_bytes, "arena_bytes",
                  (json_int_t)p.arena_bytes, "units", p.units, "gpu_units", p.gpu_units,
                  "host_units", p.host_units, "grad_slots", p.grad_slots,
                  "ckpt_every", p.ckpt_every, "params", zt_offload_place_name(p.params),
                  "grads", zt_offload_place_name(p.grads), "dsum_bytes", (json_int_t)p.dsum_bytes,
                  "est_step_s", p.est_step_s, "h2d_bytes", (json_int_t)p.h2d_bytes,
                  "d2h_bytes", (json_int_t)p.d2h_bytes, "nvme_step_bytes",
                  (json_int_t)p.nvme_step_bytes));
  if (!j) {
    *rc = -ENOMEM;
    snprintf(err, errlen, "out of memory");
  }
  return j;
}

/* A new job in the registry: the next id, jobs/<id>/ with its checkpoints directory, spec.json,
 * part.json for a part, status.json ("queued"). On failure nothing is left but a consumed id
 * (taken once its directory exists). */
static int create_job(zt_jobs *jobs, const zt_job_spec *spec, const zt__job_part *part,
                      zt__job **out, char *err, size_t errlen) {
  zt__job *job = NULL;
  json_t *pj = NULL;
  int rc, made_dir = 0;
  char new_id[ZT_JOB_ID_MAX];
  snprintf(new_id, sizeof new_id, "j%06ld", jobs->next_id);
  if ((rc = job_new(jobs, new_id, spec, &job)) < 0) {
    snprintf(err, errlen, "out of memory");
    return rc;
  }
  job->state = ZT_JOB_QUEUED;
  job->created = zt__now();
  if (part) {
    job->part = *part;
    pj = json_pack("{s:i, s:i, s:s}", "rank0", part->rank0, "resume_step", part->resume_step,
                   "coordinator", part->coordinator);
    if (!pj) {
      rc = -ENOMEM;
      snprintf(err, errlen, "out of memory");
      goto out;
    }
  }
  char ckdir[ZT__JOB_DIR_MAX + 16];
  snprintf(ckdir, sizeof ckdir, "%s/checkpoints", job->dir);
  if (mkdir(job->dir, 0755) != 0 || (made_dir = 1, mkdir(ckdir, 0755) != 0)) {
    rc = -errno;
    snprintf(err, errlen, "%s: %s", job->dir, strerror(errno));
    goto out;
  }
  /* The id is taken once its directory exists, even if writing it fails below. */
  jobs->next_id++;
  if ((rc = zt__store_write_json(job->dir, "spec.json", job->spec_json, err, errlen)) < 0 ||
      (pj && (rc = zt__store_write_json(job->dir, "part.json", pj, err, errlen)) < 0) ||
      (rc = zt__job_write_status(job, err, errlen)) < 0)
    goto out;
  if ((rc = add_job(jobs, job)) < 0) {
    snprintf(err, errlen, "out of memory");
    goto out;
  }
  *out = job;
  job = NULL;
out:
  json_decref(pj);
  if (job) {
    if (made_dir) zt__store_remove_tree(job->dir);
    job_free(job);
  }
  return rc;
}

int zt_jobs_submit(zt_jobs *jobs, const json_t *spec_in, char id[ZT_JOB_ID_MAX], char *err,
                   size_t errlen) {
  zt_job_spec spec;
  zt__job *job;
  zt__job_needs needs;
  int rc;
  if (jobs->shutting_down) {
    snprintf(err, errlen, "the daemon is shutting down");
    return -ESHUTDOWN;
  }
  if ((rc = admit(jobs, spec_in, &spec, &needs, err, errlen)) < 0 ||
      (rc = create_job(jobs, &spec, NULL, &job, err, errlen)) < 0)
    return rc;
  snprintf(id, ZT_JOB_ID_MAX, "%s", job->id);
  enqueue(jobs, job);
  zt__job_log(job, ZT_LOG_INFO, "queued%s%s", spec.name[0] ? ": " : "", spec.name);
  maybe_start(jobs);
  return 0;
}

/* The join request's "part": {"world", "rank0", "nccl_id", "resume_step", "coordinator"}. */
static int parse_part(const json_t *p, const zt_job_spec *spec, zt__job_part *out, char *err,
                      size_t errlen) {
  const json_t *w = json_object_get(p, "world"), *r0 = json_object_get(p, "rank0");
  const json_t *rs = json_object_get(p, "resume_step");
  const char *id = json_string_value(json_object_get(p, "nccl_id"));
  const char *co = json_string_value(json_object_get(p, "coordinator"));
  int W = zt__job_world(spec), G = spec->gpus;
  if (!json_is_object(p) || !json_is_integer(w) || json_integer_value(w) != W) {
    snprintf(err, errlen, "part.world must be the spec's %d ranks (parallel.gpus %d on each of "
             "%d daemons)", W, G, 1 + spec->n_peers);
    return -EINVAL;
  }
  json_int_t rank0 = json_is_integer(r0) ? json_integer_value(r0) : -1;
  if (rank0 < G || rank0 % G != 0 || rank0 + G > W) {
    snprintf(err, errlen, "part.rank0 must be a multiple of parallel.gpus %d in [%d, %d] (rank "
             "0's GPUs are the coordinator's)", G, G, W - G);
    return -EINVAL;
  }
  if (!id || strlen(id) != sizeof out->nccl_id - 1 || strspn(id, "0123456789abcdef") != strlen(id)) {
    snprintf(err, errlen, "part.nccl_id must be %zu lowercase hex digits (the NCCL group's id)",
             sizeof out->nccl_id - 1);
    return -EINVAL;
  }
  if (!json_is_integer(rs) || json_integer_value(rs) < 0 ||
      json_integer_value(rs) > spec->train.steps) {
    snprintf(err, errlen, "part.resume_step must be an integer in [0, train.steps %d]",
             spec->train.steps);
    return -EINVAL;
  }
  if (!co || !co[0] || strlen(co) >= sizeof out->coordinator) {
    snprintf(err, errlen, "part.coordinator must name the coordinator in 1 to %zu characters",
             sizeof out->coordinator - 1);
    return -EINVAL;
  }
  *out = (zt__job_part){.member = 1, .rank0 = (int)rank0, .resume_step = (int)json_integer_value(rs)};
  memcpy(out->nccl_id, id, sizeof out->nccl_id);
  snprintf(out->coordinator, sizeof out->coordinator, "%s", co);
  return 0;
}

int zt_jobs_join(zt_jobs *jobs, const json_t *spec_in, const json_t *part_in, void *owner,
                 char id[ZT_JOB_ID_MAX], char *err, size_t errlen) {
  zt_job_spec spec;
  zt__job_part part;
  zt__job_needs needs;
  zt__job *job;
  int rc;
  if (jobs->shutting_down) {
    snprintf(err, errlen, "the daemon is shutting down");
    return -ESHUTDOWN;
  }
  /* the request's shape first, then what this daemon can do */
  if ((rc = zt__job_spec_parse(spec_in, &spec, err, errlen)) < 0) return rc;
  if (spec.n_peers == 0) {
    snprintf(err, errlen, "join: the spec has no parallel.peers: it is not a job spanning daemons");
    return -EINVAL;
  }
  if ((rc = parse_part(part_in, &spec, &part, err, errlen)) < 0 ||
      (rc = admit(jobs, spec_in, &spec, &needs, err, errlen)) < 0)
    return rc;
  /* the coordinator waits for every part: one that cannot start now is refused, not queued */
  int free_now = free_devices(jobs);
  if (free_now < spec.gpus) {
    snprintf(err, errlen, "busy: %d of this daemon's %d GPUs are free, the part needs %d",
             free_now, jobs->n_dev, spec.gpus);
    return -EBUSY;
  }
  part.owner = owner;
  if ((rc = create_job(jobs, &spec, &part, &job, err, errlen)) < 0) return rc;
  job->needs = needs;
  job->has_needs = 1;
  snprintf(id, ZT_JOB_ID_MAX, "%s", job->id);
  zt__job_log(job, ZT_LOG_INFO, "joined %s as ranks %d..%d of %d", part.coordinator,
              part.rank0, part.rank0 + spec.gpus - 1, zt__job_world(&spec));
  start_job(jobs, job);
  return 0;
}

static json_t *loss_or_null(const zt__job *job) {
  return job->has_loss ? json_real(job->loss) : json_null();
}

json_t *zt_jobs_list(zt_jobs *jobs) {
  json_t *arr = json_array();
  pthread_mutex_lock(&jobs->mu);
  for (int i = 0; i < jobs->n_all; i++) {
    zt__job *job = jobs->all[i];
    json_array_append_new(
        arr, json_pack("{s:s, s:s, s:s, s:s, s:i, s:i, s:o, s:o, s:o}", "job", job->id, "name",
                       job->spec.name, "state", zt_job_state_name(job->state), "arch",
                       zt_arch_name(job->spec.model.arch), "step", job->step, "steps",
                       job->spec.train.steps, "loss", loss_or_null(job), "created",
                       time_or_null(job->created), "gpus", held_json(job)));
  }
  pthread_mutex_unlock(&jobs->mu);
  return json_pack("{s:o}", "jobs", arr);
}

json_t *zt_jobs_show(zt_jobs *jobs, const char *id, int *rc, char *err, size_t errlen) {
  zt__job *job = find(jobs, id);
  if (!job) {
    *rc = -ENOENT;
    snprintf(err, errlen, "no job %s", id);
    return NULL;
  }
  pthread_mutex_lock(&jobs->mu);
  json_t *j = json_pack(
      "{s:s, s:s, s:s, s:s, s:O, s:i, s:i, s:o, s:f, s:o, s:o, s:o, s:o, s:{s:s, s:I}}",
      "job", job->id, "name", job->spec.name, "state", zt_job_state_name(job->state), "arch",
      zt_arch_name(job->spec.model.arch), "spec", job->spec_json, "step", job->step, "steps",
      job->spec.train.steps, "loss", loss_or_null(job), "tokens_per_s", job->tokens_per_s,
      "created",
      time_or_null(job->created), "started", time_or_null(job->started), "ended",
      time_or_null(job->ended), "checkpoint_step",
      job->has_ckpt ? json_integer(job->ckpt_step) : json_null(), "memory", "backend",
      jobs->cfg.backend, "backend_bytes", (json_int_t)(job->state == ZT_JOB_RUNNING ? job->backend_bytes : 0));
  /* What its runner last measured (per tier when it is offloaded): a running job's allocations;
   * an ended one's, 0 unless it leaked, with its peaks. */
  if (j && job->memory) json_object_set(j, "memory", job->memory);
  /* "error" only on a failed job, as in the "end" event. */
  if (j && job->error[0]) json_object_set_new(j, "error", json_string(job->error));
  if (j) json_object_set_new(j, "gpus", held_json(job));
  if (j && job->part.member)
    json_object_set_new(j, "part", json_pack("{s:s, s:i, s:i, s:i}", "coordinator",
                                             job->part.coordinator, "rank0", job->part.rank0,
                                             "ranks", job->spec.gpus, "world",
                                             zt__job_world(&job->spec)));
  pthread_mutex_unlock(&jobs->mu);
  if (!j) {
    *rc = -ENOMEM;
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  json_object_set_new(j, "losses", zt__store_losses_read(job->dir));
  *rc = 0;
  return j;
}

int zt_jobs_cancel(zt_jobs *jobs, const char *id, char *err, size_t errlen) {
  zt__job *job = find(jobs, id);
  if (!job) {
    snprintf(err, errlen, "no job %s", id);
    return -ENOENT;
  }
  zt_job_state s = state_of(job);
  if (is_terminal(s)) {
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
  json_t *ev = zt__job_event(job, "state");
  json_object_set_new(ev, "state", json_string("cancelled"));
  emit(jobs, job, ev);
  ev = zt__job_event(job, "end");
  json_object_set_new(ev, "state", json_string("cancelled"));
  json_object_set_new(ev, "step", json_integer(job->step));
  emit(jobs, job, ev);
  char msg[ZT__ERR_MAX];
  snprintf(msg, sizeof msg, "job %s is cancelled", id);
  fail_pending(job, -EINVAL, msg);
  /* it may have been the head that the others waited behind */
  maybe_start(jobs);
  return rc;
}

int zt_jobs_push_batch(zt_jobs *jobs, const char *id, const int32_t *tokens, size_t n_tokens,
                       zt_jobs_done_cb done, void *owner, char *err, size_t errlen) {
  zt__job *job = find(jobs, id);
  if (!job) {
    snprintf(err, errlen, "no job %s", id);
    return -ENOENT;
  }
  if (job->spec.source != ZT_DATA_STREAM) {
    snprintf(err, errlen, "job %s reads its data from a file; it takes no batches", id);
    return -EINVAL;
  }
  zt_job_state s = state_of(job);
  if (is_terminal(s)) {
    snprintf(err, errlen, "job %s is %s", id, zt_job_state_name(s));
    return -EINVAL;
  }
  if (jobs->shutting_down) {
    snprintf(err, errlen, "the daemon is shutting down");
    return -ESHUTDOWN;
  }
  if (n_tokens != job->micro_tokens) {
    snprintf(err, errlen, "batch has %zu tokens; job %s takes micro_batch*(seq_len+1) = %zu",
             n_tokens, id, job->micro_tokens);
    return -EINVAL;
  }
  /* A bad token would fail the job inside the trainer; refuse it here instead. */
  for (size_t i = 0; i < n_tokens; i++) {
    if (tokens[i] < 0 || tokens[i] >= job->spec.model.vocab) {
      snprintf(err, errlen, "batch token %d at index %zu is outside [0, model.vocab %d)",
               tokens[i], i, job->spec.model.vocab);
      return -EINVAL;
    }
  }
  pthread_mutex_lock(&jobs->mu);
  if (!job->pushes && job->ring.count < job->ring.cap) {
    zt__batch_ring_put(&job->ring, tokens);
    uint32_t queued = job->ring.count;
    pthread_cond_signal(&job->cond);
    pthread_mutex_unlock(&jobs->mu);
    credit(done, owner, queued);
    return 0;
  }
  pthread_mutex_unlock(&jobs->mu);
  zt__pending_push *p = calloc(1, sizeof *p);
  int32_t *copy = malloc(n_tokens * sizeof *copy);
  if (!p || !copy) {
    free(p);
    free(copy);
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  memcpy(copy, tokens, n_tokens * sizeof *copy);
  p->tokens = copy;
  p->done = done;
  p->owner = owner;
  if (job->pushes_tail)
    job->pushes_tail->next = p;
  else
    job->pushes = p;
  job->pushes_tail = p;
  return 0;
}

int zt_jobs_checkpoint(zt_jobs *jobs, const char *id, zt_jobs_done_cb done, void *owner,
                       char *err, size_t errlen) {
  zt__job *job = find(jobs, id);
  if (!job) {
    snprintf(err, errlen, "no job %s", id);
    return -ENOENT;
  }
  zt_job_state s = state_of(job);
  if (s != ZT_JOB_RUNNING || !job->has_thread) {
    snprintf(err, errlen, "job %s is %s; only a running job checkpoints", id,
             zt_job_state_name(s));
    return -EINVAL;
  }
  zt__ckpt_request *q = calloc(1, sizeof *q);
  if (!q) {
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  q->done = done;
  q->owner = owner;
  pthread_mutex_lock(&jobs->mu);
  q->gen = ++job->ckpt_requested;
  pthread_cond_broadcast(&job->cond);
  pthread_mutex_unlock(&jobs->mu);
  q->next = job->ckpt_requests;
  job->ckpt_requests = q;
  return 0;
}

void zt_jobs_forget(zt_jobs *jobs, void *owner) {
  /* a part whose coordinator's connection closed cannot meet the other ranks again */
  pthread_mutex_lock(&jobs->mu);
  for (int i = 0; i < jobs->n_all; i++) {
    zt__job *job = jobs->all[i];
    if (!job->part.member || job->part.owner != owner) continue;
    job->part.owner = NULL;
    if (!job->has_thread) continue;
    char why[ZT__PART_NAME_MAX + 64];
    snprintf(why, sizeof why, "the connection of %s closed", job->part.coordinator);
    if (job->stop == ZT__STOP_NONE) job->stop = ZT__STOP_CANCEL;
    zt__runner_interrupt(job, why);
  }
  pthread_mutex_unlock(&jobs->mu);
  for (int i = 0; i < jobs->n_all; i++) {
    zt__job *job = jobs->all[i];
    zt__pending_push **pp = &job->pushes, *last = NULL;
    while (*pp) {
      zt__pending_push *p = *pp;
      if (p->owner == owner) {
        *pp = p->next;
        free(p->tokens);
        free(p);
      } else {
        last = p;
        pp = &p->next;
      }
    }
    job->pushes_tail = last;
    zt__ckpt_request **qq = &job->ckpt_requests;
    while (*qq) {
      zt__ckpt_request *q = *qq;
      if (q->owner == owner) {
        *qq = q->next;
        free(q);
      } else {
        qq = &q->next;
      }
    }
  }
}

int zt_jobs_export_chunk(zt_jobs *jobs, const char *id, uint64_t offset, uint64_t length,
                         uint8_t **data, size_t *len, uint64_t *total, uint64_t *step,
                         char *err, size_t errlen) {
  zt__job *job = find(jobs, id);
  int rc = 0, fd = -1;
  *data = NULL;
  *len = 0;
  if (!job) {
    snprintf(err, errlen, "no job %s", id);
    return -ENOENT;
  }
  /* The runner may remove the oldest checkpoint while we look: try the newest again. */
  char path[ZT__JOB_DIR_MAX + 64];
  for (int attempt = 0; attempt < 3 && fd < 0; attempt++) {
    int *steps;
    int n = zt__store_checkpoints(job->dir, &steps);
    if (n <= 0) {
      free(steps);
      snprintf(err, errlen, "job %s has no checkpoint yet", id);
      return n < 0 ? n : -ENOENT;
    }
    *step = (uint64_t)steps[n - 1];
    zt__store_checkpoint_path(path, sizeof path, job->dir, steps[n - 1]);
    free(steps);
    strncat(path, "/model.safetensors", sizeof path - strlen(path) - 1);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno != ENOENT) break;
  }
  if (fd < 0) {
    rc = -errno;
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return rc;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    rc = -errno;
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    goto out;
  }
  *total = (uint64_t)st.st_size;
  if (offset > *total) {
    rc = -EINVAL;
    snprintf(err, errlen, "offset %llu is past the end of the weights (%llu bytes)",
             (unsigned long long)offset, (unsigned long long)*total);
    goto out;
  }
  uint64_t want = *total - offset;
  if (want > length) want = length;
  if (want > EXPORT_CHUNK_MAX) want = EXPORT_CHUNK_MAX;
  *data = malloc(want ? want : 1);
  if (!*data) {
    rc = -ENOMEM;
    snprintf(err, errlen, "out of memory");
    goto out;
  }
  size_t got = 0;
  while (got < want) {
    ssize_t n = pread(fd, *data + got, want - got, (off_t)(offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      rc = n < 0 ? -errno : -EIO;
      snprintf(err, errlen, "%s: %s", path, strerror(-rc));
      goto out;
    }
    got += (size_t)n;
  }
  *len = got;
out:
  if (rc < 0) {
    free(*data);
    *data = NULL;
  }
  close(fd);
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
