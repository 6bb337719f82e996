/* Data parallelism with offload (engine/train/dp/dp.h "Offload") on simulated ranks: every ZeRO
 * stage × every placement a data-parallel job takes (optimizer on the device, on the host for
 * all units or all but the leading ones, and for stage 3 the parameters on the host too), both
 * archs, W 2 and 3, grad_accum 2 (the host staging) with clipping (the updates after the
 * exchanged norm) and without (the host units' updates overlapping the backward), bf16 and fp16
 * too.
 * Each against the same world with everything on the device:
 * - losses, norms and the final state (params, m, v) bitwise equal;
 * - a checkpoint saved by an offloaded trainer, loaded by a trainer of another placement, goes
 *   on with the same losses;
 * - each rank's device bytes fall as units move to the host, equal to zt_dp_estimate_rank_bytes,
 *   and its host bytes equal zt_dp_estimate_host_bytes;
 * - a nan gradient with the updates overlapping the backward refuses the step with nothing
 *   changed, as on the device;
 * - bad placements refused naming the field.
 * Optimizer nvme (each rank's masters, m and v of the host units in files under nvme_dir) is
 * one more placement of those worlds (all units or all but the leading ones, stage 3 with the
 * parameters on the host too), with the same checks, and: each rank's NVMe bytes equal
 * zt_dp_estimate_nvme_bytes, its store read every file once a step and wrote it once a step
 * and at the open (its counters), the files are gone after the close; an injected EIO on a
 * read (updates after the norm) and on a write-behind (updates overlapping the backward) fails
 * the step (-EIO) naming the file, and the trainer refuses further steps. Host and NVMe
 * together (dp.host_units: the units after the device ones on the host, the rest in files, with
 * the parameters on the host too at stage 3) are placements of the same worlds with the same
 * checks, the store's counters showing the NVMe units' files alone. Params nvme (stage 3: each
 * rank's NVMe units' parameter chunks read from their master files before each gather, with
 * and without gpu_units and host_units) is one more placement of the stage 3 worlds, grad_accum
 * 2 and 1, fp32 and fp16, with the same checks, and: the store's counters show the parameter
 * reads beside the update's (each NVMe unit's chunk in the forward, and again in the backward
 * unless a slot kept it; exactly that with grad_accum 1, at most that per micro-batch with 2);
 * its checkpoints load into the neighbouring placements (host, params nvme with other units on
 * the host, optimizer host); an injected EIO on a parameter read in the backward fails the step
 * (-EIO) naming the master file. Without io_uring (kernel or sandbox) the NVMe part is
 * skipped. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/kernels/backend.h"
#include "engine/plan/dp_plan.h"
#include "tests/unit/dp/dptest.h"
#include "tests/unit/model/mcheck.h"

#define SAVE_AT 2


typedef struct placement {
  zt_offload_place optimizer, params;
  int gpu_units;
  int host_units; /* optimizer nvme: the units after the device ones on the host tier */
} placement;

static const placement on_device = {ZT_PLACE_AUTO, ZT_PLACE_AUTO, 0, 0};

/* optimizer nvme: io_uring works here (main), and the directory of the matrix being run */
static int nvme_ok;
static char nvme_dir[600];

static void describe(char *out, size_t len, zt_arch arch, int W, int stage, zt_dtype dt,
                     float clip, const placement *p) {
  snprintf(out, len,
           "%s W %d stage %d %s clip %g, optimizer %s (gpu_units %d host_units %d) params %s",
           zt_arch_name(arch), W, stage, zt_dtype_name(dt), (double)clip,
           zt_offload_place_name(p->optimizer), p->gpu_units, p->host_units,
           zt_offload_place_name(p->params));
}

static zt_dp_cfg dp_cfg(int W, int stage, const placement *p) {
  return (zt_dp_cfg){.world = W, .zero_stage = stage, .optimizer = p->optimizer,
                     .params = p->params, .gpu_units = p->gpu_units,
                     .host_units = p->host_units, .nvme_dir = nvme_dir};
}

