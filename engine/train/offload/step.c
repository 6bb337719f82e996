/* The offloaded step's walks and the step (engine/train/offload/offload.h): the strategy the step
 * recipe (engine/train/step.h) drives. Each micro-batch's forward and backward walk the units
 * through the streamer, a unit's update starts as soon as its gradients are final (unit_done);
 * after the backward the norm over wherever the gradients are, the updates the walk did not
 * reach, the delayed update deferred. */
#include "engine/train/offload/internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "engine/base/clock.h"

/* the policy's limits (engine/plan/recipe.h) */
#define UNIT_DONE_LAG ZT_OFFLOAD_UNIT_DONE_LAG

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
    /* landing: the copy is of the unit's updated parameters */
    if (s->landing) zt_opt_store_wait(s->opt, v);
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
 * unit's device copy (zt_offload_unit_layout_of). */
static const void *lp_of(const zt_trainer *t, int u, const void *p) {
  const off_state *s = t->path_state;
  if (!p || s->dt == ZT_F32) return p;
  const zt_unit_info *ui = zt_model_unit(t->model, u);
  if (u < s->ng) return (const char *)s->d_lp + ui->offset * zt_dtype_size(s->dt);
  return (const char *)p + s->lp_offset[u];
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
  ov->sumsq += s->hbe.ops->sum_squares(s->hbe.ctx, zt__off_grads_of(t, u), ui->numel, &nonfinite);
  ov->summed++;
  if (nonfinite) {
    ov->bad_unit = u;
    return 0;
  }
  s->updated[u] = 1;
  if ((rc = zt__off_update_unit(t, u, ov->hp)) < 0) {
    snprintf(err, errlen, "step %d: the AdamW update failed: %s", t->step + 1,
             zt_opt_store_error(s->opt, rc));
    return rc;
  }
  ov->updated++;
  s->adam_overlapped++;
  return 0;
}

/* The forward of the n micro-batches whose activations are acts (unit-major: every one of the
 * step's, each unit fetched once for them all). Delayed: the pending update's units are started
 * one a unit (zt__off_pend_pump), behind the unit's compute so that the device has work while
 * an NVMe read is waited for. */
static int walk_forward(zt_trainer *t, zt_acts *const *acts, int n, char *err, size_t errlen) {
  off_state *s = t->path_state;
  /* landing: the units ahead are prefetched once this one's compute is queued, so that the
   * device works while the runner waits for their updates */
  int early = !s->landing;
  for (int u = 0; u < s->nu; u++) {
    void *p = NULL, *e = NULL;
    if (s->landing && u >= s->ng) {
      zt_opt_store_wait(s->opt, u);
      s->adam_landed++;
    }
    int rc = unit_get(t, u, 0, &p, NULL), prc = 0;
    if (rc == 0 && u == s->head && (rc = unit_get(t, 0, 0, &e, NULL)) < 0) {
      unit_put(t, u, 0);
      p = NULL;
    }
    if (rc == 0 && (!early || (rc = prefetch_from(s, u, 1)) == 0)) {
      s->copy->ops->compute_mark(s->copy, 0);
      for (int j = 0; j < n; j++)
        zt_model_unit_forward_dt(t->model, acts[j], u, p, lp_of(t, u, p), e, lp_of(t, 0, e));
      s->copy->ops->compute_mark(s->copy, 1);
      prc = zt__off_pend_pump(t);
      if (!early) rc = prefetch_from(s, u, 1);
    }
    if (e) unit_put(t, 0, 0);
    if (p) unit_put(t, u, 0);
    if (rc < 0) return stream_fail(t, rc, err, errlen);
    if (prc < 0) {
      zt__off_pend_fail(t, prc, t->step + 1, err, errlen);
      return prc;
    }
  }
  return 0;
}

/* The backward of the n micro-batches whose activations are acts, each unit's of them all
 * adding into its gradient buffer in their order (n > 1: unit-major, no head reading the
 * embedding). first: they begin with the first counted micro-batch of the step, whose gradient
 * buffers start at zero; later ones continue the host's running sum. last: they end with the
 * last counted one. With the sums on the device (dsum, zeroed by the step) every walk resumes
 * them and only the last writes them back. */
