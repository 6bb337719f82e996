// AdamW in torch's operation order: see cpu/adamw.c for the derivation. The scalars are
// computed on the host exactly as there, and the per-element arithmetic is the same sequence
// of fp32 operations (no FMA contraction, IEEE sqrt and division), so the results are bitwise
// the CPU reference's.
#include <math.h>

#include "engine/kernels/cuda/cuda.h"

namespace {
struct adamw_scalars {
  float decay, w1, one_minus_w1, w2, beta2, eps, neg_step_size, bc2_sqrt, grad_scale;
};
} // namespace

static __global__ void adamw_kernel(float *p, const float *g, float *m, float *v, size_t n,
                                    adamw_scalars s) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float gi = g[i] * s.grad_scale;
    float pi = p[i] * s.decay;
    float mi = s.w1 < 0.5f ? m[i] + s.w1 * (gi - m[i]) : gi - (gi - m[i]) * s.one_minus_w1;
    float vi = v[i] * s.beta2 + s.w2 * gi * gi;
    float denom = sqrtf(vi) / s.bc2_sqrt + s.eps;
    p[i] = pi + s.neg_step_size * mi / denom;
    m[i] = mi;
    v[i] = vi;
  }
}

extern "C" void zt__cuda_adamw(void *vctx, float *p, const float *g, float *m, float *v,
                               size_t n, float lr, float beta1, float beta2, float eps,
                               float weight_decay, int step, float grad_scale) {
  zt__cuda_ctx *ctx = (zt__cuda_ctx *)vctx;
  if (ctx->err || n == 0)
    return;
  adamw_scalars s;
  s.decay = (float)(1.0 - (double)lr * weight_decay);
  s.w1 = (float)(1.0 - (double)beta1);
  s.one_minus_w1 = 1.0f - s.w1; // the CPU's (1.0f - w1), rounded the same way
  s.w2 = (float)(1.0 - (double)beta2);
  s.beta2 = beta2;
  s.eps = eps;
  s.neg_step_size = (float)(-((double)lr / (1.0 - pow(beta1, step))));
  s.bc2_sqrt = (float)sqrt(1.0 - pow(beta2, step));
  s.grad_scale = grad_scale;
  adamw_kernel<<<zt__cuda_blocks(n, ZT__CUDA_THREADS), ZT__CUDA_THREADS, 0, ctx->stream>>>(
      p, g, m, v, n, s);
  zt__cuda_check_rt(ctx, cudaGetLastError(), "adamw_kernel", __FILE__, __LINE__);
}
