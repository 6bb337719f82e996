// The softmax kernels of attention (the products are cuBLAS, in attention.c): one warp per
// row of T scores, three passes over the row (max, exponentials and their sum, normalise), so
// any T works. The order of operations follows the CPU reference; the sums are warp trees.
// A row (b, h, t) covers the keys of its query's document (ops.h, "Documents"; pos NULL: one
// document a row, pos indexed from the first row's batch element); the rest of it is zero.
#include <math.h>

#include "engine/kernels/cuda/lowp.cuh"
#include "engine/kernels/cuda/reduce.cuh"
#include "engine/kernels/docs.h"

#define ROWS_PER_BLOCK 8

// The keys [*lo, *hi) row r's query sees (as the CPU reference's key_span).
static __device__ __forceinline__ void key_span(const int32_t *pos, size_t r, int T, int NH,
                                                int causal, int *lo, int *hi) {
  int t = (int)(r % T);
  const int32_t *row = pos ? pos + r / T / NH * T : NULL;
  int s = row ? zt_doc_start(row, t) : 0;
  *lo = s;
  *hi = causal ? t + 1 : row ? zt_doc_end(row, t + 1, T, s) : T;
}

static __global__ void softmax_rows_kernel(float *att, size_t rows, int T, int causal,
                                           const int32_t *pos, int NH) {
  size_t r = (size_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (r >= rows)
    return;
  int lo, hi;
  key_span(pos, r, T, NH, causal, &lo, &hi);
  float *p = att + r * T;
  float maxv = -INFINITY;
  for (int j = lo + lane; j < hi; j += 32)
    maxv = fmaxf(maxv, p[j]);
  maxv = zt__warp_max(maxv);
  float sum = 0.0f;
  for (int j = lo + lane; j < hi; j += 32) {
    float e = expf(p[j] - maxv);
    p[j] = e;
    sum += e;
  }
  sum = zt__warp_sum(sum);
  float inv = 1.0f / sum;
  for (int j = lo + lane; j < hi; j += 32)
    p[j] *= inv;
  for (int j = lane; j < lo; j += 32)
    p[j] = 0.0f;
  for (int j = hi + lane; j < T; j += 32)
    p[j] = 0.0f;
}

// P: the probabilities' storage type (float, or the typed entries' bf16/fp16 copy of them).
template <class P>
static __global__ void softmax_bwd_rows_kernel(float *dp, const P *att, size_t rows, int T,
                                               int causal, float scale, const int32_t *pos,
                                               int NH) {
  size_t r = (size_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (r >= rows)
    return;
  int lo, hi;
  key_span(pos, r, T, NH, causal, &lo, &hi);
  const P *p = att + r * T;
  float *d = dp + r * T;
  float pdp = 0.0f;
  for (int j = lo + lane; j < hi; j += 32)
    pdp += zt__ld(p[j]) * d[j];
  pdp = zt__warp_sum(pdp);
  for (int j = lo + lane; j < hi; j += 32)
    d[j] = zt__ld(p[j]) * (d[j] - pdp) * scale;
  for (int j = lane; j < lo; j += 32)
    d[j] = 0.0f;
  for (int j = hi + lane; j < T; j += 32)
    d[j] = 0.0f;
}

static unsigned row_blocks(size_t rows) {
  return (unsigned)((rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
}

extern "C" int zt__cuda_softmax_rows(zt__cuda_ctx *ctx, float *att, size_t rows, int T,
                                     int causal, const int32_t *pos, int NH) {
  if (rows == 0)
    return ctx->err;
  softmax_rows_kernel<<<row_blocks(rows), ROWS_PER_BLOCK * 32, 0, ctx->stream>>>(
      att, rows, T, causal, pos, NH);
  return zt__cuda_check_rt(ctx, cudaGetLastError(), "softmax_rows_kernel", __FILE__, __LINE__);
}

extern "C" int zt__cuda_softmax_bwd_rows(zt__cuda_ctx *ctx, float *dp, const float *att,
                                         size_t rows, int T, int causal, float scale,
                                         const int32_t *pos, int NH) {
  return zt__cuda_softmax_bwd_rows_dt(ctx, ZT_F32, dp, att, rows, T, causal, scale, pos, NH);
}

extern "C" int zt__cuda_softmax_bwd_rows_dt(zt__cuda_ctx *ctx, zt_dtype att_t, float *dp,
                                            const void *att, size_t rows, int T, int causal,
                                            float scale, const int32_t *pos, int NH) {
  if (rows == 0)
    return ctx->err;
  ZT__DISPATCH(att_t, P,
               softmax_bwd_rows_kernel<P><<<row_blocks(rows), ROWS_PER_BLOCK * 32, 0,
                                            ctx->stream>>>(dp, (const P *)att, rows, T, causal,
                                                           scale, pos, NH));
  return zt__cuda_check_rt(ctx, cudaGetLastError(), "softmax_bwd_rows_kernel", __FILE__,
                           __LINE__);
}
