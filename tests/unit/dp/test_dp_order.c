/* offload.order unit on the data-parallel trainer (engine/train/dp/dp.h "Unit-major") on
 * simulated ranks: W 2 and 3, stages 1, 2, 3 and stage 3 with the parameters on the host, G 1, 3
 * and 4, gpt (whose head reads the embedding: the backward stays micro-major) and llama untied
 * (the backward unit-major too), fp32 and bf16, clipping on and off. Against the same world in
 * micro order and the plain trainer of grad_accum W * G on the same tokens: the losses, norms
 * and final parameters, m and v bitwise those of micro order where the gradients are reduced as
 * micro order reduces them (G 1, stage 1, a head reading the embedding), else bitwise those of
 * micro order at stage 1 (which also sums a rank's micro-batches before its one reduction); the
 * first step's loss bitwise the plain trainer's and every later one within 1e-6 (bf16 1e-4) as
 * test_dp_train checks micro order. The collectives a rank issues in a step, counted through a
 * wrapped communicator, are the plan's (zt_dp_plan_step_colls): stage 3 llama's all-gathers of
 * parameters fall from 2U - 2 + 2 (G - 1)(U - 2) to 2U - 2 (U units) and its reduce-scatters
 * from G U to U. The activations of every micro-batch are held and counted (the rank's bytes
 * equal the estimate). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/plan/dp_plan.h"
#include "tests/unit/dp/dptest.h"
#include "tests/unit/model/mcheck.h"

/* A rank's communicator with its collectives counted (the CPU group's underneath). */
typedef struct counted {
  zt_comm inner;
  long all_gathers, reduce_scatters, all_reduces;
} counted;

static int ct_rank(void *c) { counted *f = c; return f->inner.ops->rank(f->inner.ctx); }
static int ct_world(void *c) { counted *f = c; return f->inner.ops->world(f->inner.ctx); }
static int ct_all_reduce(void *c, const float *x, float *y, size_t n, void *st) {
  counted *f = c;
  f->all_reduces++;
  return f->inner.ops->all_reduce(f->inner.ctx, x, y, n, st);
}
static int ct_reduce_scatter(void *c, const float *x, float *y, size_t n, void *st) {
  counted *f = c;
  f->reduce_scatters++;
  return f->inner.ops->reduce_scatter(f->inner.ctx, x, y, n, st);
}
static int ct_all_gather(void *c, const void *x, void *y, size_t n, void *st) {
  counted *f = c;
  f->all_gathers++;
  return f->inner.ops->all_gather(f->inner.ctx, x, y, n, st);
}
static int ct_broadcast(void *c, const void *x, void *y, size_t n, int root, void *st) {
  counted *f = c;
  return f->inner.ops->broadcast(f->inner.ctx, x, y, n, root, st);
}
static int ct_barrier(void *c, void *st) {
  counted *f = c;
  return f->inner.ops->barrier(f->inner.ctx, st);
}
static void ct_abort(void *c) { counted *f = c; f->inner.ops->abort(f->inner.ctx); }
static const char *ct_error_text(void *c) {
  counted *f = c;
  return f->inner.ops->error_text(f->inner.ctx);
}
static void *ct_queue(void *c) { counted *f = c; return f->inner.ops->queue(f->inner.ctx); }
static int ct_queue_after(void *c, void *st) {
  counted *f = c;
  return f->inner.ops->queue_after(f->inner.ctx, st);
}
static long long ct_queue_mark(void *c) {
  counted *f = c;
  return f->inner.ops->queue_mark(f->inner.ctx);
}
static int ct_stream_wait(void *c, void *st, long long t) {
  counted *f = c;
  return f->inner.ops->stream_wait(f->inner.ctx, st, t);
}
static int ct_queue_sync(void *c) { counted *f = c; return f->inner.ops->queue_sync(f->inner.ctx); }
static const zt_comm_ops counted_ops = {
    .name = "counted", .rank = ct_rank, .world = ct_world, .all_reduce = ct_all_reduce,
    .reduce_scatter = ct_reduce_scatter, .all_gather = ct_all_gather,
    .broadcast = ct_broadcast, .queue = ct_queue, .queue_after = ct_queue_after,
    .queue_mark = ct_queue_mark, .stream_wait = ct_stream_wait, .queue_sync = ct_queue_sync,
    .barrier = ct_barrier, .abort = ct_abort, .error_text = ct_error_text};

/* One configuration of a world. */
typedef struct cfg {
  zt_arch arch;
  int tied; /* llama: 0 untied (the head has its own weights) */
  int W, G, stage;
  int params_host; /* stage 3: the parameters and the optimizer of units 1.. on the host */
  float clip;
  zt_dtype dt;
} cfg;

