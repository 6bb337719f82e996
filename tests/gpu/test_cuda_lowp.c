/* The CUDA backend's typed ops (bf16 and fp16 activations, ops.h) against the CPU reference's
 * typed ops on the same bits (the llama family's rmsnorm, rope, swiglu, grouped-query
 * attention and per-row loss among them), plus cast, adamw_dt, adamw_sr and the TF32 switch.
 * Prints one line per comparison with the worst errors. Exits 77 without a GPU.
 *
 * Tolerances. Both backends widen the same dt inputs, compute in fp32 and round each stored
 * output once; they differ in fp32 summation order and a few device math functions, and the
 * CUDA side has by design a few extra roundings: the matmul bias is preset in dt (rounded once
 * more), attention rounds P and dS to dt before the products that read them. So a dt output
 * may land one or two dt ulps away, and where values cancel the error is relative to the
 * tensor's scale: |got - want| <= A u max|want| + R u |want|, u the unit roundoff of dt
 * (2^-8 bf16, 2^-11 fp16): A = 4, R = 4 for single products; A = 16, R = 8 for attention's
 * backward (dS rounded, then two products). fp32 outputs computed from the same dt inputs
 * (weight gradients, layernorm statistics, the loss) only differ by fp32 summation order:
 * 1e-5 relative to the scale. The AdamW updates (adamw_dt, and adamw_sr with bf16 moments
 * rounded stochastically) and the casts are bitwise. */
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
static kc_rng rng;

/* ---- buffers: the host copy the CPU works on, the device copy the GPU works on -------------- */


/* A tensor of n values of type t: host bytes h, device bytes d. */
typedef struct tb {
  void *h, *d;
  size_t n;
  zt_dtype t;
} tb;

static float get(const tb *b, size_t i) {
  if (b->t == ZT_F32) return ((const float *)b->h)[i];
  uint16_t x = ((const uint16_t *)b->h)[i];
  return b->t == ZT_BF16 ? zt_bf16_to_f32(x) : zt_f16_to_f32(x);
}

static tb make(zt_dtype t, size_t n, float lo, float hi) {
  tb b = {calloc(n ? n : 1, zt_dtype_size(t)), twin_dev_alloc(&gpu, n * zt_dtype_size(t)), n, t};
  if (!b.h) exit(1);
  for (size_t i = 0; i < n; i++) {
    float x = lo == hi ? lo : kc_uniform(&rng, lo, hi);
    if (t == ZT_F32) ((float *)b.h)[i] = x;
    else ((uint16_t *)b.h)[i] = t == ZT_BF16 ? zt_f32_to_bf16(x) : zt_f32_to_f16(x);
  }
  gpu.ops->to_device(gpu.ctx, b.d, b.h, n * zt_dtype_size(t));
  return b;
}

/* The device copy against the host copy: the GPU's result against the CPU's. */
static void check(const char *what, const tb *b, double a_scale, double r) {
  size_t es = zt_dtype_size(b->t);
  tb got = {malloc(b->n * es + 1), NULL, b->n, b->t};
  gpu.ops->to_host(gpu.ctx, got.h, b->d, b->n * es);
  double maxw = 0, max_abs = 0, worst = 0;
  for (size_t i = 0; i < b->n; i++) maxw = fmax(maxw, fabs(get(b, i)));
  double atol = a_scale * maxw;
  size_t bad = b->n, nbad = 0;
  for (size_t i = 0; i < b->n; i++) {
    double g = get(&got, i), w = get(b, i), err = fabs(g - w);
    if (!(err <= atol + r * fabs(w))) {
      if (nbad++ == 0) bad = i;
    }
    max_abs = fmax(max_abs, err);
    if (atol + r * fabs(w) > 0) worst = fmax(worst, err / (atol + r * fabs(w)));
  }
  printf("%-48s %s n=%-7zu max|want| %.3e  max abs err %.3e  worst %.2f of tolerance  %s\n",
         what, zt_dtype_name(b->t), b->n, maxw, max_abs, worst, nbad ? "FAIL" : "ok");
  if (nbad) {
    fprintf(stderr, "FAIL %s (%s): %zu of %zu elements out of tolerance (atol %.3g = %.3g x "
            "max|want|, rtol %.3g); first [%zu]: gpu %.9g, cpu %.9g\n", what,
            zt_dtype_name(b->t), nbad, b->n, atol, a_scale, r, bad, (double)get(&got, bad),
            (double)get(b, bad));
    failures++;
  }
  free(got.h);
}