/* The directory holds nothing (the trainers removed their files and directories). */
static int empty_dir(const char *path, const char *what) {
  DIR *d = opendir(path);
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  if (d) closedir(d);
  return MC_EXPECT(d && n == 0, "%s: %s holds %d entries after the close", what, path, n);
}

/* Bytes a rank's store moved so far. */
static zt_nvme_stats nvme_stats(zt_trainer *t, int r) {
  zt_nvme_stats st = {0};
  zt_trainer_dp_nvme_stats(t, r, &st);
  return st;
}

static int same_run(const dpt_run *a, const dpt_run *ref, int from, int to, const char *what) {
  int fails = 0;
  for (int i = from; i < to; i++)
    fails += MC_EXPECT(a->loss[i] == ref->loss[i] && a->norm[i] == ref->norm[i],
                       "%s: step %d loss %.17g norm %.17g, on the device %.17g %.17g", what,
                       i + 1, a->loss[i], a->norm[i], ref->loss[i], ref->norm[i]);
  return fails;
}

/* The bytes of rank r's files: a master, exp_avg and exp_avg_sq of its chunk per NVMe unit
 * (those past gpu_units + host_units), what the open writes once and a step reads and writes
 * once each. */
static uint64_t nvme_unit_bytes(zt_trainer *t, int W, const placement *p) {
  zt_shard_table *tab;
  const zt_model *m = zt_trainer_model(t);
  uint64_t sum = 0;
  if (zt_dp_plan_shard_table(m, W, &tab) < 0) exit(1);
  for (int u = p->gpu_units + p->host_units; u < zt_model_num_units(m); u++)
    sum += 3 * tab->chunk[u] * sizeof(float);
  zt_shard_table_free(tab);
  return sum;
}

/* params nvme: the bytes each rank reads from its NVMe units' master files in the walks of the
 * first micro-batch of a step: each unit's chunk gathered in the forward, and again in the
 * backward unless a slot kept it (the last two units) or it is the gpt's embedding (gathered
 * through the step). Later micro-batches read at most as much (a chunk buffer may still hold a
 * unit). */
static uint64_t param_read_bytes(zt_trainer *t, int W, const placement *p) {
  zt_shard_table *tab;
  const zt_model *m = zt_trainer_model(t);
  int nu = zt_model_num_units(m), tied = zt_model_cfg_of(m)->arch == ZT_ARCH_GPT;
  uint64_t sum = 0;
  if (p->params != ZT_PLACE_NVME) return 0;
  if (zt_dp_plan_shard_table(m, W, &tab) < 0) exit(1);
  for (int u = p->gpu_units + p->host_units; u < nu; u++)
    sum += (1 + (u < nu - 2 && !(tied && u == 0))) * tab->chunk[u] * sizeof(float);
  zt_shard_table_free(tab);
  return sum;
}

/* Each rank's device and host bytes against the estimates. */
static int bytes_match(zt_trainer *t, const zt_model_cfg *mc, const zt_train_cfg *tc,
                       const zt_dp_cfg *dc, const char *what) {
  size_t dev = zt_dp_estimate_rank_bytes(mc, tc, dc, zt_backend_ops_of("cpu"));
  size_t host = zt_dp_estimate_host_bytes(mc, tc, dc);
  uint64_t nv = zt_dp_estimate_nvme_bytes(mc, tc, dc);
  int fails = MC_EXPECT((dc->optimizer == ZT_PLACE_NVME) == (nv > 0),
                        "%s: %llu NVMe bytes estimated", what, (unsigned long long)nv);
  for (int r = 0; r < dc->world; r++)
    fails += MC_EXPECT(zt_trainer_dp_rank_bytes(t, r) == dev &&
                       zt_trainer_dp_host_bytes(t, r) == host &&
                       zt_trainer_dp_nvme_bytes(t, r) == nv,
                       "%s: rank %d holds %zu device, %zu host and %llu NVMe bytes, estimated "
                       "%zu, %zu and %llu", what, r, zt_trainer_dp_rank_bytes(t, r),
                       zt_trainer_dp_host_bytes(t, r),
                       (unsigned long long)zt_trainer_dp_nvme_bytes(t, r), dev, host,
                       (unsigned long long)nv);
  return fails;
}

