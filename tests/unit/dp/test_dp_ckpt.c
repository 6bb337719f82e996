/* Per-rank checkpoints (train/checkpoint/per_rank.c) of data-parallel trainers that run every rank
 * of their world, on simulated ranks. For stages 1, 2, 3, with the optimizer on the device and
 * on the host (all units or all but the first; stage 3 with the parameters on the host too), in
 * fp32, bf16 and fp16, a W 2 trainer saves after SAVE_AT steps and goes on; then:
 * - the directory holds manifest.json, model.safetensors and one file per rank, no flat
 *   optimizer file; the manifest names the world, the stage, each unit's range and chunk, each
 *   rank's file and its size (the file's); each rank's file holds exactly that rank's chunks of
 *   the saved state (params, m, v, gathered independently through zt_trainer_get_state);
 * - the ranks' files are written and read on the ranks' own threads, all at once: the path's
 *   save_shards / load_shards, driven with a recording zt__shard_io whose begin waits until
 *   every rank has begun (it fails after 10 s alone), see each rank's calls on one thread of its
 *   own (not the caller's), its units in order, each with its chunk's bytes;
 * - a W 2 trainer of the same configuration loads it (each rank its own file) and goes on
 *   bitwise as the uninterrupted run; a W 2 trainer of another stage loads the saved state;
 * - W 3, W 1 and a plain trainer load it (re-sharded) into the saved state, bitwise;
 * - the plain trainer's flat checkpoint of it loads into W 2, which goes on bitwise too;
 * - zt_checkpoint_estimate_bytes_dp (admission, from the configuration) is
 *   zt_trainer_checkpoint_bytes of the opened W 1, 2, 3 trainer of either arch;
 * - on a GPT whose flat parameters alone would not fit in it, a save and loads into W 2, W 3 and
 *   the plain trainer take at most the heap zt_trainer_checkpoint_bytes says (counted over every
 *   thread through the sanitizer allocator's hooks; that part skipped without them);
 * - refused with nothing changed (the state and step of a fresh trainer): a rank file missing
 *   (-ENOENT naming it), truncated (-EINVAL naming it and the manifest's bytes), a manifest that
 *   is not JSON, a world that does not match the ranks listed, a unit that is not the model's
 *   (-EINVAL naming the field); a save whose rank files pass the file size limit fails naming
 *   one (-EFBIG), the checkpoint there left as it was, and the trainer goes on.
 * With optimizer nvme (each rank's host units' masters, m and v in its files under nvme_dir)
 * the same, the ranks reading their files into the checkpoint and the loads writing them
 * (skipped without io_uring), and with host_units too (some units' state on the host tier, the
 * rest's in files), and with params nvme (stage 3: the NVMe units' parameters in their master
 * files alone, bf16's compute copy cast from them). The data-parallel open streams the
 * initial parameters a piece of units at a time: its transient heap is less than a flat copy of
 * them. */
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/model/safetensors.h"
/* internal: the ranks' threads are watched through the path's save_shards / load_shards driven
 * with a recording zt__shard_io, below the public save and load */
#include "engine/train/trainer_internal.h"
#include "tests/unit/dp/dptest.h"
#include "tests/unit/model/mcheck.h"

#define SAVE_AT 2
#define MICROS 6 /* a step's micro-batches: W * G for W 1, 2, 3 */

typedef struct ccase {
  int stage;
  zt_offload_place optimizer, params;
  int gpu_units;
  zt_dtype dt;
  int host_units; /* optimizer nvme: the units after the device ones on the host tier */
} ccase;

static char nvme_dir[600]; /* optimizer nvme's directory ("" without io_uring) */

static zt_train_cfg train_cfg(const ccase *c, int W) {
  zt_train_cfg tc = dpt_train_cfg(MICROS / W, 1.0f, c->dt);
  return tc;
}

static zt_trainer *open_w(const zt_model_cfg *mc, const ccase *c, dpt_ranks *x, int W) {
  zt_train_cfg tc = train_cfg(c, W);
  zt_dp_cfg dc = {.world = W, .zero_stage = c->stage, .optimizer = c->optimizer,
                  .params = c->params, .gpu_units = c->gpu_units, .host_units = c->host_units,
                  .nvme_dir = nvme_dir};
  dpt_ranks_open(x, W);
  return dpt_open_dp_cfg(mc, &tc, x, &dc);
}

static int same_state(zt_trainer *t, const float *want, const char *what) {
  size_t n = zt_model_num_params(zt_trainer_model(t));
  float *got = dpt_state_of(t);
  int fails = MC_EXPECT(memcmp(got, want, 3 * n * sizeof *got) == 0,
                        "%s: the state differs from the saved one", what);
  free(got);
  return fails;
}

