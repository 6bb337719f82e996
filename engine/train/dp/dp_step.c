/* The data-parallel step (engine/train/dp/dp.h): the rank threads, the per-stage buffers, the
 * step's walk over the units with its collectives (the communicator's queue, the host tier,
 * optimizer and params nvme), the path table and the open. The state between steps, the
 * gather/scatter between the shards and the flat layout and the ranks' files of per-rank
 * checkpoints, is dp_state.c's; what the two share, dp_internal.h. */
#include "engine/train/dp/dp.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/kernels/backend.h"
#include "engine/train/dp/dp_internal.h"
#include "engine/train/trainer_internal.h"
#include "offload/copy_engine.h"
#include "offload/cpu_adam.h"
#include "offload/cpu_pool.h"
#include "offload/host_arena.h"
#include "offload/nvme_store.h"
#include "offload/shard.h"

/* A rank's record in the exchange after the backward: its sum of squares, non-finite flag, its
 * part's step flags (an unsigned int: exact in a double) and the host units its AdamW updated
 * during the backward, then for each of its micro-batches the mean loss and whether it
 * counted. */
#define X_SUMSQ 0
#define X_NONFINITE 1
#define X_FLAGS 2
#define X_UPDATED 3
#define X_MICRO 4

/* How many units behind the one the backward just queued a host unit's gradients are taken up
 * (waited for, added, summed, their AdamW started): the device always has the next unit's work
 * queued when the host waits for a copy. */
#define TAKE_UP_LAG 2

int zt__dp_rank_fail(dp_rank_state *k, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = snprintf(k->err, sizeof k->err, "rank %d: ", k->r);
  vsnprintf(k->err + n, sizeof k->err - (size_t)n, fmt, ap);
  va_end(ap);
  return rc;
}

int zt__dp_comm_fail(dp_rank_state *k, int rc, const char *what) {
  return zt__dp_rank_fail(k, rc, "%s: %s", what, k->comm.ops->error_text(k->comm.ctx));
}

int zt__dp_backend_fail(dp_rank_state *k, int rc) {
  const zt_backend *be = &k->view.be;
  return zt__dp_rank_fail(k, rc, "backend %s: %s", be->ops->name, be->ops->error_text(be->ctx));
}

/* ---- open and close (on the rank's thread) ------------------------------------------------ */

static void *rank_alloc(dp_rank_state *k, size_t bytes, int *rc) {
  if (*rc < 0 || !bytes) return NULL;
  const zt_backend *be = &k->view.be;
  void *p = be->ops->alloc(be->ctx, bytes);
  if (!p) {
    *rc = zt__dp_rank_fail(k, -ENOMEM, "backend %s: cannot allocate %zu bytes (%zu held)",
                           be->ops->name, bytes, k->bytes);
    return NULL;
  }
  be->ops->zero(be->ctx, p, bytes);
  k->bytes += bytes;
  return p;
}

/* The AdamW calls of rank k: its chunk of each unit cut where the decay flag changes. */
static int build_segs(dp_rank_state *k) {
  const dp_state *s = k->s;
  const zt_model *m = k->view.model;
  int nt = zt_model_num_tensors(m);
  k->segs = calloc((size_t)nt, sizeof *k->segs);
  k->first_seg = calloc((size_t)s->nu + 1, sizeof *k->first_seg);
  if (!k->segs || !k->first_seg) return -ENOMEM;
  for (int i = 0; i < nt; i++) {
    const zt_tensor_info *ti = zt_model_tensor(m, i);
    const zt_shard *sh = zt_shard_at(s->tab, ti->unit, k->r);
    size_t t0 = ti->offset - zt_model_unit(m, ti->unit)->offset, t1 = t0 + ti->numel;
    size_t lo = t0 > sh->unit_off ? t0 : sh->unit_off;
    size_t hi = t1 < sh->unit_off + sh->count ? t1 : sh->unit_off + sh->count;
    if (lo >= hi) continue;
    adam_seg *prev = k->nsegs ? &k->segs[k->nsegs - 1] : NULL;
    if (prev && prev->unit == ti->unit && prev->decay == ti->decay &&
        prev->off + prev->n == lo - sh->unit_off) {
      prev->n += hi - lo;
      continue;
    }
    k->segs[k->nsegs++] =
        (adam_seg){.unit = ti->unit, .off = lo - sh->unit_off, .n = hi - lo, .decay = ti->decay};
  }
  /* the calls follow the tensors, which follow the units */
  for (int u = s->nu, i = k->nsegs; u >= 0; u--) {
    while (i > 0 && k->segs[i - 1].unit >= u) i--;
    k->first_seg[u] = i;
  }
  return 0;
}

/* Elements of the device's parameter buffer: stages 1-2 the padded layout, stage 3 the packed
 * shard (of the device units only with params host). */
static size_t dev_param_floats(const dp_state *s) {
  if (s->dc.zero_stage < 3) return s->tab->padded_total;
  return s->params_host ? s->dev_packed : s->tab->packed_total;
}

/* Stage 1's gradients are the padded layout; 2-3 the device units' packed shard. */
static size_t dev_grad_floats(const dp_state *s) {
  return s->dc.zero_stage == 1 ? s->tab->padded_total : s->dev_packed;
}

static int gout_count(const dp_state *s) {
  return !s->host_n ? 0 : s->dc.zero_stage >= 2 ? 2 : 1;
}

static int has_hstage(const dp_state *s, const zt_train_cfg *tc) {
  return s->host_n && s->dc.zero_stage >= 2 && tc->grad_accum > 1;
}

/* The elements of the host tier's masters and compute copy: the host units' (ng..nv0-1), and
 * with optimizer nvme and params host the NVMe units' too, as the parameters the gathers are
 * staged from (params nvme reads those from the files). m and v are the host units' alone
 * (hopt_n). */
static size_t host_master_floats(const dp_state *s) {
  return !s->nvme || (s->params_host && !s->params_nvme) ? s->host_n : s->hopt_n;
}

/* The host tier's arena: gradients, the staging, masters, m, v and the bf16 copy, each as far
 * as it goes (above), with optimizer nvme two sets (their compute copy unless params nvme,
 * whose gathers cast it on the device), and with params nvme two parameter stagings. */
static size_t host_tier_bytes(const dp_state *s, const zt_train_cfg *tc) {
  if (!s->host_n) return 0;
  size_t hm = host_master_floats(s);
  int lp = tc->precision != ZT_F32;
  size_t b = (1 + (size_t)has_hstage(s, tc)) *
             zt_host_arena_footprint(s->host_n * sizeof(float));
  if (hm) b += zt_host_arena_footprint(hm * sizeof(float));
  if (hm && lp) b += zt_host_arena_footprint(hm * sizeof(uint16_t));
  if (s->hopt_n) b += 2 * zt_host_arena_footprint(s->hopt_n * sizeof(float));
  if (s->nvme)
    b += 2 * (3 * zt_host_arena_footprint(s->nv_chunk * sizeof(float)) +
              (lp && !s->params_nvme ? zt_host_arena_footprint(s->nv_chunk * sizeof(uint16_t))
                                     : 0));
  if (s->params_nvme) b += 2 * zt_host_arena_footprint(s->nv_chunk * sizeof(float));
  return b;
}

/* The rank's files: a master, exp_avg and exp_avg_sq of its chunk per NVMe unit, each in the
 * store's whole blocks. */
static uint64_t nvme_file_bytes(const dp_state *s) {
  uint64_t sum = 0;
  for (int u = s->nv0; u < s->nu; u++) {
    uint64_t file = s->tab->chunk[u] * sizeof(float);
    sum += 3 * ((file + ZT_NVME_ALIGN - 1) / ZT_NVME_ALIGN * ZT_NVME_ALIGN);
  }
  return sum;
}

/* A host unit's first element in the host tier. */
static size_t host_at(const dp_state *s, const zt_shard *sh) {
  return sh->packed_off - s->dev_packed;
}

int zt__dp_on_host(const dp_state *s, int u) { return u >= s->ng; }

/* A host unit whose masters, m and v are in files (optimizer nvme, past host_units). */
int zt__dp_on_nvme(const dp_state *s, int u) { return u >= s->nv0; }

static int host_fail(dp_rank_state *k, int rc) {
  return zt__dp_rank_fail(k, rc, "host tier: %s", zt_host_arena_error(k->host));
}

static const char *const kind_names[3] = {"master", "exp_avg", "exp_avg_sq"};

/* optimizer nvme: the rank's directory rank-R under the trainer's, its store (opened on the
 * rank's thread, which alone uses it) and a file per NVMe unit and kind, reserved in full. */
static int nv_open(dp_rank_state *k) {
  const dp_state *s = k->s;
  const zt_model *m = k->view.model;
  char why[400];
  int rc;
  if ((size_t)snprintf(k->nvdir, sizeof k->nvdir, "%s/rank-%d", s->nvme_dir, k->r) >=
      sizeof k->nvdir) {
    k->nvdir[0] = 0;
    return zt__dp_rank_fail(k, -ENAMETOOLONG, "offload.nvme_dir: %s: %s", s->nvme_dir,
                            strerror(ENAMETOOLONG));
  }
  if (mkdir(k->nvdir, 0700) < 0) {
    rc = -errno;
    k->nvdir[0] = 0;
    return zt__dp_rank_fail(k, rc, "offload.nvme_dir: %s/rank-%d: %s", s->nvme_dir, k->r,
                            strerror(-rc));
  }
  if (!(k->ext = malloc(3 * (size_t)s->nu * sizeof *k->ext)))
    return zt__dp_rank_fail(k, -ENOMEM, "out of host memory");
  if ((rc = zt_nvme_store_open(&k->store, k->nvdir, NULL, why, sizeof why)) < 0)
    return zt__dp_rank_fail(k, rc, "offload.nvme_dir: %s", why);
  for (int u = s->nv0; u < s->nu; u++)
    for (int i = 0; i < 3; i++) {
      char name[64];
      uint64_t bytes = s->tab->chunk[u] * sizeof(float);
      snprintf(name, sizeof name, "%s.%s", zt_model_unit(m, u)->name, kind_names[i]);
      if ((rc = zt_nvme_store_alloc(k->store, name, bytes)) < 0)
        return zt__dp_rank_fail(k, rc, "offload.nvme_dir: %s", zt_nvme_store_error(k->store));
      k->ext[3 * u + i] = rc;
      k->nvme_bytes += (bytes + ZT_NVME_ALIGN - 1) / ZT_NVME_ALIGN * ZT_NVME_ALIGN;
    }
  return 0;
}

/* The host tier of rank k, its copy engine and its math, on the rank's thread (a cuda rank's
 * pages are registered with its device). */