static zt_model_cfg model_of(const cfg *c) {
  zt_model_cfg mc = dpt_model_cfg(c->arch);
  if (c->arch == ZT_ARCH_LLAMA) mc.tie_embeddings = c->tied;
  return mc;
}

static zt_dp_cfg dp_of(const cfg *c, int stage, zt_offload_order order) {
  zt_dp_cfg d = {.world = c->W, .zero_stage = stage, .order = order};
  if (c->params_host && stage == 3) {
    d.optimizer = ZT_PLACE_HOST;
    d.params = ZT_PLACE_HOST;
    d.gpu_units = 1;
  }
  return d;
}

/* A run of the world: every step's loss and norm, the state after, the collectives of a rank
 * in the last step, its bytes against the estimate. */
typedef struct world_run {
  dpt_run r;
  float *state;
  long gathers, reduce_scatters, all_reduces; /* rank 0's in the last step, the two exchanges'
                                                 all-gathers of scalars left out */
  int fails;
} world_run;

static world_run run_world(const cfg *c, int stage, zt_offload_order order, const int32_t *tok,
                           size_t per, const char *what) {
  zt_model_cfg mc = model_of(c);
  zt_train_cfg tc = dpt_train_cfg(c->G, c->clip, c->dt);
  zt_dp_cfg dc = dp_of(c, stage, order);
  world_run o = {0};
  dpt_ranks x;
  counted cn[DPT_MAXW];
  dpt_ranks_open(&x, c->W);
  for (int r = 0; r < c->W; r++) {
    cn[r] = (counted){.inner = x.r[r].comm};
    x.r[r].comm = (zt_comm){&counted_ops, &cn[r]};
  }
  zt_trainer *t = dpt_open_dp_cfg(&mc, &tc, &x, &dc);
  size_t est = zt_dp_estimate_rank_bytes(&mc, &tc, &dc, x.r[0].be.ops);
  o.fails += MC_EXPECT(est == zt_trainer_dp_rank_bytes(t, 0), "%s: rank bytes %zu, estimate %zu",
                       what, zt_trainer_dp_rank_bytes(t, 0), est);
  o.fails += dpt_run_steps(t, tok, per, 0, DPT_STEPS - 1, &o.r, what);
  counted before = cn[0];
  o.fails += dpt_run_steps(t, tok, per, DPT_STEPS - 1, DPT_STEPS, &o.r, what);
  o.gathers = cn[0].all_gathers - before.all_gathers - 2;
  o.reduce_scatters = cn[0].reduce_scatters - before.reduce_scatters;
  o.all_reduces = cn[0].all_reduces - before.all_reduces;
  o.state = dpt_state_of(t);
  zt_trainer_close(t);
  for (int r = 0; r < c->W; r++) x.r[r].comm = cn[r].inner;
  dpt_ranks_close(&x);
  return o;
}

static int close_rel(double a, double b, double tol) { return fabs(a - b) <= tol * fabs(b); }

/* Every loss, norm and the state bitwise. */
static int bitwise(const world_run *a, const world_run *b, size_t n, const char *what,
                   const char *ref) {
  int fails = 0;
  for (int i = 0; i < DPT_STEPS; i++)
    fails += MC_EXPECT(a->r.loss[i] == b->r.loss[i] && a->r.norm[i] == b->r.norm[i],
                       "%s: step %d loss %.17g norm %.17g, %s %.17g %.17g", what, i + 1,
                       a->r.loss[i], a->r.norm[i], ref, b->r.loss[i], b->r.norm[i]);
  fails += MC_EXPECT(memcmp(a->state, b->state, 3 * n * sizeof(float)) == 0,
                     "%s: parameters, m or v differ from %s's", what, ref);
  return fails;
}

/* The collectives the plan counts for this world and order. */
static zt_dp_plan_colls plan_colls(const cfg *c, zt_offload_order order) {
  zt_model_cfg mc = model_of(c);
  zt_train_cfg tc = dpt_train_cfg(c->G, c->clip, c->dt);
  zt_dp_cfg d = dp_of(c, c->stage, order);
  zt_offload_cfg o = {.optimizer = d.optimizer, .params = d.params, .gpu_units = d.gpu_units,
                      .order = order};
  zt_model *m;
  zt_dp_plan p;
  char err[256];
  if (zt_model_create(&m, &mc, err, sizeof err) < 0 ||
      zt_dp_plan_make(&p, m, &tc, &o, c->W, c->stage, err, sizeof err) < 0) {
    fprintf(stderr, "plan: %s\n", err);
    exit(1);
  }
  zt_dp_plan_colls n = zt_dp_plan_step_colls(&p, &tc);
  zt_dp_plan_free(&p);
  zt_model_destroy(m);
  return n;
}

