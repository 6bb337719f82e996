/* The CUDA backend's attention over the shapes its two paths meet (flash_attention.cu for
 * bf16/fp16 with head sizes 32, 64, 80, 96, 128; cuBLAS for fp32 and other head sizes) against
 * the CPU reference's typed twin: causal and bidirectional, T from 1 to 1024 (not multiples of
 * the 64-row tile among them), several (batch, head) pairs, multi-head and grouped-query (the
 * llama family's NH 32 NKV 8 hs 64, NH 8 NKV 2 hs 128, multi-query). Also: the backward ADDS
 * into dqkv, both directions give the same bits run to run, the 16-byte and the element-wise
 * tile loads agree bitwise, and the saved state no longer grows with T^2. Prints the worst
 * errors of every comparison. Exits 77 without a GPU.
 *
 * Tolerances, as in test_cuda_lowp.c (u the unit roundoff of dt: 2^-8 bf16, 2^-11 fp16): both
 * sides compute in fp32 from the same dt inputs and round each output once; the GPU rounds P
 * (unnormalised, <= 1) and dS to dt for the tensor-core products. |got - want| <= A u m + R u
 * |want| with m the largest |want| of the compared part: A = R = 4 for the output, A = 16,
 * R = 8 for the gradients. The gradient is checked in its q, k and v parts separately (their
 * scales differ by orders of magnitude; a grouped-query dk/dv sums over the group), m floored
 * at 1e-3 of the whole tensor's largest value because where every key sees one query (T = 1)
 * the exact dq and dk are 0 and the GPU's are fp32 roundoff. fp32 (the cuBLAS path) differs
 * only in summation order: A = R = 1e-4, no u. */
#include <math.h>
#include <stdint.h>
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

/* A tensor of n values of type t: host bytes h (the CPU's), device bytes d (the GPU's). */
typedef struct tb {
  void *h, *d;
  size_t n;
  zt_dtype t;
} tb;


static float value(zt_dtype t, const void *base, size_t i) {
  if (t == ZT_F32) return ((const float *)base)[i];
  uint16_t x = ((const uint16_t *)base)[i];
  return t == ZT_BF16 ? zt_bf16_to_f32(x) : zt_f16_to_f32(x);
}

/* Values uniform in [lo, hi] (all lo when lo == hi), the same bits on both sides. */
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

/* The host copy; the device copies go with the section's twin_dev_free_all. */
static void drop(tb *b) { free(b->h); }

static void *download(const tb *b) {
  size_t bytes = b->n * zt_dtype_size(b->t);
  void *got = malloc(bytes + 1);
  if (!got) exit(1);
  gpu.ops->to_host(gpu.ctx, got, b->d, bytes);
  return got;
}

/* Which of q (0), k (1), v (2) element i of a (B,T,(NH+2*NKV)*hs) tensor belongs to, with
 * qn = NH*hs and kvn = NKV*hs; 0 for everything when qn is 0 (one part). */
static int part_of(size_t i, size_t qn, size_t kvn) {
  if (!qn) return 0;
  size_t col = i % (qn + 2 * kvn);
  return col < qn ? 0 : col < qn + kvn ? 1 : 2;
}