static void check_bits(const char *what, const tb *b) {
  size_t bytes = b->n * zt_dtype_size(b->t);
  void *got = malloc(bytes + 1);
  gpu.ops->to_host(gpu.ctx, got, b->d, bytes);
  int same = memcmp(got, b->h, bytes) == 0;
  printf("%-48s %s n=%-7zu %s\n", what, zt_dtype_name(b->t), b->n,
         same ? "bitwise equal" : "DIFFERENT (FAIL)");
  if (!same) {
    for (size_t i = 0; i < b->n; i++) {
      tb g = {got, NULL, b->n, b->t};
      if (memcmp((char *)got + i * zt_dtype_size(b->t), (char *)b->h + i * zt_dtype_size(b->t),
                 zt_dtype_size(b->t))) {
        fprintf(stderr, "FAIL %s: first difference [%zu]: gpu %.9g, cpu %.9g\n", what, i,
                (double)get(&g, i), (double)get(b, i));
        break;
      }
    }
    failures++;
  }
  free(got);
}

static void free_all(tb *const *list, size_t n) {
  for (size_t i = 0; i < n; i++) free(list[i]->h);
  twin_dev_free_all(&gpu);
}

static double u_of(zt_dtype dt) { return dt == ZT_BF16 ? 0x1p-8 : 0x1p-11; }

#define F32_SCALE 1e-5

/* ---- the ops -------------------------------------------------------------------------------- */

static void test_matmul(zt_dtype dt, int N, int C, int OC) {
  double u = u_of(dt);
  char what[96];
  tb inp = make(dt, (size_t)N * C, -1, 1), w = make(dt, (size_t)OC * C, -1, 1);
  tb bias = make(ZT_F32, OC, -1, 1), out = make(dt, (size_t)N * OC, 0, 0);
  for (int with_bias = 0; with_bias < 2; with_bias++) {
    cpu.ops->matmul_fwd_dt(cpu.ctx, dt, out.h, inp.h, w.h, with_bias ? bias.h : NULL, N, C, OC);
    gpu.ops->matmul_fwd_dt(gpu.ctx, dt, out.d, inp.d, w.d, with_bias ? bias.d : NULL, N, C, OC);
    snprintf(what, sizeof what, "matmul_fwd N=%d C=%d OC=%d bias=%d", N, C, OC, with_bias);
    check(what, &out, 4 * u, 4 * u);
  }
  tb dout = make(dt, (size_t)N * OC, -1, 1), dinp = make(dt, (size_t)N * C, -1, 1);
  tb dw = make(ZT_F32, (size_t)OC * C, -1, 1), db = make(ZT_F32, OC, -1, 1);
  cpu.ops->matmul_bwd_dt(cpu.ctx, dt, dinp.h, dw.h, db.h, dout.h, inp.h, w.h, N, C, OC);
  gpu.ops->matmul_bwd_dt(gpu.ctx, dt, dinp.d, dw.d, db.d, dout.d, inp.d, w.d, N, C, OC);
  snprintf(what, sizeof what, "matmul_bwd dinp N=%d C=%d OC=%d", N, C, OC);
  check(what, &dinp, 4 * u, 4 * u);
  snprintf(what, sizeof what, "matmul_bwd dw (fp32) N=%d C=%d OC=%d", N, C, OC);
  check(what, &dw, F32_SCALE, F32_SCALE);
  check("matmul_bwd dbias (fp32)", &db, F32_SCALE, F32_SCALE);
  /* dinp NULL (the first layer's input needs no gradient) */
  cpu.ops->matmul_bwd_dt(cpu.ctx, dt, NULL, dw.h, NULL, dout.h, inp.h, w.h, N, C, OC);
  gpu.ops->matmul_bwd_dt(gpu.ctx, dt, NULL, dw.d, NULL, dout.d, inp.d, w.d, N, C, OC);
  check("matmul_bwd dw, no dinp/dbias (fp32)", &dw, F32_SCALE, F32_SCALE);
  tb *all[] = {&inp, &w, &bias, &out, &dout, &dinp, &dw, &db};
  free_all(all, sizeof all / sizeof *all);
}

