/* plan.json and the check of a stored plan (engine/plan/plan_file.h, zt_offload_plan_check), plan
 * only: over tiny models and GPT-2 124M under several budgets, every searched plan checked gives
 * the same sizes and estimate, and so does the plan written as JSON and read back; a plan that
 * no longer fits its budgets is refused with the numbers, one that contradicts the spec with the
 * field named; the reader refuses a missing, mistyped, out-of-range or unknown field by name. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/backend.h"
#include "engine/plan/plan_file.h"
#include "tests/unit/model/mcheck.h"

static const zt_ops *g_ops;

/* Every size of two placements, and their choices and estimate, the same. */
static int same(const zt_offload_placement *a, const zt_offload_placement *b, const char *what) {
  const zt_offload_sizes *x = &a->z, *y = &b->z;
  int sizes = x->host == y->host && x->arena == y->arena && x->slot == y->slot &&
              x->largest == y->largest && x->largest_f32 == y->largest_f32 &&
              x->held == y->held && x->ng == y->ng && x->dev_units == y->dev_units &&
              x->all_resident == y->all_resident && x->dsum == y->dsum &&
              x->dsum_bytes == y->dsum_bytes && x->nh == y->nh && x->alias == y->alias &&
              x->lo == y->lo && x->h_floats == y->h_floats && x->ring == y->ring &&
              x->ring_floats == y->ring_floats && x->nvme_f32 == y->nvme_f32 &&
              x->nvme_param == y->nvme_param && x->scopy0 == y->scopy0 &&
              x->scopy_floats == y->scopy_floats && x->delayed == y->delayed;
  int rest = a->ckpt_every == b->ckpt_every && a->params == b->params &&
             a->act_bytes == b->act_bytes && a->unit_major == b->unit_major &&
             a->delayed == b->delayed && a->gpu_budget == b->gpu_budget &&
             a->host_budget == b->host_budget && a->nvme_budget == b->nvme_budget &&
             a->units == b->units && a->est.step_s == b->est.step_s &&
             a->nvme_bytes == b->nvme_bytes &&
             a->h2d_bytes == b->h2d_bytes && a->d2h_bytes == b->d2h_bytes;
  return MC_EXPECT(sizes && rest, "%s: the checked plan differs from the searched one (sizes %d, "
                   "choices and figures %d)", what, sizes, rest);
}

/* The figure after "needs" in a refusal ("needs at least 1.5 MiB (1572864 bytes"), 0: none. */
static size_t needed(const char *err) {
  const char *at = strstr(err, "needs ");
  if (at) at = strstr(at, " (");
  return at ? (size_t)strtoull(at + 2, NULL, 10) : 0;
}

