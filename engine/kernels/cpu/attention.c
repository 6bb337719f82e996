/* Scaled dot-product attention with grouped-query heads (NKV == NH: multi-head).
 *   qkv (B,T,(NH+2*NKV)*hs): per token q (NH,hs) | k (NKV,hs) | v (NKV,hs);  out (B,T,NH*hs);
 *   query head h reads kv head h / (NH/NKV);
 *   saved = the probabilities P (B,NH,T,T), zero where a key is hidden (after the query, or in
 *   another document: a query sees the keys [lo, hi) of its document, see key_span).
 * Forward rows are independent, so threads split (b, h, query). The backward accumulates dk
 * and dv of a kv head over every query of every query head of its group, so threads split
 * (b, kv head) and each runs its group's query heads in order, each head's queries in order:
 * with NKV == NH that is exactly the multi-head order. */
#include <math.h>
#include <stddef.h>

#include "engine/kernels/cpu/cpu.h"
#include "engine/kernels/docs.h"

size_t zt__cpu_attention_saved_bytes(int B, int T, int NH, int NKV, int hs) {
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

/* The keys [*lo, *hi) query t of a row sees; pos_row NULL: one document. The keys are the
 * same run of the same values wherever the document sits in its row, so its sums are too. */
static void key_span(const int32_t *pos_row, int T, int t, int causal, int *lo, int *hi) {
  int s = pos_row ? zt_doc_start(pos_row, t) : 0;
  *lo = s;
  *hi = causal ? t + 1 : pos_row ? zt_doc_end(pos_row, t + 1, T, s) : T;
}

/* Where a head's rows start in one token's qkv row, and the distance between tokens. */
typedef struct qkv_geom {
  ptrdiff_t row;      /* (NH+2*NKV)*hs */
  ptrdiff_t k0, v0;   /* offsets of k head 0 and v head 0 */
  int group;          /* NH / NKV query heads per kv head */
} qkv_geom;

static qkv_geom geometry(int NH, int NKV, int hs) {
  qkv_geom g = {.row = (ptrdiff_t)(NH + 2 * NKV) * hs, .k0 = (ptrdiff_t)NH * hs,
                .v0 = (ptrdiff_t)(NH + NKV) * hs, .group = NH / NKV};
  return g;
}

void zt__cpu_attention_fwd(void *ctx, float *out, void *saved, const float *qkv, int B, int T,
                           int NH, int NKV, int hs, int causal, const int32_t *pos) {
  float *att = saved;
  qkv_geom g = geometry(NH, NKV, hs);
  ptrdiff_t C = (ptrdiff_t)NH * hs;
  float scale = 1.0f / sqrtf((float)hs);
  long rows = (long)B * NH * T;
  ZT__PARALLEL_FOR(zt__cpu_threads(ctx), rows * T * hs > ZT__CPU_PAR_MIN)
  for (long r = 0; r < rows; r++) {
    int t = (int)(r % T);
    int h = (int)(r / T % NH);
    int b = (int)(r / T / NH);
    ptrdiff_t kvh = (ptrdiff_t)(h / g.group) * hs;
    const float *base = qkv + (ptrdiff_t)b * T * g.row;
    const float *q = base + t * g.row + (ptrdiff_t)h * hs;
    const float *k = base + g.k0 + kvh;
    const float *v = base + g.v0 + kvh;
    float *p = att + r * T; /* (b, h, t) row: r = (b*NH + h)*T + t */
    int lo, hi;
    key_span(pos ? pos + (ptrdiff_t)b * T : NULL, T, t, causal, &lo, &hi);

    dot_rows(p + lo, q, k + (ptrdiff_t)lo * g.row, g.row, hi - lo, hs);
    float maxv = -INFINITY;
    for (int j = lo; j < hi; j++) {
      p[j] *= scale;
      if (p[j] > maxv)
        maxv = p[j];
    }
    float sum = 0.0f;
    for (int j = lo; j < hi; j++) {
      p[j] = expf(p[j] - maxv);
      sum += p[j];
    }
    float inv = 1.0f / sum;
    for (int j = lo; j < hi; j++)
      p[j] *= inv;
    for (int j = 0; j < lo; j++)
      p[j] = 0.0f;
    for (int j = hi; j < T; j++)
      p[j] = 0.0f;

    float *o = out + ((ptrdiff_t)b * T + t) * C + (ptrdiff_t)h * hs;
    for (int d = 0; d < hs; d++)
      o[d] = 0.0f;
    for (int j = lo; j < hi; j++) {
      const float *vj = v + j * g.row;
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
                           const void *saved, int B, int T, int NH, int NKV, int hs,
                           int causal, const int32_t *pos) {
  const float *att = saved;
  qkv_geom g = geometry(NH, NKV, hs);
  ptrdiff_t C = (ptrdiff_t)NH * hs;
  float scale = 1.0f / sqrtf((float)hs);
  int kv_heads = B * NKV;
  if (T <= 0 || hs <= 0)
    return; /* nothing to do, and the row buffers below must not be empty arrays */
  ZT__PARALLEL_FOR(zt__cpu_threads(ctx), (long)B * NH * T * T * hs > ZT__CPU_PAR_MIN)
  for (int bg = 0; bg < kv_heads; bg++) {
    int b = bg / NKV, kvh = bg % NKV;
    ptrdiff_t off = (ptrdiff_t)b * T * g.row, kv_off = (ptrdiff_t)kvh * hs;
    const float *k = qkv + off + g.k0 + kv_off, *v = qkv + off + g.v0 + kv_off;
    float *dk = dqkv + off + g.k0 + kv_off, *dv = dqkv + off + g.v0 + kv_off;
    /* One row of dP/dS and one dq row, per thread on its stack: T and hs floats. */
    float ds[T];
    float dq_acc[hs];
    for (int h = kvh * g.group; h < (kvh + 1) * g.group; h++) {
      const float *q = qkv + off + (ptrdiff_t)h * hs;
      float *dq = dqkv + off + (ptrdiff_t)h * hs;
      const float *att_h = att + ((ptrdiff_t)b * NH + h) * T * T;
      for (int t = 0; t < T; t++) {
        const float *p = att_h + (ptrdiff_t)t * T;
        const float *do_t = dout + ((ptrdiff_t)b * T + t) * C + (ptrdiff_t)h * hs;
        const float *qt = q + t * g.row;
        int lo, hi;
        key_span(pos ? pos + (ptrdiff_t)b * T : NULL, T, t, causal, &lo, &hi);

        dot_rows(ds + lo, do_t, v + (ptrdiff_t)lo * g.row, g.row, hi - lo, hs);
        float pdp = 0.0f;
        for (int j = lo; j < hi; j++)
          pdp += p[j] * ds[j];
        for (int j = lo; j < hi; j++)
          ds[j] = p[j] * (ds[j] - pdp) * scale;

        for (int d = 0; d < hs; d++)
          dq_acc[d] = 0.0f;
        for (int j = lo; j < hi; j++) {
          const float *kj = k + j * g.row;
          float *dkj = dk + j * g.row;
          float *dvj = dv + j * g.row;
          float sj = ds[j], pj = p[j];
          for (int d = 0; d < hs; d++) {
            dq_acc[d] += sj * kj[d];
            dkj[d] += sj * qt[d];
            dvj[d] += pj * do_t[d];
          }
        }
        float *dqt = dq + t * g.row;
        for (int d = 0; d < hs; d++)
          dqt[d] += dq_acc[d];
      }
    }
  }
}
