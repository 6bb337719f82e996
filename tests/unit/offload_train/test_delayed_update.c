/* offload.delayed_update (docs/offload.md "Delayed update") on the CPU backend, for both
 * archs: the losses, skipped steps and loss scales of a delayed run are bitwise those of a
 * reference that realises the delayed semantics with the plain trainer's kernels: each step's
 * gradients are those of a plain trainer set to the parameters the delayed step computes with
 * (every update applied but the previous step's, from step 3 on), and the updates are the
 * backend's AdamW applied by hand (the device units' at once, the streamed units' one step
 * late, step 1's at once). The delayed losses equal the run without the delay in steps 1-2 and
 * differ from it from step 3 on, so a delay silently ignored fails. fp32, bf16 and fp16 (a scale
 * that overflows at first, skipped steps), clipping or not, one micro-batch a step (a step of
 * padding alone among them) or two (their gradient sums on the host or the device),
 * parameters resident or streamed, the optimizer on the host,
 * on NVMe or split, device units beside streamed ones. The state after the run (its pending
 * update drained) is the reference's; a checkpoint in the middle holds the state with every
 * update landed, and a trainer resumed from it continues bitwise as the one that wrote it. The
 * host arena is the plan's host bytes exactly, more than without the delay by the next buffers.
 * bf16 moments (train.optimizer.state_dtype) against a reference updating them by adamw_sr.
 * The spec field is parsed and refused naming it. With the argument "unit", the same cases with
 * offload.order unit. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/dtype.h"
#include "engine/train/offload/offload.h"
#include "engine/train/config.h"
#include "engine/train/trainer_internal.h"
#include "offload/nvme_store.h"
#include "tests/unit/model/mcheck.h"
#include "tests/unit/offload_train/otrain.h"

#define STEPS 8
#define B 2
#define F16_SCALE0 0x1p21f /* overflows the first steps' gradients (test_offload_train.c) */
#define F16_GROWTH 2

static zt_backend g_be;
static int g_ga = 2;
static zt_dtype g_dt = ZT_F32;
static zt_dtype g_sd = ZT_F32; /* train.optimizer.state_dtype of the cases that follow */
static zt_offload_order g_order = ZT_ORDER_AUTO; /* "unit" (argv): offload.order unit */

static zt_model_cfg model_cfg(zt_arch arch) {
  zt_model_cfg mc = mc_tiny(arch);
  mc.n_layers = 4;
  /* unit-major: llama untied, whose backward is unit-major too (test_offload_train.c) */
  if (arch == ZT_ARCH_LLAMA && g_order) mc.tie_embeddings = 0;
  return mc;
}

static zt_train_cfg train_cfg(float clip) {
  zt_train_cfg tc = mc_train(B, g_ga);
  tc.steps = STEPS;
  tc.warmup_steps = 2;
  tc.schedule = ZT_SCHED_COSINE;
  tc.min_lr = 1e-4f;
  tc.lr = 1e-2f;
  tc.weight_decay = 0.1f;
  tc.grad_clip = clip;
  tc.precision = g_dt;
  tc.state_dtype = g_sd;
  if (g_sd == ZT_BF16) tc.seed = 77; /* the rounding bits' */
  return tc;
}

static size_t step_tokens(const zt_model_cfg *mc) { return (size_t)g_ga * B * (mc->seq_len + 1); }

/* Step 5 (index 4): one micro-batch a step, padding alone (nothing counted: the pending update
 * lands before the step zeroes the gradients); two, its first micro-batch. */
static int32_t *make_tokens(const zt_model_cfg *mc, uint64_t seed) {
  size_t per = step_tokens(mc), micro = (size_t)B * (mc->seq_len + 1);
  int32_t *tok = malloc(STEPS * per * sizeof *tok);
  if (!tok) exit(1);
  mc_tokens(&seed, tok, STEPS * per, mc->vocab);
  for (size_t i = 0; i < micro; i++) tok[4 * per + i] = -1;
  return tok;
}

static int step_counts(int i) { return i != 4 || g_ga > 1; }

static void start_scaler(zt_loss_scaler *sc) {
  zt_loss_scaler_init(sc);
  if (g_dt != ZT_F16) return;
  sc->scale = F16_SCALE0;
  sc->growth_interval = F16_GROWTH;
}

/* ---- the reference ------------------------------------------------------------------------- */

