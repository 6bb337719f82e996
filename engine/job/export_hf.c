/* defines: zt_jobs_export_hf and zt_jobs_export_hf_chunk (jobs.h; called by engine/server's
 * export), zt__exports_forget and zt__exports_close (internal.h; zt_jobs_forget and
 * zt_jobs_close call them).
 *
 * A Hugging Face export is made from the newest checkpoint's model.safetensors into the job's
 * directory (export/NAME, store.h), once per step, dtype and shard size: converting an 8 B model
 * writes tens of GB, so it runs on a worker thread of its own, never on the loop, and a request
 * is answered when its files are ready (as a checkpoint request is). Requests run one at a time
 * in their order; one for an export already asked joins it. A new export replaces the job's
 * previous one; pruning a checkpoint removes its exports (store.c). Clients then read the files
 * a chunk at a time from the loop, as the single-file export is read; a chunk of an export that
 * is gone answers ESTALE, and the client asks for the list again. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/base/tunables.h"
#include "engine/job/internal.h"
#include "engine/job/store.h"
#include "engine/model/hf.h"

typedef struct waiter {
  struct waiter *next;
  zt_jobs_done_cb done;
  void *owner;
} waiter;

/* One export asked for. The loop sets the request's fields and owns its waiters; the worker
 * fills the result. */
typedef struct xreq {
  struct xreq *next;
  char id[ZT_JOB_ID_MAX];
  char dir[ZT__JOB_DIR_MAX];
  zt_model_cfg model;
  zt_st_dtype dtype;
  uint64_t shard;
  waiter *waiters;
  int rc;
  json_t *reply;
  char err[ZT__ERR_MAX];
} xreq;

struct zt__exports {
  uv_async_t *async;          /* the worker's results, to the loop */
  pthread_t thread;
  atomic_int stop;            /* zt__exports_close: the export under way ends */
  pthread_mutex_t mu;
  pthread_cond_t cond;
  /* under mu */
  int quit;
  xreq *todo, *todo_tail;     /* asked, in order */
  xreq *running;
  xreq *done;                 /* made, to answer */
};

static const char *dtype_name(zt_st_dtype dt) { return dt == ZT_ST_BF16 ? "bf16" : "fp32"; }

static void req_free(xreq *r) {
  while (r->waiters) {
    waiter *w = r->waiters;
    r->waiters = w->next;
    free(w);
  }
  json_decref(r->reply);
  free(r);
}

/* ---- the worker ------------------------------------------------------------------------- */

static int fail(xreq *r, int rc, const char *fmt, const char *a) {
  snprintf(r->err, sizeof r->err, fmt, a, strerror(-rc));
  return rc;
}

/* Makes dir/export hold only a fresh NAME.tmp: a new export replaces the previous ones. */
static int fresh_tmp(xreq *r, const char *tmp) {
  char path[ZT__JOB_DIR_MAX + 64];
  zt__store_export_path(path, sizeof path, r->dir, NULL);
  if (mkdir(path, 0755) < 0 && errno != EEXIST) return fail(r, -errno, "%s: %s", path);
  DIR *d = opendir(path);
  if (!d) return fail(r, -errno, "%s: %s", path);
  struct dirent *e;
  int rc = 0;
  while (rc == 0 && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char p[ZT__JOB_DIR_MAX + 320];
    snprintf(p, sizeof p, "%s/%s", path, e->d_name);
    if ((rc = zt__store_remove_tree(p)) < 0) fail(r, rc, "%s: %s", p);
  }
  closedir(d);
  if (rc == 0 && mkdir(tmp, 0755) < 0) rc = fail(r, -errno, "%s: %s", tmp);
  return rc;
}

