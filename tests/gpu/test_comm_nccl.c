/* The NCCL communicator (engine/comm/comm_nccl.h) against the CPU group (engine/comm/comm.h) on
 * two GPUs: each rank thread runs every collective on the CPU group with host buffers and on NCCL
 * with device buffers on its stream, out of place and in place, and the results must be equal
 * bit for bit (with two ranks a sum is one addition, which is the same in any order). Then a
 * bad root is refused with -EINVAL and NCCL's text. Skips (77) with fewer than two devices. */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/comm/comm.h"
#include "engine/comm/comm_nccl.h"
#include "tests/unit/model/mcheck.h"

#define W 2
#define N_REDUCE 1001   /* all_reduce floats */
#define N_SCATTER 257   /* reduce_scatter floats per rank */
#define N_GATHER 37     /* all_gather bytes per rank */
#define N_BCAST 29      /* broadcast bytes */

static zt_comm_nccl_id g_id;

typedef struct rank_arg {
  int r;
  zt_comm cpu;
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
  if (zt_comm_nccl_open(&nc, W, r, &g_id, r, err, sizeof err) < 0) {
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

  /* a root that is no rank: NCCL refuses it on every rank, and the error sticks */
  int rc = o->broadcast(nc.ctx, d_in, d_out, N_BCAST, W, s);
  fails += MC_EXPECT(rc == -EINVAL && strstr(o->error_text(nc.ctx), "ncclBroadcast"),
                     "rank %d: bad root gave %d '%s'", r, rc, o->error_text(nc.ctx));
  fails += MC_EXPECT(o->barrier(nc.ctx, s) == -EINVAL, "rank %d: the error did not stick", r);

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

int main(void) {
  int count = 0;
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < W) {
    printf("needs %d CUDA devices (found %d): skipped\n", W, count);
    return 77;
  }
  char err[512];
  int nvls_unset = getenv("NCCL_NVLS_ENABLE") == NULL;
  if (zt_comm_nccl_get_id(&g_id, err, sizeof err) < 0) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  const char *nvls = getenv("NCCL_NVLS_ENABLE");
  if (MC_EXPECT(nvls && (!nvls_unset || !strcmp(nvls, "0")), "NCCL_NVLS_ENABLE is %s",
                nvls ? nvls : "unset"))
    return 1;
  zt_comm_cpu_group *g;
  if (zt_comm_cpu_group_open(&g, W) < 0) return 1;
  rank_arg a[W];
  pthread_t th[W];
  for (int r = 0; r < W; r++) {
    a[r] = (rank_arg){.r = r};
    if (zt_comm_cpu_open(&a[r].cpu, g, r) < 0 || pthread_create(&th[r], NULL, rank_main, &a[r]))
      return 1;
  }
  int fails = 0;
  for (int r = 0; r < W; r++) {
    pthread_join(th[r], NULL);
    fails += a[r].fails;
    zt_comm_cpu_close(&a[r].cpu);
  }
  zt_comm_cpu_group_close(g);
  if (fails) {
    fprintf(stderr, "%d failure(s)\n", fails);
    return 1;
  }
  printf("comm nccl: every collective equals the cpu group's on %d devices\n", W);
  return 0;
}
