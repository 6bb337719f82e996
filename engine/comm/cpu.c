/* The CPU group (engine/comm/comm.h): W ranks as threads of one process.
 *
 * A collective is: post (the rank's buffers and sizes into its slot), meet, work, meet. The
 * meeting is a barrier on the group's mutex, so everything a rank wrote before it (its post,
 * its buffers) happens before what the others read after it, and the second meeting keeps a
 * rank from reusing a buffer another rank still reads. The work reads other ranks' buffers and
 * writes only the rank's own, in parts no other rank reads in the same phase:
 * - all_reduce: rank r sums its 1/W of the elements over the ranks (in rank order) into its
 *   own recv, meets, then copies every other rank's part from that rank's recv. No scratch,
 *   in place works, and every rank ends with the same bits.
 * - reduce_scatter: rank r sums chunk r over the ranks into its recv.
 * - all_gather / broadcast: rank r copies into its own recv.
 * The posts are checked against rank 0's after the first meeting, by every rank alike, so a
 * mismatch (a partitioning bug) is an error on every rank rather than a hang or garbage.
 *
 * The queue (comm.h): a thread of the rank's, started by the first call given the queue, runs
 * the queued calls in order through the same collective() as the rank's own thread, so the bits
 * are the same. A call given any other stream (barrier always) first waits until the queue has
 * drained, so a rank's collectives run one at a time in the order of its calls, whichever thread
 * runs them: the group's meetings need nothing new, and ZT_FAULT_COMM counts both kinds alike.
 * A queued call that fails, or cannot be queued, has already returned 0 or left the rank's calls
 * out of step with the others', so its error is sticky (later calls of either kind,
 * stream_wait and queue_sync return it; calls queued after it are not run) and the queue thread
 * aborts the group itself, as a rank whose synchronous call failed must: otherwise the other
 * ranks would wait in a collective that this rank's queue will never run, until its owner
 * happened to look. abort makes the rank's error sticky too (-ECANCELED, unless an error came
 * first), so what is queued behind the collective it ends is not run.
 *
 * An aborted meeting returns only once no rank is still working between two meetings (reading
 * the others' buffers): the owner of a queued call may free its buffers as soon as stream_wait
 * returns, and with a queue an abort can come while the rank's own part is inside a collective.
 *
 * For tests of what a failing rank does to a job (comm.h, ZT_FAULT_COMM), a group can make one
 * rank's Nth collective fail with EIO before it posts, as a lost GPU or a NCCL error would:
 * the others wait in the collective until the failing rank's owner aborts the group (or, for a
 * queued call, its queue thread does). */
#include "engine/comm/comm.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/log.h"

#define ERR_LEN 512

typedef enum op_kind {
  OP_ALL_REDUCE,
  OP_REDUCE_SCATTER,
  OP_ALL_GATHER,
  OP_BROADCAST,
  OP_BARRIER,
} op_kind;

static const char *const op_names[] = {"all_reduce", "reduce_scatter", "all_gather",
                                       "broadcast", "barrier"};

/* A call: what a rank posts in the group, and what its queue holds. */
typedef struct post {
  op_kind op;
  const void *send;
  void *recv;
  size_t size; /* floats (all_reduce, reduce_scatter: per rank) or bytes */
  int root;
} post;

/* A rank's queue. Calls number 1, 2, ... in the order queued; those in (done, queued] wait in
 * ring[(number - 1) % cap]. The thread copies a call out before it runs it, so the rank's
 * thread may grow the ring meanwhile. Everything here is under mu: the thread waits on `more`,
 * the rank's thread on `progress`. */
typedef struct cpu_queue {
  pthread_mutex_t mu;
  pthread_cond_t more, progress;
  pthread_t thread;
  int started, stop;
  post *ring;
  size_t cap;
  long long queued, done;
  int rc; /* sticky: the first failure of a call given the queue, or the abort; 0 none */
  char err[ERR_LEN];
} cpu_queue;

typedef struct cpu_ctx {
  zt_comm_cpu_group *g;
  int rank;
  int open;
  int in_work;    /* left a meeting with work after it and not at the next yet (g->mu) */
  uint64_t calls; /* collectives run (by the rank's thread or its queue's, one at a time) */
  char err[ERR_LEN]; /* written by the rank's thread only: error_text */
  cpu_queue q;
} cpu_ctx;

