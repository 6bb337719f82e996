// RMSNorm, following cpu/rmsnorm.c: rows (n, h) at n*stride + h*C, one warp per row, the sum
// of squares and the backward's row sum in double (over fp32 partials of eight where 16-byte
// accesses apply), rstd rounded to fp32 once, out = (x * rstd)
// * w in fp32. dw is a column sum over the N*H rows: the deterministic two-stage reduction of
// reduce.cuh (as layernorm.cu's dw), no atomics.
#include <math.h>

#include "engine/kernels/cuda/lowp.cuh"
#include "engine/kernels/cuda/reduce.cuh"

#define ROWS_PER_BLOCK 8

// T: the storage type of the activations (inp, out, dinp, dout; lowp.cuh), float for fp32.
// Each lane reads only the elements it writes, after the row's sum: out may alias inp.
template <class T>
static __global__ void rmsnorm_fwd_kernel(T *out, float *rstd, const T *inp, const float *w,
                                          long rows, int H, int C, ptrdiff_t stride,
                                          float eps) {
  long r = (long)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (r >= rows)
    return;
  ptrdiff_t off = r / H * stride + r % H * (ptrdiff_t)C;
  const T *x = inp + off;
  double ss = 0.0;
  for (int c = lane; c < C; c += 32) {
    float v = zt__ld(x[c]);
    ss += (double)v * v;
  }
  ss = zt__warp_sum(ss);
  float s = (float)(1.0 / sqrt(ss / C + (double)eps));
  T *o = out + off;
  for (int c = lane; c < C; c += 32)
    o[c] = zt__st<T>(zt__ld(x[c]) * s * w[c]);
  if (lane == 0)
    rstd[r] = s;
}

// dinp += rstd * (w*dout - xhat * mean(w*dout * xhat)), xhat = x * rstd.
template <class T>
static __global__ void rmsnorm_bwd_inp_kernel(T *dinp, const T *dout, const T *inp,
                                              const float *w, const float *rstd, long rows,
                                              int H, int C, ptrdiff_t stride) {
  long r = (long)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (r >= rows)
    return;
  ptrdiff_t off = r / H * stride + r % H * (ptrdiff_t)C;
  const T *x = inp + off, *d = dout + off;
  float s = rstd[r];
  double sum_gx = 0.0;
  for (int c = lane; c < C; c += 32)
    sum_gx += (double)(w[c] * zt__ld(d[c])) * (zt__ld(x[c]) * s);
  float mean_gx = (float)(zt__warp_sum(sum_gx) / C);
  T *di = dinp + off;
  for (int c = lane; c < C; c += 32)
    di[c] = zt__st<T>(zt__ld(di[c]) + (w[c] * zt__ld(d[c]) - zt__ld(x[c]) * s * mean_gx) * s);
}

// The same with eight columns a lane per 16-byte access (C and stride multiples of 8, the
// buffers 16-byte aligned): each eight's fp32 partial goes into the double accumulator, as
// layernorm.cu's inp8 kernel (a double add per element is what bounds the plain kernel).
template <class T>
static __global__ void rmsnorm_bwd_inp8_kernel(T *dinp, const T *dout, const T *inp,
                                               const float *w, const float *rstd, long rows,
                                               int H, int C, ptrdiff_t stride) {
  long r = (long)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (r >= rows)
    return;
  ptrdiff_t off = r / H * stride + r % H * (ptrdiff_t)C;
  const T *x = inp + off, *d = dout + off;
  float s = rstd[r];
  double sum_gx = 0.0;
  for (int c = lane * 8; c < C; c += 32 * 8) {
    float xv[8], dv[8], wv[8], p = 0.0f;
    zt__ld8(x + c, xv);
    zt__ld8(d + c, dv);
    zt__ld8(w + c, wv);
#pragma unroll
    for (int k = 0; k < 8; k++)
      p += (wv[k] * dv[k]) * (xv[k] * s);
    sum_gx += p;
  }
  float mean_gx = (float)(zt__warp_sum(sum_gx) / C);
  T *di = dinp + off;
  for (int c = lane * 8; c < C; c += 32 * 8) {
    float xv[8], dv[8], wv[8], out[8];
    zt__ld8(x + c, xv);
    zt__ld8(d + c, dv);
    zt__ld8(w + c, wv);
    zt__ld8(di + c, out);
#pragma unroll
    for (int k = 0; k < 8; k++)
      out[k] = out[k] + (wv[k] * dv[k] - xv[k] * s * mean_gx) * s;
    zt__st8(di + c, out);
  }
}

