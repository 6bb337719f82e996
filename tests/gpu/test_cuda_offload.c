/* The offloaded step on the cuda backend against the cuda run without offload, for both archs in
 * fp32, bf16 and fp16 (V 256, T 64, C 128, NH 4, L 4, B 4, grad_accum 2, clipping on and off),
 * with every unit resident (the step's gradient sums on the device, and on the host), streamed
 * from the host within the smallest budget that opens, and
 * with the optimizer state on NVMe, and with the first two units' optimizer on the device:
 * per-step losses within TOL_F32 / TOL_LP relative (the AdamW runs on the CPU there, on the GPU
 * here: the same formula, rounded differently); the arena's peak within its budget; the host
 * tier page-locked and within its size; and the bytes copied to the device exactly the pieces
 * the units' ops read (bf16/fp16: 2 bytes a matmul weight). fp16: step SKIP_AT runs at a loss
 * scale far past fp16 in both trainers, which must both skip it (the scale halved), the
 * offloaded one changing no parameter or moment for it and, resident, fetching nothing again
 * after it. The delayed update (offload.delayed_update), streamed: losses within the same
 * tolerances of the cpu backend's delayed run, and ten times further from the undelayed run's.
 * offload.order unit, resident with the sums on the host and streamed (clipped): the same
 * tolerances; the bytes to the device exactly the pieces once a step (a head that reads the
 * embedding keeps its backward micro-major: the running sums too), the gradients to the host
 * exactly once a step (also resident micro-major with the sums on the device), streamed at
 * most the pieces twice a step. bf16 AdamW moments (train.optimizer.state_dtype), gpt and llama
 * in fp32 and bf16 compute, streamed, on NVMe and with device units (their update the CUDA
 * adamw_sr): within TOL_LP. Exits 77 without a GPU. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/cuda/cuda_backend.h"
#include "engine/plan/offload_plan.h"
#include "engine/train/offload/offload.h"
#include "engine/train/trainer_internal.h"
#include "offload/nvme_store.h"
#include "tests/unit/model/mcheck.h"

#define STEPS 10
#define B 4
#define GA 2
#define TOL_F32 1e-4
#define TOL_LP 5e-3 /* bf16 and fp16 */
#define SKIP_AT 5    /* fp16: the step (0-based) forced to overflow */
#define SKIP_SCALE 0x1p40f

static zt_dtype g_sd = ZT_F32; /* train.optimizer.state_dtype of the cases that follow */

/* An offloaded trainer opened with the planner's plan (the open checks a plan, never searches). */
static int open_planned(zt_trainer **t, const zt_model_cfg *mc, const zt_train_cfg *tc,
                        const zt_offload_cfg *oc, const zt_backend *be, char *err,
                        size_t errlen) {
  zt_offload_placement p;
  int rc = zt_offload_plan_make(mc, tc, oc, be->ops, &p, err, errlen);
  return rc < 0 ? rc : zt_trainer_open_offload(t, mc, tc, oc, &p, be, err, errlen);
}

static zt_model_cfg model_cfg(zt_arch arch) {
  zt_model_cfg c = {.arch = arch, .vocab = 256, .seq_len = 64, .d_model = 128, .n_heads = 4,
                    .n_layers = 4, .d_ff = arch == ZT_ARCH_ENCODER ? 512 : 0, .init_seed = 42};
  if (arch == ZT_ARCH_LLAMA) { /* GQA 4:2, tied: the head streams with the embedding unit */
    c.n_kv_heads = 2;
    c.rms_eps = 1e-5f;
    c.rope_theta = 10000.0f;
    c.tie_embeddings = 1;
  }
  return c;
}

static zt_train_cfg train_cfg(zt_dtype dt, float clip) {
  zt_train_cfg c = mc_train(B, GA);
  c.steps = STEPS;
  c.lr = 1e-3f;
  c.beta2 = 0.95f;
  c.weight_decay = 0.1f;
  c.schedule = ZT_SCHED_COSINE;
  c.warmup_steps = 3;
  c.min_lr = 1e-4f;
  c.grad_clip = clip;
  c.precision = dt;
  c.state_dtype = g_sd;
  if (g_sd == ZT_BF16) c.seed = 3; /* the rounding bits' */
  return c;
}

/* A state copy of the offloaded trainer (parameters, m, v), to see that a skipped step changed
 * nothing. */
typedef struct state {
  float *x[3];
} state;

