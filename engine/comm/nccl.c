/* The NCCL communicator (engine/comm/comm_nccl.h): each collective is the NCCL call of the same
 * name, queued on the rank backend's stream or on the communicator's own (comm.h's queue: a
 * stream of its own, tickets as events on it). A failed call is logged with file and line, turned
 * into -errno, and is sticky: the ranks are out of step after it, so every later call returns
 * the first error until the communicator is closed.
 *
 * NCCL facts this relies on (nccl.h 2.28; NCCL's src/init.cc, group.cc, enqueue.cc):
 * - With blocking = 0, init, collectives and ncclCommFinalize return ncclInProgress while their
 *   work goes on in a thread of NCCL's; ncclCommGetAsyncError reads the state (ncclInProgress,
 *   ncclSuccess or the error; a peer's closed socket is ncclRemoteError). A call made while the
 *   state is ncclInProgress fails ("Attempt to use communicator before the previous operation
 *   returned ncclSuccess"), hence the poll after every call.
 * - A failed call on a nonblocking communicator also leaves its error as the async state.
 * - ncclCommAbort is always blocking: it raises the abort flags (host and device, so waiting
 *   kernels, sockets and NCCL's threads give up), joins NCCL's thread of the operation in
 *   progress, and frees the communicator (ranks of one process together, in the last one's
 *   abort or destroy). Nothing may touch the communicator after it.
 * - ncclCommFinalize waits for every rank of the host to finalize too (an intra-node barrier),
 *   unless aborted; ncclCommDestroy without a finalize does that wait in the last destroy of
 *   the process, for all its ranks at once. */
#include "engine/comm/comm_nccl.h"

#include <cuda_runtime_api.h>
#include <errno.h>
/* nccl.h declares a few functions as f() */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#include <pthread.h>
#include <stdatomic.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/base/check_cuda.h"
#include "engine/base/log.h"

_Static_assert(sizeof(zt_comm_nccl_id) == sizeof(ncclUniqueId),
               "zt_comm_nccl_id holds an ncclUniqueId");

/* ---- the cancel token ----------------------------------------------------------------------- */
/* state goes 0 (armed) -> 1 (one firer writes why) -> 2 (fired): readers see why only after the
 * release store of 2, and nobody writes it again, so reading needs no lock. */
struct zt_comm_nccl_cancel {
  atomic_int state;
  char why[200];
};

int zt_comm_nccl_cancel_create(zt_comm_nccl_cancel **c) {
  *c = calloc(1, sizeof **c);
  if (!*c) return -ENOMEM;
  atomic_init(&(*c)->state, 0);
  return 0;
}

void zt_comm_nccl_cancel_fire(zt_comm_nccl_cancel *c, const char *why) {
  int armed = 0;
  if (!c || !atomic_compare_exchange_strong(&c->state, &armed, 1)) return;
  snprintf(c->why, sizeof c->why, "%s", why && why[0] ? why : "no reason given");
  atomic_store_explicit(&c->state, 2, memory_order_release);
}

void zt_comm_nccl_cancel_free(zt_comm_nccl_cancel *c) { free(c); }

static const char *cancel_why(const zt_comm_nccl_cancel *c) {
  return c && atomic_load_explicit(&c->state, memory_order_acquire) == 2 ? c->why : NULL;
}

/* ---- the ranks of one communicator in this process ------------------------------------------ */
/* Keyed by the id; an entry lives while a rank of it is open here. close must know whether the
 * communicator has other ranks here (then NCCL's finalize would wait for theirs, which the same
 * thread may close next), and every rank here must know when one of them is aborted: a rank
 * aborted for any reason never joins another collective, so the others would wait for it
 * forever; they abort too. */
typedef struct local_group {
  struct local_group *next;
  zt_comm_nccl_id id;
  int opened, closed;      /* under g_local_mu */
  atomic_int aborted_rank; /* the first rank here that was aborted, -1 while none */
} local_group;

