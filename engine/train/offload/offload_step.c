/* The offloaded step (engine/train/offload/offload.h): the trainer's state in the host arena, the units
 * walked through the streamer, AdamW per unit on the CPU pool. */
#include "engine/train/offload/offload.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/kernels/backend.h"
#include "engine/train/trainer_internal.h"
#include "engine/base/tunables.h"
#include "offload/copy_engine.h"
#include "offload/cpu_adam.h"
#include "offload/cpu_pool.h"
#include "offload/device_arena.h"
#include "offload/host_arena.h"
#include "offload/nvme_store.h"
#include "offload/streamer.h"
#include "engine/base/clock.h"

/* the policy's limits (engine/plan/recipe.h) */
#define PREFETCH_MAX ZT_OFFLOAD_PREFETCH_MAX
#define UNIT_DONE_LAG ZT_OFFLOAD_UNIT_DONE_LAG
#define GRAD_RING_SLOTS ZT_OFFLOAD_GRAD_RING_MIN
/* AdamW worker threads. On the CPU backend one keeps the update of a unit running beside the
 * backend's own threads on the runner's backward, unpinned, since the backend's threads take the
 * cores they find. Beside a GPU the update is the host's main work: a thread per core, pinned. */
#define ADAM_THREADS_BESIDE_CPU 1

/* A run of consecutive tensors of one unit sharing a decay flag: one AdamW task. */
typedef struct adam_run {
  size_t offset, n;
  int decay;
  int submitted; /* in this step, not waited for yet */
} adam_run;

/* optimizer nvme: the staging of one unit's master, m and v, moving through
 * FREE -> READING -> UPDATING -> WRITING -> FREE */
typedef enum set_state { SET_FREE, SET_READING, SET_UPDATING, SET_WRITING } set_state;
typedef struct opt_set {
  float *buf[3];
  int unit;
  set_state st;
  int req[3];
} opt_set;

enum { K_MASTER, K_M, K_V, KINDS };

/* One run's AdamW on the pool (offload/cpu_adam.h's kernel, chunk by chunk), with what the
 * delayed update adds around it: the current masters copied into p first (src), and the first
 * out_n updated parameters copied to the next stream copy (out). */
typedef struct run_task {
  zt_cpu_job job;
  zt_cpu_isa isa;
  zt_adam_hparams h;
  const float *src;
  float *p;
  const float *g;
  float *m, *v;
  uint16_t *p_bf16, *p_fp16;
  float *out;
  size_t out_n;
} run_task;

typedef struct off_state {
  zt_offload_cfg oc;
  zt_dtype dt;         /* the compute precision: fp32, or bf16/fp16 with a host compute copy */
  /* Units [ng, nh) keep masters, m and v in the host arena, units [nh, nu) on NVMe. The host's
   * flat-layout buffers start at float lo: 0 where the device units alias them (the cpu
   * backend without NVMe units or gradient ring), else the first streamed unit's offset. */
  int nh;
  size_t lo;
  float *h[KINDS];     /* masters, m, v over [lo, lo + h_floats): up to the offset of unit nh */
  size_t h_floats;
  float *grads;        /* the fp32 gradients over [lo, n); NULL with the ring */
  int ring;            /* the gradient ring's slots (0: none): unit u's in slot[(u - ng) % ring] */
  float **slot;
  size_t ring_floats;  /* a slot's floats: the largest streamed unit's */
  float *scopy;        /* NVMe units, params not nvme: the fp32 parameters their ops read, which
                          they stream from; unit u's [scopy_off[u], scopy_off[u + 1]) */
  size_t *scopy_off;
  uint16_t *lp;        /* bf16/fp16: the host compute copy over [lo, n), rewritten by the
                          AdamW */
  int scopy0;          /* the first unit with a stream copy: nh, or ng with delayed bf16/fp16 */
  /* delayed_update: the other buffer of each pair the update writes while the step reads the
   * current one (offload.h "Delayed update"), swapped with it at the drain; NULL where unused */
  int delayed;
  float *m_nxt;        /* fp32: the host units' masters, alternating with h[K_MASTER] */
  uint16_t *lp_nxt;    /* bf16/fp16: the compute copy */
  float *scopy_nxt;    /* the stream copy */
  /* the update deferred by step pend_step, with pend_hp: units pend_next down to ng are still to
   * be started (an NVMe unit's read waits, so the walks start them one by one) */
  int pend, pend_next, pend_step;
  zt_adam_hparams pend_hp;
  zt_stream_piece *pieces; /* bf16/fp16: what each unit's device copy is made of: unit u's are */
  int *first_piece;        /* pieces[first_piece[u] .. first_piece[u + 1]) */
  size_t *lp_offset;       /* bf16/fp16: per unit, its compute-copy block in its device copy */
  zt_backend hbe;      /* math on host buffers (norm, casts): the trainer's backend on the CPU,
                          a CPU backend of its own beside a GPU */
  int own_hbe;
  zt_dev_mem_ops dev_mem; /* the device arena's block from the backend (cuda) */
  /* Units 0..ng-1 keep their optimizer on the device (zt_offload_cfg.gpu_units): masters, m, v,
   * the compute copy and the gradients in backend buffers over their ng_floats parameters,
   * updated by the backend's AdamW after the backward; the streamer handles units ng.. only
   * (its unit i is unit ng + i). On the cpu backend the device buffers are the host tier's. */
  int ng;
  size_t ng_floats;
  float *d_master, *d_m, *d_v, *d_grad;
  void *d_lp;
  /* grads gpu (offload.h "Gradient sums on the device"): the streamed units' running sums in a
   * backend buffer over their parameters [ng_floats, n), each unit's its streamer dev_grads */
  int dsum;
  float *d_sum;
  size_t dsum_bytes;   /* its footprint in the plan */
  int d_alias;
  size_t dev_unit_bytes;
  uint64_t gpu_unit_updates;
  uint64_t step_ns;    /* wall time of the steps that succeeded */
  double est_s;        /* the plan's step time by the cost model */
  int adam_threads;
  zt_host_arena *host;
  zt_nvme_store *nvme; /* optimizer nvme */
  int *ext;            /* the file of unit u's kind k: ext[KINDS * u + k] */
  char nvme_dir[ZT_PATH_MAX + 32]; /* this trainer's directory under oc.nvme_dir, "" none */
  opt_set sets[2];     /* NVMe unit u uses sets[u & 1]: one updated while the next is read ahead */
  zt_dev_arena *dev;
  zt_copy_engine *copy;
  zt_cpu_pool *pool;
  zt_streamer *st;
  int nu;
  int head;            /* the unit that also reads the embedding unit (gpt head), or -1 */
  float *embed_grads;  /* the embedding unit's gradient buffer, held from the head to unit 0 */
  adam_run *runs;
  run_task *tasks;     /* one per run */
  int *first_run;      /* runs of unit u: [first_run[u], first_run[u + 1]) */
  size_t act_bytes, arena_budget, host_bytes;
  char *updated;       /* per unit: its update of this step has started */
  uint64_t adam_units, adam_overlapped;
  int broken;          /* a failed step left part of the parameters updated */
} off_state;

/* ---- the step -------------------------------------------------------------------------------- */

/* The host's state at flat offset off (a host unit's, or a device unit's where they alias) */
static float *host_at(const off_state *s, int k, size_t off) { return s->h[k] + (off - s->lo); }

static uint16_t *lp_at(const off_state *s, size_t off) { return s->lp + (off - s->lo); }

/* Streamed unit u's fp32 gradients on the host: its part of the flat buffer, or its ring slot */
static float *grads_of(const zt_trainer *t, int u) {
  const off_state *s = t->path_state;
  if (s->ring) return s->slot[(u - s->ng) % s->ring];
  return s->grads + (zt_model_unit(t->model, u)->offset - s->lo);
}

static int stream_fail(zt_trainer *t, int rc, char *err, size_t errlen) {
  off_state *s = t->path_state;
  snprintf(err, errlen, "offload step %d: %s", t->step + 1, zt_streamer_error(s->st));
  return rc;
}

/* The walk's next `prefetch` streamed units after u; in the forward through the device units,
 * the first streamed ones, whose copies then run beside those units' compute. Prefetches are
 * advisory: -EAGAIN (no room without waiting) leaves the fetch to the acquire. */
static int prefetch_from(off_state *s, int u, int dir) {
  int v0 = dir > 0 && u + 1 < s->ng ? s->ng : u + dir;
  for (int d = 0; d < s->oc.prefetch; d++) {
    int v = v0 + d * dir;
    if (v < s->ng || v >= s->nu) break;
    int rc = zt_streamer_prefetch(s->st, v - s->ng);
    if (rc < 0 && rc != -EAGAIN) return rc;
  }
  return 0;
}

/* Unit u's parameters on the device for compute (and with ZT_STREAM_GRADS its gradient
 * buffer): the device-resident buffers of a unit below ng, else through the streamer. */
static int unit_get(zt_trainer *t, int u, unsigned flags, void **p, float **g) {
  off_state *s = t->path_state;
  if (u >= s->ng) return zt_streamer_acquire(s->st, u - s->ng, flags, p, g);
  size_t off = zt_model_unit(t->model, u)->offset;
  *p = s->d_master + off;
  if (flags & ZT_STREAM_GRADS) *g = s->d_grad + off;
  return 0;
}

static void unit_put(zt_trainer *t, int u, unsigned flags) {
  off_state *s = t->path_state;
  if (u >= s->ng) zt_streamer_release(s->st, u - s->ng, flags);
}

/* The compute copy of unit u whose parameters unit_get gave as p: the fp32 parameters
 * themselves, the device-resident copy, or (bf16/fp16, streamed) the compute-copy block of the
 * unit's device copy (unit_layout_of). */
static const void *lp_of(const zt_trainer *t, int u, const void *p) {
  const off_state *s = t->path_state;
  if (!p || s->dt == ZT_F32) return p;
  const zt_unit_info *ui = zt_model_unit(t->model, u);
  if (u < s->ng) return (const char *)s->d_lp + ui->offset * zt_dtype_size(s->dt);
  return (const char *)p + s->lp_offset[u];
}


static void wait_unit_runs(off_state *s, int u) {
  for (int r = s->first_run[u]; r < s->first_run[u + 1]; r++)
    if (s->runs[r].submitted) {
      zt_cpu_pool_wait(s->pool, &s->tasks[r].job);
      s->runs[r].submitted = 0;
    }
}

static void run_task_chunk(void *arg, size_t begin, size_t end) {
  run_task *k = arg;
  size_t n = end - begin;
  if (k->src) memcpy(k->p + begin, k->src + begin, n * sizeof(float));
  zt_cpu_adam_run(k->isa, &k->h, k->p + begin, k->g + begin, k->m + begin, k->v + begin,
                  k->p_bf16 ? k->p_bf16 + begin : NULL, k->p_fp16 ? k->p_fp16 + begin : NULL, n);
  if (begin < k->out_n)
    memcpy(k->out + begin, k->p + begin, ((end < k->out_n ? end : k->out_n) - begin) * sizeof(float));
}

/* p, m, v: the unit's masters and moments (in the flat host buffers or a staging set); src: NULL,
 * or (delayed fp32) the current masters, which p receives before its update. */
static int submit_unit_adam(zt_trainer *t, int u, float *p, const float *src, float *m, float *v,
                            const zt_adam_hparams *hp) {
  off_state *s = t->path_state;
  size_t base = zt_model_unit(t->model, u)->offset;
  /* delayed: the compute copy and the stream copy go to the next buffers */
  uint16_t *lp = s->lp_nxt ? s->lp_nxt : s->lp;
  size_t pre = u < s->nh && s->scopy_nxt && u >= s->scopy0
                   ? s->scopy_off[u + 1] - s->scopy_off[u] : 0;
  if (hp->step < 1) return -EINVAL;
  for (int r = s->first_run[u]; r < s->first_run[u + 1]; r++) {
    adam_run *a = &s->runs[r];
    run_task *k = &s->tasks[r];
    size_t d = a->offset - base;
    *k = (run_task){.isa = zt_cpu_isa_best(), .h = *hp, .src = src ? src + d : NULL, .p = p + d,
                    .g = grads_of(t, u) + d, .m = m + d, .v = v + d,
                    .p_bf16 = s->dt == ZT_BF16 ? lp + (a->offset - s->lo) : NULL,
                    .p_fp16 = s->dt == ZT_F16 ? lp + (a->offset - s->lo) : NULL};
    k->h.weight_decay = a->decay ? hp->weight_decay : 0.0f;
    if (d < pre) {
      k->out = s->scopy_nxt + s->scopy_off[u] + d;
      k->out_n = pre - d < a->n ? pre - d : a->n;
    }
    k->job = (zt_cpu_job){.fn = run_task_chunk, .arg = k, .n = a->n, .chunk = ZT_CPU_ADAM_CHUNK};
    int rc = zt_cpu_pool_submit(s->pool, &k->job);
    if (rc < 0) return rc;
    a->submitted = 1;
  }
  s->adam_units++;
  return 0;
}

