/* adamw_sr, AdamW with bf16 m and v (train.optimizer.state_dtype "bf16"):
 *   - the counter hash is splitmix64 (its published first output);
 *   - the CPU op equals, bit for bit, a scalar reference written here from the same hash,
 *     over several steps, with and without the compute copy, on 1 and 4 threads, and cut into
 *     calls at any place (index0): the placement independence the offloaded and data-parallel
 *     walks will rely on;
 *   - the rounding is unbiased: the mean of many stochastically rounded values is the fp32
 *     value within 4 standard errors, where round-to-nearest is visibly off. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/dtype.h"
#include "engine/kernels/ops.h"
#include "engine/kernels/sround.h"
#include "tests/unit/kernels/kcheck.h"

#define N 70001 /* above the CPU's parallel threshold, odd */
#define SEED 1234567u

typedef struct hyper {
  float lr, beta1, beta2, eps, wd, grad_scale;
} hyper;

/* The reference: one element at a time, cpu/adamw.c's order, the bits of sround.h. */
static void ref_step(float *p, const float *g, uint16_t *m, uint16_t *v, uint16_t *p_lp,
                     size_t n, hyper h, int t, uint64_t index0) {
  float decay = (float)(1.0 - (double)h.lr * h.wd);
  float w1 = (float)(1.0 - (double)h.beta1), w2 = (float)(1.0 - (double)h.beta2);
  float neg_step = (float)(-((double)h.lr / (1.0 - pow(h.beta1, t))));
  float bc2_sqrt = (float)sqrt(1.0 - pow(h.beta2, t));
  uint64_t key = zt_sr_key(SEED, t);
  for (size_t i = 0; i < n; i++) {
    float gi = g[i] * h.grad_scale, pi = p[i] * decay;
    float m0 = zt_bf16_to_f32(m[i]), v0 = zt_bf16_to_f32(v[i]);
    float mi = w1 < 0.5f ? m0 + w1 * (gi - m0) : gi - (gi - m0) * (1.0f - w1);
    float vi = v0 * h.beta2 + w2 * gi * gi;
    p[i] = pi + neg_step * mi / (sqrtf(vi) / bc2_sqrt + h.eps);
    uint64_t r = zt_sr_bits(key, index0 + i);
    m[i] = zt_bf16_round_sr(zt__f32_bits(mi), (uint32_t)r);
    v[i] = zt_bf16_round_sr(zt__f32_bits(vi), (uint32_t)(r >> 16));
    if (p_lp) p_lp[i] = zt_f32_to_bf16(p[i]);
  }
}

/* steps of the op on [0, N) in pieces cut at `cut` (0: one call) against the reference */
static int run(int threads, hyper h, int steps, size_t cut, int with_copy) {
  zt_backend be;
  if (zt_backend_cpu_open(&be, threads) < 0) return 1;
  kc_rng rng;
  kc_seed(&rng, 7);
  float *p = kc_random(&rng, N, -1, 1), *g = kc_floats(N), *rp = kc_copy(p, N);
  uint16_t *m = calloc(N, 2), *v = calloc(N, 2), *rm = calloc(N, 2), *rv = calloc(N, 2);
  uint16_t *lp = calloc(N, 2), *rlp = calloc(N, 2);
  int fail = !m || !v || !rm || !rv || !lp || !rlp;
  for (int t = 1; t <= steps && !fail; t++) {
    kc_fill(&rng, g, N, -2, 2);
    size_t len = cut ? cut : N;
    for (size_t a = 0; a < N; a += len) {
      size_t n = N - a < len ? N - a : len;
      be.ops->adamw_sr(be.ctx, p + a, g + a, m + a, v + a, n, h.lr, h.beta1, h.beta2, h.eps,
                       h.wd, t, h.grad_scale, with_copy ? lp + a : NULL,
                       with_copy ? ZT_BF16 : ZT_F32, SEED, a);
    }
    ref_step(rp, g, rm, rv, with_copy ? rlp : NULL, N, h, t, 0);
  }
  fail |= KC_EXPECT(!memcmp(p, rp, N * sizeof *p) && !memcmp(m, rm, N * 2) &&
                        !memcmp(v, rv, N * 2) && !memcmp(lp, rlp, N * 2),
                    "adamw_sr (%d threads, %d steps, cut %zu, copy %d) is not the reference's "
                    "bits", threads, steps, cut, with_copy);
  /* the moments did move: a test of zeros would prove nothing */
  size_t moved = 0;
  for (size_t i = 0; i < N; i++) moved += m[i] != 0 && v[i] != 0;
  fail |= KC_EXPECT(moved > N / 2, "only %zu of %d moments are non-zero", moved, N);
  free(p), free(g), free(rp), free(m), free(v), free(rm), free(rv), free(lp), free(rlp);
  zt_backend_cpu_close(&be);
  return fail;
}