static int same_run(const dpt_run *a, const dpt_run *ref, int from, int to, const char *what) {
  int fails = 0;
  for (int i = from; i < to; i++)
    fails += MC_EXPECT(a->loss[i] == ref->loss[i] && a->norm[i] == ref->norm[i],
                       "%s: step %d loss %.17g norm %.17g, uninterrupted %.17g %.17g", what,
                       i + 1, a->loss[i], a->norm[i], ref->loss[i], ref->norm[i]);
  return fails;
}

/* Rank r's real elements of unit u under the manifest's chunk. */
static size_t count_of(const zt_unit_info *ui, size_t chunk, int r) {
  size_t at = (size_t)r * chunk;
  return at >= ui->numel ? 0 : ui->numel - at < chunk ? ui->numel - at : chunk;
}

/* The directory's files, the manifest's fields and each rank's file's contents against the
 * saved state S (params, m, v back to back). */
static int check_files(const char *dir, const zt_model *m, const ccase *c, int step,
                       const float *S, const char *what) {
  char path[700], err[512];
  int fails = 0, nu = zt_model_num_units(m);
  size_t n = zt_model_num_params(m);
  snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
  fails += MC_EXPECT(access(path, F_OK) < 0, "%s: a per-rank checkpoint with %s", what, path);
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  fails += MC_EXPECT(access(path, F_OK) == 0, "%s: no %s", what, path);
  snprintf(path, sizeof path, "%s/manifest.json", dir);
  json_error_t je;
  json_t *j = json_load_file(path, 0, &je);
  if (MC_EXPECT(j != NULL, "%s: %s: %s", what, path, je.text)) return fails + 1;
  json_t *units = json_object_get(j, "units"), *ranks = json_object_get(j, "ranks");
  fails += MC_EXPECT(json_integer_value(json_object_get(j, "world")) == 2 &&
                     json_integer_value(json_object_get(j, "zero_stage")) == c->stage &&
                     json_integer_value(json_object_get(j, "step")) == step &&
                     json_array_size(units) == (size_t)nu && json_array_size(ranks) == 2 &&
                     json_object_get(j, "model") && json_object_get(j, "train"),
                     "%s: the manifest's world, zero_stage, step, units, ranks, model or train",
                     what);
  for (int r = 0; r < 2 && json_array_size(ranks) == 2 && json_array_size(units) == (size_t)nu;
       r++) {
    json_t *e = json_array_get(ranks, r);
    const char *name = json_string_value(json_object_get(e, "file"));
    snprintf(path, sizeof path, "%s/%s", dir, name ? name : "?");
    struct stat st;
    fails += MC_EXPECT(name && stat(path, &st) == 0 &&
                       st.st_size == json_integer_value(json_object_get(e, "bytes")),
                       "%s: rank %d's file %s is not there with the manifest's size", what, r,
                       path);
    zt_st_file *f = NULL;
    if (MC_EXPECT(zt_st_open(&f, path, err, sizeof err) == 0, "%s: %s", what, err)) {
      fails++;
      continue;
    }
    static const char *const suffix[3] = {".params", ".exp_avg", ".exp_avg_sq"};
    int tensors = 0;
    size_t elems = 0;
    for (int u = 0; u < nu; u++) {
      const zt_unit_info *ui = zt_model_unit(m, u);
      json_t *ju = json_array_get(units, u);
      size_t chunk = (size_t)json_integer_value(json_object_get(ju, "chunk"));
      json_int_t numel = json_integer_value(json_object_get(ju, "numel"));
      fails += MC_EXPECT(numel == (json_int_t)ui->numel && chunk * 2 >= ui->numel,
                         "%s: the manifest's unit %d", what, u);
      size_t cnt = count_of(ui, chunk, r);
      for (int k = 0; cnt && k < 3; k++) {
        char nm[160];
        snprintf(nm, sizeof nm, "%s%s", ui->name, suffix[k]);
        const zt_st_tensor *t = zt_st_find(f, nm);
        float *x = malloc(cnt * sizeof *x);
        if (!x) exit(1);
        int ok = t && t->numel == cnt && zt_st_read_f32(f, t, x, 0, err, sizeof err) == 0 &&
                 memcmp(x, S + k * n + ui->offset + (size_t)r * chunk, cnt * sizeof *x) == 0;
        fails += MC_EXPECT(ok, "%s: rank %d's %s is not its chunk of the saved state", what, r,
                           nm);
        free(x);
        tensors++;
      }
      elems += cnt;
    }
    fails += MC_EXPECT(zt_st_count(f) == tensors, "%s: rank %d's file has %d tensors, its chunks "
                       "%d", what, r, zt_st_count(f), tensors);
    printf("%s: rank %d: %zu elements of %zu in %lld bytes\n", what, r, elems, n,
           (long long)st.st_size);
    zt_st_close(f);
  }
  json_decref(j);
  return fails;
}

