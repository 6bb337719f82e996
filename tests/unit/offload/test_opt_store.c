/* The optimizer-state store on a real io_uring over a temporary directory: five units of odd
 * sizes (two in host buffers, three on NVMe), two steps walked down as the backward does (each
 * NVMe unit staged, updated, the one below read ahead), every unit's state bitwise the CPU
 * AdamW's run by run (weight decay per run, the bf16 compute copy, src and out around the
 * update); the retire's hooks in the order of the updates, each write-behind after its update;
 * the files named, sized in whole blocks (zt_opt_store_file_bytes), read and written whole by
 * zt_opt_store_sync; the second step ended by zt_opt_store_flush (the sets retired) and the
 * host units waited for after it, as dp ends its updates; the errors: an injected EIO names the
 * file and frees the set, a failed submit frees the set staged for it (nothing written
 * behind), a failing hook skips the write-behind and leaves its message to the caller (""), a
 * file that exists, step 0; a store without NVMe. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "offload/opt_store.h"
#include "tests/unit/offload/otest.h"

#define NU 5
#define NV0 2 /* units [NV0, NU) on NVMe */
static const size_t floats[NU] = {1000, 3001, 2048, 517, 4103};
static const char *const names[NU] = {"u0", "u1", "u2", "u3", "u4"};
static const size_t largest = 4103;

static char tmpdir[256];
static zt_opt_run runs[3 * NU];
static int first_run[NU + 1];

/* state[u][k]: unit u's masters, m, v as the test keeps them (the host units' live here) */
static float *state[NU][ZT_OPT_KINDS], *grads[NU];
static uint16_t *lp[NU];
static float *ref[NU][ZT_OPT_KINDS];
static uint16_t *ref_lp[NU];

/* the hooks' record */
static int updated_order[16], n_updated, written_order[16], n_written, fail_updated;
static float *streamed[NU]; /* where the updated hook copies an NVMe unit's masters */

static void *abuf(size_t bytes) {
  void *p = NULL;
  if (posix_memalign(&p, ZT_NVME_ALIGN, bytes)) abort();
  memset(p, 0, bytes);
  return p;
}

static float val(uint64_t *seed, float scale) {
  return ((float)(ot_next(seed) >> 40) / (float)(1 << 24) - 0.5f) * scale;
}

static int on_updated(void *ctx, int u, const zt_opt_set *set) {
  (void)ctx;
  updated_order[n_updated++] = u;
  if (fail_updated) return -EIO;
  memcpy(streamed[u], set->buf[ZT_OPT_MASTER], floats[u] * sizeof(float));
  return 0;
}

static int on_written(void *ctx, int u) {
  (void)ctx;
  written_order[n_written++] = u;
  return 0;
}

/* Three runs a unit: the first third decays, the next third not, the rest decays. */
static void make_runs(void) {
  int r = 0;
  for (int u = 0; u < NU; u++) {
    size_t a = floats[u] / 3, b = 2 * floats[u] / 3;
    first_run[u] = r;
    runs[r++] = (zt_opt_run){.offset = 0, .n = a, .decay = 1};
    runs[r++] = (zt_opt_run){.offset = a, .n = b - a, .decay = 0};
    runs[r++] = (zt_opt_run){.offset = b, .n = floats[u] - b, .decay = 1};
  }
  first_run[NU] = r;
}

/* The reference step of unit u: the CPU AdamW run by run over ref, bf16 copy in ref_lp. */
static void ref_step(int u, const zt_adam_hparams *hp) {
  for (int r = first_run[u]; r < first_run[u + 1]; r++) {
    zt_adam_hparams h = *hp;
    size_t o = runs[r].offset;
    h.weight_decay = runs[r].decay ? hp->weight_decay : 0.0f;
    zt_cpu_adam_run(zt_cpu_isa_best(), &h, ref[u][0] + o, grads[u] + o, ref[u][1] + o,
                    ref[u][2] + o, ref_lp[u] + o, NULL, runs[r].n);
  }
}

