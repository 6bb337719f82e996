/* CPU AdamW throughput against the host memory bandwidth.
 *
 *   bench_cpu_adam [N] [THREADS]     (N params, default 50 M; THREADS default: every online core)
 *
 * AdamW on each path on one thread, then on a pool of THREADS workers, with and without the
 * bf16 or fp16 copy the step sends back to the GPU, and with bf16 moments. On the same pool, over the same arrays: STREAM's copy
 * (a = b) and triad (a = b + s*c), and AdamW's access pattern without its arithmetic (p, m, v +=
 * g: p, g, m, v read, p, m, v written in place), the most an AdamW could move. Each figure is the
 * best of 3.
 *
 * GB/s counts bytes as the issue 5 convention does: 32 per param for AdamW and its pattern
 * (16 read + 16 written; the kernel writes 12, so true traffic is 7/8 of it), 34 with the bf16
 * or fp16 copy; copy and triad count 8 and 12 bytes per element as STREAM does (no write-allocate
 * reads). Then the pool's AdamW as a fraction of the in-place pattern's rate (the host memory
 * bandwidth for AdamW's accesses) and of the triad, and one JSON line with every figure. */
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

/* ---- host memory bandwidth on the pool ------------------------------------------------------ */

typedef struct mem_args {
  float *a;
  const float *b, *c;
  float *m, *v; /* the pattern's other two in-place arrays (a is p, b is g) */
} mem_args;

static void copy_chunk(void *arg, size_t lo, size_t hi) {
  const mem_args *x = arg;
  float *restrict a = x->a;
  const float *restrict b = x->b;
  for (size_t i = lo; i < hi; i++) a[i] = b[i];
}

static void triad_chunk(void *arg, size_t lo, size_t hi) {
  const mem_args *x = arg;
  float *restrict a = x->a;
  const float *restrict b = x->b, *restrict c = x->c;
  for (size_t i = lo; i < hi; i++) a[i] = b[i] + 3.0f * c[i];
}

static void pattern_chunk(void *arg, size_t lo, size_t hi) {
  const mem_args *x = arg;
  float *restrict p = x->a, *restrict m = x->m, *restrict v = x->v;
  const float *restrict g = x->b;
  for (size_t i = lo; i < hi; i++) {
    p[i] += g[i];
    m[i] += g[i];
    v[i] += g[i];
  }
}

/* Best of 3 over n elements, in AdamW's chunks. */
static double pool_best(zt_cpu_pool *pool, zt_cpu_pool_fn fn, mem_args *arg, size_t n) {
  double best = 1e30;
  for (int rep = 0; rep < 3; rep++) {
    zt_cpu_job job = {.fn = fn, .arg = arg, .n = n, .chunk = ZT_CPU_ADAM_CHUNK};
    double t0 = now();
    if (zt_cpu_pool_submit(pool, &job) < 0) {
      fprintf(stderr, "bench_cpu_adam: pool submit failed\n");
      exit(1);
    }
    zt_cpu_pool_wait(pool, &job);
    double dt = now() - t0;
    if (dt < best) best = dt;
  }
  return best;
}

