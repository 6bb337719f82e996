/* A rank's offload in the step (engine/train/dp/dp.h "Offload"): where a unit's state is, the
 * host units' chunks staged for their gathers (params host, and params nvme's reads of the
 * master files), their gradients copied to the host and taken up behind the backward, and
 * their updates through the rank's optimizer-state store (offload/opt_store.h: the CPU AdamW
 * on the pool; optimizer nvme's files read ahead into its sets, written behind), whose retire
 * uploads each NVMe unit's chunk (the hooks here). The walk that drives them is step.c's. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "engine/train/dp/internal.h"
#include "offload/copy_engine.h"
#include "offload/cpu_adam.h"
#include "offload/nvme_store.h"
#include "offload/opt_store.h"
#include "offload/shard.h"

/* A host unit's first element in the host tier. */
size_t zt__dp_host_at(const dp_state *s, const zt_shard *sh) {
  return sh->packed_off - s->plan.dev_packed;
}

int zt__dp_on_host(const dp_state *s, int u) { return u >= s->plan.ng; }

/* A host unit whose masters, m and v are in files (optimizer nvme, past host_units). */
int zt__dp_on_nvme(const dp_state *s, int u) { return u >= s->plan.nv0; }

/* Where rank k keeps unit u's parameters of its chunk sh (stage 3: the shard; else the padded
 * copy) */
size_t zt__dp_param_at(const dp_rank_state *k, const zt_shard *sh) {
  return k->s->dc.zero_stage == 3 ? sh->packed_off : sh->padded_off;
}

void *zt__dp_lp_of(const dp_rank_state *k, void *base, size_t elem) {
  return (char *)base + elem * zt_dtype_size(k->view.tc.precision);
}

int zt__dp_copy_fail(dp_rank_state *k, int rc, const char *what) {
  return zt__dp_rank_fail(k, rc < 0 ? rc : -EIO, "copy engine: %s failed (%s)", what,
                          strerror(rc < 0 ? -rc : EIO));
}

/* params host: the copy of host unit u's chunk (fp32 and the compute copy) into chunk buffer
 * u & 1, ordered after the compute queued so far (the gather that last read it). */
static int stage_chunk(dp_rank_state *k, int u) {
  const dp_state *s = k->s;
  const zt_shard *sh = zt_shard_at(s->plan.tab, u, k->r);
  size_t c = s->plan.tab->chunk[u], at = zt__dp_host_at(s, sh);
  int b = u & 1;
  int64_t t = k->copy->ops->h2d(k->copy, k->pchunk[b], k->hm + at, c * sizeof(float),
                                ZT_COPY_AFTER_ALL);
  if (t > 0 && k->hlp)
    t = k->copy->ops->h2d(k->copy, k->lpchunk[b], k->hlp + at, c * sizeof(uint16_t),
                          ZT_COPY_AFTER_ALL);
  if (t < 0) return zt__dp_copy_fail(k, (int)t, "copying a parameter chunk to the device");
  k->chunk_unit[b] = u;
  k->chunk_tick[b] = k->h2d_last = t;
  return 0;
}

/* ---- params nvme: the NVMe units' chunks read from their master files before each gather ---
 * The step reads a file while no write of it is in flight: the update of a unit begins after
 * its last gather of the step (the backward walks down, the updates follow it), and the last
 * step's write-behind was waited for when the store's sets were retired (zt__dp_nv_finish),
 * before this step began; a state call that writes the files runs between steps. */

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
    return zt__dp_copy_fail(k, rc, "copying a parameter chunk to the device");
  k->pstage_tick[b] = 0;
  k->pstage_unit[b] = -1;
  size_t bytes = k->s->plan.tab->chunk[u] * sizeof(float);
  if ((rc = zt_nvme_read(k->store, zt_opt_store_ext(k->opt, u, ZT_OPT_MASTER), 0, k->pstage[b],
                         bytes)) < 0)
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
                                k->s->plan.tab->chunk[u] * sizeof(float), ZT_COPY_AFTER_ALL);
  if (t < 0) return zt__dp_copy_fail(k, (int)t, "copying a parameter chunk to the device");
  k->chunk_unit[b] = u;
  k->chunk_tick[b] = k->pstage_tick[b] = t;
  return 0;
}

