/* The data-parallel trainer's internals (engine/train/dp/dp.h), shared by its files. Each file
 * calls only those listed before it, which know nothing of it:
 * threads.c: the rank threads, a command run on every rank here, a rank's failure;
 * offload.c: a rank's host tier and NVMe files in the step: where a unit's state is, the chunks
 *   staged for gathers (params host / nvme), the host units' updates through the rank's
 *   optimizer-state store (offload/opt_store.h) and its retire's hooks;
 * step.c:    the step's strategy (engine/train/step.h): the walk over the units with its
 *   collectives (the communicator's queue), the exchange, the update, and the path's step;
 * state.c:   the state between steps with every rank here: the flat layout, per-rank files;
 * parts.c:   a part's state calls as collectives (the probe, every part's ranks' files), the
 *   path's state entries, send / receive and the step flags;
 * ranks.c:   the world and every rank's buffers as the plan lists them (engine/plan/dp_plan.h,
 *   whose sums the estimates are), the open and the close, the path table (which parts.c also
 *   compares a trainer's path with) and the accessors.
 * Here: the trainer's and each rank's state, the commands, and each file's functions that the
 * files listed after it call. */
#ifndef ZT_TRAIN_DP_INTERNAL_H
#define ZT_TRAIN_DP_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/plan/dp_plan.h"
#include "engine/train/dp/dp.h"
#include "engine/train/trainer_internal.h"
#include "offload/copy_engine.h"
#include "offload/cpu_adam.h"
#include "offload/cpu_pool.h"
#include "offload/host_arena.h"
#include "offload/nvme_store.h"
#include "offload/opt_store.h"
#include "offload/shard.h"

/* A part's state calls: a gather or scatter of a piece of units, rank 0's part giving up its
 * call, and a per-rank checkpoint's: the probe of its directory, every rank's file written or
 * read (dp.h). */
enum { ST_GATHER = 1, ST_SCATTER, ST_ABANDON, ST_PROBE, ST_SHARDS_OUT, ST_SHARDS_IN };

/* A rank's record in the exchange after the backward: its sum of squares, non-finite flag, its
 * part's step flags (an unsigned int: exact in a double) and the host units its AdamW updated
 * during the backward, then for each of its micro-batches the mean loss and whether it
 * counted. */
#define X_SUMSQ 0
#define X_NONFINITE 1
#define X_FLAGS 2
#define X_UPDATED 3
#define X_MICRO 4
_Static_assert(X_MICRO == ZT_DP_XCHG_SCALARS, "the plan sizes the exchange records");

struct dp_state;
struct zt__dp_cmd;