typedef struct ref {
  zt_model_cfg mc;
  zt_train_cfg tc;
  zt_trainer *g;        /* a plain trainer: the gradients at the parameters given */
  size_t n, dev;        /* parameters; the device units' (updated at once) */
  float *p, *m, *v;     /* every update applied but the pending one */
  uint16_t *m16, *v16;  /* bf16 moments: m and v as the state keeps them (m, v: widened) */
  float *grad, *pend_g; /* this step's gradients; the pending update's */
  uint16_t *lp;         /* scratch for adamw_dt's compute copy */
  int pend, pend_step;
  float pend_lr, pend_scale;
  int adam_step;
  zt_loss_scaler sc;
} ref;

static int ref_open(ref *r, const zt_model_cfg *mc, const zt_train_cfg *tc, int dev_units) {
  char err[512];
  memset(r, 0, sizeof *r);
  r->mc = *mc;
  r->tc = *tc;
  if (MC_EXPECT(zt_trainer_open(&r->g, mc, tc, &g_be, err, sizeof err) == 0, "ref: %s", err))
    return 1;
  const zt_model *m = zt_trainer_model(r->g);
  r->n = zt_model_num_params(m);
  r->dev = dev_units ? zt_model_unit(m, dev_units)->offset : 0;
  r->p = malloc(r->n * sizeof(float));
  r->m = calloc(r->n, sizeof(float));
  r->v = calloc(r->n, sizeof(float));
  r->grad = malloc(r->n * sizeof(float));
  r->pend_g = malloc(r->n * sizeof(float));
  r->lp = malloc(r->n * sizeof(uint16_t));
  r->m16 = calloc(r->n, sizeof(uint16_t));
  r->v16 = calloc(r->n, sizeof(uint16_t));
  if (!r->p || !r->m || !r->v || !r->grad || !r->pend_g || !r->lp || !r->m16 || !r->v16) exit(1);
  zt_trainer_get_state(r->g, r->p, NULL, NULL);
  start_scaler(&r->sc);
  return 0;
}

static void ref_close(ref *r) {
  zt_trainer_close(r->g);
  free(r->p);
  free(r->m);
  free(r->v);
  free(r->grad);
  free(r->pend_g);
  free(r->lp);
  free(r->m16);
  free(r->v16);
}

/* AdamW over the parameters [a, b) (whole tensors) with gradients g, as the trainer's adamw_all
 * does it (the same kernels; the offloaded step's cpu_adam is bitwise these). */
static void ref_adam(ref *r, size_t a, size_t b, const float *g, float lr, int step, float scale) {
  const zt_model *m = zt_trainer_model(r->g);
  const zt_ops *o = g_be.ops;
  for (int i = 0; i < zt_model_num_tensors(m); i++) {
    const zt_tensor_info *ti = zt_model_tensor(m, i);
    if (ti->offset < a || ti->offset >= b) continue;
    size_t x = ti->offset;
    float wd = ti->decay ? r->tc.weight_decay : 0.0f;
    int lp = r->tc.precision != ZT_F32;
    if (r->tc.state_dtype == ZT_BF16) /* rounded with the bits of the flat index */
      o->adamw_sr(g_be.ctx, r->p + x, g + x, r->m16 + x, r->v16 + x, ti->numel, lr, r->tc.beta1,
                  r->tc.beta2, r->tc.eps, wd, step, scale, lp ? r->lp + x : NULL,
                  lp ? r->tc.precision : ZT_F32, r->tc.seed, x);
    else if (lp)
      o->adamw_dt(g_be.ctx, r->p + x, g + x, r->m + x, r->v + x, ti->numel, lr, r->tc.beta1,
                  r->tc.beta2, r->tc.eps, wd, step, scale, r->lp + x, r->tc.precision);
    else
      o->adamw(g_be.ctx, r->p + x, g + x, r->m + x, r->v + x, ti->numel, lr, r->tc.beta1,
               r->tc.beta2, r->tc.eps, wd, step, scale);
  }
}

/* A state call of the delayed trainer: the pending update lands. */
static void ref_drain(ref *r) {
  if (r->pend) ref_adam(r, r->dev, r->n, r->pend_g, r->pend_lr, r->pend_step, r->pend_scale);
  r->pend = 0;
}