/* The device copy against the host copy, each part (part_of) with its own scale. */
static void check(const char *what, const tb *b, double A, double R, size_t qn, size_t kvn) {
  void *got = download(b);
  int nparts = qn ? 3 : 1;
  double maxw[3] = {0}, maxall = 0, max_abs[3] = {0}, worst = 0;
  size_t nbad = 0, bad = 0;
  for (size_t i = 0; i < b->n; i++) {
    int p = part_of(i, qn, kvn);
    maxw[p] = fmax(maxw[p], fabs(value(b->t, b->h, i)));
    maxall = fmax(maxall, fabs(value(b->t, b->h, i)));
  }
  for (size_t i = 0; i < b->n; i++) {
    int p = part_of(i, qn, kvn);
    double w = value(b->t, b->h, i), g = value(b->t, got, i), err = fabs(g - w);
    double tol = A * fmax(maxw[p], 1e-3 * maxall) + R * fabs(w);
    if (!(err <= tol) && nbad++ == 0) bad = i;
    max_abs[p] = fmax(max_abs[p], err);
    if (tol > 0) worst = fmax(worst, err / tol);
  }
  printf("%-58s %s n=%-8zu max abs err", what, zt_dtype_name(b->t), b->n);
  for (int p = 0; p < nparts; p++) printf(" %.2e (of %.2e)", max_abs[p], maxw[p]);
  printf("  worst %.2f of tol  %s\n", worst, nbad ? "FAIL" : "ok");
  if (nbad) {
    static const char *names[3] = {"q", "k", "v"};
    fprintf(stderr, "FAIL %s (%s): %zu of %zu out of tolerance; first [%zu] (%s part): gpu %.9g, "
            "cpu %.9g; max abs err", what, zt_dtype_name(b->t), nbad, b->n, bad,
            qn ? names[part_of(bad, qn, kvn)] : "all", (double)value(b->t, got, bad),
            (double)value(b->t, b->h, bad));
    for (int p = 0; p < nparts; p++) fprintf(stderr, " %.3e (of max %.3e)", max_abs[p], maxw[p]);
    fprintf(stderr, "\n");
    failures++;
  }
  free(got);
}

/* Two device results that must carry the same bits. */
static void same_bits(const char *what, const tb *x, const tb *y) {
  void *gx = download(x), *gy = download(y);
  int same = memcmp(gx, gy, x->n * zt_dtype_size(x->t)) == 0;
  printf("%-58s %s n=%-8zu %s\n", what, zt_dtype_name(x->t), x->n,
         same ? "bitwise equal" : "DIFFERENT (FAIL)");
  if (!same) {
    fprintf(stderr, "FAIL %s: results differ\n", what);
    failures++;
  }
  free(gx);
  free(gy);
}

static double u_of(zt_dtype dt) { return dt == ZT_BF16 ? 0x1p-8 : 0x1p-11; }

/* Forward and backward on one shape against the CPU twin, then the bitwise repeats. */
static void test_shape(zt_dtype dt, int B, int T, int NH, int NKV, int hs, int causal) {
  double A_out = dt == ZT_F32 ? 1e-4 : 4 * u_of(dt), R_out = A_out;
  double A_grad = dt == ZT_F32 ? 1e-4 : 16 * u_of(dt), R_grad = dt == ZT_F32 ? 1e-4 : 8 * u_of(dt);
  size_t n = (size_t)B * T * NH * hs, nqkv = (size_t)B * T * (NH + 2 * NKV) * hs;
  size_t qn = (size_t)NH * hs, kvn = (size_t)NKV * hs;
  char what[128], tag[80];
  snprintf(tag, sizeof tag, "B=%d T=%d hs=%d NH=%d NKV=%d causal=%d", B, T, hs, NH, NKV, causal);
  tb qkv = make(dt, nqkv, -1, 1), out = make(dt, n, 0, 0), out2 = make(dt, n, 0, 0);
  tb dout = make(dt, n, -1, 1);
  void *saved_h = calloc(1, cpu.ops->attention_saved_bytes_dt(dt, B, T, NH, NKV, hs));
  void *saved_d = twin_dev_alloc(&gpu, gpu.ops->attention_saved_bytes_dt(dt, B, T, NH, NKV, hs));
  if (!saved_h) exit(1);

  cpu.ops->attention_fwd_dt(cpu.ctx, dt, out.h, saved_h, qkv.h, B, T, NH, NKV, hs, causal, NULL);
  gpu.ops->attention_fwd_dt(gpu.ctx, dt, out.d, saved_d, qkv.d, B, T, NH, NKV, hs, causal, NULL);
  snprintf(what, sizeof what, "fwd %s", tag);
  check(what, &out, A_out, R_out, 0, 0);
  gpu.ops->attention_fwd_dt(gpu.ctx, dt, out2.d, saved_d, qkv.d, B, T, NH, NKV, hs, causal, NULL);
  snprintf(what, sizeof what, "fwd twice %s", tag);
  same_bits(what, &out, &out2);

  /* the gradient alone (from zeros), then added onto a random start */
  tb dz = make(dt, nqkv, 0, 0);
  cpu.ops->attention_bwd_dt(cpu.ctx, dt, dz.h, dout.h, qkv.h, saved_h, B, T, NH, NKV, hs, causal,
                            NULL);
  gpu.ops->attention_bwd_dt(gpu.ctx, dt, dz.d, dout.d, qkv.d, saved_d, B, T, NH, NKV, hs, causal,
                            NULL);
  snprintf(what, sizeof what, "bwd from 0 (dq|dk|dv) %s", tag);
  check(what, &dz, A_grad, R_grad, qn, kvn);
  tb dadd = make(dt, nqkv, -1, 1), dadd2 = make(dt, nqkv, 0, 0);
  gpu.ops->to_device(gpu.ctx, dadd2.d, dadd.h, nqkv * zt_dtype_size(dt));
  cpu.ops->attention_bwd_dt(cpu.ctx, dt, dadd.h, dout.h, qkv.h, saved_h, B, T, NH, NKV, hs,
                            causal, NULL);
  gpu.ops->attention_bwd_dt(gpu.ctx, dt, dadd.d, dout.d, qkv.d, saved_d, B, T, NH, NKV, hs,
                            causal, NULL);
  snprintf(what, sizeof what, "bwd adds into dqkv %s", tag);
  check(what, &dadd, A_grad, R_grad, qn, kvn);
  gpu.ops->attention_bwd_dt(gpu.ctx, dt, dadd2.d, dout.d, qkv.d, saved_d, B, T, NH, NKV, hs,
                            causal, NULL);
  snprintf(what, sizeof what, "bwd twice %s", tag);
  same_bits(what, &dadd, &dadd2);

  free(saved_h);
  tb *all[] = {&qkv, &out, &out2, &dout, &dz, &dadd, &dadd2};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) drop(all[i]);
  twin_dev_free_all(&gpu);
}