/* The export of checkpoint step into final (made in final.tmp, renamed when complete). */
static int make(zt__exports *x, xreq *r, int step, const char *final) {
  char tmp[ZT__JOB_DIR_MAX + 128], weights[ZT__JOB_DIR_MAX + 64];
  zt_model *m = NULL;
  zt_hf_export_opts o = {.dtype = r->dtype, .max_shard_bytes = r->shard, .stop = &x->stop};
  if (snprintf(tmp, sizeof tmp, "%s.tmp", final) >= (int)sizeof tmp)
    return fail(r, -ENAMETOOLONG, "%s: %s", final);
  zt__store_checkpoint_path(weights, sizeof weights, r->dir, step);
  /* what is converted is checked first (the checksums the checkpoint recorded) */
  int rc = zt_checkpoint_verify(weights, "model.safetensors", r->err, sizeof r->err);
  if (rc == 1)
    ZT_LOGW("job", "%s: no checksums (written before zt recorded them): exported unverified",
            weights);
  if (rc < 0) return rc;
  strncat(weights, "/model.safetensors", sizeof weights - strlen(weights) - 1);
  rc = fresh_tmp(r, tmp);
  if (rc == 0) rc = zt_model_create(&m, &r->model, r->err, sizeof r->err);
  if (rc == 0) rc = zt_hf_export(m, weights, tmp, &o, r->err, sizeof r->err);
  if (rc == 0 && rename(tmp, final) < 0) rc = fail(r, -errno, "rename to %s: %s", final);
  zt_model_destroy(m);
  if (rc < 0) {
    zt__store_remove_tree(tmp);
    return rc;
  }
  if (o.note[0]) {
    ZT_LOGW("export", "job %s: %s", r->id, o.note);
    json_object_set_new(r->reply, "note", json_string(o.note));
  }
  ZT_LOGI("export", "job %s: step %d exported for Hugging Face (%s) in %s", r->id, step,
          dtype_name(r->dtype), final);
  return 0;
}

/* The rank of a file in the listing: the weights first, config.json last (a client that stops
 * half way has no config.json that looks complete). */
static int rank_of(const char *name) {
  size_t n = strlen(name);
  if (n > 12 && !strcmp(name + n - 12, ".safetensors")) return 0;
  if (!strcmp(name, "model.safetensors.index.json")) return 1;
  return strcmp(name, "config.json") ? 2 : 3;
}

static int by_rank(const void *a, const void *b) {
  const char *x = json_string_value(json_object_get(*(json_t *const *)a, "name"));
  const char *y = json_string_value(json_object_get(*(json_t *const *)b, "name"));
  int rx = rank_of(x), ry = rank_of(y);
  return rx != ry ? rx - ry : strcmp(x, y);
}

/* {"name", "size"} of every file of the export in dir, in rank order, into files. */
static int list(xreq *r, const char *dir, json_t *files) {
  DIR *d = opendir(dir);
  json_t *all[512];
  int n = 0, rc = 0;
  if (!d) return fail(r, -errno, "%s: %s", dir);
  struct dirent *e;
  while (rc == 0 && (e = readdir(d))) {
    struct stat st;
    char p[ZT__JOB_DIR_MAX + 512];
    if (e->d_name[0] == '.') continue;
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    if (stat(p, &st) < 0) rc = fail(r, -errno, "%s: %s", p);
    else if (n == (int)(sizeof all / sizeof all[0])) rc = fail(r, -EFBIG, "%s: %s", dir);
    else if (!(all[n] = json_pack("{s:s, s:I}", "name", e->d_name, "size",
                                  (json_int_t)st.st_size)))
      rc = fail(r, -ENOMEM, "%s: %s", dir);
    else n++;
  }
  closedir(d);
  qsort(all, (size_t)n, sizeof all[0], by_rank);
  for (int i = 0; i < n; i++)
    if (rc == 0 && json_array_append(files, all[i]) < 0) rc = fail(r, -ENOMEM, "%s: %s", dir);
  for (int i = 0; i < n; i++) json_decref(all[i]);
  return rc;
}

/* The export of the newest checkpoint, made unless it is there already; again (twice at most)
 * when the runner removed that checkpoint meanwhile. */
static void build(zt__exports *x, xreq *r) {
  int rc = 0;
  for (int attempt = 0; attempt < 3; attempt++) {
    int *steps = NULL, n = zt__store_checkpoints(r->dir, &steps), step = n > 0 ? steps[n - 1] : 0;
    free(steps);
    if (n <= 0) {
      rc = n < 0 ? n : -ENOENT;
      snprintf(r->err, sizeof r->err, "job %s has no checkpoint yet", r->id);
      if (n < 0) snprintf(r->err, sizeof r->err, "%s/checkpoints: %s", r->dir, strerror(-n));
      break;
    }
    char name[64], final[ZT__JOB_DIR_MAX + 128], ckpt[ZT__JOB_DIR_MAX + 64];
    struct stat st;
    zt__store_export_name(name, sizeof name, step, dtype_name(r->dtype),
                          (unsigned long long)r->shard);
    zt__store_export_path(final, sizeof final, r->dir, name);
    json_decref(r->reply);
    r->reply = json_pack("{s:s, s:i, s:s, s:[]}", "export", name, "step", step, "dtype",
                         dtype_name(r->dtype), "files");
    if (!r->reply) {
      rc = fail(r, -ENOMEM, "%s: %s", final);
      break;
    }
    if (stat(final, &st) < 0 && (rc = make(x, r, step, final)) < 0) break;
    zt__store_checkpoint_path(ckpt, sizeof ckpt, r->dir, step);
    if (stat(ckpt, &st) < 0) {
      /* pruned while it was made: its exports go with it (store.c missed this one) */
      zt__store_remove_tree(final);
      rc = -EAGAIN;
      snprintf(r->err, sizeof r->err, "job %s checkpoints faster than it exports", r->id);
      continue;
    }
    rc = list(r, final, json_object_get(r->reply, "files"));
    break;
  }
  r->rc = rc;
  if (rc < 0) {
    json_decref(r->reply);
    r->reply = NULL;
    ZT_LOGW("export", "job %s: Hugging Face export failed: %s", r->id, r->err);
  }
}

