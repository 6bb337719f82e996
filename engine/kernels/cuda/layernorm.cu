// LayerNorm (eps 1e-5, biased variance). One warp per row; the row statistics and the two
// row sums of the backward are accumulated in double like the CPU reference (rows are long
// and these sums feed every element). dw/db are column sums over the rows: a deterministic
// two-stage reduction (reduce.cuh), no atomics.
#include <math.h>

#include "engine/kernels/cuda/reduce.cuh"

#define LN_EPS 1e-5
#define ROWS_PER_BLOCK 8

static __global__ void layernorm_fwd_kernel(float *out, float *mean, float *rstd,
                                            const float *inp, const float *w, const float *b,
                                            int N, int C) {
  int n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (n >= N)
    return;
  const float *x = inp + (size_t)n * C;
  double sum = 0.0;
  for (int c = lane; c < C; c += 32)
    sum += x[c];
  double mu = zt__warp_sum(sum) / C;
  double var = 0.0;
  for (int c = lane; c < C; c += 32) {
    double d = x[c] - mu;
    var += d * d;
  }
  var = zt__warp_sum(var);
  float m = (float)mu;
  float s = (float)(1.0 / sqrt(var / C + LN_EPS));
  float *o = out + (size_t)n * C;
  for (int c = lane; c < C; c += 32)
    o[c] = (x[c] - m) * s * w[c] + b[c];
  if (lane == 0) {
    mean[n] = m;
    rstd[n] = s;
  }
}

static __global__ void layernorm_bwd_inp_kernel(float *dinp, const float *dout, const float *inp,
                                                const float *w, const float *mean,
                                                const float *rstd, int N, int C) {
  int n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (n >= N)
    return;
  const float *x = inp + (size_t)n * C;
  const float *d = dout + (size_t)n * C;
  float m = mean[n], s = rstd[n];
  double sum_g = 0.0, sum_gx = 0.0;
  for (int c = lane; c < C; c += 32) {
    float xhat = (x[c] - m) * s;
    float g = w[c] * d[c];
    sum_g += g;
    sum_gx += (double)g * xhat;
  }
  float mean_g = (float)(zt__warp_sum(sum_g) / C);
  float mean_gx = (float)(zt__warp_sum(sum_gx) / C);
  float *di = dinp + (size_t)n * C;
  for (int c = lane; c < C; c += 32) {
    float xhat = (x[c] - m) * s;
    di[c] += (w[c] * d[c] - mean_g - xhat * mean_gx) * s;
  }
}

namespace {
// acc[0] += dout * xhat (dw), acc[1] += dout (db)
struct ln_param_grads {
  const float *dout, *inp, *mean, *rstd;
  int C;
  __device__ void operator()(int n, int c, float acc[2]) const {
    size_t i = (size_t)n * C + c;
    float d = dout[i];
    acc[0] += d * ((inp[i] - mean[n]) * rstd[n]);
    acc[1] += d;
  }
};
} // namespace

static unsigned row_blocks(int N) { return (unsigned)((N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK); }

extern "C" void zt__cuda_layernorm_fwd(void *vctx, float *out, float *mean, float *rstd,
                                       const float *inp, const float *w, const float *b, int N,
                                       int C) {
  zt__cuda_ctx *ctx = (zt__cuda_ctx *)vctx;
  if (ctx->err)
    return;
  ZT__ARG(ctx, N >= 0 && C > 0);
  if (N == 0)
    return;
  layernorm_fwd_kernel<<<row_blocks(N), ROWS_PER_BLOCK * 32, 0, ctx->stream>>>(
      out, mean, rstd, inp, w, b, N, C);
  ZT__CU(ctx, cudaGetLastError());
out:
  return;
}

extern "C" void zt__cuda_layernorm_bwd(void *vctx, float *dinp, float *dw, float *db,
                                       const float *dout, const float *inp, const float *w,
                                       const float *mean, const float *rstd, int N, int C) {
  zt__cuda_ctx *ctx = (zt__cuda_ctx *)vctx;
  if (ctx->err)
    return;
  ZT__ARG(ctx, N >= 0 && C > 0);
  if (N == 0)
    return;
  layernorm_bwd_inp_kernel<<<row_blocks(N), ROWS_PER_BLOCK * 32, 0, ctx->stream>>>(
      dinp, dout, inp, w, mean, rstd, N, C);
  ZT__CU(ctx, cudaGetLastError());
  zt__colsum_add<2>(ctx, dw, db, ln_param_grads{dout, inp, mean, rstd, C}, N, C);
out:
  return;
}