/* qkv and dout at an address 2 bytes off 16-byte alignment take the element-wise tile loads;
 * the results must carry the same bits as the 16-byte loads'. */
static void test_unaligned(zt_dtype dt, int B, int T, int NH, int NKV, int hs, int causal) {
  size_t n = (size_t)B * T * NH * hs, nqkv = (size_t)B * T * (NH + 2 * NKV) * hs;
  size_t es = zt_dtype_size(dt);
  tb qkv = make(dt, nqkv, -1, 1), dout = make(dt, n, -1, 1);
  tb out = make(dt, n, 0, 0), out_u = make(dt, n, 0, 0);
  tb d = make(dt, nqkv, 0, 0), d_u = make(dt, nqkv, 0, 0);
  char *qkv_u = twin_dev_alloc(&gpu, nqkv * es + 16), *dout_u = twin_dev_alloc(&gpu, n * es + 16);
  void *saved = twin_dev_alloc(&gpu, gpu.ops->attention_saved_bytes_dt(dt, B, T, NH, NKV, hs));
  char what[128];
  gpu.ops->to_device(gpu.ctx, qkv_u + 2, qkv.h, nqkv * es);
  gpu.ops->to_device(gpu.ctx, dout_u + 2, dout.h, n * es);
  gpu.ops->attention_fwd_dt(gpu.ctx, dt, out.d, saved, qkv.d, B, T, NH, NKV, hs, causal, NULL);
  gpu.ops->attention_bwd_dt(gpu.ctx, dt, d.d, dout.d, qkv.d, saved, B, T, NH, NKV, hs, causal,
                            NULL);
  gpu.ops->attention_fwd_dt(gpu.ctx, dt, out_u.d, saved, qkv_u + 2, B, T, NH, NKV, hs, causal,
                            NULL);
  gpu.ops->attention_bwd_dt(gpu.ctx, dt, d_u.d, dout_u + 2, qkv_u + 2, saved, B, T, NH, NKV, hs,
                            causal, NULL);
  snprintf(what, sizeof what, "fwd unaligned = aligned B=%d T=%d hs=%d NH=%d NKV=%d", B, T, hs,
           NH, NKV);
  same_bits(what, &out, &out_u);
  snprintf(what, sizeof what, "bwd unaligned = aligned B=%d T=%d hs=%d NH=%d NKV=%d", B, T, hs,
           NH, NKV);
  same_bits(what, &d, &d_u);
  tb *all[] = {&qkv, &dout, &out, &out_u, &d, &d_u};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) drop(all[i]);
  twin_dev_free_all(&gpu);
}

