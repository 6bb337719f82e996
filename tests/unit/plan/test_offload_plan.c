/* The offload plan of a GPT of more than 10 B parameters on the machine of issue 5 (24 GiB of
 * GPU, 125 GiB of RAM, a 64 GiB disk), plan only (zt_offload_estimate allocates nothing):
 * d_model 5120, 32 layers, 40 heads, vocab 50304, seq 1024, B 1, bf16, no clipping, one
 * micro-batch a step. With gpu_budget 24 GiB, host_budget 110 GiB and nvme_budget 55 GB,
 * optimizer auto splits the optimizer state between the host and NVMe and the gradients take
 * the ring: it fits every budget. Each of the two is needed: the optimizer on the host alone
 * overruns the host, on NVMe alone the NVMe budget, and clipping (the flat gradient buffer)
 * leaves too little host for the split. Prints the plan. Then GPT-2 124M and 1.5B (B 8, T 1024,
 * bf16) under gpu_budget 24 GiB with everything auto, issue 5's benchmark: 124M keeps every unit
 * on the device without recompute (the target is the no-budget time), 1.5B fits the budget,
 * and with grad_accum 4 its step is the device's compute; the plans are printed. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "engine/kernels/backend.h"
#include "engine/model/model.h"
#include "engine/plan/offload_plan.h"
#include "tests/unit/model/mcheck.h"

#define GiB ((size_t)1 << 30)

/* GPT-2 of d_model d and L layers (vocab 50304, T 1024, B 8, ga micro-batches a step, bf16)
 * under 24 GiB, all auto. */
static int gpt2_plan(const zt_ops *ops, int d, int L, int nh, int ga, zt_offload_plan *p) {
  char err[1024];
  zt_model_cfg mc = {.arch = ZT_ARCH_GPT, .vocab = 50304, .seq_len = 1024, .d_model = d,
                     .n_heads = nh, .n_layers = L, .init_seed = 1};
  zt_train_cfg tc;
  zt_train_cfg_defaults(&tc);
  tc.micro_batch = 8;
  tc.grad_accum = ga;
  tc.precision = ZT_BF16;
  tc.ckpt_every = ZT_CKPT_AUTO;
  zt_offload_cfg oc;
  zt_offload_cfg_defaults(&oc);
  oc.gpu_budget = 24 * GiB;
  int rc = zt_offload_estimate(&mc, &tc, &oc, ops, p, err, sizeof err);
  if (MC_EXPECT(rc == 0, "GPT-2 d %d: %s", d, err)) return 1;
  printf("GPT-2 d %d, %d layers, grad_accum %d on %s under 24 GiB: %d of %d units' optimizer "
         "on the device, params %s, gradient sums on the %s, checkpointing every %d, device %zu "
         "bytes, host %zu, estimated %.0f ms\n", d, L, ga, ops->name, p->gpu_units, p->units,
         zt_offload_place_name(p->params), zt_offload_place_name(p->grads), p->ckpt_every,
         p->device_bytes, p->host_bytes, p->est.step_s * 1e3);
  return MC_EXPECT(p->device_bytes <= 24 * GiB, "over the budget: %zu", p->device_bytes);
}