/* Step k (1-based) of the delayed semantics. */
static int ref_step(ref *r, int k, const int32_t *tok, zt_step_result *res) {
  char err[512];
  const zt_ops *o = g_be.ops;
  zt_trainer *g = r->g;
  o->to_device(g_be.ctx, g->params, r->p, r->n * sizeof(float));
  if (g->params_lp) o->cast(g_be.ctx, g->params_lp, r->tc.precision, g->params, ZT_F32, r->n);
  g->scaler = r->sc;
  g->step = k - 1;
  g->adam_step = 0;
  float loss_scale = r->tc.precision == ZT_F16 ? r->sc.scale : 1.0f;
  if (MC_EXPECT(zt_trainer_step(g, tok, res, err, sizeof err) == 0, "ref step %d: %s", k, err))
    return 1;
  o->to_host(g_be.ctx, r->grad, g->grads, r->n * sizeof(float));
  o->sync(g_be.ctx);
  r->sc = g->scaler; /* GradScaler's update, as the step made it */
  ref_drain(r);      /* the previous step's update lands at the end of this one's backward */
  if (res->skipped) return 0;
  float scale = 1.0f, lr = zt_train_lr(&r->tc, k);
  if (r->tc.grad_clip > 0) {
    double coef = r->tc.grad_clip / (res->grad_norm + 1e-6);
    if (coef < 1.0) scale = (float)coef;
  }
  if (r->tc.precision == ZT_F16) scale = (float)((double)scale / loss_scale);
  int step = ++r->adam_step;
  ref_adam(r, 0, r->dev, r->grad, lr, step, scale);
  if (k == 1) {
    ref_adam(r, r->dev, r->n, r->grad, lr, step, scale);
    return 0;
  }
  memcpy(r->pend_g, r->grad, r->n * sizeof(float));
  r->pend = 1;
  r->pend_step = step;
  r->pend_lr = lr;
  r->pend_scale = scale;
  return 0;
}

/* ---- checks ---------------------------------------------------------------------------------- */

static int same_steps(const zt_step_result *got, const zt_step_result *want, int from, int to,
                      const char *what, const char *whom) {
  int fails = 0;
  for (int i = from; i < to; i++)
    fails += MC_EXPECT(!memcmp(&got[i].loss, &want[i].loss, sizeof got[i].loss) &&
                           got[i].skipped == want[i].skipped &&
                           !memcmp(&got[i].loss_scale, &want[i].loss_scale, sizeof(float)),
                       "%s: step %d loss %.17g skipped %d scale %g; %s %.17g, %d, %g", what,
                       i + 1, got[i].loss, got[i].skipped, (double)got[i].loss_scale, whom,
                       want[i].loss, want[i].skipped, (double)want[i].loss_scale);
  return fails;
}

/* The trainer's state (its pending update drained) against the reference's. */
static int same_state(zt_trainer *t, ref *r, const char *what) {
  int fails = 0;
  static const char *const names[] = {"parameters", "exp_avg", "exp_avg_sq"};
  float *x[3];
  const float *y[3] = {r->p, r->m, r->v};
  for (size_t i = 0; r->tc.state_dtype == ZT_BF16 && i < r->n; i++) {
    r->m[i] = zt_bf16_to_f32(r->m16[i]);
    r->v[i] = zt_bf16_to_f32(r->v16[i]);
  }
  for (int i = 0; i < 3; i++)
    if (!(x[i] = malloc(r->n * sizeof(float)))) exit(1);
  fails += MC_EXPECT(zt_trainer_get_state(t, x[0], x[1], x[2]) == 0, "%s: get_state", what);
  for (int i = 0; i < 3; i++) {
    fails += MC_EXPECT(!memcmp(x[i], y[i], r->n * sizeof(float)), "%s: %s differ from the "
                       "reference's", what, names[i]);
    free(x[i]);
  }
  return fails;
}

/* STEPS steps delayed against the reference and against the run without the delay; with
 * ckpt_dir a checkpoint after STEPS / 2 steps (the reference drains there too) that a fresh
 * delayed trainer resumes from. */
