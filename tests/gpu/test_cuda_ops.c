/* Every op of the CUDA backend against its CPU twin (the reference) on the same seeded inputs:
 * small odd shapes (T not a multiple of 32, V_alloc > V, ignored targets), larger ones, causal
 * and bidirectional attention, multi-head and grouped-query (the llama family's NH 32 NKV 8
 * hs 64 and NH 8 NKV 2 hs 128), rmsnorm on block rows and on the heads inside qkv rows, rope,
 * swiglu, the per-row loss and sum; backward ops start from non-zero gradients so that the ADD
 * semantics are checked; then determinism (the same op twice gives the same bits) and the
 * sticky error path. Prints the worst error of every comparison (op, shape, max abs and rel
 * error). Exits 77 without a GPU. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "engine/kernels/cuda/cuda_backend.h"
#include "engine/kernels/ops.h"
#include "tests/gpu/twin.h"
#include "tests/unit/kernels/kcheck.h"

static zt_backend cpu, gpu;
static int failures;

/* ---- buffers: a host copy the CPU backend works on, a device copy the CUDA backend works on */


typedef struct buf {
  float *h, *d;
  size_t n;
} buf;

static buf upload(const float *h, size_t n) {
  buf b = {kc_copy(h, n), twin_dev_alloc(&gpu, n * sizeof(float)), n};
  gpu.ops->to_device(gpu.ctx, b.d, b.h, n * sizeof(float));
  return b;
}

static buf random_buf(kc_rng *r, size_t n, float lo, float hi) {
  float *h = kc_random(r, n, lo, hi);
  buf b = upload(h, n);
  free(h);
  return b;
}

static buf zero_buf(size_t n) {
  float *h = kc_floats(n);
  buf b = upload(h, n);
  free(h);
  return b;
}

static int32_t *upload_tokens(const int32_t *h, size_t n) {
  int32_t *d = twin_dev_alloc(&gpu, n * sizeof(int32_t));
  gpu.ops->to_device(gpu.ctx, d, h, n * sizeof(int32_t));
  return d;
}

static float *download(const float *d, size_t n) {
  float *h = kc_floats(n);
  gpu.ops->to_host(gpu.ctx, h, d, n * sizeof(float));
  return h;
}

static void free_buf(buf *b) { free(b->h); }

/* ---- comparisons --------------------------------------------------------------------------- */

/* |got - want| <= atol + rtol |want| everywhere (NaN only where want is NaN); prints the worst
 * absolute and relative errors. */
static void expect_close(const char *what, const float *got, const float *want, size_t n,
                         double atol, double rtol) {
  double max_abs = 0, max_rel = 0;
  size_t bad = n, nbad = 0;
  for (size_t i = 0; i < n; i++) {
    double g = got[i], w = want[i];
    if (isnan(w) || isnan(g)) {
      if (!(isnan(w) && isnan(g)) && nbad++ == 0)
        bad = i;
      continue;
    }
    double err = fabs(g - w);
    if (err > max_abs)
      max_abs = err;
    if (w != 0 && err / fabs(w) > max_rel)
      max_rel = err / fabs(w);
    if (err > atol + rtol * fabs(w) && nbad++ == 0)
      bad = i;
  }
  printf("%-44s n=%-8zu max abs %.3e  max rel %.3e  %s\n", what, n, max_abs, max_rel,
         nbad ? "FAIL" : "ok");
  if (nbad) {
    fprintf(stderr, "FAIL %s: %zu elements out of tolerance (atol %g rtol %g); first %zu: got "
                    "%.9g want %.9g\n",
            what, nbad, atol, rtol, bad, got[bad], want[bad]);
    failures++;
  }
}

/* The device copy of b against its host copy (the CPU backend's result). */
static void check(const char *what, buf b, double atol, double rtol) {
  float *got = download(b.d, b.n);
  expect_close(what, got, b.h, b.n, atol, rtol);
  free(got);
}

/* Device results must be bitwise the same when an op runs twice on the same inputs. */
static void expect_same_bits(const char *what, const float *d1, const float *d2, size_t n) {
  float *a = download(d1, n), *b = download(d2, n);
  int same = memcmp(a, b, n * sizeof(float)) == 0;
  printf("%-44s n=%-8zu %s\n", what, n, same ? "bitwise equal" : "DIFFERENT (FAIL)");
  failures += !same;
  free(a);
  free(b);
}

/* Tolerance of a sum of k products of O(1) values: fp32 rounding grows with the length. */
static double sum_atol(int k) { return 4e-7 * k + 1e-6; }

/* ---- the ops ---------------------------------------------------------------------------------- */

static void test_memory(kc_rng *r) {
  buf b = random_buf(r, 1001, -1, 1);
  check("to_device/to_host round trip", b, 0, 0);
  gpu.ops->zero(gpu.ctx, b.d, 100 * sizeof(float));
  memset(b.h, 0, 100 * sizeof(float));
  check("zero (first 100 of 1001)", b, 0, 0);
  free_buf(&b);
}

