/* Held-out evaluation (zt_trainer_eval_batch) on the CPU backend, for gpt, encoder and llama
 * (tied and untied head): the loss of a batch equals a separate forward of the same rows
 * through the model API (forward, the loss op, the backward that makes llama's loss, into
 * scratch gradients), sum and count bit for bit, with padding and a micro-batch of padding
 * alone; with one micro-batch a step, the evaluation of a step's rows before it is that step's
 * loss bit for bit; a plain run evaluated after every step trains bitwise as one never
 * evaluated (losses, parameters, AdamW moments); an offloaded run (parameters streamed from
 * the host, micro- and unit-major) evaluates bitwise as the plain one and trains as it does;
 * with offload.delayed_update an evaluation lands the pending update as a state call does (its
 * loss that of the state zt_trainer_get_state reads, the training after it that of a run whose
 * state was read instead); bad tokens are refused as a step refuses them. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/train/offload/offload.h"
#include "engine/train/trainer_internal.h"
#include "tests/unit/model/mcheck.h"

#define B 2
#define GA 3
#define STEPS 4

static zt_backend g_be;

static zt_train_cfg train_cfg(int ga) {
  zt_train_cfg tc = mc_train(B, ga);
  tc.steps = STEPS;
  tc.lr = 1e-2f;
  tc.weight_decay = 0.1f;
  tc.grad_clip = 1.0f;
  return tc;
}

/* STEPS + 1 batches of ga micro-batches in the tokens form: the last one is the evaluation's;
 * its second row has padding, its last micro-batch is padding alone (ga > 1). */
static int32_t *make_tokens(const zt_model_cfg *mc, int ga, size_t *per) {
  size_t micro = (size_t)B * (size_t)(mc->seq_len + 1);
  uint64_t seed = 42;
  *per = (size_t)ga * micro;
  int32_t *tok = malloc((STEPS + 1) * *per * sizeof *tok);
  if (!tok) exit(1);
  mc_tokens(&seed, tok, (STEPS + 1) * *per, mc->vocab);
  int32_t *ev = tok + STEPS * *per;
  ev[(size_t)mc->seq_len + 2] = ev[(size_t)mc->seq_len + 3] = -1;
  for (size_t i = 0; ga > 1 && i < micro; i++) ev[(size_t)(ga - 1) * micro + i] = -1;
  return tok;
}

/* The loss of the rows through the model API with the trainer's parameters. */
static int model_loss(zt_trainer *t, const int32_t *tok, int ga, double *sum, int64_t *n) {
  const zt_model *m = zt_trainer_model(t);
  const zt_model_cfg *mc = zt_model_cfg_of(m);
  int T = mc->seq_len, N = B * T;
  size_t np = zt_model_num_params(m);
  char err[256];
  zt_acts *a = NULL;
  float *host = malloc(np * sizeof *host);
  int32_t *x = malloc((size_t)N * sizeof *x), *y = malloc((size_t)N * sizeof *y);
  float *p = g_be.ops->alloc(g_be.ctx, np * sizeof(float));
  float *g = g_be.ops->alloc(g_be.ctx, np * sizeof(float));
  int fails = MC_EXPECT(host && x && y && p && g && zt_trainer_get_state(t, host, NULL, NULL) == 0 &&
                            zt_acts_open(&a, m, &g_be, B, 0, err, sizeof err) == 0,
                        "the reference's buffers");
  *sum = 0;
  *n = 0;
  if (!fails) g_be.ops->to_device(g_be.ctx, p, host, np * sizeof(float));
  for (int k = 0; !fails && k < ga; k++) {
    int counted = 0;
    for (int b = 0; b < B; b++)
      for (int j = 0; j < T; j++) {
        const int32_t *row = tok + ((size_t)k * B + (size_t)b) * (size_t)(T + 1);
        x[b * T + j] = row[j] < 0 ? 0 : row[j];
        y[b * T + j] = row[j + 1];
        counted += row[j + 1] >= 0;
      }
    if (!counted) continue;
    g_be.ops->to_device(g_be.ctx, zt_acts_tokens(a), x, (size_t)N * sizeof *x);
    g_be.ops->to_device(g_be.ctx, zt_acts_targets(a), y, (size_t)N * sizeof *y);
    mc_positions(&g_be, a, B, T);
    g_be.ops->zero(g_be.ctx, g, np * sizeof(float));
    zt_model_forward(m, a, p);
    zt_model_loss(m, a, 1.0f);
    zt_model_backward(m, a, p, g);
    double s = 0;
    int c = 0;
    zt_acts_loss(a, &s, &c);
    *sum += s;
    *n += c;
  }
  zt_acts_close(a);
  if (p) g_be.ops->free(g_be.ctx, p);
  if (g) g_be.ops->free(g_be.ctx, g);
  free(host);
  free(x);
  free(y);
  return fails;
}

