/* Data parallelism on two GPUs (engine/train/dp/dp.h over NCCL): for both archs in fp32, bf16 and
 * fp16 (the loss scale as the one GPU's), ZeRO stages 1, 2 and 3 with two ranks (micro-batch B each) against one GPU with grad_accum 2 on
 * the same tokens, STEPS steps: per-step losses within TOL_F32 / TOL_BF16 relative (NCCL adds
 * the two ranks' gradients where one GPU adds two micro-batches, and bf16 rounds what follows),
 * and the first step's loss bitwise (nothing has been reduced yet). Each rank's backend bytes
 * fall with the stage. Each stage offloaded (the optimizer on the host for all units or all but
 * the leading ones, stage 3 with the parameters on the host too) gives the losses of the same
 * stage on the devices within the tolerance, with fewer device bytes (the estimates exact), and
 * so does the optimizer on NVMe per rank (the files' bytes the estimate, read and written), at
 * stage 3 with the parameters read from those files too (params nvme: more read than the
 * update's once-a-step pass over the files).
 * Each stage with grad_accum 2 per rank runs twice with the same bits (the collectives overlap
 * the compute on the communicator's queue: a missing order would show) and within the
 * tolerance of one GPU with grad_accum 4 (its first loss bitwise), in micro order and in unit
 * order (offload.order unit, dp.h "Unit-major").
 * Each stage's per-rank checkpoint (rank files written by both GPUs at once) resumes bitwise,
 * and loads into a one-GPU trainer with the state gathered from the GPUs bit for bit.
 * Skips (77) with fewer than two GPUs or without NCCL. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/comm/comm_nccl.h"
#include "engine/kernels/backend.h"
#include "engine/train/dp/dp.h"
#include "offload/nvme_store.h"
#include "tests/unit/model/mcheck.h"

#define W 2
#define STEPS 8
#define B 4
#define TOL_F32 1e-5
#define TOL_BF16 5e-3

static zt_comm_nccl_id g_id;
static zt_dp_rank g_ranks[W];

typedef struct opener {
  int r, rc;
  char err[512];
} opener;

/* ncclCommInitRank blocks until both ranks call it: one thread each. */
static void *open_comm(void *p) {
  opener *o = p;
  o->rc = zt_comm_nccl_open(&g_ranks[o->r].comm, W, o->r, &g_id, o->r, NULL, o->err,
                            sizeof o->err);
  return NULL;
}

static zt_model_cfg model_cfg(zt_arch arch) {
  zt_model_cfg c = {.arch = arch, .vocab = 256, .seq_len = 64, .d_model = 128, .n_heads = 4,
                    .n_layers = 8, .d_ff = arch == ZT_ARCH_ENCODER ? 512 : 0, .init_seed = 42};
  return c;
}

static zt_train_cfg train_cfg(zt_dtype dt, int grad_accum) {
  zt_train_cfg c = mc_train(B, grad_accum);
  c.steps = STEPS;
  c.lr = 1e-3f;
  c.weight_decay = 0.1f;
  c.grad_clip = 1.0f;
  c.precision = dt;
  return c;
}

/* Runs steps [s0, s1) of the tokens; their losses into loss[s0..]. */
static int steps(zt_trainer *t, const int32_t *tok, size_t per, int s0, int s1, double *loss,
                 const char *what) {
  char err[512];
  for (int s = s0; s < s1; s++) {
    zt_step_result r;
    if (MC_EXPECT(zt_trainer_step(t, tok + per * (size_t)s, &r, err, sizeof err) == 0,
                  "%s: step %d: %s", what, s + 1, err))
      return 1;
    loss[s] = r.loss;
  }
  return 0;
}

static int train(zt_trainer *t, const int32_t *tok, size_t per, double *loss, const char *what) {
  return steps(t, tok, per, 0, STEPS, loss, what);
}

/* The collectives overlap the compute on the communicator's queue (dp.h): an order missing
 * between the two would change the bits from run to run, so the stage runs again, with
 * grad_accum 2 per rank (a later micro-batch's reduced chunk is added one unit late), twice:
 * bitwise the same, and within the tolerance of one GPU with grad_accum 4 on the same tokens
 * (each step takes two of `per`); in micro order and in unit order. */