typedef struct dp_rank_state {
  struct dp_state *s;
  int r;                    /* the global rank */
  /* the rank as a trainer of its own for the shared helpers (zt__trainer_stage_micro): the
   * model (shared, read only), the config, its backend, activations and host staging */
  zt_trainer view;
  zt_comm comm;
  void *stream;
  /* unit-major (plan.unit_major): each micro-batch's activations, macts[0] the view's */
  zt_acts **macts;
  /* the index of a unit's last gradient reduction of the step: grad_accum - 1, or 0 where the
   * backward is unit-major (one reduction of the summed micro-batches) */
  int red_last;
  pthread_t thread;
  /* backend memory; see dp.h for what each stage keeps */
  float *params;            /* stages 1-2: the padded layout; 3: the packed shard */
  void *params_lp;          /* the bf16 compute copy, same layout; NULL in fp32 */
  float *grads;             /* stage 1: the padded layout; 2-3: the packed shard */
  float *m, *v;             /* the packed shard */
  float *gunit[2], *gembed; /* 2-3: a unit's gradients (padded), alternating by unit so that
                               one is reduced while the next unit's backward fills the other;
                               gpt: the embedding's */
  float *gscratch;          /* 2-3: a reduce-scattered chunk of a later micro-batch */
  float *pslot[2];          /* 3: gathered units */
  void *lpslot[2];
  float *pembed;            /* 3, gpt: the gathered embedding */
  void *lpembed;
  double *xchg;             /* W exchange records */
  double *h_xchg;           /* host copy of them */
  /* the host tier (optimizer host, dp.h): units ng.. in the packed layout from dev_packed */
  zt_host_arena *host;
  zt_copy_engine *copy;
  zt_backend hbe;           /* math on the host tier: the rank's own backend on the cpu, a cpu
                               backend of its own beside a GPU */
  int own_hbe;
  float *hm, *hmom, *hvar, *hgrad; /* masters, m, v, gradients (optimizer nvme: the gradients,
                                      the host units' masters, m and v (host_units), and with
                                      params host hm, every unit's parameters the gathers read;
                                      params nvme: the host units' alone) */
  float *hstage;            /* stages 2-3 with grad_accum > 1: a later micro-batch's gradients */
  uint16_t *hlp;            /* bf16 / fp16: the compute copy the AdamW writes, beside hm */
  /* The host units' optimizer-state store (offload/opt_store.h): their AdamW on the pool, a run
   * a call (runs), and with optimizer nvme the NVMe units' files, a file per unit and kind in
   * the rank's zt_nvme_store (its directory nvdir; params nvme reads the master files through
   * it too), read ahead into two staging sets in the host tier (unit u's in sets[u & 1]: one
   * updated while the next is read ahead; the state calls use set 0 between steps) */
  zt_opt_store *opt;
  zt_nvme_store *store;
  zt_opt_set sets[2];
  const char *hook_what;    /* the store's hooks' first failure not yet reported: what failed */
  int64_t up_tick;          /* the H2D ticket of the last chunk uploaded from a set */
  uint64_t nvme_bytes;      /* the files' whole blocks */
  char nvdir[ZT_PATH_MAX + 64]; /* its directory rank-R; "" none */
  float *gout[2];           /* device chunks: a host unit's reduce-scattered gradients (stages
                               2-3, alternating by unit) and the state calls' uploads ([0]) */
  int64_t gout_tick[2];     /* the D2H ticket that last read each */
  float *pchunk[2];         /* params host / nvme: a host unit's chunk staged for its gather */
  void *lpchunk[2];
  int chunk_unit[2];        /* the unit staged in each, -1 none */
  int64_t chunk_tick[2], h2d_last; /* copy tickets (h2d_last: the last from hm); 0 none */
  /* params nvme: two page-locked stagings of an NVMe unit's parameter chunk, read from its
   * master file ahead of the walk (unit u's into pstage[u & 1]) and copied from there into
   * chunk buffer u & 1 */
  float *pstage[2];
  int pstage_unit[2];       /* the unit read or being read into each, -1 none */
  int pstage_req[2];        /* the read's request while not waited for, -1 none */
  int64_t pstage_tick[2];   /* the H2D ticket that last read each; 0 none */
  int dir;                  /* the walk: 1 forward, -1 backward */
  zt_opt_run *runs;         /* the AdamW calls: the rank's chunk of each unit cut where the
                               decay flag changes, from the chunk's element 0 */
  int *first_run;           /* unit u's: runs[first_run[u] .. first_run[u + 1]) */
  int64_t *unit_tick;       /* per unit: the D2H ticket of its gradients this micro-batch */
  double *usumsq;           /* per host unit: its sum of squares, taken up in the backward */
  char *began;              /* per unit: its host update began this step */
  int take_up;              /* the next unit (walking down) the backward takes up */
  int updated, nonfinite;   /* host units updated during the backward; one was not finite */
  int slot_unit[2];         /* 3: the unit in each slot, -1 none */
  int embed_gathered;
  /* The communicator's queue (comm.h): the tickets of the collectives that overlap the compute
   * (0: none pending, or run on the compute stream, which orders them): the last reduction
   * that read each unit gradient buffer and the embedding's, each slot's and the embedding's
   * gather (3), each unit's gather of its updated parameters (1-2, read by the next step);
   * the latest ticket the compute waited for, which covers every earlier one (the queue runs
   * in order). A later micro-batch's reduced chunk is added to the shard one unit late
   * (add_unit, -1 none), so that its reduction overlaps the next unit's backward. */
  long long gunit_tick[2], gembed_tick, slot_tick[2], embed_tick, *gather_tick, q_waited;
  long long add_tick;
  int add_unit;
  size_t bytes;             /* backend bytes held */
  int rc;
  /* cmd_state: the call failed alike on every rank without a failure of the collectives, the
   * communicators intact (rank 0's part gave up its call; a rank's file of a per-rank save
   * failed, which every rank learned from the exchange) */
  int abandoned;
  int got_op;               /* cmd_state: the call rank 0's part said (ST_*) */
  int piece[2];             /* cmd_state: the units [u0, u1) rank 0's part said it moves */
  int probe_all;            /* ST_PROBE: every rank of every part saw the directory */
  char *blob;               /* ST_PROBE: the token and the directory (rank 0's) */
  char err[512];            /* room for a checkpoint file's path */
  /* the step: the gpt embedding's parameters as the forward took them (the head reads them in
   * the backward too), and the walk's outcome (engine/train/step.h), the same on every rank */
  const float *embed_p;
  const void *embed_lp;
  zt__step_out out;
  /* an evaluation's outcome (zt__dp_eval): the world's loss sum and counted targets */
  double eval_sum;
  int64_t eval_n;
} dp_rank_state;

