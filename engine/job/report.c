/* defines: the status report, on the loop thread: zt_jobs_status, zt_jobs_list and
 * zt_jobs_show (jobs.h; called by engine/server); and what a job records of itself for the
 * queue and the runner (internal.h): status.json, its log, the watchers' events. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include "engine/job/internal.h"
#include "engine/job/store.h"
#include "engine/kernels/backend.h"
#include "engine/base/log.h"
#include "engine/plan/plan_file.h"

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

/* data.eval: the newest evaluation's "eval_step" and "eval_loss" (under mu) */
static void add_eval(json_t *o, const zt__job *job) {
  json_object_set_new(o, "eval_step", json_integer(job->eval_step));
  json_object_set_new(o, "eval_loss", json_real(job->eval_loss));
}

int zt__job_write_status(zt__job *job, char *err, size_t errlen) {
  pthread_mutex_lock(&job->jobs->mu);
  json_t *st = json_pack(
      "{s:s, s:s, s:i, s:i, s:o, s:o, s:o, s:o, s:o, s:o}", "state",
      zt_job_state_name(job->state), "client", job->tcp ? "tcp" : "unix",
      "step", job->step, "steps", job->spec.train.steps, "loss",
      job->has_loss ? json_real(job->loss) : json_null(), "error",
      job->error[0] ? json_string(job->error) : json_null(), "created",
      time_or_null(job->created), "started", time_or_null(job->started), "ended",
      time_or_null(job->ended), "checkpoint_step",
      job->has_ckpt ? json_integer(job->ckpt_step) : json_null());
  if (st && job->has_eval) add_eval(st, job);
  pthread_mutex_unlock(&job->jobs->mu);
  int rc = zt__store_write_json(job->dir, "status.json", st, err, errlen);
  json_decref(st);
  return rc;
}

void zt__jobs_emit(zt_jobs *jobs, zt__job *job, json_t *ev) {
  if (jobs->cfg.on_event) jobs->cfg.on_event(jobs->cfg.user, job->id, ev);
  json_decref(ev);
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
    if (job->has_eval) add_eval(json_array_get(arr, json_array_size(arr) - 1), job);
  }
  pthread_mutex_unlock(&jobs->mu);
  return json_pack("{s:o}", "jobs", arr);
}

json_t *zt_jobs_show(zt_jobs *jobs, const char *id, int *rc, char *err, size_t errlen) {
  zt__job *job = zt__jobs_find(jobs, id, err, errlen);
  if (!job) {
    *rc = -ENOENT;
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
  if (j && job->has_eval) add_eval(j, job);
  /* the plan it runs or ran, as plan.json holds it */
  if (j && job->has_plan) json_object_set_new(j, "plan", zt_offload_plan_to_json(&job->plan));
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
  if (job->spec.eval_path[0]) json_object_set_new(j, "evals", zt__store_evals_read(job->dir));
  *rc = 0;
  return j;
}
