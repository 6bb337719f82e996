/* The data-parallel trainer (engine/train/dp/dp.h) on simulated ranks (CPU backends, the CPU
 * communicator group) against one trainer with grad_accum W * G on the same tokens, for both
 * archs, W in {1, 2, 3} and ZeRO stages 1, 2 and 3: the first step's loss bitwise equal (same
 * parameters, same micro-batches, the loss added in the same order), every later loss and norm
 * within 1e-6 relative (only the order of the gradient sums differs), with G = 1, and with
 * G = 2 plus clipping; a micro-batch of padding alone on one rank; bf16 and fp16 (1e-4; fp16
 * with the one trainer's loss scale, and an overflowing scale skipping the same step); activation
 * checkpointing on stage 3; per-rank bytes falling with the stage; a W = 3 stage-3 checkpoint
 * restored into W = 2 stage 2 and into a plain trainer (state bitwise, then the same losses); a
 * non-finite gradient refused on every rank; a rank whose collective fails aborts the others
 * and the trainer refuses further steps; bad configurations refused naming the field. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* internal: the fp16 test sets the trainer's loss scale past fp16's range and reads its AdamW
 * step, which no public call gives */
#include "engine/train/trainer_internal.h"
#include "tests/unit/dp/dptest.h"
#include "tests/unit/model/mcheck.h"

/* DPT_STEPS steps of `micros` micro-batches each; step 3's second micro-batch is padding alone
 * (another rank's than the first when W > 1 and G = 1). */
static int32_t *padded_tokens(const zt_model_cfg *mc, int micros, uint64_t seed) {
  int32_t *tok = dpt_tokens(mc, micros, seed);
  size_t micro = dpt_step_tokens(mc, 1), per = dpt_step_tokens(mc, micros);
  for (size_t i = 0; i < micro; i++) tok[2 * per + micro + i] = -1;
  return tok;
}


static int close_rel(double a, double b, double tol) {
  return fabs(a - b) <= tol * fabs(b);
}

/* Losses within tol (the first step's bitwise when first_exact), norms within 10 * tol. */
static int same_losses(const dpt_run *a, const dpt_run *ref, int from, int to, double tol,
                       int first_exact, const char *what) {
  int fails = 0;
  for (int i = from; i < to; i++) {
    int ok = i == from && first_exact ? a->loss[i] == ref->loss[i]
                                      : close_rel(a->loss[i], ref->loss[i], tol);
    fails += MC_EXPECT(ok, "%s: step %d loss %.17g, reference %.17g (rel %.3g)", what, i + 1,
                       a->loss[i], ref->loss[i], fabs(a->loss[i] - ref->loss[i]) / ref->loss[i]);
    fails += MC_EXPECT(close_rel(a->norm[i], ref->norm[i], 10 * tol),
                       "%s: step %d norm %.17g, reference %.17g", what, i + 1, a->norm[i],
                       ref->norm[i]);
  }
  return fails;
}

/* One configuration: the plain run, then every stage against it. */
static int parity(zt_arch arch, int W, int G, float clip, zt_dtype dt, int ckpt_every,
                  const int *stages, int n_stages, double tol) {
  zt_model_cfg mc = dpt_model_cfg(arch);
  zt_train_cfg tc = dpt_train_cfg(W * G, clip, dt);
  tc.ckpt_every = ckpt_every;
  int32_t *tok = padded_tokens(&mc, W * G, 99 + (uint64_t)W * 10 + (uint64_t)G);
  size_t per = dpt_step_tokens(&mc, W * G);
  zt_backend be;
  if (zt_backend_cpu_open(&be, 1) < 0) exit(1);
  dpt_run ref, got;
  int fails = 0;
  zt_trainer *t = dpt_open_plain(&mc, &tc, &be);
  fails += dpt_run_steps(t, tok, per, 0, DPT_STEPS, &ref, "plain");
  zt_trainer_close(t);
  tc.grad_accum = G;
  for (int i = 0; i < n_stages && !fails; i++) {
    char what[160];
    snprintf(what, sizeof what, "%s W %d stage %d G %d clip %g %s ckpt %d", zt_arch_name(arch),
             W, stages[i], G, (double)clip, zt_dtype_name(dt), ckpt_every);
    dpt_ranks x;
    dpt_ranks_open(&x, W);
    t = dpt_open_dp(&mc, &tc, &x, stages[i], 0, 0);
    if (dpt_run_steps(t, tok, per, 0, DPT_STEPS, &got, what) == 0)
      fails += same_losses(&got, &ref, 0, DPT_STEPS, tol, 1, what);
    else
      fails++;
    zt_trainer_close(t);
    dpt_ranks_close(&x);
  }
  zt_backend_cpu_close(&be);
  free(tok);
  return fails;
}