/* ---- the ranks' threads: a recording zt__shard_io ------------------------------------------ */

typedef struct rec_rank {
  pthread_t thread;
  int begun, calls, last_unit, bad;
  size_t elems;
} rec_rank;

typedef struct recorder {
  const zt_model *m;
  const zt_shard_table *tab;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int begun, timed_out;
  rec_rank r[DPT_MAXW];
  float *scratch; /* a load's values: the unit's index */
} recorder;

/* Every rank waits here until all have begun: they run at the same time, or it times out. */
static int rec_begin(void *arg, int r, char *err, size_t errlen) {
  recorder *x = arg;
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 10;
  pthread_mutex_lock(&x->mu);
  x->r[r].thread = pthread_self();
  x->r[r].begun++;
  x->r[r].last_unit = -1;
  x->begun++;
  pthread_cond_broadcast(&x->cv);
  while (x->begun < x->tab->world && !x->timed_out)
    if (pthread_cond_timedwait(&x->cv, &x->mu, &until) == ETIMEDOUT) x->timed_out = 1;
  int rc = x->timed_out ? -ETIMEDOUT : 0;
  pthread_mutex_unlock(&x->mu);
  if (rc < 0) snprintf(err, errlen, "rank %d waited alone for the others to begin", r);
  return rc;
}

static void rec_unit(recorder *x, int r, int u) {
  rec_rank *k = &x->r[r];
  const zt_shard *sh = zt_shard_at(x->tab, u, r);
  k->bad += !pthread_equal(pthread_self(), k->thread) || u <= k->last_unit || !sh->count;
  k->last_unit = u;
  k->calls++;
  k->elems += sh->count;
}

static int rec_put(void *arg, int r, int u, const float *p, const float *m, const float *v,
                   char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  recorder *x = arg;
  const zt_shard *sh = zt_shard_at(x->tab, u, r);
  /* the chunk's bytes are readable: the last of each */
  volatile float sink = p[sh->count - 1] + m[sh->count - 1] + v[sh->count - 1];
  (void)sink;
  rec_unit(x, r, u);
  return 0;
}

static int rec_end(void *arg, int r, int ok, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  recorder *x = arg;
  x->r[r].bad += !ok || !pthread_equal(pthread_self(), x->r[r].thread);
  return 0;
}

static int check_recorder(recorder *x, const char *call, const char *what) {
  int fails = MC_EXPECT(!x->timed_out, "%s %s: the ranks did not run at once", what, call);
  size_t elems = 0;
  for (int r = 0; r < x->tab->world; r++) {
    rec_rank *k = &x->r[r];
    fails += MC_EXPECT(k->begun == 1 && !k->bad && !pthread_equal(k->thread, pthread_self()) &&
                       k->elems == x->tab->rank_count[r],
                       "%s %s: rank %d began %d times, %d bad calls, %zu elements of its %zu",
                       what, call, r, k->begun, k->bad, k->elems, x->tab->rank_count[r]);
    for (int q = 0; q < r; q++)
      fails += MC_EXPECT(!pthread_equal(k->thread, x->r[q].thread), "%s %s: ranks %d and %d "
                         "on one thread", what, call, q, r);
    elems += k->elems;
  }
  fails += MC_EXPECT(elems == x->tab->numel, "%s %s: the ranks moved %zu elements of %zu", what,
                     call, elems, x->tab->numel);
  return fails;
}

/* A load's values: every element of the unit u's chunk is u + 1 (params), -(u + 1) (m), u (v). */
static int rec_get(void *arg, int r, int u, float *p, float *m, float *v, char *err,
                   size_t errlen) {
  (void)err;
  (void)errlen;
  recorder *x = arg;
  const zt_shard *sh = zt_shard_at(x->tab, u, r);
  for (size_t i = 0; i < sh->count; i++) {
    p[i] = (float)(u + 1);
    m[i] = -(float)(u + 1);
    v[i] = (float)u;
  }
  rec_unit(x, r, u);
  return 0;
}