static int check_case(zt_arch arch, const char *name, zt_train_cfg tc, zt_offload_cfg oc,
                      int streamed, const char *ckpt_dir) {
  int fails = 0;
  char err[512], what[160];
  zt_model_cfg mc = model_cfg(arch);
  snprintf(what, sizeof what, "%s %s, %s, %d micro-batch(es)%s%s", zt_arch_name(arch),
           zt_dtype_name(g_dt), name, g_ga, ckpt_dir ? ", resumed" : "",
           g_sd == ZT_BF16 ? ", bf16 moments" : "");
  int32_t *tok = make_tokens(&mc, 5 + (uint64_t)arch);
  size_t per = step_tokens(&mc);
  zt_step_result got[STEPS] = {{0}}, want[STEPS] = {{0}}, plain[STEPS] = {{0}},
                 resumed[STEPS] = {{0}};
  zt_trainer *d = NULL, *p = NULL, *c = NULL;
  ref r = {0};
  oc.delayed_update = 1;
  if (!oc.order) oc.order = g_order;
  if (streamed) oc.gpu_budget = ot_min_budget(&mc, &tc, oc, &g_be, ZT_ORDER_AUTO);
  if (MC_EXPECT(!streamed || oc.gpu_budget, "%s: no budget opens", what) ||
      ref_open(&r, &mc, &tc, oc.gpu_units > 0 ? oc.gpu_units : 0) ||
      MC_EXPECT(zt_trainer_open(&p, &mc, &tc, &g_be, err, sizeof err) == 0, "%s: %s", what,
                err) ||
      MC_EXPECT(ot_open(&d, &mc, &tc, &oc, &g_be, ZT_ORDER_AUTO, err, sizeof err) == 0,
                "%s: %s", what, err)) {
    fails++;
    goto out;
  }
  start_scaler(&d->scaler);
  start_scaler(&p->scaler);
  int half = ckpt_dir ? STEPS / 2 : STEPS;
  for (int i = 0; i < STEPS && !fails; i++) {
    fails += ref_step(&r, i + 1, tok + (size_t)i * per, &want[i]);
    if (i + 1 == half && ckpt_dir) ref_drain(&r);
  }
  fails += ot_run(p, tok, per, 0, STEPS, plain, what);
  fails += ot_run(d, tok, per, 0, half, got, what);
  if (ckpt_dir) {
    fails += MC_EXPECT(zt_trainer_save(d, ckpt_dir, err, sizeof err) == 0, "%s: save: %s", what,
                       err);
    fails += ot_run(d, tok, per, half, STEPS, got, what);
  }
  fails += same_steps(got, want, 0, STEPS, what, "reference");
  /* the delay is real: steps 1-2 as without it, then other losses */
  fails += same_steps(got, plain, 0, 2, what, "without the delay");
  int differ = 0, counted = 0;
  for (int i = 2; i < STEPS; i++) {
    counted += step_counts(i);
    differ += step_counts(i) && memcmp(&got[i].loss, &plain[i].loss, sizeof got[i].loss) != 0;
  }
  char pattern[STEPS + 1];
  int skipped = 0;
  for (int i = 0; i < STEPS; i++) {
    pattern[i] = want[i].skipped ? 's' : '.';
    skipped += want[i].skipped;
  }
  pattern[STEPS] = 0;
  if (g_dt == ZT_F16)
    fails += MC_EXPECT(skipped > 0 && skipped < STEPS - 2 && differ > 0, "%s: steps %s, %d of "
                       "them differ from the run without the delay: the case does not test the "
                       "skip and the delay", what, pattern, differ);
  else
    fails += MC_EXPECT(differ == counted, "%s: %d of steps 3-%d differ from the run without "
                       "the delay, %d counted", what, differ, STEPS, counted);
  if (!fails) ref_drain(&r);
  fails += same_state(d, &r, what);
  /* the host tier: the plan's bytes, all of them allocated; more than without the delay (with
   * device units on the cpu backend less: their buffers no longer alias the host tier's) */
  zt_offload_stats st;
  zt_offload_plan plan, undelayed;
  zt_trainer_offload_stats(d, &st);
  zt_offload_cfg od = oc;
  od.delayed_update = 0;
  fails += MC_EXPECT(zt_offload_estimate(&mc, &tc, &oc, g_be.ops, &plan, err, sizeof err) == 0 &&
                     zt_offload_estimate(&mc, &tc, &od, g_be.ops, &undelayed, err,
                                         sizeof err) == 0, "%s: estimate: %s", what, err);
  fails += MC_EXPECT(plan.host_bytes == st.host_bytes && st.host_used == st.host_bytes &&
                     plan.device_bytes == st.device_budget &&
                     zt_trainer_backend_bytes(d) == st.device_budget &&
                     (oc.gpu_units > 0 || plan.host_bytes > undelayed.host_bytes) &&
                     st.grad_slots == 0 && st.unit_major == (g_order && g_ga > 1) &&
                     plan.grad_slots == 0, "%s: host arena %zu bytes, %zu used, plan %zu "
                     "(without the delay %zu), %d gradient slots", what, st.host_bytes,
                     st.host_used, plan.host_bytes, undelayed.host_bytes, st.grad_slots);
  int nu = zt_model_num_units(zt_trainer_model(d)) - st.gpu_units;
  fails += MC_EXPECT(st.adam_units == (uint64_t)(STEPS - skipped) * nu &&
                     st.gpu_unit_updates == (uint64_t)(STEPS - skipped) * st.gpu_units,
                     "%s: %llu unit updates on the pool, %llu on the device", what,
                     (unsigned long long)st.adam_units, (unsigned long long)st.gpu_unit_updates);
  if (streamed)
    fails += MC_EXPECT(st.evictions > 0, "%s: not streamed", what);
  printf("%-72s steps %s, host %zu bytes (%zu without the delay)\n", what, pattern,
         plan.host_bytes, undelayed.host_bytes);
  if (ckpt_dir) {
    /* a fresh delayed trainer from the checkpoint: the continuation of the one that wrote it */
    if (MC_EXPECT(ot_open(&c, &mc, &tc, &oc, &g_be, ZT_ORDER_AUTO, err, sizeof err) == 0,
                  "%s: %s", what, err) ||
        MC_EXPECT(zt_trainer_load(c, ckpt_dir, err, sizeof err) == 0, "%s: load: %s", what,
                  err)) {
      fails++;
      goto out;
    }
    if (g_dt == ZT_F16) c->scaler.growth_interval = F16_GROWTH; /* not in checkpoints */
    fails += ot_run(c, tok, per, half, STEPS, resumed, what);
    fails += same_steps(resumed, got, half, STEPS, what, "the run that wrote the checkpoint");
    fails += same_state(c, &r, what);
  }
out:
  zt_trainer_close(d);
  zt_trainer_close(p);
  zt_trainer_close(c);
  ref_close(&r);
  free(tok);
  return fails;
}