static int state_get(zt_trainer *t, state *st) {
  size_t n = zt_model_num_params(zt_trainer_model(t));
  for (int i = 0; i < 3; i++)
    if (!(st->x[i] = malloc(n * sizeof(float)))) return -1;
  return zt_trainer_get_state(t, st->x[0], st->x[1], st->x[2]);
}

static void state_free(state *st) {
  for (int i = 0; i < 3; i++) free(st->x[i]);
}

/* fp16: step SKIP_AT at SKIP_SCALE; after it the scale is put back to GradScaler's initial one
 * so that the other steps train. off: the offloaded trainer, whose state the skipped step must
 * leave as it was. */
static int train(zt_trainer *t, const int32_t *tok, double *loss, int off, const char *what) {
  char err[512];
  int fails = 0;
  size_t per = zt_trainer_micro_tokens(t) * GA;
  int fp16 = t->tc.precision == ZT_F16;
  for (int s = 0; s < STEPS; s++) {
    zt_step_result r;
    state before = {{NULL}}, after = {{NULL}};
    if (fp16 && s == SKIP_AT) {
      t->scaler.scale = SKIP_SCALE;
      if (off) fails += MC_EXPECT(state_get(t, &before) == 0, "%s: state before", what);
    }
    if (MC_EXPECT(zt_trainer_step(t, tok + per * (size_t)s, &r, err, sizeof err) == 0,
                  "%s: step %d: %s", what, s + 1, err)) {
      state_free(&before);
      return fails + 1;
    }
    loss[s] = r.loss;
    if (fp16)
      fails += MC_EXPECT(r.skipped == (s == SKIP_AT) &&
                             r.loss_scale == (s == SKIP_AT ? SKIP_SCALE / 2 : ZT_LOSS_SCALE_INIT),
                         "%s: step %d skipped %d, scale %g", what, s + 1, r.skipped,
                         (double)r.loss_scale);
    if (fp16 && s == SKIP_AT) {
      t->scaler.scale = ZT_LOSS_SCALE_INIT;
      if (off) {
        size_t bytes = zt_model_num_params(zt_trainer_model(t)) * sizeof(float);
        fails += MC_EXPECT(state_get(t, &after) == 0, "%s: state after", what);
        for (int i = 0; i < 3 && before.x[i] && after.x[i]; i++)
          fails += MC_EXPECT(!memcmp(before.x[i], after.x[i], bytes), "%s: the skipped step "
                             "changed the %s", what, i == 0 ? "parameters" : "moments");
      }
    }
    state_free(&before);
    state_free(&after);
  }
  return fails;
}

/* The bytes one fetch of every unit moves: each tensor's fp32 and/or compute copy. */
static uint64_t piece_bytes(const zt_model_cfg *mc, zt_dtype dt) {
  char err[256];
  zt_model *m = NULL;
  if (zt_model_create(&m, mc, err, sizeof err) < 0) return 0;
  uint64_t sum = 0;
  for (int i = 0; i < zt_model_num_tensors(m); i++) {
    const zt_tensor_info *ti = zt_model_tensor(m, i);
    if (dt == ZT_F32) sum += ti->numel * 4;
    else sum += ti->numel * (((ti->reads & ZT_READS_F32) ? 4 : 0) + ((ti->reads & ZT_READS_LP) ? 2 : 0));
  }
  zt_model_destroy(m);
  return sum;
}

/* params host within the smallest gpu_budget that opens, found by the estimate (no allocation) */
static void stream_within_least(const zt_backend *gpu, const zt_model_cfg *mc,
                                const zt_train_cfg *tc, zt_offload_cfg *oc) {
  char err[512];
  zt_offload_plan plan;
  size_t lo = 1, hi;
  oc->params = ZT_PLACE_GPU;
  zt_offload_estimate(mc, tc, oc, gpu->ops, &plan, err, sizeof err);
  hi = plan.device_bytes;
  oc->params = ZT_PLACE_HOST;
  while (hi - lo > 1) {
    oc->gpu_budget = lo + (hi - lo) / 2;
    if (zt_offload_estimate(mc, tc, oc, gpu->ops, &plan, err, sizeof err) == 0)
      hi = oc->gpu_budget;
    else
      lo = oc->gpu_budget;
  }
  oc->gpu_budget = hi;
}

