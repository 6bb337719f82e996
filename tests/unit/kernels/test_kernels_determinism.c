/* Results must not depend on the thread count: the heavy ops run on a 1-thread and a 3-thread
 * backend and must agree bit for bit (grouped-query attention and the llama ops included).
 * sum_squares must match a double reference and flag inf and nan. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/ops.h"
#include "tests/unit/kernels/kcheck.h"

static zt_backend one, many;
static kc_rng rng;

static int same(const char *what, const float *a, const float *b, size_t n) {
  return KC_EXPECT(memcmp(a, b, n * sizeof(float)) == 0, "%s differs between 1 and 3 threads",
                   what);
}

/* Both backends start from the same gradient buffers (backward adds into them). */
static int test_matmul(void) {
  int N = 203, C = 77, OC = 150; /* big enough to be split, no multiple of any block */
  size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
  float *inp = kc_random(&rng, ni, -1, 1), *w = kc_random(&rng, nw, -1, 1);
  float *bias = kc_random(&rng, OC, -1, 1), *dout = kc_random(&rng, no, -1, 1);
  float *g0 = kc_random(&rng, ni + nw + OC, -1, 1);
  float *out[2], *g[2];
  zt_backend *be[2] = {&one, &many};
  for (int k = 0; k < 2; k++) {
    out[k] = kc_floats(no);
    g[k] = kc_copy(g0, ni + nw + OC);
    be[k]->ops->matmul_fwd(be[k]->ctx, out[k], inp, w, bias, N, C, OC);
    be[k]->ops->matmul_bwd(be[k]->ctx, g[k], g[k] + ni, g[k] + ni + nw, dout, inp, w, N, C, OC);
  }
  int fail = same("matmul_fwd", out[0], out[1], no);
  fail |= same("matmul_bwd", g[0], g[1], ni + nw + OC);
  free(inp), free(w), free(bias), free(dout), free(g0);
  for (int k = 0; k < 2; k++)
    free(out[k]), free(g[k]);
  return fail;
}

/* Multi-head and grouped-query: the backward's dk/dv sum over a group's query heads. */
static int test_attention(int NH, int NKV) {
  int B = 2, T = 67, hs = 16;
  size_t nqkv = (size_t)B * T * (NH + 2 * NKV) * hs, nout = (size_t)B * T * NH * hs;
  size_t nsaved = one.ops->attention_saved_bytes(B, T, NH, NKV, hs) / sizeof(float);
  float *qkv = kc_random(&rng, nqkv, -2, 2), *dout = kc_random(&rng, nout, -1, 1);
  float *g0 = kc_random(&rng, nqkv, -1, 1);
  float *out[2], *saved[2], *g[2];
  zt_backend *be[2] = {&one, &many};
  int fail = 0;
  for (int causal = 0; causal < 2; causal++) {
    for (int k = 0; k < 2; k++) {
      out[k] = kc_floats(nout);
      saved[k] = kc_floats(nsaved);
      g[k] = kc_copy(g0, nqkv);
      be[k]->ops->attention_fwd(be[k]->ctx, out[k], saved[k], qkv, B, T, NH, NKV, hs, causal, NULL);
      be[k]->ops->attention_bwd(be[k]->ctx, g[k], dout, qkv, saved[k], B, T, NH, NKV, hs,
                                causal, NULL);
    }
    fail |= same("attention_fwd", out[0], out[1], nout);
    fail |= same("attention saved", saved[0], saved[1], nsaved);
    fail |= same("attention_bwd", g[0], g[1], nqkv);
    for (int k = 0; k < 2; k++)
      free(out[k]), free(saved[k]), free(g[k]);
  }
  free(qkv), free(dout), free(g0);
  return fail;
}

