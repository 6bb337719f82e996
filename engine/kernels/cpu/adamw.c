/* AdamW, reproducing torch.optim.AdamW (single-tensor path, foreach=False) operation by
 * operation, so that parameters match PyTorch bit for bit given the same fp32 inputs:
 *
 *   param.mul_(1 - lr * wd)
 *   exp_avg.lerp_(grad, 1 - beta1)
 *   exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
 *   step_size = lr / (1 - beta1 ** step)
 *   denom = (exp_avg_sq.sqrt() / sqrt(1 - beta2 ** step)).add_(eps)
 *   param.addcdiv_(exp_avg, denom, value=-step_size)
 *
 * The scalar expressions are Python floats there, so they are computed here in double and
 * rounded to float once, where torch hands them to the fp32 tensor kernels. (Our hyper-
 * parameters arrive as float; torch's would be the nearest doubles of the decimal literals, so
 * e.g. 1 - beta1 can differ in its last bit unless the caller's values are exact in float.) */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/kernels/cpu/cpu.h"
#include "engine/kernels/dtype.h"
#include "engine/kernels/sround.h"

/* The step's coefficients, computed once a call. */
typedef struct adamw_coef {
  float decay, w1, w2, beta2, eps, neg_step_size, bc2_sqrt, grad_scale;
} adamw_coef;

static adamw_coef coef_of(float lr, float beta1, float beta2, float eps, float weight_decay,
                          int step, float grad_scale) {
  double bc1 = 1.0 - pow(beta1, step);
  double bc2 = 1.0 - pow(beta2, step);
  return (adamw_coef){.decay = (float)(1.0 - (double)lr * weight_decay),
                      .w1 = (float)(1.0 - (double)beta1), /* lerp weight */
                      .w2 = (float)(1.0 - (double)beta2),
                      .beta2 = beta2,
                      .eps = eps,
                      .neg_step_size = (float)(-((double)lr / bc1)),
                      .bc2_sqrt = (float)sqrt(bc2),
                      .grad_scale = grad_scale};
}

/* One element: p updated in place, the new moments into *mi and *vi. */
static inline void adamw_elem(const adamw_coef *c, float *p, float g, float m, float v,
                              float *mi, float *vi) {
  float gi = g * c->grad_scale;
  float pi = *p * c->decay;
  /* torch's lerp: start + w (end - start) for w < 0.5, else end - (end - start)(1 - w) */
  *mi = c->w1 < 0.5f ? m + c->w1 * (gi - m) : gi - (gi - m) * (1.0f - c->w1);
  *vi = v * c->beta2 + c->w2 * gi * gi;
  float denom = sqrtf(*vi) / c->bc2_sqrt + c->eps;
  *p = pi + c->neg_step_size * *mi / denom;
}

void zt__cpu_adamw(void *ctx, float *p, const float *g, float *m, float *v, size_t n, float lr,
                   float beta1, float beta2, float eps, float weight_decay, int step,
                   float grad_scale) {
  adamw_coef c = coef_of(lr, beta1, beta2, eps, weight_decay, step, grad_scale);
  ZT__PARALLEL_FOR(zt__cpu_threads(ctx), n > ZT__CPU_PAR_MIN)
  for (size_t i = 0; i < n; i++) adamw_elem(&c, &p[i], g[i], m[i], v[i], &m[i], &v[i]);
}

/* The same update on bf16 m and v (ops.h adamw_sr): widened exactly to fp32, updated as above,
 * stored rounded stochastically with the counter bits of their global index (sround.h). */
void zt__cpu_adamw_sr(void *ctx, float *p, const float *g, uint16_t *m, uint16_t *v, size_t n,
                      float lr, float beta1, float beta2, float eps, float weight_decay, int step,
                      float grad_scale, void *p_lp, zt_dtype lp_t, uint64_t seed,
                      uint64_t index0) {
  adamw_coef c = coef_of(lr, beta1, beta2, eps, weight_decay, step, grad_scale);
  uint64_t key = zt_sr_key(seed, step);
  ZT__PARALLEL_FOR(zt__cpu_threads(ctx), n > ZT__CPU_PAR_MIN)
  for (size_t i = 0; i < n; i++) {
    float mi, vi;
    adamw_elem(&c, &p[i], g[i], zt_bf16_to_f32(m[i]), zt_bf16_to_f32(v[i]), &mi, &vi);
    uint64_t r = zt_sr_bits(key, index0 + i);
    m[i] = zt_bf16_round_sr(zt__f32_bits(mi), (uint32_t)r);
    v[i] = zt_bf16_round_sr(zt__f32_bits(vi), (uint32_t)(r >> 16));
  }
  if (lp_t != ZT_F32) zt__cpu_cast(ctx, p_lp, lp_t, p, ZT_F32, n);
}