int main(int argc, char **argv) {
  int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
  size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 50000000;
  int threads = argc > 2 ? atoi(argv[2]) : cores;
  if (n == 0 || threads < 1 || threads > 1024 || argc > 3) {
    fprintf(stderr, "usage: bench_cpu_adam [N params >= 1] [THREADS 1..1024]\n");
    return 2;
  }
  zt_adam_hparams h = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                       .weight_decay = 0.01f, .grad_scale = 1.0f, .step = 1};
  float *p = floats(n, 0.5f), *g = floats(n, 0.01f), *m = floats(n, 0.0f), *v = floats(n, 0.0f);
  uint16_t *lp = aligned_alloc(64, (n * 2 + 63) / 64 * 64);
  double scalar_s = 0, pool_s = 0, pool_lp_s[2] = {1e30, 1e30};
  zt_cpu_pool *pool = NULL;
  if (!lp || zt_cpu_pool_open(&pool, threads, 1) < 0) {
    fprintf(stderr, "bench_cpu_adam: no memory for the compute copy or no pool of %d\n",
            threads);
    return 1;
  }
  printf("cpu_adam: %zu params, %d threads (%d cores online), best path %s\n", n, threads, cores,
         zt_cpu_isa_name(zt_cpu_isa_best()));
  for (int isa = ZT_CPU_ISA_SCALAR; isa <= ZT_CPU_ISA_AVX512 + 1; isa++) {
    int pooled = isa > ZT_CPU_ISA_AVX512;
    double best = 1e30;
    if (!pooled && !zt_cpu_isa_supported((zt_cpu_isa)isa)) continue;
    for (int rep = 0; rep < 3; rep++) {
      double t0 = now();
      if (pooled) {
        zt_cpu_adam_task t = {.p = p, .g = g, .m = m, .v = v, .n = n, .h = h};
        zt_cpu_adam_step(pool, &t);
      } else {
        zt_cpu_adam_run((zt_cpu_isa)isa, &h, p, g, m, v, NULL, NULL, n);
      }
      double dt = now() - t0;
      if (dt < best) best = dt;
      h.step++;
    }
    if (isa == ZT_CPU_ISA_SCALAR) scalar_s = best;
    if (pooled) pool_s = best;
    char name[64];
    if (pooled)
      snprintf(name, sizeof name, "pool x%d (%s)", threads, zt_cpu_isa_name(zt_cpu_isa_best()));
    else
      snprintf(name, sizeof name, "%s x1", zt_cpu_isa_name(isa));
    printf("  %-22s %8.1f Mparams/s %7.2f GB/s  %5.2fx scalar\n", name, n / best / 1e6,
           32.0 * n / best / 1e9, scalar_s / best);
  }
  /* the compute copy: k 0 bf16, 1 fp16 */
  static const char *const lp_names[2] = {"bf16", "fp16"};
  for (int k = 0; k < 2; k++) {
    uint16_t *bf = k == 0 ? lp : NULL, *hf = k == 1 ? lp : NULL;
    char name[64];
    for (int rep = 0; rep < 3; rep++) {
      zt_cpu_adam_task t = {.p = p, .g = g, .m = m, .v = v, .p_bf16 = bf, .p_fp16 = hf, .n = n,
                            .h = h};
      double t0 = now();
      zt_cpu_adam_step(pool, &t);
      double dt = now() - t0;
      if (dt < pool_lp_s[k]) pool_lp_s[k] = dt;
      h.step++;
    }
    snprintf(name, sizeof name, "pool + %s", lp_names[k]);
    printf("  %-22s %8.1f Mparams/s %7.2f GB/s  (34 B/param: +2 %s written)\n", name,
           n / pool_lp_s[k] / 1e6, 34.0 * n / pool_lp_s[k] / 1e9, lp_names[k]);
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
      double t0 = now();
      zt_cpu_adam_run(ZT_CPU_ISA_AUTO, &h, p, g, m, v, bf, hf, n);
      double dt = now() - t0;
      if (dt < best) best = dt;
    }
    snprintf(name, sizeof name, "auto x1 + %s", lp_names[k]);
    printf("  %-22s %8.1f Mparams/s %7.2f GB/s  (34 B/param: +2 %s written)\n", name,
           n / best / 1e6, 34.0 * n / best / 1e9, lp_names[k]);
  }
  /* bf16 moments (zt_cpu_adam_run_bf16): 24 B/param by the same convention (12 read, 12
   * counted written), the rounding's counter hash on top of the arithmetic */
  uint16_t *m16 = calloc(n, sizeof *m16), *v16 = calloc(n, sizeof *v16);
  for (int isa = ZT_CPU_ISA_SCALAR; m16 && v16 && isa <= ZT_CPU_ISA_AVX512 + 1; isa++) {
    int pooled = isa > ZT_CPU_ISA_AVX512;
    double best = 1e30;
    if (!pooled && !zt_cpu_isa_supported((zt_cpu_isa)isa)) continue;
    for (int rep = 0; rep < 3; rep++) {
      double t0 = now();
      if (pooled) {
        zt_cpu_adam_task t = {.p = p, .g = g, .m = m16, .v = v16, .state = ZT_BF16, .n = n,
                              .h = h};
        zt_cpu_adam_step(pool, &t);
      } else {
        zt_cpu_adam_run_bf16((zt_cpu_isa)isa, &h, p, g, m16, v16, NULL, NULL, n, 0);
      }
      double dt = now() - t0;
      if (dt < best) best = dt;
      h.step++;
    }
    char name[64];
    if (pooled)
      snprintf(name, sizeof name, "pool x%d, bf16 m v", threads);
    else
      snprintf(name, sizeof name, "%s x1, bf16 m v", zt_cpu_isa_name(isa));
    printf("  %-22s %8.1f Mparams/s %7.2f GB/s  (24 B/param)\n", name, n / best / 1e6,
           24.0 * n / best / 1e9);
  }
  free(m16);
  free(v16);
  /* The AdamW runs are done: their arrays become scratch. */
  mem_args copy = {.a = m, .b = g}, triad = {.a = p, .b = g, .c = v};
  mem_args pattern = {.a = p, .b = g, .m = m, .v = v};
  double copy_gbs = 8.0 * n / pool_best(pool, copy_chunk, &copy, n) / 1e9;
  double triad_gbs = 12.0 * n / pool_best(pool, triad_chunk, &triad, n) / 1e9;
  double pattern_gbs = 32.0 * n / pool_best(pool, pattern_chunk, &pattern, n) / 1e9;
  double adam_gbs = 32.0 * n / pool_s / 1e9, adam_bf16_gbs = 34.0 * n / pool_lp_s[0] / 1e9;
  double adam_fp16_gbs = 34.0 * n / pool_lp_s[1] / 1e9;
  printf("  memory x%d: copy %.2f GB/s, triad %.2f GB/s (STREAM's counts: 8, 12 B/elem); "
         "in place %.2f GB/s (p, m, v += g; 32 B/param like AdamW)\n", threads, copy_gbs,
         triad_gbs, pattern_gbs);
  /* Against the in-place pattern the byte counts are the same and cancel; against the triad
   * they do not (its write-allocate reads are not counted), so that figure can pass 1. */
  printf("  pool AdamW: %.3f of the in-place bandwidth (with bf16 %.3f, fp16 %.3f); %.3f of "
         "triad\n", adam_gbs / pattern_gbs, adam_bf16_gbs / pattern_gbs,
         adam_fp16_gbs / pattern_gbs, adam_gbs / triad_gbs);
  printf("{\"bench\": \"cpu_adam\", \"params\": %zu, \"threads\": %d, \"isa\": \"%s\", "
         "\"pool_gbs\": %.3f, \"pool_bf16_gbs\": %.3f, \"pool_fp16_gbs\": %.3f, "
         "\"copy_gbs\": %.3f, \"triad_gbs\": %.3f, \"inplace_gbs\": %.3f, \"of_inplace\": %.4f, "
         "\"bf16_of_inplace\": %.4f, \"fp16_of_inplace\": %.4f, \"of_triad\": %.4f}\n", n,
         threads, zt_cpu_isa_name(zt_cpu_isa_best()), adam_gbs, adam_bf16_gbs, adam_fp16_gbs,
         copy_gbs, triad_gbs, pattern_gbs, adam_gbs / pattern_gbs, adam_bf16_gbs / pattern_gbs,
         adam_fp16_gbs / pattern_gbs, adam_gbs / triad_gbs);
  zt_cpu_pool_close(pool);
  free(p), free(g), free(m), free(v), free(lp);
  return 0;
}
