/* The copy engine: how bytes move between the host and the device, asynchronously, so that the
 * streamer can fetch the next unit while the current one computes. Two in-order queues, like two
 * CUDA streams: host-to-device (parameter fetches, zeroing gradient buffers) and device-to-host
 * (gradient write-back). Each operation gets a ticket, increasing per queue; an operation is done
 * when its queue has finished every operation up to its ticket.
 *
 * Gradient write-back accumulates (host[i] += device[i] in fp32, element by element in index
 * order), so micro-batches sum on the host in a fixed order whatever the timing; or it stores
 * (host = device) when the device buffer already holds the running sum, which keeps the order of
 * additions that of a run without offload.
 *
 * Ordering against the compute: a D2H operation follows every compute queued before it (a
 * gradient never leaves before the backward that made it). An H2D operation (a fetch or a
 * zeroing) names what it must follow, `after`: ZT_COPY_AFTER_ALL, every compute queued before it
 * (the buffer may be read by any kernel queued); a ticket from compute_ticket, the compute queued
 * before that ticket only (the buffer's last user was queued then, so a fetch into a buffer freed
 * long ago starts as soon as the link is free instead of behind the compute queued since); 0,
 * none (a buffer no compute has used).
 *
 * The CPU backend's engine (below) runs each queue on its own worker thread with memcpy, so
 * overlap is real there too. The CUDA engine implements the same ops with cudaMemcpyAsync on two
 * copy streams and an event per ticket, each operation ordered after the compute queued before
 * it (offload/copy_cuda.c). The submitting side (the streamer) belongs to one thread; the engine
 * may use threads of its own. */
#ifndef ZT_OFFLOAD_COPY_ENGINE_H
#define ZT_OFFLOAD_COPY_ENGINE_H

#include <stddef.h>
#include <stdint.h>

typedef enum zt_copy_queue { ZT_COPY_H2D = 0, ZT_COPY_D2H = 1 } zt_copy_queue;
#define ZT_COPY_QUEUES 2
#define ZT_COPY_AFTER_ALL (-1) /* an H2D operation's `after`: every compute queued before it */

typedef struct zt_copy_engine zt_copy_engine;

/* Time each resource spent busy, summed over finished work since the engine opened: each
 * queue's operations, and the device compute the caller bracketed with compute_mark. For the
 * offloaded step's timeline (which resource bounds the step). wait_ns: the callers' time
 * blocked in wait (and on the cpu engine in compute_wait, where the compute is the caller's). */
typedef struct zt_copy_busy {
  uint64_t queue_ns[ZT_COPY_QUEUES];
  uint64_t compute_ns;
  uint64_t wait_ns;
} zt_copy_busy;

/* Submitting calls return the ticket (>= 1) or -errno; query returns 1 when the ticket is done,
 * 0 when not yet, -errno when an operation of that queue failed; wait blocks until done and
 * returns 0 or -errno. close waits for everything queued, then frees the engine. */
typedef struct zt_copy_ops {
  const char *name;
  int64_t (*h2d)(zt_copy_engine *e, void *dev, const void *host, size_t bytes,
                 int64_t after);                                                       /* H2D */
  int64_t (*zero)(zt_copy_engine *e, void *dev, size_t bytes, int64_t after);            /* H2D */
  /* NULL where the engine cannot add on the host in queue order (cuda) */
  int64_t (*grad_accumulate)(zt_copy_engine *e, float *host, const float *dev, size_t n); /* D2H */
  int64_t (*d2h)(zt_copy_engine *e, void *host, const void *dev, size_t bytes);          /* D2H */
  int (*query)(zt_copy_engine *e, zt_copy_queue q, int64_t ticket);
  int (*wait)(zt_copy_engine *e, zt_copy_queue q, int64_t ticket);
  /* The backend's compute, from what is queued next, waits for the ticket: on the GPU without
   * blocking the host (cuda); by waiting where the compute runs on the calling thread (cpu). */
  int (*compute_wait)(zt_copy_engine *e, zt_copy_queue q, int64_t ticket);
  /* A mark behind the compute queued so far, for an H2D operation's `after` (>= 1, increasing;
   * -errno). */
  int64_t (*compute_ticket)(zt_copy_engine *e);
  /* Brackets device compute to be timed: end 0 before it is queued, 1 after (cuda: events on
   * the compute stream; cpu: the caller's wall time between the two). */
  int (*compute_mark)(zt_copy_engine *e, int end);
  void (*busy)(zt_copy_engine *e, zt_copy_busy *out);
  void (*close)(zt_copy_engine *e);
} zt_copy_ops;

/* Implementations start their own struct with this. */
struct zt_copy_engine {
  const zt_copy_ops *ops;
};

/* The CPU engine. link_bytes_per_s > 0 makes every operation last at least bytes / rate seconds,
 * emulating a PCIe link so that the scheduler's overlap can be measured (and tested) without a
 * GPU; 0 copies at memory speed. */
int zt_copy_cpu_open(zt_copy_engine **out, double link_bytes_per_s);

/* The CUDA engine on `device`, ordered against compute_stream (a cudaStream_t, from
 * zt_backend_stream). -ENOTSUP in a build without CUDA, -EIO when CUDA fails (logged). */
int zt_copy_cuda_open(zt_copy_engine **out, int device, void *compute_stream);

static inline void zt_copy_close(zt_copy_engine *e) {
  if (e) e->ops->close(e);
}

#endif