static void test_embedding(kc_rng *r, int B, int T, int C, int V) {
  size_t rows = (size_t)B * T;
  int32_t *tok = malloc(rows * sizeof(int32_t));
  for (size_t i = 0; i < rows; i++)
    tok[i] = kc_int(r, V); /* V small: tokens repeat, so dwte rows take several adds */
  int32_t *dtok = upload_tokens(tok, rows);
  buf wte = random_buf(r, (size_t)V * C, -1, 1), wpe = random_buf(r, (size_t)T * C, -1, 1);
  buf out = zero_buf(rows * C), out2 = zero_buf(rows * C);
  char what[96];

  for (int with_wpe = 0; with_wpe < 2; with_wpe++) {
    buf *o = with_wpe ? &out : &out2;
    cpu.ops->embedding_fwd(cpu.ctx, o->h, tok, wte.h, with_wpe ? wpe.h : NULL, B, T, C, NULL);
    gpu.ops->embedding_fwd(gpu.ctx, o->d, dtok, wte.d, with_wpe ? wpe.d : NULL, B, T, C, NULL);
    snprintf(what, sizeof what, "embedding_fwd B=%d T=%d C=%d wpe=%d", B, T, C, with_wpe);
    check(what, *o, 0, 0);
  }

  buf dout = random_buf(r, rows * C, -1, 1);
  buf dwte = random_buf(r, (size_t)V * C, -1, 1), dwpe = random_buf(r, (size_t)T * C, -1, 1);
  cpu.ops->embedding_bwd(cpu.ctx, dwte.h, dwpe.h, dout.h, tok, B, T, C, NULL);
  gpu.ops->embedding_bwd(gpu.ctx, dwte.d, dwpe.d, dout.d, dtok, B, T, C, NULL);
  snprintf(what, sizeof what, "embedding_bwd dwte V=%d", V);
  check(what, dwte, 1e-6, 1e-6);
  check("embedding_bwd dwpe", dwpe, 1e-6, 1e-6);
  /* without wpe: dwte only */
  cpu.ops->embedding_bwd(cpu.ctx, dwte.h, NULL, dout.h, tok, B, T, C, NULL);
  gpu.ops->embedding_bwd(gpu.ctx, dwte.d, NULL, dout.d, dtok, B, T, C, NULL);
  check("embedding_bwd dwte (no wpe, second add)", dwte, 1e-6, 1e-6);

  /* determinism: the same backward into two copies of the same start */
  buf d1 = zero_buf((size_t)V * C), d2 = zero_buf((size_t)V * C);
  gpu.ops->embedding_bwd(gpu.ctx, d1.d, NULL, dout.d, dtok, B, T, C, NULL);
  gpu.ops->embedding_bwd(gpu.ctx, d2.d, NULL, dout.d, dtok, B, T, C, NULL);
  expect_same_bits("embedding_bwd twice", d1.d, d2.d, d1.n);

  buf *all[] = {&wte, &wpe, &out, &out2, &dout, &dwte, &dwpe, &d1, &d2};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++)
    free_buf(all[i]);
  free(tok);
}

static void test_matmul(kc_rng *r, int N, int C, int OC) {
  buf inp = random_buf(r, (size_t)N * C, -1, 1), w = random_buf(r, (size_t)OC * C, -1, 1);
  buf bias = random_buf(r, OC, -1, 1), out = zero_buf((size_t)N * OC);
  char what[96];

  for (int with_bias = 0; with_bias < 2; with_bias++) {
    cpu.ops->matmul_fwd(cpu.ctx, out.h, inp.h, w.h, with_bias ? bias.h : NULL, N, C, OC);
    gpu.ops->matmul_fwd(gpu.ctx, out.d, inp.d, w.d, with_bias ? bias.d : NULL, N, C, OC);
    snprintf(what, sizeof what, "matmul_fwd N=%d C=%d OC=%d bias=%d", N, C, OC, with_bias);
    check(what, out, sum_atol(C), 1e-4);
  }

  buf dout = random_buf(r, (size_t)N * OC, -1, 1);
  buf dinp = random_buf(r, (size_t)N * C, -1, 1), dw = random_buf(r, (size_t)OC * C, -1, 1);
  buf dbias = random_buf(r, OC, -1, 1);
  cpu.ops->matmul_bwd(cpu.ctx, dinp.h, dw.h, dbias.h, dout.h, inp.h, w.h, N, C, OC);
  gpu.ops->matmul_bwd(gpu.ctx, dinp.d, dw.d, dbias.d, dout.d, inp.d, w.d, N, C, OC);
  snprintf(what, sizeof what, "matmul_bwd dinp N=%d C=%d OC=%d", N, C, OC);
  check(what, dinp, sum_atol(OC), 1e-4);
  check("matmul_bwd dw", dw, sum_atol(N), 1e-4);
  check("matmul_bwd dbias", dbias, sum_atol(N), 1e-4);
  /* dinp and dbias NULL: dw alone, a second accumulation */
  cpu.ops->matmul_bwd(cpu.ctx, NULL, dw.h, NULL, dout.h, inp.h, w.h, N, C, OC);
  gpu.ops->matmul_bwd(gpu.ctx, NULL, dw.d, NULL, dout.d, inp.d, w.d, N, C, OC);
  check("matmul_bwd dw only (second add)", dw, 2 * sum_atol(N), 1e-4);

  buf a = zero_buf((size_t)N * C), b = zero_buf((size_t)N * C);
  buf wa = zero_buf((size_t)OC * C), wb = zero_buf((size_t)OC * C);
  buf ba = zero_buf(OC), bb = zero_buf(OC);
  gpu.ops->matmul_bwd(gpu.ctx, a.d, wa.d, ba.d, dout.d, inp.d, w.d, N, C, OC);
  gpu.ops->matmul_bwd(gpu.ctx, b.d, wb.d, bb.d, dout.d, inp.d, w.d, N, C, OC);
  expect_same_bits("matmul_bwd twice: dinp", a.d, b.d, a.n);
  expect_same_bits("matmul_bwd twice: dw", wa.d, wb.d, wa.n);
  expect_same_bits("matmul_bwd twice: dbias", ba.d, bb.d, ba.n);

  buf *all[] = {&inp, &w, &bias, &out, &dout, &dinp, &dw, &dbias, &a, &b, &wa, &wb, &ba, &bb};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++)
    free_buf(all[i]);
}