typedef struct dp_state {
  zt_dp_cfg dc;
  zt_dp_plan plan;          /* the shard table, the units' placement, every buffer's bytes */
  int nl;                   /* the part's ranks: global dc.rank0 .. dc.rank0 + nl - 1 */
  dp_rank_state *ranks;     /* nl, in rank order */
  char nvme_dir[ZT_PATH_MAX + 32]; /* the trainer's zt-offload.XXXXXX under dc.nvme_dir */
  zt_cpu_pool *pool;        /* the host units' AdamW, shared by the part's ranks */
  int n_threads;            /* rank threads started */
  pthread_mutex_t mu;
  pthread_cond_t cmd_cv, done_cv;
  const struct zt__dp_cmd *cmd;
  uint64_t gen;
  int done;
  /* the command's arguments */
  zt__step_args args;       /* a step's, as the recipe set them (engine/train/step.h) */
  float *out[3];            /* cmd_read, a gather: params, m, v (any NULL) */
  const float *in[3];       /* cmd_write, a scatter */
  int u0, u1;               /* the units out / in hold (from unit u0's first parameter) */
  /* cmd_state: this part's call (rank 0's part: ST_*; the others: ST_GATHER for send,
   * ST_SCATTER for receive); rank 0: the gather's tensors or whether a probe is a save's */
  int op, mask;
  const char *blob;         /* rank 0's ST_PROBE: the token and the directory, blob_len bytes */
  size_t blob_len;
  /* cmd_shards_out / _in, ST_SHARDS_OUT / _IN: the checkpoint's files. A part without rank 0
   * opens its ranks' own after a probe every part passed (files, fio; io NULL with io_rc and
   * io_err when that failed, which its ranks then report in the call) */
  const zt__shard_io *io;
  zt__rank_files *files;
  zt__shard_io fio;
  int io_rc;
  char io_err[512];
  /* a part's sequence of state calls (trainer_internal.h): its op (ST_GATHER, ST_SCATTER) and
   * the units moved so far (0: none open) */
  int seq_op, seq_next;
  unsigned flags;           /* this part's flags for its next step */
  int broken;               /* a rank failed mid-step and aborted the communicators */
} dp_state;

/* A command that every rank here runs at once, each on its thread (zt__dp_dispatch), as run;
 * after_queue: first the collectives the last step left on the communicator's queue are
 * finished (the step leaves its gathers of the updated parameters there for the next step's
 * forward; a command that reads or writes the state, or frees it, runs after them); last: the
 * close, after which the thread ends, run whatever failed before. Each file defines its own
 * (zt__dp_cmd_*, below); a command of the collectives aborts the communicators where its rank
 * fails alone, so that no other rank is left waiting in one. */
typedef struct zt__dp_cmd {
  int (*run)(dp_rank_state *k);
  int after_queue, last;
} zt__dp_cmd;