static int eval_of(zt_trainer *t, const int32_t *tok, double *sum, int64_t *n, const char *what) {
  char err[512];
  zt_batch b = {.tokens = tok};
  int rc = zt_trainer_eval_batch(t, &b, sum, n, err, sizeof err);
  return MC_EXPECT(rc == 0, "%s: eval: %s", what, err);
}

static int same_state(zt_trainer *a, zt_trainer *b, const char *what) {
  size_t n = zt_model_num_params(zt_trainer_model(a));
  float *x = malloc(3 * n * sizeof *x), *y = malloc(3 * n * sizeof *y);
  int fails = MC_EXPECT(x && y, "out of memory");
  if (!fails) {
    zt_trainer_get_state(a, x, x + n, x + 2 * n);
    zt_trainer_get_state(b, y, y + n, y + 2 * n);
    fails += MC_EXPECT(!memcmp(x, y, 3 * n * sizeof *x), "%s: parameters or AdamW moments differ",
                       what);
  }
  free(x);
  free(y);
  return fails;
}

/* The offloaded trainer of the plan the planner makes for oc. */
static int open_planned(zt_trainer **t, const zt_model_cfg *mc, const zt_train_cfg *tc,
                        const zt_offload_cfg *oc, char *err, size_t errlen) {
  zt_offload_placement p;
  int rc = zt_offload_plan_make(mc, tc, oc, g_be.ops, &p, err, errlen);
  return rc < 0 ? rc : zt_trainer_open_offload(t, mc, tc, oc, &p, &g_be, err, errlen);
}

static int open_off(zt_trainer **t, const zt_model_cfg *mc, const zt_train_cfg *tc,
                    zt_offload_order order, char *err, size_t errlen) {
  zt_offload_cfg oc;
  zt_offload_cfg_defaults(&oc);
  oc.params = ZT_PLACE_HOST;
  oc.optimizer = ZT_PLACE_HOST;
  oc.order = order;
  return open_planned(t, mc, tc, &oc, err, errlen);
}

/* Plain runs with and without an evaluation after every step, and offloaded ones: the
 * evaluations against the model API's, each other's, and the training against the plain run's. */
