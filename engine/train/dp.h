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
 * 2. as 1, but gradients are sharded too: each unit's backward writes into one full-size
 *    temporary (reused by every unit; the gpt embedding has its own, held from the head, which
 *    adds the tied wte's gradient, to unit 0) that is reduce-scattered as soon as the unit is
 *    done, every micro-batch, into the rank's gradient shard.
 * 3. as 2, but parameters are sharded too: a unit is all-gathered into one of two slots before
 *    its forward and its backward. The slots alternate by unit, so the gather of the next unit
 *    is issued before this unit computes (on one stream that orders it, a communication stream
 *    would overlap it) and the last two units of the forward are still there for the start of
 *    the backward. The gpt embedding stays gathered through the step in a slot of its own,
 *    because the head reads the tied wte (FSDP keeps such a root unit gathered too).
 * Per-unit collectives are issued in the same order by every rank whatever its data (a rank
 * whose micro-batch is padding alone still takes part, with zero gradients), as the
 * collectives require.
 *
 * Checkpoints and zt_trainer_get_state gather the shards into the flat layout, and loading
 * scatters the flat layout into this trainer's shards, so checkpoints are interchangeable
 * between world sizes, stages and the trainer without data parallelism.
 *
 * The trainer runs one thread per rank for the life of the trainer; each rank's backend
 * memory is allocated, used and freed on that thread. Precision fp32 or bf16 (fp16's loss
 * scaling is not shared between ranks yet: refused). A cuda rank's thread makes its device
 * current (zt_backend_bind_thread) before anything else. */
#ifndef ZT_TRAIN_DP_H
#define ZT_TRAIN_DP_H

#include <stddef.h>

#include "engine/comm/comm.h"
#include "engine/train/trainer.h"

/* The most ranks one trainer runs: a rank per device of a machine (ZT_MAX_DEVICES). */
#define ZT_DP_MAX_WORLD 64

typedef struct zt_dp_cfg {
  int world;      /* W ranks, [1, ZT_DP_MAX_WORLD] */
  int zero_stage; /* 1 | 2 | 3 */
} zt_dp_cfg;

/* What the caller gives each rank; the trainer uses but does not own them (close them after
 * the trainer). The collectives run on the backend's stream (zt_backend_stream). */
typedef struct zt_dp_rank {
  zt_backend be; /* the rank's own backend context */
  zt_comm comm;  /* rank r of world W */
} zt_dp_rank;

/* 0, or -EINVAL with a message naming the field ("dp.zero_stage must be 1, 2 or 3 (got 4)"). */
int zt_dp_cfg_check(const zt_dp_cfg *c, char *err, size_t errlen);

/* zt_trainer_open for W ranks: ranks[r] for rank r. -EINVAL for a bad configuration or ranks
 * that do not match it (named), -ENOTSUP for fp16, -ENOMEM with the rank and the bytes. Every
 * other trainer call works as without data parallelism; a step whose gradients are not finite
 * returns -ERANGE on every rank and changes nothing; any other failure of a rank aborts the
 * communicators and leaves the trainer refusing steps (-EIO). */
int zt_trainer_open_dp(zt_trainer **t, const zt_model_cfg *mc, const zt_train_cfg *tc,
                       const zt_dp_cfg *dpc, const zt_dp_rank *ranks, char *err,
                       size_t errlen);

/* The backend bytes every rank of zt_trainer_open_dp with this configuration holds (the ranks
 * hold the same), computed without opening anything, for admission: equal to
 * zt_trainer_dp_rank_bytes after the open on backends with op table `ops`
 * (zt_backend_ops_of). SIZE_MAX for a configuration the open refuses. */
size_t zt_dp_estimate_rank_bytes(const zt_model_cfg *mc, const zt_train_cfg *tc,
                                 const zt_dp_cfg *dpc, const zt_ops *ops);

/* Backend bytes rank `rank` holds (zt_trainer_backend_bytes is the sum over the ranks); 0 for a
 * rank out of range or a trainer without data parallelism. */
size_t zt_trainer_dp_rank_bytes(const zt_trainer *t, int rank);

#endif
