/* Data-parallel training with ZeRO partitioning: W ranks, each with its own backend (a device
 * per rank on cuda, a CPU context here), its own activations and a communicator
 * (engine/comm/comm.h), run one optimizer step together as one trainer.
 *
 * The data split: train.micro_batch = B and train.grad_accum = G are per rank; the step's tokens
 * hold W * G micro-batches in the usual layout and rank r takes micro-batches r*G .. r*G+G-1.
 * Every micro-batch's loss gradient is scaled by 1 / (its counted tokens * W * G), so the
 * gradient summed over the ranks is that of one trainer with grad_accum W * G on the same
 * tokens; the reported loss is the mean over all counted micro-batches (in micro-batch order,
 * so the first step's loss is bitwise that trainer's), the norm that of the whole gradient
 * (each rank's sum of squares over its shard, exchanged and added in rank order), and clipping,
 * the schedule and AdamW are those of zt_trainer_step. Only the order in which the ranks'
 * gradients are added differs, which moves the losses of later steps by rounding (1e-6
 * relative in our tests).
 *
 * The stages (offload/shard.h: every unit split into W equal chunks, one per rank):
 * 1. every rank holds all parameters and gradients (padded layout); after the last
 *    micro-batch each unit's gradients are all-reduced as its backward finishes; each rank runs
 *    AdamW on its chunks only (its shard of m and v is all it keeps of the optimizer state),
 *    then each unit's parameters are all-gathered.
 * 2. as 1, but gradients are sharded too: each unit's backward writes into one of two
 *    full-size temporaries (alternating by unit; the gpt embedding has its own, held from the
 *    head, which adds the tied wte's gradient, to unit 0) that is reduce-scattered as soon as
 *    the unit is done, every micro-batch, into the rank's gradient shard.
 * 3. as 2, but parameters are sharded too: a unit is all-gathered into one of two slots before
 *    its forward and its backward. The slots alternate by unit, so the gather of the next unit
 *    is issued before this unit computes and the last two units of the forward are still there
 *    for the start of the backward. The gpt embedding stays gathered through the step in a
 *    slot of its own, because the head reads the tied wte (FSDP keeps such a root unit
 *    gathered too).
 * Unit-major (zt_dp_cfg.order ZT_ORDER_UNIT, docs/offload.md "Unit-major micro-batches"): with
 * grad_accum G > 1 every rank stages its G micro-batches first, each into activations of its
 * own (the plan counts G of them), and walks each unit through all of them: stage 3 gathers a
 * unit once for the forward of them all and once for their backward instead of once a
 * micro-batch each way; the backward adds each unit's gradients of the G micro-batches into its
 * buffer in micro-batch order, then reduces the sum once (stages 2-3: one reduce-scatter a unit
 * a step, no later micro-batch's chunk to add; stage 1 all-reduces once a step either way).
 * Where the head reads the embedding (gpt, a tied llama) the backward stays micro-major after
 * the unit-major forward, each micro-batch's gradients reduced as in micro order, so that the
 * embedding's gradient adds up in the order head, embedding, head, ... (as the single-rank
 * walk, zt_offload_backward_unit_major). On the CPU backend the steps are then bitwise micro
 * order's; with a unit-major backward at stages 2-3 they are bitwise micro order's at stage 1,
 * whose one reduction also reads the rank's summed micro-batches.
 * Per-unit collectives are issued in the same order by every rank whatever its data (a rank
 * whose micro-batch is padding alone still takes part, with zero gradients), as the
 * collectives require.
 *
 * Overlap. The device units' collectives run on the communicator's own queue (comm.h: a
 * stream of its own under NCCL, a thread under the CPU group), ordered against the compute by
 * tickets: each starts after the compute that produced its input and the compute waits for it
 * only where it reads the output or reuses the buffer. So a unit's reduce-scatter (stage 1:
 * all-reduce) runs while the backward computes the next unit into the other temporary (a later
 * micro-batch's reduced chunk is added to the shard one unit late), stage 3's gather of the
 * next unit while this one computes, and stages 1-2's gather of each unit's updated parameters
 * while the next unit's AdamW runs and on into the next step's forward, which waits for each
 * unit's gather just before that unit. The state calls and close wait for the queue first.
 * The host units' collectives stay on the compute stream, because their copies to and from the
 * host are ordered after the compute (offload/copy_engine.h); the communicator orders those
 * after the queue's, so each rank still issues one sequence of collectives.
 *
 * Checkpoints. A trainer that runs every rank (local == world) writes them per rank
 * (engine/train/checkpoint/per_rank.c): every rank, on its own thread and all at once, reads
 * its own chunks (from its device on its stream, through a staging of one chunk, or straight
 * from its host tier) into a file of its own, beside a manifest of the layout and model.safetensors, the
 * parameters gathered. Loading such a checkpoint into the same world, every rank reads its own
 * file into its chunks (stages 1-2 then all-gather the parameters, as after an update); any
 * other checkpoint, or this one into another world or a trainer without data parallelism, goes
 * through the flat layout a piece at a time: loading scatters it into this trainer's shards,
 * and zt_trainer_get_state and export gather the shards into it. Parts (below) write and read
 * the same per-rank files, each part its own ranks', where every part sees the checkpoint's
 * directory, else the flat layout. A per-rank checkpoint does not depend on how the world was
 * split into parts: one written by parts loads into a trainer that runs every rank of the same
 * world, each rank its own file, and the other way round, bitwise. So checkpoints are
 * interchangeable between world sizes, stages, placements, splits into parts and the trainer
 * without data parallelism.
 *
 * Parts. A trainer may run only some of the world's ranks: zt_dp_cfg.rank0 and .local make it
 * the part that runs global ranks rank0 .. rank0 + local - 1, whose communicators span the
 * whole world (a job over several daemons runs one part on each; the CPU group can drive two
 * parts in one process). Every part opens with the same configuration and seed, so it computes
 * the same initial parameters and writes its own ranks' share of them without communicating.
 * Then every part calls the same sequence of collective calls, each with its own threads:
 * - zt_trainer_step, with the step's whole batch (all W * G micro-batches; global rank r takes
 *   r*G .. r*G+G-1 as above). Loss, norm, clipping and the non-finite verdict are the world's.
 * - Step flags: zt_trainer_dp_set_flags gives the flags this part contributes to its next step;
 *   zt_step_result.flags is the OR over every rank's contribution, so all parts learn it on the
 *   same step and can stop or checkpoint there together. The trainer only ORs them; the
 *   meanings below are the caller's.
 * - State: the part holding global rank 0 reads and writes the state through zt_trainer_save,
 *   zt_trainer_export, zt_trainer_get_state (gathers) and zt_trainer_load (scatters); every
 *   other part calls, at the same time and once per call, zt_trainer_dp_send_state (for the
 *   first three) or zt_trainer_dp_receive_state (for a load), which follow the sequence of state
 *   collectives the rank-0 part's call makes until its last. For each of them global rank 0
 *   first broadcasts what it is (a gather of which tensors or a scatter, and its units; a probe;
 *   the ranks' files) or that the call gave up (before the state, e.g. a checkpoint that does
 *   not load, or between pieces, e.g. a disk that filled), so a part whose call does not match
 *   learns it instead of waiting. A call given up ends the others' with -ECANCELED, nothing
 *   changed; a load given up after some of its pieces leaves every part's state partly the
 *   checkpoint's, and fails on every part as a failure inside the collectives does (below).
 *   Per-rank checkpoints: zt_trainer_save first makes the checkpoint's temporary directory
 *   DIR.tmp with a marker file of a random token in it, and probes: the head of the probe
 *   carries the token and the directory's path, each rank of each part checks that its own
 *   view of that path holds the marker with that token and that it may write there, and the
 *   verdicts are exchanged
 *   (all-gathered), so every part learns the result. Where every rank sees it, every rank of
 *   every part writes its own rank-R.safetensors into DIR.tmp at once (per_rank.c's writer,
 *   each file fsynced, renamed into place and its directory fsynced by its writer), then the
 *   ranks exchange their results and files' sizes: one rank's failure (a full disk: ENOSPC) fails
 *   the save on every part with that rank's code, its message naming the file (on its own part
 *   its own message, on the others its file as they name it), nothing changed and the
 *   communicators intact; else rank 0's part writes model.safetensors (the parameters gathered
 *   in pieces, which the other parts follow) and the manifest with every rank's size, fsyncs
 *   DIR.tmp and swaps it into place. A load of a per-rank checkpoint whose layout is this
 *   trainer's (the world and every unit's chunk) probes the same way with the manifest as the
 *   marker (its path and a digest of its bytes: a part sees the checkpoint when its view holds
 *   a manifest of the same bytes), then every rank of every part reads its own file, the
 *   results exchanged (one rank's failure leaves every part's state partly the checkpoint's:
 *   every part fails, -EIO on the parts other than the failed rank's, and the trainers refuse
 *   steps), and stages 1-2 all-gather the parameters. Where some rank does not see the
 *   directory, rank 0's part logs which global ranks (zt_log, warn) and the call goes through
 *   the flat layout instead: a save gathers, a load scatters (from the ranks' files of a
 *   per-rank checkpoint, which rank 0's part reads a piece at a time), as for any checkpoint
 *   whose layout is not the trainer's. A gather or scatter moves a piece of whole units at a
 *   time in unit order, so that a checkpoint's host memory stays
 *   zt_trainer_checkpoint_bytes; get_state moves them in one. Per unit the ranks' chunks are
 *   all-gathered into (a gather) or cut out of (a scatter, broadcast from rank 0) a scratch
 *   buffer that is dead between steps, so the state calls take no memory of their own: stage 1
 *   the unit's region of the padded gradients, stages 2-3 the unit gradient buffer (the gpt
 *   embedding's for unit 0); the step zeroes or overwrites those before it reads them. Stages
 *   1-2 hold every unit's parameters on every rank: a gather reads rank 0's, a scatter
 *   broadcasts the unit straight into every rank's copy.
 * A trainer that runs every rank (local == world, the default) does none of this: its state
 * calls copy each rank's chunks directly, its checkpoints are per rank without a probe (above),
 * and it refuses send / receive. A part without rank 0
 * refuses zt_trainer_save, _load, _export and _get_state (-EINVAL naming the call to make
 * instead). A failure inside a state collective is handled as inside a step: the failing rank
 * aborts the communicators and the trainer refuses further steps and state calls (-EIO).
 *
 * Offload (ZeRO-Offload, and ZeRO-Infinity's parameters, per rank; zt_dp_cfg.optimizer and
 * .params). With optimizer ZT_PLACE_HOST the units from gpu_units on keep the rank's shard of
 * their fp32 masters, AdamW m and v and fp32 gradients in page-locked host memory (the packed
 * layout of those units), and the leading gpu_units units keep theirs on the device as above.
 * A host unit's gradients are reduced on the device as in its stage (stage 1: the all-reduced
 * padded copy; 2-3: reduce-scattered into one of two chunk buffers) and copied to the host on
 * the rank's copy engine (offload/copy_engine.h) behind the collective, while the device goes
 * on; later micro-batches land in a host staging buffer, added unit by unit in the order the
 * device adds them. The backward takes each host unit up a few units behind itself (waits for
 * its copy, adds, takes its sum of squares); the norm is the units' sums added in unit order
 * wherever the gradients are. The host units are updated by the CPU AdamW (offload/cpu_adam.h,
 * a worker pool the part's ranks share; the bf16 compute copy written in the same pass) and
 * the device units by the backend; then each host unit's updated chunk goes to the device and,
 * stages 1-2, is all-gathered as soon as its update is done, while the pool updates the next.
 * Without clipping a host unit's update starts when the backward takes it up, overlapping the
 * rest of the backward; with clipping all wait for the exchanged norm. A gradient that is not
 * finite then stops a rank's updates; if any rank had updated a unit the step fails (-EIO, the
 * trainer refuses further steps), else it is refused as without offload (-ERANGE). On the CPU
 * backend every step is bitwise that of the trainer without offload (cpu_adam is the backend's
 * AdamW bit for bit).
 * Optimizer ZT_PLACE_NVME (ZeRO-Infinity's optimizer): as host, but the host units' masters, m
 * and v of each rank live in its own files (offload/nvme_store.h: O_DIRECT, io_uring) under
 * zt_dp_cfg.nvme_dir, one per unit and kind, each the rank's chunk; the host tier keeps the
 * gradients, two page-locked staging sets of the largest chunk (masters, m, v, the compute
 * copy, which params nvme leaves out) and, with params host, the parameters the gathers read.
 * Each rank moves its files on its own thread through an optimizer-state store of its own
 * (offload/opt_store.h, the single-GPU offloaded step's, over the rank's chunks): a unit's
 * three files are read into a set ahead of its update while the unit above it is updated, and
 * its set is retired (the update waited for, the chunk uploaded on the copy engine or into the
 * host's parameters, the files written behind) when the set is needed for the unit below; the
 * pool runs the updates (the host units' too, through the same store).
 * A failed read or write fails the step (-EIO and the trainer refuses further steps) with the
 * store's message naming the file. The state calls and per-rank checkpoints read a unit's files
 * into a set and write them from it. The files go at close.
 * Host and NVMe together (zt_dp_cfg.host_units, as docs/offload.md's): with optimizer nvme the
 * host_units units right after the device ones keep masters, m and v on the host tier as with
 * optimizer host, and only the units after them have files (and size the sets). Those are the
 * units the backward updates last, whose NVMe reads and writes nothing else would hide.
 * params ZT_PLACE_HOST (zero_stage 3 with optimizer host or nvme): the host units' parameters are not
 * on the device between uses either. Before a host unit is all-gathered, the rank's chunk (fp32
 * and the compute copy) is copied from the host masters into one of two device chunk buffers on
 * the copy engine; the chunk of the unit after it in the walk is copied as soon as this one's
 * gather is queued, so the copy of one unit overlaps the compute of another and each GPU moves
 * only its 1/W share over its own link. The state calls read and write the host tier directly
 * (all ranks here) or through the chunk buffers (a part).
 * params ZT_PLACE_NVME (ZeRO-Infinity's NVMe-resident parameters: zero_stage 3 with optimizer
 * nvme): as params host, but the NVMe units' chunks are read from the rank's master files
 * instead of the host tier, which no longer holds them (4 bytes a parameter of those units
 * less per rank; two page-locked stagings of the largest chunk more); the host_units units keep
 * params host's way. Before an NVMe unit is all-gathered, in the forward and again in the
 * backward (unless a slot still holds it), its chunk is read from its master file into staging
 * u & 1 and copied from there into its chunk buffer on the copy engine: each gather of the walk
 * starts the read of the unit two after it (and of the next, after a device unit), which the
 * next gather waits for and copies behind itself, so that each read and each copy overlap the
 * compute of a unit before theirs; the backward's first two reads start before the loss. The
 * file holds the fp32 masters alone: with bf16 / fp16 the gather casts the compute copy from the
 * chunk on the device (the cast AdamW writes). The update reads and writes the files as
 * optimizer nvme does and has nothing to upload: the write-behind is the next gathers' source.
 * A file is never read while its write is in flight: a unit's update begins after its last
 * gather of the step (the backward walks down, the updates follow it), and every write-behind
 * has landed before the step ends (its sets retired), so the next step's gathers read the
 * updated files. A failed read fails the step as above, naming the file ("params nvme: ...").
 * The state calls and checkpoints move the NVMe units' parameters through their master files.
 * Without NVMe units (host_units all the rest) params nvme is params host.
 *
 * The trainer runs one thread per (local) rank for the life of the trainer; each rank's backend
 * memory is allocated, used and freed on that thread. Precision fp32, bf16 or fp16: every rank
 * scales its loss by the trainer's one loss scaler (loss_scale.h) and the exchanged overflow
 * verdict skips the step on every rank at once (zt_step_result.skipped, the scale backed off),
 * so the scale needs no exchange of its own (with the host tier the updates then wait for the
 * backward, as with clipping); fp16 is refused for a part (its scaler would not survive a
 * resume). A cuda rank's
 * thread makes its device current (zt_backend_bind_thread) before anything else. */
