/* Data-parallel parts (engine/train/dp/dp.h): one CPU communicator group of world W driven as two
 * parts, the one holding rank 0 and the rest, each a zt_trainer_open_dp with its own threads,
 * opened one after the other on this thread (so the initial parameter write needs no
 * collective) and then driven from two threads at once, against one trainer running all W
 * ranks on the same tokens. For stages 1, 2, 3, both archs, an even and uneven split, and bf16:
 * - losses and norms bitwise those of the one trainer, on both parts, also when the parts
 *   offload (optimizer host or nvme, some or all units; params host or nvme for stage 3);
 * - step flags set on either part come back ORed in both parts' results (and in the one
 *   trainer's; a plain trainer reports 0);
 * - a checkpoint saved by the rank-0 part while the other sends its state (both parts see the
 *   directory) is per rank, each part's ranks writing their own files: manifest.json,
 *   model.safetensors and every rank's file byte for byte the one trainer's, nothing of the flat
 *   layout, no probe marker or temporary directory left; an export is the one trainer's too;
 * - loaded by the rank-0 part while the other receives (the parts' checkpoint, or with an
 *   uneven split the one trainer's), each rank reading its own file, it resumes with the same
 *   losses as the uninterrupted run; the parts' loaded into the one trainer of all the ranks it
 *   gives the state the resumed parts gathered and goes on bitwise as the uninterrupted run;
 *   into a plain trainer and into a W 2 trainer of another stage it gives that state too, and
 *   goes on as the existing cross-world test does; the plain trainer's flat checkpoint of it
 *   scattered into the parts gives that state;
 * - the state moves in pieces of whole units (trainer_internal.h), which the other part follows:
 *   a save and a load through the parts take the heap zt_trainer_checkpoint_bytes says on a
 *   model whose flat parameters would not fit in it (counted through the sanitizer allocator's
 *   hooks; skipped without them);
 * - a non-finite step still reports the flags; a load the rank-0 part gives up before the
 *   state releases the other part (-ECANCELED) and both go on, as after a save that fails
 *   between its pieces (a file size limit past the ranks' files but within the gathered
 *   model.safetensors), whose temporary directory goes, the previous checkpoint staying; a load
 *   given up after a piece fails both parts (-EIO, their states partly the checkpoint's) and
 *   both refuse steps; mismatched state calls abort both parts (then -EIO); bad rank0 / local,
 *   ranks that do not match them, and state calls on the wrong part are refused naming the
 *   field or the call to make;
 * - a rank's file that fails (a file size limit only the smallest rank's file fits under) fails
 *   the save on both parts with its code and a message naming it, also on the part whose rank
 *   wrote its file; nothing changed, both go on;
 * - parts that do not see the same directory (the other part's threads with a working
 *   directory of their own, unshare(CLONE_FS), and relative paths; skipped where unshare is
 *   forbidden): a save the other part does not see is flat, through rank 0; a per-rank
 *   checkpoint whose manifest the other part does not see (its view holds another one) is
 *   scattered through rank 0, the state saved; a save where the other part sees the marker but
 *   its rank cannot create its file fails on both parts, the rank-0 part naming that file. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* internal: a load given up after its first piece is made through the path's write_state and
 * abandon_state, as zt_trainer_load makes one when it fails there */
#include "engine/train/trainer_internal.h"
#include "tests/unit/dp/dptest.h"
#include "tests/unit/model/mcheck.h"

#define SAVE_AT 3

typedef struct run_out {
  double loss[DPT_STEPS], norm[DPT_STEPS];
  unsigned flags[DPT_STEPS];
} run_out;

/* One trainer call, run on this thread or another. */
typedef enum call_kind {
  DO_STEPS, DO_SAVE, DO_EXPORT, DO_GET_STATE, DO_SEND, DO_LOAD, DO_RECEIVE, DO_HALF_LOAD, DO_OPEN
} call_kind;

typedef struct call {
  call_kind kind;
  zt_trainer *t;
  const int32_t *tok; /* DO_STEPS: steps from .. to - 1 of tok, `per` tokens each */
  size_t per;
  int from, to;
  const unsigned *flags; /* per step, set before it; NULL: none */
  run_out *out;
  const char *path;  /* DO_SAVE, DO_EXPORT, DO_LOAD */
  int step, adam_step; /* DO_RECEIVE */
  float *state;      /* DO_GET_STATE: params, m, v back to back */
  /* DO_OPEN: the part of x's world that runs ranks rank0 .. rank0 + local - 1, into t */
  const zt_model_cfg *mc;
  const zt_train_cfg *tc;
  dpt_ranks *x;
  int stage, rank0, local;
  /* run on a thread with a working directory of its own, cwd (unshare(CLONE_FS)), whose
   * threads (a part's ranks' when it opens one) share it; NULL: the process's */
  const char *cwd;
  int rc;
  char err[512];
} call;

static void *call_run(void *arg) {
  call *c = arg;
  c->err[0] = 0;
  c->rc = 0;
  if (c->cwd && (unshare(CLONE_FS) < 0 || chdir(c->cwd) < 0)) {
    c->rc = -errno;
    snprintf(c->err, sizeof c->err, "a working directory of its own (%s): %s", c->cwd,
             strerror(errno));
    return NULL;
  }
  switch (c->kind) {
  case DO_STEPS:
    for (int i = c->from; i < c->to && c->rc == 0; i++) {
      zt_step_result r;
      memset(&r, 0xff, sizeof r); /* every field must be written */
      if (c->flags) zt_trainer_dp_set_flags(c->t, c->flags[i]);
      c->rc = zt_trainer_step(c->t, c->tok + (size_t)i * c->per, &r, c->err, sizeof c->err);
      c->out->loss[i] = r.loss;
      c->out->norm[i] = r.grad_norm;
      c->out->flags[i] = r.flags;
    }
    break;
  case DO_SAVE: c->rc = zt_trainer_save(c->t, c->path, c->err, sizeof c->err); break;
  case DO_EXPORT: c->rc = zt_trainer_export(c->t, c->path, c->err, sizeof c->err); break;
  case DO_GET_STATE: {
    size_t n = zt_model_num_params(zt_trainer_model(c->t));
    c->rc = zt_trainer_get_state(c->t, c->state, c->state + n, c->state + 2 * n);
    break;
  }
  case DO_SEND: c->rc = zt_trainer_dp_send_state(c->t, c->err, sizeof c->err); break;
  case DO_LOAD: c->rc = zt_trainer_load(c->t, c->path, c->err, sizeof c->err); break;
  case DO_RECEIVE:
    c->rc = zt_trainer_dp_receive_state(c->t, c->step, c->adam_step, c->err, sizeof c->err);
    break;
  case DO_HALF_LOAD: {
    /* what zt_trainer_load does when it fails after its first piece: the first unit written
     * (zeros), then the call given up */
    size_t u = zt_model_unit(zt_trainer_model(c->t), 0)->numel;
    float *z = calloc(u, sizeof *z);
    if (!z) exit(1);
    c->rc = c->t->path->write_state(c->t, 0, 1, z, z, z, c->err, sizeof c->err);
    c->t->path->abandon_state(c->t);
    free(z);
    break;
  }
  case DO_OPEN: c->t = dpt_open_dp(c->mc, c->tc, c->x, c->stage, c->rank0, c->local); break;
  }
  return NULL;
}

/* a on this thread and b on another, at the same time, as two daemons would. */
static void together(call *a, call *b) {
  pthread_t th;
  if (pthread_create(&th, NULL, call_run, b) != 0) exit(1);
  call_run(a);
  pthread_join(th, NULL);
}

