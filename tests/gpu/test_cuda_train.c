/* Whole-model training on the cuda backend: for each arch (the llama one GQA 4:2, tied, llama3
 * RoPE, held to 1e-5) (V 256, T 64, C 128, NH 4, L 2, B 4,
 * grad_accum 2), 20 AdamW steps on the cpu and on the cuda backend from the same init on the same
 * batches give per-step losses within 1e-4 relative; and on cuda, activation checkpointing every
 * block gives bitwise the losses, gradient norms, parameters and AdamW moments of the run
 * without (the CUDA ops are deterministic), in fewer backend bytes; the gpt with bf16 AdamW
 * state (train.optimizer.state_dtype) on both backends within 1e-3, the estimate the bytes the
 * cuda trainer holds. Exits 77 without a GPU. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/cuda/cuda_backend.h"
#include "tests/unit/model/mcheck.h"

#define STEPS 20
#define TOLERANCE 1e-4
/* issue 15: the llama family's fp32 cuda losses within 1e-5 of the reference's */
#define TOLERANCE_LLAMA 1e-5
#define TOLERANCE_BF16_STATE 1e-3

typedef struct run {
  double loss[STEPS], norm[STEPS];
  float *state[3];      /* parameters, exp_avg, exp_avg_sq after the last step */
  size_t n;             /* floats in each */
  size_t backend_bytes;
} run;

static zt_model_cfg model_cfg(zt_arch arch) {
  zt_model_cfg c = {.arch = arch, .vocab = 256, .seq_len = 64, .d_model = 128, .n_heads = 4,
                    .n_layers = 2, .d_ff = arch == ZT_ARCH_ENCODER ? 512 : 0, .init_seed = 42};
  if (arch == ZT_ARCH_LLAMA) { /* GQA 4:2, head size 32, tied as Llama 3.2 1B, with llama3 RoPE */
    c.n_kv_heads = 2;
    c.rms_eps = 1e-5f;
    c.rope_theta = 500000.0f;
    c.tie_embeddings = 1;
    c.rope_scaling = (zt_rope_scaling){.type = ZT_ROPE_LLAMA3, .factor = 8.0f,
                                       .low_freq_factor = 1.0f, .high_freq_factor = 4.0f,
                                       .original_max_position_embeddings = 16};
  }
  return c;
}

static zt_train_cfg train_cfg(int ckpt_every, zt_dtype state_dtype) {
  zt_train_cfg c = mc_train(4, 2);
  c.steps = STEPS;
  c.lr = 1e-3f;
  c.beta2 = 0.95f;
  c.weight_decay = 0.1f;
  c.schedule = ZT_SCHED_COSINE;
  c.warmup_steps = 5;
  c.min_lr = 1e-4f;
  c.grad_clip = 1.0f;
  c.ckpt_every = ckpt_every;
  c.state_dtype = state_dtype;
  return c;
}

