/* The optimizer-state store (offload/opt_store.h): the AdamW tasks of every unit, and the NVMe
 * units' files and staging sets. */
#include "offload/opt_store.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum set_state { SET_FREE, SET_READING, SET_UPDATING, SET_WRITING } set_state;
/* What a call's first failure was, for zt_opt_store_error. */
typedef enum fail_why { WHY_OTHER, WHY_IO, WHY_HOOK } fail_why;
typedef struct opt_set {
  zt_opt_set b;
  int unit; /* -1: none */
  set_state st;
  int req[ZT_OPT_KINDS];
} opt_set;

/* One run's AdamW on the pool (offload/cpu_adam.h's kernel, chunk by chunk), with what
 * zt_opt_io adds around it: src copied into p first, the first out_n updated masters copied to
 * out. */
typedef struct run_task {
  zt_cpu_job job;
  zt_cpu_isa isa;
  zt_adam_hparams h;
  const float *src;
  float *p;
  const float *g;
  void *m, *v;
  zt_dtype state;
  uint64_t index0; /* bf16 moments: the flat index of the run's element 0 */
  uint16_t *p_bf16, *p_fp16;
  float *out;
  size_t out_n;
} run_task;

struct zt_opt_store {
  zt_opt_store_cfg c;  /* floats, runs and first_run point at the store's copies */
  size_t *floats;
  zt_opt_run *runs;
  int *first_run;
  int n_runs;
  run_task *tasks;     /* one per run */
  char *submitted;     /* per run: in this step, not waited for yet */
  int *ext;            /* the file of unit u's kind k: ext[ZT_OPT_KINDS * u + k] */
  opt_set sets[2];
  fail_why why;        /* the last failed call's first failure */
  int failed;          /* the call under way has failed already */
};

/* A public call begins: no failure yet. */
static void begin(zt_opt_store *st) { st->failed = 0; }

/* A failure of the call under way; its first one is what zt_opt_store_error describes. */
static int fail(zt_opt_store *st, int rc, fail_why why) {
  if (!st->failed) st->why = why;
  st->failed = 1;
  return rc;
}

size_t zt_opt_store_kind_bytes(int k, zt_dtype state) {
  return k == ZT_OPT_MASTER ? sizeof(float) : zt_dtype_size(state);
}

uint64_t zt_opt_store_file_bytes(size_t floats, zt_dtype state) {
  uint64_t sum = 0;
  for (int k = 0; k < ZT_OPT_KINDS; k++) {
    uint64_t file = (uint64_t)floats * zt_opt_store_kind_bytes(k, state);
    sum += (file + ZT_NVME_ALIGN - 1) / ZT_NVME_ALIGN * ZT_NVME_ALIGN;
  }
  return sum;
}

static const char *const kind_names[ZT_OPT_KINDS] = {"master", "exp_avg", "exp_avg_sq"};

int zt_opt_store_open(zt_opt_store **out, const zt_opt_store_cfg *cfg, char *err, size_t errlen) {
  int nu = cfg->n_units, nr = cfg->first_run[nu], rc = 0;
  zt_opt_store *st = NULL;
  *out = NULL;
  if (cfg->state != ZT_F32 && cfg->state != ZT_BF16) {
    snprintf(err, errlen, "optimizer state: m and v must be fp32 or bf16");
    return -EINVAL;
  }
  if (!(st = calloc(1, sizeof *st))) goto no_memory;
  st->c = *cfg;
  st->n_runs = nr;
  st->floats = malloc((size_t)nu * sizeof *st->floats);
  st->runs = malloc(((size_t)nr + 1) * sizeof *st->runs);
  st->first_run = malloc(((size_t)nu + 1) * sizeof *st->first_run);
  st->tasks = calloc((size_t)nr + 1, sizeof *st->tasks);
  st->submitted = calloc((size_t)nr + 1, 1);
  st->ext = malloc(((size_t)nu * ZT_OPT_KINDS + 1) * sizeof *st->ext);
  if (!st->floats || !st->runs || !st->first_run || !st->tasks || !st->submitted || !st->ext)
    goto no_memory;
  memcpy(st->floats, cfg->floats, (size_t)nu * sizeof *st->floats);
  memcpy(st->runs, cfg->runs, (size_t)nr * sizeof *st->runs);
  memcpy(st->first_run, cfg->first_run, ((size_t)nu + 1) * sizeof *st->first_run);
  st->c.floats = st->floats;
  st->c.runs = st->runs;
  st->c.first_run = st->first_run;
  st->c.names = NULL;
  if (!cfg->nvme) st->c.nvme_first = nu;
  for (int i = 0; i < 2; i++) st->sets[i] = (opt_set){.b = cfg->sets[i], .unit = -1};
  for (int u = st->c.nvme_first; u < nu; u++)
    for (int k = 0; k < ZT_OPT_KINDS; k++) {
      char name[64];
      snprintf(name, sizeof name, "%s.%s", cfg->names[u], kind_names[k]);
      size_t bytes = cfg->floats[u] * zt_opt_store_kind_bytes(k, cfg->state);
      if ((rc = zt_nvme_store_alloc(cfg->nvme, name, bytes)) < 0) {
        snprintf(err, errlen, "%s", zt_nvme_store_error(cfg->nvme));
        goto out;
      }
      st->ext[ZT_OPT_KINDS * u + k] = rc;
    }
  *out = st;
  return 0;
no_memory:
  rc = -ENOMEM;
  snprintf(err, errlen, "out of memory");
out:
  zt_opt_store_close(st);
  return rc;
}

