/* The optimizer step's recipe (engine/train/step.h), which the plain, the offloaded and the
 * data-parallel strategies drive: gradient accumulation over micro-batches, the global gradient
 * norm and clipping (as torch.nn.utils.clip_grad_norm_), fp16's dynamic loss scale (GradScaler's
 * skip), the update, the result. */
#include "engine/train/step.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>

#include "engine/train/trainer_internal.h"

/* Slot j of row b of micro-batch m: its input, its target (-1: not counted) and its
 * document-local position, from either of zt_batch's forms. */
typedef struct slot {
  int32_t x, y, pos;
} slot;

static slot slot_of(const zt_trainer *t, const zt_batch *bt, size_t m, int b, int j) {
  int T = zt_model_cfg_of(t->model)->seq_len;
  if (bt->tokens) {
    const int32_t *row = bt->tokens + (m * (size_t)t->tc.micro_batch + (size_t)b) * (size_t)(T + 1);
    return (slot){row[j], row[j + 1], j};
  }
  size_t i = (m * (size_t)t->tc.micro_batch + (size_t)b) * (size_t)T + (size_t)j;
  return (slot){bt->inputs[i], bt->targets[i], bt->positions[i]};
}

/* Every token of the step's `micros` micro-batches is checked before any work, so a bad batch
 * leaves the trainer as it was. -1 is padding: never a target; as an input it reads embedding
 * row 0. */
static int check_tokens(const zt_trainer *t, const zt_batch *bt, int micros, char *err,
                        size_t errlen) {
  int T = zt_model_cfg_of(t->model)->seq_len, V = zt_model_cfg_of(t->model)->vocab;
  int B = t->tc.micro_batch;
  if (bt->tokens) {
    size_t rows = (size_t)micros * (size_t)B;
    for (size_t r = 0; r < rows; r++)
      for (int j = 0; j <= T; j++) {
        int32_t x = bt->tokens[r * (size_t)(T + 1) + (size_t)j];
        if (x < -1 || x >= V) {
          snprintf(err, errlen, "micro-batch %zu row %zu position %d: token %d is outside [0, "
                   "%d) (-1 marks padding)", r / (size_t)B, r % (size_t)B, j, x, V);
          return -EINVAL;
        }
      }
    return 0;
  }
  for (size_t m = 0; m < (size_t)micros; m++)
    for (int b = 0; b < B; b++)
      for (int j = 0, prev = -1; j < T; j++) {
        slot s = slot_of(t, bt, m, b, j);
        const char *what = s.x < -1 || s.x >= V ? "input" : s.y < -1 || s.y >= V ? "target" : NULL;
        if (what) {
          snprintf(err, errlen, "micro-batch %zu row %d index %d: %s %d is outside [0, %d) (-1 "
                   "marks padding)", m, b, j, what, what[0] == 'i' ? s.x : s.y, V);
          return -EINVAL;
        }
        if (s.pos != 0 && (j == 0 || s.pos != prev + 1)) {
          snprintf(err, errlen, "micro-batch %zu row %d index %d: position %d is neither 0 (a "
                   "document's start) nor the previous position plus 1", m, b, j, s.pos);
          return -EINVAL;
        }
        prev = s.pos;
      }
  return 0;
}

/* Stages micro-batch k of the step's batch into the acts; returns the tokens counted as
 * targets (0: a micro-batch of padding alone, nothing staged). */
static int stage_micro(zt_trainer *t, const zt_batch *bt, int k) {
  const zt_ops *o = t->be.ops;
  int T = zt_model_cfg_of(t->model)->seq_len, B = t->tc.micro_batch, N = B * T;
  int counted = 0;
  for (int b = 0; b < B; b++)
    for (int j = 0; j < T; j++) {
      slot s = slot_of(t, bt, (size_t)k, b, j);
      t->h_tok[b * T + j] = s.x < 0 ? 0 : s.x;
      t->h_tgt[b * T + j] = s.y;
      counted += s.y >= 0;
    }
  if (!counted) return 0;
  o->to_device(t->be.ctx, zt_acts_tokens(t->acts), t->h_tok, (size_t)N * sizeof(int32_t));
  o->to_device(t->be.ctx, zt_acts_targets(t->acts), t->h_tgt, (size_t)N * sizeof(int32_t));
  /* The positions (0..T-1 in every row of the tokens form). to_device has read its host buffer
   * when it returns (as the next micro-batch's staging relies on), so h_tok stages them too. */
  int32_t *pos = zt_acts_positions(t->acts);
  if (pos) {
    for (int b = 0; b < B; b++)
      for (int j = 0; j < T; j++) t->h_tok[b * T + j] = slot_of(t, bt, (size_t)k, b, j).pos;
    o->to_device(t->be.ctx, pos, t->h_tok, (size_t)N * sizeof(int32_t));
  }
  return counted;
}