/* Trains STEPS steps on tok (STEPS * grad_accum micro-batches); 0 or 1 (failure, printed). */
static int train(const zt_backend *be, zt_arch arch, int ckpt_every, zt_dtype state_dtype,
                 const int32_t *tok, run *r) {
  char err[512];
  zt_model_cfg mc = model_cfg(arch);
  zt_train_cfg tc = train_cfg(ckpt_every, state_dtype);
  zt_trainer *t = NULL;
  int fails = 0;
  memset(r, 0, sizeof *r);
  if (zt_trainer_open(&t, &mc, &tc, be, err, sizeof err) < 0) {
    fprintf(stderr, "FAIL %s on %s: %s\n", zt_arch_name(arch), be->ops->name, err);
    return 1;
  }
  size_t n = r->n = zt_model_num_params(zt_trainer_model(t));
  size_t per_step = zt_trainer_micro_tokens(t) * (size_t)tc.grad_accum;
  r->backend_bytes = zt_trainer_backend_bytes(t);
  /* What the daemon admits is what this backend allocates. */
  fails += MC_EXPECT(zt_trainer_estimate_bytes(&mc, &tc, be->ops) == r->backend_bytes,
                     "%s on %s: estimate %zu bytes, trainer holds %zu", zt_arch_name(arch),
                     be->ops->name, zt_trainer_estimate_bytes(&mc, &tc, be->ops),
                     r->backend_bytes);
  for (int s = 0; s < STEPS; s++) {
    zt_step_result res;
    if (zt_trainer_step(t, tok + per_step * (size_t)s, &res, err, sizeof err) < 0) {
      fails += MC_EXPECT(0, "%s on %s step %d: %s", zt_arch_name(arch), be->ops->name, s + 1,
                         err);
      goto out;
    }
    r->loss[s] = res.loss;
    r->norm[s] = res.grad_norm;
  }
  for (int k = 0; k < 3; k++)
    if (!(r->state[k] = malloc(n * sizeof(float)))) {
      fails += MC_EXPECT(0, "out of memory");
      goto out;
    }
  fails += MC_EXPECT(zt_trainer_get_state(t, r->state[0], r->state[1], r->state[2]) == 0,
                     "%s on %s: reading the state failed", zt_arch_name(arch), be->ops->name);
out:
  zt_trainer_close(t);
  return fails;
}

static void run_free(run *r) {
  for (int k = 0; k < 3; k++) free(r->state[k]);
}

static int test_arch(const zt_backend *cpu, const zt_backend *gpu, zt_arch arch) {
  int fails = 0;
  const char *name = zt_arch_name(arch);
  zt_model_cfg mc = model_cfg(arch);
  zt_train_cfg tc = train_cfg(0, ZT_F32);
  size_t n_tok = (size_t)STEPS * tc.grad_accum * tc.micro_batch * (size_t)(mc.seq_len + 1);
  int32_t *tok = malloc(n_tok * sizeof *tok);
  run rc = {0}, rg = {0}, rk = {0};
  if (!tok) return MC_EXPECT(0, "out of memory");
  uint64_t seed = 2024 + (uint64_t)arch;
  mc_tokens(&seed, tok, n_tok, mc.vocab);
  if (train(cpu, arch, 0, ZT_F32, tok, &rc) || train(gpu, arch, 0, ZT_F32, tok, &rg) ||
      train(gpu, arch, 1, ZT_F32, tok, &rk)) {
    fails = 1;
    goto out;
  }
  size_t n = rc.n;

  /* cpu against cuda */
  double worst = 0, worst_p = 0;
  for (int s = 0; s < STEPS; s++) {
    double rel = fabs(rg.loss[s] - rc.loss[s]) / fabs(rc.loss[s]);
    worst = fmax(worst, rel);
    fails += MC_EXPECT(rel <= (arch == ZT_ARCH_LLAMA ? TOLERANCE_LLAMA : TOLERANCE), "%s step %d: cpu loss %.9g, cuda %.9g (relative %.3g)",
                       name, s + 1, rc.loss[s], rg.loss[s], rel);
  }
  for (size_t i = 0; i < n; i++)
    worst_p = fmax(worst_p, fabs((double)rg.state[0][i] - rc.state[0][i]));
  printf("%s: cpu vs cuda, %d steps: max relative loss difference %.3g (tolerance %g); "
         "largest parameter difference after the last step %.3g\n", name, STEPS, worst, TOLERANCE,
         worst_p);

  /* cuda with activation checkpointing against cuda without */
  int same_loss = !memcmp(rg.loss, rk.loss, sizeof rg.loss) &&
                  !memcmp(rg.norm, rk.norm, sizeof rg.norm);
  int same_state = 1;
  for (int k = 0; k < 3; k++)
    same_state &= !memcmp(rg.state[k], rk.state[k], n * sizeof(float));
  double worst_ck = 0;
  for (int s = 0; s < STEPS; s++) worst_ck = fmax(worst_ck, fabs(rk.loss[s] - rg.loss[s]));
  printf("%s: cuda with activation checkpointing (every block) vs without: losses and gradient "
         "norms %s, parameters and AdamW moments %s (largest loss difference %.3g); backend "
         "bytes %zu vs %zu\n", name, same_loss ? "bitwise equal" : "DIFFERENT",
         same_state ? "bitwise equal" : "DIFFERENT", worst_ck, rk.backend_bytes,
         rg.backend_bytes);
  fails += MC_EXPECT(same_loss && same_state, "%s: checkpointing changed the cuda results", name);
  fails += MC_EXPECT(rk.backend_bytes < rg.backend_bytes,
                     "%s: checkpointing did not reduce the backend bytes (%zu vs %zu)", name,
                     rk.backend_bytes, rg.backend_bytes);
out:
  run_free(&rc);
  run_free(&rg);
  run_free(&rk);
  free(tok);
  return fails;
}

