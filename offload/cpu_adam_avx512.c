/* AdamW, 16 lanes (AVX-512F). Compiled with -mavx512f and -ffp-contract=off: as in the AVX2
 * path, every intrinsic is one correctly rounded IEEE operation in the scalar order, none fused,
 * so results are bitwise the scalar ones. (gcc expands these intrinsics to plain vector `*` and
 * `+`, which it would contract into FMAs under -ffp-contract=fast on a target with FMA.) */
#include <immintrin.h>

#include "offload/cpu_adam_kernels.h"

/* 16 floats -> 16 bf16, rounded to nearest even, NaN -> 0x7fc0 */
static inline void store_bf16(uint16_t *dst, __m512 x) {
  __m512i u = _mm512_castps_si512(x);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  r = _mm512_mask_blend_epi32(nan, r, _mm512_set1_epi32(0x7fc0));
  _mm256_storeu_si256((__m256i *)dst, _mm512_cvtepi32_epi16(r));
}

/* 16 floats -> 16 fp16, rounded to nearest even (overflow to inf, subnormals exact); a NaN lane
 * becomes the quiet NaN of its sign first, as in the scalar path (the conversion would keep the
 * payload). */
static inline void store_fp16(uint16_t *dst, __m512 x) {
  __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  __m512i quiet = _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(x),
                                                   _mm512_set1_epi32((int)0x80000000u)),
                                  _mm512_set1_epi32(0x7fc00000));
  x = _mm512_mask_blend_ps(nan, x, _mm512_castsi512_ps(quiet));
  _mm256_storeu_si256((__m256i *)dst, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
}

void zt__cpu_adam_avx512(const zt_adam_consts *c, float *p, const float *g, float *m, float *v,
                         uint16_t *p_bf16, uint16_t *p_fp16, size_t n) {
  const __m512 grad_scale = _mm512_set1_ps(c->grad_scale), decay = _mm512_set1_ps(c->decay);
  const __m512 w1 = _mm512_set1_ps(c->w1), one_minus_w1 = _mm512_set1_ps(c->one_minus_w1);
  const __m512 w2 = _mm512_set1_ps(c->w2), beta2 = _mm512_set1_ps(c->beta2);
  const __m512 bc2_sqrt = _mm512_set1_ps(c->bc2_sqrt), eps = _mm512_set1_ps(c->eps);
  const __m512 neg_step_size = _mm512_set1_ps(c->neg_step_size);
  const int lerp_low = c->w1 < 0.5f;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 gi = _mm512_mul_ps(_mm512_loadu_ps(g + i), grad_scale);
    __m512 pi = _mm512_mul_ps(_mm512_loadu_ps(p + i), decay);
    __m512 m0 = _mm512_loadu_ps(m + i);
    __m512 mi = lerp_low ? _mm512_add_ps(m0, _mm512_mul_ps(w1, _mm512_sub_ps(gi, m0)))
                         : _mm512_sub_ps(gi, _mm512_mul_ps(_mm512_sub_ps(gi, m0), one_minus_w1));
    __m512 vi = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(v + i), beta2),
                              _mm512_mul_ps(_mm512_mul_ps(w2, gi), gi));
    __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), bc2_sqrt), eps);
    __m512 pn = _mm512_add_ps(pi, _mm512_div_ps(_mm512_mul_ps(neg_step_size, mi), denom));
    _mm512_storeu_ps(p + i, pn);
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    if (p_bf16) store_bf16(p_bf16 + i, pn);
    if (p_fp16) store_fp16(p_fp16 + i, pn);
  }
  for (; i < n; i++) zt__adam_one(c, p, g, m, v, p_bf16, p_fp16, i);
}
