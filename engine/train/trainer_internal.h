/* The trainer's state, shared by trainer.c, step.c (the step's recipe), the strategies
 * (offload/, dp/) and checkpoint/ (save/load). */
#ifndef ZT_TRAIN_TRAINER_INTERNAL_H
#define ZT_TRAIN_TRAINER_INTERNAL_H

#include "engine/train/checkpoint/shard_io.h"
#include "engine/train/loss_scale.h"
#include "engine/train/step.h"
#include "engine/train/trainer.h"
#include "offload/shard.h"

/* A step path other than the all-on-the-backend one (the offloaded step, built on offload/ and
 * linked only by programs that use it, engine/train/offload/offload.h). Checkpoints and
 * zt_trainer_get_state reach a path's state through read_state / write_state, a range of whole
 * units at a time (checkpoint/state.c). */
typedef struct zt__train_path {
  int (*step)(zt_trainer *t, const zt_batch *tokens, zt_step_result *res, char *err,
              size_t errlen);
  /* zt_trainer_eval_batch */
  int (*eval)(zt_trainer *t, const zt_batch *b, double *loss_sum, int64_t *counted, char *err,
              size_t errlen);
  /* The state of units [u0, u1) in the flat layout, copied out (any pointer may be NULL) or in
   * (a checkpoint loaded), wherever the path keeps it. The buffers hold that range alone:
   * element 0 is the first parameter of unit u0. A checkpoint call makes a sequence of these,
   * over consecutive ranges from unit 0 to the last unit, all reads or all writes; a path whose
   * state calls are collectives (a data-parallel part, dp.h) has its other parts follow that
   * sequence, which ends with the range that holds the last unit. A write that fails may have
   * written part of its range: the path refuses steps until a later write succeeds (and
   * zt_trainer_load refuses them while only some of its ranges are in, part_loaded). */
  int (*read_state)(zt_trainer *t, int u0, int u1, float *params, float *m, float *v, char *err,
                    size_t errlen);
  int (*write_state)(zt_trainer *t, int u0, int u1, const float *params, const float *m,
                     const float *v, char *err, size_t errlen);
  /* A checkpoint call (save, load, export) failed before its sequence of read_state /
   * write_state calls ended, and not inside one of them: a path whose state calls are
   * collectives tells the other parts, which wait for the next range. NULL where nothing
   * waits. */
  void (*abandon_state)(zt_trainer *t);
  /* Per-rank checkpoints: a data-parallel trainer that runs every rank of its world, or the
   * part of one that holds rank 0 (*part 1; any pointer may be NULL), gives its shard table and
   * zero stage (NULL for any other trainer, whose checkpoints are flat, or for a part without
   * rank 0, which refuses them; NULL functions: none). save_shards has every rank put its
   * chunks through io at once; load_shards has every rank get its chunks, then (stages 1-2)
   * every rank's copy of the parameters all-gathered. A part does either only when probe said
   * every part sees the checkpoint's directory, as a state collective: every part's ranks
   * move their own files at once and exchange their results, so that a rank's failure fails the
   * call on every part (a save: nothing changed, the communicators intact; a load: the trainer
   * refuses steps and state calls, as after a failed step). A load_shards that fails may have
   * written part of the state (the caller refuses steps, part_loaded); one that fails in the
   * all-gather leaves the trainer refusing steps and state calls as a failed step does. */
  const zt_shard_table *(*shards)(const zt_trainer *t, int *zero_stage, int *part);
  int (*save_shards)(zt_trainer *t, const zt__shard_io *io, char *err, size_t errlen);
  int (*load_shards)(zt_trainer *t, const zt__shard_io *io, char *err, size_t errlen);
  /* A part holding rank 0: whether every part sees the directory dir as this process does, a
   * state collective the other parts follow (dp.h): each rank of each part checks that dir
   * holds `token` (zt__ckpt_probe_sees; save: the marker file a save's temporary directory
   * holds, load: the manifest's digest) and the verdicts are exchanged. 1: every rank sees it;
   * 0: some do not (the path logs which; the call then goes through the flat layout); or a
   * negative errno, a failure of the collectives (the trainer refuses what follows). */
  int (*probe)(zt_trainer *t, const char *dir, int save, const char *token, char *err,
               size_t errlen);
  size_t (*backend_bytes)(const zt_trainer *t);
  /* frees the path's state and the buffers it owns (params, grads, m, v) */
  void (*close)(zt_trainer *t);
} zt__train_path;

struct zt_trainer {
  zt_model *model;
  zt_train_cfg tc;
  zt_backend be;
  float *params, *grads;          /* backend buffers in the flat layout */
  void *m, *v;                    /* AdamW's, in tc.state_dtype, in the flat layout */
  void *params_lp;                /* the bf16/fp16 compute copy; NULL in fp32 */
  zt_acts *acts;
  int32_t *h_tok, *h_tgt;         /* host staging for one micro-batch's inputs and targets */
  int step;                       /* steps completed, skipped ones included */
  int adam_step;                  /* AdamW's t of the last update (== step unless fp16 skipped) */
  zt_loss_scaler scaler;          /* fp16 only */
  const zt__train_path *path;     /* NULL: the step runs on the backend alone */
  void *path_state;
  /* a load failed after writing part of the state: steps are refused until a load succeeds */
  int part_loaded;
  int eval_step;                  /* zt_trainer_note_eval's; 0 none */
  double eval_loss;
};

/* The initial parameters (cfg->init_path, or the seeded init) into a host flat buffer. */
int zt__trainer_init_params(const zt_model *m, float *host, char *err, size_t errlen);
/* The same a range of whole units at a time, for a model larger than memory: open checks the
 * init file (its header; nothing when the init is seeded), read fills host with the parameters of
 * units [u0, u1) in their range of the flat layout (host[0] is unit u0's first), the bits
 * zt__trainer_init_params gives there, in any order; close after a failed open too. */
typedef struct zt__trainer_init {
  const zt_model *m;
  zt_model_file *file;  /* NULL: the seeded init */
  struct zt_cpu_pool *pool; /* the seeded init's threads (its bits do not depend on them) */
  int zeros;                /* cfg.init_loaded: zeros, a checkpoint comes over them */
} zt__trainer_init;
int zt__trainer_init_open(zt__trainer_init *in, const zt_model *m, char *err, size_t errlen);
/* The same with the seeded init on `threads` threads (0: every core). */
int zt__trainer_init_open_threads(zt__trainer_init *in, const zt_model *m, int threads, char *err,
                                  size_t errlen);
int zt__trainer_init_read(const zt__trainer_init *in, int u0, int u1, float *host, char *err,
                          size_t errlen);
void zt__trainer_init_close(zt__trainer_init *in);
/* Pieces of the state: runs of whole units in unit order of at most cap parameters, cap the
 * largest unit's (which always fits alone); piece_end is the end of the piece that starts at u0.
 * The units tile the flat layout in order, so a piece is one range of it. */
size_t zt__trainer_piece_cap(const zt_model *m);
int zt__trainer_piece_end(const zt_model *m, int u0, size_t cap);
/* The tensors of units [u0, u1): [first, end). */
void zt__trainer_piece_tensors(const zt_model *m, int u0, int u1, int *first, int *end);
/* The shard table of a data-parallel trainer of model m and `world` ranks
 * (engine/plan/dp_plan.h's zt_dp_plan_shard_table): the checkpoint estimate
 * (zt_checkpoint_estimate_bytes_dp) sizes a per-rank checkpoint's stagings from it. 0, or
 * zt_shard_table_build's error. */
int zt__trainer_shard_table(const zt_model *m, int world, zt_shard_table **tab);

#endif