/* One world and stage with grad_accum G: the on-device run, then each placement against it
 * (optimizer nvme too with nv). */
static int matrix(zt_arch arch, int W, int stage, zt_dtype dt, float clip, int nv, int G) {
  zt_model_cfg mc = dpt_model_cfg(arch);
  zt_train_cfg tc = dpt_train_cfg(G, clip, dt);
  int32_t *tok = dpt_tokens(&mc, W * G, 3 + (uint64_t)W);
  size_t per = dpt_step_tokens(&mc, W * G), n;
  const char *dir = mc_tmpdir();
  char what[200], path[600], err[512];
  snprintf(path, sizeof path, "%s/ckpt", dir);
  snprintf(nvme_dir, sizeof nvme_dir, "%s/nvme", dir);
  if (mkdir(nvme_dir, 0700) < 0) exit(1);
  nv = nv && nvme_ok;
  int fails = 0;
  dpt_ranks x;
  dpt_ranks_open(&x, W);
  zt_dp_cfg dc = dp_cfg(W, stage, &on_device);
  zt_trainer *t = dpt_open_dp_cfg(&mc, &tc, &x, &dc);
  n = zt_model_num_params(zt_trainer_model(t));
  int units = zt_model_num_units(zt_trainer_model(t));
  size_t dev_bytes = zt_trainer_dp_rank_bytes(t, 0);
  dpt_run ref;
  describe(what, sizeof what, arch, W, stage, dt, clip, &on_device);
  fails += dpt_run_steps(t, tok, per, 0, DPT_STEPS, &ref, what);
  float *want = dpt_state_of(t);
  zt_trainer_close(t);

  placement ps[16];
  int np = 0;
  ps[np++] = (placement){ZT_PLACE_HOST, ZT_PLACE_AUTO, 0, 0};
  if (nv) ps[np++] = (placement){ZT_PLACE_NVME, ZT_PLACE_AUTO, 0, 0};
  ps[np++] = (placement){ZT_PLACE_HOST, ZT_PLACE_GPU, units / 2, 0};
  if (nv) ps[np++] = (placement){ZT_PLACE_NVME, ZT_PLACE_GPU, units / 2, 0};
  /* host and NVMe together: the units after the device ones on the host, the rest in files */
  if (nv) ps[np++] = (placement){ZT_PLACE_NVME, ZT_PLACE_AUTO, 1, 2};
  if (nv) ps[np++] = (placement){ZT_PLACE_NVME, ZT_PLACE_AUTO, 0, units - 1};
  ps[np++] = (placement){ZT_PLACE_GPU, ZT_PLACE_GPU, 0, 0};
  if (stage == 3) {
    ps[np++] = (placement){ZT_PLACE_HOST, ZT_PLACE_HOST, 0, 0};
    ps[np++] = (placement){ZT_PLACE_HOST, ZT_PLACE_HOST, 1, 0};
    if (nv) ps[np++] = (placement){ZT_PLACE_NVME, ZT_PLACE_HOST, 1, 0};
    if (nv) ps[np++] = (placement){ZT_PLACE_NVME, ZT_PLACE_HOST, 0, 2};
    /* params nvme, loading the checkpoints of params host and of each other, its own into
     * optimizer host */
    if (nv) ps[np++] = (placement){ZT_PLACE_NVME, ZT_PLACE_NVME, 0, 0};
    if (nv) ps[np++] = (placement){ZT_PLACE_NVME, ZT_PLACE_NVME, 1, 1};
    if (nv) ps[np++] = (placement){ZT_PLACE_NVME, ZT_PLACE_NVME, 0, 2};
    if (nv) ps[np++] = (placement){ZT_PLACE_NVME, ZT_PLACE_NVME, 1, 0};
  }
  for (int i = 0; i < np; i++) {
    describe(what, sizeof what, arch, W, stage, dt, clip, &ps[i]);
    dc = dp_cfg(W, stage, &ps[i]);
    t = dpt_open_dp_cfg(&mc, &tc, &x, &dc);
    fails += bytes_match(t, &mc, &tc, &dc, what);
    /* the open wrote every file once: a step reads and writes each once */
    int nvme = ps[i].optimizer == ZT_PLACE_NVME;
    zt_nvme_stats at_open[DPT_MAXW];
    for (int r = 0; nvme && r < W; r++) at_open[r] = nvme_stats(t, r);
    if (ps[i].optimizer != ZT_PLACE_GPU)
      fails += MC_EXPECT(zt_trainer_dp_rank_bytes(t, 0) < dev_bytes &&
                         zt_trainer_dp_host_bytes(t, 0) > 0,
                         "%s: %zu device bytes (%zu on the device alone), %zu host bytes", what,
                         zt_trainer_dp_rank_bytes(t, 0), dev_bytes,
                         zt_trainer_dp_host_bytes(t, 0));
    dpt_run o;
    fails += dpt_run_steps(t, tok, per, 0, SAVE_AT, &o, what);
    /* only the NVMe units' files: the host units' state never goes through the store; with
     * params nvme the walks' parameter reads besides */
    uint64_t files = nvme ? nvme_unit_bytes(t, W, &ps[i]) : 0;
    uint64_t pr = param_read_bytes(t, W, &ps[i]);
    for (int r = 0; nvme && r < W; r++) {
      zt_nvme_stats st = nvme_stats(t, r);
      uint64_t f = at_open[r].bytes_written;
      fails += MC_EXPECT(f == files && at_open[r].bytes_read == 0 &&
                         st.bytes_read >= SAVE_AT * (f + pr) &&
                         st.bytes_read <= SAVE_AT * (f + G * pr) &&
                         st.bytes_written == (SAVE_AT + 1) * f && st.errors == 0,
                         "%s: rank %d's store wrote %llu bytes at the open (the NVMe units' "
                         "files %llu), then read %llu (the update's %llu and the parameters' "
                         "%llu to %llu) and wrote %llu in %d steps", what, r,
                         (unsigned long long)f, (unsigned long long)files,
                         (unsigned long long)st.bytes_read, (unsigned long long)(SAVE_AT * f),
                         (unsigned long long)(SAVE_AT * pr),
                         (unsigned long long)(SAVE_AT * G * pr),
                         (unsigned long long)st.bytes_written, SAVE_AT);
    }
    fails += MC_EXPECT(zt_trainer_save(t, path, err, sizeof err) == 0, "%s: save: %s", what,
                       err);
    fails += dpt_run_steps(t, tok, per, SAVE_AT, DPT_STEPS, &o, what);
    fails += same_run(&o, &ref, 0, DPT_STEPS, what);
    float *got = dpt_state_of(t);
    fails += MC_EXPECT(memcmp(got, want, 3 * n * sizeof *got) == 0,
                       "%s: the final state is not the on-device run's", what);
    free(got);
    zt_trainer_close(t);
    /* its checkpoint in the next placement (the same stage: another reduces the gradients in
     * another order) */
    const placement *q = &ps[(i + 1) % np];
    dc = dp_cfg(W, stage, q);
    t = dpt_open_dp_cfg(&mc, &tc, &x, &dc);
    char what2[200];
    describe(what2, sizeof what2, arch, W, stage, dt, clip, q);
    fails += MC_EXPECT(zt_trainer_load(t, path, err, sizeof err) == 0, "%s: load: %s", what2,
                       err);
    fails += dpt_run_steps(t, tok, per, SAVE_AT, DPT_STEPS, &o, what2);
    fails += same_run(&o, &ref, SAVE_AT, DPT_STEPS, what2);
    zt_trainer_close(t);
    fails += empty_dir(nvme_dir, what2);
    if (fails) fprintf(stderr, "in %s (loaded into %s)\n", what, what2);
  }
  free(want);
  dpt_ranks_close(&x);
  mc_rmtree(dir);
  free(tok);
  return fails;
}

