// SwiGLU, following cpu/swiglu.c operation by operation: out = g / (1 + expf(-g)) * u with g,
// u the two halves of an (N, 2F) row. CUDA's expf is within 2 ulp of glibc's; the rest rounds
// as in C (the build turns FMA contraction off).
#include "engine/kernels/cuda/lowp.cuh"

#define GRID_STRIDE(i, n)                                                                      \
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
       i += (size_t)gridDim.x * blockDim.x)

template <class T> static __global__ void swiglu_fwd_kernel(T *out, const T *inp, int F,
                                                            size_t n) {
  GRID_STRIDE(i, n) {
    size_t r = i / F, f = i % F;
    const T *row = inp + r * 2 * F;
    float g = zt__ld(row[f]), u = zt__ld(row[F + f]);
    out[i] = zt__st<T>(g / (1.0f + expf(-g)) * u);
  }
}

template <class T>
static __global__ void swiglu_bwd_kernel(T *dinp, const T *inp, const T *dout, int F,
                                         size_t n) {
  GRID_STRIDE(i, n) {
    size_t r = i / F, f = i % F;
    const T *row = inp + r * 2 * F;
    T *drow = dinp + r * 2 * F;
    float g = zt__ld(row[f]), u = zt__ld(row[F + f]), d = zt__ld(dout[i]);
    float e = 1.0f + expf(-g);
    float sig = 1.0f / e, silu = g / e;
    drow[f] = zt__st<T>(zt__ld(drow[f]) + d * u * (sig * (1.0f + g * (1.0f - sig))));
    drow[F + f] = zt__st<T>(zt__ld(drow[F + f]) + d * silu);
  }
}

template <class T> static void swiglu_fwd_t(zt__cuda_ctx *ctx, T *out, const T *inp, int N,
                                            int F) {
  size_t n;
  if (ctx->err)
    return;
  ZT__ARG(ctx, N >= 0 && F > 0);
  n = (size_t)N * F;
  if (n == 0)
    return;
  swiglu_fwd_kernel<T><<<zt__cuda_blocks(n, ZT__CUDA_THREADS), ZT__CUDA_THREADS, 0,
                         ctx->stream>>>(out, inp, F, n);
  ZT__CU(ctx, cudaGetLastError());
out:
  return;
}

template <class T>
static void swiglu_bwd_t(zt__cuda_ctx *ctx, T *dinp, const T *inp, const T *dout, int N,
                         int F) {
  size_t n;
  if (ctx->err)
    return;
  ZT__ARG(ctx, N >= 0 && F > 0);
  n = (size_t)N * F;
  if (n == 0)
    return;
  swiglu_bwd_kernel<T><<<zt__cuda_blocks(n, ZT__CUDA_THREADS), ZT__CUDA_THREADS, 0,
                         ctx->stream>>>(dinp, inp, dout, F, n);
  ZT__CU(ctx, cudaGetLastError());
out:
  return;
}

extern "C" void zt__cuda_swiglu_fwd(void *ctx, float *out, const float *inp, int N, int F) {
  swiglu_fwd_t<float>((zt__cuda_ctx *)ctx, out, inp, N, F);
}

extern "C" void zt__cuda_swiglu_bwd(void *ctx, float *dinp, const float *inp, const float *dout,
                                    int N, int F) {
  swiglu_bwd_t<float>((zt__cuda_ctx *)ctx, dinp, inp, dout, N, F);
}

extern "C" void zt__cuda_swiglu_fwd_dt(void *ctx, zt_dtype dt, void *out, const void *inp, int N,
                                       int F) {
  ZT__DISPATCH(dt, T, swiglu_fwd_t<T>((zt__cuda_ctx *)ctx, (T *)out, (const T *)inp, N, F));
}

extern "C" void zt__cuda_swiglu_bwd_dt(void *ctx, zt_dtype dt, void *dinp, const void *inp,
                                       const void *dout, int N, int F) {
  ZT__DISPATCH(dt, T,
               swiglu_bwd_t<T>((zt__cuda_ctx *)ctx, (T *)dinp, (const T *)inp,
                               (const T *)dout, N, F));
}
