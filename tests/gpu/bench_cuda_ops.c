/* Timings of the CUDA ops at GPT-2 small sizes (B=8, T=1024, C=768, NH=12, V=50257), and the
 * llama family's ops in bf16 at Llama-3.2-1B's (C 2048, NH 32, NKV 8, hs 64, F 8192), for
 * tuning and docs/BENCHMARKS.md. Each figure is the best of 10 runs after a warm-up, timed on
 * the host around the op and a sync. Run: meson test -C BUILD --benchmark --suite gpu -v
 * (or the executable directly). Exits 77 without a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "engine/kernels/cuda/cuda_backend.h"
#include "engine/kernels/ops.h"

static zt_backend be;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define BEST_OF(reps, best, stmt)                                                              \
  do {                                                                                         \
    stmt;                                                                                      \
    be.ops->sync(be.ctx);                                                                      \
    best = 1e30;                                                                               \
    for (int rep_ = 0; rep_ < (reps); rep_++) {                                                \
      double t0_ = now();                                                                      \
      stmt;                                                                                    \
      be.ops->sync(be.ctx);                                                                    \
      double dt_ = now() - t0_;                                                                \
      if (dt_ < best)                                                                          \
        best = dt_;                                                                            \
    }                                                                                          \
  } while (0)

/* Device buffer of n floats filled with a small pattern (values do not change the timings
 * of these ops, only finiteness matters). */