#ifndef ZT_TRAIN_DP_H
#define ZT_TRAIN_DP_H

#include <stddef.h>
#include <stdint.h>

#include "engine/comm/comm.h"
#include "engine/plan/dp_plan.h"
#include "engine/train/offload/offload.h"
#include "engine/train/trainer.h"
#include "offload/nvme_store.h"

typedef struct zt_dp_cfg {
  int world;      /* W ranks, [1, ZT_DP_MAX_WORLD] */
  int zero_stage; /* 1 | 2 | 3 */
  /* This trainer is the part that runs global ranks rank0 .. rank0 + local - 1 of the world,
   * local in [1, world - rank0]; local 0 means all of them (rank0 must then be 0). */
  int rank0, local;
  /* Offload (see the header). optimizer: ZT_PLACE_AUTO or _GPU (0: every unit's shard on the
   * device), _HOST (units gpu_units.. on the host) or _NVME (their masters, m and v in files
   * under nvme_dir); params: AUTO or GPU, HOST with zero_stage 3 and optimizer HOST or NVME
   * (the host units' chunks copied from the host tier before each gather), or NVME with
   * zero_stage 3 and optimizer NVME (the NVMe units' chunks read from their master files). */
  zt_offload_place optimizer, params;
  /* the walk of a step's micro-batches (see the header, "Unit-major"): ZT_ORDER_UNIT with
   * grad_accum > 1 unit-major (at most ZT_UNIT_MAJOR_MICROS_MAX of them, else -EINVAL at the
   * open), anything else micro-major (auto is resolved by the job's planner,
   * engine/plan/dp_plan.h) */
  zt_offload_order order;
  int gpu_units;  /* optimizer HOST / NVME: the leading units kept on the device, [0, the
                     model's units] */
  int host_units; /* optimizer NVME: the units after the device ones whose masters, m and v
                     stay on the host tier (the rest's in files), [0, units - gpu_units];
                     0 with any other optimizer */
  /* optimizer NVME: an existing directory; the trainer makes zt-offload.XXXXXX in it with a
   * directory rank-R per rank, removed at close. Read during the open only. */
  const char *nvme_dir;
} zt_dp_cfg;