static void test_layernorm(kc_rng *r, int N, int C) {
  buf inp = random_buf(r, (size_t)N * C, -2, 3), w = random_buf(r, C, 0.5f, 1.5f);
  buf b = random_buf(r, C, -1, 1), out = zero_buf((size_t)N * C);
  buf mean = zero_buf(N), rstd = zero_buf(N);
  char what[96];
  cpu.ops->layernorm_fwd(cpu.ctx, out.h, mean.h, rstd.h, inp.h, w.h, b.h, N, C);
  gpu.ops->layernorm_fwd(gpu.ctx, out.d, mean.d, rstd.d, inp.d, w.d, b.d, N, C);
  snprintf(what, sizeof what, "layernorm_fwd out N=%d C=%d", N, C);
  check(what, out, 1e-5, 1e-5);
  check("layernorm_fwd mean", mean, 1e-6, 1e-6);
  check("layernorm_fwd rstd", rstd, 1e-6, 1e-6);

  /* The backward from the CPU's saved statistics on both sides, so that it is tested alone. */
  gpu.ops->to_device(gpu.ctx, mean.d, mean.h, N * sizeof(float));
  gpu.ops->to_device(gpu.ctx, rstd.d, rstd.h, N * sizeof(float));
  buf dout = random_buf(r, (size_t)N * C, -1, 1), dinp = random_buf(r, (size_t)N * C, -1, 1);
  buf dw = random_buf(r, C, -1, 1), db = random_buf(r, C, -1, 1);
  cpu.ops->layernorm_bwd(cpu.ctx, dinp.h, dw.h, db.h, dout.h, inp.h, w.h, mean.h, rstd.h, N, C);
  gpu.ops->layernorm_bwd(gpu.ctx, dinp.d, dw.d, db.d, dout.d, inp.d, w.d, mean.d, rstd.d, N, C);
  snprintf(what, sizeof what, "layernorm_bwd dinp N=%d C=%d", N, C);
  check(what, dinp, 1e-5, 1e-4);
  check("layernorm_bwd dw", dw, 2 * sum_atol(N), 1e-4);
  check("layernorm_bwd db", db, sum_atol(N), 1e-4);

  buf w1 = zero_buf(C), w2 = zero_buf(C), b1 = zero_buf(C), b2 = zero_buf(C);
  buf i1 = zero_buf((size_t)N * C), i2 = zero_buf((size_t)N * C);
  gpu.ops->layernorm_bwd(gpu.ctx, i1.d, w1.d, b1.d, dout.d, inp.d, w.d, mean.d, rstd.d, N, C);
  gpu.ops->layernorm_bwd(gpu.ctx, i2.d, w2.d, b2.d, dout.d, inp.d, w.d, mean.d, rstd.d, N, C);
  expect_same_bits("layernorm_bwd twice: dinp", i1.d, i2.d, i1.n);
  expect_same_bits("layernorm_bwd twice: dw", w1.d, w2.d, C);
  expect_same_bits("layernorm_bwd twice: db", b1.d, b2.d, C);

  buf *all[] = {&inp, &w, &b, &out, &mean, &rstd, &dout, &dinp, &dw, &db,
                &w1, &w2, &b1, &b2, &i1, &i2};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++)
    free_buf(all[i]);
}

