/* Forward ops (and the matmul backward at sizes past every block boundary) against naive
 * double-precision references; causal attention must not see future keys; cross-entropy of
 * uniform logits is log V. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/ops.h"
#include "tests/unit/kernels/kcheck.h"

static zt_backend be;
static kc_rng rng;

static double *doubles(size_t n) {
  double *x = calloc(n ? n : 1, sizeof(double));
  if (!x) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  return x;
}

/* N=300, C=270, OC=37 crosses the row block (64), the depth chunk (256) in the forward (k=C)
 * and in dw (k=N), and leaves a partial 16-column panel. */
static int test_matmul(int N, int C, int OC, int with_bias) {
  size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
  float *inp = kc_random(&rng, ni, -1, 1), *w = kc_random(&rng, nw, -1, 1);
  float *bias = with_bias ? kc_random(&rng, OC, -1, 1) : NULL;
  float *out = kc_floats(no), *dout = kc_random(&rng, no, -1, 1);
  float *dinp = kc_random(&rng, ni, -1, 1), *dw = kc_random(&rng, nw, -1, 1);
  float *db = kc_random(&rng, OC, -1, 1);
  double *ref_out = doubles(no), *ref_dinp = doubles(ni), *ref_dw = doubles(nw);
  double *ref_db = doubles(OC);

  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      double s = bias ? bias[o] : 0.0;
      for (int c = 0; c < C; c++)
        s += (double)inp[n * C + c] * w[o * C + c];
      ref_out[n * OC + o] = s;
    }
  for (size_t i = 0; i < ni; i++)
    ref_dinp[i] = dinp[i];
  for (size_t i = 0; i < nw; i++)
    ref_dw[i] = dw[i];
  for (int o = 0; o < OC; o++)
    ref_db[o] = db[o];
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      double d = dout[n * OC + o];
      ref_db[o] += d;
      for (int c = 0; c < C; c++) {
        ref_dinp[n * C + c] += d * w[o * C + c];
        ref_dw[o * C + c] += d * inp[n * C + c];
      }
    }

  be.ops->matmul_fwd(be.ctx, out, inp, w, bias, N, C, OC);
  be.ops->matmul_bwd(be.ctx, dinp, dw, with_bias ? db : NULL, dout, inp, w, N, C, OC);
  /* fp32 sums of a few hundred O(1) products: errors of a few 1e-5 */
  int fail = kc_close("matmul_fwd", out, ref_out, no, 5e-4, 1e-5);
  fail |= kc_close("matmul_bwd dinp", dinp, ref_dinp, ni, 5e-4, 1e-5);
  fail |= kc_close("matmul_bwd dw", dw, ref_dw, nw, 5e-4, 1e-5);
  if (with_bias)
    fail |= kc_close("matmul_bwd dbias", db, ref_db, OC, 5e-4, 1e-5);

  free(inp), free(w), free(bias), free(out), free(dout), free(dinp), free(dw), free(db);
  free(ref_out), free(ref_dinp), free(ref_dw), free(ref_db);
  return fail;
}

static int test_attention(int causal) {
  int B = 2, T = 37, C = 32, NH = 4, hs = C / NH;
  size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, nsaved = (size_t)B * NH * T * T;
  float *qkv = kc_random(&rng, nqkv, -2, 2), *out = kc_floats(nout);
  float *saved = kc_floats(be.ops->attention_saved_bytes(B, T, C, NH) / sizeof(float));
  double *ref = doubles(nout), *ref_p = doubles(nsaved), *s = doubles(T);
  int fail = KC_EXPECT(be.ops->attention_saved_bytes(B, T, C, NH) == nsaved * sizeof(float),
                       "attention_saved_bytes");

  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        const float *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
        int nk = causal ? t + 1 : T;
        double mx = -INFINITY, sum = 0.0;
        for (int j = 0; j < nk; j++) {
          const float *k = qkv + ((size_t)b * T + j) * 3 * C + C + h * hs;
          double d = 0.0;
          for (int i = 0; i < hs; i++)
            d += (double)q[i] * k[i];
          s[j] = d / sqrt(hs);
          mx = fmax(mx, s[j]);
        }
        for (int j = 0; j < nk; j++)
          sum += s[j] = exp(s[j] - mx);
        double *p = ref_p + (((size_t)b * NH + h) * T + t) * T;
        for (int j = 0; j < nk; j++)
          p[j] = s[j] / sum;
        for (int i = 0; i < hs; i++) {
          double o = 0.0;
          for (int j = 0; j < nk; j++)
            o += p[j] * qkv[((size_t)b * T + j) * 3 * C + 2 * C + h * hs + i];
          ref[((size_t)b * T + t) * C + h * hs + i] = o;
        }
      }

  be.ops->attention_fwd(be.ctx, out, saved, qkv, B, T, C, NH, causal);
  fail |= kc_close(causal ? "attention causal out" : "attention out", out, ref, nout, 1e-5, 1e-4);
  fail |= kc_close(causal ? "attention causal probs" : "attention probs", saved, ref_p, nsaved,
                   1e-6, 1e-4);

  if (causal) {
    /* Changing batch 0's last key and value may change only its last query's outputs. */
    float *before = kc_copy(out, nout);
    float *kv = qkv + (size_t)(T - 1) * 3 * C + C;
    for (int i = 0; i < 2 * C; i++)
      kv[i] += 1.0f;
    be.ops->attention_fwd(be.ctx, out, saved, qkv, B, T, C, NH, causal);
    fail |= KC_EXPECT(memcmp(out, before, (size_t)(T - 1) * C * sizeof(float)) == 0,
                      "causal attention: earlier queries changed with a future key");
    fail |= KC_EXPECT(memcmp(out + (size_t)(T - 1) * C, before + (size_t)(T - 1) * C,
                             C * sizeof(float)) != 0,
                      "causal attention: last query ignored its own key");
    free(before);
  }
  free(qkv), free(out), free(saved), free(ref), free(ref_p), free(s);
  return fail;
}