/* The reads still in flight waited for (only a failed step leaves any, and its error is the
 * step's); the stagings hold nothing the next step may use (the update rewrites the files). */
void zt__dp_nvp_finish(dp_rank_state *k) {
  for (int b = 0; b < 2; b++) {
    if (k->pstage_req[b] >= 0) zt_nvme_wait(k->store, k->pstage_req[b]);
    k->pstage_req[b] = k->pstage_unit[b] = -1;
  }
}

/* Whether the walk is still to gather host unit v from a chunk buffer: no slot (nor the
 * embedding's) holds it. */
int zt__dp_walk_gathers(const dp_rank_state *k, int v) {
  const dp_state *s = k->s;
  if (v < 0 || v >= s->plan.nu || !zt__dp_on_host(s, v)) return 0;
  return s->plan.tied && v == 0 ? !k->embed_gathered : k->slot_unit[v & 1] != v;
}

/* params nvme: unit v's file read ahead of its staging, where the walk is to gather it from
 * NVMe and no chunk buffer holds it. */
int zt__dp_nvp_ahead(dp_rank_state *k, int v) {
  if (!zt__dp_walk_gathers(k, v) || !zt__dp_on_nvme(k->s, v) || k->chunk_unit[v & 1] == v) return 0;
  return nvp_read(k, v);
}

/* A host unit's chunk into chunk buffer u & 1, from the host tier or its file. */
int zt__dp_stage_unit(dp_rank_state *k, int u) {
  return k->s->plan.params_nvme && zt__dp_on_nvme(k->s, u) ? nvp_stage(k, u) : stage_chunk(k, u);
}

/* A host unit's reduced chunk at dev goes to the host tier behind the collective: the first
 * micro-batch's into the gradients, a later one's into the staging (added after the
 * micro-batch). */
int zt__dp_grads_to_host(dp_rank_state *k, int u, int j, const float *dev) {
  const dp_state *s = k->s;
  float *h = (j == 0 ? k->hgrad : k->hstage) + zt__dp_host_at(s, zt_shard_at(s->plan.tab, u, k->r));
  int64_t t = k->copy->ops->d2h(k->copy, h, dev, s->plan.tab->chunk[u] * sizeof(float));
  if (t < 0) return zt__dp_copy_fail(k, (int)t, "copying gradients to the host");
  k->unit_tick[u] = t;
  return 0;
}

/* Starts host unit u's AdamW on the pool through the rank's store: on the host tier, or for an
 * NVMe unit on the set x its state was staged into. */
static int submit_adam(dp_rank_state *k, int u, const zt_opt_set *x, float scale) {
  const dp_state *s = k->s;
  const zt_train_cfg *c = &k->view.tc;
  size_t base = zt__dp_host_at(s, zt_shard_at(s->plan.tab, u, k->r));
  zt_opt_io io = {.p = x ? x->buf[ZT_OPT_MASTER] : k->hm + base,
                  .m = x ? x->buf[ZT_OPT_M] : k->hmom + base,
                  .v = x ? x->buf[ZT_OPT_V] : k->hvar + base, .g = k->hgrad + base,
                  .lp = x ? x->lp : k->hlp ? k->hlp + base : NULL};
  zt_adam_hparams hp = {.lr = s->args.lr, .beta1 = c->beta1, .beta2 = c->beta2, .eps = c->eps,
                        .weight_decay = c->weight_decay, .step = s->args.adam_step,
                        .grad_scale = scale};
  int rc = zt_opt_store_submit(k->opt, u, &io, &hp);
  return rc < 0 ? zt__dp_rank_fail(k, rc, "the host AdamW: %s", strerror(-rc)) : 0;
}

/* ---- optimizer nvme: the rank's store (offload/opt_store.h) and its retire's hooks --------- */

/* A hook's failure: its message is made when the store returns it (zt__dp_nv_fail), unless an
 * earlier failure of the same call is the one returned. */
