/* The data-parallel plan (dp_plan.h): the shard table, the units' placement, every buffer of a
 * rank, and the search of a several-rank job's placement under a per-GPU budget, its policy
 * checked first (zt_dp_plan_resolve). */
#include "engine/plan/dp_plan.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/sizes.h"
#include "engine/plan/offload_plan.h"
#include "offload/host_arena.h"
#include "offload/opt_store.h"

int zt_dp_plan_shard_table(const zt_model *m, int world, zt_shard_table **tab) {
  int nu = zt_model_num_units(m);
  zt_shard_unit *units = calloc((size_t)nu, sizeof *units);
  if (!units) return -ENOMEM;
  for (int u = 0; u < nu; u++)
    units[u] = (zt_shard_unit){zt_model_unit(m, u)->offset, zt_model_unit(m, u)->numel};
  int rc = zt_shard_table_build(tab, units, nu, world, ZT_DP_ALIGN);
  free(units);
  return rc;
}

/* ---- the checks ---------------------------------------------------------------------------- */

int zt_dp_plan_check_world(int world, int zero_stage, char *err, size_t errlen) {
  if (world < 1 || world > ZT_DP_MAX_WORLD) {
    snprintf(err, errlen, "dp.world must be in [1, %d] (got %d)", ZT_DP_MAX_WORLD, world);
    return -EINVAL;
  }
  if (zero_stage < 1 || zero_stage > 3) {
    snprintf(err, errlen, "dp.zero_stage must be 1, 2 or 3 (got %d)", zero_stage);
    return -EINVAL;
  }
  return 0;
}

int zt_dp_plan_check_place(const zt_offload_cfg *c, int zero_stage, char *err, size_t errlen) {
  const struct {
    const char *field;
    zt_offload_place v;
  } places[] = {{"optimizer", c->optimizer}, {"params", c->params}};
  for (int i = 0; i < 2; i++)
    if (places[i].v < ZT_PLACE_AUTO || places[i].v > ZT_PLACE_NVME) {
      snprintf(err, errlen, "dp.%s must be auto, gpu, host or nvme", places[i].field);
      return -EINVAL;
    }
  int off = c->optimizer == ZT_PLACE_HOST || c->optimizer == ZT_PLACE_NVME;
  if (c->params == ZT_PLACE_HOST && (zero_stage != 3 || !off)) {
    snprintf(err, errlen, "dp.params: host needs zero_stage 3 (stages 1-2 keep every unit's "
             "parameters on every device) and optimizer host or nvme (the masters the chunks "
             "are copied from) (got zero_stage %d, optimizer %s)", zero_stage,
             zt_offload_place_name(c->optimizer));
    return -EINVAL;
  }
  if (c->params == ZT_PLACE_NVME && (zero_stage != 3 || c->optimizer != ZT_PLACE_NVME)) {
    snprintf(err, errlen, "dp.params: nvme needs zero_stage 3 (stages 1-2 keep every unit's "
             "parameters on every device) and optimizer nvme (the master files the chunks are "
             "read from) (got zero_stage %d, optimizer %s)", zero_stage,
             zt_offload_place_name(c->optimizer));
    return -EINVAL;
  }
  if (off && c->gpu_units < 0) {
    snprintf(err, errlen, "dp.gpu_units must be >= 0 with optimizer %s (got %d)",
             zt_offload_place_name(c->optimizer), c->gpu_units);
    return -EINVAL;
  }
  if (c->host_units < 0 || (c->host_units && c->optimizer != ZT_PLACE_NVME)) {
    snprintf(err, errlen, "dp.host_units splits the host units' optimizer between the host and "
             "NVMe: it must be >= 0, and 0 unless optimizer is nvme (got %d with optimizer %s)",
             c->host_units, zt_offload_place_name(c->optimizer));
    return -EINVAL;
  }
  if (c->optimizer == ZT_PLACE_NVME && !c->nvme_dir[0]) {
    snprintf(err, errlen, "dp.nvme_dir is required with optimizer nvme");
    return -EINVAL;
  }
  if (c->optimizer == ZT_PLACE_NVME && strlen(c->nvme_dir) + 20 >= ZT_PATH_MAX) {
    snprintf(err, errlen, "dp.nvme_dir is longer than %d bytes", ZT_PATH_MAX - 21);
    return -ENAMETOOLONG;
  }
  return 0;
}