/* threads.c: a rank's failure, its message in k->err; returns rc */
int zt__dp_rank_fail(dp_rank_state *k, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int zt__dp_comm_fail(dp_rank_state *k, int rc, const char *what);
int zt__dp_backend_fail(dp_rank_state *k, int rc);
/* threads.c: a rank's thread; a command on every rank here */
void *zt__dp_rank_main(void *arg);
int zt__dp_dispatch(dp_state *s, const zt__dp_cmd *cmd);
int zt__dp_run_cmd(dp_state *s, const zt__dp_cmd *cmd, char *err, size_t errlen);
int zt__dp_refuse_broken(const char *what, char *err, size_t errlen);

/* offload.c: where a unit's state is */
int zt__dp_on_host(const dp_state *s, int u);
int zt__dp_on_nvme(const dp_state *s, int u);
size_t zt__dp_host_at(const dp_state *s, const zt_shard *sh);
size_t zt__dp_param_at(const dp_rank_state *k, const zt_shard *sh);
void *zt__dp_lp_of(const dp_rank_state *k, void *base, size_t elem);
int zt__dp_copy_fail(dp_rank_state *k, int rc, const char *what);
/* offload.c: the host units' chunks staged for the walk's gathers (params host / nvme) */
void zt__dp_nvp_finish(dp_rank_state *k);
int zt__dp_walk_gathers(const dp_rank_state *k, int v);
int zt__dp_nvp_ahead(dp_rank_state *k, int v);
int zt__dp_stage_unit(dp_rank_state *k, int u);
/* offload.c: the host units' gradients and their AdamW */
int zt__dp_grads_to_host(dp_rank_state *k, int u, int j, const float *dev);
int zt__dp_update_host_unit(dp_rank_state *k, int u, float scale);
int zt__dp_take_up_to(dp_rank_state *k, int to, int j, int overlap);
void zt__dp_upload_unit(dp_rank_state *k, int u);
/* offload.c: optimizer nvme through the store: the retire's hooks (zt_opt_store_cfg), a set read
 * ahead, the sets retired, a failed store call's message */
int zt__dp_nv_updated(void *ctx, int u, const zt_opt_set *x);
int zt__dp_nv_written(void *ctx, int u);
int zt__dp_nv_read(dp_rank_state *k, int u);
int zt__dp_nv_finish(dp_rank_state *k);
void zt__dp_nv_why(const dp_rank_state *k, int rc, char *why, size_t len);
int zt__dp_nv_fail(dp_rank_state *k, int rc);

/* step.c: the gradient buffer unit u's backward adds into (the state calls' scratch) */
float *zt__dp_unit_grads(dp_rank_state *k, int u);
/* step.c: stages 1-2's gather of a unit's parameters */
int zt__dp_gather_updated(dp_rank_state *k, int u);
/* step.c: the step on every rank, and the path's */
extern const zt__dp_cmd zt__dp_cmd_step;
int zt__dp_step(zt_trainer *t, const zt_batch *tokens, zt_step_result *res, char *err,
                size_t errlen);
/* step.c: held-out evaluation (the path's eval), a trainer that runs every rank */
int zt__dp_eval(zt_trainer *t, const zt_batch *b, double *loss_sum, int64_t *counted, char *err,
                size_t errlen);

/* state.c: where a state call finds host unit u's chunks, and puts them back */
int zt__dp_tier_get(dp_rank_state *k, int u, int fetch, float *x[3]);
int zt__dp_tier_put(dp_rank_state *k, int u, float *x[3]);
/* state.c: every rank copies its own chunks out of (read) or into (write) the flat layout, moves
 * them to (shards_out) or from (shards_in) its file of a per-rank checkpoint, or all-gathers
 * stages 1-2's parameters after them (shards_gather); a rank's side of the last three, on its
 * thread, for a part's collective calls */
extern const zt__dp_cmd zt__dp_cmd_read, zt__dp_cmd_write, zt__dp_cmd_shards_out,
    zt__dp_cmd_shards_in, zt__dp_cmd_shards_gather;
int zt__dp_rank_shards_out(dp_rank_state *k);
int zt__dp_rank_shards_in(dp_rank_state *k);
int zt__dp_rank_shards_gather(dp_rank_state *k);

/* parts.c: a part's collective state call on every rank here */
extern const zt__dp_cmd zt__dp_cmd_state;
/* parts.c: the path's state entries (zt__train_path) */
int zt__dp_read_state(zt_trainer *t, int u0, int u1, float *params, float *m, float *v,
                      char *err, size_t errlen);
int zt__dp_write_state(zt_trainer *t, int u0, int u1, const float *params, const float *m,
                       const float *v, char *err, size_t errlen);
void zt__dp_abandon_state(zt_trainer *t);
const zt_shard_table *zt__dp_shards(const zt_trainer *t, int *zero_stage, int *part);
int zt__dp_save_shards(zt_trainer *t, const zt__shard_io *io, char *err, size_t errlen);
int zt__dp_load_shards(zt_trainer *t, const zt__shard_io *io, char *err, size_t errlen);
int zt__dp_probe(zt_trainer *t, const char *dir, int save, const char *token, char *err,
                 size_t errlen);

/* ranks.c: every rank's buffers opened or closed; the path table */
extern const zt__dp_cmd zt__dp_cmd_open, zt__dp_cmd_close;
extern const zt__train_path zt__dp_path;

#endif