static int threads(zt_trainer *t, const char *what) {
  int fails = 0, stage;
  char err[512];
  const zt_shard_table *tab = t->path->shards(t, &stage, NULL);
  const zt_model *m = zt_trainer_model(t);
  size_t n = zt_model_num_params(m);
  for (int load = 0; load < 2; load++) {
    recorder x = {.m = m, .tab = tab};
    pthread_mutex_init(&x.mu, NULL);
    pthread_cond_init(&x.cv, NULL);
    zt__shard_io io = {&x, rec_begin, rec_put, rec_get, rec_end, NULL, NULL};
    int rc = load ? t->path->load_shards(t, &io, err, sizeof err)
                  : t->path->save_shards(t, &io, err, sizeof err);
    fails += MC_EXPECT(rc == 0, "%s %s: %s", what, load ? "load_shards" : "save_shards", err);
    fails += check_recorder(&x, load ? "load_shards" : "save_shards", what);
    pthread_mutex_destroy(&x.mu);
    pthread_cond_destroy(&x.cv);
  }
  /* what the ranks' gets wrote is where the trainer keeps it */
  float *S = dpt_state_of(t);
  int bad = 0;
  for (int u = 0; u < zt_model_num_units(m); u++) {
    const zt_unit_info *ui = zt_model_unit(m, u);
    for (size_t i = ui->offset; i < ui->offset + ui->numel; i++)
      bad += S[i] != (float)(u + 1) || S[n + i] != -(float)(u + 1) || S[2 * n + i] != (float)u;
  }
  fails += MC_EXPECT(!bad, "%s: %d elements are not what the ranks' gets wrote", what, bad);
  free(S);
  return fails;
}

/* ---- one configuration --------------------------------------------------------------------- */

static int one_case(const ccase *c) {
  zt_model_cfg mc = dpt_model_cfg(ZT_ARCH_GPT);
  int32_t *tok = dpt_tokens(&mc, MICROS, 31 + (uint64_t)c->stage);
  size_t per = dpt_step_tokens(&mc, MICROS);
  char what[200], ck[600], flat[600], err[512];
  snprintf(what, sizeof what, "stage %d %s, optimizer %s (gpu_units %d host_units %d) params %s",
           c->stage, zt_dtype_name(c->dt), zt_offload_place_name(c->optimizer), c->gpu_units,
           c->host_units, zt_offload_place_name(c->params));
  const char *dir = mc_tmpdir();
  snprintf(ck, sizeof ck, "%s/ranked", dir);
  snprintf(flat, sizeof flat, "%s/flat", dir);
  int fails = 0;
  dpt_run ref, run;

  /* the uninterrupted W 2 run, saved at SAVE_AT */
  dpt_ranks x2;
  zt_trainer *a = open_w(&mc, c, &x2, 2);
  fails += dpt_run_steps(a, tok, per, 0, SAVE_AT, &ref, what);
  float *S = dpt_state_of(a);
  fails += MC_EXPECT(zt_trainer_save(a, ck, err, sizeof err) == 0, "%s: save: %s", what, err);
  fails += dpt_run_steps(a, tok, per, SAVE_AT, DPT_STEPS, &ref, what);
  fails += check_files(ck, zt_trainer_model(a), c, SAVE_AT, S, what);
  fails += threads(a, what);
  zt_trainer_close(a);
  dpt_ranks_close(&x2);

  /* resumed at W 2: each rank its own file */
  zt_trainer *b = open_w(&mc, c, &x2, 2);
  fails += MC_EXPECT(zt_trainer_load(b, ck, err, sizeof err) == 0, "%s: W 2 load: %s", what, err);
  fails += MC_EXPECT(zt_trainer_step_count(b) == SAVE_AT, "%s: W 2 step %d after the load", what,
                     zt_trainer_step_count(b));
  fails += same_state(b, S, "W 2 loaded");
  fails += dpt_run_steps(b, tok, per, SAVE_AT, DPT_STEPS, &run, what);
  fails += same_run(&run, &ref, SAVE_AT, DPT_STEPS, "W 2 resumed");
  zt_trainer_close(b);
  dpt_ranks_close(&x2);

  /* the same world at another stage: each rank its own file too */
  ccase o = *c;
  o.stage = c->stage % 3 + 1;
  if (o.stage != 3) o.params = ZT_PLACE_AUTO;
  b = open_w(&mc, &o, &x2, 2);
  fails += MC_EXPECT(zt_trainer_load(b, ck, err, sizeof err) == 0, "%s: W 2 stage %d load: %s",
                     what, o.stage, err);
  fails += same_state(b, S, "W 2 loaded at another stage");
  zt_trainer_close(b);
  dpt_ranks_close(&x2);

  /* re-sharded: W 3, W 1 */
  for (int W = 1; W <= 3; W += 2) {
    dpt_ranks xw;
    zt_trainer *t = open_w(&mc, c, &xw, W);
    char w[240];
    snprintf(w, sizeof w, "%s: W %d loaded", what, W);
    fails += MC_EXPECT(zt_trainer_load(t, ck, err, sizeof err) == 0, "%s: %s", w, err);
    fails += same_state(t, S, w);
    zt_trainer_close(t);
    dpt_ranks_close(&xw);
  }

  /* the plain trainer, and its flat checkpoint back into W 2 */
  zt_backend be;
  if (zt_backend_cpu_open(&be, 1) < 0) exit(1);
  zt_train_cfg tcp = train_cfg(c, 1);
  zt_trainer *tp = dpt_open_plain(&mc, &tcp, &be);
  fails += MC_EXPECT(zt_trainer_load(tp, ck, err, sizeof err) == 0, "%s: plain load: %s", what,
                     err);
  fails += same_state(tp, S, "plain loaded");
  fails += MC_EXPECT(zt_trainer_save(tp, flat, err, sizeof err) == 0, "%s: plain save: %s", what,
                     err);
  zt_trainer_close(tp);
  zt_backend_cpu_close(&be);
  b = open_w(&mc, c, &x2, 2);
  fails += MC_EXPECT(zt_trainer_load(b, flat, err, sizeof err) == 0, "%s: W 2 flat load: %s",
                     what, err);
  fails += same_state(b, S, "W 2 loaded from flat");
  fails += dpt_run_steps(b, tok, per, SAVE_AT, DPT_STEPS, &run, what);
  fails += same_run(&run, &ref, SAVE_AT, DPT_STEPS, "W 2 resumed from flat");
  zt_trainer_close(b);
  dpt_ranks_close(&x2);

  free(S);
  free(tok);
  mc_rmtree(dir);
  return fails;
}