static size_t align256(size_t x) { return (x + 255) / 256 * 256; }

/* The flash path keeps LSE and D (B,NH,T) in fp32 and a copy of out (B,T,C) in dt; the cuBLAS
 * path kept the probabilities (B,NH,T,T) in dt plus scratch. */
static void test_saved_bytes(void) {
  const int B = 8, T = 1024, C = 768, NH = 12; /* GPT-2 124M as benchmarked */
  const int hs = C / NH;
  for (int k = 0; k < 2; k++) {
    zt_dtype dt = k ? ZT_F16 : ZT_BF16;
    size_t got = gpu.ops->attention_saved_bytes_dt(dt, B, T, NH, NH, hs);
    size_t rows = (size_t)B * NH * T;
    size_t want = align256(rows * 4) + align256((size_t)B * T * C * 2) + rows * 4;
    size_t probs = rows * T * 2; /* the probabilities alone, what the cuBLAS path kept */
    /* head size 16: not covered by the flash kernels, the cuBLAS path's state */
    size_t gemm = gpu.ops->attention_saved_bytes_dt(dt, B, T, C / 16, C / 16, 16);
    int ok = got == want && got * 10 < probs && gemm >= (size_t)B * (C / 16) * T * T * 2;
    printf("attention_saved_bytes_dt %s GPT-2 124M (B=%d T=%d C=%d NH=%d): %zu bytes (%.1f MiB) "
           "per layer; probabilities alone %.1f MiB; hs=16 (cuBLAS path) %.1f MiB  %s\n",
           zt_dtype_name(dt), B, T, C, NH, got, got / 1048576.0, probs / 1048576.0,
           gemm / 1048576.0, ok ? "ok" : "FAIL");
    if (!ok) {
      fprintf(stderr, "FAIL saved bytes: got %zu, want %zu\n", got, want);
      failures++;
    }
  }
}

int main(void) {
  int rc = twin_open(&cpu, &gpu);
  if (rc) return rc;
  kc_seed(&rng, 20261130);
  test_saved_bytes();
  const zt_dtype dts[3] = {ZT_F32, ZT_BF16, ZT_F16};
  const int Ts[5] = {1, 37, 64, 200, 1024}, hss[3] = {32, 64, 128};
  for (int k = 0; k < 3; k++)
    for (int causal = 0; causal < 2; causal++)
      for (int h = 0; h < 3; h++)
        for (int t = 0; t < 5; t++) {
          int B = 2, NH = Ts[t] > 200 ? 2 : 3;
          test_shape(dts[k], B, Ts[t], NH, NH, hss[h], causal);
        }
  /* grouped-query shapes of the llama family, T not a multiple of the tile; the head sizes 80
   * and 96 of some Qwen models; multi-query (NKV 1) */
  for (int k = 0; k < 3; k++)
    for (int causal = 0; causal < 2; causal++) {
      test_shape(dts[k], 1, 150, 32, 8, 64, causal);
      test_shape(dts[k], 2, 77, 8, 2, 128, causal);
      test_shape(dts[k], 1, 300, 8, 2, 128, causal);
      test_shape(dts[k], 2, 100, 4, 2, 80, causal);
      test_shape(dts[k], 1, 130, 6, 2, 96, causal);
      test_shape(dts[k], 2, 65, 4, 1, 64, causal);
    }
  /* head sizes 16 and 48: the cuBLAS path, chosen at run time */
  test_shape(ZT_BF16, 3, 37, 3, 3, 16, 1);
  test_shape(ZT_F16, 2, 77, 4, 2, 48, 0);
  test_unaligned(ZT_BF16, 2, 200, 4, 4, 64, 1);
  test_unaligned(ZT_F16, 1, 37, 3, 3, 32, 0);
  test_unaligned(ZT_BF16, 1, 100, 8, 2, 128, 1);
  rc = gpu.ops->sync(gpu.ctx);
  if (rc < 0) {
    fprintf(stderr, "FAIL: backend error %d: %s\n", rc, gpu.ops->error_text(gpu.ctx));
    failures++;
  }
  twin_close(&cpu, &gpu);
  printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
