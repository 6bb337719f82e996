/* The CPU copy engine: each queue is a fixed ring of operations served in order by one worker
 * thread. Submitting blocks only when the ring is full (a sign the caller runs far ahead). */
#include "offload/copy_engine.h"
#include "engine/base/clock.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RING 256

typedef enum op_kind { OP_COPY, OP_ZERO, OP_ACCUMULATE } op_kind;

typedef struct copy_op {
  op_kind kind;
  void *dst;
  const void *src;
  size_t bytes;
} copy_op;

typedef struct queue {
  pthread_t thread;
  int started;
  copy_op ring[RING];
  int64_t submitted, completed; /* tickets: op k (1-based) is done when completed >= k */
  int stop;
  uint64_t busy_ns;
} queue;

typedef struct cpu_engine {
  zt_copy_engine base;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* any change of submitted/completed/stop */
  double rate;
  queue q[ZT_COPY_QUEUES];
  uint64_t compute_t0, compute_ns; /* the caller's, unlocked */
  uint64_t wait_ns;                /* the caller's time in cpu_wait, unlocked */
  int64_t compute_tickets;         /* the caller's, unlocked */
} cpu_engine;

static void run_op(const copy_op *op) {
  switch (op->kind) {
  case OP_COPY:
    memcpy(op->dst, op->src, op->bytes);
    break;
  case OP_ZERO:
    memset(op->dst, 0, op->bytes);
    break;
  case OP_ACCUMULATE: {
    float *h = op->dst;
    const float *d = op->src;
    size_t n = op->bytes / sizeof(float);
    for (size_t i = 0; i < n; i++) h[i] += d[i];
    break;
  }
  }
}

/* Sleeps out the rest of the time the emulated link would need for `bytes`. */
static void pace(double rate, size_t bytes, uint64_t t0) {
  if (rate <= 0) return;
  uint64_t need = (uint64_t)((double)bytes / rate * 1e9);
  uint64_t spent = zt_now_ns() - t0;
  if (spent >= need) return;
  uint64_t left = need - spent;
  struct timespec ts = {.tv_sec = (time_t)(left / 1000000000u), .tv_nsec = (long)(left % 1000000000u)};
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
  }
}

typedef struct worker_arg {
  cpu_engine *e;
  int qi;
} worker_arg;

static void *worker(void *p) {
  cpu_engine *e = ((worker_arg *)p)->e;
  queue *q = &e->q[((worker_arg *)p)->qi];
  free(p);
  pthread_mutex_lock(&e->mu);
  for (;;) {
    while (q->completed == q->submitted && !q->stop) pthread_cond_wait(&e->cv, &e->mu);
    if (q->completed == q->submitted) break; /* stop, and nothing left */
    copy_op op = q->ring[q->completed % RING];
    pthread_mutex_unlock(&e->mu);
    uint64_t t0 = zt_now_ns();
    run_op(&op);
    pace(e->rate, op.bytes, t0);
    uint64_t spent = zt_now_ns() - t0;
    pthread_mutex_lock(&e->mu);
    q->busy_ns += spent;
    q->completed++;
    pthread_cond_broadcast(&e->cv);
  }
  pthread_mutex_unlock(&e->mu);
  return NULL;
}

static int64_t submit(cpu_engine *e, zt_copy_queue qi, op_kind kind, void *dst, const void *src,
                      size_t bytes) {
  queue *q = &e->q[qi];
  pthread_mutex_lock(&e->mu);
  while (q->submitted - q->completed >= RING) pthread_cond_wait(&e->cv, &e->mu);
  q->ring[q->submitted % RING] = (copy_op){.kind = kind, .dst = dst, .src = src, .bytes = bytes};
  int64_t ticket = ++q->submitted;
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
  return ticket;
}

/* `after` needs nothing here: the compute ran on the caller's thread before it submitted. */
static int64_t cpu_h2d(zt_copy_engine *base, void *dev, const void *host, size_t bytes,
                       int64_t after) {
  (void)after;
  return submit((cpu_engine *)base, ZT_COPY_H2D, OP_COPY, dev, host, bytes);
}

static int64_t cpu_zero(zt_copy_engine *base, void *dev, size_t bytes, int64_t after) {
  (void)after;
  return submit((cpu_engine *)base, ZT_COPY_H2D, OP_ZERO, dev, NULL, bytes);
}

