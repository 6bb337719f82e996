/* Token (and optional position) embedding: out (B,T,C) = wte (V,C)[tok] + wpe (T,C)[t]. */
#include <stddef.h>

#include "engine/kernels/cpu/cpu.h"

void zt__cpu_embedding_fwd(void *ctx, float *out, const int32_t *tok, const float *wte,
                           const float *wpe, int B, int T, int C) {
  long rows = (long)B * T;
  ZT__PARALLEL_FOR(zt__cpu_threads(ctx), rows * C > ZT__CPU_PAR_MIN)
  for (long bt = 0; bt < rows; bt++) {
    float *o = out + bt * C;
    const float *e = wte + (ptrdiff_t)tok[bt] * C;
    if (wpe) {
      const float *p = wpe + (bt % T) * C;
      for (int c = 0; c < C; c++)
        o[c] = e[c] + p[c];
    } else {
      for (int c = 0; c < C; c++)
        o[c] = e[c];
    }
  }
}

/* Several positions can carry the same token, so rows of dwte are not independent outputs;
 * the channels are. Threads split the channels and every thread walks all positions in order,
 * which also fixes the order in which a repeated token's gradients are added. */
#define CHAN_BLOCK 64

void zt__cpu_embedding_bwd(void *ctx, float *dwte, float *dwpe, const float *dout,
                           const int32_t *tok, int B, int T, int C) {
  long rows = (long)B * T;
  int blocks = (C + CHAN_BLOCK - 1) / CHAN_BLOCK;
  ZT__PARALLEL_FOR(zt__cpu_threads(ctx), rows * C > ZT__CPU_PAR_MIN)
  for (int blk = 0; blk < blocks; blk++) {
    int c0 = blk * CHAN_BLOCK;
    int cb = C - c0 < CHAN_BLOCK ? C - c0 : CHAN_BLOCK;
    for (long bt = 0; bt < rows; bt++) {
      const float *d = dout + bt * C + c0;
      float *g = dwte + (ptrdiff_t)tok[bt] * C + c0;
      for (int c = 0; c < cb; c++)
        g[c] += d[c];
    }
    if (dwpe) {
      /* dwpe[t] += sum_b dout[b,t], summed over b first so each position gets one add. */
      for (int t = 0; t < T; t++) {
        float acc[CHAN_BLOCK] = {0};
        for (int b = 0; b < B; b++) {
          const float *d = dout + ((long)b * T + t) * C + c0;
          for (int c = 0; c < cb; c++)
            acc[c] += d[c];
        }
        float *g = dwpe + (ptrdiff_t)t * C + c0;
        for (int c = 0; c < cb; c++)
          g[c] += acc[c];
      }
    }
  }
}
