/* bf16 and fp16 training on the CPU reference backend: losses close to fp32 for every
 * architecture (llama with GQA, q/k norm, q/k/v biases and a tied head, its every typed op),
 * the fp16 loss scaler (GradScaler's rules: skip and halve on overflow, double
 * after the growth interval), and the resume of an fp16 job bitwise equal to an uninterrupted
 * run, the scaler state included.
 *
 * Loss tolerances (per step, relative to the fp32 loss, 20 steps at lr 1e-2 on a small model):
 * bf16 keeps 8 mantissa bits (u = 2^-8 = 3.9e-3) in every stored activation and weight, so the
 * losses may drift by a few u: 2e-2; fp16 keeps 11 bits (u = 4.9e-4): 5e-3. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* internal: the trainer's loss scaler is set past fp16's range and its AdamW step read, which
 * no public call gives */
#include "engine/train/trainer_internal.h"
#include "tests/unit/model/mcheck.h"

#define STEPS 20

static zt_model_cfg small_model(zt_arch arch) {
  zt_model_cfg c = {.arch = arch, .vocab = 64, .seq_len = 16, .d_model = 32, .n_heads = 4,
                    .n_layers = 2, .d_ff = arch == ZT_ARCH_ENCODER ? 64 : 0, .init_seed = 7};
  if (arch == ZT_ARCH_LLAMA) {
    c.n_kv_heads = 2;
    c.rms_eps = 1e-5f;
    c.rope_theta = 10000.0f;
    c.qk_norm = c.qkv_bias = c.tie_embeddings = 1;
  }
  return c;
}

static zt_train_cfg recipe(zt_dtype precision) {
  zt_train_cfg c = mc_train(4, 2);
  c.steps = STEPS;
  c.lr = 1e-2f;
  c.grad_clip = 1.0f;
  c.precision = precision;
  return c;
}

static int open_trainer(zt_trainer **t, const zt_model_cfg *mc, const zt_train_cfg *tc,
                        const zt_backend *be) {
  char err[256];
  if (zt_trainer_open(t, mc, tc, be, err, sizeof err) < 0) {
    fprintf(stderr, "FAIL open (%s): %s\n", zt_dtype_name(tc->precision), err);
    return 1;
  }
  return 0;
}

static int32_t *batches(const zt_model_cfg *mc, const zt_train_cfg *tc, int steps) {
  size_t n = (size_t)steps * tc->grad_accum * tc->micro_batch * (mc->seq_len + 1);
  int32_t *tok = malloc(n * sizeof *tok);
  uint64_t s = 42;
  /* rows counting up in steps of 3 from a random start: something to learn in a few steps */
  for (size_t r = 0; tok && r < n / (size_t)(mc->seq_len + 1); r++) {
    int32_t start = (int32_t)(mc_next(&s) % (uint64_t)mc->vocab);
    for (int j = 0; j <= mc->seq_len; j++)
      tok[r * (size_t)(mc->seq_len + 1) + (size_t)j] = (start + 3 * j) % mc->vocab;
  }
  return tok;
}

static size_t step_tokens(const zt_model_cfg *mc, const zt_train_cfg *tc) {
  return (size_t)tc->grad_accum * tc->micro_batch * (mc->seq_len + 1);
}

/* Runs steps [from, to) of the shared batches; losses[s] and skipped[s] per step. */
static int run(zt_trainer *t, const int32_t *tok, size_t per_step, int from, int to,
               double *losses, int *skipped) {
  char err[256];
  for (int s = from; s < to; s++) {
    zt_step_result r;
    if (zt_trainer_step(t, tok + per_step * (size_t)s, &r, err, sizeof err) < 0) {
      fprintf(stderr, "FAIL step %d: %s\n", s + 1, err);
      return 1;
    }
    losses[s] = r.loss;
    if (skipped) skipped[s] = r.skipped;
  }
  return 0;
}

static int test_scaler(void) {
  int fails = 0;
  zt_loss_scaler s;
  zt_loss_scaler_init(&s);
  fails += MC_EXPECT(s.scale == 65536.0f && s.growth_interval == 2000, "GradScaler defaults");
  for (int i = 0; i < 1999; i++) zt_loss_scaler_update(&s, 0);
  fails += MC_EXPECT(s.scale == 65536.0f && s.good_steps == 1999, "no growth before 2000");
  zt_loss_scaler_update(&s, 0);
  fails += MC_EXPECT(s.scale == 131072.0f && s.good_steps == 0, "growth at 2000: %g",
                     (double)s.scale);
  for (int i = 0; i < 5; i++) zt_loss_scaler_update(&s, 0);
  zt_loss_scaler_update(&s, 1);
  fails += MC_EXPECT(s.scale == 65536.0f && s.good_steps == 0, "backoff: %g %d", (double)s.scale,
                     s.good_steps);
  return fails;
}