static int check_json_and_refusals(void) {
  int fails = 0;
  char err[512];
  zt_offload_cfg oc;
  json_t *j = json_loads("{\"delayed_update\": true}", 0, NULL);
  int rc = zt_config_offload_from_json(j, &oc, err, sizeof err);
  json_decref(j);
  fails += MC_EXPECT(rc == 0 && oc.delayed_update == 1, "delayed_update true: rc %d (%s)", rc,
                     err);
  j = json_loads("{\"delayed_update\": false}", 0, NULL);
  rc = zt_config_offload_from_json(j, &oc, err, sizeof err);
  json_decref(j);
  fails += MC_EXPECT(rc == 0 && oc.delayed_update == 0, "delayed_update false: rc %d (%s)", rc,
                     err);
  static const char *const bad[] = {"{\"delayed_update\": 1}", "{\"delayed_update\": \"yes\"}",
                                    "{\"delayed_update\": null}"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    j = json_loads(bad[i], 0, NULL);
    err[0] = 0;
    rc = zt_config_offload_from_json(j, &oc, err, sizeof err);
    json_decref(j);
    fails += MC_EXPECT(rc == -EINVAL && strstr(err, "offload.delayed_update must be true or "
                                                    "false"), "%s: rc %d, '%s'", bad[i], rc, err);
  }
  zt_offload_cfg_defaults(&oc);
  fails += MC_EXPECT(oc.delayed_update == 0, "delayed by default");
  oc.delayed_update = 2;
  fails += MC_EXPECT(zt_offload_cfg_check(&oc, err, sizeof err) == -EINVAL &&
                     strstr(err, "offload.delayed_update"), "delayed_update 2: %s", err);
  /* the streamer would read the master files the update rewrites */
  oc.delayed_update = 1;
  oc.params = oc.optimizer = ZT_PLACE_NVME;
  snprintf(oc.nvme_dir, sizeof oc.nvme_dir, "/tmp");
  zt_model_cfg mc = model_cfg(ZT_ARCH_GPT);
  zt_train_cfg tc = train_cfg(0);
  zt_trainer *t = NULL;
  fails += MC_EXPECT(ot_open(&t, &mc, &tc, &oc, &g_be, ZT_ORDER_AUTO, err, sizeof err) ==
                         -ENOTSUP && strstr(err, "offload.delayed_update") &&
                         strstr(err, "params nvme") && !t, "params nvme: %s", err);
  return fails;
}