/* ---- the plan ------------------------------------------------------------------------------ */

/* The units on the device and the two tiers' sizes, from the table. */
static int place_units(zt_dp_plan *s, const zt_offload_cfg *o, char *err, size_t errlen) {
  s->ng = s->nu;
  if (o->optimizer == ZT_PLACE_HOST || o->optimizer == ZT_PLACE_NVME) {
    if (o->gpu_units > s->nu) {
      snprintf(err, errlen, "dp.gpu_units must be in [0, %d] (the model's units) (got %d)",
               s->nu, o->gpu_units);
      return -EINVAL;
    }
    s->ng = o->gpu_units;
  }
  if (o->host_units > s->nu - s->ng) {
    snprintf(err, errlen, "dp.host_units must be in [0, %d] (the units after dp.gpu_units %d "
             "of the model's %d) (got %d)", s->nu - s->ng, s->ng, s->nu, o->host_units);
    return -EINVAL;
  }
  s->params_host =
      (o->params == ZT_PLACE_HOST || o->params == ZT_PLACE_NVME) && s->ng < s->nu;
  s->dev_packed = s->ng < s->nu ? zt_shard_at(s->tab, s->ng, 0)->packed_off
                                : s->tab->packed_total;
  s->host_n = s->tab->packed_total - s->dev_packed;
  s->nv0 = o->optimizer == ZT_PLACE_NVME ? s->ng + o->host_units : s->nu;
  s->nvme = s->nv0 < s->nu;
  /* without NVMe units (host_units all the rest) params nvme is params host */
  s->params_nvme = o->params == ZT_PLACE_NVME && s->nvme;
  s->hopt_n = (s->nvme ? zt_shard_at(s->tab, s->nv0, 0)->packed_off : s->tab->packed_total) -
              s->dev_packed;
  for (int u = s->nv0; u < s->nu; u++)
    if (s->tab->chunk[u] > s->nv_chunk) s->nv_chunk = s->tab->chunk[u];
  return 0;
}

/* Elements of the device's parameter buffer: stages 1-2 the padded layout, stage 3 the packed
 * shard (of the device units only with params host). */
static size_t dev_param_floats(const zt_dp_plan *s) {
  if (s->zero_stage < 3) return s->tab->padded_total;
  return s->params_host ? s->dev_packed : s->tab->packed_total;
}

/* Stage 1's gradients are the padded layout; 2-3 the device units' packed shard. */
static size_t dev_grad_floats(const zt_dp_plan *s) {
  return s->zero_stage == 1 ? s->tab->padded_total : s->dev_packed;
}

static int gout_count(const zt_dp_plan *s) {
  return !s->host_n ? 0 : s->zero_stage >= 2 ? 2 : 1;
}

/* Stages 2-3: each unit's gradients are reduced once a micro-batch, later ones into a scratch
 * chunk added to the first's; once a step where the backward is unit-major. */
static int reduced_again(const zt_dp_plan *s, const zt_train_cfg *tc) {
  return tc->grad_accum > 1 && !s->um_back;
}

static int has_hstage(const zt_dp_plan *s, const zt_train_cfg *tc) {
  return s->host_n && s->zero_stage >= 2 && reduced_again(s, tc);
}

/* The elements of the host tier's masters and compute copy: the host units' (ng..nv0-1), and
 * with optimizer nvme and params host the NVMe units' too, as the parameters the gathers are
 * staged from (params nvme reads those from the files). m and v are the host units' alone
 * (hopt_n). */
static size_t host_master_floats(const zt_dp_plan *s) {
  return !s->nvme || (s->params_host && !s->params_nvme) ? s->host_n : s->hopt_n;
}