static void test_layernorm(zt_dtype dt, int N, int C) {
  double u = u_of(dt);
  tb inp = make(dt, (size_t)N * C, -2, 3), w = make(ZT_F32, C, 0.5f, 1.5f);
  tb b = make(ZT_F32, C, -1, 1), out = make(dt, (size_t)N * C, 0, 0);
  tb mean = make(ZT_F32, N, 0, 0), rstd = make(ZT_F32, N, 0, 0);
  cpu.ops->layernorm_fwd_dt(cpu.ctx, dt, out.h, mean.h, rstd.h, inp.h, w.h, b.h, N, C);
  gpu.ops->layernorm_fwd_dt(gpu.ctx, dt, out.d, mean.d, rstd.d, inp.d, w.d, b.d, N, C);
  check("layernorm_fwd out", &out, 4 * u, 4 * u);
  check("layernorm_fwd mean (fp32)", &mean, F32_SCALE, F32_SCALE);
  check("layernorm_fwd rstd (fp32)", &rstd, F32_SCALE, F32_SCALE);
  tb dout = make(dt, (size_t)N * C, -1, 1), dinp = make(dt, (size_t)N * C, -1, 1);
  tb dw = make(ZT_F32, C, -1, 1), db = make(ZT_F32, C, -1, 1);
  /* both sides from the CPU's statistics, so the backward is compared alone */
  gpu.ops->to_device(gpu.ctx, mean.d, mean.h, (size_t)N * 4);
  gpu.ops->to_device(gpu.ctx, rstd.d, rstd.h, (size_t)N * 4);
  cpu.ops->layernorm_bwd_dt(cpu.ctx, dt, dinp.h, dw.h, db.h, dout.h, inp.h, w.h, mean.h, rstd.h,
                            N, C);
  gpu.ops->layernorm_bwd_dt(gpu.ctx, dt, dinp.d, dw.d, db.d, dout.d, inp.d, w.d, mean.d, rstd.d,
                            N, C);
  check("layernorm_bwd dinp", &dinp, 4 * u, 4 * u);
  check("layernorm_bwd dw (fp32)", &dw, F32_SCALE, F32_SCALE);
  check("layernorm_bwd db (fp32)", &db, F32_SCALE, F32_SCALE);
  tb *all[] = {&inp, &w, &b, &out, &mean, &rstd, &dout, &dinp, &dw, &db};
  free_all(all, sizeof all / sizeof *all);
}

static void test_attention(zt_dtype dt, int B, int T, int NH, int NKV, int hs, int causal) {
  double u = u_of(dt);
  char what[96];
  size_t n = (size_t)B * T * NH * hs, nqkv = (size_t)B * T * (NH + 2 * NKV) * hs;
  tb qkv = make(dt, nqkv, -1, 1), out = make(dt, n, 0, 0);
  void *saved_h = calloc(1, cpu.ops->attention_saved_bytes_dt(dt, B, T, NH, NKV, hs));
  void *saved_d = twin_dev_alloc(&gpu, gpu.ops->attention_saved_bytes_dt(dt, B, T, NH, NKV, hs));
  cpu.ops->attention_fwd_dt(cpu.ctx, dt, out.h, saved_h, qkv.h, B, T, NH, NKV, hs, causal, NULL);
  gpu.ops->attention_fwd_dt(gpu.ctx, dt, out.d, saved_d, qkv.d, B, T, NH, NKV, hs, causal, NULL);
  snprintf(what, sizeof what, "attention_fwd B=%d T=%d NH=%d NKV=%d hs=%d causal=%d", B, T, NH,
           NKV, hs, causal);
  check(what, &out, 4 * u, 4 * u);
  tb dout = make(dt, n, -1, 1), dqkv = make(dt, nqkv, -1, 1);
  cpu.ops->attention_bwd_dt(cpu.ctx, dt, dqkv.h, dout.h, qkv.h, saved_h, B, T, NH, NKV, hs,
                            causal, NULL);
  gpu.ops->attention_bwd_dt(gpu.ctx, dt, dqkv.d, dout.d, qkv.d, saved_d, B, T, NH, NKV, hs,
                            causal, NULL);
  snprintf(what, sizeof what, "attention_bwd B=%d T=%d NH=%d NKV=%d hs=%d causal=%d", B, T, NH,
           NKV, hs, causal);
  check(what, &dqkv, 16 * u, 8 * u);
  free(saved_h);
  tb *all[] = {&qkv, &out, &dout, &dqkv};
  free_all(all, sizeof all / sizeof *all);
}