/* Step flags (zt_trainer_dp_set_flags): what they mean is the caller's convention, the trainer
 * only ORs them over the ranks. */
#define ZT_DP_FLAG_STOP 1u       /* some part wants every part to stop after this step */
#define ZT_DP_FLAG_CHECKPOINT 2u /* some part wants a checkpoint of this step */

/* What the caller gives each rank; the trainer uses but does not own them (close them after
 * the trainer). The collectives run on the backend's stream (zt_backend_stream) or the
 * communicator's queue (above). */
typedef struct zt_dp_rank {
  zt_backend be; /* the rank's own backend context */
  zt_comm comm;  /* global rank rank0 + i of world W, for ranks[i] */
} zt_dp_rank;

/* 0, or -EINVAL with a message naming the field ("dp.zero_stage must be 1, 2 or 3 (got 4)",
 * "dp.local must be in [0, 3] (dp.world 4 - dp.rank0 1) (got 4)"). */
int zt_dp_cfg_check(const zt_dp_cfg *c, char *err, size_t errlen);

/* zt_trainer_open for the part's ranks (all W by default): ranks[i] for global rank
 * rank0 + i, local entries. -EINVAL for a bad configuration or ranks that do not match it
 * (named), -ENOTSUP for fp16 where it is refused (above), -ENOMEM with the rank and the bytes. Every other trainer call works
 * as without data parallelism (for a part, as the header says); a step whose gradients are not
 * finite returns -ERANGE on every rank and changes nothing, with res still filled (step is the
 * refused step, skipped 1, the flags as on any step) so that no part loses the step's flags;
 * any other failure of a rank aborts the communicators and leaves the trainer refusing steps
 * (-EIO). */