/* Every buffer of a rank from the layout: the device's as far as its stage goes (above), and
 * the host tier's gradients, staging, masters, m, v and the bf16 copy, with optimizer nvme two
 * sets (their compute copy unless params nvme, whose gathers cast it on the device), and with
 * params nvme two parameter stagings. */
static void size_bufs(zt_dp_plan *s, const zt_train_cfg *tc) {
  const zt_shard_table *tab = s->tab;
  size_t f = sizeof(float), W = (size_t)s->world;
  size_t lp = tc->precision != ZT_F32 ? zt_dtype_size(tc->precision) : 0;
  int stage = s->zero_stage;
  zt_dp_dev_bufs *d = &s->dev;
  d->params = dev_param_floats(s) * f;
  d->params_lp = dev_param_floats(s) * lp;
  d->grads = dev_grad_floats(s) * f;
  d->moments = s->dev_packed * f;
  d->xchg = W * s->rec * sizeof(double);
  for (int i = 0; i < gout_count(s); i++) d->gout[i] = tab->max_chunk * f;
  if (s->params_host) {
    d->pchunk = tab->max_chunk * f;
    d->lpchunk = tab->max_chunk * lp;
  }
  if (stage >= 2) {
    d->gunit = s->slot_floats * f;
    d->gembed = s->tied ? tab->chunk[0] * W * f : 0;
    d->gscratch = s->um_back ? 0 : tab->max_chunk * f;
  }
  if (stage == 3) {
    d->pslot = s->slot_floats * f;
    d->lpslot = s->slot_floats * lp;
    d->pembed = s->tied ? tab->chunk[0] * W * f : 0;
    d->lpembed = s->tied ? tab->chunk[0] * W * lp : 0;
  }
  if (!s->host_n) return;
  zt_dp_host_bufs *h = &s->host;
  size_t hm = host_master_floats(s);
  h->grads = s->host_n * f;
  h->stage = has_hstage(s, tc) ? s->host_n * f : 0;
  h->masters = hm * f;
  h->lp = lp ? hm * sizeof(uint16_t) : 0;
  h->moments = s->hopt_n * f;
  if (s->nvme) {
    h->set = s->nv_chunk * f;
    h->set_lp = lp && !s->params_nvme ? s->nv_chunk * sizeof(uint16_t) : 0;
  }
  if (s->params_nvme) h->pstage = s->nv_chunk * f;
}

int zt_dp_plan_make(zt_dp_plan *s, const zt_model *m, const zt_train_cfg *tc,
                    const zt_offload_cfg *o, int world, int zero_stage, char *err,
                    size_t errlen) {
  *s = (zt_dp_plan){.world = world, .zero_stage = zero_stage};
  s->nu = zt_model_num_units(m);
  s->tied = zt_model_head_reads_embed(m);
  s->rec = ZT_DP_XCHG_SCALARS + 2 * (size_t)tc->grad_accum;
  if (o->order == ZT_ORDER_UNIT && tc->grad_accum > ZT_UNIT_MAJOR_MICROS_MAX) {
    snprintf(err, errlen, "offload.order: unit walks at most %d micro-batches at once "
             "(train.grad_accum is %d)", ZT_UNIT_MAJOR_MICROS_MAX, tc->grad_accum);
    return -EINVAL;
  }
  s->unit_major = o->order == ZT_ORDER_UNIT && tc->grad_accum > 1;
  s->um_back = s->unit_major && zt_offload_backward_unit_major(m);
  s->act_micros = s->unit_major ? tc->grad_accum : 1;
  int rc = zt_dp_plan_shard_table(m, world, &s->tab);
  if (rc < 0) {
    snprintf(err, errlen, rc == -EOVERFLOW ? "the model is too large to shard" : "out of memory");
    return rc;
  }
  /* the units a slot or the unit gradient buffer holds: all but a tied embedding */
  for (int u = s->tied; u < s->nu; u++) {
    size_t f = s->tab->chunk[u] * (size_t)world;
    if (f > s->slot_floats) s->slot_floats = f;
  }
  if ((rc = place_units(s, o, err, errlen)) < 0) {
    zt_dp_plan_free(s);
    return rc;
  }
  size_bufs(s, tc);
  return 0;
}

