/* Forward ops (and the matmul backward at sizes past every block boundary) against naive
 * double-precision references; causal attention must not see future keys; cross-entropy of
 * uniform logits is log V; the strided ops (rmsnorm, rope) leave the rest of a row alone. */
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

/* Grouped-query attention (NKV < NH) and multi-head (NKV == NH) against a double reference. */
static int test_attention(int NH, int NKV, int causal) {
  int B = 2, T = 37, hs = 8, C = NH * hs, R = (NH + 2 * NKV) * hs, group = NH / NKV;
  size_t nqkv = (size_t)B * T * R, nout = (size_t)B * T * C, nsaved = (size_t)B * NH * T * T;
  float *qkv = kc_random(&rng, nqkv, -2, 2), *out = kc_floats(nout);
  float *saved = kc_floats(be.ops->attention_saved_bytes(B, T, NH, NKV, hs) / sizeof(float));
  double *ref = doubles(nout), *ref_p = doubles(nsaved), *s = doubles(T);
  char what[96];
  int fail = KC_EXPECT(be.ops->attention_saved_bytes(B, T, NH, NKV, hs) == nsaved * sizeof(float),
                       "attention_saved_bytes");

  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        const float *q = qkv + ((size_t)b * T + t) * R + h * hs;
        size_t k_off = (size_t)C + (size_t)(h / group) * hs;
        size_t v_off = (size_t)C + (size_t)NKV * hs + (size_t)(h / group) * hs;
        int nk = causal ? t + 1 : T;
        double mx = -INFINITY, sum = 0.0;
        for (int j = 0; j < nk; j++) {
          const float *k = qkv + ((size_t)b * T + j) * R + k_off;
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
            o += p[j] * qkv[((size_t)b * T + j) * R + v_off + i];
          ref[((size_t)b * T + t) * C + h * hs + i] = o;
        }
      }

  be.ops->attention_fwd(be.ctx, out, saved, qkv, B, T, NH, NKV, hs, causal, NULL);
  snprintf(what, sizeof what, "attention NH=%d NKV=%d causal=%d out", NH, NKV, causal);
  fail |= kc_close(what, out, ref, nout, 1e-5, 1e-4);
  snprintf(what, sizeof what, "attention NH=%d NKV=%d causal=%d probs", NH, NKV, causal);
  fail |= kc_close(what, saved, ref_p, nsaved, 1e-6, 1e-4);

  if (causal) {
    /* Changing batch 0's last keys and values may change only its last query's outputs. */
    float *before = kc_copy(out, nout);
    float *kv = qkv + (size_t)(T - 1) * R + C;
    for (int i = 0; i < 2 * NKV * hs; i++)
      kv[i] += 1.0f;
    be.ops->attention_fwd(be.ctx, out, saved, qkv, B, T, NH, NKV, hs, causal, NULL);
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

/* RMSNorm of H = 3 heads of C inside rows of `stride` floats (Qwen3's q norm on a qkv row),
 * and the block norm (H = 1, stride = C). Values between the heads must stay untouched. */
static int test_rmsnorm(int N, int H, int C, ptrdiff_t stride) {
  size_t n = (size_t)N * stride;
  float eps = 1e-6f;
  float *inp = kc_random(&rng, n, -3, 3), *w = kc_random(&rng, C, -1, 2);
  float *out = kc_random(&rng, n, -1, 1), *out0 = kc_copy(out, n), *rstd = kc_floats(N * H);
  double *ref = doubles(n), *ref_rstd = doubles(N * H);
  for (size_t i = 0; i < n; i++)
    ref[i] = out0[i];
  for (int r = 0; r < N * H; r++) {
    size_t off = (size_t)(r / H) * stride + (size_t)(r % H) * C;
    double ss = 0.0;
    for (int c = 0; c < C; c++)
      ss += (double)inp[off + c] * inp[off + c];
    double rs = 1.0 / sqrt(ss / C + eps);
    ref_rstd[r] = rs;
    for (int c = 0; c < C; c++)
      ref[off + c] = inp[off + c] * rs * w[c];
  }
  be.ops->rmsnorm_fwd(be.ctx, out, rstd, inp, w, N, H, C, stride, eps);
  char what[96];
  snprintf(what, sizeof what, "rmsnorm N=%d H=%d C=%d stride=%td out", N, H, C, stride);
  int fail = kc_close(what, out, ref, n, 1e-5, 1e-5);
  snprintf(what, sizeof what, "rmsnorm N=%d H=%d C=%d stride=%td rstd", N, H, C, stride);
  fail |= kc_close(what, rstd, ref_rstd, N * H, 1e-6, 1e-6);
  /* in place, as a caller may normalise q inside its qkv row */
  float *x = kc_copy(inp, n);
  be.ops->rmsnorm_fwd(be.ctx, x, rstd, x, w, N, H, C, stride, eps);
  for (int r = 0; r < N; r++)
    for (ptrdiff_t c = 0; c < stride; c++)
      if (c >= (ptrdiff_t)H * C)
        ref[r * stride + c] = inp[r * stride + c];
  snprintf(what, sizeof what, "rmsnorm N=%d H=%d C=%d in place", N, H, C);
  fail |= kc_close(what, x, ref, n, 1e-5, 1e-5);
  free(inp), free(w), free(out), free(out0), free(rstd), free(ref), free(ref_rstd), free(x);
  return fail;
}

/* Llama's inverse frequencies theta^(-2i/hs). */
static float *rope_inv_freq(int hs, double theta) {
  float *f = kc_floats(hs / 2);
  for (int i = 0; i < hs / 2; i++)
    f[i] = (float)(1.0 / pow(theta, 2.0 * i / hs));
  return f;
}

/* The k part of a qkv row (H = NKV heads after NH query heads), positions that restart as in
 * a packed row, some large (the angle's range reduction). */
static int test_rope(void) {
  int N = 11, NH = 4, H = 2, hs = 16, half = hs / 2;
  ptrdiff_t stride = (ptrdiff_t)(NH + 2 * H) * hs;
  size_t n = (size_t)N * stride;
  float *inv_freq = rope_inv_freq(hs, 500000.0);
  int32_t pos[11] = {0, 1, 2, 3, 4, 0, 1, 2, 70000, 131071, 5};
  float *qkv = kc_random(&rng, n, -2, 2), *x = kc_copy(qkv, n);
  double *ref = doubles(n);
  for (size_t i = 0; i < n; i++)
    ref[i] = qkv[i];
  for (int t = 0; t < N; t++)
    for (int h = 0; h < H; h++) {
      size_t off = (size_t)t * stride + (size_t)(NH + h) * hs;
      for (int i = 0; i < half; i++) {
        double a = (float)pos[t] * inv_freq[i]; /* the fp32 product, as the op defines */
        double x1 = qkv[off + i], x2 = qkv[off + i + half];
        ref[off + i] = x1 * cos(a) - x2 * sin(a);
        ref[off + i + half] = x2 * cos(a) + x1 * sin(a);
      }
    }
  be.ops->rope_fwd(be.ctx, x + NH * hs, inv_freq, pos, N, H, hs, stride);
  int fail = kc_close("rope_fwd", x, ref, n, 1e-6, 1e-6);
  free(inv_freq), free(qkv), free(x), free(ref);
  return fail;
}

static int test_swiglu(void) {
  int N = 7, F = 45;
  size_t n = (size_t)N * F;
  float *inp = kc_random(&rng, 2 * n, -12, 12), *out = kc_floats(n);
  double *ref = doubles(n);
  for (int r = 0; r < N; r++)
    for (int f = 0; f < F; f++) {
      double g = inp[(size_t)r * 2 * F + f], u = inp[(size_t)r * 2 * F + F + f];
      ref[(size_t)r * F + f] = g / (1.0 + exp(-g)) * u;
    }
  be.ops->swiglu_fwd(be.ctx, out, inp, N, F);
  int fail = kc_close("swiglu_fwd", out, ref, n, 1e-6, 1e-6);
  free(inp), free(out), free(ref);
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
    be.ops->embedding_fwd(be.ctx, out, tok, wte, with_wpe ? wpe : NULL, B, T, C, NULL);
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
  fail |= test_attention(4, 4, 1);
  fail |= test_attention(4, 4, 0);
  fail |= test_attention(8, 2, 1);
  fail |= test_attention(6, 3, 0);
  fail |= test_layernorm();
  fail |= test_rmsnorm(9, 1, 70, 70);
  fail |= test_rmsnorm(5, 3, 16, 3 * 16 + 2 * 2 * 16);
  fail |= test_rope();
  fail |= test_swiglu();
  fail |= test_crossentropy();
  fail |= test_pointwise();
  fail |= test_embedding();
  fail |= test_memory();
  zt_backend_cpu_close(&be);
  if (!fail)
    printf("all forward checks passed\n");
  return fail;
}
