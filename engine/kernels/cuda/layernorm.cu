// LayerNorm (eps 1e-5, biased variance). One warp per row; the row statistics and the two
// row sums of the backward are accumulated in double like the CPU reference (rows are long
// and these sums feed every element). dw/db are column sums over the rows: a deterministic
// two-stage reduction (reduce.cuh), no atomics.
#include <math.h>

#include "engine/kernels/cuda/lowp.cuh"
#include "engine/kernels/cuda/reduce.cuh"

#define LN_EPS 1e-5
#define ROWS_PER_BLOCK 8

// T: the storage type of the activations (inp, out, dinp, dout; lowp.cuh), float for fp32.
template <class T>
static __global__ void layernorm_fwd_kernel(T *out, float *mean, float *rstd, const T *inp,
                                            const float *w, const float *b, int N, int C) {
  int n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (n >= N)
    return;
  const T *x = inp + (size_t)n * C;
  double sum = 0.0;
  for (int c = lane; c < C; c += 32)
    sum += zt__ld(x[c]);
  double mu = zt__warp_sum(sum) / C;
  double var = 0.0;
  for (int c = lane; c < C; c += 32) {
    double d = zt__ld(x[c]) - mu;
    var += d * d;
  }
  var = zt__warp_sum(var);
  float m = (float)mu;
  float s = (float)(1.0 / sqrt(var / C + LN_EPS));
  T *o = out + (size_t)n * C;
  for (int c = lane; c < C; c += 32)
    o[c] = zt__st<T>((zt__ld(x[c]) - m) * s * w[c] + b[c]);
  if (lane == 0) {
    mean[n] = m;
    rstd[n] = s;
  }
}

template <class T>
static __global__ void layernorm_bwd_inp_kernel(T *dinp, const T *dout, const T *inp,
                                                const float *w, const float *mean,
                                                const float *rstd, int N, int C) {
  int n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (n >= N)
    return;
  const T *x = inp + (size_t)n * C;
  const T *d = dout + (size_t)n * C;
  float m = mean[n], s = rstd[n];
  double sum_g = 0.0, sum_gx = 0.0;
  for (int c = lane; c < C; c += 32) {
    float xhat = (zt__ld(x[c]) - m) * s;
    float g = w[c] * zt__ld(d[c]);
    sum_g += g;
    sum_gx += (double)g * xhat;
  }
  float mean_g = (float)(zt__warp_sum(sum_g) / C);
  float mean_gx = (float)(zt__warp_sum(sum_gx) / C);
  T *di = dinp + (size_t)n * C;
  for (int c = lane; c < C; c += 32) {
    float xhat = (zt__ld(x[c]) - m) * s;
    di[c] = zt__st<T>(zt__ld(di[c]) + (w[c] * zt__ld(d[c]) - mean_g - xhat * mean_gx) * s);
  }
}

// The same with eight columns a lane per 16-byte access (C a multiple of 8, every row 16-byte
// aligned): the sums take each eight's fp32 partial into the double accumulators (the
// difference from the reference's order is within fp32 rounding of the partials).
template <class T>
static __global__ void layernorm_bwd_inp8_kernel(T *dinp, const T *dout, const T *inp,
                                                 const float *w, const float *mean,
                                                 const float *rstd, int N, int C) {
  int n = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (n >= N)
    return;
  const T *x = inp + (size_t)n * C;
  const T *d = dout + (size_t)n * C;
  float m = mean[n], s = rstd[n];
  double sum_g = 0.0, sum_gx = 0.0;
  for (int c = lane * 8; c < C; c += 32 * 8) {
    float xv[8], dv[8], wv[8], pg = 0.0f, pgx = 0.0f;
    zt__ld8(x + c, xv);
    zt__ld8(d + c, dv);
    zt__ld8(w + c, wv);
#pragma unroll
    for (int k = 0; k < 8; k++) {
      float g = wv[k] * dv[k];
      pg += g;
      pgx += g * ((xv[k] - m) * s);
    }
    sum_g += pg;
    sum_gx += pgx;
  }
  float mean_g = (float)(zt__warp_sum(sum_g) / C);
  float mean_gx = (float)(zt__warp_sum(sum_gx) / C);
  T *di = dinp + (size_t)n * C;
  for (int c = lane * 8; c < C; c += 32 * 8) {
    float xv[8], dv[8], wv[8], out[8];
    zt__ld8(x + c, xv);
    zt__ld8(d + c, dv);
    zt__ld8(w + c, wv);
    zt__ld8(di + c, out);
#pragma unroll
    for (int k = 0; k < 8; k++) {
      float xhat = (xv[k] - m) * s;
      out[k] = out[k] + (wv[k] * dv[k] - mean_g - xhat * mean_gx) * s;
    }
    zt__st8(di + c, out);
  }
}