/* train.optimizer.state_dtype bf16: the CUDA adamw_sr rounds with the CPU's counter bits, so
 * the runs differ only as the fp32 ones do, but a gradient that differs in its last fp32 bit
 * can now and then round a moment to the other bf16 neighbour: held to TOLERANCE_BF16_STATE. */
static int test_bf16_state(const zt_backend *cpu, const zt_backend *gpu) {
  int fails = 0;
  zt_model_cfg mc = model_cfg(ZT_ARCH_GPT);
  zt_train_cfg tc = train_cfg(0, ZT_BF16);
  size_t n_tok = (size_t)STEPS * tc.grad_accum * tc.micro_batch * (size_t)(mc.seq_len + 1);
  int32_t *tok = malloc(n_tok * sizeof *tok);
  run rc = {0}, rg = {0};
  if (!tok) return MC_EXPECT(0, "out of memory");
  uint64_t seed = 2025;
  mc_tokens(&seed, tok, n_tok, mc.vocab);
  if (train(cpu, ZT_ARCH_GPT, 0, ZT_BF16, tok, &rc) ||
      train(gpu, ZT_ARCH_GPT, 0, ZT_BF16, tok, &rg)) {
    fails = 1;
    goto out;
  }
  double worst = 0;
  for (int s = 0; s < STEPS; s++)
    worst = fmax(worst, fabs(rg.loss[s] - rc.loss[s]) / fabs(rc.loss[s]));
  printf("gpt, bf16 AdamW state: cpu vs cuda, %d steps: max relative loss difference %.3g "
         "(tolerance %g)\n", STEPS, worst, TOLERANCE_BF16_STATE);
  fails += MC_EXPECT(worst <= TOLERANCE_BF16_STATE, "bf16 state: cpu and cuda losses differ by "
                     "%.3g relative", worst);
out:
  run_free(&rc);
  run_free(&rg);
  free(tok);
  return fails;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* keep our lines in order with the backend's log lines */
  zt_backend gpu, cpu;
  int rc = zt_backend_cuda_open(&gpu, 0);
  if (rc == -ENODEV) {
    printf("no CUDA device: skipped\n");
    return 77;
  }
  if (rc < 0) {
    fprintf(stderr, "FAIL: zt_backend_cuda_open: %d\n", rc);
    return 1;
  }
  cpu = mc_backend();
  int fails = test_arch(&cpu, &gpu, ZT_ARCH_GPT) + test_arch(&cpu, &gpu, ZT_ARCH_ENCODER) +
              test_arch(&cpu, &gpu, ZT_ARCH_LLAMA) + test_bf16_state(&cpu, &gpu);
  zt_backend_cuda_close(&gpu);
  zt_backend_cpu_close(&cpu);
  printf("%s: %d failure(s)\n", fails ? "FAIL" : "PASS", fails);
  return fails ? 1 : 0;
}
