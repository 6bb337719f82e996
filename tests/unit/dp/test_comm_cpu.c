/* The CPU group (engine/comm/comm.h) against a naive reference: every collective for world
 * sizes 1, 2, 3 and 5, out of place and in place, sizes smaller than the world included, called
 * on the backend's stream and on the communicator's queue; sums bitwise equal to adding in rank
 * order on every rank; calls that do not match are an error on every rank and leave the group
 * usable; abort releases ranks waiting in a collective; bad arguments to the opens.
 * The queue: queuing returns before the other ranks have called; a wait returns only once they
 * have, and one for an early ticket does not wait for later calls; queued and synchronous calls
 * mixed on a rank keep the order of the calls; a queued mismatch, an injected fault (counted
 * over both kinds of call) and an abort reach every rank's wait with the reason, calls queued
 * behind them are not run, and nothing hangs. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/comm/comm.h"
#include "tests/unit/model/mcheck.h"

#define MAXW 5

/* Rank r's value at i: distinct per rank, with fractions so that the order of additions
 * matters in fp32. */
static float val(int r, size_t i) {
  return (float)((int)((i * 7 + (size_t)r * 13) % 17) - 8) * 0.37f + (float)r * 1.0e-3f +
         (float)i * 1.0e-7f;
}

/* The sum over ranks at i, added in rank order. */
static float ref_sum(int W, size_t i) {
  float s = val(0, i);
  for (int r = 1; r < W; r++) s += val(r, i);
  return s;
}

typedef struct rank_arg {
  zt_comm c;
  int r, W;
  int fails;
  int waits; /* queued calls waited for (settle) */
  int (*body)(struct rank_arg *);
} rank_arg;

static void *rank_thread(void *p) {
  rank_arg *a = p;
  a->fails = a->body(a);
  return NULL;
}

/* Runs body on W rank threads of a new group, opened with ZT_FAULT_COMM=fault unless NULL;
 * returns the failures. */
static int run_group_fault(int W, int (*body)(rank_arg *), const char *fault) {
  zt_comm_cpu_group *g;
  rank_arg a[MAXW];
  pthread_t th[MAXW];
  int fails = 0;
  if (fault) setenv("ZT_FAULT_COMM", fault, 1);
  int rc = zt_comm_cpu_group_open(&g, W);
  if (fault) unsetenv("ZT_FAULT_COMM");
  if (MC_EXPECT(rc == 0, "group_open(%d)", W)) return 1;
  for (int r = 0; r < W; r++) {
    a[r] = (rank_arg){.r = r, .W = W, .body = body};
    if (zt_comm_cpu_open(&a[r].c, g, r) < 0 || pthread_create(&th[r], NULL, rank_thread, &a[r])) {
      fprintf(stderr, "cannot start rank %d\n", r);
      exit(1);
    }
  }
  for (int r = 0; r < W; r++) {
    pthread_join(th[r], NULL);
    fails += a[r].fails;
    zt_comm_cpu_close(&a[r].c);
  }
  zt_comm_cpu_group_close(g);
  return fails;
}

static int run_group(int W, int (*body)(rank_arg *)) { return run_group_fault(W, body, NULL); }

/* The bodies up to barrier_body run twice: on the backend's stream (NULL), and with g_queued on
 * the communicator's queue, reading results only once a wait covers the call (settle). */
static int g_queued;

static void *stream_of(const rank_arg *a) { return g_queued ? a->c.ops->queue(a->c.ctx) : NULL; }

/* rc of a call; for a queued one, what waiting for it returns: stream_wait on a ticket, and
 * queue_sync every other time. */
static int settle(rank_arg *a, int rc) {
  const zt_comm_ops *o = a->c.ops;
  if (!g_queued || rc < 0) return rc;
  if (++a->waits % 2 == 0) return o->queue_sync(a->c.ctx);
  long long t = o->queue_mark(a->c.ctx);
  return t < 0 ? (int)t : o->stream_wait(a->c.ctx, NULL, t);
}

static const size_t counts[] = {0, 1, 4, 1001};