static int hook_fail(dp_rank_state *k, int rc, const char *what) {
  if (!k->hook_what) k->hook_what = what;
  return rc;
}

/* The message of a failed store call: its I/O failure's (the store's names the file). */
void zt__dp_nv_why(const dp_rank_state *k, int rc, char *why, size_t len) {
  snprintf(why, len, "optimizer nvme: %s", zt_opt_store_error(k->opt, rc));
}

/* A store call failed with rc: the hook's copy failure, or the store's. */
int zt__dp_nv_fail(dp_rank_state *k, int rc) {
  const char *what = k->hook_what;
  k->hook_what = NULL;
  if (!zt_opt_store_error(k->opt, rc)[0]) return zt__dp_copy_fail(k, rc, what);
  char why[400];
  zt__dp_nv_why(k, rc, why, sizeof why);
  return zt__dp_rank_fail(k, rc, "%s", why);
}

/* The updated hook: the set's updated chunk where the step reads it: with params nvme in the
 * master file written behind (nothing more to do), with params host into the host's parameters
 * (the copies staged from them so far landed first), else onto the device on the copy engine,
 * which orders it after the compute queued so far (the backward of the unit may still read the
 * old parameters). */
int zt__dp_nv_updated(void *ctx, int u, const zt_opt_set *x) {
  dp_rank_state *k = ctx;
  const dp_state *s = k->s;
  const zt_shard *sh = zt_shard_at(s->plan.tab, u, k->r);
  size_t c = s->plan.tab->chunk[u], at = zt__dp_host_at(s, sh), dev = zt__dp_param_at(k, sh);
  int rc;
  if (s->plan.params_nvme) return 0;
  if (s->plan.params_host) {
    if (k->h2d_last && (rc = k->copy->ops->wait(k->copy, ZT_COPY_H2D, k->h2d_last)) < 0)
      return hook_fail(k, rc, "copying a parameter chunk to the device");
    memcpy(k->hm + at, x->buf[ZT_OPT_MASTER], c * sizeof(float));
    if (x->lp) memcpy(k->hlp + at, x->lp, c * sizeof(uint16_t));
    return 0;
  }
  int64_t t = k->copy->ops->h2d(k->copy, k->params + dev, x->buf[ZT_OPT_MASTER],
                                c * sizeof(float), ZT_COPY_AFTER_ALL);
  if (t > 0 && x->lp)
    t = k->copy->ops->h2d(k->copy, zt__dp_lp_of(k, k->params_lp, dev), x->lp,
                          c * zt_dtype_size(k->view.tc.precision), ZT_COPY_AFTER_ALL);
  if (t < 0) return hook_fail(k, (int)t, "copying updated parameters to the device");
  k->up_tick = t;
  return 0;
}

/* The written hook: the upload, which reads the set too, landed before the set is used again. */
int zt__dp_nv_written(void *ctx, int u) {
  dp_rank_state *k = ctx;
  (void)u;
  int rc = k->up_tick ? k->copy->ops->wait(k->copy, ZT_COPY_H2D, k->up_tick) : 0;
  return rc < 0 ? hook_fail(k, rc, "copying updated parameters to the device") : 0;
}

/* Starts reading host unit u's state into its set, unless it is there or coming (retiring the
 * set's unit: its update waited for, uploaded and written behind). */
int zt__dp_nv_read(dp_rank_state *k, int u) {
  int rc = zt_opt_store_read(k->opt, u);
  return rc < 0 ? zt__dp_nv_fail(k, rc) : 0;
}

/* Host unit u's AdamW from its set once read (the compute copy cast from the masters first,
 * so that the chunk's padding is as the host tier keeps it), then the state of the unit below
 * read ahead: that retires the set of the unit above (its update waited for, uploaded and
 * written behind) while the pool updates this one. */