static zt_nvme_store *open_nvme(void) {
  zt_nvme_store *nv = NULL;
  char err[512];
  int rc = zt_nvme_store_open(&nv, tmpdir, NULL, err, sizeof err);
  if (rc == -ENOSYS || rc == -EPERM) {
    printf("SKIP: io_uring unavailable here: %s\n", err);
    exit(77);
  }
  OT_CHECK(rc == 0, "nvme store: %s", err);
  if (rc) exit(1);
  return nv;
}

/* One step walked down: host units submitted in place, NVMe units staged, updated, the next
 * read ahead; then finish, or with `flush` the sets retired first and the host units waited
 * for after. */
static int walk(zt_opt_store *st, const zt_adam_hparams *hp, int flush) {
  for (int u = NU - 1; u >= 0; u--) {
    float *p = state[u][0], *m = state[u][1], *v = state[u][2];
    int rc;
    if (u >= NV0) {
      zt_opt_set x;
      if ((rc = zt_opt_store_stage(st, u, &x)) < 0) return rc;
      p = x.buf[0];
      m = x.buf[1];
      v = x.buf[2];
    }
    zt_opt_io io = {.p = p, .m = m, .v = v, .g = grads[u], .lp = lp[u]};
    if ((rc = zt_opt_store_submit(st, u, &io, hp)) < 0) return rc;
    if (u > NV0 && (rc = zt_opt_store_read(st, u - 1)) < 0) return rc;
    ref_step(u, hp);
  }
  if (!flush) return zt_opt_store_finish(st);
  int rc = zt_opt_store_flush(st);
  for (int u = 0; u < NV0; u++) zt_opt_store_wait(st, u);
  return rc;
}

static void check_state(zt_opt_store *st, zt_opt_set *sets, const char *what) {
  for (int u = 0; u < NU; u++) {
    float *got[ZT_OPT_KINDS] = {state[u][0], state[u][1], state[u][2]};
    if (u >= NV0) {
      OT_CHECK(zt_opt_store_sync(st, u, 0) == 0, "%s: sync read of unit %d", what, u);
      for (int k = 0; k < ZT_OPT_KINDS; k++) got[k] = sets[0].buf[k];
      OT_CHECK(!memcmp(streamed[u], ref[u][0], floats[u] * sizeof(float)),
               "%s: unit %d: the updated hook's masters differ", what, u);
    }
    for (int k = 0; k < ZT_OPT_KINDS; k++)
      OT_CHECK(!memcmp(got[k], ref[u][k], floats[u] * sizeof(float)),
               "%s: unit %d kind %d differs from the CPU AdamW", what, u, k);
    OT_CHECK(!memcmp(lp[u], ref_lp[u], floats[u] * sizeof(uint16_t)),
             "%s: unit %d: the bf16 copy differs", what, u);
  }
}

