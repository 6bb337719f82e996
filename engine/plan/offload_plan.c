/* The single-rank offloaded step's plan (engine/plan/offload_plan.h): the sizes of every buffer
 * the open allocates, the cost model, the search over what the spec leaves to auto. */
#include "engine/plan/offload_plan.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/sizes.h"
#include "engine/base/tunables.h"
#include "engine/plan/rates.h"
#include "engine/plan/step_cost.h"
#include "offload/device_arena.h"
#include "offload/host_arena.h"
#include "offload/opt_store.h"
#include "offload/streamer.h"

/* A size in a refusal: "1.5 GiB", one of at most SIZE_TEXTS in a message. */
#define SIZE_TEXTS 8
typedef struct size_texts {
  char t[SIZE_TEXTS][32];
  int n;
} size_texts;
static const char *sz(size_texts *b, double bytes) {
  char *t = b->t[b->n++ % SIZE_TEXTS];
  zt_size_format(t, sizeof b->t[0], bytes);
  return t;
}

/* the policy's limits (engine/plan/recipe.h) */
#define GRAD_RING_SLOTS ZT_OFFLOAD_GRAD_RING_MIN

zt_offload_unit_layout zt_offload_unit_layout_of(const zt_model *m, int u, zt_dtype dt) {
  const zt_unit_info *ui = zt_model_unit(m, u);
  if (dt == ZT_F32)
    return (zt_offload_unit_layout){0, ui->numel * sizeof(float), ui->numel * sizeof(float)};
  size_t es = zt_dtype_size(dt), f32_end = 0, lp_begin = SIZE_MAX, lp_end = 0;
  for (int i = ui->first_tensor; i < ui->first_tensor + ui->n_tensors; i++) {
    const zt_tensor_info *ti = zt_model_tensor(m, i);
    size_t a = ti->offset - ui->offset, b = a + ti->numel;
    if ((ti->reads & ZT_READS_F32) && b * sizeof(float) > f32_end) f32_end = b * sizeof(float);
    if ((ti->reads & ZT_READS_LP) && a * es < lp_begin) lp_begin = a * es;
    if ((ti->reads & ZT_READS_LP) && b * es > lp_end) lp_end = b * es;
  }
  if (lp_begin == SIZE_MAX) return (zt_offload_unit_layout){0, f32_end, f32_end};
  size_t gap = f32_end > lp_begin ? f32_end - lp_begin : 0;
  size_t lp_offset = (gap + ZT_DEV_ARENA_ALIGN - 1) / ZT_DEV_ARENA_ALIGN * ZT_DEV_ARENA_ALIGN;
  size_t bytes = lp_offset + lp_end > f32_end ? lp_offset + lp_end : f32_end;
  return (zt_offload_unit_layout){lp_offset, bytes, f32_end};
}

size_t zt_offload_unit_param_bytes(const zt_model *m, int u, zt_dtype dt) {
  return zt_offload_unit_layout_of(m, u, dt).bytes;
}

size_t zt_offload_unit_fetch_bytes(const zt_model *m, int u, zt_dtype dt) {
  const zt_unit_info *ui = zt_model_unit(m, u);
  if (dt == ZT_F32) return ui->numel * sizeof(float);
  size_t sum = 0;
  for (int i = ui->first_tensor; i < ui->first_tensor + ui->n_tensors; i++) {
    const zt_tensor_info *ti = zt_model_tensor(m, i);
    if (ti->reads & ZT_READS_F32) sum += ti->numel * sizeof(float);
    if (ti->reads & ZT_READS_LP) sum += ti->numel * zt_dtype_size(dt);
  }
  return sum;
}

/* The files the optimizer-state store reserves for the units from nh on (the NVMe units), with
 * m and v of type sd (train.optimizer.state_dtype). */
static uint64_t state_file_bytes(const zt_model *m, int nh, zt_dtype sd) {
  uint64_t sum = 0;
  for (int u = nh; u < zt_model_num_units(m); u++)
    sum += zt_opt_store_file_bytes(zt_model_unit(m, u)->numel, sd);
  return sum;
}

/* Every unit's parameters, and (without dsum) the gradient buffers held and one write-back in
 * flight, in slots. */
static size_t all_resident_bytes(int nu, int held, int dsum, size_t slot) {
  return (size_t)(nu + (dsum ? 0 : held + 1)) * zt_dev_arena_footprint(slot);
}


/* The device bytes of units 0..ng-1 kept whole on the device: masters and gradients in fp32, m
 * and v in sd, and (bf16/fp16) the compute copy, each one backend buffer over their
 * parameters. */