static int host_open(dp_rank_state *k) {
  const dp_state *s = k->s;
  const zt_backend *be = &k->view.be;
  const zt_train_cfg *tc = &k->view.tc;
  int on_gpu = strcmp(be->ops->name, "cuda") == 0, rc;
  if ((rc = zt_host_arena_open(&k->host, host_tier_bytes(s, tc),
                               on_gpu ? zt_host_mem_cuda() : NULL)) < 0)
    return zt__dp_rank_fail(k, rc, "opening the host tier failed: %s", strerror(-rc));
  float **bufs[5];
  size_t len[5], hm = host_master_floats(s);
  int nb = 0, lp = tc->precision != ZT_F32;
  bufs[nb] = &k->hgrad;
  len[nb++] = s->host_n;
  if (has_hstage(s, tc)) {
    bufs[nb] = &k->hstage;
    len[nb++] = s->host_n;
  }
  if (hm) {
    bufs[nb] = &k->hm;
    len[nb++] = hm;
  }
  if (s->hopt_n) {
    bufs[nb] = &k->hmom;
    len[nb++] = s->hopt_n;
    bufs[nb] = &k->hvar;
    len[nb++] = s->hopt_n;
  }
  for (int i = 0; i < nb; i++) {
    if ((rc = zt_host_arena_alloc(k->host, len[i] * sizeof(float), (void **)bufs[i])) < 0)
      return host_fail(k, rc);
    memset(*bufs[i], 0, len[i] * sizeof(float));
  }
  if (lp && hm && (rc = zt_host_arena_alloc(k->host, hm * sizeof(uint16_t), (void **)&k->hlp)) < 0)
    return host_fail(k, rc);
  /* page-aligned and pinned: O_DIRECT reads and writes, and the uploads, straight from them */
  for (int i = 0; s->nvme && i < 2; i++) {
    nv_set *x = &k->sets[i];
    for (int j = 0; j < 3; j++) {
      if ((rc = zt_host_arena_alloc(k->host, s->nv_chunk * sizeof(float),
                                    (void **)&x->buf[j])) < 0)
        return host_fail(k, rc);
      memset(x->buf[j], 0, s->nv_chunk * sizeof(float));
    }
    if (lp && !s->params_nvme &&
        (rc = zt_host_arena_alloc(k->host, s->nv_chunk * sizeof(uint16_t), (void **)&x->lp)) < 0)
      return host_fail(k, rc);
    x->unit = -1;
  }
  for (int i = 0; i < 2; i++) {
    k->pstage_unit[i] = k->pstage_req[i] = -1;
    if (s->params_nvme && (rc = zt_host_arena_alloc(k->host, s->nv_chunk * sizeof(float),
                                                    (void **)&k->pstage[i])) < 0)
      return host_fail(k, rc);
  }
  if (s->nvme && (rc = nv_open(k)) < 0) return rc;
  k->hbe = *be;
  if (on_gpu) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = cores > s->nl ? (int)(cores / s->nl) : 1;
    if ((rc = zt_backend_cpu_open(&k->hbe, threads)) < 0) {
      k->hbe = *be;
      return zt__dp_rank_fail(k, rc, "opening a cpu backend for the host tier failed (%d)", rc);
    }
    k->own_hbe = 1;
  }
  rc = on_gpu ? zt_copy_cuda_open(&k->copy, zt_backend_device(be), k->stream)
              : zt_copy_cpu_open(&k->copy, 0);
  if (rc < 0) return zt__dp_rank_fail(k, rc, "opening the copy engine failed: %s", strerror(-rc));
  k->tasks = calloc((size_t)k->nsegs, sizeof *k->tasks);
  k->unit_tick = calloc((size_t)s->nu, sizeof *k->unit_tick);
  k->usumsq = calloc((size_t)s->nu, sizeof *k->usumsq);
  k->submitted = calloc((size_t)s->nu, 1);
  k->began = calloc((size_t)s->nu, 1);
  if (!k->tasks || !k->unit_tick || !k->usumsq || !k->submitted || !k->began)
    return zt__dp_rank_fail(k, -ENOMEM, "out of host memory");
  k->chunk_unit[0] = k->chunk_unit[1] = -1;
  return 0;
}

static int rank_open(dp_rank_state *k) {
  dp_state *s = k->s;
  const zt_train_cfg *tc = &k->view.tc;
  const zt_backend *be = &k->view.be;
  const zt_model_cfg *mc = zt_model_cfg_of(k->view.model);
  const zt_shard_table *tab = s->tab;
  size_t ds = zt_dtype_size(tc->precision), N = (size_t)tc->micro_batch * (size_t)mc->seq_len;
  int stage = s->dc.zero_stage, rc = be->ops->set_allow_tf32(be->ctx, tc->tf32);
  if (rc < 0)
    return zt__dp_rank_fail(k, rc, "train.tf32: the %s backend cannot set this matmul mode",
                            be->ops->name);
  char why[200];
  rc = zt_acts_open_dt(&k->view.acts, k->view.model, be, tc->micro_batch, tc->ckpt_every,
                       tc->precision, why, sizeof why);
  if (rc < 0) return zt__dp_rank_fail(k, rc, "%s", why);
  k->bytes += zt_acts_bytes(k->view.acts);
  k->view.h_tok = malloc(N * sizeof *k->view.h_tok);
  k->view.h_tgt = malloc(N * sizeof *k->view.h_tgt);
  k->h_xchg = malloc((size_t)s->dc.world * s->rec * sizeof *k->h_xchg);
  k->gather_tick = calloc((size_t)s->nu, sizeof *k->gather_tick);
  if (!k->view.h_tok || !k->view.h_tgt || !k->h_xchg || !k->gather_tick || build_segs(k) < 0)
    return zt__dp_rank_fail(k, -ENOMEM, "out of host memory");
  size_t pn = dev_param_floats(s);
  k->params = rank_alloc(k, pn * sizeof(float), &rc);
  if (tc->precision != ZT_F32) k->params_lp = rank_alloc(k, pn * ds, &rc);
  k->grads = rank_alloc(k, dev_grad_floats(s) * sizeof(float), &rc);
  k->m = rank_alloc(k, s->dev_packed * sizeof(float), &rc);
  k->v = rank_alloc(k, s->dev_packed * sizeof(float), &rc);
  k->xchg = rank_alloc(k, (size_t)s->dc.world * s->rec * sizeof(double), &rc);
  for (int i = 0; i < gout_count(s); i++)
    k->gout[i] = rank_alloc(k, tab->max_chunk * sizeof(float), &rc);
  for (int i = 0; s->params_host && i < 2; i++) {
    k->pchunk[i] = rank_alloc(k, tab->max_chunk * sizeof(float), &rc);
    if (tc->precision != ZT_F32) k->lpchunk[i] = rank_alloc(k, tab->max_chunk * ds, &rc);
  }
  if (stage >= 2) {
    for (int i = 0; i < 2; i++) k->gunit[i] = rank_alloc(k, s->slot_floats * sizeof(float), &rc);
    if (s->tied)
      k->gembed = rank_alloc(k, tab->chunk[0] * (size_t)s->dc.world * sizeof(float), &rc);
    k->gscratch = rank_alloc(k, tab->max_chunk * sizeof(float), &rc);
  }
  if (stage == 3) {
    for (int i = 0; i < 2; i++) {
      k->pslot[i] = rank_alloc(k, s->slot_floats * sizeof(float), &rc);
      if (tc->precision != ZT_F32) k->lpslot[i] = rank_alloc(k, s->slot_floats * ds, &rc);
    }
    if (s->tied) {
      size_t e = tab->chunk[0] * (size_t)s->dc.world;
      k->pembed = rank_alloc(k, e * sizeof(float), &rc);
      if (tc->precision != ZT_F32) k->lpembed = rank_alloc(k, e * ds, &rc);
    }
  }
  if (rc == 0 && s->host_n) rc = host_open(k);
  if (rc == 0 && (rc = be->ops->sync(be->ctx)) < 0)
    zt__dp_rank_fail(k, rc, "backend %s: %s", be->ops->name, be->ops->error_text(be->ctx));
  return rc;
}

/* The backend bytes rank_open allocates besides the activations, from the same layout: what
 * zt_dp_estimate_rank_bytes adds up without opening (tests compare the two). */
static size_t rank_buffer_bytes(const dp_state *s, const zt_train_cfg *tc) {
  const zt_shard_table *tab = s->tab;
  size_t f = sizeof(float), W = (size_t)s->dc.world;
  size_t lp = tc->precision != ZT_F32 ? zt_dtype_size(tc->precision) : 0;
  int stage = s->dc.zero_stage;
  size_t b = dev_param_floats(s) * (f + lp) + dev_grad_floats(s) * f + 2 * s->dev_packed * f +
             W * s->rec * sizeof(double) + (size_t)gout_count(s) * tab->max_chunk * f;
  if (s->params_host) b += 2 * tab->max_chunk * (f + lp);
  if (stage >= 2)
    b += 2 * s->slot_floats * f + (s->tied ? tab->chunk[0] * W * f : 0) + tab->max_chunk * f;
  if (stage == 3)
    b += 2 * s->slot_floats * (f + lp) + (s->tied ? tab->chunk[0] * W * (f + lp) : 0);
  return b;
}

static void rank_close(dp_rank_state *k) {
  const zt_backend *be = &k->view.be;
  /* the copies in flight read or write device buffers */
  zt_copy_close(k->copy);
  /* the I/O in flight reads or writes the sets; the files go with the store */
  zt_nvme_store_close(k->store);
  if (k->nvdir[0]) rmdir(k->nvdir);
  free(k->ext);
  void *bufs[] = {k->params,    k->params_lp, k->grads,     k->m,         k->v,
                  k->xchg,      k->gunit[0],  k->gunit[1],  k->gembed,    k->gscratch,
                  k->pslot[0],  k->pslot[1],  k->lpslot[0], k->lpslot[1], k->pembed,
                  k->lpembed,   k->gout[0],   k->gout[1],   k->pchunk[0], k->pchunk[1],
                  k->lpchunk[0], k->lpchunk[1]};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (bufs[i]) be->ops->free(be->ctx, bufs[i]);
  zt_host_arena_close(k->host);
  if (k->own_hbe) zt_backend_close(&k->hbe);
  free(k->tasks);
  free(k->first_seg);
  free(k->unit_tick);
  free(k->usumsq);
  free(k->submitted);
  free(k->began);
  free(k->gather_tick);
  zt_acts_close(k->view.acts);
  free(k->blob);
  free(k->view.h_tok);
  free(k->view.h_tgt);
  free(k->h_xchg);
  free(k->segs);
}

/* ---- the step (on every rank's thread at once) -------------------------------------------- */

/* Where rank k keeps unit u's parameters of its chunk sh (stage 3: the shard; else the padded
 * copy) */
size_t zt__dp_param_at(const dp_rank_state *k, const zt_shard *sh) {
  return k->s->dc.zero_stage == 3 ? sh->packed_off : sh->padded_off;
}

static size_t grad_at(const dp_rank_state *k, const zt_shard *sh) {
  return k->s->dc.zero_stage == 1 ? sh->padded_off : sh->packed_off;
}

void *zt__dp_lp_of(const dp_rank_state *k, void *base, size_t elem) {
  return (char *)base + elem * zt_dtype_size(k->view.tc.precision);
}

static int copy_fail(dp_rank_state *k, int rc, const char *what) {
  return zt__dp_rank_fail(k, rc < 0 ? rc : -EIO, "copy engine: %s failed (%s)", what,
                          strerror(rc < 0 ? -rc : EIO));
}

/* ---- the communicator's queue: collectives that overlap the compute ------------------------ */
/* The device units' collectives of a step run on the queue (comm.h), each after the compute
 * that produced its input (q_begin) and before the compute that reads its output or reuses its
 * buffer (q_wait on its ticket). The host units' run on the compute stream as before: their
 * copies to and from the host are ordered after the compute, not after the queue. */
