/* The CUDA copy engine against plain pinned cudaMemcpyAsync (issue 5: H2D and D2H while
 * streaming >= 85% of the pinned copy bandwidth, about 55 GB/s each way on an H200 host).
 *
 *   bench_copy [--bytes BYTES] [--unit BYTES] [--reps N]      (BYTES: K, M or G suffix)
 *
 * BYTES each way (default 2 GiB) between device buffers and pinned host buffers, measured as:
 *   raw        one cudaMemcpyAsync of all the bytes, one direction at a time, from host memory
 *              allocated with cudaHostAlloc (the baseline: "pinned cudaMemcpy") and from the
 *              host arena's memory (mmap + cudaHostRegister, what the offloaded step uses);
 *   raw both   both directions at once on two streams, arena memory (what the link gives when
 *              both are busy);
 *   engine     zt_copy_cuda_open over a compute stream of our own, the same bytes as UNIT-sized
 *              operations (default 64 MiB, about a GPT-2 1.5B layer in bf16) from the host
 *              arena's memory: each queue alone, then both at once, each H2D ticket handed to
 *              the compute stream (compute_wait) as the step does. The engine orders every copy
 *              after the compute queued before it, so D2H k follows H2D k, as a unit's gradient
 *              follows its fetch: the D2H figure carries that one unit of lag.
 * A direction's time runs from the submission of its first copy to the moment the host sees
 * its last one done (polled, so two directions get their own end times); each figure is the
 * best of REPS (default 5) after a warm-up. The ratios are against the raw cudaHostAlloc
 * figure of the same direction. The data is checked once, through both paths. Prints GB/s
 * (1e9 bytes/s), then one JSON line. Exits 77 without a GPU. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "offload/copy_engine.h"
#include "offload/host_arena.h"

#define CK(call)                                                                               \
  do {                                                                                         \
    cudaError_t e_ = (call);                                                                   \
    if (e_ != cudaSuccess) {                                                                   \
      fprintf(stderr, "bench_copy: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,               \
              cudaGetErrorString(e_));                                                         \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

/* Engine calls return a ticket (>= 1) or -errno; query 0/1. */
static int64_t ok(int64_t rc, const char *what) {
  if (rc < 0) {
    fprintf(stderr, "bench_copy: copy engine: %s: %s\n", what, strerror((int)-rc));
    exit(1);
  }
  return rc;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct bufs {
  size_t bytes, unit;
  char *dev_in, *dev_out;   /* H2D destination, D2H source */
  char *reg_in, *reg_out;   /* host arena memory (mmap + cudaHostRegister): H2D source, D2H dest */
  char *alloc_in, *alloc_out; /* the same from cudaHostAlloc */
  cudaStream_t s[2];        /* raw copies: H2D, D2H */
  cudaStream_t compute;     /* the engine's compute stream (no kernels: only its ordering) */
} bufs;

typedef struct rate {
  double h2d, d2h; /* GB/s; 0: not measured */
} rate;

/* Spins until each direction in use is done, noting when. done(i) is 1 once direction i is. */
typedef int (*done_fn)(void *ctx, int dir);

static void time_dirs(double t0, const int use[2], done_fn done, void *ctx, double secs[2]) {
  int left = use[0] + use[1];
  int seen[2] = {!use[0], !use[1]};
  while (left) {
    for (int d = 0; d < 2; d++) {
      if (seen[d] || !done(ctx, d)) continue;
      secs[d] = now() - t0;
      seen[d] = 1;
      left--;
    }
  }
}

static int stream_done(void *ctx, int dir) {
  cudaError_t r = cudaStreamQuery(((bufs *)ctx)->s[dir]);
  if (r == cudaErrorNotReady) return 0;
  CK(r);
  return 1;
}

/* Raw: one cudaMemcpyAsync per direction used, on its own stream. */
static rate raw_once(bufs *b, int alloc, const int use[2]) {
  double secs[2] = {0, 0};
  const char *in = alloc ? b->alloc_in : b->reg_in;
  char *out = alloc ? b->alloc_out : b->reg_out;
  CK(cudaDeviceSynchronize());
  double t0 = now();
  if (use[0]) CK(cudaMemcpyAsync(b->dev_in, in, b->bytes, cudaMemcpyHostToDevice, b->s[0]));
  if (use[1]) CK(cudaMemcpyAsync(out, b->dev_out, b->bytes, cudaMemcpyDeviceToHost, b->s[1]));
  time_dirs(t0, use, stream_done, b, secs);
  return (rate){use[0] ? b->bytes / secs[0] / 1e9 : 0, use[1] ? b->bytes / secs[1] / 1e9 : 0};
}

typedef struct engine_ctx {
  zt_copy_engine *e;
  int64_t last[2];
} engine_ctx;

static int ticket_done(void *ctx, int dir) {
  engine_ctx *c = ctx;
  return (int)ok(c->e->ops->query(c->e, (zt_copy_queue)dir, c->last[dir]), "query");
}

/* The engine: unit-sized operations, alternating between the queues in use. */
static rate engine_once(bufs *b, zt_copy_engine *e, const int use[2]) {
  engine_ctx c = {.e = e};
  double secs[2] = {0, 0};
  CK(cudaDeviceSynchronize());
  double t0 = now();
  for (size_t off = 0; off < b->bytes; off += b->unit) {
    size_t n = b->bytes - off < b->unit ? b->bytes - off : b->unit;
    if (use[0]) {
      c.last[0] = ok(e->ops->h2d(e, b->dev_in + off, b->reg_in + off, n, ZT_COPY_AFTER_ALL), "h2d");
      ok(e->ops->compute_wait(e, ZT_COPY_H2D, c.last[0]), "compute_wait");
    }
    if (use[1]) c.last[1] = ok(e->ops->d2h(e, b->reg_out + off, b->dev_out + off, n), "d2h");
  }
  time_dirs(t0, use, ticket_done, &c, secs);
  return (rate){use[0] ? b->bytes / secs[0] / 1e9 : 0, use[1] ? b->bytes / secs[1] / 1e9 : 0};
}

static void keep_best(rate *best, rate r) {
  if (r.h2d > best->h2d) best->h2d = r.h2d;
  if (r.d2h > best->d2h) best->d2h = r.d2h;
}

/* kind: 0 raw from cudaHostAlloc memory, 1 raw from arena memory, 2 engine */
static rate measure(bufs *b, zt_copy_engine *e, int kind, int h2d, int d2h, unsigned reps) {
  const int use[2] = {h2d, d2h};
  rate best = {0, 0};
  for (unsigned rep = 0; rep <= reps; rep++) { /* rep 0 warms up */
    rate r = kind == 2 ? engine_once(b, e, use) : raw_once(b, kind == 0, use);
    if (rep) keep_best(&best, r);
  }
  return best;
}

static void fill(char *p, size_t n, uint32_t seed) {
  uint32_t x = seed | 1;
  for (size_t i = 0; i + 4 <= n; i += 4) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    memcpy(p + i, &x, 4);
  }
}