static size_t dev_unit_bytes(const zt_model *m, int ng, zt_dtype dt, zt_dtype sd) {
  if (!ng) return 0;
  size_t f = zt_model_unit(m, ng)->offset;
  return 2 * zt_dev_arena_footprint(f * sizeof(float)) +
         2 * zt_dev_arena_footprint(f * zt_dtype_size(sd)) +
         (dt == ZT_F32 ? 0 : zt_dev_arena_footprint(f * zt_dtype_size(dt)));
}

/* The flat offset of unit u; the parameter count for u == units. */
static size_t unit_start(const zt_model *m, int u) {
  return u < zt_model_num_units(m) ? zt_model_unit(m, u)->offset : zt_model_num_params(m);
}

/* NVMe unit u's stream copy on the host (params not nvme): the fp32 tensors its ops read, which
 * lie in its first zt_offload_unit_layout.f32_end bytes (all of it in fp32). */
size_t zt_offload_stream_copy_floats(const zt_model *m, int u, zt_dtype dt) {
  return zt_offload_unit_layout_of(m, u, dt).f32_end / sizeof(float);
}

/* The gradient ring's slots for ns streamed units of at most slot_bytes: `asked` (offload
 * .grad_slots) if set, else the fewest that keep the backward from waiting for the CPU AdamW to
 * free a slot (docs/offload.md "The gradients on the host"), or 0 (the flat buffer) where that
 * is every unit: the flat buffer holds them in no more bytes. The backward releases a unit
 * every 4 * numel * tokens / flops seconds (its backward alone, by the cost model) while the pool updates one every numel / rate; where the pool is
 * the slower, it falls 1 - ratio of a unit further behind per unit released, and each unit it
 * is behind holds a slot. At least GRAD_RING_SLOTS, at most ns, and no more than
 * ZT_TUNE_GRAD_RING_BYTES unless that is below the minimum: the ring exists for models whose
 * gradients the host cannot hold whole. */
static int ring_slots(const zt_model *m, const zt_train_cfg *tc, int asked, int ns,
                      size_t slot_bytes) {
  if (asked) return asked < ns ? asked : ns;
  double tokens = (double)tc->micro_batch * zt_model_cfg_of(m)->seq_len;
  const zt_plan_rates *R = zt_plan_rates_active();
  double flops = zt_plan_rates_flops(R, tc->precision == ZT_F32, zt_model_cfg_of(m)->d_model);
  double ratio = 4 * tokens * R->adamw_params / flops;
  int slots = GRAD_RING_SLOTS + (ratio < 1 ? (int)ceil(ns * (1 - ratio)) : 0);
  size_t fit = slot_bytes ? ZT_TUNE_GRAD_RING_BYTES / slot_bytes : (size_t)slots;
  if ((size_t)slots > fit) slots = fit > GRAD_RING_SLOTS ? (int)fit : GRAD_RING_SLOTS;
  return slots < ns ? slots : 0;
}

/* The host arena with units [z->ng, nh) on the host, [nh, nu) on NVMe: masters, m, v of the
 * host units (m and v in train.optimizer.state_dtype, here and in the staging sets); the gradients (flat over [lo, n), or the ring: no clipping, one micro-batch a
 * step or the sums on the device, docs/offload.md); the bf16/fp16 compute copy over [lo, n);
 * with NVMe units the two staging sets of master, m and v, and the stream copies (params host
 * or gpu) or the streamer's staging (params nvme). on_cpu: the cpu backend, whose device units
 * may alias the host's buffers. delayed_update (docs/offload.md): the flat gradients, no alias,
 * the host units' stream copies in bf16/fp16, and the next buffers: fp32 the host units'
 * masters, bf16/fp16 the compute copy; the stream copies. */
/* Whether the host's gradients may be a ring (docs/offload.md): the updates must overlap the
 * backward, so not with clipping, nor fp16, nor the delayed update, which needs the whole
 * step's gradients while the next step runs; with several micro-batches only with the sums on
 * the device. */
static int ring_applies(const zt_offload_cfg *oc, const zt_train_cfg *tc, int dsum) {
  return tc->grad_clip == 0 && (tc->grad_accum == 1 || dsum) && tc->precision != ZT_F16 &&
         !oc->delayed_update;
}