/* ---- optimizer state on NVMe ----------------------------------------------------------------- */

/* Starts the reads (write 0) or writes of the set's unit; on a failure waits for those started. */
static int set_io(zt_trainer *t, opt_set *x, int write) {
  off_state *s = t->path_state;
  size_t bytes = zt_model_unit(t->model, x->unit)->numel * sizeof(float);
  for (int k = 0; k < KINDS; k++) {
    int ext = s->ext[KINDS * x->unit + k];
    int rc = write ? zt_nvme_write(s->nvme, ext, 0, x->buf[k], bytes)
                   : zt_nvme_read(s->nvme, ext, 0, x->buf[k], bytes);
    if (rc < 0) {
      while (k-- > 0) zt_nvme_wait(s->nvme, x->req[k]);
      return rc;
    }
    x->req[k] = rc;
  }
  return 0;
}

static int set_wait(off_state *s, opt_set *x) {
  int rc = 0;
  for (int k = 0; k < KINDS; k++) {
    int r = zt_nvme_wait(s->nvme, x->req[k]);
    if (r < 0 && rc == 0) rc = r;
  }
  return rc;
}

/* Back to FREE: a read finished, an update waited for and written behind, a write landed. */
static int set_retire(zt_trainer *t, opt_set *x) {
  off_state *s = t->path_state;
  int rc = 0;
  if (x->st == SET_READING) rc = set_wait(s, x);
  if (x->st == SET_UPDATING) {
    wait_unit_runs(s, x->unit);
    /* the host copy the streamer fetches from, when the parameters live on the host */
    size_t a = s->scopy ? s->scopy_off[x->unit] : 0, b = s->scopy ? s->scopy_off[x->unit + 1] : 0;
    if (b > a)
      memcpy((s->scopy_nxt ? s->scopy_nxt : s->scopy) + a, x->buf[K_MASTER], (b - a) * sizeof(float));
    if ((rc = set_io(t, x, 1)) == 0) x->st = SET_WRITING;
  }
  if (x->st == SET_WRITING) rc = set_wait(s, x);
  x->st = SET_FREE;
  x->unit = -1;
  return rc;
}

/* Starts reading unit u's master, m and v into its set, unless they are there or coming. */
static int opt_read(zt_trainer *t, int u) {
  off_state *s = t->path_state;
  opt_set *x = &s->sets[u & 1];
  if (x->unit == u) return 0;
  int rc = set_retire(t, x);
  if (rc < 0) return rc;
  x->unit = u;
  if ((rc = set_io(t, x, 0)) < 0) {
    x->unit = -1;
    return rc;
  }
  x->st = SET_READING;
  return 0;
}

/* Starts unit u's AdamW: in place on the host tier; on NVMe from its set once read, then reads
 * the next unit's state ahead (the update of u and the write-behind of u + 1 run meanwhile). */
static int update_unit(zt_trainer *t, int u, const zt_adam_hparams *hp) {
  off_state *s = t->path_state;
  if (u < s->ng) {
    /* on the device, queued behind the backward; the compute copy rewritten in the same pass */
    const zt_ops *o = t->be.ops;
    size_t es = zt_dtype_size(s->dt);
    s->copy->ops->compute_mark(s->copy, 0);
    for (int r = s->first_run[u]; r < s->first_run[u + 1]; r++) {
      const adam_run *a = &s->runs[r];
      o->adamw_dt(t->be.ctx, s->d_master + a->offset, s->d_grad + a->offset, s->d_m + a->offset,
                  s->d_v + a->offset, a->n, hp->lr, hp->beta1, hp->beta2, hp->eps,
                  a->decay ? hp->weight_decay : 0.0f, hp->step, hp->grad_scale,
                  s->d_lp ? (char *)s->d_lp + a->offset * es : NULL, s->dt);
    }
    s->copy->ops->compute_mark(s->copy, 1);
    s->gpu_unit_updates++;
    return 0;
  }
  if (u < s->nh) {
    size_t o = zt_model_unit(t->model, u)->offset;
    float *p = host_at(s, K_MASTER, o);
    const float *src = NULL;
    if (s->m_nxt) { /* delayed fp32: into the other masters, which the step does not read */
      src = p;
      p = s->m_nxt + (o - s->lo);
    }
    return submit_unit_adam(t, u, p, src, host_at(s, K_M, o), host_at(s, K_V, o), hp);
  }
  opt_set *x = &s->sets[u & 1];
  int rc = opt_read(t, u);
  if (rc == 0 && x->st == SET_READING && (rc = set_wait(s, x)) < 0) {
    x->st = SET_FREE;
    x->unit = -1;
  }
  if (rc < 0) return rc;
  x->st = SET_UPDATING;
  if ((rc = submit_unit_adam(t, u, x->buf[K_MASTER], NULL, x->buf[K_M], x->buf[K_V], hp)) < 0)
    return rc;
  return u > s->nh ? opt_read(t, u - 1) : 0;
}

/* Every update started has finished and, on NVMe, been written back. */
static int finish_updates(zt_trainer *t) {
  off_state *s = t->path_state;
  int rc = 0;
  for (int u = 0; u < s->nu; u++) wait_unit_runs(s, u);
  for (int i = 0; s->nvme && i < 2; i++) {
    int r = set_retire(t, &s->sets[i]);
    if (r < 0 && rc == 0) rc = r;
  }
  return rc;
}

/* ---- the delayed update (offload.h "Delayed update") ----------------------------------------- */

/* The pieces that point into [a, a + bytes) point at the same place of b, and the reverse. */
static void rebase_pieces(off_state *s, const void *a, const void *b, size_t bytes) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  for (int k = 0; k < s->first_piece[s->nu]; k++) {
    uintptr_t h = (uintptr_t)s->pieces[k].host;
    if (h >= x && h < x + bytes)
      s->pieces[k].host = (const void *)(y + (h - x));
    else if (h >= y && h < y + bytes)
      s->pieces[k].host = (const void *)(x + (h - y));
  }
}

/* An update written into the next buffers has finished: they become the current ones, which
 * the streamer fetches from, and the current ones the next update's. */
static void swap_copies(zt_trainer *t) {
  off_state *s = t->path_state;
  size_t lp_bytes = (zt_model_num_params(t->model) - s->lo) * zt_dtype_size(s->dt);
  if (s->m_nxt) {
    rebase_pieces(s, s->h[K_MASTER], s->m_nxt, s->h_floats * sizeof(float));
    float *m = s->h[K_MASTER];
    s->h[K_MASTER] = s->m_nxt;
    s->m_nxt = m;
  }
  if (s->lp_nxt) {
    rebase_pieces(s, s->lp, s->lp_nxt, lp_bytes);
    uint16_t *l = s->lp;
    s->lp = s->lp_nxt;
    s->lp_nxt = l;
  }
  if (s->scopy_nxt) {
    rebase_pieces(s, s->scopy, s->scopy_nxt, s->scopy_off[s->nu] * sizeof(float));
    float *c = s->scopy;
    s->scopy = s->scopy_nxt;
    s->scopy_nxt = c;
  }
}

/* Starts the pending update's next units: an NVMe unit (update_unit waits for its read, then
 * reads the next one ahead), or once they are reached every host unit at once. */
static int pend_pump(zt_trainer *t) {
  off_state *s = t->path_state;
  int rc = 0;
  if (!s->pend) return 0;
  if (s->pend_next >= s->nh) {
    if ((rc = update_unit(t, s->pend_next, &s->pend_hp)) == 0) s->pend_next--;
    return rc;
  }
  while (rc == 0 && s->pend_next >= s->ng)
    if ((rc = update_unit(t, s->pend_next, &s->pend_hp)) == 0) s->pend_next--;
  return rc;
}

/* Step k's update deferred: every host unit's started at once when there is no NVMe unit, else
 * the first NVMe unit's read; the walks of step k + 1 start the rest (pend_pump). */
static int pend_start(zt_trainer *t, const zt_adam_hparams *hp, int step) {
  off_state *s = t->path_state;
  s->pend = 1;
  s->pend_hp = *hp;
  s->pend_step = step;
  s->pend_next = s->nu - 1;
  return s->pend_next >= s->nh ? opt_read(t, s->pend_next) : pend_pump(t);
}

/* Before step k + 1 writes back streamed unit u's gradients over step k's: the pending update
 * of u started and done reading them. */
static int pend_wait_unit(zt_trainer *t, int u) {
  off_state *s = t->path_state;
  int rc = 0;
  while (rc == 0 && s->pend && s->pend_next >= u) rc = pend_pump(t);
  wait_unit_runs(s, u);
  return rc;
}

/* Lands the pending update: every unit started and finished (NVMe ones written back), the next
 * buffers made current, the device copies of the stale ones dropped. A failure leaves the state
 * between two steps: broken. */
static int pend_finish(zt_trainer *t) {
  off_state *s = t->path_state;
  int rc = 0;
  if (!s->pend) return 0;
  while (rc == 0 && s->pend_next >= s->ng) rc = pend_pump(t);
  int frc = finish_updates(t);
  if (rc == 0) rc = frc;
  s->pend = 0;
  if (rc < 0) {
    s->broken = 1;
    return rc;
  }
  swap_copies(t);
  return zt_streamer_invalidate(s->st, -1);
}

/* err for a failure of pend_*: the NVMe store's message or the errno's */
static void pend_fail(zt_trainer *t, int rc, int step, char *err, size_t errlen) {
  off_state *s = t->path_state;
  snprintf(err, errlen, "step %d: the delayed AdamW update of step %d failed: %s", step,
           s->pend_step, s->nvme && zt_nvme_store_error(s->nvme)[0] ? zt_nvme_store_error(s->nvme)
                                                                     : strerror(-rc));
}

/* With overlap, each unit's update starts as soon as its gradients are final; a unit whose
 * gradients are not finite stops the updates (*bad_unit gets it). */
typedef struct overlap {
  int on;
  const zt_adam_hparams *hp;
  int bad_unit, updated;
  double sumsq;  /* the units' sums of squares, added in the backward's order */
  int summed;    /* units summed */
} overlap;

/* err gets the message of a failure: the streamer's, or the update's (the NVMe store's names
 * the file and the cause). */
static int unit_done(zt_trainer *t, int u, overlap *ov, char *err, size_t errlen) {
  off_state *s = t->path_state;
  if (!ov->on || ov->bad_unit >= 0 || u < s->ng) return 0;
  const zt_unit_info *ui = zt_model_unit(t->model, u);
  int rc = zt_streamer_wait_grads(s->st, u - s->ng);
  if (rc < 0) {
    snprintf(err, errlen, "offload step %d: unit %s: %s", t->step + 1, ui->name,
             zt_streamer_error(s->st));
    return rc;
  }
  int nonfinite = 0;
  ov->sumsq += s->hbe.ops->sum_squares(s->hbe.ctx, grads_of(t, u), ui->numel, &nonfinite);
  ov->summed++;
  if (nonfinite) {
    ov->bad_unit = u;
    return 0;
  }
  s->updated[u] = 1;
  if ((rc = update_unit(t, u, ov->hp)) < 0) {
    snprintf(err, errlen, "step %d: the AdamW update failed: %s", t->step + 1,
             s->nvme && zt_nvme_store_error(s->nvme)[0] ? zt_nvme_store_error(s->nvme)
                                                         : strerror(-rc));
    return rc;
  }
  ov->updated++;
  s->adam_overlapped++;
  return 0;
}

/* Delayed: the pending update's units are started one a unit (pend_pump), behind the unit's
 * compute so that the device has work while an NVMe read is waited for. */
static int walk_forward(zt_trainer *t, char *err, size_t errlen) {
  off_state *s = t->path_state;
  for (int u = 0; u < s->nu; u++) {
    void *p = NULL, *e = NULL;
    int rc = unit_get(t, u, 0, &p, NULL), prc = 0;
    if (rc == 0 && u == s->head && (rc = unit_get(t, 0, 0, &e, NULL)) < 0) {
      unit_put(t, u, 0);
      p = NULL;
    }
    if (rc == 0 && (rc = prefetch_from(s, u, 1)) == 0) {
      s->copy->ops->compute_mark(s->copy, 0);
      zt_model_unit_forward_dt(t->model, t->acts, u, p, lp_of(t, u, p), e, lp_of(t, 0, e));
      s->copy->ops->compute_mark(s->copy, 1);
      prc = pend_pump(t);
    }
    if (e) unit_put(t, 0, 0);
    if (p) unit_put(t, u, 0);
    if (rc < 0) return stream_fail(t, rc, err, errlen);
    if (prc < 0) {
      pend_fail(t, prc, t->step + 1, err, errlen);
      return prc;
    }
  }
  return 0;
}