int zt_trainer_open_dp(zt_trainer **t, const zt_model_cfg *mc, const zt_train_cfg *tc,
                       const zt_dp_cfg *dpc, const zt_dp_rank *ranks, char *err,
                       size_t errlen);

/* The backend bytes every rank of zt_trainer_open_dp with this configuration holds (the ranks
 * hold the same), computed without opening anything (engine/plan/dp_plan.h's sums, which the
 * open allocates), for admission: equal to
 * zt_trainer_dp_rank_bytes after the open on backends with op table `ops`
 * (zt_backend_ops_of). SIZE_MAX for a configuration the open refuses. */
size_t zt_dp_estimate_rank_bytes(const zt_model_cfg *mc, const zt_train_cfg *tc,
                                 const zt_dp_cfg *dpc, const zt_ops *ops);
/* The host bytes (page-locked, whole pages) every rank of such a trainer holds for its host
 * units: 0 without offload; SIZE_MAX for a configuration the open refuses. */
size_t zt_dp_estimate_host_bytes(const zt_model_cfg *mc, const zt_train_cfg *tc,
                                 const zt_dp_cfg *dpc);

/* The NVMe bytes (its files in the store's whole blocks) every rank of such a trainer reserves
 * under nvme_dir: 0 without optimizer nvme; UINT64_MAX for a configuration the open refuses. */
