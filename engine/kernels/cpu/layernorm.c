/* LayerNorm over the last dimension, as torch.nn.LayerNorm: eps 1e-5, biased variance.
 * The per-row statistics and the two per-row sums of the backward are accumulated in double:
 * the rows are long (C up to thousands) and these sums feed every element of the row. */
#include <math.h>
#include <stddef.h>

#include "engine/kernels/cpu/cpu.h"

#define LN_EPS 1e-5

void zt__cpu_layernorm_fwd(void *ctx, float *out, float *mean, float *rstd, const float *inp,
                           const float *w, const float *b, int N, int C) {
  ZT__PARALLEL_FOR(zt__cpu_threads(ctx), (long)N * C > ZT__CPU_PAR_MIN)
  for (int n = 0; n < N; n++) {
    const float *x = inp + (ptrdiff_t)n * C;
    double sum = 0.0;
    for (int c = 0; c < C; c++)
      sum += x[c];
    double mu = sum / C;
    double var = 0.0;
    for (int c = 0; c < C; c++) {
      double d = x[c] - mu;
      var += d * d;
    }
    float m = (float)mu;
    float s = (float)(1.0 / sqrt(var / C + LN_EPS));
    float *o = out + (ptrdiff_t)n * C;
    for (int c = 0; c < C; c++)
      o[c] = (x[c] - m) * s * w[c] + b[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

/* Channels per task of the weight/bias gradients: a block of columns summed down all rows. */
#define CHAN_BLOCK 64

void zt__cpu_layernorm_bwd(void *ctx, float *dinp, float *dw, float *db, const float *dout,
                           const float *inp, const float *w, const float *mean,
                           const float *rstd, int N, int C) {
  /* dinp: each row needs the row means of g = w*dout and of g*xhat (xhat the normalised input,
   * recomputed from the saved mean/rstd). */
  ZT__PARALLEL_FOR(zt__cpu_threads(ctx), (long)N * C > ZT__CPU_PAR_MIN)
  for (int n = 0; n < N; n++) {
    const float *x = inp + (ptrdiff_t)n * C;
    const float *d = dout + (ptrdiff_t)n * C;
    float m = mean[n], s = rstd[n];
    double sum_g = 0.0, sum_gx = 0.0;
    for (int c = 0; c < C; c++) {
      float xhat = (x[c] - m) * s;
      float g = w[c] * d[c];
      sum_g += g;
      sum_gx += (double)g * xhat;
    }
    float mean_g = (float)(sum_g / C);
    float mean_gx = (float)(sum_gx / C);
    float *di = dinp + (ptrdiff_t)n * C;
    for (int c = 0; c < C; c++) {
      float xhat = (x[c] - m) * s;
      di[c] += (w[c] * d[c] - mean_g - xhat * mean_gx) * s;
    }
  }

  /* dw[c] += sum_n dout*xhat, db[c] += sum_n dout: reductions over rows, so threads split
   * the channels instead. */
  int blocks = (C + CHAN_BLOCK - 1) / CHAN_BLOCK;
  ZT__PARALLEL_FOR(zt__cpu_threads(ctx), (long)N * C > ZT__CPU_PAR_MIN)
  for (int blk = 0; blk < blocks; blk++) {
    int c0 = blk * CHAN_BLOCK;
    int cb = C - c0 < CHAN_BLOCK ? C - c0 : CHAN_BLOCK;
    float acc_w[CHAN_BLOCK] = {0}, acc_b[CHAN_BLOCK] = {0};
    for (int n = 0; n < N; n++) {
      const float *x = inp + (ptrdiff_t)n * C + c0;
      const float *d = dout + (ptrdiff_t)n * C + c0;
      float m = mean[n], s = rstd[n];
      for (int c = 0; c < cb; c++) {
        acc_w[c] += d[c] * ((x[c] - m) * s);
        acc_b[c] += d[c];
      }
    }
    for (int c = 0; c < cb; c++) {
      dw[c0 + c] += acc_w[c];
      db[c0 + c] += acc_b[c];
    }
  }
}