/* H heads of C inside rows of `stride` values (H = 1, stride = C: the block norm). */
static void test_rmsnorm(zt_dtype dt, int N, int H, int C, ptrdiff_t stride) {
  double u = u_of(dt);
  char what[96];
  size_t n = (size_t)N * stride, rows = (size_t)N * H;
  tb inp = make(dt, n, -2, 3), w = make(ZT_F32, C, 0.5f, 1.5f), out = make(dt, n, -1, 1);
  tb rstd = make(ZT_F32, rows, 0, 0);
  cpu.ops->rmsnorm_fwd_dt(cpu.ctx, dt, out.h, rstd.h, inp.h, w.h, N, H, C, stride, 1e-5f);
  gpu.ops->rmsnorm_fwd_dt(gpu.ctx, dt, out.d, rstd.d, inp.d, w.d, N, H, C, stride, 1e-5f);
  snprintf(what, sizeof what, "rmsnorm_fwd N=%d H=%d C=%d stride=%td", N, H, C, stride);
  check(what, &out, 4 * u, 4 * u);
  snprintf(what, sizeof what, "rmsnorm_fwd rstd (fp32) N=%d H=%d C=%d", N, H, C);
  check(what, &rstd, F32_SCALE, F32_SCALE);
  tb dout = make(dt, n, -1, 1), dinp = make(dt, n, -1, 1), dw = make(ZT_F32, C, -1, 1);
  gpu.ops->to_device(gpu.ctx, rstd.d, rstd.h, rows * 4);
  cpu.ops->rmsnorm_bwd_dt(cpu.ctx, dt, dinp.h, dw.h, dout.h, inp.h, w.h, rstd.h, N, H, C, stride);
  gpu.ops->rmsnorm_bwd_dt(gpu.ctx, dt, dinp.d, dw.d, dout.d, inp.d, w.d, rstd.d, N, H, C, stride);
  snprintf(what, sizeof what, "rmsnorm_bwd dinp N=%d H=%d C=%d stride=%td", N, H, C, stride);
  check(what, &dinp, 4 * u, 4 * u);
  snprintf(what, sizeof what, "rmsnorm_bwd dw (fp32) N=%d H=%d C=%d", N, H, C);
  check(what, &dw, F32_SCALE, F32_SCALE);
  tb *all[] = {&inp, &w, &out, &rstd, &dout, &dinp, &dw};
  free_all(all, sizeof all / sizeof *all);
}

/* The q heads of qkv rows: the rotation of the same dt values, rounded once on both sides. */
static void test_rope(zt_dtype dt, int N, int NH, int NKV, int hs) {
  double u = u_of(dt);
  char what[96];
  ptrdiff_t stride = (ptrdiff_t)(NH + 2 * NKV) * hs;
  size_t n = (size_t)N * stride, es = zt_dtype_size(dt);
  tb x = make(dt, n, -2, 2), dx = make(dt, n, -1, 1), f = make(ZT_F32, hs / 2, 0, 0);
  for (int i = 0; i < hs / 2; i++)
    ((float *)f.h)[i] = (float)(1.0 / pow(10000.0, 2.0 * i / hs));
  gpu.ops->to_device(gpu.ctx, f.d, f.h, (size_t)hs / 2 * 4);
  int32_t *pos = malloc((size_t)N * sizeof *pos);
  for (int i = 0; i < N; i++) pos[i] = i % 3 == 2 ? kc_int(&rng, 32768) : i;
  int32_t *dpos = twin_dev_alloc(&gpu, (size_t)N * sizeof *pos);
  gpu.ops->to_device(gpu.ctx, dpos, pos, (size_t)N * sizeof *pos);
  cpu.ops->rope_fwd_dt(cpu.ctx, dt, x.h, f.h, pos, N, NH, hs, stride);
  gpu.ops->rope_fwd_dt(gpu.ctx, dt, x.d, f.d, dpos, N, NH, hs, stride);
  snprintf(what, sizeof what, "rope_fwd N=%d H=%d hs=%d (q of qkv rows)", N, NH, hs);
  check(what, &x, 4 * u, 4 * u);
  cpu.ops->rope_bwd_dt(cpu.ctx, dt, (char *)dx.h + (size_t)NH * hs * es, f.h, pos, N, NKV, hs,
                       stride);
  gpu.ops->rope_bwd_dt(gpu.ctx, dt, (char *)dx.d + (size_t)NH * hs * es, f.d, dpos, N, NKV, hs,
                       stride);
  snprintf(what, sizeof what, "rope_bwd N=%d H=%d hs=%d (k of qkv rows)", N, NKV, hs);
  check(what, &dx, 4 * u, 4 * u);
  free(pos);
  tb *all[] = {&x, &dx, &f};
  free_all(all, sizeof all / sizeof *all);
}