static pthread_mutex_t g_local_mu = PTHREAD_MUTEX_INITIALIZER;
static local_group *g_local;

static local_group *local_join(const zt_comm_nccl_id *id) {
  pthread_mutex_lock(&g_local_mu);
  local_group *g = g_local;
  while (g && memcmp(g->id.bytes, id->bytes, sizeof id->bytes)) g = g->next;
  if (!g && (g = calloc(1, sizeof *g))) {
    g->id = *id;
    atomic_init(&g->aborted_rank, -1);
    g->next = g_local;
    g_local = g;
  }
  if (g) g->opened++;
  pthread_mutex_unlock(&g_local_mu);
  return g;
}

static void local_leave(local_group *g) {
  pthread_mutex_lock(&g_local_mu);
  if (++g->closed == g->opened) {
    local_group **p = &g_local;
    while (*p != g) p = &(*p)->next;
    *p = g->next;
    free(g);
  }
  pthread_mutex_unlock(&g_local_mu);
}

static int local_opened(local_group *g) {
  pthread_mutex_lock(&g_local_mu);
  int n = g->opened;
  pthread_mutex_unlock(&g_local_mu);
  return n;
}

/* Read before every collective, so an atomic rather than the process-wide mutex. */
static int local_aborted_rank(local_group *g) { return atomic_load(&g->aborted_rank); }

static void local_mark_aborted(local_group *g, int rank) {
  int none = -1;
  atomic_compare_exchange_strong(&g->aborted_rank, &none, rank);
}

/* ---- the communicator ----------------------------------------------------------------------- */
typedef struct nccl_ctx {
  ncclComm_t comm; /* NCCL frees it in the abort: dead once aborted is set */
  int rank, world, device;
  float *one; /* a device float for the barrier's all-reduce */
  zt_comm_nccl_cancel *cancel;
  local_group *local;
  /* mu: every NCCL call on comm (NCCL allows one thread at a time), and the fields below.
   * Never held while sleeping or in cudaStreamSynchronize. */
  pthread_mutex_t mu;
  pthread_cond_t wake; /* the watchdog's sleep, cut short by close */
  int aborted, stop;
  int watching; /* the watchdog thread was started */
  pthread_t watchdog;
  int err; /* the first error as -errno, 0 while none */
  char err_text[256];
  /* The queue (comm.h), the rank's thread's alone: its stream, the events of its tickets
   * (marks[t % ZT_COMM_NCCL_MARKS] recorded for ticket t), one to order a stream after it and
   * one to order it after a stream. queued: a collective ever ran on it (until then no
   * collective needs ordering against it). */
  cudaStream_t queue;
  cudaEvent_t marks[ZT_COMM_NCCL_MARKS], tail, fence;
  long long ticket;
  int queued;
} nccl_ctx;

/* Records the first failure, logged once by engine/base's check with where it happened, and
 * returns it. mu held. */
static int fail_locked(nccl_ctx *c, int code, const char *what, const char *why,
                       const char *file, int line) {
  char call[160], text[256];
  snprintf(call, sizeof call, "rank %d: %s", c->rank, what);
  zt_check_fail("comm", file, line, call, code, why, text, sizeof text);
  if (!c->err) {
    c->err = code;
    snprintf(c->err_text, sizeof c->err_text, "rank %d (device %d): %s: %s", c->rank, c->device,
             what, why);
  }
  return c->err;
}

/* The NCCL and CUDA statuses through the check's converters (engine/base/check_cuda.h), their
 * text kept as the communicator's first failure. mu held for NCCL's. */
static int keep_locked(nccl_ctx *c, int code, const char *text) {
  if (!c->err) {
    c->err = code;
    snprintf(c->err_text, sizeof c->err_text, "rank %d (device %d): %.200s", c->rank,
             c->device, text);
  }
  return c->err;
}

