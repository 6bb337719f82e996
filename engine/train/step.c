/* The optimizer step's recipe (engine/train/step.h), which the plain, the offloaded and the
 * data-parallel strategies drive: gradient accumulation over micro-batches, the global gradient
 * norm and clipping (as torch.nn.utils.clip_grad_norm_), fp16's dynamic loss scale (GradScaler's
 * skip), the update, the result. */
#include "engine/train/step.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>

#include "engine/train/trainer_internal.h"

/* Every token of the step's `micros` micro-batches is checked before any work, so a bad batch
 * leaves the trainer as it was. -1 is padding: never a target; as an input it reads embedding
 * row 0. */
static int check_tokens(const zt_trainer *t, const int32_t *tok, int micros, char *err,
                        size_t errlen) {
  int T = zt_model_cfg_of(t->model)->seq_len, V = zt_model_cfg_of(t->model)->vocab;
  size_t rows = (size_t)micros * (size_t)t->tc.micro_batch;
  for (size_t r = 0; r < rows; r++)
    for (int j = 0; j <= T; j++) {
      int32_t x = tok[r * (size_t)(T + 1) + (size_t)j];
      if (x < -1 || x >= V) {
        snprintf(err, errlen, "micro-batch %zu row %zu position %d: token %d is outside [0, %d) "
                 "(-1 marks padding)", r / (size_t)t->tc.micro_batch,
                 r % (size_t)t->tc.micro_batch, j, x, V);
        return -EINVAL;
      }
    }
  return 0;
}

/* Stages micro-batch k of the step's tokens into the acts; returns the tokens counted as
 * targets (0: a micro-batch of padding alone, nothing staged). */
static int stage_micro(zt_trainer *t, const int32_t *tokens, int k) {
  const zt_ops *o = t->be.ops;
  int T = zt_model_cfg_of(t->model)->seq_len, B = t->tc.micro_batch, N = B * T;
  const int32_t *mb = tokens + (size_t)k * zt_trainer_micro_tokens(t);
  int counted = 0;
  for (int b = 0; b < B; b++)
    for (int j = 0; j < T; j++) {
      int32_t x = mb[(size_t)b * (T + 1) + j], y = mb[(size_t)b * (T + 1) + j + 1];
      t->h_tok[b * T + j] = x < 0 ? 0 : x;
      t->h_tgt[b * T + j] = y;
      counted += y >= 0;
    }
  if (!counted) return 0;
  o->to_device(t->be.ctx, zt_acts_tokens(t->acts), t->h_tok, (size_t)N * sizeof(int32_t));
  o->to_device(t->be.ctx, zt_acts_targets(t->acts), t->h_tgt, (size_t)N * sizeof(int32_t));
  /* RoPE's positions: 0..T-1 in every row. to_device has read its host buffer when it returns
   * (as the next micro-batch's staging relies on), so h_tok stages them too. */
  int32_t *pos = zt_acts_positions(t->acts);
  if (pos) {
    for (int b = 0; b < B; b++)
      for (int j = 0; j < T; j++) t->h_tok[b * T + j] = j;
    o->to_device(t->be.ctx, pos, t->h_tok, (size_t)N * sizeof(int32_t));
  }
  return counted;
}

/* The last of micro-batches micro0 .. micro0 + grad_accum - 1 with a counted target, as an
 * index from micro0; -1 none. */
static int last_counted_micro(const zt_trainer *t, const int32_t *tokens, int micro0) {
  int T = zt_model_cfg_of(t->model)->seq_len, last = -1;
  size_t mt = zt_trainer_micro_tokens(t);
  tokens += (size_t)micro0 * mt;
  for (int k = 0; k < t->tc.grad_accum; k++)
    for (int b = 0; b < t->tc.micro_batch && last < k; b++)
      for (int j = 1; j <= T; j++)
        if (tokens[(size_t)k * mt + (size_t)b * (T + 1) + j] >= 0) {
          last = k;
          break;
        }
  return last;
}