static void test_swiglu(zt_dtype dt, int N, int F) {
  double u = u_of(dt);
  size_t n = (size_t)N * F;
  tb inp = make(dt, 2 * n, -6, 6), out = make(dt, n, 0, 0), dout = make(dt, n, -1, 1);
  tb dinp = make(dt, 2 * n, -1, 1);
  cpu.ops->swiglu_fwd_dt(cpu.ctx, dt, out.h, inp.h, N, F);
  gpu.ops->swiglu_fwd_dt(gpu.ctx, dt, out.d, inp.d, N, F);
  char what[96];
  snprintf(what, sizeof what, "swiglu_fwd N=%d F=%d", N, F);
  check(what, &out, 4 * u, 4 * u);
  cpu.ops->swiglu_bwd_dt(cpu.ctx, dt, dinp.h, inp.h, dout.h, N, F);
  gpu.ops->swiglu_bwd_dt(gpu.ctx, dt, dinp.d, inp.d, dout.d, N, F);
  snprintf(what, sizeof what, "swiglu_bwd (adds into dinp) N=%d F=%d", N, F);
  check(what, &dinp, 4 * u, 4 * u);
  tb *all[] = {&inp, &out, &dout, &dinp};
  free_all(all, sizeof all / sizeof *all);
}

static void test_pointwise(zt_dtype dt, size_t n) {
  double u = u_of(dt);
  tb a = make(dt, n, -4, 4), b = make(dt, n, -4, 4), d = make(dt, n, -1, 1);
  tb out = make(dt, n, 0, 0), acc = make(dt, n, -1, 1);
  cpu.ops->gelu_fwd_dt(cpu.ctx, dt, out.h, a.h, n);
  gpu.ops->gelu_fwd_dt(gpu.ctx, dt, out.d, a.d, n);
  check("gelu_fwd", &out, 4 * u, 4 * u);
  cpu.ops->relu_fwd_dt(cpu.ctx, dt, out.h, a.h, n);
  gpu.ops->relu_fwd_dt(gpu.ctx, dt, out.d, a.d, n);
  check_bits("relu_fwd", &out);
  cpu.ops->add_dt(cpu.ctx, dt, out.h, a.h, b.h, n);
  gpu.ops->add_dt(gpu.ctx, dt, out.d, a.d, b.d, n);
  check_bits("add", &out);
  cpu.ops->gelu_bwd_dt(cpu.ctx, dt, acc.h, a.h, d.h, n);
  gpu.ops->gelu_bwd_dt(gpu.ctx, dt, acc.d, a.d, d.d, n);
  check("gelu_bwd (adds into dinp)", &acc, 4 * u, 4 * u);
  /* from the same start on both sides */
  gpu.ops->to_device(gpu.ctx, acc.d, acc.h, n * 2);
  cpu.ops->relu_bwd_dt(cpu.ctx, dt, acc.h, a.h, d.h, n);
  gpu.ops->relu_bwd_dt(gpu.ctx, dt, acc.d, a.d, d.d, n);
  check_bits("relu_bwd (adds into dinp)", &acc);
  tb *all[] = {&a, &b, &d, &out, &acc};
  free_all(all, sizeof all / sizeof *all);
}

static void test_embedding(zt_dtype dt, int B, int T, int C, int V) {
  size_t rows = (size_t)B * T;
  int32_t *tok = malloc(rows * sizeof *tok);
  for (size_t i = 0; i < rows; i++) tok[i] = kc_int(&rng, V);
  int32_t *dtok = twin_dev_alloc(&gpu, rows * sizeof *tok);
  gpu.ops->to_device(gpu.ctx, dtok, tok, rows * sizeof *tok);
  tb wte = make(ZT_F32, (size_t)V * C, -1, 1), wpe = make(ZT_F32, (size_t)T * C, -1, 1);
  tb out = make(dt, rows * C, 0, 0);
  cpu.ops->embedding_fwd_dt(cpu.ctx, dt, out.h, tok, wte.h, wpe.h, B, T, C, NULL);
  gpu.ops->embedding_fwd_dt(gpu.ctx, dt, out.d, dtok, wte.d, wpe.d, B, T, C, NULL);
  check_bits("embedding_fwd", &out);
  tb dout = make(dt, rows * C, -1, 1);
  tb dwte = make(ZT_F32, (size_t)V * C, -1, 1), dwpe = make(ZT_F32, (size_t)T * C, -1, 1);
  cpu.ops->embedding_bwd_dt(cpu.ctx, dt, dwte.h, dwpe.h, dout.h, tok, B, T, C, NULL);
  gpu.ops->embedding_bwd_dt(gpu.ctx, dt, dwte.d, dwpe.d, dout.d, dtok, B, T, C, NULL);
  check("embedding_bwd dwte (fp32)", &dwte, 1e-6, 1e-6);
  check("embedding_bwd dwpe (fp32)", &dwpe, 1e-6, 1e-6);
  free(tok);
  tb *all[] = {&wte, &wpe, &out, &dout, &dwte, &dwpe};
  free_all(all, sizeof all / sizeof *all);
}

