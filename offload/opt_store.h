/* defines: zt_opt_store, the per-unit optimizer state of an offloaded step (fp32 masters, AdamW
 * m and v) and its updates: each unit's AdamW, run by run, on the CPU pool over the caller's
 * host buffers (zt_opt_store_submit); for the units kept on NVMe, their three files in a
 * zt_nvme_store, read ahead of the update into one of two staging sets and written back behind
 * it (zt_opt_store_read, _stage, _finish); the state calls' synchronous reads and writes
 * (zt_opt_store_sync); the message of a failure, which names the file.
 * called by: engine/train/offload (the single-rank step, a store over the model's units) and
 * engine/train/dp (a store per rank over the rank's own files and chunks (floats), its sets
 * with the compute copy beside them (zt_opt_store_cfg.sets[].lp), its uploads done in the
 * retire's hooks).
 *
 * A set moves FREE -> READING -> UPDATING -> WRITING -> FREE; NVMe unit u uses set u & 1, so
 * that the update of one unit and the write-behind of the unit before it run while the next
 * (u - 1: the backward walks down) is read ahead. Units are the caller's numbering; those below
 * nvme_first keep their state in the caller's buffers and only take the AdamW from here. Not
 * thread-safe: a store and its zt_nvme_store belong to one thread (the pool is shared). */
#ifndef ZT_OFFLOAD_OPT_STORE_H
#define ZT_OFFLOAD_OPT_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/kernels/dtype.h"
#include "offload/cpu_adam.h"
#include "offload/cpu_pool.h"
#include "offload/nvme_store.h"

/* A unit's kinds of state, each a file of an NVMe unit: NAME.master, NAME.exp_avg,
 * NAME.exp_avg_sq */
enum { ZT_OPT_MASTER, ZT_OPT_M, ZT_OPT_V, ZT_OPT_KINDS };

/* Consecutive elements of one unit sharing a weight-decay flag: one AdamW task. offset counts
 * from the unit's element 0. */
typedef struct zt_opt_run {
  size_t offset, n;
  int decay;
} zt_opt_run;

/* A staging set: an NVMe unit's masters, m and v, and where the caller wants one (dp: the
 * chunk's compute copy, which the update writes and the retire uploads) its compute copy;
 * buffers of the largest NVMe unit's elements (masters fp32, m and v of cfg.state),
 * ZT_NVME_ALIGN-aligned (host arena pages). */
typedef struct zt_opt_set {
  void *buf[ZT_OPT_KINDS];
  uint16_t *lp; /* NULL: none */
} zt_opt_set;

typedef struct zt_opt_store_cfg {
  int n_units;
  const size_t *floats;     /* per unit: its elements, each of its files' length */
  const zt_opt_run *runs;   /* every unit's runs, unit by unit */
  const int *first_run;     /* unit u's: runs[first_run[u] .. first_run[u + 1]) */
  zt_dtype dt;              /* the compute copy the AdamW rewrites (zt_opt_io.lp): bf16, fp16, or
                               ZT_F32 for none */
  zt_dtype state;           /* m and v's type (train.optimizer.state_dtype): ZT_F32 or ZT_BF16,
                               in the buffers and the files alike */
  zt_cpu_pool *pool;
  /* NVMe: units [nvme_first, n_units); nvme NULL: none (nvme_first is n_units) */
  zt_nvme_store *nvme;      /* the caller's: the streamer reads the master files through it */
  int nvme_first;
  const char *const *names; /* per unit: its files' name before the kind's (only at the open) */
  zt_opt_set sets[2];       /* the staging, the caller's memory; sets[0] serves zt_opt_store_sync */
  /* The retire's hooks, each may be NULL; a negative return fails the retire. updated: unit's
   * update has finished, before its write-behind (copy the updated masters where the step reads
   * them); written: its write-behind landed, before the set takes another unit (wait for any copy
   * still reading the set). */
  int (*updated)(void *ctx, int unit, const zt_opt_set *set);
  int (*written)(void *ctx, int unit);
  void *ctx;
} zt_opt_store_cfg;

typedef struct zt_opt_store zt_opt_store;

/* The bytes of one element of kind k (ZT_OPT_MASTER, _M, _V) with moments of type state. */
size_t zt_opt_store_kind_bytes(int k, zt_dtype state);
/* The bytes an NVMe unit of `floats` elements takes on disk with moments of type state: its
 * three files, each in the store's whole blocks (what a plan sums). */
uint64_t zt_opt_store_file_bytes(size_t floats, zt_dtype state);

/* Copies what it keeps of cfg; creates the NVMe units' files (unit order, then kind order),
 * reserving their space. err: the zt_nvme_store's message, which names the file. */
int zt_opt_store_open(zt_opt_store **out, const zt_opt_store_cfg *cfg, char *err, size_t errlen);
/* Waits for every update; the files stay with the zt_nvme_store. NULL is a no-op. */
void zt_opt_store_close(zt_opt_store *st);
/* The extent of NVMe unit u's file of kind k (zt_nvme_read of the masters: params nvme). */
int zt_opt_store_ext(const zt_opt_store *st, int u, int k);

/* Where unit u's update reads and writes, each pointer at the unit's element 0: p the masters,
 * m and v the moments (of cfg.state), g the gradients; lp NULL or the compute copy (cfg.dt) the
 * AdamW writes from the updated masters. Beside the update in the same pass: src NULL or the
 * masters p takes first; out NULL or where the first out_n updated masters are copied too.
 * index0: bf16 moments, the flat index of element 0, which picks its rounding bits
 * (zt_cpu_adam_run_bf16; the seed is hp->seed). */
typedef struct zt_opt_io {
  float *p;
  const float *src;
  void *m, *v;
  const float *g;
  uint16_t *lp;
  float *out;
  size_t out_n;
  uint64_t index0;
} zt_opt_io;

/* Starts unit u's AdamW on the pool, a task a run (its weight decay, or 0 where the run has
 * none). -EINVAL for hp->step < 1. A failure waits for the tasks it started and, for an NVMe
 * unit staged, frees its set: nothing of a failed update is written behind. */
int zt_opt_store_submit(zt_opt_store *st, int u, const zt_opt_io *io, const zt_adam_hparams *hp);
/* Blocks until unit u's AdamW has finished. */
void zt_opt_store_wait(zt_opt_store *st, int u);

/* NVMe unit u: starts reading its state into its set unless it is there or coming, after
 * retiring what the set held. */
int zt_opt_store_read(zt_opt_store *st, int u);
/* NVMe unit u's state in its set, read (waited for; started if it was not) and marked as being
 * updated: submit its AdamW on *out's buffers. A failed read frees the set. */
int zt_opt_store_stage(zt_opt_store *st, int u, zt_opt_set *out);
/* Every set retired, the higher unit's first (the order of the updates): its update waited
 * for and written back; the other units' updates may still run (dp: the host units', updated
 * after the NVMe ones, while the last write-behinds go). The first failure's errno. */
int zt_opt_store_flush(zt_opt_store *st);
/* Every update waited for, then zt_opt_store_flush. */
int zt_opt_store_finish(zt_opt_store *st);

/* Between steps (every set free): NVMe unit u's files read into cfg.sets[0] (write 0) or
 * written from it, synchronously. */
int zt_opt_store_sync(zt_opt_store *st, int u, int write);

/* The message of the last failed call's first failure, which it returned as rc: an I/O one's is
 * the zt_nvme_store's (it names the file); a hook's is the caller's to make, "" here; else
 * strerror's. */
const char *zt_opt_store_error(const zt_opt_store *st, int rc);

#endif