/* The bytes went where they should: arena memory -> device -> (raw) cudaHostAlloc memory, and
 * device -> arena memory through the engine against the device's copy. */
static int check_data(bufs *b, zt_copy_engine *e) {
  fill(b->reg_in, b->bytes, 3);
  fill(b->alloc_in, b->bytes, 5);
  CK(cudaMemcpy(b->dev_out, b->alloc_in, b->bytes, cudaMemcpyHostToDevice));
  CK(cudaDeviceSynchronize()); /* the engine's streams do not wait for the default stream */
  engine_ctx c = {.e = e};
  for (size_t off = 0; off < b->bytes; off += b->unit) {
    size_t n = b->bytes - off < b->unit ? b->bytes - off : b->unit;
    c.last[0] = ok(e->ops->h2d(e, b->dev_in + off, b->reg_in + off, n, ZT_COPY_AFTER_ALL), "h2d");
    c.last[1] = ok(e->ops->d2h(e, b->reg_out + off, b->dev_out + off, n), "d2h");
  }
  ok(e->ops->wait(e, ZT_COPY_H2D, c.last[0]), "wait");
  ok(e->ops->wait(e, ZT_COPY_D2H, c.last[1]), "wait");
  CK(cudaMemcpy(b->alloc_out, b->dev_in, b->bytes, cudaMemcpyDeviceToHost));
  if (memcmp(b->alloc_out, b->reg_in, b->bytes) || memcmp(b->reg_out, b->alloc_in, b->bytes)) {
    fprintf(stderr, "bench_copy: the engine's copies do not match their sources\n");
    return -EILSEQ;
  }
  return 0;
}