static void test_crossentropy(zt_dtype dt, int N, int V, int V_alloc) {
  double u = u_of(dt);
  int32_t *tgt = malloc((size_t)N * sizeof *tgt);
  for (int i = 0; i < N; i++) tgt[i] = i % 7 == 3 ? -1 : kc_int(&rng, V);
  int32_t *dtgt = twin_dev_alloc(&gpu, (size_t)N * sizeof *tgt);
  gpu.ops->to_device(gpu.ctx, dtgt, tgt, (size_t)N * sizeof *tgt);
  tb logits = make(dt, (size_t)N * V_alloc, -6, 6);
  double lc, lg, fc, fg;
  int cc, cg, nc, ng;
  cpu.ops->crossentropy_fwd_dt(cpu.ctx, dt, logits.h, tgt, N, V, V_alloc, -1, &fc, &nc);
  gpu.ops->crossentropy_fwd_dt(gpu.ctx, dt, logits.d, dtgt, N, V, V_alloc, -1, &fg, &ng);
  /* the fp16 loss scale makes dlogits large: what the trainer hands it */
  float dscale = dt == ZT_F16 ? 65536.0f / N : 1.0f / N;
  cpu.ops->crossentropy_fwd_bwd_dt(cpu.ctx, dt, logits.h, tgt, N, V, V_alloc, -1, dscale, &lc, &cc);
  gpu.ops->crossentropy_fwd_bwd_dt(gpu.ctx, dt, logits.d, dtgt, N, V, V_alloc, -1, dscale, &lg,
                                   &cg);
  char what[96];
  snprintf(what, sizeof what, "crossentropy N=%d V=%d dlogits", N, V);
  check(what, &logits, 4 * u, 4 * u);
  int ok = cc == cg && nc == ng && cc == nc && fabs(lg - lc) <= 1e-5 * fabs(lc) &&
           fabs(fg - fc) <= 1e-5 * fabs(fc) && lc == fc;
  printf("%-48s %s loss cpu %.9g gpu %.9g (fwd only %.9g), counted %d/%d  %s\n",
         "crossentropy loss", zt_dtype_name(dt), lc, lg, fg, cc, cg, ok ? "ok" : "FAIL");
  if (!ok) {
    fprintf(stderr, "FAIL crossentropy loss (%s): cpu %.17g/%d, gpu %.17g/%d, gpu fwd only "
            "%.17g/%d (relative tolerance 1e-5)\n", zt_dtype_name(dt), lc, cc, lg, cg, fg, ng);
    failures++;
  }
  free(tgt);
  tb *all[] = {&logits};
  free_all(all, 1);
}

/* The rows entry: the same dlogits as crossentropy_fwd_bwd_dt, row losses added in fp32. */
static void test_crossentropy_rows(zt_dtype dt, int N, int V, int V_alloc) {
  double u = u_of(dt);
  int32_t *tgt = malloc((size_t)N * sizeof *tgt);
  for (int i = 0; i < N; i++) tgt[i] = i % 5 == 2 ? -1 : kc_int(&rng, V);
  int32_t *dtgt = twin_dev_alloc(&gpu, (size_t)N * sizeof *tgt);
  gpu.ops->to_device(gpu.ctx, dtgt, tgt, (size_t)N * sizeof *tgt);
  tb logits = make(dt, (size_t)N * V_alloc, -6, 6), rows = make(ZT_F32, N, 0, 1);
  float dscale = dt == ZT_F16 ? 65536.0f / N : 1.0f / N;
  cpu.ops->crossentropy_rows_dt(cpu.ctx, dt, logits.h, tgt, N, V, V_alloc, -1, dscale, rows.h);
  gpu.ops->crossentropy_rows_dt(gpu.ctx, dt, logits.d, dtgt, N, V, V_alloc, -1, dscale, rows.d);
  char what[96];
  snprintf(what, sizeof what, "crossentropy_rows N=%d V=%d dlogits", N, V);
  check(what, &logits, 4 * u, 4 * u);
  snprintf(what, sizeof what, "crossentropy_rows N=%d V=%d row_loss (fp32, adds)", N, V);
  check(what, &rows, F32_SCALE, F32_SCALE);
  free(tgt);
  tb *all[] = {&logits, &rows};
  free_all(all, sizeof all / sizeof *all);
}

