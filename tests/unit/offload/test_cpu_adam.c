/* CPU AdamW: every path this CPU supports, on one thread and on pools of 1, 2 and 4 threads,
 * must give bitwise the parameters and moments of the CPU backend's reference kernel
 * (engine/kernels/cpu/adamw.c) over several steps, on data with zeros, signed zeros, denormals
 * and wide exponents, at lengths that leave every kind of SIMD tail; the bf16 copy must equal an
 * independent round-to-nearest-even, the fp16 copy the backend's adamw_dt's and an independent
 * IEEE half rounding. Then the fp16 copy of every path on the values where conversions differ:
 * overflow, the tie at 65520, NaNs with payloads, half subnormals and their ties. Then the
 * bf16-moment variant (zt_cpu_adam_run_bf16, a pool task of state bf16) of every path bitwise
 * the backend's adamw_sr, at an index0 and a seed of their own, on one thread and on pools. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/ops.h"
#include "offload/cpu_adam.h"
#include "tests/unit/offload/otest.h"

static zt_backend ref;

/* Nearest-even by comparing the two candidates' remainders; NaN as torch writes it. */
static uint16_t ref_bf16(float f) {
  uint32_t u;
  if (isnan(f)) return 0x7fc0;
  memcpy(&u, &f, sizeof u);
  uint32_t hi = u >> 16, rem = u & 0xffffu;
  if (rem > 0x8000u || (rem == 0x8000u && (hi & 1u))) hi++;
  return (uint16_t)hi;
}

/* The value of half encoding h in [0, 0x7c00], 0x7c00 taken as 2^16: the step after 65504, so
 * that rounding to nearest even sends [65520, 65536) to inf as IEEE's overflow rule does. */
static double half_value(unsigned h) {
  unsigned e = h >> 10, m = h & 0x3ffu;
  return e ? ldexp(1024.0 + m, (int)e - 25) : ldexp(m, -24);
}

/* IEEE half, nearest even, found by bisection over the ordered encodings and comparing against
 * the midpoint (2a and the sum of two neighbours are exact in double); NaN as the backend's cast
 * writes it, the quiet NaN of its sign. */
static uint16_t ref_fp16(float f) {
  uint16_t sign = signbit(f) ? 0x8000 : 0;
  if (isnan(f)) return sign | 0x7e00;
  double a = fabs((double)f);
  if (a >= half_value(0x7c00)) return sign | 0x7c00;
  unsigned lo = 0, hi = 0x7c00; /* half_value(lo) <= a < half_value(hi) */
  while (hi - lo > 1) {
    unsigned mid = (lo + hi) / 2;
    if (half_value(mid) <= a) lo = mid;
    else hi = mid;
  }
  double mid2 = half_value(lo) + half_value(hi);
  unsigned h = 2 * a < mid2 ? lo : 2 * a > mid2 ? hi : (lo & 1u) ? hi : lo;
  return sign | (uint16_t)h;
}

static float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Values that stress the arithmetic: zeros of both signs, denormals, tiny and huge. */
static float wild(uint64_t *rng, int nonneg) {
  uint64_t r = ot_next(rng);
  float x;
  switch (r % 8) {
  case 0: x = 0.0f; break;
  case 1: x = -0.0f; break;
  case 2: x = (float)((r >> 8) % 1000 + 1) * 1e-42f; break; /* denormal */
  case 3: x = ldexpf((float)((r >> 8) % 4096) / 4096.0f + 0.5f, (int)((r >> 20) % 200) - 100); break;
  default: x = ((float)((r >> 11) % 2000001) - 1000000.0f) * 1e-6f; break;
  }
  if (nonneg) return fabsf(x);
  return (r >> 40) & 1 ? -x : x;
}

typedef struct state {
  float *p, *g, *m, *v;
  uint16_t *bf, *h; /* the bf16 and fp16 copies */
  size_t n;
} state;

/* the compute copies a case asks for */
enum { LP_BF16 = 1, LP_FP16 = 2 };