int main(void) {
  const char *tmp = getenv("TMPDIR");
  snprintf(tmpdir, sizeof tmpdir, "%s/zt-opt-store.XXXXXX", tmp ? tmp : "/tmp");
  if (!mkdtemp(tmpdir)) return 1;
  char err[512];
  uint64_t seed = 42;
  make_runs();
  zt_nvme_store *nv = open_nvme();
  zt_cpu_pool *pool = NULL;
  OT_CHECK(zt_cpu_pool_open(&pool, 2, 0) == 0, "pool");
  zt_opt_set sets[2];
  for (int i = 0; i < 2; i++) {
    for (int k = 0; k < ZT_OPT_KINDS; k++) sets[i].buf[k] = abuf(largest * sizeof(float));
    sets[i].lp = NULL;
  }
  for (int u = 0; u < NU; u++) {
    grads[u] = abuf(floats[u] * sizeof(float));
    lp[u] = abuf(floats[u] * sizeof(uint16_t));
    ref_lp[u] = abuf(floats[u] * sizeof(uint16_t));
    streamed[u] = abuf(floats[u] * sizeof(float));
    for (int k = 0; k < ZT_OPT_KINDS; k++) {
      state[u][k] = abuf(floats[u] * sizeof(float));
      ref[u][k] = abuf(floats[u] * sizeof(float));
      for (size_t i = 0; i < floats[u]; i++)
        ref[u][k][i] = k == 2 ? val(&seed, 1e-3f) + 1e-3f : val(&seed, k ? 0.1f : 2.0f);
      memcpy(state[u][k], ref[u][k], floats[u] * sizeof(float));
    }
  }

  OT_CHECK(zt_opt_store_file_bytes(1000, ZT_F32) == 3 * 4096 &&
               zt_opt_store_file_bytes(1024, ZT_F32) == 3 * 4096 &&
               zt_opt_store_file_bytes(1025, ZT_F32) == 3 * 8192 &&
               zt_opt_store_file_bytes(2048, ZT_BF16) == 8192 + 2 * 4096 &&
               zt_opt_store_file_bytes(2049, ZT_BF16) == 3 * 4096 + 2 * 8192, "file bytes");
  zt_opt_store_cfg c = {.n_units = NU, .floats = floats, .runs = runs, .first_run = first_run,
                        .dt = ZT_BF16, .pool = pool, .nvme = nv, .nvme_first = NV0,
                        .names = names, .sets = {sets[0], sets[1]}, .updated = on_updated,
                        .written = on_written};
  zt_opt_store *st = NULL;
  int rc = zt_opt_store_open(&st, &c, err, sizeof err);
  OT_CHECK(rc == 0, "open: %s", err);
  if (rc) return 1;
  zt_nvme_stats ns;
  zt_nvme_store_get_stats(nv, &ns);
  OT_CHECK(ns.extents == 3 * (NU - NV0), "%llu files", (unsigned long long)ns.extents);
  const char *path = zt_nvme_extent_path(nv, zt_opt_store_ext(st, 3, ZT_OPT_M));
  OT_CHECK(path && strstr(path, "/u3.exp_avg") && !strstr(path, "exp_avg_sq"), "file %s", path);

  /* the initial state of the NVMe units, written whole through set 0 */
  for (int u = NV0; u < NU; u++) {
    for (int k = 0; k < ZT_OPT_KINDS; k++)
      memcpy(sets[0].buf[k], state[u][k], floats[u] * sizeof(float));
    OT_CHECK(zt_opt_store_sync(st, u, 1) == 0, "sync write %d: %s", u,
             zt_opt_store_error(st, -EIO));
  }
  zt_adam_hparams hp = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                        .weight_decay = 0.1f, .step = 1, .grad_scale = 1.0f};
  for (int step = 1; step <= 2; step++) {
    for (int u = 0; u < NU; u++)
      for (size_t i = 0; i < floats[u]; i++) grads[u][i] = val(&seed, 1.0f);
    hp.step = step;
    n_updated = n_written = 0;
    OT_CHECK(walk(st, &hp, step == 2) == 0, "step %d: %s", step, zt_opt_store_error(st, -EIO));
    OT_CHECK(n_updated == 3 && updated_order[0] == 4 && updated_order[1] == 3 &&
                 updated_order[2] == 2, "step %d: updated %d: %d %d %d", step, n_updated,
             updated_order[0], updated_order[1], updated_order[2]);
    OT_CHECK(n_written == 3 && written_order[0] == 4 && written_order[1] == 3 &&
                 written_order[2] == 2, "step %d: written %d", step, n_written);
    check_state(st, sets, step == 1 ? "step 1" : "step 2");
  }

  /* src and out around a host unit's update: p takes src first, out the first 100 masters */
  float *src = abuf(floats[0] * sizeof(float)), *out = abuf(floats[0] * sizeof(float));
  memcpy(src, ref[0][0], floats[0] * sizeof(float));
  memset(state[0][0], 0xff, floats[0] * sizeof(float));
  hp.step = 3;
  zt_opt_io io = {.p = state[0][0], .src = src, .m = state[0][1], .v = state[0][2],
                  .g = grads[0], .lp = lp[0], .out = out, .out_n = 100};
  OT_CHECK(zt_opt_store_submit(st, 0, &io, &hp) == 0, "submit with src and out");
  zt_opt_store_wait(st, 0);
  ref_step(0, &hp);
  OT_CHECK(!memcmp(state[0][0], ref[0][0], floats[0] * sizeof(float)) &&
               !memcmp(out, ref[0][0], 100 * sizeof(float)) && out[100] == 0.0f,
           "src and out");
  hp.step = 0;
  OT_CHECK(zt_opt_store_submit(st, 0, &io, &hp) == -EINVAL, "step 0");

  /* an injected read error names the file and frees the set: the next stage reads again */
  zt_nvme_store_fail_nth(nv, 1, EIO);
  zt_opt_set x;
  rc = zt_opt_store_stage(st, 4, &x);
  OT_CHECK(rc == -EIO && strstr(zt_opt_store_error(st, rc), "/u4.") &&
               strstr(zt_opt_store_error(st, rc), "Input/output error"),
           "read fault: %d %s", rc, zt_opt_store_error(st, rc));
  OT_CHECK(zt_opt_store_stage(st, 4, &x) == 0 && x.buf[0] == sets[0].buf[0], "stage after it");
  /* a failed submit frees the set staged for it: no hook, nothing written behind */
  n_updated = n_written = 0;
  io = (zt_opt_io){.p = x.buf[0], .m = x.buf[1], .v = x.buf[2], .g = grads[4]};
  rc = zt_opt_store_submit(st, 4, &io, &hp);
  OT_CHECK(rc == -EINVAL && !strcmp(zt_opt_store_error(st, rc), strerror(EINVAL)) &&
               zt_opt_store_finish(st) == 0 && n_updated == 0 && n_written == 0,
           "failed submit: %d '%s', updated %d written %d", rc, zt_opt_store_error(st, rc),
           n_updated, n_written);
  OT_CHECK(zt_opt_store_stage(st, 4, &x) == 0 && x.buf[0] == sets[0].buf[0],
           "stage after a failed submit");
  /* a failing updated hook: no write-behind, the set free again */
  fail_updated = 1;
  n_updated = n_written = 0;
  memset(x.buf[0], 0, floats[4] * sizeof(float));
  OT_CHECK(zt_opt_store_finish(st) == -EIO && n_updated == 1 && n_written == 0 &&
               !strcmp(zt_opt_store_error(st, -EIO), ""),
           "failing hook: updated %d written %d, '%s'", n_updated, n_written,
           zt_opt_store_error(st, -EIO));
  fail_updated = 0;
  OT_CHECK(zt_opt_store_sync(st, 4, 0) == 0 &&
               !memcmp(sets[0].buf[0], ref[4][0], floats[4] * sizeof(float)),
           "the failed retire wrote its set");
  zt_opt_store_close(st);

  /* a second store over the same files: the file exists */
  st = NULL;
  rc = zt_opt_store_open(&st, &c, err, sizeof err);
  OT_CHECK(rc == -EEXIST && !st && strstr(err, "u2.master"), "existing file: %d %s", rc, err);

  /* without NVMe: the AdamW alone, nothing to retire */
  c.nvme = NULL;
  c.updated = NULL;
  c.written = NULL;
  rc = zt_opt_store_open(&st, &c, err, sizeof err);
  OT_CHECK(rc == 0, "open without nvme: %s", err);
  hp.step = 4;
  io = (zt_opt_io){.p = state[4][0], .m = state[4][1], .v = state[4][2], .g = grads[4],
                   .lp = lp[4]};
  memcpy(state[4][0], ref[4][0], floats[4] * sizeof(float));
  OT_CHECK(zt_opt_store_submit(st, 4, &io, &hp) == 0 && zt_opt_store_finish(st) == 0,
           "without nvme");
  OT_CHECK(!strcmp(zt_opt_store_error(st, -ENOMEM), strerror(ENOMEM)), "error without nvme");
  zt_opt_store_close(st);

  zt_cpu_pool_close(pool);
  zt_nvme_store_close(nv);
  rmdir(tmpdir);
  free(src);
  free(out);
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < ZT_OPT_KINDS; k++) free(sets[i].buf[k]);
  for (int u = 0; u < NU; u++) {
    free(grads[u]);
    free(lp[u]);
    free(ref_lp[u]);
    free(streamed[u]);
    for (int k = 0; k < ZT_OPT_KINDS; k++) {
      free(state[u][k]);
      free(ref[u][k]);
    }
  }
  if (ot_failures) fprintf(stderr, "%d failures\n", ot_failures);
  return ot_failures ? 1 : 0;
}