/* Stage by stage, a rank holds less: L 8 so that the blocks outweigh the temporaries. */
static int rank_bytes(zt_arch arch) {
  zt_model_cfg mc = dpt_model_cfg(arch);
  mc.n_layers = 8;
  zt_train_cfg tc = dpt_train_cfg(1, 0, ZT_F32);
  size_t bytes[4] = {0};
  int fails = 0;
  for (int stage = 1; stage <= 3; stage++) {
    dpt_ranks x;
    dpt_ranks_open(&x, 3);
    zt_trainer *t = dpt_open_dp(&mc, &tc, &x, stage, 0, 0);
    bytes[stage] = zt_trainer_dp_rank_bytes(t, 0);
    size_t sum = 0;
    for (int r = 0; r < 3; r++) sum += zt_trainer_dp_rank_bytes(t, r);
    fails += MC_EXPECT(sum == zt_trainer_backend_bytes(t) && zt_trainer_dp_rank_bytes(t, 3) == 0,
                       "%s stage %d: backend bytes %zu, ranks' sum %zu", zt_arch_name(arch),
                       stage, zt_trainer_backend_bytes(t), sum);
    printf("%s L 8 W 3 stage %d: %zu bytes per rank\n", zt_arch_name(arch), stage,
           bytes[stage]);
    zt_trainer_close(t);
    dpt_ranks_close(&x);
  }
  fails += MC_EXPECT(bytes[1] > bytes[2] && bytes[2] > bytes[3], "%s: per-rank bytes %zu, %zu, "
                     "%zu for stages 1, 2, 3", zt_arch_name(arch), bytes[1], bytes[2],
                     bytes[3]);
  return fails;
}

static int same_state(zt_trainer *a, zt_trainer *b, const char *what) {
  size_t n = zt_model_num_params(zt_trainer_model(a));
  int fails = 0;
  float *x = malloc(3 * n * sizeof *x), *y = malloc(3 * n * sizeof *y);
  if (!x || !y) exit(1);
  fails += MC_EXPECT(zt_trainer_get_state(a, x, x + n, x + 2 * n) == 0 &&
                     zt_trainer_get_state(b, y, y + n, y + 2 * n) == 0, "%s: get_state", what);
  fails += MC_EXPECT(memcmp(x, y, 3 * n * sizeof *x) == 0, "%s: states differ", what);
  free(x);
  free(y);
  return fails;
}

/* W 3 G 2 stage 3 saves after 3 steps and goes on; W 2 G 3 stage 2 and a plain trainer with
 * grad_accum 6 load the checkpoint (the same 6 micro-batches a step) and go on alike. */