static void state_init(state *s, size_t n, uint64_t seed) {
  uint64_t rng = seed;
  s->n = n;
  s->p = malloc((n + 1) * sizeof(float));
  s->g = malloc((n + 1) * sizeof(float));
  s->m = malloc((n + 1) * sizeof(float));
  s->v = malloc((n + 1) * sizeof(float));
  s->bf = malloc((n + 1) * sizeof(uint16_t));
  s->h = malloc((n + 1) * sizeof(uint16_t));
  if (!s->p || !s->g || !s->m || !s->v || !s->bf || !s->h) abort();
  for (size_t i = 0; i < n; i++) {
    s->p[i] = wild(&rng, 0);
    s->m[i] = wild(&rng, 0);
    s->v[i] = wild(&rng, 1);
  }
  memset(s->bf, 0, (n + 1) * sizeof(uint16_t));
  memset(s->h, 0, (n + 1) * sizeof(uint16_t));
}

static void state_grads(state *s, uint64_t seed) {
  uint64_t rng = seed;
  for (size_t i = 0; i < s->n; i++) s->g[i] = wild(&rng, 0);
}

static void state_free(state *s) {
  free(s->p), free(s->g), free(s->m), free(s->v), free(s->bf), free(s->h);
}

/* first differing index of two float arrays, bitwise; SIZE_MAX when equal */
static size_t diff(const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (memcmp(&a[i], &b[i], sizeof(float))) return i;
  return SIZE_MAX;
}

/* want->h is the backend's adamw_dt fp16 copy when lp has LP_FP16 */
static void compare(const char *what, const state *got, const state *want, int lp) {
  size_t i;
  OT_CHECK((i = diff(got->p, want->p, want->n)) == SIZE_MAX, "%s: p[%zu] %a != %a", what, i,
           got->p[i], want->p[i]);
  OT_CHECK((i = diff(got->m, want->m, want->n)) == SIZE_MAX, "%s: m[%zu] %a != %a", what, i,
           got->m[i], want->m[i]);
  OT_CHECK((i = diff(got->v, want->v, want->n)) == SIZE_MAX, "%s: v[%zu] %a != %a", what, i,
           got->v[i], want->v[i]);
  for (i = 0; (lp & LP_BF16) && i < want->n; i++)
    if (got->bf[i] != ref_bf16(got->p[i])) break;
  OT_CHECK(!(lp & LP_BF16) || i == want->n, "%s: bf16[%zu] %04x != %04x (of %a)", what, i,
           got->bf[i], ref_bf16(got->p[i]), got->p[i]);
  for (i = 0; (lp & LP_FP16) && i < want->n; i++)
    if (got->h[i] != want->h[i] || got->h[i] != ref_fp16(got->p[i])) break;
  OT_CHECK(!(lp & LP_FP16) || i == want->n, "%s: fp16[%zu] %04x, the backend's %04x, the "
           "reference's %04x (of %a)", what, i, got->h[i], want->h[i], ref_fp16(got->p[i]),
           got->p[i]);
  /* only what was asked for is written, and nothing past the end */
  OT_CHECK(got->bf[want->n] == 0 && got->h[want->n] == 0, "%s: written past the end", what);
  for (i = 0; !(lp & LP_BF16) && i < want->n && got->bf[i] == 0; i++) {}
  OT_CHECK((lp & LP_BF16) || i == want->n, "%s: bf16 written though not asked", what);
  for (i = 0; !(lp & LP_FP16) && i < want->n && got->h[i] == 0; i++) {}
  OT_CHECK((lp & LP_FP16) || i == want->n, "%s: fp16 written though not asked", what);
}

static const zt_adam_hparams hsets[] = {
    {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f, .grad_scale = 1.0f},
    /* beta1 < 0.5 takes the other branch of torch's lerp; a loss-scale unscaling factor */
    {.lr = 3e-2f, .beta1 = 0.25f, .beta2 = 0.95f, .eps = 1e-6f, .weight_decay = 0.1f, .grad_scale = 1.0f / 1024},
};

