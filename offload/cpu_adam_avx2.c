/* AdamW, 8 lanes (AVX2). Compiled with -mavx2 -mf16c and -ffp-contract=off only: without FMA
 * in the target, no multiply-add can be fused, and each intrinsic below is one correctly rounded
 * IEEE operation, in the scalar path's order, so the results are bitwise the scalar ones. */
#include <immintrin.h>

#include "offload/cpu_adam_kernels.h"

/* 8 floats -> 8 bf16, rounded to nearest even, NaN -> 0x7fc0 */
static inline void store_bf16(uint16_t *dst, __m256 x) {
  __m256i u = _mm256_castps_si256(x);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), nan);
  __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storeu_si128((__m128i *)dst, packed);
}

/* 8 floats -> 8 fp16 by F16C, rounded to nearest even (overflow to inf, subnormals exact). F16C
 * would keep a NaN's payload; the scalar path (the CPU backend's cast) writes the quiet NaN of
 * its sign, so a NaN lane is made that NaN first. */
static inline void store_fp16(uint16_t *dst, __m256 x) {
  __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  __m256 quiet = _mm256_or_ps(_mm256_and_ps(x, _mm256_set1_ps(-0.0f)),
                              _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)));
  x = _mm256_blendv_ps(x, quiet, nan);
  _mm_storeu_si128((__m128i *)dst, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
}

void zt__cpu_adam_avx2(const zt_adam_consts *c, float *p, const float *g, float *m, float *v,
                       uint16_t *p_bf16, uint16_t *p_fp16, size_t n) {
  const __m256 grad_scale = _mm256_set1_ps(c->grad_scale), decay = _mm256_set1_ps(c->decay);
  const __m256 w1 = _mm256_set1_ps(c->w1), one_minus_w1 = _mm256_set1_ps(c->one_minus_w1);
  const __m256 w2 = _mm256_set1_ps(c->w2), beta2 = _mm256_set1_ps(c->beta2);
  const __m256 bc2_sqrt = _mm256_set1_ps(c->bc2_sqrt), eps = _mm256_set1_ps(c->eps);
  const __m256 neg_step_size = _mm256_set1_ps(c->neg_step_size);
  const int lerp_low = c->w1 < 0.5f;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 gi = _mm256_mul_ps(_mm256_loadu_ps(g + i), grad_scale);
    __m256 pi = _mm256_mul_ps(_mm256_loadu_ps(p + i), decay);
    __m256 m0 = _mm256_loadu_ps(m + i);
    __m256 mi = lerp_low ? _mm256_add_ps(m0, _mm256_mul_ps(w1, _mm256_sub_ps(gi, m0)))
                         : _mm256_sub_ps(gi, _mm256_mul_ps(_mm256_sub_ps(gi, m0), one_minus_w1));
    __m256 vi = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i), beta2),
                              _mm256_mul_ps(_mm256_mul_ps(w2, gi), gi));
    __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc2_sqrt), eps);
    __m256 pn = _mm256_add_ps(pi, _mm256_div_ps(_mm256_mul_ps(neg_step_size, mi), denom));
    _mm256_storeu_ps(p + i, pn);
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    if (p_bf16) store_bf16(p_bf16 + i, pn);
    if (p_fp16) store_fp16(p_fp16 + i, pn);
  }
  for (; i < n; i++) zt__adam_one(c, p, g, m, v, p_bf16, p_fp16, i);
}