uint64_t zt_dp_estimate_nvme_bytes(const zt_model_cfg *mc, const zt_train_cfg *tc,
                                   const zt_dp_cfg *dpc);

/* Backend bytes global rank `rank` holds (zt_trainer_backend_bytes is the sum over the part's
 * ranks); 0 for a rank this trainer does not run or a trainer without data parallelism. */
size_t zt_trainer_dp_rank_bytes(const zt_trainer *t, int rank);

/* Host-tier bytes global rank `rank` holds (page-locked, whole pages): what
 * zt_dp_estimate_host_bytes computes; 0 without offload or for a rank this trainer does not
 * run. */
size_t zt_trainer_dp_host_bytes(const zt_trainer *t, int rank);

/* The NVMe bytes global rank `rank` reserved (what zt_dp_estimate_nvme_bytes computes) and its
 * store's counters; 0 / -ENOENT without optimizer nvme or for a rank this trainer does not run.
 * Between calls only (a rank's store is its thread's while a call runs). */
uint64_t zt_trainer_dp_nvme_bytes(const zt_trainer *t, int rank);
int zt_trainer_dp_nvme_stats(const zt_trainer *t, int rank, zt_nvme_stats *out);

/* The flags this part contributes to its next zt_trainer_step that runs (replacing any set
 * before); cleared once that step has run, whatever its result. No-op for a trainer without data
 * parallelism (whose zt_step_result.flags are 0). */
