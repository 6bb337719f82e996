/* The offloaded step (ZeRO-Offload, DESIGN.md "Memory: tiers, shards, the plan"): fp32 master
 * parameters, AdamW m and v and the fp32 gradients live in the pinned host arena; the device
 * holds the activations of one micro-batch and, in a budgeted device arena, the parameter copies
 * of the units in flight and their gradient buffers. Each micro-batch walks the units through
 * the streamer (offload/streamer.h): forward 0..U-1 prefetching `prefetch` units ahead, backward
 * U-1..0 with each unit's gradients going to the host as soon as its backward is done, and the
 * CPU AdamW of a unit (offload/cpu_adam.h, on a worker pool) submitted as soon as its gradients
 * of the last micro-batch are on the host, while the device computes the next unit.
 *
 * The math is that of zt_trainer_step without offload, bit for bit: micro-batches add up in the
 * device gradient buffer, which keeps the step's running sum (below, "Gradient sums") or starts
 * as the host's (ZT_STREAM_GRADS_RESUME), so every gradient sees the same additions in the same
 * order; with clipping the norm is the backend's sum_squares over the same flat buffer; cpu_adam
 * is bitwise the backend's adamw.
 *
 * Gradient sums (offload.grads) with several micro-batches a step: gpu keeps the streamed units'
 * running sums on the device, in one backend buffer over their parameters (4 bytes a parameter
 * of device memory), zeroed at the start of the step; each micro-batch's backward adds into it
 * and only the last one's gradients go to the host, once a step. host keeps no such buffer: each
 * later micro-batch brings the unit's running sum up from the host before its backward and takes
 * it back after, two copies on the backward's path per unit and micro-batch, for no device
 * memory beyond the arena's gradient buffers. auto: with a gpu_budget, the plan the cost model
 * finds faster (it charges host's copies to the step); without one, gpu. One micro-batch a step
 * makes the two the same: auto is host.
 *
 * Clipping needs the global norm before any update, so with train.grad_clip > 0 the updates wait
 * for the whole backward; without it they overlap the backward. A gradient with inf/nan is then
 * found unit by unit: the step fails with -ERANGE as without offload, but the units updated
 * before it stay updated, so the trainer refuses further steps (-EIO) until a checkpoint is
 * loaded.
 *
 * fp16 compute: the loss is scaled by the trainer's loss scaler (loss_scale.h, GradScaler's
 * rules) and an overflowed step must be skipped whole, which is known only after the whole
 * backward, so with fp16 the updates always wait for the backward (as with clipping; and so no
 * gradient ring). An inf/nan in any gradient, on the host or in the device units, then skips the
 * step as without offload (nothing updated, AdamW's step count kept, the scale halved,
 * zt_step_result.skipped); otherwise every AdamW, the CPU's and the device units', takes
 * grad_scale = clip coefficient / scale, and the scale grows after the scaler's interval of
 * clean steps. The scaler is the trainer's, so checkpoints carry it as without offload.
 *
 * optimizer nvme: masters, m and v live in one file per unit and kind under nvme_dir
 * (offload/nvme_store.h); a unit's three are read ahead into host staging while the unit before
 * it is updated, and written back behind its update. The host keeps the gradients, the staging
 * and, unless params is nvme too, a copy of the fp32 parameters the units' ops read to stream
 * from (fp32 compute: all of them; bf16/fp16: the vectors and embeddings). params nvme: the
 * units are streamed from their master files (fp32 compute: the parameters are the masters), so
 * it needs optimizer nvme.
 *
 * Host and NVMe together (host_units): after the device units, a run of host_units units keeps
 * masters, m and v in the host arena and the units after it keep them on NVMe. The units right
 * after the device ones, because the backward updates them last: an NVMe unit's read waits
 * behind the update before it and its write-back behind its own update, which the rest of the
 * backward hides for the first units updated but nothing hides for the last ones. Units are
 * numbered in layout order, so the host units' state is one range of the flat layout.
 *
 * The gradients on the host: a flat fp32 buffer over the streamed units, which clipping (and
 * fp16's overflow check) reads whole before any update and later micro-batches resume from
 * (grads host with several micro-batches: the running sum of the step). Without these
 * (train.grad_clip 0, one micro-batch or grads gpu, not fp16) a unit's gradients are needed on
 * the host only from their write-back
 * until its AdamW has read them: they go to a ring of grad_slots buffers of the largest
 * streamed unit, unit u to slot (u - gpu_units) mod grad_slots. The bound: the backward takes a
 * unit's gradients up (waits for their write-back, then submits its AdamW) two units behind the
 * one it queues (UNIT_DONE_LAG in step.c), so at a unit's release the three units
 * released before it are still to be taken up and one more slot takes the unit released now:
 * 4 slots at least, or the streamed units if fewer. The slot's previous user, grad_slots units
 * back in the walk, has been taken up; the release waits for its AdamW to finish reading the
 * slot. So where the CPU AdamW of a unit takes longer than the backward of one, 4 slots would
 * hold the backward to the pool's pace: by default the ring has as many more slots as units
 * the pool falls behind by over the walk (the cost model's rates, ZT_TUNE_PLAN_*), within
 * ZT_TUNE_GRAD_RING_BYTES of host memory, and where that is every streamed unit the flat
 * buffer serves instead (no more bytes); offload.grad_slots sets the count.
 * The norm is then the sum of the units' sums of squares, taken as each unit is (so its value
 * may differ in the last bits from the run without offload's; the updates do not use it).
 *
 * On the GPU (the cuda backend) the same walk runs asynchronously: the copy engine's streams
 * are ordered against the compute stream by events (offload/copy_cuda.c), the host tier is
 * page-locked, the AdamW pool takes every core, and a unit's gradients are taken up on the host
 * two units behind the backward, so the runner never waits for the last compute it queued. The
 * inf/nan check and the streamed units' part of the norm are summed on the host as each unit is
 * taken up (a CPU backend of the path's own), so each gradient is read there once.
 *
 * Device units (gpu_units): the leading units may keep masters, m, v, gradients and the compute
 * copy on the device, accumulate there and be updated by the backend's AdamW after the backward;
 * the streamer then handles the others only. The leading ones, because their gradients are the
 * last the backward makes, leaving the CPU least time to hide their update.
 *
 * bf16 or fp16 compute: the host keeps a copy of the parameters in that type that the AdamW
 * rewrites in the same pass (offload/cpu_adam.h). Only the bytes a unit's ops read move
 * (zt_tensor_info.reads): the matmul weights in bf16/fp16, biases, norms and embeddings in fp32.
 * The layouts put a block's vectors before its matrices, so a unit moves in two copies, about 2
 * bytes a parameter.
 *
 * The plan (zt_offload_estimate, the same computation as the open): with a gpu_budget, what the
 * spec leaves to auto (activation checkpointing, params gpu or host, the device units) is
 * searched for the cheapest plan that fits by a cost model whose rates are in engine/base/tunables.h;
 * with optimizer auto, a host_budget and an nvme_dir each candidate keeps on the host as many
 * units as the host_budget holds. The host arena is the plan's host_bytes exactly; beside it the
 * open holds the initial parameters in a flat buffer (4 bytes a parameter) until they are in
 * their tiers, before it allocates the host units' m and v.
 *
 * Delayed update (offload.delayed_update, ZeRO-Offload's one-step delayed parameter update,
 * DeepSpeed's DPU): from step 2 on, the CPU AdamW of step k's streamed units (host and NVMe;
 * the device units are updated on the device at the end of step k as without it) is not waited
 * for: it runs on the pool while step k + 1's forward and backward run, which therefore compute
 * with those units' parameters of step k - 1's update (stale by one step); step 1's update is
 * applied within step 1 as without the delay. Step k's norm, clip coefficient, fp16 verdict,
 * learning rate and AdamW step count are step k's own, taken when its backward ends; the
 * deferred update applies them. The pending update is finished (drained) at the end of step
 * k + 1's backward, before that step's own update is deferred in turn; and before any state call
 * (a checkpoint save, load or export, zt_trainer_get_state) and when a step fails, so a
 * checkpoint holds every update up to its step. After a drain the next step computes with every
 * update applied (the stale parameters are never in a checkpoint), so a run resumed from a
 * checkpoint continues bitwise as the run that wrote it. A step of fp16 whose gradients overflow
 * is skipped as without the delay (nothing deferred; the pending update of the step before
 * still lands); bf16/fp32 gradients with inf or nan fail the step with -ERANGE, the pending
 * update of the step before landed and this step's not started. To keep what the device reads
 * apart from what the update writes, the update writes the next copies: fp32 host units' masters
 * alternate between two buffers (each update copies the current masters into the other and
 * updates them there); bf16/fp16 has a second compute copy and, for the fp32 tensors the units'
 * ops read, a stream copy (as NVMe units have) in two buffers too; NVMe units' stream copy is
 * doubled. The buffers swap at the drain. The update needs the step's whole gradients while the
 * next step writes its own back, unit by unit: a unit's first write-back of the step
 * waits for the pending update of that unit, so the gradient ring is not used (the flat buffer
 * is), nor (on the cpu backend) do the device units alias the host's buffers. Refused with
 * params nvme (the streamer reads the master files the update rewrites) and, in ztd, with more
 * than one rank.
 *
 * Scope today: the cpu and cuda backends, precision fp32, bf16 or fp16; params gpu (every unit
 * resident), host (streamed within gpu_budget) or nvme (fp32 only: the files hold the masters);
 * the step's gradient sums on the device or the host; optimizer on the device for the leading units, on the host, on nvme, or on
 * the host for a run of units and nvme for the rest. Other placements are refused with a
 * message naming the field. */
