/* The CUDA copy engine (offload/copy_engine.h): each queue is a CUDA stream of its own, and a
 * ticket is an event recorded behind its operation. Every operation first waits, on the GPU,
 * for the compute queued before it was submitted, or (H2D) only for a compute ticket's mark, so
 * a copy never overwrites a buffer that a queued kernel still reads, and a gradient never leaves
 * before the backward that made it;
 * compute_wait makes the compute stream wait for a ticket, so the host never blocks to order
 * a fetch before its use. Only the job's runner thread calls the engine: no locks.
 *
 * grad_accumulate (host += device) is absent: adding on the host in queue order needs a host
 * callback per chunk; the offloaded step keeps running sums on the device instead
 * (ZT_STREAM_GRADS_RESUME with ZT_STREAM_STORE). */
#include "offload/copy_engine.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <cuda_runtime_api.h>

#include "engine/base/check_cuda.h"
#include "engine/base/log.h"
#include "engine/base/clock.h"
#include "offload/host_arena.h"

/* Tickets in flight per queue before submitting waits for the oldest; compute spans likewise. */
#define RING 512

/* Ticket k's events are ev[k % RING] (its end) and start[k % RING] (recorded once its queue
 * has waited for the compute, so end - start is the copy's own time) while k > accounted. */
typedef struct queue {
  cudaStream_t stream;
  cudaEvent_t ev[RING], start[RING];
  int64_t submitted, completed, accounted;
  uint64_t busy_ns;
} queue;

typedef struct cuda_engine {
  zt_copy_engine base;
  int device;
  cudaStream_t compute;
  cudaEvent_t compute_ev;    /* re-recorded at each submit: a wait captures the record it sees */
  /* compute ticket k is marks[k % RING]. Once RING later tickets have reused its event, a wait
   * on k waits for a later mark: later than needed, never earlier. */
  cudaEvent_t marks[RING];
  int64_t compute_tickets;
  int64_t marks_done;        /* a ticket known finished (seen when its event was reused) */
  queue q[ZT_COPY_QUEUES];
  cudaEvent_t span[RING][2]; /* compute span k: span[k % RING] while k > spans_accounted */
  int64_t spans, spans_accounted;
  int span_open;             /* the last span has its start only */
  uint64_t compute_ns;
  uint64_t wait_ns; /* the host's time in cu_wait */
} cuda_engine;

static uint64_t elapsed_ns(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  if (cudaEventElapsedTime(&ms, a, b) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return (uint64_t)((double)ms * 1e6);
}

/* Adds the time of finished tickets up to `upto` (waiting for them when wait). */
static int account(queue *q, int64_t upto, int wait) {
  while (q->accounted < upto) {
    int64_t k = q->accounted + 1;
    cudaEvent_t end = q->ev[k % RING];
    cudaError_t r = wait ? cudaEventSynchronize(end) : cudaEventQuery(end);
    if (r == cudaErrorNotReady) return 0;
    if (ZT_CUDA_STATUS("offload", r, "waiting for a copy") < 0) return -EIO;
    q->busy_ns += elapsed_ns(q->start[k % RING], end);
    q->accounted = k;
    if (q->completed < k) q->completed = k;
  }
  return 0;
}

/* Frees ring slot of ticket `submitted + 1`: the ticket RING before it must be done and counted. */
static int make_slot(queue *q) {
  return account(q, q->submitted + 1 - RING, 1);
}

/* Orders the queue after the compute `after` names (ZT_COPY_AFTER_ALL: all queued so far; a
 * compute ticket; 0: none); returns 0 or -EIO. */
static int begin(cuda_engine *e, queue *q, int64_t after) {
  if (after < ZT_COPY_AFTER_ALL || after > e->compute_tickets) return -EINVAL;
  int rc = make_slot(q);
  cudaEvent_t ev = e->compute_ev;
  if (after > 0 && after <= e->marks_done) after = 0;
  if (after > 0) ev = e->marks[after % RING];
  else if (after == ZT_COPY_AFTER_ALL && rc == 0)
    rc = ZT_CUDA_STATUS("offload", cudaEventRecord(e->compute_ev, e->compute),
                        "recording the compute");
  if (rc == 0 && after != 0)
    rc = ZT_CUDA_STATUS("offload", cudaStreamWaitEvent(q->stream, ev, 0), "ordering a copy");
  if (rc == 0)
    rc = ZT_CUDA_STATUS("offload", cudaEventRecord(q->start[(q->submitted + 1) % RING], q->stream),
                        "timing a copy");
  return rc;
}

static int64_t finish(queue *q, cudaError_t launched, const char *what) {
  int rc = ZT_CUDA_STATUS("offload", launched, what);
  if (rc == 0)
    rc = ZT_CUDA_STATUS("offload", cudaEventRecord(q->ev[(q->submitted + 1) % RING], q->stream),
                        what);
  return rc < 0 ? rc : ++q->submitted;
}

static int64_t cu_h2d(zt_copy_engine *base, void *dev, const void *host, size_t bytes,
                      int64_t after) {
  cuda_engine *e = (cuda_engine *)base;
  queue *q = &e->q[ZT_COPY_H2D];
  int rc = begin(e, q, after);
  if (rc < 0) return rc;
  return finish(q, cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, q->stream),
                "cudaMemcpyAsync host to device");
}