static void *worker(void *arg) {
  zt__exports *x = arg;
  pthread_mutex_lock(&x->mu);
  for (;;) {
    while (!x->todo && !x->quit) pthread_cond_wait(&x->cond, &x->mu);
    if (x->quit) break;
    xreq *r = x->todo;
    x->todo = r->next;
    if (!x->todo) x->todo_tail = NULL;
    x->running = r;
    pthread_mutex_unlock(&x->mu);
    build(x, r);
    pthread_mutex_lock(&x->mu);
    x->running = NULL;
    r->next = x->done;
    x->done = r;
    uv_async_send(x->async);
  }
  pthread_mutex_unlock(&x->mu);
  return NULL;
}

/* ---- the loop thread ------------------------------------------------------------------- */

static void answer(uv_async_t *h) {
  zt__exports *x = h->data;
  pthread_mutex_lock(&x->mu);
  xreq *r = x->done;
  x->done = NULL;
  pthread_mutex_unlock(&x->mu);
  while (r) {
    xreq *next = r->next;
    while (r->waiters) {
      waiter *w = r->waiters;
      r->waiters = w->next;
      w->done(w->owner, r->rc, r->rc < 0 ? NULL : r->reply, r->err);
      free(w);
    }
    req_free(r);
    r = next;
  }
}

static void free_async(uv_handle_t *h) { free(h); }

/* The worker and its handle, made at the first export. */
static int exports_open(zt_jobs *jobs, char *err, size_t errlen) {
  zt__exports *x = calloc(1, sizeof *x);
  if (!x || !(x->async = calloc(1, sizeof *x->async))) goto nomem;
  pthread_mutex_init(&x->mu, NULL);
  pthread_cond_init(&x->cond, NULL);
  if (uv_async_init(jobs->cfg.loop, x->async, answer) < 0) goto nomem;
  x->async->data = x;
  if (pthread_create(&x->thread, NULL, worker, x) != 0) {
    uv_close((uv_handle_t *)x->async, free_async);
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->cond);
    free(x);
    snprintf(err, errlen, "cannot start the export thread");
    return -EAGAIN;
  }
  jobs->exports = x;
  return 0;
nomem:
  if (x) free(x->async);
  free(x);
  snprintf(err, errlen, "out of memory");
  return -ENOMEM;
}

/* The request for the same export of the same job, asked and not made yet (under mu). */
static xreq *same(zt__exports *x, const char *id, zt_st_dtype dt, uint64_t shard) {
  if (x->running && !strcmp(x->running->id, id) && x->running->dtype == dt &&
      x->running->shard == shard)
    return x->running;
  for (xreq *r = x->todo; r; r = r->next)
    if (!strcmp(r->id, id) && r->dtype == dt && r->shard == shard) return r;
  return NULL;
}

