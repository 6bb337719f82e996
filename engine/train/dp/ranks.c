/* The data-parallel trainer's world and ranks (engine/train/dp/dp.h): the configuration's
 * checks, each rank's buffers (the device's, the host tier, the NVMe files) opened as the plan
 * lists them (engine/plan/dp_plan.h: the shard table, the units' placement, every buffer's
 * bytes) and closed, on its thread, the estimates, the open and the close, the path table and
 * the per-rank accessors. */
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
#include "offload/cpu_pool.h"
#include "offload/host_arena.h"
#include "offload/nvme_store.h"
#include "offload/opt_store.h"
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
static int build_runs(dp_rank_state *k) {
  const dp_state *s = k->s;
  const zt_model *m = k->view.model;
  int nt = zt_model_num_tensors(m), n = 0, next = 0; /* next: the first unit without first_run */
  k->runs = calloc((size_t)nt, sizeof *k->runs);
  k->first_run = calloc((size_t)s->plan.nu + 1, sizeof *k->first_run);
  if (!k->runs || !k->first_run) return -ENOMEM;
  for (int i = 0; i < nt; i++) {
    const zt_tensor_info *ti = zt_model_tensor(m, i);
    const zt_shard *sh = zt_shard_at(s->plan.tab, ti->unit, k->r);
    size_t t0 = ti->offset - zt_model_unit(m, ti->unit)->offset, t1 = t0 + ti->numel;
    size_t lo = t0 > sh->unit_off ? t0 : sh->unit_off;
    size_t hi = t1 < sh->unit_off + sh->count ? t1 : sh->unit_off + sh->count;
    if (lo >= hi) continue;
    /* the tensors follow the units: the last run is this unit's when next is past it */
    zt_opt_run *prev = n && next == ti->unit + 1 ? &k->runs[n - 1] : NULL;
    if (prev && prev->decay == ti->decay && prev->offset + prev->n == lo - sh->unit_off) {
      prev->n += hi - lo;
      continue;
    }
    while (next <= ti->unit) k->first_run[next++] = n;
    k->runs[n++] = (zt_opt_run){.offset = lo - sh->unit_off, .n = hi - lo, .decay = ti->decay};
  }
  while (next <= s->plan.nu) k->first_run[next++] = n;
  return 0;
}

static int host_fail(dp_rank_state *k, int rc) {
  return zt__dp_rank_fail(k, rc, "host tier: %s", zt_host_arena_error(k->host));
}

/* optimizer nvme: the rank's directory rank-R under the trainer's and its zt_nvme_store (opened
 * on the rank's thread, which alone uses it), where the optimizer-state store makes its files. */
static int nv_open(dp_rank_state *k) {
  const dp_state *s = k->s;
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
  if ((rc = zt_nvme_store_open(&k->store, k->nvdir, NULL, why, sizeof why)) < 0)
    return zt__dp_rank_fail(k, rc, "offload.nvme_dir: %s", why);
  return 0;
}

/* The host units' optimizer-state store over the rank's chunks (floats) and runs, with
 * optimizer nvme a file per NVMe unit and kind, reserved in full (the plan's NVMe bytes). */
static int opt_open(dp_rank_state *k) {
  const dp_state *s = k->s;
  const zt_model *m = k->view.model;
  const char **names = malloc((size_t)s->plan.nu * sizeof *names);
  char why[400];
  int rc;
  if (!names) return zt__dp_rank_fail(k, -ENOMEM, "out of host memory");
  for (int u = 0; u < s->plan.nu; u++) names[u] = zt_model_unit(m, u)->name;
  zt_opt_store_cfg c = {.n_units = s->plan.nu, .floats = s->plan.tab->chunk, .runs = k->runs,
                        .first_run = k->first_run, .dt = k->view.tc.precision, .pool = s->pool,
                        .nvme = k->store, .nvme_first = s->plan.nv0, .names = names,
                        .sets = {k->sets[0], k->sets[1]}, .updated = zt__dp_nv_updated,
                        .written = zt__dp_nv_written, .ctx = k};
  rc = zt_opt_store_open(&k->opt, &c, why, sizeof why);
  free(names);
  if (rc == -ENOMEM) return zt__dp_rank_fail(k, rc, "out of host memory");
  if (rc < 0) return zt__dp_rank_fail(k, rc, "offload.nvme_dir: %s", why);
  for (int u = s->plan.nv0; k->store && u < s->plan.nu; u++)
    k->nvme_bytes += zt_opt_store_file_bytes(s->plan.tab->chunk[u], ZT_F32);
  return 0;
}