static int check_nccl_locked(nccl_ctx *c, ncclResult_t r, const char *what, const char *file,
                             int line) {
  char call[160], text[256];
  snprintf(call, sizeof call, "rank %d: %s", c->rank, what);
  int rc = zt_check_nccl(r, "comm", call, file, line, text, sizeof text);
  return rc < 0 ? keep_locked(c, rc, text) : 0;
}

static int check_cuda(nccl_ctx *c, cudaError_t e, const char *what, const char *file, int line) {
  char call[160], text[256];
  snprintf(call, sizeof call, "rank %d: %s", c->rank, what);
  int rc = zt_check_cuda(e, "comm", call, file, line, text, sizeof text);
  if (rc == 0) return 0;
  pthread_mutex_lock(&c->mu);
  rc = keep_locked(c, rc, text);
  pthread_mutex_unlock(&c->mu);
  return rc;
}

#define CUDA_CALL(c, expr) check_cuda((c), (expr), #expr, __FILE__, __LINE__)

/* The one ncclCommAbort of the communicator, whoever asks first. mu held. */
static void abort_locked(nccl_ctx *c) {
  if (c->aborted) return;
  if (c->comm) {
    ncclResult_t r = ncclCommAbort(c->comm);
    if (r != ncclSuccess)
      ZT_LOGE("comm", "rank %d: ncclCommAbort: %s", c->rank, ncclGetErrorString(r));
  }
  c->aborted = 1;
  local_mark_aborted(c->local, c->rank);
}

/* A reason to stop that NCCL does not see: the token fired, or another rank of the
 * communicator in this process was aborted. The reason becomes the error (unless there is one)
 * and the communicator is aborted; returns 1. mu held. */
static int stop_check_locked(nccl_ctx *c) {
  if (c->aborted) return 0;
  char why[224];
  const char *t = cancel_why(c->cancel);
  int other = t ? -1 : local_aborted_rank(c->local);
  if (t)
    snprintf(why, sizeof why, "cancelled: %s", t);
  else if (other >= 0)
    snprintf(why, sizeof why, "rank %d in this process was aborted", other);
  else
    return 0;
  if (!c->err) {
    c->err = -ECANCELED;
    snprintf(c->err_text, sizeof c->err_text, "rank %d (device %d): %s", c->rank, c->device, why);
    ZT_LOGE("comm", "%s", c->err_text);
  }
  abort_locked(c);
  return 1;
}

static int usable_locked(nccl_ctx *c) {
  stop_check_locked(c);
  if (!c->err && c->aborted) {
    c->err = -ECANCELED;
    snprintf(c->err_text, sizeof c->err_text, "rank %d: the communicator was aborted", c->rank);
  }
  return c->err;
}

static ncclResult_t async_state_locked(nccl_ctx *c) {
  ncclResult_t s = ncclSuccess, r = ncclCommGetAsyncError(c->comm, &s);
  return r != ncclSuccess ? r : s;
}

static void nap(void) {
  struct timespec t = {0, ZT_COMM_NCCL_POLL_US * 1000L};
  nanosleep(&t, NULL);
}

/* r is what a call on the communicator returned: waits out ncclInProgress, polling the async
 * state and the token with mu released between polls, then records the outcome. Returns 0 or
 * the sticky error (the token's, or the watchdog's if it aborted meanwhile). mu held. */
static int settle_locked(nccl_ctx *c, ncclResult_t r, const char *what, const char *file,
                         int line) {
  /* a collective's ncclInProgress is its enqueue finishing, microseconds: a nap per call cost
   * about 1 ms each (per-unit collectives at a tenth of NCCL's bus bandwidth), so the first
   * polls only yield */
  for (int polls = 0; r == ncclInProgress; polls++) {
    pthread_mutex_unlock(&c->mu);
    if (polls < ZT_COMM_NCCL_SPIN_POLLS) sched_yield();
    else nap();
    pthread_mutex_lock(&c->mu);
    if (c->aborted || stop_check_locked(c)) return usable_locked(c);
    r = async_state_locked(c);
  }
  return check_nccl_locked(c, r, what, file, line);
}