/* One configuration: `steps` steps with the reference and with the path under test. isa < 0
 * means through a pool of -isa threads (ISA auto). */
static void run_case(int isa_or_threads, const zt_adam_hparams *h0, size_t n, int lp,
                     zt_cpu_pool *pool) {
  state want, got;
  char what[96];
  state_init(&want, n, 1000 + n);
  state_init(&got, n, 1000 + n);
  for (int step = 1; step <= 3; step++) {
    zt_adam_hparams h = *h0;
    h.step = step;
    state_grads(&want, 77 * step + n);
    state_grads(&got, 77 * step + n);
    ref.ops->adamw_dt(ref.ctx, want.p, want.g, want.m, want.v, n, h.lr, h.beta1, h.beta2, h.eps,
                      h.weight_decay, step, h.grad_scale, want.h,
                      (lp & LP_FP16) ? ZT_F16 : ZT_F32);
    uint16_t *bf = (lp & LP_BF16) ? got.bf : NULL, *hf = (lp & LP_FP16) ? got.h : NULL;
    if (pool) {
      zt_cpu_adam_task t = {.p = got.p, .g = got.g, .m = got.m, .v = got.v, .p_bf16 = bf,
                            .p_fp16 = hf, .n = n, .h = h};
      int rc = zt_cpu_adam_step(pool, &t);
      OT_CHECK(rc == 0, "pool step: %d", rc);
      snprintf(what, sizeof what, "pool(%d threads, %s) n=%zu step %d", isa_or_threads,
               zt_cpu_isa_name(t.isa), n, step);
    } else {
      int rc = zt_cpu_adam_run((zt_cpu_isa)isa_or_threads, &h, got.p, got.g, got.m, got.v, bf, hf,
                               n);
      OT_CHECK(rc == 0, "run: %d", rc);
      snprintf(what, sizeof what, "%s n=%zu step %d bf16=%d fp16=%d",
               zt_cpu_isa_name(isa_or_threads), n, step, !!bf, !!hf);
    }
    compare(what, &got, &want, lp);
  }
  state_free(&want);
  state_free(&got);
}

/* Where fp32 -> fp16 conversions part ways. With lr 0, no decay and zero moments and gradients
 * the update leaves each parameter as it was (p + -0), so the copy is of these values. */