static void test_cast_adamw(zt_dtype dt, size_t n) {
  tb p32 = make(ZT_F32, n, -2, 2), lp = make(dt, n, 0, 0), back = make(ZT_F32, n, 0, 0);
  /* a few values where rounding matters: ties, fp16 subnormals, overflow, inf, -0 */
  float special[] = {1.0f + 0x1p-8f, 1.0f + 0x1p-7f + 0x1p-8f, 65520.0f, 65519.0f, 0x1p-25f,
                     0x1.8p-24f, 3.4e38f, INFINITY, -INFINITY, -0.0f};
  for (size_t i = 0; i < sizeof special / sizeof *special && i < n; i++)
    ((float *)p32.h)[i] = special[i];
  gpu.ops->to_device(gpu.ctx, p32.d, p32.h, n * 4);
  cpu.ops->cast(cpu.ctx, lp.h, dt, p32.h, ZT_F32, n);
  gpu.ops->cast(gpu.ctx, lp.d, dt, p32.d, ZT_F32, n);
  check_bits("cast fp32 -> dt (ties, subnormals, inf)", &lp);
  cpu.ops->cast(cpu.ctx, back.h, ZT_F32, lp.h, dt, n);
  gpu.ops->cast(gpu.ctx, back.d, ZT_F32, lp.d, dt, n);
  check_bits("cast dt -> fp32", &back);
  tb g = make(ZT_F32, n, -1, 1), m = make(ZT_F32, n, -0.1f, 0.1f), v = make(ZT_F32, n, 0, 0.01f);
  tb p = make(ZT_F32, n, -1, 1);
  for (int t = 1; t <= 3; t++) {
    cpu.ops->adamw_dt(cpu.ctx, p.h, g.h, m.h, v.h, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 0.5f,
                      lp.h, dt);
    gpu.ops->adamw_dt(gpu.ctx, p.d, g.d, m.d, v.d, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 0.5f,
                      lp.d, dt);
  }
  check_bits("adamw_dt p (3 steps)", &p);
  check_bits("adamw_dt m", &m);
  check_bits("adamw_dt v", &v);
  check_bits("adamw_dt compute copy", &lp);
  tb *all[] = {&p32, &lp, &back, &g, &m, &v, &p};
  free_all(all, sizeof all / sizeof *all);
}

/* adamw_sr (bf16 m and v, rounded stochastically): the same fp32 operations as adamw_dt and
 * the same counter bits (engine/kernels/sround.h), so bitwise equal too; index0 past 2^32
 * checks the 64-bit index reaches the hash whole. lp_t ZT_F32: no compute copy. */
static void test_adamw_sr(zt_dtype lp_t, size_t n, uint64_t index0) {
  tb g = make(ZT_F32, n, -1, 1), m = make(ZT_BF16, n, -0.1f, 0.1f), v = make(ZT_BF16, n, 0, 0.01f);
  tb p = make(ZT_F32, n, -1, 1), lp = make(lp_t == ZT_F32 ? ZT_BF16 : lp_t, n, 0, 0);
  void *lp_h = lp_t == ZT_F32 ? NULL : lp.h, *lp_d = lp_t == ZT_F32 ? NULL : lp.d;
  for (int t = 1; t <= 3; t++) {
    cpu.ops->adamw_sr(cpu.ctx, p.h, g.h, m.h, v.h, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 0.5f,
                      lp_h, lp_t, 20261202u, index0);
    gpu.ops->adamw_sr(gpu.ctx, p.d, g.d, m.d, v.d, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 0.5f,
                      lp_d, lp_t, 20261202u, index0);
  }
  char what[96];
  snprintf(what, sizeof what, "adamw_sr p (3 steps, copy %s)", zt_dtype_name(lp_t));
  check_bits(what, &p);
  check_bits("adamw_sr m (bf16, stochastic)", &m);
  check_bits("adamw_sr v (bf16, stochastic)", &v);
  if (lp_h) check_bits("adamw_sr compute copy", &lp);
  tb *all[] = {&g, &m, &v, &p, &lp};
  free_all(all, sizeof all / sizeof *all);
}

