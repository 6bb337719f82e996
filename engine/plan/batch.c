/* The split of a step's tokens into micro-batches (engine/plan/batch.h). */
#include "engine/plan/batch.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>

#include "engine/plan/rates.h"

/* The nearest multiples of `unit` below and above `want` (the lower at least one unit). */
static void nearest(int64_t want, int64_t unit, int64_t *lo, int64_t *hi) {
  *lo = want / unit * unit;
  if (*lo < unit) *lo = unit;
  *hi = (want + unit - 1) / unit * unit;
}

int zt_batch_splits(const zt_train_cfg *tc, int ranks, int seq_len, int *micro, int max,
                    char *err, size_t errlen) {
  int64_t bt = tc->batch_tokens, row = (int64_t)ranks * seq_len, lo, hi;
  int fixed_m = tc->micro_batch != ZT_BATCH_AUTO, fixed_g = tc->grad_accum != ZT_BATCH_AUTO;
  int64_t unit = row * (fixed_m ? tc->micro_batch : 1) * (fixed_g ? tc->grad_accum : 1);
  if (bt % unit != 0 || (fixed_m && fixed_g && bt != unit)) {
    nearest(bt, unit, &lo, &hi);
    if (fixed_m && fixed_g)
      snprintf(err, errlen, "train.batch_tokens %lld is not train.micro_batch %d x "
               "train.grad_accum %d x %d rank(s) x model.seq_len %d = %lld tokens",
               (long long)bt, tc->micro_batch, tc->grad_accum, ranks, seq_len,
               (long long)unit);
    else {
      char fix[64] = "";
      if (fixed_m) snprintf(fix, sizeof fix, " x train.micro_batch %d", tc->micro_batch);
      if (fixed_g) snprintf(fix, sizeof fix, " x train.grad_accum %d", tc->grad_accum);
      snprintf(err, errlen, "train.batch_tokens %lld does not split into whole micro-batches of "
               "%d rank(s) x model.seq_len %d%s = %lld tokens: the nearest that do are %lld and "
               "%lld", (long long)bt, ranks, seq_len, fix, (long long)unit, (long long)lo,
               (long long)(hi == lo ? lo + unit : hi));
    }
    return -EINVAL;
  }
  int64_t rows = bt / row; /* micro_batch × grad_accum */
  int n = 0;
  int64_t top = rows < ZT_TRAIN_MAX_BATCH ? rows : ZT_TRAIN_MAX_BATCH;
  for (int64_t m = fixed_m ? tc->micro_batch : top; m >= 1 && n < max; m = fixed_m ? 0 : m - 1) {
    if (rows % m != 0 || rows / m > ZT_TRAIN_MAX_BATCH) continue;
    if (fixed_g && rows / m != tc->grad_accum) continue;
    micro[n++] = (int)m;
  }
  if (n == 0) {
    snprintf(err, errlen, "train.batch_tokens %lld is %lld rows of %d rank(s) x model.seq_len "
             "%d: more than train.micro_batch x train.grad_accum can hold (each at most %d)",
             (long long)bt, (long long)rows, ranks, seq_len, ZT_TRAIN_MAX_BATCH);
    return -EINVAL;
  }
  return n;
}

double zt_batch_step_s(const zt_model *m, const zt_train_cfg *tc) {
  const zt_model_cfg *mc = zt_model_cfg_of(m);
  double P = (double)zt_model_num_params(m), L = mc->n_layers, T = mc->seq_len;
  double B = tc->micro_batch;
  double flops = 6 * P * B * T + 12 * L * B * T * T * mc->d_model;
  const zt_plan_rates *R = zt_plan_rates_active();
  double rate = zt_plan_rates_flops(R, tc->precision == ZT_F32, mc->d_model);
  double recomputed = tc->ckpt_every > 0 ? ceil(L / tc->ckpt_every) / L : 0;
  return tc->grad_accum * flops / rate * (1 + recomputed / 3);
}