static int checkpoint(zt_arch arch) {
  zt_model_cfg mc = dpt_model_cfg(arch);
  zt_train_cfg tc = dpt_train_cfg(2, 1.0f, ZT_F32);
  int32_t *tok = padded_tokens(&mc, 6, 5);
  size_t per = dpt_step_tokens(&mc, 6);
  const char *dir = mc_tmpdir();
  char path[600], err[512];
  snprintf(path, sizeof path, "%s/ckpt", dir);
  int fails = 0;
  dpt_run a, b;
  dpt_ranks x3, x2;
  dpt_ranks_open(&x3, 3);
  zt_trainer *t3 = dpt_open_dp(&mc, &tc, &x3, 3, 0, 0);
  fails += dpt_run_steps(t3, tok, per, 0, 3, &a, "W 3 stage 3");
  fails += MC_EXPECT(zt_trainer_save(t3, path, err, sizeof err) == 0, "save: %s", err);
  fails += dpt_run_steps(t3, tok, per, 3, DPT_STEPS, &a, "W 3 stage 3 after the save");

  tc.grad_accum = 3;
  dpt_ranks_open(&x2, 2);
  zt_trainer *t2 = dpt_open_dp(&mc, &tc, &x2, 2, 0, 0);
  fails += MC_EXPECT(zt_trainer_load(t2, path, err, sizeof err) == 0, "W 2 load: %s", err);
  fails += MC_EXPECT(zt_trainer_step_count(t2) == 3, "W 2: step %d after the load",
                     zt_trainer_step_count(t2));
  zt_backend be;
  if (zt_backend_cpu_open(&be, 1) < 0) exit(1);
  tc.grad_accum = 6;
  zt_trainer *tp = dpt_open_plain(&mc, &tc, &be);
  fails += MC_EXPECT(zt_trainer_load(tp, path, err, sizeof err) == 0, "plain load: %s", err);
  fails += same_state(t2, tp, "W 2 stage 2 and plain, both loaded");
  fails += dpt_run_steps(t2, tok, per, 3, DPT_STEPS, &b, "W 2 stage 2 loaded");
  fails += same_losses(&b, &a, 3, DPT_STEPS, 1e-6, 1, "W 2 stage 2 loaded vs W 3 stage 3");
  fails += dpt_run_steps(tp, tok, per, 3, DPT_STEPS, &b, "plain loaded");
  fails += same_losses(&b, &a, 3, DPT_STEPS, 1e-6, 1, "plain loaded vs W 3 stage 3");

  /* and back: the plain trainer's checkpoint into W 3 stage 3 */
  fails += MC_EXPECT(zt_trainer_save(tp, path, err, sizeof err) == 0, "plain save: %s", err);
  fails += MC_EXPECT(zt_trainer_load(t3, path, err, sizeof err) == 0, "W 3 load: %s", err);
  fails += same_state(t3, tp, "W 3 stage 3 loaded from plain");
  zt_trainer_close(tp);
  zt_trainer_close(t2);
  zt_trainer_close(t3);
  dpt_ranks_close(&x2);
  dpt_ranks_close(&x3);
  zt_backend_cpu_close(&be);
  mc_rmtree(dir);
  free(tok);
  return fails;
}

/* A communicator that fails its n-th collective on its own, as a device or a link can: the
 * CPU group's table with the collectives wrapped. */
typedef struct flaky {
  zt_comm inner;
  int calls, fail_at;
} flaky;

static int flaky_call(flaky *f) { return ++f->calls == f->fail_at ? -EIO : 0; }
static int fl_rank(void *c) { flaky *f = c; return f->inner.ops->rank(f->inner.ctx); }
static int fl_world(void *c) { flaky *f = c; return f->inner.ops->world(f->inner.ctx); }
static int fl_all_reduce(void *c, const float *x, float *y, size_t n, void *st) {
  flaky *f = c;
  return flaky_call(f) ? -EIO : f->inner.ops->all_reduce(f->inner.ctx, x, y, n, st);
}
static int fl_reduce_scatter(void *c, const float *x, float *y, size_t n, void *st) {
  flaky *f = c;
  return flaky_call(f) ? -EIO : f->inner.ops->reduce_scatter(f->inner.ctx, x, y, n, st);
}
static int fl_all_gather(void *c, const void *x, void *y, size_t n, void *st) {
  flaky *f = c;
  return flaky_call(f) ? -EIO : f->inner.ops->all_gather(f->inner.ctx, x, y, n, st);
}
static int fl_broadcast(void *c, const void *x, void *y, size_t n, int root, void *st) {
  flaky *f = c;
  return flaky_call(f) ? -EIO : f->inner.ops->broadcast(f->inner.ctx, x, y, n, root, st);
}
static int fl_barrier(void *c, void *st) {
  flaky *f = c;
  return flaky_call(f) ? -EIO : f->inner.ops->barrier(f->inner.ctx, st);
}
static void fl_abort(void *c) { flaky *f = c; f->inner.ops->abort(f->inner.ctx); }
static const char *fl_error_text(void *c) {
  flaky *f = c;
  return f->calls == f->fail_at ? "injected failure" : f->inner.ops->error_text(f->inner.ctx);
}
static void *fl_queue(void *c) { flaky *f = c; return f->inner.ops->queue(f->inner.ctx); }
static int fl_queue_after(void *c, void *st) {
  flaky *f = c;
  return f->inner.ops->queue_after(f->inner.ctx, st);
}
static long long fl_queue_mark(void *c) {
  flaky *f = c;
  return f->inner.ops->queue_mark(f->inner.ctx);
}
static int fl_stream_wait(void *c, void *st, long long t) {
  flaky *f = c;
  return f->inner.ops->stream_wait(f->inner.ctx, st, t);
}
static int fl_queue_sync(void *c) { flaky *f = c; return f->inner.ops->queue_sync(f->inner.ctx); }
static const zt_comm_ops flaky_ops = {
    .name = "flaky", .rank = fl_rank, .world = fl_world, .all_reduce = fl_all_reduce,
    .reduce_scatter = fl_reduce_scatter, .all_gather = fl_all_gather,
    .broadcast = fl_broadcast, .queue = fl_queue, .queue_after = fl_queue_after,
    .queue_mark = fl_queue_mark, .stream_wait = fl_stream_wait, .queue_sync = fl_queue_sync,
    .barrier = fl_barrier, .abort = fl_abort, .error_text = fl_error_text};

