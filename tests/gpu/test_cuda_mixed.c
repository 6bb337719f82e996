/* Mixed precision on the cuda backend, whole model, both archs (V 256, T 64, C 128, NH 4, L 2,
 * B 4, grad_accum 2; 20 AdamW steps on batches with something to learn, from one init):
 * - bf16 and fp16 per-step losses against fp32 within 2e-2 (bf16) and 5e-3 (fp16) relative:
 *   bf16 stores 8 mantissa bits (u = 3.9e-3) in every activation and weight copy, fp16 11
 *   (u = 4.9e-4), and both accumulate in fp32, so losses stay within a few u of fp32 (this
 *   configuration on the CPU twin, through tools/ztrain: bf16 3.2e-3 / 8.5e-4, fp16 1.1e-3 /
 *   1.6e-4 for gpt / encoder);
 * - fp16 with the default loss scale (65536) skips no step on this model (none on the CPU);
 * - activation checkpointing every block gives bitwise the bf16 losses and parameters of the
 *   run without (the typed ops are deterministic too), in fewer backend bytes;
 * - tf32 on: fp32 losses within 5e-3 relative of tf32 off (TF32 keeps 10 mantissa bits of the
 *   matmul inputs, like fp16).
 * Every loss is printed, so a failure shows where the runs part. Exits 77 without a GPU. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "engine/kernels/cuda/cuda_backend.h"
#include "tests/unit/model/mcheck.h"

#define STEPS 20

typedef struct run {
  double loss[STEPS];
  int skipped;
  float last_scale;
  float *params;
  size_t n, backend_bytes;
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

static zt_train_cfg train_cfg(zt_dtype precision, int tf32, int ckpt_every) {
  zt_train_cfg c = mc_train(4, 2);
  c.steps = STEPS;
  c.lr = 3e-3f;
  c.beta2 = 0.95f;
  c.weight_decay = 0.1f;
  c.grad_clip = 1.0f;
  c.precision = precision;
  c.tf32 = tf32;
  c.ckpt_every = ckpt_every;
  return c;
}

static int train(const zt_backend *be, zt_arch arch, zt_dtype precision, int tf32,
                 int ckpt_every, const int32_t *tok, run *r) {
  char err[512];
  zt_model_cfg mc = model_cfg(arch);
  zt_train_cfg tc = train_cfg(precision, tf32, ckpt_every);
  zt_trainer *t = NULL;
  int fails = 0;
  memset(r, 0, sizeof *r);
  if (zt_trainer_open(&t, &mc, &tc, be, err, sizeof err) < 0) {
    fprintf(stderr, "FAIL %s %s open: %s\n", zt_arch_name(arch), zt_dtype_name(precision), err);
    return 1;
  }
  r->n = zt_model_num_params(zt_trainer_model(t));
  r->backend_bytes = zt_trainer_backend_bytes(t);
  /* What the daemon admits is what this backend allocates (flash attention's rows included). */
  fails += MC_EXPECT(zt_trainer_estimate_bytes(&mc, &tc, be->ops) == r->backend_bytes,
                     "%s %s: estimate %zu bytes, trainer holds %zu", zt_arch_name(arch),
                     zt_dtype_name(precision), zt_trainer_estimate_bytes(&mc, &tc, be->ops),
                     r->backend_bytes);
  size_t per_step = zt_trainer_micro_tokens(t) * (size_t)tc.grad_accum;
  for (int s = 0; s < STEPS; s++) {
    zt_step_result res;
    if (zt_trainer_step(t, tok + per_step * (size_t)s, &res, err, sizeof err) < 0) {
      fails += MC_EXPECT(0, "%s %s step %d: %s", zt_arch_name(arch), zt_dtype_name(precision),
                         s + 1, err);
      goto out;
    }
    r->loss[s] = res.loss;
    r->skipped += res.skipped;
    r->last_scale = res.loss_scale;
  }
  if (!(r->params = malloc(r->n * sizeof(float)))) {
    fails += MC_EXPECT(0, "out of memory");
    goto out;
  }
  fails += MC_EXPECT(zt_trainer_get_state(t, r->params, NULL, NULL) == 0, "reading the state");
out:
  zt_trainer_close(t);
  return fails;
}

static int compare(const char *what, const run *ref, const run *got, double tol) {
  double worst = 0;
  int at = 0;
  for (int s = 0; s < STEPS; s++) {
    double e = fabs(got->loss[s] - ref->loss[s]) / ref->loss[s];
    if (e > worst) worst = e, at = s;
  }
  printf("%-34s worst relative loss difference %.3e at step %d (tolerance %.0e)  %s\n", what,
         worst, at + 1, tol, worst <= tol ? "ok" : "FAIL");
  if (worst > tol) {
    fprintf(stderr, "FAIL %s: step %d loss %.9g vs %.9g (relative %.3g > %.0e)\n", what, at + 1,
            got->loss[at], ref->loss[at], worst, tol);
    return 1;
  }
  return 0;
}

