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
#include "engine/kernels/sround.h"
#include "offload/cpu_adam.h"

/* One element's update from its moments m0 and v0, in engine/kernels/cpu/adamw.c's order: the
 * new parameter, the new moments in *mi and *vi. Every path's element, whatever the moments'
 * type. */
static inline float zt__adam_elem(const zt_adam_consts *c, float p, float g, float m0, float v0,
                                  float *mi, float *vi) {
  float gi = g * c->grad_scale;
  float pi = p * c->decay;
  *mi = c->w1 < 0.5f ? m0 + c->w1 * (gi - m0) : gi - (gi - m0) * c->one_minus_w1;
  *vi = v0 * c->beta2 + c->w2 * gi * gi;
  float denom = sqrtf(*vi) / c->bc2_sqrt + c->eps;
  return pi + c->neg_step_size * *mi / denom;
}

/* The compute copies of element i. The bf16 and fp16 copies are the CPU backend's casts
 * themselves (engine/kernels/dtype.h), so they are the copies the backend's adamw_dt and
 * adamw_sr write. */
static inline void zt__adam_copies(float p, uint16_t *p_bf16, uint16_t *p_fp16, size_t i) {
  if (p_bf16) p_bf16[i] = zt_f32_to_bf16(p);
  if (p_fp16) p_fp16[i] = zt_f32_to_f16(p);
}

/* Element i with fp32 moments. */
static inline void zt__adam_one(const zt_adam_consts *c, float *p, const float *g, float *m,
                                float *v, uint16_t *p_bf16, uint16_t *p_fp16, size_t i) {
  p[i] = zt__adam_elem(c, p[i], g[i], m[i], v[i], &m[i], &v[i]);
  zt__adam_copies(p[i], p_bf16, p_fp16, i);
}

/* The bf16 moments of element i stored from their fp32 values, rounded stochastically: bits
 * 0..15 of the element's counter bits round m, bits 16..31 v (cpu/adamw.c's adamw_sr). */
static inline void zt__adam_store_sr(const zt_adam_consts *c, uint16_t *m, uint16_t *v, float mi,
                                     float vi, size_t i, uint64_t index) {
  uint64_t r = zt_sr_bits(c->sr_key, index);
  m[i] = zt_bf16_round_sr(zt__f32_bits(mi), (uint32_t)r);
  v[i] = zt_bf16_round_sr(zt__f32_bits(vi), (uint32_t)(r >> 16));
}

/* Element i with bf16 moments, widened exactly; index0 is element 0's flat index. */
static inline void zt__adam_one_bf16(const zt_adam_consts *c, float *p, const float *g,
                                     uint16_t *m, uint16_t *v, uint16_t *p_bf16,
                                     uint16_t *p_fp16, size_t i, uint64_t index0) {
  float mi, vi;
  p[i] = zt__adam_elem(c, p[i], g[i], zt_bf16_to_f32(m[i]), zt_bf16_to_f32(v[i]), &mi, &vi);
  zt__adam_store_sr(c, m, v, mi, vi, i, index0 + i);
  zt__adam_copies(p[i], p_bf16, p_fp16, i);
}

void zt__cpu_adam_scalar(const zt_adam_consts *c, float *p, const float *g, float *m, float *v,
                         uint16_t *p_bf16, uint16_t *p_fp16, size_t n);
void zt__cpu_adam_avx2(const zt_adam_consts *c, float *p, const float *g, float *m, float *v,
                       uint16_t *p_bf16, uint16_t *p_fp16, size_t n);
void zt__cpu_adam_avx512(const zt_adam_consts *c, float *p, const float *g, float *m, float *v,
                         uint16_t *p_bf16, uint16_t *p_fp16, size_t n);
/* bf16 moments (zt_cpu_adam_run_bf16) */
void zt__cpu_adam_bf16_scalar(const zt_adam_consts *c, float *p, const float *g, uint16_t *m,
                              uint16_t *v, uint16_t *p_bf16, uint16_t *p_fp16, size_t n,
                              uint64_t index0);
void zt__cpu_adam_bf16_avx2(const zt_adam_consts *c, float *p, const float *g, uint16_t *m,
                            uint16_t *v, uint16_t *p_bf16, uint16_t *p_fp16, size_t n,
                            uint64_t index0);
void zt__cpu_adam_bf16_avx512(const zt_adam_consts *c, float *p, const float *g, uint16_t *m,
                              uint16_t *v, uint16_t *p_bf16, uint16_t *p_fp16, size_t n,
                              uint64_t index0);

#endif