/* The host tier of rank k, its copy engine and its math, on the rank's thread (a cuda rank's
 * pages are registered with its device). */
static int host_open(dp_rank_state *k) {
  const dp_state *s = k->s;
  const zt_backend *be = &k->view.be;
  const zt_dp_host_bufs *h = &s->plan.host;
  int on_gpu = strcmp(be->ops->name, "cuda") == 0, rc;
  if ((rc = zt_host_arena_open(&k->host, zt_dp_plan_host_bytes(&s->plan),
                               on_gpu ? zt_host_mem_cuda() : NULL)) < 0)
    return zt__dp_rank_fail(k, rc, "opening the host tier failed: %s", strerror(-rc));
  float **bufs[5] = {&k->hgrad, &k->hstage, &k->hm, &k->hmom, &k->hvar};
  size_t len[5] = {h->grads, h->stage, h->masters, h->moments, h->moments};
  for (int i = 0; i < 5; i++) {
    if (!len[i]) continue;
    if ((rc = zt_host_arena_alloc(k->host, len[i], (void **)bufs[i])) < 0)
      return host_fail(k, rc);
    memset(*bufs[i], 0, len[i]);
  }
  if (h->lp && (rc = zt_host_arena_alloc(k->host, h->lp, (void **)&k->hlp)) < 0)
    return host_fail(k, rc);
  /* page-aligned and pinned: O_DIRECT reads and writes, and the uploads, straight from them */
  for (int i = 0; s->plan.nvme && i < 2; i++) {
    zt_opt_set *x = &k->sets[i];
    for (int j = 0; j < ZT_OPT_KINDS; j++) {
      if ((rc = zt_host_arena_alloc(k->host, h->set, (void **)&x->buf[j])) < 0)
        return host_fail(k, rc);
      memset(x->buf[j], 0, h->set);
    }
    if (h->set_lp && (rc = zt_host_arena_alloc(k->host, h->set_lp, (void **)&x->lp)) < 0)
      return host_fail(k, rc);
  }
  for (int i = 0; i < 2; i++) {
    k->pstage_unit[i] = k->pstage_req[i] = -1;
    if (h->pstage && (rc = zt_host_arena_alloc(k->host, h->pstage, (void **)&k->pstage[i])) < 0)
      return host_fail(k, rc);
  }
  if ((s->plan.nvme && (rc = nv_open(k)) < 0) || (rc = opt_open(k)) < 0) return rc;
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
  k->unit_tick = calloc((size_t)s->plan.nu, sizeof *k->unit_tick);
  k->usumsq = calloc((size_t)s->plan.nu, sizeof *k->usumsq);
  k->began = calloc((size_t)s->plan.nu, 1);
  if (!k->unit_tick || !k->usumsq || !k->began)
    return zt__dp_rank_fail(k, -ENOMEM, "out of host memory");
  k->chunk_unit[0] = k->chunk_unit[1] = -1;
  return 0;
}

