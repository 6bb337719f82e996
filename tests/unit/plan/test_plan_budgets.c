/* The offload plan against its budgets (zt_offload_estimate, plan only, nothing allocated), on
 * GPT-2 124M (B 8, T 1024, bf16, everything auto) and the tiny gpt and encoder of the trainer's
 * tests: a bigger gpu_budget, host_budget or nvme_budget never gives a slower plan, nor a
 * refusal where a smaller budget fitted, and every plan stays within its budgets; a refusal's
 * figure is a budget that fits. Each sweep sees both refusals and plans. The properties the
 * pure planner's test checked of that planner (engine/plan/planner.c, removed), asked of the
 * plan the trainer runs. (Unlike that planner's, a refusal's figure is not always the least
 * that fits: it is the figure of the plan with the fewest choices, no unit's optimizer on the
 * device; with GPT-2's embedding there the streamer's slots shrink by more than it takes.) */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/backend.h"
#include "engine/plan/offload_plan.h"
#include "tests/unit/model/mcheck.h"

#define POINTS 40

enum { GPU, HOST, NVME };
static const char *const budget_names[] = {"gpu_budget", "host_budget", "nvme_budget"};

static const zt_ops *g_ops;

static void set_budget(zt_offload_cfg *oc, int which, size_t b) {
  if (which == GPU) oc->gpu_budget = b;
  if (which == HOST) oc->host_budget = b;
  if (which == NVME) oc->nvme_budget = b;
}

/* The figure a refusal names as needed, in bytes after its size ("needs at least 1.5 MiB
 * (1572864 bytes", "the host tier needs 2 KiB (2048 bytes"), 0 when it names none. */
static size_t needed(const char *err) {
  const char *at = strstr(err, "needs ");
  if (at) at = strstr(at, " (");
  return at ? (size_t)strtoull(at + 2, NULL, 10) : 0;
}

/* A refusal of a budget of kind `which`: its figure fits. */
static int check_refusal(const zt_model_cfg *mc, const zt_train_cfg *tc, zt_offload_cfg oc,
                         int which, const char *err, const char *what) {
  char e2[1024];
  zt_offload_plan p;
  size_t need = needed(err);
  int fails = MC_EXPECT(need > 0, "%s: the refusal names no figure: %s", what, err);
  if (!need) return fails;
  set_budget(&oc, which, need);
  int rc = zt_offload_estimate(mc, tc, &oc, g_ops, &p, e2, sizeof e2);
  fails += MC_EXPECT(rc == 0, "%s: %s of the refusal's %zu bytes (%s) is refused: %s", what,
                     budget_names[which], need, err, e2);
  return fails;
}

/* Budget `which` from hi / 128 to hi, geometrically: plans within budget, never slower as it
 * grows, never refused once one fitted; the first refusal's figure checked. *fit: the least
 * budget of the sweep that planned. */
static int sweep(const zt_model_cfg *mc, const zt_train_cfg *tc, zt_offload_cfg oc, int which,
                 size_t hi, size_t *fit, const char *what) {
  size_t lo = hi / 128;
  int fails = 0, fitted = 0, refused = 0;
  double last = 0;
  for (int i = 0; i <= POINTS; i++) {
    size_t b = (size_t)((double)lo * pow((double)hi / (double)lo, (double)i / POINTS));
    char err[1024];
    zt_offload_plan p;
    set_budget(&oc, which, b);
    int rc = zt_offload_estimate(mc, tc, &oc, g_ops, &p, err, sizeof err);
    fails += MC_EXPECT(rc == 0 || rc == -ENOMEM || rc == -ENOSPC, "%s: %s %zu: rc %d %s", what,
                       budget_names[which], b, rc, err);
    if (rc < 0) {
      fails += MC_EXPECT(!fitted, "%s: %s grew to %zu and the plan stopped fitting: %s", what,
                         budget_names[which], b, err);
      if (!refused++) fails += check_refusal(mc, tc, oc, which, err, what);
      continue;
    }
    fails += MC_EXPECT(p.device_bytes <= (oc.gpu_budget ? oc.gpu_budget : p.device_bytes) &&
                           p.host_bytes <= (oc.host_budget ? oc.host_budget : p.host_bytes) &&
                           p.nvme_bytes <= (oc.nvme_budget ? oc.nvme_budget : p.nvme_bytes),
                       "%s: %s %zu: the plan (device %zu, host %zu, nvme %llu) overruns a "
                       "budget", what, budget_names[which], b, p.device_bytes, p.host_bytes,
                       (unsigned long long)p.nvme_bytes);
    /* more room never slower, but for the search's ties (a simpler plan kept over one up to
     * ZT_PLAN_TIE faster) */
    fails += MC_EXPECT(!fitted || p.est.step_s * (1 - ZT_PLAN_TIE) <= last, "%s: %s %zu gives "
                       "%g s, slower than %g s with less", what, budget_names[which], b,
                       p.est.step_s, last);
    if (!fitted++) *fit = b;
    last = p.est.step_s;
  }
  fails += MC_EXPECT(fitted && refused, "%s: %d plans and %d refusals over the sweep of %s",
                     what, fitted, refused, budget_names[which]);
  printf("%-34s %-11s %9zu .. %12zu: %2d refused, %2d planned, down to %.3g s\n", what,
         budget_names[which], lo, hi, refused, fitted, last);
  return fails;
}