/* first: the first counted micro-batch of the step, whose gradient buffers start at zero; later
 * ones continue the host's running sum. last: the last counted one. With the sums on the device
 * (dsum, zeroed by the step) every micro-batch resumes them and only the last writes them back. */
static int walk_backward(zt_trainer *t, int first, int last, overlap *ov, char *err,
                         size_t errlen) {
  off_state *s = t->path_state;
  unsigned gflags = ZT_STREAM_GRADS | (first && !s->dsum ? 0u : ZT_STREAM_GRADS_RESUME);
  /* this walk's write-backs, and whether they are the step's first to the host */
  unsigned dirty = s->dsum && !last ? 0u : ZT_STREAM_DIRTY | ZT_STREAM_STORE;
  int first_to_host = s->dsum ? last : first;
  int done = s->nu - 1; /* the next unit to hand to unit_done */
  for (int u = s->nu - 1; u >= 0; u--) {
    void *p = NULL, *e = NULL;
    float *g = NULL, *eg = NULL;
    int companion_of_head = u == 0 && s->head >= 0; /* unit 0 holds its buffer since the head */
    int rc = companion_of_head ? unit_get(t, u, 0, &p, NULL) : unit_get(t, u, gflags, &p, &g);
    if (rc == 0 && companion_of_head) g = s->embed_grads;
    if (rc == 0 && u == s->head) {
      if ((rc = unit_get(t, 0, gflags, &e, &eg)) < 0) {
        unit_put(t, u, 0);
        p = NULL;
      }
      s->embed_grads = eg;
    }
    if (rc == 0 && (rc = prefetch_from(s, u, -1)) == 0) {
      s->copy->ops->compute_mark(s->copy, 0);
      zt_model_unit_backward_dt(t->model, t->acts, u, p, lp_of(t, u, p), g, e, lp_of(t, 0, e),
                                eg);
      s->copy->ops->compute_mark(s->copy, 1);
    }
    /* a failed step's gradients are dropped, not written back */
    unsigned rflags = rc == 0 ? dirty : 0;
    /* delayed: the first write-back replaces the gradients the pending update reads */
    int prc = 0;
    if (rflags && first_to_host && s->pend && u >= s->ng && (prc = pend_wait_unit(t, u)) < 0)
      rflags = 0;
    /* the ring: the write-back of unit u (unit 0's too, held since the head) goes to the slot
     * whose previous user, ring units back, may still be read by its AdamW */
    if (s->ring && u >= s->ng && u + s->ring < s->nu) wait_unit_runs(s, u + s->ring);
    if (p) unit_put(t, u, rflags);
    if (s->embed_grads && (companion_of_head || rc < 0)) {
      unit_put(t, 0, rflags);
      s->embed_grads = NULL;
    }
    if (rc < 0) return stream_fail(t, rc, err, errlen);
    if (prc < 0) {
      pend_fail(t, prc, t->step + 1, err, errlen);
      return prc;
    }
    /* A unit is done (its gradients read on the host) UNIT_DONE_LAG units behind the one just
     * queued, so that on a GPU the runner never waits for a write-back whose backward is the
     * last compute queued: the device always has the next unit's work. */
    for (; done > u + UNIT_DONE_LAG || (u == 0 && done >= 0); done--)
      if ((rc = unit_done(t, done, ov, err, errlen)) < 0) return rc;
  }
  return 0;
}

static int last_counted_micro(const zt_trainer *t, const int32_t *tokens) {
  int T = zt_model_cfg_of(t->model)->seq_len, last = -1;
  size_t mt = zt_trainer_micro_tokens(t);
  for (int k = 0; k < t->tc.grad_accum; k++)
    for (int b = 0; b < t->tc.micro_batch && last < k; b++)
      for (int j = 1; j <= T; j++)
        if (tokens[(size_t)k * mt + (size_t)b * (T + 1) + j] >= 0) {
          last = k;
          break;
        }
  return last;
}

static int off_step(zt_trainer *t, const int32_t *tokens, zt_step_result *res, char *err,
                    size_t errlen) {
  off_state *s = t->path_state;
  const zt_ops *o = t->be.ops;
  const zt_model_cfg *mc = zt_model_cfg_of(t->model);
  const zt_train_cfg *c = &t->tc;
  int N = c->micro_batch * mc->seq_len, step = t->step + 1, adam_step = t->adam_step + 1;
  size_t n = zt_model_num_params(t->model);
  /* fp16 scales the loss gradient; 1 (which changes no bit) otherwise */
  float loss_scale = s->dt == ZT_F16 ? t->scaler.scale : 1.0f;
  if (s->broken) {
    snprintf(err, errlen, "step %d: an earlier step failed after updating part of the "
             "parameters; load a checkpoint to continue", step);
    return -EIO;
  }
  int rc = zt__trainer_check_tokens(t, tokens, err, errlen);
  if (rc < 0) return rc;
  uint64_t t0 = zt_now_ns();
  float lr = zt_train_lr(c, step);
  zt_adam_hparams hp = {.lr = lr, .beta1 = c->beta1, .beta2 = c->beta2, .eps = c->eps,
                        .weight_decay = c->weight_decay, .step = adam_step, .grad_scale = 1.0f};
  int last = last_counted_micro(t, tokens);
  /* delayed_update: this step's update of the streamed units runs during the next step */
  int defer = s->delayed && step > 1;
  memset(s->updated, 0, (size_t)s->nu);
  /* the device-resident units accumulate every micro-batch in place, as without offload; so do
   * the streamed ones with dsum, once the last step's write-backs of their sums have landed */
  if (s->ng) o->zero(t->be.ctx, s->d_grad, s->ng_floats * sizeof(float));
  if (s->dsum && (rc = zt_streamer_wait_grads(s->st, -1)) < 0) {
    snprintf(err, errlen, "offload step %d: %s", step, zt_streamer_error(s->st));
    return rc;
  }
  if (s->dsum) o->zero(t->be.ctx, s->d_sum, (n - s->ng_floats) * sizeof(float));
  overlap ov = {.on = 0, .hp = &hp, .bad_unit = -1};
  double loss = 0;
  int counted_micros = 0;
  for (int k = 0; k < c->grad_accum; k++) {
    int counted = zt__trainer_stage_micro(t, tokens, k);
    if (!counted) continue;
    if ((rc = walk_forward(t, err, errlen)) < 0) goto out;
    double loss_sum = 0;
    int n_counted = 0;
    s->copy->ops->compute_mark(s->copy, 0);
    zt_model_loss(t->model, t->acts,
                  (float)((double)loss_scale / ((double)counted * c->grad_accum)));
    s->copy->ops->compute_mark(s->copy, 1);
    /* clipping needs the norm, fp16 the overflow verdict, of the whole backward first */
    ov.on = !defer && k == last && c->grad_clip == 0 && s->dt != ZT_F16;
    if ((rc = walk_backward(t, counted_micros == 0, k == last, &ov, err, errlen)) < 0) goto out;
    zt_acts_loss(t->acts, &loss_sum, &n_counted);
    loss += loss_sum / n_counted;
    counted_micros++;
  }
  if ((rc = zt_streamer_wait_grads(s->st, -1)) < 0) {
    snprintf(err, errlen, "offload step %d: %s", step, zt_streamer_error(s->st));
    goto out;
  }
  /* the previous step's update lands before this one's verdict, whatever it is (and before
   * a step without a counted micro-batch zeroes the gradients it reads) */
  if ((rc = pend_finish(t)) < 0) {
    pend_fail(t, rc, step, err, errlen);
    goto out;
  }
  /* nothing counted: the gradients of an all-on-device step are the zeros it started from (with
   * the ring, nothing reads the slots until these updates, which read them all) */
  if (!counted_micros && s->grads) memset(s->grads, 0, (n - s->lo) * sizeof(float));
  for (int i = 0; !counted_micros && i < s->ring; i++)
    memset(s->slot[i], 0, s->ring_floats * sizeof(float));
  int nonfinite = 0;
  double norm;
  if (!s->ring && !s->own_hbe && (s->d_alias || !s->ng)) {
    /* the CPU backend: the norm of the run without offload, over the same flat buffer */
    norm = sqrt(s->hbe.ops->sum_squares(s->hbe.ctx, s->grads, n, &nonfinite));
  } else {
    /* beside a GPU or with the ring: the device units' sum there, the streamed units' from the
     * overlap's per-unit sums when it reached them all (each gradient read once on the host);
     * the ring's are all in them unless a unit was not finite, or zeros */
    int dev_nonfinite = 0;
    double dev = s->ng ? o->sum_squares(t->be.ctx, s->d_grad, s->ng_floats, &dev_nonfinite) : 0;
    double host = s->ring || (ov.summed == s->nu - s->ng && counted_micros)
                      ? (counted_micros ? ov.sumsq : 0)
                      : s->hbe.ops->sum_squares(s->hbe.ctx, s->grads + (s->ng_floats - s->lo),
                                                n - s->ng_floats, &nonfinite);
    norm = sqrt(dev + host);
    nonfinite |= dev_nonfinite || ov.bad_unit >= 0;
  }
  /* the norm of the unscaled gradients: loss_scale is a power of two, so dividing the norm is
   * unscaling every value first */
  norm /= loss_scale;
  if (nonfinite && s->dt == ZT_F16) {
    /* GradScaler skips the step: nothing was updated (fp16 never overlaps), AdamW's step count
     * stays, the scale backs off; the step still counts */
    if ((rc = o->sync(t->be.ctx)) < 0) {
      snprintf(err, errlen, "backend %s failed during step %d: %s", o->name, step,
               o->error_text(t->be.ctx));
      goto out;
    }
    zt_loss_scaler_update(&t->scaler, 1);
    t->step = step;
    s->step_ns += zt_now_ns() - t0;
    if (res)
      *res = (zt_step_result){.step = step, .loss = counted_micros ? loss / counted_micros : 0.0,
                              .grad_norm = norm, .lr = lr, .tokens = (int64_t)N * c->grad_accum,
                              .skipped = 1, .loss_scale = t->scaler.scale};
    goto out;
  }
  if (nonfinite) {
    finish_updates(t);
    rc = -ERANGE;
    if (ov.updated) {
      s->broken = 1;
      snprintf(err, errlen, "step %d: the gradient of unit %s has inf or nan values (loss %g); "
               "%d unit(s) after it in the backward were updated already", step,
               zt_model_unit(t->model, ov.bad_unit >= 0 ? ov.bad_unit : 0)->name,
               counted_micros ? loss / counted_micros : 0.0, ov.updated);
    } else {
      snprintf(err, errlen, "step %d: the gradient has inf or nan values (loss %g); parameters "
               "left unchanged", step, counted_micros ? loss / counted_micros : 0.0);
    }
    goto out;
  }
  if (c->grad_clip > 0) {
    double coef = c->grad_clip / (norm + 1e-6);
    if (coef < 1.0) hp.grad_scale = (float)coef;
  }
  /* AdamW sees g * clip / loss_scale: the unscaled, clipped gradient (the device units' too) */
  if (s->dt == ZT_F16) hp.grad_scale = (float)((double)hp.grad_scale / loss_scale);
  /* the units the overlap did not reach (all of them with clipping or without a counted
   * micro-batch), in the backward's order; deferred: the device units alone */
  for (int u = defer ? s->ng - 1 : s->nu - 1; u >= 0 && rc == 0; u--)
    if (!s->updated[u]) {
      s->updated[u] = 1;
      rc = update_unit(t, u, &hp);
    }
  int frc = finish_updates(t);
  if (rc == 0) rc = frc;
  /* delayed, not deferred (step 1): the update wrote the next buffers */
  if (rc == 0 && s->delayed && !defer) swap_copies(t);
  if (rc < 0) {
    s->broken = 1;
    snprintf(err, errlen, "step %d: the AdamW update failed: %s", step,
             s->nvme && zt_nvme_store_error(s->nvme)[0] ? zt_nvme_store_error(s->nvme)
                                                         : strerror(-rc));
    goto out;
  }
  /* the masters changed: every device copy is stale */
  if ((rc = zt_streamer_invalidate(s->st, -1)) < 0) {
    snprintf(err, errlen, "offload step %d: %s", step, zt_streamer_error(s->st));
    goto out;
  }
  if ((rc = o->sync(t->be.ctx)) < 0) {
    snprintf(err, errlen, "backend %s failed during step %d: %s", o->name, step,
             o->error_text(t->be.ctx));
    goto out;
  }
  if (defer && (rc = pend_start(t, &hp, step)) < 0) {
    s->broken = 1;
    pend_fail(t, rc, step, err, errlen);
    goto out;
  }
  if (s->dt == ZT_F16) zt_loss_scaler_update(&t->scaler, 0);
  t->step = step;
  t->adam_step = adam_step;
  s->step_ns += zt_now_ns() - t0;
  if (res)
    *res = (zt_step_result){.step = step, .loss = counted_micros ? loss / counted_micros : 0.0,
                            .grad_norm = norm, .lr = lr, .tokens = (int64_t)N * c->grad_accum,
                            .skipped = 0, .loss_scale = s->dt == ZT_F16 ? t->scaler.scale : 1.0f};
out:
  if (rc < 0) {
    /* a pending update of the step before lands (a failure of it breaks the state) */
    if (pend_finish(t) < 0) s->broken = 1;
    finish_updates(t);
    /* updates that overlapped the backward stay: the state is no step's */
    for (int u = 0; u < s->nu; u++) s->broken |= s->updated[u];
    zt_streamer_invalidate(s->st, -1);
  }
  return rc;
}