static void check_fp16_edges(void) {
  const float edges[] = {
      0.0f, -0.0f, 1.0f, -1.0f, 0.1f, -3.14159f, 1e5f, -1e5f,
      65504.0f, -65504.0f, nextafterf(65520.0f, 0.0f), 65520.0f, -65520.0f, /* the tie: inf */
      65536.0f, FLT_MAX, -FLT_MAX, INFINITY, -INFINITY,
      NAN, -NAN, from_bits(0x7f800001u), from_bits(0x7fc12345u), from_bits(0xffa00000u),
      0x1p-24f, 0x1p-25f, nextafterf(0x1p-25f, 1.0f), -0x1p-25f, /* the tie with 0 */
      0x3p-25f, 0x5p-25f, -0x7p-25f, 0x1p-14f, 0x1p-14f - 0x1p-24f, 0x1p-14f - 0x1p-25f,
      0x1p-15f + 0x1p-26f, 1.0f + 0x1p-11f, 1.0f + 0x3p-11f, -(1.0f + 0x5p-11f), 2049.0f, 2051.0f,
      1e-45f, -1e-40f, 1e-8f, 6e-8f, 3e-8f, 0x1.ffep15f, 0x1.ffcp15f + 0x1p4f};
  enum { NE = sizeof edges / sizeof edges[0], N = 17 * NE + 5 }; /* every lane, body and tail */
  static float p[N], zero[N], m[N], v[N], want_p[N];
  static uint16_t h[N + 1], want_h[N], cast[N];
  zt_adam_hparams hp = {.lr = 0.0f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                        .weight_decay = 0.0f, .step = 1, .grad_scale = 1.0f};
  /* the reference itself, on hand-worked values */
  OT_CHECK(ref_fp16(1.0f) == 0x3c00 && ref_fp16(65504.0f) == 0x7bff &&
           ref_fp16(65520.0f) == 0x7c00 && ref_fp16(nextafterf(65520.0f, 0.0f)) == 0x7bff &&
           ref_fp16(0x1p-24f) == 0x0001 && ref_fp16(0x1p-25f) == 0x0000 &&
           ref_fp16(0x3p-25f) == 0x0002 && ref_fp16(0x5p-25f) == 0x0002 &&
           ref_fp16(0x1p-14f) == 0x0400 && ref_fp16(0x1p-14f - 0x1p-25f) == 0x0400 &&
           ref_fp16(1.0f + 0x1p-11f) == 0x3c00 && ref_fp16(1.0f + 0x3p-11f) == 0x3c02 &&
           ref_fp16(-0.0f) == 0x8000 && ref_fp16(NAN) == 0x7e00 && ref_fp16(-NAN) == 0xfe00 &&
           ref_fp16(1e-45f) == 0x0000 && ref_fp16(-INFINITY) == 0xfc00,
           "fp16 reference");
  for (size_t i = 0; i < N; i++) {
    want_p[i] = edges[(i * 7) % NE]; /* a stride prime to NE: each value in many lanes */
    want_h[i] = ref_fp16(want_p[i]);
  }
  /* the backend's cast of the same values */
  ref.ops->cast(ref.ctx, cast, ZT_F16, want_p, ZT_F32, N);
  OT_CHECK(!memcmp(cast, want_h, sizeof cast), "the backend's fp16 cast differs from the "
           "reference");
  for (int isa = ZT_CPU_ISA_SCALAR; isa <= ZT_CPU_ISA_AVX512; isa++) {
    if (!zt_cpu_isa_supported((zt_cpu_isa)isa)) continue;
    memcpy(p, want_p, sizeof p);
    memset(m, 0, sizeof m);
    memset(v, 0, sizeof v);
    memset(h, 0, sizeof h);
    OT_CHECK(zt_cpu_adam_run((zt_cpu_isa)isa, &hp, p, zero, m, v, NULL, h, N) == 0, "edges run");
    size_t i;
    for (i = 0; i < N; i++)
      if (h[i] != want_h[i] || (!isnan(want_p[i]) && memcmp(&p[i], &want_p[i], sizeof p[i])))
        break;
    OT_CHECK(i == N, "%s: [%zu] %a became %a, fp16 %04x, want %04x", zt_cpu_isa_name(isa), i,
             want_p[i % N], p[i % N], h[i % N], want_h[i % N]);
    OT_CHECK(h[N] == 0, "%s: fp16 written past the end", zt_cpu_isa_name(isa));
    printf("%s: the fp16 copy of %d edge values as the reference\n", zt_cpu_isa_name(isa), NE);
  }
}

static const size_t lengths[] = {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 1000, 65536 + 13, 3 * 65536 + 5};
enum { NLEN = sizeof lengths / sizeof lengths[0] };

/* bf16 moments: the parameters, m, v and the compute copies against the backend's adamw_sr over
 * three steps. isa < 0: a pool task of -isa threads. The seed and index0 differ per case so that
 * a path using the wrong bits of the wrong element shows. */