struct zt_comm_cpu_group {
  int world;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int arrived;
  uint64_t gen; /* meetings completed */
  int working;  /* ranks between a meeting and their next (cpu_ctx.in_work) */
  int aborted;
  char why[ERR_LEN - 64]; /* who aborted, "by rank R...": room for a rank's text around it */
  int fault_rank;    /* ZT_FAULT_COMM: this rank's fault_call-th collective fails; -1 none */
  uint64_t fault_call;
  post *posts;  /* one slot per rank */
  cpu_ctx *ctx; /* one per rank */
};

/* The barrier. then_work: whether the ranks go on to read each other's buffers after it (every
 * rank passes the same at the same meeting). -ECANCELED, with its text in err, when the group
 * is aborted before every rank has arrived. */
static int meet(cpu_ctx *c, char *err, int then_work) {
  zt_comm_cpu_group *g = c->g;
  pthread_mutex_lock(&g->mu);
  if (c->in_work) {
    c->in_work = 0;
    if (--g->working == 0) pthread_cond_broadcast(&g->cv);
  }
  uint64_t gen = g->gen;
  int ok = !g->aborted;
  if (ok && ++g->arrived == g->world) {
    g->arrived = 0;
    g->gen++;
    /* counted here, not as each rank wakes, so an abort cannot miss a rank not yet awake */
    if (then_work) g->working = g->world;
    pthread_cond_broadcast(&g->cv);
  } else if (ok) {
    while (g->gen == gen && !g->aborted) pthread_cond_wait(&g->cv, &g->mu);
    ok = g->gen != gen; /* the meeting completed, even if an abort came after it */
  }
  if (ok) {
    c->in_work = then_work;
  } else {
    /* a rank past the last meeting may still read this rank's buffers; it is on its way to the
     * next meeting, where it stops */
    while (g->working > 0) pthread_cond_wait(&g->cv, &g->mu);
    snprintf(err, ERR_LEN, "rank %d: the group was aborted %s", c->rank, g->why);
  }
  pthread_mutex_unlock(&g->mu);
  return ok ? 0 : -ECANCELED;
}

/* Ends every collective in progress or to come. cause: NULL when the rank's own thread aborts,
 * else the text of the queued call whose failure made its queue abort. */