static void test_attention(kc_rng *r, int B, int T, int NH, int NKV, int hs, int causal) {
  size_t nqkv = (size_t)B * T * (NH + 2 * NKV) * hs, nout = (size_t)B * T * NH * hs;
  size_t np = (size_t)B * NH * T * T; /* both backends keep P (B,NH,T,T) first in saved */
  buf qkv = random_buf(r, nqkv, -1, 1), out = zero_buf(nout);
  float *saved_h = kc_floats(cpu.ops->attention_saved_bytes(B, T, NH, NKV, hs) / sizeof(float));
  size_t gbytes = gpu.ops->attention_saved_bytes(B, T, NH, NKV, hs);
  float *saved_d = twin_dev_alloc(&gpu, gbytes);
  char what[128];

  cpu.ops->attention_fwd(cpu.ctx, out.h, saved_h, qkv.h, B, T, NH, NKV, hs, causal, NULL);
  gpu.ops->attention_fwd(gpu.ctx, out.d, saved_d, qkv.d, B, T, NH, NKV, hs, causal, NULL);
  snprintf(what, sizeof what, "attention_fwd P B=%d T=%d NH=%d NKV=%d hs=%d causal=%d", B, T, NH,
           NKV, hs, causal);
  float *p_got = download(saved_d, np);
  expect_close(what, p_got, saved_h, np, 1e-6, 1e-4);
  free(p_got);
  snprintf(what, sizeof what, "attention_fwd out NH=%d NKV=%d hs=%d", NH, NKV, hs);
  check(what, out, sum_atol(T), 1e-4);

  /* The backward from the CPU's P on both sides, so that it is tested alone. dk and dv of a
   * shared head sum over its group: longer sums. */
  gpu.ops->to_device(gpu.ctx, saved_d, saved_h, np * sizeof(float));
  buf dout = random_buf(r, nout, -1, 1), dqkv = random_buf(r, nqkv, -1, 1);
  cpu.ops->attention_bwd(cpu.ctx, dqkv.h, dout.h, qkv.h, saved_h, B, T, NH, NKV, hs, causal, NULL);
  gpu.ops->attention_bwd(gpu.ctx, dqkv.d, dout.d, qkv.d, saved_d, B, T, NH, NKV, hs, causal, NULL);
  snprintf(what, sizeof what, "attention_bwd dqkv B=%d T=%d NH=%d NKV=%d hs=%d causal=%d", B, T,
           NH, NKV, hs, causal);
  check(what, dqkv, sum_atol(NH / NKV * T + hs), 1e-4);

  buf d1 = zero_buf(nqkv), d2 = zero_buf(nqkv);
  gpu.ops->attention_bwd(gpu.ctx, d1.d, dout.d, qkv.d, saved_d, B, T, NH, NKV, hs, causal, NULL);
  gpu.ops->attention_bwd(gpu.ctx, d2.d, dout.d, qkv.d, saved_d, B, T, NH, NKV, hs, causal, NULL);
  snprintf(what, sizeof what, "attention_bwd twice NH=%d NKV=%d hs=%d", NH, NKV, hs);
  expect_same_bits(what, d1.d, d2.d, nqkv);

  buf *all[] = {&qkv, &out, &dout, &dqkv, &d1, &d2};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++)
    free_buf(all[i]);
  free(saved_h);
}

/* N rows of H heads of C inside rows of `stride` floats (H = 1, stride = C: the block norm). */
static void test_rmsnorm(kc_rng *r, int N, int H, int C, ptrdiff_t stride) {
  size_t n = (size_t)N * stride, rows = (size_t)N * H;
  buf inp = random_buf(r, n, -2, 3), w = random_buf(r, C, 0.5f, 1.5f);
  buf out = random_buf(r, n, -1, 1), rstd = zero_buf(rows); /* out's gaps must survive */
  char what[128];
  cpu.ops->rmsnorm_fwd(cpu.ctx, out.h, rstd.h, inp.h, w.h, N, H, C, stride, 1e-6f);
  gpu.ops->rmsnorm_fwd(gpu.ctx, out.d, rstd.d, inp.d, w.d, N, H, C, stride, 1e-6f);
  snprintf(what, sizeof what, "rmsnorm_fwd out N=%d H=%d C=%d stride=%td", N, H, C, stride);
  check(what, out, 1e-5, 1e-5);
  snprintf(what, sizeof what, "rmsnorm_fwd rstd N=%d H=%d C=%d", N, H, C);
  check(what, rstd, 1e-6, 1e-6);

  /* the backward from the CPU's rstd on both sides */
  gpu.ops->to_device(gpu.ctx, rstd.d, rstd.h, rows * sizeof(float));
  buf dout = random_buf(r, n, -1, 1), dinp = random_buf(r, n, -1, 1), dw = random_buf(r, C, -1, 1);
  cpu.ops->rmsnorm_bwd(cpu.ctx, dinp.h, dw.h, dout.h, inp.h, w.h, rstd.h, N, H, C, stride);
  gpu.ops->rmsnorm_bwd(gpu.ctx, dinp.d, dw.d, dout.d, inp.d, w.d, rstd.d, N, H, C, stride);
  snprintf(what, sizeof what, "rmsnorm_bwd dinp N=%d H=%d C=%d stride=%td", N, H, C, stride);
  check(what, dinp, 1e-5, 1e-4);
  snprintf(what, sizeof what, "rmsnorm_bwd dw N=%d H=%d C=%d (sum over N*H rows)", N, H, C);
  check(what, dw, 2 * sum_atol((int)rows), 1e-4);

  buf i1 = zero_buf(n), i2 = zero_buf(n), w1 = zero_buf(C), w2 = zero_buf(C);
  gpu.ops->rmsnorm_bwd(gpu.ctx, i1.d, w1.d, dout.d, inp.d, w.d, rstd.d, N, H, C, stride);
  gpu.ops->rmsnorm_bwd(gpu.ctx, i2.d, w2.d, dout.d, inp.d, w.d, rstd.d, N, H, C, stride);
  snprintf(what, sizeof what, "rmsnorm_bwd twice: dinp N=%d H=%d C=%d", N, H, C);
  expect_same_bits(what, i1.d, i2.d, n);
  snprintf(what, sizeof what, "rmsnorm_bwd twice: dw N=%d H=%d C=%d", N, H, C);
  expect_same_bits(what, w1.d, w2.d, C);

  buf *all[] = {&inp, &w, &out, &rstd, &dout, &dinp, &dw, &i1, &i2, &w1, &w2};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++)
    free_buf(all[i]);
}

