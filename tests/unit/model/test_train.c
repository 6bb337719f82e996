/* Trainer behaviour: the schedule's values, one AdamW step against a hand computation (decay
 * groups, warmup lr, clipping), gradient accumulation equal to one big micro-batch, token
 * validation, the backend-bytes estimate, and a tiny gpt memorising a sequence. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/model/mcheck.h"

static int near(double a, double b, double tol) { return fabs(a - b) <= tol * fmax(1.0, fabs(b)); }

static int test_schedule(void) {
  int fails = 0;
  zt_train_cfg c = mc_train(1, 1);
  c.steps = 25;
  c.lr = 1e-3f;
  c.min_lr = 1e-4f;
  c.warmup_steps = 5;
  c.schedule = ZT_SCHED_COSINE;
  const double lr = (double)1e-3f, mn = (double)1e-4f;
  fails += MC_EXPECT(near(zt_train_lr(&c, 1), lr / 5, 1e-6), "warmup step 1: %g", (double)zt_train_lr(&c, 1));
  fails += MC_EXPECT(near(zt_train_lr(&c, 5), lr, 1e-6), "end of warmup: %g", (double)zt_train_lr(&c, 5));
  /* step 15 is half way through the 20 cosine steps: cos(pi/2) = 0 */
  fails += MC_EXPECT(near(zt_train_lr(&c, 15), (lr + mn) / 2, 1e-6), "cosine midpoint: %g",
                     (double)zt_train_lr(&c, 15));
  /* step 10 is a quarter: (1 + cos(pi/4)) / 2 */
  fails += MC_EXPECT(near(zt_train_lr(&c, 10), mn + (lr - mn) * (1 + sqrt(0.5)) / 2, 1e-6),
                     "cosine quarter: %g", (double)zt_train_lr(&c, 10));
  fails += MC_EXPECT(near(zt_train_lr(&c, 25), mn, 1e-6), "last step: %g", (double)zt_train_lr(&c, 25));
  fails += MC_EXPECT(near(zt_train_lr(&c, 40), mn, 1e-6), "past the end: %g", (double)zt_train_lr(&c, 40));
  c.schedule = ZT_SCHED_CONSTANT;
  fails += MC_EXPECT(near(zt_train_lr(&c, 3), 3 * lr / 5, 1e-6), "constant warmup: %g", (double)zt_train_lr(&c, 3));
  fails += MC_EXPECT(near(zt_train_lr(&c, 20), lr, 1e-6), "constant: %g", (double)zt_train_lr(&c, 20));

  char err[256];
  c.warmup_steps = 30;
  fails += MC_EXPECT(zt_train_cfg_check(&c, err, sizeof err) == -EINVAL &&
                     strstr(err, "train.schedule.warmup_steps"), "warmup > steps: %s", err);
  c.warmup_steps = 0;
  c.beta2 = 1.0f;
  fails += MC_EXPECT(zt_train_cfg_check(&c, err, sizeof err) == -EINVAL &&
                     strstr(err, "train.optimizer.betas[1]"), "beta2 = 1: %s", err);
  return fails;
}

/* The loss gradient of one batch through the model API, as the trainer should see it. */
static double reference_grad(const zt_model_cfg *mc, int B, const int32_t *rows, float *p,
                             float *g, size_t n) {
  char err[256];
  zt_model *m;
  zt_acts *a;
  zt_backend be = mc_backend();
  zt_model_create(&m, mc, err, sizeof err);
  zt_acts_open(&a, m, &be, B, 0, err, sizeof err);
  int T = mc->seq_len, N = B * T;
  int32_t *tok = malloc((size_t)N * 4), *tgt = malloc((size_t)N * 4);
  for (int b = 0; b < B; b++)
    for (int j = 0; j < T; j++) {
      tok[b * T + j] = rows[b * (T + 1) + j];
      tgt[b * T + j] = rows[b * (T + 1) + j + 1];
    }
  memcpy(zt_acts_tokens(a), tok, (size_t)N * 4);   /* cpu backend: host memory */
  memcpy(zt_acts_targets(a), tgt, (size_t)N * 4);
  memset(g, 0, n * sizeof *g);
  zt_model_forward(m, a, p);
  double sum;
  int cnt;
  be.ops->crossentropy_fwd_bwd(be.ctx, zt_acts_logits(a), zt_acts_targets(a), N, mc->vocab,
                               mc->vocab, -1, 1.0f / (float)N, &sum, &cnt);
  zt_model_backward(m, a, p, g);
  zt_acts_close(a);
  zt_model_destroy(m);
  zt_backend_cpu_close(&be);
  free(tok);
  free(tgt);
  return sum / cnt;
}

