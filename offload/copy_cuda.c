/* The CUDA copy engine (offload/copy_engine.h): each queue is a CUDA stream of its own, and a
 * ticket is an event recorded behind its operation. Every operation first waits, on the GPU,
 * for the compute queued before it was submitted, so a copy never overwrites a buffer that a
 * queued kernel still reads, and a gradient never leaves before the backward that made it;
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

#include "engine/log.h"
#include "offload/host_arena.h"

/* Tickets in flight per queue before submitting waits for the oldest. */
#define RING 512

typedef struct queue {
  cudaStream_t stream;
  cudaEvent_t ev[RING];      /* ticket k's event is ev[k % RING] while k > completed */
  int64_t submitted, completed;
} queue;

typedef struct cuda_engine {
  zt_copy_engine base;
  int device;
  cudaStream_t compute;
  cudaEvent_t compute_ev;    /* re-recorded at each submit: a wait captures the record it sees */
  queue q[ZT_COPY_QUEUES];
} cuda_engine;

static int check(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return 0;
  ZT_LOGE("offload", "copy engine (cuda): %s: %s", what, cudaGetErrorString(e));
  return -EIO;
}

/* Frees ring slot of ticket `submitted + 1` by waiting for the ticket RING before it. */
static int make_slot(queue *q) {
  int64_t old = q->submitted + 1 - RING;
  if (old <= q->completed) return 0;
  int rc = check(cudaEventSynchronize(q->ev[old % RING]), "waiting for an old copy");
  if (rc == 0) q->completed = old;
  return rc;
}

/* Orders the queue after the compute queued so far; returns 0 or -EIO. */
static int begin(cuda_engine *e, queue *q) {
  int rc = make_slot(q);
  if (rc == 0) rc = check(cudaEventRecord(e->compute_ev, e->compute), "recording the compute");
  if (rc == 0) rc = check(cudaStreamWaitEvent(q->stream, e->compute_ev, 0), "ordering a copy");
  return rc;
}

static int64_t finish(queue *q, cudaError_t launched, const char *what) {
  int rc = check(launched, what);
  if (rc == 0) rc = check(cudaEventRecord(q->ev[(q->submitted + 1) % RING], q->stream), what);
  return rc < 0 ? rc : ++q->submitted;
}

static int64_t cu_h2d(zt_copy_engine *base, void *dev, const void *host, size_t bytes) {
  cuda_engine *e = (cuda_engine *)base;
  queue *q = &e->q[ZT_COPY_H2D];
  int rc = begin(e, q);
  if (rc < 0) return rc;
  return finish(q, cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, q->stream),
                "cudaMemcpyAsync host to device");
}

static int64_t cu_zero(zt_copy_engine *base, void *dev, size_t bytes) {
  cuda_engine *e = (cuda_engine *)base;
  queue *q = &e->q[ZT_COPY_H2D];
  int rc = begin(e, q);
  if (rc < 0) return rc;
  return finish(q, cudaMemsetAsync(dev, 0, bytes, q->stream), "cudaMemsetAsync");
}

static int64_t cu_d2h(zt_copy_engine *base, void *host, const void *dev, size_t bytes) {
  cuda_engine *e = (cuda_engine *)base;
  queue *q = &e->q[ZT_COPY_D2H];
  int rc = begin(e, q);
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
  return check(r, "querying a copy") < 0 ? -EIO : 1;
}

static int cu_wait(zt_copy_engine *base, zt_copy_queue qi, int64_t ticket) {
  queue *q = &((cuda_engine *)base)->q[qi];
  if (bad_ticket(q, ticket)) return -EINVAL;
  if (ticket <= q->completed) return 0;
  return check(cudaEventSynchronize(q->ev[ticket % RING]), "waiting for a copy");
}

static int cu_compute_wait(zt_copy_engine *base, zt_copy_queue qi, int64_t ticket) {
  cuda_engine *e = (cuda_engine *)base;
  queue *q = &e->q[qi];
  if (bad_ticket(q, ticket)) return -EINVAL;
  if (ticket <= q->completed) return 0;
  return check(cudaStreamWaitEvent(e->compute, q->ev[ticket % RING], 0),
               "ordering the compute after a copy");
}

static void cu_close(zt_copy_engine *base) {
  cuda_engine *e = (cuda_engine *)base;
  cudaSetDevice(e->device);
  for (int i = 0; i < ZT_COPY_QUEUES; i++) {
    queue *q = &e->q[i];
    if (q->stream) cudaStreamSynchronize(q->stream);
    for (int k = 0; k < RING; k++)
      if (q->ev[k]) cudaEventDestroy(q->ev[k]);
    if (q->stream) cudaStreamDestroy(q->stream);
  }
  if (e->compute_ev) cudaEventDestroy(e->compute_ev);
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
    .close = cu_close,
};

int zt_copy_cuda_open(zt_copy_engine **out, int device, void *compute_stream) {
  *out = NULL;
  cuda_engine *e = calloc(1, sizeof *e);
  if (!e) return -ENOMEM;
  e->base.ops = &cuda_ops;
  e->device = device;
  e->compute = (cudaStream_t)compute_stream;
  int rc = check(cudaSetDevice(device), "cudaSetDevice");
  if (rc == 0)
    rc = check(cudaEventCreateWithFlags(&e->compute_ev, cudaEventDisableTiming), "cudaEventCreate");
  for (int i = 0; rc == 0 && i < ZT_COPY_QUEUES; i++) {
    rc = check(cudaStreamCreateWithFlags(&e->q[i].stream, cudaStreamNonBlocking),
               "cudaStreamCreate");
    for (int k = 0; rc == 0 && k < RING; k++)
      rc = check(cudaEventCreateWithFlags(&e->q[i].ev[k], cudaEventDisableTiming),
                 "cudaEventCreate");
  }
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
