/* Data-parallel parts (engine/train/dp.h): one CPU communicator group of world W driven as two
 * parts, the one holding rank 0 and the rest, each a zt_trainer_open_dp with its own threads,
 * opened one after the other on this thread (so the initial parameter write needs no
 * collective) and then driven from two threads at once, against one trainer running all W
 * ranks on the same tokens. For stages 1, 2, 3, both archs, an even and uneven split, and bf16:
 * - losses and norms bitwise those of the one trainer, on both parts, also when the parts
 *   offload (optimizer host, some or all units; params host for stage 3);
 * - step flags set on either part come back ORed in both parts' results (and in the one
 *   trainer's; a plain trainer reports 0);
 * - a checkpoint saved by the rank-0 part while the other sends its state is flat, its
 *   model.safetensors byte for byte the one trainer's (whose checkpoint is per rank), and so is
 *   an export;
 * - loaded by the rank-0 part while the other receives (the parts' flat checkpoint, or with an
 *   uneven split the one trainer's per-rank one), it resumes with the same losses as the
 *   uninterrupted run; the parts' loaded into a plain trainer and into a W 2 trainer of another
 *   stage it gives the state gathered from the parts, and goes on as the existing cross-world
 *   test does;
 * - the state moves in pieces of whole units (trainer_internal.h), which the other part follows:
 *   a save and a load through the parts take the heap zt_trainer_checkpoint_bytes says on a
 *   model whose flat parameters would not fit in it (counted through the sanitizer allocator's
 *   hooks; skipped without them);
 * - a non-finite step still reports the flags; a load the rank-0 part gives up before the
 *   state releases the other part (-ECANCELED) and both go on, as after a save that fails
 *   between its pieces (a file size limit); a load given up after a piece fails both parts
 *   (-EIO, their states partly the checkpoint's) and both refuse steps; mismatched state calls
 *   abort both parts (then -EIO); bad rank0 / local, ranks that do not match them, and state
 *   calls on the wrong part are refused naming the field or the call to make. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

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
  DO_STEPS, DO_SAVE, DO_EXPORT, DO_GET_STATE, DO_SEND, DO_LOAD, DO_RECEIVE, DO_HALF_LOAD
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
  int rc;
  char err[512];
} call;

static void *call_run(void *arg) {
  call *c = arg;
  size_t n = zt_model_num_params(zt_trainer_model(c->t));
  c->err[0] = 0;
  c->rc = 0;
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
  case DO_GET_STATE: c->rc = zt_trainer_get_state(c->t, c->state, c->state + n, c->state + 2 * n);
    break;
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
  /* the parts' checkpoint is flat, the one trainer's per rank: the parameters are the same */
  snprintf(file_a, sizeof file_a, "%s/model.safetensors", dir_ref);
  snprintf(file_b, sizeof file_b, "%s/model.safetensors", dir_parts);
  fails += mc_same_file(file_a, file_b);
  snprintf(file_a, sizeof file_a, "%s/manifest.json", dir_ref);
  snprintf(file_b, sizeof file_b, "%s/optimizer.safetensors", dir_parts);
  fails += MC_EXPECT(access(file_a, F_OK) == 0 && access(file_b, F_OK) == 0, "%s: the one "
                     "trainer's checkpoint has no manifest or the parts' no optimizer file", what);
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

  /* the parts' checkpoint in a plain trainer and in a W 2 trainer of another stage: the state
   * the resumed parts gathered, then the losses as in the cross-world test */
  size_t bytes = 3 * zt_model_num_params(zt_trainer_model(b)) * sizeof(float);
  zt_backend be;
  if (zt_backend_cpu_open(&be, 1) < 0) exit(1);
  zt_train_cfg tcp = tc;
  tcp.grad_accum = W * G;
  zt_trainer *tp = dpt_open_plain(&mc, &tcp, &be);
  fails += MC_EXPECT(zt_trainer_load(tp, dir_parts, err, sizeof err) == 0, "plain load: %s", err);
  float *want = dpt_state_of(tp);
  fails += MC_EXPECT(memcmp(got, want, bytes) == 0, "%s: the resumed parts' state is not the "
                     "plain trainer's of the same checkpoint", what);
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

/* A save that fails between its pieces (a file size limit: the optimizer file's second moment
 * lies past it) releases the other part (-ECANCELED) and both go on. A load given up after its
 * first piece leaves both parts' states partly the checkpoint's: both fail (-EIO) and refuse
 * the next step. */
static int given_up_between_pieces(void) {
  zt_model_cfg mc = dpt_model_cfg(ZT_ARCH_GPT);
  zt_train_cfg tc = dpt_train_cfg(1, 0, ZT_F32);
  int32_t *tok = dpt_tokens(&mc, 3, 9);
  size_t per = dpt_step_tokens(&mc, 3);
  const char *dir = mc_tmpdir();
  char path[600];
  snprintf(path, sizeof path, "%s/ckpt", dir);
  dpt_ranks x;
  dpt_ranks_open(&x, 3);
  zt_trainer *a = dpt_open_dp(&mc, &tc, &x, 2, 0, 1), *b = dpt_open_dp(&mc, &tc, &x, 2, 1, 2);
  int fails = MC_EXPECT(zt_model_num_units(zt_trainer_model(a)) > 2, "the model has %d units",
                        zt_model_num_units(zt_trainer_model(a)));
  struct rlimit old, lim;
  if (getrlimit(RLIMIT_FSIZE, &old) < 0) exit(1);
  lim = old;
  lim.rlim_cur = 16 * 1024;
  signal(SIGXFSZ, SIG_IGN);
  if (setrlimit(RLIMIT_FSIZE, &lim) < 0) exit(1);
  call ca = {.kind = DO_SAVE, .t = a, .path = path}, cb = {.kind = DO_SEND, .t = b};
  together(&ca, &cb);
  if (setrlimit(RLIMIT_FSIZE, &old) < 0) exit(1);
  signal(SIGXFSZ, SIG_DFL);
  fails += MC_EXPECT(ca.rc == -EFBIG && strstr(ca.err, "optimizer.safetensors"), "a save past "
                     "the file size limit: %d %s", ca.rc, ca.err);
  fails += MC_EXPECT(cb.rc == -ECANCELED && strstr(cb.err, "gave up"), "send against a save "
                     "that failed between pieces: %d %s", cb.rc, cb.err);
  run_out oa, ob;
  fails += steps_together(a, b, tok, per, 0, 1, NULL, NULL, &oa, &ob, "after the failed save");
  ca = (call){.kind = DO_HALF_LOAD, .t = a};
  cb = (call){.kind = DO_RECEIVE, .t = b, .step = 1, .adam_step = 1};
  together(&ca, &cb);
  fails += MC_EXPECT(ca.rc == 0, "the first piece of a load: %d %s", ca.rc, ca.err);
  fails += MC_EXPECT(cb.rc == -EIO && strstr(cb.err, "gave up its load") &&
                     zt_trainer_step_count(b) == 1, "receive against a load given up after a "
                     "piece: %d %s", cb.rc, cb.err);
  ca = (call){.kind = DO_STEPS, .t = a, .tok = tok, .per = per, .from = 1, .to = 2, .out = &oa};
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
