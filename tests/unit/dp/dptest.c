#include "tests/unit/dp/dptest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "tests/unit/model/mcheck.h"

#define MICRO_BATCH 2

zt_model_cfg dpt_model_cfg(zt_arch arch) {
  zt_model_cfg mc = {.arch = arch, .vocab = 37, .seq_len = 16, .d_model = 32, .n_heads = 4,
                     .n_layers = 2, .d_ff = arch == ZT_ARCH_ENCODER ? 64 : 0, .init_seed = 7};
  if (arch == ZT_ARCH_LLAMA) { /* GQA 4:2, tied: the head reads the embedding unit */
    mc.n_kv_heads = 2;
    mc.rms_eps = 1e-5f;
    mc.rope_theta = 10000.0f;
    mc.tie_embeddings = 1;
  }
  return mc;
}

zt_train_cfg dpt_train_cfg(int grad_accum, float clip, zt_dtype dt) {
  zt_train_cfg tc = mc_train(MICRO_BATCH, grad_accum);
  tc.steps = DPT_STEPS;
  tc.warmup_steps = 2;
  tc.schedule = ZT_SCHED_COSINE;
  tc.min_lr = 1e-4f;
  tc.lr = 1e-2f;
  tc.weight_decay = 0.1f;
  tc.grad_clip = clip;
  tc.precision = dt;
  return tc;
}

void dpt_ranks_open(dpt_ranks *x, int W) {
  x->W = W;
  if (zt_comm_cpu_group_open(&x->g, W) < 0) exit(1);
  for (int r = 0; r < W; r++)
    if (zt_backend_cpu_open(&x->r[r].be, 1) < 0 || zt_comm_cpu_open(&x->r[r].comm, x->g, r) < 0)
      exit(1);
}

void dpt_ranks_close(dpt_ranks *x) {
  for (int r = 0; r < x->W; r++) {
    zt_comm_cpu_close(&x->r[r].comm);
    zt_backend_cpu_close(&x->r[r].be);
  }
  zt_comm_cpu_group_close(x->g);
}

size_t dpt_step_tokens(const zt_model_cfg *mc, int micros) {
  return (size_t)micros * MICRO_BATCH * (mc->seq_len + 1);
}

int32_t *dpt_tokens(const zt_model_cfg *mc, int micros, uint64_t seed) {
  size_t n = DPT_STEPS * dpt_step_tokens(mc, micros);
  int32_t *tok = malloc(n * sizeof *tok);
  if (!tok) exit(1);
  mc_tokens(&seed, tok, n, mc->vocab);
  return tok;
}

int dpt_run_steps(zt_trainer *t, const int32_t *tok, size_t per, int from, int to, dpt_run *o,
                  const char *what) {
  char err[512];
  for (int i = from; i < to; i++) {
    zt_step_result r;
    int rc = zt_trainer_step(t, tok + (size_t)i * per, &r, err, sizeof err);
    if (MC_EXPECT(rc == 0, "%s: step %d: %s", what, i + 1, err)) return 1;
    o->loss[i] = r.loss;
    o->norm[i] = r.grad_norm;
  }
  return 0;
}

float *dpt_state_of(zt_trainer *t) {
  size_t n = zt_model_num_params(zt_trainer_model(t));
  float *x = malloc(3 * n * sizeof *x);
  if (!x || zt_trainer_get_state(t, x, x + n, x + 2 * n) < 0) exit(1);
  return x;
}

zt_trainer *dpt_open_plain(const zt_model_cfg *mc, const zt_train_cfg *tc, zt_backend *be) {
  zt_trainer *t;
  char err[512];
  if (zt_trainer_open(&t, mc, tc, be, err, sizeof err) < 0) {
    fprintf(stderr, "plain trainer: %s\n", err);
    exit(1);
  }
  return t;
}

zt_trainer *dpt_open_dp_cfg(const zt_model_cfg *mc, const zt_train_cfg *tc, dpt_ranks *x,
                            const zt_dp_cfg *dc) {
  zt_trainer *t;
  char err[512];
  if (zt_trainer_open_dp(&t, mc, tc, dc, x->r + dc->rank0, err, sizeof err) < 0) {
    fprintf(stderr, "dp W %d stage %d ranks %d+%d optimizer %s (gpu_units %d) params %s: %s\n",
            dc->world, dc->zero_stage, dc->rank0, dc->local,
            zt_offload_place_name(dc->optimizer), dc->gpu_units,
            zt_offload_place_name(dc->params), err);
    exit(1);
  }
  return t;
}

zt_trainer *dpt_open_dp(const zt_model_cfg *mc, const zt_train_cfg *tc, dpt_ranks *x, int stage,
                        int rank0, int local) {
  zt_dp_cfg dc = {.world = x->W, .zero_stage = stage, .rank0 = rank0, .local = local};
  return dpt_open_dp_cfg(mc, tc, x, &dc);
}

float *dpt_nan_init(zt_model_cfg *mc, const char *dir, size_t *nan_at, int *fails) {
  zt_model *m;
  char err[512];
  if (zt_model_create(&m, mc, err, sizeof err) < 0) exit(1);
  size_t n = zt_model_num_params(m), at = zt_model_unit(m, 1)->offset + 3;
  float *p = malloc(n * sizeof *p);
  if (!p) exit(1);
  zt_model_init_params(m, p);
  p[at] = NAN;
  snprintf(mc->init_path, sizeof mc->init_path, "%s/init.safetensors", dir);
  zt_model_state st = {"", p};
  *fails += MC_EXPECT(zt_model_save_states(m, mc->init_path, &st, 1, 0, NULL, err,
                                           sizeof err) == 0, "save init: %s", err);
  zt_model_destroy(m);
  if (nan_at) *nan_at = at;
  return p;
}