static int test_adamw_step(void) {
  int fails = 0;
  char err[256];
  zt_model_cfg mc = mc_tiny(ZT_ARCH_GPT);
  zt_train_cfg tc = mc_train(2, 1);
  tc.lr = 0.01f;
  tc.weight_decay = 0.5f;
  tc.warmup_steps = 2;
  tc.beta1 = 0.8f;
  tc.beta2 = 0.9f;
  tc.grad_clip = 0.05f;  /* below the initial norm: clipping is active */
  zt_backend be = mc_backend();
  zt_trainer *t;
  if (zt_trainer_open(&t, &mc, &tc, &be, err, sizeof err) < 0) {
    fprintf(stderr, "FAIL open: %s\n", err);
    return 1;
  }
  size_t n = zt_model_num_params(zt_trainer_model(t));
  float *p0 = malloc(n * 4), *g = malloc(n * 4), *p1 = malloc(n * 4), *m1 = malloc(n * 4),
        *v1 = malloc(n * 4);
  zt_trainer_get_state(t, p0, NULL, NULL);
  int32_t rows[2 * 6];
  uint64_t s = 7;
  mc_tokens(&s, rows, 12, mc.vocab);
  double want_loss = reference_grad(&mc, 2, rows, p0, g, n);
  double norm = 0;
  for (size_t i = 0; i < n; i++) norm += (double)g[i] * g[i];
  norm = sqrt(norm);
  zt_step_result r;
  if (zt_trainer_step(t, rows, &r, err, sizeof err) < 0) {
    fprintf(stderr, "FAIL step: %s\n", err);
    return 1;
  }
  zt_trainer_get_state(t, p1, m1, v1);
  fails += MC_EXPECT(near(r.loss, want_loss, 1e-6), "loss %.9g, want %.9g", r.loss, want_loss);
  fails += MC_EXPECT(near(r.grad_norm, norm, 1e-5), "grad_norm %.9g, want %.9g", r.grad_norm, norm);
  fails += MC_EXPECT(norm > tc.grad_clip, "test needs clipping: norm %g", norm);
  fails += MC_EXPECT(near(r.lr, 0.005, 1e-6), "lr at step 1 of 2 warmup: %g", (double)r.lr);
  double coef = tc.grad_clip / (norm + 1e-6), lr = r.lr, worst = 0;
  const zt_model *m = zt_trainer_model(t);
  for (int k = 0; k < zt_model_num_tensors(m); k++) {
    const zt_tensor_info *ti = zt_model_tensor(m, k);
    double wd = ti->decay ? tc.weight_decay : 0.0;
    for (size_t i = ti->offset; i < ti->offset + ti->numel; i++) {
      double gi = g[i] * coef, mi = (1 - 0.8) * gi, vi = (1 - 0.9) * gi * gi;
      double want = p0[i] * (1 - lr * wd) - lr * (mi / 0.2) / (sqrt(vi / 0.1) + 1e-8);
      double e = fabs(p1[i] - want);
      if (e > worst) worst = e;
      if (e > 1e-7 + 1e-5 * fabs(want) || fabs(m1[i] - mi) > 1e-9 + 1e-4 * fabs(mi) ||
          fabs(v1[i] - vi) > 1e-12 + 1e-4 * fabs(vi)) {
        fails += MC_EXPECT(0, "%s[%zu]: p %.9g want %.9g, m %.9g want %.9g, v %.9g want %.9g",
                           ti->name, i - ti->offset, (double)p1[i], want, (double)m1[i], mi,
                           (double)v1[i], vi);
        break;
      }
    }
  }
  printf("adamw: worst parameter error %.3g\n", worst);
  /* a bad token leaves the trainer untouched */
  rows[7] = mc.vocab;
  fails += MC_EXPECT(zt_trainer_step(t, rows, &r, err, sizeof err) == -EINVAL &&
                     strstr(err, "row 1 position 1"), "bad token: %s", err);
  rows[7] = -2;
  fails += MC_EXPECT(zt_trainer_step(t, rows, &r, err, sizeof err) == -EINVAL, "token -2 accepted");
  fails += MC_EXPECT(zt_trainer_step_count(t) == 1, "step count %d", zt_trainer_step_count(t));
  zt_trainer_close(t);
  zt_backend_cpu_close(&be);
  free(p0);
  free(g);
  free(p1);
  free(m1);
  free(v1);
  return fails;
}