static int colls_are(const world_run *w, const cfg *c, zt_offload_order order,
                     const char *what) {
  zt_dp_plan_colls want = plan_colls(c, order);
  long per_gather = c->dt == ZT_F32 ? 1 : 2; /* the compute copy gathered beside the fp32 */
  return MC_EXPECT(w->gathers == want.gathers * per_gather &&
                       w->reduce_scatters == want.reduce_scatters &&
                       w->all_reduces == want.all_reduces,
                   "%s: a step's all-gathers %ld, reduce-scatters %ld, all-reduces %ld; the "
                   "plan's %ld (x%ld), %ld, %ld", what, w->gathers, w->reduce_scatters,
                   w->all_reduces, want.gathers, per_gather, want.reduce_scatters,
                   want.all_reduces);
}

static int check(const cfg *c) {
  zt_model_cfg mc = model_of(c);
  zt_train_cfg tc = dpt_train_cfg(c->W * c->G, c->clip, c->dt);
  int32_t *tok = dpt_tokens(&mc, c->W * c->G, 41 + (uint64_t)c->W * 7 + (uint64_t)c->G);
  size_t per = dpt_step_tokens(&mc, c->W * c->G);
  char what[200];
  snprintf(what, sizeof what, "%s%s W %d G %d stage %d%s clip %g %s", zt_arch_name(c->arch),
           c->arch == ZT_ARCH_LLAMA && !c->tied ? " untied" : "", c->W, c->G, c->stage,
           c->params_host ? " params host" : "", (double)c->clip, zt_dtype_name(c->dt));
  zt_backend be;
  if (zt_backend_cpu_open(&be, 1) < 0) exit(1);
  zt_trainer *tp = dpt_open_plain(&mc, &tc, &be);
  dpt_run plain;
  size_t n = zt_model_num_params(zt_trainer_model(tp));
  int fails = dpt_run_steps(tp, tok, per, 0, DPT_STEPS, &plain, "plain");
  zt_trainer_close(tp);
  zt_backend_cpu_close(&be);

  world_run unit = run_world(c, c->stage, ZT_ORDER_UNIT, tok, per, what);
  world_run micro = run_world(c, c->stage, ZT_ORDER_MICRO, tok, per, "micro order");
  fails += unit.fails + micro.fails;
  /* reduced as micro order reduces them, or summed first as stage 1 always does */
  int summed_first = c->G > 1 && c->stage > 1 && !(c->arch == ZT_ARCH_GPT || c->tied);
  if (!summed_first) {
    fails += bitwise(&unit, &micro, n, what, "micro order");
  } else {
    world_run s1 = run_world(c, 1, ZT_ORDER_MICRO, tok, per, "micro order stage 1");
    fails += s1.fails + bitwise(&unit, &s1, n, what, "micro order stage 1");
    free(s1.state);
  }
  double tol = c->dt == ZT_F32 ? 1e-6 : 1e-4;
  for (int i = 0; i < DPT_STEPS; i++)
    fails += MC_EXPECT(i == 0 ? unit.r.loss[0] == plain.loss[0]
                              : close_rel(unit.r.loss[i], plain.loss[i], tol),
                       "%s: step %d loss %.17g, plain %.17g", what, i + 1, unit.r.loss[i],
                       plain.loss[i]) +
             MC_EXPECT(close_rel(unit.r.norm[i], plain.norm[i], 10 * tol),
                       "%s: step %d norm %.17g, plain %.17g", what, i + 1, unit.r.norm[i],
                       plain.norm[i]);
  fails += colls_are(&unit, c, ZT_ORDER_UNIT, what);
  fails += colls_are(&micro, c, ZT_ORDER_MICRO, "micro order");
  printf("%s: a step's all-gathers %ld (micro %ld), reduce-scatters %ld (%ld), all-reduces %ld "
         "(%ld)\n", what, unit.gathers, micro.gathers, unit.reduce_scatters,
         micro.reduce_scatters, unit.all_reduces, micro.all_reduces);
  free(unit.state);
  free(micro.state);
  free(tok);
  return fails;
}

/* Stage 3 llama untied, fp32: U units, the all-gathers of parameters per step fall from
 * 2U - 2 + 2 (G - 1)(U - 2) (the first forward gathers every unit, each later pass all but the
 * two the slots still hold) to 2U - 2 (the forward once, the backward once), and the
 * reduce-scatters from G U to U. */
