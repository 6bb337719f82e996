/* The plan's sizes with train.optimizer.state_dtype bf16 (plan only, zt_offload_estimate): m and
 * v at 2 bytes each a parameter wherever they live. GPT-2 124M with every unit's optimizer on
 * the host: the host tier 4 bytes a streamed parameter smaller than with fp32 moments (to the
 * page of each buffer); on NVMe: the files 4 bytes a parameter smaller (to the block of each
 * file) and the staging smaller; units on the device: their device bytes 4 a parameter smaller.
 * And a plan that bf16 moments make fit: the 10 B GPT of test_offload_plan.c with its optimizer
 * on the host alone overruns host_budget 110 GiB with fp32 moments and fits it with bf16. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "engine/kernels/backend.h"
#include "engine/model/model.h"
#include "engine/plan/offload_plan.h"
#include "tests/unit/model/mcheck.h"

#define GiB ((size_t)1 << 30)

static int estimate(const zt_model_cfg *mc, zt_train_cfg tc, zt_dtype sd,
                    const zt_offload_cfg *oc, zt_offload_plan *p, char *err, size_t errlen) {
  tc.state_dtype = sd;
  err[0] = 0;
  return zt_offload_estimate(mc, &tc, oc, zt_backend_ops_of("cpu"), p, err, errlen);
}

/* |a - b| <= slack */
static int near(double a, double b, double slack) { return a - b <= slack && b - a <= slack; }

int main(void) {
  int fails = 0;
  char err[1024];
  double page = (double)sysconf(_SC_PAGESIZE);
  zt_model_cfg mc = {.arch = ZT_ARCH_GPT, .vocab = 50304, .seq_len = 1024, .d_model = 768,
                     .n_heads = 12, .n_layers = 12, .init_seed = 1};
  zt_model *m = NULL;
  if (MC_EXPECT(zt_model_create(&m, &mc, err, sizeof err) == 0, "%s", err)) return 1;
  double n = (double)zt_model_num_params(m);
  int nu = zt_model_num_units(m);
  double dev2 = (double)zt_model_unit(m, 2)->offset; /* the parameters of units 0 and 1 */
  zt_model_destroy(m);
  zt_train_cfg tc;
  zt_train_cfg_defaults(&tc);
  tc.micro_batch = 1;
  tc.precision = ZT_BF16;
  tc.grad_clip = 1.0f;
  zt_offload_cfg oc;
  zt_offload_cfg_defaults(&oc);
  oc.optimizer = ZT_PLACE_HOST;
  oc.params = ZT_PLACE_HOST;
  oc.gpu_units = 0;
  zt_offload_plan f, b;

  /* every unit's optimizer on the host: 2 x 2 bytes a parameter, each buffer to its page */
  if (MC_EXPECT(estimate(&mc, tc, ZT_F32, &oc, &f, err, sizeof err) == 0, "host fp32: %s", err) ||
      MC_EXPECT(estimate(&mc, tc, ZT_BF16, &oc, &b, err, sizeof err) == 0, "host bf16: %s", err))
    return 1;
  double saved = (double)f.host_bytes - (double)b.host_bytes;
  fails += MC_EXPECT(near(saved, 4 * n, 2 * page) && b.device_bytes == f.device_bytes,
                     "host: %zu bytes with fp32 moments, %zu with bf16 (%.0f less, 4 a "
                     "parameter is %.0f); device %zu, %zu", f.host_bytes, b.host_bytes, saved,
                     4 * n, f.device_bytes, b.device_bytes);
  printf("host units: host %zu bytes with fp32 moments, %zu with bf16\n", f.host_bytes,
         b.host_bytes);

  /* on NVMe: the files 4 bytes a parameter less (each unit's m and v to a block), the staging
   * of two sets with it */
  zt_offload_cfg nv = oc;
  nv.optimizer = ZT_PLACE_NVME;
  snprintf(nv.nvme_dir, sizeof nv.nvme_dir, "/nvme");
  if (MC_EXPECT(estimate(&mc, tc, ZT_F32, &nv, &f, err, sizeof err) == 0, "nvme fp32: %s", err) ||
      MC_EXPECT(estimate(&mc, tc, ZT_BF16, &nv, &b, err, sizeof err) == 0, "nvme bf16: %s", err))
    return 1;
  saved = (double)f.nvme_bytes - (double)b.nvme_bytes;
  fails += MC_EXPECT(near(saved, 4 * n, 2.0 * nu * 4096) && b.host_bytes < f.host_bytes &&
                         b.host_units == 0 && f.host_units == 0,
                     "nvme: %llu bytes with fp32 moments, %llu with bf16 (%.0f less, 4 a "
                     "parameter is %.0f); host %zu, %zu", (unsigned long long)f.nvme_bytes,
                     (unsigned long long)b.nvme_bytes, saved, 4 * n, f.host_bytes,
                     b.host_bytes);
  printf("nvme units: files %llu bytes with fp32 moments, %llu with bf16\n",
         (unsigned long long)f.nvme_bytes, (unsigned long long)b.nvme_bytes);

  /* two units' optimizer on the device: their m and v at 2 bytes each */
  zt_offload_cfg dv = oc;
  dv.gpu_units = 2;
  if (MC_EXPECT(estimate(&mc, tc, ZT_F32, &dv, &f, err, sizeof err) == 0, "dev fp32: %s", err) ||
      MC_EXPECT(estimate(&mc, tc, ZT_BF16, &dv, &b, err, sizeof err) == 0, "dev bf16: %s", err))
    return 1;
  saved = (double)f.gpu_unit_bytes - (double)b.gpu_unit_bytes;
  fails += MC_EXPECT(f.gpu_units == 2 && near(saved, 4 * dev2, 2 * 4096.0),
                     "device units: %zu bytes with fp32 moments, %zu with bf16 (%.0f less, 4 a "
                     "parameter is %.0f)", f.gpu_unit_bytes, b.gpu_unit_bytes, saved, 4 * dev2);

  /* the 10 B GPT, its optimizer on the host alone under host_budget 110 GiB: refused with fp32
   * moments (test_offload_plan.c), fits with bf16 */
  zt_model_cfg big = {.arch = ZT_ARCH_GPT, .vocab = 50304, .seq_len = 1024, .d_model = 5120,
                      .n_heads = 40, .n_layers = 32, .init_seed = 1};
  zt_train_cfg bt = tc;
  bt.grad_clip = 0;
  bt.ckpt_every = ZT_CKPT_AUTO;
  zt_offload_cfg host = oc;
  host.gpu_units = -1;
  host.params = ZT_PLACE_AUTO;
  host.gpu_budget = 24 * GiB;
  host.host_budget = 110 * GiB;
  int rc = estimate(&big, bt, ZT_F32, &host, &f, err, sizeof err);
  fails += MC_EXPECT(rc == -ENOMEM && strstr(err, "offload.host_budget"), "10 B, fp32 moments "
                     "on the host: rc %d, %s", rc, err);
  rc = estimate(&big, bt, ZT_BF16, &host, &b, err, sizeof err);
  fails += MC_EXPECT(rc == 0 && b.host_bytes <= host.host_budget && b.nvme_bytes == 0,
                     "10 B, bf16 moments on the host: rc %d, %s", rc, err);
  if (rc == 0) printf("10 B with bf16 moments on the host: host %zu bytes\n", b.host_bytes);
  if (fails) fprintf(stderr, "%d failure(s)\n", fails);
  return fails ? 1 : 0;
}