static int both_ok(const call *a, const call *b, const char *what) {
  return MC_EXPECT(a->rc == 0, "%s: rank-0 part: %d %s", what, a->rc, a->err) +
         MC_EXPECT(b->rc == 0, "%s: other part: %d %s", what, b->rc, b->err);
}

/* Steps from .. to - 1 on both parts at once. */
static int steps_together(zt_trainer *a, zt_trainer *b, const int32_t *tok, size_t per, int from,
                          int to, const unsigned *fa, const unsigned *fb, run_out *oa,
                          run_out *ob, const char *what) {
  call ca = {.kind = DO_STEPS, .t = a, .tok = tok, .per = per, .from = from, .to = to,
             .flags = fa, .out = oa};
  call cb = ca;
  cb.t = b;
  cb.flags = fb;
  cb.out = ob;
  together(&ca, &cb);
  return both_ok(&ca, &cb, what);
}

static int run_steps(zt_trainer *t, const int32_t *tok, size_t per, int from, int to,
                     const unsigned *flags, run_out *o, const char *what) {
  call c = {.kind = DO_STEPS, .t = t, .tok = tok, .per = per, .from = from, .to = to,
            .flags = flags, .out = o};
  call_run(&c);
  return MC_EXPECT(c.rc == 0, "%s: %d %s", what, c.rc, c.err);
}

/* Bitwise: losses, norms and flags. */
static int same_run(const run_out *a, const run_out *ref, int from, int to, const char *what) {
  int fails = 0;
  for (int i = from; i < to; i++)
    fails += MC_EXPECT(a->loss[i] == ref->loss[i] && a->norm[i] == ref->norm[i] &&
                       a->flags[i] == ref->flags[i], "%s: step %d loss %.17g norm %.17g flags %u, "
                       "reference %.17g %.17g %u", what, i + 1, a->loss[i], a->norm[i],
                       a->flags[i], ref->loss[i], ref->norm[i], ref->flags[i]);
  return fails;
}

/* The first loss bitwise, later ones and the norms within tol (the order of the sums moves). */
static int close_run(const run_out *a, const run_out *ref, int from, int to, double tol,
                     const char *what) {
  int fails = 0;
  for (int i = from; i < to; i++) {
    int ok = i == from ? a->loss[i] == ref->loss[i]
                       : fabs(a->loss[i] - ref->loss[i]) <= tol * fabs(ref->loss[i]);
    fails += MC_EXPECT(ok && fabs(a->norm[i] - ref->norm[i]) <= 10 * tol * fabs(ref->norm[i]),
                       "%s: step %d loss %.17g norm %.17g, reference %.17g %.17g", what, i + 1,
                       a->loss[i], a->norm[i], ref->loss[i], ref->norm[i]);
  }
  return fails;
}

/* A per-rank checkpoint in dir of W ranks, byte for byte the one in ref (manifest, gathered
 * parameters, every rank's file), with nothing of the flat layout, no probe marker left and no
 * temporary directory beside it. */
static int same_ranked(const char *ref, const char *dir, int W, const char *what) {
  char a[700], b[700];
  int fails = 0;
  const char *same[] = {"manifest.json", "model.safetensors"};
  const char *none[] = {"optimizer.safetensors", "trainer.json", "probe"};
  for (size_t i = 0; i < 2 + (size_t)W; i++) {
    char rank[48];
    snprintf(rank, sizeof rank, "rank-%zu.safetensors", i < 2 ? 0 : i - 2);
    snprintf(a, sizeof a, "%s/%s", ref, i < 2 ? same[i] : rank);
    snprintf(b, sizeof b, "%s/%s", dir, i < 2 ? same[i] : rank);
    fails += mc_same_file(a, b);
  }
  for (size_t i = 0; i < 3; i++) {
    snprintf(b, sizeof b, "%s/%s", dir, none[i]);
    fails += MC_EXPECT(access(b, F_OK) < 0, "%s: %s in a per-rank checkpoint", what, b);
  }
  snprintf(b, sizeof b, "%s.tmp", dir);
  fails += MC_EXPECT(access(b, F_OK) < 0, "%s: %s left behind", what, b);
  return fails;
}

/* The parts' state, gathered by the rank-0 part while the other sends. */
static float *parts_state(zt_trainer *a, zt_trainer *b, int *fails) {
  size_t n = zt_model_num_params(zt_trainer_model(a));
  float *x = malloc(3 * n * sizeof *x);
  if (!x) exit(1);
  call ca = {.kind = DO_GET_STATE, .t = a, .state = x}, cb = {.kind = DO_SEND, .t = b};
  together(&ca, &cb);
  *fails += both_ok(&ca, &cb, "get_state / send_state");
  return x;
}

typedef struct cfg {
  zt_arch arch;
  int stage, W, split, G; /* the rank-0 part runs ranks 0 .. split - 1 */
  float clip;
  zt_dtype dt;
  double tol; /* cross-world losses */
  /* the parts' offload (dp.h; the one trainer keeps everything on its devices) */
  zt_offload_place optimizer, params;
  int gpu_units;
} cfg;

static char nvme_dir[600]; /* optimizer nvme's directory ("" without io_uring: skipped) */

/* The part of c's world that runs ranks rank0 .. rank0 + local - 1. */
static zt_trainer *open_part(const zt_model_cfg *mc, const zt_train_cfg *tc, dpt_ranks *x,
                             const cfg *c, int rank0, int local) {
  zt_dp_cfg dc = {.world = c->W, .zero_stage = c->stage, .rank0 = rank0, .local = local,
                  .optimizer = c->optimizer, .params = c->params, .gpu_units = c->gpu_units,
                  .nvme_dir = nvme_dir};
  return dpt_open_dp_cfg(mc, tc, x, &dc);
}

