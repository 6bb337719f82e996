// AdamW in torch's operation order: see cpu/adamw.c for the derivation. The scalars are
// computed on the host exactly as there, and the per-element arithmetic is the same sequence
// of fp32 operations (no FMA contraction, IEEE sqrt and division), so the results are bitwise
// the CPU reference's.
#include <math.h>

#include "engine/kernels/cuda/lowp.cuh"
#include "engine/kernels/sround.h"

namespace {
struct adamw_scalars {
  float decay, w1, one_minus_w1, w2, beta2, eps, neg_step_size, bc2_sqrt, grad_scale;
};
} // namespace

// The compute copy written in the same pass (ops.h adamw_dt); a void pointer: none.
static __device__ __forceinline__ void store_copy(void *, size_t, float) {}
template <class L> static __device__ __forceinline__ void store_copy(L *p_lp, size_t i, float v) {
  p_lp[i] = zt__st<L>(v);
}

// The moments: fp32 as they are, or bf16 (ops.h adamw_sr) widened and stored rounded
// stochastically with the counter hash's bits of the element (sround.h), as the CPU's
// zt__cpu_adamw_sr does, so either is bitwise the CPU's.
static __device__ __forceinline__ float load_moment(const float *x, size_t i) { return x[i]; }
static __device__ __forceinline__ float load_moment(const uint16_t *x, size_t i) {
  return __uint_as_float((uint32_t)x[i] << 16);
}
static __device__ __forceinline__ void store_moments(float *m, float *v, size_t i, float mi,
                                                     float vi, uint64_t, uint64_t) {
  m[i] = mi;
  v[i] = vi;
}
static __device__ __forceinline__ void store_moments(uint16_t *m, uint16_t *v, size_t i,
                                                     float mi, float vi, uint64_t key,
                                                     uint64_t index0) {
  uint64_t r = zt_sr_bits(key, index0 + i);
  m[i] = zt_bf16_round_sr(__float_as_uint(mi), (uint32_t)r);
  v[i] = zt_bf16_round_sr(__float_as_uint(vi), (uint32_t)(r >> 16));
}

// One element update for every kernel: L the type of the compute copy (void for none), M the
// moments' (float, or uint16_t for bf16; key and index0 then give the rounding bits).
template <class L, class M>
static __global__ void adamw_kernel(float *p, const float *g, M *m, M *v, size_t n,
                                    adamw_scalars s, L *p_lp, uint64_t key, uint64_t index0) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float gi = g[i] * s.grad_scale;
    float pi = p[i] * s.decay;
    float m0 = load_moment(m, i), v0 = load_moment(v, i);
    float mi = s.w1 < 0.5f ? m0 + s.w1 * (gi - m0) : gi - (gi - m0) * s.one_minus_w1;
    float vi = v0 * s.beta2 + s.w2 * gi * gi;
    float denom = sqrtf(vi) / s.bc2_sqrt + s.eps;
    float pn = pi + s.neg_step_size * mi / denom;
    p[i] = pn;
    store_moments(m, v, i, mi, vi, key, index0);
    store_copy(p_lp, i, pn);
  }
}

static adamw_scalars adamw_scalars_of(float lr, float beta1, float beta2, float eps,
                                      float weight_decay, int step, float grad_scale) {
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
  return s;
}

template <class L>
static void adamw_t(void *vctx, float *p, const float *g, float *m, float *v, size_t n, float lr,
                    float beta1, float beta2, float eps, float weight_decay, int step,
                    float grad_scale, L *p_lp) {
  zt__cuda_ctx *ctx = (zt__cuda_ctx *)vctx;
  if (ctx->err || n == 0)
    return;
  adamw_scalars s = adamw_scalars_of(lr, beta1, beta2, eps, weight_decay, step, grad_scale);
  adamw_kernel<L, float><<<zt__cuda_blocks(n, ZT__CUDA_THREADS), ZT__CUDA_THREADS, 0,
                            ctx->stream>>>(p, g, m, v, n, s, p_lp, 0, 0);
  zt__cuda_check_rt(ctx, cudaGetLastError(), "adamw_kernel", __FILE__, __LINE__);
}

extern "C" void zt__cuda_adamw(void *ctx, float *p, const float *g, float *m, float *v, size_t n,
                               float lr, float beta1, float beta2, float eps, float weight_decay,
                               int step, float grad_scale) {
  adamw_t<void>(ctx, p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, step, grad_scale,
                nullptr);
}

extern "C" void zt__cuda_adamw_dt(void *ctx, float *p, const float *g, float *m, float *v,
                                  size_t n, float lr, float beta1, float beta2, float eps,
                                  float weight_decay, int step, float grad_scale, void *p_lp,
                                  zt_dtype lp_t) {
  if (lp_t == ZT_BF16)
    adamw_t<__nv_bfloat16>(ctx, p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, step,
                           grad_scale, (__nv_bfloat16 *)p_lp);
  else if (lp_t == ZT_F16)
    adamw_t<__half>(ctx, p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, step, grad_scale,
                    (__half *)p_lp);
  else
    zt__cuda_adamw(ctx, p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, step, grad_scale);
}

template <class L>
static void adamw_sr_t(void *vctx, float *p, const float *g, uint16_t *m, uint16_t *v, size_t n,
                       float lr, float beta1, float beta2, float eps, float weight_decay,
                       int step, float grad_scale, L *p_lp, uint64_t seed, uint64_t index0) {
  zt__cuda_ctx *ctx = (zt__cuda_ctx *)vctx;
  if (ctx->err || n == 0)
    return;
  adamw_scalars s = adamw_scalars_of(lr, beta1, beta2, eps, weight_decay, step, grad_scale);
  adamw_kernel<L, uint16_t><<<zt__cuda_blocks(n, ZT__CUDA_THREADS), ZT__CUDA_THREADS, 0,
                               ctx->stream>>>(p, g, m, v, n, s, p_lp, zt_sr_key(seed, step),
                                              index0);
  zt__cuda_check_rt(ctx, cudaGetLastError(), "adamw_kernel (bf16 moments)", __FILE__, __LINE__);
}

extern "C" void zt__cuda_adamw_sr(void *ctx, float *p, const float *g, uint16_t *m, uint16_t *v,
                                  size_t n, float lr, float beta1, float beta2, float eps,
                                  float weight_decay, int step, float grad_scale, void *p_lp,
                                  zt_dtype lp_t, uint64_t seed, uint64_t index0) {
  if (lp_t == ZT_BF16)
    adamw_sr_t<__nv_bfloat16>(ctx, p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, step,
                              grad_scale, (__nv_bfloat16 *)p_lp, seed, index0);
  else if (lp_t == ZT_F16)
    adamw_sr_t<__half>(ctx, p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, step,
                       grad_scale, (__half *)p_lp, seed, index0);
  else
    adamw_sr_t<void>(ctx, p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, step, grad_scale,
                     nullptr, seed, index0);
}