static float *dev_floats(size_t n) {
  float *h = malloc(n * sizeof(float));
  float *d = be.ops->alloc(be.ctx, n * sizeof(float));
  if (!h || !d) {
    fprintf(stderr, "allocation of %zu floats failed\n", n);
    exit(1);
  }
  for (size_t i = 0; i < n; i++)
    h[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
  be.ops->to_device(be.ctx, d, h, n * sizeof(float));
  free(h);
  return d;
}

static int32_t *dev_tokens(size_t n, int V) {
  int32_t *h = malloc(n * sizeof(int32_t));
  int32_t *d = be.ops->alloc(be.ctx, n * sizeof(int32_t));
  if (!h || !d) {
    fprintf(stderr, "allocation of %zu tokens failed\n", n);
    exit(1);
  }
  for (size_t i = 0; i < n; i++)
    h[i] = (int32_t)((i * 2654435761u) % (unsigned)V);
  be.ops->to_device(be.ctx, d, h, n * sizeof(int32_t));
  free(h);
  return d;
}

int main(void) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    printf("no CUDA device: skipped\n");
    return 77;
  }
  if (zt_backend_cuda_open(&be, 0) < 0)
    return 1;
  const zt_ops *op = be.ops;
  void *ctx = be.ctx;
  const int B = 8, T = 1024, C = 768, NH = 12, V = 50257, Vp = 50304;
  const int N = B * T, hs = C / NH;
  double t;

  float *x = dev_floats((size_t)N * C), *w = dev_floats((size_t)4 * C * C);
  float *bias = dev_floats(4 * C), *y = dev_floats((size_t)N * 4 * C);
  float *dy = dev_floats((size_t)N * 4 * C), *dx = dev_floats((size_t)N * C);
  float *dw = dev_floats((size_t)4 * C * C), *db = dev_floats(4 * C);
  double gf = 2.0 * N * C * 4 * C * 1e-9;
  BEST_OF(10, t, op->matmul_fwd(ctx, y, x, w, bias, N, C, 4 * C));
  printf("matmul_fwd N=%d C=%d OC=%d: %8.3f ms %7.1f TFLOP/s\n", N, C, 4 * C, t * 1e3,
         gf / t * 1e-3);
  BEST_OF(10, t, op->matmul_bwd(ctx, dx, dw, db, dy, x, w, N, C, 4 * C));
  printf("matmul_bwd N=%d C=%d OC=%d: %8.3f ms %7.1f TFLOP/s\n", N, C, 4 * C, t * 1e3,
         2 * gf / t * 1e-3);

  float *qkv = dev_floats((size_t)N * 3 * C), *att_out = dev_floats((size_t)N * C);
  float *dqkv = dev_floats((size_t)N * 3 * C);
  size_t saved_bytes = op->attention_saved_bytes(B, T, NH, NH, hs);
  void *saved = op->alloc(ctx, saved_bytes);
  if (!saved)
    return 1;
  for (int causal = 0; causal < 2; causal++) {
    BEST_OF(10, t, op->attention_fwd(ctx, att_out, saved, qkv, B, T, NH, NH, hs, causal, NULL));
    printf("attention_fwd B=%d T=%d C=%d NH=%d causal=%d: %8.3f ms (saved %.0f MiB)\n", B, T,
           C, NH, causal, t * 1e3, saved_bytes / 1048576.0);
    BEST_OF(10, t, op->attention_bwd(ctx, dqkv, x, qkv, saved, B, T, NH, NH, hs, causal, NULL));
    printf("attention_bwd B=%d T=%d C=%d NH=%d causal=%d: %8.3f ms\n", B, T, C, NH, causal,
           t * 1e3);
  }
  /* bf16: the flash kernels (flash_attention.cu), inputs rounded from the fp32 ones */
  size_t n3 = (size_t)N * 3 * C, saved16_bytes = op->attention_saved_bytes_dt(ZT_BF16, B, T, NH,
                                                                              NH, hs);
  void *qkv16 = op->alloc(ctx, n3 * 2), *dqkv16 = op->alloc(ctx, n3 * 2);
  void *out16 = op->alloc(ctx, (size_t)N * C * 2), *dout16 = op->alloc(ctx, (size_t)N * C * 2);
  void *saved16 = op->alloc(ctx, saved16_bytes);
  if (!qkv16 || !dqkv16 || !out16 || !dout16 || !saved16)
    return 1;
  op->cast(ctx, qkv16, ZT_BF16, qkv, ZT_F32, n3);
  op->cast(ctx, dqkv16, ZT_BF16, qkv, ZT_F32, n3);
  op->cast(ctx, dout16, ZT_BF16, x, ZT_F32, (size_t)N * C);
  for (int causal = 0; causal < 2; causal++) {
    BEST_OF(10, t, op->attention_fwd_dt(ctx, ZT_BF16, out16, saved16, qkv16, B, T, NH, NH, hs,
                                        causal, NULL));
    printf("attention_fwd bf16 B=%d T=%d C=%d NH=%d causal=%d: %8.3f ms (saved %.0f MiB)\n", B,
           T, C, NH, causal, t * 1e3, saved16_bytes / 1048576.0);
    BEST_OF(10, t,
            op->attention_bwd_dt(ctx, ZT_BF16, dqkv16, dout16, qkv16, saved16, B, T, NH, NH, hs,
                                 causal, NULL));
    printf("attention_bwd bf16 B=%d T=%d C=%d NH=%d causal=%d: %8.3f ms\n", B, T, C, NH, causal,
           t * 1e3);
  }

  /* packed documents in bf16 (ops.h, "Documents"): B 8 rows of T 4096 holding documents of
   * 384 to 640 tokens (about 512), against the same shape as one document a row (positions
   * NULL, and 0..T-1: what the model passes by default) */
  {
    const int PB = 8, PT = 4096, PNH = 12, PHS = 64, PR = 3 * PNH * PHS;
    size_t pn = (size_t)PB * PT, nq = pn * PR, no = pn * PNH * PHS;
    size_t sb = op->attention_saved_bytes_dt(ZT_BF16, PB, PT, PNH, PNH, PHS);
    float *src = dev_floats(nq);
    void *a = op->alloc(ctx, nq * 2), *da = op->alloc(ctx, nq * 2), *o = op->alloc(ctx, no * 2);
    void *sv = op->alloc(ctx, sb);
    int32_t *h = malloc(pn * 2 * sizeof *h), *packed = op->alloc(ctx, pn * sizeof *h);
    int32_t *ident = op->alloc(ctx, pn * sizeof *h);
    if (!a || !da || !o || !sv || !h || !packed || !ident)
      return 1;
    int docs = 0;
    for (int b = 0; b < PB; b++)
      for (int i = 0; i < PT; docs++) {
        int len = 384 + (int)((docs * 2654435761u) % 257);
        for (int j = 0; j < len && i < PT; j++, i++) h[(size_t)b * PT + i] = j;
      }
    for (size_t i = 0; i < pn; i++) h[pn + i] = (int32_t)(i % PT);
    op->to_device(ctx, packed, h, pn * sizeof *h);
    op->to_device(ctx, ident, h + pn, pn * sizeof *h);
    op->cast(ctx, a, ZT_BF16, src, ZT_F32, nq);
    op->cast(ctx, da, ZT_BF16, src, ZT_F32, nq);
    const int32_t *which[3] = {NULL, ident, packed};
    const char *name[3] = {"one document a row (pos NULL)", "one document a row (pos 0..T-1)",
                           "packed"};
    for (int causal = 1; causal >= 0; causal--)
      for (int k = 0; k < 3; k++) {
        double tf, tb;
        BEST_OF(10, tf, op->attention_fwd_dt(ctx, ZT_BF16, o, sv, a, PB, PT, PNH, PNH, PHS,
                                             causal, which[k]));
        BEST_OF(10, tb, op->attention_bwd_dt(ctx, ZT_BF16, da, o, a, sv, PB, PT, PNH, PNH, PHS,
                                             causal, which[k]));
        printf("attention bf16 B=%d T=%d NH=%d hs=%d causal=%d %s%s%.0f: fwd %8.3f ms bwd "
               "%8.3f ms\n", PB, PT, PNH, PHS, causal, name[k],
               k == 2 ? ", documents of ~" : "", k == 2 ? (double)pn / docs : 0.0, tf * 1e3,
               tb * 1e3);
      }
    free(h);
    op->free(ctx, src), op->free(ctx, a), op->free(ctx, da), op->free(ctx, o), op->free(ctx, sv);
    op->free(ctx, packed), op->free(ctx, ident);
  }

  /* the llama family in bf16: grouped-query flash attention, rmsnorm, rope, swiglu */
  {
    const int LC = 2048, LNH = 32, LNKV = 8, LHS = 64, LF = 8192, R = (LNH + 2 * LNKV) * LHS;
    size_t nq = (size_t)N * R, no = (size_t)N * LNH * LHS, nf = (size_t)N * LF;
    size_t sb = op->attention_saved_bytes_dt(ZT_BF16, B, T, LNH, LNKV, LHS);
    float *src = dev_floats(nf * 2), *nw = dev_floats(LC), *rs = dev_floats(N);
    float *dnw = dev_floats(LC), *inv_freq = dev_floats(LHS / 2);
    void *a = op->alloc(ctx, nq * 2), *da = op->alloc(ctx, nq * 2), *o = op->alloc(ctx, no * 2);
    void *sv = op->alloc(ctx, sb), *h1 = op->alloc(ctx, nf * 4), *h2 = op->alloc(ctx, nf * 4);
    int32_t *pos = dev_tokens(N, T);
    if (!a || !da || !o || !sv || !h1 || !h2)
      return 1;
    op->cast(ctx, a, ZT_BF16, src, ZT_F32, nq);
    op->cast(ctx, da, ZT_BF16, src, ZT_F32, nq);
    op->cast(ctx, h1, ZT_BF16, src, ZT_F32, nf * 2);
    op->cast(ctx, h2, ZT_BF16, src, ZT_F32, nf * 2);
    BEST_OF(10, t, op->attention_fwd_dt(ctx, ZT_BF16, o, sv, a, B, T, LNH, LNKV, LHS, 1, NULL));
    printf("attention_fwd bf16 GQA B=%d T=%d NH=%d NKV=%d hs=%d causal: %8.3f ms\n", B, T, LNH,
           LNKV, LHS, t * 1e3);
    BEST_OF(10, t, op->attention_bwd_dt(ctx, ZT_BF16, da, o, a, sv, B, T, LNH, LNKV, LHS, 1, NULL));
    printf("attention_bwd bf16 GQA B=%d T=%d NH=%d NKV=%d hs=%d causal: %8.3f ms\n", B, T, LNH,
           LNKV, LHS, t * 1e3);
    BEST_OF(10, t, op->rmsnorm_fwd_dt(ctx, ZT_BF16, h1, rs, h2, nw, N, 1, LC, LC, 1e-5f));
    printf("rmsnorm_fwd bf16 N=%d C=%d: %8.3f ms\n", N, LC, t * 1e3);
    BEST_OF(10, t, op->rmsnorm_bwd_dt(ctx, ZT_BF16, h1, dnw, h2, h2, nw, rs, N, 1, LC, LC));
    printf("rmsnorm_bwd bf16 N=%d C=%d: %8.3f ms\n", N, LC, t * 1e3);
    BEST_OF(10, t, op->rope_fwd_dt(ctx, ZT_BF16, a, inv_freq, pos, N, LNH, LHS, R));
    printf("rope_fwd bf16 N=%d H=%d hs=%d (q of qkv rows): %8.3f ms\n", N, LNH, LHS, t * 1e3);
    BEST_OF(10, t, op->swiglu_fwd_dt(ctx, ZT_BF16, h1, h2, N, LF));
    printf("swiglu_fwd bf16 N=%d F=%d: %8.3f ms %6.0f GB/s\n", N, LF, t * 1e3,
           6.0 * nf / t * 1e-9);
    BEST_OF(10, t, op->swiglu_bwd_dt(ctx, ZT_BF16, h1, h2, h2, N, LF));
    printf("swiglu_bwd bf16 N=%d F=%d: %8.3f ms %6.0f GB/s\n", N, LF, t * 1e3,
           14.0 * nf / t * 1e-9);
  }

  float *mean = dev_floats(N), *rstd = dev_floats(N), *lnw = dev_floats(C);
  BEST_OF(10, t, op->layernorm_fwd(ctx, y, mean, rstd, x, lnw, lnw, N, C));
  printf("layernorm_fwd N=%d C=%d: %8.3f ms\n", N, C, t * 1e3);
  BEST_OF(10, t, op->layernorm_bwd(ctx, dx, dw, db, x, x, lnw, mean, rstd, N, C));
  printf("layernorm_bwd N=%d C=%d: %8.3f ms\n", N, C, t * 1e3);

  size_t nh = (size_t)N * 4 * C;
  BEST_OF(10, t, op->gelu_fwd(ctx, y, dy, nh));
  printf("gelu_fwd n=%zu: %8.3f ms %6.0f GB/s\n", nh, t * 1e3, 8.0 * nh / t * 1e-9);
  BEST_OF(10, t, op->gelu_bwd(ctx, y, dy, dy, nh));
  printf("gelu_bwd n=%zu: %8.3f ms %6.0f GB/s\n", nh, t * 1e3, 16.0 * nh / t * 1e-9);

  int32_t *tok = dev_tokens(N, V);
  float *wte = dev_floats((size_t)V * C), *wpe = dev_floats((size_t)T * C);
  BEST_OF(10, t, op->embedding_fwd(ctx, x, tok, wte, wpe, B, T, C, NULL));
  printf("embedding_fwd B=%d T=%d C=%d: %8.3f ms\n", B, T, C, t * 1e3);
  BEST_OF(10, t, op->embedding_bwd(ctx, wte, wpe, x, tok, B, T, C, NULL));
  printf("embedding_bwd B=%d T=%d C=%d: %8.3f ms\n", B, T, C, t * 1e3);
  /* with positions 0..T-1, as the model passes them by default */
  int32_t *epos = dev_tokens(N, 1);
  {
    int32_t *h = malloc((size_t)N * sizeof *h);
    if (!h)
      return 1;
    for (int i = 0; i < N; i++)
      h[i] = i % T;
    op->to_device(ctx, epos, h, (size_t)N * sizeof *h);
    free(h);
  }
  BEST_OF(10, t, op->embedding_fwd(ctx, x, tok, wte, wpe, B, T, C, epos));
  printf("embedding_fwd B=%d T=%d C=%d pos 0..T-1: %8.3f ms\n", B, T, C, t * 1e3);
  BEST_OF(10, t, op->embedding_bwd(ctx, wte, wpe, x, tok, B, T, C, epos));
  printf("embedding_bwd B=%d T=%d C=%d pos 0..T-1: %8.3f ms\n", B, T, C, t * 1e3);

  float *logits = dev_floats((size_t)N * Vp);
  double loss;
  int cnt;
  BEST_OF(10, t, op->crossentropy_fwd_bwd(ctx, logits, tok, N, V, Vp, -1, 1.0f / N, &loss, &cnt));
  printf("crossentropy_fwd_bwd N=%d V=%d: %8.3f ms %6.0f GB/s\n", N, V, t * 1e3,
         8.0 * N * Vp / t * 1e-9);

  size_t np = (size_t)124 << 20; /* GPT-2 small's parameter count, roughly */
  float *p = dev_floats(np), *g = dev_floats(np), *m = dev_floats(np), *v = dev_floats(np);
  BEST_OF(10, t, op->adamw(ctx, p, g, m, v, np, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f));
  printf("adamw n=%zu: %8.3f ms %6.0f GB/s\n", np, t * 1e3, 28.0 * np / t * 1e-9);
  BEST_OF(10, t, op->sum_squares(ctx, g, np, NULL));
  printf("sum_squares n=%zu: %8.3f ms %6.0f GB/s\n", np, t * 1e3, 4.0 * np / t * 1e-9);

  int rc = op->sync(ctx);
  zt_backend_cuda_close(&be); /* the device memory goes with the process */
  return rc < 0 ? 1 : 0;
}