static int parts(const cfg *c) {
  zt_model_cfg mc = dpt_model_cfg(c->arch);
  zt_train_cfg tc = dpt_train_cfg(c->G, c->clip, c->dt);
  int W = c->W, G = c->G, fails = 0;
  int32_t *tok = dpt_tokens(&mc, W * G, 11 + (uint64_t)W * 10 + (uint64_t)G);
  size_t per = dpt_step_tokens(&mc, W * G);
  const unsigned fa[DPT_STEPS] = {0, ZT_DP_FLAG_STOP, 0, 0, 0};
  const unsigned fb[DPT_STEPS] = {0, ZT_DP_FLAG_CHECKPOINT, 0, ZT_DP_FLAG_STOP, 0};
  unsigned fboth[DPT_STEPS];
  for (int i = 0; i < DPT_STEPS; i++) fboth[i] = fa[i] | fb[i];
  char what[200], dir_ref[600], dir_parts[600], file_a[700], file_b[700], err[512];
  snprintf(what, sizeof what, "%s stage %d W %d split %d G %d %s, optimizer %s (gpu_units %d) "
           "params %s", zt_arch_name(c->arch), c->stage, W, c->split, G, zt_dtype_name(c->dt),
           zt_offload_place_name(c->optimizer), c->gpu_units, zt_offload_place_name(c->params));
  const char *dir = mc_tmpdir();
  snprintf(dir_ref, sizeof dir_ref, "%s/ref", dir);
  snprintf(dir_parts, sizeof dir_parts, "%s/parts", dir);

  /* the one trainer of all the ranks: its run, checkpoint and export at SAVE_AT */
  dpt_ranks xr;
  dpt_ranks_open(&xr, W);
  zt_trainer *tr = dpt_open_dp(&mc, &tc, &xr, c->stage, 0, 0);
  run_out ref;
  fails += run_steps(tr, tok, per, 0, SAVE_AT, fboth, &ref, what);
  fails += MC_EXPECT(zt_trainer_save(tr, dir_ref, err, sizeof err) == 0, "save: %s", err);
  snprintf(file_a, sizeof file_a, "%s/ref.safetensors", dir);
  fails += MC_EXPECT(zt_trainer_export(tr, file_a, err, sizeof err) == 0, "export: %s", err);
  fails += run_steps(tr, tok, per, SAVE_AT, DPT_STEPS, fboth, &ref, what);
  for (int i = 0; i < DPT_STEPS; i++)
    fails += MC_EXPECT(ref.flags[i] == fboth[i], "%s: one trainer, step %d flags %u, want %u",
                       what, i + 1, ref.flags[i], fboth[i]);
  zt_trainer_close(tr);
  dpt_ranks_close(&xr);

  /* the parts: the same run, the checkpoint and export between steps */
  dpt_ranks xp;
  dpt_ranks_open(&xp, W);
  zt_trainer *a = open_part(&mc, &tc, &xp, c, 0, c->split);
  zt_trainer *b = open_part(&mc, &tc, &xp, c, c->split, W - c->split);
  size_t bytes_b = 0;
  for (int r = c->split; r < W; r++) bytes_b += zt_trainer_dp_rank_bytes(b, r);
  fails += MC_EXPECT(bytes_b == zt_trainer_backend_bytes(b) && bytes_b > 0 &&
                     zt_trainer_dp_rank_bytes(b, 0) == 0 &&
                     zt_trainer_dp_rank_bytes(a, c->split) == 0,
                     "%s: the other part's bytes %zu, its ranks' sum %zu", what,
                     zt_trainer_backend_bytes(b), bytes_b);
  run_out oa, ob;
  fails += steps_together(a, b, tok, per, 0, SAVE_AT, fa, fb, &oa, &ob, what);
  call ca = {.kind = DO_SAVE, .t = a, .path = dir_parts}, cb = {.kind = DO_SEND, .t = b};
  together(&ca, &cb);
  fails += both_ok(&ca, &cb, "save / send_state");
  snprintf(file_b, sizeof file_b, "%s/parts.safetensors", dir);
  ca = (call){.kind = DO_EXPORT, .t = a, .path = file_b};
  together(&ca, &cb);
  fails += both_ok(&ca, &cb, "export / send_state");
  fails += mc_same_file(file_a, file_b);
  /* every part sees the directory: per rank, each part's ranks' files its own, every file
   * byte for byte the one trainer's */
  fails += same_ranked(dir_ref, dir_parts, W, what);
  fails += steps_together(a, b, tok, per, SAVE_AT, DPT_STEPS, fa, fb, &oa, &ob, what);
  fails += same_run(&oa, &ref, 0, DPT_STEPS, "rank-0 part vs one trainer");
  fails += same_run(&ob, &ref, 0, DPT_STEPS, "other part vs one trainer");
  zt_trainer_close(b);
  zt_trainer_close(a);
  dpt_ranks_close(&xp);

  /* resumed parts: the rank-0 part loads while the other receives */
  dpt_ranks_open(&xp, W);
  a = open_part(&mc, &tc, &xp, c, 0, c->split);
  b = open_part(&mc, &tc, &xp, c, c->split, W - c->split);
  /* the state loaded either way is checked below against the parts' checkpoint's in a plain
   * trainer */
  ca = (call){.kind = DO_LOAD, .t = a, .path = W - c->split > c->split ? dir_ref : dir_parts};
  cb = (call){.kind = DO_RECEIVE, .t = b, .step = SAVE_AT, .adam_step = SAVE_AT};
  together(&ca, &cb);
  fails += both_ok(&ca, &cb, "load / receive_state");
  fails += MC_EXPECT(zt_trainer_step_count(a) == SAVE_AT && zt_trainer_step_count(b) == SAVE_AT,
                     "%s: steps %d and %d after the load", what, zt_trainer_step_count(a),
                     zt_trainer_step_count(b));
  float *got = parts_state(a, b, &fails);
  fails += steps_together(a, b, tok, per, SAVE_AT, DPT_STEPS, fa, fb, &oa, &ob, what);
  fails += same_run(&oa, &ref, SAVE_AT, DPT_STEPS, "resumed rank-0 part vs one trainer");
  fails += same_run(&ob, &ref, SAVE_AT, DPT_STEPS, "resumed other part vs one trainer");

  /* the parts' checkpoint in the one trainer of all the ranks: each rank its own file, the
   * state the resumed parts gathered, and on bitwise as the uninterrupted run */
  dpt_ranks_open(&xr, W);
  tr = dpt_open_dp(&mc, &tc, &xr, c->stage, 0, 0);
  fails += MC_EXPECT(zt_trainer_load(tr, dir_parts, err, sizeof err) == 0, "one trainer load: %s",
                     err);
  float *got_all = dpt_state_of(tr);
  size_t bytes = 3 * zt_model_num_params(zt_trainer_model(tr)) * sizeof(float);
  fails += MC_EXPECT(memcmp(got_all, got, bytes) == 0, "%s: the one trainer loaded another "
                     "state than the resumed parts", what);
  free(got_all);
  run_out ow;
  fails += run_steps(tr, tok, per, SAVE_AT, DPT_STEPS, fboth, &ow, "one trainer loaded");
  fails += same_run(&ow, &ref, SAVE_AT, DPT_STEPS, "one trainer loaded vs uninterrupted");
  zt_trainer_close(tr);
  dpt_ranks_close(&xr);

  /* the parts' checkpoint in a plain trainer and in a W 2 trainer of another stage: the state
   * the resumed parts gathered, then the losses as in the cross-world test */
  zt_backend be;
  if (zt_backend_cpu_open(&be, 1) < 0) exit(1);
  zt_train_cfg tcp = tc;
  tcp.grad_accum = W * G;
  zt_trainer *tp = dpt_open_plain(&mc, &tcp, &be);
  fails += MC_EXPECT(zt_trainer_load(tp, dir_parts, err, sizeof err) == 0, "plain load: %s", err);
  float *want = dpt_state_of(tp);
  fails += MC_EXPECT(memcmp(got, want, bytes) == 0, "%s: the resumed parts' state is not the "
                     "plain trainer's of the same checkpoint", what);
  /* its flat checkpoint scattered into the parts (the ranks' chunks cut out of each unit,
   * wherever each part keeps them) */
  char dir_flat[600];
  snprintf(dir_flat, sizeof dir_flat, "%s/flat", dir);
  fails += MC_EXPECT(zt_trainer_save(tp, dir_flat, err, sizeof err) == 0, "plain save: %s", err);
  ca = (call){.kind = DO_LOAD, .t = a, .path = dir_flat};
  cb = (call){.kind = DO_RECEIVE, .t = b, .step = SAVE_AT, .adam_step = SAVE_AT};
  together(&ca, &cb);
  fails += both_ok(&ca, &cb, "flat load / receive_state");
  float *got_flat = parts_state(a, b, &fails);
  fails += MC_EXPECT(memcmp(got_flat, want, bytes) == 0, "%s: a flat checkpoint scattered into "
                     "the parts is not its state", what);
  free(got_flat);
  run_out op;
  fails += run_steps(tp, tok, per, SAVE_AT, DPT_STEPS, NULL, &op, "plain loaded");
  fails += close_run(&op, &ref, SAVE_AT, DPT_STEPS, c->tol, "plain loaded vs one trainer");
  for (int i = SAVE_AT; i < DPT_STEPS; i++)
    fails += MC_EXPECT(op.flags[i] == 0, "plain trainer: step %d flags %u", i + 1, op.flags[i]);
  dpt_ranks x2;
  dpt_ranks_open(&x2, 2);
  zt_train_cfg tc2 = tc;
  tc2.grad_accum = W * G / 2;
  zt_trainer *t2 = dpt_open_dp(&mc, &tc2, &x2, c->stage % 3 + 1, 0, 0);
  fails += MC_EXPECT(zt_trainer_load(t2, dir_parts, err, sizeof err) == 0, "W 2 load: %s", err);
  float *got2 = dpt_state_of(t2);
  fails += MC_EXPECT(memcmp(got2, want, bytes) == 0, "%s: W 2 stage %d loaded another state",
                     what, c->stage % 3 + 1);
  fails += run_steps(t2, tok, per, SAVE_AT, DPT_STEPS, NULL, &op, "W 2 loaded");
  fails += close_run(&op, &ref, SAVE_AT, DPT_STEPS, c->tol, "W 2 loaded vs one trainer");
  zt_trainer_close(t2);
  dpt_ranks_close(&x2);
  zt_trainer_close(tp);
  zt_backend_cpu_close(&be);
  zt_trainer_close(b);
  zt_trainer_close(a);
  dpt_ranks_close(&xp);
  if (fails) fprintf(stderr, "in %s\n", what);
  free(got);
  free(got2);
  free(want);
  mc_rmtree(dir);
  free(tok);
  return fails;
}