void zt_dp_plan_free(zt_dp_plan *p) {
  zt_shard_table_free(p->tab);
  p->tab = NULL;
}

size_t zt_dp_plan_dev_bytes(const zt_dp_plan *p) {
  const zt_dp_dev_bufs *d = &p->dev;
  return d->params + d->params_lp + d->grads + 2 * d->moments + d->xchg + d->gout[0] +
         d->gout[1] + 2 * (d->pchunk + d->lpchunk) + 2 * d->gunit + d->gembed + d->gscratch +
         2 * (d->pslot + d->lpslot) + d->pembed + d->lpembed;
}

size_t zt_dp_plan_host_bytes(const zt_dp_plan *p) {
  const zt_dp_host_bufs *h = &p->host;
  return zt_host_arena_footprint(h->grads) + zt_host_arena_footprint(h->stage) +
         zt_host_arena_footprint(h->masters) + zt_host_arena_footprint(h->lp) +
         2 * zt_host_arena_footprint(h->moments) +
         2 * (3 * zt_host_arena_footprint(h->set) + zt_host_arena_footprint(h->set_lp)) +
         2 * zt_host_arena_footprint(h->pstage);
}

uint64_t zt_dp_plan_nvme_bytes(const zt_dp_plan *s) {
  uint64_t sum = 0;
  /* dp runs fp32 moments alone (zt_train_cfg_check_strategy) */
  for (int u = s->nv0; u < s->nu; u++)
    sum += zt_opt_store_file_bytes(s->tab->chunk[u], ZT_F32);
  return sum;
}

size_t zt_dp_plan_act_bytes(const zt_dp_plan *p, const zt_model *m, const zt_train_cfg *tc,
                            const zt_ops *ops) {
  return zt_acts_size_dt(m, ops, tc->micro_batch, tc->ckpt_every, tc->precision) *
         (size_t)p->act_micros;
}

/* Stage 3: a visit of unit u by the walk gathers it unless its slot (the embedding's own, for a
 * tied one) holds it; counts the gathers. */
static long visit(const zt_dp_plan *p, int u, int slot[2], int *embed) {
  if (p->tied && u == 0) {
    if (*embed) return 0;
    *embed = 1;
    return 1;
  }
  if (slot[u & 1] == u) return 0;
  slot[u & 1] = u;
  return 1;
}

/* Stage 3's gathers of a step, as engine/train/dp/step.c walks: the slots start empty, the
 * forward walks the units up (each one's prefetch of the next is that next visit) and the
 * backward down, every micro-batch (micro-major), or the forward once and the backward once
 * (unit-major) or once a micro-batch (a head reading the embedding). */
static long stage3_gathers(const zt_dp_plan *p, int G) {
  int slot[2] = {-1, -1}, embed = 0;
  long n = 0;
  int forwards = p->unit_major ? 1 : G, backwards = p->um_back ? 1 : G;
  for (int i = 0; i < G; i++) {
    for (int u = 0; i < forwards && u < p->nu; u++) n += visit(p, u, slot, &embed);
    for (int u = p->nu - 1; i < backwards && u >= 0; u--) n += visit(p, u, slot, &embed);
  }
  return n;
}

zt_dp_plan_colls zt_dp_plan_step_colls(const zt_dp_plan *p, const zt_train_cfg *tc) {
  zt_dp_plan_colls c = {0};
  long reductions = p->um_back ? 1 : tc->grad_accum;
  if (p->zero_stage == 1) {
    c.all_reduces = p->nu; /* after the last micro-batch, whatever the order */
    c.gathers = p->nu;     /* of the updated parameters */
    return c;
  }
  c.reduce_scatters = p->nu * reductions;
  c.gathers = p->zero_stage == 2 ? p->nu : stage3_gathers(p, tc->grad_accum);
  return c;
}

