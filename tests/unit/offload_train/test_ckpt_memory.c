/* Checkpoints move the state in pieces of whole units (train/checkpoint/state.c): the heap that
 * a save, a load and an export take, counted through the sanitizer allocator's hooks over every
 * thread, stays within zt_trainer_checkpoint_bytes (plus the files' names and headers) on a GPT
 * whose parameters alone, one flat copy, would not fit in it: for the trainer without offload,
 * and offloaded with units on the device, on the host and on NVMe (on the host alone where
 * io_uring is not allowed). The checkpoints move the right state: the offloaded trainer loads
 * the plain one's and holds its state bitwise, both step alike, and the plain trainer loads the
 * offloaded one's; their exports are the same file. A load whose write into the NVMe tier fails
 * after its first pieces leaves the trainer refusing steps until a load succeeds.
 *
 * The offloaded open writes the initial state in pieces too: from the seed and from an init
 * file (the plain trainer's export, Conv1D weights transposed), in fp32 and bf16, the heap the
 * open takes beyond what it keeps stays within zt_checkpoint_estimate_bytes (which the job's
 * admission counts beside the plan's host tier), all of it within the plan's host and device
 * bytes and that bound, and the trainer holds bitwise the plain trainer's state opened from the
 * same init (bf16: after a step too, which reads the compute copy). Skips (77) in a build
 * without the hooks (no ASan). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/train/offload/offload.h"
#include "offload/nvme_store.h"
#include "tests/unit/model/mcheck.h"

/* What a checkpoint may take beyond the bound: trainer.json, the directory's and files' handles
 * (the bound counts the files' headers). */
#define SLACK (64 * 1024)

static zt_backend g_be;

/* An offloaded trainer opened with the planner's plan (the open checks a plan, never searches). */
static int open_planned(zt_trainer **t, const zt_model_cfg *mc, const zt_train_cfg *tc,
                        const zt_offload_cfg *oc, const zt_backend *be, char *err,
                        size_t errlen) {
  zt_offload_placement p;
  int rc = zt_offload_plan_make(mc, tc, oc, be->ops, &p, err, errlen);
  return rc < 0 ? rc : zt_trainer_open_offload(t, mc, tc, oc, &p, be, err, errlen);
}

static zt_model_cfg model_cfg(void) {
  zt_model_cfg mc = mc_tiny(ZT_ARCH_GPT);
  mc.vocab = 64;
  mc.seq_len = 8;
  mc.d_model = 96;
  mc.n_heads = 4;
  mc.n_layers = 12;
  return mc;
}

static int within(const char *what, size_t bound) {
  int64_t peak = mc_heap_peak();
  printf("%-28s %8lld heap bytes (bound %zu + %d)\n", what, (long long)peak, bound, SLACK);
  return MC_EXPECT(peak > 0 && (size_t)peak <= bound + SLACK, "%s took %lld heap bytes, more "
                   "than the bound %zu + %d", what, (long long)peak, bound, SLACK);
}

static float *state_of(zt_trainer *t) {
  size_t n = zt_model_num_params(zt_trainer_model(t));
  float *x = malloc(3 * n * sizeof *x);
  if (!x || zt_trainer_get_state(t, x, x + n, x + 2 * n) < 0) exit(1);
  return x;
}

static int same_state(zt_trainer *a, zt_trainer *b, const char *what) {
  size_t n = zt_model_num_params(zt_trainer_model(a));
  float *x = state_of(a), *y = state_of(b);
  int fails = MC_EXPECT(memcmp(x, y, 3 * n * sizeof *x) == 0, "%s: the states differ", what);
  free(x);
  free(y);
  return fails;
}

static int step(zt_trainer *t, const int32_t *tok, const char *what) {
  char err[512];
  zt_step_result r;
  int rc = zt_trainer_step(t, tok, &r, err, sizeof err);
  return MC_EXPECT(rc == 0, "%s: step: %d %s", what, rc, err);
}

/* The load's write of an NVMe unit's master fails (the store's fault injection) after the
 * device and host units and two NVMe units were written: -EIO naming it, then the trainer
 * refuses steps until the same load succeeds. */
