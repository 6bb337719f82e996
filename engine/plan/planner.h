/* The memory planner (DESIGN.md "Memory: tiers, shards, the plan"): from the units' sizes, the
 * budgets and a cost model, where each kind of training state lives, how many units the device
 * holds, whether activations are checkpointed, the bytes every tier will hold and an estimated
 * step time. A pure function: no allocation outside the plan call, no I/O, deterministic.
 *
 * Kinds and their tiers (one tier per kind for the whole model):
 *   master   fp32 parameters, updated by AdamW          device | host | nvme
 *   moments  AdamW m and v (fp32, master-sized each)   same tier as master
 *   params   compute-precision copy used by the units  device (all resident, never moved)
 *            -- its home between uses when streamed:   host | nvme
 *   grads    device buffers accumulated into fp32 host gradients (optimizer off the device), or
 *            whole on the device (optimizer on the device)
 *   acts     activations of one micro-batch             device, always
 * The combinations: optimizer on the device keeps everything there (no offload). Optimizer on the
 * host or NVMe streams params through the unit streamer (offload/streamer.h) with
 * `resident_units` copies on the device (all units: fetched once per step after the update),
 * and accumulates gradients on the host.
 *
 * Accounting (exact: the figures are what the allocations take, in their arenas' units):
 *   - one allocation per unit per kind; device allocations count zt_dev_arena_footprint(bytes),
 *     host ones zt_host_arena_footprint(bytes), NVMe extents bytes rounded up to ZT_NVME_ALIGN;
 *   - params share the master's buffer (no separate allocation) when param_bytes ==
 *     master_bytes (fp32 compute) and params' home is the master's tier;
 *   - device, optimizer there: acts + sum params + sum grads + sum master + 2 sum moments;
 *   - device, streamed: acts + the streamer's arena = the `resident_units` largest param
 *     footprints + the (max_acquired + 1) largest grad footprints (one write-back in flight
 *     while the next unit's backward runs); the arena is opened with exactly that budget;
 *   - host, optimizer on the host: sum master + 2 sum moments + sum fp32 grads (master-sized) +
 *     sum params (unless shared) + NVMe staging when params' home is NVMe;
 *   - host, optimizer on NVMe: sum fp32 grads + sum params when their home is the host +
 *     optimizer staging (ZT_PLAN_OPT_STAGING sets of master + m + v of the largest unit: one
 *     being updated while the next is read ahead) + param staging when their home is NVMe;
 *   - param staging: the streamer's (max_acquired + prefetch_depth) buffers of the largest
 *     param_bytes;
 *   - nvme: sum master + 2 sum moments (optimizer there) + sum params (home there, unshared).
 *
 * Transfers per step assume the walk forward 0..U-1 then backward U-1..0 per micro-batch, with
 * the streamer keeping the last units it used: the first forward fetches every unit (the
 * update invalidated them), each backward refetches the units that fell out, each later forward
 * the same from the other end; a companion that fell out is fetched again for its partner, and its
 * gradients go back with the partner's. The streamer opened with the plan's budgets moves exactly
 * these for units of equal size (tested); otherwise they are an estimate. Times: per unit the
 * slower of its compute and its transfers (they overlap), the step's first fetch exposed, CPU
 * AdamW hidden under the last backward except the update of the unit it ends on. */
#ifndef ZT_OFFLOAD_PLANNER_H
#define ZT_OFFLOAD_PLANNER_H

#include <stddef.h>
#include <stdint.h>

typedef enum zt_tier { ZT_TIER_DEVICE = 0, ZT_TIER_HOST = 1, ZT_TIER_NVME = 2 } zt_tier;
#define ZT_TIERS 3
#define ZT_TIER_AUTO (-1) /* in a policy: let the planner choose */

typedef enum zt_plan_kind {
  ZT_KIND_MASTER = 0,
  ZT_KIND_MOMENTS,
  ZT_KIND_PARAMS,
  ZT_KIND_GRADS,
  ZT_KIND_ACTS,
  ZT_KIND_STAGING,
} zt_plan_kind;
#define ZT_PLAN_KINDS 6

#define ZT_PLAN_OPT_STAGING 2