/* ---- the path -------------------------------------------------------------------------------- */

/* The device-resident units' part of the flat range [base, end) (they are its first ng_floats
 * floats), out[k] holding the range; nothing to do where the device buffers are the host's. */
static int read_device_units(zt_trainer *t, size_t base, size_t end, float *out[KINDS]) {
  off_state *s = t->path_state;
  if (!s->ng || s->d_alias || base >= s->ng_floats) return 0;
  size_t n = (end < s->ng_floats ? end : s->ng_floats) - base;
  const float *dev[KINDS] = {s->d_master, s->d_m, s->d_v};
  for (int k = 0; k < KINDS; k++)
    if (out[k]) t->be.ops->to_host(t->be.ctx, out[k], dev[k] + base, n * sizeof(float));
  return t->be.ops->sync(t->be.ctx);
}

/* in[k] NULL: zeros */
static int write_device_units(zt_trainer *t, size_t base, size_t end, const float *in[KINDS]) {
  off_state *s = t->path_state;
  if (!s->ng || s->d_alias || base >= s->ng_floats) return 0;
  size_t n = (end < s->ng_floats ? end : s->ng_floats) - base;
  float *dev[KINDS] = {s->d_master, s->d_m, s->d_v};
  for (int k = 0; k < KINDS; k++) {
    if (in[k])
      t->be.ops->to_device(t->be.ctx, dev[k] + base, in[k], n * sizeof(float));
    else
      t->be.ops->zero(t->be.ctx, dev[k] + base, n * sizeof(float));
  }
  if (s->d_lp)
    t->be.ops->cast(t->be.ctx, (char *)s->d_lp + base * zt_dtype_size(s->dt), s->dt,
                    s->d_master + base, ZT_F32, n);
  return t->be.ops->sync(t->be.ctx);
}

/* Units [u0, u1): the host tier's part of their flat range [base, end), the NVMe units' files
 * one unit at a time through the first set, the device units'. err: the NVMe store's message
 * (it names the file) or the backend's. */
static int off_read_state(zt_trainer *t, int u0, int u1, float *params, float *m, float *v,
                          char *err, size_t errlen) {
  off_state *s = t->path_state;
  float *out[KINDS] = {params, m, v};
  size_t base = zt_model_unit(t->model, u0)->offset;
  size_t end = zt_model_unit(t->model, u1 - 1)->offset + zt_model_unit(t->model, u1 - 1)->numel;
  size_t a = base > s->lo ? base : s->lo, b = end < s->lo + s->h_floats ? end : s->lo + s->h_floats;
  /* delayed: the state of the last step, its update landed */
  int rc = pend_finish(t), frc = finish_updates(t);
  if (rc == 0) rc = frc;
  for (int k = 0; k < KINDS && a < b && rc == 0; k++)
    if (out[k]) memcpy(out[k] + (a - base), s->h[k] + (a - s->lo), (b - a) * sizeof(float));
  opt_set *x = &s->sets[0];
  for (int u = u0 > s->nh ? u0 : s->nh; u < u1 && rc == 0; u++) {
    const zt_unit_info *ui = zt_model_unit(t->model, u);
    x->unit = u;
    if ((rc = set_io(t, x, 0)) < 0 || (rc = set_wait(s, x)) < 0) break;
    for (int k = 0; k < KINDS; k++)
      if (out[k]) memcpy(out[k] + (ui->offset - base), x->buf[k], ui->numel * sizeof(float));
  }
  x->unit = -1;
  if (rc < 0) {
    snprintf(err, errlen, "%s", s->nvme && zt_nvme_store_error(s->nvme)[0]
                                    ? zt_nvme_store_error(s->nvme)
                                    : strerror(-rc));
    return rc;
  }
  if ((rc = read_device_units(t, base, end, out)) < 0)
    snprintf(err, errlen, "the device-resident units: %s", t->be.ops->error_text(t->be.ctx));
  return rc;
}

/* m and v NULL: zeros (the trainer's initial state; the open writes it before the host units'
 * m and v exist, write_initial_state). A failure leaves part of the range written: steps are
 * refused (broken) until a write succeeds, and a load that stops between ranges is the
 * trainer's to refuse (part_loaded). */
static int off_write_state(zt_trainer *t, int u0, int u1, const float *params, const float *m,
                           const float *v, char *err, size_t errlen) {
  off_state *s = t->path_state;
  const float *in[KINDS] = {params, m, v};
  size_t base = zt_model_unit(t->model, u0)->offset;
  size_t end = zt_model_unit(t->model, u1 - 1)->offset + zt_model_unit(t->model, u1 - 1)->numel;
  size_t a = base > s->lo ? base : s->lo, b = end < s->lo + s->h_floats ? end : s->lo + s->h_floats;
  /* delayed: the pending update lands first (its NVMe writes must not follow these) */
  int rc = pend_finish(t), frc = finish_updates(t);
  if (rc == 0) rc = frc;
  for (int k = 0; k < KINDS && a < b; k++) {
    if (!s->h[k]) continue;
    if (in[k])
      memcpy(s->h[k] + (a - s->lo), in[k] + (a - base), (b - a) * sizeof(float));
    else
      memset(s->h[k] + (a - s->lo), 0, (b - a) * sizeof(float));
  }
  opt_set *x = &s->sets[0];
  for (int u = u0 > s->nh ? u0 : s->nh; u < u1 && rc == 0; u++) {
    const zt_unit_info *ui = zt_model_unit(t->model, u);
    x->unit = u;
    for (int k = 0; k < KINDS; k++) {
      if (in[k])
        memcpy(x->buf[k], in[k] + (ui->offset - base), ui->numel * sizeof(float));
      else
        memset(x->buf[k], 0, ui->numel * sizeof(float));
    }
    if ((rc = set_io(t, x, 1)) == 0) rc = set_wait(s, x);
  }
  x->unit = -1;
  /* the host copy the units stream from */
  for (int u = u0 > s->scopy0 ? u0 : s->scopy0; u < u1 && rc == 0 && s->scopy; u++)
    memcpy(s->scopy + s->scopy_off[u], params + (zt_model_unit(t->model, u)->offset - base),
           (s->scopy_off[u + 1] - s->scopy_off[u]) * sizeof(float));
  if (rc < 0) {
    s->broken = 1;
    snprintf(err, errlen, "offload: writing the optimizer state failed: %s",
             s->nvme && zt_nvme_store_error(s->nvme)[0] ? zt_nvme_store_error(s->nvme)
                                                        : strerror(-rc));
    return rc;
  }
  if ((rc = write_device_units(t, base, end, in)) < 0) {
    s->broken = 1;
    snprintf(err, errlen, "offload: writing the device-resident units failed: %s",
             t->be.ops->error_text(t->be.ctx));
    return rc;
  }
  /* the compute copy (over [lo, n)) follows the masters */
  a = base > s->lo ? base : s->lo;
  if (s->lp && a < end)
    s->hbe.ops->cast(s->hbe.ctx, s->lp + (a - s->lo), s->dt, params + (a - base), ZT_F32,
                     end - a);
  if (s->st && (rc = zt_streamer_invalidate(s->st, -1)) < 0) {
    s->broken = 1;
    snprintf(err, errlen, "offload: %s", zt_streamer_error(s->st));
    return rc;
  }
  s->broken = 0;
  return 0;
}

static size_t off_backend_bytes(const zt_trainer *t) {
  const off_state *s = t->path_state;
  return s->act_bytes + s->dev_unit_bytes + s->dsum_bytes + s->arena_budget;
}

static void off_close(zt_trainer *t) {
  off_state *s = t->path_state;
  if (!s) return;
  zt_streamer_close(s->st);
  zt_cpu_pool_close(s->pool);
  zt_copy_close(s->copy);
  zt_dev_arena_close(s->dev);
  zt_nvme_store_close(s->nvme); /* its files with it */
  if (s->nvme_dir[0]) rmdir(s->nvme_dir);
  zt_host_arena_close(s->host); /* masters, m, v, gradients and the staging with it */
  free(s->slot);
  free(s->scopy_off);
  free(s->ext);
  free(s->updated);
  free(s->runs);
  free(s->tasks);
  free(s->first_run);
  free(s->pieces);
  free(s->first_piece);
  free(s->lp_offset);
  if (!s->d_alias) {
    void *dev[] = {s->d_master, s->d_m, s->d_v, s->d_grad, s->d_lp};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
      if (dev[i]) t->be.ops->free(t->be.ctx, dev[i]);
  }
  if (s->d_sum) t->be.ops->free(t->be.ctx, s->d_sum);
  if (s->own_hbe) zt_backend_close(&s->hbe);
  free(s);
  t->path_state = NULL;
}

static const zt__train_path offload_path = {
    .step = off_step,
    .read_state = off_read_state,
    .write_state = off_write_state,
    .backend_bytes = off_backend_bytes,
    .close = off_close,
};

static int build_runs(const zt_model *m, off_state *s) {
  int nt = zt_model_num_tensors(m);
  s->runs = calloc((size_t)nt, sizeof *s->runs);
  s->tasks = calloc((size_t)nt, sizeof *s->tasks);
  s->first_run = calloc((size_t)s->nu + 1, sizeof *s->first_run);
  if (!s->runs || !s->tasks || !s->first_run) return -ENOMEM;
  int r = 0;
  for (int i = 0; i < nt; i++) {
    const zt_tensor_info *ti = zt_model_tensor(m, i);
    adam_run *prev = r ? &s->runs[r - 1] : NULL;
    if (prev && prev->decay == ti->decay && zt_model_tensor(m, i - 1)->unit == ti->unit &&
        prev->offset + prev->n == ti->offset) {
      prev->n += ti->numel;
      continue;
    }
    s->runs[r++] = (adam_run){.offset = ti->offset, .n = ti->numel, .decay = ti->decay};
  }
  /* tensors are in layout order, units contiguous: runs of unit u follow those of u - 1 */
  for (int u = 0, k = 0; u <= s->nu; u++) {
    while (k < r && u < s->nu && s->runs[k].offset < zt_model_unit(m, u)->offset) k++;
    s->first_run[u] = u < s->nu ? k : r;
  }
  return 0;
}

/* A unit's device copy (bf16/fp16): the model addresses a tensor's fp32 copy at p + 4 * its offset
 * in the unit and its compute copy at p_lp + 2 * that offset, so the copy holds the fp32
 * tensors it reads at those places from p, and the compute-copy block from p_lp = p + lp_offset,
 * far enough on that no compute-copy tensor overlaps an fp32 one (256-aligned). The layouts put
 * a block's vectors before its matrices, so this is little more than the compute copy: fp32
 * vectors, then the 16-bit matrices. Only the bytes the ops read are copied in
 * (zt_tensor_info.reads). fp32 compute: the unit's fp32 parameters, lp_offset 0. */
typedef struct unit_layout {
  size_t lp_offset, bytes;
  size_t f32_end; /* the fp32 tensors read lie in the unit's first f32_end bytes */
} unit_layout;

static unit_layout unit_layout_of(const zt_model *m, int u, zt_dtype dt) {
  const zt_unit_info *ui = zt_model_unit(m, u);
  if (dt == ZT_F32) return (unit_layout){0, ui->numel * sizeof(float), ui->numel * sizeof(float)};
  size_t es = zt_dtype_size(dt), f32_end = 0, lp_begin = SIZE_MAX, lp_end = 0;
  for (int i = ui->first_tensor; i < ui->first_tensor + ui->n_tensors; i++) {
    const zt_tensor_info *ti = zt_model_tensor(m, i);
    size_t a = ti->offset - ui->offset, b = a + ti->numel;
    if ((ti->reads & ZT_READS_F32) && b * sizeof(float) > f32_end) f32_end = b * sizeof(float);
    if ((ti->reads & ZT_READS_LP) && a * es < lp_begin) lp_begin = a * es;
    if ((ti->reads & ZT_READS_LP) && b * es > lp_end) lp_end = b * es;
  }
  if (lp_begin == SIZE_MAX) return (unit_layout){0, f32_end, f32_end};
  size_t gap = f32_end > lp_begin ? f32_end - lp_begin : 0;
  size_t lp_offset = (gap + ZT_DEV_ARENA_ALIGN - 1) / ZT_DEV_ARENA_ALIGN * ZT_DEV_ARENA_ALIGN;
  size_t bytes = lp_offset + lp_end > f32_end ? lp_offset + lp_end : f32_end;
  return (unit_layout){lp_offset, bytes, f32_end};
}