/* One NCCL call on the communicator, unless it is unusable (usable_locked), its ncclInProgress
 * waited out. */
#define NCCL_RUN(c, rc, expr)                                                                    \
  do {                                                                                           \
    pthread_mutex_lock(&(c)->mu);                                                                \
    (rc) = usable_locked(c);                                                                     \
    if ((rc) == 0) (rc) = settle_locked((c), (expr), #expr, __FILE__, __LINE__);                 \
    pthread_mutex_unlock(&(c)->mu);                                                              \
  } while (0)

/* comm.h: every collective runs in the rank's call order whatever its stream. One on another
 * stream than the queue waits for the queue's work, and the queue's next for it. */
static int order_before(nccl_ctx *c, cudaStream_t s) {
  if (!c->queued || s == c->queue) return 0;
  int rc = CUDA_CALL(c, cudaEventRecord(c->tail, c->queue));
  return rc ? rc : CUDA_CALL(c, cudaStreamWaitEvent(s, c->tail, 0));
}
static int order_after(nccl_ctx *c, cudaStream_t s) {
  if (s == c->queue) {
    c->queued = 1;
    return 0;
  }
  if (!c->queued) return 0;
  int rc = CUDA_CALL(c, cudaEventRecord(c->fence, s));
  return rc ? rc : CUDA_CALL(c, cudaStreamWaitEvent(c->queue, c->fence, 0));
}

/* A collective: NCCL_RUN between the orderings. */
#define COLLECTIVE(c, rc, s, expr)                                                               \
  do {                                                                                           \
    (rc) = order_before((c), (s));                                                               \
    if ((rc) == 0) NCCL_RUN(c, rc, expr);                                                        \
    if ((rc) == 0) (rc) = order_after((c), (s));                                                 \
  } while (0)

static int n_rank(void *ctx) { return ((const nccl_ctx *)ctx)->rank; }
static int n_world(void *ctx) { return ((const nccl_ctx *)ctx)->world; }

static int n_all_reduce(void *ctx, const float *send, float *recv, size_t count, void *stream) {
  nccl_ctx *c = ctx;
  int rc;
  cudaStream_t s = stream;
  COLLECTIVE(c, rc, s, ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, c->comm, s));
  return rc;
}

static int n_reduce_scatter(void *ctx, const float *send, float *recv, size_t count,
                            void *stream) {
  nccl_ctx *c = ctx;
  int rc;
  cudaStream_t s = stream;
  COLLECTIVE(c, rc, s, ncclReduceScatter(send, recv, count, ncclFloat32, ncclSum, c->comm, s));
  return rc;
}

static int n_all_gather(void *ctx, const void *send, void *recv, size_t bytes, void *stream) {
  nccl_ctx *c = ctx;
  int rc;
  cudaStream_t s = stream;
  COLLECTIVE(c, rc, s, ncclAllGather(send, recv, bytes, ncclUint8, c->comm, s));
  return rc;
}

static int n_broadcast(void *ctx, const void *send, void *recv, size_t bytes, int root,
                       void *stream) {
  nccl_ctx *c = ctx;
  int rc;
  cudaStream_t s = stream;
  COLLECTIVE(c, rc, s, ncclBroadcast(send, recv, bytes, ncclUint8, root, c->comm, s));
  return rc;
}

/* NCCL has no barrier: a one-float all-reduce that every rank waits for on the host. The
 * watchdog's abort ends the wait early, so the error is read again after it. */
static int n_barrier(void *ctx, void *stream) {
  nccl_ctx *c = ctx;
  int rc;
  cudaStream_t s = stream;
  COLLECTIVE(c, rc, s, ncclAllReduce(c->one, c->one, 1, ncclFloat32, ncclSum, c->comm, s));
  if (rc == 0) rc = CUDA_CALL(c, cudaStreamSynchronize((cudaStream_t)stream));
  if (rc == 0) {
    pthread_mutex_lock(&c->mu);
    rc = usable_locked(c);
    pthread_mutex_unlock(&c->mu);
  }
  return rc;
}