static int test_losses(zt_arch arch) {
  int fails = 0;
  zt_backend be = mc_backend();
  zt_model_cfg mc = small_model(arch);
  zt_train_cfg tc[3] = {recipe(ZT_F32), recipe(ZT_BF16), recipe(ZT_F16)};
  int32_t *tok = batches(&mc, &tc[0], STEPS);
  double losses[3][STEPS];
  int skipped[STEPS];
  for (int p = 0; p < 3 && !fails; p++) {
    zt_trainer *t;
    if ((fails += open_trainer(&t, &mc, &tc[p], &be))) break;
    fails += run(t, tok, step_tokens(&mc, &tc[p]), 0, STEPS, losses[p], skipped);
    zt_trainer_close(t);
  }
  double tol[3] = {0, 2e-2, 5e-3}, worst[3] = {0, 0, 0};
  for (int p = 1; p < 3 && !fails; p++) {
    for (int s = 0; s < STEPS; s++)
      worst[p] = fmax(worst[p], fabs(losses[p][s] - losses[0][s]) / losses[0][s]);
    fails += MC_EXPECT(worst[p] <= tol[p], "%s %s: losses differ from fp32 by %.3g (relative), "
                       "more than %.g", zt_arch_name(arch), zt_dtype_name(tc[p].precision),
                       worst[p], tol[p]);
  }
  if (!fails) {
    fails += MC_EXPECT(losses[0][STEPS - 1] < 0.8 * losses[0][0], "fp32 did not learn");
    printf("%s: loss %.4f -> %.4f (fp32); worst relative difference bf16 %.2e, fp16 %.2e\n",
           zt_arch_name(arch), losses[0][0], losses[0][STEPS - 1], worst[1], worst[2]);
  }
  free(tok);
  zt_backend_cpu_close(&be);
  return fails;
}

/* A scale that overflows fp16 skips the step: nothing changes but the scale and the step
 * count; the next step with a sane scale updates and counts AdamW's first step. */
static int test_skip_and_growth(void) {
  int fails = 0;
  zt_backend be = mc_backend();
  zt_model_cfg mc = small_model(ZT_ARCH_GPT);
  zt_train_cfg tc = recipe(ZT_F16);
  int32_t *tok = batches(&mc, &tc, 6);
  zt_trainer *t;
  if (open_trainer(&t, &mc, &tc, &be)) return 1;
  size_t n = zt_model_num_params(zt_trainer_model(t));
  float *before = malloc(3 * n * sizeof(float)), *after = malloc(3 * n * sizeof(float));
  char err[256];
  zt_step_result r;
  t->scaler.scale = 0x1p40f;  /* dlogits ~ 2^40 / 128: far past fp16's 65504 */
  zt_trainer_get_state(t, before, before + n, before + 2 * n);
  fails += MC_EXPECT(zt_trainer_step(t, tok, &r, err, sizeof err) == 0, "step: %s", err);
  zt_trainer_get_state(t, after, after + n, after + 2 * n);
  fails += MC_EXPECT(r.skipped == 1 && r.loss_scale == 0x1p39f && r.step == 1 && isfinite(r.loss),
                     "overflow: skipped %d, scale %g, step %d, loss %g", r.skipped,
                     (double)r.loss_scale, r.step, r.loss);
  fails += MC_EXPECT(memcmp(before, after, 3 * n * sizeof(float)) == 0,
                     "a skipped step changed the parameters or the AdamW moments");
  fails += MC_EXPECT(t->adam_step == 0 && zt_trainer_step_count(t) == 1,
                     "skipped: AdamW step %d (want 0), steps %d (want 1)", t->adam_step,
                     zt_trainer_step_count(t));
  /* GradScaler's growth, with the interval shortened to 3 */
  t->scaler.scale = 65536.0f;
  t->scaler.growth_interval = 3;
  size_t per = step_tokens(&mc, &tc);
  float scales[3];
  for (int s = 1; s <= 3 && !fails; s++) {
    fails += MC_EXPECT(zt_trainer_step(t, tok + per * s, &r, err, sizeof err) == 0, "step: %s",
                       err);
    fails += MC_EXPECT(!r.skipped, "step %d skipped at scale 65536", r.step);
    scales[s - 1] = r.loss_scale;
  }
  fails += MC_EXPECT(scales[0] == 65536.0f && scales[1] == 65536.0f && scales[2] == 131072.0f,
                     "growth after 3 clean steps: %g %g %g", (double)scales[0],
                     (double)scales[1], (double)scales[2]);
  fails += MC_EXPECT(t->adam_step == 3 && zt_trainer_step_count(t) == 4,
                     "AdamW step %d (want 3), steps %d (want 4)", t->adam_step,
                     zt_trainer_step_count(t));
  zt_trainer_get_state(t, after, NULL, NULL);
  fails += MC_EXPECT(memcmp(before, after, n * sizeof(float)) != 0, "clean steps changed nothing");
  printf("fp16 loss scaler: skip on overflow, backoff and growth %s\n", fails ? "FAILED" : "ok");
  zt_trainer_close(t);
  free(before);
  free(after);
  free(tok);
  zt_backend_cpu_close(&be);
  return fails;
}