typedef enum placement {
  RESIDENT, SUMS_HOST, STREAMED, OPT_NVME, DEVICE_UNITS, UNIT_SUMS_HOST, UNIT_STREAMED
} placement;
static const char *const placement_names[] = {"resident", "resident, sums on the host",
                                              "streamed", "optimizer nvme",
                                              "2 device units, streamed",
                                              "unit-major, resident, sums on the host",
                                              "unit-major, streamed"};

static int check(const zt_backend *gpu, zt_arch arch, zt_dtype dt, float clip, placement pl,
                 const char *tmp) {
  char err[512], what[160];
  int fails = 0;
  zt_model_cfg mc = model_cfg(arch);
  zt_train_cfg tc = train_cfg(dt, clip);
  snprintf(what, sizeof what, "%s %s clip %g %s%s", zt_arch_name(arch), zt_dtype_name(dt), clip,
           placement_names[pl], g_sd == ZT_BF16 ? ", bf16 moments" : "");
  uint64_t seed = 5 + (uint64_t)arch;
  size_t per = (size_t)GA * B * (mc.seq_len + 1);
  int32_t *tok = malloc(STEPS * per * sizeof *tok);
  if (!tok) return 1;
  mc_tokens(&seed, tok, STEPS * per, mc.vocab);
  zt_offload_cfg oc;
  zt_offload_cfg_defaults(&oc);
  oc.prefetch = pl == DEVICE_UNITS ? 0 : 2; /* four streamed units must still evict */
  if (pl == OPT_NVME) {
    oc.optimizer = ZT_PLACE_NVME;
    snprintf(oc.nvme_dir, sizeof oc.nvme_dir, "%s", tmp);
  }
  zt_trainer *a = NULL, *b = NULL;
  double ref[STEPS], off[STEPS];
  if (pl == DEVICE_UNITS) oc.gpu_units = 2;
  int unit = pl == UNIT_SUMS_HOST || pl == UNIT_STREAMED;
  if (unit) oc.order = ZT_ORDER_UNIT;
  if (pl == SUMS_HOST || pl == UNIT_SUMS_HOST) oc.grads = ZT_PLACE_HOST;
  int resident = pl == RESIDENT || pl == SUMS_HOST || pl == UNIT_SUMS_HOST;
  if (!resident) stream_within_least(gpu, &mc, &tc, &oc);
  if (MC_EXPECT(zt_trainer_open(&a, &mc, &tc, gpu, err, sizeof err) == 0, "%s: %s", what, err) ||
      MC_EXPECT(open_planned(&b, &mc, &tc, &oc, gpu, err, sizeof err) == 0, "%s: %s",
                what, err)) {
    fails++;
    goto out;
  }
  fails += train(a, tok, ref, 0, what) + train(b, tok, off, 1, what);
  /* bf16 moments: rounded stochastically from fp32 values that differ between the two */
  double worst = 0, tol = dt == ZT_F32 && g_sd == ZT_F32 ? TOL_F32 : TOL_LP;
  for (int s = 0; s < STEPS; s++) {
    double rel = fabs(off[s] - ref[s]) / fabs(ref[s]);
    if (rel > worst) worst = rel;
  }
  fails += MC_EXPECT(worst <= tol, "%s: losses differ by %.3g relative (limit %g)", what, worst,
                     tol);
  zt_offload_stats st;
  zt_trainer_offload_stats(b, &st);
  fails += MC_EXPECT(st.arena_peak <= st.arena_budget, "%s: arena peak %zu over its budget %zu",
                     what, st.arena_peak, st.arena_budget);
  fails += MC_EXPECT(st.host_used <= st.host_bytes && st.host_pinned == st.host_used,
                     "%s: host tier %zu bytes used, %zu pinned, size %zu", what, st.host_used,
                     st.host_pinned, st.host_bytes);
  /* fp16: one step skipped, which updates nothing and leaves the device copies valid */
  int skipped = dt == ZT_F16;
  /* unit-major with a head that does not read the embedding: each unit's gradients summed over
   * the micro-batches on the device and sent to the host once a step, nothing resumed */
  int once = unit && zt_offload_backward_unit_major(zt_trainer_model(b));
  fails += MC_EXPECT(st.unit_major == unit, "%s: unit-major %d", what, st.unit_major);
  uint64_t grads = piece_bytes(&mc, ZT_F32);
  if (resident) {
    /* the pieces once a step but after the skipped one; with the sums on the host (without a
     * budget auto keeps them on the device) from the second micro-batch on each unit's running
     * sum, but unit-major */
    zt_offload_place sums = pl == RESIDENT ? ZT_PLACE_GPU : ZT_PLACE_HOST;
    uint64_t want = (STEPS - skipped) * piece_bytes(&mc, dt) +
                    (sums == ZT_PLACE_HOST && !once ? STEPS * (GA - 1) * grads : 0);
    fails += MC_EXPECT(st.grads == sums, "%s: gradient sums on the %s", what,
                       zt_offload_place_name(st.grads));
    fails += MC_EXPECT(st.bytes_h2d == want, "%s: %llu bytes to the device, the pieces are %llu",
                       what, (unsigned long long)st.bytes_h2d, (unsigned long long)want);
  } else {
    fails += MC_EXPECT(st.evictions > 0, "%s: nothing evicted: not streamed", what);
  }
  /* the gradients once a step exactly; streamed unit-major, the pieces at most twice a step
   * (once for the forward of both micro-batches, once for their backward) */
  if (once || pl == RESIDENT)
    fails += MC_EXPECT(st.bytes_d2h == STEPS * grads, "%s: %llu bytes to the host, the "
                       "gradients once a step are %llu", what, (unsigned long long)st.bytes_d2h,
                       (unsigned long long)(STEPS * grads));
  if (once && pl == UNIT_STREAMED)
    fails += MC_EXPECT(st.bytes_h2d <= 2 * STEPS * piece_bytes(&mc, dt), "%s: %llu bytes to "
                       "the device, more than the pieces twice a step (%llu)", what,
                       (unsigned long long)st.bytes_h2d,
                       (unsigned long long)(2 * STEPS * piece_bytes(&mc, dt)));
  fails += MC_EXPECT(st.gpu_units == (pl == DEVICE_UNITS ? 2 : 0) &&
                     st.gpu_unit_updates == (uint64_t)(STEPS - skipped) * st.gpu_units,
                     "%s: %d device units, %llu updates", what, st.gpu_units,
                     (unsigned long long)st.gpu_unit_updates);
  printf("%-40s max loss difference %.3g, h2d %llu, d2h %llu bytes, arena peak %zu of %zu\n",
         what, worst, (unsigned long long)st.bytes_h2d, (unsigned long long)st.bytes_d2h,
         st.arena_peak, st.arena_budget);
out:
  zt_trainer_close(a);
  zt_trainer_close(b);
  free(tok);
  return fails;
}