static int rank_open(dp_rank_state *k) {
  dp_state *s = k->s;
  const zt_train_cfg *tc = &k->view.tc;
  const zt_backend *be = &k->view.be;
  const zt_model_cfg *mc = zt_model_cfg_of(k->view.model);
  const zt_dp_dev_bufs *b = &s->plan.dev;
  size_t N = (size_t)tc->micro_batch * (size_t)mc->seq_len;
  int rc = be->ops->set_allow_tf32(be->ctx, tc->tf32);
  if (rc < 0)
    return zt__dp_rank_fail(k, rc, "train.tf32: the %s backend cannot set this matmul mode",
                            be->ops->name);
  char why[200];
  rc = zt_acts_open_dt(&k->view.acts, k->view.model, be, tc->micro_batch, tc->ckpt_every,
                       tc->precision, why, sizeof why);
  if (rc < 0) return zt__dp_rank_fail(k, rc, "%s", why);
  k->bytes += zt_acts_bytes(k->view.acts);
  k->red_last = s->plan.um_back ? 0 : tc->grad_accum - 1;
  if (s->plan.unit_major) {
    if (!(k->macts = calloc((size_t)tc->grad_accum, sizeof *k->macts)))
      return zt__dp_rank_fail(k, -ENOMEM, "out of host memory");
    k->macts[0] = k->view.acts;
    for (int j = 1; j < tc->grad_accum; j++) {
      rc = zt_acts_open_dt(&k->macts[j], k->view.model, be, tc->micro_batch, tc->ckpt_every,
                           tc->precision, why, sizeof why);
      if (rc < 0) return zt__dp_rank_fail(k, rc, "%s", why);
      k->bytes += zt_acts_bytes(k->macts[j]);
    }
  }
  k->view.h_tok = malloc(N * sizeof *k->view.h_tok);
  k->view.h_tgt = malloc(N * sizeof *k->view.h_tgt);
  k->h_xchg = malloc((size_t)s->dc.world * s->plan.rec * sizeof *k->h_xchg);
  k->gather_tick = calloc((size_t)s->plan.nu, sizeof *k->gather_tick);
  if (!k->view.h_tok || !k->view.h_tgt || !k->h_xchg || !k->gather_tick || build_runs(k) < 0)
    return zt__dp_rank_fail(k, -ENOMEM, "out of host memory");
  /* the plan's buffers, in its order (a size 0 is none) */
  k->params = rank_alloc(k, b->params, &rc);
  k->params_lp = rank_alloc(k, b->params_lp, &rc);
  k->grads = rank_alloc(k, b->grads, &rc);
  k->m = rank_alloc(k, b->moments, &rc);
  k->v = rank_alloc(k, b->moments, &rc);
  k->xchg = rank_alloc(k, b->xchg, &rc);
  for (int i = 0; i < 2; i++) k->gout[i] = rank_alloc(k, b->gout[i], &rc);
  for (int i = 0; i < 2; i++) {
    k->pchunk[i] = rank_alloc(k, b->pchunk, &rc);
    k->lpchunk[i] = rank_alloc(k, b->lpchunk, &rc);
  }
  for (int i = 0; i < 2; i++) k->gunit[i] = rank_alloc(k, b->gunit, &rc);
  k->gembed = rank_alloc(k, b->gembed, &rc);
  k->gscratch = rank_alloc(k, b->gscratch, &rc);
  for (int i = 0; i < 2; i++) {
    k->pslot[i] = rank_alloc(k, b->pslot, &rc);
    k->lpslot[i] = rank_alloc(k, b->lpslot, &rc);
  }
  k->pembed = rank_alloc(k, b->pembed, &rc);
  k->lpembed = rank_alloc(k, b->lpembed, &rc);
  if (rc == 0 && s->plan.host_n) rc = host_open(k);
  if (rc == 0 && (rc = be->ops->sync(be->ctx)) < 0) zt__dp_backend_fail(k, rc);
  return rc;
}

static int rank_close(dp_rank_state *k) {
  const zt_backend *be = &k->view.be;
  /* the copies in flight read or write device buffers */
  zt_copy_close(k->copy);
  /* the AdamW in flight, then the I/O, read or write the sets; the files go with the store */
  zt_opt_store_close(k->opt);
  zt_nvme_store_close(k->store);
  if (k->nvdir[0]) rmdir(k->nvdir);
  void *bufs[] = {k->params,    k->params_lp, k->grads,     k->m,         k->v,
                  k->xchg,      k->gunit[0],  k->gunit[1],  k->gembed,    k->gscratch,
                  k->pslot[0],  k->pslot[1],  k->lpslot[0], k->lpslot[1], k->pembed,
                  k->lpembed,   k->gout[0],   k->gout[1],   k->pchunk[0], k->pchunk[1],
                  k->lpchunk[0], k->lpchunk[1]};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (bufs[i]) be->ops->free(be->ctx, bufs[i]);
  zt_host_arena_close(k->host);
  if (k->own_hbe) zt_backend_close(&k->hbe);
  free(k->first_run);
  free(k->unit_tick);
  free(k->usumsq);
  free(k->began);
  free(k->gather_tick);
  for (int j = 1; k->macts && j < k->view.tc.grad_accum; j++) zt_acts_close(k->macts[j]);
  free(k->macts);
  zt_acts_close(k->view.acts);
  free(k->blob);
  free(k->view.h_tok);
  free(k->view.h_tgt);
  free(k->h_xchg);
  free(k->runs);
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
  zt_dp_plan_free(&s->plan);
  /* the ranks' directories and files went with their stores */
  if (s->nvme_dir[0]) rmdir(s->nvme_dir);
  free(s->ranks);
  free(s);
  t->path_state = NULL;
}

