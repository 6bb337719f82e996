/* The cost model's rates (engine/plan/rates.h): the built-in sets by name, a rates file (its
 * fields over the default's, its refusals naming the file and the field without its bytes),
 * the same fields from an object, a calibration's file written and read back, and that plans
 * rank by the rates in use (the process's, or a thread's own over them): under a slower device
 * the estimate grows (the choices may change with it: the gradient ring's slots follow the
 * rates) and still fits. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/kernels/backend.h"
#include "engine/plan/offload_plan.h"
#include "engine/plan/rates.h"
#include "tests/unit/model/mcheck.h"

static char g_path[64];

static void write_file(const char *text) {
  FILE *f = fopen(g_path, "w");
  fputs(text, f);
  fclose(f);
}

int main(void) {
  int fails = 0;
  char err[512];
  zt_plan_rates r, d = *zt_plan_rates_active();
  fails += MC_EXPECT(!strcmp(d.name, "default") && d.flops_lp > 0 && d.nvme_read > 0,
                     "the built-in default is active: %s", d.name);
  fails += MC_EXPECT(zt_plan_rates_named("h200", &r, err, sizeof err) == 0 &&
                         !strcmp(r.name, "h200") && r.nvme_read != r.nvme_write,
                     "h200: %s", err);
  fails += MC_EXPECT(zt_plan_rates_named("a100", &r, err, sizeof err) == -ENOENT &&
                         strstr(err, "\"a100\"") && strstr(err, "default, h200"),
                     "unknown set: %s", err);

  snprintf(g_path, sizeof g_path, "/tmp/zt-rates-test.%d.json", (int)getpid());
  unlink(g_path);
  fails += MC_EXPECT(zt_plan_rates_load(g_path, &r, err, sizeof err) == -ENOENT && !err[0],
                     "no file: %s", err);
  write_file("{\"name\": \"slow-box\", \"flops_bf16\": 1e13, \"nvme_write_bytes\": 5e8}");
  fails += MC_EXPECT(zt_plan_rates_load(g_path, &r, err, sizeof err) == 0, "load: %s", err);
  fails += MC_EXPECT(!strcmp(r.name, "slow-box") && r.flops_lp == 1e13 &&
                         r.nvme_write == 5e8 && r.flops_f32 == d.flops_f32 &&
                         r.h2d_bytes == d.h2d_bytes,
                     "the file's fields over the default's");
  static const struct {
    const char *text, *want;
  } bad[] = {
      {"{\"flops_bf16\": -1}", "flops_bf16 must be a positive number"},
      {"{\"flops_bf16\": \"fast\"}", "flops_bf16 must be a positive number"},
      {"{\"secret-ish\": 1}", "unknown field (the fields: name, flops_bf16"},
      {"[1, 2]", "a rates file is one JSON object"},
      {"{\"h2d_bytes\": 5e10, oops}", "not JSON (line 1, column"},
      {"{\"name\": \"\"}", "name must be a string of 1 to 63 characters"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    write_file(bad[i].text);
    int rc = zt_plan_rates_load(g_path, &r, err, sizeof err);
    fails += MC_EXPECT(rc == -EINVAL && strstr(err, g_path) && strstr(err, bad[i].want) &&
                           !strstr(err, "secret") && !strstr(err, "oops"),
                       "%s: %d %s", bad[i].text, rc, err);
  }
  unlink(g_path);
  /* an object (a plan target's rates, sent inline) as a file's content */
  json_t *obj = json_pack("{s:f}", "nvme_read_bytes", 2e9);
  fails += MC_EXPECT(zt_plan_rates_from_json(obj, "target.rates", "inline", &r, err,
                                             sizeof err) == 0 &&
                         !strcmp(r.name, "inline") && r.nvme_read == 2e9 &&
                         r.flops_lp == d.flops_lp,
                     "an object: %s", err);
  json_object_set_new(obj, "hbm_bytes", json_string("quick"));
  fails += MC_EXPECT(zt_plan_rates_from_json(obj, "target.rates", "inline", &r, err,
                                             sizeof err) == -EINVAL &&
                         !strcmp(err, "target.rates: hbm_bytes must be a positive number (per "
                                      "second)"),
                     "an object's bad field: %s", err);
  json_decref(obj);

  /* ztd --calibrate's file: written atomically, read back to the same rates (every field
   * exact), its informational strings checked and named, never echoed */
  char dir[40], path[96];
  snprintf(dir, sizeof dir, "/tmp/zt-rates-save.%d", (int)getpid());
  snprintf(path, sizeof path, "%s/rates.json", dir);
  mkdir(dir, 0700);
  zt_plan_rates cal = {.name = "calibrated", .flops_lp = 1.2345678901234567e14,
                       .flops_f32 = 3e13, .h2d_bytes = 2.5e10, .d2h_bytes = 2.4e10,
                       .adamw_params = 1.1e9, .sumsq_bytes = 7e9, .nvme_read = 1.5e9,
                       .nvme_write = 1.25e9, .hbm_bytes = 2.9e12,
                       .adamw_alone_params = 2.2e9, .flops_knee = 860};
  fails += MC_EXPECT(zt_plan_rates_save(dir, &cal, "2026-01-02T03:04:05Z", "cuda", err,
                                        sizeof err) == 0,
                     "save: %s", err);
  fails += MC_EXPECT(zt_plan_rates_load(path, &r, err, sizeof err) == 0 &&
                         !memcmp(&r, &cal, sizeof r),
                     "the saved rates read back: %s", err);
  char tmp[96];
  snprintf(tmp, sizeof tmp, "%s/.rates.json.tmp", dir);
  fails += MC_EXPECT(access(tmp, F_OK) != 0, "no temp file left");
  json_t *saved = json_load_file(path, 0, NULL);
  fails += MC_EXPECT(saved && !strcmp(json_string_value(json_object_get(saved, "measured")),
                                      "2026-01-02T03:04:05Z") &&
                         !strcmp(json_string_value(json_object_get(saved, "backend")), "cuda") &&
                         json_object_size(saved) == 14,
                     "name, measured, backend and the eleven rates");
  json_object_set_new(saved, "measured", json_integer(20260102));
  fails += MC_EXPECT(zt_plan_rates_from_json(saved, "X", "f", &r, err, sizeof err) == -EINVAL &&
                         !strcmp(err, "X: measured must be a string of 1 to 63 characters"),
                     "measured not a string: %s", err);
  json_object_set_new(saved, "measured", json_string("2026"));
  json_object_set_new(saved, "backend", json_string("secret-but-far-too-long-for-a-backend-name-"
                                                    "of-any-machine-at-all"));
  fails += MC_EXPECT(zt_plan_rates_from_json(saved, "X", "f", &r, err, sizeof err) == -EINVAL &&
                         strstr(err, "X: backend must be a string") && !strstr(err, "secret"),
                     "backend too long: %s", err);
  json_decref(saved);
  fails += MC_EXPECT(zt_plan_rates_save("/nonexistent-zt-dir", &cal, NULL, NULL, err,
                                        sizeof err) == -ENOENT &&
                         strstr(err, "/nonexistent-zt-dir/rates.json"),
                     "save into no directory: %s", err);
  unlink(path);
  rmdir(dir);

  /* GPT-2 124M, bf16, offloaded under 4 GiB, planned again under a device 35x slower */
  zt_model_cfg mc = {.arch = ZT_ARCH_GPT, .vocab = 50257, .seq_len = 1024, .d_model = 768,
                     .n_heads = 12, .n_layers = 12};
  zt_train_cfg tc;
  zt_train_cfg_defaults(&tc);
  tc.micro_batch = 8;
  tc.precision = ZT_BF16;
  zt_offload_cfg oc;
  zt_offload_cfg_defaults(&oc);
  oc.gpu_budget = (size_t)4 << 30;
  oc.gpu_units = 0;
  tc.ckpt_every = 1;
  zt_offload_plan a, b;
  const zt_ops *ops = zt_backend_ops_of("cpu");
  fails += MC_EXPECT(zt_offload_estimate(&mc, &tc, &oc, ops, &a, err, sizeof err) == 0,
                     "plan: %s", err);
  zt_plan_rates slow = d;
  slow.flops_lp = d.flops_lp / 35;
  zt_plan_rates_use(&slow);
  fails += MC_EXPECT(zt_offload_estimate(&mc, &tc, &oc, ops, &b, err, sizeof err) == 0,
                     "plan under slow rates: %s", err);
  fails += MC_EXPECT(b.est.step_s > 5 * a.est.step_s, "estimate %g s, slow device %g s",
                     a.est.step_s, b.est.step_s);
  fails += MC_EXPECT(b.device_bytes <= oc.gpu_budget, "the slow device's plan fits its budget");
  zt_plan_rates_use(&d);
  /* a thread's own rates over the process's (a plan for another machine), and back */
  zt_plan_rates_use_here(&slow);
  fails += MC_EXPECT(zt_offload_estimate(&mc, &tc, &oc, ops, &b, err, sizeof err) == 0 &&
                         b.est.step_s > 5 * a.est.step_s && zt_plan_rates_active() == &slow,
                     "the thread's rates: %g s", b.est.step_s);
  zt_plan_rates_use_here(NULL);
  fails += MC_EXPECT(zt_offload_estimate(&mc, &tc, &oc, ops, &b, err, sizeof err) == 0 &&
                         b.est.step_s == a.est.step_s && !strcmp(zt_plan_rates_active()->name,
                                                                 "default"),
                     "the process's rates again: %g s", b.est.step_s);
  if (!fails) printf("rates: ok (GPT-2 124M: %.3f s a step, %.3f s on a device 35x slower)\n",
                     a.est.step_s, b.est.step_s);
  return fails ? 1 : 0;
}
