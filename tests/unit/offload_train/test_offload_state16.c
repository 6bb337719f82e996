/* train.optimizer.state_dtype "bf16" in the offloaded walk (docs/offload.md "The optimizer
 * state's type"), on the CPU backend, gpt and llama, fp32 and bf16 compute, clipped at 1.0 with
 * weight decay: the losses and the final parameters and moments bitwise those of the plain
 * trainer with bf16 moments, for every unit's optimizer on the host (resident and streamed),
 * units on the device (aliased to the host's buffers, and in device buffers of their own beside
 * NVMe units), the optimizer on NVMe and split between the host and NVMe, two micro-batches a
 * step walked unit by unit (offload.order unit). Checkpoints: an offloaded save loads into
 * another placement and into the plain trainer, a plain save into the offloaded trainer, each
 * continuing bitwise. The plan's host and NVMe bytes count 2-byte moments. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/train/offload/offload.h"
#include "engine/train/trainer_internal.h"
#include "offload/nvme_store.h"
#include "tests/unit/model/mcheck.h"
#include "tests/unit/offload_train/otrain.h"

#define STEPS 6
#define B 2

static zt_backend g_be;
static int g_ga = 2;
static zt_dtype g_dt = ZT_F32;
static zt_offload_order g_order = ZT_ORDER_AUTO;

static zt_model_cfg model_cfg(zt_arch arch) {
  zt_model_cfg mc = mc_tiny(arch);
  mc.n_layers = 4;
  /* unit-major: llama untied, whose backward is unit-major too (test_offload_train.c) */
  if (arch == ZT_ARCH_LLAMA && g_order) mc.tie_embeddings = 0;
  return mc;
}

static zt_train_cfg train_cfg(void) {
  zt_train_cfg tc = mc_train(B, g_ga);
  tc.steps = STEPS;
  tc.warmup_steps = 1;
  tc.schedule = ZT_SCHED_COSINE;
  tc.min_lr = 1e-4f;
  tc.lr = 1e-2f;
  tc.weight_decay = 0.1f;
  tc.grad_clip = 1.0f;
  tc.precision = g_dt;
  tc.state_dtype = ZT_BF16;
  tc.seed = 4242; /* the rounding bits' seed */
  return tc;
}

static size_t step_tokens(const zt_model_cfg *mc) {
  return (size_t)g_ga * B * (mc->seq_len + 1);
}

static int32_t *make_tokens(const zt_model_cfg *mc, uint64_t seed) {
  size_t per = step_tokens(mc);
  int32_t *tok = malloc(STEPS * per * sizeof *tok);
  if (!tok) exit(1);
  mc_tokens(&seed, tok, STEPS * per, mc->vocab);
  return tok;
}

static int same_steps(const zt_step_result *got, const zt_step_result *want, int from, int to,
                      const char *what) {
  int fails = 0;
  for (int i = from; i < to; i++)
    fails += MC_EXPECT(!memcmp(&got[i].loss, &want[i].loss, sizeof got[i].loss),
                       "%s: step %d loss %.17g, the plain trainer's %.17g", what, i + 1,
                       got[i].loss, want[i].loss);
  return fails;
}

/* Parameters and moments (widened: equal bits in bf16 are equal bits widened). */
static int same_state(zt_trainer *a, zt_trainer *b, const char *what) {
  size_t n = zt_model_num_params(zt_trainer_model(a));
  int fails = 0;
  static const char *const names[] = {"parameters", "exp_avg", "exp_avg_sq"};
  float *x[3], *y[3];
  for (int i = 0; i < 3; i++)
    if (!(x[i] = malloc(n * sizeof(float))) || !(y[i] = malloc(n * sizeof(float)))) exit(1);
  fails += MC_EXPECT(zt_trainer_get_state(a, x[0], x[1], x[2]) == 0 &&
                         zt_trainer_get_state(b, y[0], y[1], y[2]) == 0,
                     "%s: get_state", what);
  for (int i = 0; i < 3; i++) {
    fails += MC_EXPECT(!memcmp(x[i], y[i], n * sizeof(float)), "%s: %s differ", what, names[i]);
    free(x[i]);
    free(y[i]);
  }
  return fails;
}

/* The moments of t are bf16 values widened, and trained (not all zero). */
static int bf16_moments(zt_trainer *t, const char *what) {
  size_t n = zt_model_num_params(zt_trainer_model(t)), nonzero = 0, wide = 0;
  float *m = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
  if (!m || !v) exit(1);
  int fails = MC_EXPECT(zt_trainer_get_state(t, NULL, m, v) == 0, "%s: get_state", what);
  for (size_t i = 0; i < n; i++) {
    uint32_t a, b;
    memcpy(&a, &m[i], 4);
    memcpy(&b, &v[i], 4);
    nonzero += a != 0 && b != 0;
    wide += (a & 0xffffu) != 0 || (b & 0xffffu) != 0;
  }
  fails += MC_EXPECT(wide == 0 && nonzero > n / 2, "%s: %zu of %zu moments not bf16, %zu "
                     "nonzero", what, wide, n, nonzero);
  free(m);
  free(v);
  return fails;
}

