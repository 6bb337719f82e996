/* defines: the single-rank offloaded step's plan. zt_offload_plan and zt_offload_estimate: its
 * figures, what `ztctl plan` prints (engine/job, tools, tests). The plan in full: the choices
 * auto leaves open, decided (zt_offload_placement), every size they give (zt_offload_sizes), a
 * unit's device copy (zt_offload_unit_layout); searched once (zt_offload_plan_make: engine/job's
 * admission, ztrain, tests), stored (engine/plan/plan_file.h), and checked, not searched
 * (zt_offload_plan_check: a restarted daemon, zt_trainer_open_offload, which allocates it). One
 * computation behind all, so what the daemon admits is what the trainer allocates; the cost
 * model's rates are engine/plan/rates.h's. */
#ifndef ZT_PLAN_OFFLOAD_PLAN_H
#define ZT_PLAN_OFFLOAD_PLAN_H

#include <stddef.h>
#include <stdint.h>
#include "engine/kernels/ops.h"
#include "engine/model/model.h"
#include "engine/plan/recipe.h"

/* The cost model's grain: the search keeps the plan found first (less recompute, resident
 * parameters, more units on the device) over one less than this much faster. */
#define ZT_PLAN_TIE 0.01

/* The cost model's figures of a plan (engine/plan/step_cost.h): a step once the walk repeats,
 * and each queue's busy seconds in it: what bounds the step. */
typedef struct zt_step_cost {
  double step_s;
  double compute_s, h2d_s, d2h_s, adam_s, nvme_s, runner_s;
} zt_step_cost;

/* An offloaded job as zt_trainer_open_offload will run it, decided the same way (the auto
 * choices included) without allocating. */
typedef struct zt_offload_plan {
  size_t host_bytes;       /* the host arena */
  size_t device_bytes;     /* act_bytes + gpu_unit_bytes + dsum_bytes + arena_bytes */
  uint64_t nvme_bytes;     /* the NVMe files, in the store's whole blocks */
  size_t act_bytes;        /* activations: of one micro-batch, or unit-major of all the step's */
  size_t gpu_unit_bytes;   /* the units whose optimizer lives on the device */
  size_t arena_bytes;      /* the streamer's arena: parameter copies and gradient buffers */
  int units, gpu_units;    /* the model's units; the leading ones with the optimizer on device */
  int host_units;          /* the units after those with the optimizer on the host; the rest
                              have it on NVMe */
  int grad_slots;          /* the host's gradient ring (0: one flat buffer) */
  int ckpt_every;          /* activation checkpointing as resolved */
  zt_offload_place params; /* the parameters' home between uses, as resolved */
  zt_offload_place grads;  /* where the step's gradient sums are kept, as resolved: gpu, host */
  size_t dsum_bytes;       /* grads gpu: their device buffer (in device_bytes) */
  int unit_major;          /* offload.order as resolved: 1 unit, 0 micro */
  zt_step_cost est;        /* the cost model's step (engine/plan/rates.h's rates) and its
                              parts: each queue's busy time in that step */
  /* the transfers a step is expected to make: parameters and running gradient sums to the
   * device, gradients to the host (streamed parameters: at most, the streamer keeps what fits),
   * NVMe reads plus writes */
  uint64_t h2d_bytes, d2h_bytes, nvme_step_bytes;
} zt_offload_plan;

/* The plan; the same refusals (-EINVAL, -ENOTSUP, -ENOMEM with the numbers, -ENOSPC for a plan
 * over nvme_budget) as the open. A held-out evaluation walks the units through the same arena
 * and activations as the step's forward: it adds nothing to the plan. */
int zt_offload_estimate(const zt_model_cfg *mc, const zt_train_cfg *tc, const zt_offload_cfg *oc,
                        const zt_ops *ops, zt_offload_plan *out, char *err, size_t errlen);

/* ---- the plan in full (engine/train/offload's open) ------------------------------------------ */

/* A unit's device copy (bf16/fp16): the model addresses a tensor's fp32 copy at p + 4 * its offset
 * in the unit and its compute copy at p_lp + 2 * that offset, so the copy holds the fp32
 * tensors it reads at those places from p, and the compute-copy block from p_lp = p + lp_offset,
 * far enough on that no compute-copy tensor overlaps an fp32 one (256-aligned). The layouts put
 * a block's vectors before its matrices, so this is little more than the compute copy: fp32
 * vectors, then the 16-bit matrices. Only the bytes the ops read are copied in
 * (zt_tensor_info.reads). fp32 compute: the unit's fp32 parameters, lp_offset 0. */
typedef struct zt_offload_unit_layout {
  size_t lp_offset, bytes;
  size_t f32_end; /* the fp32 tensors read lie in the unit's first f32_end bytes */
} zt_offload_unit_layout;

/* Every size the offloaded trainer takes, from the layout and the activation bytes alone: the
 * one computation behind zt_trainer_open_offload and zt_offload_estimate, so what the daemon
 * admits is what the trainer allocates. */
