/* The data-parallel step (engine/train/dp/dp.h): the strategy the step recipe
 * (engine/train/step.h) drives. The recipe's walk runs on every rank's thread at once, each with
 * the rank's hooks: the walk over the units with its collectives (the communicator's queue,
 * stage 3's gathers into slots, the gradients reduced unit by unit), the exchange of the step's
 * scalars in the norm (so every rank reaches the same verdict), the update and stages 1-2's
 * gathers of the updated parameters; the recipe's step around it runs once, on the trainer's
 * thread (dp_run dispatches the walks); with offload.order unit its forward_all and
 * backward_all walk each unit through every micro-batch of the rank. The host tier's part of
 * the walk is offload.c's. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "engine/train/dp/internal.h"
#include "engine/train/trainer_internal.h"
#include "offload/copy_engine.h"
#include "offload/shard.h"

/* How many units behind the one the backward just queued a host unit's gradients are taken up
 * (waited for, added, summed, their AdamW started): the device always has the next unit's work
 * queued when the host waits for a copy. */
#define TAKE_UP_LAG 2

/* ---- the step (on every rank's thread at once) -------------------------------------------- */

static size_t grad_at(const dp_rank_state *k, const zt_shard *sh) {
  return k->s->dc.zero_stage == 1 ? sh->padded_off : sh->packed_off;
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

/* Stage 3: unit u's parameters gathered into p (and the compute copy into lp), *tick the
 * compute's wait for them. A device unit's gather runs on the queue after the compute queued
 * so far (the slot's last reader). A host unit's chunk comes from its chunk buffer, gathered on
 * the compute stream, and the next unit of the walk's is copied behind it; with params nvme
 * the file of the unit after that is read meanwhile (and the next one's, after a device unit),
 * so that each read and each copy overlap the compute of a unit before theirs. */
static int gather_unit(dp_rank_state *k, int u, float *p, void *lp, long long *tick) {
  const dp_state *s = k->s;
  const zt_backend *be = &k->view.be;
  const zt_shard *sh = zt_shard_at(s->plan.tab, u, k->r);
  size_t c = s->plan.tab->chunk[u];
  zt_dtype dt = k->view.tc.precision;
  const zt_comm_ops *co = k->comm.ops;
  const float *src = k->params + sh->packed_off;
  const void *lsrc = k->params_lp ? zt__dp_lp_of(k, k->params_lp, sh->packed_off) : NULL;
  int host = s->plan.params_host && zt__dp_on_host(s, u), rc;
  if (host) {
    int b = u & 1;
    if (k->chunk_unit[b] != u && (rc = zt__dp_stage_unit(k, u)) < 0) return rc;
    if ((rc = k->copy->ops->compute_wait(k->copy, ZT_COPY_H2D, k->chunk_tick[b])) < 0)
      return zt__dp_copy_fail(k, rc, "ordering a gather after its chunk's copy");
    src = k->pchunk[b];
    lsrc = k->lpchunk[b];
    /* a file holds the fp32 masters alone: the compute copy is their cast, as AdamW writes it,
     * made here where the gather waits for the copy anyway */
    if (lp && s->plan.params_nvme && zt__dp_on_nvme(s, u))
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
  if (host && zt__dp_walk_gathers(k, next) && k->chunk_unit[next & 1] != next &&
      (rc = zt__dp_stage_unit(k, next)) < 0)
    return rc;
  for (int i = 1; s->plan.params_nvme && i <= 2; i++)
    if ((rc = zt__dp_nvp_ahead(k, u + i * k->dir)) < 0) return rc;
  return 0;
}

/* Unit u's parameters (fp32 and the compute copy; in fp32 the same) for its forward or
 * backward; stage 3 gathers them unless a slot holds them. With `use` the compute queued next
 * reads them: it waits for their gather (stages 1-2: the last step's, of the updated
 * parameters). */
static int unit_params(dp_rank_state *k, int u, int use, const float **p, const void **lp) {
  const dp_state *s = k->s;
  if (s->dc.zero_stage < 3) {
    size_t at = s->plan.tab->padded_unit[u];
    *p = k->params + at;
    *lp = k->params_lp ? zt__dp_lp_of(k, k->params_lp, at) : (const void *)*p;
    return use ? q_wait(k, k->gather_tick[u]) : 0;
  }
  float *fp;
  void *l;
  long long *tick;
  if (s->plan.tied && u == 0) {
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
  if (k->s->dc.zero_stage < 3 || u < 0 || u >= k->s->plan.nu) return 0;
  return unit_params(k, u, 0, &p, &lp);
}

/* The gradient buffer unit u's backward adds into. */
float *zt__dp_unit_grads(dp_rank_state *k, int u) {
  const dp_state *s = k->s;
  if (s->dc.zero_stage == 1) return k->grads + s->plan.tab->padded_unit[u];
  return s->plan.tied && u == 0 ? k->gembed : k->gunit[u & 1];
}

/* Stages 2-3: the reduced chunk of a later micro-batch, waiting in gscratch, added to its
 * unit's shard once its reduction is done (before gscratch is reduced into again). */
static int flush_add(dp_rank_state *k) {
  const zt_backend *be = &k->view.be;
  int u = k->add_unit, rc;
  if (u < 0) return 0;
  k->add_unit = -1;
  if ((rc = q_wait(k, k->add_tick)) < 0) return rc;
  float *shard = k->grads + zt_shard_at(k->s->plan.tab, u, k->r)->packed_off;
  be->ops->add(be->ctx, shard, shard, k->gscratch, k->s->plan.tab->chunk[u]);
  return 0;
}

/* Unit u's gradients of reduction j are done (micro-batch j's; where the backward is unit-major
 * the sum of the step's, j 0 and k->red_last 0): stage 1 all-reduces them after the last
 * micro-batch; stages 2-3 reduce-scatter them into the shard (the first reduction writes it,
 * later ones add). A device unit's collective runs on the queue while the compute goes on to
 * the next unit; a host unit's reduced chunk goes to the host. */
static int unit_grads_done(dp_rank_state *k, int u, int j) {
  const dp_state *s = k->s;
  const zt_comm_ops *co = k->comm.ops;
  const zt_shard *sh = zt_shard_at(s->plan.tab, u, k->r);
  size_t c = s->plan.tab->chunk[u], W = (size_t)s->dc.world;
  float *g = zt__dp_unit_grads(k, u);
  int rc = 0;
  if (s->dc.zero_stage == 1) {
    if (j < k->red_last) return 0;
    if (zt__dp_on_host(s, u)) {
      if ((rc = co->all_reduce(k->comm.ctx, g, g, c * W, k->stream)) < 0)
        return zt__dp_comm_fail(k, rc, "reducing gradients");
      return zt__dp_grads_to_host(k, u, 0, k->grads + sh->padded_off);
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
      return zt__dp_copy_fail(k, rc, "ordering a reduction after a copy");
    if ((rc = co->reduce_scatter(k->comm.ctx, g, k->gout[b], c, k->stream)) < 0)
      return zt__dp_comm_fail(k, rc, "reducing gradients");
    if ((rc = zt__dp_grads_to_host(k, u, j, k->gout[b])) < 0) return rc;
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

/* ---- the strategy (engine/train/step.h), on every rank's thread ---------------------------- */

/* The rank's record in the exchange (its slot of h_xchg, which the exchange rewrites with the
 * same bytes). */
static double *rank_rec(const dp_rank_state *k) {
  return k->h_xchg + (size_t)k->r * k->s->plan.rec;
}

/* The parameters changed since the last walk: no slot or chunk holds a unit's. */
static void forget_gathers(dp_rank_state *k) {
  k->slot_unit[0] = k->slot_unit[1] = -1;
  k->chunk_unit[0] = k->chunk_unit[1] = -1;
  k->embed_gathered = 0;
}

static int dp_begin(void *ctx, zt__step_walk *w) {
  dp_rank_state *k = ctx;
  const dp_state *s = k->s;
  const zt_backend *be = &k->view.be;
  double *rec = rank_rec(k);
  w->unit_major = s->plan.unit_major;
  memset(rec, 0, s->plan.rec * sizeof *rec);
  rec[X_FLAGS] = s->flags; /* every rank of the part: an OR does not count them twice */
  forget_gathers(k);
  k->add_unit = -1;
  if (s->dc.zero_stage == 1)
    be->ops->zero(be->ctx, k->grads, s->plan.tab->padded_total * sizeof(float));
  k->updated = k->nonfinite = 0;
  if (s->plan.host_n) memset(k->began, 0, (size_t)s->plan.nu);
  return 0;
}

/* The forward of the n micro-batches mbs, whose activations are acts, unit by unit (whether
 * they counted or not: the collectives run): each unit's parameters taken once (stage 3: one
 * gather) for all of them. n > 1: unit-major. */
static int walk_forward(dp_rank_state *k, const zt__step_micro *mbs, zt_acts *const *acts,
                        int n) {
  const dp_state *s = k->s;
  const zt_model *m = k->view.model;
  const float *p;
  const void *lp;
  int rc;
  k->dir = 1;
  for (int u = 0; u < s->plan.nu; u++) {
    if ((rc = unit_params(k, u, 1, &p, &lp)) < 0 || (rc = prefetch(k, u + 1)) < 0) return rc;
    if (u == 0 && s->plan.tied) { /* a tied head reads the embedding unit's parameters */
      k->embed_p = p;
      k->embed_lp = lp;
    }
    for (int j = 0; j < n; j++)
      if (mbs[j].counted)
        zt_model_unit_forward_dt(m, acts[j], u, p, lp, k->embed_p, k->embed_lp);
  }
  /* params nvme: the files of the backward's first two gathers (below the units the slots keep)
   * read during the last forwards and the loss */
  for (int v = s->plan.nu - 1, c = 0; s->plan.params_nvme && v >= 0 && c < 2; v--)
    if (zt__dp_walk_gathers(k, v)) {
      if ((rc = zt__dp_nvp_ahead(k, v)) < 0) return rc;
      c++;
    }
  return 0;
}

/* Micro-batch j's forward. */
static int dp_forward(void *ctx, const zt__step_walk *w, const zt__step_micro *mb) {
  dp_rank_state *k = ctx;
  (void)w;
  return walk_forward(k, mb, &k->view.acts, 1);
}

/* micro-batch j's summed loss and its counted targets into the rank's record, for the
 * exchange */
static int dp_loss(void *ctx, const zt__step_walk *w, const zt__step_micro *mb) {
  double *rec = rank_rec(ctx);
  (void)w;
  rec[X_MICRO + 2 * mb->k] = mb->loss_sum;
  rec[X_MICRO + 2 * mb->k + 1] = mb->counted;
  return 0;
}

/* The world's counted targets, added in rank order: every rank's micro-batches are scaled by
 * the same normaliser, even where a part holds only its own ranks' batches (a pushed step).
 * The exchange buffer is free until the norm's exchange rewrites it. */
static int dp_count(void *ctx, zt__step_walk *w) {
  dp_rank_state *k = ctx;
  const dp_state *s = k->s;
  const zt_backend *be = &k->view.be;
  double got[ZT_DP_MAX_WORLD];
  be->ops->to_device(be->ctx, k->xchg + k->r, &w->counted, sizeof(double));
  int rc = k->comm.ops->all_gather(k->comm.ctx, k->xchg + k->r, k->xchg, sizeof(double),
                                   k->stream);
  if (rc < 0) return zt__dp_comm_fail(k, rc, "exchanging the counted targets");
  be->ops->to_host(be->ctx, got, k->xchg, (size_t)s->dc.world * sizeof(double));
  if ((rc = be->ops->sync(be->ctx)) < 0) return zt__dp_backend_fail(k, rc);
  w->counted = 0;
  for (int r = 0; r < s->dc.world; r++) w->counted += got[r];
  return 0;
}

/* The backward of the n micro-batches mbs, whose activations are acts, unit by unit, each
 * unit's gradients of them all added into its buffer in their order and reduced as reduction j
 * (unit_grads_done: n 1, micro-batch j's; n > 1, unit-major, the step's one); the host units'
 * taken up behind it, their updates started where the walk may overlap them. */
static int walk_backward(dp_rank_state *k, const zt__step_walk *w, const zt__step_micro *mbs,
                         zt_acts *const *acts, int n, int j) {
  const dp_state *s = k->s;
  const zt_model *m = k->view.model;
  const zt_backend *be = &k->view.be;
  int W = s->dc.world, stage = s->dc.zero_stage, rc;
  const float *p;
  const void *lp;
  /* stages 2-3: a gradient buffer is zeroed once the reduction that last read it is done */
  if (stage >= 2 && s->plan.tied) {
    if ((rc = q_wait(k, k->gembed_tick)) < 0) return rc;
    be->ops->zero(be->ctx, k->gembed, s->plan.tab->chunk[0] * (size_t)W * sizeof(float));
  }
  k->dir = -1;
  k->take_up = s->plan.nu - 1;
  for (int u = s->plan.nu - 1; u >= 0; u--) {
    if ((rc = unit_params(k, u, 1, &p, &lp)) < 0 || (rc = prefetch(k, u - 1)) < 0) return rc;
    float *g = zt__dp_unit_grads(k, u);
    if (stage >= 2 && g != k->gembed) {
      if ((rc = q_wait(k, k->gunit_tick[u & 1])) < 0) return rc;
      be->ops->zero(be->ctx, g, s->plan.tab->chunk[u] * (size_t)W * sizeof(float));
    }
    for (int i = 0; i < n; i++)
      if (mbs[i].counted)
        zt_model_unit_backward_dt(m, acts[i], u, p, lp, g, k->embed_p, k->embed_lp,
                                  s->plan.tied ? zt__dp_unit_grads(k, 0) : NULL);
    if ((rc = unit_grads_done(k, u, j)) < 0 ||
        (s->plan.host_n &&
         (rc = zt__dp_take_up_to(k, u + TAKE_UP_LAG + 1, j, w->overlap)) < 0))
      return rc;
  }
  if ((rc = flush_add(k)) < 0) return rc;
  return s->plan.host_n ? zt__dp_take_up_to(k, 0, j, w->overlap) : 0;
}

/* Micro-batch j's backward. */
static int dp_backward(void *ctx, const zt__step_walk *w, const zt__step_micro *mb) {
  dp_rank_state *k = ctx;
  return walk_backward(k, w, mb, &k->view.acts, 1, mb->k);
}

/* ---- unit-major (offload.order unit, dp.h "Unit-major") ------------------------------------ */

static zt_acts *dp_acts(void *ctx, int j) { return ((dp_rank_state *)ctx)->macts[j]; }

/* Every micro-batch of the rank (padding too) through each unit at once: stage 3 gathers each
 * unit once for them all. */
static int dp_forward_all(void *ctx, const zt__step_walk *w, const zt__step_micro *mbs, int n) {
  dp_rank_state *k = ctx;
  zt_acts *acts[ZT_UNIT_MAJOR_MICROS_MAX];
  (void)w;
  for (int i = 0; i < n; i++) acts[i] = k->macts[mbs[i].k];
  return walk_forward(k, mbs, acts, n);
}

/* Unit-major: each unit's gradients summed over the micro-batches, then reduced once; where the
 * head reads the embedding (plan.um_back 0) micro-major, each micro-batch's reduced as the
 * micro-major walk does, so that the embedding's gradient adds up in its order (head,
 * embedding, head, ...). */
static int dp_backward_all(void *ctx, const zt__step_walk *w, const zt__step_micro *mbs,
                           int n) {
  dp_rank_state *k = ctx;
  zt_acts *acts[ZT_UNIT_MAJOR_MICROS_MAX];
  int rc = 0;
  for (int i = 0; i < n; i++) acts[i] = k->macts[mbs[i].k];
  if (k->s->plan.um_back) return walk_backward(k, w, mbs, acts, n, 0);
  for (int i = 0; i < n && rc == 0; i++) rc = walk_backward(k, w, &mbs[i], &acts[i], 1, mbs[i].k);
  return rc;
}

/* The step's scalars from every rank's record, added in rank and micro-batch order (the loss
 * then is the sum a single trainer makes), the OR of the flags, whether any gradient was not
 * finite and whether any rank updated units during the backward. */
static int exchange(dp_rank_state *k, const double *rec, zt__step_norm *n) {
  const dp_state *s = k->s;
  const zt_backend *be = &k->view.be;
  size_t R = s->plan.rec, bytes = R * sizeof(double);
  be->ops->to_device(be->ctx, k->xchg + (size_t)k->r * R, rec, bytes);
  int rc = k->comm.ops->all_gather(k->comm.ctx, k->xchg + (size_t)k->r * R, k->xchg, bytes,
                                   k->stream);
  if (rc < 0) return zt__dp_comm_fail(k, rc, "exchanging the loss and the norm");
  be->ops->to_host(be->ctx, k->h_xchg, k->xchg, (size_t)s->dc.world * bytes);
  if ((rc = be->ops->sync(be->ctx)) < 0) return zt__dp_backend_fail(k, rc);
  double sumsq = 0;
  zt__step_norm sum = {0};
  n->nonfinite = n->updated = 0;
  n->flags = 0;
  for (int r = 0; r < s->dc.world; r++) {
    const double *x = k->h_xchg + (size_t)r * R;
    sumsq += x[X_SUMSQ];
    n->nonfinite |= x[X_NONFINITE] != 0;
    n->updated |= x[X_UPDATED] != 0;
    n->flags |= (unsigned)x[X_FLAGS];
    for (int j = 0; j < k->view.tc.grad_accum; j++)
      if (x[X_MICRO + 2 * j + 1] != 0) zt__step_norm_add(&sum, x[X_MICRO + 2 * j],
                                                         x[X_MICRO + 2 * j + 1]);
  }
  n->sumsq = sumsq;
  n->loss = sum.loss;
  n->loss_sum = sum.loss_sum;
  n->micro_counted = sum.micro_counted;
  n->micros = sum.micros;
  n->unequal = sum.unequal;
  return 0;
}

/* The rank's sum of squares and verdict, then the world's from the exchange. */
static int dp_norm(void *ctx, const zt__step_walk *w, zt__step_norm *n) {
  dp_rank_state *k = ctx;
  const dp_state *s = k->s;
  const zt_backend *be = &k->view.be;
  double *rec = rank_rec(k);
  int rc;
  (void)w;
  /* the reductions and gathers on the queue are done before the shards are read */
  if ((rc = q_wait_all(k)) < 0) return rc;
  /* the norm over this rank's real gradient elements, unit by unit wherever they are (a host
   * unit's summed when the backward took it up) */
  for (int u = 0; u < s->plan.nu; u++) {
    const zt_shard *sh = zt_shard_at(s->plan.tab, u, k->r);
    int nf = 0;
    if (!sh->count) continue;
    if (zt__dp_on_host(s, u))
      rec[X_SUMSQ] += k->usumsq[u];
    else
      rec[X_SUMSQ] += be->ops->sum_squares(be->ctx, k->grads + grad_at(k, sh), sh->count, &nf);
    if (nf) rec[X_NONFINITE] = 1;
  }
  if (k->nonfinite) rec[X_NONFINITE] = 1;
  rec[X_UPDATED] = k->updated;
  /* optimizer nvme, the updates after the exchange: the first one's state read meanwhile */
  if (s->plan.nvme && !k->began[s->plan.nu - 1] && (rc = zt__dp_nv_read(k, s->plan.nu - 1)) < 0)
    return rc;
  return exchange(k, rec, n);
}

/* Every rank sees the same verdict: the host AdamW the backward started is waited for. */
static int dp_nonfinite(void *ctx, const zt__step_walk *w, const zt__step_norm *n) {
  dp_rank_state *k = ctx;
  (void)w;
  (void)n;
  for (int u = k->s->plan.ng; u < k->s->plan.nu; u++) zt_opt_store_wait(k->opt, u);
  return 0;
}

static int dp_broken(void *ctx, const zt__step_walk *w, const zt__step_out *o) {
  (void)w;
  (void)o;
  return zt__dp_rank_fail(ctx, -EIO, "the gradient has inf or nan values, and the AdamW "
                          "overlapping the backward had updated units of a rank already (the "
                          "state is no step's): load a checkpoint");
}

/* Stages 1-2: every rank gets unit u's updated parameters back. A device unit's gather runs
 * on the queue after its update, and the next step's compute waits for it only where it reads
 * the unit (unit_params); a host unit's on the compute stream, after its upload. */
int zt__dp_gather_updated(dp_rank_state *k, int u) {
  const dp_state *s = k->s;
  const zt_shard *sh = zt_shard_at(s->plan.tab, u, k->r);
  size_t at = s->plan.tab->padded_unit[u], c = s->plan.tab->chunk[u];
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

/* The update: the host units' the backward did not start and the device units', stages 1-2's
 * gathers of every unit's updated parameters. */
static int dp_update(void *ctx, const zt__step_walk *w, float scale) {
  dp_rank_state *k = ctx;
  const dp_state *s = k->s;
  const zt_train_cfg *c = &k->view.tc;
  const zt_backend *be = &k->view.be;
  const zt_ops *o = be->ops;
  const zt__step_args *a = w->a;
  int stage = s->dc.zero_stage, rc = 0;
  /* the host units' updates the backward did not start (all of them with clipping), in its
   * order, on the pool while the device runs its own; the masters they write are no copy's
   * source any more */
  if (k->h2d_last && (rc = k->copy->ops->wait(k->copy, ZT_COPY_H2D, k->h2d_last)) < 0)
    return zt__dp_copy_fail(k, rc, "copying a parameter chunk to the device");
  for (int u = s->plan.nu - 1; u >= s->plan.ng; u--)
    if (!k->began[u] && (rc = zt__dp_update_host_unit(k, u, scale)) < 0) return rc;
  /* the device units' updates; stages 1-2: every rank gets every unit's updated parameters
   * back, each device unit's gathered on the queue while the next one's update runs, then each
   * host unit's once its AdamW is done, uploaded and gathered while the pool updates the next */
  for (int u = 0; u < s->plan.ng; u++) {
    const zt_shard *sh = zt_shard_at(s->plan.tab, u, k->r);
    for (int i = k->first_run[u]; i < k->first_run[u + 1]; i++) {
      const zt_opt_run *g = &k->runs[i];
      size_t pa = zt__dp_param_at(k, sh) + g->offset, sa = sh->packed_off + g->offset;
      float wd = g->decay ? c->weight_decay : 0.0f;
      if (k->params_lp)
        o->adamw_dt(be->ctx, k->params + pa, k->grads + grad_at(k, sh) + g->offset, k->m + sa,
                    k->v + sa, g->n, a->lr, c->beta1, c->beta2, c->eps, wd, a->adam_step,
                    scale, zt__dp_lp_of(k, k->params_lp, pa), c->precision);
      else
        o->adamw(be->ctx, k->params + pa, k->grads + grad_at(k, sh) + g->offset, k->m + sa,
                 k->v + sa, g->n, a->lr, c->beta1, c->beta2, c->eps, wd, a->adam_step, scale);
    }
    if (stage < 3 && (rc = zt__dp_gather_updated(k, u)) < 0) break;
  }
  if (s->plan.nvme) {
    /* the sets' chunks were uploaded as each set was retired: the last two now, then the
     * gathers ordered after the uploads */
    if (rc == 0) rc = zt__dp_nv_finish(k);
    if (rc == 0 && k->up_tick &&
        (rc = k->copy->ops->compute_wait(k->copy, ZT_COPY_H2D, k->up_tick)) < 0)
      rc = zt__dp_copy_fail(k, rc, "ordering a gather after its upload");
    for (int u = s->plan.nu - 1; rc == 0 && stage < 3 && u >= s->plan.nv0; u--)
      rc = zt__dp_gather_updated(k, u);
  }
  /* the host units' (all of them without NVMe), updated last */
  for (int u = s->plan.nv0 - 1; u >= s->plan.ng; u--) {
    zt_opt_store_wait(k->opt, u);
    if (rc < 0) continue; /* the others are still waited for */
    zt__dp_upload_unit(k, u);
    if (stage < 3) rc = zt__dp_gather_updated(k, u);
  }
  if (rc < 0) return rc;
  if ((rc = o->sync(be->ctx)) < 0) return zt__dp_backend_fail(k, rc);
  return 0;
}

/* The walk's end on rank k; whatever its result, no host AdamW is left running and (optimizer
 * nvme) every set is retired, so that the state calls and close find the host tier at rest. */
static int dp_end(void *ctx, const zt__step_walk *w, int rc) {
  dp_rank_state *k = ctx;
  const dp_state *s = k->s;
  (void)w;
  for (int u = s->plan.ng; s->plan.host_n && u < s->plan.nu; u++) zt_opt_store_wait(k->opt, u);
  if (s->plan.params_nvme) zt__dp_nvp_finish(k);
  if (s->plan.nvme) {
    char keep[sizeof k->err];
    memcpy(keep, k->err, sizeof keep);
    int r = zt__dp_nv_finish(k);
    if (rc < 0)
      memcpy(k->err, keep, sizeof keep);
    else
      rc = r;
  }
  /* a rank that fails alone must not leave the others waiting in a collective; -ERANGE is
   * every rank's verdict on the same exchanged norm */
  if (rc < 0 && rc != -ERANGE) k->comm.ops->abort(k->comm.ctx);
  return rc;
}

static int dp_run(void *ctx, const zt__step_args *a, zt__step_out *out, char *err,
                  size_t errlen);

/* Every rank walks every micro-batch, padding too: the collectives need every rank. */
static const zt__step_hooks dp_hooks = {
    .run = dp_run, .walk_padding = 1, .begin = dp_begin, .count = dp_count, .forward = dp_forward,
    .backward = dp_backward, .acts = dp_acts, .forward_all = dp_forward_all,
    .backward_all = dp_backward_all, .loss = dp_loss, .norm = dp_norm, .nonfinite = dp_nonfinite,
    .broken = dp_broken, .update = dp_update, .end = dp_end};

/* The step on rank k's thread: its walk of its micro-batches r * G .. of the step. */
static int rank_step(dp_rank_state *k) {
  return zt__step_rank(&k->view, &dp_hooks, k, &k->s->args, k->r, &k->out);
}

const zt__dp_cmd zt__dp_cmd_step = {.run = rank_step};

/* ---- held-out evaluation (zt_trainer_eval_batch), on every rank's thread at once --------- */

/* A micro-batch's forward, every rank's (the collectives run), and where it counts its loss
 * with the head's parameters as the walk left them (stage 3: in their slot). */
static int eval_walk(void *ctx, int counted, char *err, size_t errlen) {
  dp_rank_state *k = ctx;
  zt__step_micro mb = {.counted = counted};
  const float *p;
  const void *lp;
  int u = k->s->plan.nu - 1;
  int rc = dp_forward(k, NULL, &mb);
  if (rc == 0 && counted && (rc = unit_params(k, u, 1, &p, &lp)) == 0)
    zt_model_eval_loss(k->view.model, k->view.acts, lp, k->embed_lp);
  if (rc < 0) snprintf(err, errlen, "%s", k->err);
  return rc;
}

/* The rank's micro-batches r * G .. walked forward, their sums and counts exchanged, the
 * world's added in rank and micro-batch order: the order of a single trainer's evaluation. */
static int rank_eval(dp_rank_state *k) {
  dp_state *s = k->s;
  const zt_backend *be = &k->view.be;
  int G = k->view.tc.grad_accum;
  size_t R = s->plan.rec, bytes = R * sizeof(double);
  double *rec = rank_rec(k);
  char why[sizeof k->err];
  memset(rec, 0, bytes);
  forget_gathers(k);
  int rc = zt__step_eval_rank(&k->view, eval_walk, k, 1, s->args.batch, k->r * G, G,
                              rec + X_MICRO, why, sizeof why);
  if (s->plan.params_nvme) zt__dp_nvp_finish(k);
  if (rc < 0) {
    snprintf(k->err, sizeof k->err, "%s", why);
    goto fail;
  }
  be->ops->to_device(be->ctx, k->xchg + (size_t)k->r * R, rec, bytes);
  rc = k->comm.ops->all_gather(k->comm.ctx, k->xchg + (size_t)k->r * R, k->xchg, bytes,
                               k->stream);
  if (rc < 0) {
    rc = zt__dp_comm_fail(k, rc, "exchanging the evaluation's loss");
    goto fail;
  }
  be->ops->to_host(be->ctx, k->h_xchg, k->xchg, (size_t)s->dc.world * bytes);
  if ((rc = be->ops->sync(be->ctx)) < 0) {
    rc = zt__dp_backend_fail(k, rc);
    goto fail;
  }
  k->eval_sum = 0;
  k->eval_n = 0;
  for (int r = 0; r < s->dc.world; r++)
    for (int j = 0; j < G; j++) {
      const double *x = k->h_xchg + (size_t)r * R + X_MICRO + 2 * j;
      k->eval_sum += x[0];
      k->eval_n += (int64_t)x[1];
    }
  return 0;
fail:
  /* a rank that fails alone must not leave the others waiting in a collective */
  k->comm.ops->abort(k->comm.ctx);
  return rc;
}

static const zt__dp_cmd cmd_eval = {.run = rank_eval};

int zt__dp_eval(zt_trainer *t, const zt_batch *b, double *loss_sum, int64_t *counted, char *err,
                size_t errlen) {
  dp_state *s = t->path_state;
  char what[48];
  snprintf(what, sizeof what, "evaluation after step %d", t->step);
  if (s->broken) return zt__dp_refuse_broken(what, err, errlen);
  /* a part's other parts would have to walk with it: not done */
  if (s->nl < s->dc.world) {
    snprintf(err, errlen, "%s: held-out evaluation runs on a trainer with every rank of its "
             "world, not a part of %d of its %d ranks", what, s->nl, s->dc.world);
    return -ENOTSUP;
  }
  int rc = zt__step_check(t, b, s->dc.world * t->tc.grad_accum, err, errlen);
  if (rc < 0) return rc;
  s->args = (zt__step_args){.batch = b, .step = t->step, .world = s->dc.world};
  int bad = zt__dp_dispatch(s, &cmd_eval);
  if (bad >= 0) {
    /* the communicators were aborted */
    s->broken = 1;
    snprintf(err, errlen, "%s: %s", what, s->ranks[bad].err);
    return s->ranks[bad].rc;
  }
  *loss_sum = s->ranks[0].eval_sum;
  *counted = s->ranks[0].eval_n;
  return 0;
}

/* ---- the path's step, on the trainer's thread ---------------------------------------------- */

/* The walk on every rank's thread at once; rank 0's outcome (every rank's verdict is the
 * same), or the failure of the rank that failed first of its own. */
static int dp_run(void *ctx, const zt__step_args *a, zt__step_out *out, char *err,
                  size_t errlen) {
  dp_state *s = ctx;
  s->args = *a;
  int bad = zt__dp_dispatch(s, &zt__dp_cmd_step);
  s->flags = 0;
  *out = s->ranks[0].out;
  if (bad < 0) return 0;
  /* a refusal: every rank found it in the exchange and none updated anything */
  if (s->ranks[bad].rc == -ERANGE) return -ERANGE;
  s->broken = 1;
  snprintf(err, errlen, "step %d: %s", a->step, s->ranks[bad].err);
  return s->ranks[bad].rc;
}

int zt__dp_step(zt_trainer *t, const zt_batch *tokens, zt_step_result *res, char *err,
                size_t errlen) {
  dp_state *s = t->path_state;
  if (s->broken) {
    char what[32];
    snprintf(what, sizeof what, "step %d", t->step + 1);
    return zt__dp_refuse_broken(what, err, errlen);
  }
  return zt__step(t, &dp_hooks, s, s->dc.world, tokens, res, err, errlen);
}