/* A nan parameter: both parts' steps fail with -ERANGE, still reporting the step's flags (the
 * rank-0 part's STOP), which the next step no longer carries. */
static int nonfinite_flags(void) {
  zt_model_cfg mc = dpt_model_cfg(ZT_ARCH_GPT);
  const char *dir = mc_tmpdir();
  int fails = 0;
  float *p = dpt_nan_init(&mc, dir, NULL, &fails);
  zt_train_cfg tc = dpt_train_cfg(1, 0, ZT_F32);
  int32_t *tok = dpt_tokens(&mc, 3, 3);
  size_t per = dpt_step_tokens(&mc, 3);
  dpt_ranks x;
  dpt_ranks_open(&x, 3);
  zt_trainer *a = dpt_open_dp(&mc, &tc, &x, 2, 0, 1), *b = dpt_open_dp(&mc, &tc, &x, 2, 1, 2);
  const unsigned fa[DPT_STEPS] = {ZT_DP_FLAG_STOP, 0};
  run_out oa, ob;
  call ca = {.kind = DO_STEPS, .t = a, .tok = tok, .per = per, .from = 0, .to = 1, .flags = fa,
             .out = &oa};
  call cb = ca;
  cb.t = b;
  cb.flags = NULL;
  cb.out = &ob;
  for (int i = 0; i < 2; i++) {
    together(&ca, &cb);
    unsigned want = i == 0 ? ZT_DP_FLAG_STOP : 0;
    fails += MC_EXPECT(ca.rc == -ERANGE && cb.rc == -ERANGE && oa.flags[0] == want &&
                       ob.flags[0] == want, "nan step %d: %d %d, flags %u %u (want %u): %s",
                       i + 1, ca.rc, cb.rc, oa.flags[0], ob.flags[0], want, ca.err);
    ca.flags = NULL;
  }
  fails += MC_EXPECT(zt_trainer_step_count(a) == 0 && zt_trainer_step_count(b) == 0,
                     "a refused step counted");
  zt_trainer_close(b);
  zt_trainer_close(a);
  dpt_ranks_close(&x);
  mc_rmtree(dir);
  free(tok);
  free(p);
  return fails;
}

/* The rank-0 part's load fails before the state (no such checkpoint): the other part's receive
 * ends with -ECANCELED and nothing changed; both step on. Then the calls mismatched (a save
 * against a receive): both fail, and both refuse the next step. */
static int abandoned_and_mismatched(void) {
  zt_model_cfg mc = dpt_model_cfg(ZT_ARCH_ENCODER);
  zt_train_cfg tc = dpt_train_cfg(1, 0, ZT_F32);
  int32_t *tok = dpt_tokens(&mc, 3, 8);
  size_t per = dpt_step_tokens(&mc, 3);
  const char *dir = mc_tmpdir();
  char path[600];
  snprintf(path, sizeof path, "%s/none", dir);
  dpt_ranks x;
  dpt_ranks_open(&x, 3);
  zt_trainer *a = dpt_open_dp(&mc, &tc, &x, 3, 0, 2), *b = dpt_open_dp(&mc, &tc, &x, 3, 2, 1);
  call ca = {.kind = DO_LOAD, .t = a, .path = path};
  call cb = {.kind = DO_RECEIVE, .t = b, .step = 4, .adam_step = 4};
  together(&ca, &cb);
  int fails = MC_EXPECT(ca.rc < 0 && strstr(ca.err, "none"), "load of nothing: %d %s", ca.rc,
                        ca.err);
  fails += MC_EXPECT(cb.rc == -ECANCELED && strstr(cb.err, "gave up") &&
                     zt_trainer_step_count(b) == 0, "receive against a failed load: %d %s",
                     cb.rc, cb.err);
  run_out oa, ob;
  fails += steps_together(a, b, tok, per, 0, 1, NULL, NULL, &oa, &ob, "after the failed load");
  snprintf(path, sizeof path, "%s/ckpt", dir);
  ca = (call){.kind = DO_SAVE, .t = a, .path = path};
  cb = (call){.kind = DO_RECEIVE, .t = b, .step = 1, .adam_step = 1};
  together(&ca, &cb);
  fails += MC_EXPECT(ca.rc < 0, "a save against a receive succeeded");
  fails += MC_EXPECT(cb.rc == -EINVAL && strstr(cb.err, "reads the state") &&
                     strstr(cb.err, "zt_trainer_dp_receive_state"), "receive against a save: %d "
                     "%s", cb.rc, cb.err);
  ca = (call){.kind = DO_STEPS, .t = a, .tok = tok, .per = per, .from = 1, .to = 2, .out = &oa};
  cb = ca;
  cb.t = b;
  cb.out = &ob;
  together(&ca, &cb);
  fails += MC_EXPECT(ca.rc == -EIO && cb.rc == -EIO && strstr(ca.err, "aborted") &&
                     strstr(cb.err, "aborted"), "steps after the mismatch: %d '%s', %d '%s'",
                     ca.rc, ca.err, cb.rc, cb.err);
  zt_trainer_close(b);
  zt_trainer_close(a);
  dpt_ranks_close(&x);
  mc_rmtree(dir);
  free(tok);
  return fails;
}

/* The size of dir's file name (it must exist). */
static long long file_size(const char *dir, const char *name) {
  char path[700];
  struct stat st;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (stat(path, &st) < 0) {
    fprintf(stderr, "%s: %s\n", path, strerror(errno));
    exit(1);
  }
  return (long long)st.st_size;
}

/* zt_trainer_save on a, with send_state on b, under a file size limit of `limit` bytes. */
static void save_limited(call *ca, call *cb, zt_trainer *a, zt_trainer *b, const char *path,
                         long long limit) {
  struct rlimit old, lim;
  if (getrlimit(RLIMIT_FSIZE, &old) < 0) exit(1);
  lim = old;
  lim.rlim_cur = (rlim_t)limit;
  signal(SIGXFSZ, SIG_IGN);
  if (setrlimit(RLIMIT_FSIZE, &lim) < 0) exit(1);
  *ca = (call){.kind = DO_SAVE, .t = a, .path = path};
  *cb = (call){.kind = DO_SEND, .t = b};
  together(ca, cb);
  if (setrlimit(RLIMIT_FSIZE, &old) < 0) exit(1);
  signal(SIGXFSZ, SIG_DFL);
}

