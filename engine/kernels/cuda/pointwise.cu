// Elementwise ops, written as the CPU reference writes them (same operations in the same
// order; the build turns off FMA contraction so that each one rounds as in C). tanhf differs
// from glibc's by an ulp or so, the rest is bitwise the reference.
#include "engine/kernels/cuda/lowp.cuh"

#define GELU_SCALE 0.7978845608028654f
#define GELU_CUBIC 0.044715f

#define GRID_STRIDE(i, n)                                                                      \
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
       i += (size_t)gridDim.x * blockDim.x)

// The activation kernels are templates over the storage type T of ops.h's typed entries
// (lowp.cuh): fp32 arithmetic, one rounding per stored value; T = float is the fp32 op. GELU and
// add also come in a form taking eight elements a thread with 16-byte accesses, which the
// launchers pick where the sizes and pointers allow (zt__aligned8); the math is the same.
static __device__ __forceinline__ float gelu_of(float x) {
  float cube = GELU_CUBIC * x * x * x;
  return 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + cube)));
}

static __device__ __forceinline__ float gelu_grad(float x) {
  float th = tanhf(GELU_SCALE * (x + GELU_CUBIC * x * x * x));
  float sech2 = 1.0f - th * th;
  return 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * GELU_CUBIC * x * x);
}

template <class T> static __global__ void gelu_fwd_kernel(T *out, const T *inp, size_t n) {
  GRID_STRIDE(i, n) out[i] = zt__st<T>(gelu_of(zt__ld(inp[i])));
}

template <class T> static __global__ void gelu_fwd8_kernel(T *out, const T *inp, size_t n8) {
  GRID_STRIDE(i, n8) {
    float x[8];
    zt__ld8(inp + 8 * i, x);
#pragma unroll
    for (int k = 0; k < 8; k++)
      x[k] = gelu_of(x[k]);
    zt__st8(out + 8 * i, x);
  }
}

template <class T>
static __global__ void gelu_bwd_kernel(T *dinp, const T *inp, const T *dout, size_t n) {
  GRID_STRIDE(i, n) {
    dinp[i] = zt__st<T>(zt__ld(dinp[i]) + gelu_grad(zt__ld(inp[i])) * zt__ld(dout[i]));
  }
}

template <class T>
static __global__ void gelu_bwd8_kernel(T *dinp, const T *inp, const T *dout, size_t n8) {
  GRID_STRIDE(i, n8) {
    float x[8], d[8], g[8];
    zt__ld8(inp + 8 * i, x);
    zt__ld8(dout + 8 * i, d);
    zt__ld8(dinp + 8 * i, g);
#pragma unroll
    for (int k = 0; k < 8; k++)
      g[k] = g[k] + gelu_grad(x[k]) * d[k];
    zt__st8(dinp + 8 * i, g);
  }
}

template <class T> static __global__ void relu_fwd_kernel(T *out, const T *inp, size_t n) {
  GRID_STRIDE(i, n) {
    float x = zt__ld(inp[i]);
    out[i] = zt__st<T>(x > 0.0f ? x : 0.0f);
  }
}

template <class T>
static __global__ void relu_bwd_kernel(T *dinp, const T *inp, const T *dout, size_t n) {
  GRID_STRIDE(i, n) {
    dinp[i] = zt__st<T>(zt__ld(dinp[i]) + (zt__ld(inp[i]) > 0.0f ? zt__ld(dout[i]) : 0.0f));
  }
}

template <class T>
static __global__ void add_kernel(T *out, const T *a, const T *b, size_t n) {
  GRID_STRIDE(i, n) out[i] = zt__st<T>(zt__ld(a[i]) + zt__ld(b[i]));
}

template <class T>
static __global__ void add8_kernel(T *out, const T *a, const T *b, size_t n8) {
  GRID_STRIDE(i, n8) {
    float x[8], y[8];
    zt__ld8(a + 8 * i, x);
    zt__ld8(b + 8 * i, y);
#pragma unroll
    for (int k = 0; k < 8; k++)
      x[k] = x[k] + y[k];
    zt__st8(out + 8 * i, x);
  }
}

