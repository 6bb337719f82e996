/* Multi-head scaled dot-product attention.
 *   qkv (B,T,3C): q | k | v, each (B,T,NH,hs), hs = C/NH;  out (B,T,C);
 *   saved = the probabilities P (B,NH,T,T), zero where the causal mask hides a key.
 * Forward rows are independent, so threads split (b, h, query); the backward accumulates dk and
 * dv over all queries of a head, so threads split (b, h) and each head runs its queries in
 * order. */
#include <math.h>
#include <stddef.h>

#include "engine/kernels/cpu/cpu.h"

size_t zt__cpu_attention_saved_bytes(int B, int T, int C, int NH) {
  return (size_t)B * NH * T * T * sizeof(float);
}

/* s[j] = sum_d a[d] * rows[j*stride + d] for j < n, each sum in increasing d. Eight rows at a
 * time give the compiler eight independent chains (a single dot is latency bound); the sums
 * are the same as one row at a time. */
#define DOT_ROWS 8
static void dot_rows(float *s, const float *a, const float *rows, ptrdiff_t stride, int n,
                     int hs) {
  int j = 0;
  for (; j + DOT_ROWS <= n; j += DOT_ROWS) {
    const float *r0 = rows + (ptrdiff_t)j * stride;
    float acc[DOT_ROWS] = {0};
    for (int d = 0; d < hs; d++)
      for (int r = 0; r < DOT_ROWS; r++)
        acc[r] += a[d] * r0[r * stride + d];
    for (int r = 0; r < DOT_ROWS; r++)
      s[j + r] = acc[r];
  }
  for (; j < n; j++) {
    const float *r0 = rows + (ptrdiff_t)j * stride;
    float acc = 0.0f;
    for (int d = 0; d < hs; d++)
      acc += a[d] * r0[d];
    s[j] = acc;
  }
}

void zt__cpu_attention_fwd(void *ctx, float *out, void *saved, const float *qkv, int B, int T,
                           int C, int NH, int causal) {
  float *att = saved;
  int hs = C / NH;
  ptrdiff_t C3 = 3 * (ptrdiff_t)C;
  float scale = 1.0f / sqrtf((float)hs);
  long rows = (long)B * NH * T;
  ZT__PARALLEL_FOR(zt__cpu_threads(ctx), rows * T * hs > ZT__CPU_PAR_MIN)
  for (long r = 0; r < rows; r++) {
    int t = (int)(r % T);
    int h = (int)(r / T % NH);
    int b = (int)(r / T / NH);
    const float *base = qkv + (ptrdiff_t)b * T * C3 + (ptrdiff_t)h * hs;
    const float *q = base + t * C3;
    const float *k = base + C;
    const float *v = base + 2 * (ptrdiff_t)C;
    float *p = att + r * T; /* (b, h, t) row: r = (b*NH + h)*T + t */
    int nk = causal ? t + 1 : T;

    dot_rows(p, q, k, C3, nk, hs);
    float maxv = -INFINITY;
    for (int j = 0; j < nk; j++) {
      p[j] *= scale;
      if (p[j] > maxv)
        maxv = p[j];
    }
    float sum = 0.0f;
    for (int j = 0; j < nk; j++) {
      p[j] = expf(p[j] - maxv);
      sum += p[j];
    }
    float inv = 1.0f / sum;
    for (int j = 0; j < nk; j++)
      p[j] *= inv;
    for (int j = nk; j < T; j++)
      p[j] = 0.0f;

    float *o = out + ((ptrdiff_t)b * T + t) * C + (ptrdiff_t)h * hs;
    for (int d = 0; d < hs; d++)
      o[d] = 0.0f;
    for (int j = 0; j < nk; j++) {
      const float *vj = v + j * C3;
      float pj = p[j];
      for (int d = 0; d < hs; d++)
        o[d] += pj * vj[d];
    }
  }
}

/* With P from the forward and dO = dout:
 *   dV += P^T dO;  dP = dO V^T;  dS = P * (dP - rowsum(P * dP));
 *   dQ += scale dS K;  dK += scale dS^T Q. */
void zt__cpu_attention_bwd(void *ctx, float *dqkv, const float *dout, const float *qkv,
                           const void *saved, int B, int T, int C, int NH, int causal) {
  const float *att = saved;
  int hs = C / NH;
  ptrdiff_t C3 = 3 * (ptrdiff_t)C;
  float scale = 1.0f / sqrtf((float)hs);
  int heads = B * NH;
  if (T <= 0 || hs <= 0)
    return; /* nothing to do, and the row buffers below must not be empty arrays */
  ZT__PARALLEL_FOR(zt__cpu_threads(ctx), (long)heads * T * T * hs > ZT__CPU_PAR_MIN)
  for (int bh = 0; bh < heads; bh++) {
    int b = bh / NH, h = bh % NH;
    ptrdiff_t off = (ptrdiff_t)b * T * C3 + (ptrdiff_t)h * hs;
    const float *q = qkv + off, *k = q + C, *v = q + 2 * (ptrdiff_t)C;
    float *dq = dqkv + off, *dk = dq + C, *dv = dq + 2 * (ptrdiff_t)C;
    /* One row of dP/dS and one dq row, per thread on its stack: T and hs floats. */
    float ds[T];
    float dq_acc[hs];
    for (int t = 0; t < T; t++) {
      const float *p = att + ((ptrdiff_t)bh * T + t) * T;
      const float *do_t = dout + ((ptrdiff_t)b * T + t) * C + (ptrdiff_t)h * hs;
      const float *qt = q + t * C3;
      int nk = causal ? t + 1 : T;

      dot_rows(ds, do_t, v, C3, nk, hs);
      float pdp = 0.0f;
      for (int j = 0; j < nk; j++)
        pdp += p[j] * ds[j];
      for (int j = 0; j < nk; j++)
        ds[j] = p[j] * (ds[j] - pdp) * scale;

      for (int d = 0; d < hs; d++)
        dq_acc[d] = 0.0f;
      for (int j = 0; j < nk; j++) {
        const float *kj = k + j * C3;
        float *dkj = dk + j * C3;
        float *dvj = dv + j * C3;
        float sj = ds[j], pj = p[j];
        for (int d = 0; d < hs; d++) {
          dq_acc[d] += sj * kj[d];
          dkj[d] += sj * qt[d];
          dvj[d] += pj * do_t[d];
        }
      }
      float *dqt = dq + t * C3;
      for (int d = 0; d < hs; d++)
        dqt[d] += dq_acc[d];
    }
  }
}
