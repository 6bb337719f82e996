/* defines: the offloaded step (ZeRO-Offload, DESIGN.md "Memory: tiers, shards, the plan"):
 * zt_trainer_open_offload, a trainer whose state lives in the host tier and on NVMe and whose
 * units stream through the device, and its statistics. What it runs is a plan of
 * engine/plan/offload_plan.h (zt_offload_plan_make, included here for its callers). How the step
 * works and why: docs/offload.md. Called by engine/job's runner, ztrain and the tests. */
#ifndef ZT_TRAIN_OFFLOAD_H
#define ZT_TRAIN_OFFLOAD_H

#include <stddef.h>
#include <stdint.h>
#include "engine/plan/offload_plan.h"
#include "engine/train/trainer.h"

/* zt_trainer_open for an offloaded step run as plan says (zt_offload_plan_make's, or a stored
 * one): the plan is checked (zt_offload_plan_check), never searched. -ENOMEM with the numbers
 * when its budgets cannot hold it; -EINVAL where it does not match the model, tc or oc;
 * -ENOTSUP for a backend other than cpu or cuda, or params nvme with bf16/fp16. Every other
 * trainer call works as without offload (checkpoints included, interchangeable with those of a
 * run without offload; fp16 steps skipped and the loss scale as without offload). */
int zt_trainer_open_offload(zt_trainer **t, const zt_model_cfg *mc, const zt_train_cfg *tc,
                            const zt_offload_cfg *oc, const zt_offload_placement *plan,
                            const zt_backend *be, char *err, size_t errlen);

/* The threads of the CPU AdamW pool an offloaded trainer opens (*pin: whether each is pinned
 * to a core), beside a GPU backend (on_gpu) or the CPU backend; ztd --calibrate times the pool
 * with the same (engine/train/calibrate.c). */
int zt_offload_adam_threads(int on_gpu, int *pin);

typedef struct zt_offload_stats {
  size_t device_budget;  /* gpu_budget as resolved: activations + device units + gradient sums +
                            arena */
  size_t act_bytes;      /* activations of one micro-batch, unit-major of every micro-batch
                            of the step (backend memory) */
  int gpu_units;         /* leading units with their optimizer on the device */
  int host_units;        /* the units after them with their optimizer on the host */
  int grad_slots;        /* the host's gradient ring (0: one flat buffer) */
  int ckpt_every;        /* the plan's activation checkpointing (train's, or auto's choice) */
  zt_offload_place params; /* the plan's home of the parameters between uses */
  zt_offload_place grads;  /* where the step's gradient sums are kept: gpu, host */
  size_t dsum_bytes;     /* grads gpu: their device buffer */
  zt_step_cost est;      /* the plan's step by the planner's cost model, and each queue's busy
                            time in it, to set beside the timeline's */
  int unit_major;        /* offload.order as the plan resolved it: 1 unit, 0 micro */
  size_t gpu_unit_bytes; /* their device buffers */
  uint64_t gpu_unit_updates; /* unit updates run by the backend's AdamW */
  size_t arena_budget;   /* the device arena: parameter copies and gradient buffers */
  size_t arena_peak;     /* the arena's highest use so far */
  size_t host_bytes;     /* the host arena: gradients, and masters, m, v and their staging */
  size_t host_used, host_pinned; /* of it, allocated, and of that page-locked */
  uint64_t fetches, evictions, grad_writebacks, bytes_h2d, bytes_d2h;
  uint64_t nvme_bytes_read, nvme_bytes_written; /* the NVMe tier's traffic (store counters) */
  uint64_t adam_units;   /* unit updates run on the CPU pool */
  uint64_t adam_overlapped; /* of those, submitted before the backward had finished */
  uint64_t adam_landed;  /* of those, left running when their step returned and waited for by
                            the next step's forward of the unit */
  /* The timeline, cumulative over the steps: each resource's busy time against the steps'
   * wall time tells which one bounds the step. compute: the device's unit forwards, backwards,
   * losses and device AdamW; h2d / d2h: the copy queues; adam: the CPU pool's threads, summed
   * (divide by adam_threads); nvme: time with an I/O in flight. The waits: the trainer's thread
   * blocked on a copy, on the AdamW pool, on NVMe I/O (a busy fraction tells what was used, a
   * wait what the step stood still for: on the GPU the compute queue runs dry behind such a
   * wait once what was queued before it is done). */
  uint64_t step_ns, compute_ns, h2d_ns, d2h_ns, adam_ns, nvme_ns;
  uint64_t wait_copy_ns, wait_adam_ns, wait_nvme_ns;
  int adam_threads;
} zt_offload_stats;

/* -EINVAL for a trainer without offload. */
int zt_trainer_offload_stats(const zt_trainer *t, zt_offload_stats *out);

#endif