/* A failed save leaves no temporary directory and the previous checkpoint of step `step`,
 * which loads. */
static int kept_previous(const char *path, const zt_model_cfg *mc, int W, int step,
                         const char *what) {
  char tmp[700], err[512];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int fails = MC_EXPECT(access(tmp, F_OK) < 0, "%s: %s left behind", what, tmp);
  zt_backend be;
  if (zt_backend_cpu_open(&be, 1) < 0) exit(1);
  zt_train_cfg tcp = dpt_train_cfg(W, 0, ZT_F32);
  zt_trainer *tp = dpt_open_plain(mc, &tcp, &be);
  fails += MC_EXPECT(zt_trainer_load(tp, path, err, sizeof err) == 0 &&
                     zt_trainer_step_count(tp) == step, "%s: the previous checkpoint: %s", what,
                     err);
  zt_trainer_close(tp);
  zt_backend_cpu_close(&be);
  return fails;
}

/* A per-rank save that fails between its pieces (a file size limit that every rank's file fits
 * under but the gathered model.safetensors, written a piece at a time after them, does not)
 * releases the other part (-ECANCELED), its temporary directory goes and the previous
 * checkpoint stays; both go on. A load given up after its first piece leaves both parts'
 * states partly the checkpoint's: both fail (-EIO) and refuse the next step. */
static int given_up_between_pieces(void) {
  zt_model_cfg mc = dpt_model_cfg(ZT_ARCH_GPT);
  zt_train_cfg tc = dpt_train_cfg(1, 0, ZT_F32);
  int32_t *tok = dpt_tokens(&mc, 4, 9);
  size_t per = dpt_step_tokens(&mc, 4);
  const char *dir = mc_tmpdir();
  char path[600];
  snprintf(path, sizeof path, "%s/ckpt", dir);
  dpt_ranks x;
  dpt_ranks_open(&x, 4);
  zt_trainer *a = dpt_open_dp(&mc, &tc, &x, 2, 0, 1), *b = dpt_open_dp(&mc, &tc, &x, 2, 1, 3);
  int fails = MC_EXPECT(zt_model_num_units(zt_trainer_model(a)) > 2, "the model has %d units",
                        zt_model_num_units(zt_trainer_model(a)));
  run_out oa, ob;
  fails += steps_together(a, b, tok, per, 0, 1, NULL, NULL, &oa, &ob, "before the saves");
  call ca = {.kind = DO_SAVE, .t = a, .path = path}, cb = {.kind = DO_SEND, .t = b};
  together(&ca, &cb);
  fails += both_ok(&ca, &cb, "the previous save");
  /* W 4: a rank's file holds 3 x a quarter of the parameters */
  long long rank = file_size(path, "rank-0.safetensors");
  long long model = file_size(path, "model.safetensors");
  fails += MC_EXPECT(rank < model, "a rank's file %lld bytes, the model file %lld", rank, model);
  fails += steps_together(a, b, tok, per, 1, 2, NULL, NULL, &oa, &ob, "between the saves");
  save_limited(&ca, &cb, a, b, path, (rank + model) / 2);
  fails += MC_EXPECT(ca.rc == -EFBIG && strstr(ca.err, "model.safetensors"), "a save past "
                     "the file size limit: %d %s", ca.rc, ca.err);
  fails += MC_EXPECT(cb.rc == -ECANCELED && strstr(cb.err, "gave up"), "send against a save "
                     "that failed between pieces: %d %s", cb.rc, cb.err);
  fails += kept_previous(path, &mc, 4, 1, "a save failed between its pieces");
  fails += steps_together(a, b, tok, per, 2, 3, NULL, NULL, &oa, &ob, "after the failed save");
  ca = (call){.kind = DO_HALF_LOAD, .t = a};
  cb = (call){.kind = DO_RECEIVE, .t = b, .step = 1, .adam_step = 1};
  together(&ca, &cb);
  fails += MC_EXPECT(ca.rc == 0, "the first piece of a load: %d %s", ca.rc, ca.err);
  fails += MC_EXPECT(cb.rc == -EIO && strstr(cb.err, "gave up its load") &&
                     zt_trainer_step_count(b) == 3, "receive against a load given up after a "
                     "piece: %d %s", cb.rc, cb.err);
  ca = (call){.kind = DO_STEPS, .t = a, .tok = tok, .per = per, .from = 3, .to = 4, .out = &oa};
  cb = ca;
  cb.t = b;
  cb.out = &ob;
  together(&ca, &cb);
  fails += MC_EXPECT(ca.rc == -EIO && cb.rc == -EIO, "steps after a load given up half way: %d "
                     "'%s', %d '%s'", ca.rc, ca.err, cb.rc, cb.err);
  zt_trainer_close(b);
  zt_trainer_close(a);
  dpt_ranks_close(&x);
  mc_rmtree(dir);
  free(tok);
  return fails;
}

/* A rank's file of a per-rank save that fails fails the save on every part with that rank's
 * code, the exchanged verdict: under a file size limit that only the last rank's file (the
 * smallest: the units' last chunks are short) fits under, the rank-0 part (ranks 0, 1) fails
 * naming its rank 0's file, and the other part, whose rank 2 wrote its file, names the same
 * file as another part's. Nothing changed: the temporary directory goes, the previous
 * checkpoint stays, both parts go on and save again. */
static int rank_file_failed(void) {
  zt_model_cfg mc = dpt_model_cfg(ZT_ARCH_GPT);
  zt_train_cfg tc = dpt_train_cfg(1, 0, ZT_F32);
  int32_t *tok = dpt_tokens(&mc, 3, 12);
  size_t per = dpt_step_tokens(&mc, 3);
  const char *dir = mc_tmpdir();
  char path[600];
  snprintf(path, sizeof path, "%s/ckpt", dir);
  dpt_ranks x;
  dpt_ranks_open(&x, 3);
  zt_trainer *a = dpt_open_dp(&mc, &tc, &x, 2, 0, 2), *b = dpt_open_dp(&mc, &tc, &x, 2, 2, 1);
  run_out oa, ob;
  int fails = steps_together(a, b, tok, per, 0, 1, NULL, NULL, &oa, &ob, "before the saves");
  call ca = {.kind = DO_SAVE, .t = a, .path = path}, cb = {.kind = DO_SEND, .t = b};
  together(&ca, &cb);
  fails += both_ok(&ca, &cb, "the previous save");
  long long first = file_size(path, "rank-0.safetensors");
  long long last = file_size(path, "rank-2.safetensors");
  fails += MC_EXPECT(last < first, "rank 2's file %lld bytes, rank 0's %lld", last, first);
  fails += steps_together(a, b, tok, per, 1, 2, NULL, NULL, &oa, &ob, "between the saves");
  save_limited(&ca, &cb, a, b, path, last);
  printf("a rank's file past the file size limit: %s | %s\n", ca.err, cb.err);
  fails += MC_EXPECT(ca.rc == -EFBIG && strstr(ca.err, "rank-0.safetensors"), "the rank-0 part's "
                     "save with its rank 0's file past the limit: %d %s", ca.rc, ca.err);
  fails += MC_EXPECT(cb.rc == -EFBIG && strstr(cb.err, "rank-0.safetensors") &&
                     strstr(cb.err, "another part"), "the other part's send: %d %s", cb.rc,
                     cb.err);
  fails += kept_previous(path, &mc, 3, 1, "a rank's file failed");
  fails += steps_together(a, b, tok, per, 2, 3, NULL, NULL, &oa, &ob, "after the failed save");
  ca = (call){.kind = DO_SAVE, .t = a, .path = path};
  cb = (call){.kind = DO_SEND, .t = b};
  together(&ca, &cb);
  fails += both_ok(&ca, &cb, "the save after");
  fails += kept_previous(path, &mc, 3, 3, "the save after");
  zt_trainer_close(b);
  zt_trainer_close(a);
  dpt_ranks_close(&x);
  mc_rmtree(dir);
  free(tok);
  return fails;
}