/* tf32 changes fp32 matmul results (a little), and switching back restores the exact ones. */
static void test_tf32(void) {
  int N = 256, C = 512, OC = 256;
  tb inp = make(ZT_F32, (size_t)N * C, -1, 1), w = make(ZT_F32, (size_t)OC * C, -1, 1);
  tb out = make(ZT_F32, (size_t)N * OC, 0, 0);
  float *plain = malloc((size_t)N * OC * 4), *tf = malloc((size_t)N * OC * 4);
  float *again = malloc((size_t)N * OC * 4);
  int rc = gpu.ops->set_allow_tf32(gpu.ctx, 0);
  gpu.ops->matmul_fwd(gpu.ctx, out.d, inp.d, w.d, NULL, N, C, OC);
  gpu.ops->to_host(gpu.ctx, plain, out.d, (size_t)N * OC * 4);
  rc |= gpu.ops->set_allow_tf32(gpu.ctx, 1);
  gpu.ops->matmul_fwd(gpu.ctx, out.d, inp.d, w.d, NULL, N, C, OC);
  gpu.ops->to_host(gpu.ctx, tf, out.d, (size_t)N * OC * 4);
  rc |= gpu.ops->set_allow_tf32(gpu.ctx, 0);
  gpu.ops->matmul_fwd(gpu.ctx, out.d, inp.d, w.d, NULL, N, C, OC);
  gpu.ops->to_host(gpu.ctx, again, out.d, (size_t)N * OC * 4);
  double worst = 0, scale = 0;
  for (size_t i = 0; i < (size_t)N * OC; i++) {
    worst = fmax(worst, fabs((double)tf[i] - plain[i]));
    scale = fmax(scale, fabs(plain[i]));
  }
  /* TF32 keeps 10 mantissa bits of each input: errors ~ 2^-11 sqrt(C) |x||w| */
  int ok = rc == 0 && memcmp(plain, again, (size_t)N * OC * 4) == 0 && worst > 0 &&
           worst <= 2e-2 * scale;
  printf("%-48s tf32 max abs diff %.3e (max|out| %.3e), differs: %s, off again restores fp32: "
         "%s  %s\n", "set_allow_tf32 on a 256x512x256 matmul", worst, scale,
         worst > 0 ? "yes" : "no", memcmp(plain, again, (size_t)N * OC * 4) ? "no" : "yes",
         ok ? "ok" : "FAIL");
  if (!ok) {
    fprintf(stderr, "FAIL tf32: rc %d, max diff %.3g (want in (0, %.3g]); fp32 restored: %d\n",
            rc, worst, 2e-2 * scale, memcmp(plain, again, (size_t)N * OC * 4) == 0);
    failures++;
  }
  free(plain), free(tf), free(again);
  tb *all[] = {&inp, &w, &out};
  free_all(all, sizeof all / sizeof *all);
}

int main(void) {
  int rc = twin_open(&cpu, &gpu);
  if (rc) return rc;
  kc_seed(&rng, 20261130);
  zt_dtype dts[2] = {ZT_BF16, ZT_F16};
  for (int k = 0; k < 2; k++) {
    zt_dtype dt = dts[k];
    test_matmul(dt, 111, 48, 67);
    test_matmul(dt, 512, 256, 768);
    test_layernorm(dt, 111, 48);
    test_layernorm(dt, 512, 768);
    for (int causal = 0; causal < 2; causal++) {
      test_attention(dt, 3, 37, 3, 3, 16, causal);
      test_attention(dt, 2, 200, 4, 4, 64, causal);
      test_attention(dt, 2, 77, 8, 2, 128, causal); /* grouped-query, the flash path */
      test_attention(dt, 2, 77, 6, 2, 48, causal);  /* grouped-query, the cuBLAS path */
    }
    test_rmsnorm(dt, 111, 1, 48, 48);
    test_rmsnorm(dt, 256, 1, 2048, 2048);
    test_rmsnorm(dt, 77, 8, 128, (8 + 2 * 2) * 128);
    test_rope(dt, 77, 8, 2, 128);
    test_rope(dt, 130, 32, 8, 64);
    test_swiglu(dt, 111, 67);
    test_swiglu(dt, 256, 2816);
    test_pointwise(dt, 111 * 48 + 5);
    test_pointwise(dt, (size_t)1 << 20);
    test_embedding(dt, 3, 37, 48, 67);
    test_crossentropy(dt, 111, 67, 72);
    test_crossentropy(dt, 64, 50257, 50304);
    test_crossentropy_rows(dt, 111, 67, 72);
    test_crossentropy_rows(dt, 64, 32000, 32000);
    test_cast_adamw(dt, 10007);
    test_adamw_sr(dt, 10007, 12345);
  }
  test_adamw_sr(ZT_F32, (size_t)1 << 20, ((uint64_t)1 << 33) + 7);
  test_tf32();
  rc = gpu.ops->sync(gpu.ctx);
  if (rc < 0) {
    fprintf(stderr, "FAIL: backend error %d: %s\n", rc, gpu.ops->error_text(gpu.ctx));
    failures++;
  }
  twin_close(&cpu, &gpu);
  printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