int main(void) {
  int fails = 0;
  char err[1024];
  zt_model_cfg mc = {.arch = ZT_ARCH_GPT, .vocab = 50304, .seq_len = 1024, .d_model = 5120,
                     .n_heads = 40, .n_layers = 32, .init_seed = 1};
  zt_train_cfg tc;
  zt_train_cfg_defaults(&tc);
  tc.steps = 3;
  tc.micro_batch = 1;
  tc.grad_accum = 1;
  tc.precision = ZT_BF16;
  tc.grad_clip = 0;
  tc.ckpt_every = ZT_CKPT_AUTO;
  /* the activations as the GPU that runs it sizes them, where this build has it */
  const zt_ops *ops = zt_backend_ops_of("cuda");
  if (!ops) ops = zt_backend_ops_of("cpu");
  zt_model *m = NULL;
  if (MC_EXPECT(zt_model_create(&m, &mc, err, sizeof err) == 0, "%s", err)) return 1;
  size_t params = zt_model_num_params(m);
  zt_model_destroy(m);
  /* 12 d^2 + 13 d a block, the embeddings V d + T d, the final norm 2 d */
  size_t d = 5120;
  fails += MC_EXPECT(params == 32 * (12 * d * d + 13 * d) + 50304 * d + 1024 * d + 2 * d &&
                     params >= 10000000000u, "%zu parameters", params);

  zt_offload_cfg oc;
  zt_offload_cfg_defaults(&oc);
  oc.gpu_budget = 24 * GiB;
  oc.host_budget = 110 * GiB;
  oc.nvme_budget = 55000000000u;
  snprintf(oc.nvme_dir, sizeof oc.nvme_dir, "/nvme");
  zt_offload_plan p;
  int rc = zt_offload_estimate(&mc, &tc, &oc, ops, &p, err, sizeof err);
  fails += MC_EXPECT(rc == 0, "the 10 B plan: %s", err);
  if (rc == 0) {
    printf("%zu parameters on %s: %d units, %d with their optimizer on the device, %d on the "
           "host, %d on NVMe; checkpointing every %d, params %s, %d gradient slots\n"
           "device %zu bytes (activations %zu, device units %zu, arena %zu)\n"
           "host %zu bytes\nnvme %llu bytes\nestimated step %.1f s (NVMe %llu bytes a step)\n",
           params, ops->name, p.units, p.gpu_units, p.host_units,
           p.units - p.gpu_units - p.host_units, p.ckpt_every, zt_offload_place_name(p.params),
           p.grad_slots, p.device_bytes, p.act_bytes, p.gpu_unit_bytes, p.arena_bytes,
           p.host_bytes, (unsigned long long)p.nvme_bytes, p.est.step_s,
           (unsigned long long)p.nvme_step_bytes);
    fails += MC_EXPECT(p.device_bytes <= oc.gpu_budget && p.host_bytes <= oc.host_budget &&
                       p.nvme_bytes <= oc.nvme_budget, "the plan overruns a budget");
    fails += MC_EXPECT(p.host_units > 0 && p.gpu_units + p.host_units < p.units &&
                       p.nvme_bytes > 0 && p.grad_slots > 0, "not split: %d host units, %d "
                       "gradient slots", p.host_units, p.grad_slots);
  }

  zt_offload_plan small, big;
  if (gpt2_plan(ops, 768, 12, 12, 1, &small) == 0)
    fails += MC_EXPECT(small.ckpt_every == 0 && small.params == ZT_PLACE_GPU &&
                           small.gpu_units >= small.units - 1,
                       "124M: checkpointing %d, params %s, %d of %d units on the device",
                       small.ckpt_every, zt_offload_place_name(small.params), small.gpu_units,
                       small.units);
  else
    fails++;
  fails += gpt2_plan(ops, 1600, 48, 25, 1, &big);
  /* four micro-batches a step: the copies and the CPU's work hide under four forwards and
   * backwards, the step is the device's compute (the H200 measured 96% busy, session 11) */
  if (gpt2_plan(ops, 1600, 48, 25, 4, &big) == 0)
    fails += MC_EXPECT(big.est.step_s <= 1.05 * big.est.compute_s, "1.5B, grad_accum 4: "
                       "estimated %g s, of it compute %g s", big.est.step_s, big.est.compute_s);
  else
    fails++;

  /* the optimizer on the host alone: the host budget cannot hold it */
  zt_offload_cfg host = oc;
  host.optimizer = ZT_PLACE_HOST;
  rc = zt_offload_estimate(&mc, &tc, &host, ops, &p, err, sizeof err);
  fails += MC_EXPECT(rc == -ENOMEM && strstr(err, "offload.host_budget"), "optimizer host: rc "
                     "%d, %s", rc, err);
  /* on NVMe alone: the NVMe budget cannot */
  zt_offload_cfg nvme = oc;
  nvme.optimizer = ZT_PLACE_NVME;
  rc = zt_offload_estimate(&mc, &tc, &nvme, ops, &p, err, sizeof err);
  fails += MC_EXPECT(rc == -ENOSPC && strstr(err, "offload.nvme_budget"), "optimizer nvme: rc "
                     "%d, %s", rc, err);
  /* clipping keeps the flat gradients (4 bytes a parameter on the host): too little host is
   * left to keep NVMe within its budget */
  zt_train_cfg clipped = tc;
  clipped.grad_clip = 1.0f;
  rc = zt_offload_estimate(&mc, &clipped, &oc, ops, &p, err, sizeof err);
  fails += MC_EXPECT(rc == -ENOSPC && strstr(err, "offload.nvme_budget"), "clipped: rc %d, %s",
                     rc, err);
  if (fails) fprintf(stderr, "%d failure(s)\n", fails);
  return fails ? 1 : 0;
}
