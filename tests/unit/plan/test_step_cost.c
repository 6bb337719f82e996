/* The cost model's walk (engine/plan/step_cost.h) against what the H200 measured (session 11,
 * docs/BENCHMARKS.md "The cost model against the H200"), as orderings it must keep whatever the
 * rates: GPT-2 1.5B (B 8, T 1024, bf16, every block recomputed) with every unit's optimizer on
 * the host costs more than with 38 units' on the device (666 ms against 340); clipping, whose
 * updates wait for the whole backward, costs no less than without; with four micro-batches,
 * unit-major is faster than micro-major (1388 ms against 1561); a slower CPU AdamW never makes a
 * step faster, and its work shows in the AdamW queue's busy time; the delayed update, which
 * runs the updates beside the next step, is no slower; the queues' busy times fit in the step
 * (none is busier than the step is long). */
#include <stdio.h>
#include <string.h>

#include "engine/kernels/backend.h"
#include "engine/plan/offload_plan.h"
#include "engine/plan/rates.h"
#include "tests/unit/model/mcheck.h"

#define GiB ((size_t)1 << 30)

typedef struct forced {
  int gpu_units, ga, unit_major, delayed;
  float clip;
} forced;

static double plan(const zt_ops *ops, forced f, zt_offload_plan *p) {
  char err[1024];
  zt_model_cfg mc = {.arch = ZT_ARCH_GPT, .vocab = 50304, .seq_len = 1024, .d_model = 1600,
                     .n_heads = 25, .n_layers = 48, .init_seed = 1};
  zt_train_cfg tc;
  zt_train_cfg_defaults(&tc);
  tc.micro_batch = 8;
  tc.grad_accum = f.ga;
  tc.precision = ZT_BF16;
  tc.ckpt_every = 1;
  tc.grad_clip = f.clip;
  zt_offload_cfg oc;
  zt_offload_cfg_defaults(&oc);
  oc.gpu_budget = 24 * GiB;
  oc.params = ZT_PLACE_HOST;
  oc.gpu_units = f.gpu_units;
  oc.prefetch = 2;
  oc.delayed_update = f.delayed;
  if (f.ga > 1) oc.order = f.unit_major ? ZT_ORDER_UNIT : ZT_ORDER_MICRO;
  if (zt_offload_estimate(&mc, &tc, &oc, ops, p, err, sizeof err) < 0) {
    printf("plan: %s\n", err);
    return -1;
  }
  const zt_step_cost *e = &p->est;
  printf("gpu_units %2d ga %d %s%s%s: %7.1f ms (compute %.0f, h2d %.0f, d2h %.0f, adam %.0f, "
         "runner %.0f)\n", f.gpu_units, f.ga, f.unit_major ? "unit" : "micro",
         f.clip > 0 ? ", clip" : "", f.delayed ? ", delayed" : "", e->step_s * 1e3,
         e->compute_s * 1e3, e->h2d_s * 1e3, e->d2h_s * 1e3, e->adam_s * 1e3,
         e->runner_s * 1e3);
  return e->step_s;
}

static int fits(const zt_offload_plan *p) {
  const zt_step_cost *e = &p->est;
  double t = e->step_s * (1 + 1e-9);
  return e->compute_s <= t && e->h2d_s <= t && e->d2h_s <= t && e->adam_s <= t &&
         e->nvme_s <= t && e->runner_s <= t && e->compute_s > 0;
}

int main(void) {
  /* the activations as the GPU sizes them, where this build has it */
  const zt_ops *ops = zt_backend_ops_of("cuda");
  if (!ops) ops = zt_backend_ops_of("cpu");
  int fails = 0;
  zt_offload_plan a, b;
  double dev38 = plan(ops, (forced){.gpu_units = 38, .ga = 1}, &a);
  fails += MC_EXPECT(dev38 > 0 && fits(&a), "38 on the device");
  double host = plan(ops, (forced){.gpu_units = 0, .ga = 1}, &b);
  fails += MC_EXPECT(host > 1.5 * dev38 && fits(&b), "all on the host %g s, 38 on the device %g",
                     host, dev38);
  fails += MC_EXPECT(b.est.adam_s > 3 * a.est.adam_s, "the host's AdamW: %g s against %g",
                     b.est.adam_s, a.est.adam_s);
  double clip = plan(ops, (forced){.gpu_units = 38, .ga = 1, .clip = 1}, &b);
  fails += MC_EXPECT(clip >= dev38 && fits(&b), "clipping %g s, without %g", clip, dev38);
  double delayed = plan(ops, (forced){.gpu_units = 38, .ga = 1, .clip = 1, .delayed = 1}, &b);
  fails += MC_EXPECT(delayed <= clip * (1 + 1e-9) && fits(&b), "delayed %g s, not %g", delayed,
                     clip);
  double micro = plan(ops, (forced){.gpu_units = 0, .ga = 4, .clip = 1}, &a);
  double unit = plan(ops, (forced){.gpu_units = 0, .ga = 4, .clip = 1, .unit_major = 1}, &b);
  fails += MC_EXPECT(unit < micro && fits(&a) && fits(&b), "unit-major %g s, micro-major %g",
                     unit, micro);
  /* a host half as fast */
  zt_plan_rates slow = *zt_plan_rates_active();
  slow.adamw_params /= 2;
  slow.adamw_alone_params /= 2;
  zt_plan_rates_use(&slow);
  double slow_host = plan(ops, (forced){.gpu_units = 0, .ga = 1}, &b);
  fails += MC_EXPECT(slow_host > host, "half the AdamW rate: %g s, not more than %g", slow_host,
                     host);
  if (fails) fprintf(stderr, "%d failure(s)\n", fails);
  return fails ? 1 : 0;
}