/* The delayed update streamed on the GPU against the cpu backend's (every unit resident: the
 * placement does not change the math), and against the GPU's undelayed run, which it must not
 * match. */
static int check_delayed(const zt_backend *gpu, zt_arch arch, zt_dtype dt) {
  char err[512], what[160];
  int fails = 0;
  zt_model_cfg mc = model_cfg(arch);
  zt_train_cfg tc = train_cfg(dt, 1.0f);
  snprintf(what, sizeof what, "%s %s clip 1 delayed update, streamed", zt_arch_name(arch),
           zt_dtype_name(dt));
  uint64_t seed = 9 + (uint64_t)arch;
  size_t per = (size_t)GA * B * (mc.seq_len + 1);
  int32_t *tok = malloc(STEPS * per * sizeof *tok);
  if (!tok) return 1;
  mc_tokens(&seed, tok, STEPS * per, mc.vocab);
  zt_backend cpu;
  if (MC_EXPECT(zt_backend_cpu_open(&cpu, 4) == 0, "%s: cpu backend", what)) {
    free(tok);
    return 1;
  }
  zt_offload_cfg on_cpu, on_gpu, undelayed;
  zt_offload_cfg_defaults(&on_cpu);
  on_cpu.delayed_update = 1;
  on_gpu = on_cpu;
  on_gpu.prefetch = 2;
  stream_within_least(gpu, &mc, &tc, &on_gpu);
  undelayed = on_gpu;
  undelayed.delayed_update = 0;
  zt_trainer *ref = NULL, *t = NULL, *plain = NULL;
  double want[STEPS], got[STEPS], other[STEPS];
  if (MC_EXPECT(open_planned(&ref, &mc, &tc, &on_cpu, &cpu, err, sizeof err) == 0,
                "%s: cpu: %s", what, err) ||
      MC_EXPECT(open_planned(&t, &mc, &tc, &on_gpu, gpu, err, sizeof err) == 0,
                "%s: %s", what, err) ||
      MC_EXPECT(open_planned(&plain, &mc, &tc, &undelayed, gpu, err, sizeof err) == 0,
                "%s: undelayed: %s", what, err)) {
    fails++;
    goto out;
  }
  fails += train(ref, tok, want, 0, what) + train(t, tok, got, 0, what) +
           train(plain, tok, other, 0, what);
  double worst = 0, apart = 0, tol = dt == ZT_F32 ? TOL_F32 : TOL_LP;
  for (int s = 0; s < STEPS; s++) {
    double rel = fabs(got[s] - want[s]) / fabs(want[s]);
    double away = fabs(got[s] - other[s]) / fabs(other[s]);
    if (rel > worst) worst = rel;
    if (away > apart) apart = away;
  }
  fails += MC_EXPECT(worst <= tol, "%s: losses differ from the cpu backend's by %.3g relative "
                     "(limit %g)", what, worst, tol);
  /* the delay moves the losses (2e-4 to 2e-3 here) far more than the backends differ */
  fails += MC_EXPECT(apart > 10 * worst && apart > 1e-5,
                     "%s: losses within %.3g of the undelayed run's (%.3g of the cpu backend's): "
                     "no delay", what, apart, worst);
  zt_offload_stats st;
  zt_trainer_offload_stats(t, &st);
  fails += MC_EXPECT(st.arena_peak <= st.arena_budget && st.evictions > 0,
                     "%s: arena peak %zu of %zu, %llu evictions", what, st.arena_peak,
                     st.arena_budget, (unsigned long long)st.evictions);
  printf("%-40s max loss difference from the cpu backend %.3g, from the undelayed run %.3g\n",
         what, worst, apart);
out:
  zt_trainer_close(ref);
  zt_trainer_close(t);
  zt_trainer_close(plain);
  zt_backend_cpu_close(&cpu);
  free(tok);
  return fails;
}

