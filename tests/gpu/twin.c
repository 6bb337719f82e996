#include "tests/gpu/twin.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine/kernels/cuda/cuda_backend.h"

static void **g_bufs;
static size_t g_n, g_cap;

int twin_open(zt_backend *cpu, zt_backend *gpu) {
  int count = 0;
  /* keep result tables in order with the backend's log lines */
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    printf("no CUDA device: skipped\n");
    return 77;
  }
  int rc = zt_backend_cuda_open(gpu, 0);
  if (rc < 0) {
    fprintf(stderr, "zt_backend_cuda_open: %d\n", rc);
    return 1;
  }
  if ((rc = zt_backend_cpu_open(cpu, 0)) < 0) {
    fprintf(stderr, "zt_backend_cpu_open: %d\n", rc);
    zt_backend_cuda_close(gpu);
    return 1;
  }
  return 0;
}

void twin_close(zt_backend *cpu, zt_backend *gpu) {
  twin_dev_free_all(gpu);
  free(g_bufs);
  g_bufs = NULL;
  g_cap = 0;
  zt_backend_cuda_close(gpu);
  zt_backend_cpu_close(cpu);
}

void *twin_dev_alloc(const zt_backend *gpu, size_t bytes) {
  if (g_n == g_cap) {
    size_t cap = g_cap ? 2 * g_cap : 64;
    void **b = realloc(g_bufs, cap * sizeof *b);
    if (!b) {
      fprintf(stderr, "out of memory for the device buffer list\n");
      exit(1);
    }
    g_bufs = b;
    g_cap = cap;
  }
  void *p = gpu->ops->alloc(gpu->ctx, bytes ? bytes : 1);
  if (!p) {
    fprintf(stderr, "device allocation of %zu bytes failed\n", bytes);
    exit(1);
  }
  return g_bufs[g_n++] = p;
}

void twin_dev_free_all(const zt_backend *gpu) {
  while (g_n > 0) gpu->ops->free(gpu->ctx, g_bufs[--g_n]);
}