static void run_case_bf16(int isa_or_threads, const zt_adam_hparams *h0, size_t n, int lp,
                          zt_cpu_pool *pool) {
  state want, got;
  uint16_t *wm = calloc(n + 1, 2), *wv = calloc(n + 1, 2), *gm = calloc(n + 1, 2);
  uint16_t *gv = calloc(n + 1, 2), *wlp = calloc(n + 1, 2);
  uint64_t index0 = 12345 + 7 * n;
  char what[128];
  if (!wm || !wv || !gm || !gv || !wlp) abort();
  state_init(&want, n, 2000 + n);
  state_init(&got, n, 2000 + n);
  for (size_t i = 0; i < n; i++) { /* moments that are bf16 values, as the state holds */
    wm[i] = gm[i] = zt_f32_to_bf16(want.m[i]);
    wv[i] = gv[i] = zt_f32_to_bf16(want.v[i]);
  }
  for (int step = 1; step <= 3; step++) {
    zt_adam_hparams h = *h0;
    h.step = step;
    h.seed = 0x5eed0000u + n;
    state_grads(&want, 91 * step + n);
    state_grads(&got, 91 * step + n);
    ref.ops->adamw_sr(ref.ctx, want.p, want.g, wm, wv, n, h.lr, h.beta1, h.beta2, h.eps,
                      h.weight_decay, step, h.grad_scale, wlp, (lp & LP_BF16) ? ZT_BF16 : ZT_F32,
                      h.seed, index0);
    uint16_t *bf = (lp & LP_BF16) ? got.bf : NULL, *hf = (lp & LP_FP16) ? got.h : NULL;
    int rc;
    if (pool) {
      zt_cpu_adam_task t = {.p = got.p, .g = got.g, .m = gm, .v = gv, .state = ZT_BF16,
                            .index0 = index0, .p_bf16 = bf, .p_fp16 = hf, .n = n, .h = h};
      rc = zt_cpu_adam_step(pool, &t);
      snprintf(what, sizeof what, "bf16 state: pool(%d threads, %s) n=%zu step %d",
               isa_or_threads, zt_cpu_isa_name(t.isa), n, step);
    } else {
      rc = zt_cpu_adam_run_bf16((zt_cpu_isa)isa_or_threads, &h, got.p, got.g, gm, gv, bf, hf, n,
                                index0);
      snprintf(what, sizeof what, "bf16 state: %s n=%zu step %d bf16=%d fp16=%d",
               zt_cpu_isa_name(isa_or_threads), n, step, !!bf, !!hf);
    }
    OT_CHECK(rc == 0, "%s: %d", what, rc);
    size_t i;
    OT_CHECK((i = diff(got.p, want.p, n)) == SIZE_MAX, "%s: p[%zu] %a != %a", what, i, got.p[i],
             want.p[i]);
    for (i = 0; i < n && gm[i] == wm[i] && gv[i] == wv[i]; i++) {}
    OT_CHECK(i == n, "%s: m[%zu] %04x (want %04x), v %04x (want %04x)", what, i, gm[i], wm[i],
             gv[i], wv[i]);
    for (i = 0; (lp & LP_BF16) && i < n && got.bf[i] == wlp[i]; i++) {}
    OT_CHECK(!(lp & LP_BF16) || i == n, "%s: bf16 copy [%zu] %04x != %04x", what, i, got.bf[i],
             wlp[i]);
    for (i = 0; (lp & LP_FP16) && i < n && got.h[i] == ref_fp16(got.p[i]); i++) {}
    OT_CHECK(!(lp & LP_FP16) || i == n, "%s: fp16 copy [%zu]", what, i);
    OT_CHECK(gm[n] == 0 && gv[n] == 0 && got.bf[n] == 0 && got.h[n] == 0,
             "%s: written past the end", what);
  }
  state_free(&want);
  state_free(&got);
  free(wm), free(wv), free(gm), free(gv), free(wlp);
}

/* bf16 moments that are NaN or infinite, in every lane and the tail: a NaN moment stays the
 * canonical 0x7fc0, an infinite one infinite, as the reference rounds them (the parameters are
 * not compared: a NaN's payload is the arithmetic's). */
