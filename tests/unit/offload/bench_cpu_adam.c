/* CPU AdamW throughput: each path on one thread, then the pool on every core, on N params
 * (default 50 M; argv[1] overrides). Prints params/s, GB/s and the speed-up over the scalar
 * path. GB/s counts 32 bytes per param, the offload issue's convention (16 read + 16 written);
 * the kernel reads 16 (p, g, m, v) but writes 12 (p, m, v), so true traffic is 7/8 of it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "offload/cpu_adam.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float *floats(size_t n, float v) {
  float *x = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
  if (!x) {
    perror("alloc");
    exit(1);
  }
  for (size_t i = 0; i < n; i++) x[i] = v + (float)(i % 1000) * 1e-4f;
  return x;
}

int main(int argc, char **argv) {
  size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 50000000;
  zt_adam_hparams h = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                       .weight_decay = 0.01f, .grad_scale = 1.0f, .step = 1};
  float *p = floats(n, 0.5f), *g = floats(n, 0.01f), *m = floats(n, 0.0f), *v = floats(n, 0.0f);
  uint16_t *bf = aligned_alloc(64, (n * 2 + 63) / 64 * 64);
  double scalar_s = 0;
  int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (!bf) return 1;
  printf("cpu_adam: %zu params, %d cores, best path %s\n", n, cores, zt_cpu_isa_name(zt_cpu_isa_best()));
  for (int isa = ZT_CPU_ISA_SCALAR; isa <= ZT_CPU_ISA_AVX512 + 1; isa++) {
    int pooled = isa > ZT_CPU_ISA_AVX512;
    zt_cpu_pool *pool = NULL;
    double best = 1e30;
    if (!pooled && !zt_cpu_isa_supported((zt_cpu_isa)isa)) continue;
    if (pooled && zt_cpu_pool_open(&pool, cores, 1) < 0) return 1;
    for (int rep = 0; rep < 3; rep++) {
      double t0 = now();
      if (pooled) {
        zt_cpu_adam_task t = {.p = p, .g = g, .m = m, .v = v, .n = n, .h = h};
        zt_cpu_adam_step(pool, &t);
      } else {
        zt_cpu_adam_run((zt_cpu_isa)isa, &h, p, g, m, v, NULL, n);
      }
      double dt = now() - t0;
      if (dt < best) best = dt;
      h.step++;
    }
    if (isa == ZT_CPU_ISA_SCALAR) scalar_s = best;
    char name[64];
    if (pooled)
      snprintf(name, sizeof name, "pool x%d (%s)", cores, zt_cpu_isa_name(zt_cpu_isa_best()));
    else
      snprintf(name, sizeof name, "%s x1", zt_cpu_isa_name(isa));
    printf("  %-22s %8.1f Mparams/s %7.2f GB/s  %5.2fx scalar\n", name, n / best / 1e6,
           32.0 * n / best / 1e9, scalar_s / best);
    zt_cpu_pool_close(pool);
  }
  {
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
      double t0 = now();
      zt_cpu_adam_run(ZT_CPU_ISA_AUTO, &h, p, g, m, v, bf, n);
      double dt = now() - t0;
      if (dt < best) best = dt;
    }
    printf("  %-22s %8.1f Mparams/s %7.2f GB/s  (+2 B/param bf16 written)\n", "auto x1 + bf16",
           n / best / 1e6, 32.0 * n / best / 1e9);
  }
  free(p), free(g), free(m), free(v), free(bf);
  return 0;
}