static int64_t cu_zero(zt_copy_engine *base, void *dev, size_t bytes, int64_t after) {
  cuda_engine *e = (cuda_engine *)base;
  queue *q = &e->q[ZT_COPY_H2D];
  int rc = begin(e, q, after);
  if (rc < 0) return rc;
  return finish(q, cudaMemsetAsync(dev, 0, bytes, q->stream), "cudaMemsetAsync");
}

static int64_t cu_d2h(zt_copy_engine *base, void *host, const void *dev, size_t bytes) {
  cuda_engine *e = (cuda_engine *)base;
  queue *q = &e->q[ZT_COPY_D2H];
  int rc = begin(e, q, ZT_COPY_AFTER_ALL);
  if (rc < 0) return rc;
  return finish(q, cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, q->stream),
                "cudaMemcpyAsync device to host");
}

static int bad_ticket(const queue *q, int64_t ticket) { return ticket < 1 || ticket > q->submitted; }

static int cu_query(zt_copy_engine *base, zt_copy_queue qi, int64_t ticket) {
  queue *q = &((cuda_engine *)base)->q[qi];
  if (bad_ticket(q, ticket)) return -EINVAL;
  if (ticket <= q->completed) return 1;
  cudaError_t r = cudaEventQuery(q->ev[ticket % RING]);
  if (r == cudaErrorNotReady) return 0;
  return ZT_CUDA_STATUS("offload", r, "querying a copy") < 0 ? -EIO : 1;
}

static int cu_wait(zt_copy_engine *base, zt_copy_queue qi, int64_t ticket) {
  cuda_engine *e = (cuda_engine *)base;
  queue *q = &e->q[qi];
  if (bad_ticket(q, ticket)) return -EINVAL;
  if (ticket <= q->completed) return 0;
  uint64_t t0 = zt_now_ns();
  int rc =
      ZT_CUDA_STATUS("offload", cudaEventSynchronize(q->ev[ticket % RING]), "waiting for a copy");
  e->wait_ns += zt_now_ns() - t0;
  return rc;
}

static int cu_compute_wait(zt_copy_engine *base, zt_copy_queue qi, int64_t ticket) {
  cuda_engine *e = (cuda_engine *)base;
  queue *q = &e->q[qi];
  if (bad_ticket(q, ticket)) return -EINVAL;
  if (ticket <= q->completed) return 0;
  return ZT_CUDA_STATUS("offload", cudaStreamWaitEvent(e->compute, q->ev[ticket % RING], 0),
                        "ordering the compute after a copy");
}

static int64_t cu_compute_ticket(zt_copy_engine *base) {
  cuda_engine *e = (cuda_engine *)base;
  int64_t old = e->compute_tickets + 1 - RING; /* the ticket whose event this one reuses */
  if (old > e->marks_done && cudaEventQuery(e->marks[old % RING]) == cudaSuccess)
    e->marks_done = old;
  int rc = ZT_CUDA_STATUS("offload",
                          cudaEventRecord(e->marks[(e->compute_tickets + 1) % RING], e->compute),
                          "marking the compute");
  return rc < 0 ? rc : ++e->compute_tickets;
}

/* Adds the compute spans finished up to `upto` (waiting for them when wait). */
static int account_spans(cuda_engine *e, int64_t upto, int wait) {
  while (e->spans_accounted < upto) {
    cudaEvent_t *sp = e->span[(e->spans_accounted + 1) % RING];
    cudaError_t r = wait ? cudaEventSynchronize(sp[1]) : cudaEventQuery(sp[1]);
    if (r == cudaErrorNotReady) return 0;
    if (ZT_CUDA_STATUS("offload", r, "waiting for the compute") < 0) return -EIO;
    e->compute_ns += elapsed_ns(sp[0], sp[1]);
    e->spans_accounted++;
  }
  return 0;
}

static int cu_compute_mark(zt_copy_engine *base, int end) {
  cuda_engine *e = (cuda_engine *)base;
  if (!end) {
    int rc = account_spans(e, e->spans + 1 - RING, 1);
    if (rc < 0) return rc;
    e->spans++;
  }
  e->span_open = !end;
  return ZT_CUDA_STATUS("offload",
                        cudaEventRecord(e->span[e->spans % RING][end ? 1 : 0], e->compute),
                        "timing the compute");
}