static int headline(void) {
  cfg c = {ZT_ARCH_LLAMA, 0, 2, 4, 3, 0, 0.0f, ZT_F32};
  zt_dp_plan_colls um = plan_colls(&c, ZT_ORDER_UNIT), mm = plan_colls(&c, ZT_ORDER_MICRO);
  long U = 4, G = c.G; /* the embedding, 2 blocks, the head */
  return MC_EXPECT(um.gathers == 2 * U - 2 && mm.gathers == 2 * U - 2 + 2 * (G - 1) * (U - 2) &&
                       um.reduce_scatters == U && mm.reduce_scatters == G * U,
                   "stage 3 G 4: the plan's all-gathers unit %ld micro %ld, reduce-scatters "
                   "unit %ld micro %ld", um.gathers, mm.gathers, um.reduce_scatters,
                   mm.reduce_scatters);
}

/* offload.order auto under a budget (zt_dp_plan_place): unit where every micro-batch's
 * activations fit and it saves collectives (stage 3 llama untied), micro where it saves none
 * (stage 1: one all-reduce a step either way) or its activations do not fit. */
static int auto_order(void) {
  static const struct {
    int stage;
    size_t budget;
    zt_offload_order want;
  } cases[] = {{3, 100000000, ZT_ORDER_UNIT}, {1, 100000000, ZT_ORDER_MICRO},
               {3, 0, ZT_ORDER_MICRO}};
  cfg c = {ZT_ARCH_LLAMA, 0, 2, 3, 3, 0, 0.0f, ZT_F32};
  zt_model_cfg mc = model_of(&c);
  zt_backend be;
  zt_model *m;
  char err[256];
  int fails = 0;
  if (zt_backend_cpu_open(&be, 1) < 0 || zt_model_create(&m, &mc, err, sizeof err) < 0) exit(1);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    zt_train_cfg tc = dpt_train_cfg(c.G, 0, ZT_F32);
    zt_offload_cfg o = {.optimizer = ZT_PLACE_HOST, .params = ZT_PLACE_GPU, .gpu_units = 1,
                        .host_units = -1, .gpu_budget = cases[i].budget};
    zt_dp_plan_least least;
    int no_offload, rc;
    if (!o.gpu_budget) {
      /* just below what unit order needs with this placement: micro order fits */
      zt_offload_cfg u = o;
      u.order = ZT_ORDER_UNIT;
      u.host_units = 0;
      o.gpu_budget = zt_dp_plan_rank_bytes(&mc, &tc, &u, c.W, cases[i].stage, be.ops) - 1;
    }
    rc = zt_dp_plan_place(m, &tc, &o, c.W, cases[i].stage, be.ops, &no_offload, &least);
    fails += MC_EXPECT(rc == 0 && o.order == cases[i].want, "auto order, stage %d budget %zu: "
                       "%d, order %d, want %d", cases[i].stage, o.gpu_budget, rc, (int)o.order,
                       (int)cases[i].want);
  }
  zt_model_destroy(m);
  zt_backend_cpu_close(&be);
  return fails;
}

int main(void) {
  static const cfg cfgs[] = {
      /* arch, tied, W, G, stage, params host, clip, dtype */
      {ZT_ARCH_LLAMA, 0, 2, 3, 1, 0, 0.0f, ZT_F32},
      {ZT_ARCH_LLAMA, 0, 2, 3, 2, 0, 0.0f, ZT_F32},
      {ZT_ARCH_LLAMA, 0, 2, 3, 3, 0, 0.5f, ZT_F32},
      {ZT_ARCH_LLAMA, 0, 3, 4, 3, 0, 0.0f, ZT_F32},
      {ZT_ARCH_LLAMA, 0, 3, 3, 3, 1, 0.0f, ZT_F32},
      {ZT_ARCH_LLAMA, 0, 2, 3, 3, 1, 0.5f, ZT_F32},
      {ZT_ARCH_LLAMA, 0, 2, 4, 3, 0, 0.0f, ZT_BF16},
      {ZT_ARCH_LLAMA, 0, 3, 1, 3, 0, 0.0f, ZT_F32},
      {ZT_ARCH_LLAMA, 1, 2, 3, 3, 0, 0.0f, ZT_F32},
      {ZT_ARCH_GPT, 0, 2, 3, 1, 0, 0.5f, ZT_F32},
      {ZT_ARCH_GPT, 0, 3, 3, 2, 0, 0.0f, ZT_F32},
      {ZT_ARCH_GPT, 0, 2, 4, 3, 0, 0.0f, ZT_F32},
      {ZT_ARCH_GPT, 0, 3, 3, 3, 1, 0.5f, ZT_F32},
      {ZT_ARCH_GPT, 0, 2, 3, 3, 0, 0.0f, ZT_BF16},
      {ZT_ARCH_GPT, 0, 2, 1, 2, 0, 0.0f, ZT_F32},
  };
  int fails = headline() + auto_order();
  for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) fails += check(&cfgs[i]);
  if (fails) {
    fprintf(stderr, "%d failure(s)\n", fails);
    return 1;
  }
  printf("dp order: ok\n");
  return 0;
}