static int walk_backward(zt_trainer *t, zt_acts *const *acts, int n, int first, int last,
                         overlap *ov, char *err, size_t errlen) {
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
      for (int j = 0; j < n; j++)
        zt_model_unit_backward_dt(t->model, acts[j], u, p, lp_of(t, u, p), g, e, lp_of(t, 0, e),
                                  eg);
      s->copy->ops->compute_mark(s->copy, 1);
    }
    /* a failed step's gradients are dropped, not written back */
    unsigned rflags = rc == 0 ? dirty : 0;
    /* delayed: the first write-back replaces the gradients the pending update reads */
    int prc = 0;
    if (rflags && first_to_host && s->pend && u >= s->ng &&
        (prc = zt__off_pend_wait_unit(t, u)) < 0)
      rflags = 0;
    /* the ring: the write-back of unit u (unit 0's too, held since the head) goes to the slot
     * whose previous user, ring units back, may still be read by its AdamW */
    if (s->ring && u >= s->ng && u + s->ring < s->nu) zt_opt_store_wait(s->opt, u + s->ring);
    if (p) unit_put(t, u, rflags);
    if (s->embed_grads && (companion_of_head || rc < 0)) {
      unit_put(t, 0, rflags);
      s->embed_grads = NULL;
    }
    if (rc < 0) return stream_fail(t, rc, err, errlen);
    if (prc < 0) {
      zt__off_pend_fail(t, prc, t->step + 1, err, errlen);
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

/* Held-out evaluation's forward of the micro-batch staged in t->acts: the units streamed as the
 * step's forward streams them, the loss made while the head is held (llama's reads its
 * weights). The last step's updates have landed (zt__off_eval). */
static int eval_walk(void *ctx, int counted, char *err, size_t errlen) {
  zt_trainer *t = ctx;
  off_state *s = t->path_state;
  (void)counted; /* walked only when it counts */
  for (int u = 0; u < s->nu; u++) {
    void *p = NULL, *e = NULL;
    int rc = unit_get(t, u, 0, &p, NULL);
    if (rc == 0 && u == s->head && (rc = unit_get(t, 0, 0, &e, NULL)) < 0) {
      unit_put(t, u, 0);
      p = NULL;
    }
    if (rc == 0 && (rc = prefetch_from(s, u, 1)) == 0) {
      s->copy->ops->compute_mark(s->copy, 0);
      zt_model_unit_forward_dt(t->model, t->acts, u, p, lp_of(t, u, p), e, lp_of(t, 0, e));
      /* e is NULL unless the head reads the embedding unit */
      if (u == s->nu - 1) zt_model_eval_loss(t->model, t->acts, lp_of(t, u, p), lp_of(t, 0, e));
      s->copy->ops->compute_mark(s->copy, 1);
    }
    if (e) unit_put(t, 0, 0);
    if (p) unit_put(t, u, 0);
    if (rc < 0) {
      snprintf(err, errlen, "evaluation after step %d: %s", t->step, zt_streamer_error(s->st));
      return rc;
    }
  }
  return 0;
}

int zt__off_eval(zt_trainer *t, const zt_batch *b, double *loss_sum, int64_t *counted,
                 char *err, size_t errlen) {
  off_state *s = t->path_state;
  if (s->broken) {
    snprintf(err, errlen, "evaluation after step %d: an earlier step failed after updating "
             "part of the parameters; load a checkpoint to continue", t->step);
    return -EIO;
  }
  /* the parameters of the last step, its update landed (delayed: drained, as a state call
   * drains it) */
  int rc = zt__off_pend_finish(t), lrc = zt__off_land(t);
  if (rc == 0) rc = lrc;
  if (rc < 0) {
    snprintf(err, errlen, "evaluation after step %d: the AdamW update of step %d failed: %s",
             t->step, t->step, zt_opt_store_error(s->opt, rc));
    return rc;
  }
  return zt__step_eval(t, eval_walk, t, t->tc.grad_accum, b, loss_sum, counted, err, errlen);
}

/* ---- the strategy (engine/train/step.h) -------------------------------------------------- */

/* The last step's updates finished before this step's backward writes the gradients they read
 * (or its norm, where nothing was walked). */
static int land(zt_trainer *t, int step, char *err, size_t errlen) {
  int rc = zt__off_land(t);
  if (rc < 0)
    snprintf(err, errlen, "step %d: the AdamW update of step %d failed: %s", step, step - 1,
             zt_opt_store_error(((off_state *)t->path_state)->opt, rc));
  return rc;
}

/* One step of the path: the recipe's hooks' state. */
typedef struct off_step {
  zt_trainer *t;
  char *err;
  size_t errlen;
  zt_adam_hparams hp;
  overlap ov;
  int defer;          /* delayed_update: this step's update of the streamed units runs during the
                         next step */
  uint64_t t0;
} off_step;

static int off_begin(void *ctx, zt__step_walk *w) {
  off_step *x = ctx;
  zt_trainer *t = x->t;
  off_state *s = t->path_state;
  const zt_ops *o = t->be.ops;
  const zt_train_cfg *c = &t->tc;
  size_t n = zt_model_num_params(t->model);
  int rc;
  x->t0 = zt_now_ns();
  x->hp = (zt_adam_hparams){.lr = w->a->lr, .beta1 = c->beta1, .beta2 = c->beta2, .eps = c->eps,
                            .weight_decay = c->weight_decay, .step = w->a->adam_step,
                            .grad_scale = 1.0f, .seed = c->seed};
  w->deferred = x->defer = s->delayed && w->a->step > 1;
  memset(s->updated, 0, (size_t)s->nu);
  /* the device-resident units accumulate every micro-batch in place, as without offload; so do
   * the streamed ones with dsum, once the last step's write-backs of their sums have landed */
  if (s->ng) o->zero(t->be.ctx, s->d_grad, s->ng_floats * sizeof(float));
  if (s->dsum && (rc = zt_streamer_wait_grads(s->st, -1)) < 0) {
    snprintf(x->err, x->errlen, "offload step %d: %s", w->a->step, zt_streamer_error(s->st));
    return rc;
  }
  if (s->dsum) o->zero(t->be.ctx, s->d_sum, (n - s->ng_floats) * sizeof(float));
  x->ov = (overlap){.on = 0, .hp = &x->hp, .bad_unit = -1};
  w->unit_major = s->unit_major;
  return 0;
}

static int off_forward(void *ctx, const zt__step_walk *w, const zt__step_micro *mb) {
  off_step *x = ctx;
  (void)w;
  (void)mb;
  return walk_forward(x->t, &x->t->acts, 1, x->err, x->errlen);
}

/* the loss's compute, timed as the walks' is */
static void off_compute(void *ctx, int end) {
  off_state *s = ((off_step *)ctx)->t->path_state;
  s->copy->ops->compute_mark(s->copy, end);
}

static int off_backward(void *ctx, const zt__step_walk *w, const zt__step_micro *mb) {
  off_step *x = ctx;
  /* the last counted micro-batch's backward updates the units as it goes, where it may */
  int rc = land(x->t, w->a->step, x->err, x->errlen);
  if (rc < 0) return rc;
  x->ov.on = w->overlap && mb->last;
  return walk_backward(x->t, &x->t->acts, 1, mb->first, mb->last, &x->ov, x->err, x->errlen);
}

/* ---- unit-major (offload.order unit) ---------------------------------------------------- */

static zt_acts *off_acts(void *ctx, int k) {
  return ((off_state *)((off_step *)ctx)->t->path_state)->macts[k];
}

static int off_forward_all(void *ctx, const zt__step_walk *w, const zt__step_micro *mbs, int n) {
  off_step *x = ctx;
  off_state *s = x->t->path_state;
  zt_acts *acts[ZT_UNIT_MAJOR_MICROS_MAX];
  (void)w;
  for (int j = 0; j < n; j++) acts[j] = s->macts[mbs[j].k];
  return walk_forward(x->t, acts, n, x->err, x->errlen);
}

/* Unit-major, or micro-major after the unit-major forward where the head reads the embedding
 * (zt_offload_backward_unit_major). */
static int off_backward_all(void *ctx, const zt__step_walk *w, const zt__step_micro *mbs,
                            int n) {
  off_step *x = ctx;
  off_state *s = x->t->path_state;
  zt_acts *acts[ZT_UNIT_MAJOR_MICROS_MAX];
  int rc = land(x->t, w->a->step, x->err, x->errlen);
  if (rc < 0) return rc;
  for (int j = 0; j < n; j++) acts[j] = s->macts[mbs[j].k];
  if (s->um_back) {
    x->ov.on = w->overlap && mbs[n - 1].last;
    return walk_backward(x->t, acts, n, mbs[0].first, mbs[n - 1].last, &x->ov, x->err,
                         x->errlen);
  }
  for (int j = 0; j < n && rc == 0; j++) {
    x->ov.on = w->overlap && mbs[j].last;
    rc = walk_backward(x->t, &acts[j], 1, mbs[j].first, mbs[j].last, &x->ov, x->err,
                       x->errlen);
  }
  return rc;
}

static int off_norm(void *ctx, const zt__step_walk *w, zt__step_norm *nm) {
  off_step *x = ctx;
  zt_trainer *t = x->t;
  off_state *s = t->path_state;
  const zt_ops *o = t->be.ops;
  size_t n = zt_model_num_params(t->model);
  int counted_micros = nm->micros, rc;
  if ((rc = land(t, w->a->step, x->err, x->errlen)) < 0) return rc;
  if ((rc = zt_streamer_wait_grads(s->st, -1)) < 0) {
    snprintf(x->err, x->errlen, "offload step %d: %s", w->a->step, zt_streamer_error(s->st));
    return rc;
  }
  /* the previous step's update lands before this one's verdict, whatever it is (and before
   * a step without a counted micro-batch zeroes the gradients it reads) */
  if ((rc = zt__off_pend_finish(t)) < 0) {
    zt__off_pend_fail(t, rc, w->a->step, x->err, x->errlen);
    return rc;
  }
  /* nothing counted: the gradients of an all-on-device step are the zeros it started from (with
   * the ring, nothing reads the slots until these updates, which read them all) */
  if (!counted_micros && s->grads) memset(s->grads, 0, (n - s->lo) * sizeof(float));
  for (int i = 0; !counted_micros && i < s->ring; i++)
    memset(s->slot[i], 0, s->ring_floats * sizeof(float));
  int nonfinite = 0;
  if (!s->ring && !s->own_hbe && (s->d_alias || !s->ng)) {
    /* the CPU backend: the norm of the run without offload, over the same flat buffer */
    nm->sumsq = s->hbe.ops->sum_squares(s->hbe.ctx, s->grads, n, &nonfinite);
  } else {
    /* beside a GPU or with the ring: the device units' sum there, the streamed units' from the
     * overlap's per-unit sums when it reached them all (each gradient read once on the host);
     * the ring's are all in them unless a unit was not finite, or zeros */
    int dev_nonfinite = 0;
    double dev = s->ng ? o->sum_squares(t->be.ctx, s->d_grad, s->ng_floats, &dev_nonfinite) : 0;
    double host = s->ring || (x->ov.summed == s->nu - s->ng && counted_micros)
                      ? (counted_micros ? x->ov.sumsq : 0)
                      : s->hbe.ops->sum_squares(s->hbe.ctx, s->grads + (s->ng_floats - s->lo),
                                                n - s->ng_floats, &nonfinite);
    nm->sumsq = dev + host;
    nonfinite |= dev_nonfinite || x->ov.bad_unit >= 0;
  }
  nm->nonfinite = nonfinite;
  nm->updated = x->ov.updated;
  return 0;
}

/* fp16's skip: the work queued so far finished; a refusal: the updates the overlap started */
static int off_nonfinite(void *ctx, const zt__step_walk *w, const zt__step_norm *n) {
  off_step *x = ctx;
  zt_trainer *t = x->t;
  const zt_ops *o = t->be.ops;
  int rc;
  (void)n;
  if (!w->a->fp16) {
    zt_opt_store_finish(((off_state *)t->path_state)->opt);
    return 0;
  }
  if ((rc = o->sync(t->be.ctx)) < 0)
    snprintf(x->err, x->errlen, "backend %s failed during step %d: %s", o->name, w->a->step,
             o->error_text(t->be.ctx));
  return rc;
}

/* The units the overlap updated before the one not finite stay updated: the trainer refuses
 * further steps until a checkpoint is loaded. */
static int off_broken(void *ctx, const zt__step_walk *w, const zt__step_out *out) {
  off_step *x = ctx;
  off_state *s = x->t->path_state;
  s->broken = 1;
  snprintf(x->err, x->errlen, "step %d: the gradient of unit %s has inf or nan values (loss %g); "
           "%d unit(s) after it in the backward were updated already", w->a->step,
           zt_model_unit(x->t->model, x->ov.bad_unit >= 0 ? x->ov.bad_unit : 0)->name, out->loss,
           x->ov.updated);
  return -ERANGE;
}

static int off_update(void *ctx, const zt__step_walk *w, float grad_scale) {
  off_step *x = ctx;
  zt_trainer *t = x->t;
  off_state *s = t->path_state;
  const zt_ops *o = t->be.ops;
  int rc = 0, step = w->a->step;
  /* the device units' too */
  x->hp.grad_scale = grad_scale;
  /* Without NVMe units or the delay, the streamed units' updates are left running when the step
   * returns: each lands behind the next step's forward of it (zt__off_land), so they start in
   * the forward's order, the device units' after them (on the runner, done by then). NVMe
   * units' follow the store's read-ahead, in the backward's order, and are waited for. */
  int landing = !x->defer && !s->delayed && s->nh == s->nu;
  /* the units the overlap did not reach (all of them with clipping or without a counted
   * micro-batch); deferred: the device units alone */
  for (int i = 0; i < s->nu && rc == 0; i++) {
    int u = !landing ? s->nu - 1 - i : i + s->ng < s->nu ? i + s->ng : i + s->ng - s->nu;
    if ((x->defer && u >= s->ng) || s->updated[u]) continue;
    s->updated[u] = 1;
    rc = zt__off_update_unit(t, u, &x->hp);
  }
  int frc = landing && rc == 0 ? 0 : zt_opt_store_finish(s->opt);
  if (rc == 0) rc = frc;
  s->landing = landing && rc == 0;
  /* delayed, not deferred (step 1): the update wrote the next buffers */
  if (rc == 0 && s->delayed && !x->defer) zt__off_swap_copies(t);
  if (rc < 0) {
    s->broken = 1;
    snprintf(x->err, x->errlen, "step %d: the AdamW update failed: %s", step,
             zt_opt_store_error(s->opt, rc));
    return rc;
  }
  /* the masters changed: every device copy is stale */
  if ((rc = zt_streamer_invalidate(s->st, -1)) < 0) {
    snprintf(x->err, x->errlen, "offload step %d: %s", step, zt_streamer_error(s->st));
    return rc;
  }
  if ((rc = o->sync(t->be.ctx)) < 0) {
    snprintf(x->err, x->errlen, "backend %s failed during step %d: %s", o->name, step,
             o->error_text(t->be.ctx));
    return rc;
  }
  if (x->defer && (rc = zt__off_pend_start(t, &x->hp, step)) < 0) {
    s->broken = 1;
    zt__off_pend_fail(t, rc, step, x->err, x->errlen);
  }
  return rc;
}

static int off_end(void *ctx, const zt__step_walk *w, int rc) {
  off_step *x = ctx;
  off_state *s = x->t->path_state;
  (void)w;
  if (rc == 0) {
    s->step_ns += zt_now_ns() - x->t0;
    return 0;
  }
  /* a pending update of the step before lands (a failure of it breaks the state) */
  if (zt__off_pend_finish(x->t) < 0) s->broken = 1;
  zt__off_land(x->t);
  zt_opt_store_finish(s->opt);
  /* updates that overlapped the backward stay: the state is no step's */
  for (int u = 0; u < s->nu; u++) s->broken |= s->updated[u];
  zt_streamer_invalidate(s->st, -1);
  return rc;
}

static const zt__step_hooks off_hooks = {
    .begin = off_begin, .forward = off_forward, .compute = off_compute,
    .backward = off_backward, .acts = off_acts, .forward_all = off_forward_all,
    .backward_all = off_backward_all, .norm = off_norm, .nonfinite = off_nonfinite,
    .broken = off_broken, .update = off_update, .end = off_end};

int zt__off_step(zt_trainer *t, const zt_batch *tokens, zt_step_result *res, char *err,
                 size_t errlen) {
  off_state *s = t->path_state;
  if (s->broken) {
    snprintf(err, errlen, "step %d: an earlier step failed after updating part of the "
             "parameters; load a checkpoint to continue", t->step + 1);
    return -EIO;
  }
  off_step x = {.t = t, .err = err, .errlen = errlen};
  return zt__step(t, &off_hooks, &x, 1, tokens, res, err, errlen);
}
