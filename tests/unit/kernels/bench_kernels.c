/* Timings of the heavy CPU ops at the sizes of the small demo GPT, for tuning and for
 * docs/BENCHMARKS.md. Run: meson test -C BUILD --benchmark --suite kernels -v
 * (or the executable directly; argument: thread count, 0 = all cores). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "engine/kernels/ops.h"
#include "tests/unit/kernels/kcheck.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Best of `reps` so that a noisy neighbour does not decide the figure. */
#define BEST_OF(reps, best, stmt)                                                              \
  do {                                                                                         \
    best = 1e30;                                                                               \
    for (int rep_ = 0; rep_ < (reps); rep_++) {                                                \
      double t0_ = now();                                                                      \
      stmt;                                                                                    \
      double dt_ = now() - t0_;                                                                \
      if (dt_ < best)                                                                          \
        best = dt_;                                                                            \
    }                                                                                          \
  } while (0)

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 0;
  zt_backend be;
  if (zt_backend_cpu_open(&be, threads) < 0)
    return 1;
  const zt_ops *op = be.ops;
  kc_rng rng;
  kc_seed(&rng, 1);
  double t;

  int N = 1024, C = 256, OC = 1024;
  float *inp = kc_random(&rng, (size_t)N * C, -1, 1), *w = kc_random(&rng, (size_t)OC * C, -1, 1);
  float *bias = kc_random(&rng, OC, -1, 1), *out = kc_floats((size_t)N * OC);
  float *dout = kc_random(&rng, (size_t)N * OC, -1, 1);
  float *dinp = kc_floats((size_t)N * C), *dw = kc_floats((size_t)OC * C), *db = kc_floats(OC);
  double gf = 2.0 * N * C * OC * 1e-9;
  BEST_OF(5, t, op->matmul_fwd(be.ctx, out, inp, w, bias, N, C, OC));
  printf("matmul_fwd  N=%d C=%d OC=%d: %7.2f ms %6.1f GFLOP/s\n", N, C, OC, t * 1e3, gf / t);
  BEST_OF(5, t, op->matmul_bwd(be.ctx, dinp, dw, db, dout, inp, w, N, C, OC));
  printf("matmul_bwd  N=%d C=%d OC=%d: %7.2f ms %6.1f GFLOP/s\n", N, C, OC, t * 1e3,
         2 * gf / t);

  int B = 8, T = 128, AC = 256, NH = 4;
  float *qkv = kc_random(&rng, (size_t)B * T * 3 * AC, -1, 1);
  float *aout = kc_floats((size_t)B * T * AC), *adout = kc_random(&rng, (size_t)B * T * AC, -1, 1);
  float *dqkv = kc_floats((size_t)B * T * 3 * AC);
  void *saved = kc_floats(op->attention_saved_bytes(B, T, NH, NH, AC / NH) / sizeof(float));
  BEST_OF(5, t, op->attention_fwd(be.ctx, aout, saved, qkv, B, T, NH, NH, AC / NH, 1, NULL));
  printf("attention_fwd B=%d T=%d C=%d NH=%d causal: %7.2f ms\n", B, T, AC, NH, t * 1e3);
  BEST_OF(5, t, op->attention_bwd(be.ctx, dqkv, adout, qkv, saved, B, T, NH, NH, AC / NH, 1, NULL));
  printf("attention_bwd B=%d T=%d C=%d NH=%d causal: %7.2f ms\n", B, T, AC, NH, t * 1e3);

  int V = 4096, NR = 1024;
  float *logits = kc_random(&rng, (size_t)NR * V, -4, 4);
  int32_t *tg = malloc(NR * sizeof(int32_t));
  for (int i = 0; i < NR; i++)
    tg[i] = kc_int(&rng, V);
  double loss;
  int cnt;
  BEST_OF(3, t, op->crossentropy_fwd_bwd(be.ctx, logits, tg, NR, V, V, -1, 1.0f, &loss, &cnt));
  printf("crossentropy_fwd_bwd N=%d V=%d: %7.2f ms\n", NR, V, t * 1e3);

  float *mean = kc_floats(N), *rstd = kc_floats(N), *lnw = kc_random(&rng, C, -1, 1);
  BEST_OF(5, t, op->layernorm_fwd(be.ctx, dinp, mean, rstd, inp, lnw, lnw, N, C));
  printf("layernorm_fwd N=%d C=%d: %7.2f ms\n", N, C, t * 1e3);
  BEST_OF(5, t, op->layernorm_bwd(be.ctx, dinp, dw, db, inp, inp, lnw, mean, rstd, N, C));
  printf("layernorm_bwd N=%d C=%d: %7.2f ms\n", N, C, t * 1e3);
  size_t np = (size_t)N * OC; /* GELU on the MLP's hidden activations; AdamW on as many params */
  BEST_OF(5, t, op->gelu_fwd(be.ctx, out, dout, np));
  printf("gelu_fwd n=%zu: %7.2f ms\n", np, t * 1e3);
  BEST_OF(5, t, op->gelu_bwd(be.ctx, out, dout, dout, np));
  printf("gelu_bwd n=%zu: %7.2f ms\n", np, t * 1e3);
  float *m = kc_floats(np), *v = kc_floats(np);
  BEST_OF(5, t, op->adamw(be.ctx, out, dout, m, v, np, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 1, 1));
  printf("adamw n=%zu: %7.2f ms\n", np, t * 1e3);
  int nonfinite;
  BEST_OF(5, t, op->sum_squares(be.ctx, dout, np, &nonfinite));
  printf("sum_squares n=%zu: %7.2f ms\n", np, t * 1e3);

  free(inp), free(w), free(bias), free(out), free(dout), free(dinp), free(dw), free(db);
  free(mean), free(rstd), free(lnw), free(m), free(v);
  free(qkv), free(aout), free(adout), free(dqkv), free(saved), free(logits), free(tg);
  zt_backend_cpu_close(&be);
  return 0;
}
