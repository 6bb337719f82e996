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
 * For tests of what a failing rank does to a job (comm.h, ZT_FAULT_COMM), a group can make one
 * rank's Nth collective fail with EIO before it posts, as a lost GPU or a NCCL error would:
 * the others wait in the collective until the failing rank's owner aborts the group. */
#include "engine/comm/comm.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/log.h"

typedef enum op_kind {
  OP_ALL_REDUCE,
  OP_REDUCE_SCATTER,
  OP_ALL_GATHER,
  OP_BROADCAST,
  OP_BARRIER,
} op_kind;

static const char *const op_names[] = {"all_reduce", "reduce_scatter", "all_gather",
                                       "broadcast", "barrier"};

typedef struct post {
  op_kind op;
  const void *send;
  void *recv;
  size_t size; /* floats (all_reduce, reduce_scatter: per rank) or bytes */
  int root;
} post;

typedef struct cpu_ctx {
  zt_comm_cpu_group *g;
  int rank;
  int open;
  uint64_t calls; /* collectives called */
  char err[256];
} cpu_ctx;

struct zt_comm_cpu_group {
  int world;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int arrived;
  uint64_t gen; /* meetings completed */
  int aborted;
  int fault_rank;       /* ZT_FAULT_COMM: this rank's fault_call-th collective fails; -1 none */
  uint64_t fault_call;
  post *posts;  /* one slot per rank */
  cpu_ctx *ctx; /* one per rank */
};

static int cancelled(cpu_ctx *c) {
  snprintf(c->err, sizeof c->err, "rank %d: the group was aborted", c->rank);
  return -ECANCELED;
}

/* The barrier. -ECANCELED when the group is aborted before every rank has arrived. */
static int meet(cpu_ctx *c) {
  zt_comm_cpu_group *g = c->g;
  pthread_mutex_lock(&g->mu);
  uint64_t gen = g->gen;
  int ok = !g->aborted;
  if (ok && ++g->arrived == g->world) {
    g->arrived = 0;
    g->gen++;
    pthread_cond_broadcast(&g->cv);
  } else if (ok) {
    while (g->gen == gen && !g->aborted) pthread_cond_wait(&g->cv, &g->mu);
    ok = g->gen != gen; /* the meeting completed, even if an abort came after it */
  }
  pthread_mutex_unlock(&g->mu);
  return ok ? 0 : cancelled(c);
}

/* Elements [lo, hi) of n that rank r reduces in all_reduce. */
static void part(size_t n, int world, int r, size_t *lo, size_t *hi) {
  size_t q = n / (size_t)world, m = n % (size_t)world, ur = (size_t)r;
  *lo = q * ur + (ur < m ? ur : m);
  *hi = *lo + q + (ur < m ? 1 : 0);
}

/* Every rank runs the same check on the same posts, so all of them agree on the verdict. */
static int check_posts(cpu_ctx *c) {
  const zt_comm_cpu_group *g = c->g;
  const post *p0 = &g->posts[0];
  for (int r = 0; r < g->world; r++) {
    const post *p = &g->posts[r];
    if (p->op != p0->op || p->size != p0->size || p->root != p0->root) {
      snprintf(c->err, sizeof c->err, "rank %d called %s(size %zu, root %d) while rank 0 called "
               "%s(size %zu, root %d)", r, op_names[p->op], p->size, p->root, op_names[p0->op],
               p0->size, p0->root);
      return -EINVAL;
    }
    int needs_send = p->op != OP_BROADCAST || r == p->root;
    if (p->op != OP_BARRIER && p->size && ((needs_send && !p->send) || !p->recv)) {
      snprintf(c->err, sizeof c->err, "rank %d called %s with a NULL buffer", r, op_names[p->op]);
      return -EINVAL;
    }
    if (p->op == OP_BROADCAST && (p->root < 0 || p->root >= g->world)) {
      snprintf(c->err, sizeof c->err, "broadcast: root %d is not a rank of %d", p->root,
               g->world);
      return -EINVAL;
    }
  }
  return 0;
}

static void copy(void *dst, const void *src, size_t bytes) {
  if (dst != src && bytes) memcpy(dst, src, bytes);
}

