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

/* 16 bf16 -> 16 floats, exact */
static inline __m512 load_bf16(const uint16_t *src) {
  __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)src));
  return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}

/* The step's constants in lanes. */
typedef struct lanes {
  __m512 grad_scale, decay, w1, one_minus_w1, w2, beta2, bc2_sqrt, eps, neg_step_size;
  int lerp_low;
} lanes;

static inline lanes lanes_of(const zt_adam_consts *c) {
  return (lanes){.grad_scale = _mm512_set1_ps(c->grad_scale), .decay = _mm512_set1_ps(c->decay),
                 .w1 = _mm512_set1_ps(c->w1), .one_minus_w1 = _mm512_set1_ps(c->one_minus_w1),
                 .w2 = _mm512_set1_ps(c->w2), .beta2 = _mm512_set1_ps(c->beta2),
                 .bc2_sqrt = _mm512_set1_ps(c->bc2_sqrt), .eps = _mm512_set1_ps(c->eps),
                 .neg_step_size = _mm512_set1_ps(c->neg_step_size), .lerp_low = c->w1 < 0.5f};
}

/* 16 elements' update from their moments m0 and v0: zt__adam_elem lane by lane. */
static inline __m512 update(const lanes *k, __m512 p, __m512 g, __m512 m0, __m512 v0, __m512 *mi,
                            __m512 *vi) {
  __m512 gi = _mm512_mul_ps(g, k->grad_scale);
  __m512 pi = _mm512_mul_ps(p, k->decay);
  *mi = k->lerp_low ? _mm512_add_ps(m0, _mm512_mul_ps(k->w1, _mm512_sub_ps(gi, m0)))
                    : _mm512_sub_ps(gi, _mm512_mul_ps(_mm512_sub_ps(gi, m0), k->one_minus_w1));
  *vi = _mm512_add_ps(_mm512_mul_ps(v0, k->beta2), _mm512_mul_ps(_mm512_mul_ps(k->w2, gi), gi));
  __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(*vi), k->bc2_sqrt), k->eps);
  return _mm512_add_ps(pi, _mm512_div_ps(_mm512_mul_ps(k->neg_step_size, *mi), denom));
}

static inline void store_copies(__m512 pn, uint16_t *p_bf16, uint16_t *p_fp16, size_t i) {
  if (p_bf16) store_bf16(p_bf16 + i, pn);
  if (p_fp16) store_fp16(p_fp16 + i, pn);
}

void zt__cpu_adam_avx512(const zt_adam_consts *c, float *p, const float *g, float *m, float *v,
                         uint16_t *p_bf16, uint16_t *p_fp16, size_t n) {
  const lanes k = lanes_of(c);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 mi, vi;
    __m512 pn = update(&k, _mm512_loadu_ps(p + i), _mm512_loadu_ps(g + i), _mm512_loadu_ps(m + i),
                       _mm512_loadu_ps(v + i), &mi, &vi);
    _mm512_storeu_ps(p + i, pn);
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    store_copies(pn, p_bf16, p_fp16, i);
  }
  for (; i < n; i++) zt__adam_one(c, p, g, m, v, p_bf16, p_fp16, i);
}

/* a * b mod 2^64 in 8 lanes from 32 x 32 -> 64-bit products (AVX-512F has no 64-bit mullo) */
static inline __m512i mul64(__m512i a, __m512i b) {
  __m512i cross = _mm512_add_epi64(_mm512_mul_epu32(_mm512_srli_epi64(a, 32), b),
                                   _mm512_mul_epu32(a, _mm512_srli_epi64(b, 32)));
  return _mm512_add_epi64(_mm512_mul_epu32(a, b), _mm512_slli_epi64(cross, 32));
}

/* zt_sr_mix in 8 lanes */
static inline __m512i mix(__m512i x) {
  x = _mm512_add_epi64(x, _mm512_set1_epi64((long long)0x9e3779b97f4a7c15ull));
  x = mul64(_mm512_xor_si512(x, _mm512_srli_epi64(x, 30)),
            _mm512_set1_epi64((long long)0xbf58476d1ce4e5b9ull));
  x = mul64(_mm512_xor_si512(x, _mm512_srli_epi64(x, 27)),
            _mm512_set1_epi64((long long)0x94d049bb133111ebull));
  return _mm512_xor_si512(x, _mm512_srli_epi64(x, 31));
}

/* zt_bf16_round_sr of 16 lanes with the 16 random bits in the low half of each r lane */
static inline __m256i round_sr(__m512 x, __m512i r) {
  __m512i u = _mm512_castps_si512(x);
  __m512i t = _mm512_add_epi32(u, _mm512_and_si512(r, _mm512_set1_epi32(0xffff)));
  t = _mm512_srli_epi32(t, 16);
  __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, t, _mm512_set1_epi32(0x7fc0)));
}

/* bf16 moments: widened, updated and rounded in lanes, the counter bits of 16 indices at once
 * (zt__adam_store_sr's bits: r's bits 0..15 round m, 16..31 v) */
void zt__cpu_adam_bf16_avx512(const zt_adam_consts *c, float *p, const float *g, uint16_t *m,
                              uint16_t *v, uint16_t *p_bf16, uint16_t *p_fp16, size_t n,
                              uint64_t index0) {
  const lanes k = lanes_of(c);
  const __m512i key = _mm512_set1_epi64((long long)c->sr_key);
  const __m512i lane = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 mi, vi;
    __m512 pn = update(&k, _mm512_loadu_ps(p + i), _mm512_loadu_ps(g + i), load_bf16(m + i),
                       load_bf16(v + i), &mi, &vi);
    __m512i at = _mm512_add_epi64(_mm512_set1_epi64((long long)(index0 + i)), lane);
    __m256i lo = _mm512_cvtepi64_epi32(mix(_mm512_xor_si512(key, at)));
    __m256i hi = _mm512_cvtepi64_epi32(
        mix(_mm512_xor_si512(key, _mm512_add_epi64(at, _mm512_set1_epi64(8)))));
    __m512i r = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); /* low words of 16 */
    _mm512_storeu_ps(p + i, pn);
    _mm256_storeu_si256((__m256i *)(m + i), round_sr(mi, r));
    _mm256_storeu_si256((__m256i *)(v + i), round_sr(vi, _mm512_srli_epi32(r, 16)));
    store_copies(pn, p_bf16, p_fp16, i);
  }
  for (; i < n; i++) zt__adam_one_bf16(c, p, g, m, v, p_bf16, p_fp16, i, index0);
}