static int64_t cpu_grad_accumulate(zt_copy_engine *base, float *host, const float *dev, size_t n) {
  return submit((cpu_engine *)base, ZT_COPY_D2H, OP_ACCUMULATE, host, dev, n * sizeof(float));
}

static int64_t cpu_d2h(zt_copy_engine *base, void *host, const void *dev, size_t bytes) {
  return submit((cpu_engine *)base, ZT_COPY_D2H, OP_COPY, host, dev, bytes);
}

static int cpu_query(zt_copy_engine *base, zt_copy_queue qi, int64_t ticket) {
  cpu_engine *e = (cpu_engine *)base;
  pthread_mutex_lock(&e->mu);
  int done = e->q[qi].completed >= ticket;
  pthread_mutex_unlock(&e->mu);
  return done;
}

static int cpu_wait(zt_copy_engine *base, zt_copy_queue qi, int64_t ticket) {
  cpu_engine *e = (cpu_engine *)base;
  pthread_mutex_lock(&e->mu);
  if (ticket > e->q[qi].submitted) {
    pthread_mutex_unlock(&e->mu);
    return -EINVAL;
  }
  if (e->q[qi].completed < ticket) {
    uint64_t t0 = zt_now_ns();
    while (e->q[qi].completed < ticket) pthread_cond_wait(&e->cv, &e->mu);
    e->wait_ns += zt_now_ns() - t0;
  }
  pthread_mutex_unlock(&e->mu);
  return 0;
}

static int cpu_compute_mark(zt_copy_engine *base, int end) {
  cpu_engine *e = (cpu_engine *)base;
  if (!end) e->compute_t0 = zt_now_ns();
  else e->compute_ns += zt_now_ns() - e->compute_t0;
  return 0;
}

static int64_t cpu_compute_ticket(zt_copy_engine *base) {
  return ++((cpu_engine *)base)->compute_tickets;
}

static void cpu_busy(zt_copy_engine *base, zt_copy_busy *out) {
  cpu_engine *e = (cpu_engine *)base;
  pthread_mutex_lock(&e->mu);
  for (int i = 0; i < ZT_COPY_QUEUES; i++) out->queue_ns[i] = e->q[i].busy_ns;
  pthread_mutex_unlock(&e->mu);
  out->compute_ns = e->compute_ns;
  out->wait_ns = e->wait_ns;
}

static void cpu_close(zt_copy_engine *base) {
  cpu_engine *e = (cpu_engine *)base;
  pthread_mutex_lock(&e->mu);
  for (int i = 0; i < ZT_COPY_QUEUES; i++) e->q[i].stop = 1;
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
  for (int i = 0; i < ZT_COPY_QUEUES; i++)
    if (e->q[i].started) pthread_join(e->q[i].thread, NULL);
  pthread_cond_destroy(&e->cv);
  pthread_mutex_destroy(&e->mu);
  free(e);
}

static const zt_copy_ops cpu_ops = {
    .name = "cpu",
    .h2d = cpu_h2d,
    .zero = cpu_zero,
    .grad_accumulate = cpu_grad_accumulate,
    .d2h = cpu_d2h,
    .query = cpu_query,
    .wait = cpu_wait,
    .compute_wait = cpu_wait, /* the CPU backend computes on the caller's thread */
    .compute_mark = cpu_compute_mark,
    .compute_ticket = cpu_compute_ticket,
    .busy = cpu_busy,
    .close = cpu_close,
};

int zt_copy_cpu_open(zt_copy_engine **out, double link_bytes_per_s) {
  *out = NULL;
  if (!(link_bytes_per_s >= 0)) return -EINVAL;
  cpu_engine *e = calloc(1, sizeof *e);
  if (!e) return -ENOMEM;
  e->base.ops = &cpu_ops;
  e->rate = link_bytes_per_s;
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv, NULL);
  for (int i = 0; i < ZT_COPY_QUEUES; i++) {
    worker_arg *a = malloc(sizeof *a);
    int rc = a ? 0 : ENOMEM;
    if (a) {
      *a = (worker_arg){.e = e, .qi = i};
      rc = pthread_create(&e->q[i].thread, NULL, worker, a);
      if (rc) free(a);
    }
    if (rc) {
      cpu_close(&e->base);
      return -rc;
    }
    e->q[i].started = 1;
  }
  *out = &e->base;
  return 0;
}