static void *q_stream(const dp_rank_state *k) { return k->comm.ops->queue(k->comm.ctx); }

/* The queue's next collectives start after the compute queued so far. */
static int q_begin(dp_rank_state *k) {
  int rc = k->comm.ops->queue_after(k->comm.ctx, k->stream);
  return rc < 0 ? zt__dp_comm_fail(k, rc, "ordering a collective after the compute") : 0;
}

/* A ticket for the collectives queued so far (>= 1), or the failure. */
static long long q_mark(dp_rank_state *k) {
  long long t = k->comm.ops->queue_mark(k->comm.ctx);
  return t < 0 ? zt__dp_comm_fail(k, (int)t, "marking the collectives queued") : t;
}

/* The compute queued next waits for ticket t (0: nothing to wait for). */
static int q_wait(dp_rank_state *k, long long t) {
  if (t <= k->q_waited) return 0;
  int rc = k->comm.ops->stream_wait(k->comm.ctx, k->stream, t);
  if (rc < 0) return zt__dp_comm_fail(k, rc, "ordering the compute after a collective");
  k->q_waited = t;
  return 0;
}

/* The compute queued next waits for every collective queued so far. */
static int q_wait_all(dp_rank_state *k) {
  long long t = q_mark(k);
  return t < 0 ? (int)t : q_wait(k, t);
}

/* params host: the copy of host unit u's chunk (fp32 and the compute copy) into chunk buffer
 * u & 1, ordered after the compute queued so far (the gather that last read it). */
static int stage_chunk(dp_rank_state *k, int u) {
  const dp_state *s = k->s;
  const zt_shard *sh = zt_shard_at(s->tab, u, k->r);
  size_t c = s->tab->chunk[u], at = host_at(s, sh);
  int b = u & 1;
  int64_t t = k->copy->ops->h2d(k->copy, k->pchunk[b], k->hm + at, c * sizeof(float),
                                ZT_COPY_AFTER_ALL);
  if (t > 0 && k->hlp)
    t = k->copy->ops->h2d(k->copy, k->lpchunk[b], k->hlp + at, c * sizeof(uint16_t),
                          ZT_COPY_AFTER_ALL);
  if (t < 0) return copy_fail(k, (int)t, "copying a parameter chunk to the device");
  k->chunk_unit[b] = u;
  k->chunk_tick[b] = k->h2d_last = t;
  return 0;
}

/* ---- params nvme: the NVMe units' chunks read from their master files before each gather ---
 * The step reads a file while no write of it is in flight: the update of a unit begins after
 * its last gather of the step (the backward walks down, the updates follow it), and the last
 * step's write-behind was waited for when its sets were retired (nv_finish), before this step
 * began; a state call that writes the files runs between steps. */

static int nvp_fail(dp_rank_state *k, int rc) {
  const char *e = zt_nvme_store_error(k->store);
  return zt__dp_rank_fail(k, rc, "params nvme: %s", e[0] ? e : strerror(-rc));
}

/* Staging b's read waited for, if one is; a failed one leaves it holding nothing. */
static int nvp_settle(dp_rank_state *k, int b) {
  if (k->pstage_req[b] < 0) return 0;
  int rc = zt_nvme_wait(k->store, k->pstage_req[b]);
  k->pstage_req[b] = -1;
  if (rc < 0) {
    k->pstage_unit[b] = -1;
    return nvp_fail(k, rc);
  }
  return 0;
}

/* Starts reading NVMe unit u's chunk from its master file into staging u & 1 unless it is
 * there or coming, once the copy that last read the staging has landed. */
static int nvp_read(dp_rank_state *k, int u) {
  int b = u & 1, rc;
  if (k->pstage_unit[b] == u) return 0;
  if ((rc = nvp_settle(k, b)) < 0) return rc;
  if (k->pstage_tick[b] &&
      (rc = k->copy->ops->wait(k->copy, ZT_COPY_H2D, k->pstage_tick[b])) < 0)
    return copy_fail(k, rc, "copying a parameter chunk to the device");
  k->pstage_tick[b] = 0;
  k->pstage_unit[b] = -1;
  size_t bytes = k->s->tab->chunk[u] * sizeof(float);
  if ((rc = zt_nvme_read(k->store, k->ext[3 * u], 0, k->pstage[b], bytes)) < 0)
    return nvp_fail(k, rc);
  k->pstage_unit[b] = u;
  k->pstage_req[b] = rc;
  return 0;
}

/* NVMe unit u's chunk into chunk buffer u & 1: its read (started ahead, normally) waited for,
 * then the copy, ordered after the compute queued so far (the gather that last read the
 * buffer). */
static int nvp_stage(dp_rank_state *k, int u) {
  int b = u & 1, rc;
  if ((rc = nvp_read(k, u)) < 0 || (rc = nvp_settle(k, b)) < 0) return rc;
  int64_t t = k->copy->ops->h2d(k->copy, k->pchunk[b], k->pstage[b],
                                k->s->tab->chunk[u] * sizeof(float), ZT_COPY_AFTER_ALL);
  if (t < 0) return copy_fail(k, (int)t, "copying a parameter chunk to the device");
  k->chunk_unit[b] = u;
  k->chunk_tick[b] = k->pstage_tick[b] = t;
  return 0;
}

/* The reads still in flight waited for (only a failed step leaves any, and its error is the
 * step's); the stagings hold nothing the next step may use (the update rewrites the files). */
static void nvp_finish(dp_rank_state *k) {
  for (int b = 0; b < 2; b++) {
    if (k->pstage_req[b] >= 0) zt_nvme_wait(k->store, k->pstage_req[b]);
    k->pstage_req[b] = k->pstage_unit[b] = -1;
  }
}

/* Whether the walk is still to gather host unit v from a chunk buffer: no slot (nor the
 * embedding's) holds it. */
static int walk_gathers(const dp_rank_state *k, int v) {
  const dp_state *s = k->s;
  if (v < 0 || v >= s->nu || !zt__dp_on_host(s, v)) return 0;
  return s->tied && v == 0 ? !k->embed_gathered : k->slot_unit[v & 1] != v;
}

/* params nvme: unit v's file read ahead of its staging, where the walk is to gather it from
 * NVMe and no chunk buffer holds it. */
static int nvp_ahead(dp_rank_state *k, int v) {
  if (!walk_gathers(k, v) || !zt__dp_on_nvme(k->s, v) || k->chunk_unit[v & 1] == v) return 0;
  return nvp_read(k, v);
}

/* A host unit's chunk into chunk buffer u & 1, from the host tier or its file. */
static int stage_unit(dp_rank_state *k, int u) {
  return k->s->params_nvme && zt__dp_on_nvme(k->s, u) ? nvp_stage(k, u) : stage_chunk(k, u);
}

/* Stage 3: unit u's parameters gathered into p (and the compute copy into lp), *tick the
 * compute's wait for them. A device unit's gather runs on the queue after the compute queued
 * so far (the slot's last reader). A host unit's chunk comes from its chunk buffer, gathered on
 * the compute stream, and the next unit of the walk's is copied behind it; with params nvme
 * the file of the unit after that is read meanwhile (and the next one's, after a device unit),
 * so that each read and each copy overlap the compute of a unit before theirs. */
static int gather_unit(dp_rank_state *k, int u, float *p, void *lp, long long *tick) {
  const dp_state *s = k->s;
  const zt_backend *be = &k->view.be;
  const zt_shard *sh = zt_shard_at(s->tab, u, k->r);
  size_t c = s->tab->chunk[u];
  zt_dtype dt = k->view.tc.precision;
  const zt_comm_ops *co = k->comm.ops;
  const float *src = k->params + sh->packed_off;
  const void *lsrc = k->params_lp ? zt__dp_lp_of(k, k->params_lp, sh->packed_off) : NULL;
  int host = s->params_host && zt__dp_on_host(s, u), rc;
  if (host) {
    int b = u & 1;
    if (k->chunk_unit[b] != u && (rc = stage_unit(k, u)) < 0) return rc;
    if ((rc = k->copy->ops->compute_wait(k->copy, ZT_COPY_H2D, k->chunk_tick[b])) < 0)
      return copy_fail(k, rc, "ordering a gather after its chunk's copy");
    src = k->pchunk[b];
    lsrc = k->lpchunk[b];
    /* a file holds the fp32 masters alone: the compute copy is their cast, as AdamW writes it,
     * made here where the gather waits for the copy anyway */
    if (lp && s->params_nvme && zt__dp_on_nvme(s, u))
      be->ops->cast(be->ctx, k->lpchunk[b], dt, k->pchunk[b], ZT_F32, c);
  } else if ((rc = q_begin(k)) < 0) {
    return rc;
  }
  void *on = host ? k->stream : q_stream(k);
  rc = co->all_gather(k->comm.ctx, src, p, c * sizeof(float), on);
  if (rc == 0 && lp) rc = co->all_gather(k->comm.ctx, lsrc, lp, c * zt_dtype_size(dt), on);
  if (rc < 0) return zt__dp_comm_fail(k, rc, "gathering parameters");
  *tick = 0;
  if (!host && (*tick = q_mark(k)) < 0) return (int)*tick;
  int next = u + k->dir;
  if (host && walk_gathers(k, next) && k->chunk_unit[next & 1] != next &&
      (rc = stage_unit(k, next)) < 0)
    return rc;
  for (int i = 1; s->params_nvme && i <= 2; i++)
    if ((rc = nvp_ahead(k, u + i * k->dir)) < 0) return rc;
  return 0;
}

/* Unit u's parameters (fp32 and the compute copy; in fp32 the same) for its forward or
 * backward; stage 3 gathers them unless a slot holds them. With `use` the compute queued next
 * reads them: it waits for their gather (stages 1-2: the last step's, of the updated
 * parameters). */
static int unit_params(dp_rank_state *k, int u, int use, const float **p, const void **lp) {
  const dp_state *s = k->s;
  if (s->dc.zero_stage < 3) {
    size_t at = s->tab->padded_unit[u];
    *p = k->params + at;
    *lp = k->params_lp ? zt__dp_lp_of(k, k->params_lp, at) : (const void *)*p;
    return use ? q_wait(k, k->gather_tick[u]) : 0;
  }
  float *fp;
  void *l;
  long long *tick;
  if (s->tied && u == 0) {
    fp = k->pembed;
    l = k->lpembed;
    tick = &k->embed_tick;
    if (!k->embed_gathered) {
      int rc = gather_unit(k, u, fp, l, tick);
      if (rc < 0) return rc;
      k->embed_gathered = 1;
    }
  } else {
    int slot = u & 1;
    fp = k->pslot[slot];
    l = k->lpslot[slot];
    tick = &k->slot_tick[slot];
    if (k->slot_unit[slot] != u) {
      k->slot_unit[slot] = -1;
      int rc = gather_unit(k, u, fp, l, tick);
      if (rc < 0) return rc;
      k->slot_unit[slot] = u;
    }
  }
  *p = fp;
  *lp = l ? (const void *)l : (const void *)fp;
  return use ? q_wait(k, *tick) : 0;
}

/* Stage 3: the next unit's gather issued before this one computes. */
static int prefetch(dp_rank_state *k, int u) {
  const float *p;
  const void *lp;
  if (k->s->dc.zero_stage < 3 || u < 0 || u >= k->s->nu) return 0;
  return unit_params(k, u, 0, &p, &lp);
}