/* One step from zero moments with one gradient value everywhere: every m is the same fp32
 * value rounded with other bits. Its mean must be that value, not round-to-nearest's. */
static int unbiased(float gval) {
  zt_backend be;
  if (zt_backend_cpu_open(&be, 0) < 0) return 1;
  float *p = kc_floats(N), *g = kc_floats(N);
  uint16_t *m = calloc(N, 2), *v = calloc(N, 2);
  int fail = !m || !v;
  for (size_t i = 0; i < N; i++) g[i] = gval;
  if (!fail)
    be.ops->adamw_sr(be.ctx, p, g, m, v, N, 1e-3f, 0.9f, 0.999f, 1e-8f, 0, 1, 1.0f, NULL,
                     ZT_F32, SEED, 0);
  /* the fp32 values the op rounds (cpu/adamw.c's expressions from m = v = 0) */
  float w1 = (float)(1.0 - 0.9), w2 = (float)(1.0 - (double)0.999f);
  float want[2] = {0.0f + w1 * (gval - 0.0f), 0.0f * 0.999f + w2 * gval * gval};
  uint16_t *got[2] = {m, v};
  for (int k = 0; k < 2 && !fail; k++) {
    uint16_t lo = (uint16_t)(zt__f32_bits(want[k]) >> 16);
    double down = zt_bf16_to_f32(lo), up = zt_bf16_to_f32((uint16_t)(lo + 1));
    double frac = (want[k] - down) / (up - down), sum = 0;
    size_t other = 0;
    for (size_t i = 0; i < N; i++) {
      sum += zt_bf16_to_f32(got[k][i]);
      other += got[k][i] != lo && got[k][i] != lo + 1;
    }
    double mean = sum / N, se = fabs(up - down) * sqrt(frac * (1 - frac) / N);
    double rne = zt_bf16_to_f32(zt_f32_to_bf16(want[k]));
    printf("%s of g=%g: fp32 %.9g, bf16 neighbours %.9g %.9g (fraction %.4f), mean %.9g "
           "(%.2f standard errors), round-to-nearest %.9g\n",
           k ? "v" : "m", gval, want[k], down, up, frac, mean, (mean - want[k]) / se, rne);
    fail |= KC_EXPECT(other == 0, "%zu values are not the two bf16 neighbours", other);
    fail |= KC_EXPECT(fabs(mean - want[k]) <= 4 * se, "the mean is %.2f standard errors off",
                      (mean - want[k]) / se);
    /* the bound is tight enough to tell the rounding from round-to-nearest's */
    fail |= KC_EXPECT(fabs(rne - want[k]) > 8 * se, "the value does not separate the roundings");
  }
  free(p), free(g), free(m), free(v);
  zt_backend_cpu_close(&be);
  return fail;
}

int main(void) {
  int fail = 0;
  /* splitmix64 with state 0: its first output, 0xe220a8397b1dcdaf */
  fail |= KC_EXPECT(zt_sr_mix(0) == 0xe220a8397b1dcdafull, "zt_sr_mix(0) = %llx",
                    (unsigned long long)zt_sr_mix(0));
  /* inf stays inf, NaN the quiet NaN, an exact bf16 value stays itself whatever the bits */
  fail |= KC_EXPECT(zt_bf16_round_sr(0x7f800000u, 0xffff) == 0x7f80, "inf");
  fail |= KC_EXPECT(zt_bf16_round_sr(0x7f800001u, 0) == 0x7fc0, "nan");
  fail |= KC_EXPECT(zt_bf16_round_sr(0xbf800000u, 0xffff) == 0xbf80, "-1 exact");
  fail |= KC_EXPECT(zt_bf16_round_sr(0xbf80ffffu, 1) == 0xbf81, "-1 - tiny rounds away");
  hyper typical = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .wd = 0.1f,
                   .grad_scale = 0.25f};
  hyper unusual = {.lr = 0.05f, .beta1 = 0.3f, .beta2 = 0.95f, .eps = 1e-6f, .wd = 0.5f,
                   .grad_scale = 3.0f};
  fail |= run(1, typical, 3, 0, 0);
  fail |= run(4, typical, 3, 0, 1);
  fail |= run(4, unusual, 3, 0, 0);
  fail |= run(1, typical, 3, 4099, 1); /* cut mid-run: index0 carries the global index */
  fail |= run(4, unusual, 2, 1, 0);    /* one element a call */
  fail |= unbiased(0.3f);
  fail |= unbiased(-1.7e-3f);
  if (!fail) printf("adamw_sr matches the reference bit for bit and rounds without bias\n");
  return fail;
}
