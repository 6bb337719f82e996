/* Mixed precision on the CPU reference: the bf16/fp16 conversions (round to nearest even,
 * subnormals, overflow, inf/nan) and every typed op against its fp32 op (the strided ones,
 * rmsnorm and rope, also leave the values between their rows alone).
 *
 * Tolerances. With inputs that are exactly representable in dt, a typed op is defined (ops.h) as
 * the fp32 op on the widened inputs with its dt outputs rounded once: the CPU reference must
 * match that bit for bit (fp32 outputs such as parameter gradients and statistics included).
 * Against the fp32 op on the unrounded inputs, a matmul may differ by the input and output
 * roundings: |got - want| <= 3 u sum_k |a_k b_k| (+ the bias' rounding), u the unit roundoff of
 * dt (2^-8 bf16, 2^-11 fp16). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/ops.h"
#include "tests/unit/kernels/kcheck.h"

static zt_backend be;
static kc_rng rng;

static uint16_t to_lp(zt_dtype dt, float x) {
  return dt == ZT_BF16 ? zt_f32_to_bf16(x) : zt_f32_to_f16(x);
}

static float from_lp(zt_dtype dt, uint16_t h) {
  return dt == ZT_BF16 ? zt_bf16_to_f32(h) : zt_f16_to_f32(h);
}

/* ---- conversions ------------------------------------------------------------------------ */

/* h is the nearest value of dt to x, ties to the even mantissa (the neighbours are the adjacent
 * bit patterns of the same sign). */
static int check_nearest(zt_dtype dt, float x) {
  uint16_t h = to_lp(dt, x);
  uint16_t inf = dt == ZT_BF16 ? 0x7f80 : 0x7c00;
  float r = from_lp(dt, h);
  if (isinf(r)) {
    /* overflow: x must be at least halfway between the largest finite value and 2^(emax+1) */
    float maxf = from_lp(dt, (uint16_t)(inf - 1));
    double half = (double)maxf + 0.5 * ((double)maxf - (double)from_lp(dt, (uint16_t)(inf - 2)));
    return KC_EXPECT(fabs((double)x) >= half, "%s(%a) = inf, below the overflow threshold",
                     zt_dtype_name(dt), (double)x);
  }
  uint16_t mag = h & 0x7fffu;
  double d = fabs((double)x - r);
  int fails = 0;
  for (int k = -1; k <= 1; k += 2) {
    if ((mag == 0 && k < 0) || mag + k >= inf) continue;
    uint16_t nb = (uint16_t)((h & 0x8000u) | (uint16_t)(mag + k));
    double dn = fabs((double)x - from_lp(dt, nb));
    fails += KC_EXPECT(d < dn || (d == dn && (h & 1u) == 0),
                       "%s(%a) = 0x%04x (%a): neighbour 0x%04x is nearer or the even tie",
                       zt_dtype_name(dt), (double)x, h, (double)r, nb);
  }
  return fails;
}