/* 6 steps in one go == 3 steps, checkpoint, a new trainer, resume, 3 steps; started at a scale
 * that overflows, so skipped steps and the backed-off scale cross the checkpoint. */
static int test_resume(void) {
  int fails = 0;
  char err[256];
  zt_backend be = mc_backend();
  zt_model_cfg mc = small_model(ZT_ARCH_GPT);
  zt_train_cfg tc = recipe(ZT_F16);
  tc.steps = 6;
  int32_t *tok = batches(&mc, &tc, 6);
  size_t per = step_tokens(&mc, &tc);
  double la[6], lb[6];
  int sa[6], sb[6];
  zt_trainer *a, *b, *c;
  if (open_trainer(&a, &mc, &tc, &be) || open_trainer(&b, &mc, &tc, &be) ||
      open_trainer(&c, &mc, &tc, &be))
    return 1;
  a->scaler.scale = b->scaler.scale = 0x1p22f;
  fails += run(a, tok, per, 0, 6, la, sa);
  fails += run(b, tok, per, 0, 3, lb, sb);
  const char *dir = mc_tmpdir();
  char ck[600];
  snprintf(ck, sizeof ck, "%s/ck", dir);
  fails += MC_EXPECT(zt_trainer_save(b, ck, err, sizeof err) == 0, "save: %s", err);
  fails += MC_EXPECT(zt_trainer_load(c, ck, err, sizeof err) == 0, "load: %s", err);
  fails += MC_EXPECT(c->scaler.scale == b->scaler.scale && c->adam_step == b->adam_step &&
                         c->scaler.good_steps == b->scaler.good_steps,
                     "restored scaler %g/%d, AdamW step %d; saved %g/%d, %d",
                     (double)c->scaler.scale, c->scaler.good_steps, c->adam_step,
                     (double)b->scaler.scale, b->scaler.good_steps, b->adam_step);
  if (!fails) fails += run(c, tok, per, 3, 6, lb, sb);
  int n_skipped = 0;
  char pattern[7] = "";
  for (int s = 0; s < 6 && !fails; s++) {
    pattern[s] = sa[s] ? 's' : '.';
    n_skipped += sa[s];
    fails += MC_EXPECT(memcmp(&la[s], &lb[s], sizeof la[s]) == 0 && sa[s] == sb[s],
                       "step %d: loss %.17g skipped %d uninterrupted, %.17g skipped %d resumed",
                       s + 1, la[s], sa[s], lb[s], sb[s]);
  }
  fails += MC_EXPECT(sa[0] && n_skipped < 6, "expected step 1 skipped and some trained "
                     "(steps: %s, s = skipped)", pattern);
  size_t n = zt_model_num_params(zt_trainer_model(a));
  float *pa = malloc(3 * n * sizeof(float)), *pc = malloc(3 * n * sizeof(float));
  zt_trainer_get_state(a, pa, pa + n, pa + 2 * n);
  zt_trainer_get_state(c, pc, pc + n, pc + 2 * n);
  fails += MC_EXPECT(memcmp(pa, pc, 3 * n * sizeof(float)) == 0,
                     "resumed parameters or moments differ from the uninterrupted run");
  printf("fp16 resume: steps %s (s = skipped), bitwise equal: %s\n", pattern,
         fails ? "no" : "yes");
  free(pa);
  free(pc);
  mc_rmtree(dir);
  zt_trainer_close(a);
  zt_trainer_close(b);
  zt_trainer_close(c);
  free(tok);
  zt_backend_cpu_close(&be);
  return fails;
}

int main(void) {
  int fails = test_scaler();
  fails += test_losses(ZT_ARCH_GPT) + test_losses(ZT_ARCH_ENCODER) + test_losses(ZT_ARCH_LLAMA);
  fails += test_skip_and_growth();
  fails += test_resume();
  return fails ? 1 : 0;
}