#ifndef ZT_TRAIN_OFFLOAD_H
#define ZT_TRAIN_OFFLOAD_H

#include <stddef.h>
#include <stdint.h>
#include "engine/plan/offload_plan.h"
#include "engine/train/trainer.h"

/* zt_trainer_open for an offloaded step. -ENOMEM with the numbers when gpu_budget cannot hold
 * the activations plus the streamer's minimum; -ENOTSUP for a backend other than cpu or cuda,
 * or params nvme with bf16/fp16. Every other trainer call works as without offload
 * (checkpoints included, interchangeable with those of a run without offload; fp16 steps
 * skipped and the loss scale as without offload). */
int zt_trainer_open_offload(zt_trainer **t, const zt_model_cfg *mc, const zt_train_cfg *tc,
                            const zt_offload_cfg *oc, const zt_backend *be, char *err,
                            size_t errlen);

typedef struct zt_offload_stats {
  size_t device_budget;  /* gpu_budget as resolved: activations + device units + gradient sums +
                            arena */
  size_t act_bytes;      /* activations of one micro-batch (backend memory) */
  int gpu_units;         /* leading units with their optimizer on the device */
  int host_units;        /* the units after them with their optimizer on the host */
  int grad_slots;        /* the host's gradient ring (0: one flat buffer) */
  int ckpt_every;        /* the plan's activation checkpointing (train's, or auto's choice) */
  zt_offload_place params; /* the plan's home of the parameters between uses */
  zt_offload_place grads;  /* where the step's gradient sums are kept: gpu, host */
  size_t dsum_bytes;     /* grads gpu: their device buffer */
  double est_step_s;     /* the plan's step time by the planner's cost model */
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