static void group_abort(cpu_ctx *c, const char *cause) {
  zt_comm_cpu_group *g = c->g;
  pthread_mutex_lock(&g->mu);
  if (!g->aborted) {
    g->aborted = 1;
    if (cause) snprintf(g->why, sizeof g->why, "by rank %d's queue: %s", c->rank, cause);
    else snprintf(g->why, sizeof g->why, "by rank %d", c->rank);
  }
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

/* Elements [lo, hi) of n that rank r reduces in all_reduce. */
static void part(size_t n, int world, int r, size_t *lo, size_t *hi) {
  size_t q = n / (size_t)world, m = n % (size_t)world, ur = (size_t)r;
  *lo = q * ur + (ur < m ? ur : m);
  *hi = *lo + q + (ur < m ? 1 : 0);
}

/* Every rank runs the same check on the same posts, so all of them agree on the verdict. */
static int check_posts(cpu_ctx *c, char *err) {
  const zt_comm_cpu_group *g = c->g;
  const post *p0 = &g->posts[0];
  for (int r = 0; r < g->world; r++) {
    const post *p = &g->posts[r];
    if (p->op != p0->op || p->size != p0->size || p->root != p0->root) {
      snprintf(err, ERR_LEN, "rank %d called %s(size %zu, root %d) while rank 0 called "
               "%s(size %zu, root %d)", r, op_names[p->op], p->size, p->root, op_names[p0->op],
               p0->size, p0->root);
      return -EINVAL;
    }
    int needs_send = p->op != OP_BROADCAST || r == p->root;
    if (p->op != OP_BARRIER && p->size && ((needs_send && !p->send) || !p->recv)) {
      snprintf(err, ERR_LEN, "rank %d called %s with a NULL buffer", r, op_names[p->op]);
      return -EINVAL;
    }
    if (p->op == OP_BROADCAST && (p->root < 0 || p->root >= g->world)) {
      snprintf(err, ERR_LEN, "broadcast: root %d is not a rank of %d", p->root, g->world);
      return -EINVAL;
    }
  }
  return 0;
}

static void copy(void *dst, const void *src, size_t bytes) {
  if (dst != src && bytes) memcpy(dst, src, bytes);
}

/* Runs call p on the calling thread (the rank's or its queue's); its error text goes to err. */
static int collective(cpu_ctx *c, char *err, const post *p) {
  zt_comm_cpu_group *g = c->g;
  int W = g->world, r = c->rank;
  size_t size = p->size;
  if (++c->calls == g->fault_call && r == g->fault_rank) {
    snprintf(err, ERR_LEN, "rank %d: %s failed: Input/output error (injected by "
             "ZT_FAULT_COMM)", r, op_names[p->op]);
    return -EIO;
  }
  g->posts[r] = *p;
  int rc = meet(c, err, 1);
  if (rc < 0) return rc;
  int bad = check_posts(c, err);
  const post *P = g->posts;
  if (!bad) switch (p->op) {
    case OP_ALL_REDUCE: {
      size_t lo, hi;
      part(size, W, r, &lo, &hi);
      float *out = p->recv;
      for (size_t i = lo; i < hi; i++) {
        float s = ((const float *)P[0].send)[i];
        for (int k = 1; k < W; k++) s += ((const float *)P[k].send)[i];
        out[i] = s;
      }
      if ((rc = meet(c, err, 1)) < 0) return rc;
      for (int k = 0; k < W; k++) {
        if (k == r) continue;
        part(size, W, k, &lo, &hi);
        copy(out + lo, (const float *)P[k].recv + lo, (hi - lo) * sizeof(float));
      }
      break;
    }
    case OP_REDUCE_SCATTER: {
      size_t off = (size_t)r * size;
      float *out = p->recv;
      for (size_t i = 0; i < size; i++) {
        float s = ((const float *)P[0].send)[off + i];
        for (int k = 1; k < W; k++) s += ((const float *)P[k].send)[off + i];
        out[i] = s;
      }
      break;
    }
    case OP_ALL_GATHER:
      for (int k = 0; k < W; k++) copy((char *)p->recv + (size_t)k * size, P[k].send, size);
      break;
    case OP_BROADCAST:
      copy(p->recv, P[p->root].send, size);
      break;
    case OP_BARRIER:
      break;
  }
  if ((rc = meet(c, err, 0)) < 0) return rc;
  return bad;
}

/* ---- the queue ----------------------------------------------------------------------------- */

/* A call given the queue failed, or could not be queued: sticky, and the group is aborted (the
 * file's comment says why). */
static void queue_fail(cpu_ctx *c, int rc, const char *text) {
  group_abort(c, text);
  pthread_mutex_lock(&c->q.mu);
  if (!c->q.rc) {
    c->q.rc = rc;
    snprintf(c->q.err, sizeof c->q.err, "%s", text);
  }
  pthread_mutex_unlock(&c->q.mu);
}

static void *queue_main(void *arg) {
  cpu_ctx *c = arg;
  cpu_queue *q = &c->q;
  char err[ERR_LEN];
  pthread_mutex_lock(&q->mu);
  for (;;) {
    while (q->done == q->queued && !q->stop) pthread_cond_wait(&q->more, &q->mu);
    if (q->done == q->queued) break;
    post p = q->ring[(size_t)q->done % q->cap];
    int failed = q->rc; /* then the call is not run: the rank is out of step already */
    pthread_mutex_unlock(&q->mu);
    int rc = failed ? 0 : collective(c, err, &p);
    if (rc < 0) queue_fail(c, rc, err);
    pthread_mutex_lock(&q->mu);
    q->done++;
    pthread_cond_broadcast(&q->progress);
  }
  pthread_mutex_unlock(&q->mu);
  return NULL;
}

/* The sticky error, copied into the rank's text. q->mu held. */
static int sticky(cpu_ctx *c) {
  if (c->q.rc) memcpy(c->err, c->q.err, sizeof c->err);
  return c->q.rc;
}

/* Appends p to the rank's queue, starting its thread at the first call. */
static int enqueue(cpu_ctx *c, const post *p) {
  cpu_queue *q = &c->q;
  pthread_mutex_lock(&q->mu);
  int rc = sticky(c);
  if (rc < 0) {
    pthread_mutex_unlock(&q->mu);
    return rc;
  }
  if (q->queued - q->done == (long long)q->cap) {
    size_t cap = q->cap ? 2 * q->cap : 16;
    post *ring = malloc(cap * sizeof *ring);
    if (!ring) {
      rc = -ENOMEM;
      snprintf(c->err, sizeof c->err, "rank %d: queuing %s: out of memory for %zu calls",
               c->rank, op_names[p->op], cap);
      goto out;
    }
    for (long long n = q->done; n < q->queued; n++)
      ring[(size_t)n % cap] = q->ring[(size_t)n % q->cap];
    free(q->ring);
    q->ring = ring;
    q->cap = cap;
  }
  if (!q->started) {
    int e = pthread_create(&q->thread, NULL, queue_main, c);
    if (e) {
      rc = -e;
      snprintf(c->err, sizeof c->err, "rank %d: queuing %s: cannot start the queue's thread: "
               "%s", c->rank, op_names[p->op], strerror(e));
      goto out;
    }
    q->started = 1;
  }
  q->ring[(size_t)q->queued % q->cap] = *p;
  q->queued++;
  pthread_cond_signal(&q->more);
out:
  pthread_mutex_unlock(&q->mu);
  if (rc < 0) queue_fail(c, rc, c->err);
  return rc;
}

/* Waits until the queue has done its first n calls (all of them when n is past the end), then
 * returns the sticky error or 0. */
static int queue_wait(cpu_ctx *c, long long n) {
  cpu_queue *q = &c->q;
  pthread_mutex_lock(&q->mu);
  while (q->done < n && q->done < q->queued) pthread_cond_wait(&q->progress, &q->mu);
  int rc = sticky(c);
  pthread_mutex_unlock(&q->mu);
  return rc;
}

/* A call: queued when stream is the rank's queue, else run here once the queue has drained. */
static int call(void *ctx, void *stream, post p) {
  cpu_ctx *c = ctx;
  if (stream == &c->q) return enqueue(c, &p);
  int rc = queue_wait(c, LLONG_MAX);
  return rc < 0 ? rc : collective(c, c->err, &p);
}

static int cpu_rank(void *ctx) { return ((const cpu_ctx *)ctx)->rank; }
static int cpu_world(void *ctx) { return ((const cpu_ctx *)ctx)->g->world; }

static int cpu_all_reduce(void *ctx, const float *send, float *recv, size_t count,
                          void *stream) {
  return call(ctx, stream, (post){.op = OP_ALL_REDUCE, .send = send, .recv = recv, .size = count});
}

static int cpu_reduce_scatter(void *ctx, const float *send, float *recv, size_t count,
                              void *stream) {
  return call(ctx, stream,
              (post){.op = OP_REDUCE_SCATTER, .send = send, .recv = recv, .size = count});
}

static int cpu_all_gather(void *ctx, const void *send, void *recv, size_t bytes, void *stream) {
  return call(ctx, stream, (post){.op = OP_ALL_GATHER, .send = send, .recv = recv, .size = bytes});
}

static int cpu_broadcast(void *ctx, const void *send, void *recv, size_t bytes, int root,
                         void *stream) {
  return call(ctx, stream,
              (post){.op = OP_BROADCAST, .send = send, .recv = recv, .size = bytes, .root = root});
}

/* On the calling thread whatever the stream: it returns when every rank has called it. */
static int cpu_barrier(void *ctx, void *stream) {
  return call(ctx, NULL, (post){.op = OP_BARRIER});
}

static void *cpu_queue_of(void *ctx) { return &((cpu_ctx *)ctx)->q; }

/* The backend's compute is done when its calls return, so the queue has nothing to wait for. */
static int cpu_queue_after(void *ctx, void *stream) { return queue_wait(ctx, 0); }

/* Ticket t stands for the first t - 1 calls queued, so that one taken before any is >= 1. */
static long long cpu_queue_mark(void *ctx) {
  cpu_ctx *c = ctx;
  pthread_mutex_lock(&c->q.mu);
  int rc = sticky(c);
  long long t = c->q.queued + 1;
  pthread_mutex_unlock(&c->q.mu);
  return rc < 0 ? rc : t;
}

static int cpu_stream_wait(void *ctx, void *stream, long long ticket) {
  cpu_ctx *c = ctx;
  pthread_mutex_lock(&c->q.mu);
  long long last = c->q.queued + 1;
  pthread_mutex_unlock(&c->q.mu);
  if (ticket < 1 || ticket > last) {
    snprintf(c->err, sizeof c->err, "rank %d: stream_wait: ticket %lld was not given by "
             "queue_mark (it has given 1..%lld)", c->rank, ticket, last);
    return -EINVAL;
  }
  return queue_wait(c, ticket - 1);
}

static int cpu_queue_sync(void *ctx) { return queue_wait(ctx, LLONG_MAX); }

/* The rank's error first, so that the collective the abort ends on its queue does not take its
 * place with "aborted by rank R". */
static void cpu_abort(void *ctx) {
  cpu_ctx *c = ctx;
  snprintf(c->err, sizeof c->err, "rank %d aborted the group", c->rank);
  pthread_mutex_lock(&c->q.mu);
  if (!c->q.rc) {
    c->q.rc = -ECANCELED;
    memcpy(c->q.err, c->err, sizeof c->q.err);
  }
  pthread_mutex_unlock(&c->q.mu);
  group_abort(c, NULL);
}

static const char *cpu_error_text(void *ctx) { return ((const cpu_ctx *)ctx)->err; }

static const zt_comm_ops cpu_comm_ops = {
    .name = "cpu",
    .rank = cpu_rank,
    .world = cpu_world,
    .all_reduce = cpu_all_reduce,
    .reduce_scatter = cpu_reduce_scatter,
    .all_gather = cpu_all_gather,
    .broadcast = cpu_broadcast,
    .queue = cpu_queue_of,
    .queue_after = cpu_queue_after,
    .queue_mark = cpu_queue_mark,
    .stream_wait = cpu_stream_wait,
    .queue_sync = cpu_queue_sync,
    .barrier = cpu_barrier,
    .abort = cpu_abort,
    .error_text = cpu_error_text,
};

int zt_comm_cpu_group_open(zt_comm_cpu_group **out, int world) {
  *out = NULL;
  if (world < 1 || world > ZT_COMM_CPU_MAX_WORLD) return -EINVAL;
  zt_comm_cpu_group *g = calloc(1, sizeof *g);
  if (!g) return -ENOMEM;
  g->world = world;
  g->posts = calloc((size_t)world, sizeof *g->posts);
  g->ctx = calloc((size_t)world, sizeof *g->ctx);
  if (!g->posts || !g->ctx) {
    free(g->posts);
    free(g->ctx);
    free(g);
    return -ENOMEM;
  }
  g->fault_rank = -1;
  const char *f = getenv("ZT_FAULT_COMM");
  if (f && f[0]) {
    int rank, used = 0;
    uint64_t call;
    if (sscanf(f, "%d:%" SCNu64 "%n", &rank, &call, &used) != 2 || f[used] || rank < 0 ||
        call < 1) {
      ZT_LOGE("comm", "ZT_FAULT_COMM=%s: expected RANK:N (rank RANK's Nth collective fails)", f);
      free(g->posts);
      free(g->ctx);
      free(g);
      return -EINVAL;
    }
    g->fault_rank = rank;
    g->fault_call = call;
    ZT_LOGW("comm", "ZT_FAULT_COMM=%s: rank %d's collective %" PRIu64 " will fail with EIO "
            "(fault injection for tests)", f, rank, call);
  }
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  for (int r = 0; r < world; r++) {
    cpu_ctx *c = &g->ctx[r];
    *c = (cpu_ctx){.g = g, .rank = r};
    pthread_mutex_init(&c->q.mu, NULL);
    pthread_cond_init(&c->q.more, NULL);
    pthread_cond_init(&c->q.progress, NULL);
  }
  *out = g;
  return 0;
}

void zt_comm_cpu_group_close(zt_comm_cpu_group *g) {
  if (!g) return;
  for (int r = 0; r < g->world; r++) {
    cpu_queue *q = &g->ctx[r].q;
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->more);
    pthread_cond_destroy(&q->progress);
  }
  pthread_mutex_destroy(&g->mu);
  pthread_cond_destroy(&g->cv);
  free(g->posts);
  free(g->ctx);
  free(g);
}

