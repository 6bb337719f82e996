/* The communicator: the collectives of data-parallel training behind one table of function
 * pointers, like the op interface (engine/kernels/ops.h). It is shaped after NCCL, the
 * implementation that matters (engine/comm/nccl.c); engine/comm/cpu.c runs W ranks as threads
 * of one process, so that the partitioning logic built on it is tested without GPUs.
 *
 * Conventions (both implementations):
 * - One zt_comm per rank, used by that rank's thread only. Every rank calls the same
 *   collectives in the same order with the same sizes (a rank that cannot must abort).
 * - Buffers are backend memory of the rank's backend (device memory for NCCL, host memory for
 *   the CPU backend). stream is the rank backend's stream (a cudaStream_t for NCCL; ignored by
 *   the CPU group, whose collectives are done when they return): the collective is ordered
 *   with the backend's ops on that stream, so the caller synchronises the backend before it
 *   reads a result on the host.
 * - Calls return 0 or a negative errno; error_text gives the reason ("" while none).
 * - Sums are fp32. The CPU group adds in rank order, so every rank gets the same bits; NCCL
 *   adds in the order of its algorithm (a ring or a tree).
 * - In place: all_reduce with send == recv; reduce_scatter with recv == send + rank * count;
 *   all_gather with send == recv + rank * bytes; broadcast with send == recv. Other overlaps
 *   between send and recv are not allowed. */
#ifndef ZT_COMM_COMM_H
#define ZT_COMM_COMM_H

#include <stddef.h>

typedef struct zt_comm_ops {
  const char *name; /* "cpu" | "nccl" */
  int (*rank)(void *ctx);
  int (*world)(void *ctx);
  /* recv[i] = sum over ranks of send[i], i < count */
  int (*all_reduce)(void *ctx, const float *send, float *recv, size_t count, void *stream);
  /* send holds world chunks of count floats; rank r gets the sum over ranks of chunk r */
  int (*reduce_scatter)(void *ctx, const float *send, float *recv, size_t count, void *stream);
  /* recv holds world chunks of `bytes`: chunk r is rank r's send */
  int (*all_gather)(void *ctx, const void *send, void *recv, size_t bytes, void *stream);
  /* every rank's recv gets root's send (root's recv too) */
  int (*broadcast)(void *ctx, const void *send, void *recv, size_t bytes, int root,
                   void *stream);
  /* The communicator's own queue, so that collectives overlap the compute (NCCL: a CUDA
   * stream of its own on the rank's device; the CPU group: a thread of the rank's). A
   * collective given stream == queue(ctx) runs there, in the order queued; one given the
   * backend's stream runs as above. Every collective of a rank, whichever its stream, runs
   * after the ones the rank issued before it (the CPU group's waits for the queue to drain;
   * NCCL's is ordered after the queue by an event, and the queue's next after it), so the
   * order every rank must keep is still the order of the calls. Between the queue and a
   * stream the order is explicit:
   * - queue_after: the queue's later collectives start after everything queued on `stream`
   *   so far (NCCL: an event on stream that the queue waits for; CPU: nothing to do, the
   *   backend's compute is done when its call returns).
   * - queue_mark: a ticket (>= 1) for the collectives queued on the queue so far, or -errno.
   * - stream_wait: what `stream` runs next waits for the ticket (NCCL: without blocking the
   *   host; CPU: the calling thread blocks until the queue has done the ticket).
   * - queue_sync: the calling thread waits until everything queued on the queue is done.
   * A queued collective that fails makes the communicator's error sticky as any failed call
   * does: that call may have returned 0 (it was only queued), so stream_wait, queue_sync and
   * every later call return the error. */
  void *(*queue)(void *ctx);
  int (*queue_after)(void *ctx, void *stream);
  long long (*queue_mark)(void *ctx);
  int (*stream_wait)(void *ctx, void *stream, long long ticket);
  int (*queue_sync)(void *ctx);
  /* returns when every rank has called it (NCCL: once the stream's work before it is done) */
  int (*barrier)(void *ctx, void *stream);
  /* Gives up on the group: collectives in progress or called later on any rank return
   * -ECANCELED (CPU) or fail (NCCL: ncclCommAbort; the other ranks in this process abort too,
   * which ends their kernels, and their next call returns -ECANCELED; ranks in other processes
   * fail when NCCL notices or their cancel token fires, engine/comm/comm_nccl.h), so that no
   * rank waits forever for one that failed; collectives queued on the queue end the same way.
   * Called by the rank's own thread, between
   * collectives (the CPU group's waiting ranks may still read a rank's buffers inside one). The
   * communicator still has to be closed. */
  void (*abort)(void *ctx);
  const char *(*error_text)(void *ctx);
} zt_comm_ops;

/* A rank's communicator: its table and context (the zt_backend pattern). */
typedef struct zt_comm {
  const zt_comm_ops *ops;
  void *ctx;
} zt_comm;

/* ---- the CPU group ------------------------------------------------------------------------- */
/* W ranks as threads of one process: each collective posts the rank's buffers in the group,
 * meets the others at a barrier (a mutex and a condition variable, so the posts happen before
 * the reads), computes its part reading the others' buffers, and meets them again before it
 * returns, so no buffer is reused while another rank reads it. Ranks whose calls do not match
 * (another collective, size or root) all get -EINVAL naming both. The queue is a thread of the
 * rank's, started by its first queued call, that runs the calls through the same code (same
 * bits); a call on any other stream, and barrier on any, first waits until it has drained. A
 * call given the queue that fails, or cannot be queued, also aborts the group, so that no rank
 * waits for a collective this rank's queue will not run. Closing waits for what is queued (abort
 * first where a rank may never come). */
typedef struct zt_comm_cpu_group zt_comm_cpu_group;

/* world in [1, ZT_COMM_CPU_MAX_WORLD]; -EINVAL / -ENOMEM. The environment variable
 * ZT_FAULT_COMM=RANK:N (a testing aid) makes rank RANK's Nth collective of every group fail with
 * -EIO and a message saying so; a malformed value fails the open with -EINVAL (logged). */
#define ZT_COMM_CPU_MAX_WORLD 1024
int zt_comm_cpu_group_open(zt_comm_cpu_group **g, int world);
/* After every rank's communicator is closed. NULL is a no-op. */
void zt_comm_cpu_group_close(zt_comm_cpu_group *g);
/* Rank `rank`'s communicator in the group; -EINVAL for a rank out of range or taken. */
int zt_comm_cpu_open(zt_comm *c, zt_comm_cpu_group *g, int rank);
void zt_comm_cpu_close(zt_comm *c);

/* The NCCL communicator is in engine/comm/comm_nccl.h (with the cuda feature and NCCL). */

#endif
