/* defines: the optimizer step's recipe, written once (zt__step: the tokens checked, the learning
 * rate and AdamW's step, the fp16 loss scale; zt__step_rank, a rank's walk: the micro-batch loop
 * with the loss, the global norm and the non-finite check, fp16's skip, clipping, the update;
 * then the scaler, the step counts and the result), the held-out evaluation's walk of a batch
 * (zt__step_eval), and the placement strategies' hooks it
 * drives (zt__step_hooks).
 * called by: trainer.c (the plain strategy: every buffer on the backend),
 * engine/train/offload/step.c (the single-rank offloaded walk), engine/train/dp/step.c (the
 * data-parallel walk: zt__step_rank on every rank's thread, each rank's hooks exchanging the
 * scalars in their norm; zt__step once on the trainer's thread around them).
 *
 * The recipe's order, which every strategy keeps (the order of every floating-point operation
 * and of every call to the backend, the copy engine and the communicator is the strategy's
 * own within each hook): begin; count; per micro-batch k of the rank: stage its tokens,
 * forward, the loss (scaled by loss_scale / the step's counted targets, every rank's), backward
 * (unit-major: every micro-batch staged, one forward of them all, each one's loss, one backward,
 * each one's loss value: the same math per unit and micro-batch, in another order between
 * units); norm; then either a
 * non-finite gradient (fp16: skipped; else refused, or broken where units were updated during
 * the backward) or the clip coefficient and the update; end, whatever happened. Data
 * parallelism runs the walk per rank rather than gathering its ranks into one walk: each rank's
 * thread then issues its calls as one sequence, with no barrier between hooks, and the exchange
 * in its norm hook gives every rank the same verdict. */
#ifndef ZT_TRAIN_STEP_H
#define ZT_TRAIN_STEP_H

#include <stddef.h>
#include <stdint.h>

#include "engine/train/trainer.h"

/* The step as the recipe sets it, the same on every rank. */
typedef struct zt__step_args {
  const zt_batch *batch;  /* the step's world * grad_accum micro-batches; rank r's micro-batch k
                             is r * grad_accum + k */
  int step, adam_step;    /* this step's number and AdamW's t if it updates */
  float lr;
  float loss_scale;       /* fp16: the scaler's scale; 1 otherwise (which changes no bit) */
  int fp16;
  int world;              /* ranks taking part: 1 but with data parallelism */
} zt__step_args;

/* One walk (a rank's) as its hooks see it. */
typedef struct zt__step_walk {
  const zt__step_args *a;
  int deferred;           /* set by begin: this step's update runs later (the delayed update) */
  int overlap;            /* the units' updates may start during the backward: no clipping (it
                             needs the norm first), not fp16 (the overflow verdict first), not
                             deferred */
  int unit_major;         /* set by begin: the micro-batches are staged first, each into the
                             activations h->acts gives, and walked together (forward_all,
                             backward_all) */
  double counted;         /* the step's counted targets: the rank's, then (count) the world's */
} zt__step_walk;

/* A micro-batch of the walk. */
typedef struct zt__step_micro {
  int k;                  /* the rank's, 0 .. grad_accum - 1 */
  int counted;            /* its counted targets; 0: padding alone, nothing staged (walked only
                             with walk_padding, computing nothing) */
  int first, last;        /* the rank's first counted micro-batch of the step, its last */
  double loss_sum;        /* counted: its loss summed over its targets, known after the backward
                             (the loss hook) */
} zt__step_micro;

/* What norm reports once the backward is done. */
typedef struct zt__step_norm {
  double sumsq;           /* of the loss-scaled gradients, the whole step's */
  int nonfinite;
  int updated;            /* units were updated during the backward (overlap) */
  /* the micro-batches' mean losses and summed losses added in their order, their count,
   * whether their counted targets differ, as zt__step_norm_add makes them; data parallelism's
   * norm puts the world's (every rank's, in rank order) */
  double loss, loss_sum, micro_counted;
  int micros, unequal;
  unsigned flags;         /* data parallelism: the world's step flags (dp.h); 0 otherwise */
} zt__step_norm;

/* A walk's outcome: the same on every rank. */
typedef struct zt__step_out {
  double loss, norm;      /* the step's mean loss, the norm of the unscaled gradients */
  unsigned flags;
  int skipped;            /* fp16: the gradients overflowed, nothing was updated */
  int refused;            /* -ERANGE: a gradient is not finite and nothing was updated; zt__step
                             makes the message */
} zt__step_out;

/* A strategy: each hook returns 0 or a negative errno with its message made (in the strategy's
 * state, ctx). NULL hooks: nothing to do (forward, backward, norm and update are required, and
 * broken where norm may report units updated). */