int main(int argc, char **argv) {
  int fails = 0;
  if (argc > 1 && !strcmp(argv[1], "unit")) g_order = ZT_ORDER_UNIT;
  g_be = mc_backend();
  const char *tmp = mc_tmpdir();
  char dir[600];
  zt_nvme_store *probe = NULL;
  char err[512];
  int rc = zt_nvme_store_open(&probe, tmp, NULL, err, sizeof err);
  zt_nvme_store_close(probe);
  int nvme = !(rc == -ENOSYS || rc == -EPERM);
  if (!nvme) fprintf(stderr, "io_uring is not available here (%s): the NVMe cases skipped\n", err);
  if (!g_order) fails += check_json_and_refusals();
  zt_arch archs[] = {ZT_ARCH_GPT, ZT_ARCH_ENCODER, ZT_ARCH_LLAMA};
  for (int i = 0; i < 3; i++) {
    zt_arch a = archs[i];
    zt_offload_cfg host, split, all_nvme;
    zt_offload_cfg_defaults(&host);
    split = all_nvme = host;
    split.optimizer = all_nvme.optimizer = ZT_PLACE_NVME;
    split.params = all_nvme.params = ZT_PLACE_HOST;
    split.host_units = 2;
    snprintf(split.nvme_dir, sizeof split.nvme_dir, "%s", tmp);
    snprintf(all_nvme.nvme_dir, sizeof all_nvme.nvme_dir, "%s", tmp);
    snprintf(dir, sizeof dir, "%s/%s-ckpt", tmp, zt_arch_name(a));
    g_dt = ZT_F32;
    g_ga = 1; /* without the delay, the gradient ring */
    fails += check_case(a, "host, resident", train_cfg(0), host, 0, NULL);
    g_ga = 2;
    fails += check_case(a, "host, streamed, clipped", train_cfg(0.5f), host, 1, dir);
    /* the step's gradient sums on the host and on the device: the first write-back to the host
     * of a step waits for the pending update of the unit either way */
    zt_offload_cfg sums = host;
    sums.grads = ZT_PLACE_HOST;
    fails += check_case(a, "grads host, streamed", train_cfg(0), sums, 1, NULL);
    sums.grads = ZT_PLACE_GPU;
    fails += check_case(a, "grads gpu, streamed, clipped", train_cfg(0.5f), sums, 1, NULL);
    zt_offload_cfg dev = host;
    dev.gpu_units = 2;
    fails += check_case(a, "2 device units, host", train_cfg(0), dev, 0, NULL);
    if (nvme) {
      fails += check_case(a, "optimizer nvme, streamed, clipped", train_cfg(0.5f), all_nvme, 1,
                          NULL);
      g_ga = 1;
      fails += check_case(a, "2 host units, rest nvme", train_cfg(0), split, 0, NULL);
      g_ga = 2;
    }
    g_dt = ZT_BF16;
    fails += check_case(a, "host, streamed, clipped", train_cfg(0.5f), host, 1, NULL);
    g_ga = 1;
    fails += check_case(a, "host, resident", train_cfg(0), host, 0, NULL);
    g_ga = 2;
    if (nvme) fails += check_case(a, "2 host units, rest nvme, streamed", train_cfg(0), split, 1,
                                  dir);
    g_dt = ZT_F16;
    fails += check_case(a, "host, resident", train_cfg(0), host, 0, dir);
    if (nvme) fails += check_case(a, "2 host units, rest nvme, clipped", train_cfg(0.5f), split,
                                  0, NULL);
    /* bf16 moments (train.optimizer.state_dtype): the reference's AdamW is adamw_sr */
    g_sd = ZT_BF16;
    g_dt = ZT_F32;
    fails += check_case(a, "host, streamed, clipped", train_cfg(0.5f), host, 1, dir);
    fails += check_case(a, "2 device units, host", train_cfg(0), dev, 0, NULL);
    g_dt = ZT_BF16;
    fails += check_case(a, "host, streamed, clipped", train_cfg(0.5f), host, 1, NULL);
    if (nvme) fails += check_case(a, "2 host units, rest nvme, streamed", train_cfg(0), split, 1,
                                  dir);
    g_sd = ZT_F32;
    g_dt = ZT_F32;
  }
  mc_rmtree(tmp);
  zt_backend_cpu_close(&g_be);
  if (fails) fprintf(stderr, "%d failure(s)\n", fails);
  return fails ? 1 : 0;
}