static void host_sizes(const zt_model *m, const zt_offload_cfg *oc, const zt_train_cfg *tc,
                       int on_cpu, int nh, int ring, zt_offload_sizes *z) {
  int nu = zt_model_num_units(m), params_nvme = oc->params == ZT_PLACE_NVME;
  size_t n = zt_model_num_params(m);
  zt_dtype dt = tc->precision;
  size_t sd = zt_dtype_size(tc->state_dtype); /* m and v's bytes an element */
  z->nh = nh;
  z->ring = 0;
  /* ring >= 0: a stored plan's (zt_offload_plan_check validated it), else decided here */
  z->ring_floats = z->largest_f32 / sizeof(float);
  if (ring_applies(oc, tc, z->dsum))
    z->ring = ring >= 0 ? ring
                        : ring_slots(m, tc, oc->grad_slots, nu - z->ng,
                                     z->ring_floats * sizeof(float));
  z->alias = on_cpu && z->ng > 0 && nh == nu && !z->ring && !oc->delayed_update;
  z->lo = z->alias ? 0 : unit_start(m, z->ng);
  z->h_floats = unit_start(m, nh) - z->lo;
  z->nvme_f32 = z->nvme_param = z->scopy_floats = 0;
  z->scopy0 = oc->delayed_update && dt != ZT_F32 ? z->ng : nh;
  for (int u = nh; u < nu; u++) {
    size_t f32 = zt_model_unit(m, u)->numel * sizeof(float);
    size_t pb = zt_offload_unit_param_bytes(m, u, dt);
    if (f32 > z->nvme_f32) z->nvme_f32 = f32;
    if (params_nvme && pb > z->nvme_param) z->nvme_param = pb;
  }
  for (int u = z->scopy0; u < nu && !params_nvme; u++)
    z->scopy_floats += zt_offload_stream_copy_floats(m, u, dt);
  z->host = z->h_floats ? zt_host_arena_footprint(z->h_floats * sizeof(float)) +
                             2 * zt_host_arena_footprint(z->h_floats * sd)
                       : 0;
  z->host += z->ring ? (size_t)z->ring * zt_host_arena_footprint(z->largest_f32)
                     : zt_host_arena_footprint((n - z->lo) * sizeof(float));
  if (dt != ZT_F32) z->host += zt_host_arena_footprint((n - z->lo) * zt_dtype_size(dt));
  if (nh < nu) {
    z->host += 2 * (zt_host_arena_footprint(z->nvme_f32) +
                    2 * zt_host_arena_footprint(z->nvme_f32 / sizeof(float) * sd));
    if (z->nvme_param)
      z->host += (size_t)(z->held + oc->prefetch) * zt_host_arena_footprint(z->nvme_param);
  }
  if (z->scopy_floats) z->host += zt_host_arena_footprint(z->scopy_floats * sizeof(float));
  z->delayed = 0;
  if (oc->delayed_update) {
    if (dt == ZT_F32 && z->h_floats)
      z->delayed += zt_host_arena_footprint(z->h_floats * sizeof(float));
    if (dt != ZT_F32) z->delayed += zt_host_arena_footprint((n - z->lo) * zt_dtype_size(dt));
    if (z->scopy_floats) z->delayed += zt_host_arena_footprint(z->scopy_floats * sizeof(float));
  }
  z->host += z->delayed;
}

/* Where the streamed units keep their optimizer (offload.host_units): the host side of z for
 * the device side sizes_for gave it, with ring gradient slots (-1: decided by host_sizes).
 * -EINVAL for a host_units the units cannot take, -ENOMEM
 * over host_budget, -ENOSPC over nvme_budget; err says why with the numbers. */
static int place_optimizer(const zt_model *m, const zt_offload_cfg *oc, const zt_train_cfg *tc,
                           int on_cpu, int ring, zt_offload_sizes *z, char *err,
                           size_t errlen) {
  int nu = zt_model_num_units(m), ng = z->ng, nh = nu;
  if (oc->host_units >= 0 || oc->optimizer == ZT_PLACE_NVME) {
    int k = oc->host_units > 0 ? oc->host_units : 0;
    if (k > nu - ng) {
      snprintf(err, errlen, "offload.host_units is %d; after %d unit(s) on the device the model "
               "has %d", oc->host_units, ng, nu - ng);
      return -EINVAL;
    }
    nh = ng + k;
    if (nh < nu && !oc->nvme_dir[0]) {
      snprintf(err, errlen, "offload.host_units %d leaves %d unit(s) for NVMe: "
               "offload.nvme_dir is required", oc->host_units, nu - nh);
      return -EINVAL;
    }
    host_sizes(m, oc, tc, on_cpu, nh, ring, z);
  } else if (oc->optimizer == ZT_PLACE_AUTO && oc->host_budget && oc->nvme_dir[0]) {
    /* the most units on the host that fit it: the host is faster than NVMe for every unit */
    for (host_sizes(m, oc, tc, on_cpu, nh, ring, z); nh > ng && z->host > oc->host_budget;)
      host_sizes(m, oc, tc, on_cpu, --nh, ring, z);
  } else {
    host_sizes(m, oc, tc, on_cpu, nh, ring, z);
  }
  if (oc->host_budget && z->host > oc->host_budget) {
    size_texts b = {0};
    snprintf(err, errlen, "offload.host_budget is %s (%zu bytes); the host tier needs %s (%zu "
             "bytes) with %d unit(s)' optimizer on the host and %d on NVMe%s",
             sz(&b, (double)oc->host_budget), oc->host_budget, sz(&b, (double)z->host), z->host,
             nh - ng, nu - nh,
             oc->nvme_dir[0] ? "" : " (with an offload.nvme_dir, optimizer auto keeps on NVMe "
                                    "what the host cannot hold)");
    return -ENOMEM;
  }
  uint64_t nvme = state_file_bytes(m, nh, tc->state_dtype);
  if (oc->nvme_budget && nvme > oc->nvme_budget) {
    size_texts b = {0};
    snprintf(err, errlen, "offload.nvme_budget is %s (%llu bytes); the NVMe tier needs %s (%llu "
             "bytes) for the optimizer of %d unit(s) (%d on the host)",
             sz(&b, (double)oc->nvme_budget), (unsigned long long)oc->nvme_budget,
             sz(&b, (double)nvme), (unsigned long long)nvme, nu - nh, nh - ng);
    return -ENOSPC;
  }
  return 0;
}