int main(void) {
  zt_backend gpu;
  int rc = zt_backend_cuda_open(&gpu, 0);
  if (rc == -ENODEV) {
    fprintf(stderr, "SKIP: no CUDA device\n");
    return 77;
  }
  if (rc < 0) {
    fprintf(stderr, "FAIL: zt_backend_cuda_open: %d\n", rc);
    return 1;
  }
  const char *tmp = mc_tmpdir();
  zt_nvme_store *probe = NULL;
  char err[256];
  int have_uring = zt_nvme_store_open(&probe, tmp, NULL, err, sizeof err) == 0;
  zt_nvme_store_close(probe);
  int fails = 0;
  zt_arch archs[] = {ZT_ARCH_GPT, ZT_ARCH_ENCODER, ZT_ARCH_LLAMA};
  zt_dtype dts[] = {ZT_F32, ZT_BF16, ZT_F16};
  for (int i = 0; i < (int)(sizeof archs / sizeof archs[0]); i++)
    for (int d = 0; d < 3; d++) {
      fails += check(&gpu, archs[i], dts[d], 0, RESIDENT, tmp);
      fails += check(&gpu, archs[i], dts[d], 0, SUMS_HOST, tmp);
      fails += check(&gpu, archs[i], dts[d], 1.0f, STREAMED, tmp);
      if (have_uring) fails += check(&gpu, archs[i], dts[d], 0, OPT_NVME, tmp);
      fails += check(&gpu, archs[i], dts[d], 1.0f, DEVICE_UNITS, tmp);
      fails += check(&gpu, archs[i], dts[d], 0, UNIT_SUMS_HOST, tmp);
      fails += check(&gpu, archs[i], dts[d], 1.0f, UNIT_STREAMED, tmp);
      fails += check_delayed(&gpu, archs[i], dts[d]);
    }
  g_sd = ZT_BF16;
  for (int i = 0; i < (int)(sizeof archs / sizeof archs[0]); i++)
    for (int d = 0; d < 2 && archs[i] != ZT_ARCH_ENCODER; d++) {
      fails += check(&gpu, archs[i], dts[d], 1.0f, STREAMED, tmp);
      if (have_uring) fails += check(&gpu, archs[i], dts[d], 0, OPT_NVME, tmp);
      fails += check(&gpu, archs[i], dts[d], 1.0f, DEVICE_UNITS, tmp);
    }
  g_sd = ZT_F32;
  if (!have_uring) printf("optimizer nvme cases skipped: io_uring unavailable (%s)\n", err);
  zt_backend_cuda_close(&gpu);
  mc_rmtree(tmp);
  if (fails) fprintf(stderr, "%d failure(s)\n", fails);
  return fails ? 1 : 0;
}