/* The searched plan checked, written, read back and checked again; then what must be refused. */
static int check_case(const zt_model_cfg *mc, const zt_train_cfg *tc, const zt_offload_cfg *oc,
                      const char *what, int *rings) {
  char err[1024], e2[1024];
  zt_offload_placement p, q, r, bad;
  zt_model *m = NULL;
  int fails = 0, rc = zt_offload_plan_make(mc, tc, oc, g_ops, &p, err, sizeof err);
  if (MC_EXPECT(rc == 0, "%s: %s", what, err) ||
      MC_EXPECT(zt_model_create(&m, mc, err, sizeof err) == 0, "%s: %s", what, err))
    return 1;
  fails += MC_EXPECT(zt_offload_plan_check(m, tc, oc, g_ops, &p, &q, err, sizeof err) == 0,
                     "%s: the searched plan is refused: %s", what, err);
  fails += same(&p, &q, what);
  *rings += p.z.ring > 0;

  json_t *j = zt_offload_plan_to_json(&p);
  char *text = j ? json_dumps(j, JSON_SORT_KEYS) : NULL;
  json_t *back = text ? json_loads(text, 0, NULL) : NULL;
  fails += MC_EXPECT(back && zt_offload_plan_from_json(back, &r, err, sizeof err) == 0,
                     "%s: plan.json read back: %s", what, back ? err : "not JSON");
  fails += MC_EXPECT(zt_offload_plan_check(m, tc, oc, g_ops, &r, &q, err, sizeof err) == 0,
                     "%s: the plan read back is refused: %s", what, err);
  fails += same(&p, &q, what);
  json_t *again = zt_offload_plan_to_json(&q);
  char *text2 = again ? json_dumps(again, JSON_SORT_KEYS) : NULL;
  fails += MC_EXPECT(text && text2 && !strcmp(text, text2), "%s: written again differs:\n%s\n%s",
                     what, text, text2);
  free(text2);
  json_decref(again);

  /* a budget under what the choices need: refused with the numbers, which fit */
  bad = r;
  bad.gpu_budget = 4096;
  rc = zt_offload_plan_check(m, tc, oc, g_ops, &bad, &q, err, sizeof err);
  fails += MC_EXPECT(rc == -ENOMEM && needed(err) > 4096, "%s: gpu_budget 4096: rc %d %s", what,
                     rc, err);
  if (rc == -ENOMEM && needed(err) > 4096) {
    bad.gpu_budget = needed(err);
    rc = zt_offload_plan_check(m, tc, oc, g_ops, &bad, &q, e2, sizeof e2);
    fails += MC_EXPECT(oc->gpu_budget && needed(err) > oc->gpu_budget ? rc == -EINVAL : rc == 0,
                       "%s: the refusal's figure (%s): rc %d %s", what, err, rc, e2);
  }
  /* a budget over the spec's */
  if (oc->gpu_budget) {
    bad = r;
    bad.gpu_budget = oc->gpu_budget + 1;
    rc = zt_offload_plan_check(m, tc, oc, g_ops, &bad, &q, err, sizeof err);
    fails += MC_EXPECT(rc == -EINVAL && strstr(err, "budgets.gpu"), "%s: over the spec's "
                       "gpu_budget: rc %d %s", what, rc, err);
  }
  /* choices the model or the spec do not allow */
  bad = r;
  bad.z.ng = p.units;
  rc = zt_offload_plan_check(m, tc, oc, g_ops, &bad, &q, err, sizeof err);
  fails += MC_EXPECT(rc == -EINVAL && strstr(err, "gpu_units"), "%s: gpu_units %d: rc %d %s",
                     what, bad.z.ng, rc, err);
  bad = r;
  bad.ckpt_every = zt_model_cfg_of(m)->n_layers + 1;
  rc = zt_offload_plan_check(m, tc, oc, g_ops, &bad, &q, err, sizeof err);
  fails += MC_EXPECT(rc == -EINVAL && strstr(err, "ckpt_every"), "%s: ckpt_every: rc %d %s",
                     what, rc, err);
  zt_offload_cfg fixed = *oc;
  fixed.params = p.params == ZT_PLACE_GPU ? ZT_PLACE_HOST : ZT_PLACE_GPU;
  rc = zt_offload_plan_check(m, tc, &fixed, g_ops, &r, &q, err, sizeof err);
  fails += MC_EXPECT(rc == -EINVAL && strstr(err, "offload.params"), "%s: offload.params %s: "
                     "rc %d %s", what, zt_offload_place_name(fixed.params), rc, err);
  bad = r;
  bad.z.ring = p.units - p.z.ng + 1;
  rc = zt_offload_plan_check(m, tc, oc, g_ops, &bad, &q, err, sizeof err);
  fails += MC_EXPECT(rc == -EINVAL && strstr(err, "grad_slots"), "%s: grad_slots %d: rc %d %s",
                     what, bad.z.ring, rc, err);
  printf("%-40s ckpt %d params %-4s %s ng %d nh %d ring %d dsum %d: checked, read back\n", what,
         p.ckpt_every, zt_offload_place_name(p.params), p.unit_major ? "unit " : "micro", p.z.ng,
         p.z.nh, p.z.ring, p.z.dsum);
  free(text);
  json_decref(back);
  json_decref(j);
  zt_model_destroy(m);
  return fails;
}

/* The reader against a good record with one field changed (value NULL: removed). */
static int refuse(const json_t *good, const char *obj, const char *key, json_t *value,
                  const char *named) {
  json_t *j = json_deep_copy(good);
  json_t *o = obj ? json_object_get(j, obj) : j;
  if (value) json_object_set_new(o, key, value);
  else json_object_del(o, key);
  char err[512];
  zt_offload_placement p;
  int rc = zt_offload_plan_from_json(j, &p, err, sizeof err);
  json_decref(j);
  return MC_EXPECT(rc == -EINVAL && strstr(err, named), "%s%s%s: rc %d, %s (wanted %s named)",
                   obj ? obj : "", obj ? "." : "", key, rc, err, named);
}