/* Rank 1's 5th collective of the second step fails: every rank stops, the step fails with rank
 * 1's reason, and the trainer refuses the next one. */
static int rank_failure(int stage) {
  zt_model_cfg mc = dpt_model_cfg(ZT_ARCH_GPT);
  zt_train_cfg tc = dpt_train_cfg(1, 0, ZT_F32);
  int32_t *tok = padded_tokens(&mc, 3, 4);
  size_t per = dpt_step_tokens(&mc, 3);
  dpt_ranks x;
  dpt_ranks_open(&x, 3);
  flaky f = {.inner = x.r[1].comm, .fail_at = -1};
  x.r[1].comm = (zt_comm){&flaky_ops, &f};
  zt_trainer *t = dpt_open_dp(&mc, &tc, &x, stage, 0, 0);
  dpt_run o;
  char err[512];
  zt_step_result r;
  int fails = dpt_run_steps(t, tok, per, 0, 1, &o, "before the failure");
  f.fail_at = f.calls + 5;
  int rc = zt_trainer_step(t, tok + per, &r, err, sizeof err);
  fails += MC_EXPECT(rc == -EIO && strstr(err, "rank 1") && strstr(err, "injected failure"),
                     "stage %d: failed collective gave %d '%s'", stage, rc, err);
  rc = zt_trainer_step(t, tok + per, &r, err, sizeof err);
  fails += MC_EXPECT(rc == -EIO && strstr(err, "aborted"), "stage %d: step after the failure "
                     "gave %d '%s'", stage, rc, err);
  fails += MC_EXPECT(zt_trainer_step_count(t) == 1, "stage %d: a failed step counted", stage);
  zt_trainer_close(t);
  x.r[1].comm = f.inner;
  dpt_ranks_close(&x);
  free(tok);
  return fails;
}

/* A parameter that is nan makes every gradient nan: -ERANGE on every rank, nothing updated,
 * and the trainer still answers. */