static int reproducible(const zt_model_cfg *mc, zt_dtype dt, int stage, const int32_t *tok,
                        size_t per, const char *what) {
  char err[512], name[192];
  int fails = 0, n = STEPS / 2;
  double ref[STEPS], got[2][STEPS];
  zt_train_cfg one = train_cfg(dt, 2 * W), per_rank = train_cfg(dt, 2);
  zt_trainer *t = NULL;
  snprintf(name, sizeof name, "%s, one GPU grad_accum 4", what);
  zt_backend_bind_thread(&g_ranks[0].be);
  if (MC_EXPECT(zt_trainer_open(&t, mc, &one, &g_ranks[0].be, err, sizeof err) == 0, "%s: %s",
                name, err))
    return 1;
  fails += steps(t, tok, 2 * per, 0, n, ref, name);
  zt_trainer_close(t);
  /* micro order, then offload.order unit (dp.h "Unit-major": each unit gathered once a pass,
   * its micro-batches' gradients summed before one reduction where the head does not read the
   * embedding) */
  static const zt_offload_order orders[] = {ZT_ORDER_MICRO, ZT_ORDER_UNIT};
  for (int o = 0; o < 2; o++) {
    zt_dp_cfg dpc = {.world = W, .zero_stage = stage, .order = orders[o]};
    const char *on = o ? "unit order" : "micro order";
    for (int i = 0; i < 2; i++) {
      snprintf(name, sizeof name, "%s, grad_accum 2 per rank, %s, run %d", what, on, i + 1);
      if (MC_EXPECT(zt_trainer_open_dp(&t, mc, &per_rank, &dpc, g_ranks, err, sizeof err) == 0,
                    "%s: %s", name, err))
        return fails + 1;
      fails += steps(t, tok, 2 * per, 0, n, got[i], name);
      zt_trainer_close(t);
    }
    double worst = 0, tol = dt == ZT_F32 ? TOL_F32 : TOL_BF16;
    for (int s = 0; s < n; s++) {
      fails += MC_EXPECT(got[0][s] == got[1][s], "%s, %s: step %d loss %.17g, then %.17g",
                         what, on, s + 1, got[0][s], got[1][s]);
      double rel = fabs(got[0][s] - ref[s]) / fabs(ref[s]);
      if (rel > worst) worst = rel;
    }
    fails += MC_EXPECT(got[0][0] == ref[0], "%s, %s: first loss %.17g, one GPU's %.17g", what,
                       on, got[0][0], ref[0]);
    fails += MC_EXPECT(worst <= tol, "%s, grad_accum 2 per rank, %s: losses differ from one "
                       "GPU's by %.3g relative (limit %g)", what, on, worst, tol);
  }
  return fails;
}

/* The stage's per-rank checkpoint after half the steps: a new two-GPU trainer resumes from it
 * with the losses of the run that wrote it, bitwise; a one-GPU trainer loads the state that
 * the two-GPU one gathers, bit for bit. */
