/* The NCCL communicator (engine/comm/comm.h's table on NCCL): one rank per CUDA device, each
 * driven by its own thread. Built only with the cuda feature and NCCL (ZT_HAVE_NCCL); plain C,
 * no NCCL or CUDA types here.
 *
 * Every wait can be ended. The communicator is nonblocking (ncclConfig_t.blocking = 0): init,
 * every collective and close's finalize return to zt at once and zt polls
 * ncclCommGetAsyncError (every ZT_COMM_NCCL_POLL_US), so a rank whose peer never arrives,
 * refused the job or died can still be told to stop:
 * - A cancel token (below), shared by the ranks of one job part, is fired by any thread at any
 *   time. Every rank using it then calls ncclCommAbort: an open in progress returns -ECANCELED,
 *   and a communicator that is open gets the sticky error -ECANCELED "rank R (device D):
 *   cancelled: <why>".
 * - Each open communicator has a watchdog thread (started by open, stopped by close) that every
 *   ZT_COMM_NCCL_WATCH_MS checks the token and ncclCommGetAsyncError. An error there (e.g.
 *   ncclRemoteError when a peer's socket closes) becomes the sticky error with NCCL's text and
 *   ncclGetLastError, and the watchdog calls ncclCommAbort. The abort makes NCCL's kernels in
 *   flight exit, so a rank thread blocked in cudaStreamSynchronize on its stream (the backend's
 *   sync after a collective, or the barrier's own) returns; barrier then returns the sticky
 *   error, the other collectives return it at their next call (their data is garbage).
 * - When a rank of the communicator in this process is aborted (by its watchdog, its token or
 *   the table's abort), the other ranks here abort too (their watchdog, or their next call),
 *   with -ECANCELED "rank R (device D): rank A in this process was aborted": they would wait
 *   for it forever. So one rank's abort fails the communicator's ranks here, as in the CPU
 *   group; ranks in other processes learn of it when NCCL notices the connections that the
 *   last abort here closes (an async error, e.g. ncclRemoteError), or from their own token.
 * - The communicator is aborted at most once: the rank thread's abort (the table's abort), the
 *   watchdog and close share one mutex, which also keeps NCCL calls on the communicator to one
 *   thread at a time as NCCL requires.
 * Threads: open, the collectives, abort and error_text are the rank's thread's (open makes the
 * device current there); close may run on another thread once the rank thread has stopped using
 * the communicator; zt_comm_nccl_cancel_fire runs on any thread. */
#ifndef ZT_COMM_COMM_NCCL_H
#define ZT_COMM_COMM_NCCL_H

#include <stddef.h>

#include "engine/comm/comm.h"

/* How often a rank waiting on NCCL (init, a collective's ncclInProgress, close) polls it and
 * the token, and how often the watchdog looks. */
#define ZT_COMM_NCCL_POLL_US 1000
/* A collective's ncclInProgress (its enqueue, microseconds) is polled this many times with
 * sched_yield before the polls sleep ZT_COMM_NCCL_POLL_US. */
#define ZT_COMM_NCCL_SPIN_POLLS 20000

/* The events behind the queue's tickets (comm.h queue_mark), reused in turn: a wait for a
 * ticket older than this many marks waits for a later one instead (longer, never wrong). The
 * trainer waits for tickets a few units old. */
#define ZT_COMM_NCCL_MARKS 64
#define ZT_COMM_NCCL_WATCH_MS 25

/* The group's identity, made once (by the thread that starts the ranks) and handed to every
 * rank: ncclUniqueId's bytes. */
typedef struct zt_comm_nccl_id {
  char bytes[128];
} zt_comm_nccl_id;

/* The cancel token. Fired once and for good by any thread at any time: the first why is kept
 * (its first 199 bytes), later fires do nothing. Free it after every communicator that uses it
 * is closed; NULL is a no-op (for fire too). create: 0 or -ENOMEM. */
typedef struct zt_comm_nccl_cancel zt_comm_nccl_cancel;
int zt_comm_nccl_cancel_create(zt_comm_nccl_cancel **c);
void zt_comm_nccl_cancel_fire(zt_comm_nccl_cancel *c, const char *why);
void zt_comm_nccl_cancel_free(zt_comm_nccl_cancel *c);

/* ncclGetUniqueId. Before NCCL's first call in the process (here or in open, whichever comes
 * first) the environment is prepared once: NCCL_NVLS_ENABLE=0 unless it is set (NVLink SHARP
 * multicast stays off, as the GPU machines we are lent require), and NCCL_COMM_BLOCKING removed
 * (logged) when it asks for blocking communicators, which could not be cancelled. */
int zt_comm_nccl_get_id(zt_comm_nccl_id *id, char *err, size_t errlen);
/* Rank `rank` of `world` on CUDA device `device`, called from the thread that will use it (the
 * device becomes current there). Init returns once every rank has called it, so the ranks call
 * it from their own threads at the same time; it waits until they have, NCCL fails, or `cancel`
 * (NULL: none) fires, which returns -ECANCELED with the why in err (a token already fired
 * returns at once). 0 or -errno with the NCCL text (rank, device, ncclGetLastError). */
int zt_comm_nccl_open(zt_comm *c, int world, int rank, const zt_comm_nccl_id *id, int device,
                      zt_comm_nccl_cancel *cancel, char *err, size_t errlen);
/* Stops the watchdog and frees what open took. A communicator that is healthy is finalized:
 * ncclCommFinalize and a poll (a peer that never finalizes is waited for until the token fires
 * or NCCL reports it gone), then ncclCommDestroy. Where several ranks of the communicator live
 * in this process, NCCL's finalize waits for all of them at once, so close then calls
 * ncclCommDestroy alone: NCCL tears those ranks down together in the last one's call, which
 * cannot be cancelled. A communicator that failed, was aborted, whose token fired, or one of
 * whose ranks in this process was aborted, is aborted instead: its peers may never finalize. */
void zt_comm_nccl_close(zt_comm *c);

#endif