static void check_bf16_state_edges(void) {
  enum { N = 16 * 5 + 7 };
  static const uint16_t mvals[] = {0x7fc0, 0x7f80, 0xff80, 0x3f80, 0x0000, 0x8000, 0x7f7f,
                                   0xffc1};
  static float p[N], g[N], want_p[N];
  static uint16_t m[N], v[N], want_m[N], want_v[N];
  zt_adam_hparams h = hsets[0];
  h.step = 2;
  h.seed = 99;
  for (int isa = ZT_CPU_ISA_SCALAR; isa <= ZT_CPU_ISA_AVX512; isa++) {
    if (!zt_cpu_isa_supported((zt_cpu_isa)isa)) continue;
    for (size_t i = 0; i < N; i++) {
      p[i] = want_p[i] = 0.25f * (float)(i % 7) - 0.5f;
      g[i] = 0.125f * (float)(i % 5) - 0.25f;
      m[i] = want_m[i] = mvals[(i * 3) % 8];
      v[i] = want_v[i] = mvals[(i * 5) % 8] & 0x7fff; /* v >= 0 or a NaN */
    }
    ref.ops->adamw_sr(ref.ctx, want_p, g, want_m, want_v, N, h.lr, h.beta1, h.beta2, h.eps,
                      h.weight_decay, h.step, h.grad_scale, NULL, ZT_F32, h.seed, 1000);
    OT_CHECK(zt_cpu_adam_run_bf16((zt_cpu_isa)isa, &h, p, g, m, v, NULL, NULL, N, 1000) == 0,
             "bf16 state edges run");
    size_t i;
    for (i = 0; i < N && m[i] == want_m[i] && v[i] == want_v[i]; i++) {}
    OT_CHECK(i == N, "%s: bf16 state edge [%zu]: m %04x (want %04x), v %04x (want %04x)",
             zt_cpu_isa_name(isa), i, m[i % N], want_m[i % N], v[i % N], want_v[i % N]);
    printf("%s: bf16 moments that are NaN or infinite as the reference\n", zt_cpu_isa_name(isa));
  }
}