static int resumed(const zt_model_cfg *mc, const zt_train_cfg *tc, int stage, const int32_t *tok,
                   size_t per, const char *tmp, const char *what) {
  char err[512], dir[600];
  int fails = 0, half = STEPS / 2;
  size_t n = 0;
  double want[STEPS], got[STEPS];
  float *x[6] = {NULL};
  zt_dp_cfg dpc = {.world = W, .zero_stage = stage};
  zt_trainer *a = NULL, *b = NULL, *one = NULL;
  snprintf(dir, sizeof dir, "%s/stage%d", tmp, stage);
  if (MC_EXPECT(zt_trainer_open_dp(&a, mc, tc, &dpc, g_ranks, err, sizeof err) == 0, "%s: %s",
                what, err) ||
      steps(a, tok, per, 0, half, want, what) ||
      MC_EXPECT(zt_trainer_save(a, dir, err, sizeof err) == 0, "%s: save: %s", what, err) ||
      steps(a, tok, per, half, STEPS, want, what) ||
      MC_EXPECT(zt_trainer_open_dp(&b, mc, tc, &dpc, g_ranks, err, sizeof err) == 0, "%s: %s",
                what, err) ||
      MC_EXPECT(zt_trainer_load(b, dir, err, sizeof err) == 0, "%s: load: %s", what, err)) {
    fails++;
    goto out;
  }
  n = zt_model_num_params(zt_trainer_model(b));
  for (int i = 0; i < 6; i++)
    if (!(x[i] = malloc(n * sizeof(float)))) {
      fails++;
      goto out;
    }
  zt_backend_bind_thread(&g_ranks[0].be);
  if (MC_EXPECT(zt_trainer_get_state(b, x[0], x[1], x[2]) == 0, "%s: get_state", what) ||
      MC_EXPECT(zt_trainer_open(&one, mc, tc, &g_ranks[0].be, err, sizeof err) == 0,
                "%s: one GPU: %s", what, err) ||
      MC_EXPECT(zt_trainer_load(one, dir, err, sizeof err) == 0, "%s: one GPU load: %s", what,
                err) ||
      MC_EXPECT(zt_trainer_get_state(one, x[3], x[4], x[5]) == 0, "%s: one GPU state", what)) {
    fails++;
    goto out;
  }
  for (int i = 0; i < 3; i++)
    fails += MC_EXPECT(!memcmp(x[i], x[3 + i], n * sizeof(float)), "%s: the one-GPU trainer "
                       "loaded other %s", what, i == 0 ? "parameters" : "moments");
  if ((fails += steps(b, tok, per, half, STEPS, got, what)) == 0)
    for (int s = half; s < STEPS; s++)
      fails += MC_EXPECT(got[s] == want[s], "%s: resumed step %d loss %.17g, the run %.17g",
                         what, s + 1, got[s], want[s]);
  printf("%-28s per-rank checkpoint: resumed bitwise, one GPU loads the same state\n", what);
out:
  for (int i = 0; i < 6; i++) free(x[i]);
  zt_trainer_close(a);
  zt_trainer_close(b);
  zt_trainer_close(one);
  return fails;
}

/* The stage's offloaded placements (dp.h "Offload") against its run on the devices: the same
 * losses within the tolerance (the host's AdamW and norm round otherwise than the GPU's), fewer
 * device bytes, a host tier; with the optimizer on NVMe (nvme_dir non-NULL: io_uring works
 * there) each rank's files of the estimated size, read and written (params nvme: read more
 * than the update's pass over them, the gathers reading the parameters from them too). */