static int parse_bytes(const char *name, const char *s, size_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  unsigned shift = 0;
  if (*end == 'K' || *end == 'k') shift = 10, end++;
  else if (*end == 'M' || *end == 'm') shift = 20, end++;
  else if (*end == 'G' || *end == 'g') shift = 30, end++;
  if (errno || end == s || *end || s[0] == '-' || v == 0 || v > (SIZE_MAX >> shift) ||
      (v << shift) % 4096) {
    fprintf(stderr, "bench_copy: %s '%s': expected a positive multiple of 4096 bytes, e.g. 2G\n",
            name, s);
    return -EINVAL;
  }
  *out = (size_t)v << shift;
  return 0;
}

static void *arena_mem(const zt_host_mem_ops *m, size_t bytes) {
  void *p = NULL;
  int pin_err = 0;
  if (m->alloc(m->ctx, bytes, &p, &pin_err) < 0 || pin_err) {
    fprintf(stderr, "bench_copy: %zu bytes of pinned host memory: %s\n", bytes,
            p ? "cudaHostRegister refused them" : "out of memory");
    if (p) m->free(m->ctx, p, bytes, 0);
    exit(1);
  }
  return p;
}

int main(int argc, char **argv) {
  size_t bytes = (size_t)2 << 30, unit = (size_t)64 << 20;
  unsigned reps = 5;
  for (int i = 1; i < argc; i++) {
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    int rc = -EINVAL;
    if (v && !strcmp(argv[i], "--bytes")) rc = parse_bytes(argv[i], v, &bytes);
    else if (v && !strcmp(argv[i], "--unit")) rc = parse_bytes(argv[i], v, &unit);
    else if (v && !strcmp(argv[i], "--reps")) {
      char *end;
      unsigned long n = strtoul(v, &end, 10);
      rc = *v >= '1' && *v <= '9' && !*end && n <= 100 ? 0 : -EINVAL;
      if (rc) fprintf(stderr, "bench_copy: --reps '%s': expected 1..100\n", v);
      reps = (unsigned)n;
    } else {
      fprintf(stderr, "usage: bench_copy [--bytes BYTES] [--unit BYTES] [--reps N]\n");
    }
    if (rc < 0) return 2;
    i++;
  }
  if (unit > bytes) unit = bytes;
  int n_dev = 0;
  cudaError_t r = cudaGetDeviceCount(&n_dev);
  if (r != cudaSuccess || n_dev == 0) {
    printf("SKIP: no CUDA device (%s)\n", r != cudaSuccess ? cudaGetErrorString(r) : "none found");
    return 77;
  }
  struct cudaDeviceProp prop;
  CK(cudaSetDevice(0));
  CK(cudaGetDeviceProperties(&prop, 0));
  const zt_host_mem_ops *arena = zt_host_mem_cuda();
  bufs b = {.bytes = bytes, .unit = unit};
  CK(cudaMalloc((void **)&b.dev_in, bytes));
  CK(cudaMalloc((void **)&b.dev_out, bytes));
  CK(cudaMemset(b.dev_out, 0x5a, bytes));
  b.reg_in = arena_mem(arena, bytes);
  b.reg_out = arena_mem(arena, bytes);
  CK(cudaHostAlloc((void **)&b.alloc_in, bytes, cudaHostAllocDefault));
  CK(cudaHostAlloc((void **)&b.alloc_out, bytes, cudaHostAllocDefault));
  memset(b.reg_out, 0, bytes);
  memset(b.alloc_out, 0, bytes);
  for (int d = 0; d < 2; d++) CK(cudaStreamCreateWithFlags(&b.s[d], cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&b.compute, cudaStreamNonBlocking));
  zt_copy_engine *e = NULL;
  ok(zt_copy_cuda_open(&e, 0, b.compute), "zt_copy_cuda_open");
  int rc = check_data(&b, e);
  if (rc == 0) {
    printf("bench_copy: %s, %.2f GiB each way, engine units of %.1f MiB, best of %u\n", prop.name,
           (double)bytes / (1 << 30), (double)unit / (1 << 20), reps);
    rate raw_alloc = {measure(&b, e, 0, 1, 0, reps).h2d, measure(&b, e, 0, 0, 1, reps).d2h};
    rate raw_reg = {measure(&b, e, 1, 1, 0, reps).h2d, measure(&b, e, 1, 0, 1, reps).d2h};
    rate raw_both = measure(&b, e, 1, 1, 1, reps);
    rate eng_one = {measure(&b, e, 2, 1, 0, reps).h2d, measure(&b, e, 2, 0, 1, reps).d2h};
    rate eng_both = measure(&b, e, 2, 1, 1, reps);
    double h = eng_both.h2d / raw_alloc.h2d, d = eng_both.d2h / raw_alloc.d2h;
    printf("  %-44s H2D %6.2f GB/s  D2H %6.2f GB/s\n", "raw, cudaHostAlloc (baseline)",
           raw_alloc.h2d, raw_alloc.d2h);
    printf("  %-44s H2D %6.2f GB/s  D2H %6.2f GB/s\n", "raw, arena memory (cudaHostRegister)",
           raw_reg.h2d, raw_reg.d2h);
    printf("  %-44s H2D %6.2f GB/s  D2H %6.2f GB/s\n", "raw, both directions at once", raw_both.h2d,
           raw_both.d2h);
    printf("  %-44s H2D %6.2f GB/s  D2H %6.2f GB/s  (%.3f, %.3f of baseline)\n",
           "engine, one queue at a time", eng_one.h2d, eng_one.d2h, eng_one.h2d / raw_alloc.h2d,
           eng_one.d2h / raw_alloc.d2h);
    printf("  %-44s H2D %6.2f GB/s  D2H %6.2f GB/s  (%.3f, %.3f of baseline; target 0.85)\n",
           "engine, both queues at once", eng_both.h2d, eng_both.d2h, h, d);
    printf("{\"bench\": \"copy\", \"device\": \"%s\", \"bytes\": %zu, \"unit_bytes\": %zu, "
           "\"reps\": %u, \"raw_h2d_gbs\": %.3f, \"raw_d2h_gbs\": %.3f, "
           "\"raw_registered_h2d_gbs\": %.3f, \"raw_registered_d2h_gbs\": %.3f, "
           "\"raw_both_h2d_gbs\": %.3f, \"raw_both_d2h_gbs\": %.3f, \"engine_h2d_gbs\": %.3f, "
           "\"engine_d2h_gbs\": %.3f, \"engine_both_h2d_gbs\": %.3f, "
           "\"engine_both_d2h_gbs\": %.3f, \"h2d_ratio\": %.4f, \"d2h_ratio\": %.4f, "
           "\"target\": 0.85}\n",
           prop.name, bytes, unit, reps, raw_alloc.h2d, raw_alloc.d2h, raw_reg.h2d, raw_reg.d2h,
           raw_both.h2d, raw_both.d2h, eng_one.h2d, eng_one.d2h, eng_both.h2d, eng_both.d2h, h, d);
  }
  zt_copy_close(e);
  for (int d = 0; d < 2; d++) CK(cudaStreamDestroy(b.s[d]));
  CK(cudaStreamDestroy(b.compute));
  CK(cudaFreeHost(b.alloc_in));
  CK(cudaFreeHost(b.alloc_out));
  arena->free(arena->ctx, b.reg_in, bytes, 1);
  arena->free(arena->ctx, b.reg_out, bytes, 1);
  CK(cudaFree(b.dev_in));
  CK(cudaFree(b.dev_out));
  return rc ? 1 : 0;
}
