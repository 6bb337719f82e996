/* The data-parallel plan (engine/train/dp/dp.h runs it): from the model, the recipe, the offload
 * placement, the world and the ZeRO stage, the shard table, the units whose state the device,
 * the host tier and NVMe keep, and the bytes of every buffer a rank allocates in each; and a
 * several-rank job's placement resolved against a per-GPU budget. Called by engine/train/dp
 * (its open allocates what the plan lists, its estimates are the plan's sums) and engine/job
 * (admission, dp_placement.c: zt_dp_plan_resolve). */
#ifndef ZT_PLAN_DP_PLAN_H
#define ZT_PLAN_DP_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "engine/kernels/ops.h"
#include "engine/model/model.h"
#include "engine/plan/recipe.h"
#include "offload/shard.h"

/* The most ranks one trainer runs: a rank per device of a machine (ZT_MAX_DEVICES). */
#define ZT_DP_MAX_WORLD 64

/* Every unit is split into world chunks of a multiple of ZT_DP_ALIGN elements (8: 16 bytes of
 * bf16, 32 of fp32, so that every chunk a collective reads or writes starts 16-byte aligned in
 * either type). */
#define ZT_DP_ALIGN 8

/* A rank's record in the step's exchange after the backward: this many scalars, then two per
 * micro-batch (engine/train/dp/internal.h, X_*). */
#define ZT_DP_XCHG_SCALARS 4

/* The backend buffers a rank allocates besides its activations, in bytes (0: none); the open
 * allocates each of them, in this order, and zt_dp_plan_dev_bytes adds them up. */
typedef struct zt_dp_dev_bufs {
  size_t params, params_lp;   /* stages 1-2: the padded layout; 3: the packed shard (of the
                                 device units alone with params host); and the compute copy */
  size_t grads;               /* stage 1: the padded layout; 2-3: the device units' shard */
  size_t moments;             /* m, and as much v: the device units' shard */
  size_t xchg;                /* the world's exchange records */
  size_t gout[2];             /* a host unit's reduced chunk (stage 1: one; 2-3: two) */
  size_t pchunk, lpchunk;     /* params host: each of two chunks staged for a gather */
  size_t gunit, gembed, gscratch; /* 2-3: each of two units' gradients (padded), the gpt
                                     embedding's, a later micro-batch's reduced chunk */
  size_t pslot, lpslot;       /* 3: each of two gathered units */
  size_t pembed, lpembed;     /* 3, gpt: the gathered embedding */
} zt_dp_dev_bufs;

/* The host tier's buffers of a rank, in bytes (0: none), each allocated from its arena. */
typedef struct zt_dp_host_bufs {
  size_t grads, stage;        /* the host units' gradients; stages 2-3 with grad_accum > 1 a
                                 later micro-batch's */
  size_t masters, lp;         /* the masters and their compute copy: the host units', and with
                                 optimizer nvme and params host the NVMe units' too (the
                                 parameters the gathers are staged from) */
  size_t moments;             /* m, and as much v: the host units' that keep theirs here */
  size_t set, set_lp;         /* optimizer nvme: each of two sets' masters, m and v (each), and
                                 its compute copy (none with params nvme) */
  size_t pstage;              /* params nvme: each of two parameter stagings */
} zt_dp_host_bufs;

typedef struct zt_dp_plan {
  int world, zero_stage;
  zt_shard_table *tab;
  int nu;
  int tied;                 /* gpt: the head reads (and adds the gradient of) the embedding */
  /* offload.order unit with grad_accum > 1 (at most ZT_UNIT_MAJOR_MICROS_MAX): every micro-batch's
   * activations kept from the forward to the backward (act_micros of them), the forward walked
   * unit-major; um_back: the backward too (not where the head reads the embedding,
   * zt_offload_backward_unit_major), each unit's gradients summed over the micro-batches then
   * reduced once a step */
  int unit_major, um_back, act_micros;
  size_t slot_floats;       /* the largest unit a slot or gunit holds (padded) */
  size_t rec;               /* doubles per exchange record */
  /* offload: units 0..ng-1 on the device (all without), the rest on the host tier; the
   * device's packed buffers hold dev_packed elements, the host's host_n */
  int ng, params_host;      /* params_host: the host units' parameters are not on the device
                               between uses (params host or nvme, stage 3) */
  int params_nvme;          /* params nvme: the NVMe units' chunks are read from their master
                               files before each gather; the host tier holds none of them */
  size_t dev_packed, host_n;
  int nvme;                 /* optimizer nvme: units nv0.. keep masters, m and v in files */
  int nv0;                  /* the first NVMe unit: ng + host_units with optimizer nvme, else
                               nu; units ng..nv0-1 keep theirs on the host tier */
  size_t hopt_n;            /* those host units' elements (a prefix of host_n) */
  size_t nv_chunk;          /* the largest NVMe unit's chunk (a set's floats) */
  zt_dp_dev_bufs dev;
  zt_dp_host_bufs host;
} zt_dp_plan;

/* The shard table of model m over `world` ranks (ZT_DP_ALIGN). 0, or zt_shard_table_build's
 * error. */
int zt_dp_plan_shard_table(const zt_model *m, int world, zt_shard_table **tab);

/* The checks of a data-parallel trainer's shape (world, zero_stage) and of its placement
 * (o->optimizer, ->params, ->gpu_units, ->host_units, ->nvme_dir) that need no model: 0, or
 * -EINVAL / -ENAMETOOLONG with a message naming the dp.* field. */