static __global__ void scale_kernel(float *x, float s, size_t n) {
  GRID_STRIDE(i, n) x[i] *= s;
}

// A thread per column (blockIdx.x), rows strided over blockIdx.y: no division per element.
template <class T>
static __global__ void broadcast_rows_kernel(T *out, const float *bias, int N, int OC) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= OC)
    return;
  T v = zt__st<T>(bias[c]);
  for (int n = blockIdx.y; n < N; n += gridDim.y)
    out[(size_t)n * OC + c] = v;
}

// The common prologue and epilogue of a pointwise launch: skip after an error or on empty
// input, check the launch.
#define LAUNCH(ctx_, n_, kernel, ...)                                                          \
  do {                                                                                         \
    zt__cuda_ctx *c_ = (zt__cuda_ctx *)(ctx_);                                                 \
    if (c_->err || (n_) == 0)                                                                  \
      return;                                                                                  \
    kernel<<<zt__cuda_blocks((n_), ZT__CUDA_THREADS), ZT__CUDA_THREADS, 0, c_->stream>>>(      \
        __VA_ARGS__);                                                                          \
    zt__cuda_check_rt(c_, cudaGetLastError(), #kernel, __FILE__, __LINE__);                    \
  } while (0)

extern "C" void zt__cuda_relu_fwd(void *ctx, float *out, const float *inp, size_t n) {
  LAUNCH(ctx, n, relu_fwd_kernel<float>, out, inp, n);
}

extern "C" void zt__cuda_relu_bwd(void *ctx, float *dinp, const float *inp, const float *dout,
                                  size_t n) {
  LAUNCH(ctx, n, relu_bwd_kernel<float>, dinp, inp, dout, n);
}

extern "C" void zt__cuda_scale(void *ctx, float *x, float s, size_t n) {
  LAUNCH(ctx, n, scale_kernel, x, s, n);
}

extern "C" int zt__cuda_broadcast_rows(zt__cuda_ctx *ctx, float *out, const float *bias, int N,
                                       int OC) {
  return zt__cuda_broadcast_rows_dt(ctx, ZT_F32, out, bias, N, OC);
}

extern "C" int zt__cuda_broadcast_rows_dt(zt__cuda_ctx *ctx, zt_dtype dt, void *out,
                                          const float *bias, int N, int OC) {
  if (N == 0 || OC == 0)
    return ctx->err;
  dim3 grid((unsigned)((OC + ZT__CUDA_THREADS - 1) / ZT__CUDA_THREADS),
            (unsigned)(N < 1024 ? N : 1024));
  ZT__DISPATCH(dt, T,
               broadcast_rows_kernel<T><<<grid, ZT__CUDA_THREADS, 0, ctx->stream>>>(
                   (T *)out, bias, N, OC));
  return zt__cuda_check_rt(ctx, cudaGetLastError(), "broadcast_rows_kernel", __FILE__,
                           __LINE__);
}

// ---- typed entries ---------------------------------------------------------------------------

template <class T> static void gelu_fwd_t(void *ctx, void *out, const void *inp, size_t n) {
  if (zt__aligned8(n, out, inp))
    LAUNCH(ctx, n / 8, gelu_fwd8_kernel<T>, (T *)out, (const T *)inp, n / 8);
  else
    LAUNCH(ctx, n, gelu_fwd_kernel<T>, (T *)out, (const T *)inp, n);
}

template <class T>
static void gelu_bwd_t(void *ctx, void *dinp, const void *inp, const void *dout, size_t n) {
  if (zt__aligned8(n, dinp, inp, dout))
    LAUNCH(ctx, n / 8, gelu_bwd8_kernel<T>, (T *)dinp, (const T *)inp, (const T *)dout, n / 8);
  else
    LAUNCH(ctx, n, gelu_bwd_kernel<T>, (T *)dinp, (const T *)inp, (const T *)dout, n);
}

template <class T> static void relu_fwd_t(void *ctx, void *out, const void *inp, size_t n) {
  LAUNCH(ctx, n, relu_fwd_kernel<T>, (T *)out, (const T *)inp, n);
}

template <class T>
static void relu_bwd_t(void *ctx, void *dinp, const void *inp, const void *dout, size_t n) {
  LAUNCH(ctx, n, relu_bwd_kernel<T>, (T *)dinp, (const T *)inp, (const T *)dout, n);
}

template <class T>
static void add_t(void *ctx, void *out, const void *a, const void *b, size_t n) {
  if (zt__aligned8(n, out, a, b))
    LAUNCH(ctx, n / 8, add8_kernel<T>, (T *)out, (const T *)a, (const T *)b, n / 8);
  else
    LAUNCH(ctx, n, add_kernel<T>, (T *)out, (const T *)a, (const T *)b, n);
}

extern "C" void zt__cuda_gelu_fwd(void *ctx, float *out, const float *inp, size_t n) {
  gelu_fwd_t<float>(ctx, out, inp, n);
}

extern "C" void zt__cuda_gelu_bwd(void *ctx, float *dinp, const float *inp, const float *dout,
                                  size_t n) {
  gelu_bwd_t<float>(ctx, dinp, inp, dout, n);
}

extern "C" void zt__cuda_add(void *ctx, float *out, const float *a, const float *b, size_t n) {
  add_t<float>(ctx, out, a, b, n);
}

extern "C" void zt__cuda_gelu_fwd_dt(void *ctx, zt_dtype dt, void *out, const void *inp,
                                     size_t n) {
  ZT__DISPATCH(dt, T, gelu_fwd_t<T>(ctx, out, inp, n));
}

extern "C" void zt__cuda_gelu_bwd_dt(void *ctx, zt_dtype dt, void *dinp, const void *inp,
                                     const void *dout, size_t n) {
  ZT__DISPATCH(dt, T, gelu_bwd_t<T>(ctx, dinp, inp, dout, n));
}

extern "C" void zt__cuda_relu_fwd_dt(void *ctx, zt_dtype dt, void *out, const void *inp,
                                     size_t n) {
  ZT__DISPATCH(dt, T, relu_fwd_t<T>(ctx, out, inp, n));
}

extern "C" void zt__cuda_relu_bwd_dt(void *ctx, zt_dtype dt, void *dinp, const void *inp,
                                     const void *dout, size_t n) {
  ZT__DISPATCH(dt, T, relu_bwd_t<T>(ctx, dinp, inp, dout, n));
}

extern "C" void zt__cuda_add_dt(void *ctx, zt_dtype dt, void *out, const void *a, const void *b,
                                size_t n) {
  ZT__DISPATCH(dt, T, add_t<T>(ctx, out, a, b, n));
}

template <class D, class S> static __global__ void cast_kernel(D *dst, const S *src, size_t n) {
  GRID_STRIDE(i, n) dst[i] = zt__st<D>(zt__ld(src[i]));
}

template <class D, class S> static void cast_t(void *ctx, D *dst, const S *src, size_t n) {
  zt__cuda_ctx *c = (zt__cuda_ctx *)ctx;
  if (c->err || n == 0)
    return;
  cast_kernel<D, S><<<zt__cuda_blocks(n, ZT__CUDA_THREADS), ZT__CUDA_THREADS, 0, c->stream>>>(
      dst, src, n);
  zt__cuda_check_rt(c, cudaGetLastError(), "cast_kernel", __FILE__, __LINE__);
}

template <class D> static void cast_from(void *ctx, D *dst, const void *src, zt_dtype st,
                                         size_t n) {
  ZT__DISPATCH(st, S, cast_t<D, S>(ctx, dst, (const S *)src, n));
}

extern "C" void zt__cuda_cast(void *ctx, void *dst, zt_dtype dst_t, const void *src,
                              zt_dtype src_t, size_t n) {
  ZT__DISPATCH(dst_t, D, cast_from<D>(ctx, (D *)dst, src, src_t, n));
}