static void *n_queue(void *ctx) { return ((nccl_ctx *)ctx)->queue; }

static int n_queue_after(void *ctx, void *stream) {
  nccl_ctx *c = ctx;
  int rc = CUDA_CALL(c, cudaEventRecord(c->fence, (cudaStream_t)stream));
  return rc ? rc : CUDA_CALL(c, cudaStreamWaitEvent(c->queue, c->fence, 0));
}

static long long n_queue_mark(void *ctx) {
  nccl_ctx *c = ctx;
  long long t = c->ticket + 1;
  int rc = CUDA_CALL(c, cudaEventRecord(c->marks[t % ZT_COMM_NCCL_MARKS], c->queue));
  if (rc < 0) return rc;
  c->ticket = t;
  return t;
}

/* The queue's failures are NCCL's async errors, which the watchdog turns into the sticky error
 * (and an abort, which ends the waits); a wait returns it. */
static int n_stream_wait(void *ctx, void *stream, long long ticket) {
  nccl_ctx *c = ctx;
  int rc;
  pthread_mutex_lock(&c->mu);
  rc = usable_locked(c);
  if (rc == 0 && (ticket < 1 || ticket > c->ticket))
    rc = fail_locked(c, -EINVAL, "waiting for a queue ticket", "no such ticket", __FILE__,
                     __LINE__);
  pthread_mutex_unlock(&c->mu);
  if (rc < 0) return rc;
  return CUDA_CALL(c, cudaStreamWaitEvent((cudaStream_t)stream,
                                          c->marks[ticket % ZT_COMM_NCCL_MARKS], 0));
}

static int n_queue_sync(void *ctx) {
  nccl_ctx *c = ctx;
  int rc = CUDA_CALL(c, cudaStreamSynchronize(c->queue));
  pthread_mutex_lock(&c->mu);
  if (rc == 0) rc = usable_locked(c);
  pthread_mutex_unlock(&c->mu);
  return rc;
}

static void n_abort(void *ctx) {
  nccl_ctx *c = ctx;
  pthread_mutex_lock(&c->mu);
  abort_locked(c);
  pthread_mutex_unlock(&c->mu);
}

/* The text is written once, under mu, with the error: taking mu orders this read after it. */
static const char *n_error_text(void *ctx) {
  nccl_ctx *c = ctx;
  pthread_mutex_lock(&c->mu);
  const char *t = c->err_text;
  pthread_mutex_unlock(&c->mu);
  return t;
}

static const zt_comm_ops nccl_ops = {
    .name = "nccl",
    .rank = n_rank,
    .world = n_world,
    .all_reduce = n_all_reduce,
    .reduce_scatter = n_reduce_scatter,
    .all_gather = n_all_gather,
    .broadcast = n_broadcast,
    .queue = n_queue,
    .queue_after = n_queue_after,
    .queue_mark = n_queue_mark,
    .stream_wait = n_stream_wait,
    .queue_sync = n_queue_sync,
    .barrier = n_barrier,
    .abort = n_abort,
    .error_text = n_error_text,
};

/* Until close: the token, the other ranks here, then NCCL's async state; any ends in the
 * abort. */