/* The loss of the micro-batch staged, its gradient scaled by the loss scale over the step's
 * counted micro-batches (PyTorch's loss / grad_accum, times the fp16 loss scale), after the
 * forward; the model computes it now or (a chunked head) in its head's backward
 * (zt_model_loss). */
static void micro_loss(zt_trainer *v, const zt__step_hooks *h, void *ctx,
                       const zt__step_args *a, int counted) {
  if (h->compute) h->compute(ctx, 0);
  zt_model_loss(v->model, v->acts,
                (float)((double)a->loss_scale / ((double)counted * a->world * v->tc.grad_accum)));
  if (h->compute) h->compute(ctx, 1);
}

/* After the backward: the mean over the micro-batch's counted tokens. */
static double micro_loss_value(zt_trainer *v) {
  double loss_sum = 0;
  int n_counted = 0;
  zt_acts_loss(v->acts, &loss_sum, &n_counted);
  return loss_sum / n_counted;
}

/* After the backward: the verdict on the norm (fp16's skip, a refusal, a broken state) or the
 * clip coefficient and the update. */
static int finish(zt_trainer *v, const zt__step_hooks *h, void *ctx, const zt__step_walk *w,
                  const zt__step_norm *n, zt__step_out *out) {
  const zt__step_args *a = w->a;
  int rc;
  out->loss = n->micros ? n->loss / n->micros : 0.0;
  /* the norm of the unscaled gradients: loss_scale is a power of two, so dividing the norm is
   * unscaling every value first */
  out->norm = sqrt(n->sumsq) / a->loss_scale;
  out->flags = n->flags;
  if (n->nonfinite) {
    if (h->nonfinite && (rc = h->nonfinite(ctx, w, n)) < 0) return rc;
    /* GradScaler: optimizer.step() is skipped (nothing was updated: fp16 never overlaps),
     * AdamW's step count stays, the scale backs off; the iteration still counts */
    if (a->fp16) {
      out->skipped = 1;
      return 0;
    }
    if (n->updated) return h->broken(ctx, w, out);
    out->refused = 1;
    return -ERANGE;
  }
  float scale = 1.0f;
  if (v->tc.grad_clip > 0) {
    double coef = v->tc.grad_clip / (out->norm + 1e-6);
    if (coef < 1.0) scale = (float)coef;
  }
  /* AdamW sees g * scale / loss_scale: the unscaled, clipped gradient */
  if (a->fp16) scale = (float)((double)scale / a->loss_scale);
  return h->update(ctx, w, scale);
}

/* The unit-major walk of a rank's micro-batches: each staged into its own activations, walked
 * through the units together; each one's loss as the micro-major walk makes it. v->acts is each
 * micro-batch's in turn where the recipe reads it, and the first's after. */
static int walk_unit_major(zt_trainer *v, const zt__step_hooks *h, void *ctx, zt__step_walk *w,
                           int micro0, int last, zt__step_norm *n) {
  const zt__step_args *a = w->a;
  int G = v->tc.grad_accum, walked = 0, counted = 0, rc = 0;
  zt__step_micro mbs[ZT_UNIT_MAJOR_MICROS_MAX];
  zt_acts *a0 = v->acts;
  for (int k = 0; k < G; k++) {
    v->acts = h->acts(ctx, k);
    zt__step_micro mb = {.k = k, .counted = stage_micro(v, a->tokens, micro0 + k),
                         .first = counted == 0, .last = k == last};
    counted += mb.counted > 0;
    if (mb.counted || h->walk_padding) mbs[walked++] = mb;
  }
  if (walked && (rc = h->forward_all(ctx, w, mbs, walked)) == 0) {
    for (int j = 0; j < walked; j++)
      if (mbs[j].counted) {
        v->acts = h->acts(ctx, mbs[j].k);
        micro_loss(v, h, ctx, a, mbs[j].counted);
      }
    rc = h->backward_all(ctx, w, mbs, walked);
  }
  for (int j = 0; rc == 0 && j < walked; j++)
    if (mbs[j].counted) {
      v->acts = h->acts(ctx, mbs[j].k);
      mbs[j].loss = micro_loss_value(v);
      if (h->loss && (rc = h->loss(ctx, w, &mbs[j])) < 0) break;
      n->loss += mbs[j].loss;
      n->micros++;
    }
  v->acts = a0;
  return rc;
}