/* STEPS steps offloaded against the plain trainer. */
static int check_case(zt_arch arch, const char *name, zt_offload_cfg oc, int streamed) {
  int fails = 0;
  char err[512], what[160];
  zt_model_cfg mc = model_cfg(arch);
  zt_train_cfg tc = train_cfg();
  snprintf(what, sizeof what, "%s %s, %s compute, grad_accum %d%s", zt_arch_name(arch), name,
           zt_dtype_name(g_dt), g_ga, g_order == ZT_ORDER_UNIT ? ", order unit" : "");
  int32_t *tok = make_tokens(&mc, 3 + (uint64_t)arch);
  size_t per = step_tokens(&mc);
  zt_step_result ref[STEPS] = {{0}}, off[STEPS] = {{0}};
  zt_trainer *a = NULL, *b = NULL;
  if (streamed) {
    oc.gpu_budget = ot_min_budget(&mc, &tc, oc, &g_be, g_order);
    fails += MC_EXPECT(oc.gpu_budget > 0, "%s: no budget opens", what);
  }
  if (MC_EXPECT(zt_trainer_open(&a, &mc, &tc, &g_be, err, sizeof err) == 0, "%s: %s", what,
                err) ||
      MC_EXPECT(ot_open(&b, &mc, &tc, &oc, &g_be, g_order, err, sizeof err) == 0,
                "%s: %s", what, err)) {
    fails++;
    goto out;
  }
  fails += ot_run(a, tok, per, 0, STEPS, ref, what);
  fails += ot_run(b, tok, per, 0, STEPS, off, what);
  fails += same_steps(off, ref, 0, STEPS, what);
  fails += same_state(a, b, what);
  fails += bf16_moments(b, what);
  zt_offload_stats st;
  zt_trainer_offload_stats(b, &st);
  if (streamed) fails += MC_EXPECT(st.evictions > 0, "%s: nothing was evicted", what);
  if (g_order == ZT_ORDER_UNIT)
    fails += MC_EXPECT(st.unit_major == 1, "%s: the plan is not unit-major", what);
  if (oc.gpu_units > 0)
    fails += MC_EXPECT(st.gpu_unit_updates > 0, "%s: no device unit updated", what);
  if (!fails) printf("ok: %s\n", what);
out:
  zt_trainer_close(a);
  zt_trainer_close(b);
  free(tok);
  return fails;
}

/* Checkpoints of bf16 moments cross between the trainers: offloaded (oc) saved after STEPS / 2,
 * loaded into another placement (load_oc) and into the plain trainer; the plain trainer's save
 * loaded into the offloaded one; each continues bitwise as the plain run. */
static int check_resume(zt_arch arch, zt_offload_cfg oc, zt_offload_cfg load_oc,
                        const char *name, const char *tmp) {
  int fails = 0;
  char err[512], what[160], dir[600], pdir[600];
  zt_model_cfg mc = model_cfg(arch);
  zt_train_cfg tc = train_cfg();
  snprintf(what, sizeof what, "%s resume, %s", zt_arch_name(arch), name);
  snprintf(dir, sizeof dir, "%s/%s-off-ckpt", tmp, zt_arch_name(arch));
  snprintf(pdir, sizeof pdir, "%s/%s-plain-ckpt", tmp, zt_arch_name(arch));
  int32_t *tok = make_tokens(&mc, 9 + (uint64_t)arch);
  size_t per = step_tokens(&mc);
  zt_step_result ref[STEPS] = {{0}}, got[STEPS] = {{0}};
  zt_trainer *a = NULL, *b = NULL, *c = NULL, *d = NULL, *e = NULL;
  load_oc.gpu_budget = ot_min_budget(&mc, &tc, load_oc, &g_be, g_order);
  if (MC_EXPECT(zt_trainer_open(&a, &mc, &tc, &g_be, err, sizeof err) == 0, "%s", err) ||
      MC_EXPECT(ot_open(&b, &mc, &tc, &oc, &g_be, g_order, err, sizeof err) == 0,
                "%s: %s", what, err) ||
      MC_EXPECT(ot_open(&c, &mc, &tc, &load_oc, &g_be, g_order, err, sizeof err) == 0,
                "%s: %s", what, err) ||
      MC_EXPECT(zt_trainer_open(&d, &mc, &tc, &g_be, err, sizeof err) == 0, "%s", err) ||
      MC_EXPECT(ot_open(&e, &mc, &tc, &oc, &g_be, g_order, err, sizeof err) == 0,
                "%s: %s", what, err)) {
    fails++;
    goto out;
  }
  fails += ot_run(a, tok, per, 0, STEPS / 2, ref, "plain");
  fails += MC_EXPECT(zt_trainer_save(a, pdir, err, sizeof err) == 0, "plain save: %s", err);
  fails += ot_run(a, tok, per, STEPS / 2, STEPS, ref, "plain");
  fails += ot_run(b, tok, per, 0, STEPS / 2, got, what);
  fails += MC_EXPECT(zt_trainer_save(b, dir, err, sizeof err) == 0, "%s: save: %s", what, err);
  /* offloaded -> offloaded elsewhere; c ran a step of its own first, which the load replaces */
  zt_step_result scratch[STEPS] = {{0}};
  fails += ot_run(c, tok, per, STEPS - 1, STEPS, scratch, what);
  fails += MC_EXPECT(zt_trainer_load(c, dir, err, sizeof err) == 0, "%s: load: %s", what, err);
  fails += ot_run(c, tok, per, STEPS / 2, STEPS, got, what);
  fails += same_steps(got, ref, 0, STEPS, what);
  fails += same_state(a, c, what);
  /* offloaded -> plain */
  zt_step_result plain[STEPS] = {{0}};
  fails += MC_EXPECT(zt_trainer_load(d, dir, err, sizeof err) == 0, "plain load: %s", err);
  fails += ot_run(d, tok, per, STEPS / 2, STEPS, plain, "offloaded checkpoint, plain trainer");
  fails += same_steps(plain, ref, STEPS / 2, STEPS, "offloaded checkpoint, plain trainer");
  fails += same_state(a, d, "offloaded checkpoint, plain trainer");
  /* plain -> offloaded */
  zt_step_result off[STEPS] = {{0}};
  fails += MC_EXPECT(zt_trainer_load(e, pdir, err, sizeof err) == 0, "offloaded load of a "
                     "plain checkpoint: %s", err);
  fails += ot_run(e, tok, per, STEPS / 2, STEPS, off, "plain checkpoint, offloaded trainer");
  fails += same_steps(off, ref, STEPS / 2, STEPS, "plain checkpoint, offloaded trainer");
  fails += same_state(a, e, "plain checkpoint, offloaded trainer");
  if (!fails) printf("ok: %s\n", what);
out:
  zt_trainer_close(a);
  zt_trainer_close(b);
  zt_trainer_close(c);
  zt_trainer_close(d);
  zt_trainer_close(e);
  free(tok);
  return fails;
}