static int nonfinite(void) {
  zt_model_cfg mc = dpt_model_cfg(ZT_ARCH_GPT);
  const char *dir = mc_tmpdir();
  size_t nan_at;
  int fails = 0;
  float *p = dpt_nan_init(&mc, dir, &nan_at, &fails);
  zt_train_cfg tc = dpt_train_cfg(1, 0, ZT_F32);
  int32_t *tok = padded_tokens(&mc, 3, 3);
  dpt_ranks x;
  dpt_ranks_open(&x, 3);
  zt_trainer *t = dpt_open_dp(&mc, &tc, &x, 3, 0, 0);
  size_t n = zt_model_num_params(zt_trainer_model(t));
  float *q = malloc(n * sizeof *q);
  if (!q) exit(1);
  char err[512];
  zt_step_result r;
  int rc = zt_trainer_step(t, tok, &r, err, sizeof err);
  fails += MC_EXPECT(rc == -ERANGE && strstr(err, "inf or nan"), "nan gradient: %d %s", rc, err);
  fails += MC_EXPECT(zt_trainer_step_count(t) == 0, "a refused step counted");
  rc = zt_trainer_get_state(t, q, NULL, NULL);
  fails += MC_EXPECT(rc == 0 && isnan(q[nan_at]) && q[0] == p[0] && q[n - 1] == p[n - 1],
                     "state after the refused step");
  rc = zt_trainer_step(t, tok, &r, err, sizeof err);
  fails += MC_EXPECT(rc == -ERANGE, "second nan step: %d %s", rc, err);
  zt_trainer_close(t);
  dpt_ranks_close(&x);
  mc_rmtree(dir);
  free(tok);
  free(p);
  free(q);
  return fails;
}

/* fp16 with a scale that overflows: the first step is skipped on every rank as by the one
 * trainer (the scale halves, nothing changes, AdamW's step stays), and the steps after it go on
 * as that trainer's. */
static int fp16_skip(int stage) {
  zt_model_cfg mc = dpt_model_cfg(ZT_ARCH_GPT);
  zt_train_cfg tc = dpt_train_cfg(2, 0, ZT_F16);
  int32_t *tok = padded_tokens(&mc, 2, 17);
  size_t per = dpt_step_tokens(&mc, 2);
  zt_backend be;
  if (zt_backend_cpu_open(&be, 1) < 0) exit(1);
  zt_trainer *tp = dpt_open_plain(&mc, &tc, &be);
  tc.grad_accum = 1;
  dpt_ranks x;
  dpt_ranks_open(&x, 2);
  zt_trainer *t = dpt_open_dp(&mc, &tc, &x, stage, 0, 0);
  int fails = 0;
  char err[512];
  tp->scaler.scale = t->scaler.scale = 0x1p40f; /* dlogits far past fp16's 65504 */
  for (int i = 0; i < DPT_STEPS; i++) {
    zt_step_result a, b;
    fails += MC_EXPECT(zt_trainer_step(tp, tok + per * (size_t)i, &a, err, sizeof err) == 0 &&
                       zt_trainer_step(t, tok + per * (size_t)i, &b, err, sizeof err) == 0,
                       "stage %d step %d: %s", stage, i + 1, err);
    fails += MC_EXPECT(a.skipped == b.skipped && a.loss_scale == b.loss_scale &&
                       (i > 0 || (b.skipped && b.loss_scale == 0x1p39f && b.loss == a.loss)) &&
                       fabs(a.loss - b.loss) <= 1e-4 * fabs(a.loss),
                       "stage %d step %d: skipped %d scale %g loss %.9g, one trainer %d %g %.9g",
                       stage, i + 1, b.skipped, (double)b.loss_scale, b.loss, a.skipped,
                       (double)a.loss_scale, a.loss);
    if (i == 0) /* the skipped step: AdamW's count stays */
      fails += MC_EXPECT(t->adam_step == 0 && zt_trainer_step_count(t) == 1,
                         "stage %d: AdamW step %d, steps %d after the skip", stage, t->adam_step,
                         zt_trainer_step_count(t));
  }
  zt_trainer_close(t);
  zt_trainer_close(tp);
  dpt_ranks_close(&x);
  zt_backend_cpu_close(&be);
  free(tok);
  return fails;
}

static int refuses(const zt_dp_cfg *dc, dpt_ranks *x, zt_dtype dt, int want_rc,
                   const char *field) {
  zt_model_cfg mc = dpt_model_cfg(ZT_ARCH_GPT);
  zt_train_cfg tc = dpt_train_cfg(1, 0, dt);
  zt_trainer *t = (zt_trainer *)(uintptr_t)1; /* must come back NULL */
  char err[512] = "";
  int rc = zt_trainer_open_dp(&t, &mc, &tc, dc, x->r, err, sizeof err);
  return MC_EXPECT(rc == want_rc && !t && strstr(err, field), "world %d stage %d: %d '%s', "
                   "want %d naming %s", dc->world, dc->zero_stage, rc, err, want_rc, field);
}