int zt__step_rank(zt_trainer *v, const zt__step_hooks *h, void *ctx, const zt__step_args *a,
                  int rank, zt__step_out *out) {
  int G = v->tc.grad_accum, micro0 = rank * G, last = last_counted_micro(v, a->tokens, micro0);
  zt__step_walk w = {.a = a};
  zt__step_norm n = {0};
  *out = (zt__step_out){0};
  int rc = h->begin ? h->begin(ctx, &w) : 0;
  w.overlap = v->tc.grad_clip == 0 && !a->fp16 && !w.deferred;
  if (rc == 0 && w.unit_major) rc = walk_unit_major(v, h, ctx, &w, micro0, last, &n);
  for (int k = 0; rc == 0 && !w.unit_major && k < G; k++) {
    zt__step_micro mb = {.k = k, .counted = stage_micro(v, a->tokens, micro0 + k),
                         .first = n.micros == 0, .last = k == last};
    /* a micro-batch of padding alone has no loss and contributes no gradient */
    if (!mb.counted && !h->walk_padding) continue;
    if ((rc = h->forward(ctx, &w, &mb)) < 0) break;
    if (mb.counted) micro_loss(v, h, ctx, a, mb.counted);
    if ((rc = h->backward(ctx, &w, &mb)) < 0) break;
    if (mb.counted) {
      mb.loss = micro_loss_value(v);
      if (h->loss && (rc = h->loss(ctx, &w, &mb)) < 0) break;
      n.loss += mb.loss;
      n.micros++;
    }
  }
  if (rc == 0 && (rc = h->norm(ctx, &w, &n)) == 0) rc = finish(v, h, ctx, &w, &n, out);
  return h->end ? h->end(ctx, &w, rc) : rc;
}

int zt__step(zt_trainer *t, const zt__step_hooks *h, void *ctx, int world, const int32_t *tokens,
             zt_step_result *res, char *err, size_t errlen) {
  const zt_train_cfg *c = &t->tc;
  int rc = check_tokens(t, tokens, world * c->grad_accum, err, errlen);
  if (rc < 0) return rc;
  int fp16 = c->precision == ZT_F16, step = t->step + 1;
  zt__step_args a = {.tokens = tokens, .step = step, .adam_step = t->adam_step + 1,
                     .lr = zt_train_lr(c, step), .loss_scale = fp16 ? t->scaler.scale : 1.0f,
                     .fp16 = fp16, .world = world};
  zt__step_out o;
  rc = h->run ? h->run(ctx, &a, &o, err, errlen) : zt__step_rank(t, h, ctx, &a, 0, &o);
  int N = c->micro_batch * zt_model_cfg_of(t->model)->seq_len;
  zt_step_result r = {.step = step, .loss = o.loss, .grad_norm = o.norm, .lr = a.lr,
                      .tokens = (int64_t)N * world * c->grad_accum, .skipped = o.skipped,
                      .loss_scale = 1.0f, .flags = o.flags};
  if (rc == -ERANGE && o.refused) {
    snprintf(err, errlen, "step %d: the gradient has inf or nan values (loss %g); parameters "
             "left unchanged", step, o.loss);
    r.skipped = 1;
    if (res) *res = r;
    return rc;
  }
  if (rc < 0) return rc;
  /* fp16: every rank saw the same overflow verdict, so the scalers agree; a skipped step counts,
   * AdamW's does not */
  if (fp16) zt_loss_scaler_update(&t->scaler, o.skipped);
  t->step = step;
  if (!o.skipped) t->adam_step = a.adam_step;
  r.loss_scale = fp16 ? t->scaler.scale : 1.0f;
  if (res) *res = r;
  return 0;
}