/* The plan under oc's budgets, without the one of kind `which` (what it takes to sweep to). */
static int unbounded(const zt_model_cfg *mc, const zt_train_cfg *tc, zt_offload_cfg oc,
                     int which, zt_offload_plan *p, const char *what) {
  char err[1024];
  set_budget(&oc, which, 0);
  return MC_EXPECT(zt_offload_estimate(mc, tc, &oc, g_ops, p, err, sizeof err) == 0,
                   "%s: without a %s: %s", what, budget_names[which], err);
}

static int check_model(const zt_model_cfg *mc, const zt_train_cfg *tc, const char *name) {
  int fails = 0;
  char what[128];
  size_t fit = 0;
  zt_offload_plan all, p;
  zt_offload_cfg oc;
  zt_offload_cfg_defaults(&oc);

  /* the device: up to twice what every unit resident takes */
  snprintf(what, sizeof what, "%s, all auto", name);
  fails += unbounded(mc, tc, oc, GPU, &all, what);
  fails += sweep(mc, tc, oc, GPU, 2 * all.device_bytes, &fit, what);

  /* every unit streamed under half that device budget, NVMe for the optimizer state the host
   * cannot hold: up to twice all of it on the host */
  zt_offload_cfg split = oc;
  snprintf(split.nvme_dir, sizeof split.nvme_dir, "/nonexistent-the-plan-opens-no-file");
  split.gpu_budget = all.device_bytes / 2;
  split.gpu_units = 0;
  snprintf(what, sizeof what, "%s, optimizer auto with nvme", name);
  fails += unbounded(mc, tc, split, HOST, &p, what);
  fails += sweep(mc, tc, split, HOST, 2 * p.host_bytes, &fit, what);

  /* NVMe under a host budget halfway from the least that plans to all on the host, or where
   * that keeps nothing there (tiny units, whose staging outweighs what would move) all of the
   * optimizer state on NVMe: up to twice what the plan puts there */
  split.host_budget = (fit + p.host_bytes) / 2;
  fails += unbounded(mc, tc, split, NVME, &p, what);
  if (!p.nvme_bytes) {
    split.host_budget = 0;
    split.optimizer = ZT_PLACE_NVME;
    snprintf(what, sizeof what, "%s, optimizer nvme", name);
    fails += unbounded(mc, tc, split, NVME, &p, what);
  }
  fails += MC_EXPECT(p.nvme_bytes > 0, "%s: nothing on NVMe", what);
  fails += sweep(mc, tc, split, NVME, 2 * p.nvme_bytes, &fit, what);
  return fails;
}

int main(void) {
  int fails = 0;
  /* the activations as the GPU that runs it sizes them, where this build has it */
  g_ops = zt_backend_ops_of("cuda");
  if (!g_ops) g_ops = zt_backend_ops_of("cpu");
  zt_model_cfg gpt2 = {.arch = ZT_ARCH_GPT, .vocab = 50304, .seq_len = 1024, .d_model = 768,
                       .n_heads = 12, .n_layers = 12, .init_seed = 1};
  zt_train_cfg tc;
  zt_train_cfg_defaults(&tc);
  tc.micro_batch = 8;
  tc.precision = ZT_BF16;
  tc.ckpt_every = ZT_CKPT_AUTO;
  fails += check_model(&gpt2, &tc, "GPT-2 124M bf16");
  tc.grad_accum = 4;
  fails += check_model(&gpt2, &tc, "GPT-2 124M bf16, grad_accum 4");
  tc.grad_accum = 1;
  tc.grad_clip = 1.0f;
  tc.precision = ZT_F32;
  fails += check_model(&gpt2, &tc, "GPT-2 124M fp32, clipped");

  zt_arch archs[] = {ZT_ARCH_GPT, ZT_ARCH_ENCODER};
  for (int i = 0; i < 2; i++) {
    zt_model_cfg mc = mc_tiny(archs[i]);
    mc.n_layers = 4;
    mc.d_model = 64;
    mc.d_ff = archs[i] == ZT_ARCH_ENCODER ? 128 : 0;
    zt_train_cfg t = mc_train(2, 3);
    t.ckpt_every = ZT_CKPT_AUTO;
    char name[64];
    snprintf(name, sizeof name, "tiny %s", zt_arch_name(archs[i]));
    fails += check_model(&mc, &t, name);
  }
  if (fails) fprintf(stderr, "%d failure(s)\n", fails);
  return fails ? 1 : 0;
}
