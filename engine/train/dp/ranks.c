/* The data-parallel trainer's world and ranks (engine/train/dp/dp.h): the configuration's
 * checks, the shard table and the units' placement, each rank's buffers (the device's, the host
 * tier, the NVMe files) opened and closed on its thread, the estimates of those bytes, the open
 * and the close, the path table and the per-rank accessors. */
#include "engine/train/dp/dp.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/kernels/backend.h"
#include "engine/train/dp/internal.h"
#include "engine/train/trainer_internal.h"
#include "offload/copy_engine.h"
#include "offload/cpu_adam.h"
#include "offload/cpu_pool.h"
#include "offload/host_arena.h"
#include "offload/nvme_store.h"
#include "offload/shard.h"

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

static int rank_close(dp_rank_state *k) {
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
  return 0;
}

const zt__dp_cmd zt__dp_cmd_open = {.run = rank_open};
const zt__dp_cmd zt__dp_cmd_close = {.run = rank_close, .after_queue = 1, .last = 1};

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
    zt__dp_dispatch(s, &zt__dp_cmd_close);
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
    .step = zt__dp_step,
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
  s.tied = mc->arch == ZT_ARCH_GPT;
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
  s->tied = mc->arch == ZT_ARCH_GPT;
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
    if ((rc = -pthread_create(&k->thread, NULL, zt__dp_rank_main, k)) < 0) {
      snprintf(err, errlen, "starting the thread of rank %d: %s", k->r, strerror(-rc));
      goto out;
    }
    s->n_threads++;
  }
  int bad = zt__dp_dispatch(s, &zt__dp_cmd_open);
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
        (rc = zt__dp_run_cmd(s, &zt__dp_cmd_write, err, errlen)) < 0)
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
