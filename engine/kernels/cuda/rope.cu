// Rotary position embedding, following cpu/rope.c: the angle pos * inv_freq[i] is the fp32
// product, cos and sin are evaluated in double and rounded to fp32 (as the reference does, so
// both give the same angles' values but for the last-bit ties of a double libm), then the fp32
// rotation, each value rounded to T once. A thread per (token, i) computes the angle once and
// turns dimension i against i + hs/2 in each of the H heads; neighbouring threads take
// neighbouring i, so the loads of a head are coalesced.
#include <math.h>

#include "engine/kernels/cuda/lowp.cuh"

template <class T>
static __global__ void rope_kernel(T *x, const float *inv_freq, const int32_t *pos, int N,
                                   int H, int hs, ptrdiff_t stride, float dir) {
  int half = hs / 2;
  for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < (size_t)N * half;
       k += (size_t)gridDim.x * blockDim.x) {
    int n = (int)(k / half), i = (int)(k % half);
    float a = (float)pos[n] * inv_freq[i];
    double sd, cd;
    sincos((double)a, &sd, &cd);
    float c = (float)cd, s = (float)sd * dir;
    T *row = x + (ptrdiff_t)n * stride;
    for (int h = 0; h < H; h++) {
      T *xh = row + (ptrdiff_t)h * hs;
      float x1 = zt__ld(xh[i]), x2 = zt__ld(xh[i + half]);
      xh[i] = zt__st<T>(x1 * c - x2 * s);
      xh[i + half] = zt__st<T>(x2 * c + x1 * s);
    }
  }
}

template <class T>
static void rope_t(zt__cuda_ctx *ctx, T *x, const float *inv_freq, const int32_t *pos, int N,
                   int H, int hs, ptrdiff_t stride, float dir) {
  size_t n;
  if (ctx->err)
    return;
  ZT__ARG(ctx, N >= 0 && H > 0 && hs > 0 && hs % 2 == 0 && stride >= (ptrdiff_t)H * hs);
  n = (size_t)N * (hs / 2);
  if (n == 0)
    return;
  rope_kernel<T><<<zt__cuda_blocks(n, ZT__CUDA_THREADS), ZT__CUDA_THREADS, 0, ctx->stream>>>(
      x, inv_freq, pos, N, H, hs, stride, dir);
  ZT__CU(ctx, cudaGetLastError());
out:
  return;
}

extern "C" void zt__cuda_rope_fwd(void *ctx, float *x, const float *inv_freq, const int32_t *pos,
                                  int N, int H, int hs, ptrdiff_t stride) {
  rope_t<float>((zt__cuda_ctx *)ctx, x, inv_freq, pos, N, H, hs, stride, 1.0f);
}

extern "C" void zt__cuda_rope_bwd(void *ctx, float *dx, const float *inv_freq,
                                  const int32_t *pos, int N, int H, int hs, ptrdiff_t stride) {
  rope_t<float>((zt__cuda_ctx *)ctx, dx, inv_freq, pos, N, H, hs, stride, -1.0f);
}

extern "C" void zt__cuda_rope_fwd_dt(void *ctx, zt_dtype dt, void *x, const float *inv_freq,
                                     const int32_t *pos, int N, int H, int hs,
                                     ptrdiff_t stride) {
  ZT__DISPATCH(dt, T,
               rope_t<T>((zt__cuda_ctx *)ctx, (T *)x, inv_freq, pos, N, H, hs, stride, 1.0f));
}

extern "C" void zt__cuda_rope_bwd_dt(void *ctx, zt_dtype dt, void *dx, const float *inv_freq,
                                     const int32_t *pos, int N, int H, int hs,
                                     ptrdiff_t stride) {
  ZT__DISPATCH(dt, T,
               rope_t<T>((zt__cuda_ctx *)ctx, (T *)dx, inv_freq, pos, N, H, hs, stride, -1.0f));
}