static int test_arch(const zt_backend *be, zt_arch arch) {
  int fails = 0;
  zt_model_cfg mc = model_cfg(arch);
  zt_train_cfg tc = train_cfg(ZT_F32, 0, 0);
  size_t per_step = (size_t)tc.grad_accum * tc.micro_batch * (mc.seq_len + 1);
  int32_t *tok = malloc(per_step * STEPS * sizeof *tok);
  uint64_t seed = 5;
  /* rows counting up in steps of 3 from a random start (mod vocab): learnable in 20 steps */
  for (size_t r = 0; r < per_step * STEPS / (size_t)(mc.seq_len + 1); r++) {
    int32_t start = (int32_t)(mc_next(&seed) % (uint64_t)mc.vocab);
    for (int j = 0; j <= mc.seq_len; j++)
      tok[r * (size_t)(mc.seq_len + 1) + (size_t)j] = (start + 3 * j) % mc.vocab;
  }
  run f32, bf16, f16, bf16_ck, tf;
  const char *a = zt_arch_name(arch);
  fails += train(be, arch, ZT_F32, 0, 0, tok, &f32);
  fails += train(be, arch, ZT_BF16, 0, 0, tok, &bf16);
  fails += train(be, arch, ZT_F16, 0, 0, tok, &f16);
  fails += train(be, arch, ZT_BF16, 0, 1, tok, &bf16_ck);
  fails += train(be, arch, ZT_F32, 1, 0, tok, &tf);
  if (fails) goto out;
  printf("%s losses per step (fp32 | bf16 | fp16 | bf16 ckpt | fp32 tf32):\n", a);
  for (int s = 0; s < STEPS; s++)
    printf("  %2d  %.6f  %.6f  %.6f  %.6f  %.6f\n", s + 1, f32.loss[s], bf16.loss[s],
           f16.loss[s], bf16_ck.loss[s], tf.loss[s]);
  char what[96];
  snprintf(what, sizeof what, "%s bf16 vs fp32", a);
  fails += compare(what, &f32, &bf16, 2e-2);
  snprintf(what, sizeof what, "%s fp16 vs fp32", a);
  fails += compare(what, &f32, &f16, 5e-3);
  snprintf(what, sizeof what, "%s fp32 tf32 vs fp32", a);
  fails += compare(what, &f32, &tf, 5e-3);
  fails += MC_EXPECT(f16.skipped == 0, "%s fp16: %d of %d steps skipped (loss scale now %g): "
                     "the default scale overflowed on this model", a, f16.skipped, STEPS,
                     (double)f16.last_scale);
  fails += MC_EXPECT(f32.loss[STEPS - 1] < 0.8 * f32.loss[0], "%s fp32 did not learn: %.4f -> "
                     "%.4f", a, f32.loss[0], f32.loss[STEPS - 1]);
  int same = memcmp(bf16.loss, bf16_ck.loss, sizeof bf16.loss) == 0 &&
             memcmp(bf16.params, bf16_ck.params, bf16.n * sizeof(float)) == 0;
  printf("%-34s losses and parameters %s; backend bytes %zu -> %zu  %s\n",
         "bf16 checkpointing on vs off", same ? "bitwise equal" : "DIFFERENT",
         bf16.backend_bytes, bf16_ck.backend_bytes,
         same && bf16_ck.backend_bytes < bf16.backend_bytes ? "ok" : "FAIL");
  fails += MC_EXPECT(same && bf16_ck.backend_bytes < bf16.backend_bytes,
                     "%s bf16: activation checkpointing changed the results or saved no memory", a);
  /* bf16 activations take half the bytes: the whole trainer must be smaller than fp32's */
  fails += MC_EXPECT(bf16.backend_bytes < f32.backend_bytes, "%s: bf16 holds %zu bytes, fp32 %zu",
                     a, bf16.backend_bytes, f32.backend_bytes);
out:
  free(f32.params), free(bf16.params), free(f16.params), free(bf16_ck.params), free(tf.params);
  free(tok);
  return fails;
}

int main(void) {
  int count = 0;
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    printf("no CUDA device: skipped\n");
    return 77;
  }
  zt_backend be;
  if (zt_backend_cuda_open(&be, 0) < 0) {
    fprintf(stderr, "FAIL: cannot open the cuda backend\n");
    return 1;
  }
  int fails = test_arch(&be, ZT_ARCH_GPT) + test_arch(&be, ZT_ARCH_ENCODER) +
              test_arch(&be, ZT_ARCH_LLAMA);
  zt_backend_cuda_close(&be);
  printf("%s\n", fails ? "FAIL" : "PASS");
  return fails ? 1 : 0;
}
