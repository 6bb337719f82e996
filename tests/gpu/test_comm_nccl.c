/* The NCCL communicator (engine/comm/comm_nccl.h):
 * - a token fired before open: open returns -ECANCELED with the first why, touching no device
 *   (runs without GPUs);
 * - on one device: an open whose peer never comes (rank 0 of a world of two) returns
 *   -ECANCELED with the why within 5 s of the token firing; a world of one reduces exactly and
 *   closes through ncclCommFinalize; a bad root is refused with -EINVAL and NCCL's text, sticky;
 * - on two devices: each rank thread runs every collective on the CPU group (engine/comm/comm.h)
 *   with host buffers and on NCCL with device buffers on its stream, out of place and in place,
 *   and the results must be equal bit for bit (with two ranks a sum is one addition, which is
 *   the same in any order); then a bad root is refused; then, with rank 1 idle, rank 0's
 *   barrier (waiting for rank 1 in cudaStreamSynchronize) returns -ECANCELED with the why
 *   within 5 s of rank 0's token firing, the error sticks, and rank 1's next call fails
 *   because rank 0 was aborted.
 * Each part runs under alarm(), so a hang fails the test naming the part. Skips (77) without
 * devices; with one device the parts that need two are skipped by name. */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/comm/comm.h"
#include "engine/comm/comm_nccl.h"
#include "tests/unit/model/mcheck.h"

#define W 2
#define N_REDUCE 1001   /* all_reduce floats */
#define N_SCATTER 257   /* reduce_scatter floats per rank */
#define N_GATHER 37     /* all_gather bytes per rank */
#define N_BCAST 29      /* broadcast bytes */
#define PART_LIMIT_S 60 /* alarm() per part */
#define CANCEL_AFTER_S 0.5
#define CANCEL_WITHIN_S 5.0

static zt_comm_nccl_id g_id;
static const char *volatile g_part = "setup";

static void on_alarm(int sig) {
  static const char msg[] = "FAIL: timed out in: ";
  const char *p = g_part;
  (void)sig;
  if (write(2, msg, sizeof msg - 1) > 0 && write(2, p, strlen(p)) > 0) (void)!write(2, "\n", 1);
  _exit(1);
}

/* Starts a part: its name for the timeout message and a fresh alarm. */
static void part(const char *name) {
  g_part = name;
  printf("%s\n", name);
  alarm(PART_LIMIT_S);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void sleep_s(double s) {
  struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&t, &t) < 0 && errno == EINTR) {
  }
}

typedef struct rank_arg {
  int r;
  zt_comm cpu;
  int refused; /* the bad root got NCCL's -EINVAL */
  int fails;
} rank_arg;

static float val(int r, size_t i) {
  return (float)((int)((i * 7 + (size_t)r * 13) % 17) - 8) * 0.37f + (float)r * 1.0e-3f +
         (float)i * 1.0e-7f;
}

/* Exits the test on a CUDA failure: nothing after it would mean anything. */
static void cu(cudaError_t e, const char *what) {
  if (e != cudaSuccess) {
    fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    exit(1);
  }
}

