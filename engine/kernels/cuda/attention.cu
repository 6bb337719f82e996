// The softmax kernels of attention (the products are cuBLAS, in attention.c): one warp per
// row of T scores, three passes over the row (max, exponentials and their sum, normalise), so
// any T works. The order of operations follows the CPU reference; the sums are warp trees.
#include <math.h>

#include "engine/kernels/cuda/lowp.cuh"
#include "engine/kernels/cuda/reduce.cuh"

#define ROWS_PER_BLOCK 8

static __global__ void softmax_rows_kernel(float *att, size_t rows, int T, int causal) {
  size_t r = (size_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (r >= rows)
    return;
  int t = (int)(r % T);
  int nk = causal ? t + 1 : T;
  float *p = att + r * T;
  float maxv = -INFINITY;
  for (int j = lane; j < nk; j += 32)
    maxv = fmaxf(maxv, p[j]);
  maxv = zt__warp_max(maxv);
  float sum = 0.0f;
  for (int j = lane; j < nk; j += 32) {
    float e = expf(p[j] - maxv);
    p[j] = e;
    sum += e;
  }
  sum = zt__warp_sum(sum);
  float inv = 1.0f / sum;
  for (int j = lane; j < nk; j += 32)
    p[j] *= inv;
  for (int j = nk + lane; j < T; j += 32)
    p[j] = 0.0f;
}

// P: the probabilities' storage type (float, or the typed entries' bf16/fp16 copy of them).
template <class P>
static __global__ void softmax_bwd_rows_kernel(float *dp, const P *att, size_t rows, int T,
                                               int causal, float scale) {
  size_t r = (size_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (r >= rows)
    return;
  int t = (int)(r % T);
  int nk = causal ? t + 1 : T;
  const P *p = att + r * T;
  float *d = dp + r * T;
  float pdp = 0.0f;
  for (int j = lane; j < nk; j += 32)
    pdp += zt__ld(p[j]) * d[j];
  pdp = zt__warp_sum(pdp);
  for (int j = lane; j < nk; j += 32)
    d[j] = zt__ld(p[j]) * (d[j] - pdp) * scale;
  for (int j = nk + lane; j < T; j += 32)
    d[j] = 0.0f;
}

static unsigned row_blocks(size_t rows) {
  return (unsigned)((rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
}

extern "C" int zt__cuda_softmax_rows(zt__cuda_ctx *ctx, float *att, size_t rows, int T,
                                     int causal) {
  if (rows == 0)
    return ctx->err;
  softmax_rows_kernel<<<row_blocks(rows), ROWS_PER_BLOCK * 32, 0, ctx->stream>>>(att, rows, T,
                                                                                 causal);
  return zt__cuda_check_rt(ctx, cudaGetLastError(), "softmax_rows_kernel", __FILE__, __LINE__);
}

extern "C" int zt__cuda_softmax_bwd_rows(zt__cuda_ctx *ctx, float *dp, const float *att,
                                         size_t rows, int T, int causal, float scale) {
  return zt__cuda_softmax_bwd_rows_dt(ctx, ZT_F32, dp, att, rows, T, causal, scale);
}

extern "C" int zt__cuda_softmax_bwd_rows_dt(zt__cuda_ctx *ctx, zt_dtype att_t, float *dp,
                                            const void *att, size_t rows, int T, int causal,
                                            float scale) {
  if (rows == 0)
    return ctx->err;
  ZT__DISPATCH(att_t, P,
               softmax_bwd_rows_kernel<P><<<row_blocks(rows), ROWS_PER_BLOCK * 32, 0,
                                            ctx->stream>>>(dp, (const P *)att, rows, T, causal,
                                                           scale));
  return zt__cuda_check_rt(ctx, cudaGetLastError(), "softmax_bwd_rows_kernel", __FILE__,
                           __LINE__);
}