static int test_conversions(void) {
  int fails = 0;
  zt_dtype dts[2] = {ZT_BF16, ZT_F16};
  for (int k = 0; k < 2; k++) {
    zt_dtype dt = dts[k];
    /* every value survives the round trip; nans stay nans */
    for (uint32_t h = 0; h < 0x10000u && fails < 5; h++) {
      float f = from_lp(dt, (uint16_t)h);
      if (isnan(f))
        fails += KC_EXPECT(isnan(from_lp(dt, to_lp(dt, f))), "%s nan 0x%04x lost",
                           zt_dtype_name(dt), h);
      else
        fails += KC_EXPECT(to_lp(dt, f) == h, "%s 0x%04x -> %a -> 0x%04x", zt_dtype_name(dt), h,
                           (double)f, to_lp(dt, f));
    }
    /* nearest-even over a sweep of fp32 bit patterns of both signs (normal, subnormal, huge) */
    for (uint64_t u = 0; u < 0x7f800000u && fails < 5; u += 1237) {
      float x;
      uint32_t b = (uint32_t)u;
      memcpy(&x, &b, 4);
      fails += check_nearest(dt, x) + check_nearest(dt, -x);
    }
    float inf = INFINITY, nan = NAN;
    fails += KC_EXPECT(isinf(from_lp(dt, to_lp(dt, inf))) && from_lp(dt, to_lp(dt, -inf)) < 0,
                       "%s: inf", zt_dtype_name(dt));
    fails += KC_EXPECT(isnan(from_lp(dt, to_lp(dt, nan))), "%s: nan", zt_dtype_name(dt));
    fails += KC_EXPECT(to_lp(dt, -0.0f) == 0x8000, "%s: -0", zt_dtype_name(dt));
  }
  /* the ties and edges by hand */
  fails += KC_EXPECT(zt_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80, "bf16 tie down to even");
  fails += KC_EXPECT(zt_f32_to_bf16(1.0f + 0x1p-7f + 0x1p-8f) == 0x3f82, "bf16 tie up to even");
  fails += KC_EXPECT(zt_f32_to_bf16(3.4028235e38f) == 0x7f80, "bf16 FLT_MAX -> inf");
  fails += KC_EXPECT(zt_f32_to_f16(65504.0f) == 0x7bff, "f16 max");
  fails += KC_EXPECT(zt_f32_to_f16(65519.0f) == 0x7bff, "f16 below the overflow tie");
  fails += KC_EXPECT(zt_f32_to_f16(65520.0f) == 0x7c00, "f16 overflow tie -> inf");
  fails += KC_EXPECT(zt_f32_to_f16(0x1p-24f) == 0x0001, "f16 smallest subnormal");
  fails += KC_EXPECT(zt_f32_to_f16(0x1p-25f) == 0x0000, "f16 half the smallest: tie to 0");
  fails += KC_EXPECT(zt_f32_to_f16(0x1.8p-24f) == 0x0002, "f16 subnormal tie to even");
  fails += KC_EXPECT(zt_f32_to_f16(0x1.000002p-25f) == 0x0001, "f16 just above the tie");
  fails += KC_EXPECT(zt_f32_to_f16(0x1.ff8p-15f) == 0x03ff, "f16 largest subnormal");
  fails += KC_EXPECT(zt_f32_to_f16(0x1.ffcp-15f) == 0x0400, "f16 tie up to the smallest normal");
  fails += KC_EXPECT(zt_f16_to_f32(0x0001) == 0x1p-24f && zt_f16_to_f32(0x8001) == -0x1p-24f,
                     "f16 subnormal widening");
  printf("conversions: %s\n", fails ? "FAILED" : "ok");
  return fails;
}

/* ---- typed ops ---------------------------------------------------------------------------- */

/* A tensor of dt values and the same values widened to fp32. */
typedef struct lp {
  uint16_t *h;
  float *f;
  size_t n;
} lp;

static lp lp_random(zt_dtype dt, size_t n, float lo, float hi) {
  lp t = {calloc(n ? n : 1, 2), kc_floats(n), n};
  if (!t.h) exit(1);
  for (size_t i = 0; i < n; i++) {
    t.h[i] = to_lp(dt, kc_uniform(&rng, lo, hi));
    t.f[i] = from_lp(dt, t.h[i]);
  }
  return t;
}

static void lp_free(lp *t) {
  free(t->h);
  free(t->f);
}

/* got (dt) == ref rounded to dt, bit for bit. */
static int same_lp(const char *what, zt_dtype dt, const uint16_t *got, const float *ref,
                   size_t n) {
  for (size_t i = 0; i < n; i++)
    if (got[i] != to_lp(dt, ref[i])) {
      fprintf(stderr, "FAIL %s %s: [%zu] = 0x%04x (%g), the fp32 op rounded gives 0x%04x (%g)\n",
              what, zt_dtype_name(dt), i, got[i], (double)from_lp(dt, got[i]), to_lp(dt, ref[i]),
              (double)ref[i]);
      return 1;
    }
  return 0;
}

static int same_f32(const char *what, zt_dtype dt, const float *got, const float *ref, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (memcmp(&got[i], &ref[i], 4) != 0) {
      fprintf(stderr, "FAIL %s %s: fp32 output [%zu] = %a, the fp32 op gives %a\n", what,
              zt_dtype_name(dt), i, (double)got[i], (double)ref[i]);
      return 1;
    }
  return 0;
}

