/* The training loop of one job on one backend: parameters, gradients and AdamW state, the
 * learning-rate schedule, gradient accumulation and clipping, checkpoints. The daemon's runner
 * drives it one optimizer step at a time. */
#ifndef ZT_TRAINER_H
#define ZT_TRAINER_H

#include <stddef.h>
#include <stdint.h>
#include "engine/kernels/ops.h"
#include "engine/model/model.h"
#include "engine/plan/recipe.h"

/* The learning rate at optimizer step s (1-based), as the schedule gives it. */
float zt_train_lr(const zt_train_cfg *c, int step);

typedef struct zt_step_result {
  int step;             /* the optimizer step just completed (1-based) */
  double loss;          /* the mean over the step's counted targets, every micro-batch's (with
                           as many in each: the mean of their means, its bits) */
  double grad_norm;     /* global L2 norm before clipping */
  float lr;
  int64_t tokens;       /* tokens processed in this step */
  int skipped;          /* fp16: 1 when the gradients overflowed and nothing was updated */
  float loss_scale;     /* fp16: the loss scale after this step's update; 1 otherwise */
  unsigned flags;       /* data parallelism: the OR over the world's ranks of the step flags
                           contributed to this step (engine/train/dp/dp.h); 0 otherwise */
} zt_step_result;

typedef struct zt_trainer zt_trainer;

/* Exactly the bytes zt_trainer_open would allocate on a backend with op table `ops` for this
 * config (params, grads, AdamW m and v, the bf16/fp16 compute copy, activations of one
 * micro-batch in tc->precision with tc->ckpt_every), computed without allocating: the daemon
 * refuses a job that cannot fit with this number. `ops` sizes the attention's saved state, which
 * differs by backend (the CPU keeps (B, NH, T, T) probabilities, CUDA's flash path a few rows);
 * zt_backend_ops_of() gives a table without opening the backend. SIZE_MAX for a configuration
 * that does not pass zt_model_cfg_check / zt_train_cfg_check. A held-out evaluation
 * (zt_trainer_eval_batch) runs in these buffers and takes none of its own. */
size_t zt_trainer_estimate_bytes(const zt_model_cfg *mc, const zt_train_cfg *tc,
                                 const zt_ops *ops);

/* Allocates everything the step needs on the backend (nothing is allocated per step) and
 * initialises the parameters (seed or cfg->init_path). */
int zt_trainer_open(zt_trainer **t, const zt_model_cfg *mc, const zt_train_cfg *tc,
                    const zt_backend *be, char *err, size_t errlen);
void zt_trainer_close(zt_trainer *t);

const zt_model *zt_trainer_model(const zt_trainer *t);
/* Steps completed (each one a call of zt_trainer_step that returned 0; with fp16 this includes
 * skipped steps, which still advance the learning-rate schedule, as a scheduler stepped every
 * iteration does in PyTorch, but not AdamW's own step count). */
int zt_trainer_step_count(const zt_trainer *t);
/* Bytes the trainer holds on the backend (params, grads, optimizer state, activations). */
size_t zt_trainer_backend_bytes(const zt_trainer *t);

/* Copies the parameters and the AdamW moments to the host, in the flat layout (internal shapes);
 * any pointer may be NULL. For tests and tools that compare states (the caller holds the whole
 * state; checkpoints do not, zt_trainer_checkpoint_bytes). */
int zt_trainer_get_state(zt_trainer *t, float *params, float *exp_avg, float *exp_avg_sq);

/* Tokens one micro-batch needs: B * (T + 1) (inputs plus the next-token targets). */
size_t zt_trainer_micro_tokens(const zt_trainer *t);
/* Runs one optimizer step over grad_accum micro-batches; tokens holds grad_accum micro-batches
 * back to back, each B rows of T+1 tokens. Token ids outside [0, vocab) give -EINVAL. Gradients
 * with inf/nan give -ERANGE and change nothing (res, when given, describes the refused step:
 * skipped, its loss, norm and flags), except in fp16, where the step is skipped as GradScaler
 * skips it (res->skipped, the loss scale halved) and 0 is returned. The step's recipe:
 * engine/train/step.h. */
int zt_trainer_step(zt_trainer *t, const int32_t *tokens, zt_step_result *res, char *err,
                    size_t errlen);
/* A step's batch as the trainer takes it, for all of its micro-batches back to back: either
 * tokens (zt_trainer_step's rows of T + 1) alone, or three planes of B * T per micro-batch:
 * inputs (-1: padding, read as token 0), targets (-1: not counted) and positions
 * (document-local: a row starts at 0 and each position is 0, a document's start, or the one
 * before plus 1; engine/model/model.h's contract). */
typedef struct zt_batch {
  const int32_t *tokens;
  const int32_t *inputs, *targets, *positions;
} zt_batch;
/* zt_trainer_step over either form; a position that breaks the contract gives -EINVAL naming
 * the micro-batch, row and index. */
int zt_trainer_step_batch(zt_trainer *t, const zt_batch *b, zt_step_result *res, char *err,
                          size_t errlen);

/* Held-out evaluation: the loss of a batch of zt_trainer_step_batch's shape (its world *
 * grad_accum micro-batches, in either form) with the current parameters, forward only:
 * *loss_sum gets the sum of the per-token losses over its counted targets, *counted their
 * number (the mean is their quotient, training's normaliser). The ops are the step's forward
 * and loss, so the loss of rows a step trains on is that step's forward's, bit for bit. No
 * gradient, optimizer state or step count is touched and nothing is allocated (the step's
 * activations and host staging are used): training after an evaluation goes on bitwise as
 * without it, except with offload.delayed_update, whose pending update lands first as before
 * a checkpoint (docs/offload.md "Delayed update"). Data parallelism: each rank walks its
 * micro-batches (padding too, for the collectives), the world's sums added in micro-batch
 * order, as one trainer of the same parameters adds them; -ENOTSUP for a part of a world
 * (dp.h, "Parts": its other parts would have to walk with it). Tokens out of range: -EINVAL as
 * a step's. */