/* The file dir/name exists (want 1) or not (want 0). */
static int exists(const char *dir, const char *name, int want, const char *what) {
  char path[700];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return MC_EXPECT((access(path, F_OK) == 0) == want, "%s: %s %s", what, path,
                   want ? "is missing" : "is there");
}

/* Whether a thread can have a working directory of its own (unshare(CLONE_FS); a seccomp
 * profile may forbid it): 0, or the errno. */
static void *try_unshare(void *arg) {
  *(int *)arg = unshare(CLONE_FS) == 0 ? 0 : errno;
  return NULL;
}

/* Parts that do not see the same directory. The rank-0 part and its ranks' threads see this
 * process's working directory, A; the other part is opened and called from threads with a
 * working directory of their own, B, so that a relative checkpoint path names another
 * directory there, as on a daemon whose host does not share the coordinator's files. W 2, a
 * rank each:
 * - a save to a relative path: the other part does not see the marker, so the checkpoint is
 *   flat, gathered through rank 0 (nothing in B);
 * - a save to an absolute path both see is per rank, and loads into one trainer of both ranks
 *   (each rank its own file) with the state saved, going on bitwise as the parts;
 * - a per-rank checkpoint loaded by a relative path where B holds another checkpoint (of the
 *   step after) under that name: the other part's manifest is not the one rank 0 probed, so the
 *   state is scattered from rank 0's files: the state saved, whose steps go on bitwise;
 * - the same save where B's view of the temporary directory shows rank 0's marker (a symbolic
 *   link) but rank 1 cannot create its file there (a directory in its way): rank 1's failure
 *   fails the save on both parts, the rank-0 part's error naming rank 1's file; both go on. */
static int views(void) {
  int cannot = 0;
  pthread_t th;
  if (pthread_create(&th, NULL, try_unshare, &cannot) != 0) exit(1);
  pthread_join(th, NULL);
  if (cannot) {
    printf("parts with views of their own: skipped (unshare(CLONE_FS): %s)\n",
           strerror(cannot));
    return 0;
  }
  zt_model_cfg mc = dpt_model_cfg(ZT_ARCH_GPT);
  zt_train_cfg tc = dpt_train_cfg(1, 0.5f, ZT_F32);
  int32_t *tok = dpt_tokens(&mc, 2, 13);
  size_t per = dpt_step_tokens(&mc, 2);
  const char *dir = mc_tmpdir();
  char A[600], B[600], path[700], link_at[700];
  snprintf(A, sizeof A, "%s/a", dir);
  snprintf(B, sizeof B, "%s/b", dir);
  int home = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (home < 0 || mkdir(A, 0755) < 0 || mkdir(B, 0755) < 0 || chdir(A) < 0) exit(1);
  dpt_ranks x;
  dpt_ranks_open(&x, 2);
  call ca = {.kind = DO_OPEN, .mc = &mc, .tc = &tc, .x = &x, .stage = 2, .rank0 = 0, .local = 1};
  call cb = ca;
  cb.rank0 = 1;
  cb.cwd = B;
  together(&ca, &cb);
  int fails = both_ok(&ca, &cb, "opening the parts");
  if (fails) exit(1);
  zt_trainer *a = ca.t, *b = cb.t;
  run_out oa, ob, again;
  fails += steps_together(a, b, tok, per, 0, 1, NULL, NULL, &oa, &ob, "views");
  float *s1 = parts_state(a, b, &fails);

  /* the other part does not see "flat.tmp": the flat layout, through rank 0 */
  ca = (call){.kind = DO_SAVE, .t = a, .path = "flat"};
  cb = (call){.kind = DO_SEND, .t = b, .cwd = B};
  together(&ca, &cb);
  fails += both_ok(&ca, &cb, "a save the other part does not see");
  fails += exists(A, "flat/optimizer.safetensors", 1, "a save the other part does not see");
  fails += exists(A, "flat/manifest.json", 0, "a save the other part does not see");
  fails += exists(B, "flat", 0, "a save the other part does not see");
  fails += exists(B, "flat.tmp", 0, "a save the other part does not see");

  /* "ranked" is step 1's per-rank checkpoint in A, step 2's in B (absolute paths: both parts
   * see them) */
  snprintf(path, sizeof path, "%s/ranked", A);
  ca = (call){.kind = DO_SAVE, .t = a, .path = path};
  together(&ca, &cb);
  fails += both_ok(&ca, &cb, "a save both parts see");
  fails += exists(path, "rank-1.safetensors", 1, "a save both parts see");
  fails += exists(path, "manifest.json", 1, "a save both parts see");
  fails += steps_together(a, b, tok, per, 1, 2, NULL, NULL, &oa, &ob, "views");
  /* the two parts' checkpoint in one trainer of both ranks: each rank its own file, step 1's
   * state, and step 2 bitwise the parts' */
  dpt_ranks y;
  dpt_ranks_open(&y, 2);
  zt_trainer *all = dpt_open_dp(&mc, &tc, &y, 2, 0, 0);
  char err[512];
  fails += MC_EXPECT(zt_trainer_load(all, path, err, sizeof err) == 0, "one trainer of both "
                     "ranks: %s", err);
  float *s_all = dpt_state_of(all);
  size_t bytes = 3 * zt_model_num_params(zt_trainer_model(a)) * sizeof(float);
  fails += MC_EXPECT(!memcmp(s_all, s1, bytes), "the parts' checkpoint in one trainer of both "
                     "ranks: not step 1's state");
  fails += run_steps(all, tok, per, 1, 2, NULL, &again, "one trainer of both ranks");
  fails += same_run(&again, &oa, 1, 2, "one trainer of both ranks vs the parts");
  free(s_all);
  zt_trainer_close(all);
  dpt_ranks_close(&y);
  snprintf(path, sizeof path, "%s/ranked", B);
  ca = (call){.kind = DO_SAVE, .t = a, .path = path};
  together(&ca, &cb);
  fails += both_ok(&ca, &cb, "step 2's save");
  ca = (call){.kind = DO_LOAD, .t = a, .path = "ranked"};
  cb = (call){.kind = DO_RECEIVE, .t = b, .step = 1, .adam_step = 1, .cwd = B};
  together(&ca, &cb);
  fails += both_ok(&ca, &cb, "a load whose manifest the other part does not see");
  float *got = parts_state(a, b, &fails);
  fails += MC_EXPECT(!memcmp(got, s1, bytes), "a load whose manifest the other part does not "
                     "see: not step 1's state");
  fails += steps_together(a, b, tok, per, 1, 2, NULL, NULL, &again, &ob, "views");
  fails += same_run(&again, &oa, 1, 2, "after the load through rank 0");

  /* rank 1 sees rank 0's marker in "bad.tmp" but cannot create its file there */
  snprintf(path, sizeof path, "%s/bad.tmp", B);
  snprintf(link_at, sizeof link_at, "%s/bad.tmp/probe", A);
  if (mkdir(path, 0755) < 0) exit(1);
  snprintf(path, sizeof path, "%s/bad.tmp/probe", B);
  if (symlink(link_at, path) < 0) exit(1);
  snprintf(path, sizeof path, "%s/bad.tmp/rank-1.safetensors.tmp", B);
  if (mkdir(path, 0755) < 0) exit(1);
  ca = (call){.kind = DO_SAVE, .t = a, .path = "bad"};
  cb = (call){.kind = DO_SEND, .t = b, .cwd = B};
  together(&ca, &cb);
  printf("the other part's rank cannot write its file: %s | %s\n", ca.err, cb.err);
  fails += MC_EXPECT(ca.rc == -EISDIR && strstr(ca.err, "bad.tmp/rank-1.safetensors") &&
                     strstr(ca.err, "another part"), "the rank-0 part's save: %d %s", ca.rc,
                     ca.err);
  fails += MC_EXPECT(cb.rc == -EISDIR && strstr(cb.err, "rank-1.safetensors"), "the other "
                     "part's send: %d %s", cb.rc, cb.err);
  fails += exists(A, "bad", 0, "a failed save");
  fails += exists(A, "bad.tmp", 0, "a failed save");
  fails += steps_together(a, b, tok, per, 2, 3, NULL, NULL, &oa, &ob, "after the failed save");

  zt_trainer_close(b);
  zt_trainer_close(a);
  dpt_ranks_close(&x);
  if (fchdir(home) < 0) exit(1);
  close(home);
  mc_rmtree(dir);
  free(got);
  free(s1);
  free(tok);
  return fails;
}

