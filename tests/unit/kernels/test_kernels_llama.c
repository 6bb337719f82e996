/* The ops of the llama family against the ops they generalise or invert (the finite-difference
 * and double-precision checks are in test_kernels_grad.c and test_kernels_forward.c):
 * - grouped-query attention equals multi-head attention on K/V heads replicated by the test,
 *   forward bit for bit, backward with the replicated heads' gradients summed back;
 * - rope_bwd undoes rope_fwd;
 * - crossentropy_rows_dt gives crossentropy_fwd_bwd's dlogits bit for bit and row losses that
 *   sum to its loss;
 * - sum against a double reference. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/ops.h"
#include "tests/unit/kernels/kcheck.h"

static zt_backend be;
static kc_rng rng;

/* qkv (B,T,(NH+2*NKV)*hs) -> the same with every kv head repeated for its group's query heads:
 * (B,T,3*NH*hs). */
static float *replicate_kv(const float *qkv, int BT, int NH, int NKV, int hs) {
  size_t R = (size_t)(NH + 2 * NKV) * hs, R3 = (size_t)3 * NH * hs;
  float *m = kc_floats((size_t)BT * R3);
  for (int t = 0; t < BT; t++) {
    const float *src = qkv + t * R;
    float *dst = m + t * R3;
    memcpy(dst, src, (size_t)NH * hs * sizeof(float));
    for (int part = 1; part <= 2; part++) /* k, v */
      for (int h = 0; h < NH; h++)
        memcpy(dst + ((size_t)part * NH + h) * hs,
               src + (size_t)NH * hs + ((size_t)(part - 1) * NKV + h / (NH / NKV)) * hs,
               (size_t)hs * sizeof(float));
  }
  return m;
}

static int test_gqa(int NH, int NKV, int causal) {
  int B = 2, T = 29, hs = 8, BT = B * T;
  size_t R = (size_t)(NH + 2 * NKV) * hs, R3 = (size_t)3 * NH * hs, C = (size_t)NH * hs;
  size_t nqkv = BT * R, nout = BT * C;
  size_t nsaved = be.ops->attention_saved_bytes(B, T, NH, NKV, hs) / sizeof(float);
  char what[128];
  float *qkv = kc_random(&rng, nqkv, -2, 2), *mqkv = replicate_kv(qkv, BT, NH, NKV, hs);
  float *out = kc_floats(nout), *mout = kc_floats(nout), *dout = kc_random(&rng, nout, -1, 1);
  float *saved = kc_floats(nsaved), *msaved = kc_floats(nsaved);
  int fail = KC_EXPECT(be.ops->attention_saved_bytes(B, T, NH, NH, hs) / sizeof(float) == nsaved,
                       "saved bytes depend on NKV");
  be.ops->attention_fwd(be.ctx, out, saved, qkv, B, T, NH, NKV, hs, causal, NULL);
  be.ops->attention_fwd(be.ctx, mout, msaved, mqkv, B, T, NH, NH, hs, causal, NULL);
  snprintf(what, sizeof what, "NH=%d NKV=%d causal=%d", NH, NKV, causal);
  fail |= KC_EXPECT(!memcmp(out, mout, nout * sizeof(float)) &&
                        !memcmp(saved, msaved, nsaved * sizeof(float)),
                    "gqa forward %s differs from mha on replicated kv", what);

  /* Both gradients start from the same random values (the kv part replicated, so that the
   * summed-back reference carries the start once). */
  float *dqkv = kc_random(&rng, nqkv, -1, 1), *mdqkv = replicate_kv(dqkv, BT, NH, NKV, hs);
  for (int t = 0; t < BT; t++)
    for (size_t i = C; i < R3; i++)
      if (((i - C) / hs) % NH % (NH / NKV))
        mdqkv[t * R3 + i] = 0.0f; /* the start lives in the group's first copy only */
  be.ops->attention_bwd(be.ctx, dqkv, dout, qkv, saved, B, T, NH, NKV, hs, causal, NULL);
  be.ops->attention_bwd(be.ctx, mdqkv, dout, mqkv, msaved, B, T, NH, NH, hs, causal, NULL);
  double *want = malloc(nqkv * sizeof(double));
  if (!want) exit(1);
  for (int t = 0; t < BT; t++) {
    for (size_t i = 0; i < C; i++)
      want[t * R + i] = mdqkv[t * R3 + i];
    for (size_t i = C; i < R; i++)
      want[t * R + i] = 0.0;
    for (int part = 1; part <= 2; part++)
      for (int h = 0; h < NH; h++)
        for (int d = 0; d < hs; d++)
          want[t * R + C + ((size_t)(part - 1) * NKV + h / (NH / NKV)) * hs + d] +=
              mdqkv[t * R3 + ((size_t)part * NH + h) * hs + d];
  }
  /* dq is the same computation; dk, dv differ only in the order of the group's sums */
  snprintf(what, sizeof what, "gqa backward NH=%d NKV=%d causal=%d vs mha summed back", NH, NKV,
           causal);
  fail |= kc_close(what, dqkv, want, nqkv, 1e-5, 1e-5);
  for (int t = 0; t < BT && !fail; t++)
    fail |= KC_EXPECT(!memcmp(dqkv + t * R, mdqkv + t * R3, C * sizeof(float)),
                      "gqa dq NH=%d NKV=%d causal=%d differs from mha", NH, NKV, causal);
  free(qkv), free(mqkv), free(out), free(mout), free(dout), free(saved), free(msaved);
  free(dqkv), free(mdqkv), free(want);
  return fail;
}