/* The counted targets of micro-batches micro0 .. micro0 + grad_accum - 1; *last: the last of
 * them with one, as an index from micro0 (-1 none). */
static double rank_counted(const zt_trainer *t, const zt_batch *bt, int micro0, int *last) {
  int T = zt_model_cfg_of(t->model)->seq_len;
  double counted = 0;
  *last = -1;
  for (int k = 0; k < t->tc.grad_accum; k++)
    for (int b = 0; b < t->tc.micro_batch; b++)
      for (int j = 0; j < T; j++)
        if (slot_of(t, bt, (size_t)(micro0 + k), b, j).y >= 0) {
          *last = k;
          counted++;
        }
  return counted;
}

/* The loss of the micro-batch staged, its gradient scaled by the loss scale over the step's
 * counted targets, every micro-batch's of every rank (transformers' Trainer since 4.46: the
 * sum over the step's targets divided by their number, times the fp16 loss scale), after the
 * forward; the model computes it now or (a chunked head) in its head's backward
 * (zt_model_loss). Every per-micro-batch gradient scale is made here. */
static void micro_loss(zt_trainer *v, const zt__step_hooks *h, void *ctx,
                       const zt__step_walk *w) {
  if (h->compute) h->compute(ctx, 0);
  zt_model_loss(v->model, v->acts, (float)((double)w->a->loss_scale / w->counted));
  if (h->compute) h->compute(ctx, 1);
}

/* After the backward: the sum over the micro-batch's counted tokens (their count: mb->counted). */
static double micro_loss_sum(zt_trainer *v) {
  double loss_sum = 0;
  int n_counted = 0;
  zt_acts_loss(v->acts, &loss_sum, &n_counted);
  return loss_sum;
}

void zt__step_norm_add(zt__step_norm *n, double loss_sum, double counted) {
  /* the mean as each micro-batch's loss was made before the step's normaliser */
  n->loss += loss_sum / counted;
  n->loss_sum += loss_sum;
  if (n->micros && counted != n->micro_counted) n->unequal = 1;
  n->micro_counted = counted;
  n->micros++;
}

/* After the backward: the verdict on the norm (fp16's skip, a refusal, a broken state) or the
 * clip coefficient and the update. */
static int finish(zt_trainer *v, const zt__step_hooks *h, void *ctx, const zt__step_walk *w,
                  const zt__step_norm *n, zt__step_out *out) {
  const zt__step_args *a = w->a;
  int rc;
  /* Micro-batches of one count: the mean of their means is the mean over their targets, and
   * keeps the bits of the steps before the normaliser counted targets */
  out->loss = !n->micros ? 0.0 : n->unequal ? n->loss_sum / w->counted : n->loss / n->micros;
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
    zt__step_micro mb = {.k = k, .counted = stage_micro(v, a->batch, micro0 + k),
                         .first = counted == 0, .last = k == last};
    counted += mb.counted > 0;
    if (mb.counted || h->walk_padding) mbs[walked++] = mb;
  }
  if (walked && (rc = h->forward_all(ctx, w, mbs, walked)) == 0) {
    for (int j = 0; j < walked; j++)
      if (mbs[j].counted) {
        v->acts = h->acts(ctx, mbs[j].k);
        micro_loss(v, h, ctx, w);
      }
    rc = h->backward_all(ctx, w, mbs, walked);
  }
  for (int j = 0; rc == 0 && j < walked; j++)
    if (mbs[j].counted) {
      v->acts = h->acts(ctx, mbs[j].k);
      mbs[j].loss_sum = micro_loss_sum(v);
      if (h->loss && (rc = h->loss(ctx, w, &mbs[j])) < 0) break;
      zt__step_norm_add(n, mbs[j].loss_sum, mbs[j].counted);
    }
  v->acts = a0;
  return rc;
}

