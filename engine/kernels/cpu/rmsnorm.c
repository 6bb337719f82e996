/* RMSNorm over rows of C, as transformers' LlamaRMSNorm: y = x * rsqrt(mean(x^2) + eps) * w.
 * The rows are (n, h) with row (n, h) at n*stride + h*C, so one op covers the block norms
 * (H = 1) and Qwen3's per-head q/k norms inside a qkv row (H heads, stride the qkv row).
 * As in layernorm.c, the per-row sums are accumulated in double and rstd is rounded to fp32
 * once; the output is (x * rstd) * w in fp32, transformers' order. */
#include <math.h>
#include <stddef.h>

#include "engine/kernels/cpu/cpu.h"

void zt__cpu_rmsnorm_fwd(void *ctx, float *out, float *rstd, const float *inp, const float *w,
                         int N, int H, int C, ptrdiff_t stride, float eps) {
  long rows = (long)N * H;
  ZT__PARALLEL_FOR(zt__cpu_threads(ctx), rows * C > ZT__CPU_PAR_MIN)
  for (long r = 0; r < rows; r++) {
    ptrdiff_t off = r / H * stride + r % H * (ptrdiff_t)C;
    const float *x = inp + off;
    double ss = 0.0;
    for (int c = 0; c < C; c++)
      ss += (double)x[c] * x[c];
    float s = (float)(1.0 / sqrt(ss / C + (double)eps));
    float *o = out + off;
    /* every x[c] is read before o[c] is written: out may alias inp */
    for (int c = 0; c < C; c++)
      o[c] = x[c] * s * w[c];
    rstd[r] = s;
  }
}

/* Channels per task of the weight gradient: a block of columns summed down all rows. */
#define CHAN_BLOCK 64

/* With xhat = x * rstd and g = w * dout:  dx = rstd * (g - xhat * mean(g * xhat)). */
void zt__cpu_rmsnorm_bwd(void *ctx, float *dinp, float *dw, const float *dout, const float *inp,
                         const float *w, const float *rstd, int N, int H, int C,
                         ptrdiff_t stride) {
  long rows = (long)N * H;
  ZT__PARALLEL_FOR(zt__cpu_threads(ctx), rows * C > ZT__CPU_PAR_MIN)
  for (long r = 0; r < rows; r++) {
    ptrdiff_t off = r / H * stride + r % H * (ptrdiff_t)C;
    const float *x = inp + off, *d = dout + off;
    float s = rstd[r];
    double sum_gx = 0.0;
    for (int c = 0; c < C; c++)
      sum_gx += (double)(w[c] * d[c]) * (x[c] * s);
    float mean_gx = (float)(sum_gx / C);
    float *di = dinp + off;
    for (int c = 0; c < C; c++)
      di[c] += (w[c] * d[c] - x[c] * s * mean_gx) * s;
  }

  /* dw[c] += sum over the rows (n, h), in that order, of dout * xhat: threads split the
   * channels. */
  int blocks = (C + CHAN_BLOCK - 1) / CHAN_BLOCK;
  ZT__PARALLEL_FOR(zt__cpu_threads(ctx), rows * C > ZT__CPU_PAR_MIN)
  for (int blk = 0; blk < blocks; blk++) {
    int c0 = blk * CHAN_BLOCK;
    int cb = C - c0 < CHAN_BLOCK ? C - c0 : CHAN_BLOCK;
    float acc[CHAN_BLOCK] = {0};
    for (long r = 0; r < rows; r++) {
      ptrdiff_t off = r / H * stride + r % H * (ptrdiff_t)C + c0;
      const float *x = inp + off, *d = dout + off;
      float s = rstd[r];
      for (int c = 0; c < cb; c++)
        acc[c] += d[c] * (x[c] * s);
    }
    for (int c = 0; c < cb; c++)
      dw[c0 + c] += acc[c];
  }
}
