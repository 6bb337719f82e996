/* Storage types of activations and of the compute copy of the parameters, and the host-side
 * conversions of the CPU reference (round to nearest, ties to even, like torch's .to() and
 * CUDA's __float2bfloat16_rn / __float2half_rn). Arithmetic is always done in fp32: a bf16 or
 * fp16 value is only ever stored, widened exactly to fp32, and rounded back once. */
#ifndef ZT_KERNELS_DTYPE_H
#define ZT_KERNELS_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum zt_dtype { ZT_F32 = 0, ZT_BF16 = 1, ZT_F16 = 2 } zt_dtype;

static inline size_t zt_dtype_size(zt_dtype t) { return t == ZT_F32 ? 4 : 2; }

/* "fp32" | "bf16" | "fp16": the job spec's train.precision names. */
static inline const char *zt_dtype_name(zt_dtype t) {
  return t == ZT_BF16 ? "bf16" : t == ZT_F16 ? "fp16" : "fp32";
}

/* 0 and *out set for a known name, else -1. */
static inline int zt_dtype_parse(const char *s, zt_dtype *out) {
  static const zt_dtype all[] = {ZT_F32, ZT_BF16, ZT_F16};
  for (size_t i = 0; s && i < sizeof all / sizeof all[0]; i++)
    if (!strcmp(s, zt_dtype_name(all[i]))) {
      *out = all[i];
      return 0;
    }
  return -1;
}

static inline uint32_t zt__f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float zt__bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static inline uint16_t zt_f32_to_bf16(float f) {
  uint32_t u = zt__f32_bits(f);
  /* a NaN becomes the canonical quiet NaN, as torch's c10::BFloat16 has it (the CPU AdamW's SIMD
   * paths write the same) */
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  /* adding 0x7fff plus the lowest kept bit rounds ties to even; a carry out of the mantissa
   * bumps the exponent, and FLT_MAX-sized values correctly become inf */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline float zt_bf16_to_f32(uint16_t h) { return zt__bits_f32((uint32_t)h << 16); }

static inline uint16_t zt_f32_to_f16(float f) {
  uint32_t x = zt__f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return sign | 0x7e00u;    /* nan */
  if (ax >= 0x477ff000u) return sign | 0x7c00u;   /* >= 65520 (the tie above 65504) -> inf */
  if (ax >= 0x38800000u) {                        /* normal half: rebias the exponent */
    uint32_t r = ax - 0x38000000u;
    return sign | (uint16_t)((r + 0xfffu + ((r >> 13) & 1u)) >> 13);
  }
  if (ax <= 0x33000000u) return sign;             /* <= 2^-25, the tie with 0: rounds to 0 */
  /* subnormal half: the value in units of 2^-24, rounded to nearest even */
  uint32_t m = (ax & 0x7fffffu) | 0x800000u;
  int shift = 126 - (int)(ax >> 23);              /* 14..24 */
  uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (h & 1u))) h++;
  return sign | (uint16_t)h;
}

static inline float zt_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) { /* zero or subnormal: m * 2^-24, exact in float */
    float v = (float)m * 0x1p-24f;
    return sign ? -v : v;
  }
  if (e == 31) return zt__bits_f32(sign | 0x7f800000u | (m << 13));
  return zt__bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

/* x rounded to t and widened back: what storing x in a tensor of type t keeps. */
static inline float zt_dtype_round(zt_dtype t, float x) {
  return t == ZT_BF16 ? zt_bf16_to_f32(zt_f32_to_bf16(x))
         : t == ZT_F16 ? zt_f16_to_f32(zt_f32_to_f16(x))
                       : x;
}

#endif