int main(void) {
  if (zt_backend_cpu_open(&ref, 1) < 0) return 1;
  /* the bf16 reference itself, on hand-worked values */
  OT_CHECK(ref_bf16(1.0f) == 0x3f80 && ref_bf16(1.00390625f) == 0x3f80 &&
           ref_bf16(1.01171875f) == 0x3f82 && ref_bf16(FLT_MAX) == 0x7f80 &&
           ref_bf16(-0.0f) == 0x8000 && ref_bf16(NAN) == 0x7fc0 && ref_bf16(1e-45f) == 0x0000,
           "bf16 reference");

  for (int isa = ZT_CPU_ISA_SCALAR; isa <= ZT_CPU_ISA_AVX512; isa++) {
    if (!zt_cpu_isa_supported((zt_cpu_isa)isa)) {
      printf("%s: not supported here, not run\n", zt_cpu_isa_name(isa));
      float x = 0;
      zt_adam_hparams h = hsets[0];
      h.step = 1;
      OT_CHECK(zt_cpu_adam_run((zt_cpu_isa)isa, &h, &x, &x, &x, &x, NULL, NULL, 1) == -ENOTSUP,
               "unsupported ISA accepted");
      continue;
    }
    for (size_t hs = 0; hs < sizeof hsets / sizeof hsets[0]; hs++)
      for (int li = 0; li < NLEN; li++)
        for (int lp = 0; lp <= (LP_BF16 | LP_FP16); lp++)
          run_case(isa, &hsets[hs], lengths[li], lp, NULL);
    printf("%s: bitwise equal to the reference\n", zt_cpu_isa_name(isa));
  }
  printf("best: %s\n", zt_cpu_isa_name(zt_cpu_isa_best()));
  for (int isa = ZT_CPU_ISA_SCALAR; isa <= ZT_CPU_ISA_AVX512; isa++) {
    if (!zt_cpu_isa_supported((zt_cpu_isa)isa)) {
      float x = 0;
      uint16_t y = 0;
      zt_adam_hparams h = hsets[0];
      h.step = 1;
      OT_CHECK(zt_cpu_adam_run_bf16((zt_cpu_isa)isa, &h, &x, &x, &y, &y, NULL, NULL, 1, 0) ==
                   -ENOTSUP, "unsupported ISA accepted (bf16 state)");
      continue;
    }
    for (size_t hs = 0; hs < sizeof hsets / sizeof hsets[0]; hs++)
      for (int li = 0; li < NLEN; li++)
        for (int lp = 0; lp <= (LP_BF16 | LP_FP16); lp++)
          run_case_bf16(isa, &hsets[hs], lengths[li], lp, NULL);
    printf("%s: bf16 state bitwise equal to the reference's adamw_sr\n", zt_cpu_isa_name(isa));
  }
  check_fp16_edges();
  check_bf16_state_edges();

  static const int threads[] = {1, 2, 4};
  for (int ti = 0; ti < 3; ti++) {
    zt_cpu_pool *pool;
    zt_cpu_pool_stats st;
    OT_CHECK(zt_cpu_pool_open(&pool, threads[ti], 1) == 0, "pool open");
    for (int li = 0; li < NLEN; li++)
      run_case(threads[ti], &hsets[li % 2], lengths[li], li % 4, pool);
    for (int li = 0; li < NLEN; li++)
      run_case_bf16(threads[ti], &hsets[li % 2], lengths[li], li % 4, pool);
    zt_cpu_pool_get_stats(pool, &st);
    printf("pool %d threads: %d pinned, %llu jobs, %llu chunks\n", st.threads, st.pinned_threads,
           (unsigned long long)st.jobs, (unsigned long long)st.chunks);
    OT_CHECK(st.threads == threads[ti] && st.jobs > 0 && st.chunks >= st.jobs, "pool stats");
    zt_cpu_pool_close(pool);
  }

  /* async: two tensors in flight on one pool, waited in reverse order */
  {
    zt_cpu_pool *pool;
    state want[2], got[2];
    zt_cpu_adam_task t[2];
    size_t n[2] = {200003, 70001};
    zt_adam_hparams h = hsets[0];
    h.step = 1;
    OT_CHECK(zt_cpu_pool_open(&pool, 2, 0) == 0, "pool open");
    for (int k = 0; k < 2; k++) {
      state_init(&want[k], n[k], 5 + k);
      state_init(&got[k], n[k], 5 + k);
      state_grads(&want[k], 9 + k);
      state_grads(&got[k], 9 + k);
      ref.ops->adamw_dt(ref.ctx, want[k].p, want[k].g, want[k].m, want[k].v, n[k], h.lr, h.beta1,
                        h.beta2, h.eps, h.weight_decay, 1, h.grad_scale, want[k].h, ZT_F16);
      t[k] = (zt_cpu_adam_task){.p = got[k].p, .g = got[k].g, .m = got[k].m, .v = got[k].v,
                                .p_bf16 = got[k].bf, .p_fp16 = got[k].h, .n = n[k], .h = h};
      OT_CHECK(zt_cpu_adam_submit(pool, &t[k]) == 0, "submit %d", k);
    }
    for (int k = 1; k >= 0; k--) {
      zt_cpu_adam_wait(pool, &t[k]);
      compare("async", &got[k], &want[k], LP_BF16 | LP_FP16);
      state_free(&want[k]);
      state_free(&got[k]);
    }
    zt_cpu_adam_task bad = {.n = 1, .h = hsets[0]}; /* step 0 */
    OT_CHECK(zt_cpu_adam_submit(pool, &bad) == -EINVAL, "step 0 accepted");
    bad.h.step = 1;
    bad.state = ZT_F16;
    OT_CHECK(zt_cpu_adam_submit(pool, &bad) == -EINVAL, "fp16 state accepted");
    zt_cpu_pool_close(pool);
  }

  zt_backend_cpu_close(&ref);
  if (ot_failures) fprintf(stderr, "%d failures\n", ot_failures);
  return ot_failures ? 1 : 0;
}