/* The k heads of qkv rows (NH query heads first), positions of packed documents, some large
 * (the angle's range reduction); forward, then backward on another tensor. */
static void test_rope(kc_rng *r, int N, int NH, int NKV, int hs) {
  ptrdiff_t stride = (ptrdiff_t)(NH + 2 * NKV) * hs;
  size_t n = (size_t)N * stride;
  float *f = kc_floats(hs / 2);
  for (int i = 0; i < hs / 2; i++)
    f[i] = (float)(1.0 / pow(500000.0, 2.0 * i / hs));
  buf inv_freq = upload(f, hs / 2);
  int32_t *pos = malloc(N * sizeof(int32_t));
  for (int i = 0; i < N; i++)
    pos[i] = i % 5 == 4 ? kc_int(r, 1 << 17) : i % 37;
  int32_t *dpos = upload_tokens(pos, N);
  buf x = random_buf(r, n, -2, 2), dx = random_buf(r, n, -1, 1);
  char what[128];
  cpu.ops->rope_fwd(cpu.ctx, x.h + NH * hs, inv_freq.h, pos, N, NKV, hs, stride);
  gpu.ops->rope_fwd(gpu.ctx, x.d + NH * hs, inv_freq.d, dpos, N, NKV, hs, stride);
  snprintf(what, sizeof what, "rope_fwd N=%d H=%d hs=%d stride=%td", N, NKV, hs, stride);
  check(what, x, 1e-6, 1e-6);
  cpu.ops->rope_bwd(cpu.ctx, dx.h + NH * hs, inv_freq.h, pos, N, NKV, hs, stride);
  gpu.ops->rope_bwd(gpu.ctx, dx.d + NH * hs, inv_freq.d, dpos, N, NKV, hs, stride);
  snprintf(what, sizeof what, "rope_bwd N=%d H=%d hs=%d stride=%td", N, NKV, hs, stride);
  check(what, dx, 1e-6, 1e-6);
  free(f), free(pos);
  free_buf(&inv_freq), free_buf(&x), free_buf(&dx);
}

static void test_swiglu(kc_rng *r, int N, int F) {
  size_t n = (size_t)N * F;
  buf inp = random_buf(r, 2 * n, -8, 8), out = zero_buf(n), dout = random_buf(r, n, -1, 1);
  buf dinp = random_buf(r, 2 * n, -1, 1);
  char what[96];
  cpu.ops->swiglu_fwd(cpu.ctx, out.h, inp.h, N, F);
  gpu.ops->swiglu_fwd(gpu.ctx, out.d, inp.d, N, F);
  snprintf(what, sizeof what, "swiglu_fwd N=%d F=%d", N, F);
  check(what, out, 1e-6, 1e-5);
  cpu.ops->swiglu_bwd(cpu.ctx, dinp.h, inp.h, dout.h, N, F);
  gpu.ops->swiglu_bwd(gpu.ctx, dinp.d, inp.d, dout.d, N, F);
  snprintf(what, sizeof what, "swiglu_bwd (adds, gate | up) N=%d F=%d", N, F);
  check(what, dinp, 1e-6, 1e-5);
  buf *all[] = {&inp, &out, &dout, &dinp};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++)
    free_buf(all[i]);
}