/* ---- memory -------------------------------------------------------------------------------- */

/* What a checkpoint may take beyond the bound: the directory's and files' handles, paths. */
#define SLACK (64 * 1024)

static int within(const char *what, size_t bound) {
  int64_t peak = mc_heap_peak();
  printf("%-32s %8lld heap bytes (bound %zu + %d)\n", what, (long long)peak, bound, SLACK);
  return MC_EXPECT(peak > 0 && (size_t)peak <= bound + SLACK, "%s took %lld heap bytes, more "
                   "than the bound %zu + %d", what, (long long)peak, bound, SLACK);
}

static int memory(void) {
  if (mc_heap_count_start() < 0) {
    printf("memory: skipped (the allocator has no hooks to count the heap: a build without "
           "ASan)\n");
    return 0;
  }
  zt_model_cfg mc = mc_tiny(ZT_ARCH_GPT);
  mc.vocab = 64;
  mc.seq_len = 8;
  mc.d_model = 96;
  mc.n_heads = 4;
  mc.n_layers = 12;
  /* every unit but the first on the host tier: both of a rank's ways to its chunks */
  ccase c = {2, ZT_PLACE_HOST, ZT_PLACE_AUTO, 1, ZT_F32, 0};
  const char *dir = mc_tmpdir();
  char ck[600], err[512];
  snprintf(ck, sizeof ck, "%s/ranked", dir);
  int fails = 0;
  dpt_ranks x2, y2, x3;
  /* the open's transient heap (what it frees before it returns): no flat copy of the
   * parameters */
  mc_heap_mark();
  zt_trainer *a = open_w(&mc, &c, &x2, 2);
  int64_t transient = mc_heap_peak() - mc_heap_now();
  size_t n = zt_model_num_params(zt_trainer_model(a)), bound = zt_trainer_checkpoint_bytes(a);
  printf("%-32s %8lld heap bytes freed again (%zu parameters)\n", "W 2 open", (long long)transient,
         n);
  fails += MC_EXPECT(transient >= 0 && (size_t)transient < n * sizeof(float) / 2,
                     "the W 2 open took %lld heap bytes it freed again; a flat copy of the "
                     "parameters is %zu", (long long)transient, n * sizeof(float));
  fails += MC_EXPECT(bound + SLACK < n * sizeof(float), "%zu parameters: a flat copy (%zu bytes) "
                     "is within the bound %zu + %d", n, n * sizeof(float), bound, SLACK);
  mc_heap_mark();
  fails += MC_EXPECT(zt_trainer_save(a, ck, err, sizeof err) == 0, "save: %s", err);
  fails += within("W 2 per-rank save", bound);
  zt_trainer *b = open_w(&mc, &c, &y2, 2);
  mc_heap_mark();
  fails += MC_EXPECT(zt_trainer_load(b, ck, err, sizeof err) == 0, "W 2 load: %s", err);
  fails += within("W 2 load (each rank its file)", bound);
  zt_trainer *t3 = open_w(&mc, &c, &x3, 3);
  mc_heap_mark();
  fails += MC_EXPECT(zt_trainer_load(t3, ck, err, sizeof err) == 0, "W 3 load: %s", err);
  fails += within("W 3 load (re-sharded)", zt_trainer_checkpoint_bytes(t3));
  zt_backend be;
  if (zt_backend_cpu_open(&be, 1) < 0) exit(1);
  zt_train_cfg tcp = train_cfg(&c, 1);
  zt_trainer *tp = dpt_open_plain(&mc, &tcp, &be);
  mc_heap_mark();
  fails += MC_EXPECT(zt_trainer_load(tp, ck, err, sizeof err) == 0, "plain load: %s", err);
  fails += within("plain load (re-sharded)", zt_trainer_checkpoint_bytes(tp));
  float *S = dpt_state_of(a);
  fails += same_state(b, S, "memory: W 2 loaded") + same_state(t3, S, "memory: W 3 loaded") +
           same_state(tp, S, "memory: plain loaded");
  free(S);
  zt_trainer_close(tp);
  zt_backend_cpu_close(&be);
  zt_trainer_close(t3);
  zt_trainer_close(b);
  zt_trainer_close(a);
  dpt_ranks_close(&x3);
  dpt_ranks_close(&y2);
  dpt_ranks_close(&x2);
  mc_rmtree(dir);
  return fails;
}

