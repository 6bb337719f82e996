/* The unit streamer: keeps the compute-precision parameters of the units the step needs on the
 * device, within the device arena's budget, and moves gradients back to the host.
 *
 * The step loop drives it (DESIGN.md "Memory"): forward acquires unit i, prefetches i+1..i+k,
 * computes, releases i; backward does the same walking down, acquiring each unit with a gradient
 * buffer and releasing it dirty, which queues the write-back that accumulates the buffer into
 * the unit's fp32 host gradients (host += device) on the copy engine's D2H queue.
 *
 * Homes: a unit's parameters live in host memory (`host_params`) or in an NVMe extent, read into
 * one of the streamer's staging buffers (taken from the host arena at open) before the copy to
 * the device. NVMe reads start at prefetch and overlap compute; the store is not thread-safe, so
 * the streamer completes them on the caller's thread and queues their H2D copy at the next
 * release (the end of the compute that hid the read) or the unit's acquire, whichever is first.
 *
 * Device memory comes from the device arena only. When an allocation does not fit, the streamer
 * makes room in a fixed order, so its decisions depend on the sequence of calls, never on timing.
 * A parameter copy evicts another that nobody holds (waiting for its fetch if still in flight):
 * units behind the walk first, least recently used first, then units ahead of it, farthest
 * first; only with none left does it wait for the oldest gradient write-back and free its
 * buffer. A gradient buffer does the reverse: write-backs first, evictions after, except where
 * the arena cannot hold every unit's copy (streaming): there a copy behind the walk goes first,
 * since the walk would evict it before it comes round to it, and reusing its memory waits on
 * the device for its last compute, where waiting for a write-back would hold the caller until
 * the compute before it is done. With neither
 * left the call fails with -ENOMEM and the numbers. The walk's direction is that of the last
 * two different units acquired.
 *
 * Reuse: each release takes a compute ticket (copy_engine.h), the last use of the unit's device
 * buffers so far. A buffer freed keeps its ticket as a fence, and a copy into memory that was
 * freed follows only the fences over it: a prefetch into a slot whose unit computed long ago
 * starts at once rather than behind all the compute queued since.
 *
 * One thread (the job's runner) calls the streamer; the copy engine works behind it. */
#ifndef ZT_OFFLOAD_STREAMER_H
#define ZT_OFFLOAD_STREAMER_H

#include <stddef.h>
#include <stdint.h>
#include "offload/copy_engine.h"
#include "offload/device_arena.h"
#include "offload/host_arena.h"
#include "offload/nvme_store.h"

/* One host range copied into a unit's device copy, at dev_offset. */
typedef struct zt_stream_piece {
  size_t dev_offset;
  const void *host;
  size_t bytes;
} zt_stream_piece;

typedef struct zt_stream_unit {
  size_t param_bytes;      /* the device copy of the unit's compute-precision parameters (> 0) */
  const void *host_params; /* home in host memory, param_bytes long; NULL: home on NVMe or in
                              pieces */
  /* n_pieces > 0: the home is these host ranges instead (a mixed-precision unit whose ops read
   * the fp32 copy of some tensors and the compute copy of others: only those bytes move) */
  int n_pieces;
  const zt_stream_piece *pieces; /* not copied at open: must outlive the streamer */
  int nvme_ext;            /* home extent when host_params is NULL, read at nvme_offset (the
                              store's alignment rules apply) */
  uint64_t nvme_offset;
  size_t grad_floats;      /* fp32 gradient elements; 0: the unit has no gradients */
  float *host_grads;       /* the unit's fp32 host gradients, accumulated into */
  /* a device buffer of the caller's, grad_floats long, outside the arena, that keeps the unit's
   * gradients between acquires (the step's running sum stays on the device): an acquire with
   * ZT_STREAM_GRADS gives it, zeroed, or as it is with ZT_STREAM_GRADS_RESUME; a dirty release
   * copies it to host_grads; a clean one leaves it. NULL: buffers from the arena */
  float *dev_grads;
} zt_stream_unit;

typedef struct zt_streamer_cfg {
  int n_units;
  const zt_stream_unit *units; /* copied at open */
  zt_dev_arena *dev;
  zt_host_arena *host;         /* staging for NVMe homes; unused (may be NULL) without them */
  zt_nvme_store *nvme;         /* required when a unit's home is on NVMe */
  zt_copy_engine *copy;
  int prefetch_depth;          /* units the step loop prefetches ahead of the one it computes */
  int max_acquired;            /* units held at once (gpt head + tied embedding: 2); 0 means 1 */
  size_t param_budget;         /* the most arena bytes (footprints) parameter copies take
                                  together, so gradient buffers keep the rest; 0: only the arena
                                  limits */
  size_t slot_bytes;           /* > 0: every device allocation (parameter copy or gradient
                                  buffer) takes this many bytes, at least the largest unit's, so
                                  the arena is a pool of equal slots that cannot fragment: the
                                  minimum below then always suffices. 0: exact sizes */
} zt_streamer_cfg;

