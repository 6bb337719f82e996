/* Internals of cpu_adam: the per-element update every path shares (the SIMD paths use it for
 * their tails) and the kernels of each ISA. Every file including this is compiled with
 * -ffp-contract=off: the expressions below must not become fused multiply-adds. */
#ifndef ZT_OFFLOAD_CPU_ADAM_KERNELS_H
#define ZT_OFFLOAD_CPU_ADAM_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "engine/kernels/dtype.h"
#include "offload/cpu_adam.h"

/* One element, in engine/kernels/cpu/adamw.c's order. The bf16 and fp16 copies are the CPU
 * backend's casts themselves (engine/kernels/dtype.h), so they are the copies the backend's
 * adamw_dt writes. */
static inline void zt__adam_one(const zt_adam_consts *c, float *p, const float *g, float *m,
                                float *v, uint16_t *p_bf16, uint16_t *p_fp16, size_t i) {
  float gi = g[i] * c->grad_scale;
  float pi = p[i] * c->decay;
  float mi = c->w1 < 0.5f ? m[i] + c->w1 * (gi - m[i]) : gi - (gi - m[i]) * c->one_minus_w1;
  float vi = v[i] * c->beta2 + c->w2 * gi * gi;
  float denom = sqrtf(vi) / c->bc2_sqrt + c->eps;
  p[i] = pi + c->neg_step_size * mi / denom;
  m[i] = mi;
  v[i] = vi;
  if (p_bf16) p_bf16[i] = zt_f32_to_bf16(p[i]);
  if (p_fp16) p_fp16[i] = zt_f32_to_f16(p[i]);
}

void zt__cpu_adam_scalar(const zt_adam_consts *c, float *p, const float *g, float *m, float *v,
                         uint16_t *p_bf16, uint16_t *p_fp16, size_t n);
void zt__cpu_adam_avx2(const zt_adam_consts *c, float *p, const float *g, float *m, float *v,
                       uint16_t *p_bf16, uint16_t *p_fp16, size_t n);
void zt__cpu_adam_avx512(const zt_adam_consts *c, float *p, const float *g, float *m, float *v,
                         uint16_t *p_bf16, uint16_t *p_fp16, size_t n);

#endif
