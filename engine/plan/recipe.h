/* The recipe of a job as the planner and the trainer read it: the training configuration
 * (zt_train_cfg) and the offload policy (zt_offload_cfg), their defaults and checks. Filled by
 * engine/train's JSON reader; planned by engine/plan; run by engine/train. */
#ifndef ZT_PLAN_RECIPE_H
#define ZT_PLAN_RECIPE_H

#include <stddef.h>
#include <stdint.h>
#include "engine/kernels/dtype.h"
#include "engine/model/model.h"

typedef enum zt_schedule { ZT_SCHED_CONSTANT = 1, ZT_SCHED_COSINE = 2 } zt_schedule;

/* The bounds of the training fields: zt_train_cfg_check and the config reader use these;
 * docs/spec.md lists them. */
#define ZT_TRAIN_MAX_STEPS 1000000000
#define ZT_TRAIN_MAX_EPOCHS 1000      /* train.epochs */
#define ZT_TRAIN_MAX_BATCH 65536      /* train.micro_batch, train.grad_accum */
#define ZT_TRAIN_MAX_BATCH_TOKENS (1LL << 40) /* train.batch_tokens */
/* train.micro_batch or train.grad_accum "auto" (or left out with train.batch_tokens) */
#define ZT_BATCH_AUTO 0
#define ZT_TRAIN_MAX_LR 10.0
#define ZT_TRAIN_MAX_GRAD_CLIP 1e6
#define ZT_TRAIN_MAX_CKPT_EVERY 1048576

/* zt_train_cfg.ckpt_every: chosen by the offload planner */
#define ZT_CKPT_AUTO (-1)

typedef struct zt_train_cfg {
  int steps;            /* optimizer steps; 0 with epochs until ztd's admission resolves them */
  /* JSON "epochs": passes over a file source's data, in place of steps (engine/job/admission.c
   * makes them steps from the token file, docs/spec.md "Epochs"); 0: not given */
  int epochs;
  int micro_batch;      /* B; ZT_BATCH_AUTO: the planner's (with batch_tokens) */
  int grad_accum;       /* micro-batches per optimizer step; ZT_BATCH_AUTO as micro_batch */
  /* JSON "batch_tokens": tokens per optimizer step, micro_batch × grad_accum × ranks × seq_len
   * (engine/plan/batch.h); 0: not given */
  int64_t batch_tokens;
  float lr, beta1, beta2, eps, weight_decay; /* AdamW; defaults as torch: 1e-3, 0.9, 0.999, 1e-8, 0.01 */
  /* JSON "optimizer.state_dtype": the type of AdamW's m and v, fp32 (default) or bf16 (rounded
   * stochastically with counter bits of (seed, step, index): engine/kernels/sround.h); the
   * master parameters stay fp32. bf16 runs on the plain trainer only for now. */
  zt_dtype state_dtype;
  zt_schedule schedule; /* warmup (linear from 0) then constant or cosine to min_lr */
  int warmup_steps;
  float min_lr;
  float grad_clip;      /* max global L2 norm; 0 = off */
  uint64_t seed;        /* data order */
  /* Activation checkpointing: 0 = none; k > 0 = blocks 0, k, 2k, ... keep only their input and
   * output and recompute their internals in backward (1 = every block). The checkpointed blocks
   * share one set of internal buffers, so the activations shrink by (their count - 1) blocks'
   * internals, for one extra forward of those blocks per micro-batch; losses and gradients are
   * bitwise those of the run without. JSON: "activation_checkpointing": {"every": k}.
   * ZT_CKPT_AUTO (JSON "auto"): the offloaded step's planner picks k with the rest of its plan
   * under offload.gpu_budget (engine/train/offload/offload.h); without offload it means none. */
  int ckpt_every;
  /* Mixed precision (JSON "precision": "fp32" | "bf16" | "fp16"): fp32 master parameters,
   * gradients and AdamW state always; with bf16/fp16 a compute copy of the parameters in that
   * type feeds the matmuls (rewritten by each AdamW step) and every activation is stored in it.
   * fp16 adds dynamic loss scaling (loss_scale.h): steps whose gradients overflow are skipped. */
  zt_dtype precision;
  /* JSON "tf32": true lets fp32 matmuls use TF32 tensor cores (cuda backend only). */
  int tf32;
} zt_train_cfg;

void zt_train_cfg_defaults(zt_train_cfg *c);
int zt_train_cfg_check(const zt_train_cfg *c, char *err, size_t errlen);
/* What the single-rank trainers alone support (the plain one and the offloaded walk), refused
 * (-ENOTSUP) for another strategy ("data parallelism"): today train.optimizer.state_dtype bf16.
 * Called by the open of engine/train/dp and by the admission (engine/job). */