/* The gradient buffer unit u's backward adds into. */
float *zt__dp_unit_grads(dp_rank_state *k, int u) {
  const dp_state *s = k->s;
  if (s->dc.zero_stage == 1) return k->grads + s->tab->padded_unit[u];
  return s->tied && u == 0 ? k->gembed : k->gunit[u & 1];
}

/* A host unit's reduced chunk at dev goes to the host tier behind the collective: the first
 * micro-batch's into the gradients, a later one's into the staging (added after the
 * micro-batch). */
static int grads_to_host(dp_rank_state *k, int u, int j, const float *dev) {
  const dp_state *s = k->s;
  float *h = (j == 0 ? k->hgrad : k->hstage) + host_at(s, zt_shard_at(s->tab, u, k->r));
  int64_t t = k->copy->ops->d2h(k->copy, h, dev, s->tab->chunk[u] * sizeof(float));
  if (t < 0) return copy_fail(k, (int)t, "copying gradients to the host");
  k->unit_tick[u] = t;
  return 0;
}

/* Starts host unit u's AdamW on the pool (its calls in k->tasks): on the host tier, or for an
 * NVMe unit on its set (read). */
static int submit_adam(dp_rank_state *k, int u, float scale) {
  const dp_state *s = k->s;
  const zt_train_cfg *c = &k->view.tc;
  size_t base = host_at(s, zt_shard_at(s->tab, u, k->r));
  const nv_set *x = &k->sets[u & 1];
  int nv = zt__dp_on_nvme(s, u);
  /* the state's chunk, and where the chunk's element 0 is */
  float *p = nv ? x->buf[0] : k->hm + base, *mo = nv ? x->buf[1] : k->hmom + base;
  float *va = nv ? x->buf[2] : k->hvar + base;
  uint16_t *lp = nv ? x->lp : k->hlp ? k->hlp + base : NULL;
  for (int i = k->first_seg[u]; i < k->first_seg[u + 1]; i++) {
    const adam_seg *g = &k->segs[i];
    size_t at = g->off;
    zt_cpu_adam_task *task = &k->tasks[i];
    *task = (zt_cpu_adam_task){
        .p = p + at, .g = k->hgrad + base + at, .m = mo + at, .v = va + at,
        .p_bf16 = lp && c->precision == ZT_BF16 ? lp + at : NULL,
        .p_fp16 = lp && c->precision == ZT_F16 ? lp + at : NULL, .n = g->n,
        .isa = ZT_CPU_ISA_AUTO,
        .h = {.lr = s->lr, .beta1 = c->beta1, .beta2 = c->beta2, .eps = c->eps,
              .weight_decay = g->decay ? c->weight_decay : 0.0f, .step = s->adam_step,
              .grad_scale = scale}};
    int rc = zt_cpu_adam_submit(s->pool, task);
    if (rc < 0) {
      while (--i >= k->first_seg[u]) zt_cpu_adam_wait(s->pool, &k->tasks[i]);
      return zt__dp_rank_fail(k, rc, "the host AdamW: %s", strerror(-rc));
    }
  }
  k->submitted[u] = 1;
  return 0;
}

static void wait_adam(dp_rank_state *k, int u) {
  if (!k->submitted[u]) return;
  for (int i = k->first_seg[u]; i < k->first_seg[u + 1]; i++)
    zt_cpu_adam_wait(k->s->pool, &k->tasks[i]);
  k->submitted[u] = 0;
}

/* optimizer nvme: starts the reads (write 0) or writes of set x's unit, its whole chunk (the
 * padding zero); on a failure waits for those started. The store's message names the file. */
int zt__dp_nv_io(dp_rank_state *k, nv_set *x, int write) {
  size_t bytes = k->s->tab->chunk[x->unit] * sizeof(float);
  for (int i = 0; i < 3; i++) {
    int ext = k->ext[3 * x->unit + i];
    int rc = write ? zt_nvme_write(k->store, ext, 0, x->buf[i], bytes)
                   : zt_nvme_read(k->store, ext, 0, x->buf[i], bytes);
    if (rc < 0) {
      while (i-- > 0) zt_nvme_wait(k->store, x->req[i]);
      return rc;
    }
    x->req[i] = rc;
  }
  return 0;
}

int zt__dp_nv_wait(dp_rank_state *k, nv_set *x) {
  int rc = 0;
  for (int i = 0; i < 3; i++) {
    int r = zt_nvme_wait(k->store, x->req[i]);
    if (r < 0 && rc == 0) rc = r;
  }
  return rc;
}

/* The message of a failed NVMe call (the store's names the file). */
void zt__dp_nv_why(const dp_rank_state *k, int rc, char *why, size_t len) {
  const char *e = zt_nvme_store_error(k->store);
  snprintf(why, len, "optimizer nvme: %s", e[0] ? e : strerror(-rc));
}

int zt__dp_nv_fail(dp_rank_state *k, int rc) {
  char why[400];
  zt__dp_nv_why(k, rc, why, sizeof why);
  return zt__dp_rank_fail(k, rc, "%s", why);
}

/* optimizer nvme: set x's updated chunk where the step reads it: with params nvme in the
 * master file written behind (nothing more to do), with params host into the host's parameters
 * (the copies staged from them so far landed first), else onto the device on the copy engine,
 * which orders it after the compute queued so far (the backward of the unit may still read the
 * old parameters). */
static int nv_upload(dp_rank_state *k, const nv_set *x) {
  const dp_state *s = k->s;
  const zt_shard *sh = zt_shard_at(s->tab, x->unit, k->r);
  size_t c = s->tab->chunk[x->unit], at = host_at(s, sh), dev = zt__dp_param_at(k, sh);
  int rc;
  if (s->params_nvme) return 0;
  if (s->params_host) {
    if (k->h2d_last && (rc = k->copy->ops->wait(k->copy, ZT_COPY_H2D, k->h2d_last)) < 0)
      return copy_fail(k, rc, "copying a parameter chunk to the device");
    memcpy(k->hm + at, x->buf[0], c * sizeof(float));
    if (x->lp) memcpy(k->hlp + at, x->lp, c * sizeof(uint16_t));
    return 0;
  }
  int64_t t = k->copy->ops->h2d(k->copy, k->params + dev, x->buf[0], c * sizeof(float),
                                ZT_COPY_AFTER_ALL);
  if (t > 0 && x->lp)
    t = k->copy->ops->h2d(k->copy, zt__dp_lp_of(k, k->params_lp, dev), x->lp,
                          c * zt_dtype_size(k->view.tc.precision), ZT_COPY_AFTER_ALL);
  if (t < 0) return copy_fail(k, (int)t, "copying updated parameters to the device");
  k->up_tick = t;
  return 0;
}

/* Back to FREE: a read landed; an update waited for, its chunk uploaded and written behind;
 * a write (and the upload, which reads the set too) landed before the set is used again. */
static int nv_retire(dp_rank_state *k, nv_set *x) {
  int rc = 0;
  if (x->st == NV_READING && (rc = zt__dp_nv_wait(k, x)) < 0) rc = zt__dp_nv_fail(k, rc);
  if (x->st == NV_UPDATING) {
    wait_adam(k, x->unit);
    if ((rc = nv_upload(k, x)) == 0) {
      if ((rc = zt__dp_nv_io(k, x, 1)) < 0)
        rc = zt__dp_nv_fail(k, rc);
      else
        x->st = NV_WRITING;
    }
  }
  if (x->st == NV_WRITING) {
    if ((rc = zt__dp_nv_wait(k, x)) < 0) rc = zt__dp_nv_fail(k, rc);
    int r = k->up_tick ? k->copy->ops->wait(k->copy, ZT_COPY_H2D, k->up_tick) : 0;
    if (r < 0 && rc == 0) rc = copy_fail(k, r, "copying updated parameters to the device");
  }
  x->st = NV_FREE;
  x->unit = -1;
  return rc;
}

/* Starts reading host unit u's state into its set, unless it is there or coming. */
static int nv_read(dp_rank_state *k, int u) {
  nv_set *x = &k->sets[u & 1];
  if (x->unit == u) return 0;
  int rc = nv_retire(k, x);
  if (rc < 0) return rc;
  x->unit = u;
  if ((rc = zt__dp_nv_io(k, x, 0)) < 0) {
    x->unit = -1;
    return zt__dp_nv_fail(k, rc);
  }
  x->st = NV_READING;
  return 0;
}

/* Host unit u's AdamW from its set once read (the compute copy cast from the masters first,
 * so that the chunk's padding is as the host tier keeps it), then the state of the unit below
 * read ahead: that retires the set of the unit above (its update waited for, uploaded and
 * written behind) while the pool updates this one. */
static int nv_update(dp_rank_state *k, int u, float scale) {
  nv_set *x = &k->sets[u & 1];
  int rc = nv_read(k, u);
  if (rc == 0 && x->st == NV_READING && (rc = zt__dp_nv_wait(k, x)) < 0)
    rc = zt__dp_nv_fail(k, rc);
  if (rc == 0 && x->lp)
    k->hbe.ops->cast(k->hbe.ctx, x->lp, k->view.tc.precision, x->buf[0], ZT_F32,
                     k->s->tab->chunk[u]);
  if (rc == 0) {
    x->st = NV_UPDATING;
    rc = submit_adam(k, u, scale);
  }
  if (rc < 0) {
    x->st = NV_FREE;
    x->unit = -1;
    return rc;
  }
  return u - 1 >= k->s->nv0 ? nv_read(k, u - 1) : 0;
}

/* Every set retired, the higher unit's first; the first failure's message is kept. */
static int nv_finish(dp_rank_state *k) {
  int hi = k->sets[1].unit > k->sets[0].unit, rc = 0;
  for (int i = 0; i < 2; i++) {
    char keep[sizeof k->err];
    if (rc < 0) memcpy(keep, k->err, sizeof keep);
    int r = nv_retire(k, &k->sets[i ? !hi : hi]);
    if (rc < 0)
      memcpy(k->err, keep, sizeof keep);
    else
      rc = r;
  }
  return rc;
}

/* Host unit u's AdamW, from the host tier or its files. */
static int update_host_unit(dp_rank_state *k, int u, float scale) {
  k->began[u] = 1;
  return zt__dp_on_nvme(k->s, u) ? nv_update(k, u, scale) : submit_adam(k, u, scale);
}

/* Host unit u's gradients of micro-batch j have landed (waited for): a later micro-batch's are
 * added to the running sum as the device adds its units'; after the last one its sum of squares
 * is taken and, when the update may overlap the backward (no clipping: no norm needed first),
 * its AdamW starts unless a gradient of this rank was not finite. */
static int take_up_unit(dp_rank_state *k, int u, int j) {
  const dp_state *s = k->s;
  const zt_shard *sh = zt_shard_at(s->tab, u, k->r);
  size_t at = host_at(s, sh), c = s->tab->chunk[u];
  int rc = k->copy->ops->wait(k->copy, ZT_COPY_D2H, k->unit_tick[u]);
  if (rc < 0) return copy_fail(k, rc, "copying gradients to the host");
  if (j > 0 && s->dc.zero_stage >= 2)
    k->hbe.ops->add(k->hbe.ctx, k->hgrad + at, k->hgrad + at, k->hstage + at, c);
  if (j < k->view.tc.grad_accum - 1) return 0;
  int nf = 0;
  k->usumsq[u] = sh->count ? k->hbe.ops->sum_squares(k->hbe.ctx, k->hgrad + at, sh->count, &nf)
                           : 0.0;
  k->nonfinite |= nf;
  /* clipping needs the norm first, fp16 the world's overflow verdict */
  if (k->view.tc.grad_clip > 0 || k->view.tc.precision == ZT_F16 || k->nonfinite) return 0;
  if ((rc = update_host_unit(k, u, 1.0f)) == 0) k->updated++;
  return rc;
}