/* A save and a load through the parts (stage 3, the other part's units on the host tier) take
 * the heap zt_trainer_checkpoint_bytes says, counted over every thread of both parts, on a
 * model (d_model 96, 12 layers) whose flat parameters would not fit in it; the files the save
 * wrote load into a plain trainer with the parts' state. */
static int parts_memory(void) {
  /* trainer.json, the directory's and files' handles (the bound counts the files' headers) */
  const size_t slack = 64 * 1024;
  zt_model_cfg mc = dpt_model_cfg(ZT_ARCH_GPT);
  mc.vocab = 64;
  mc.seq_len = 8;
  mc.d_model = 96;
  mc.n_layers = 12;
  zt_train_cfg tc = dpt_train_cfg(1, 0, ZT_F32);
  int32_t *tok = dpt_tokens(&mc, 2, 10);
  size_t per = dpt_step_tokens(&mc, 2);
  const char *dir = mc_tmpdir();
  char path[600];
  snprintf(path, sizeof path, "%s/ckpt", dir);
  dpt_ranks x;
  dpt_ranks_open(&x, 2);
  cfg c = {ZT_ARCH_GPT, 3, 2, 1, 1, 0.0f, ZT_F32, 0, ZT_PLACE_AUTO, ZT_PLACE_AUTO, 0};
  zt_trainer *a = open_part(&mc, &tc, &x, &c, 0, 1);
  c.optimizer = ZT_PLACE_HOST;
  zt_trainer *b = open_part(&mc, &tc, &x, &c, 1, 1);
  size_t n = zt_model_num_params(zt_trainer_model(a)), bound = zt_trainer_checkpoint_bytes(a);
  int fails = MC_EXPECT(bound + slack < n * sizeof(float), "%zu parameters: a flat copy is "
                        "within the bound %zu", n, bound);
  run_out oa, ob;
  fails += steps_together(a, b, tok, per, 0, 1, NULL, NULL, &oa, &ob, "parts memory");
  float *want = parts_state(a, b, &fails);
  call ca = {.kind = DO_SAVE, .t = a, .path = path}, cb = {.kind = DO_SEND, .t = b};
  mc_heap_mark();
  together(&ca, &cb);
  int64_t peak = mc_heap_peak();
  printf("a save through the parts: %lld heap bytes (bound %zu)\n", (long long)peak, bound);
  fails += both_ok(&ca, &cb, "save / send_state");
  fails += MC_EXPECT(peak > 0 && (size_t)peak <= bound + slack, "a save through the parts took "
                     "%lld heap bytes, the bound is %zu", (long long)peak, bound);
  fails += steps_together(a, b, tok, per, 1, 2, NULL, NULL, &oa, &ob, "parts memory");
  ca = (call){.kind = DO_LOAD, .t = a, .path = path};
  cb = (call){.kind = DO_RECEIVE, .t = b, .step = 1, .adam_step = 1};
  mc_heap_mark();
  together(&ca, &cb);
  peak = mc_heap_peak();
  printf("a load through the parts: %lld heap bytes (bound %zu)\n", (long long)peak, bound);
  fails += both_ok(&ca, &cb, "load / receive_state");
  fails += MC_EXPECT(peak > 0 && (size_t)peak <= bound + slack, "a load through the parts took "
                     "%lld heap bytes, the bound is %zu", (long long)peak, bound);
  float *got = parts_state(a, b, &fails);
  fails += MC_EXPECT(memcmp(got, want, 3 * n * sizeof *got) == 0, "the parts' state after the "
                     "load is not the one they saved");
  zt_backend be;
  if (zt_backend_cpu_open(&be, 1) < 0) exit(1);
  zt_train_cfg tcp = tc;
  tcp.grad_accum = 2;
  zt_trainer *tp = dpt_open_plain(&mc, &tcp, &be);
  char err[512];
  fails += MC_EXPECT(zt_trainer_load(tp, path, err, sizeof err) == 0, "plain load: %s", err);
  float *plain = dpt_state_of(tp);
  fails += MC_EXPECT(memcmp(plain, want, 3 * n * sizeof *plain) == 0, "the plain trainer loaded "
                     "another state than the parts saved");
  zt_trainer_close(tp);
  zt_backend_cpu_close(&be);
  zt_trainer_close(b);
  zt_trainer_close(a);
  dpt_ranks_close(&x);
  mc_rmtree(dir);
  free(plain);
  free(got);
  free(want);
  free(tok);
  return fails;
}

static int refuses_cfg(int world, int rank0, int local, dpt_ranks *x, const char *field) {
  zt_model_cfg mc = dpt_model_cfg(ZT_ARCH_GPT);
  zt_train_cfg tc = dpt_train_cfg(1, 0, ZT_F32);
  zt_dp_cfg dc = {.world = world, .zero_stage = 2, .rank0 = rank0, .local = local};
  zt_trainer *t = (zt_trainer *)(uintptr_t)1; /* must come back NULL */
  char err[512] = "", check[512] = "";
  int rc = zt_trainer_open_dp(&t, &mc, &tc, &dc, x->r, err, sizeof err);
  int crc = zt_dp_cfg_check(&dc, check, sizeof check);
  return MC_EXPECT(rc == -EINVAL && !t && strstr(err, field), "world %d rank0 %d local %d: %d "
                   "'%s', want -EINVAL naming %s", world, rank0, local, rc, err, field) +
         MC_EXPECT(strstr(field, "ranks") ? crc == 0 : crc == -EINVAL && !strcmp(err, check),
                   "zt_dp_cfg_check: %d '%s'", crc, check);
}