/* The device side with units 0..ng-1 on the device and the rest streamed, their gradient sums
 * on the device (dsum) or not; -ENOMEM (err says why, with the numbers) when they do not fit
 * gpu_budget. */
static int sizes_for(const zt_model *m, const zt_offload_cfg *oc, zt_dtype dt, zt_dtype sd,
                     size_t act_bytes, int ng, int dsum, zt_offload_sizes *z, char *err,
                     size_t errlen) {
  int nu = zt_model_num_units(m), ns = nu - ng;
  size_t sum_floats = zt_model_num_params(m) - unit_start(m, ng);
  *z = (zt_offload_sizes){.held = zt_model_head_reads_embed(m) ? 2 : 1, .ng = ng,
                   .dev_units = dev_unit_bytes(m, ng, dt, sd), .dsum = dsum,
                   .dsum_bytes = dsum ? zt_dev_arena_footprint(sum_floats * sizeof(float)) : 0};
  zt_stream_unit *units = calloc((size_t)ns, sizeof *units);
  if (!units) {
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  for (int i = 0; i < ns; i++) {
    const zt_unit_info *ui = zt_model_unit(m, ng + i);
    /* with dsum no gradient buffer comes from the arena */
    units[i] = (zt_stream_unit){.param_bytes = zt_offload_unit_param_bytes(m, ng + i, dt),
                                .grad_floats = dsum ? 0 : ui->numel};
    if (units[i].param_bytes > z->largest) z->largest = units[i].param_bytes;
    if (ui->numel * sizeof(float) > z->largest_f32) z->largest_f32 = ui->numel * sizeof(float);
  }
  /* Units differ in size (the gpt head is two vectors): equal slots of the largest keep the
   * arena from fragmenting, so the budget that opens is the budget that runs. A slot holds a
   * device copy or a gradient buffer (fp32, larger than a 16-bit device copy), with dsum a
   * device copy only. */
  z->slot = z->largest > z->largest_f32 || dsum ? z->largest : z->largest_f32;
  zt_streamer_cfg sc = {.n_units = ns, .units = units, .prefetch_depth = oc->prefetch,
                        .max_acquired = z->held, .slot_bytes = z->slot};
  size_t need = zt_streamer_min_device_bytes(&sc);
  free(units);
  if (need == SIZE_MAX) {
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  size_t resident = all_resident_bytes(ns, z->held, dsum, z->slot);
  size_t fixed = act_bytes + z->dev_units + z->dsum_bytes;
  zt_offload_place params = oc->params != ZT_PLACE_AUTO ? oc->params
                            : oc->gpu_budget ? ZT_PLACE_HOST : ZT_PLACE_GPU;
  if (params == ZT_PLACE_GPU || !oc->gpu_budget) {
    z->arena = resident;
    if (oc->gpu_budget && fixed + resident > oc->gpu_budget) {
      size_texts b = {0};
      snprintf(err, errlen, "offload.params gpu keeps every unit on the device: needs %s (%zu "
               "bytes: activations %s + %d unit(s) with their optimizer on the device %s + "
               "gradient sums on the device %s + parameters and gradient buffers %s); "
               "offload.gpu_budget is %s (params host streams the units)",
               sz(&b, (double)(fixed + resident)), fixed + resident, sz(&b, (double)act_bytes),
               ng, sz(&b, (double)z->dev_units), sz(&b, (double)z->dsum_bytes),
               sz(&b, (double)resident), sz(&b, (double)oc->gpu_budget));
      return -ENOMEM;
    }
  } else {
    if (oc->gpu_budget < fixed + need) {
      size_texts b = {0};
      snprintf(err, errlen, "offload.gpu_budget is %s; streaming needs at least %s (%zu bytes: "
               "activations %s + %d unit(s) with their optimizer on the device %s + gradient "
               "sums on the device %s + %d unit(s) held and %d prefetched with their gradients "
               "%s)", sz(&b, (double)oc->gpu_budget), sz(&b, (double)(fixed + need)),
               fixed + need, sz(&b, (double)act_bytes), ng, sz(&b, (double)z->dev_units),
               sz(&b, (double)z->dsum_bytes), z->held, oc->prefetch, sz(&b, (double)need));
      return -ENOMEM;
    }
    z->arena = oc->gpu_budget - fixed;
    if (z->arena > resident) z->arena = resident;
  }
  z->all_resident = z->arena >= resident;
  return 0;
}


/* The copies a step of the plan is expected to make: each streamed unit's device copy fetched
 * once a step when the arena holds them all, else in each forward and backward (the streamer
 * keeps what fits, so this is the most); its gradients to the host every micro-batch and from
 * the second micro-batch on its running sum copied back, or with dsum its sum to the host once
 * a step; unit-major, once a pass, and its gradients to the host once a step. */
static void plan_transfers(const zt_model *m, const zt_train_cfg *tc, const zt_offload_placement *p,
                           double *h2d, double *d2h) {
  double ga = tc->grad_accum, fetch = 0, grads = 0;
  for (int u = p->z.ng; u < zt_model_num_units(m); u++) {
    fetch += (double)zt_offload_unit_fetch_bytes(m, u, tc->precision);
    grads += (double)zt_model_unit(m, u)->numel * sizeof(float);
  }
  /* unit-major: once a pass; a head that reads the embedding keeps the backward micro-major
   * (zt_offload_backward_unit_major) */
  int um_back = p->unit_major && zt_offload_backward_unit_major(m);
  double fetches = p->params == ZT_PLACE_GPU || p->z.all_resident ? 1
                   : p->unit_major ? 1 + (um_back ? 1 : ga) : 2 * ga;
  double moves = p->z.dsum || um_back ? 1 : ga;
  *h2d = fetch * fetches + grads * (moves - 1);
  *d2h = grads * moves;
}

/* One candidate: checkpointing every ck, the parameters' home place, ng units on the device;
 * the host and NVMe sides follow (place_optimizer, ring as there). */
static int plan_try_order(const zt_model *m, const zt_train_cfg *tc, const zt_offload_cfg *oc,
                          const zt_ops *ops, int ck, zt_offload_place place, int ng, int dsum,
                          int um, int ring, zt_offload_placement *p, char *err, size_t errlen) {
  zt_offload_cfg c = *oc;
  c.params = place;
  *p = (zt_offload_placement){.ckpt_every = ck, .params = place, .delayed = oc->delayed_update,
                  .unit_major = um, .units = zt_model_num_units(m),
                  .gpu_budget = oc->gpu_budget, .host_budget = oc->host_budget,
                  .nvme_budget = oc->nvme_budget,
                  .act_bytes = zt_acts_size_dt(m, ops, tc->micro_batch, ck, tc->precision)};
  /* unit-major keeps every micro-batch's activations until its backward */
  p->act_bytes *= um ? (size_t)tc->grad_accum : 1;
  if (!p->act_bytes) {
    snprintf(err, errlen, "train.activation_checkpointing.every %d: cannot size the "
             "activations", ck);
    return -EINVAL;
  }
  int rc = sizes_for(m, &c, tc->precision, tc->state_dtype, p->act_bytes, ng, dsum, &p->z, err,
                     errlen);
  if (rc == 0)
    rc = place_optimizer(m, &c, tc, strcmp(ops->name, "cpu") == 0, ring, &p->z, err, errlen);
  if (rc < 0) return rc;
  zt_plan_step_cost(m, tc, p, oc->prefetch, &p->est);
  p->nvme_bytes = state_file_bytes(m, p->z.nh, tc->state_dtype);
  double h2d, d2h;
  plan_transfers(m, tc, p, &h2d, &d2h);
  p->h2d_bytes = (uint64_t)h2d;
  p->d2h_bytes = (uint64_t)d2h;
  return 0;
}

/* A candidate in the order offload.order fixes; auto with several micro-batches and a
 * gpu_budget: unit where it fits (its activations may not) and is faster by more than the cost
 * model's grain, else micro (less memory). */
static int plan_try(const zt_model *m, const zt_train_cfg *tc, const zt_offload_cfg *oc,
                    const zt_ops *ops, int ck, zt_offload_place place, int ng, int dsum,
                    zt_offload_placement *p, char *err, size_t errlen) {
  int several = tc->grad_accum > 1 && tc->grad_accum <= ZT_UNIT_MAJOR_MICROS_MAX;
  int um = several && oc->order == ZT_ORDER_UNIT;
  int rc = plan_try_order(m, tc, oc, ops, ck, place, ng, dsum, um, -1, p, err, errlen);
  if (!several || oc->order != ZT_ORDER_AUTO || !oc->gpu_budget || !p->act_bytes) return rc;
  zt_offload_placement q;
  char why[512];
  if (plan_try_order(m, tc, oc, ops, ck, place, ng, dsum, 1, -1, &q, why, sizeof why) == 0 &&
      (rc < 0 || q.est.step_s < p->est.step_s * (1 - ZT_PLAN_TIE))) {
    *p = q;
    rc = 0;
  }
  return rc;
}

int zt_offload_backward_unit_major(const zt_model *m) {
  /* the head's gradient of the embedding and the embedding's own add up in one buffer in the
   * order head, embedding, head, ... of the micro-batches (the run without offload's), which a
   * unit-major backward would change */
  return !zt_model_head_reads_embed(m);
}

/* The plan: every choice the spec fixes as given; with a gpu_budget, each one left to auto
 * (activation checkpointing, params gpu or host, the units with their optimizer on the device,
 * with several micro-batches the gradient sums on the device or the host) searched for the
 * cheapest plan by the cost model (step_cost.h) that fits, the host and NVMe sides of each
 * decided by
 * place_optimizer. Without a budget auto means the plain choice: no checkpointing, every unit
 * resident, no unit's optimizer on the device, the sums on the device when there are several
 * micro-batches (the budget is then what that takes). At least one unit is always streamed. */
static int plan_search(const zt_model *m, const zt_train_cfg *tc, const zt_offload_cfg *oc,
                       const zt_ops *ops, zt_offload_placement *best, char *err,
                       size_t errlen) {
  int nu = zt_model_num_units(m), L = zt_model_cfg_of(m)->n_layers, budget = oc->gpu_budget > 0;
  if (oc->gpu_units >= nu) {
    snprintf(err, errlen, "offload.gpu_units is %d; the model has %d units and at least one "
             "must be streamed (leave the offload object out to keep everything on the device)",
             oc->gpu_units, nu);
    return -EINVAL;
  }
  if (oc->order == ZT_ORDER_UNIT && tc->grad_accum > ZT_UNIT_MAJOR_MICROS_MAX) {
    snprintf(err, errlen, "offload.order: unit walks at most %d micro-batches at once "
             "(train.grad_accum is %d)", ZT_UNIT_MAJOR_MICROS_MAX, tc->grad_accum);
    return -EINVAL;
  }
  int ck_auto = tc->ckpt_every == ZT_CKPT_AUTO && budget;
  int ck_lo = ck_auto ? 0 : tc->ckpt_every == ZT_CKPT_AUTO ? 0 : tc->ckpt_every;
  int ck_hi = ck_auto ? L : ck_lo;
  zt_offload_place places[2] = {oc->params, oc->params};
  if (oc->params == ZT_PLACE_AUTO) {
    places[0] = ZT_PLACE_GPU;
    places[1] = budget ? ZT_PLACE_HOST : ZT_PLACE_GPU;
  }
  int ng_hi = oc->gpu_units >= 0 ? oc->gpu_units
              : oc->optimizer == ZT_PLACE_AUTO && budget ? nu - 1 : 0;
  int ng_lo = oc->gpu_units >= 0 ? oc->gpu_units : 0;
  int several = tc->grad_accum > 1;
  int ds_hi = oc->grads == ZT_PLACE_GPU || (oc->grads == ZT_PLACE_AUTO && several);
  int ds_lo = oc->grads == ZT_PLACE_GPU || (oc->grads == ZT_PLACE_AUTO && several && !budget);
  int found = 0;
  for (int ck = ck_lo; ck <= ck_hi; ck++)
    for (int pl = 0; pl < 2; pl++) {
      if (pl && places[1] == places[0]) break;
      for (int ng = ng_hi; ng >= ng_lo; ng--)
        for (int ds = ds_hi; ds >= ds_lo; ds--) {
          char why[512];
          zt_offload_placement p;
          int rc = plan_try(m, tc, oc, ops, ck, places[pl], ng, ds, &p, why, sizeof why);
          if (rc == -EINVAL && !p.act_bytes) {
            snprintf(err, errlen, "%s", why);
            return rc;
          }
          if (rc < 0) continue;
          /* a later candidate (more recompute, streamed parameters, fewer units on the
           * device: more moving parts) must be faster by more than the estimate's grain */
          if (!found || p.est.step_s < best->est.step_s * (1 - ZT_PLAN_TIE)) *best = p;
          found = 1;
        }
    }
  if (found) return 0;
  /* nothing fits: the refusal of the plan that needs the least device memory */
  return plan_try(m, tc, oc, ops, ck_auto ? 1 : ck_lo, places[1], ng_lo, ds_lo, best, err,
                  errlen);
}

/* What the offloaded step runs on today: the cpu and cuda backends, fp32, bf16 or fp16 compute
 * (params nvme: fp32). */
int zt_offload_supported(const char *backend, const zt_train_cfg *tc, const zt_offload_cfg *oc,
                         char *err, size_t errlen) {
  if (strcmp(backend, "cpu") != 0 && strcmp(backend, "cuda") != 0) {
    snprintf(err, errlen, "offload: runs on the cpu and cuda backends (not %s)", backend);
    return -ENOTSUP;
  }
  if (tc->precision != ZT_F32 && oc->params == ZT_PLACE_NVME) {
    snprintf(err, errlen, "offload.params: nvme streams the fp32 masters, so it needs "
             "train.precision fp32 (got %s); use params host", zt_dtype_name(tc->precision));
    return -ENOTSUP;
  }
  return 0;
}

int zt_offload_plan_make(const zt_model_cfg *mc, const zt_train_cfg *tc,
                         const zt_offload_cfg *oc, const zt_ops *ops, zt_offload_placement *out,
                         char *err, size_t errlen) {
  zt_model *m = NULL;
  int rc;
  if ((rc = zt_offload_cfg_check(oc, err, errlen)) < 0 ||
      (rc = zt_model_create(&m, mc, err, errlen)) < 0)
    return rc;
  rc = zt_offload_supported(ops->name, tc, oc, err, errlen);
  if (rc == 0) rc = plan_search(m, tc, oc, ops, out, err, errlen);
  zt_model_destroy(m);
  return rc;
}

zt_offload_plan zt_offload_plan_summary(const zt_offload_placement *p) {
  /* every NVMe unit's master, m and v read and written once a step */
  return (zt_offload_plan){.host_bytes = p->z.host,
                           .device_bytes = p->act_bytes + p->z.dev_units + p->z.dsum_bytes +
                                           p->z.arena,
                           .nvme_bytes = p->nvme_bytes,
                           .act_bytes = p->act_bytes,
                           .gpu_unit_bytes = p->z.dev_units,
                           .arena_bytes = p->z.arena,
                           .units = p->units,
                           .gpu_units = p->z.ng,
                           .host_units = p->z.nh - p->z.ng,
                           .grad_slots = p->z.ring,
                           .ckpt_every = p->ckpt_every,
                           .params = p->params,
                           .grads = p->z.dsum ? ZT_PLACE_GPU : ZT_PLACE_HOST,
                           .dsum_bytes = p->z.dsum_bytes,
                           .unit_major = p->unit_major,
                           .est = p->est,
                           .h2d_bytes = p->h2d_bytes,
                           .d2h_bytes = p->d2h_bytes,
                           .nvme_step_bytes = 2 * p->nvme_bytes};
}

int zt_offload_estimate(const zt_model_cfg *mc, const zt_train_cfg *tc, const zt_offload_cfg *oc,
                        const zt_ops *ops, zt_offload_plan *out, char *err, size_t errlen) {
  zt_offload_placement p;
  int rc = zt_offload_plan_make(mc, tc, oc, ops, &p, err, errlen);
  if (rc == 0) *out = zt_offload_plan_summary(&p);
  return rc;
}

/* A budget of a stored plan against the spec's: at most it, where the spec sets one. */
static int budget_within(const char *name, uint64_t given, uint64_t spec, char *err,
                         size_t errlen) {
  if (!spec || (given && given <= spec)) return 0;
  snprintf(err, errlen, "plan: budgets.%s %llu is over offload.%s_budget %llu", name,
           (unsigned long long)given, name, (unsigned long long)spec);
  return -EINVAL;
}

/* A stored plan's choices against the model and what the spec fixes: 0, or -EINVAL with the
 * field named in err. */
static int check_choices(const zt_model *m, const zt_train_cfg *tc, const zt_offload_cfg *oc,
                         const zt_offload_placement *g, char *err, size_t errlen) {
  int nu = zt_model_num_units(m), L = zt_model_cfg_of(m)->n_layers;
  int ng = g->z.ng, nh = g->z.nh, ring = g->z.ring, ns = nu - g->z.ng;
  int several = tc->grad_accum > 1 && tc->grad_accum <= ZT_UNIT_MAJOR_MICROS_MAX;
  const char *order = oc->order == ZT_ORDER_UNIT    ? "unit"
                      : oc->order == ZT_ORDER_MICRO ? "micro"
                                                    : "auto";
  int rc = -EINVAL;
  size_t k = (size_t)snprintf(err, errlen, "plan: ");
  char *e = err + k;
  errlen -= k;
  if (g->ckpt_every < 0 || g->ckpt_every > L) {
    snprintf(e, errlen, "ckpt_every %d is not in [0, %d] (model.n_layers)", g->ckpt_every, L);
  } else if (tc->ckpt_every != ZT_CKPT_AUTO && g->ckpt_every != tc->ckpt_every) {
    snprintf(e, errlen, "ckpt_every %d, but train.activation_checkpointing.every is %d",
             g->ckpt_every, tc->ckpt_every);
  } else if (g->params != ZT_PLACE_GPU && g->params != ZT_PLACE_HOST &&
             g->params != ZT_PLACE_NVME) {
    snprintf(e, errlen, "params must be gpu, host or nvme");
  } else if (oc->params != ZT_PLACE_AUTO ? g->params != oc->params
                                         : g->params == ZT_PLACE_NVME) {
    snprintf(e, errlen, "params %s, but offload.params is %s", zt_offload_place_name(g->params),
             zt_offload_place_name(oc->params));
  } else if (ng < 0 || ng >= nu) {
    snprintf(e, errlen, "gpu_units %d is not in [0, %d] (one unit at least is streamed)", ng,
             nu - 1);
  } else if (oc->gpu_units >= 0 ? ng != oc->gpu_units : oc->optimizer != ZT_PLACE_AUTO && ng) {
    snprintf(e, errlen, "gpu_units %d, but offload.gpu_units is %d and offload.optimizer %s", ng,
             oc->gpu_units, zt_offload_place_name(oc->optimizer));
  } else if (nh < ng || nh > nu) {
    snprintf(e, errlen, "host_units %d is not in [0, %d] (the units after gpu_units)", nh - ng,
             ns);
  } else if (oc->host_units >= 0          ? nh - ng != oc->host_units
             : oc->optimizer == ZT_PLACE_NVME ? nh != ng
             : nh != nu && (oc->optimizer != ZT_PLACE_AUTO || !oc->host_budget ||
                            !oc->nvme_dir[0])) {
    snprintf(e, errlen, "host_units %d, but offload.host_units is %d and offload.optimizer %s",
             nh - ng, oc->host_units, zt_offload_place_name(oc->optimizer));
  } else if (g->z.dsum ? oc->grads == ZT_PLACE_HOST ||
                             (oc->grads == ZT_PLACE_AUTO && tc->grad_accum == 1)
                       : oc->grads == ZT_PLACE_GPU) {
    snprintf(e, errlen, "grads %s, but offload.grads is %s with train.grad_accum %d",
             g->z.dsum ? "gpu" : "host", zt_offload_place_name(oc->grads), tc->grad_accum);
  } else if (g->unit_major ? !several || oc->order == ZT_ORDER_MICRO
                           : several && oc->order == ZT_ORDER_UNIT) {
    snprintf(e, errlen, "order %s, but offload.order is %s with train.grad_accum %d",
             g->unit_major ? "unit" : "micro", order, tc->grad_accum);
  } else if (g->delayed != oc->delayed_update) {
    snprintf(e, errlen, "delayed_update %s, but offload.delayed_update is %s",
             g->delayed ? "true" : "false", oc->delayed_update ? "true" : "false");
  } else if (!ring_applies(oc, tc, g->z.dsum) ? ring != 0
             : oc->grad_slots ? ring != (oc->grad_slots < ns ? oc->grad_slots : ns)
             : ring && (ring > ns || ring < (ns < GRAD_RING_SLOTS ? ns : GRAD_RING_SLOTS))) {
    snprintf(e, errlen, "grad_slots %d: the recipe and offload.grad_slots %d do not give a "
             "gradient ring of that many slots for %d streamed unit(s)", ring, oc->grad_slots,
             ns);
  } else {
    rc = 0;
  }
  return rc;
}

int zt_offload_plan_check(const zt_model *m, const zt_train_cfg *tc, const zt_offload_cfg *oc,
                          const zt_ops *ops, const zt_offload_placement *given,
                          zt_offload_placement *out, char *err, size_t errlen) {
  int rc;
  if ((rc = budget_within("gpu", given->gpu_budget, oc->gpu_budget, err, errlen)) < 0 ||
      (rc = budget_within("host", given->host_budget, oc->host_budget, err, errlen)) < 0 ||
      (rc = budget_within("nvme", given->nvme_budget, oc->nvme_budget, err, errlen)) < 0 ||
      (rc = check_choices(m, tc, oc, given, err, errlen)) < 0)
    return rc;
  int ng = given->z.ng, nh = given->z.nh;
  /* the sizes of those choices under the plan's budgets: what the search computed for them */
  zt_offload_cfg c = *oc;
  c.gpu_units = ng;
  c.host_units = nh - ng;
  c.gpu_budget = given->gpu_budget;
  c.host_budget = given->host_budget;
  c.nvme_budget = given->nvme_budget;
  return plan_try_order(m, tc, &c, ops, given->ckpt_every, given->params, ng, given->z.dsum,
                        given->unit_major, given->z.ring, out, err, errlen);
}