int zt_train_cfg_check_strategy(const zt_train_cfg *c, const char *strategy, char *err,
                                size_t errlen);

/* ---- the offload policy (engine/train/offload/offload.h runs it) ---------------------------- */

/* The offloaded step's limits the policy is checked against: units fetched ahead, how many
 * units behind the backward each unit's gradients are taken up (walk_backward), and the
 * gradient ring's slots (docs/offload.md "The gradients on the host" gives the bound). */
#define ZT_OFFLOAD_PREFETCH_MAX 16
#define ZT_OFFLOAD_UNIT_DONE_LAG 2
#define ZT_OFFLOAD_GRAD_RING_MIN (ZT_OFFLOAD_UNIT_DONE_LAG + 2)
#define ZT_OFFLOAD_GRAD_RING_MAX 4096

/* offload.order unit: the micro-batches a step walks at once, at most */
#define ZT_UNIT_MAJOR_MICROS_MAX 64

/* The order of a step's micro-batches ("auto" | "micro" | "unit" in offload.order,
 * docs/offload.md "Unit-major micro-batches"). */
typedef enum zt_offload_order {
  ZT_ORDER_AUTO = 0,
  ZT_ORDER_MICRO = 1, /* each micro-batch walks every unit, forward then backward */
  ZT_ORDER_UNIT = 2,  /* each unit walks every micro-batch: its parameters come once a pass */
} zt_offload_order;

/* A placement of one kind ("gpu" | "host" | "nvme" | "auto" in the spec). */
typedef enum zt_offload_place {
  ZT_PLACE_AUTO = 0,
  ZT_PLACE_GPU = 1,
  ZT_PLACE_HOST = 2,
  ZT_PLACE_NVME = 3,
} zt_offload_place;

typedef struct zt_offload_cfg {
  zt_offload_place params;    /* home of the compute parameters between uses; auto: with a
                                 gpu_budget the planner's choice of gpu or host, else gpu */
  zt_offload_place grads;     /* where the streamed units' gradients sum over the step's
                                 micro-batches (docs/offload.md "Gradient sums"): gpu,
                                 host or auto */
  zt_offload_place optimizer; /* fp32 masters, AdamW m and v; auto: with a gpu_budget the
                                 leading units the plan fits on the device (gpu_units), the
                                 rest on the host; with a host_budget and an nvme_dir, the host
                                 for the units that fit it (host_units) and nvme for the rest;
                                 else host */
  size_t gpu_budget;          /* device bytes for activations + the arena; 0: what every unit
                                 resident needs */
  int prefetch;               /* units fetched ahead of the one computing, [0, 16] */
  int gpu_units;              /* the first gpu_units units keep masters, m, v, gradients and
                                 compute copy on the device, updated there; -1 (default): with
                                 optimizer auto and a gpu_budget, as many as the budget holds,
                                 else none */
  int host_units;             /* optimizer nvme or auto: the host_units units after the device
                                 units keep masters, m and v on the host, the rest on nvme;
                                 -1 (default): with optimizer auto, a host_budget and an
                                 nvme_dir, as many as the host_budget holds; else with nvme
                                 none, with auto all */
  size_t host_budget;         /* the host arena's limit, bytes; 0: none */
  uint64_t nvme_budget;       /* the NVMe files' limit, bytes; 0: none (ztd still checks the
                                 free space of nvme_dir) */
  int grad_slots;             /* the host's gradient ring where it applies (docs/offload.md
                                 "The gradients on the host"): 0 (default) the fewest slots that
                                 keep the backward from waiting for the CPU AdamW, by the cost
                                 model (0 slots, the flat buffer, where that is all the
                                 streamed units); else that many, >= 4 (at most the streamed
                                 units) */
  int delayed_update;         /* 1: from step 2 on, the streamed units' update of a step runs
                                 during the next step (docs/offload.md "Delayed
                                 update"); 0: none */
  zt_offload_order order;     /* with grad_accum > 1; auto: with a gpu_budget the cost model's
                                 choice, else micro */
  char nvme_dir[ZT_PATH_MAX]; /* an existing directory; the trainer keeps its files in a new
                                 directory in it (zt-offload.XXXXXX, removed when it closes);
                                 required with an nvme placement */
} zt_offload_cfg;

void zt_offload_cfg_defaults(zt_offload_cfg *c);
const char *zt_offload_place_name(zt_offload_place p);
/* "gpu" | "host" | "nvme" | "auto"; -EINVAL otherwise. */
int zt_offload_place_parse(const char *s, zt_offload_place *out);
/* 0, or -EINVAL / -ENOTSUP with a message naming the field ("offload.params: nvme needs
 * offload.optimizer nvme"). */
int zt_offload_cfg_check(const zt_offload_cfg *c, char *err, size_t errlen);

#endif