int zt_jobs_export_hf(zt_jobs *jobs, const char *id, const char *dtype, uint64_t max_shard_bytes,
                      zt_jobs_done_cb done, void *owner, char *err, size_t errlen) {
  zt__job *job = zt__jobs_find(jobs, id, err, errlen);
  int rc;
  if (!job) return -ENOENT;
  zt_st_dtype dt = !strcmp(dtype, "bf16") ? ZT_ST_BF16 : ZT_ST_F32;
  if (strcmp(dtype, "bf16") && strcmp(dtype, "fp32")) {
    snprintf(err, errlen, "dtype must be \"bf16\" or \"fp32\"");
    return -EINVAL;
  }
  if (!max_shard_bytes) max_shard_bytes = ZT_TUNE_HF_SHARD_BYTES;
  if (!jobs->exports && (rc = exports_open(jobs, err, errlen)) < 0) return rc;
  zt__exports *x = jobs->exports;
  waiter *w = calloc(1, sizeof *w);
  if (!w) {
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  w->done = done;
  w->owner = owner;
  pthread_mutex_lock(&x->mu);
  xreq *r = same(x, id, dt, max_shard_bytes);
  pthread_mutex_unlock(&x->mu);
  int fresh = !r;
  if (fresh) {
    if (!(r = calloc(1, sizeof *r))) {
      free(w);
      snprintf(err, errlen, "out of memory");
      return -ENOMEM;
    }
    snprintf(r->id, sizeof r->id, "%s", id);
    snprintf(r->dir, sizeof r->dir, "%s", job->dir);
    r->model = job->spec.model;
    r->dtype = dt;
    r->shard = max_shard_bytes;
  }
  /* waiters are the loop's: the worker never reads them (a request asked already may have
   * none left, its clients gone) */
  w->next = r->waiters;
  r->waiters = w;
  if (!fresh) return 0;
  pthread_mutex_lock(&x->mu);
  if (x->todo_tail) x->todo_tail->next = r;
  else x->todo = r;
  x->todo_tail = r;
  pthread_cond_signal(&x->cond);
  pthread_mutex_unlock(&x->mu);
  return 0;
}

int zt_jobs_export_hf_chunk(zt_jobs *jobs, const char *id, const char *export_name,
                            const char *file, uint64_t offset, uint64_t length, uint8_t **data,
                            size_t *len, uint64_t *total, uint64_t *step, char *err,
                            size_t errlen) {
  zt__job *job = zt__jobs_find(jobs, id, err, errlen);
  int s, rc;
  *data = NULL;
  *len = 0;
  if (!job) return -ENOENT;
  if (zt__store_export_parse(export_name, &s) < 0) {
    snprintf(err, errlen, "export: not the name of an export (as its list gives it)");
    return -EINVAL;
  }
  /* the files are the export's own: a plain name, no directory */
  if (!file[0] || file[0] == '.' || strchr(file, '/')) {
    snprintf(err, errlen, "file: not a file of an export");
    return -EINVAL;
  }
  char dir[ZT__JOB_DIR_MAX + 128], path[ZT__JOB_DIR_MAX + 400];
  zt__store_export_path(dir, sizeof dir, job->dir, export_name);
  snprintf(path, sizeof path, "%s/%s", dir, file);
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    rc = -errno;
    if (access(dir, F_OK) < 0) {
      snprintf(err, errlen, "export %s of job %s is gone (a newer export replaced it, or its "
               "checkpoint was removed): ask for its files again", export_name, id);
      return -ESTALE;
    }
    snprintf(err, errlen, "export %s of job %s: %s: %s", export_name, id, file, strerror(-rc));
    return rc;
  }
  *step = (uint64_t)s;
  rc = zt__export_read(fd, path, file, offset, length, data, len, total, err, errlen);
  close(fd);
  return rc;
}

void zt__exports_forget(zt_jobs *jobs, void *owner) {
  zt__exports *x = jobs->exports;
  if (!x) return;
  pthread_mutex_lock(&x->mu);
  xreq *lists[3] = {x->running, x->todo, x->done};
  /* the waiters are the loop's whichever list holds their request; mu keeps the lists still */
  for (int k = 0; k < 3; k++)
    for (xreq *r = lists[k]; r; r = k ? r->next : NULL)
      for (waiter **pw = &r->waiters; *pw;) {
        waiter *w = *pw;
        if (w->owner == owner) {
          *pw = w->next;
          free(w);
        } else {
          pw = &w->next;
        }
      }
  pthread_mutex_unlock(&x->mu);
}

void zt__exports_close(zt_jobs *jobs) {
  zt__exports *x = jobs->exports;
  if (!x) return;
  atomic_store(&x->stop, 1);
  pthread_mutex_lock(&x->mu);
  x->quit = 1;
  pthread_cond_signal(&x->cond);
  pthread_mutex_unlock(&x->mu);
  pthread_join(x->thread, NULL);
  /* what was asked and not answered is dropped, as zt_jobs_close drops every pending answer */
  xreq *lists[3] = {x->running, x->todo, x->done};
  for (int k = 0; k < 3; k++)
    for (xreq *r = lists[k], *next; r; r = next) {
      next = k ? r->next : NULL;
      req_free(r);
    }
  uv_close((uv_handle_t *)x->async, free_async);
  pthread_mutex_destroy(&x->mu);
  pthread_cond_destroy(&x->cond);
  free(x);
  jobs->exports = NULL;
}