static int check_reader(const zt_model_cfg *mc, const zt_train_cfg *tc,
                        const zt_offload_cfg *oc) {
  char err[512];
  zt_offload_placement p;
  if (MC_EXPECT(zt_offload_plan_make(mc, tc, oc, g_ops, &p, err, sizeof err) == 0, "%s", err))
    return 1;
  json_t *good = zt_offload_plan_to_json(&p);
  static const char *const top[] = {"version", "ckpt_every", "params", "order", "gpu_units",
                                    "host_units", "grad_slots", "grads", "delayed_update",
                                    "budgets", "estimate"};
  int fails = 0;
  for (size_t i = 0; i < sizeof top / sizeof *top; i++)
    fails += refuse(good, NULL, top[i], NULL, top[i]);
  fails += refuse(good, NULL, "version", json_integer(2), "version");
  fails += refuse(good, NULL, "ckpt_every", json_string("auto"), "ckpt_every");
  fails += refuse(good, NULL, "gpu_units", json_integer(-1), "gpu_units");
  fails += refuse(good, NULL, "params", json_string("auto"), "params");
  fails += refuse(good, NULL, "grads", json_string("nvme"), "grads");
  fails += refuse(good, NULL, "order", json_string("auto"), "order");
  fails += refuse(good, NULL, "delayed_update", json_integer(0), "delayed_update");
  fails += refuse(good, NULL, "extra", json_true(), "extra");
  fails += refuse(good, "budgets", "gpu", json_integer(-5), "budgets.gpu");
  fails += refuse(good, "budgets", "nvme", NULL, "budgets.nvme");
  fails += refuse(good, "budgets", "disk", json_integer(1), "budgets.disk");
  fails += refuse(good, "estimate", "step_s", json_string("fast"), "estimate.step_s");
  fails += refuse(good, "estimate", "device_bytes", NULL, "estimate.device_bytes");
  fails += refuse(good, NULL, "budgets", json_integer(1), "budgets");
  json_t *arr = json_array();
  fails += MC_EXPECT(zt_offload_plan_from_json(arr, &p, err, sizeof err) == -EINVAL,
                     "an array is read as a plan");
  json_decref(arr);
  json_decref(good);
  printf("the reader refuses each field missing, mistyped, out of range or unknown\n");
  return fails;
}

int main(void) {
  int fails = 0, rings = 0;
  g_ops = zt_backend_ops_of("cpu");
  zt_offload_cfg oc;
  zt_offload_cfg_defaults(&oc);
  zt_arch archs[] = {ZT_ARCH_GPT, ZT_ARCH_ENCODER};
  for (int i = 0; i < 2; i++) {
    zt_model_cfg mc = mc_tiny(archs[i]);
    mc.n_layers = 4;
    mc.d_model = 64;
    mc.d_ff = archs[i] == ZT_ARCH_ENCODER ? 128 : 0;
    char what[96];
    for (int ga = 1; ga <= 2; ga++) {
      zt_train_cfg tc = mc_train(2, ga);
      tc.ckpt_every = ZT_CKPT_AUTO;
      zt_offload_cfg c = oc;
      snprintf(what, sizeof what, "tiny %s ga %d, no budget", zt_arch_name(archs[i]), ga);
      fails += check_case(&mc, &tc, &c, what, &rings);
      zt_offload_placement all;
      char err[512];
      if (MC_EXPECT(zt_offload_plan_make(&mc, &tc, &c, g_ops, &all, err, sizeof err) == 0, "%s",
                    err))
        return 1;
      zt_offload_plan s = zt_offload_plan_summary(&all);
      c.gpu_budget = s.device_bytes * 3 / 4;
      snprintf(what, sizeof what, "tiny %s ga %d, 3/4 of the device", zt_arch_name(archs[i]), ga);
      fails += check_case(&mc, &tc, &c, what, &rings);
      snprintf(c.nvme_dir, sizeof c.nvme_dir, "/nonexistent-the-plan-opens-no-file");
      c.optimizer = ZT_PLACE_NVME;
      snprintf(what, sizeof what, "tiny %s ga %d, optimizer nvme", zt_arch_name(archs[i]), ga);
      fails += check_case(&mc, &tc, &c, what, &rings);
    }
  }
  /* GPT-2 124M on a small GPU: streamed, units on the device, a gradient ring */
  zt_model_cfg gpt2 = {.arch = ZT_ARCH_GPT, .vocab = 50304, .seq_len = 1024, .d_model = 768,
                       .n_heads = 12, .n_layers = 12, .init_seed = 1};
  zt_train_cfg tc;
  zt_train_cfg_defaults(&tc);
  tc.micro_batch = 8;
  tc.ckpt_every = ZT_CKPT_AUTO;
  zt_offload_cfg c = oc;
  c.gpu_budget = (size_t)4 << 30;
  fails += check_case(&gpt2, &tc, &c, "GPT-2 124M, 4 GiB", &rings);
  c.gpu_units = 0;
  fails += check_case(&gpt2, &tc, &c, "GPT-2 124M, 4 GiB, no unit on the device", &rings);
  tc.grad_accum = 4;
  c.gpu_units = -1;
  fails += check_case(&gpt2, &tc, &c, "GPT-2 124M, 4 GiB, grad_accum 4", &rings);
  fails += MC_EXPECT(rings > 0, "no case has a gradient ring");
  fails += check_reader(&gpt2, &tc, &c);
  if (fails) fprintf(stderr, "%d failure(s)\n", fails);
  return fails ? 1 : 0;
}
