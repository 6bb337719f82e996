/* defines: the stochastic rounding of the bf16 AdamW state (train.optimizer.state_dtype "bf16",
 * docs/spec.md "Optimizer state"). Called by the adamw_sr op of both backends (cpu/adamw.c,
 * cuda/adamw.cu) and by tests/unit/kernels/test_kernels_adamw_sr.c.
 *
 * The random bits of element i of a step come from a counter, never a stream: splitmix64 of
 * (seed, step, i) where i is the element's index in the model's flat parameter vector. So a
 * value is rounded the same whichever thread, kernel, unit or rank updates it. Integer-only
 * and header-only so that host code and CUDA device code share the very same bits. */
#ifndef ZT_KERNELS_SROUND_H
#define ZT_KERNELS_SROUND_H

#include <stdint.h>

#ifdef __CUDACC__
#define ZT__SR_HD __host__ __device__ __forceinline__
#else
#define ZT__SR_HD static inline
#endif

/* splitmix64's finaliser (Steele, Lea, Flood 2014) */
ZT__SR_HD uint64_t zt_sr_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* The key of one AdamW step (t >= 1), computed once per call. */
ZT__SR_HD uint64_t zt_sr_key(uint64_t seed, int step) {
  return zt_sr_mix(zt_sr_mix(seed) ^ (uint64_t)(uint32_t)step);
}

/* 64 random bits of parameter index i at that step: bits 0..15 round m, bits 16..31 round v. */
ZT__SR_HD uint64_t zt_sr_bits(uint64_t key, uint64_t i) { return zt_sr_mix(key ^ i); }

/* The fp32 value of bits u rounded to bf16 stochastically with the 16 random bits r: its
 * magnitude goes up one bf16 ulp with probability (dropped bits) / 2^16, else it is truncated,
 * so the expected value is u's own. Inf stays inf (its low bits are zero); the largest finite
 * values may round to inf, as rounding up there must; a NaN becomes the canonical quiet NaN. */
ZT__SR_HD uint16_t zt_bf16_round_sr(uint32_t u, uint32_t r) {
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  return (uint16_t)((u + (r & 0xffffu)) >> 16);
}

#endif