typedef struct zt_plan_unit {
  char name[32];
  size_t master_bytes; /* fp32 parameters (also the size of each moment and of host gradients) */
  size_t param_bytes;  /* compute-precision copy */
  size_t grad_bytes;   /* device gradient buffer */
  double fwd_s, bwd_s; /* device compute time of one micro-batch through the unit */
  int checkpointable;  /* 1: with checkpointing its backward first recomputes its forward */
  int companion;       /* a unit that must be on the device with it (gpt head: embed), or -1 */
} zt_plan_unit;

typedef struct zt_plan_cost {
  double h2d_bytes_per_s, d2h_bytes_per_s;
  double nvme_read_bytes_per_s, nvme_write_bytes_per_s;
  double cpu_adam_params_per_s;
  double dev_adam_params_per_s;
} zt_plan_cost;

typedef struct zt_plan_input {
  int n_units;
  const zt_plan_unit *units;
  size_t act_bytes, act_ckpt_bytes; /* activations of one micro-batch, without / with ckpt */
  int grad_accum;                   /* micro-batches per step (>= 1) */
  int prefetch_depth;               /* the streamer's */
  size_t device_budget, host_budget, nvme_budget; /* nvme 0: no NVMe */
  zt_plan_cost cost;
  /* policy: ZT_TIER_AUTO or a tier each; ckpt -1 auto, 0 off, 1 on */
  int optimizer, params, ckpt;
} zt_plan_input;

typedef struct zt_plan {
  zt_tier tier[ZT_PLAN_KINDS]; /* where each kind lives (params: home between uses; staging:
                                  host; acts: device) */
  int ckpt;
  int streamed;                /* params move through the streamer */
  int resident_units;          /* parameter copies the device holds (n_units when not streamed
                                  or all fit) */
  int prefetch_depth, max_acquired;
  size_t streamer_device_bytes;        /* the budget of the streamer's device arena (0: none);
                                          its param_budget is bytes[ZT_TIER_DEVICE][ZT_KIND_PARAMS] */
  size_t bytes[ZT_TIERS][ZT_PLAN_KINDS];
  size_t total[ZT_TIERS];
  uint64_t fetches;                    /* per step */
  uint64_t h2d_bytes, d2h_bytes, nvme_read_bytes, nvme_write_bytes; /* per step */
  double compute_s, optimizer_s, step_s; /* estimates: the units' compute (with recompute), the
                                            optimizer time not hidden, the step */
} zt_plan;

/* Fills *out with the fastest plan the policy allows that fits every budget (ties go to the
 * plan with less offload). -ENOMEM when none fits, err naming the tier short and the numbers
 * ("needs at least 3.1 GiB of device memory for 2 units in flight; budget 2.0 GiB"); -EINVAL for
 * a bad input, err naming the field. */
int zt_plan_make(const zt_plan_input *in, zt_plan *out, char *err, size_t errlen);

const char *zt_tier_name(zt_tier t);        /* "device" | "host" | "nvme" */
const char *zt_plan_kind_name(zt_plan_kind k); /* "master" | "moments" | ... */

/* Human-readable and JSON renderings (what lives where, bytes per tier, transfers per step).
 * Return the length written (snprintf rules: truncated at len, NUL-terminated). */
int zt_plan_render_text(const zt_plan *p, const zt_plan_input *in, char *buf, size_t len);
int zt_plan_render_json(const zt_plan *p, const zt_plan_input *in, char *buf, size_t len);

/* ---- from a model (engine/model/model.h, public API only) ----------------------------------- */
struct zt_model;
struct zt_ops;

/* Fills units[0..n) (cap >= zt_model_num_units) from the model's units: master, moments and
 * fp32 gradients from each unit's numel, param_bytes = numel * param_elem_bytes; fwd_s and
 * bwd_s from 2 and 4 flops per parameter per token at device_flops_per_s (0: leave them 0;
 * attention's own flops are not counted); blocks checkpointable; the gpt head's companion is
 * the embedding unit (it reads the tied wte). Activation bytes of one micro-batch of
 * micro_batch rows come from zt_acts_size on ops without and with checkpointing every block.
 * Returns n, or -EINVAL / -ENOSPC (cap too small) / -ENOMEM (zt_acts_size failed). */
int zt_plan_units_from_model(const struct zt_model *m, const struct zt_ops *ops,
                             size_t param_elem_bytes, int micro_batch, double device_flops_per_s,
                             zt_plan_unit *units, int cap, size_t *act_bytes,
                             size_t *act_ckpt_bytes);

#endif