/* One micro-batch of 4 rows equals two of 2 rows (the same 4 rows back to back). */
static int test_accumulation(zt_arch arch) {
  int fails = 0;
  char err[256];
  zt_model_cfg mc = mc_tiny(arch);
  zt_train_cfg a = mc_train(4, 1), b = mc_train(2, 2);
  a.grad_clip = b.grad_clip = 1.0f;
  zt_backend be = mc_backend();
  zt_trainer *ta, *tb;
  if (zt_trainer_open(&ta, &mc, &a, &be, err, sizeof err) < 0 ||
      zt_trainer_open(&tb, &mc, &b, &be, err, sizeof err) < 0) {
    fprintf(stderr, "FAIL open: %s\n", err);
    return 1;
  }
  size_t n = zt_model_num_params(zt_trainer_model(ta));
  float *pa = malloc(n * 4), *pb = malloc(n * 4);
  int32_t rows[2][4 * 6];
  uint64_t s = 99;
  mc_tokens(&s, &rows[0][0], sizeof rows / 4, mc.vocab);
  /* one padded target in each half, so both ways weigh every counted token the same */
  rows[0][5] = rows[0][17] = -1;
  rows[1][11] = rows[1][23] = -1;
  double worst = 0;
  for (int k = 0; k < 2; k++) {
    zt_step_result ra, rb;
    if (zt_trainer_step(ta, rows[k], &ra, err, sizeof err) < 0 ||
        zt_trainer_step(tb, rows[k], &rb, err, sizeof err) < 0) {
      fprintf(stderr, "FAIL step: %s\n", err);
      return 1;
    }
    fails += MC_EXPECT(fabs(ra.loss - rb.loss) <= 1e-6 * fabs(ra.loss), "%s step %d: loss %.9g vs %.9g",
                       zt_arch_name(arch), k + 1, ra.loss, rb.loss);
    fails += MC_EXPECT(ra.tokens == rb.tokens && ra.tokens == 20, "tokens %lld vs %lld",
                       (long long)ra.tokens, (long long)rb.tokens);
  }
  zt_trainer_get_state(ta, pa, NULL, NULL);
  zt_trainer_get_state(tb, pb, NULL, NULL);
  for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs(pa[i] - pb[i]));
  fails += MC_EXPECT(worst <= 1e-6, "%s: parameters differ by %g after 2 steps",
                     zt_arch_name(arch), worst);
  printf("accumulation %s: worst parameter difference %.3g\n", zt_arch_name(arch), worst);
  zt_trainer_close(ta);
  zt_trainer_close(tb);
  zt_backend_cpu_close(&be);
  free(pa);
  free(pb);
  return fails;
}

static int test_overfit(void) {
  char err[256];
  zt_model_cfg mc = mc_tiny(ZT_ARCH_GPT);
  mc.seq_len = 8;
  mc.d_model = 16;
  zt_train_cfg tc = mc_train(2, 1);
  tc.steps = 400;
  tc.lr = 1e-2f;
  tc.weight_decay = 0.0f;
  tc.grad_clip = 1.0f;
  zt_backend be = mc_backend();
  zt_trainer *t;
  if (zt_trainer_open(&t, &mc, &tc, &be, err, sizeof err) < 0) {
    fprintf(stderr, "FAIL open: %s\n", err);
    return 1;
  }
  const int32_t rows[2 * 9] = {1, 5, 2, 9, 3, 3, 7, 0, 4, 6, 2, 8, 8, 10, 1, 5, 9, 2};
  zt_step_result r = {0};
  double first = 0;
  int s = 0;
  for (; s < tc.steps; s++) {
    if (zt_trainer_step(t, rows, &r, err, sizeof err) < 0) {
      fprintf(stderr, "FAIL step: %s\n", err);
      return 1;
    }
    if (s == 0) first = r.loss;
    if (r.loss < 0.05) break;
  }
  printf("overfit: loss %.4f -> %.4f in %d steps\n", first, r.loss, r.step);
  zt_trainer_close(t);
  zt_backend_cpu_close(&be);
  return MC_EXPECT(r.loss < 0.05, "loss %.4f after %d steps", r.loss, r.step);
}

/* The daemon's admission number is what the trainer then holds, in every precision. */
static int test_estimate(zt_arch arch, zt_dtype precision) {
  char err[256];
  int fails = 0;
  zt_model_cfg mc = mc_tiny(arch);
  zt_train_cfg tc = mc_train(3, 2);
  tc.precision = precision;
  zt_backend be = mc_backend();
  zt_trainer *t;
  if (zt_trainer_open(&t, &mc, &tc, &be, err, sizeof err) < 0) {
    fprintf(stderr, "FAIL open: %s\n", err);
    return 1;
  }
  size_t est = zt_trainer_estimate_bytes(&mc, &tc, zt_backend_cpu_ops());
  size_t held = zt_trainer_backend_bytes(t);
  fails += MC_EXPECT(est == held && held > 4 * 4 * zt_model_num_params(zt_trainer_model(t)),
                     "%s %s: estimate %zu, trainer holds %zu", zt_arch_name(arch),
                     zt_dtype_name(precision), est, held);
  mc.n_heads = 3;
  fails += MC_EXPECT(zt_trainer_estimate_bytes(&mc, &tc, zt_backend_cpu_ops()) == SIZE_MAX,
                     "invalid config estimated");
  zt_trainer_close(t);
  zt_backend_cpu_close(&be);
  return fails;
}

int main(void) {
  int fails = test_schedule();
  for (int p = ZT_F32; p <= ZT_F16; p++)
    fails += test_estimate(ZT_ARCH_GPT, (zt_dtype)p) + test_estimate(ZT_ARCH_ENCODER, (zt_dtype)p);
  fails += test_adamw_step();
  fails += test_accumulation(ZT_ARCH_GPT);
  fails += test_accumulation(ZT_ARCH_ENCODER);
  fails += test_overfit();
  return fails ? 1 : 0;
}