static int check_runs(zt_model_cfg mc, int ga, const char *name) {
  int fails = 0;
  char err[512], what[128];
  zt_train_cfg tc = train_cfg(ga);
  size_t per;
  int32_t *tok = make_tokens(&mc, ga, &per);
  const int32_t *ev = tok + STEPS * per;
  zt_trainer *ref = NULL, *plain = NULL, *off[2] = {NULL, NULL};
  static const zt_offload_order orders[2] = {ZT_ORDER_MICRO, ZT_ORDER_UNIT};
  if (MC_EXPECT(zt_trainer_open(&ref, &mc, &tc, &g_be, err, sizeof err) == 0 &&
                    zt_trainer_open(&plain, &mc, &tc, &g_be, err, sizeof err) == 0,
                "%s: %s", name, err))
    goto out;
  for (int o = 0; o < 2; o++)
    if (MC_EXPECT(open_off(&off[o], &mc, &tc, orders[o], err, sizeof err) == 0, "%s offload: %s",
                  name, err))
      goto out;
  for (int i = 0; i <= STEPS; i++) {
    double want, got, sum;
    int64_t n_want, n;
    snprintf(what, sizeof what, "%s, grad_accum %d, after step %d", name, ga, i);
    fails += model_loss(plain, ev, ga, &want, &n_want);
    fails += eval_of(plain, ev, &got, &n, what);
    fails += MC_EXPECT(!memcmp(&got, &want, sizeof got) && n == n_want && n > 0,
                       "%s: eval %.17g over %lld targets; the model's forward %.17g over %lld",
                       what, got, (long long)n, want, (long long)n_want);
    for (int o = 0; o < 2; o++) {
      fails += eval_of(off[o], ev, &sum, &n, what);
      fails += MC_EXPECT(!memcmp(&sum, &got, sizeof sum) && n == n_want,
                         "%s: offload.order %d eval %.17g; plain %.17g", what, o, sum, got);
    }
    if (i == STEPS) break;
    zt_step_result r_ref, r;
    if (MC_EXPECT(zt_trainer_step(ref, tok + (size_t)i * per, &r_ref, err, sizeof err) == 0 &&
                      zt_trainer_step(plain, tok + (size_t)i * per, &r, err, sizeof err) == 0,
                  "%s: step: %s", what, err))
      goto out;
    fails += MC_EXPECT(!memcmp(&r.loss, &r_ref.loss, sizeof r.loss), "%s: evaluated run's loss "
                       "%.17g, the run never evaluated %.17g", what, r.loss, r_ref.loss);
    for (int o = 0; o < 2; o++) {
      zt_step_result r_off;
      if (MC_EXPECT(zt_trainer_step(off[o], tok + (size_t)i * per, &r_off, err, sizeof err) == 0,
                    "%s: offloaded step: %s", what, err))
        goto out;
      fails += MC_EXPECT(!memcmp(&r_off.loss, &r_ref.loss, sizeof r.loss),
                         "%s: offloaded loss %.17g, plain %.17g", what, r_off.loss, r_ref.loss);
    }
  }
  snprintf(what, sizeof what, "%s, grad_accum %d", name, ga);
  fails += same_state(plain, ref, what);
  fails += same_state(off[0], ref, what);
  fails += same_state(off[1], ref, what);
  if (ga == 1) {
    /* the rows of the next step, evaluated first: that step's forward loss */
    double sum;
    int64_t n;
    zt_step_result r;
    fails += eval_of(plain, tok, &sum, &n, what);
    fails += MC_EXPECT(zt_trainer_step(plain, tok, &r, err, sizeof err) == 0, "%s", err);
    double mean = sum / (double)n;
    fails += MC_EXPECT(!memcmp(&mean, &r.loss, sizeof mean), "%s: eval of a step's rows %.17g, "
                       "the step's loss %.17g", what, mean, r.loss);
  }
  /* a token out of range: refused, nothing computed */
  int32_t *bad = malloc(per * sizeof *bad);
  if (bad) {
    double sum = -1;
    int64_t n = -1;
    memcpy(bad, ev, per * sizeof *bad);
    bad[1] = mc.vocab;
    zt_batch b = {.tokens = bad};
    int rc = zt_trainer_eval_batch(plain, &b, &sum, &n, err, sizeof err);
    fails += MC_EXPECT(rc == -EINVAL && strstr(err, "outside") && sum == -1 && n == -1,
                       "%s: a bad token: rc %d: %s", what, rc, err);
    free(bad);
  }
out:
  zt_trainer_close(ref);
  zt_trainer_close(plain);
  zt_trainer_close(off[0]);
  zt_trainer_close(off[1]);
  free(tok);
  return fails;
}

