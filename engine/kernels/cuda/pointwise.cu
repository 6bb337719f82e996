// Elementwise ops, written as the CPU reference writes them (same operations in the same
// order; the build turns off FMA contraction so that each one rounds as in C). tanhf differs
// from glibc's by an ulp or so, the rest is bitwise the reference.
#include "engine/kernels/cuda/cuda.h"

#define GELU_SCALE 0.7978845608028654f
#define GELU_CUBIC 0.044715f

#define GRID_STRIDE(i, n)                                                                      \
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
       i += (size_t)gridDim.x * blockDim.x)

static __global__ void gelu_fwd_kernel(float *out, const float *inp, size_t n) {
  GRID_STRIDE(i, n) {
    float x = inp[i];
    float cube = GELU_CUBIC * x * x * x;
    out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + cube)));
  }
}

static __global__ void gelu_bwd_kernel(float *dinp, const float *inp, const float *dout,
                                       size_t n) {
  GRID_STRIDE(i, n) {
    float x = inp[i];
    float th = tanhf(GELU_SCALE * (x + GELU_CUBIC * x * x * x));
    float sech2 = 1.0f - th * th;
    float local = 0.5f * (1.0f + th) +
                  0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * GELU_CUBIC * x * x);
    dinp[i] += local * dout[i];
  }
}

static __global__ void relu_fwd_kernel(float *out, const float *inp, size_t n) {
  GRID_STRIDE(i, n) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

static __global__ void relu_bwd_kernel(float *dinp, const float *inp, const float *dout,
                                       size_t n) {
  GRID_STRIDE(i, n) dinp[i] += inp[i] > 0.0f ? dout[i] : 0.0f;
}

static __global__ void add_kernel(float *out, const float *a, const float *b, size_t n) {
  GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

static __global__ void scale_kernel(float *x, float s, size_t n) {
  GRID_STRIDE(i, n) x[i] *= s;
}

static __global__ void broadcast_rows_kernel(float *out, const float *bias, size_t n, int OC) {
  GRID_STRIDE(i, n) out[i] = bias[i % OC];
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

extern "C" void zt__cuda_gelu_fwd(void *ctx, float *out, const float *inp, size_t n) {
  LAUNCH(ctx, n, gelu_fwd_kernel, out, inp, n);
}

extern "C" void zt__cuda_gelu_bwd(void *ctx, float *dinp, const float *inp, const float *dout,
                                  size_t n) {
  LAUNCH(ctx, n, gelu_bwd_kernel, dinp, inp, dout, n);
}

extern "C" void zt__cuda_relu_fwd(void *ctx, float *out, const float *inp, size_t n) {
  LAUNCH(ctx, n, relu_fwd_kernel, out, inp, n);
}

extern "C" void zt__cuda_relu_bwd(void *ctx, float *dinp, const float *inp, const float *dout,
                                  size_t n) {
  LAUNCH(ctx, n, relu_bwd_kernel, dinp, inp, dout, n);
}

extern "C" void zt__cuda_add(void *ctx, float *out, const float *a, const float *b, size_t n) {
  LAUNCH(ctx, n, add_kernel, out, a, b, n);
}

extern "C" void zt__cuda_scale(void *ctx, float *x, float s, size_t n) {
  LAUNCH(ctx, n, scale_kernel, x, s, n);
}

extern "C" int zt__cuda_broadcast_rows(zt__cuda_ctx *ctx, float *out, const float *bias, int N,
                                       int OC) {
  size_t n = (size_t)N * OC;
  if (n == 0)
    return ctx->err;
  broadcast_rows_kernel<<<zt__cuda_blocks(n, ZT__CUDA_THREADS), ZT__CUDA_THREADS, 0,
                          ctx->stream>>>(out, bias, n, OC);
  return zt__cuda_check_rt(ctx, cudaGetLastError(), "broadcast_rows_kernel", __FILE__,
                           __LINE__);
}