typedef struct zt__step_hooks {
  /* NULL: the walk runs here, zt__step_rank(t, ..., ctx). Data parallelism: on every rank's
   * thread at once, each rank's walk with the rank's state as the hooks' ctx (run's own ctx is
   * the trainer's); *out gets rank 0's outcome, err the failure's message */
  int (*run)(void *ctx, const zt__step_args *a, zt__step_out *out, char *err, size_t errlen);
  /* micro-batches of padding alone are walked too (every rank takes part in every collective) */
  int walk_padding;
  /* before the first micro-batch: the gradient buffers made ready; sets w->deferred */
  int (*begin)(void *ctx, zt__step_walk *w);
  /* after begin, with several ranks: w->counted, the rank's, made the world's (the gradient
   * scale of every micro-batch needs it before the first backward) */
  int (*count)(void *ctx, zt__step_walk *w);
  int (*forward)(void *ctx, const zt__step_walk *w, const zt__step_micro *mb);
  /* brackets the device work the recipe queues itself (the loss): end 0 before, 1 after */
  void (*compute)(void *ctx, int end);
  int (*backward)(void *ctx, const zt__step_walk *w, const zt__step_micro *mb);
  /* unit-major (w->unit_major): the activations of the rank's micro-batch k, and the walks of
   * the n micro-batches mbs (in k order, those walked) through the units at once; the recipe
   * computes each one's loss between the two */
  zt_acts *(*acts)(void *ctx, int k);
  int (*forward_all)(void *ctx, const zt__step_walk *w, const zt__step_micro *mbs, int n);
  int (*backward_all)(void *ctx, const zt__step_walk *w, const zt__step_micro *mbs, int n);
  /* after a counted micro-batch's backward: mb->loss_sum is known (a chunked head computes it
   * in its backward) */
  int (*loss)(void *ctx, const zt__step_walk *w, const zt__step_micro *mb);
  /* after the last micro-batch (n: the walk's loss and count filled in) */
  int (*norm)(void *ctx, const zt__step_walk *w, zt__step_norm *n);
  /* a gradient is not finite: whatever still runs is stopped or finished (fp16: before the
   * skip) */
  int (*nonfinite)(void *ctx, const zt__step_walk *w, const zt__step_norm *n);
  /* not finite after units were updated during the backward (not fp16): the state is no
   * step's; the strategy's failure */
  int (*broken)(void *ctx, const zt__step_walk *w, const zt__step_out *o);
  /* the update of every unit not yet updated; AdamW takes grad_scale = clip coefficient / loss
   * scale (fp16) */
  int (*update)(void *ctx, const zt__step_walk *w, float grad_scale);
  /* last, whatever happened (rc: the walk's result so far); returns rc or its own failure */
  int (*end)(void *ctx, const zt__step_walk *w, int rc);
} zt__step_hooks;

/* The step of trainer t, `world` ranks of t->tc.grad_accum micro-batches each: tokens checked
 * before any work (a bad batch leaves the trainer as it was), the walk (h->run or here), then
 * the fp16 scaler, t's step counts and *res. A refused step (-ERANGE) still fills *res
 * (skipped, its loss, norm and flags: every part of a world must see the flags). */
int zt__step(zt_trainer *t, const zt__step_hooks *h, void *ctx, int world, const zt_batch *batch,
             zt_step_result *res, char *err, size_t errlen);
/* Held-out evaluation (zt_trainer_eval_batch) of `micros` micro-batches of t's shape: tokens
 * checked as a step's, each micro-batch with a counted target staged into t->acts and walked
 * by the strategy's `walk` (every unit's forward with the parameters wherever they are, then,
 * where `counted` (its counted targets) is not 0, zt_model_eval_loss; 0 or a negative errno
 * with err made), its loss summed in micro-batch order. Nothing but the activations and the
 * host staging is written. */
typedef int (*zt__eval_walk)(void *ctx, int counted, char *err, size_t errlen);
int zt__step_eval(zt_trainer *t, zt__eval_walk walk, void *ctx, int micros, const zt_batch *batch,
                  double *loss_sum, int64_t *counted, char *err, size_t errlen);
/* The same for one rank (view: its model, config, backend, activations, host staging): its n
 * micro-batches micro0 .. of batch, each one's loss sum and counted targets into sums[2 j],
 * sums[2 j + 1] (zeros for padding alone, walked too with walk_padding, as the collectives
 * need); the tokens are zt__step_check's to check first. */
int zt__step_eval_rank(zt_trainer *view, zt__eval_walk walk, void *ctx, int walk_padding,
                       const zt_batch *batch, int micro0, int n, double *sums, char *err,
                       size_t errlen);
/* The tokens of `micros` micro-batches of t's shape, checked as zt__step checks a step's. */
int zt__step_check(const zt_trainer *t, const zt_batch *batch, int micros, char *err,
                   size_t errlen);
/* A counted micro-batch's loss (summed over its `counted` targets) into n, in the walk's order. */
void zt__step_norm_add(zt__step_norm *n, double loss_sum, double counted);
/* One rank's walk on view (its model, config, backend, activations, host staging): micro-batches
 * rank * grad_accum .. of a->batch, the hooks called with ctx. 0 (updated or skipped), or the
 * failure (refused: -ERANGE with out->refused). */
int zt__step_rank(zt_trainer *view, const zt__step_hooks *h, void *ctx, const zt__step_args *a,
                  int rank, zt__step_out *out);

#endif