/* rmsnorm (its dw sums over every row and head), rope, swiglu, crossentropy_rows, sum. */
static int test_llama_ops(void) {
  int N = 301, H = 4, C = 64, F = 150, V = 500;
  ptrdiff_t stride = (ptrdiff_t)H * C + 2 * C;
  size_t n = (size_t)N * stride;
  float *inp = kc_random(&rng, n, -2, 2), *w = kc_random(&rng, C, -1, 1);
  float *dout = kc_random(&rng, n, -1, 1), *mlp = kc_random(&rng, (size_t)N * 2 * F, -5, 5);
  float *logits = kc_random(&rng, (size_t)N * V, -5, 5), *inv_freq = kc_random(&rng, C / 2, 0, 1);
  int32_t *tok = malloc(sizeof(int32_t) * N);
  for (int i = 0; i < N; i++)
    tok[i] = i % 7 == 0 ? -1 : kc_int(&rng, V);
  float *res[2];
  double sums[2];
  zt_backend *be[2] = {&one, &many};
  /* layout of res: out | rstd | dinp | dw | roped | swiglu | dmlp | dlogits | row_loss */
  size_t nmlp = (size_t)N * F;
  size_t total = 3 * n + (size_t)N * H + C + nmlp + 2 * nmlp + (size_t)N * V + N;
  for (int k = 0; k < 2; k++) {
    float *r = res[k] = kc_floats(total);
    float *out = r, *rstd = out + n, *dinp = rstd + (size_t)N * H, *dw = dinp + n;
    float *roped = dw + C, *sw = roped + n, *dmlp = sw + nmlp, *dl = dmlp + 2 * nmlp;
    float *row_loss = dl + (size_t)N * V;
    void *ctx = be[k]->ctx;
    const zt_ops *o = be[k]->ops;
    o->rmsnorm_fwd(ctx, out, rstd, inp, w, N, H, C, stride, 1e-6f);
    o->rmsnorm_bwd(ctx, dinp, dw, dout, inp, w, rstd, N, H, C, stride);
    memcpy(roped, inp, n * sizeof(float));
    o->rope_fwd(ctx, roped, inv_freq, tok, N, H, C, stride); /* the tokens as positions */
    o->swiglu_fwd(ctx, sw, mlp, N, F);
    o->swiglu_bwd(ctx, dmlp, mlp, dout, N, F);
    memcpy(dl, logits, sizeof(float) * N * V);
    o->crossentropy_rows_dt(ctx, ZT_F32, dl, tok, N, V, V, -1, 0.01f, row_loss);
    sums[k] = o->sum(ctx, inp, n);
  }
  int fail = same("rmsnorm/rope/swiglu/crossentropy_rows", res[0], res[1], total);
  fail |= KC_EXPECT(memcmp(&sums[0], &sums[1], sizeof(double)) == 0,
                    "sum differs between 1 and 3 threads");
  free(inp), free(w), free(dout), free(mlp), free(logits), free(inv_freq), free(tok);
  free(res[0]), free(res[1]);
  return fail;
}

