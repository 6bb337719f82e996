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

/* 8 bf16 -> 8 floats, exact */
static inline __m256 load_bf16(const uint16_t *src) {
  __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)src));
  return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

/* The step's constants in lanes. */
typedef struct lanes {
  __m256 grad_scale, decay, w1, one_minus_w1, w2, beta2, bc2_sqrt, eps, neg_step_size;
  int lerp_low;
} lanes;

static inline lanes lanes_of(const zt_adam_consts *c) {
  return (lanes){.grad_scale = _mm256_set1_ps(c->grad_scale), .decay = _mm256_set1_ps(c->decay),
                 .w1 = _mm256_set1_ps(c->w1), .one_minus_w1 = _mm256_set1_ps(c->one_minus_w1),
                 .w2 = _mm256_set1_ps(c->w2), .beta2 = _mm256_set1_ps(c->beta2),
                 .bc2_sqrt = _mm256_set1_ps(c->bc2_sqrt), .eps = _mm256_set1_ps(c->eps),
                 .neg_step_size = _mm256_set1_ps(c->neg_step_size), .lerp_low = c->w1 < 0.5f};
}

/* 8 elements' update from their moments m0 and v0: zt__adam_elem lane by lane. */
static inline __m256 update(const lanes *k, __m256 p, __m256 g, __m256 m0, __m256 v0, __m256 *mi,
                            __m256 *vi) {
  __m256 gi = _mm256_mul_ps(g, k->grad_scale);
  __m256 pi = _mm256_mul_ps(p, k->decay);
  *mi = k->lerp_low ? _mm256_add_ps(m0, _mm256_mul_ps(k->w1, _mm256_sub_ps(gi, m0)))
                    : _mm256_sub_ps(gi, _mm256_mul_ps(_mm256_sub_ps(gi, m0), k->one_minus_w1));
  *vi = _mm256_add_ps(_mm256_mul_ps(v0, k->beta2), _mm256_mul_ps(_mm256_mul_ps(k->w2, gi), gi));
  __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(*vi), k->bc2_sqrt), k->eps);
  return _mm256_add_ps(pi, _mm256_div_ps(_mm256_mul_ps(k->neg_step_size, *mi), denom));
}

static inline void store_copies(__m256 pn, uint16_t *p_bf16, uint16_t *p_fp16, size_t i) {
  if (p_bf16) store_bf16(p_bf16 + i, pn);
  if (p_fp16) store_fp16(p_fp16 + i, pn);
}

void zt__cpu_adam_avx2(const zt_adam_consts *c, float *p, const float *g, float *m, float *v,
                       uint16_t *p_bf16, uint16_t *p_fp16, size_t n) {
  const lanes k = lanes_of(c);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 mi, vi;
    __m256 pn = update(&k, _mm256_loadu_ps(p + i), _mm256_loadu_ps(g + i), _mm256_loadu_ps(m + i),
                       _mm256_loadu_ps(v + i), &mi, &vi);
    _mm256_storeu_ps(p + i, pn);
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    store_copies(pn, p_bf16, p_fp16, i);
  }
  for (; i < n; i++) zt__adam_one(c, p, g, m, v, p_bf16, p_fp16, i);
}

/* bf16 moments: widened in lanes, updated in lanes, rounded element by element (the counter
 * hash is 64-bit integer work, scalar here). */
void zt__cpu_adam_bf16_avx2(const zt_adam_consts *c, float *p, const float *g, uint16_t *m,
                            uint16_t *v, uint16_t *p_bf16, uint16_t *p_fp16, size_t n,
                            uint64_t index0) {
  const lanes k = lanes_of(c);
  float mf[8], vf[8];
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 mi, vi;
    __m256 pn = update(&k, _mm256_loadu_ps(p + i), _mm256_loadu_ps(g + i), load_bf16(m + i),
                       load_bf16(v + i), &mi, &vi);
    _mm256_storeu_ps(p + i, pn);
    _mm256_storeu_ps(mf, mi);
    _mm256_storeu_ps(vf, vi);
    for (int j = 0; j < 8; j++)
      zt__adam_store_sr(c, m + i, v + i, mf[j], vf[j], (size_t)j, index0 + i + j);
    store_copies(pn, p_bf16, p_fp16, i);
  }
  for (; i < n; i++) zt__adam_one_bf16(c, p, g, m, v, p_bf16, p_fp16, i, index0);
}