static int all_reduce_body(rank_arg *a) {
  int fails = 0;
  const zt_comm_ops *o = a->c.ops;
  for (size_t t = 0; t < sizeof counts / sizeof counts[0]; t++) {
    size_t n = counts[t];
    float *x = malloc((n + 1) * sizeof *x), *y = malloc((n + 1) * sizeof *y);
    for (size_t i = 0; i < n; i++) x[i] = val(a->r, i);
    for (int inplace = 0; inplace < 2; inplace++) {
      float *out = inplace ? x : y;
      if (inplace)
        for (size_t i = 0; i < n; i++) x[i] = val(a->r, i);
      int rc = settle(a, o->all_reduce(a->c.ctx, x, out, n, stream_of(a)));
      fails += MC_EXPECT(rc == 0, "W %d rank %d all_reduce(%zu): %d %s", a->W, a->r, n, rc,
                         o->error_text(a->c.ctx));
      for (size_t i = 0; i < n && rc == 0; i++)
        if (MC_EXPECT(out[i] == ref_sum(a->W, i), "W %d rank %d all_reduce(%zu%s)[%zu] = %.9g, "
                      "rank-order sum %.9g", a->W, a->r, n, inplace ? ", in place" : "", i,
                      (double)out[i], (double)ref_sum(a->W, i))) {
          fails++;
          break;
        }
    }
    free(x);
    free(y);
  }
  return fails;
}

static int reduce_scatter_body(rank_arg *a) {
  int fails = 0;
  const zt_comm_ops *o = a->c.ops;
  for (size_t t = 0; t < 3; t++) {
    size_t c = counts[t] + (t == 2 ? 3 : 0), n = c * (size_t)a->W;
    float *x = malloc((n + 1) * sizeof *x), *y = malloc((c + 1) * sizeof *y);
    for (int inplace = 0; inplace < 2; inplace++) {
      for (size_t i = 0; i < n; i++) x[i] = val(a->r, i);
      float *out = inplace ? x + (size_t)a->r * c : y;
      int rc = settle(a, o->reduce_scatter(a->c.ctx, x, out, c, stream_of(a)));
      fails += MC_EXPECT(rc == 0, "W %d rank %d reduce_scatter(%zu): %d", a->W, a->r, c, rc);
      for (size_t i = 0; i < c && rc == 0; i++) {
        float want = ref_sum(a->W, (size_t)a->r * c + i);
        if (MC_EXPECT(out[i] == want, "W %d rank %d reduce_scatter(%zu%s)[%zu] = %.9g, want "
                      "%.9g", a->W, a->r, c, inplace ? ", in place" : "", i, (double)out[i],
                      (double)want)) {
          fails++;
          break;
        }
      }
    }
    free(x);
    free(y);
  }
  return fails;
}

static int all_gather_body(rank_arg *a) {
  int fails = 0;
  const zt_comm_ops *o = a->c.ops;
  static const size_t sizes[] = {0, 1, 3, 64};
  for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; t++) {
    size_t b = sizes[t], n = b * (size_t)a->W;
    unsigned char *mine = malloc(b + 1), *all = malloc(n + 1);
    for (size_t i = 0; i < b; i++) mine[i] = (unsigned char)(a->r * 31 + (int)i);
    for (int inplace = 0; inplace < 2; inplace++) {
      memset(all, 0xee, n);
      const void *send = mine;
      if (inplace) {
        memcpy(all + (size_t)a->r * b, mine, b);
        send = all + (size_t)a->r * b;
      }
      int rc = settle(a, o->all_gather(a->c.ctx, send, all, b, stream_of(a)));
      fails += MC_EXPECT(rc == 0, "W %d rank %d all_gather(%zu): %d", a->W, a->r, b, rc);
      for (size_t i = 0; i < n && rc == 0; i++) {
        unsigned char want = (unsigned char)((int)(i / b) * 31 + (int)(i % b));
        if (MC_EXPECT(all[i] == want, "W %d rank %d all_gather(%zu%s)[%zu] = %d, want %d",
                      a->W, a->r, b, inplace ? ", in place" : "", i, all[i], want)) {
          fails++;
          break;
        }
      }
    }
    free(mine);
    free(all);
  }
  return fails;
}