static int bad_configs(void) {
  int fails = 0;
  dpt_ranks x, y;
  dpt_ranks_open(&x, 3);
  fails += refuses(&(zt_dp_cfg){.world = 0, .zero_stage = 1}, &x, ZT_F32, -EINVAL, "dp.world");
  fails += refuses(&(zt_dp_cfg){.world = -2, .zero_stage = 1}, &x, ZT_F32, -EINVAL, "dp.world");
  fails += refuses(&(zt_dp_cfg){.world = ZT_DP_MAX_WORLD + 1, .zero_stage = 2}, &x, ZT_F32,
                   -EINVAL, "dp.world");
  fails += refuses(&(zt_dp_cfg){.world = 3, .zero_stage = 4}, &x, ZT_F32, -EINVAL,
                   "dp.zero_stage");
  fails += refuses(&(zt_dp_cfg){.world = 3, .zero_stage = 0}, &x, ZT_F32, -EINVAL,
                   "dp.zero_stage");
  fails += refuses(&(zt_dp_cfg){.world = 2, .zero_stage = 1}, &x, ZT_F32, -EINVAL,
                   "dp.ranks[0]");
  fails += refuses(&(zt_dp_cfg){.world = 3, .zero_stage = 1, .local = 2}, &x, ZT_F16, -ENOTSUP,
                   "fp16 with a part of the world");
  /* two ranks on one backend context */
  dpt_ranks_open(&y, 3);
  zt_backend keep = y.r[2].be;
  y.r[2].be = y.r[1].be;
  fails += refuses(&(zt_dp_cfg){.world = 3, .zero_stage = 3}, &y, ZT_F32, -EINVAL,
                   "dp.ranks[2]");
  y.r[2].be = keep;
  /* the ranks given out of order */
  zt_comm c = y.r[0].comm;
  y.r[0].comm = y.r[1].comm;
  y.r[1].comm = c;
  fails += refuses(&(zt_dp_cfg){.world = 3, .zero_stage = 2}, &y, ZT_F32, -EINVAL,
                   "dp.ranks[0]");
  c = y.r[0].comm;
  y.r[0].comm = y.r[1].comm;
  y.r[1].comm = c;
  dpt_ranks_close(&y);
  dpt_ranks_close(&x);
  return fails;
}

int main(void) {
  static const int all[] = {1, 2, 3}, three[] = {3};
  static const zt_arch archs[] = {ZT_ARCH_GPT, ZT_ARCH_ENCODER, ZT_ARCH_LLAMA};
  int fails = 0;
  for (int a = 0; a < 3; a++) {
    for (int W = 1; W <= 3; W++) {
      fails += parity(archs[a], W, 1, 0.0f, ZT_F32, 0, all, 3, 1e-6);
      fails += parity(archs[a], W, 2, 0.5f, ZT_F32, 0, all, 3, 1e-6);
    }
    fails += parity(archs[a], 3, 1, 0.0f, ZT_F32, 1, three, 1, 1e-6);
    /* bf16: a master moved by rounding can round to the neighbouring bf16 value (2^-8
     * relative), so later losses move by more */
    fails += parity(archs[a], 2, 2, 0.0f, ZT_BF16, 0, all, 3, 1e-4);
    /* fp16: the loss scale as the one trainer's, every rank alike */
    fails += parity(archs[a], 2, 2, 1.0f, ZT_F16, 0, all, 3, 1e-4);
    fails += rank_bytes(archs[a]);
    fails += checkpoint(archs[a]);
  }
  fails += nonfinite();
  for (int stage = 1; stage <= 3; stage++) fails += fp16_skip(stage);
  for (int stage = 1; stage <= 3; stage++) fails += rank_failure(stage);
  fails += bad_configs();
  if (fails) {
    fprintf(stderr, "%d failure(s)\n", fails);
    return 1;
  }
  printf("dp train: ok\n");
  return 0;
}