/* ---- the admission's estimate ------------------------------------------------------------- */

/* zt_checkpoint_estimate_bytes_dp, from the configuration alone (job admission), is
 * zt_trainer_checkpoint_bytes of the opened trainer, for W 1-3, both archs, a stage and
 * placement of each kind; for W >= 2 it is more than the flat estimate (every rank's staging
 * at once), and a world out of range gets SIZE_MAX. With the test model's units the chunks of
 * W 3 are rounded up to the trainer's alignment, so the estimate must shard as it does. */
static int estimates(void) {
  static const ccase cases[] = {{1, ZT_PLACE_AUTO, ZT_PLACE_AUTO, 0, ZT_F32, 0},
                                {3, ZT_PLACE_HOST, ZT_PLACE_HOST, 1, ZT_F32, 0}};
  int fails = 0;
  for (int a = 0; a < 2; a++) {
    zt_model_cfg mc = dpt_model_cfg(a ? ZT_ARCH_ENCODER : ZT_ARCH_GPT);
    const char *arch = zt_arch_name(mc.arch);
    size_t flat = zt_checkpoint_estimate_bytes(&mc);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
      for (int W = 1; W <= 3; W++) {
        dpt_ranks x;
        zt_trainer *t = open_w(&mc, &cases[i], &x, W);
        size_t got = zt_trainer_checkpoint_bytes(t), est = zt_checkpoint_estimate_bytes_dp(&mc, W);
        fails += MC_EXPECT(est == got, "%s W %d stage %d: the estimate %zu, the trainer's %zu",
                           arch, W, cases[i].stage, est, got);
        fails += MC_EXPECT(W < 2 || est > flat, "%s W %d: the estimate %zu, the flat one %zu",
                           arch, W, est, flat);
        zt_trainer_close(t);
        dpt_ranks_close(&x);
      }
    fails += MC_EXPECT(zt_checkpoint_estimate_bytes_dp(&mc, 0) == SIZE_MAX &&
                           zt_checkpoint_estimate_bytes_dp(&mc, ZT_DP_MAX_WORLD + 1) == SIZE_MAX,
                       "%s: a world out of range has an estimate", arch);
  }
  return fails;
}

/* ---- refusals ------------------------------------------------------------------------------ */

static void copy_file(const char *from, const char *to) {
  FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
  int ch;
  if (!a || !b) exit(1);
  while ((ch = fgetc(a)) != EOF) fputc(ch, b);
  fclose(a);
  if (fclose(b) != 0) exit(1);
}

/* dir's checkpoint copied to dir/bad (rank files, model file, manifest). */
static void copy_ckpt(const char *src, const char *dst) {
  static const char *const files[] = {"manifest.json", "model.safetensors", "rank-0.safetensors",
                                      "rank-1.safetensors"};
  char a[700], b[700];
  mkdir(dst, 0755);
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    snprintf(a, sizeof a, "%s/%s", src, files[i]);
    snprintf(b, sizeof b, "%s/%s", dst, files[i]);
    copy_file(a, b);
  }
}