static int broadcast_body(rank_arg *a) {
  int fails = 0;
  const zt_comm_ops *o = a->c.ops;
  for (int root = 0; root < a->W; root++)
    for (int inplace = 0; inplace < 2; inplace++) {
      unsigned char send[5], recv[5];
      for (int i = 0; i < 5; i++) send[i] = (unsigned char)(a->r * 10 + i);
      memset(recv, 0, sizeof recv);
      unsigned char *out = inplace ? send : recv;
      int rc = settle(a, o->broadcast(a->c.ctx, send, out, 5, root, stream_of(a)));
      fails += MC_EXPECT(rc == 0, "W %d rank %d broadcast root %d: %d", a->W, a->r, root, rc);
      for (int i = 0; i < 5 && rc == 0; i++)
        if (MC_EXPECT(out[i] == root * 10 + i, "W %d rank %d broadcast(root %d%s)[%d] = %d",
                      a->W, a->r, root, inplace ? ", in place" : "", i, out[i])) {
          fails++;
          break;
        }
    }
  return fails;
}

/* What every rank wrote before the barrier is seen by every rank after it. */
static atomic_int g_arrived[MAXW];

static int barrier_body(rank_arg *a) {
  int fails = 0;
  for (int round = 1; round <= 3; round++) {
    atomic_store(&g_arrived[a->r], round);
    /* on the queue too it returns only when every rank has called it */
    int rc = a->c.ops->barrier(a->c.ctx, stream_of(a));
    fails += MC_EXPECT(rc == 0, "barrier: %d", rc);
    for (int r = 0; r < a->W; r++)
      fails += MC_EXPECT(atomic_load(&g_arrived[r]) >= round, "W %d rank %d: rank %d had not "
                         "reached barrier %d", a->W, a->r, r, round);
    rc = a->c.ops->barrier(a->c.ctx, NULL); /* nobody starts the next round before all checked */
    fails += MC_EXPECT(rc == 0, "barrier: %d", rc);
  }
  return fails;
}

/* Rank 1 calls all_gather where the others call all_reduce; then a NULL buffer; then the
 * group still works. */
static int mismatch_body(rank_arg *a) {
  int fails = 0;
  const zt_comm_ops *o = a->c.ops;
  float x[4] = {1, 2, 3, 4}, y[4];
  int rc = a->r == 1 ? o->all_gather(a->c.ctx, x, y, 4, NULL)
                     : o->all_reduce(a->c.ctx, x, y, 4, NULL);
  fails += MC_EXPECT(rc == -EINVAL && strstr(o->error_text(a->c.ctx), "rank 1 called all_gather")
                     && strstr(o->error_text(a->c.ctx), "rank 0 called all_reduce"),
                     "rank %d: mismatch gave %d '%s'", a->r, rc, o->error_text(a->c.ctx));
  rc = o->all_reduce(a->c.ctx, a->r == a->W - 1 ? NULL : x, y, 4, NULL);
  fails += MC_EXPECT(rc == -EINVAL && strstr(o->error_text(a->c.ctx), "NULL buffer"),
                     "rank %d: NULL buffer gave %d '%s'", a->r, rc, o->error_text(a->c.ctx));
  rc = o->broadcast(a->c.ctx, x, y, 4, a->W, NULL);
  fails += MC_EXPECT(rc == -EINVAL && strstr(o->error_text(a->c.ctx), "root"),
                     "rank %d: bad root gave %d '%s'", a->r, rc, o->error_text(a->c.ctx));
  rc = o->all_reduce(a->c.ctx, x, y, 4, NULL);
  fails += MC_EXPECT(rc == 0 && y[3] == 4.0f * (float)a->W, "rank %d: all_reduce after the "
                     "errors: %d, %g", a->r, rc, (double)y[3]);
  return fails;
}

/* The last rank aborts instead of joining a barrier; the others, waiting in it, are released
 * with -ECANCELED, and so is every later call. */
static int abort_body(rank_arg *a) {
  int fails = 0;
  const zt_comm_ops *o = a->c.ops;
  if (a->r == a->W - 1) o->abort(a->c.ctx);
  else fails += MC_EXPECT(o->barrier(a->c.ctx, NULL) == -ECANCELED, "rank %d: barrier after "
                          "abort did not fail", a->r);
  float x = 1, y;
  fails += MC_EXPECT(o->all_reduce(a->c.ctx, &x, &y, 1, NULL) == -ECANCELED,
                     "rank %d: all_reduce after abort did not fail", a->r);
  return fails;
}