int main(int argc, char **argv) {
  int fails = 0;
  if (argc > 1 && !strcmp(argv[1], "unit")) g_order = ZT_ORDER_UNIT;
  g_be = mc_backend();
  const char *tmp = mc_tmpdir();
  zt_nvme_store *probe = NULL;
  char err[512];
  int rc = zt_nvme_store_open(&probe, tmp, NULL, err, sizeof err);
  zt_nvme_store_close(probe);
  int nvme = !(rc == -ENOSYS || rc == -EPERM);
  if (!nvme) fprintf(stderr, "io_uring is not available here (%s): the NVMe cases skipped\n", err);
  zt_arch archs[] = {ZT_ARCH_GPT, ZT_ARCH_LLAMA};
  static const zt_dtype dts[] = {ZT_F32, ZT_BF16};
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < 2; k++) {
      zt_arch a = archs[i];
      g_dt = dts[k];
      zt_offload_cfg host, dev, split, all_nvme, dev_nvme;
      zt_offload_cfg_defaults(&host);
      host.optimizer = ZT_PLACE_HOST;
      host.params = ZT_PLACE_HOST;
      dev = split = all_nvme = host;
      dev.gpu_units = 2;
      split.optimizer = all_nvme.optimizer = ZT_PLACE_NVME;
      split.host_units = 2;
      snprintf(split.nvme_dir, sizeof split.nvme_dir, "%s", tmp);
      snprintf(all_nvme.nvme_dir, sizeof all_nvme.nvme_dir, "%s", tmp);
      dev_nvme = all_nvme;
      dev_nvme.gpu_units = 2;
      if (g_order == ZT_ORDER_UNIT) { /* the walk unit by unit: two micro-batches a step */
        fails += check_case(a, "host", host, 1);
        fails += check_case(a, "2 device units, host", dev, 0);
        if (nvme) fails += check_case(a, "2 host units, rest nvme", split, 1);
        continue;
      }
      g_ga = 1;
      fails += check_case(a, "host, resident", host, 0);
      g_ga = 2;
      fails += check_case(a, "host, streamed", host, 1);
      fails += check_case(a, "2 device units (aliased), host", dev, 0);
      if (nvme) {
        fails += check_case(a, "optimizer nvme, streamed", all_nvme, 1);
        fails += check_case(a, "2 host units, rest nvme", split, 0);
        fails += check_case(a, "2 device units, rest nvme", dev_nvme, 0);
        if (k == 0) fails += check_resume(a, all_nvme, dev, "nvme -> device units, host", tmp);
      }
      if (k == 1)
        fails += check_resume(a, host, nvme ? split : dev,
                              nvme ? "host -> 2 host units, rest nvme" : "host -> device units",
                              tmp);
    }
  mc_rmtree(tmp);
  zt_backend_cpu_close(&g_be);
  if (fails) fprintf(stderr, "%d failure(s)\n", fails);
  return fails ? 1 : 0;
}