static size_t unit_param_bytes(const zt_model *m, int u, zt_dtype dt) {
  return unit_layout_of(m, u, dt).bytes;
}

/* The bytes one fetch of unit u moves: its fp32 parameters, or (bf16/fp16) the copies its ops
 * read. */
static size_t unit_fetch_bytes(const zt_model *m, int u, zt_dtype dt) {
  const zt_unit_info *ui = zt_model_unit(m, u);
  if (dt == ZT_F32) return ui->numel * sizeof(float);
  size_t sum = 0;
  for (int i = ui->first_tensor; i < ui->first_tensor + ui->n_tensors; i++) {
    const zt_tensor_info *ti = zt_model_tensor(m, i);
    if (ti->reads & ZT_READS_F32) sum += ti->numel * sizeof(float);
    if (ti->reads & ZT_READS_LP) sum += ti->numel * zt_dtype_size(dt);
  }
  return sum;
}

/* bf16/fp16: each unit's pieces, runs of consecutive tensors read in the same copy (masters or
 * compute copy), placed at the tensors' offsets in the unit's fp32 block or 16-bit block. */
static int build_pieces(zt_trainer *t) {
  off_state *s = t->path_state;
  const zt_model *m = t->model;
  int nt = zt_model_num_tensors(m);
  s->pieces = calloc(2 * (size_t)nt, sizeof *s->pieces);
  s->first_piece = calloc((size_t)s->nu + 1, sizeof *s->first_piece);
  s->lp_offset = calloc((size_t)s->nu, sizeof *s->lp_offset);
  if (!s->pieces || !s->first_piece || !s->lp_offset) return -ENOMEM;
  for (int u = 0; u < s->nu; u++) s->lp_offset[u] = unit_layout_of(m, u, s->dt).lp_offset;
  int np = 0;
  for (int u = 0; u < s->nu; u++) {
    const zt_unit_info *ui = zt_model_unit(m, u);
    s->first_piece[u] = np;
    if (u < s->ng) continue; /* not streamed */
    if (s->dt == ZT_F32) { /* delayed: the masters or the stream copy, whole */
      s->pieces[np++] = (zt_stream_piece){
          .dev_offset = 0,
          .host = u < s->nh ? (const void *)host_at(s, K_MASTER, ui->offset)
                            : (const void *)(s->scopy + s->scopy_off[u]),
          .bytes = ui->numel * sizeof(float)};
      continue;
    }
    for (int i = ui->first_tensor; i < ui->first_tensor + ui->n_tensors; i++) {
      const zt_tensor_info *ti = zt_model_tensor(m, i);
      size_t in_unit = ti->offset - ui->offset;
      for (unsigned kind = ZT_READS_F32; kind <= ZT_READS_LP; kind <<= 1) {
        if (!(ti->reads & kind)) continue;
        int lp = kind == ZT_READS_LP;
        size_t es = lp ? zt_dtype_size(s->dt) : sizeof(float);
        zt_stream_piece pc = {
            .dev_offset = (lp ? s->lp_offset[u] : 0) + in_unit * es,
            .host = lp               ? (const void *)lp_at(s, ti->offset)
                    : u < s->scopy0 ? (const void *)host_at(s, K_MASTER, ti->offset)
                                     : (const void *)(s->scopy + s->scopy_off[u] + in_unit),
            .bytes = ti->numel * es};
        /* the pieces of a unit are not sorted by kind: extend any that ends where this begins */
        int merged = 0;
        for (int k = s->first_piece[u]; k < np && !merged; k++) {
          zt_stream_piece *q = &s->pieces[k];
          if (q->dev_offset + q->bytes == pc.dev_offset &&
              (const char *)q->host + q->bytes == (const char *)pc.host) {
            q->bytes += pc.bytes;
            merged = 1;
          }
        }
        if (!merged) s->pieces[np++] = pc;
      }
    }
  }
  s->first_piece[s->nu] = np;
  return 0;
}

/* The device-resident units' buffers: backend memory, or with d_alias (the cpu backend with the
 * optimizer on the host and the flat gradients) the host tier's buffers themselves (from float
 * 0), which makes the norm and the state reads those of the run without offload. Called once
 * the host's buffers are all there; the initial state comes with off_write_state. */
static int open_device_units(zt_trainer *t) {
  off_state *s = t->path_state;
  if (!s->ng) return 0;
  if (s->d_alias) {
    s->d_master = s->h[K_MASTER];
    s->d_m = s->h[K_M];
    s->d_v = s->h[K_V];
    s->d_grad = s->grads;
    s->d_lp = s->lp;
    return 0;
  }
  size_t bytes = s->ng_floats * sizeof(float);
  float **f[] = {&s->d_master, &s->d_m, &s->d_v, &s->d_grad};
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
    if (!(*f[i] = t->be.ops->alloc(t->be.ctx, bytes))) return -ENOMEM;
  if (s->dt != ZT_F32 &&
      !(s->d_lp = t->be.ops->alloc(t->be.ctx, s->ng_floats * zt_dtype_size(s->dt))))
    return -ENOMEM;
  return 0;
}

/* The device arena's block from the backend (cudaMalloc, 256-byte aligned). */
static int dev_block_alloc(void *ctx, size_t bytes, void **out) {
  zt_backend *be = ctx;
  *out = be->ops->alloc(be->ctx, bytes);
  return *out ? 0 : -ENOMEM;
}

static void dev_block_free(void *ctx, void *p, size_t bytes) {
  zt_backend *be = ctx;
  (void)bytes;
  be->ops->free(be->ctx, p);
}

static const char *const kind_names[KINDS] = {"master", "exp_avg", "exp_avg_sq"};

/* The files open_nvme reserves: a master, exp_avg and exp_avg_sq per unit from nh on (the NVMe
 * units), each in the store's whole blocks. */
static uint64_t nvme_file_bytes(const zt_model *m, int nh) {
  uint64_t sum = 0;
  for (int u = nh; u < zt_model_num_units(m); u++) {
    uint64_t file = zt_model_unit(m, u)->numel * sizeof(float);
    sum += KINDS * ((file + ZT_NVME_ALIGN - 1) / ZT_NVME_ALIGN * ZT_NVME_ALIGN);
  }
  return sum;
}