typedef struct zt_offload_sizes {
  size_t host;         /* the host arena */
  size_t arena;        /* the device arena */
  size_t slot;         /* one unit's device slot */
  size_t largest;      /* the largest streamed unit's device copy, bytes */
  size_t largest_f32;  /* the largest streamed unit's fp32 parameters */
  int held;            /* units acquired at once */
  int ng;              /* leading units with their optimizer on the device */
  size_t dev_units;    /* their device bytes */
  int all_resident;    /* the arena holds every streamed unit: each is fetched once a step */
  int dsum;            /* grads gpu: the streamed units' gradient sums on the device */
  size_t dsum_bytes;   /* their device buffer */
  /* the host side (host_sizes) */
  int nh;              /* units [ng, nh) with their optimizer on the host, [nh, nu) on NVMe */
  int alias;           /* the device units' buffers are the host's (open_device_units) */
  size_t lo;           /* the host's flat-layout buffers start at this float */
  size_t h_floats;     /* the host units' masters, m and v: elements each (masters fp32, m
                          and v of train.optimizer.state_dtype) */
  int ring;            /* the gradient ring's slots; 0: the flat buffer */
  size_t ring_floats;  /* a slot: the largest streamed unit */
  size_t nvme_f32;     /* the largest NVMe unit's fp32 parameters, bytes (an NVMe staging
                          set's masters; its m and v take nvme_f32 / 4 elements each) */
  size_t nvme_param;   /* params nvme: the largest NVMe unit's device copy (streamer staging) */
  int scopy0;          /* the first unit with a stream copy */
  size_t scopy_floats; /* the stream copies of units [scopy0, nu): the NVMe units' (params not
                          nvme), with delayed bf16/fp16 the host units' too */
  size_t delayed;      /* delayed_update: the next buffers' bytes */
} zt_offload_sizes;

/* A plan: what auto leaves open, decided (the record plan.json stores, engine/plan/plan_file.h),
 * the budgets it was made under, and the sizes that follow. */
typedef struct zt_offload_placement {
  int ckpt_every;          /* train.activation_checkpointing.every, resolved */
  zt_offload_place params; /* offload.params, resolved */
  size_t act_bytes;        /* every micro-batch's with unit_major */
  int unit_major;          /* offload.order, resolved */
  zt_offload_sizes z;      /* z.ng: offload.gpu_units, z.nh - z.ng: offload.host_units, z.ring:
                              the gradient slots, z.dsum: offload.grads gpu, resolved */
  int delayed;             /* offload.delayed_update */
  size_t gpu_budget, host_budget; /* offload's budgets as planned under (0: none) */
  uint64_t nvme_budget;
  int units;               /* the model's */
  zt_step_cost est;        /* the cost model's step time and its parts */
  uint64_t nvme_bytes;     /* the NVMe files */
  uint64_t h2d_bytes, d2h_bytes; /* a step's expected copies (zt_offload_plan) */
} zt_offload_placement;

zt_offload_unit_layout zt_offload_unit_layout_of(const zt_model *m, int u, zt_dtype dt);
/* unit u's device copy, bytes (zt_offload_unit_layout.bytes) */
size_t zt_offload_unit_param_bytes(const zt_model *m, int u, zt_dtype dt);
/* the bytes one fetch of unit u moves: its fp32 parameters, or (bf16/fp16) the copies its ops
 * read */
size_t zt_offload_unit_fetch_bytes(const zt_model *m, int u, zt_dtype dt);
/* NVMe unit u's stream copy on the host (params not nvme), floats */
size_t zt_offload_stream_copy_floats(const zt_model *m, int u, zt_dtype dt);

/* Whether a unit-major step's backward is unit-major too (1), or micro-major after a unit-major
 * forward (0: a head that reads the embedding, docs/offload.md "Unit-major micro-batches"). */
int zt_offload_backward_unit_major(const zt_model *m);

/* What the offloaded step runs on: the cpu and cuda backends; -ENOTSUP naming the field
 * otherwise. */
int zt_offload_supported(const char *backend, const zt_train_cfg *tc, const zt_offload_cfg *oc,
                         char *err, size_t errlen);
/* The plan: every choice the spec fixes as given, the others searched for the cheapest that
 * fits, the offload policy and the backend checked first. The one entry of the search: for
 * admission, and whoever opens an offloaded trainer without a stored plan (ztrain, tests). The
 * refusals of zt_offload_estimate. */
int zt_offload_plan_make(const zt_model_cfg *mc, const zt_train_cfg *tc,
                         const zt_offload_cfg *oc, const zt_ops *ops, zt_offload_placement *out,
                         char *err, size_t errlen);
/* A given plan (a stored one) checked instead of searched: its choices against model m and
 * what tc and oc fix (-EINVAL naming the field otherwise), its budgets at most oc's, and its
 * sizes recomputed under its own budgets into out: -ENOMEM / -ENOSPC with the numbers when the
 * choices no longer fit them. Of a placement the search gave, out is the same. */
int zt_offload_plan_check(const zt_model *m, const zt_train_cfg *tc, const zt_offload_cfg *oc,
                          const zt_ops *ops, const zt_offload_placement *given,
                          zt_offload_placement *out, char *err, size_t errlen);
/* A placement's figures as zt_offload_estimate reports them. */
zt_offload_plan zt_offload_plan_summary(const zt_offload_placement *p);

#endif