/* Takes up the host units the backward of micro-batch j has copied, down to unit `to`. */
static int take_up_to(dp_rank_state *k, int to, int j) {
  const dp_state *s = k->s;
  if (s->dc.zero_stage == 1 && j < k->view.tc.grad_accum - 1) return 0; /* nothing copied */
  for (; k->take_up >= to && k->take_up >= s->ng; k->take_up--) {
    int rc = take_up_unit(k, k->take_up, j);
    if (rc < 0) return rc;
  }
  return 0;
}

/* Stages 2-3: the reduced chunk of a later micro-batch, waiting in gscratch, added to its
 * unit's shard once its reduction is done (before gscratch is reduced into again). */
static int flush_add(dp_rank_state *k) {
  const zt_backend *be = &k->view.be;
  int u = k->add_unit, rc;
  if (u < 0) return 0;
  k->add_unit = -1;
  if ((rc = q_wait(k, k->add_tick)) < 0) return rc;
  float *shard = k->grads + zt_shard_at(k->s->tab, u, k->r)->packed_off;
  be->ops->add(be->ctx, shard, shard, k->gscratch, k->s->tab->chunk[u]);
  return 0;
}

/* Unit u's gradients of micro-batch j are done: stage 1 all-reduces them after the last
 * micro-batch; stages 2-3 reduce-scatter them into the shard (the first micro-batch writes it,
 * later ones add). A device unit's collective runs on the queue while the compute goes on to
 * the next unit; a host unit's reduced chunk goes to the host. */
static int unit_grads_done(dp_rank_state *k, int u, int j) {
  const dp_state *s = k->s;
  const zt_comm_ops *co = k->comm.ops;
  const zt_shard *sh = zt_shard_at(s->tab, u, k->r);
  size_t c = s->tab->chunk[u], W = (size_t)s->dc.world;
  float *g = zt__dp_unit_grads(k, u);
  int rc = 0;
  if (s->dc.zero_stage == 1) {
    if (j < k->view.tc.grad_accum - 1) return 0;
    if (zt__dp_on_host(s, u)) {
      if ((rc = co->all_reduce(k->comm.ctx, g, g, c * W, k->stream)) < 0)
        return zt__dp_comm_fail(k, rc, "reducing gradients");
      return grads_to_host(k, u, 0, k->grads + sh->padded_off);
    }
    if ((rc = q_begin(k)) < 0) return rc;
    if ((rc = co->all_reduce(k->comm.ctx, g, g, c * W, q_stream(k))) < 0)
      return zt__dp_comm_fail(k, rc, "reducing gradients");
    return 0;
  }
  long long *tick = g == k->gembed ? &k->gembed_tick : &k->gunit_tick[u & 1];
  if ((rc = flush_add(k)) < 0) return rc;
  if (zt__dp_on_host(s, u)) {
    *tick = 0; /* on the compute stream */
    /* the chunk buffer's last copy out is done before the collective rewrites it */
    int b = u & 1;
    if (k->gout_tick[b] &&
        (rc = k->copy->ops->compute_wait(k->copy, ZT_COPY_D2H, k->gout_tick[b])) < 0)
      return copy_fail(k, rc, "ordering a reduction after a copy");
    if ((rc = co->reduce_scatter(k->comm.ctx, g, k->gout[b], c, k->stream)) < 0)
      return zt__dp_comm_fail(k, rc, "reducing gradients");
    if ((rc = grads_to_host(k, u, j, k->gout[b])) < 0) return rc;
    k->gout_tick[b] = k->unit_tick[u];
    return 0;
  }
  if ((rc = q_begin(k)) < 0) return rc;
  rc = co->reduce_scatter(k->comm.ctx, g, j == 0 ? k->grads + sh->packed_off : k->gscratch, c,
                          q_stream(k));
  if (rc < 0) return zt__dp_comm_fail(k, rc, "reducing gradients");
  if ((*tick = q_mark(k)) < 0) return (int)*tick;
  if (j > 0) {
    k->add_unit = u;
    k->add_tick = *tick;
  }
  return 0;
}

/* Micro-batch j of this rank: forward, loss, backward, the gradients reduced unit by unit. The
 * collectives run whether the micro-batch counted or not. */
static int rank_micro(dp_rank_state *k, int j, double *rec) {
  const dp_state *s = k->s;
  const zt_model *m = k->view.model;
  const zt_backend *be = &k->view.be;
  zt_acts *a = k->view.acts;
  int G = k->view.tc.grad_accum, W = s->dc.world, stage = s->dc.zero_stage;
  int counted = zt__trainer_stage_micro(&k->view, s->tokens, k->r * G + j);
  const float *p, *e = NULL;
  const void *lp, *elp = NULL;
  int rc;
  k->dir = 1;
  for (int u = 0; u < s->nu; u++) {
    if ((rc = unit_params(k, u, 1, &p, &lp)) < 0 || (rc = prefetch(k, u + 1)) < 0) return rc;
    if (u == 0 && s->tied) { /* only the gpt head reads another unit's parameters */
      e = p;
      elp = lp;
    }
    if (counted) zt_model_unit_forward_dt(m, a, u, p, lp, e, elp);
  }
  /* params nvme: the files of the backward's first two gathers (below the units the slots keep)
   * read during the last forwards and the loss */
  for (int v = s->nu - 1, n = 0; s->params_nvme && v >= 0 && n < 2; v--)
    if (walk_gathers(k, v)) {
      if ((rc = nvp_ahead(k, v)) < 0) return rc;
      n++;
    }
  if (counted)
    zt_model_loss(m, a, (float)((double)s->loss_scale / ((double)counted * W * G)));
  /* stages 2-3: a gradient buffer is zeroed once the reduction that last read it is done */
  if (stage >= 2 && s->tied) {
    if ((rc = q_wait(k, k->gembed_tick)) < 0) return rc;
    be->ops->zero(be->ctx, k->gembed, s->tab->chunk[0] * (size_t)W * sizeof(float));
  }
  k->dir = -1;
  k->take_up = s->nu - 1;
  for (int u = s->nu - 1; u >= 0; u--) {
    if ((rc = unit_params(k, u, 1, &p, &lp)) < 0 || (rc = prefetch(k, u - 1)) < 0) return rc;
    float *g = zt__dp_unit_grads(k, u);
    if (stage >= 2 && g != k->gembed) {
      if ((rc = q_wait(k, k->gunit_tick[u & 1])) < 0) return rc;
      be->ops->zero(be->ctx, g, s->tab->chunk[u] * (size_t)W * sizeof(float));
    }
    if (counted)
      zt_model_unit_backward_dt(m, a, u, p, lp, g, e, elp,
                                s->tied ? zt__dp_unit_grads(k, 0) : NULL);
    if ((rc = unit_grads_done(k, u, j)) < 0 ||
        (s->host_n && (rc = take_up_to(k, u + TAKE_UP_LAG + 1, j)) < 0))
      return rc;
  }
  if (counted) {
    double loss_sum = 0;
    int n_counted = 0;
    zt_acts_loss(a, &loss_sum, &n_counted);
    rec[X_MICRO + 2 * j] = loss_sum / n_counted;
    rec[X_MICRO + 2 * j + 1] = 1;
  }
  if ((rc = flush_add(k)) < 0) return rc;
  return s->host_n ? take_up_to(k, 0, j) : 0;
}

/* The step's scalars from every rank's record, added in rank and micro-batch order (the loss
 * then is the sum a single trainer makes), the OR of the flags, whether any gradient was not
 * finite and whether any rank updated units during the backward. */
static int exchange(dp_rank_state *k, double *rec, int *nonfinite, int *updated) {
  const dp_state *s = k->s;
  const zt_backend *be = &k->view.be;
  size_t R = s->rec, bytes = R * sizeof(double);
  be->ops->to_device(be->ctx, k->xchg + (size_t)k->r * R, rec, bytes);
  int rc = k->comm.ops->all_gather(k->comm.ctx, k->xchg + (size_t)k->r * R, k->xchg, bytes,
                                   k->stream);
  if (rc < 0) return zt__dp_comm_fail(k, rc, "exchanging the loss and the norm");
  be->ops->to_host(be->ctx, k->h_xchg, k->xchg, (size_t)s->dc.world * bytes);
  if ((rc = be->ops->sync(be->ctx)) < 0)
    return zt__dp_rank_fail(k, rc, "backend %s: %s", be->ops->name, be->ops->error_text(be->ctx));
  double sumsq = 0, loss = 0;
  int micros = 0;
  *nonfinite = *updated = 0;
  k->flags = 0;
  for (int r = 0; r < s->dc.world; r++) {
    const double *x = k->h_xchg + (size_t)r * R;
    sumsq += x[X_SUMSQ];
    *nonfinite |= x[X_NONFINITE] != 0;
    *updated |= x[X_UPDATED] != 0;
    k->flags |= (unsigned)x[X_FLAGS];
    for (int j = 0; j < k->view.tc.grad_accum; j++)
      if (x[X_MICRO + 2 * j + 1] != 0) {
        loss += x[X_MICRO + 2 * j];
        micros++;
      }
  }
  k->loss = micros ? loss / micros : 0.0;
  /* of the unscaled gradients: the fp16 loss scale is a power of two */
  k->norm = sqrt(sumsq) / s->loss_scale;
  return 0;
}

/* Host unit u's updated chunk to the device's parameters (unless params host: it is copied
 * before each gather), ordered before its all-gather on the stream. */
static void upload_unit(dp_rank_state *k, int u) {
  const dp_state *s = k->s;
  const zt_backend *be = &k->view.be;
  if (s->params_host) return;
  const zt_shard *sh = zt_shard_at(s->tab, u, k->r);
  size_t c = s->tab->chunk[u], at = host_at(s, sh), dev = zt__dp_param_at(k, sh);
  be->ops->to_device(be->ctx, k->params + dev, k->hm + at, c * sizeof(float));
  if (k->hlp)
    be->ops->to_device(be->ctx, zt__dp_lp_of(k, k->params_lp, dev), k->hlp + at,
                       c * zt_dtype_size(k->view.tc.precision));
}

/* Stages 1-2: every rank gets unit u's updated parameters back. A device unit's gather runs
 * on the queue after its update, and the next step's compute waits for it only where it reads
 * the unit (unit_params); a host unit's on the compute stream, after its upload. */