/* The other ops with a reduction: layernorm, embedding backward, cross-entropy. */
static int test_reductions(void) {
  int N = 300, C = 200, V = 500, B = 3, T = 100;
  size_t n = (size_t)N * C;
  float *inp = kc_random(&rng, n, -2, 2), *w = kc_random(&rng, C, -1, 1);
  float *b = kc_random(&rng, C, -1, 1), *dout = kc_random(&rng, n, -1, 1);
  float *logits = kc_random(&rng, (size_t)N * V, -5, 5);
  int32_t *tok = malloc(sizeof(int32_t) * N);
  for (int i = 0; i < N; i++)
    tok[i] = i % 7 == 0 ? -1 : kc_int(&rng, V);
  float *res[2];
  double loss[2];
  int count[2];
  zt_backend *be[2] = {&one, &many};
  /* layout of res: out | mean | rstd | dinp | dw | db | dwte (V,C) | dwpe (T,C) | dlogits */
  size_t total = 2 * n + 2 * N + 2 * C + (size_t)V * C + (size_t)T * C + (size_t)N * V;
  for (int k = 0; k < 2; k++) {
    float *r = res[k] = kc_floats(total);
    float *out = r, *mean = out + n, *rstd = mean + N, *dinp = rstd + N, *dw = dinp + n;
    float *db = dw + C, *dwte = db + C, *dwpe = dwte + (size_t)V * C, *dl = dwpe + (size_t)T * C;
    void *ctx = be[k]->ctx;
    be[k]->ops->layernorm_fwd(ctx, out, mean, rstd, inp, w, b, N, C);
    be[k]->ops->layernorm_bwd(ctx, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    int32_t *etok = malloc(sizeof(int32_t) * N);
    for (int i = 0; i < N; i++)
      etok[i] = i % 5; /* heavy repeats */
    be[k]->ops->embedding_bwd(ctx, dwte, dwpe, dout, etok, B, T, C, NULL);
    free(etok);
    memcpy(dl, logits, sizeof(float) * N * V);
    be[k]->ops->crossentropy_fwd_bwd(ctx, dl, tok, N, V, V, -1, 0.01f, &loss[k], &count[k]);
  }
  int fail = same("layernorm/embedding/crossentropy", res[0], res[1], total);
  fail |= KC_EXPECT(memcmp(&loss[0], &loss[1], sizeof(double)) == 0 && count[0] == count[1],
                    "crossentropy loss differs between 1 and 3 threads");
  free(inp), free(w), free(b), free(dout), free(logits), free(tok), free(res[0]), free(res[1]);
  return fail;
}

static int test_sum_squares(void) {
  size_t n = 1000003;
  float *x = kc_random(&rng, n, -3, 3);
  double ref = 0.0;
  for (size_t i = 0; i < n; i++)
    ref += (double)x[i] * x[i];
  int nf1 = -1, nf3 = -1;
  double s1 = one.ops->sum_squares(one.ctx, x, n, &nf1);
  double s3 = many.ops->sum_squares(many.ctx, x, n, &nf3);
  int fail = KC_EXPECT(fabs(s1 - ref) <= 1e-12 * ref, "sum_squares %.17g want %.17g", s1, ref);
  fail |= KC_EXPECT(memcmp(&s1, &s3, sizeof(double)) == 0, "sum_squares differs by threads");
  fail |= KC_EXPECT(nf1 == 0 && nf3 == 0, "finite input flagged");

  double s_small = one.ops->sum_squares(one.ctx, x, 5, &nf1);
  double r_small = 0.0;
  for (int i = 0; i < 5; i++)
    r_small += (double)x[i] * x[i];
  fail |= KC_EXPECT(fabs(s_small - r_small) <= 1e-15 * r_small, "sum_squares of 5 values");
  fail |= KC_EXPECT(one.ops->sum_squares(one.ctx, x, 0, &nf1) == 0.0 && nf1 == 0,
                    "sum_squares of nothing");

  x[n / 2] = INFINITY;
  many.ops->sum_squares(many.ctx, x, n, &nf3);
  fail |= KC_EXPECT(nf3 == 1, "inf not flagged");
  x[n / 2] = NAN;
  many.ops->sum_squares(many.ctx, x, n, &nf3);
  fail |= KC_EXPECT(nf3 == 1, "nan not flagged");
  x[n / 2] = 3e38f; /* the largest floats still square to a finite double */
  many.ops->sum_squares(many.ctx, x, n, &nf3);
  fail |= KC_EXPECT(nf3 == 0, "large finite value flagged");
  free(x);
  return fail;
}

int main(void) {
  if (zt_backend_cpu_open(&one, 1) < 0 || zt_backend_cpu_open(&many, 3) < 0)
    return 1;
  kc_seed(&rng, 31337);
  int fail = 0;
  fail |= test_matmul();
  fail |= test_attention(3, 3);
  fail |= test_attention(8, 2);
  fail |= test_llama_ops();
  fail |= test_reductions();
  fail |= test_sum_squares();
  zt_backend_cpu_close(&one);
  zt_backend_cpu_close(&many);
  if (!fail)
    printf("results are independent of the thread count\n");
  return fail;
}