int zt__step_rank(zt_trainer *v, const zt__step_hooks *h, void *ctx, const zt__step_args *a,
                  int rank, zt__step_out *out) {
  int G = v->tc.grad_accum, micro0 = rank * G, last;
  zt__step_walk w = {.a = a, .counted = rank_counted(v, a->batch, micro0, &last)};
  zt__step_norm n = {0};
  *out = (zt__step_out){0};
  int rc = h->begin ? h->begin(ctx, &w) : 0;
  if (rc == 0 && h->count) rc = h->count(ctx, &w);
  w.overlap = v->tc.grad_clip == 0 && !a->fp16 && !w.deferred;
  if (rc == 0 && w.unit_major) rc = walk_unit_major(v, h, ctx, &w, micro0, last, &n);
  for (int k = 0; rc == 0 && !w.unit_major && k < G; k++) {
    zt__step_micro mb = {.k = k, .counted = stage_micro(v, a->batch, micro0 + k),
                         .first = n.micros == 0, .last = k == last};
    /* a micro-batch of padding alone has no loss and contributes no gradient */
    if (!mb.counted && !h->walk_padding) continue;
    if ((rc = h->forward(ctx, &w, &mb)) < 0) break;
    if (mb.counted) micro_loss(v, h, ctx, &w);
    if ((rc = h->backward(ctx, &w, &mb)) < 0) break;
    if (mb.counted) {
      mb.loss_sum = micro_loss_sum(v);
      if (h->loss && (rc = h->loss(ctx, &w, &mb)) < 0) break;
      zt__step_norm_add(&n, mb.loss_sum, mb.counted);
    }
  }
  if (rc == 0 && (rc = h->norm(ctx, &w, &n)) == 0) rc = finish(v, h, ctx, &w, &n, out);
  return h->end ? h->end(ctx, &w, rc) : rc;
}

int zt__step_check(const zt_trainer *t, const zt_batch *batch, int micros, char *err,
                   size_t errlen) {
  return check_tokens(t, batch, micros, err, errlen);
}

int zt__step_eval_rank(zt_trainer *view, zt__eval_walk walk, void *ctx, int walk_padding,
                       const zt_batch *batch, int micro0, int n, double *sums, char *err,
                       size_t errlen) {
  const zt_ops *o = view->be.ops;
  for (int k = 0; k < n; k++) {
    int counted = stage_micro(view, batch, micro0 + k), rc;
    sums[2 * k] = sums[2 * k + 1] = 0;
    /* a micro-batch of padding alone has no loss */
    if (!counted && !walk_padding) continue;
    if ((rc = walk(ctx, counted, err, errlen)) < 0) return rc;
    if (!counted) continue;
    if ((rc = o->sync(view->be.ctx)) < 0) {
      snprintf(err, errlen, "backend %s failed during an evaluation after step %d: %s", o->name,
               view->step, o->error_text(view->be.ctx));
      return rc;
    }
    int c = 0;
    zt_acts_loss(view->acts, &sums[2 * k], &c);
    sums[2 * k + 1] = c;
  }
  return 0;
}

int zt__step_eval(zt_trainer *t, zt__eval_walk walk, void *ctx, int micros, const zt_batch *batch,
                  double *loss_sum, int64_t *counted, char *err, size_t errlen) {
  int rc = check_tokens(t, batch, micros, err, errlen);
  double sum = 0, one[2];
  int64_t n = 0;
  for (int k = 0; rc == 0 && k < micros; k++) {
    if ((rc = zt__step_eval_rank(t, walk, ctx, 0, batch, k, 1, one, err, errlen)) < 0) break;
    sum += one[0];
    n += (int64_t)one[1];
  }
  if (rc < 0) return rc;
  *loss_sum = sum;
  *counted = n;
  return 0;
}

int zt__step(zt_trainer *t, const zt__step_hooks *h, void *ctx, int world, const zt_batch *batch,
             zt_step_result *res, char *err, size_t errlen) {
  const zt_train_cfg *c = &t->tc;
  int rc = check_tokens(t, batch, world * c->grad_accum, err, errlen);
  if (rc < 0) return rc;
  int fp16 = c->precision == ZT_F16, step = t->step + 1;
  zt__step_args a = {.batch = batch, .step = step, .adam_step = t->adam_step + 1,
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