/* A nan parameter with the updates overlapping the backward: every rank finds its first host
 * unit not finite before updating anything, so the step is refused with nothing changed, as on
 * the device, and the next one too. */
static int nonfinite(int stage) {
  zt_model_cfg mc = dpt_model_cfg(ZT_ARCH_GPT);
  const char *dir = mc_tmpdir();
  int fails = 0;
  float *p = dpt_nan_init(&mc, dir, NULL, &fails);
  zt_train_cfg tc = dpt_train_cfg(1, 0, ZT_F32);
  int32_t *tok = dpt_tokens(&mc, 2, 9);
  dpt_ranks x;
  dpt_ranks_open(&x, 2);
  placement pl = {ZT_PLACE_HOST, stage == 3 ? ZT_PLACE_HOST : ZT_PLACE_AUTO, 1, 0};
  zt_dp_cfg dc = dp_cfg(2, stage, &pl);
  zt_trainer *t = dpt_open_dp_cfg(&mc, &tc, &x, &dc);
  size_t n = zt_model_num_params(zt_trainer_model(t));
  char err[512];
  zt_step_result r;
  for (int i = 0; i < 2; i++) {
    int rc = zt_trainer_step(t, tok, &r, err, sizeof err);
    fails += MC_EXPECT(rc == -ERANGE && strstr(err, "inf or nan") && r.skipped,
                       "stage %d nan step %d: %d %s", stage, i + 1, rc, err);
  }
  float *q = dpt_state_of(t);
  /* the nan compares unequal to itself: compare the bits */
  fails += MC_EXPECT(zt_trainer_step_count(t) == 0 && memcmp(q, p, n * sizeof *q) == 0,
                     "stage %d: the refused steps changed the parameters", stage);
  for (size_t i = n; i < 3 * n; i++)
    if (q[i] != 0.0f) {
      fails += MC_EXPECT(0, "stage %d: the refused steps changed the AdamW state", stage);
      break;
    }
  free(q);
  zt_trainer_close(t);
  dpt_ranks_close(&x);
  mc_rmtree(dir);
  free(tok);
  free(p);
  return fails;
}