/* What a rank holds: with ops its device bytes; without, its host tier or (nvme) its files. */
static uint64_t estimate(const zt_model_cfg *mc, const zt_train_cfg *tc, const zt_offload_cfg *o,
                         int world, int zero_stage, const zt_ops *ops, int nvme) {
  char err[256];
  uint64_t bytes = UINT64_MAX;
  zt_model *m;
  zt_dp_plan p;
  if (zt_train_cfg_check(tc, err, sizeof err) < 0 ||
      zt_dp_plan_check_world(world, zero_stage, err, sizeof err) < 0 ||
      zt_dp_plan_check_place(o, zero_stage, err, sizeof err) < 0 ||
      zt_model_create(&m, mc, err, sizeof err) < 0)
    return UINT64_MAX;
  if (zt_dp_plan_make(&p, m, tc, o, world, zero_stage, err, sizeof err) == 0) {
    if (nvme) {
      bytes = zt_dp_plan_nvme_bytes(&p);
    } else if (!ops) {
      bytes = zt_dp_plan_host_bytes(&p);
    } else {
      size_t acts = zt_dp_plan_act_bytes(&p, m, tc, ops);
      if (acts) bytes = acts + zt_dp_plan_dev_bytes(&p);
    }
    zt_dp_plan_free(&p);
  }
  zt_model_destroy(m);
  return bytes;
}

size_t zt_dp_plan_rank_bytes(const zt_model_cfg *mc, const zt_train_cfg *tc,
                             const zt_offload_cfg *o, int world, int zero_stage,
                             const zt_ops *ops) {
  uint64_t b = ops ? estimate(mc, tc, o, world, zero_stage, ops, 0) : UINT64_MAX;
  return b > SIZE_MAX ? SIZE_MAX : (size_t)b;
}

size_t zt_dp_plan_host_tier_bytes(const zt_model_cfg *mc, const zt_train_cfg *tc,
                                  const zt_offload_cfg *o, int world, int zero_stage) {
  uint64_t b = estimate(mc, tc, o, world, zero_stage, NULL, 0);
  return b > SIZE_MAX ? SIZE_MAX : (size_t)b;
}

uint64_t zt_dp_plan_nvme_file_bytes(const zt_model_cfg *mc, const zt_train_cfg *tc,
                                    const zt_offload_cfg *o, int world, int zero_stage) {
  return estimate(mc, tc, o, world, zero_stage, NULL, 1);
}

/* ---- a several-rank job's placement ---------------------------------------------------------- */

/* What the search reads: the model, the recipe and the policy as asked for, the ranks. */
typedef struct search {
  const zt_model_cfg *mc;
  const zt_train_cfg *train;
  const zt_offload_cfg *offload;
  int world, zero_stage;
} search;

/* A rank's device bytes with this placement and activation checkpointing. */
static size_t rank_bytes(const search *s, const zt_ops *ops, zt_offload_place opt,
                         zt_offload_place params, int gpu_units, int ckpt_every) {
  zt_train_cfg tc = *s->train;
  tc.ckpt_every = ckpt_every;
  zt_offload_cfg d = *s->offload;
  d.optimizer = opt;
  d.params = params;
  d.gpu_units = gpu_units;
  d.host_units = 0;
  return zt_dp_plan_rank_bytes(s->mc, &tc, &d, s->world, s->zero_stage, ops);
}

/* Where the units the device does not keep have their optimizer: nvme where the spec says so
 * (a rank's device bytes are those of host), else host. */
static zt_offload_place off_place(const search *s) {
  return s->offload->optimizer == ZT_PLACE_NVME ? ZT_PLACE_NVME : ZT_PLACE_HOST;
}

/* The most leading units whose optimizer fits the budget on the device with the rest on the
 * host or NVMe (a rank's bytes grow with them), or -1 when not even none does. */