namespace {
// acc[0] += dout * xhat over the rows r = n*H + h. Dense: the block norms' contiguous rows
// (H 1, stride C), indexed without the per-element division the strided q/k rows need.
template <class T, bool Dense> struct rms_weight_grad {
  const T *dout, *inp;
  const float *rstd;
  int H, C;
  ptrdiff_t stride;
  __device__ void operator()(int r, int c, float acc[1]) const {
    size_t i = Dense ? (size_t)r * (size_t)C + (size_t)c
                     : (size_t)(r / H * stride + r % H * (ptrdiff_t)C + c);
    acc[0] += zt__ld(dout[i]) * (zt__ld(inp[i]) * rstd[r]);
  }
};
} // namespace

static unsigned row_blocks(long rows) {
  return (unsigned)((rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
}

template <class T>
static void rmsnorm_fwd_t(zt__cuda_ctx *ctx, T *out, float *rstd, const T *inp, const float *w,
                          int N, int H, int C, ptrdiff_t stride, float eps) {
  long rows = (long)N * H;
  if (ctx->err)
    return;
  ZT__ARG(ctx, N >= 0 && H > 0 && C > 0 && stride >= (ptrdiff_t)H * C && rows < INT32_MAX);
  if (N == 0)
    return;
  rmsnorm_fwd_kernel<T><<<row_blocks(rows), ROWS_PER_BLOCK * 32, 0, ctx->stream>>>(
      out, rstd, inp, w, rows, H, C, stride, eps);
  ZT__CU(ctx, cudaGetLastError());
out:
  return;
}

template <class T>
static void rmsnorm_bwd_t(zt__cuda_ctx *ctx, T *dinp, float *dw, const T *dout, const T *inp,
                          const float *w, const float *rstd, int N, int H, int C,
                          ptrdiff_t stride) {
  long rows = (long)N * H;
  if (ctx->err)
    return;
  ZT__ARG(ctx, N >= 0 && H > 0 && C > 0 && stride >= (ptrdiff_t)H * C && rows < INT32_MAX);
  if (N == 0)
    return;
  if (C % 8 == 0 && stride % 8 == 0 && zt__aligned8((size_t)C, dinp, dout, inp) &&
      zt__aligned8((size_t)C, w))
    rmsnorm_bwd_inp8_kernel<T><<<row_blocks(rows), ROWS_PER_BLOCK * 32, 0, ctx->stream>>>(
        dinp, dout, inp, w, rstd, rows, H, C, stride);
  else
    rmsnorm_bwd_inp_kernel<T><<<row_blocks(rows), ROWS_PER_BLOCK * 32, 0, ctx->stream>>>(
        dinp, dout, inp, w, rstd, rows, H, C, stride);
  ZT__CU(ctx, cudaGetLastError());
  if (H == 1 && stride == C)
    zt__colsum_add<1>(ctx, dw, nullptr, rms_weight_grad<T, true>{dout, inp, rstd, H, C, stride},
                      (int)rows, C);
  else
    zt__colsum_add<1>(ctx, dw, nullptr, rms_weight_grad<T, false>{dout, inp, rstd, H, C, stride},
                      (int)rows, C);
out:
  return;
}

extern "C" void zt__cuda_rmsnorm_fwd(void *ctx, float *out, float *rstd, const float *inp,
                                     const float *w, int N, int H, int C, ptrdiff_t stride,
                                     float eps) {
  rmsnorm_fwd_t<float>((zt__cuda_ctx *)ctx, out, rstd, inp, w, N, H, C, stride, eps);
}

extern "C" void zt__cuda_rmsnorm_bwd(void *ctx, float *dinp, float *dw, const float *dout,
                                     const float *inp, const float *w, const float *rstd, int N,
                                     int H, int C, ptrdiff_t stride) {
  rmsnorm_bwd_t<float>((zt__cuda_ctx *)ctx, dinp, dw, dout, inp, w, rstd, N, H, C, stride);
}

extern "C" void zt__cuda_rmsnorm_fwd_dt(void *ctx, zt_dtype dt, void *out, float *rstd,
                                        const void *inp, const float *w, int N, int H, int C,
                                        ptrdiff_t stride, float eps) {
  ZT__DISPATCH(dt, T,
               rmsnorm_fwd_t<T>((zt__cuda_ctx *)ctx, (T *)out, rstd, (const T *)inp, w, N, H, C,
                                stride, eps));
}

extern "C" void zt__cuda_rmsnorm_bwd_dt(void *ctx, zt_dtype dt, void *dinp, float *dw,
                                        const void *dout, const void *inp, const float *w,
                                        const float *rstd, int N, int H, int C,
                                        ptrdiff_t stride) {
  ZT__DISPATCH(dt, T,
               rmsnorm_bwd_t<T>((zt__cuda_ctx *)ctx, (T *)dinp, dw, (const T *)dout,
                                (const T *)inp, w, rstd, N, H, C, stride));
}