/* ---- the queue ------------------------------------------------------------------------------ */

static void nap_us(long us) {
  struct timespec ts = {.tv_sec = 0, .tv_nsec = us * 1000};
  nanosleep(&ts, NULL);
}

/* Waits up to 10 s for *flag to reach v; 1 when it did not. The tests below make a rank wait so
 * for another's progress that a wrong queue would hold back: it fails instead of hanging. */
static int wait_for(atomic_int *flag, int v) {
  for (int i = 0; i < 100000; i++) {
    if (atomic_load(flag) >= v) return 0;
    nap_us(100);
  }
  return 1;
}

/* Call k of a sequence every rank makes alike: kind k % 4 (all_reduce, reduce_scatter,
 * all_gather, broadcast with root k % W), sizes growing with k, in place when k / 4 is odd,
 * values shifted by k so that a call mixed up with another gives other bits. Where recv is not
 * the send buffer it starts as 0xee bytes, so a call that did not run is seen. */
typedef struct job {
  int k;
  unsigned char *mem; /* send and recv */
  unsigned char *out; /* recv, as the rank checks it */
  size_t n;           /* floats or bytes at out */
} job;

static int job_inplace(int k) { return k / 4 % 2; }

static int job_issue(rank_arg *a, job *j, int k, void *stream) {
  const zt_comm_ops *o = a->c.ops;
  int W = a->W, r = a->r, in = job_inplace(k);
  size_t b = (size_t)k + 1, c = (size_t)(k % 5) + 1, uk = (size_t)k;
  *j = (job){.k = k};
  switch (k % 4) {
  case 0: {
    j->n = b;
    j->mem = malloc(2 * b * sizeof(float));
    float *x = (float *)j->mem;
    j->out = in ? j->mem : (unsigned char *)(x + b);
    if (!in) memset(j->out, 0xee, b * sizeof(float));
    for (size_t i = 0; i < b; i++) x[i] = val(r, i + uk);
    return o->all_reduce(a->c.ctx, x, (float *)j->out, b, stream);
  }
  case 1: {
    size_t n = c * (size_t)W;
    j->n = c;
    j->mem = malloc((n + c) * sizeof(float));
    float *x = (float *)j->mem;
    j->out = (unsigned char *)(in ? x + (size_t)r * c : x + n);
    if (!in) memset(j->out, 0xee, c * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = val(r, i + uk);
    return o->reduce_scatter(a->c.ctx, x, (float *)j->out, c, stream);
  }
  case 2: {
    j->n = b * (size_t)W;
    j->mem = malloc(b + j->n);
    j->out = j->mem + b;
    memset(j->out, 0xee, j->n);
    unsigned char *mine = in ? j->out + (size_t)r * b : j->mem;
    for (size_t i = 0; i < b; i++) mine[i] = (unsigned char)((size_t)r * 31 + i + uk);
    return o->all_gather(a->c.ctx, mine, j->out, b, stream);
  }
  default: {
    j->n = b;
    j->mem = malloc(2 * b);
    j->out = in ? j->mem : j->mem + b;
    if (!in) memset(j->out, 0xee, b);
    for (size_t i = 0; i < b; i++) j->mem[i] = (unsigned char)((size_t)r * 10 + i + uk);
    return o->broadcast(a->c.ctx, j->mem, j->out, b, k % W, stream);
  }
  }
}

/* Whether call j gave what it should; 1 and a message when not. */
static int job_check(const rank_arg *a, const job *j) {
  int W = a->W, r = a->r, k = j->k;
  size_t uk = (size_t)k, b = uk + 1;
  for (size_t i = 0; i < j->n; i++) {
    float got = 0, want = 0;
    switch (k % 4) {
    case 0: got = ((const float *)j->out)[i], want = ref_sum(W, i + uk); break;
    case 1: got = ((const float *)j->out)[i], want = ref_sum(W, (size_t)r * j->n + i + uk); break;
    case 2: got = j->out[i], want = (unsigned char)(i / b * 31 + i % b + uk); break;
    default: got = j->out[i], want = (unsigned char)((size_t)(k % W) * 10 + i + uk); break;
    }
    if (got != want)
      return MC_EXPECT(0, "W %d rank %d call %d (kind %d%s)[%zu] = %.9g, want %.9g", W, r, k,
                       k % 4, job_inplace(k) ? ", in place" : "", i, (double)got, (double)want);
  }
  return 0;
}

/* Whether call j (not in place) left its recv as it was: 1 and a message when not. */
static int job_untouched(const rank_arg *a, const job *j) {
  size_t bytes = j->k % 4 < 2 ? j->n * sizeof(float) : j->n;
  for (size_t i = 0; i < bytes; i++)
    if (j->out[i] != 0xee)
      return MC_EXPECT(0, "rank %d: call %d, which should not have run, wrote its recv", a->r,
                       j->k);
  return 0;
}

#define NJOBS 40
enum { F_QUEUED, F_WAITING, F_EARLY_DONE, F_ABORTED, NFLAGS };
static atomic_int g_flag[NFLAGS];
static atomic_int g_started[MAXW]; /* calls a rank has begun */
static void *g_queues[MAXW];

static void reset_flags(void) {
  for (int i = 0; i < NFLAGS; i++) atomic_store(&g_flag[i], 0);
  for (int r = 0; r < MAXW; r++) atomic_store(&g_started[r], 0);
}

/* Rank 0 queues NJOBS calls while the others have called none (so they are all pending on its
 * queue), then waits on the ticket of its 20th: the others begin their calls only once it is
 * waiting (and a moment later, so that a wait that does not wait returns first), and make the
 * 21st only once that wait has returned. The others mix queued and synchronous calls. Before
 * that: the tickets and queue handles themselves. */
static int async_body(rank_arg *a) {
  const zt_comm_ops *o = a->c.ops;
  void *ctx = a->c.ctx, *q = o->queue(ctx);
  int fails = 0, rc;
  job j[NJOBS];
  g_queues[a->r] = q;
  long long t0 = o->queue_mark(ctx);
  fails += MC_EXPECT(q && t0 >= 1, "rank %d: queue %p, first ticket %lld", a->r, q, t0);
  rc = o->stream_wait(ctx, NULL, t0);
  fails += MC_EXPECT(rc == 0, "rank %d: stream_wait on the ticket of nothing: %d", a->r, rc);
  fails += MC_EXPECT(o->queue_after(ctx, NULL) == 0 && o->queue_sync(ctx) == 0 &&
                     o->queue_mark(ctx) == t0, "rank %d: an empty queue", a->r);
  rc = o->stream_wait(ctx, NULL, t0 + 1);
  fails += MC_EXPECT(rc == -EINVAL && strstr(o->error_text(ctx), "ticket"), "rank %d: "
                     "stream_wait on a ticket not given: %d '%s'", a->r, rc, o->error_text(ctx));
  fails += MC_EXPECT(o->stream_wait(ctx, NULL, 0) == -EINVAL, "rank %d: ticket 0", a->r);
  rc = o->barrier(ctx, NULL); /* a bad ticket is no failure of the group */
  fails += MC_EXPECT(rc == 0, "rank %d: barrier: %d %s", a->r, rc, o->error_text(ctx));
  for (int r = 0; r < a->W; r++)
    fails += MC_EXPECT(r == a->r || g_queues[r] != q, "ranks %d and %d share a queue", r, a->r);
  if (a->r == 0) {
    long long t[NJOBS];
    for (int k = 0; k < NJOBS; k++) {
      rc = job_issue(a, &j[k], k, q);
      t[k] = o->queue_mark(ctx);
      fails += MC_EXPECT(rc == 0 && t[k] > (k ? t[k - 1] : t0), "rank 0: queuing call %d: %d, "
                         "ticket %lld", k, rc, t[k]);
    }
    atomic_store(&g_flag[F_QUEUED], 1);
    atomic_store(&g_flag[F_WAITING], 1);
    rc = o->stream_wait(ctx, NULL, t[19]);
    fails += MC_EXPECT(rc == 0, "rank 0: stream_wait: %d %s", rc, o->error_text(ctx));
    for (int r = 1; r < a->W; r++)
      fails += MC_EXPECT(atomic_load(&g_started[r]) >= 20, "rank 0: the wait for call 20 "
                         "returned before rank %d had begun it", r);
    for (int k = 0; k < 20; k++) fails += job_check(a, &j[k]);
    atomic_store(&g_flag[F_EARLY_DONE], 1);
  } else {
    fails += MC_EXPECT(!wait_for(&g_flag[F_QUEUED], 1), "rank %d: rank 0 had not queued its "
                       "calls before the other ranks made theirs", a->r);
    wait_for(&g_flag[F_WAITING], 1);
    nap_us(2000);
    for (int k = 0; k < NJOBS; k++) {
      if (k == 20)
        fails += MC_EXPECT(!wait_for(&g_flag[F_EARLY_DONE], 1), "rank %d: rank 0's wait for "
                           "call 20 did not return before call 21 was made", a->r);
      atomic_store(&g_started[a->r], k + 1);
      int sync = k % 2 == 0;
      rc = job_issue(a, &j[k], k, sync ? NULL : q);
      fails += MC_EXPECT(rc == 0, "rank %d: call %d: %d %s", a->r, k, rc, o->error_text(ctx));
      if (sync && rc == 0) fails += job_check(a, &j[k]);
    }
  }
  rc = o->queue_sync(ctx);
  fails += MC_EXPECT(rc == 0, "rank %d: queue_sync: %d %s", a->r, rc, o->error_text(ctx));
  for (int k = 0; k < NJOBS; k++) {
    if (a->r == 0 ? k >= 20 : k % 2) fails += job_check(a, &j[k]);
    free(j[k].mem);
  }
  return fails;
}

/* Each rank mixes the two kinds of call its own way (rank 0 queues all but every third, rank 1
 * queues none and comes late to each, rank 2 queues all): a synchronous call runs only after
 * the queued ones before it, so the calls still meet in order. */
static int order_body(rank_arg *a) {
  const zt_comm_ops *o = a->c.ops;
  void *ctx = a->c.ctx;
  int fails = 0, rc;
  job j[12];
  for (int k = 0; k < 12; k++) {
    int queued = a->r == 0 ? k % 3 != 1 : a->r != 1;
    if (a->r == 1) nap_us(1000);
    rc = job_issue(a, &j[k], k, queued ? o->queue(ctx) : NULL);
    fails += MC_EXPECT(rc == 0, "rank %d: call %d: %d %s", a->r, k, rc, o->error_text(ctx));
    if (!queued && rc == 0) fails += job_check(a, &j[k]);
  }
  rc = o->queue_sync(ctx);
  fails += MC_EXPECT(rc == 0, "rank %d: queue_sync: %d %s", a->r, rc, o->error_text(ctx));
  for (int k = 0; k < 12; k++) {
    if (rc == 0) fails += job_check(a, &j[k]);
    free(j[k].mem);
  }
  return fails;
}

/* Rank 1 queues all_gather where the others queue all_reduce, then every rank queues another
 * call: the error reaches every rank's wait with both calls named, the call behind it does not
 * run, and the error stays. */
static int queued_mismatch_body(rank_arg *a) {
  const zt_comm_ops *o = a->c.ops;
  void *ctx = a->c.ctx, *q = o->queue(ctx);
  int fails = 0;
  float x[4] = {1, 2, 3, 4}, y[4 * MAXW];
  job j;
  int rc = a->r == 1 ? o->all_gather(ctx, x, y, 4, q) : o->all_reduce(ctx, x, y, 4, q);
  fails += MC_EXPECT(rc == 0, "rank %d: queuing: %d", a->r, rc);
  int queued = job_issue(a, &j, 0, q) == 0; /* refused if the error came first */
  rc = o->queue_sync(ctx);
  const char *e = o->error_text(ctx);
  fails += MC_EXPECT(rc == -EINVAL && strstr(e, "rank 1 called all_gather") &&
                     strstr(e, "rank 0 called all_reduce"), "rank %d: a queued mismatch gave "
                     "%d '%s'", a->r, rc, e);
  if (queued) fails += job_untouched(a, &j);
  free(j.mem);
  fails += MC_EXPECT(o->queue_mark(ctx) == -EINVAL && o->queue_after(ctx, NULL) == -EINVAL &&
                     o->stream_wait(ctx, NULL, 1) == -EINVAL && o->barrier(ctx, NULL) == -EINVAL
                     && o->all_reduce(ctx, x, y, 4, NULL) == -EINVAL &&
                     o->all_reduce(ctx, x, y, 4, q) == -EINVAL, "rank %d: the error did not "
                     "stay", a->r);
  fails += MC_EXPECT(strstr(o->error_text(ctx), "rank 1 called all_gather") != NULL,
                     "rank %d: later text '%s'", a->r, o->error_text(ctx));
  return fails;
}

/* Rank 0 queues all_reduce(4) where rank 1 calls all_reduce(5) on its stream: both get the
 * mismatch, and rank 0's queue aborts the group, so rank 1's next call is cancelled. */
static int queued_size_mismatch_body(rank_arg *a) {
  const zt_comm_ops *o = a->c.ops;
  void *ctx = a->c.ctx;
  int fails = 0, rc;
  float x[5] = {1, 2, 3, 4, 5}, y[5];
  if (a->r == 0) {
    rc = o->all_reduce(ctx, x, y, 4, o->queue(ctx));
    fails += MC_EXPECT(rc == 0, "rank 0: queuing: %d", rc);
    rc = o->queue_sync(ctx);
  } else {
    rc = o->all_reduce(ctx, x, y, 5, NULL);
  }
  fails += MC_EXPECT(rc == -EINVAL && strstr(o->error_text(ctx), "rank 1 called all_reduce(size"
                     " 5"), "rank %d: a size mismatch gave %d '%s'", a->r, rc, o->error_text(ctx));
  rc = o->barrier(ctx, NULL);
  fails += MC_EXPECT(a->r == 0 ? rc == -EINVAL : rc == -ECANCELED && strstr(o->error_text(ctx),
                     "aborted by rank 0's queue"), "rank %d: barrier after: %d '%s'", a->r, rc,
                     o->error_text(ctx));
  return fails;
}

/* Run with ZT_FAULT_COMM=1:3: the third collective of rank 1 fails, counting a synchronous
 * first call; it is its queued all_gather (call 2 here). Every rank's wait reports the fault,
 * the call that failed and the one behind it do not run, the one before it did. */
static int queued_fault_body(rank_arg *a) {
  const zt_comm_ops *o = a->c.ops;
  void *ctx = a->c.ctx, *q = o->queue(ctx);
  int fails = 0, rc;
  job j[4];
  int issued = 0;
  for (int k = 0; k < 4; k++, issued++) {
    rc = job_issue(a, &j[k], k, k ? q : NULL);
    if (k < 3) fails += MC_EXPECT(rc == 0, "rank %d: call %d: %d %s", a->r, k, rc,
                                  o->error_text(ctx));
    if (rc < 0) { /* refused once the queue's error is known; nothing to wait for */
      free(j[k].mem);
      break;
    }
  }
  rc = o->queue_sync(ctx);
  const char *e = o->error_text(ctx);
  fails += MC_EXPECT(rc == (a->r == 1 ? -EIO : -ECANCELED) && strstr(e, "injected by "
                     "ZT_FAULT_COMM") && strstr(e, "rank 1: all_gather failed"), "rank %d: a "
                     "queued fault gave %d '%s'", a->r, rc, e);
  fails += job_check(a, &j[0]) + job_check(a, &j[1]) + job_untouched(a, &j[2]);
  if (issued == 4) fails += job_untouched(a, &j[3]);
  for (int k = 0; k < issued; k++) free(j[k].mem);
  float x = 1, y;
  int again = o->all_reduce(ctx, &x, &y, 1, NULL);
  fails += MC_EXPECT(again == rc, "rank %d: the error did not stay: %d, then %d", a->r, rc, again);
  return fails;
}

/* Ranks 0 and 1 queue two calls that rank 2 never makes; rank 0 aborts: both waits return
 * -ECANCELED and neither call ran. Rank 2 then queues a call and leaves it to the close. */
static int queued_abort_body(rank_arg *a) {
  const zt_comm_ops *o = a->c.ops;
  void *ctx = a->c.ctx, *q = o->queue(ctx);
  int fails = 0, rc;
  if (a->r == 2) {
    static float x[4], y[4]; /* still the queue's after the body returns */
    fails += MC_EXPECT(!wait_for(&g_flag[F_ABORTED], 1), "rank 2: no abort");
    rc = o->all_reduce(ctx, x, y, 4, q);
    fails += MC_EXPECT(rc == 0, "rank 2: queuing after another's abort: %d", rc);
    return fails;
  }
  job j[2];
  for (int k = 0; k < 2; k++) {
    rc = job_issue(a, &j[k], k, q);
    fails += MC_EXPECT(rc == 0, "rank %d: call %d: %d", a->r, k, rc);
  }
  atomic_store(&g_started[a->r], 1);
  if (a->r == 0) {
    fails += MC_EXPECT(!wait_for(&g_started[1], 1), "rank 0: rank 1 did not queue");
    nap_us(1000); /* most likely both queues wait in the meeting now; either way it ends */
    o->abort(ctx);
    atomic_store(&g_flag[F_ABORTED], 1);
  }
  rc = o->queue_sync(ctx);
  const char *e = o->error_text(ctx);
  fails += MC_EXPECT(rc == -ECANCELED && strstr(e, a->r == 0 ? "rank 0 aborted the group"
                                                             : "aborted by rank 0"),
                     "rank %d: queue_sync after the abort: %d '%s'", a->r, rc, e);
  for (int k = 0; k < 2; k++) {
    fails += job_untouched(a, &j[k]);
    free(j[k].mem);
  }
  return fails;
}

static int opens(void) {
  int fails = 0;
  zt_comm_cpu_group *g;
  zt_comm c, d;
  fails += MC_EXPECT(zt_comm_cpu_group_open(&g, 0) == -EINVAL, "world 0 accepted");
  fails += MC_EXPECT(zt_comm_cpu_group_open(&g, ZT_COMM_CPU_MAX_WORLD + 1) == -EINVAL,
                     "world past the limit accepted");
  if (MC_EXPECT(zt_comm_cpu_group_open(&g, 2) == 0, "group_open(2)")) return fails + 1;
  fails += MC_EXPECT(zt_comm_cpu_open(&c, g, 2) == -EINVAL, "rank 2 of 2 accepted");
  fails += MC_EXPECT(zt_comm_cpu_open(&c, g, 1) == 0, "rank 1 refused");
  fails += MC_EXPECT(c.ops->rank(c.ctx) == 1 && c.ops->world(c.ctx) == 2, "rank/world");
  fails += MC_EXPECT(zt_comm_cpu_open(&d, g, 1) == -EINVAL, "rank 1 taken twice");
  zt_comm_cpu_close(&c);
  fails += MC_EXPECT(zt_comm_cpu_open(&d, g, 1) == 0, "rank 1 not free after close");
  zt_comm_cpu_close(&d);
  zt_comm_cpu_group_close(g);
  return fails;
}

int main(void) {
  static const int worlds[] = {1, 2, 3, 5};
  int fails = opens();
  for (g_queued = 0; g_queued < 2; g_queued++)
    for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++) {
      int W = worlds[w];
      fails += run_group(W, all_reduce_body);
      fails += run_group(W, reduce_scatter_body);
      fails += run_group(W, all_gather_body);
      fails += run_group(W, broadcast_body);
      fails += run_group(W, barrier_body);
      for (int r = 0; r < MAXW; r++) atomic_store(&g_arrived[r], 0);
    }
  g_queued = 0;
  fails += run_group(3, mismatch_body);
  fails += run_group(3, abort_body);
  for (int W = 1; W <= 3; W++) {
    reset_flags();
    fails += run_group(W, async_body);
  }
  fails += run_group(3, order_body);
  fails += run_group(3, queued_mismatch_body);
  fails += run_group(2, queued_size_mismatch_body);
  fails += run_group_fault(3, queued_fault_body, "1:3");
  reset_flags();
  fails += run_group(3, queued_abort_body);
  if (fails) {
    fprintf(stderr, "%d failure(s)\n", fails);
    return 1;
  }
  printf("comm cpu: ok\n");
  return 0;
}