int zt_comm_cpu_open(zt_comm *c, zt_comm_cpu_group *g, int rank) {
  if (!c || !g || rank < 0 || rank >= g->world) return -EINVAL;
  pthread_mutex_lock(&g->mu);
  int taken = g->ctx[rank].open;
  g->ctx[rank].open = 1;
  if (!taken) g->ctx[rank].err[0] = 0;
  pthread_mutex_unlock(&g->mu);
  if (taken) return -EINVAL;
  c->ops = &cpu_comm_ops;
  c->ctx = &g->ctx[rank];
  return 0;
}

/* The queue's thread runs what is left (an aborted group fails it at once) and ends. */
void zt_comm_cpu_close(zt_comm *c) {
  if (!c || !c->ctx) return;
  cpu_ctx *x = c->ctx;
  cpu_queue *q = &x->q;
  if (q->started) {
    pthread_mutex_lock(&q->mu);
    q->stop = 1;
    pthread_cond_signal(&q->more);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->thread, NULL);
  }
  free(q->ring);
  q->ring = NULL;
  q->cap = 0;
  q->started = q->stop = q->rc = 0;
  q->queued = q->done = 0;
  q->err[0] = 0;
  pthread_mutex_lock(&x->g->mu);
  x->open = 0;
  pthread_mutex_unlock(&x->g->mu);
  c->ops = NULL;
  c->ctx = NULL;
}
