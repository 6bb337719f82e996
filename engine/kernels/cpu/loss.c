/* Softmax cross-entropy over the vocabulary, fused with its gradient.
 *
 * Per row: the max is subtracted, each exponential is computed in float (expf, within an ulp)
 * and their sum is accumulated in double, so the log-sum-exp stays accurate for vocabularies
 * of 100k+ entries at the cost of one expf per logit. The total loss is a sum over rows,
 * which threads must not split: rows are grouped into LOSS_BLOCKS contiguous blocks whose
 * boundaries depend only on N, each block is summed in row order by one thread, and the block
 * sums are added in block order. crossentropy_rows keeps the per-row losses instead (each
 * row's double loss rounded to fp32), for callers that sum them later without a host trip. */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "engine/kernels/cpu/cpu.h"

#define LOSS_BLOCKS 64

static float row_max(const float *x, int V) {
  float maxv = -INFINITY;
  for (int j = 0; j < V; j++)
    if (x[j] > maxv)
      maxv = x[j];
  return maxv;
}

/* Every entry point: with grad NULL only the loss is computed; else the gradient is written to
 * grad, which may be the logits themselves. row_loss (may be NULL) gets each counted row's
 * loss added. */
static void crossentropy(void *ctx, float *grad, const float *logits, const int32_t *targets,
                         int N, int V, int V_alloc, int ignore_index, float dscale,
                         double *loss_sum, int *n_counted, float *row_loss) {
  double block_loss[LOSS_BLOCKS] = {0};
  int block_count[LOSS_BLOCKS] = {0};
  int nblocks = N < LOSS_BLOCKS ? N : LOSS_BLOCKS;
  ZT__PARALLEL_FOR(zt__cpu_threads(ctx), (long)N * V > ZT__CPU_PAR_MIN)
  for (int blk = 0; blk < nblocks; blk++) {
    int n0 = (int)((long)N * blk / nblocks), n1 = (int)((long)N * (blk + 1) / nblocks);
    for (int n = n0; n < n1; n++) {
      const float *x = logits + (ptrdiff_t)n * V_alloc;
      int target = targets[n];
      if (target == ignore_index) {
        if (grad)
          memset(grad + (ptrdiff_t)n * V_alloc, 0, (size_t)V_alloc * sizeof(float));
        continue;
      }
      float maxv = row_max(x, V);
      float x_target = x[target]; /* read before grad (maybe x itself) is written */
      double sum_exp = 0.0;
      float *g = grad ? grad + (ptrdiff_t)n * V_alloc : NULL;
      for (int j = 0; j < V; j++) {
        float e = expf(x[j] - maxv);
        sum_exp += e;
        if (g)
          g[j] = e;
      }
      double loss = maxv + log(sum_exp) - x_target;
      block_loss[blk] += loss;
      if (row_loss)
        row_loss[n] += (float)loss;
      block_count[blk]++;
      if (g) {
        float mul = (float)(1.0 / sum_exp) * dscale;
        for (int j = 0; j < V; j++)
          g[j] *= mul;
        g[target] -= dscale;
        for (int j = V; j < V_alloc; j++)
          g[j] = 0.0f;
      }
    }
  }
  double total = 0.0;
  int count = 0;
  for (int blk = 0; blk < nblocks; blk++) {
    total += block_loss[blk];
    count += block_count[blk];
  }
  if (loss_sum)
    *loss_sum = total;
  if (n_counted)
    *n_counted = count;
}

void zt__cpu_crossentropy_fwd_bwd(void *ctx, float *logits, const int32_t *targets, int N, int V,
                                  int V_alloc, int ignore_index, float dscale,
                                  double *loss_sum, int *n_counted) {
  crossentropy(ctx, logits, logits, targets, N, V, V_alloc, ignore_index, dscale, loss_sum,
               n_counted, NULL);
}

void zt__cpu_crossentropy_fwd(void *ctx, const float *logits, const int32_t *targets, int N,
                              int V, int V_alloc, int ignore_index, double *loss_sum,
                              int *n_counted) {
  crossentropy(ctx, NULL, logits, targets, N, V, V_alloc, ignore_index, 0.0f, loss_sum,
               n_counted, NULL);
}

void zt__cpu_crossentropy_rows(void *ctx, float *logits, const int32_t *targets, int N, int V,
                               int V_alloc, int ignore_index, float dscale, float *row_loss) {
  crossentropy(ctx, logits, logits, targets, N, V, V_alloc, ignore_index, dscale, NULL, NULL,
               row_loss);
}
