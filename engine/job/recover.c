/* defines: zt__jobs_scan (internal.h; called by zt_jobs_open): the jobs of the state dir read
 * back after a restart; one that was queued or running is queued again where it can resume.
 * The files a job names are not read here: the queue's start check does it on a worker. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine/job/internal.h"
#include "engine/job/store.h"
#include "engine/base/log.h"

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
  if (zt__job_state_parse(json_string_value(json_object_get(st, "state")), &state) < 0) {
    ZT_LOGW("job", "skipping %s: status.json has no valid state", dir);
    goto out;
  }
  if (spec.model.init_job[0])
    snprintf(spec.model.init_path, sizeof spec.model.init_path, "%s/" ZT__INIT_FILE, dir);
  if ((rc = zt__job_new(jobs, id, &spec, &job)) < 0) goto out;
  /* A runner that never ended (the daemon was killed) left its NVMe files: they take the space
   * the job needs to start again. This runs before the daemon serves anyone (zt_jobs_open) and
   * only removes a directory the daemon made (store.h; nftw opens directories only, never a
   * FIFO or a device). */
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
  if (json_is_number(v = json_object_get(st, "eval_loss")) &&
      json_is_integer(json_object_get(st, "eval_step"))) {
    job->has_eval = 1;
    job->eval_loss = json_number_value(v);
    job->eval_step = (int)json_integer_value(json_object_get(st, "eval_step"));
  }
  if (json_is_string(v = json_object_get(st, "error")))
    snprintf(job->error, sizeof job->error, "%s", json_string_value(v));
  if (json_is_integer(v = json_object_get(st, "checkpoint_step"))) {
    job->has_ckpt = 1;
    job->ckpt_step = (int)json_integer_value(v);
  }
  /* absent from a record written before TCP jobs were confined: unconfined, as that daemon
   * ran it */
  job->tcp = !strcmp(json_string_value(json_object_get(st, "client")) ?: "", "tcp");
  job->created = status_time(st, "created");
  job->started = status_time(st, "started");
  job->ended = status_time(st, "ended");
  /* for show; the start check reads it again, and checks it */
  char why[ZT__ERR_MAX];
  job->has_plan = spec.has_offload && zt__job_world(&spec) == 1 &&
                  zt__store_plan_read(dir, &job->plan, why, sizeof why) == 0;
  if ((rc = zt__jobs_add(jobs, job)) < 0) goto out;
  zt__job *added = job;
  job = NULL;

  json_t *part = zt__store_read_json(dir, "part.json", why, sizeof why);
  if (part) {
    added->part.member = 1;
    added->part.rank0 = (int)json_integer_value(json_object_get(part, "rank0"));
    snprintf(added->part.coordinator, sizeof added->part.coordinator, "%s",
             json_string_value(json_object_get(part, "coordinator")) ?: "?");
    json_decref(part);
  }
  if ((state == ZT_JOB_RUNNING || state == ZT_JOB_QUEUED) && added->part.member) {
    zt__job_fail(jobs, added, "interrupted by daemon restart; a part runs only while its "
             "coordinator holds it: the coordinator starts a new part when the job resumes");
  } else if (state == ZT_JOB_RUNNING && spec.source == ZT_DATA_STREAM) {
    zt__job_fail(jobs, added, "interrupted by daemon restart; stream data cannot be replayed");
  } else if (state == ZT_JOB_RUNNING || state == ZT_JOB_QUEUED) {
    added->state = ZT_JOB_QUEUED;
    zt__jobs_enqueue(jobs, added);
  }
out:
  if (job) zt__job_free(job);
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

int zt__jobs_scan(zt_jobs *jobs, char *err, size_t errlen) {
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
  /* ids of removed jobs stay taken */
  long kept = zt__store_ids_next(jobs->state_dir);
  if (kept > jobs->next_id) jobs->next_id = kept;
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