const zt__train_path zt__dp_path = {
    .step = zt__dp_step,
    .eval = zt__dp_eval,
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

/* The placement of c as the plan reads it. */
static void offload_of(const zt_dp_cfg *c, zt_offload_cfg *o) {
  *o = (zt_offload_cfg){.optimizer = c->optimizer, .params = c->params,
                        .gpu_units = c->gpu_units, .host_units = c->host_units,
                        .order = c->order};
  snprintf(o->nvme_dir, sizeof o->nvme_dir, "%s", c->nvme_dir ? c->nvme_dir : "");
}

int zt_dp_cfg_check(const zt_dp_cfg *c, char *err, size_t errlen) {
  int rc = zt_dp_plan_check_world(c->world, c->zero_stage, err, errlen);
  if (rc < 0) return rc;
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
  zt_offload_cfg o;
  offload_of(c, &o);
  return zt_dp_plan_check_place(&o, c->zero_stage, err, errlen);
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

/* Whether the open refuses dpc (its checks, fp16 for a part); dpc's placement as the plan reads
 * it in *o. */
static int refused(const zt_train_cfg *tc, const zt_dp_cfg *dpc, zt_offload_cfg *o) {
  char err[256];
  offload_of(dpc, o);
  return zt_dp_cfg_check(dpc, err, sizeof err) < 0 || fp16_supported(tc, dpc, err, sizeof err) < 0;
}

size_t zt_dp_estimate_rank_bytes(const zt_model_cfg *mc, const zt_train_cfg *tc,
                                 const zt_dp_cfg *dpc, const zt_ops *ops) {
  zt_offload_cfg o;
  if (refused(tc, dpc, &o)) return SIZE_MAX;
  return zt_dp_plan_rank_bytes(mc, tc, &o, dpc->world, dpc->zero_stage, ops);
}

size_t zt_dp_estimate_host_bytes(const zt_model_cfg *mc, const zt_train_cfg *tc,
                                 const zt_dp_cfg *dpc) {
  zt_offload_cfg o;
  if (refused(tc, dpc, &o)) return SIZE_MAX;
  return zt_dp_plan_host_tier_bytes(mc, tc, &o, dpc->world, dpc->zero_stage);
}

uint64_t zt_dp_estimate_nvme_bytes(const zt_model_cfg *mc, const zt_train_cfg *tc,
                                   const zt_dp_cfg *dpc) {
  zt_offload_cfg o;
  if (refused(tc, dpc, &o)) return UINT64_MAX;
  return zt_dp_plan_nvme_file_bytes(mc, tc, &o, dpc->world, dpc->zero_stage);
}

int zt_trainer_open_dp(zt_trainer **out, const zt_model_cfg *mc, const zt_train_cfg *tc,
                       const zt_dp_cfg *dpc, const zt_dp_rank *ranks, char *err,
                       size_t errlen) {
  int rc;
  float *init = NULL;
  zt__trainer_init in = {0};
  *out = NULL;
  if ((rc = zt_train_cfg_check(tc, err, errlen)) < 0 ||
      (rc = zt_train_cfg_check_strategy(tc, "data parallelism", err, errlen)) < 0 ||
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
  t->be = ranks[0].be; /* what engine/train/checkpoint synchronises; the state is reached through the path */
  t->path = &zt__dp_path;
  t->path_state = s;
  zt_loss_scaler_init(&t->scaler);
  s->dc = *dpc;
  s->nl = dpc->local ? dpc->local : dpc->world;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cmd_cv, NULL);
  pthread_cond_init(&s->done_cv, NULL);
  if ((rc = zt_model_create(&t->model, mc, err, errlen)) < 0) goto out;
  s->ranks = calloc((size_t)s->nl, sizeof *s->ranks);
  /* the initial parameters a piece of units at a time (as engine/train/offload/open.c's
   * write_initial_state), not a flat copy of the model */
  size_t cap = zt__trainer_piece_cap(t->model);
  init = malloc(cap * sizeof *init);
  if (!s->ranks || !init) {
    rc = -ENOMEM;
    snprintf(err, errlen, "out of memory");
    goto out;
  }
  zt_offload_cfg o;
  offload_of(dpc, &o);
  if ((rc = zt_dp_plan_make(&s->plan, t->model, tc, &o, dpc->world, dpc->zero_stage, err,
                            errlen)) < 0)
    goto out;
  if (s->plan.nvme) {
    /* a directory of its own, so that trainers can share nvme_dir; the ranks' inside it */
    snprintf(s->nvme_dir, sizeof s->nvme_dir, "%s/zt-offload.XXXXXX", dpc->nvme_dir);
    if (!mkdtemp(s->nvme_dir)) {
      rc = -errno;
      s->nvme_dir[0] = 0;
      snprintf(err, errlen, "offload.nvme_dir: %s: %s", dpc->nvme_dir, strerror(-rc));
      goto out;
    }
  }
  if (s->plan.host_n) {
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
  for (int u0 = 0, u1; u0 < s->plan.nu; u0 = u1) {
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