int zt_dp_plan_check_world(int world, int zero_stage, char *err, size_t errlen);
int zt_dp_plan_check_place(const zt_offload_cfg *o, int zero_stage, char *err, size_t errlen);

/* The plan of model m on `world` ranks with those checked: 0, or -EINVAL for gpu_units or
 * host_units past the model's units or offload.order unit past ZT_UNIT_MAJOR_MICROS_MAX
 * micro-batches, -ENOMEM / -EOVERFLOW for the table, with a message.
 * zt_dp_plan_free after a success. */
int zt_dp_plan_make(zt_dp_plan *p, const zt_model *m, const zt_train_cfg *tc,
                    const zt_offload_cfg *o, int world, int zero_stage, char *err,
                    size_t errlen);
void zt_dp_plan_free(zt_dp_plan *p);

/* A rank's activations on backends with op table ops: act_micros micro-batches' (0 where they
 * cannot be sized). */
size_t zt_dp_plan_act_bytes(const zt_dp_plan *p, const zt_model *m, const zt_train_cfg *tc,
                            const zt_ops *ops);

/* The collectives of the parameters and gradients a rank issues in a step (the two scalar
 * exchanges aside), counted as the walk issues them: what offload.order auto weighs
 * (zt_dp_plan_place) and what the tests count on the CPU group. */
typedef struct zt_dp_plan_colls {
  long gathers;         /* units' parameters gathered: an all-gather each, two with a compute
                           copy */
  long reduce_scatters, all_reduces;
} zt_dp_plan_colls;
zt_dp_plan_colls zt_dp_plan_step_colls(const zt_dp_plan *p, const zt_train_cfg *tc);

/* A rank's backend bytes besides its activations; its host tier's (page-locked, whole pages);
 * its NVMe files' (a master, exp_avg and exp_avg_sq of its chunk per NVMe unit, in the
 * store's whole blocks). */
size_t zt_dp_plan_dev_bytes(const zt_dp_plan *p);
size_t zt_dp_plan_host_bytes(const zt_dp_plan *p);
uint64_t zt_dp_plan_nvme_bytes(const zt_dp_plan *p);

/* The same for a model configuration, without a model: a rank's backend bytes on backends with
 * op table ops (activations included), host tier bytes, NVMe bytes. SIZE_MAX / UINT64_MAX for
 * a configuration the checks above or zt_train_cfg_check refuse, or ops NULL. */
size_t zt_dp_plan_rank_bytes(const zt_model_cfg *mc, const zt_train_cfg *tc,
                             const zt_offload_cfg *o, int world, int zero_stage,
                             const zt_ops *ops);
size_t zt_dp_plan_host_tier_bytes(const zt_model_cfg *mc, const zt_train_cfg *tc,
                                  const zt_offload_cfg *o, int world, int zero_stage);
uint64_t zt_dp_plan_nvme_file_bytes(const zt_model_cfg *mc, const zt_train_cfg *tc,
                                    const zt_offload_cfg *o, int world, int zero_stage);

/* What zt_dp_plan_place reports when nothing fits: the fewest device bytes a rank needs with
 * what the policy allows (the optimizer of its gpu_units units, or none, on the device, the
 * rest's where it says), with the parameters there and that checkpointing. */
typedef struct zt_dp_plan_least {
  size_t bytes;
  zt_offload_place params;
  int ckpt_every;
} zt_dp_plan_least;

/* A several-rank job's placement (engine/job/dp_placement.c): o's optimizer, params and
 * gpu_units, and tc->ckpt_every where it is ZT_CKPT_AUTO, resolved for model m on `world`
 * ranks. Without o->gpu_budget auto means host for the optimizer (nvme stays nvme) and gpu
 * for the rest (auto checkpointing is then the caller's). With it, the least recompute first
 * and for each the fastest placement that fits the budget per GPU: everything on the device
 * (*no_offload set: the job runs without offload), else as many units' optimizer on the device
 * as fit, else (stage 3) the host units' parameters on the host too; params nvme stays nvme;
 * then o->order auto with grad_accum > 1 resolved: unit where every micro-batch's activations
 * fit too and it issues fewer collectives a step (zt_dp_plan_step_colls), else micro (without a
 * budget auto stays, which the trainer runs as micro).
 * 0, or -ENOMEM with *least for the caller's message, o and tc unchanged. */
int zt_dp_plan_place(const zt_model *m, zt_train_cfg *tc, zt_offload_cfg *o, int world,
                     int zero_stage, const zt_ops *ops, int *no_offload, zt_dp_plan_least *least);
/* A several-rank job's offload policy checked (what several ranks cannot do: delayed_update,
 * order unit, grads gpu; params nvme or host without stage 3; host_units without optimizer
 * nvme; units the model lacks) and resolved in place by zt_dp_plan_place: 0 (*no_offload: the
 * job runs without offload), or -errno with the message naming the fields, `ranks` naming the
 * job's ranks ("parallel.gpus 2"), and for -ENOMEM what a rank needs at the least. */
int zt_dp_plan_resolve(const zt_model_cfg *mc, zt_train_cfg *tc, zt_offload_cfg *o, int world,
                       int zero_stage, const char *ranks, const zt_ops *ops, int *no_offload,
                       char *err, size_t errlen);

#endif