/* offload.delayed_update: an evaluation lands the pending update first, as a state call does:
 * its loss is that of a plain trainer given the delayed trainer's state, and the training after
 * it is that of a delayed run whose state was read at the same point instead. */
static int check_delayed(zt_arch arch) {
  int fails = 0;
  char err[512], what[64];
  snprintf(what, sizeof what, "%s delayed_update", zt_arch_name(arch));
  zt_model_cfg mc = mc_tiny(arch);
  zt_train_cfg tc = train_cfg(GA);
  size_t per, n;
  int32_t *tok = make_tokens(&mc, GA, &per);
  const int32_t *ev = tok + STEPS * per;
  zt_offload_cfg oc;
  zt_offload_cfg_defaults(&oc);
  oc.params = ZT_PLACE_HOST;
  oc.optimizer = ZT_PLACE_HOST;
  oc.delayed_update = 1;
  zt_trainer *a = NULL, *b = NULL, *plain = NULL;
  float *state = NULL;
  if (MC_EXPECT(open_planned(&a, &mc, &tc, &oc, err, sizeof err) == 0 &&
                    open_planned(&b, &mc, &tc, &oc, err, sizeof err) == 0 &&
                    zt_trainer_open(&plain, &mc, &tc, &g_be, err, sizeof err) == 0,
                "%s: %s", what, err))
    goto out;
  n = zt_model_num_params(zt_trainer_model(a));
  if (!(state = malloc(3 * n * sizeof *state))) goto out;
  for (int i = 0; i < STEPS; i++) {
    zt_step_result ra, rb;
    if (MC_EXPECT(zt_trainer_step(a, tok + (size_t)i * per, &ra, err, sizeof err) == 0 &&
                      zt_trainer_step(b, tok + (size_t)i * per, &rb, err, sizeof err) == 0,
                  "%s: step %d: %s", what, i + 1, err))
      goto out;
    fails += MC_EXPECT(!memcmp(&ra.loss, &rb.loss, sizeof ra.loss), "%s: step %d's loss %.17g "
                       "after an evaluation, %.17g after a state call", what, i + 1, ra.loss,
                       rb.loss);
    if (i < 1) continue; /* from step 2 on an update is pending */
    double want, got;
    int64_t n_want, n_got;
    zt_trainer_get_state(b, state, state + n, state + 2 * n);
    fails += eval_of(a, ev, &got, &n_got, what);
    /* internal: the plain trainer's parameters are one backend buffer in the flat layout */
    g_be.ops->to_device(g_be.ctx, plain->params, state, n * sizeof *state);
    fails += eval_of(plain, ev, &want, &n_want, what);
    fails += MC_EXPECT(!memcmp(&got, &want, sizeof got) && n_got == n_want,
                       "%s: after step %d: eval %.17g; of its state in a plain trainer %.17g",
                       what, i + 1, got, want);
  }
out:
  free(state);
  free(tok);
  zt_trainer_close(a);
  zt_trainer_close(b);
  zt_trainer_close(plain);
  return fails;
}

int main(void) {
  int fails = 0;
  g_be = mc_backend();
  static const zt_arch archs[] = {ZT_ARCH_GPT, ZT_ARCH_ENCODER, ZT_ARCH_LLAMA};
  for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) {
    zt_model_cfg mc = mc_tiny(archs[i]);
    mc.n_layers = 3;
    for (int ga = 1; ga <= GA; ga += GA - 1) fails += check_runs(mc, ga, zt_arch_name(archs[i]));
  }
  zt_model_cfg untied = mc_tiny(ZT_ARCH_LLAMA);
  untied.tie_embeddings = 0;
  fails += check_runs(untied, GA, "llama untied");
  fails += check_delayed(ZT_ARCH_GPT);
  fails += check_delayed(ZT_ARCH_LLAMA);
  if (fails) fprintf(stderr, "%d failure(s)\n", fails);
  return fails ? 1 : 0;
}
