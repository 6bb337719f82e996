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

/* a * b mod 2^64 in 4 lanes from 32 x 32 -> 64-bit products (AVX2 has no 64-bit mullo) */
static inline __m256i mul64(__m256i a, __m256i b) {
  __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), b),
                                   _mm256_mul_epu32(a, _mm256_srli_epi64(b, 32)));
  return _mm256_add_epi64(_mm256_mul_epu32(a, b), _mm256_slli_epi64(cross, 32));
}

/* zt_sr_mix in 4 lanes */
static inline __m256i mix(__m256i x) {
  x = _mm256_add_epi64(x, _mm256_set1_epi64x((long long)0x9e3779b97f4a7c15ull));
  x = mul64(_mm256_xor_si256(x, _mm256_srli_epi64(x, 30)),
            _mm256_set1_epi64x((long long)0xbf58476d1ce4e5b9ull));
  x = mul64(_mm256_xor_si256(x, _mm256_srli_epi64(x, 27)),
            _mm256_set1_epi64x((long long)0x94d049bb133111ebull));
  return _mm256_xor_si256(x, _mm256_srli_epi64(x, 31));
}

/* zt_bf16_round_sr of 8 lanes with the 16 random bits in the low half of each r lane, stored */
static inline void store_sr(uint16_t *dst, __m256 x, __m256i r) {
  __m256i u = _mm256_castps_si256(x);
  __m256i t = _mm256_add_epi32(u, _mm256_and_si256(r, _mm256_set1_epi32(0xffff)));
  t = _mm256_srli_epi32(t, 16);
  __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  t = _mm256_blendv_epi8(t, _mm256_set1_epi32(0x7fc0), nan);
  __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
  _mm_storeu_si128((__m128i *)dst, packed);
}

/* bf16 moments: widened, updated and rounded in lanes, the counter bits of 8 indices at once
 * (zt__adam_store_sr's bits: r's bits 0..15 round m, 16..31 v) */
void zt__cpu_adam_bf16_avx2(const zt_adam_consts *c, float *p, const float *g, uint16_t *m,
                            uint16_t *v, uint16_t *p_bf16, uint16_t *p_fp16, size_t n,
                            uint64_t index0) {
  const lanes k = lanes_of(c);
  const __m256i key = _mm256_set1_epi64x((long long)c->sr_key);
  const __m256i lane = _mm256_set_epi64x(3, 2, 1, 0);
  const __m256i low_words = _mm256_set_epi32(6, 4, 2, 0, 6, 4, 2, 0);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 mi, vi;
    __m256 pn = update(&k, _mm256_loadu_ps(p + i), _mm256_loadu_ps(g + i), load_bf16(m + i),
                       load_bf16(v + i), &mi, &vi);
    __m256i at = _mm256_add_epi64(_mm256_set1_epi64x((long long)(index0 + i)), lane);
    __m256i lo = mix(_mm256_xor_si256(key, at));
    __m256i hi = mix(_mm256_xor_si256(key, _mm256_add_epi64(at, _mm256_set1_epi64x(4))));
    /* the low words of the 8 lanes' bits, in index order */
    __m256i r = _mm256_blend_epi32(_mm256_permutevar8x32_epi32(lo, low_words),
                                   _mm256_permutevar8x32_epi32(hi, low_words), 0xf0);
    _mm256_storeu_ps(p + i, pn);
    store_sr(m + i, mi, r);
    store_sr(v + i, vi, _mm256_srli_epi32(r, 16));
    store_copies(pn, p_bf16, p_fp16, i);
  }
  for (; i < n; i++) zt__adam_one_bf16(c, p, g, m, v, p_bf16, p_fp16, i, index0);
}