static int collective(void *ctx, op_kind op, const void *send, void *recv, size_t size,
                      int root) {
  cpu_ctx *c = ctx;
  zt_comm_cpu_group *g = c->g;
  int W = g->world, r = c->rank;
  if (++c->calls == g->fault_call && r == g->fault_rank) {
    snprintf(c->err, sizeof c->err, "rank %d: %s failed: Input/output error (injected by "
             "ZT_FAULT_COMM)", r, op_names[op]);
    return -EIO;
  }
  g->posts[r] = (post){.op = op, .send = send, .recv = recv, .size = size, .root = root};
  int rc = meet(c);
  if (rc < 0) return rc;
  int bad = check_posts(c);
  const post *P = g->posts;
  if (!bad) switch (op) {
    case OP_ALL_REDUCE: {
      size_t lo, hi;
      part(size, W, r, &lo, &hi);
      float *out = recv;
      for (size_t i = lo; i < hi; i++) {
        float s = ((const float *)P[0].send)[i];
        for (int k = 1; k < W; k++) s += ((const float *)P[k].send)[i];
        out[i] = s;
      }
      if ((rc = meet(c)) < 0) return rc;
      for (int k = 0; k < W; k++) {
        if (k == r) continue;
        part(size, W, k, &lo, &hi);
        copy(out + lo, (const float *)P[k].recv + lo, (hi - lo) * sizeof(float));
      }
      break;
    }
    case OP_REDUCE_SCATTER: {
      size_t off = (size_t)r * size;
      float *out = recv;
      for (size_t i = 0; i < size; i++) {
        float s = ((const float *)P[0].send)[off + i];
        for (int k = 1; k < W; k++) s += ((const float *)P[k].send)[off + i];
        out[i] = s;
      }
      break;
    }
    case OP_ALL_GATHER:
      for (int k = 0; k < W; k++) copy((char *)recv + (size_t)k * size, P[k].send, size);
      break;
    case OP_BROADCAST:
      copy(recv, P[root].send, size);
      break;
    case OP_BARRIER:
      break;
  }
  if ((rc = meet(c)) < 0) return rc;
  return bad;
}

static int cpu_rank(void *ctx) { return ((const cpu_ctx *)ctx)->rank; }
static int cpu_world(void *ctx) { return ((const cpu_ctx *)ctx)->g->world; }

static int cpu_all_reduce(void *ctx, const float *send, float *recv, size_t count,
                          void *stream) {
  return collective(ctx, OP_ALL_REDUCE, send, recv, count, 0);
}

static int cpu_reduce_scatter(void *ctx, const float *send, float *recv, size_t count,
                              void *stream) {
  return collective(ctx, OP_REDUCE_SCATTER, send, recv, count, 0);
}

static int cpu_all_gather(void *ctx, const void *send, void *recv, size_t bytes, void *stream) {
  return collective(ctx, OP_ALL_GATHER, send, recv, bytes, 0);
}

static int cpu_broadcast(void *ctx, const void *send, void *recv, size_t bytes, int root,
                         void *stream) {
  return collective(ctx, OP_BROADCAST, send, recv, bytes, root);
}

static int cpu_barrier(void *ctx, void *stream) {
  return collective(ctx, OP_BARRIER, NULL, NULL, 0, 0);
}

static void cpu_abort(void *ctx) {
  cpu_ctx *c = ctx;
  zt_comm_cpu_group *g = c->g;
  pthread_mutex_lock(&g->mu);
  g->aborted = 1;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
  snprintf(c->err, sizeof c->err, "rank %d aborted the group", c->rank);
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
  for (int r = 0; r < world; r++) g->ctx[r] = (cpu_ctx){.g = g, .rank = r};
  *out = g;
  return 0;
}

void zt_comm_cpu_group_close(zt_comm_cpu_group *g) {
  if (!g) return;
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

void zt_comm_cpu_close(zt_comm *c) {
  if (!c || !c->ctx) return;
  cpu_ctx *x = c->ctx;
  pthread_mutex_lock(&x->g->mu);
  x->open = 0;
  pthread_mutex_unlock(&x->g->mu);
  c->ops = NULL;
  c->ctx = NULL;
}