static int offloaded(const zt_model_cfg *mc, const zt_train_cfg *tc, int stage,
                     const int32_t *tok, size_t per, const double *ref, size_t dev_bytes,
                     const char *on_device, const char *nvme_dir) {
  static const struct {
    zt_offload_place optimizer, params;
    int gpu_units, stage3;
  } places[] = {{ZT_PLACE_HOST, ZT_PLACE_GPU, 0, 0}, {ZT_PLACE_HOST, ZT_PLACE_GPU, 4, 0},
                {ZT_PLACE_HOST, ZT_PLACE_HOST, 0, 1}, {ZT_PLACE_HOST, ZT_PLACE_HOST, 3, 1},
                {ZT_PLACE_NVME, ZT_PLACE_GPU, 0, 0}, {ZT_PLACE_NVME, ZT_PLACE_GPU, 4, 0},
                {ZT_PLACE_NVME, ZT_PLACE_HOST, 2, 1}, {ZT_PLACE_NVME, ZT_PLACE_NVME, 0, 1},
                {ZT_PLACE_NVME, ZT_PLACE_NVME, 3, 1}};
  char err[512], what[160];
  int fails = 0;
  for (size_t i = 0; i < sizeof places / sizeof places[0]; i++) {
    int nvme = places[i].optimizer == ZT_PLACE_NVME;
    if ((places[i].stage3 && stage != 3) || (nvme && !nvme_dir)) continue;
    zt_dp_cfg dpc = {.world = W, .zero_stage = stage, .optimizer = places[i].optimizer,
                     .params = places[i].params, .gpu_units = places[i].gpu_units,
                     .nvme_dir = nvme ? nvme_dir : NULL};
    zt_trainer *t = NULL;
    snprintf(what, sizeof what, "%s, optimizer %s (gpu_units %d) params %s", on_device,
             zt_offload_place_name(places[i].optimizer), places[i].gpu_units,
             zt_offload_place_name(places[i].params));
    if (MC_EXPECT(zt_trainer_open_dp(&t, mc, tc, &dpc, g_ranks, err, sizeof err) == 0,
                  "%s: %s", what, err))
      return fails + 1;
    double got[STEPS], worst = 0, tol = tc->precision == ZT_F32 ? TOL_F32 : TOL_BF16;
    fails += train(t, tok, per, got, what);
    for (int s = 0; s < STEPS; s++) {
      double rel = fabs(got[s] - ref[s]) / fabs(ref[s]);
      if (rel > worst) worst = rel;
    }
    size_t bytes = zt_trainer_dp_rank_bytes(t, 0), host = zt_trainer_dp_host_bytes(t, 1);
    fails += MC_EXPECT(worst <= tol && got[0] == ref[0], "%s: losses differ by %.3g relative "
                       "(limit %g), first %.17g vs %.17g", what, worst, tol, got[0], ref[0]);
    fails += MC_EXPECT(bytes < dev_bytes && host > 0 &&
                       host == zt_dp_estimate_host_bytes(mc, tc, &dpc) &&
                       bytes == zt_dp_estimate_rank_bytes(mc, tc, &dpc,
                                                          zt_backend_ops_of("cuda")),
                       "%s: rank bytes %zu (on the devices %zu), host bytes %zu", what, bytes,
                       dev_bytes, host);
    if (nvme) {
      zt_nvme_stats st = {0};
      uint64_t files = zt_trainer_dp_nvme_bytes(t, 1);
      fails += MC_EXPECT(files > 0 && files == zt_dp_estimate_nvme_bytes(mc, tc, &dpc) &&
                             zt_trainer_dp_nvme_stats(t, 1, &st) == 0 && st.bytes_read > 0 &&
                             st.bytes_written > files &&
                             (places[i].params != ZT_PLACE_NVME ||
                              st.bytes_read > STEPS * files),
                         "%s: rank 1's files %llu bytes, read %llu, written %llu", what,
                         (unsigned long long)files, (unsigned long long)st.bytes_read,
                         (unsigned long long)st.bytes_written);
    }
    printf("  %-70s max loss difference %.3g, rank 0 %zu device + %zu host bytes\n", what,
           worst, bytes, host);
    zt_trainer_close(t);
  }
  return fails;
}