static void test_pointwise(kc_rng *r, size_t n) {
  buf inp = random_buf(r, n, -5, 5), out = zero_buf(n), dout = random_buf(r, n, -1, 1);
  buf dinp = random_buf(r, n, -1, 1), other = random_buf(r, n, -1, 1);
  char what[96];

  cpu.ops->gelu_fwd(cpu.ctx, out.h, inp.h, n);
  gpu.ops->gelu_fwd(gpu.ctx, out.d, inp.d, n);
  snprintf(what, sizeof what, "gelu_fwd n=%zu", n);
  check(what, out, 1e-6, 1e-5);
  cpu.ops->gelu_bwd(cpu.ctx, dinp.h, inp.h, dout.h, n);
  gpu.ops->gelu_bwd(gpu.ctx, dinp.d, inp.d, dout.d, n);
  check("gelu_bwd (adds)", dinp, 1e-6, 1e-5);
  cpu.ops->relu_fwd(cpu.ctx, out.h, inp.h, n);
  gpu.ops->relu_fwd(gpu.ctx, out.d, inp.d, n);
  check("relu_fwd", out, 0, 0);
  cpu.ops->relu_bwd(cpu.ctx, dinp.h, inp.h, dout.h, n);
  gpu.ops->relu_bwd(gpu.ctx, dinp.d, inp.d, dout.d, n);
  check("relu_bwd (adds)", dinp, 1e-6, 1e-5);
  cpu.ops->add(cpu.ctx, out.h, inp.h, other.h, n);
  gpu.ops->add(gpu.ctx, out.d, inp.d, other.d, n);
  check("add", out, 0, 0);
  cpu.ops->add(cpu.ctx, out.h, out.h, other.h, n); /* out aliasing a */
  gpu.ops->add(gpu.ctx, out.d, out.d, other.d, n);
  check("add (out == a)", out, 0, 0);
  cpu.ops->scale(cpu.ctx, out.h, 0.37f, n);
  gpu.ops->scale(gpu.ctx, out.d, 0.37f, n);
  check("scale", out, 0, 0);

  buf *all[] = {&inp, &out, &dout, &dinp, &other};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++)
    free_buf(all[i]);
}

/* Every ignore_every-th row has the ignore_index target (1: all of them; 0: none). */
static void test_crossentropy(kc_rng *r, int N, int V, int V_alloc, int ignore_every) {
  const int ignore_index = -100;
  size_t n = (size_t)N * V_alloc;
  float *h = kc_random(r, n, -6, 6);
  for (int i = 0; i < N; i++)
    for (int j = V; j < V_alloc; j++)
      h[(size_t)i * V_alloc + j] = 1e3f; /* padding: must not be read into the loss */
  int32_t *tg = malloc(N * sizeof(int32_t));
  for (int i = 0; i < N; i++)
    tg[i] = ignore_every && i % ignore_every == ignore_every - 1 ? ignore_index : kc_int(r, V);
  int32_t *dtg = upload_tokens(tg, N);
  buf logits = upload(h, n);
  char what[128];

  double lc, lg;
  int cc, cg;
  cpu.ops->crossentropy_fwd(cpu.ctx, logits.h, tg, N, V, V_alloc, ignore_index, &lc, &cc);
  gpu.ops->crossentropy_fwd(gpu.ctx, logits.d, dtg, N, V, V_alloc, ignore_index, &lg, &cg);
  snprintf(what, sizeof what, "crossentropy_fwd N=%d V=%d V_alloc=%d", N, V, V_alloc);
  int ok = cc == cg && fabs(lc - lg) <= 1e-5 * fabs(lc) + 1e-6;
  printf("%-44s loss cpu %.9g gpu %.9g count %d/%d  %s\n", what, lc, lg, cc, cg,
         ok ? "ok" : "FAIL");
  failures += !ok;
  check("crossentropy_fwd leaves logits", logits, 0, 0);

  float dscale = cc ? 1.0f / cc : 1.0f;
  cpu.ops->crossentropy_fwd_bwd(cpu.ctx, logits.h, tg, N, V, V_alloc, ignore_index, dscale, &lc,
                                &cc);
  gpu.ops->crossentropy_fwd_bwd(gpu.ctx, logits.d, dtg, N, V, V_alloc, ignore_index, dscale,
                                &lg, &cg);
  ok = cc == cg && fabs(lc - lg) <= 1e-5 * fabs(lc) + 1e-6;
  printf("%-44s loss cpu %.9g gpu %.9g count %d/%d  %s\n", "crossentropy_fwd_bwd", lc, lg, cc,
         cg, ok ? "ok" : "FAIL");
  failures += !ok;
  check("crossentropy_fwd_bwd dlogits (in place)", logits, 1e-7, 1e-5);

  /* determinism: the loss sum bit for bit, and the gradient */
  buf again = upload(h, n);
  double l1, l2;
  int c1, c2;
  gpu.ops->crossentropy_fwd(gpu.ctx, again.d, dtg, N, V, V_alloc, ignore_index, &l1, &c1);
  gpu.ops->crossentropy_fwd(gpu.ctx, again.d, dtg, N, V, V_alloc, ignore_index, &l2, &c2);
  ok = memcmp(&l1, &l2, sizeof l1) == 0 && c1 == c2;
  printf("%-44s %s\n", "crossentropy_fwd twice", ok ? "bitwise equal" : "DIFFERENT (FAIL)");
  failures += !ok;
  gpu.ops->crossentropy_fwd_bwd(gpu.ctx, again.d, dtg, N, V, V_alloc, ignore_index, dscale, &l1,
                                &c1);
  expect_same_bits("crossentropy_fwd_bwd twice", logits.d, again.d, n);

  free_buf(&logits);
  free_buf(&again);
  free(h);
  free(tg);
}