/* Bad rank0 / local, ranks that are not the part's, and state calls on the wrong trainer. */
static int refusals(void) {
  int fails = 0;
  dpt_ranks x;
  dpt_ranks_open(&x, 3);
  fails += refuses_cfg(3, -1, 1, &x, "dp.rank0");
  fails += refuses_cfg(3, 3, 1, &x, "dp.rank0");
  fails += refuses_cfg(3, 1, 0, &x, "dp.rank0");
  fails += refuses_cfg(3, 0, -1, &x, "dp.local");
  fails += refuses_cfg(3, 0, 4, &x, "dp.local");
  fails += refuses_cfg(3, 2, 2, &x, "dp.local");
  /* ranks 0 and 1 given for a part that starts at rank 1 */
  fails += refuses_cfg(3, 1, 2, &x, "dp.ranks[0]");

  zt_model_cfg mc = dpt_model_cfg(ZT_ARCH_GPT);
  zt_train_cfg tc = dpt_train_cfg(1, 0, ZT_F32);
  zt_trainer *a = dpt_open_dp(&mc, &tc, &x, 1, 0, 1), *b = dpt_open_dp(&mc, &tc, &x, 1, 1, 2);
  zt_trainer *all;
  dpt_ranks y;
  dpt_ranks_open(&y, 2);
  all = dpt_open_dp(&mc, &tc, &y, 1, 0, 0);
  zt_backend be;
  if (zt_backend_cpu_open(&be, 1) < 0) exit(1);
  zt_trainer *tp = dpt_open_plain(&mc, &tc, &be);
  char err[512], path[600];
  const char *dir = mc_tmpdir();
  snprintf(path, sizeof path, "%s/plain", dir);
  fails += MC_EXPECT(zt_trainer_save(tp, path, err, sizeof err) == 0, "plain save: %s", err);
  int rc = zt_trainer_dp_send_state(a, err, sizeof err);
  fails += MC_EXPECT(rc == -EINVAL && strstr(err, "holds rank 0"), "send on the rank-0 part: %d "
                     "%s", rc, err);
  rc = zt_trainer_dp_receive_state(all, 0, 0, err, sizeof err);
  fails += MC_EXPECT(rc == -EINVAL && strstr(err, "holds rank 0"), "receive on a trainer of all "
                     "ranks: %d %s", rc, err);
  rc = zt_trainer_dp_send_state(tp, err, sizeof err);
  fails += MC_EXPECT(rc == -EINVAL && strstr(err, "not a data-parallel"), "send on a plain "
                     "trainer: %d %s", rc, err);
  rc = zt_trainer_dp_receive_state(b, 2, 3, err, sizeof err);
  fails += MC_EXPECT(rc == -EINVAL && strstr(err, "adam_step"), "receive of adam_step 3 at step "
                     "2: %d %s", rc, err);
  /* the part without rank 0 cannot be the reading or writing side (and waits for nobody) */
  snprintf(path, sizeof path, "%s/b", dir);
  rc = zt_trainer_save(b, path, err, sizeof err);
  fails += MC_EXPECT(rc == -EINVAL && strstr(err, "zt_trainer_dp_send_state"), "save on the "
                     "other part: %d %s", rc, err);
  snprintf(path, sizeof path, "%s/plain", dir);
  rc = zt_trainer_load(b, path, err, sizeof err);
  fails += MC_EXPECT(rc == -EINVAL && strstr(err, "zt_trainer_dp_receive_state"), "load on the "
                     "other part: %d %s", rc, err);
  size_t n = zt_model_num_params(zt_trainer_model(b));
  float *p = malloc(n * sizeof *p);
  if (!p) exit(1);
  fails += MC_EXPECT(zt_trainer_get_state(b, p, NULL, NULL) == -EINVAL, "get_state on the "
                     "other part");
  free(p);
  zt_trainer_close(tp);
  zt_backend_cpu_close(&be);
  zt_trainer_close(all);
  dpt_ranks_close(&y);
  zt_trainer_close(b);
  zt_trainer_close(a);
  dpt_ranks_close(&x);
  mc_rmtree(dir);
  return fails;
}

/* a cfg's offload fields: everything on the devices */
#define ON_DEVICE ZT_PLACE_AUTO, ZT_PLACE_AUTO, 0

int main(void) {
  static const cfg cfgs[] = {
      {ZT_ARCH_GPT, 1, 4, 2, 1, 0.0f, ZT_F32, 1e-6, ON_DEVICE},
      {ZT_ARCH_GPT, 2, 3, 1, 2, 0.5f, ZT_F32, 1e-6, ON_DEVICE},
      {ZT_ARCH_GPT, 3, 3, 2, 2, 0.5f, ZT_F32, 1e-6, ON_DEVICE},
      {ZT_ARCH_ENCODER, 1, 3, 2, 2, 0.5f, ZT_F32, 1e-6, ON_DEVICE},
      {ZT_ARCH_ENCODER, 2, 4, 2, 1, 0.0f, ZT_F32, 1e-6, ON_DEVICE},
      {ZT_ARCH_ENCODER, 3, 3, 1, 2, 0.5f, ZT_F32, 1e-6, ON_DEVICE},
      /* bf16: a master moved by rounding can round to the neighbouring bf16 value, so the
       * cross-world losses move by more; the parts stay bitwise */
      {ZT_ARCH_GPT, 3, 3, 1, 2, 0.0f, ZT_BF16, 1e-4, ON_DEVICE},
      /* offloaded parts, bitwise the one trainer whose ranks keep everything on the device;
       * their state calls go through the host tier */
      {ZT_ARCH_GPT, 1, 3, 2, 2, 0.5f, ZT_F32, 1e-6, ZT_PLACE_HOST, ZT_PLACE_AUTO, 1},
      {ZT_ARCH_ENCODER, 2, 3, 1, 2, 0.5f, ZT_F32, 1e-6, ZT_PLACE_HOST, ZT_PLACE_AUTO, 0},
      {ZT_ARCH_GPT, 3, 3, 1, 2, 0.5f, ZT_F32, 1e-6, ZT_PLACE_HOST, ZT_PLACE_HOST, 2},
      {ZT_ARCH_GPT, 3, 3, 2, 2, 0.0f, ZT_BF16, 1e-4, ZT_PLACE_HOST, ZT_PLACE_HOST, 0},
      /* optimizer nvme: the state calls read and write each rank's files */
      {ZT_ARCH_GPT, 2, 3, 1, 2, 0.5f, ZT_F32, 1e-6, ZT_PLACE_NVME, ZT_PLACE_AUTO, 1},
      {ZT_ARCH_GPT, 3, 3, 2, 2, 0.0f, ZT_BF16, 1e-4, ZT_PLACE_NVME, ZT_PLACE_HOST, 0},
      /* params nvme: each rank's chunks read from its master files before each gather */
      {ZT_ARCH_GPT, 3, 3, 1, 2, 0.5f, ZT_F32, 1e-6, ZT_PLACE_NVME, ZT_PLACE_NVME, 1},
      {ZT_ARCH_ENCODER, 3, 3, 2, 2, 0.0f, ZT_BF16, 1e-4, ZT_PLACE_NVME, ZT_PLACE_NVME, 0},
  };
  int fails = 0, counted = mc_heap_count_start() == 0;
  /* io_uring may be forbidden here (a sandbox, an old kernel) */
  const char *nv = mc_tmpdir();
  zt_nvme_store *st = NULL;
  char why[256];
  if (zt_nvme_store_open(&st, nv, NULL, why, sizeof why) == 0)
    snprintf(nvme_dir, sizeof nvme_dir, "%s", nv);
  else
    printf("optimizer nvme: skipped (%s)\n", why);
  zt_nvme_store_close(st);
  for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++)
    if (cfgs[i].optimizer != ZT_PLACE_NVME || nvme_dir[0]) fails += parts(&cfgs[i]);
  mc_rmtree(nv);
  fails += nonfinite_flags();
  fails += abandoned_and_mismatched();
  fails += given_up_between_pieces();
  fails += rank_file_failed();
  fails += views();
  if (counted)
    fails += parts_memory();
  else
    printf("the allocator has no hooks to count the heap (a build without ASan): the parts' "
           "checkpoint memory is not measured\n");
  fails += refusals();
  if (fails) {
    fprintf(stderr, "%d failure(s)\n", fails);
    return 1;
  }
  printf("dp parts: ok\n");
  return 0;
}