/* An NVMe device error mid-step, injected by ZT_FAULT_NVME (offload/nvme_store.h), which arms
 * every rank's store at its open: with clipping the fault is a read of a unit's state (the
 * updates after the norm), without it the write-behind of the first unit updated (the updates
 * overlapping the backward). The open wrote each of the 9 files (3 NVMe units) once. With
 * params nvme (every unit in files, stage 3) the fifth read is the parameters of unit 1 for
 * the backward (the forward reads units 0..3, the last two stay gathered, the embedding too),
 * read ahead during the loss. The step fails naming the file (`what` says whose, `file` which
 * and the I/O), and the trainer refuses the next one. */
static int eio(const char *fault, float clip, int stage, const placement *pl, const char *what,
               const char *file_io) {
  zt_model_cfg mc = dpt_model_cfg(ZT_ARCH_GPT);
  zt_train_cfg tc = dpt_train_cfg(1, clip, ZT_F32);
  int32_t *tok = dpt_tokens(&mc, 2, 11);
  const char *dir = mc_tmpdir();
  snprintf(nvme_dir, sizeof nvme_dir, "%s/nvme", dir);
  if (mkdir(nvme_dir, 0700) < 0) exit(1);
  dpt_ranks x;
  dpt_ranks_open(&x, 2);
  zt_dp_cfg dc = dp_cfg(2, stage, pl);
  setenv("ZT_FAULT_NVME", fault, 1);
  zt_trainer *t = dpt_open_dp_cfg(&mc, &tc, &x, &dc);
  unsetenv("ZT_FAULT_NVME");
  char err[1024], file[700];
  int fails = 0, rc = zt_trainer_step(t, tok, NULL, err, sizeof err);
  snprintf(file, sizeof file, "%s/zt-offload.", nvme_dir);
  fails += MC_EXPECT(rc == -EIO && strstr(err, file) && strstr(err, "/rank-") &&
                     strstr(err, what) && strstr(err, file_io) &&
                     strstr(err, "Input/output error (injected by ZT_FAULT_NVME)"),
                     "%s: the step gave %d '%s', want -EIO naming a file under %s, '%s' and "
                     "'%s'", fault, rc, err, file, what, file_io);
  rc = zt_trainer_step(t, tok, NULL, err, sizeof err);
  fails += MC_EXPECT(rc == -EIO && strstr(err, "aborted the communicators"),
                     "%s: the next step gave %d '%s'", fault, rc, err);
  zt_trainer_close(t);
  fails += empty_dir(nvme_dir, fault);
  /* a directory that is not there is refused at the open, naming it */
  snprintf(nvme_dir, sizeof nvme_dir, "%s/missing", dir);
  t = (zt_trainer *)(uintptr_t)1;
  rc = zt_trainer_open_dp(&t, &mc, &tc, &dc, x.r, err, sizeof err);
  fails += MC_EXPECT(rc == -ENOENT && !t && strstr(err, "offload.nvme_dir") &&
                     strstr(err, nvme_dir), "missing nvme_dir: %d '%s'", rc, err);
  dpt_ranks_close(&x);
  mc_rmtree(dir);
  free(tok);
  return fails;
}