static void cu_busy(zt_copy_engine *base, zt_copy_busy *out) {
  cuda_engine *e = (cuda_engine *)base;
  for (int i = 0; i < ZT_COPY_QUEUES; i++) {
    account(&e->q[i], e->q[i].submitted, 0);
    out->queue_ns[i] = e->q[i].busy_ns;
  }
  account_spans(e, e->spans - e->span_open, 0);
  out->compute_ns = e->compute_ns;
  out->wait_ns = e->wait_ns;
}

static void cu_close(zt_copy_engine *base) {
  cuda_engine *e = (cuda_engine *)base;
  cudaSetDevice(e->device);
  for (int i = 0; i < ZT_COPY_QUEUES; i++) {
    queue *q = &e->q[i];
    if (q->stream) cudaStreamSynchronize(q->stream);
    for (int k = 0; k < RING; k++) {
      if (q->ev[k]) cudaEventDestroy(q->ev[k]);
      if (q->start[k]) cudaEventDestroy(q->start[k]);
    }
    if (q->stream) cudaStreamDestroy(q->stream);
  }
  for (int k = 0; k < RING; k++)
    for (int j = 0; j < 2; j++)
      if (e->span[k][j]) cudaEventDestroy(e->span[k][j]);
  if (e->compute_ev) cudaEventDestroy(e->compute_ev);
  for (int k = 0; k < RING; k++)
    if (e->marks[k]) cudaEventDestroy(e->marks[k]);
  free(e);
}

static const zt_copy_ops cuda_ops = {
    .name = "cuda",
    .h2d = cu_h2d,
    .zero = cu_zero,
    .grad_accumulate = NULL,
    .d2h = cu_d2h,
    .query = cu_query,
    .wait = cu_wait,
    .compute_wait = cu_compute_wait,
    .compute_mark = cu_compute_mark,
    .compute_ticket = cu_compute_ticket,
    .busy = cu_busy,
    .close = cu_close,
};

int zt_copy_cuda_open(zt_copy_engine **out, int device, void *compute_stream) {
  *out = NULL;
  cuda_engine *e = calloc(1, sizeof *e);
  if (!e) return -ENOMEM;
  e->base.ops = &cuda_ops;
  e->device = device;
  e->compute = (cudaStream_t)compute_stream;
  int rc = ZT_CUDA_STATUS("offload", cudaSetDevice(device), "cudaSetDevice");
  if (rc == 0)
    rc = ZT_CUDA_STATUS("offload", cudaEventCreateWithFlags(&e->compute_ev, cudaEventDisableTiming),
                        "cudaEventCreate");
  for (int k = 0; rc == 0 && k < RING; k++)
    rc = ZT_CUDA_STATUS("offload", cudaEventCreateWithFlags(&e->marks[k], cudaEventDisableTiming),
                        "cudaEventCreate");
  for (int i = 0; rc == 0 && i < ZT_COPY_QUEUES; i++) {
    rc =
        ZT_CUDA_STATUS("offload", cudaStreamCreateWithFlags(&e->q[i].stream, cudaStreamNonBlocking),
                       "cudaStreamCreate");
    for (int k = 0; rc == 0 && k < RING; k++) {
      rc = ZT_CUDA_STATUS("offload", cudaEventCreate(&e->q[i].ev[k]), "cudaEventCreate");
      if (rc == 0)
        rc = ZT_CUDA_STATUS("offload", cudaEventCreate(&e->q[i].start[k]), "cudaEventCreate");
    }
  }
  for (int k = 0; rc == 0 && k < RING; k++)
    for (int j = 0; rc == 0 && j < 2; j++)
      rc = ZT_CUDA_STATUS("offload", cudaEventCreate(&e->span[k][j]), "cudaEventCreate");
  if (rc < 0) {
    cu_close(&e->base);
    return rc;
  }
  *out = &e->base;
  return 0;
}

/* ---- pinned host memory ------------------------------------------------------------------- */

/* Anonymous pages registered with CUDA (page-locked and mapped for DMA). Registration, not
 * cudaHostAlloc, so that a refusal leaves ordinary memory behind, counted as unpinned, exactly
 * like the CPU's mlock path. */
static int pin_alloc(void *ctx, size_t bytes, void **out, int *pin_err) {
  (void)ctx;
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return -ENOMEM;
  zt_host_mem_prepare(p, bytes);
  cudaError_t r = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
  *pin_err = 0;
  if (r != cudaSuccess) {
    ZT_LOGW("offload", "pinning %zu host bytes failed (%s); using them unpinned", bytes,
            cudaGetErrorString(r));
    cudaGetLastError(); /* not sticky: clear it so later calls do not see it */
    *pin_err = -ENOMEM;
  }
  *out = p;
  return 0;
}

static void pin_free(void *ctx, void *p, size_t bytes, int pinned) {
  (void)ctx;
  if (pinned) cudaHostUnregister(p);
  munmap(p, bytes);
}

static const zt_host_mem_ops pinned_ops = {.name = "cuda", .alloc = pin_alloc, .free = pin_free};

const zt_host_mem_ops *zt_host_mem_cuda(void) { return &pinned_ops; }