static int most_gpu_units(const search *s, const zt_ops *ops, zt_offload_place params,
                          int units, int ckpt_every, size_t budget) {
  zt_offload_place opt = off_place(s);
  if (rank_bytes(s, ops, opt, params, 0, ckpt_every) > budget) return -1;
  int lo = 0, hi = units; /* lo fits; find the largest that does */
  while (lo < hi) {
    int mid = lo + (hi - lo + 1) / 2;
    if (rank_bytes(s, ops, opt, params, mid, ckpt_every) <= budget)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

/* The fastest placement that fits the budget with this checkpointing: everything on the device
 * (*on_gpu set: no offload), else as many units' optimizer on the device as fit, else (stage 3)
 * the host units' parameters on the host too; params nvme (the spec's alone) stays nvme. 0 with
 * the choice in *o, or -ENOMEM. (The spec's parser refuses optimizer "gpu": that is the job
 * without an offload object.) */
static int fit(const search *s, const zt_ops *ops, int units, int ckpt_every, zt_offload_cfg *o,
               int *on_gpu) {
  const zt_offload_cfg *want = s->offload;
  size_t budget = want->gpu_budget;
  *on_gpu = want->optimizer == ZT_PLACE_AUTO && want->gpu_units < 0 &&
            (want->params == ZT_PLACE_AUTO || want->params == ZT_PLACE_GPU) &&
            rank_bytes(s, ops, ZT_PLACE_GPU, ZT_PLACE_GPU, 0, ckpt_every) <= budget;
  if (*on_gpu) return 0;
  /* the parameters' homes to try, fastest first */
  zt_offload_place homes[2];
  int nh = 0;
  if (want->params == ZT_PLACE_NVME) homes[nh++] = ZT_PLACE_NVME;
  if (want->params == ZT_PLACE_AUTO || want->params == ZT_PLACE_GPU) homes[nh++] = ZT_PLACE_GPU;
  if ((want->params == ZT_PLACE_AUTO || want->params == ZT_PLACE_HOST) && s->zero_stage == 3)
    homes[nh++] = ZT_PLACE_HOST;
  for (int i = 0; i < nh; i++) {
    zt_offload_place params = homes[i];
    int ng = want->gpu_units;
    if (ng >= 0 ? rank_bytes(s, ops, off_place(s), params, ng, ckpt_every) > budget
                : (ng = most_gpu_units(s, ops, params, units, ckpt_every, budget)) < 0)
      continue;
    o->optimizer = off_place(s);
    o->params = params;
    o->gpu_units = ng;
    return 0;
  }
  return -ENOMEM;
}

/* A step's collectives of parameters and gradients with placement o in order `order`: the
 * gathers and reductions offload.order auto weighs (the compute is the same in both). -1 where
 * the plan cannot be made. */
static long step_colls(const zt_model *m, const zt_train_cfg *tc, const zt_offload_cfg *o,
                       zt_offload_order order, int world, int zero_stage) {
  zt_offload_cfg c = *o;
  zt_dp_plan p;
  char err[256];
  c.order = order;
  c.host_units = 0; /* resolved after the placement; the walk's collectives do not depend on it */
  if (zt_dp_plan_make(&p, m, tc, &c, world, zero_stage, err, sizeof err) < 0) return -1;
  zt_dp_plan_colls n = zt_dp_plan_step_colls(&p, tc);
  zt_dp_plan_free(&p);
  return n.gathers + n.reduce_scatters + n.all_reduces;
}

/* offload.order auto with several micro-batches and a budget: unit where every micro-batch's
 * activations fit beside placement o and it issues fewer collectives a step (the all-gathers
 * and reduce-scatters it saves), else micro. */
static zt_offload_order pick_order(const zt_model *m, const zt_train_cfg *tc,
                                   const zt_offload_cfg *o, int world, int zero_stage,
                                   const zt_ops *ops) {
  if (tc->grad_accum > ZT_UNIT_MAJOR_MICROS_MAX) return ZT_ORDER_MICRO;
  zt_offload_cfg u = *o;
  u.order = ZT_ORDER_UNIT;
  u.host_units = 0; /* as rank_bytes: a rank's device bytes do not depend on it */
  if (zt_dp_plan_rank_bytes(zt_model_cfg_of(m), tc, &u, world, zero_stage, ops) > o->gpu_budget)
    return ZT_ORDER_MICRO;
  long um = step_colls(m, tc, o, ZT_ORDER_UNIT, world, zero_stage),
       mm = step_colls(m, tc, o, ZT_ORDER_MICRO, world, zero_stage);
  return um >= 0 && um < mm ? ZT_ORDER_UNIT : ZT_ORDER_MICRO;
}

int zt_dp_plan_place(const zt_model *m, zt_train_cfg *tc, zt_offload_cfg *o, int world,
                     int zero_stage, const zt_ops *ops, int *no_offload, zt_dp_plan_least *least) {
  const zt_model_cfg *mc = zt_model_cfg_of(m);
  int units = zt_model_num_units(m), L = mc->n_layers;
  search q = {.mc = mc, .train = tc, .offload = o, .world = world, .zero_stage = zero_stage};
  const search *s = &q;
  int auto_ckpt = tc->ckpt_every == ZT_CKPT_AUTO;
  *no_offload = 0;
  if (!o->gpu_budget) {
    /* no budget: auto means host for the optimizer (as with one rank; nvme stays nvme), gpu
     * for the rest */
    o->optimizer = off_place(s);
    if (o->params == ZT_PLACE_AUTO) o->params = ZT_PLACE_GPU;
    if (o->gpu_units < 0) o->gpu_units = 0;
    return 0; /* "auto" checkpointing: the least recompute that fits the device (engine/job/admission.c) */
  }
  /* the least recompute first (every L blocks recomputes 1, ... every 1 all L), and for each
   * the fastest placement */
  for (int i = 0; i <= (auto_ckpt ? L : 0); i++) {
    int every = !auto_ckpt ? tc->ckpt_every : i == 0 ? 0 : L + 1 - i;
    zt_offload_cfg got = *o;
    int on_gpu;
    if (fit(s, ops, units, every, &got, &on_gpu) == 0) {
      tc->ckpt_every = every;
      /* one micro-batch has no order to choose: auto stays */
      if (got.order == ZT_ORDER_AUTO && tc->grad_accum > 1)
        got.order = pick_order(m, tc, &got, world, zero_stage, ops);
      /* everything fits on the device: the job runs without offload, and its stored spec
       * says so */
      *no_offload = on_gpu;
      *o = got;
      return 0;
    }
  }
  /* the least a rank can take with what the spec allows, for the message (params nvme takes as
   * little of the device as host) */
  least->params = o->params == ZT_PLACE_NVME ? ZT_PLACE_NVME
                  : zero_stage == 3 && o->params != ZT_PLACE_GPU ? ZT_PLACE_HOST
                                                                 : ZT_PLACE_GPU;
  least->ckpt_every = auto_ckpt ? 1 : tc->ckpt_every;
  least->bytes = rank_bytes(s, ops, off_place(s), least->params,
                            o->gpu_units > 0 ? o->gpu_units : 0, least->ckpt_every);
  return -ENOMEM;
}

/* gpu_units, params, checkpointing and (auto) offload.order: what the budget (if any) holds,
 * fastest first (engine/plan/dp_plan.h), and the job without offload where everything fits on
 * the device. */
static int resolve_placement(const zt_model *m, zt_train_cfg *tc, zt_offload_cfg *o, int world,
                             int zero_stage, const char *ranks, const zt_ops *ops,
                             int *no_offload, char *err, size_t errlen) {
  zt_dp_plan_least least;
  int rc = zt_dp_plan_place(m, tc, o, world, zero_stage, ops, no_offload, &least);
  if (rc == 0) return 0;
  char a[32], b[32];
  zt_size_format(a, sizeof a, (double)least.bytes);
  zt_size_format(b, sizeof b, (double)o->gpu_budget);
  snprintf(err, errlen, "offload.gpu_budget %s per GPU is too small for %s: with the optimizer "
           "of %d unit(s) on the GPU and the rest's on the %s, the parameters %s%s a rank "
           "needs %s", b, ranks, o->gpu_units > 0 ? o->gpu_units : 0,
           o->optimizer == ZT_PLACE_NVME ? "NVMe" : "host",
           least.params == ZT_PLACE_NVME   ? "in NVMe files"
           : least.params == ZT_PLACE_HOST ? "on the host"
                                           : "on the GPU",
           least.ckpt_every == 1 ? " and every block recomputed" : "", a);
  return rc;
}

int zt_dp_plan_resolve(const zt_model_cfg *mc, zt_train_cfg *tc, zt_offload_cfg *o, int world,
                       int zero_stage, const char *ranks, const zt_ops *ops, int *no_offload,
                       char *err, size_t errlen) {
  *no_offload = 0;
  if (o->delayed_update) {
    snprintf(err, errlen, "offload.delayed_update with %s is not supported (only the offloaded "
             "step of one rank delays its update)", ranks);
    return -ENOTSUP;
  }
  if (o->order == ZT_ORDER_UNIT && tc->grad_accum > ZT_UNIT_MAJOR_MICROS_MAX) {
    snprintf(err, errlen, "offload.order: unit walks at most %d micro-batches at once "
             "(train.grad_accum is %d)", ZT_UNIT_MAJOR_MICROS_MAX, tc->grad_accum);
    return -EINVAL;
  }
  if (o->grads == ZT_PLACE_GPU) {
    snprintf(err, errlen, "offload.grads gpu with %s is not supported (the ranks reduce their "
             "gradients where their placement puts them, engine/train/dp/dp.h); use auto", ranks);
    return -ENOTSUP;
  }
  /* each rank reads its chunks of the parameters from its master files (engine/train/dp/dp.h):
   * stage 3's chunks, optimizer nvme's files */
  if (o->params == ZT_PLACE_NVME &&
      (zero_stage != 3 || o->optimizer != ZT_PLACE_NVME)) {
    snprintf(err, errlen, "offload.params: nvme with %s needs parallel.zero_stage 3 and "
             "offload.optimizer nvme (each rank reads its chunks of the parameters from its "
             "optimizer's master files) (got zero_stage %d, optimizer %s)", ranks,
             zero_stage, zt_offload_place_name(o->optimizer));
    return -EINVAL;
  }
  if (o->params == ZT_PLACE_HOST && zero_stage != 3) {
    snprintf(err, errlen, "offload.params: host with %s needs parallel.zero_stage 3 (stages 1-2 "
             "keep every unit's parameters on every GPU)", ranks);
    return -EINVAL;
  }
  zt_model *m;
  int rc = zt_model_create(&m, mc, err, errlen);
  if (rc < 0) return rc;
  int units = zt_model_num_units(m);
  if (o->gpu_units > units) {
    snprintf(err, errlen, "offload.gpu_units must be in [0, %d] (the model's units) (got %d)",
             units, o->gpu_units);
    rc = -EINVAL;
    goto out;
  }
  /* the host / NVMe split of the units the device does not keep is nvme's (a rank's device
   * bytes do not depend on it, so gpu_units is resolved as without it, then checked) */
  if (o->host_units >= 0 && o->optimizer != ZT_PLACE_NVME) {
    snprintf(err, errlen, "offload.host_units with %s needs offload.optimizer nvme (the units "
             "after the host ones keep their optimizer on NVMe) (got optimizer %s)", ranks,
             zt_offload_place_name(o->optimizer));
    rc = -ENOTSUP;
    goto out;
  }
  if ((rc = resolve_placement(m, tc, o, world, zero_stage, ranks, ops, no_offload, err,
                              errlen)) < 0)
    goto out;
  if (!*no_offload && o->host_units > units - o->gpu_units) {
    snprintf(err, errlen, "offload.host_units is %d; after %d unit(s) on the device the model "
             "has %d", o->host_units, o->gpu_units, units - o->gpu_units);
    rc = -EINVAL;
  }
out:
  zt_model_destroy(m);
  return rc;
}