/* io_uring works here (a sandbox or an old kernel may forbid it). */
static int have_nvme(void) {
  const char *dir = mc_tmpdir();
  zt_nvme_store *st = NULL;
  char err[256];
  int rc = zt_nvme_store_open(&st, dir, NULL, err, sizeof err);
  zt_nvme_store_close(st);
  mc_rmtree(dir);
  if (rc < 0) printf("optimizer nvme: skipped (%s)\n", err);
  return rc == 0;
}

static int refuses(const placement *p, int stage, int want_rc, const char *field) {
  zt_model_cfg mc = dpt_model_cfg(ZT_ARCH_GPT);
  zt_train_cfg tc = dpt_train_cfg(1, 0, ZT_F32);
  dpt_ranks x;
  dpt_ranks_open(&x, 2);
  zt_dp_cfg dc = dp_cfg(2, stage, p);
  zt_trainer *t = (zt_trainer *)(uintptr_t)1; /* must come back NULL */
  char err[512] = "";
  int rc = zt_trainer_open_dp(&t, &mc, &tc, &dc, x.r, err, sizeof err);
  dpt_ranks_close(&x);
  size_t est = zt_dp_estimate_host_bytes(&mc, &tc, &dc);
  return MC_EXPECT(rc == want_rc && !t && strstr(err, field) && est == SIZE_MAX,
                   "stage %d optimizer %s params %s gpu_units %d host_units %d: %d '%s' "
                   "(estimate %zu), want %d naming %s", stage,
                   zt_offload_place_name(p->optimizer), zt_offload_place_name(p->params),
                   p->gpu_units, p->host_units, rc, err, est, want_rc, field);
}