typedef struct zt_streamer_stats {
  uint64_t fetches;         /* parameter copies to the device */
  uint64_t hits;            /* acquires that found the parameters on the device or on their way */
  uint64_t misses;          /* acquires that had to start the fetch themselves */
  uint64_t stalls;          /* acquires that blocked on a copy or read not finished yet */
  uint64_t wait_ns;         /* time blocked on the copy engine or the store, all calls */
  uint64_t evictions;       /* parameter copies dropped to make room */
  uint64_t grad_writebacks; /* gradient buffers accumulated into the host */
  uint64_t bytes_h2d;       /* bytes copied to the device: parameters, and running gradient
                               sums a ZT_STREAM_GRADS_RESUME acquire starts from */
  uint64_t bytes_d2h;       /* gradient bytes copied back */
  uint64_t nvme_reads;      /* parameter reads from NVMe homes */
  uint64_t nvme_bytes;
  size_t device_peak;       /* the device arena's peak (every allocation in it, rounded) */
} zt_streamer_stats;

typedef struct zt_streamer zt_streamer;

/* The smallest device budget the streamer accepts: the (max_acquired + prefetch_depth) largest
 * parameter footprints plus the max_acquired largest gradient footprints (arena footprints; a
 * slot each in slot mode), so
 * any walk with at most max_acquired units held and prefetch_depth in flight finds room when the
 * units are of equal size. Units of mixed sizes can still fragment the arena; that shows as
 * -ENOMEM with the numbers, never as an overrun. SIZE_MAX for an invalid cfg. */
size_t zt_streamer_min_device_bytes(const zt_streamer_cfg *cfg);

/* -EINVAL for an invalid cfg, -ENOMEM when the device budget is below the minimum above, a
 * param_budget below its parameter part, or staging buffers that do not fit the host arena; err
 * says why with the numbers. */
int zt_streamer_open(zt_streamer **out, const zt_streamer_cfg *cfg, char *err, size_t errlen);
/* Waits for every copy and read in flight (gradient write-backs finish), then frees the
 * streamer's device and host allocations. NULL is a no-op. */
void zt_streamer_close(zt_streamer *s);

/* Starts fetching the unit's parameters if they are neither on the device nor on their way.
 * Advisory: returns 0 when the unit is there or coming, -EAGAIN when no room can be made
 * without waiting on a unit that is held (the acquire will fetch it), or another -errno. */
int zt_streamer_prefetch(zt_streamer *s, int unit);

#define ZT_STREAM_GRADS 1u /* acquire: also a zeroed device gradient buffer (grad_floats fp32) */
/* acquire, with ZT_STREAM_GRADS: the buffer starts as a copy of the unit's host gradients instead
 * of zeros. With ZT_STREAM_STORE on release, micro-batches then add up on the device in the order
 * a run without offload adds them, so the sums are bitwise that run's. */
#define ZT_STREAM_GRADS_RESUME 2u

/* Holds the unit on the device and blocks until its parameters are there (fetching them if no
 * prefetch did), *params pointing at them. With ZT_STREAM_GRADS, *grads gets a zeroed gradient
 * buffer for the unit (-EBUSY if the unit holds one already; -EINVAL if it has no gradients).
 * Holds nest: a unit acquired twice needs two releases. */
int zt_streamer_acquire(zt_streamer *s, int unit, unsigned flags, void **params, float **grads);

#define ZT_STREAM_DIRTY 1u /* release: accumulate the gradient buffer into the host gradients */
#define ZT_STREAM_STORE 2u /* release, with ZT_STREAM_DIRTY: the buffer replaces the host gradients */

/* Drops one hold. A gradient buffer held by the unit goes with it: with ZT_STREAM_DIRTY it is
 * first accumulated into host_grads (asynchronously; see zt_streamer_wait_grads), otherwise it
 * is discarded; with ZT_STREAM_DIRTY | ZT_STREAM_STORE it is copied over them. The parameters stay on the device until evicted. */
int zt_streamer_release(zt_streamer *s, int unit, unsigned flags);

/* Blocks until every gradient write-back of the unit (unit < 0: of all units) has landed in its
 * host gradients, so the optimizer may read them. */
int zt_streamer_wait_grads(zt_streamer *s, int unit);

/* The unit's home parameters changed (the optimizer updated them): drops the device copy so the
 * next acquire fetches again. unit < 0: all units. -EBUSY for a unit that is held. */
int zt_streamer_invalidate(zt_streamer *s, int unit);

/* 1 when the unit's parameters are on the device or on their way, else 0. */
int zt_streamer_is_resident(const zt_streamer *s, int unit);

void zt_streamer_get_stats(const zt_streamer *s, zt_streamer_stats *out);
/* The message of the last failure; "" when none. */
const char *zt_streamer_error(const zt_streamer *s);

#endif