/* The manifest rewritten: key set to value (a JSON text) at the top or in units[0]. */
static void edit_manifest(const char *dir, int in_unit, const char *key, const char *value) {
  char path[700];
  snprintf(path, sizeof path, "%s/manifest.json", dir);
  json_t *j = json_load_file(path, 0, NULL), *v = json_loads(value, JSON_DECODE_ANY, NULL);
  if (!j || !v) exit(1);
  json_t *o = in_unit ? json_array_get(json_object_get(j, "units"), 0) : j;
  if (json_object_set_new(o, key, v) < 0 || json_dump_file(j, path, 0) < 0) exit(1);
  json_decref(j);
}

static int refused(zt_trainer *t, const float *fresh, const char *dir, int want,
                   const char *needle1, const char *needle2, const char *what) {
  char err[512] = "";
  int rc = zt_trainer_load(t, dir, err, sizeof err);
  int fails = MC_EXPECT(rc == want && strstr(err, needle1) && strstr(err, needle2),
                        "%s: load returned %d (want %d): %s (want it to name %s and %s)", what,
                        rc, want, err, needle1, needle2);
  printf("%s: %s\n", what, err);
  fails += MC_EXPECT(zt_trainer_step_count(t) == 0, "%s: step %d after a refused load", what,
                     zt_trainer_step_count(t));
  fails += same_state(t, fresh, what);
  return fails;
}

static int refusals(void) {
  zt_model_cfg mc = dpt_model_cfg(ZT_ARCH_GPT);
  ccase c = {2, ZT_PLACE_HOST, ZT_PLACE_AUTO, 1, ZT_F32, 0};
  int32_t *tok = dpt_tokens(&mc, MICROS, 3);
  size_t per = dpt_step_tokens(&mc, MICROS);
  const char *dir = mc_tmpdir();
  char ck[600], bad[600], path[700], err[512];
  snprintf(ck, sizeof ck, "%s/ranked", dir);
  snprintf(bad, sizeof bad, "%s/bad", dir);
  int fails = 0;
  dpt_run run;
  dpt_ranks x2, y2;
  zt_trainer *a = open_w(&mc, &c, &x2, 2);
  fails += dpt_run_steps(a, tok, per, 0, 1, &run, "refusals");
  fails += MC_EXPECT(zt_trainer_save(a, ck, err, sizeof err) == 0, "save: %s", err);
  float *S1 = dpt_state_of(a);
  zt_trainer *t = open_w(&mc, &c, &y2, 2);
  float *fresh = dpt_state_of(t);

  copy_ckpt(ck, bad);
  snprintf(path, sizeof path, "%s/rank-1.safetensors", bad);
  unlink(path);
  fails += refused(t, fresh, bad, -ENOENT, "rank-1.safetensors", "missing", "rank 1's file gone");

  copy_ckpt(ck, bad);
  snprintf(path, sizeof path, "%s/rank-0.safetensors", bad);
  struct stat st;
  if (stat(path, &st) < 0 || truncate(path, st.st_size - 8) < 0) exit(1);
  fails += refused(t, fresh, bad, -EINVAL, "rank-0.safetensors", "ranks[0].bytes",
                   "rank 0's file truncated");

  copy_ckpt(ck, bad);
  snprintf(path, sizeof path, "%s/manifest.json", bad);
  FILE *f = fopen(path, "r+");
  if (!f || fputs("{\"format\": 1, ", f) < 0 || fclose(f) != 0) exit(1);
  fails += refused(t, fresh, bad, -EINVAL, "manifest.json", "JSON", "a corrupt manifest");

  copy_ckpt(ck, bad);
  edit_manifest(bad, 0, "world", "3");
  fails += refused(t, fresh, bad, -EINVAL, "manifest.json", "ranks", "world 3 with 2 ranks");

  copy_ckpt(ck, bad);
  edit_manifest(bad, 1, "numel", "12");
  fails += refused(t, fresh, bad, -EINVAL, "manifest.json", "units[0].numel", "a foreign unit");

  copy_ckpt(ck, bad);
  edit_manifest(bad, 1, "chunk", "8");
  fails += refused(t, fresh, bad, -EINVAL, "manifest.json", "units[0].chunk",
                   "chunks that do not cover the unit");

  /* and the intact copy loads */
  copy_ckpt(ck, bad);
  fails += MC_EXPECT(zt_trainer_load(t, bad, err, sizeof err) == 0 &&
                     zt_trainer_step_count(t) == 1, "the intact copy: %s", err);
  fails += same_state(t, S1, "the intact copy loaded");
  /* a save whose rank files pass the file size limit (the gathered model file does not) */
  struct stat sm, sr;
  snprintf(path, sizeof path, "%s/model.safetensors", ck);
  if (stat(path, &sm) < 0) exit(1);
  snprintf(path, sizeof path, "%s/rank-0.safetensors", ck);
  if (stat(path, &sr) < 0) exit(1);
  fails += MC_EXPECT(sm.st_size < sr.st_size, "the model file %lld bytes, a rank's %lld",
                     (long long)sm.st_size, (long long)sr.st_size);
  fails += dpt_run_steps(a, tok, per, 1, 2, &run, "refusals");
  struct rlimit old, lim;
  if (getrlimit(RLIMIT_FSIZE, &old) < 0) exit(1);
  lim = old;
  lim.rlim_cur = (rlim_t)(sm.st_size + sr.st_size) / 2;
  signal(SIGXFSZ, SIG_IGN);
  if (setrlimit(RLIMIT_FSIZE, &lim) < 0) exit(1);
  int rc = zt_trainer_save(a, ck, err, sizeof err);
  if (setrlimit(RLIMIT_FSIZE, &old) < 0) exit(1);
  signal(SIGXFSZ, SIG_DFL);
  printf("a save past the file size limit: %s\n", err);
  fails += MC_EXPECT(rc == -EFBIG && strstr(err, "rank-"), "a save past the file size limit: "
                     "%d %s", rc, err);
  fails += MC_EXPECT(zt_trainer_load(t, ck, err, sizeof err) == 0 &&
                     zt_trainer_step_count(t) == 1, "the checkpoint after a failed save: %s",
                     err);
  fails += dpt_run_steps(a, tok, per, 2, 3, &run, "after the failed save");
  fails += MC_EXPECT(zt_trainer_save(a, ck, err, sizeof err) == 0, "save again: %s", err);
  fails += MC_EXPECT(zt_trainer_load(t, ck, err, sizeof err) == 0 &&
                     zt_trainer_step_count(t) == 3, "the checkpoint saved again: %s", err);

  free(fresh);
  free(S1);
  zt_trainer_close(t);
  zt_trainer_close(a);
  dpt_ranks_close(&y2);
  dpt_ranks_close(&x2);
  free(tok);
  mc_rmtree(dir);
  return fails;
}