static int test_layernorm(void) {
  int N = 9, C = 70;
  size_t n = (size_t)N * C;
  float *inp = kc_random(&rng, n, -3, 5), *w = kc_random(&rng, C, -1, 2);
  float *b = kc_random(&rng, C, -1, 1), *out = kc_floats(n);
  float *mean = kc_floats(N), *rstd = kc_floats(N);
  double *ref = doubles(n), *ref_mean = doubles(N), *ref_rstd = doubles(N);
  for (int r = 0; r < N; r++) {
    double mu = 0.0, var = 0.0;
    for (int c = 0; c < C; c++)
      mu += inp[r * C + c];
    mu /= C;
    for (int c = 0; c < C; c++)
      var += (inp[r * C + c] - mu) * (inp[r * C + c] - mu);
    double rs = 1.0 / sqrt(var / C + 1e-5);
    ref_mean[r] = mu;
    ref_rstd[r] = rs;
    for (int c = 0; c < C; c++)
      ref[r * C + c] = (inp[r * C + c] - mu) * rs * w[c] + b[c];
  }
  be.ops->layernorm_fwd(be.ctx, out, mean, rstd, inp, w, b, N, C);
  int fail = kc_close("layernorm out", out, ref, n, 1e-5, 1e-5);
  fail |= kc_close("layernorm mean", mean, ref_mean, N, 1e-6, 1e-6);
  fail |= kc_close("layernorm rstd", rstd, ref_rstd, N, 1e-6, 1e-6);
  free(inp), free(w), free(b), free(out), free(mean), free(rstd);
  free(ref), free(ref_mean), free(ref_rstd);
  return fail;
}

static int test_crossentropy(void) {
  int N = 13, V = 1000, V_alloc = 1024;
  size_t n = (size_t)N * V_alloc;
  float *logits = kc_floats(n);
  int32_t *tg = malloc(sizeof(int32_t) * N);
  for (int i = 0; i < N; i++)
    tg[i] = kc_int(&rng, V);
  tg[5] = -1;
  double loss;
  int count;
  int fail = 0;

  /* uniform logits (any constant): loss log V per counted row */
  for (size_t i = 0; i < n; i++)
    logits[i] = 3.25f;
  be.ops->crossentropy_fwd(be.ctx, logits, tg, N, V, V_alloc, -1, &loss, &count);
  fail |= KC_EXPECT(count == N - 1, "uniform: counted %d", count);
  fail |= KC_EXPECT(fabs(loss - (N - 1) * log(V)) < 1e-5 * (N - 1) * log(V),
                    "uniform: loss %.9g want %.9g", loss, (N - 1) * log(V));

  /* random logits against a double reference; large values check the max subtraction */
  kc_fill(&rng, logits, n, -30, 90);
  double ref = 0.0;
  for (int r = 0; r < N; r++) {
    if (tg[r] == -1)
      continue;
    const float *x = logits + (size_t)r * V_alloc;
    double mx = -INFINITY, sum = 0.0;
    for (int j = 0; j < V; j++)
      mx = fmax(mx, x[j]);
    for (int j = 0; j < V; j++)
      sum += exp(x[j] - mx);
    ref += mx + log(sum) - x[tg[r]];
  }
  be.ops->crossentropy_fwd(be.ctx, logits, tg, N, V, V_alloc, -1, &loss, &count);
  fail |= KC_EXPECT(isfinite(loss) && fabs(loss - ref) < 1e-9 * fabs(ref) + 1e-9,
                    "random: loss %.12g want %.12g", loss, ref);
  free(logits), free(tg);
  return fail;
}