static int check(zt_arch arch, zt_dtype dt, const char *tmp, const char *nvme_dir) {
  char err[512], what[96];
  int fails = 0;
  zt_model_cfg mc = model_cfg(arch);
  zt_train_cfg one = train_cfg(dt, W), per_rank = train_cfg(dt, 1);
  size_t per = (size_t)W * B * (mc.seq_len + 1);
  int32_t *tok = malloc(STEPS * per * sizeof *tok);
  uint64_t seed = 3 + (uint64_t)arch;
  if (!tok) return 1;
  mc_tokens(&seed, tok, STEPS * per, mc.vocab);
  double ref[STEPS], got[STEPS];
  zt_trainer *a = NULL;
  snprintf(what, sizeof what, "%s %s one GPU, grad_accum 2", zt_arch_name(arch),
           zt_dtype_name(dt));
  /* the backend ops run on the current device: the last backend opened made GPU 1 current */
  zt_backend_bind_thread(&g_ranks[0].be);
  if (MC_EXPECT(zt_trainer_open(&a, &mc, &one, &g_ranks[0].be, err, sizeof err) == 0, "%s: %s",
                what, err)) {
    free(tok);
    return 1;
  }
  fails += train(a, tok, per, ref, what);
  zt_trainer_close(a);
  size_t prev_bytes = SIZE_MAX;
  for (int stage = 1; stage <= 3; stage++) {
    zt_dp_cfg dpc = {.world = W, .zero_stage = stage};
    zt_trainer *t = NULL;
    snprintf(what, sizeof what, "%s %s 2 GPUs stage %d", zt_arch_name(arch), zt_dtype_name(dt),
             stage);
    if (MC_EXPECT(zt_trainer_open_dp(&t, &mc, &per_rank, &dpc, g_ranks, err, sizeof err) == 0,
                  "%s: %s", what, err)) {
      fails++;
      continue;
    }
    fails += train(t, tok, per, got, what);
    double worst = 0, tol = dt == ZT_F32 ? TOL_F32 : TOL_BF16; /* fp16 rounds finer than bf16 */
    for (int s = 0; s < STEPS; s++) {
      double rel = fabs(got[s] - ref[s]) / fabs(ref[s]);
      if (rel > worst) worst = rel;
    }
    fails += MC_EXPECT(worst <= tol, "%s: losses differ by %.3g relative (limit %g)", what,
                       worst, tol);
    fails += MC_EXPECT(got[0] == ref[0], "%s: first loss %.17g vs %.17g", what, got[0], ref[0]);
    size_t bytes = zt_trainer_dp_rank_bytes(t, 0);
    fails += MC_EXPECT(bytes < prev_bytes, "%s: rank 0 holds %zu bytes, stage %d held %zu",
                       what, bytes, stage - 1, prev_bytes);
    prev_bytes = bytes;
    printf("%-28s max loss difference %.3g, rank 0 backend bytes %zu\n", what, worst, bytes);
    zt_trainer_close(t);
    fails += reproducible(&mc, dt, stage, tok, per, what);
    fails += offloaded(&mc, &per_rank, stage, tok, per, got, bytes, what, nvme_dir);
    fails += resumed(&mc, &per_rank, stage, tok, per, tmp, what);
  }
  free(tok);
  return fails;
}

int main(void) {
  zt_device_info dev[ZT_MAX_DEVICES];
  if (zt_backend_cuda_devices(dev, ZT_MAX_DEVICES) < W) {
    fprintf(stderr, "SKIP: needs %d GPUs\n", W);
    return 77;
  }
  char err[512];
  if (zt_comm_nccl_get_id(&g_id, err, sizeof err) < 0) {
    fprintf(stderr, "FAIL: %s\n", err);
    return 1;
  }
  for (int r = 0; r < W; r++)
    if (zt_backend_open(&g_ranks[r].be, "cuda", r, 0, err, sizeof err) < 0) {
      fprintf(stderr, "FAIL: %s\n", err);
      return 1;
    }
  pthread_t th[W];
  opener op[W];
  for (int r = 0; r < W; r++) {
    op[r] = (opener){.r = r};
    pthread_create(&th[r], NULL, open_comm, &op[r]);
  }
  int fails = 0;
  for (int r = 0; r < W; r++) {
    pthread_join(th[r], NULL);
    fails += MC_EXPECT(op[r].rc == 0, "rank %d: %s", r, op[r].err);
  }
  const char *tmp = mc_tmpdir(), *nvme_dir = tmp;
  zt_nvme_store *probe = NULL;
  if (zt_nvme_store_open(&probe, tmp, NULL, err, sizeof err) < 0) {
    printf("optimizer nvme cases skipped: %s\n", err);
    nvme_dir = NULL;
  }
  zt_nvme_store_close(probe);
  if (!fails) {
    zt_arch archs[] = {ZT_ARCH_GPT, ZT_ARCH_ENCODER};
    zt_dtype dts[] = {ZT_F32, ZT_BF16, ZT_F16};
    for (int i = 0; i < 2; i++)
      for (int d = 0; d < 3; d++) fails += check(archs[i], dts[d], tmp, nvme_dir);
  }
  for (int r = 0; r < W; r++) {
    if (op[r].rc == 0) zt_comm_nccl_close(&g_ranks[r].comm);
    zt_backend_close(&g_ranks[r].be);
  }
  mc_rmtree(tmp);
  if (fails) fprintf(stderr, "%d failure(s)\n", fails);
  return fails ? 1 : 0;
}