/* The rows entry (fp32) in two chunks into one row_loss, as the chunked head calls it. */
static void test_crossentropy_rows(kc_rng *r, int N, int V, int V_alloc) {
  const int ignore_index = -100, n0 = N / 3;
  size_t n = (size_t)N * V_alloc;
  int32_t *tg = malloc(N * sizeof(int32_t));
  for (int i = 0; i < N; i++)
    tg[i] = i % 5 == 1 ? ignore_index : kc_int(r, V);
  int32_t *dtg = upload_tokens(tg, N);
  buf logits = random_buf(r, n, -6, 6), row_loss = random_buf(r, N, 0, 1);
  char what[128];
  float dscale = 1.0f / N;
  for (int part = 0; part < 2; part++) {
    int first = part ? n0 : 0, rows = part ? N - n0 : n0;
    size_t off = (size_t)first * V_alloc;
    cpu.ops->crossentropy_rows_dt(cpu.ctx, ZT_F32, logits.h + off, tg + first, rows, V, V_alloc,
                                  ignore_index, dscale, row_loss.h + first);
    gpu.ops->crossentropy_rows_dt(gpu.ctx, ZT_F32, logits.d + off, dtg + first, rows, V, V_alloc,
                                  ignore_index, dscale, row_loss.d + first);
  }
  snprintf(what, sizeof what, "crossentropy_rows_dt fp32 N=%d V=%d dlogits", N, V);
  check(what, logits, 1e-7, 1e-5);
  snprintf(what, sizeof what, "crossentropy_rows_dt fp32 N=%d V=%d row_loss (adds)", N, V);
  check(what, row_loss, 1e-6, 1e-5);
  free_buf(&logits), free_buf(&row_loss);
  free(tg);
}

static void test_sum(kc_rng *r, size_t n) {
  buf x = random_buf(r, n, -3, 5);
  double sc = cpu.ops->sum(cpu.ctx, x.h, n), sg = gpu.ops->sum(gpu.ctx, x.d, n);
  double sg2 = gpu.ops->sum(gpu.ctx, x.d, n), mag = 0;
  for (size_t i = 0; i < n; i++)
    mag += fabs(x.h[i]);
  int ok = fabs(sc - sg) <= 1e-12 * mag && memcmp(&sg, &sg2, sizeof sg) == 0;
  printf("sum n=%-10zu cpu %.17g gpu %.17g abs %.2e (of sum|x| %.3e)  %s\n", n, sc, sg,
         fabs(sc - sg), mag, ok ? "ok" : "FAIL");
  if (!ok)
    fprintf(stderr, "FAIL sum n=%zu: cpu %.17g gpu %.17g (twice %.17g), tolerance %.3g\n", n, sc,
            sg, sg2, 1e-12 * mag);
  failures += !ok;
  free_buf(&x);
}

static void test_sum_squares(kc_rng *r, size_t n) {
  buf x = random_buf(r, n, -3, 3);
  int nf_c = -1, nf_g = -1;
  double sc = cpu.ops->sum_squares(cpu.ctx, x.h, n, &nf_c);
  double sg = gpu.ops->sum_squares(gpu.ctx, x.d, n, &nf_g);
  double sg2 = gpu.ops->sum_squares(gpu.ctx, x.d, n, NULL);
  int ok = nf_c == 0 && nf_g == 0 && fabs(sc - sg) <= 1e-10 * sc &&
           memcmp(&sg, &sg2, sizeof sg) == 0;
  printf("sum_squares n=%-10zu cpu %.17g gpu %.17g rel %.2e  %s\n", n, sc, sg,
         sc ? fabs(sc - sg) / sc : 0.0, ok ? "ok" : "FAIL");
  failures += !ok;

  static const float bad[] = {INFINITY, NAN, -INFINITY};
  for (int k = 0; k < 3; k++) {
    size_t at = n / 3 + k;
    if (at >= n)
      continue;
    float keep = x.h[at];
    gpu.ops->to_device(gpu.ctx, x.d + at, &bad[k], sizeof(float));
    gpu.ops->sum_squares(gpu.ctx, x.d, n, &nf_g);
    printf("sum_squares with %-4g at %-8zu nonfinite=%d  %s\n", bad[k], at, nf_g,
           nf_g ? "ok" : "FAIL");
    failures += !nf_g;
    gpu.ops->to_device(gpu.ctx, x.d + at, &keep, sizeof(float));
  }
  free_buf(&x);
}