void zt_opt_store_close(zt_opt_store *st) {
  if (!st) return;
  for (int r = 0; st->submitted && r < st->n_runs; r++)
    if (st->submitted[r]) zt_cpu_pool_wait(st->c.pool, &st->tasks[r].job);
  free(st->floats);
  free(st->runs);
  free(st->first_run);
  free(st->tasks);
  free(st->submitted);
  free(st->ext);
  free(st);
}

int zt_opt_store_ext(const zt_opt_store *st, int u, int k) {
  return st->ext[ZT_OPT_KINDS * u + k];
}

void zt_opt_store_wait(zt_opt_store *st, int u) {
  for (int r = st->first_run[u]; r < st->first_run[u + 1]; r++)
    if (st->submitted[r]) {
      zt_cpu_pool_wait(st->c.pool, &st->tasks[r].job);
      st->submitted[r] = 0;
    }
}

static void run_task_chunk(void *arg, size_t begin, size_t end) {
  run_task *k = arg;
  size_t n = end - begin;
  uint16_t *bf = k->p_bf16 ? k->p_bf16 + begin : NULL, *hf = k->p_fp16 ? k->p_fp16 + begin : NULL;
  if (k->src) memcpy(k->p + begin, k->src + begin, n * sizeof(float));
  if (k->state == ZT_BF16)
    zt_cpu_adam_run_bf16(k->isa, &k->h, k->p + begin, k->g + begin, (uint16_t *)k->m + begin,
                         (uint16_t *)k->v + begin, bf, hf, n, k->index0 + begin);
  else
    zt_cpu_adam_run(k->isa, &k->h, k->p + begin, k->g + begin, (float *)k->m + begin,
                    (float *)k->v + begin, bf, hf, n);
  if (begin < k->out_n)
    memcpy(k->out + begin, k->p + begin,
           ((end < k->out_n ? end : k->out_n) - begin) * sizeof(float));
}

/* A failed submit: the tasks started waited for, an NVMe unit's set (staged for this update)
 * freed unwritten. */
static int submit_fail(zt_opt_store *st, int u, int rc) {
  opt_set *x = &st->sets[u & 1];
  zt_opt_store_wait(st, u);
  if (x->unit == u && x->st == SET_UPDATING) {
    x->st = SET_FREE;
    x->unit = -1;
  }
  return fail(st, rc, WHY_OTHER);
}

int zt_opt_store_submit(zt_opt_store *st, int u, const zt_opt_io *io, const zt_adam_hparams *hp) {
  begin(st);
  if (hp->step < 1) return submit_fail(st, u, -EINVAL);
  for (int r = st->first_run[u]; r < st->first_run[u + 1]; r++) {
    const zt_opt_run *a = &st->runs[r];
    run_task *k = &st->tasks[r];
    size_t d = a->offset, ms = zt_dtype_size(st->c.state);
    *k = (run_task){.isa = zt_cpu_isa_best(), .h = *hp, .src = io->src ? io->src + d : NULL,
                    .p = io->p + d, .g = io->g + d, .m = (char *)io->m + d * ms,
                    .v = (char *)io->v + d * ms, .state = st->c.state, .index0 = io->index0 + d,
                    .p_bf16 = io->lp && st->c.dt == ZT_BF16 ? io->lp + d : NULL,
                    .p_fp16 = io->lp && st->c.dt == ZT_F16 ? io->lp + d : NULL};
    k->h.weight_decay = a->decay ? hp->weight_decay : 0.0f;
    if (io->out && d < io->out_n) {
      k->out = io->out + d;
      k->out_n = io->out_n - d < a->n ? io->out_n - d : a->n;
    }
    k->job = (zt_cpu_job){.fn = run_task_chunk, .arg = k, .n = a->n, .chunk = ZT_CPU_ADAM_CHUNK};
    int rc = zt_cpu_pool_submit(st->c.pool, &k->job);
    if (rc < 0) return submit_fail(st, u, rc);
    st->submitted[r] = 1;
  }
  return 0;
}