static int nv_update(dp_rank_state *k, int u, float scale) {
  zt_opt_set x;
  int rc = zt_opt_store_stage(k->opt, u, &x);
  if (rc < 0) return zt__dp_nv_fail(k, rc);
  if (x.lp)
    k->hbe.ops->cast(k->hbe.ctx, x.lp, k->view.tc.precision, x.buf[ZT_OPT_MASTER], ZT_F32,
                     k->s->plan.tab->chunk[u]);
  if ((rc = submit_adam(k, u, &x, scale)) < 0) return rc;
  return u - 1 >= k->s->plan.nv0 ? zt__dp_nv_read(k, u - 1) : 0;
}

/* Every set retired, the higher unit's first; the host units' updates may still run. */
int zt__dp_nv_finish(dp_rank_state *k) {
  int rc = zt_opt_store_flush(k->opt);
  return rc < 0 ? zt__dp_nv_fail(k, rc) : 0;
}

/* Host unit u's AdamW, from the host tier or its files. */
int zt__dp_update_host_unit(dp_rank_state *k, int u, float scale) {
  k->began[u] = 1;
  return zt__dp_on_nvme(k->s, u) ? nv_update(k, u, scale) : submit_adam(k, u, NULL, scale);
}

/* Host unit u's gradients of reduction j (micro-batch j's; unit-major, the step's one) have landed (waited for): a later micro-batch's are
 * added to the running sum as the device adds its units'; after the last one its sum of squares
 * is taken and, where the step's updates may overlap the backward (the recipe's `overlap`: no
 * clipping, which needs the norm first, nor fp16, the world's overflow verdict), its AdamW
 * starts unless a gradient of this rank was not finite. */
static int take_up_unit(dp_rank_state *k, int u, int j, int overlap) {
  const dp_state *s = k->s;
  const zt_shard *sh = zt_shard_at(s->plan.tab, u, k->r);
  size_t at = zt__dp_host_at(s, sh), c = s->plan.tab->chunk[u];
  int rc = k->copy->ops->wait(k->copy, ZT_COPY_D2H, k->unit_tick[u]);
  if (rc < 0) return zt__dp_copy_fail(k, rc, "copying gradients to the host");
  if (j > 0 && s->dc.zero_stage >= 2)
    k->hbe.ops->add(k->hbe.ctx, k->hgrad + at, k->hgrad + at, k->hstage + at, c);
  if (j < k->red_last) return 0;
  int nf = 0;
  k->usumsq[u] = sh->count ? k->hbe.ops->sum_squares(k->hbe.ctx, k->hgrad + at, sh->count, &nf)
                           : 0.0;
  k->nonfinite |= nf;
  if (!overlap || k->nonfinite) return 0;
  if ((rc = zt__dp_update_host_unit(k, u, 1.0f)) == 0) k->updated++;
  return rc;
}

/* Takes up the host units the backward of micro-batch j has copied, down to unit `to`. */
int zt__dp_take_up_to(dp_rank_state *k, int to, int j, int overlap) {
  const dp_state *s = k->s;
  if (s->dc.zero_stage == 1 && j < k->red_last) return 0; /* nothing copied */
  for (; k->take_up >= to && k->take_up >= s->plan.ng; k->take_up--) {
    int rc = take_up_unit(k, k->take_up, j, overlap);
    if (rc < 0) return rc;
  }
  return 0;
}

/* Host unit u's updated chunk to the device's parameters (unless params host: it is copied
 * before each gather), ordered before its all-gather on the stream. */
void zt__dp_upload_unit(dp_rank_state *k, int u) {
  const dp_state *s = k->s;
  const zt_backend *be = &k->view.be;
  if (s->plan.params_host) return;
  const zt_shard *sh = zt_shard_at(s->plan.tab, u, k->r);
  size_t c = s->plan.tab->chunk[u], at = zt__dp_host_at(s, sh), dev = zt__dp_param_at(k, sh);
  be->ops->to_device(be->ctx, k->params + dev, k->hm + at, c * sizeof(float));
  if (k->hlp)
    be->ops->to_device(be->ctx, zt__dp_lp_of(k, k->params_lp, dev), k->hlp + at,
                       c * zt_dtype_size(k->view.tc.precision));
}