static int test_ops(zt_dtype dt) {
  const zt_ops *o = be.ops;
  void *ctx = be.ctx;
  int fails = 0;
  const int B = 2, T = 7, C = 24, NH = 3, OC = 40, V = 19;
  const int N = B * T;
  size_t NC = (size_t)N * C;

  /* matmul forward and backward */
  {
    lp inp = lp_random(dt, NC, -1, 1), w = lp_random(dt, (size_t)OC * C, -1, 1);
    lp dout = lp_random(dt, (size_t)N * OC, -1, 1), dinp = lp_random(dt, NC, -1, 1);
    float *bias = kc_random(&rng, OC, -1, 1), *ref = kc_floats((size_t)N * OC);
    uint16_t *out = calloc((size_t)N * OC, 2);
    o->matmul_fwd(ctx, ref, inp.f, w.f, bias, N, C, OC);
    o->matmul_fwd_dt(ctx, dt, out, inp.h, w.h, bias, N, C, OC);
    fails += same_lp("matmul_fwd", dt, out, ref, (size_t)N * OC);
    /* against fp32 on unrounded inputs: the roundings' bound (see the top) */
    float *x = kc_random(&rng, NC, -1, 1), *wx = kc_random(&rng, (size_t)OC * C, -1, 1);
    float *xr = kc_floats(NC), *wr = kc_floats((size_t)OC * C);
    for (size_t i = 0; i < NC; i++) xr[i] = zt_dtype_round(dt, x[i]);
    for (size_t i = 0; i < (size_t)OC * C; i++) wr[i] = zt_dtype_round(dt, wx[i]);
    uint16_t *xh = calloc(NC, 2), *wh = calloc((size_t)OC * C, 2);
    for (size_t i = 0; i < NC; i++) xh[i] = to_lp(dt, x[i]);
    for (size_t i = 0; i < (size_t)OC * C; i++) wh[i] = to_lp(dt, wx[i]);
    o->matmul_fwd(ctx, ref, x, wx, bias, N, C, OC);
    o->matmul_fwd_dt(ctx, dt, out, xh, wh, bias, N, C, OC);
    double u = dt == ZT_BF16 ? 0x1p-8 : 0x1p-11, worst = 0;
    for (int n = 0; n < N; n++)
      for (int j = 0; j < OC; j++) {
        double mag = fabs(bias[j]);
        for (int c = 0; c < C; c++) mag += fabs((double)x[n * C + c] * wx[j * C + c]);
        double e = fabs((double)from_lp(dt, out[n * OC + j]) - ref[n * OC + j]) / (3 * u * mag);
        worst = fmax(worst, e);
      }
    fails += KC_EXPECT(worst <= 1.0, "matmul_fwd %s vs fp32: error %.3g of the bound",
                       zt_dtype_name(dt), worst);
    printf("matmul_fwd %s vs fp32 on unrounded inputs: worst error %.3f of 3u sum|ab|\n",
           zt_dtype_name(dt), worst);
    free(x), free(wx), free(xr), free(wr), free(xh), free(wh);

    float *dw = kc_random(&rng, (size_t)OC * C, -1, 1), *db = kc_random(&rng, OC, -1, 1);
    float *dw_ref = kc_copy(dw, (size_t)OC * C), *db_ref = kc_copy(db, OC);
    float *dinp_ref = kc_copy(dinp.f, NC);
    o->matmul_bwd(ctx, dinp_ref, dw_ref, db_ref, dout.f, inp.f, w.f, N, C, OC);
    o->matmul_bwd_dt(ctx, dt, dinp.h, dw, db, dout.h, inp.h, w.h, N, C, OC);
    fails += same_lp("matmul_bwd dinp", dt, dinp.h, dinp_ref, NC);
    fails += same_f32("matmul_bwd dw", dt, dw, dw_ref, (size_t)OC * C);
    fails += same_f32("matmul_bwd dbias", dt, db, db_ref, OC);
    lp_free(&inp), lp_free(&w), lp_free(&dout), lp_free(&dinp);
    free(bias), free(ref), free(out), free(dw), free(db), free(dw_ref), free(db_ref);
    free(dinp_ref);
  }

  /* layernorm */
  {
    lp inp = lp_random(dt, NC, -2, 2), dout = lp_random(dt, NC, -1, 1);
    lp dinp = lp_random(dt, NC, -1, 1);
    float *w = kc_random(&rng, C, 0.5f, 1.5f), *b = kc_random(&rng, C, -1, 1);
    float *ref = kc_floats(NC), *mean = kc_floats(N), *rstd = kc_floats(N);
    float *mean_r = kc_floats(N), *rstd_r = kc_floats(N);
    uint16_t *out = calloc(NC, 2);
    o->layernorm_fwd(ctx, ref, mean_r, rstd_r, inp.f, w, b, N, C);
    o->layernorm_fwd_dt(ctx, dt, out, mean, rstd, inp.h, w, b, N, C);
    fails += same_lp("layernorm_fwd", dt, out, ref, NC);
    fails += same_f32("layernorm_fwd mean", dt, mean, mean_r, N);
    fails += same_f32("layernorm_fwd rstd", dt, rstd, rstd_r, N);
    float *dw = kc_random(&rng, C, -1, 1), *db = kc_random(&rng, C, -1, 1);
    float *dw_r = kc_copy(dw, C), *db_r = kc_copy(db, C), *dinp_r = kc_copy(dinp.f, NC);
    o->layernorm_bwd(ctx, dinp_r, dw_r, db_r, dout.f, inp.f, w, mean, rstd, N, C);
    o->layernorm_bwd_dt(ctx, dt, dinp.h, dw, db, dout.h, inp.h, w, mean, rstd, N, C);
    fails += same_lp("layernorm_bwd dinp", dt, dinp.h, dinp_r, NC);
    fails += same_f32("layernorm_bwd dw", dt, dw, dw_r, C);
    fails += same_f32("layernorm_bwd db", dt, db, db_r, C);
    lp_free(&inp), lp_free(&dout), lp_free(&dinp);
    free(w), free(b), free(ref), free(mean), free(rstd), free(mean_r), free(rstd_r), free(out);
    free(dw), free(db), free(dw_r), free(db_r), free(dinp_r);
  }

  /* attention, causal and not, multi-head and grouped-query */
  for (int causal = 0; causal <= 1; causal++)
    for (int NKV = NH; NKV >= 1; NKV -= 2) {
      const int hs = C / NH;
      size_t nqkv = (size_t)N * (NH + 2 * NKV) * hs;
      lp qkv = lp_random(dt, nqkv, -1, 1), dout = lp_random(dt, NC, -1, 1);
      lp dqkv = lp_random(dt, nqkv, -1, 1);
      size_t sb = o->attention_saved_bytes_dt(dt, B, T, NH, NKV, hs);
      void *saved = calloc(1, sb);
      void *saved_r = calloc(1, o->attention_saved_bytes(B, T, NH, NKV, hs));
      float *ref = kc_floats(NC), *dqkv_r = kc_copy(dqkv.f, nqkv);
      uint16_t *out = calloc(NC, 2);
      char what[64];
      o->attention_fwd(ctx, ref, saved_r, qkv.f, B, T, NH, NKV, hs, causal, NULL);
      o->attention_fwd_dt(ctx, dt, out, saved, qkv.h, B, T, NH, NKV, hs, causal, NULL);
      snprintf(what, sizeof what, "attention_fwd NKV=%d causal=%d", NKV, causal);
      fails += same_lp(what, dt, out, ref, NC);
      o->attention_bwd(ctx, dqkv_r, dout.f, qkv.f, saved_r, B, T, NH, NKV, hs, causal, NULL);
      o->attention_bwd_dt(ctx, dt, dqkv.h, dout.h, qkv.h, saved, B, T, NH, NKV, hs, causal, NULL);
      snprintf(what, sizeof what, "attention_bwd NKV=%d causal=%d", NKV, causal);
      fails += same_lp(what, dt, dqkv.h, dqkv_r, nqkv);
      lp_free(&qkv), lp_free(&dout), lp_free(&dqkv);
      free(saved), free(saved_r), free(ref), free(dqkv_r), free(out);
    }

  /* rmsnorm: the block norm, and H = 2 heads inside rows of 3*C (a q norm); the gaps between
   * the heads keep their values */
  for (int H = 1; H <= 2; H++) {
    ptrdiff_t stride = H == 1 ? C : 3 * C;
    size_t n = (size_t)N * stride;
    lp inp = lp_random(dt, n, -2, 2), dout = lp_random(dt, n, -1, 1);
    lp dinp = lp_random(dt, n, -1, 1), out = lp_random(dt, n, -1, 1);
    float *w = kc_random(&rng, C, 0.5f, 1.5f), *ref = kc_copy(out.f, n);
    float *rstd = kc_floats((size_t)N * H), *rstd_r = kc_floats((size_t)N * H);
    o->rmsnorm_fwd(ctx, ref, rstd_r, inp.f, w, N, H, C, stride, 1e-6f);
    o->rmsnorm_fwd_dt(ctx, dt, out.h, rstd, inp.h, w, N, H, C, stride, 1e-6f);
    fails += same_lp(H == 1 ? "rmsnorm_fwd" : "rmsnorm_fwd heads", dt, out.h, ref, n);
    fails += same_f32("rmsnorm_fwd rstd", dt, rstd, rstd_r, (size_t)N * H);
    float *dw = kc_random(&rng, C, -1, 1), *dw_r = kc_copy(dw, C), *dinp_r = kc_copy(dinp.f, n);
    o->rmsnorm_bwd(ctx, dinp_r, dw_r, dout.f, inp.f, w, rstd, N, H, C, stride);
    o->rmsnorm_bwd_dt(ctx, dt, dinp.h, dw, dout.h, inp.h, w, rstd, N, H, C, stride);
    fails += same_lp(H == 1 ? "rmsnorm_bwd dinp" : "rmsnorm_bwd heads dinp", dt, dinp.h, dinp_r,
                     n);
    fails += same_f32("rmsnorm_bwd dw", dt, dw, dw_r, C);
    lp_free(&inp), lp_free(&dout), lp_free(&dinp), lp_free(&out);
    free(w), free(ref), free(rstd), free(rstd_r), free(dw), free(dw_r), free(dinp_r);
  }

  /* rope on the k heads of a qkv row (NH query heads, then 2 k heads of hs) */
  {
    const int hs = C / NH, H = 2;
    ptrdiff_t stride = (ptrdiff_t)(NH + 2 * H) * hs;
    size_t n = (size_t)N * stride;
    lp x = lp_random(dt, n, -2, 2), dx = lp_random(dt, n, -1, 1);
    float *inv_freq = kc_random(&rng, hs / 2, 0, 1);
    int32_t pos[B * T];
    for (int i = 0; i < N; i++) pos[i] = kc_int(&rng, 4096);
    float *ref = kc_copy(x.f, n), *dref = kc_copy(dx.f, n);
    o->rope_fwd(ctx, ref + NH * hs, inv_freq, pos, N, H, hs, stride);
    o->rope_fwd_dt(ctx, dt, x.h + NH * hs, inv_freq, pos, N, H, hs, stride);
    fails += same_lp("rope_fwd", dt, x.h, ref, n);
    o->rope_bwd(ctx, dref + NH * hs, inv_freq, pos, N, H, hs, stride);
    o->rope_bwd_dt(ctx, dt, dx.h + NH * hs, inv_freq, pos, N, H, hs, stride);
    fails += same_lp("rope_bwd", dt, dx.h, dref, n);
    lp_free(&x), lp_free(&dx);
    free(inv_freq), free(ref), free(dref);
  }

  /* swiglu */
  {
    const int F = 37;
    size_t n = (size_t)N * F;
    lp inp = lp_random(dt, 2 * n, -6, 6), dout = lp_random(dt, n, -1, 1);
    lp dinp = lp_random(dt, 2 * n, -1, 1);
    float *ref = kc_floats(n), *dinp_r = kc_copy(dinp.f, 2 * n);
    uint16_t *out = calloc(n, 2);
    o->swiglu_fwd(ctx, ref, inp.f, N, F);
    o->swiglu_fwd_dt(ctx, dt, out, inp.h, N, F);
    fails += same_lp("swiglu_fwd", dt, out, ref, n);
    o->swiglu_bwd(ctx, dinp_r, inp.f, dout.f, N, F);
    o->swiglu_bwd_dt(ctx, dt, dinp.h, inp.h, dout.h, N, F);
    fails += same_lp("swiglu_bwd", dt, dinp.h, dinp_r, 2 * n);
    lp_free(&inp), lp_free(&dout), lp_free(&dinp);
    free(ref), free(dinp_r), free(out);
  }

  /* pointwise */
  {
    lp a = lp_random(dt, NC, -3, 3), b = lp_random(dt, NC, -3, 3), d = lp_random(dt, NC, -1, 1);
    lp acc = lp_random(dt, NC, -1, 1);
    float *ref = kc_floats(NC), *acc_r = kc_copy(acc.f, NC);
    uint16_t *out = calloc(NC, 2);
    o->gelu_fwd(ctx, ref, a.f, NC);
    o->gelu_fwd_dt(ctx, dt, out, a.h, NC);
    fails += same_lp("gelu_fwd", dt, out, ref, NC);
    o->relu_fwd(ctx, ref, a.f, NC);
    o->relu_fwd_dt(ctx, dt, out, a.h, NC);
    fails += same_lp("relu_fwd", dt, out, ref, NC);
    o->add(ctx, ref, a.f, b.f, NC);
    o->add_dt(ctx, dt, out, a.h, b.h, NC);
    fails += same_lp("add", dt, out, ref, NC);
    o->gelu_bwd(ctx, acc_r, a.f, d.f, NC);
    o->gelu_bwd_dt(ctx, dt, acc.h, a.h, d.h, NC);
    fails += same_lp("gelu_bwd", dt, acc.h, acc_r, NC);
    for (size_t i = 0; i < NC; i++) acc_r[i] = from_lp(dt, acc.h[i]);
    o->relu_bwd(ctx, acc_r, a.f, d.f, NC);
    o->relu_bwd_dt(ctx, dt, acc.h, a.h, d.h, NC);
    fails += same_lp("relu_bwd", dt, acc.h, acc_r, NC);
    /* out aliasing an input, as the models' residual adds may */
    memcpy(out, a.h, NC * 2);
    o->add(ctx, ref, a.f, b.f, NC);
    o->add_dt(ctx, dt, out, out, b.h, NC);
    fails += same_lp("add in place", dt, out, ref, NC);
    lp_free(&a), lp_free(&b), lp_free(&d), lp_free(&acc);
    free(ref), free(acc_r), free(out);
  }

  /* embedding */
  {
    float *wte = kc_random(&rng, (size_t)V * C, -1, 1), *wpe = kc_random(&rng, (size_t)T * C, -1,
                                                                         1);
    int32_t tok[B * T];
    for (int i = 0; i < N; i++) tok[i] = kc_int(&rng, V);
    float *ref = kc_floats(NC);
    uint16_t *out = calloc(NC, 2);
    o->embedding_fwd(ctx, ref, tok, wte, wpe, B, T, C, NULL);
    o->embedding_fwd_dt(ctx, dt, out, tok, wte, wpe, B, T, C, NULL);
    fails += same_lp("embedding_fwd", dt, out, ref, NC);
    lp dout = lp_random(dt, NC, -1, 1);
    float *dwte = kc_random(&rng, (size_t)V * C, -1, 1), *dwpe = kc_random(&rng, (size_t)T * C,
                                                                           -1, 1);
    float *dwte_r = kc_copy(dwte, (size_t)V * C), *dwpe_r = kc_copy(dwpe, (size_t)T * C);
    o->embedding_bwd(ctx, dwte_r, dwpe_r, dout.f, tok, B, T, C, NULL);
    o->embedding_bwd_dt(ctx, dt, dwte, dwpe, dout.h, tok, B, T, C, NULL);
    fails += same_f32("embedding_bwd dwte", dt, dwte, dwte_r, (size_t)V * C);
    fails += same_f32("embedding_bwd dwpe", dt, dwpe, dwpe_r, (size_t)T * C);
    lp_free(&dout);
    free(wte), free(wpe), free(ref), free(out), free(dwte), free(dwpe), free(dwte_r), free(dwpe_r);
  }

  /* cross-entropy (logits padded to V_alloc, one ignored target), with a loss scale */
  {
    int Va = V + 3;
    lp logits = lp_random(dt, (size_t)N * Va, -4, 4);
    int32_t tgt[B * T];
    for (int i = 0; i < N; i++) tgt[i] = kc_int(&rng, V);
    tgt[3] = -1;
    float *ref = kc_copy(logits.f, (size_t)N * Va);
    double loss_r, loss, loss_f;
    int cnt_r, cnt, cnt_f;
    o->crossentropy_fwd_dt(ctx, dt, logits.h, tgt, N, V, Va, -1, &loss_f, &cnt_f);
    o->crossentropy_fwd_bwd(ctx, ref, tgt, N, V, Va, -1, 1024.0f / N, &loss_r, &cnt_r);
    o->crossentropy_fwd_bwd_dt(ctx, dt, logits.h, tgt, N, V, Va, -1, 1024.0f / N, &loss, &cnt);
    fails += same_lp("crossentropy_fwd_bwd dlogits", dt, logits.h, ref, (size_t)N * Va);
    fails += KC_EXPECT(loss == loss_r && cnt == cnt_r && loss_f == loss_r && cnt_f == cnt_r,
                       "crossentropy %s: loss %.17g/%d, fwd %.17g/%d, fp32 %.17g/%d",
                       zt_dtype_name(dt), loss, cnt, loss_f, cnt_f, loss_r, cnt_r);
    /* the rows entry: the same dlogits, row losses in fp32 */
    lp rows = lp_random(dt, (size_t)N * Va, -4, 4);
    float *rref = kc_copy(rows.f, (size_t)N * Va);
    float *rl = kc_random(&rng, N, 0, 1), *rl_r = kc_copy(rl, N);
    o->crossentropy_rows_dt(ctx, ZT_F32, rref, tgt, N, V, Va, -1, 0.5f, rl_r);
    o->crossentropy_rows_dt(ctx, dt, rows.h, tgt, N, V, Va, -1, 0.5f, rl);
    fails += same_lp("crossentropy_rows dlogits", dt, rows.h, rref, (size_t)N * Va);
    fails += same_f32("crossentropy_rows row_loss", dt, rl, rl_r, N);
    lp_free(&logits), lp_free(&rows);
    free(ref), free(rref), free(rl), free(rl_r);
  }

  /* cast and AdamW with the compute copy */
  {
    size_t n = 1000;
    float *p = kc_random(&rng, n, -1, 1), *g = kc_random(&rng, n, -1, 1);
    float *m = kc_random(&rng, n, -0.1f, 0.1f), *v = kc_random(&rng, n, 0, 0.01f);
    float *p_r = kc_copy(p, n), *m_r = kc_copy(m, n), *v_r = kc_copy(v, n), *back = kc_floats(n);
    uint16_t *h = calloc(n, 2), *h2 = calloc(n, 2);
    o->cast(ctx, h, dt, p, ZT_F32, n);
    o->cast(ctx, back, ZT_F32, h, dt, n);
    fails += same_lp("cast to", dt, h, p, n);
    for (size_t i = 0; i < n; i++)
      fails += KC_EXPECT(back[i] == from_lp(dt, h[i]), "cast back [%zu]", i) ? (i = n, 1) : 0;
    zt_dtype other = dt == ZT_BF16 ? ZT_F16 : ZT_BF16;
    o->cast(ctx, h2, other, h, dt, n);
    for (size_t i = 0; i < n; i++) back[i] = from_lp(dt, h[i]);
    fails += same_lp("cast between", other, h2, back, n);
    o->adamw(ctx, p_r, g, m_r, v_r, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.5f);
    o->adamw_dt(ctx, p, g, m, v, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.5f, h, dt);
    fails += same_f32("adamw_dt p", dt, p, p_r, n) + same_f32("adamw_dt m", dt, m, m_r, n) +
             same_f32("adamw_dt v", dt, v, v_r, n);
    fails += same_lp("adamw_dt compute copy", dt, h, p, n);
    free(p), free(g), free(m), free(v), free(p_r), free(m_r), free(v_r), free(back);
    free(h), free(h2);
  }
  fails += KC_EXPECT(o->sync(ctx) == 0, "sync after the typed ops");
  printf("typed ops %s: %s\n", zt_dtype_name(dt), fails ? "FAILED" : "ok");
  return fails;
}

int main(void) {
  kc_seed(&rng, 20261130);
  if (zt_backend_cpu_open(&be, 2) < 0) return 1;
  int fails = test_conversions();
  fails += test_ops(ZT_BF16) + test_ops(ZT_F16);
  fails += KC_EXPECT(be.ops->set_allow_tf32(be.ctx, 1) == -ENOTSUP &&
                         be.ops->set_allow_tf32(be.ctx, 0) == 0,
                     "cpu: tf32 must be refused, fp32 accepted");
  zt_backend_cpu_close(&be);
  return fails ? 1 : 0;
}