int zt_trainer_eval_batch(zt_trainer *t, const zt_batch *b, double *loss_sum, int64_t *counted,
                          char *err, size_t errlen);
/* The newest evaluation's mean loss after step `step`, for the checkpoints' record (trainer.json
 * or the manifest: "eval": {"step", "loss"}, written while step <= the trainer's step; a load
 * takes the checkpoint's back). */
void zt_trainer_note_eval(zt_trainer *t, int step, double loss);

/* Checkpoint directory: model.safetensors (parameters under the documented names),
 * optimizer.safetensors (AdamW m and v, same names), trainer.json (step, AdamW's step, the fp16
 * loss scaler's state, the configuration). A data-parallel trainer that runs every rank of its
 * world (dp.h) writes the per-rank layout instead: model.safetensors, rank-R.safetensors per
 * rank R (its chunk of each unit's fp32 parameters, m and v: "<unit>.params", ".exp_avg",
 * ".exp_avg_sq", 1-D), written by all ranks at once, and manifest.json (format, layout
 * "per-rank", world, zero_stage, align, units [{name, offset, numel, chunk}], ranks [{file,
 * bytes}], model_file, and trainer.json's fields); so does the part of a world that holds rank
 * 0 where every part sees dir (dp.h, "Parts"; else the flat layout).
 * Written into a temp directory, fsynced, then renamed into place; a save that fails removes the
 * temp directory and leaves dir as it was. The state moves between the trainer and the files a
 * piece of whole units at a time (zt_trainer_checkpoint_bytes). The record (trainer.json, or the
 * manifest) holds the checksum of every tensor of every file ("checksum": "xxh3-64",
 * "checksums": {file: {tensor: 16 hex digits}}). */
int zt_trainer_save(zt_trainer *t, const char *dir, char *err, size_t errlen);
/* Restores parameters, optimizer state and step; continues bit-identically. Either layout, into
 * any trainer (a per-rank checkpoint into the same world: each rank reads its own file, a
 * data-parallel part's ranks where every part sees the checkpoint (dp.h); else re-sharded
 * through the flat layout). The files' tensors (names, shapes, dtypes; nothing
 * missing or extra), a manifest's fields (-EINVAL naming the field) and its ranks' files (one
 * missing: -ENOENT naming it; of another size than the manifest's: -EINVAL) are checked before
 * any of the state is written; a load that fails after that (a read error of the files, a
 * failure of the step path) leaves the trainer refusing steps (-EIO) until a load succeeds.
 * Each tensor is checked against its recorded checksum as it is read: a mismatch fails the load
 * (-EBADMSG naming the file, the tensor and the word checksum); a checkpoint without checksums
 * (written before they were recorded) loads with a warning in the log. */
int zt_trainer_load(zt_trainer *t, const char *dir, char *err, size_t errlen);
/* A checkpoint directory's files against the checksums recorded in it (trainer.json or the
 * manifest: every tensor of every file is summed when written, and zt_trainer_load checks each
 * as it reads it): only one file of it (e.g. "model.safetensors", what ztd's export serves), or
 * all of them (only NULL). Reads all of their data. 0 when they match; 1 when the checkpoint has
 * no checksums (written before they were recorded); -EBADMSG naming the file, the tensor and
 * the word checksum where one differs; -errno naming the file when one cannot be read. */
int zt_checkpoint_verify(const char *dir, const char *only, char *err, size_t errlen);
/* Parameters alone as one safetensors file (fp32), atomically. */
int zt_trainer_export(zt_trainer *t, const char *path, char *err, size_t errlen);

/* The host memory zt_trainer_save, _load or _export takes at most beyond the trainer's own (its
 * backend buffers, an offloaded trainer's host tier and files): the state moves in pieces of
 * whole units of at most the largest unit's parameters, through one staging of their
 * parameters, m and v (3 x 4 bytes a parameter of the largest unit); a load reads the files
 * through the safetensors reader's chunk (ZT_ST_CHUNK_BYTES, 1 MiB); the files' headers are
 * built from the model's tensors (an allowance of 2 KB a tensor of each file). It does not grow
 * with the model's depth but for the headers: a 10.3 B GPT (d_model 5120, 32 layers), whose
 * flat state is 124 GB, takes 3.8 GB (a block's 315 M parameters). A data-parallel part's
 * state calls move each piece through device scratch buffers the trainer already holds
 * (dp.h). A per-rank checkpoint's ranks, all at once, each take a staging of their chunk of the
 * largest unit (3 x 4 bytes an element), the reader's chunk and their file's header: the larger
 * of that and the above. */
size_t zt_trainer_checkpoint_bytes(const zt_trainer *t);
/* The same for a model configuration, without a trainer (job admission): of a trainer whose
 * checkpoints are flat (zt_trainer_open, an offloaded one); _dp of a data-parallel trainer of
 * a world of `world` ranks that runs every rank (zt_trainer_open_dp with local == world) or is
 * the part holding rank 0, whose checkpoints are per rank, at any stage and placement (it
 * bounds another part's too: its ranks' stagings are some of the world's). Equal to
 * zt_trainer_checkpoint_bytes of such a trainer once opened; SIZE_MAX for a configuration that
 * does not pass zt_model_cfg_check or a world outside [1, ZT_DP_MAX_WORLD]. */
size_t zt_checkpoint_estimate_bytes(const zt_model_cfg *mc);
size_t zt_checkpoint_estimate_bytes_dp(const zt_model_cfg *mc, int world);

#endif