static int check_partial_load(const zt_model_cfg *mc, const zt_train_cfg *tc,
                              const zt_offload_cfg *oc, const char *dir, const int32_t *tok,
                              zt_trainer *want) {
  char err[512], fault[64];
  zt_trainer *t = NULL;
  int nu = 0, fails = 0;
  zt_model *m = NULL;
  if (zt_model_create(&m, mc, err, sizeof err) < 0) exit(1);
  nu = zt_model_num_units(m);
  zt_model_destroy(m);
  /* the open writes every NVMe unit's three files, the load the first two NVMe units' */
  int nvme_units = nu - oc->gpu_units - oc->host_units;
  snprintf(fault, sizeof fault, "eio:write:%d", 3 * nvme_units + 3 * 2 + 1);
  setenv("ZT_FAULT_NVME", fault, 1);
  int rc = open_planned(&t, mc, tc, oc, &g_be, err, sizeof err);
  unsetenv("ZT_FAULT_NVME");
  if (MC_EXPECT(rc == 0, "open with a write fault armed: %s", err)) return 1;
  rc = zt_trainer_load(t, dir, err, sizeof err);
  fails += MC_EXPECT(rc == -EIO && strstr(err, "writing the optimizer state failed") &&
                     strstr(err, ".master"), "a load whose NVMe write fails: %d %s", rc, err);
  zt_step_result r;
  rc = zt_trainer_step(t, tok, &r, err, sizeof err);
  fails += MC_EXPECT(rc == -EIO && strstr(err, "load a checkpoint to continue") &&
                     zt_trainer_step_count(t) == 0, "a step after a load that failed half way: "
                     "%d %s", rc, err);
  fails += MC_EXPECT(zt_trainer_load(t, dir, err, sizeof err) == 0, "the load again: %s", err);
  fails += same_state(want, t, "loaded after a failed load");
  fails += step(t, tok, "after the load");
  zt_trainer_close(t);
  return fails;
}

/* An offloaded open (see the top). */
static int check_open(const zt_model_cfg *mc, const zt_train_cfg *tc, const zt_offload_cfg *oc,
                      const int32_t *tok, const char *what) {
  char err[512];
  zt_trainer *p = NULL, *o = NULL;
  zt_offload_placement placed;
  if (zt_offload_plan_make(mc, tc, oc, g_be.ops, &placed, err, sizeof err) < 0 ||
      zt_trainer_open(&p, mc, tc, &g_be, err, sizeof err) < 0) {
    fprintf(stderr, "%s: %s\n", what, err);
    return 1;
  }
  zt_offload_plan plan = zt_offload_plan_summary(&placed);
  size_t bound = zt_checkpoint_estimate_bytes(mc), planned = plan.host_bytes + plan.device_bytes;
  mc_heap_mark();
  int rc = zt_trainer_open_offload(&o, mc, tc, oc, &placed, &g_be, err, sizeof err);
  int64_t peak = mc_heap_peak(), kept = mc_heap_now();
  int fails = MC_EXPECT(rc == 0, "%s: offloaded open: %s", what, err);
  printf("%-28s %8lld heap bytes, %lld kept (plan %zu, bound %zu + %d)\n", what,
         (long long)peak, (long long)kept, planned, bound, SLACK);
  fails += MC_EXPECT(kept > 0 && peak - kept <= (int64_t)(bound + SLACK), "%s: the open took "
                     "%lld heap bytes beyond the %lld it kept, more than the bound %zu + %d",
                     what, (long long)(peak - kept), (long long)kept, bound, SLACK);
  fails += MC_EXPECT(peak <= (int64_t)(planned + bound + SLACK), "%s: the open took %lld heap "
                     "bytes, more than the plan's %zu and the bound %zu + %d", what,
                     (long long)peak, planned, bound, SLACK);
  if (rc == 0) {
    fails += same_state(p, o, what);
    if (tc->precision != ZT_F32)
      fails += step(p, tok, what) + step(o, tok, what) + same_state(p, o, what);
  }
  zt_trainer_close(o);
  zt_trainer_close(p);
  return fails;
}

