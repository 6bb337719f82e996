/* Token (and optional position) embedding: out (B,T,C) = wte (V,C)[tok] + wpe (T,C)[p], p the
 * token's position in its document (t without positions). */
#include <stddef.h>

#include "engine/kernels/cpu/cpu.h"
#include "engine/kernels/docs.h"

void zt__cpu_embedding_fwd(void *ctx, float *out, const int32_t *tok, const float *wte,
                           const float *wpe, int B, int T, int C, const int32_t *pos) {
  long rows = (long)B * T;
  ZT__PARALLEL_FOR(zt__cpu_threads(ctx), rows * C > ZT__CPU_PAR_MIN)
  for (long bt = 0; bt < rows; bt++) {
    float *o = out + bt * C;
    const float *e = wte + (ptrdiff_t)tok[bt] * C;
    if (wpe) {
      int t = (int)(bt % T);
      const int32_t *row = pos ? pos + (bt - t) : NULL;
      const float *p = wpe + (ptrdiff_t)(row ? t - zt_doc_start(row, t) : t) * C;
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
                           const int32_t *tok, int B, int T, int C, const int32_t *pos) {
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
      /* dwpe[p] += the sum of dout over the tokens at position p (row by row, a row's
       * documents in order), summed first so each position gets one add: without positions,
       * or with 0..T-1, that is sum_b dout[b,p]. */
      for (int p = 0; p < T; p++) {
        float acc[CHAN_BLOCK] = {0};
        int any = 0;
        for (int b = 0; b < B; b++) {
          const int32_t *row = pos ? pos + (ptrdiff_t)b * T : NULL;
          for (int s = 0; s + p < T;) { /* s: the start of each document of the row */
            int t = s + p, in = !row || zt_doc_start(row, t) == s;
            if (in) {
              const float *d = dout + ((long)b * T + t) * C + c0;
              for (int c = 0; c < cb; c++)
                acc[c] += d[c];
              any = 1;
            }
            if (!row)
              break;
            s = in ? zt_doc_end(row, t + 1, T, s) : zt_doc_end(row, s + 1, t, s);
          }
        }
        if (!any)
          continue;
        float *g = dwpe + (ptrdiff_t)p * C + c0;
        for (int c = 0; c < cb; c++)
          g[c] += acc[c];
      }
    }
  }
}