static void *watchdog_main(void *arg) {
  nccl_ctx *c = arg;
  pthread_mutex_lock(&c->mu);
  while (!c->stop && !c->aborted) {
    if (!stop_check_locked(c)) {
      ncclResult_t s = async_state_locked(c);
      if (s != ncclSuccess && s != ncclInProgress) {
        check_nccl_locked(c, s, "ncclCommGetAsyncError", __FILE__, __LINE__);
        abort_locked(c);
      }
    }
    if (c->stop || c->aborted) break;
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_nsec += ZT_COMM_NCCL_WATCH_MS * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
      t.tv_sec++;
      t.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&c->wake, &c->mu, &t);
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

/* NCCL reads its environment once, at its first call in the process: the ranks of a part on a
 * peer reach NCCL through open without a get_id, so both prepare it. NVLink SHARP stays off
 * unless set; NCCL_COMM_BLOCKING=1 would override our nonblocking config and make the waits
 * uncancellable again, so it goes. */
static pthread_once_t g_env_once = PTHREAD_ONCE_INIT;
static int g_env_errno;

static void prepare_env(void) {
  const char *blocking = getenv("NCCL_COMM_BLOCKING");
  if (blocking && strcmp(blocking, "0") != 0) {
    ZT_LOGW("comm", "NCCL_COMM_BLOCKING=%s ignored: zt's NCCL waits must stay cancellable",
            blocking);
    if (unsetenv("NCCL_COMM_BLOCKING") < 0) g_env_errno = errno;
  }
  if (setenv("NCCL_NVLS_ENABLE", "0", 0) < 0) g_env_errno = errno;
}

static int env_ready(char *err, size_t errlen) {
  pthread_once(&g_env_once, prepare_env);
  if (g_env_errno)
    snprintf(err, errlen, "preparing NCCL's environment: %s", strerror(g_env_errno));
  return -g_env_errno;
}

int zt_comm_nccl_get_id(zt_comm_nccl_id *id, char *err, size_t errlen) {
  int rc = env_ready(err, errlen);
  if (rc < 0) return rc;
  ncclUniqueId u;
  ncclResult_t r = ncclGetUniqueId(&u);
  if (r != ncclSuccess) {
    ZT_LOGE("comm", "%s:%d: ncclGetUniqueId: %s", __FILE__, __LINE__, ncclGetErrorString(r));
    snprintf(err, errlen, "ncclGetUniqueId: %s", ncclGetErrorString(r));
    return zt_nccl_errno(r);
  }
  memcpy(id->bytes, u.internal, sizeof id->bytes);
  return 0;
}

/* Frees what open took; the communicator is aborted or destroyed already. */
static void ctx_free(nccl_ctx *c) {
  local_leave(c->local);
  if (c->one) cudaFree(c->one);
  /* the queue's work ended with the communicator (finalized, or aborted, which ends kernels) */
  if (c->queue) cudaStreamSynchronize(c->queue);
  for (int i = 0; i < ZT_COMM_NCCL_MARKS; i++)
    if (c->marks[i]) cudaEventDestroy(c->marks[i]);
  if (c->tail) cudaEventDestroy(c->tail);
  if (c->fence) cudaEventDestroy(c->fence);
  if (c->queue) cudaStreamDestroy(c->queue);
  pthread_cond_destroy(&c->wake);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

static int ctx_new(nccl_ctx **out, int world, int rank, const zt_comm_nccl_id *id, int device,
                   zt_comm_nccl_cancel *cancel) {
  nccl_ctx *c = calloc(1, sizeof *c);
  if (!c) return -ENOMEM;
  *c = (nccl_ctx){.rank = rank, .world = world, .device = device, .cancel = cancel,
                  .mu = PTHREAD_MUTEX_INITIALIZER};
  pthread_condattr_t ca;
  int rc = -pthread_condattr_init(&ca);
  if (rc == 0) {
    rc = -pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (rc == 0) rc = -pthread_cond_init(&c->wake, &ca);
    pthread_condattr_destroy(&ca);
  }
  if (rc == 0 && !(c->local = local_join(id))) {
    pthread_cond_destroy(&c->wake);
    rc = -ENOMEM;
  }
  if (rc < 0) {
    free(c);
    return rc;
  }
  *out = c;
  return 0;
}

int zt_comm_nccl_open(zt_comm *out, int world, int rank, const zt_comm_nccl_id *id, int device,
                      zt_comm_nccl_cancel *cancel, char *err, size_t errlen) {
  out->ops = NULL;
  out->ctx = NULL;
  if (world < 1 || rank < 0 || rank >= world || device < 0) {
    snprintf(err, errlen, "nccl: rank %d of world %d on device %d is out of range", rank, world,
             device);
    return -EINVAL;
  }
  int rc = env_ready(err, errlen);
  if (rc < 0) return rc;
  nccl_ctx *c;
  rc = ctx_new(&c, world, rank, id, device, cancel);
  if (rc < 0) {
    snprintf(err, errlen, "nccl: rank %d: %s", rank, strerror(-rc));
    return rc;
  }
  pthread_mutex_lock(&c->mu);
  rc = usable_locked(c); /* a token fired already: no device touched */
  pthread_mutex_unlock(&c->mu);
  if (rc == 0) rc = CUDA_CALL(c, cudaSetDevice(device));
  if (rc == 0) rc = CUDA_CALL(c, cudaMalloc((void **)&c->one, sizeof(float)));
  if (rc == 0) rc = CUDA_CALL(c, cudaMemset(c->one, 0, sizeof(float)));
  if (rc == 0) rc = CUDA_CALL(c, cudaStreamCreateWithFlags(&c->queue, cudaStreamNonBlocking));
  for (int i = 0; rc == 0 && i < ZT_COMM_NCCL_MARKS; i++)
    rc = CUDA_CALL(c, cudaEventCreateWithFlags(&c->marks[i], cudaEventDisableTiming));
  if (rc == 0) rc = CUDA_CALL(c, cudaEventCreateWithFlags(&c->tail, cudaEventDisableTiming));
  if (rc == 0) rc = CUDA_CALL(c, cudaEventCreateWithFlags(&c->fence, cudaEventDisableTiming));
  if (rc == 0) {
    ncclUniqueId u;
    memcpy(u.internal, id->bytes, sizeof u.internal);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    NCCL_RUN(c, rc, ncclCommInitRankConfig(&c->comm, world, u, rank, &cfg));
  }
  if (rc == 0) {
    int e = pthread_create(&c->watchdog, NULL, watchdog_main, c);
    pthread_mutex_lock(&c->mu);
    if (e)
      rc = fail_locked(c, -e, "starting the watchdog thread", strerror(e), __FILE__, __LINE__);
    c->watching = !e;
    pthread_mutex_unlock(&c->mu);
  }
  if (rc < 0) {
    /* a communicator whose init failed or was cancelled is only freed by the abort */
    pthread_mutex_lock(&c->mu);
    abort_locked(c);
    pthread_mutex_unlock(&c->mu);
    snprintf(err, errlen, "%s", c->err_text);
    ctx_free(c);
    return rc;
  }
  out->ops = &nccl_ops;
  out->ctx = c;
  return 0;
}

/* Healthy and alone in this process: finalize (cancellable), then destroy. mu held. */
static void finalize_locked(nccl_ctx *c) {
  if (settle_locked(c, ncclCommFinalize(c->comm), "ncclCommFinalize", __FILE__, __LINE__) < 0) {
    abort_locked(c);
    return;
  }
  ncclResult_t r = ncclCommDestroy(c->comm);
  if (r != ncclSuccess)
    ZT_LOGE("comm", "rank %d: ncclCommDestroy: %s", c->rank, ncclGetErrorString(r));
}

void zt_comm_nccl_close(zt_comm *cm) {
  if (!cm || !cm->ctx) return;
  nccl_ctx *c = cm->ctx;
  if (c->watching) {
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_cond_signal(&c->wake);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->watchdog, NULL);
  }
  pthread_mutex_lock(&c->mu);
  if (!c->aborted) {
    if (c->err || stop_check_locked(c)) {
      abort_locked(c);
    } else if (local_opened(c->local) > 1) {
      ncclResult_t r = ncclCommDestroy(c->comm);
      if (r != ncclSuccess)
        ZT_LOGE("comm", "rank %d: ncclCommDestroy: %s", c->rank, ncclGetErrorString(r));
    } else {
      finalize_locked(c);
    }
  }
  pthread_mutex_unlock(&c->mu);
  ctx_free(c);
  cm->ops = NULL;
  cm->ctx = NULL;
}