static int test_rope_inverse(void) {
  int N = 40, H = 4, hs = 128;
  size_t n = (size_t)N * H * hs;
  float *inv_freq = kc_floats(hs / 2);
  for (int i = 0; i < hs / 2; i++)
    inv_freq[i] = (float)(1.0 / pow(1e6, 2.0 * i / hs));
  int32_t *pos = malloc(N * sizeof(int32_t));
  if (!pos) exit(1);
  for (int t = 0; t < N; t++)
    pos[t] = t < 20 ? t : kc_int(&rng, 1 << 17);
  float *x = kc_random(&rng, n, -1, 1), *y = kc_copy(x, n);
  double *want = malloc(n * sizeof(double));
  if (!want) exit(1);
  for (size_t i = 0; i < n; i++)
    want[i] = x[i];
  be.ops->rope_fwd(be.ctx, y, inv_freq, pos, N, H, hs, (ptrdiff_t)H * hs);
  int fail = KC_EXPECT(memcmp(x, y, n * sizeof(float)) != 0, "rope_fwd changed nothing");
  be.ops->rope_bwd(be.ctx, y, inv_freq, pos, N, H, hs, (ptrdiff_t)H * hs);
  fail |= kc_close("rope_bwd(rope_fwd(x)) = x", y, want, n, 1e-6, 0);
  free(inv_freq), free(pos), free(x), free(y), free(want);
  return fail;
}

/* Two chunks of rows into one row_loss buffer, as the chunked head calls it; ignored rows keep
 * their row_loss (0 added) and get zero gradients. */
static int test_crossentropy_rows(void) {
  int N = 37, V = 301, Va = 320, ignore = -100;
  size_t n = (size_t)N * Va;
  float dscale = 1.0f / 29;
  float *logits = kc_random(&rng, n, -8, 8);
  int32_t *tg = malloc(N * sizeof(int32_t));
  if (!tg) exit(1);
  for (int i = 0; i < N; i++)
    tg[i] = i % 5 == 2 ? ignore : kc_int(&rng, V);
  float *ref = kc_copy(logits, n), *rows = kc_copy(logits, n);
  float *row_loss = kc_random(&rng, N, 0, 1), *start = kc_copy(row_loss, N);
  double loss;
  int count;
  be.ops->crossentropy_fwd_bwd(be.ctx, ref, tg, N, V, Va, ignore, dscale, &loss, &count);
  int n0 = 16;
  be.ops->crossentropy_rows_dt(be.ctx, ZT_F32, rows, tg, n0, V, Va, ignore, dscale, row_loss);
  be.ops->crossentropy_rows_dt(be.ctx, ZT_F32, rows + (size_t)n0 * Va, tg + n0, N - n0, V, Va,
                               ignore, dscale, row_loss + n0);
  int fail = KC_EXPECT(!memcmp(ref, rows, n * sizeof(float)),
                       "crossentropy_rows dlogits differ from crossentropy_fwd_bwd");
  double sum = 0.0;
  for (int i = 0; i < N; i++) {
    float added = row_loss[i] - start[i];
    if (tg[i] == ignore)
      fail |= KC_EXPECT(row_loss[i] == start[i], "ignored row %d: row_loss changed", i);
    else
      fail |= KC_EXPECT(added > 0, "row %d: loss %g", i, added);
    sum += added;
  }
  fail |= KC_EXPECT(fabs(sum - loss) <= 1e-6 * fabs(loss),
                    "crossentropy_rows: rows sum to %.9g, crossentropy_fwd_bwd %.9g", sum, loss);
  /* a row's fp32 loss is the double one rounded: added to 0 it is exactly that (row 0 counts) */
  float *one = kc_copy(logits, Va), *zero = kc_floats(1);
  double l1;
  int c1;
  be.ops->crossentropy_rows_dt(be.ctx, ZT_F32, one, tg, 1, V, Va, ignore, dscale, zero);
  memcpy(one, logits, Va * sizeof(float));
  be.ops->crossentropy_fwd_bwd(be.ctx, one, tg, 1, V, Va, ignore, dscale, &l1, &c1);
  fail |= KC_EXPECT(c1 == 1 && zero[0] == (float)l1, "row loss %a, the double loss rounded %a",
                    (double)zero[0], (double)(float)l1);
  free(logits), free(tg), free(ref), free(rows), free(row_loss), free(start), free(one);
  free(zero);
  return fail;
}

static int test_sum(void) {
  size_t n = 1000003;
  float *x = kc_random(&rng, n, -3, 5);
  double ref = 0.0;
  for (size_t i = 0; i < n; i++)
    ref += x[i];
  double s = be.ops->sum(be.ctx, x, n);
  int fail = KC_EXPECT(fabs(s - ref) <= 1e-12 * fabs(ref), "sum %.17g want %.17g", s, ref);
  double r5 = 0.0;
  for (int i = 0; i < 5; i++)
    r5 += x[i];
  fail |= KC_EXPECT(fabs(be.ops->sum(be.ctx, x, 5) - r5) <= 1e-15 * fabs(r5), "sum of 5");
  fail |= KC_EXPECT(be.ops->sum(be.ctx, x, 0) == 0.0, "sum of nothing");
  free(x);
  return fail;
}

int main(void) {
  if (zt_backend_cpu_open(&be, 0) < 0)
    return 1;
  kc_seed(&rng, 4242);
  int fail = 0;
  for (int causal = 0; causal < 2; causal++) {
    fail |= test_gqa(8, 2, causal);
    fail |= test_gqa(4, 2, causal);
    fail |= test_gqa(8, 8, causal);
  }
  fail |= test_rope_inverse();
  fail |= test_crossentropy_rows();
  fail |= test_sum();
  zt_backend_cpu_close(&be);
  if (!fail)
    printf("llama ops agree with the ops they generalise\n");
  return fail;
}