int main(void) {
  static const ccase cases[] = {
      {1, ZT_PLACE_AUTO, ZT_PLACE_AUTO, 0, ZT_F32, 0},
      {2, ZT_PLACE_AUTO, ZT_PLACE_AUTO, 0, ZT_F16, 0},
      {3, ZT_PLACE_AUTO, ZT_PLACE_AUTO, 0, ZT_BF16, 0},
      {1, ZT_PLACE_HOST, ZT_PLACE_AUTO, 0, ZT_BF16, 0},
      {2, ZT_PLACE_HOST, ZT_PLACE_AUTO, 1, ZT_F32, 0},
      {3, ZT_PLACE_HOST, ZT_PLACE_AUTO, 1, ZT_F32, 0},
      {3, ZT_PLACE_HOST, ZT_PLACE_HOST, 1, ZT_BF16, 0},
  };
  static const ccase nvme_cases[] = {
      {1, ZT_PLACE_NVME, ZT_PLACE_AUTO, 0, ZT_F32, 0},
      {2, ZT_PLACE_NVME, ZT_PLACE_AUTO, 1, ZT_BF16, 0},
      {3, ZT_PLACE_NVME, ZT_PLACE_HOST, 1, ZT_F16, 0},
      /* host and NVMe together: a unit's chunks through the host tier or its files */
      {2, ZT_PLACE_NVME, ZT_PLACE_AUTO, 1, ZT_BF16, 2},
      {3, ZT_PLACE_NVME, ZT_PLACE_HOST, 0, ZT_F32, 2},
      /* params nvme: the NVMe units' parameters through their master files */
      {3, ZT_PLACE_NVME, ZT_PLACE_NVME, 1, ZT_BF16, 1},
  };
  int fails = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) fails += one_case(&cases[i]);
  /* io_uring may be forbidden here (a sandbox, an old kernel) */
  const char *nv = mc_tmpdir();
  zt_nvme_store *st = NULL;
  char why[256];
  if (zt_nvme_store_open(&st, nv, NULL, why, sizeof why) == 0) {
    snprintf(nvme_dir, sizeof nvme_dir, "%s", nv);
    for (size_t i = 0; i < sizeof nvme_cases / sizeof nvme_cases[0]; i++)
      fails += one_case(&nvme_cases[i]);
  } else {
    printf("optimizer nvme: skipped (%s)\n", why);
  }
  zt_nvme_store_close(st);
  mc_rmtree(nv);
  fails += estimates();
  fails += refusals();
  fails += memory();
  if (fails) fprintf(stderr, "%d failures\n", fails);
  else printf("ok\n");
  return fails ? 1 : 0;
}