/* The store under nvme_dir with a file per NVMe unit and kind; off_write_state fills them. */
static int open_nvme(zt_trainer *t, char *err, size_t errlen) {
  off_state *s = t->path_state;
  int rc = 0;
  if (!(s->ext = malloc((size_t)s->nu * KINDS * sizeof *s->ext))) {
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  /* a directory of its own, so that trainers can share nvme_dir */
  snprintf(s->nvme_dir, sizeof s->nvme_dir, "%s/zt-offload.XXXXXX", s->oc.nvme_dir);
  if (strlen(s->oc.nvme_dir) + 20 >= sizeof s->nvme_dir || !mkdtemp(s->nvme_dir)) {
    rc = strlen(s->oc.nvme_dir) + 20 >= sizeof s->nvme_dir ? -ENAMETOOLONG : -errno;
    snprintf(err, errlen, "offload.nvme_dir: %s: %s", s->oc.nvme_dir, strerror(-rc));
    s->nvme_dir[0] = 0;
    return rc;
  }
  if ((rc = zt_nvme_store_open(&s->nvme, s->nvme_dir, NULL, err, errlen)) < 0) {
    char why[256];
    snprintf(why, sizeof why, "%s", err);
    snprintf(err, errlen, "offload.nvme_dir: %s", why);
    return rc;
  }
  for (int u = s->nh; u < s->nu; u++)
    for (int k = 0; k < KINDS; k++) {
      char name[64];
      const zt_unit_info *ui = zt_model_unit(t->model, u);
      snprintf(name, sizeof name, "%s.%s", ui->name, kind_names[k]);
      if ((rc = zt_nvme_store_alloc(s->nvme, name, ui->numel * sizeof(float))) < 0) {
        snprintf(err, errlen, "offload.nvme_dir: %s", zt_nvme_store_error(s->nvme));
        return rc;
      }
      s->ext[KINDS * u + k] = rc;
    }
  return 0;
}

/* Every unit's parameters, and (without dsum) the gradient buffers held and one write-back in
 * flight, in slots. */
static size_t all_resident_bytes(int nu, int held, int dsum, size_t slot) {
  return (size_t)(nu + (dsum ? 0 : held + 1)) * zt_dev_arena_footprint(slot);
}

/* Every size the offloaded trainer takes, from the layout and the activation bytes alone: the
 * one computation behind zt_trainer_open_offload and zt_offload_estimate, so what the daemon
 * admits is what the trainer allocates. */
typedef struct off_sizes {
  size_t host;         /* the host arena */
  size_t arena;        /* the device arena */
  size_t slot;         /* one unit's device slot */
  size_t largest;      /* the largest streamed unit's device copy, bytes */
  size_t largest_f32;  /* the largest streamed unit's fp32 parameters */
  int held;            /* units acquired at once */
  int ng;              /* leading units with their optimizer on the device */
  size_t dev_units;    /* their device bytes */
  int all_resident;    /* the arena holds every streamed unit: each is fetched once a step */
  int dsum;            /* grads gpu: the streamed units' gradient sums on the device */
  size_t dsum_bytes;   /* their device buffer */
  /* the host side (host_sizes) */
  int nh;              /* units [ng, nh) with their optimizer on the host, [nh, nu) on NVMe */
  int alias;           /* the device units' buffers are the host's (open_device_units) */
  size_t lo;           /* the host's flat-layout buffers start at this float */
  size_t h_floats;     /* the host units' masters, m and v: floats each */
  int ring;            /* the gradient ring's slots; 0: the flat buffer */
  size_t ring_floats;  /* a slot: the largest streamed unit */
  size_t nvme_f32;     /* the largest NVMe unit's fp32 parameters (an NVMe staging set) */
  size_t nvme_param;   /* params nvme: the largest NVMe unit's device copy (streamer staging) */
  int scopy0;          /* the first unit with a stream copy */
  size_t scopy_floats; /* the stream copies of units [scopy0, nu): the NVMe units' (params not
                          nvme), with delayed bf16/fp16 the host units' too */
  size_t delayed;      /* delayed_update: the next buffers' bytes (offload.h) */
} off_sizes;

/* The device bytes of units 0..ng-1 kept whole on the device: masters, m, v and gradients in
 * fp32 and (bf16/fp16) the compute copy, each one backend buffer over their parameters. */
static size_t dev_unit_bytes(const zt_model *m, int ng, zt_dtype dt) {
  if (!ng) return 0;
  size_t f = zt_model_unit(m, ng)->offset;
  return 4 * zt_dev_arena_footprint(f * sizeof(float)) +
         (dt == ZT_F32 ? 0 : zt_dev_arena_footprint(f * zt_dtype_size(dt)));
}

/* The flat offset of unit u; the parameter count for u == units. */
static size_t unit_start(const zt_model *m, int u) {
  return u < zt_model_num_units(m) ? zt_model_unit(m, u)->offset : zt_model_num_params(m);
}

/* NVMe unit u's stream copy on the host (params not nvme): the fp32 tensors its ops read, which
 * lie in its first unit_layout.f32_end bytes (all of it in fp32). */
static size_t stream_copy_floats(const zt_model *m, int u, zt_dtype dt) {
  return unit_layout_of(m, u, dt).f32_end / sizeof(float);
}

/* The gradient ring's slots for ns streamed units of at most slot_bytes: `asked` (offload
 * .grad_slots) if set, else the fewest that keep the backward from waiting for the CPU AdamW to
 * free a slot (offload.h "The gradients on the host"), or 0 (the flat buffer) where that is
 * every unit: the flat buffer holds them in no more bytes. The backward releases a unit every 4 * numel * tokens / flops seconds (its backward
 * alone, by the cost model) while the pool updates one every numel / rate; where the pool is
 * the slower, it falls 1 - ratio of a unit further behind per unit released, and each unit it
 * is behind holds a slot. At least GRAD_RING_SLOTS, at most ns, and no more than
 * ZT_TUNE_GRAD_RING_BYTES unless that is below the minimum: the ring exists for models whose
 * gradients the host cannot hold whole. */
static int ring_slots(const zt_model *m, const zt_train_cfg *tc, int asked, int ns,
                      size_t slot_bytes) {
  if (asked) return asked < ns ? asked : ns;
  double tokens = (double)tc->micro_batch * zt_model_cfg_of(m)->seq_len;
  double flops = tc->precision == ZT_F32 ? ZT_TUNE_PLAN_DEVICE_FLOPS_F32
                                         : ZT_TUNE_PLAN_DEVICE_FLOPS_LP;
  double ratio = 4 * tokens * ZT_TUNE_PLAN_CPU_ADAM_PARAMS / flops;
  int slots = GRAD_RING_SLOTS + (ratio < 1 ? (int)ceil(ns * (1 - ratio)) : 0);
  size_t fit = slot_bytes ? ZT_TUNE_GRAD_RING_BYTES / slot_bytes : (size_t)slots;
  if ((size_t)slots > fit) slots = fit > GRAD_RING_SLOTS ? (int)fit : GRAD_RING_SLOTS;
  return slots < ns ? slots : 0;
}

/* The host arena with units [z->ng, nh) on the host, [nh, nu) on NVMe: masters, m, v of the
 * host units; the gradients (flat over [lo, n), or the ring: no clipping, one micro-batch a
 * step or the sums on the device, offload.h); the bf16/fp16 compute copy over [lo, n); with
 * NVMe units the two staging sets of master, m and v, and the stream copies (params host or
 * gpu) or the streamer's staging (params nvme). on_cpu: the cpu backend, whose device units may
 * alias the host's buffers. delayed_update (offload.h): the flat gradients, no alias, the host
 * units' stream copies in bf16/fp16, and the next buffers: fp32 the host units' masters, bf16/fp16
 * the compute copy; the stream copies. */
static void host_sizes(const zt_model *m, const zt_offload_cfg *oc, const zt_train_cfg *tc,
                       int on_cpu, int nh, off_sizes *z) {
  int nu = zt_model_num_units(m), params_nvme = oc->params == ZT_PLACE_NVME;
  size_t n = zt_model_num_params(m);
  zt_dtype dt = tc->precision;
  z->nh = nh;
  z->ring = 0;
  /* the ring needs the updates to overlap the backward (offload.h): not with fp16, nor with
   * the delayed update, which needs the whole step's gradients while the next step runs */
  z->ring_floats = z->largest_f32 / sizeof(float);
  if (tc->grad_clip == 0 && (tc->grad_accum == 1 || z->dsum) && dt != ZT_F16 &&
      !oc->delayed_update)
    z->ring = ring_slots(m, tc, oc->grad_slots, nu - z->ng, z->ring_floats * sizeof(float));
  z->alias = on_cpu && z->ng > 0 && nh == nu && !z->ring && !oc->delayed_update;
  z->lo = z->alias ? 0 : unit_start(m, z->ng);
  z->h_floats = unit_start(m, nh) - z->lo;
  z->nvme_f32 = z->nvme_param = z->scopy_floats = 0;
  z->scopy0 = oc->delayed_update && dt != ZT_F32 ? z->ng : nh;
  for (int u = nh; u < nu; u++) {
    size_t f32 = zt_model_unit(m, u)->numel * sizeof(float), pb = unit_param_bytes(m, u, dt);
    if (f32 > z->nvme_f32) z->nvme_f32 = f32;
    if (params_nvme && pb > z->nvme_param) z->nvme_param = pb;
  }
  for (int u = z->scopy0; u < nu && !params_nvme; u++)
    z->scopy_floats += stream_copy_floats(m, u, dt);
  z->host = z->h_floats ? KINDS * zt_host_arena_footprint(z->h_floats * sizeof(float)) : 0;
  z->host += z->ring ? (size_t)z->ring * zt_host_arena_footprint(z->largest_f32)
                     : zt_host_arena_footprint((n - z->lo) * sizeof(float));
  if (dt != ZT_F32) z->host += zt_host_arena_footprint((n - z->lo) * zt_dtype_size(dt));
  if (nh < nu) {
    z->host += 2 * KINDS * zt_host_arena_footprint(z->nvme_f32);
    if (z->nvme_param)
      z->host += (size_t)(z->held + oc->prefetch) * zt_host_arena_footprint(z->nvme_param);
  }
  if (z->scopy_floats) z->host += zt_host_arena_footprint(z->scopy_floats * sizeof(float));
  z->delayed = 0;
  if (oc->delayed_update) {
    if (dt == ZT_F32 && z->h_floats)
      z->delayed += zt_host_arena_footprint(z->h_floats * sizeof(float));
    if (dt != ZT_F32) z->delayed += zt_host_arena_footprint((n - z->lo) * zt_dtype_size(dt));
    if (z->scopy_floats) z->delayed += zt_host_arena_footprint(z->scopy_floats * sizeof(float));
  }
  z->host += z->delayed;
}

/* Where the streamed units keep their optimizer (offload.host_units): the host side of z for
 * the device side sizes_for gave it. -EINVAL for a host_units the units cannot take, -ENOMEM
 * over host_budget, -ENOSPC over nvme_budget; err says why with the numbers. */
static int place_optimizer(const zt_model *m, const zt_offload_cfg *oc, const zt_train_cfg *tc,
                           int on_cpu, off_sizes *z, char *err, size_t errlen) {
  int nu = zt_model_num_units(m), ng = z->ng, nh = nu;
  if (oc->host_units >= 0 || oc->optimizer == ZT_PLACE_NVME) {
    int k = oc->host_units > 0 ? oc->host_units : 0;
    if (k > nu - ng) {
      snprintf(err, errlen, "offload.host_units is %d; after %d unit(s) on the device the model "
               "has %d", oc->host_units, ng, nu - ng);
      return -EINVAL;
    }
    nh = ng + k;
    if (nh < nu && !oc->nvme_dir[0]) {
      snprintf(err, errlen, "offload.host_units %d leaves %d unit(s) for NVMe: "
               "offload.nvme_dir is required", oc->host_units, nu - nh);
      return -EINVAL;
    }
    host_sizes(m, oc, tc, on_cpu, nh, z);
  } else if (oc->optimizer == ZT_PLACE_AUTO && oc->host_budget && oc->nvme_dir[0]) {
    /* the most units on the host that fit it: the host is faster than NVMe for every unit */
    for (host_sizes(m, oc, tc, on_cpu, nh, z); nh > ng && z->host > oc->host_budget;)
      host_sizes(m, oc, tc, on_cpu, --nh, z);
  } else {
    host_sizes(m, oc, tc, on_cpu, nh, z);
  }
  if (oc->host_budget && z->host > oc->host_budget) {
    snprintf(err, errlen, "offload.host_budget is %zu bytes; the host tier needs %zu with %d "
             "unit(s)' optimizer on the host and %d on NVMe%s", oc->host_budget, z->host,
             nh - ng, nu - nh,
             oc->nvme_dir[0] ? "" : " (with an offload.nvme_dir, optimizer auto keeps on NVMe "
                                    "what the host cannot hold)");
    return -ENOMEM;
  }
  uint64_t nvme = nvme_file_bytes(m, nh);
  if (oc->nvme_budget && nvme > oc->nvme_budget) {
    snprintf(err, errlen, "offload.nvme_budget is %llu bytes; the NVMe tier needs %llu for the "
             "optimizer of %d unit(s) (%d on the host)", (unsigned long long)oc->nvme_budget,
             (unsigned long long)nvme, nu - nh, nh - ng);
    return -ENOSPC;
  }
  return 0;
}

/* The device side with units 0..ng-1 on the device and the rest streamed, their gradient sums
 * on the device (dsum) or not; -ENOMEM (err says why, with the numbers) when they do not fit
 * gpu_budget. */
static int sizes_for(const zt_model *m, const zt_offload_cfg *oc, zt_dtype dt, size_t act_bytes,
                     int ng, int dsum, off_sizes *z, char *err, size_t errlen) {
  int nu = zt_model_num_units(m), ns = nu - ng;
  size_t sum_floats = zt_model_num_params(m) - unit_start(m, ng);
  *z = (off_sizes){.held = zt_model_head_reads_embed(m) ? 2 : 1, .ng = ng,
                   .dev_units = dev_unit_bytes(m, ng, dt), .dsum = dsum,
                   .dsum_bytes = dsum ? zt_dev_arena_footprint(sum_floats * sizeof(float)) : 0};
  zt_stream_unit *units = calloc((size_t)ns, sizeof *units);
  if (!units) {
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  for (int i = 0; i < ns; i++) {
    const zt_unit_info *ui = zt_model_unit(m, ng + i);
    /* with dsum no gradient buffer comes from the arena */
    units[i] = (zt_stream_unit){.param_bytes = unit_param_bytes(m, ng + i, dt),
                                .grad_floats = dsum ? 0 : ui->numel};
    if (units[i].param_bytes > z->largest) z->largest = units[i].param_bytes;
    if (ui->numel * sizeof(float) > z->largest_f32) z->largest_f32 = ui->numel * sizeof(float);
  }
  /* Units differ in size (the gpt head is two vectors): equal slots of the largest keep the
   * arena from fragmenting, so the budget that opens is the budget that runs. A slot holds a
   * device copy or a gradient buffer (fp32, larger than a 16-bit device copy), with dsum a
   * device copy only. */
  z->slot = z->largest > z->largest_f32 || dsum ? z->largest : z->largest_f32;
  zt_streamer_cfg sc = {.n_units = ns, .units = units, .prefetch_depth = oc->prefetch,
                        .max_acquired = z->held, .slot_bytes = z->slot};
  size_t need = zt_streamer_min_device_bytes(&sc);
  free(units);
  if (need == SIZE_MAX) {
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  size_t resident = all_resident_bytes(ns, z->held, dsum, z->slot);
  size_t fixed = act_bytes + z->dev_units + z->dsum_bytes;
  zt_offload_place params = oc->params != ZT_PLACE_AUTO ? oc->params
                            : oc->gpu_budget ? ZT_PLACE_HOST : ZT_PLACE_GPU;
  if (params == ZT_PLACE_GPU || !oc->gpu_budget) {
    z->arena = resident;
    if (oc->gpu_budget && fixed + resident > oc->gpu_budget) {
      snprintf(err, errlen, "offload.params gpu keeps every unit on the device: needs %zu bytes "
               "(activations %zu + %d unit(s) with their optimizer on the device %zu + "
               "gradient sums on the device %zu + parameters and gradient buffers %zu); "
               "offload.gpu_budget is %zu (params host streams the units)", fixed + resident,
               act_bytes, ng, z->dev_units, z->dsum_bytes, resident, oc->gpu_budget);
      return -ENOMEM;
    }
  } else {
    if (oc->gpu_budget < fixed + need) {
      snprintf(err, errlen, "offload.gpu_budget is %zu bytes; streaming needs at least %zu "
               "(activations %zu + %d unit(s) with their optimizer on the device %zu + "
               "gradient sums on the device %zu + %d unit(s) held and %d prefetched with their "
               "gradients %zu)", oc->gpu_budget, fixed + need, act_bytes, ng, z->dev_units,
               z->dsum_bytes, z->held, oc->prefetch, need);
      return -ENOMEM;
    }
    z->arena = oc->gpu_budget - fixed;
    if (z->arena > resident) z->arena = resident;
  }
  z->all_resident = z->arena >= resident;
  return 0;
}

/* A plan: what auto leaves open, decided, and the sizes that follow. */
typedef struct off_plan {
  int ckpt_every;          /* train.activation_checkpointing.every, resolved */
  zt_offload_place params; /* offload.params, resolved */
  size_t act_bytes;
  off_sizes z;             /* z.ng: offload.gpu_units, z.nh - z.ng: offload.host_units, resolved */
  int delayed;             /* offload.delayed_update */
  double est_s;            /* the cost model's step time */
} off_plan;

/* The copies a step of the plan is expected to make: each streamed unit's device copy fetched
 * once a step when the arena holds them all, else in each forward and backward (the streamer
 * keeps what fits, so this is the most); its gradients to the host every micro-batch and from
 * the second micro-batch on its running sum copied back, or with dsum its sum to the host once
 * a step. */
static void plan_transfers(const zt_model *m, const zt_train_cfg *tc, const off_plan *p,
                           double *h2d, double *d2h) {
  double ga = tc->grad_accum, fetch = 0, grads = 0;
  for (int u = p->z.ng; u < zt_model_num_units(m); u++) {
    fetch += (double)unit_fetch_bytes(m, u, tc->precision);
    grads += (double)zt_model_unit(m, u)->numel * sizeof(float);
  }
  double fetches = p->params == ZT_PLACE_GPU || p->z.all_resident ? 1 : 2 * ga;
  double moves = p->z.dsum ? 1 : ga;
  *h2d = fetch * fetches + grads * (moves - 1);
  *d2h = grads * moves;
}

/* The cost model that ranks the plans that fit (tunables in engine/base/tunables.h): per step, the
 * device compute (6 * params * tokens plus attention, a third more for the recomputed blocks'
 * forward), the host's work on the streamed units (their sum of squares on the runner and their
 * AdamW on the pool, beside which the NVMe units' state is read and written) less the backward
 * of the device units it hides under (nothing hides it with clipping or fp16, which need the
 * whole backward first; the last streamed unit's update never is), the copies beyond the
 * compute, and the device AdamW at HBM speed. Coarse, but it orders the choices that matter:
 * checkpointing against units on the device against resident parameters against NVMe. Running
 * gradient sums on the host (no dsum) put two copies of each streamed unit's gradients on the
 * backward's path in every later micro-batch: up before its backward, back after it (session 6
 * measured them as 21% of a grad_accum 4 step). With the delayed update the host's work runs
 * beside the next step's instead: the step is the longer of the two. */
static double plan_cost(const zt_model *m, const zt_train_cfg *tc, const off_plan *p) {
  const zt_model_cfg *mc = zt_model_cfg_of(m);
  double P = (double)zt_model_num_params(m), L = mc->n_layers, T = mc->seq_len;
  double N = (double)tc->micro_batch * T, ga = tc->grad_accum;
  double flops = 6 * P * N + 12 * L * tc->micro_batch * T * T * mc->d_model;
  double micro = flops / (tc->precision == ZT_F32 ? ZT_TUNE_PLAN_DEVICE_FLOPS_F32
                                                  : ZT_TUNE_PLAN_DEVICE_FLOPS_LP);
  double recomputed = p->ckpt_every > 0 ? ceil(L / p->ckpt_every) / L : 0;
  double compute = ga * micro * (1 + recomputed / 3);
  double p_dev = p->z.ng ? (double)zt_model_unit(m, p->z.ng)->offset : 0, p_cpu = P - p_dev;
  double per_param = 1 / ZT_TUNE_PLAN_CPU_ADAM_PARAMS + 4 / ZT_TUNE_PLAN_HOST_SUMSQ_BYTES;
  double nvme = 2 * (double)nvme_file_bytes(m, p->z.nh) / ZT_TUNE_PLAN_NVME_BYTES;
  double cpu = fmax(p_cpu * per_param, nvme);
  double last = (double)zt_model_unit(m, p->z.ng)->numel * per_param;
  double hidden = tc->grad_clip > 0 || tc->precision == ZT_F16 ? 0 : micro * 2 / 3 * p_dev / P;
  double h2d, d2h;
  plan_transfers(m, tc, p, &h2d, &d2h);
  double copies = fmax(h2d, d2h) / ZT_TUNE_PLAN_LINK_BYTES;
  double resumed = p->z.dsum ? 0 : 2 * (ga - 1) * p_cpu * sizeof(float) / ZT_TUNE_PLAN_LINK_BYTES;
  double rest = fmax(0, copies - compute) + resumed + p_dev * 18 / 3e12;
  if (p->delayed) return fmax(compute + rest, cpu);
  return compute + fmax(last, cpu - hidden) + rest;
}

/* One candidate: checkpointing every ck, the parameters' home place, ng units on the device;
 * the host and NVMe sides follow (place_optimizer). */
static int plan_try(const zt_model *m, const zt_train_cfg *tc, const zt_offload_cfg *oc,
                    const zt_ops *ops, int ck, zt_offload_place place, int ng, int dsum,
                    off_plan *p, char *err, size_t errlen) {
  zt_offload_cfg c = *oc;
  c.params = place;
  *p = (off_plan){.ckpt_every = ck, .params = place, .delayed = oc->delayed_update,
                  .act_bytes = zt_acts_size_dt(m, ops, tc->micro_batch, ck, tc->precision)};
  if (!p->act_bytes) {
    snprintf(err, errlen, "train.activation_checkpointing.every %d: cannot size the "
             "activations", ck);
    return -EINVAL;
  }
  int rc = sizes_for(m, &c, tc->precision, p->act_bytes, ng, dsum, &p->z, err, errlen);
  if (rc == 0)
    rc = place_optimizer(m, &c, tc, strcmp(ops->name, "cpu") == 0, &p->z, err, errlen);
  if (rc == 0) p->est_s = plan_cost(m, tc, p);
  return rc;
}

/* The plan: every choice the spec fixes as given; with a gpu_budget, each one left to auto
 * (activation checkpointing, params gpu or host, the units with their optimizer on the device,
 * with several micro-batches the gradient sums on the device or the host) searched for the
 * cheapest plan by plan_cost that fits, the host and NVMe sides of each decided by
 * place_optimizer. Without a budget auto means the plain choice: no checkpointing, every unit
 * resident, no unit's optimizer on the device, the sums on the device when there are several
 * micro-batches (the budget is then what that takes). At least one unit is always streamed. */
static int off_plan_of(const zt_model *m, const zt_train_cfg *tc, const zt_offload_cfg *oc,
                       const zt_ops *ops, off_plan *best, char *err, size_t errlen) {
  int nu = zt_model_num_units(m), L = zt_model_cfg_of(m)->n_layers, budget = oc->gpu_budget > 0;
  if (oc->gpu_units >= nu) {
    snprintf(err, errlen, "offload.gpu_units is %d; the model has %d units and at least one "
             "must be streamed (leave the offload object out to keep everything on the device)",
             oc->gpu_units, nu);
    return -EINVAL;
  }
  int ck_auto = tc->ckpt_every == ZT_CKPT_AUTO && budget;
  int ck_lo = ck_auto ? 0 : tc->ckpt_every == ZT_CKPT_AUTO ? 0 : tc->ckpt_every;
  int ck_hi = ck_auto ? L : ck_lo;
  zt_offload_place places[2] = {oc->params, oc->params};
  if (oc->params == ZT_PLACE_AUTO) {
    places[0] = ZT_PLACE_GPU;
    places[1] = budget ? ZT_PLACE_HOST : ZT_PLACE_GPU;
  }
  int ng_hi = oc->gpu_units >= 0 ? oc->gpu_units
              : oc->optimizer == ZT_PLACE_AUTO && budget ? nu - 1 : 0;
  int ng_lo = oc->gpu_units >= 0 ? oc->gpu_units : 0;
  int several = tc->grad_accum > 1;
  int ds_hi = oc->grads == ZT_PLACE_GPU || (oc->grads == ZT_PLACE_AUTO && several);
  int ds_lo = oc->grads == ZT_PLACE_GPU || (oc->grads == ZT_PLACE_AUTO && several && !budget);
  int found = 0;
  for (int ck = ck_lo; ck <= ck_hi; ck++)
    for (int pl = 0; pl < 2; pl++) {
      if (pl && places[1] == places[0]) break;
      for (int ng = ng_hi; ng >= ng_lo; ng--)
        for (int ds = ds_hi; ds >= ds_lo; ds--) {
          char why[512];
          off_plan p;
          int rc = plan_try(m, tc, oc, ops, ck, places[pl], ng, ds, &p, why, sizeof why);
          if (rc == -EINVAL && !p.act_bytes) {
            snprintf(err, errlen, "%s", why);
            return rc;
          }
          if (rc < 0) continue;
          if (!found || p.est_s < best->est_s) *best = p;
          found = 1;
        }
    }
  if (found) return 0;
  /* nothing fits: the refusal of the plan that needs the least device memory */
  return plan_try(m, tc, oc, ops, ck_auto ? 1 : ck_lo, places[1], ng_lo, ds_lo, best, err,
                  errlen);
}

/* What the offloaded step runs on today: the cpu and cuda backends, fp32, bf16 or fp16 compute
 * (params nvme: fp32). */
static int off_supported(const char *backend, const zt_train_cfg *tc, const zt_offload_cfg *oc,
                         char *err, size_t errlen) {
  if (strcmp(backend, "cpu") != 0 && strcmp(backend, "cuda") != 0) {
    snprintf(err, errlen, "offload: runs on the cpu and cuda backends (not %s)", backend);
    return -ENOTSUP;
  }
  if (tc->precision != ZT_F32 && oc->params == ZT_PLACE_NVME) {
    snprintf(err, errlen, "offload.params: nvme streams the fp32 masters, so it needs "
             "train.precision fp32 (got %s); use params host", zt_dtype_name(tc->precision));
    return -ENOTSUP;
  }
  return 0;
}

int zt_offload_estimate(const zt_model_cfg *mc, const zt_train_cfg *tc, const zt_offload_cfg *oc,
                        const zt_ops *ops, zt_offload_plan *out, char *err, size_t errlen) {
  zt_model *m = NULL;
  off_plan p;
  int rc;
  if ((rc = zt_offload_cfg_check(oc, err, errlen)) < 0 ||
      (rc = zt_model_create(&m, mc, err, errlen)) < 0)
    return rc;
  rc = off_supported(ops->name, tc, oc, err, errlen);
  if (rc == 0) rc = off_plan_of(m, tc, oc, ops, &p, err, errlen);
  if (rc == 0) {
    *out = (zt_offload_plan){.host_bytes = p.z.host,
                             .device_bytes = p.act_bytes + p.z.dev_units + p.z.dsum_bytes +
                                             p.z.arena,
                             .nvme_bytes = nvme_file_bytes(m, p.z.nh),
                             .act_bytes = p.act_bytes,
                             .gpu_unit_bytes = p.z.dev_units,
                             .arena_bytes = p.z.arena,
                             .units = zt_model_num_units(m),
                             .gpu_units = p.z.ng,
                             .host_units = p.z.nh - p.z.ng,
                             .grad_slots = p.z.ring,
                             .ckpt_every = p.ckpt_every,
                             .params = p.params,
                             .grads = p.z.dsum ? ZT_PLACE_GPU : ZT_PLACE_HOST,
                             .dsum_bytes = p.z.dsum_bytes,
                             .est_step_s = p.est_s};
    double h2d, d2h;
    plan_transfers(m, tc, &p, &h2d, &d2h);
    out->h2d_bytes = (uint64_t)h2d;
    out->d2h_bytes = (uint64_t)d2h;
    /* every NVMe unit's master, m and v read and written once a step */
    out->nvme_step_bytes = 2 * out->nvme_bytes;
  }
  zt_model_destroy(m);
  return rc;
}

/* The initial parameters (init_path or the seed) and zero moments, in every tier but the host
 * units' m and v, which the open allocates after it (zeroed). The parameters come a piece of
 * units at a time through one staging of the largest unit's parameters outside the arena (with
 * an init file, its header and the reader's chunk beside it), not a flat copy of the model (for
 * a 10 B model that would be 41 GB beside the arena). That is less than a checkpoint's staging
 * (zt_checkpoint_estimate_bytes: three such stagings, the chunk, the headers of three entries a
 * tensor), which the job's admission counts on top of the plan's host tier and which no
 * checkpoint needs while the open runs (test_ckpt_memory measures both). */
static int write_initial_state(zt_trainer *t, char *err, size_t errlen) {
  int nu = zt_model_num_units(t->model);
  size_t cap = zt__trainer_piece_cap(t->model);
  zt__trainer_init in;
  float *buf = NULL;
  int rc = zt__trainer_init_open(&in, t->model, err, errlen);
  if (rc < 0) goto out;
  if (!(buf = malloc(cap * sizeof *buf))) {
    rc = -ENOMEM;
    snprintf(err, errlen, "out of memory");
    goto out;
  }
  for (int u0 = 0, u1; u0 < nu && rc == 0; u0 = u1) {
    u1 = zt__trainer_piece_end(t->model, u0, cap);
    if ((rc = zt__trainer_init_read(&in, u0, u1, buf, err, errlen)) == 0)
      rc = off_write_state(t, u0, u1, buf, NULL, NULL, err, errlen);
  }
out:
  free(buf);
  zt__trainer_init_close(&in);
  return rc;
}

int zt_trainer_open_offload(zt_trainer **out, const zt_model_cfg *mc, const zt_train_cfg *tc,
                            const zt_offload_cfg *oc, const zt_backend *be, char *err,
                            size_t errlen) {
  int rc;
  zt_stream_unit *units = NULL;
  *out = NULL;
  if ((rc = zt_train_cfg_check(tc, err, errlen)) < 0 ||
      (rc = zt_offload_cfg_check(oc, err, errlen)) < 0)
    return rc;
  if ((rc = off_supported(be->ops->name, tc, oc, err, errlen)) < 0) return rc;
  int on_gpu = strcmp(be->ops->name, "cuda") == 0;
  zt_trainer *t = calloc(1, sizeof *t);
  off_state *s = calloc(1, sizeof *s);
  if (!t || !s) {
    free(t);
    free(s);
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  t->tc = *tc;
  t->be = *be;
  t->path = &offload_path;
  t->path_state = s;
  s->oc = *oc;
  s->dt = tc->precision;
  s->head = -1;
  s->hbe = *be;
  if (on_gpu) {
    /* the host tier's own math (the norm over the host gradients, the compute-copy casts of a
     * loaded state) on every core */
    if ((rc = zt_backend_cpu_open(&s->hbe, 0)) < 0) {
      snprintf(err, errlen, "offload: opening a cpu backend for the host tier failed (%d)", rc);
      s->hbe = *be;
      goto out;
    }
    s->own_hbe = 1;
  }
  zt_loss_scaler_init(&t->scaler);
  if ((rc = be->ops->set_allow_tf32(be->ctx, tc->tf32)) < 0) {
    snprintf(err, errlen, "train.tf32: the %s backend has no TF32 mode", be->ops->name);
    goto out;
  }
  if ((rc = zt_model_create(&t->model, mc, err, errlen)) < 0) goto out;
  size_t n = zt_model_num_params(t->model), N = (size_t)tc->micro_batch * (size_t)mc->seq_len;
  s->nu = zt_model_num_units(t->model);
  if (zt_model_head_reads_embed(t->model)) s->head = s->nu - 1;
  off_plan plan;
  if ((rc = off_plan_of(t->model, tc, oc, be->ops, &plan, err, errlen)) < 0) goto out;
  t->tc.ckpt_every = plan.ckpt_every;
  s->oc.params = plan.params;
  s->est_s = plan.est_s;
  if ((rc = zt_acts_open_dt(&t->acts, t->model, be, tc->micro_batch, plan.ckpt_every,
                            tc->precision, err, errlen)) < 0)
    goto out;
  s->act_bytes = zt_acts_bytes(t->acts);
  t->h_tok = malloc(N * sizeof *t->h_tok);
  t->h_tgt = malloc(N * sizeof *t->h_tgt);
  units = calloc((size_t)s->nu, sizeof *units);
  if (!t->h_tok || !t->h_tgt || !units || (rc = build_runs(t->model, s)) < 0) {
    rc = -ENOMEM;
    snprintf(err, errlen, "out of memory");
    goto out;
  }
  s->updated = calloc((size_t)s->nu, 1);
  if (!s->updated) {
    rc = -ENOMEM;
    snprintf(err, errlen, "out of memory");
    goto out;
  }
  int params_nvme = oc->params == ZT_PLACE_NVME;
  off_sizes z = plan.z;
  int held = z.held;
  s->ng = z.ng;
  s->nh = z.nh;
  s->lo = z.lo;
  s->h_floats = z.h_floats;
  s->ring = z.ring;
  s->ring_floats = z.ring_floats;
  s->ng_floats = s->ng ? zt_model_unit(t->model, s->ng)->offset : 0;
  s->dev_unit_bytes = z.dev_units;
  s->dsum = z.dsum;
  s->dsum_bytes = z.dsum_bytes;
  s->host_bytes = z.host;
  if ((rc = zt_host_arena_open(&s->host, s->host_bytes, on_gpu ? zt_host_mem_cuda() : NULL)) < 0) {
    snprintf(err, errlen, "offload: opening the host arena failed (%d)", rc);
    goto out;
  }
  /* host_sizes' buffers; the host units' m and v once the initial state is written */
  s->d_alias = z.alias;
  if (s->h_floats && (rc = zt_host_arena_alloc(s->host, s->h_floats * sizeof(float),
                                               (void **)&s->h[K_MASTER])) < 0)
    goto host_full;
  if (s->ring) {
    if (!(s->slot = calloc((size_t)s->ring, sizeof *s->slot))) goto no_memory;
    for (int i = 0; i < s->ring; i++)
      if ((rc = zt_host_arena_alloc(s->host, s->ring_floats * sizeof(float),
                                    (void **)&s->slot[i])) < 0)
        goto host_full;
  } else if ((rc = zt_host_arena_alloc(s->host, (n - s->lo) * sizeof(float),
                                       (void **)&s->grads)) < 0) {
    goto host_full;
  } else {
    memset(s->grads, 0, (n - s->lo) * sizeof(float));
  }
  if (s->dt != ZT_F32 &&
      (rc = zt_host_arena_alloc(s->host, (n - s->lo) * zt_dtype_size(s->dt), (void **)&s->lp)) < 0)
    goto host_full;
  /* delayed_update: the next buffers (host_sizes) */
  s->delayed = oc->delayed_update;
  if (s->delayed && s->dt == ZT_F32 && s->h_floats &&
      (rc = zt_host_arena_alloc(s->host, s->h_floats * sizeof(float), (void **)&s->m_nxt)) < 0)
    goto host_full;
  if (s->delayed && s->dt != ZT_F32 &&
      (rc = zt_host_arena_alloc(s->host, (n - s->lo) * zt_dtype_size(s->dt),
                                (void **)&s->lp_nxt)) < 0)
    goto host_full;
  s->scopy0 = z.scopy0;
  if (z.scopy_floats) {
    if (!(s->scopy_off = calloc((size_t)s->nu + 1, sizeof *s->scopy_off))) goto no_memory;
    for (int u = s->scopy0; u < s->nu; u++)
      s->scopy_off[u + 1] = s->scopy_off[u] + stream_copy_floats(t->model, u, s->dt);
    if ((rc = zt_host_arena_alloc(s->host, z.scopy_floats * sizeof(float),
                                  (void **)&s->scopy)) < 0 ||
        (s->delayed && (rc = zt_host_arena_alloc(s->host, z.scopy_floats * sizeof(float),
                                                 (void **)&s->scopy_nxt)) < 0))
      goto host_full;
  }
  if (s->nh < s->nu) {
    for (int i = 0; i < 2; i++) {
      s->sets[i].unit = -1;
      for (int k = 0; k < KINDS; k++)
        if ((rc = zt_host_arena_alloc(s->host, z.nvme_f32, (void **)&s->sets[i].buf[k])) < 0)
          goto host_full;
    }
    if ((rc = open_nvme(t, err, errlen)) < 0) goto out;
  }
  if (!s->d_alias && (rc = open_device_units(t)) < 0) {
    snprintf(err, errlen, "offload: allocating %zu device bytes for %d unit(s) with their "
             "optimizer on the device failed", z.dev_units, s->ng);
    goto out;
  }
  if ((rc = write_initial_state(t, err, errlen)) < 0) goto out;
  for (int k = K_M; k < KINDS && s->h_floats; k++) {
    if ((rc = zt_host_arena_alloc(s->host, s->h_floats * sizeof(float), (void **)&s->h[k])) < 0)
      goto host_full;
    memset(s->h[k], 0, s->h_floats * sizeof(float));
  }
  if (s->d_alias) open_device_units(t);
  /* fp32 compute: the device copy of a unit is its masters, fetched from the host copy or from
   * their file; bf16/fp16: the pieces its ops read, from the masters and the compute copy;
   * delayed: pieces too, which the drain points at the buffers made current */
  if ((s->dt != ZT_F32 || s->delayed) && (rc = build_pieces(t)) < 0) goto no_memory;
  if (s->dsum && !(s->d_sum = be->ops->alloc(be->ctx, (n - s->ng_floats) * sizeof(float)))) {
    rc = -ENOMEM;
    snprintf(err, errlen, "offload: allocating %zu device bytes for the streamed units' gradient "
             "sums failed", (n - s->ng_floats) * sizeof(float));
    goto out;
  }
  /* the streamer's unit i is unit ng + i */
  for (int u = s->ng; u < s->nu; u++) {
    const zt_unit_info *ui = zt_model_unit(t->model, u);
    zt_stream_unit *x = &units[u - s->ng];
    *x = (zt_stream_unit){.param_bytes = unit_param_bytes(t->model, u, s->dt),
                          .grad_floats = ui->numel,
                          .host_grads = grads_of(t, u),
                          .dev_grads = s->d_sum ? s->d_sum + (ui->offset - s->ng_floats) : NULL};
    if (s->pieces) {
      x->pieces = s->pieces + s->first_piece[u];
      x->n_pieces = s->first_piece[u + 1] - s->first_piece[u];
    } else if (u < s->nh) {
      x->host_params = host_at(s, K_MASTER, ui->offset);
    } else if (params_nvme) {
      x->nvme_ext = s->ext[KINDS * u + K_MASTER];
    } else {
      x->host_params = s->scopy + s->scopy_off[u];
    }
  }
  zt_streamer_cfg sc = {.n_units = s->nu - s->ng, .units = units, .host = s->host, .nvme = s->nvme,
                        .prefetch_depth = oc->prefetch, .max_acquired = held,
                        .slot_bytes = z.slot};
  s->arena_budget = z.arena;
  s->dev_mem = (zt_dev_mem_ops){.name = be->ops->name, .alloc = dev_block_alloc,
                                 .free = dev_block_free, .ctx = &t->be};
  if ((rc = zt_dev_arena_open(&s->dev, s->arena_budget, on_gpu ? &s->dev_mem : NULL, err,
                              errlen)) < 0)
    goto out;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  s->adam_threads = on_gpu ? (cores > 0 ? (int)cores : 1) : ADAM_THREADS_BESIDE_CPU;
  rc = on_gpu ? zt_copy_cuda_open(&s->copy, zt_backend_device(be), zt_backend_stream(be))
              : zt_copy_cpu_open(&s->copy, 0);
  if (rc == 0)
    rc = zt_cpu_pool_open(&s->pool, s->adam_threads, on_gpu);
  if (rc < 0) {
    snprintf(err, errlen, "offload: starting the copy engine or the AdamW pool failed: %s",
             strerror(-rc));
    goto out;
  }
  sc.dev = s->dev;
  sc.copy = s->copy;
  if ((rc = zt_streamer_open(&s->st, &sc, err, errlen)) < 0) goto out;
  *out = t;
  t = NULL;
  goto out;
no_memory:
  rc = -ENOMEM;
  snprintf(err, errlen, "out of memory");
  goto out;
host_full:
  snprintf(err, errlen, "offload: host tier: %s", zt_host_arena_error(s->host));
out:
  free(units);
  zt_trainer_close(t);
  return rc;
}

int zt_trainer_offload_stats(const zt_trainer *t, zt_offload_stats *out) {
  if (t->path != &offload_path) return -EINVAL;
  const off_state *s = t->path_state;
  zt_streamer_stats ss;
  zt_streamer_get_stats(s->st, &ss);
  zt_nvme_stats ns = {0};
  if (s->nvme) zt_nvme_store_get_stats(s->nvme, &ns);
  zt_host_arena_stats hs;
  zt_host_arena_get_stats(s->host, &hs);
  zt_copy_busy cb = {0};
  s->copy->ops->busy(s->copy, &cb);
  zt_cpu_pool_stats ps;
  zt_cpu_pool_get_stats(s->pool, &ps);
  *out = (zt_offload_stats){.device_budget = s->act_bytes + s->dev_unit_bytes + s->dsum_bytes +
                                             s->arena_budget,
                            .grads = s->dsum ? ZT_PLACE_GPU : ZT_PLACE_HOST,
                            .dsum_bytes = s->dsum_bytes,
                            .gpu_units = s->ng,
                            .host_units = s->nh - s->ng,
                            .grad_slots = s->ring,
                            .ckpt_every = t->tc.ckpt_every,
                            .params = s->oc.params,
                            .est_step_s = s->est_s,
                            .gpu_unit_bytes = s->dev_unit_bytes,
                            .gpu_unit_updates = s->gpu_unit_updates,
                            .step_ns = s->step_ns,
                            .compute_ns = cb.compute_ns,
                            .h2d_ns = cb.queue_ns[ZT_COPY_H2D],
                            .d2h_ns = cb.queue_ns[ZT_COPY_D2H],
                            .adam_ns = ps.busy_ns,
                            .adam_threads = s->adam_threads,
                            .nvme_ns = ns.busy_ns,
                            .wait_copy_ns = cb.wait_ns,
                            .wait_adam_ns = ps.wait_ns,
                            .wait_nvme_ns = ns.wait_ns,
                            .act_bytes = s->act_bytes,
                            .arena_budget = s->arena_budget,
                            .arena_peak = ss.device_peak,
                            .host_bytes = s->host_bytes,
                            .host_used = hs.used,
                            .host_pinned = hs.pinned_bytes,
                            .nvme_bytes_read = ns.bytes_read,
                            .nvme_bytes_written = ns.bytes_written,
                            .fetches = ss.fetches,
                            .evictions = ss.evictions,
                            .grad_writebacks = ss.grad_writebacks,
                            .bytes_h2d = ss.bytes_h2d,
                            .bytes_d2h = ss.bytes_d2h,
                            .adam_units = s->adam_units,
                            .adam_overlapped = s->adam_overlapped};
  return 0;
}