static int bad_placements(void) {
  int fails = 0;
  fails += refuses(&(placement){ZT_PLACE_HOST, ZT_PLACE_HOST, 0, 0}, 2, -EINVAL, "dp.params");
  fails += refuses(&(placement){ZT_PLACE_GPU, ZT_PLACE_HOST, 0, 0}, 3, -EINVAL, "dp.params");
  nvme_dir[0] = 0;
  fails += refuses(&(placement){ZT_PLACE_NVME, ZT_PLACE_AUTO, 0, 0}, 1, -EINVAL, "dp.nvme_dir");
  snprintf(nvme_dir, sizeof nvme_dir, "/nonexistent-zt-dir");
  /* params nvme reads the master files of stage 3's chunks */
  fails += refuses(&(placement){ZT_PLACE_HOST, ZT_PLACE_NVME, 0, 0}, 3, -EINVAL, "dp.params");
  fails += refuses(&(placement){ZT_PLACE_NVME, ZT_PLACE_NVME, 0, 0}, 2, -EINVAL, "dp.params");
  fails += refuses(&(placement){ZT_PLACE_NVME, ZT_PLACE_HOST, 0, 0}, 2, -EINVAL, "dp.params");
  fails += refuses(&(placement){ZT_PLACE_NVME, ZT_PLACE_AUTO, -1, 0}, 2, -EINVAL, "dp.gpu_units");
  fails += refuses(&(placement){ZT_PLACE_HOST, ZT_PLACE_AUTO, -1, 0}, 2, -EINVAL, "dp.gpu_units");
  fails += refuses(&(placement){ZT_PLACE_HOST, ZT_PLACE_AUTO, 99, 0}, 2, -EINVAL, "dp.gpu_units");
  /* the host / NVMe split is optimizer nvme's, within the units after the device ones */
  fails += refuses(&(placement){ZT_PLACE_HOST, ZT_PLACE_AUTO, 1, 1}, 2, -EINVAL, "dp.host_units");
  fails += refuses(&(placement){ZT_PLACE_NVME, ZT_PLACE_AUTO, 1, -1}, 2, -EINVAL,
                   "dp.host_units");
  fails += refuses(&(placement){ZT_PLACE_NVME, ZT_PLACE_AUTO, 1, 4}, 2, -EINVAL, "dp.host_units");
  return fails;
}

int main(void) {
  static const zt_arch archs[] = {ZT_ARCH_GPT, ZT_ARCH_ENCODER, ZT_ARCH_LLAMA};
  int fails = 0;
  nvme_ok = have_nvme();
  /* clipping waits for the norm; without it the host units' updates overlap the backward (and
   * with optimizer nvme read ahead and write behind during it); nvme in the gpt's worlds */
  for (int a = 0; a < 3; a++)
    for (int stage = 1; stage <= 3; stage++) {
      fails += matrix(archs[a], 2, stage, ZT_F32, 0.5f, a == 0, 2);
      fails += matrix(archs[a], 2, stage, ZT_F32, 0.0f, a == 0, 2);
    }
  fails += matrix(ZT_ARCH_GPT, 3, 3, ZT_F32, 0.0f, 0, 2);
  fails += matrix(ZT_ARCH_ENCODER, 3, 2, ZT_BF16, 0.5f, 1, 2);
  fails += matrix(ZT_ARCH_GPT, 3, 1, ZT_BF16, 0.0f, 0, 2);
  /* fp16: the host's AdamW writes the fp16 copy; the updates wait for the overflow verdict
   * (params nvme: the gathers cast it from the masters read) */
  fails += matrix(ZT_ARCH_GPT, 2, 3, ZT_F16, 0.0f, 1, 2);
  fails += matrix(ZT_ARCH_ENCODER, 2, 2, ZT_F16, 0.5f, 1, 2);
  /* one micro-batch a step: params nvme's reads counted exactly; the encoder's backward reads
   * unit 0 from its file too */
  fails += matrix(ZT_ARCH_ENCODER, 2, 3, ZT_F32, 0.0f, 1, 1);
  for (int stage = 1; stage <= 3; stage++) fails += nonfinite(stage);
  if (nvme_ok) {
    placement opt = {ZT_PLACE_NVME, ZT_PLACE_AUTO, 1, 0};
    placement par = {ZT_PLACE_NVME, ZT_PLACE_NVME, 0, 0};
    fails += eio("eio:read:5", 1.0f, 2, &opt, "optimizer nvme: ", "/block.1.exp_avg: read");
    fails += eio("eio:write:10", 0.0f, 2, &opt, "optimizer nvme: ", "/head.master: write");
    fails += eio("eio:read:5", 0.0f, 3, &par, "params nvme: ", "/block.0.master: read");
  }
  fails += bad_placements();
  if (fails) {
    fprintf(stderr, "%d failure(s)\n", fails);
    return 1;
  }
  printf("dp offload: ok\n");
  return 0;
}