/* Device buffer dev of `bytes` to the host buffer out after the stream's work. */
static void fetch(void *out, const void *dev, size_t bytes, cudaStream_t s) {
  cu(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  cu(cudaMemcpy(out, dev, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}

static int same(const void *got, const void *want, size_t bytes, int r, const char *what) {
  return MC_EXPECT(memcmp(got, want, bytes) == 0, "rank %d: %s: nccl differs from the cpu group",
                   r, what);
}

static void *rank_main(void *p) {
  rank_arg *a = p;
  int r = a->r, fails = 0;
  char err[512];
  zt_comm nc;
  cudaStream_t s;
  cu(cudaSetDevice(r), "cudaSetDevice");
  cu(cudaStreamCreate(&s), "cudaStreamCreate");
  if (zt_comm_nccl_open(&nc, W, r, &g_id, r, NULL, err, sizeof err) < 0) {
    fprintf(stderr, "rank %d: %s\n", r, err);
    exit(1);
  }
  const zt_comm_ops *o = nc.ops, *c = a->cpu.ops;
  fails += MC_EXPECT(o->rank(nc.ctx) == r && o->world(nc.ctx) == W, "rank/world");
  size_t big = (size_t)N_REDUCE * sizeof(float) + (size_t)W * N_SCATTER * sizeof(float);
  char *h_in = malloc(big), *h_out = malloc(big), *h_want = malloc(big), *d_in, *d_out;
  cu(cudaMalloc((void **)&d_in, big), "cudaMalloc");
  cu(cudaMalloc((void **)&d_out, big), "cudaMalloc");

  /* all_reduce, out of place then in place */
  float *x = (float *)h_in;
  for (size_t i = 0; i < N_REDUCE; i++) x[i] = val(r, i);
  size_t nb = N_REDUCE * sizeof(float);
  for (int inplace = 0; inplace < 2; inplace++) {
    cu(cudaMemcpy(d_in, h_in, nb, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    char *dst = inplace ? d_in : d_out;
    fails += MC_EXPECT(c->all_reduce(a->cpu.ctx, x, (float *)h_want, N_REDUCE, NULL) == 0 &&
                       o->all_reduce(nc.ctx, (float *)d_in, (float *)dst, N_REDUCE, s) == 0,
                       "all_reduce: %s", o->error_text(nc.ctx));
    fetch(h_out, dst, nb, s);
    fails += same(h_out, h_want, nb, r, inplace ? "all_reduce in place" : "all_reduce");
  }

  /* reduce_scatter: W chunks in, this rank's chunk out */
  size_t cb = N_SCATTER * sizeof(float);
  for (size_t i = 0; i < (size_t)W * N_SCATTER; i++) x[i] = val(r, i + 5);
  for (int inplace = 0; inplace < 2; inplace++) {
    cu(cudaMemcpy(d_in, h_in, W * cb, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    char *dst = inplace ? d_in + (size_t)r * cb : d_out;
    fails += MC_EXPECT(c->reduce_scatter(a->cpu.ctx, x, (float *)h_want, N_SCATTER, NULL) == 0 &&
                       o->reduce_scatter(nc.ctx, (float *)d_in, (float *)dst, N_SCATTER, s) == 0,
                       "reduce_scatter: %s", o->error_text(nc.ctx));
    fetch(h_out, dst, cb, s);
    fails += same(h_out, h_want, cb, r, inplace ? "reduce_scatter in place" : "reduce_scatter");
  }

  /* all_gather of an odd number of bytes */
  for (size_t i = 0; i < N_GATHER; i++) h_in[i] = (char)(r * 31 + (int)i);
  for (int inplace = 0; inplace < 2; inplace++) {
    char *src = inplace ? d_out + (size_t)r * N_GATHER : d_in;
    cu(cudaMemcpy(src, h_in, N_GATHER, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    fails += MC_EXPECT(c->all_gather(a->cpu.ctx, h_in, h_want, N_GATHER, NULL) == 0 &&
                       o->all_gather(nc.ctx, src, d_out, N_GATHER, s) == 0,
                       "all_gather: %s", o->error_text(nc.ctx));
    fetch(h_out, d_out, W * N_GATHER, s);
    fails += same(h_out, h_want, W * N_GATHER, r, inplace ? "all_gather in place" : "all_gather");
  }

  /* broadcast from each root, the root in place */
  for (int root = 0; root < W; root++) {
    for (size_t i = 0; i < N_BCAST; i++) h_in[i] = (char)(r * 50 + root + (int)i);
    cu(cudaMemcpy(d_in, h_in, N_BCAST, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    char *dst = r == root ? d_in : d_out;
    fails += MC_EXPECT(c->broadcast(a->cpu.ctx, h_in, h_want, N_BCAST, root, NULL) == 0 &&
                       o->broadcast(nc.ctx, d_in, dst, N_BCAST, root, s) == 0,
                       "broadcast: %s", o->error_text(nc.ctx));
    fetch(h_out, dst, N_BCAST, s);
    fails += same(h_out, h_want, N_BCAST, r, "broadcast");
  }

  fails += MC_EXPECT(o->barrier(nc.ctx, s) == 0 && c->barrier(a->cpu.ctx, NULL) == 0,
                     "barrier: %s", o->error_text(nc.ctx));

  /* A root that is no rank: NCCL refuses it, and the error sticks. The first rank refused is
   * aborted by its watchdog, and with it the other rank here (comm_nccl.h), which may happen
   * before that rank makes the call; main wants at least one refusal. */
  int rc = o->broadcast(nc.ctx, d_in, d_out, N_BCAST, W, s);
  const char *t = o->error_text(nc.ctx);
  a->refused = rc == -EINVAL && strstr(t, "ncclBroadcast") != NULL;
  fails += MC_EXPECT(a->refused || (rc == -ECANCELED && strstr(t, "in this process was aborted")),
                     "rank %d: bad root gave %d '%s'", r, rc, t);
  fails += MC_EXPECT(o->barrier(nc.ctx, s) == rc, "rank %d: the error did not stick", r);

  zt_comm_nccl_close(&nc);
  cudaFree(d_in);
  cudaFree(d_out);
  cudaStreamDestroy(s);
  free(h_in);
  free(h_out);
  free(h_want);
  a->fails = fails;
  return NULL;
}

/* ---- the cancel token ------------------------------------------------------------------------ */
/* A token fired twice before open: open refuses at once with the first why and no device. */
static int test_fired_before_open(void) {
  part("a token fired before open");
  int fails = 0;
  zt_comm_nccl_cancel *tok;
  zt_comm c = {&(const zt_comm_ops){.name = "stale"}, &fails};
  zt_comm_nccl_id id = {{1}};
  char err[512] = "";
  if (MC_EXPECT(zt_comm_nccl_cancel_create(&tok) == 0, "cancel_create")) return 1;
  zt_comm_nccl_cancel_fire(tok, "first why");
  zt_comm_nccl_cancel_fire(tok, "second why");
  zt_comm_nccl_cancel_fire(NULL, "nobody's");
  int rc = zt_comm_nccl_open(&c, 2, 0, &id, 0, tok, err, sizeof err);
  fails += MC_EXPECT(rc == -ECANCELED && strstr(err, "first why") && !strstr(err, "second") &&
                         !c.ops && !c.ctx,
                     "open after the token fired gave %d '%s'", rc, err);
  zt_comm_nccl_cancel_free(tok);
  zt_comm_nccl_cancel_free(NULL);
  alarm(0);
  return fails;
}

/* ---- one device ------------------------------------------------------------------------------ */
typedef struct lone_arg {
  zt_comm_nccl_id id;
  zt_comm_nccl_cancel *tok;
  int rc;
  double done;
  char err[512];
} lone_arg;

static void *lone_main(void *p) {
  lone_arg *a = p;
  zt_comm c;
  a->rc = zt_comm_nccl_open(&c, W, 0, &a->id, 0, a->tok, a->err, sizeof a->err);
  a->done = now_s();
  if (a->rc == 0) zt_comm_nccl_close(&c);
  return NULL;
}

/* Rank 0 of a world of two opens alone, as when the other daemon refused the job. */
static int test_init_cancel(const zt_comm_nccl_id *id) {
  part("init cancelled while rank 1 never comes");
  static const char why[] = "test: rank 1 never came";
  int fails = 0;
  lone_arg a = {.id = *id, .rc = 1};
  if (MC_EXPECT(zt_comm_nccl_cancel_create(&a.tok) == 0, "cancel_create")) return 1;
  pthread_t th;
  if (MC_EXPECT(pthread_create(&th, NULL, lone_main, &a) == 0, "pthread_create")) return 1;
  sleep_s(CANCEL_AFTER_S);
  double fired = now_s();
  zt_comm_nccl_cancel_fire(a.tok, why);
  pthread_join(th, NULL);
  fails += MC_EXPECT(a.rc == -ECANCELED && strstr(a.err, why), "open gave %d '%s'", a.rc, a.err);
  fails += MC_EXPECT(a.done - fired < CANCEL_WITHIN_S, "open returned %.2f s after the token",
                     a.done - fired);
  zt_comm_nccl_cancel_free(a.tok);
  alarm(0);
  return fails;
}

/* A world of one: the reduction is the input, close finalizes; then a bad root on a second
 * communicator is refused and sticks. */
static int test_world_one(void) {
  part("a world of one: all_reduce, barrier, close by finalize, a bad root");
  int fails = 0;
  char err[512];
  zt_comm_nccl_id id;
  zt_comm_nccl_cancel *tok;
  cudaStream_t s;
  float h[N_REDUCE], got[N_REDUCE], *d;
  cu(cudaSetDevice(0), "cudaSetDevice");
  cu(cudaStreamCreate(&s), "cudaStreamCreate");
  cu(cudaMalloc((void **)&d, sizeof h), "cudaMalloc");
  for (size_t i = 0; i < N_REDUCE; i++) h[i] = val(0, i);
  cu(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  if (MC_EXPECT(zt_comm_nccl_cancel_create(&tok) == 0, "cancel_create")) return 1;
  for (int round = 0; round < 2; round++) {
    zt_comm c;
    if (MC_EXPECT(zt_comm_nccl_get_id(&id, err, sizeof err) == 0, "%s", err) ||
        MC_EXPECT(zt_comm_nccl_open(&c, 1, 0, &id, 0, tok, err, sizeof err) == 0, "open: %s",
                  err)) {
      fails++;
      break;
    }
    const zt_comm_ops *o = c.ops;
    if (round == 0) {
      fails += MC_EXPECT(o->all_reduce(c.ctx, d, d, N_REDUCE, s) == 0 && o->barrier(c.ctx, s) == 0,
                         "world of one: %s", o->error_text(c.ctx));
      fetch(got, d, sizeof got, s);
      fails += MC_EXPECT(!memcmp(got, h, sizeof h), "world of one: the sum is not the input");
    } else {
      int rc = o->broadcast(c.ctx, d, d, sizeof(float), 1, s);
      fails += MC_EXPECT(rc == -EINVAL && strstr(o->error_text(c.ctx), "ncclBroadcast"),
                         "bad root gave %d '%s'", rc, o->error_text(c.ctx));
      fails += MC_EXPECT(o->barrier(c.ctx, s) == -EINVAL, "the bad root's error did not stick");
    }
    zt_comm_nccl_close(&c);
  }
  zt_comm_nccl_cancel_free(tok);
  cudaFree(d);
  cudaStreamDestroy(s);
  alarm(0);
  return fails;
}

/* ---- two devices: cancel while rank 0 waits in a barrier ------------------------------------- */
static const char g_barrier_why[] = "test: the job part was cancelled";

typedef struct idle_group {
  zt_comm_nccl_id id;
  zt_comm_nccl_cancel *tok[W];
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int ready; /* ranks past their first barrier */
  int go_on; /* rank 1 may go on (rank 0 is done) */
} idle_group;

typedef struct idle_arg {
  idle_group *g;
  int r, fails;
  double left; /* when rank 0's barrier returned */
} idle_arg;

static void *idle_main(void *p) {
  idle_arg *a = p;
  idle_group *g = a->g;
  int r = a->r, fails = 0;
  char err[512];
  zt_comm nc;
  cudaStream_t s;
  float *d;
  cu(cudaSetDevice(r), "cudaSetDevice");
  cu(cudaStreamCreate(&s), "cudaStreamCreate");
  cu(cudaMalloc((void **)&d, sizeof(float)), "cudaMalloc");
  if (zt_comm_nccl_open(&nc, W, r, &g->id, r, g->tok[r], err, sizeof err) < 0) {
    fprintf(stderr, "rank %d: %s\n", r, err);
    exit(1);
  }
  const zt_comm_ops *o = nc.ops;
  /* once together, so that the barrier below needs no new connection */
  fails += MC_EXPECT(o->barrier(nc.ctx, s) == 0, "rank %d: %s", r, o->error_text(nc.ctx));
  pthread_mutex_lock(&g->mu);
  g->ready++;
  pthread_cond_broadcast(&g->cv);
  if (r == 1)
    while (!g->go_on) pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
  if (r == 0) {
    int rc = o->barrier(nc.ctx, s);
    a->left = now_s();
    fails += MC_EXPECT(rc == -ECANCELED && strstr(o->error_text(nc.ctx), g_barrier_why),
                       "rank 0: the barrier gave %d '%s'", rc, o->error_text(nc.ctx));
    int again = o->all_reduce(nc.ctx, d, d, 1, s);
    fails += MC_EXPECT(again == rc, "rank 0: the next all_reduce gave %d, not %d", again, rc);
  } else {
    int rc = o->barrier(nc.ctx, s);
    fails += MC_EXPECT(rc == -ECANCELED &&
                           strstr(o->error_text(nc.ctx), "rank 0 in this process was aborted"),
                       "rank 1: after rank 0's cancel, the barrier gave %d '%s'", rc,
                       o->error_text(nc.ctx));
  }
  zt_comm_nccl_close(&nc);
  cudaFree(d);
  cudaStreamDestroy(s);
  a->fails = fails;
  return NULL;
}

static int test_barrier_cancel(void) {
  part("cancel while rank 0 waits in a barrier for an idle rank 1");
  int fails = 0;
  char err[512];
  idle_group g = {.ready = 0};
  idle_arg a[W];
  pthread_t th[W];
  if (MC_EXPECT(zt_comm_nccl_get_id(&g.id, err, sizeof err) == 0, "%s", err)) return 1;
  for (int r = 0; r < W; r++)
    if (MC_EXPECT(zt_comm_nccl_cancel_create(&g.tok[r]) == 0, "cancel_create")) return 1;
  pthread_mutex_init(&g.mu, NULL);
  pthread_cond_init(&g.cv, NULL);
  for (int r = 0; r < W; r++) {
    a[r] = (idle_arg){.g = &g, .r = r};
    if (MC_EXPECT(pthread_create(&th[r], NULL, idle_main, &a[r]) == 0, "pthread_create"))
      exit(1);
  }
  pthread_mutex_lock(&g.mu);
  while (g.ready < W) pthread_cond_wait(&g.cv, &g.mu);
  pthread_mutex_unlock(&g.mu);
  sleep_s(CANCEL_AFTER_S);
  double fired = now_s();
  zt_comm_nccl_cancel_fire(g.tok[0], g_barrier_why);
  pthread_join(th[0], NULL);
  pthread_mutex_lock(&g.mu);
  g.go_on = 1;
  pthread_cond_broadcast(&g.cv);
  pthread_mutex_unlock(&g.mu);
  pthread_join(th[1], NULL);
  fails += a[0].fails + a[1].fails;
  fails += MC_EXPECT(a[0].left - fired < CANCEL_WITHIN_S,
                     "rank 0's barrier returned %.2f s after the token", a[0].left - fired);
  /* it waited for rank 1 until then, not refused up front */
  fails += MC_EXPECT(a[0].left >= fired, "rank 0's barrier returned %.2f s before the token",
                     fired - a[0].left);
  pthread_mutex_destroy(&g.mu);
  pthread_cond_destroy(&g.cv);
  for (int r = 0; r < W; r++) zt_comm_nccl_cancel_free(g.tok[r]);
  alarm(0);
  return fails;
}

/* ---- two devices: every collective against the cpu group ------------------------------------ */
static int test_collectives(void) {
  part("every collective against the cpu group, then a bad root");
  char err[512];
  if (MC_EXPECT(zt_comm_nccl_get_id(&g_id, err, sizeof err) == 0, "%s", err)) return 1;
  zt_comm_cpu_group *g;
  if (zt_comm_cpu_group_open(&g, W) < 0) return 1;
  rank_arg a[W];
  pthread_t th[W];
  for (int r = 0; r < W; r++) {
    a[r] = (rank_arg){.r = r};
    if (zt_comm_cpu_open(&a[r].cpu, g, r) < 0 || pthread_create(&th[r], NULL, rank_main, &a[r]))
      return 1;
  }
  int fails = 0, refused = 0;
  for (int r = 0; r < W; r++) {
    pthread_join(th[r], NULL);
    fails += a[r].fails;
    refused += a[r].refused;
    zt_comm_cpu_close(&a[r].cpu);
  }
  zt_comm_cpu_group_close(g);
  fails += MC_EXPECT(refused > 0, "no rank saw NCCL refuse the bad root");
  alarm(0);
  return fails;
}

int main(void) {
  int count = 0;
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGALRM, on_alarm);
  int fails = test_fired_before_open();
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
    printf("needs a CUDA device (found none): skipped\n");
    return fails ? 1 : 77;
  }
  /* the environment NCCL reads on first use is set by the first get_id */
  char err[512];
  zt_comm_nccl_id id;
  int nvls_unset = getenv("NCCL_NVLS_ENABLE") == NULL;
  if (zt_comm_nccl_get_id(&id, err, sizeof err) < 0) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  const char *nvls = getenv("NCCL_NVLS_ENABLE");
  fails += MC_EXPECT(nvls && (!nvls_unset || !strcmp(nvls, "0")), "NCCL_NVLS_ENABLE is %s",
                     nvls ? nvls : "unset");
  fails += test_init_cancel(&id);
  fails += test_world_one();
  if (count >= W) {
    fails += test_collectives();
    fails += test_barrier_cancel();
  } else {
    printf("skipped (needs %d CUDA devices, found %d): every collective against the cpu group; "
           "cancel while rank 0 waits in a barrier\n",
           W, count);
  }
  if (fails) {
    fprintf(stderr, "%d failure(s)\n", fails);
    return 1;
  }
  printf("comm nccl: %s\n", count >= W ? "every part passed" : "the one-device parts passed");
  return 0;
}