/* Starts the reads (write 0) or writes of the set's unit; on a failure waits for those started. */
static int set_io(zt_opt_store *st, opt_set *x, int write) {
  for (int k = 0; k < ZT_OPT_KINDS; k++) {
    size_t bytes = st->floats[x->unit] * zt_opt_store_kind_bytes(k, st->c.state);
    int ext = st->ext[ZT_OPT_KINDS * x->unit + k];
    int rc = write ? zt_nvme_write(st->c.nvme, ext, 0, x->b.buf[k], bytes)
                   : zt_nvme_read(st->c.nvme, ext, 0, x->b.buf[k], bytes);
    if (rc < 0) {
      while (k-- > 0) zt_nvme_wait(st->c.nvme, x->req[k]);
      return fail(st, rc, WHY_IO);
    }
    x->req[k] = rc;
  }
  return 0;
}

static int set_wait(zt_opt_store *st, opt_set *x) {
  int rc = 0;
  for (int k = 0; k < ZT_OPT_KINDS; k++) {
    int r = zt_nvme_wait(st->c.nvme, x->req[k]);
    if (r < 0 && rc == 0) rc = fail(st, r, WHY_IO);
  }
  return rc;
}

/* Back to FREE: a read finished, an update waited for and written behind, a write landed. */
static int set_retire(zt_opt_store *st, opt_set *x) {
  int rc = 0;
  if (x->st == SET_READING) rc = set_wait(st, x);
  if (x->st == SET_UPDATING) {
    zt_opt_store_wait(st, x->unit);
    if (st->c.updated && (rc = st->c.updated(st->c.ctx, x->unit, &x->b)) < 0)
      fail(st, rc, WHY_HOOK);
    if (rc == 0 && (rc = set_io(st, x, 1)) == 0) x->st = SET_WRITING;
  }
  if (x->st == SET_WRITING) {
    rc = set_wait(st, x);
    int r = st->c.written ? st->c.written(st->c.ctx, x->unit) : 0;
    if (r < 0 && rc == 0) rc = fail(st, r, WHY_HOOK);
  }
  x->st = SET_FREE;
  x->unit = -1;
  return rc;
}

int zt_opt_store_read(zt_opt_store *st, int u) {
  opt_set *x = &st->sets[u & 1];
  begin(st);
  if (x->unit == u) return 0;
  int rc = set_retire(st, x);
  if (rc < 0) return rc;
  x->unit = u;
  if ((rc = set_io(st, x, 0)) < 0) {
    x->unit = -1;
    return rc;
  }
  x->st = SET_READING;
  return 0;
}

int zt_opt_store_stage(zt_opt_store *st, int u, zt_opt_set *out) {
  opt_set *x = &st->sets[u & 1];
  int rc = zt_opt_store_read(st, u);
  if (rc == 0 && x->st == SET_READING && (rc = set_wait(st, x)) < 0) {
    x->st = SET_FREE;
    x->unit = -1;
  }
  if (rc < 0) return rc;
  x->st = SET_UPDATING;
  *out = x->b;
  return 0;
}

int zt_opt_store_flush(zt_opt_store *st) {
  int rc = 0;
  begin(st);
  if (!st->c.nvme) return 0;
  int hi = st->sets[1].unit > st->sets[0].unit;
  for (int i = 0; i < 2; i++) {
    int r = set_retire(st, &st->sets[i ? !hi : hi]);
    if (r < 0 && rc == 0) rc = r;
  }
  return rc;
}

int zt_opt_store_finish(zt_opt_store *st) {
  for (int u = 0; u < st->c.n_units; u++) zt_opt_store_wait(st, u);
  return zt_opt_store_flush(st);
}

int zt_opt_store_sync(zt_opt_store *st, int u, int write) {
  opt_set *x = &st->sets[0];
  begin(st);
  x->unit = u;
  int rc = set_io(st, x, write);
  if (rc == 0) rc = set_wait(st, x);
  x->unit = -1;
  return rc;
}

const char *zt_opt_store_error(const zt_opt_store *st, int rc) {
  if (st && st->why == WHY_HOOK) return "";
  const char *e = st && st->c.nvme && st->why == WHY_IO ? zt_nvme_store_error(st->c.nvme) : "";
  return e[0] ? e : strerror(-rc);
}