int zt__dp_gather_updated(dp_rank_state *k, int u) {
  const dp_state *s = k->s;
  const zt_shard *sh = zt_shard_at(s->tab, u, k->r);
  size_t at = s->tab->padded_unit[u], c = s->tab->chunk[u];
  int dev = !zt__dp_on_host(s, u), rc = dev ? q_begin(k) : 0;
  void *on = dev ? q_stream(k) : k->stream;
  if (rc < 0) return rc;
  rc = k->comm.ops->all_gather(k->comm.ctx, k->params + sh->padded_off, k->params + at,
                               c * sizeof(float), on);
  if (rc == 0 && k->params_lp)
    rc = k->comm.ops->all_gather(k->comm.ctx, zt__dp_lp_of(k, k->params_lp, sh->padded_off),
                                 zt__dp_lp_of(k, k->params_lp, at),
                                 c * zt_dtype_size(k->view.tc.precision), on);
  if (rc < 0) return zt__dp_comm_fail(k, rc, "gathering the updated parameters");
  k->gather_tick[u] = 0;
  if (dev && (k->gather_tick[u] = q_mark(k)) < 0) return (int)k->gather_tick[u];
  return 0;
}

static int step_body(dp_rank_state *k) {
  const dp_state *s = k->s;
  const zt_train_cfg *c = &k->view.tc;
  const zt_backend *be = &k->view.be;
  const zt_ops *o = be->ops;
  int stage = s->dc.zero_stage, rc;
  double *rec = k->h_xchg + (size_t)k->r * s->rec;
  memset(rec, 0, s->rec * sizeof *rec);
  rec[X_FLAGS] = s->flags; /* every rank of the part: an OR does not count them twice */
  /* the parameters changed since the last step */
  k->slot_unit[0] = k->slot_unit[1] = -1;
  k->chunk_unit[0] = k->chunk_unit[1] = -1;
  k->embed_gathered = 0;
  k->add_unit = -1;
  if (stage == 1) o->zero(be->ctx, k->grads, s->tab->padded_total * sizeof(float));
  k->updated = k->nonfinite = 0;
  if (s->host_n) memset(k->began, 0, (size_t)s->nu);
  for (int j = 0; j < c->grad_accum; j++)
    if ((rc = rank_micro(k, j, rec)) < 0) return rc;
  /* the reductions and gathers on the queue are done before the shards are read */
  if ((rc = q_wait_all(k)) < 0) return rc;
  /* the norm over this rank's real gradient elements, unit by unit wherever they are (a host
   * unit's summed when the backward took it up) */
  for (int u = 0; u < s->nu; u++) {
    const zt_shard *sh = zt_shard_at(s->tab, u, k->r);
    int nf = 0;
    if (!sh->count) continue;
    if (zt__dp_on_host(s, u))
      rec[X_SUMSQ] += k->usumsq[u];
    else
      rec[X_SUMSQ] += o->sum_squares(be->ctx, k->grads + grad_at(k, sh), sh->count, &nf);
    if (nf) rec[X_NONFINITE] = 1;
  }
  if (k->nonfinite) rec[X_NONFINITE] = 1;
  rec[X_UPDATED] = k->updated;
  /* optimizer nvme, the updates after the exchange: the first one's state read meanwhile */
  if (s->nvme && !k->began[s->nu - 1] && (rc = nv_read(k, s->nu - 1)) < 0) return rc;
  int nonfinite = 0, updated = 0;
  if ((rc = exchange(k, rec, &nonfinite, &updated)) < 0) return rc;
  k->skipped = 0;
  if (nonfinite) {
    for (int u = s->ng; u < s->nu; u++) wait_adam(k, u);
    /* fp16: GradScaler skips the update (every rank sees the overflow; none updated) */
    if (c->precision == ZT_F16) {
      k->skipped = 1;
      return 0;
    }
    /* every rank sees it; with no update anywhere nothing changed */
    if (!updated) return -ERANGE;
    return zt__dp_rank_fail(k, -EIO, "the gradient has inf or nan values, and the AdamW "
                            "overlapping the backward had updated units of a rank already (the "
                            "state is no step's): load a checkpoint");
  }
  float scale = 1.0f;
  if (c->grad_clip > 0) {
    double coef = c->grad_clip / (k->norm + 1e-6);
    if (coef < 1.0) scale = (float)coef;
  }
  /* AdamW sees g * scale / loss_scale: the unscaled, clipped gradient */
  if (c->precision == ZT_F16) scale = (float)((double)scale / s->loss_scale);
  /* the host units' updates the backward did not start (all of them with clipping), in its
   * order, on the pool while the device runs its own; the masters they write are no copy's
   * source any more */
  if (k->h2d_last && (rc = k->copy->ops->wait(k->copy, ZT_COPY_H2D, k->h2d_last)) < 0)
    return copy_fail(k, rc, "copying a parameter chunk to the device");
  for (int u = s->nu - 1; u >= s->ng; u--)
    if (!k->began[u] && (rc = update_host_unit(k, u, scale)) < 0) return rc;
  /* the device units' updates; stages 1-2: every rank gets every unit's updated parameters
   * back, each device unit's gathered on the queue while the next one's update runs, then each
   * host unit's once its AdamW is done, uploaded and gathered while the pool updates the next */
  for (int u = 0; u < s->ng; u++) {
    for (int i = k->first_seg[u]; i < k->first_seg[u + 1]; i++) {
      const adam_seg *g = &k->segs[i];
      const zt_shard *sh = zt_shard_at(s->tab, g->unit, k->r);
      size_t pa = zt__dp_param_at(k, sh) + g->off, sa = sh->packed_off + g->off;
      float wd = g->decay ? c->weight_decay : 0.0f;
      if (k->params_lp)
        o->adamw_dt(be->ctx, k->params + pa, k->grads + grad_at(k, sh) + g->off, k->m + sa,
                    k->v + sa, g->n, s->lr, c->beta1, c->beta2, c->eps, wd, s->adam_step,
                    scale, zt__dp_lp_of(k, k->params_lp, pa), c->precision);
      else
        o->adamw(be->ctx, k->params + pa, k->grads + grad_at(k, sh) + g->off, k->m + sa,
                 k->v + sa, g->n, s->lr, c->beta1, c->beta2, c->eps, wd, s->adam_step, scale);
    }
    if (stage < 3 && (rc = zt__dp_gather_updated(k, u)) < 0) break;
  }
  if (s->nvme) {
    /* the sets' chunks were uploaded as each set was retired: the last two now, then the
     * gathers ordered after the uploads */
    if (rc == 0) rc = nv_finish(k);
    if (rc == 0 && k->up_tick &&
        (rc = k->copy->ops->compute_wait(k->copy, ZT_COPY_H2D, k->up_tick)) < 0)
      rc = copy_fail(k, rc, "ordering a gather after its upload");
    for (int u = s->nu - 1; rc == 0 && stage < 3 && u >= s->nv0; u--)
      rc = zt__dp_gather_updated(k, u);
  }
  /* the host units' (all of them without NVMe), updated last */
  for (int u = s->nv0 - 1; u >= s->ng; u--) {
    wait_adam(k, u);
    if (rc < 0) continue; /* the others are still waited for */
    upload_unit(k, u);
    if (stage < 3) rc = zt__dp_gather_updated(k, u);
  }
  if (rc < 0) return rc;
  if ((rc = o->sync(be->ctx)) < 0)
    return zt__dp_rank_fail(k, rc, "backend %s: %s", o->name, o->error_text(be->ctx));
  return 0;
}

/* The step of rank k; whatever its result, no host AdamW is left running and (optimizer nvme)
 * every set is retired, so that the state calls and close find the host tier at rest. */
static int rank_step(dp_rank_state *k) {
  const dp_state *s = k->s;
  int rc = step_body(k);
  for (int u = s->ng; s->host_n && u < s->nu; u++) wait_adam(k, u);
  if (s->params_nvme) nvp_finish(k);
  if (s->nvme) {
    char keep[sizeof k->err];
    memcpy(keep, k->err, sizeof keep);
    int r = nv_finish(k);
    if (rc < 0)
      memcpy(k->err, keep, sizeof keep);
    else
      rc = r;
  }
  return rc;
}

/* ---- the rank threads ---------------------------------------------------------------------- */

static int rank_run(dp_rank_state *k, dp_cmd cmd) {
  /* a step leaves the gathers of the updated parameters on the queue for the next step's
   * forward; every other command reads or writes the state, or frees it, after them */
  if (cmd != CMD_OPEN && cmd != CMD_STEP) {
    int rc = k->comm.ops->queue_sync(k->comm.ctx);
    if (rc < 0 && cmd != CMD_CLOSE)
      return zt__dp_comm_fail(k, rc, "finishing the step's collectives");
  }
  switch (cmd) {
  case CMD_OPEN: return rank_open(k);
  case CMD_STEP: {
    /* a rank that fails alone must not leave the others waiting in a collective; -ERANGE is
     * every rank's verdict on the same exchanged norm */
    int rc = rank_step(k);
    if (rc < 0 && rc != -ERANGE) k->comm.ops->abort(k->comm.ctx);
    return rc;
  }
  case CMD_READ: return zt__dp_rank_read(k);
  case CMD_WRITE: return zt__dp_rank_write(k);
  case CMD_SHARDS_OUT: return zt__dp_rank_shards_out(k);
  case CMD_SHARDS_IN: return zt__dp_rank_shards_in(k);
  case CMD_SHARDS_GATHER: {
    /* a collective: as a step's, a rank that fails releases the others */
    int rc = zt__dp_rank_shards_gather(k);
    if (rc < 0) k->comm.ops->abort(k->comm.ctx);
    return rc;
  }
  case CMD_STATE: {
    /* as a step's: a rank that fails mid-call releases the others; a call rank 0 gave up
     * before it began is no failure of the collectives */
    int rc = zt__dp_rank_state(k);
    if (rc < 0 && !k->abandoned) k->comm.ops->abort(k->comm.ctx);
    return rc;
  }
  case CMD_CLOSE: rank_close(k); return 0;
  }
  return -EINVAL;
}

static void *rank_main(void *arg) {
  dp_rank_state *k = arg;
  dp_state *s = k->s;
  uint64_t seen = 0;
  /* a cuda rank's device, current for every command this thread runs */
  int bound = zt_backend_bind_thread(&k->view.be);
  for (;;) {
    pthread_mutex_lock(&s->mu);
    while (s->gen == seen) pthread_cond_wait(&s->cmd_cv, &s->mu);
    seen = s->gen;
    dp_cmd cmd = s->cmd;
    pthread_mutex_unlock(&s->mu);
    k->err[0] = 0;
    k->rc = bound < 0 && cmd != CMD_CLOSE ? bound : rank_run(k, cmd);
    if (bound < 0 && cmd != CMD_CLOSE)
      snprintf(k->err, sizeof k->err, "rank %d: making its device current failed", k->r);
    pthread_mutex_lock(&s->mu);
    if (++s->done == s->n_threads) pthread_cond_signal(&s->done_cv);
    pthread_mutex_unlock(&s->mu);
    if (cmd == CMD_CLOSE) return NULL;
  }
}

static int failure_rank(int rc) {
  return rc >= 0 ? 0 : rc == -ERANGE ? 1 : rc == -ECANCELED ? 2 : 3;
}

/* Runs cmd on every rank and waits for all of them. Returns a failed rank (-1: none): one whose
 * failure is its own before one cancelled by another's, before a non-finite gradient. */