int main(void) {
  if (mc_heap_count_start() < 0) {
    fprintf(stderr, "SKIP: the allocator has no hooks to count the heap (a build without ASan)\n");
    return 77;
  }
  g_be = mc_backend();
  const char *tmp = mc_tmpdir();
  char err[512], dir_a[600], dir_b[600], file_a[600], file_b[600];
  snprintf(dir_a, sizeof dir_a, "%s/a", tmp);
  snprintf(dir_b, sizeof dir_b, "%s/b", tmp);
  snprintf(file_a, sizeof file_a, "%s/a.safetensors", tmp);
  snprintf(file_b, sizeof file_b, "%s/b.safetensors", tmp);
  zt_model_cfg mc = model_cfg();
  zt_train_cfg tc = mc_train(1, 1);
  int fails = 0, rc;
  int32_t tok[3][9];
  uint64_t seed = 5;
  mc_tokens(&seed, &tok[0][0], sizeof tok / sizeof tok[0][0], mc.vocab);

  zt_trainer *a = NULL, *b = NULL, *c = NULL;
  if ((rc = zt_trainer_open(&a, &mc, &tc, &g_be, err, sizeof err)) < 0) {
    fprintf(stderr, "open: %s\n", err);
    return 1;
  }
  size_t n = zt_model_num_params(zt_trainer_model(a)), bound = zt_trainer_checkpoint_bytes(a);
  fails += MC_EXPECT(bound == zt_checkpoint_estimate_bytes(&mc), "the bound of the trainer %zu, "
                     "of its configuration %zu", bound, zt_checkpoint_estimate_bytes(&mc));
  /* so that a flat copy of any one kind of the state could not pass */
  fails += MC_EXPECT(bound + SLACK < n * sizeof(float), "%zu parameters: a flat copy (%zu bytes) "
                     "is within the bound %zu + %d", n, n * sizeof(float), bound, SLACK);
  fails += step(a, tok[0], "plain");
  mc_heap_mark();
  fails += MC_EXPECT(zt_trainer_save(a, dir_a, err, sizeof err) == 0, "save: %s", err);
  fails += within("save", bound);

  /* offloaded: 2 units on the device, 4 on the host, the rest in files */
  zt_offload_cfg oc;
  zt_offload_cfg_defaults(&oc);
  oc.optimizer = ZT_PLACE_NVME;
  oc.gpu_units = 2;
  oc.host_units = 4;
  snprintf(oc.nvme_dir, sizeof oc.nvme_dir, "%s", tmp);
  zt_nvme_store *probe = NULL;
  rc = zt_nvme_store_open(&probe, tmp, NULL, err, sizeof err);
  zt_nvme_store_close(probe);
  if (rc == -ENOSYS || rc == -EPERM) {
    printf("io_uring is not available here (%s): the offloaded trainer keeps its units on the "
           "device and the host\n", err);
    oc.optimizer = ZT_PLACE_HOST;
    oc.host_units = -1;
  }
  if ((rc = open_planned(&b, &mc, &tc, &oc, &g_be, err, sizeof err)) < 0) {
    fprintf(stderr, "offloaded open: %s\n", err);
    return 1;
  }
  zt_offload_stats st;
  zt_trainer_offload_stats(b, &st);
  fails += MC_EXPECT(st.gpu_units == 2 && (oc.optimizer == ZT_PLACE_HOST || st.host_units == 4),
                     "offloaded: %d units on the device, %d on the host", st.gpu_units,
                     st.host_units);
  mc_heap_mark();
  fails += MC_EXPECT(zt_trainer_load(b, dir_a, err, sizeof err) == 0, "offloaded load: %s", err);
  fails += within("offloaded load", bound);
  fails += same_state(a, b, "the offloaded trainer loaded the plain one's checkpoint");
  if (oc.optimizer == ZT_PLACE_NVME) fails += check_partial_load(&mc, &tc, &oc, dir_a, tok[1], a);
  fails += step(a, tok[1], "plain") + step(b, tok[1], "offloaded");
  mc_heap_mark();
  fails += MC_EXPECT(zt_trainer_save(b, dir_b, err, sizeof err) == 0, "offloaded save: %s", err);
  fails += within("offloaded save", bound);
  mc_heap_mark();
  fails += MC_EXPECT(zt_trainer_export(b, file_b, err, sizeof err) == 0, "offloaded export: %s",
                     err);
  fails += within("offloaded export", bound);
  mc_heap_mark();
  fails += MC_EXPECT(zt_trainer_export(a, file_a, err, sizeof err) == 0, "export: %s", err);
  fails += within("export", bound);
  fails += mc_same_file(file_a, file_b);

  if ((rc = zt_trainer_open(&c, &mc, &tc, &g_be, err, sizeof err)) < 0) {
    fprintf(stderr, "open: %s\n", err);
    return 1;
  }
  mc_heap_mark();
  fails += MC_EXPECT(zt_trainer_load(c, dir_b, err, sizeof err) == 0, "load: %s", err);
  fails += within("load", bound);
  fails += same_state(a, c, "the plain trainer loaded the offloaded one's checkpoint");
  fails += step(b, tok[2], "offloaded") + step(c, tok[2], "plain");
  fails += same_state(b, c, "a step after the loads");

  /* the offloaded open, from the seed and from a's export */
  char init[600];
  snprintf(init, sizeof init, "%s/init.safetensors", tmp);
  fails += MC_EXPECT(zt_trainer_export(a, init, err, sizeof err) == 0, "export: %s", err);
  zt_model_cfg from_file = mc;
  snprintf(from_file.init_path, sizeof from_file.init_path, "%s", init);
  zt_train_cfg bf16 = tc;
  bf16.precision = ZT_BF16;
  fails += check_open(&mc, &tc, &oc, tok[0], "offloaded open (seed)") +
           check_open(&from_file, &tc, &oc, tok[0], "offloaded open (init_path)") +
           check_open(&mc, &bf16, &oc, tok[0], "offloaded open (seed, bf16)") +
           check_open(&from_file, &bf16, &oc, tok[0], "offloaded open (file, bf16)");

  zt_trainer_close(c);
  zt_trainer_close(b);
  zt_trainer_close(a);
  zt_backend_cpu_close(&g_be);
  mc_rmtree(tmp);
  if (fails) {
    fprintf(stderr, "%d failure(s)\n", fails);
    return 1;
  }
  printf("checkpoint memory: ok\n");
  return 0;
}