static int test_pointwise(void) {
  size_t n = 100003; /* past the parallel threshold, odd */
  float *x = kc_random(&rng, n, -6, 6), *y = kc_random(&rng, n, -1, 1), *out = kc_floats(n);
  double *ref = doubles(n);
  int fail = 0;

  for (size_t i = 0; i < n; i++) {
    double v = x[i];
    ref[i] = 0.5 * v * (1.0 + tanh(sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
  }
  be.ops->gelu_fwd(be.ctx, out, x, n);
  fail |= kc_close("gelu_fwd", out, ref, n, 1e-6, 1e-5);

  for (size_t i = 0; i < n; i++)
    ref[i] = x[i] > 0 ? x[i] : 0.0;
  be.ops->relu_fwd(be.ctx, out, x, n);
  fail |= kc_close("relu_fwd", out, ref, n, 0, 0);

  /* add in place (out aliases a), then scale */
  for (size_t i = 0; i < n; i++)
    ref[i] = (double)(x[i] + y[i]) * 0.5;
  be.ops->add(be.ctx, x, x, y, n);
  be.ops->scale(be.ctx, x, 0.5f, n);
  fail |= kc_close("add+scale", x, ref, n, 0, 0);
  free(x), free(y), free(out), free(ref);
  return fail;
}

static int test_embedding(void) {
  int B = 3, T = 6, C = 10, V = 17;
  float *wte = kc_random(&rng, (size_t)V * C, -1, 1), *wpe = kc_random(&rng, (size_t)T * C, -1, 1);
  float *out = kc_floats((size_t)B * T * C);
  int32_t tok[3 * 6];
  double *ref = doubles((size_t)B * T * C);
  int fail = 0;
  for (int i = 0; i < B * T; i++)
    tok[i] = kc_int(&rng, V);
  for (int with_wpe = 0; with_wpe < 2; with_wpe++) {
    for (int i = 0; i < B * T; i++)
      for (int c = 0; c < C; c++)
        ref[i * C + c] = (double)(wte[tok[i] * C + c] + (with_wpe ? wpe[(i % T) * C + c] : 0.0f));
    be.ops->embedding_fwd(be.ctx, out, tok, wte, with_wpe ? wpe : NULL, B, T, C);
    fail |= kc_close(with_wpe ? "embedding_fwd wpe" : "embedding_fwd", out, ref,
                     (size_t)B * T * C, 0, 0);
  }
  free(wte), free(wpe), free(out), free(ref);
  return fail;
}

static int test_memory(void) {
  int fail = 0;
  size_t sizes[] = {0, 1, 63, 64, 1000};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    unsigned char *p = be.ops->alloc(be.ctx, sizes[i]);
    fail |= KC_EXPECT(p && (uintptr_t)p % 64 == 0, "alloc(%zu) not 64-byte aligned", sizes[i]);
    if (!p)
      continue;
    unsigned char src[1000], back[1000];
    for (size_t j = 0; j < sizes[i]; j++)
      src[j] = (unsigned char)(j * 7 + 1);
    be.ops->to_device(be.ctx, p, src, sizes[i]);
    be.ops->to_host(be.ctx, back, p, sizes[i]);
    fail |= KC_EXPECT(memcmp(src, back, sizes[i]) == 0, "round trip of %zu bytes", sizes[i]);
    be.ops->zero(be.ctx, p, sizes[i]);
    for (size_t j = 0; j < sizes[i]; j++)
      fail |= KC_EXPECT(p[j] == 0, "zero(%zu) left byte %zu", sizes[i], j);
    be.ops->free(be.ctx, p);
  }
  fail |= KC_EXPECT(be.ops->alloc(be.ctx, SIZE_MAX) == NULL, "alloc(SIZE_MAX) did not fail");
  fail |= KC_EXPECT(be.ops->sync(be.ctx) == 0, "sync");
  fail |= KC_EXPECT(strcmp(be.ops->name, "cpu") == 0, "name");
  return fail;
}

int main(void) {
  if (zt_backend_cpu_open(&be, 0) < 0)
    return 1;
  kc_seed(&rng, 7);
  int fail = 0;
  fail |= test_matmul(300, 270, 37, 1);
  fail |= test_matmul(5, 3, 70, 0);
  fail |= test_attention(1);
  fail |= test_attention(0);
  fail |= test_layernorm();
  fail |= test_crossentropy();
  fail |= test_pointwise();
  fail |= test_embedding();
  fail |= test_memory();
  zt_backend_cpu_close(&be);
  if (!fail)
    printf("all forward checks passed\n");
  return fail;
}