int zt__dp_dispatch(dp_state *s, dp_cmd cmd) {
  pthread_mutex_lock(&s->mu);
  s->cmd = cmd;
  s->done = 0;
  s->gen++;
  pthread_cond_broadcast(&s->cmd_cv);
  while (s->done < s->n_threads) pthread_cond_wait(&s->done_cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  int bad = -1;
  for (int r = 0; r < s->n_threads; r++)
    if (failure_rank(s->ranks[r].rc) > (bad < 0 ? 0 : failure_rank(s->ranks[bad].rc))) bad = r;
  return bad;
}

/* ---- the path ------------------------------------------------------------------------------ */

int zt__dp_refuse_broken(const char *what, char *err, size_t errlen) {
  snprintf(err, errlen, "%s: an earlier step or state call failed on a rank and aborted the "
           "communicators; close the trainer and open a new one (a checkpoint restores the "
           "state)", what);
  return -EIO;
}

/* cmd on every rank here; 0, or the failed rank's code and message */
int zt__dp_run_cmd(dp_state *s, dp_cmd cmd, char *err, size_t errlen) {
  int bad = zt__dp_dispatch(s, cmd);
  if (bad < 0) return 0;
  snprintf(err, errlen, "%s", s->ranks[bad].err);
  return s->ranks[bad].rc;
}

static int dp_step(zt_trainer *t, const int32_t *tokens, zt_step_result *res, char *err,
                   size_t errlen) {
  dp_state *s = t->path_state;
  int step = t->step + 1, W = s->dc.world;
  if (s->broken) {
    char what[32];
    snprintf(what, sizeof what, "step %d", step);
    return zt__dp_refuse_broken(what, err, errlen);
  }
  /* the whole step's W * G micro-batches, checked before any rank starts */
  zt_trainer whole = *t;
  whole.tc.grad_accum = W * t->tc.grad_accum;
  int rc = zt__trainer_check_tokens(&whole, tokens, err, errlen);
  if (rc < 0) return rc;
  int fp16 = t->tc.precision == ZT_F16;
  s->tokens = tokens;
  s->lr = zt_train_lr(&t->tc, step);
  s->adam_step = t->adam_step + 1;
  s->loss_scale = fp16 ? t->scaler.scale : 1.0f;
  int bad = zt__dp_dispatch(s, CMD_STEP);
  s->flags = 0;
  const dp_rank_state *k0 = &s->ranks[0];
  zt_step_result r = {.step = step, .loss = k0->loss, .grad_norm = k0->norm, .lr = s->lr,
                      .tokens = (int64_t)t->tc.micro_batch * zt_model_cfg_of(t->model)->seq_len *
                                W * t->tc.grad_accum,
                      .skipped = 0, .loss_scale = 1.0f, .flags = k0->flags};
  if (bad >= 0 && s->ranks[bad].rc == -ERANGE) {
    /* every rank found it in the exchange and none updated anything; the flags were
     * exchanged with it, and every part must see them */
    snprintf(err, errlen, "step %d: the gradient has inf or nan values (loss %g); parameters "
             "left unchanged", step, k0->loss);
    if (res) {
      *res = r;
      res->skipped = 1;
    }
    return -ERANGE;
  }
  if (bad >= 0) {
    s->broken = 1;
    snprintf(err, errlen, "step %d: %s", step, s->ranks[bad].err);
    return s->ranks[bad].rc;
  }
  /* fp16: every rank saw the same overflow verdict, so the scalers agree; a skipped step
   * counts, AdamW's does not */
  if (fp16) zt_loss_scaler_update(&t->scaler, k0->skipped);
  t->step = step;
  if (!k0->skipped) t->adam_step = s->adam_step;
  r.skipped = k0->skipped;
  r.loss_scale = fp16 ? t->scaler.scale : 1.0f;
  if (res) *res = r;
  return 0;
}

static size_t dp_backend_bytes(const zt_trainer *t) {
  const dp_state *s = t->path_state;
  size_t b = 0;
  for (int i = 0; i < s->nl; i++) b += s->ranks[i].bytes;
  return b;
}

static void dp_close(zt_trainer *t) {
  dp_state *s = t->path_state;
  if (!s) return;
  if (s->n_threads) {
    zt__dp_dispatch(s, CMD_CLOSE);
    for (int r = 0; r < s->n_threads; r++) pthread_join(s->ranks[r].thread, NULL);
  }
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cmd_cv);
  pthread_cond_destroy(&s->done_cv);
  zt_cpu_pool_close(s->pool);
  zt_shard_table_free(s->tab);
  /* the ranks' directories and files went with their stores */
  if (s->nvme_dir[0]) rmdir(s->nvme_dir);
  free(s->ranks);
  free(s);
  t->path_state = NULL;
}

const zt__train_path zt__dp_path = {
    .step = dp_step,
    .read_state = zt__dp_read_state,
    .write_state = zt__dp_write_state,
    .abandon_state = zt__dp_abandon_state,
    .shards = zt__dp_shards,
    .save_shards = zt__dp_save_shards,
    .load_shards = zt__dp_load_shards,
    .probe = zt__dp_probe,
    .backend_bytes = dp_backend_bytes,
    .close = dp_close,
};

size_t zt_trainer_dp_rank_bytes(const zt_trainer *t, int rank) {
  if (t->path != &zt__dp_path) return 0;
  const dp_state *s = t->path_state;
  int i = rank - s->dc.rank0;
  return i >= 0 && i < s->nl ? s->ranks[i].bytes : 0;
}

size_t zt_trainer_dp_host_bytes(const zt_trainer *t, int rank) {
  if (t->path != &zt__dp_path) return 0;
  const dp_state *s = t->path_state;
  int i = rank - s->dc.rank0;
  if (i < 0 || i >= s->nl || !s->ranks[i].host) return 0;
  zt_host_arena_stats st;
  zt_host_arena_get_stats(s->ranks[i].host, &st);
  return st.used;
}

static const dp_rank_state *rank_here(const zt_trainer *t, int rank) {
  if (t->path != &zt__dp_path) return NULL;
  const dp_state *s = t->path_state;
  int i = rank - s->dc.rank0;
  return i >= 0 && i < s->nl ? &s->ranks[i] : NULL;
}

uint64_t zt_trainer_dp_nvme_bytes(const zt_trainer *t, int rank) {
  const dp_rank_state *k = rank_here(t, rank);
  return k ? k->nvme_bytes : 0;
}

int zt_trainer_dp_nvme_stats(const zt_trainer *t, int rank, zt_nvme_stats *out) {
  const dp_rank_state *k = rank_here(t, rank);
  if (!k || !k->store) return -ENOENT;
  zt_nvme_store_get_stats(k->store, out);
  return 0;
}

void zt_trainer_dp_set_flags(zt_trainer *t, unsigned flags) {
  if (t->path == &zt__dp_path) ((dp_state *)t->path_state)->flags = flags;
}

/* ---- open ---------------------------------------------------------------------------------- */

int zt_dp_cfg_check(const zt_dp_cfg *c, char *err, size_t errlen) {
  if (c->world < 1 || c->world > ZT_DP_MAX_WORLD) {
    snprintf(err, errlen, "dp.world must be in [1, %d] (got %d)", ZT_DP_MAX_WORLD, c->world);
    return -EINVAL;
  }
  if (c->zero_stage < 1 || c->zero_stage > 3) {
    snprintf(err, errlen, "dp.zero_stage must be 1, 2 or 3 (got %d)", c->zero_stage);
    return -EINVAL;
  }
  if (c->rank0 < 0 || c->rank0 >= c->world) {
    snprintf(err, errlen, "dp.rank0 must be in [0, %d] (dp.world %d) (got %d)", c->world - 1,
             c->world, c->rank0);
    return -EINVAL;
  }
  if (c->local == 0 && c->rank0 != 0) {
    snprintf(err, errlen, "dp.rank0 must be 0 when dp.local is 0 (all ranks) (got %d)",
             c->rank0);
    return -EINVAL;
  }
  if (c->local < 0 || c->local > c->world - c->rank0) {
    snprintf(err, errlen, "dp.local must be in [0, %d] (dp.world %d - dp.rank0 %d) (got %d)",
             c->world - c->rank0, c->world, c->rank0, c->local);
    return -EINVAL;
  }
  const struct {
    const char *field;
    zt_offload_place v;
  } places[] = {{"optimizer", c->optimizer}, {"params", c->params}};
  for (int i = 0; i < 2; i++)
    if (places[i].v < ZT_PLACE_AUTO || places[i].v > ZT_PLACE_NVME) {
      snprintf(err, errlen, "dp.%s must be auto, gpu, host or nvme", places[i].field);
      return -EINVAL;
    }
  int off = c->optimizer == ZT_PLACE_HOST || c->optimizer == ZT_PLACE_NVME;
  if (c->params == ZT_PLACE_HOST && (c->zero_stage != 3 || !off)) {
    snprintf(err, errlen, "dp.params: host needs zero_stage 3 (stages 1-2 keep every unit's "
             "parameters on every device) and optimizer host or nvme (the masters the chunks "
             "are copied from) (got zero_stage %d, optimizer %s)", c->zero_stage,
             zt_offload_place_name(c->optimizer));
    return -EINVAL;
  }
  if (c->params == ZT_PLACE_NVME && (c->zero_stage != 3 || c->optimizer != ZT_PLACE_NVME)) {
    snprintf(err, errlen, "dp.params: nvme needs zero_stage 3 (stages 1-2 keep every unit's "
             "parameters on every device) and optimizer nvme (the master files the chunks are "
             "read from) (got zero_stage %d, optimizer %s)", c->zero_stage,
             zt_offload_place_name(c->optimizer));
    return -EINVAL;
  }
  if (off && c->gpu_units < 0) {
    snprintf(err, errlen, "dp.gpu_units must be >= 0 with optimizer %s (got %d)",
             zt_offload_place_name(c->optimizer), c->gpu_units);
    return -EINVAL;
  }
  if (c->host_units < 0 || (c->host_units && c->optimizer != ZT_PLACE_NVME)) {
    snprintf(err, errlen, "dp.host_units splits the host units' optimizer between the host and "
             "NVMe: it must be >= 0, and 0 unless optimizer is nvme (got %d with optimizer %s)",
             c->host_units, zt_offload_place_name(c->optimizer));
    return -EINVAL;
  }
  if (c->optimizer == ZT_PLACE_NVME && (!c->nvme_dir || !c->nvme_dir[0])) {
    snprintf(err, errlen, "dp.nvme_dir is required with optimizer nvme");
    return -EINVAL;
  }
  if (c->optimizer == ZT_PLACE_NVME && strlen(c->nvme_dir) + 20 >= ZT_PATH_MAX) {
    snprintf(err, errlen, "dp.nvme_dir is longer than %d bytes", ZT_PATH_MAX - 21);
    return -ENAMETOOLONG;
  }
  return 0;
}

/* fp16: every rank scales the loss by the trainer's scaler and skips the same overflowed steps,
 * so the scale needs no exchange; but a part's scaler is not carried by the state calls. */
static int fp16_supported(const zt_train_cfg *tc, const zt_dp_cfg *c, char *err, size_t errlen) {
  if (tc->precision != ZT_F16) return 0;
  if (c->local && c->local < c->world) {
    snprintf(err, errlen, "train.precision: fp16 with a part of the world (dp.local %d of "
             "dp.world %d: a job spanning daemons) is not supported yet (a resumed part would "
             "not have the loss scale); use bf16 or fp32", c->local, c->world);
    return -ENOTSUP;
  }
  return 0;
}