static void test_adamw(kc_rng *r, size_t n) {
  buf p = random_buf(r, n, -1, 1), m = zero_buf(n), v = zero_buf(n);
  buf g = zero_buf(n);
  for (int t = 1; t <= 3; t++) {
    kc_fill(r, g.h, n, -2, 2);
    gpu.ops->to_device(gpu.ctx, g.d, g.h, n * sizeof(float));
    cpu.ops->adamw(cpu.ctx, p.h, g.h, m.h, v.h, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 0.5f);
    gpu.ops->adamw(gpu.ctx, p.d, g.d, m.d, v.d, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 0.5f);
  }
  /* the same fp32 operations in the same order: expected bitwise, allowed an ulp or two */
  check("adamw p after 3 steps", p, 1e-7, 3e-7);
  check("adamw m", m, 1e-7, 3e-7);
  check("adamw v", v, 1e-9, 3e-7);
  buf *all[] = {&p, &m, &v, &g};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++)
    free_buf(all[i]);
}

/* A bad argument poisons a context: later ops are skipped and sync() reports the first error.
 * On a context of its own, so the one under test stays clean. */
static void test_sticky_error(void) {
  zt_backend be;
  int rc = zt_backend_cuda_open(&be, 0);
  if (rc < 0) {
    printf("sticky error: open failed: %d  FAIL\n", rc);
    failures++;
    return;
  }
  float *x = be.ops->alloc(be.ctx, 64 * sizeof(float));
  int before = be.ops->sync(be.ctx);
  be.ops->matmul_fwd(be.ctx, x, x, x, NULL, -1, 4, 4);
  be.ops->scale(be.ctx, x, 2.0f, 64);
  int after = be.ops->sync(be.ctx);
  const char *text = be.ops->error_text(be.ctx);
  int ok = x && before == 0 && after == -EINVAL && text[0] != '\0';
  printf("sticky error: sync %d -> %d (\"%s\")  %s\n", before, after, text, ok ? "ok" : "FAIL");
  failures += !ok;
  be.ops->free(be.ctx, x);
  zt_backend_cuda_close(&be);
}

int main(void) {
  int rc = twin_open(&cpu, &gpu);
  if (rc) return rc;
  kc_rng r;
  kc_seed(&r, 20240611);

  test_memory(&r);
  test_embedding(&r, 3, 37, 48, 67);
  test_embedding(&r, 4, 64, 256, 1000);
  test_matmul(&r, 111, 48, 67);
  test_matmul(&r, 512, 256, 768);
  test_layernorm(&r, 111, 48);
  test_layernorm(&r, 512, 768);
  for (int causal = 0; causal < 2; causal++) {
    test_attention(&r, 3, 37, 3, 3, 16, causal);
    test_attention(&r, 2, 200, 4, 4, 64, causal);
    test_attention(&r, 2, 77, 8, 2, 128, causal);
  }
  test_attention(&r, 1, 1, 2, 2, 4, 1);
  test_attention(&r, 1, 150, 32, 8, 64, 1);
  test_attention(&r, 1, 1, 4, 1, 8, 1);
  test_rmsnorm(&r, 111, 1, 48, 48);
  test_rmsnorm(&r, 256, 1, 2048, 2048);
  test_rmsnorm(&r, 77, 8, 128, (8 + 2 * 2) * 128); /* Qwen3's q norm: 8 heads in qkv rows */
  test_rmsnorm(&r, 77, 2, 64, (4 + 2 * 2) * 64 + 8);
  test_rope(&r, 77, 8, 2, 128);
  test_rope(&r, 300, 32, 8, 64);
  test_swiglu(&r, 111, 67);
  test_swiglu(&r, 256, 2816);
  test_pointwise(&r, 111 * 48 + 5);
  test_pointwise(&r, (size_t)1 << 20);
  test_crossentropy(&r, 111, 67, 72, 7);
  test_crossentropy(&r, 64, 50257, 50304, 5);
  test_crossentropy(&r, 5, 67, 72, 1); /* nothing counted: loss 0, gradient all zero */
  test_crossentropy(&r, 300, 1000, 1000, 0);
  test_crossentropy_rows(&r, 111, 67, 72);
  test_crossentropy_rows(&r, 64, 32000, 32000);
  test_sum_squares(&r, 7);
  test_sum_squares(&r, 1000003);
  test_sum(&r, 7);
  test_sum(&r, 1000003);
  test_adamw(&r, 10007);

  rc = gpu.ops->sync(gpu.ctx);
  if (rc < 0) {
    fprintf(stderr, "FAIL: backend error %d: %s\n", rc, gpu.ops->error_text(gpu.ctx));
    failures++;
  }
  test_sticky_error();

  twin_close(&cpu, &gpu);
  printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