namespace {
// acc[0] += dout * xhat (dw), acc[1] += dout (db)
template <class T> struct ln_param_grads {
  const T *dout, *inp;
  const float *mean, *rstd;
  int C;
  __device__ void operator()(int n, int c, float acc[2]) const {
    size_t i = (size_t)n * C + c;
    float d = zt__ld(dout[i]);
    acc[0] += d * ((zt__ld(inp[i]) - mean[n]) * rstd[n]);
    acc[1] += d;
  }
};
} // namespace

static unsigned row_blocks(int N) { return (unsigned)((N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK); }

template <class T>
static void layernorm_fwd_t(zt__cuda_ctx *ctx, T *out, float *mean, float *rstd, const T *inp,
                            const float *w, const float *b, int N, int C) {
  if (ctx->err)
    return;
  ZT__ARG(ctx, N >= 0 && C > 0);
  if (N == 0)
    return;
  layernorm_fwd_kernel<T><<<row_blocks(N), ROWS_PER_BLOCK * 32, 0, ctx->stream>>>(
      out, mean, rstd, inp, w, b, N, C);
  ZT__CU(ctx, cudaGetLastError());
out:
  return;
}

template <class T>
static void layernorm_bwd_t(zt__cuda_ctx *ctx, T *dinp, float *dw, float *db, const T *dout,
                            const T *inp, const float *w, const float *mean, const float *rstd,
                            int N, int C) {
  if (ctx->err)
    return;
  ZT__ARG(ctx, N >= 0 && C > 0);
  if (N == 0)
    return;
  if (zt__aligned8((size_t)C, dinp, dout, inp) && zt__aligned8((size_t)C, w))
    layernorm_bwd_inp8_kernel<T><<<row_blocks(N), ROWS_PER_BLOCK * 32, 0, ctx->stream>>>(
        dinp, dout, inp, w, mean, rstd, N, C);
  else
    layernorm_bwd_inp_kernel<T><<<row_blocks(N), ROWS_PER_BLOCK * 32, 0, ctx->stream>>>(
        dinp, dout, inp, w, mean, rstd, N, C);
  ZT__CU(ctx, cudaGetLastError());
  zt__colsum_add<2>(ctx, dw, db, ln_param_grads<T>{dout, inp, mean, rstd, C}, N, C);
out:
  return;
}

extern "C" void zt__cuda_layernorm_fwd(void *ctx, float *out, float *mean, float *rstd,
                                       const float *inp, const float *w, const float *b, int N,
                                       int C) {
  layernorm_fwd_t<float>((zt__cuda_ctx *)ctx, out, mean, rstd, inp, w, b, N, C);
}

extern "C" void zt__cuda_layernorm_bwd(void *ctx, float *dinp, float *dw, float *db,
                                       const float *dout, const float *inp, const float *w,
                                       const float *mean, const float *rstd, int N, int C) {
  layernorm_bwd_t<float>((zt__cuda_ctx *)ctx, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}

extern "C" void zt__cuda_layernorm_fwd_dt(void *ctx, zt_dtype dt, void *out, float *mean,
                                          float *rstd, const void *inp, const float *w,
                                          const float *b, int N, int C) {
  ZT__DISPATCH(dt, T,
               layernorm_fwd_t<T>((zt__cuda_ctx *)ctx, (T *)out, mean, rstd, (const T *)inp, w,
                                  b, N, C));
}

extern "C" void zt__cuda_layernorm_bwd_dt(void *ctx, zt_dtype dt, void *dinp, float *dw,
                                          float *db, const void *dout, const void *inp,
                                          const float *w, const float *mean, const float *rstd,
                                          int N, int C) {
  ZT__DISPATCH(dt, T,
               layernorm_bwd_t<T>((zt__cuda_ctx *)ctx, (T *)dinp, dw, db, (const T *)dout,
                                  (const T *)inp, w, mean, rstd, N, C));
}