/* The units on the device and the two tiers' sizes, from the table. */
static int place_units(dp_state *s, char *err, size_t errlen) {
  s->ng = s->nu;
  if (s->dc.optimizer == ZT_PLACE_HOST || s->dc.optimizer == ZT_PLACE_NVME) {
    if (s->dc.gpu_units > s->nu) {
      snprintf(err, errlen, "dp.gpu_units must be in [0, %d] (the model's units) (got %d)",
               s->nu, s->dc.gpu_units);
      return -EINVAL;
    }
    s->ng = s->dc.gpu_units;
  }
  if (s->dc.host_units > s->nu - s->ng) {
    snprintf(err, errlen, "dp.host_units must be in [0, %d] (the units after dp.gpu_units %d "
             "of the model's %d) (got %d)", s->nu - s->ng, s->ng, s->nu, s->dc.host_units);
    return -EINVAL;
  }
  s->params_host =
      (s->dc.params == ZT_PLACE_HOST || s->dc.params == ZT_PLACE_NVME) && s->ng < s->nu;
  s->dev_packed = s->ng < s->nu ? zt_shard_at(s->tab, s->ng, 0)->packed_off
                                : s->tab->packed_total;
  s->host_n = s->tab->packed_total - s->dev_packed;
  s->nv0 = s->dc.optimizer == ZT_PLACE_NVME ? s->ng + s->dc.host_units : s->nu;
  s->nvme = s->nv0 < s->nu;
  /* without NVMe units (host_units all the rest) params nvme is params host */
  s->params_nvme = s->dc.params == ZT_PLACE_NVME && s->nvme;
  s->hopt_n = (s->nvme ? zt_shard_at(s->tab, s->nv0, 0)->packed_off : s->tab->packed_total) -
              s->dev_packed;
  for (int u = s->nv0; u < s->nu; u++)
    if (s->tab->chunk[u] > s->nv_chunk) s->nv_chunk = s->tab->chunk[u];
  return 0;
}

/* ranks[i] is global rank rank0 + i, each with a backend context of its own. */
static int check_ranks(const zt_dp_cfg *dc, int nl, const zt_dp_rank *ranks, char *err,
                       size_t errlen) {
  for (int i = 0; i < nl; i++) {
    const zt_dp_rank *k = &ranks[i];
    int r = dc->rank0 + i;
    if (!k->be.ops || !k->comm.ops) {
      snprintf(err, errlen, "dp.ranks[%d]: no %s", i, k->be.ops ? "communicator" : "backend");
      return -EINVAL;
    }
    int cr = k->comm.ops->rank(k->comm.ctx), cw = k->comm.ops->world(k->comm.ctx);
    if (cr != r || cw != dc->world) {
      snprintf(err, errlen, "dp.ranks[%d]: its communicator is rank %d of %d, not rank %d "
               "(dp.rank0 %d + %d) of dp.world %d", i, cr, cw, r, dc->rank0, i, dc->world);
      return -EINVAL;
    }
    for (int q = 0; q < i; q++)
      if (ranks[q].be.ctx == k->be.ctx) {
        snprintf(err, errlen, "dp.ranks[%d]: shares its backend context with dp.ranks[%d] "
                 "(each rank needs its own)", i, q);
        return -EINVAL;
      }
  }
  return 0;
}

/* The shard table (the checkpoint estimate builds the same: zt__trainer_shard_table) and the
 * size of a slot. */
static int build_table(zt_trainer *t, dp_state *s) {
  int rc = zt__trainer_shard_table(t->model, s->dc.world, &s->tab);
  if (rc < 0) return rc;
  /* the units a slot or the unit gradient buffer holds: all but a tied embedding */
  for (int u = s->tied; u < s->nu; u++) {
    size_t f = s->tab->chunk[u] * (size_t)s->dc.world;
    if (f > s->slot_floats) s->slot_floats = f;
  }
  return 0;
}

/* What a rank holds: with ops its device bytes (zt_dp_estimate_rank_bytes); without, its host
 * tier or (nvme) its files. */
static uint64_t estimate(const zt_model_cfg *mc, const zt_train_cfg *tc, const zt_dp_cfg *dpc,
                         const zt_ops *ops, int nvme) {
  char err[256];
  uint64_t bytes = UINT64_MAX;
  zt_trainer t = {0};
  dp_state s = {.dc = *dpc};
  if (zt_train_cfg_check(tc, err, sizeof err) < 0 ||
      zt_dp_cfg_check(dpc, err, sizeof err) < 0 || fp16_supported(tc, dpc, err, sizeof err) < 0 ||
      zt_model_create(&t.model, mc, err, sizeof err) < 0)
    return SIZE_MAX;
  s.nu = zt_model_num_units(t.model);
  s.tied = zt_model_head_reads_embed(t.model);
  s.rec = X_MICRO + 2 * (size_t)tc->grad_accum;
  if (build_table(&t, &s) == 0 && place_units(&s, err, sizeof err) == 0) {
    if (nvme) {
      bytes = nvme_file_bytes(&s);
    } else if (!ops) {
      bytes = host_tier_bytes(&s, tc);
    } else {
      size_t acts = zt_acts_size_dt(t.model, ops, tc->micro_batch, tc->ckpt_every,
                                    tc->precision);
      if (acts) bytes = acts + rank_buffer_bytes(&s, tc);
    }
  }
  zt_shard_table_free(s.tab);
  zt_model_destroy(t.model);
  return bytes;
}

size_t zt_dp_estimate_rank_bytes(const zt_model_cfg *mc, const zt_train_cfg *tc,
                                 const zt_dp_cfg *dpc, const zt_ops *ops) {
  uint64_t b = ops ? estimate(mc, tc, dpc, ops, 0) : UINT64_MAX;
  return b > SIZE_MAX ? SIZE_MAX : (size_t)b;
}

size_t zt_dp_estimate_host_bytes(const zt_model_cfg *mc, const zt_train_cfg *tc,
                                 const zt_dp_cfg *dpc) {
  uint64_t b = estimate(mc, tc, dpc, NULL, 0);
  return b > SIZE_MAX ? SIZE_MAX : (size_t)b;
}

uint64_t zt_dp_estimate_nvme_bytes(const zt_model_cfg *mc, const zt_train_cfg *tc,
                                   const zt_dp_cfg *dpc) {
  return estimate(mc, tc, dpc, NULL, 1);
}

int zt_trainer_open_dp(zt_trainer **out, const zt_model_cfg *mc, const zt_train_cfg *tc,
                       const zt_dp_cfg *dpc, const zt_dp_rank *ranks, char *err,
                       size_t errlen) {
  int rc;
  float *init = NULL;
  zt__trainer_init in = {0};
  *out = NULL;
  if ((rc = zt_train_cfg_check(tc, err, errlen)) < 0 ||
      (rc = zt_dp_cfg_check(dpc, err, errlen)) < 0 ||
      (rc = check_ranks(dpc, dpc->local ? dpc->local : dpc->world, ranks, err, errlen)) < 0)
    return rc;
  if ((rc = fp16_supported(tc, dpc, err, errlen)) < 0) return rc;
  zt_trainer *t = calloc(1, sizeof *t);
  dp_state *s = calloc(1, sizeof *s);
  if (!t || !s) {
    free(t);
    free(s);
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  t->tc = *tc;
  t->be = ranks[0].be; /* what checkpoint.c synchronises; the state is reached through the path */
  t->path = &zt__dp_path;
  t->path_state = s;
  zt_loss_scaler_init(&t->scaler);
  s->dc = *dpc;
  s->nl = dpc->local ? dpc->local : dpc->world;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cmd_cv, NULL);
  pthread_cond_init(&s->done_cv, NULL);
  if ((rc = zt_model_create(&t->model, mc, err, errlen)) < 0) goto out;
  s->nu = zt_model_num_units(t->model);
  s->tied = zt_model_head_reads_embed(t->model);
  s->rec = X_MICRO + 2 * (size_t)tc->grad_accum;
  s->ranks = calloc((size_t)s->nl, sizeof *s->ranks);
  /* the initial parameters a piece of units at a time (as offload_step.c's
   * write_initial_state), not a flat copy of the model */
  size_t cap = zt__trainer_piece_cap(t->model);
  init = malloc(cap * sizeof *init);
  if (!s->ranks || !init || (rc = build_table(t, s)) < 0) {
    rc = rc < 0 ? rc : -ENOMEM;
    snprintf(err, errlen, rc == -EOVERFLOW ? "the model is too large to shard" : "out of memory");
    goto out;
  }
  if ((rc = place_units(s, err, errlen)) < 0) goto out;
  if (s->nvme) {
    /* a directory of its own, so that trainers can share nvme_dir; the ranks' inside it */
    snprintf(s->nvme_dir, sizeof s->nvme_dir, "%s/zt-offload.XXXXXX", dpc->nvme_dir);
    if (!mkdtemp(s->nvme_dir)) {
      rc = -errno;
      s->nvme_dir[0] = 0;
      snprintf(err, errlen, "offload.nvme_dir: %s: %s", dpc->nvme_dir, strerror(-rc));
      goto out;
    }
  }
  if (s->host_n) {
    /* beside GPUs the host's main work: a thread per core, pinned; on the cpu backend one
     * beside the ranks' own threads */
    int on_gpu = strcmp(ranks[0].be.ops->name, "cuda") == 0;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if ((rc = zt_cpu_pool_open(&s->pool, on_gpu && cores > 0 ? (int)cores : 1, on_gpu)) < 0) {
      snprintf(err, errlen, "starting the AdamW pool failed: %s", strerror(-rc));
      goto out;
    }
  }
  for (int i = 0; i < s->nl; i++) {
    dp_rank_state *k = &s->ranks[i];
    k->s = s;
    k->r = dpc->rank0 + i;
    k->comm = ranks[i].comm;
    k->stream = zt_backend_stream(&ranks[i].be);
    k->view.model = t->model;
    k->view.tc = *tc;
    k->view.be = ranks[i].be;
    if ((rc = -pthread_create(&k->thread, NULL, rank_main, k)) < 0) {
      snprintf(err, errlen, "starting the thread of rank %d: %s", k->r, strerror(-rc));
      goto out;
    }
    s->n_threads++;
  }
  int bad = zt__dp_dispatch(s, CMD_OPEN);
  if (bad >= 0) {
    rc = s->ranks[bad].rc;
    snprintf(err, errlen, "%s", s->ranks[bad].err);
    goto out;
  }
  /* every part computes the same init and writes its own ranks' share of it: no collective */
  if ((rc = zt__trainer_init_open(&in, t->model, err, errlen)) < 0) goto out;
  s->in[0] = init;
  s->in[1] = s->in[2] = NULL; /* the moments start as the zeros rank_open allocated */
  for (int u0 = 0, u1; u0 < s->nu; u0 = u1) {
    u1 = zt__trainer_piece_end(t->model, u0, cap);
    s->u0 = u0;
    s->u1 = u1;
    if ((rc = zt__trainer_init_read(&in, u0, u1, init, err, errlen)) < 0 ||
        (rc = zt__dp_run_cmd(s, CMD_WRITE, err, errlen)) < 0)
      goto out;
  }
  *out = t;
  t = NULL;
out:
  zt__trainer_init_close(&in);
  free(init);
  zt_trainer_close(t);
  return rc;
}