void zt_trainer_dp_set_flags(zt_trainer *t, unsigned flags);

/* A part without global rank 0, its side of the state collectives (see the header): send_state
 * while the rank-0 part runs zt_trainer_save, zt_trainer_export or zt_trainer_get_state;
 * receive_state while it runs zt_trainer_load, then the trainer's step and AdamW step become
 * `step` and `adam_step` (trainer.json's, which the caller passes on; 0 <= adam_step <= step).
 * Each returns once the rank-0 part's call has made its last state collective (its last
 * piece, or a load's ranks' files). -EINVAL with a message on a trainer that holds rank 0 or has
 * no data parallelism, or for a call that does not match the rank-0 part's (which then fails
 * too: the communicators are aborted, as for -EIO); -ECANCELED when the rank-0 part's call
 * failed other than in the collectives (nothing changed on either side), -EIO when its load did
 * so after some of its pieces; for a per-rank checkpoint, the code of a rank whose file failed
 * (a save: nothing changed; a load: -EIO here unless the rank is this part's, the trainers
 * refusing steps); -EIO and other failures as for a step. */
int zt_trainer_dp_send_state(zt_trainer *t, char *err, size_t errlen);
int zt_trainer_dp_receive_state(zt_trainer *t, int step, int adam_step, char *err,
                                size_t errlen);

#endif
