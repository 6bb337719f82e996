/* The collectives of ZeRO training on two GPUs against NCCL's own all-reduce (issue 6: the bus
 * bandwidth of the reduce-scatter / all-gather phases reported against the all-reduce's,
 * measured in the same run).
 *
 *   bench_comm [--reps N] [--warmup N]
 *
 * Two ranks, one thread each on GPU 0 and GPU 1, through zt's NCCL communicator
 * (engine/comm/comm_nccl.h: every call below is the NCCL call of the same name on the rank's
 * stream), on cudaMalloc'd buffers, for the units of GPT-2 1.5B (d 1600, 48 layers, vocab
 * 50304, seq 1024; engine/model/gpt.c): the embedding (wte + wpe), 48 blocks of 12 d^2 + 13 d
 * parameters, the head (ln_f, 2 d). Each unit of n elements is cut as the trainer cuts it
 * (offload/shard.h with engine/plan/dp_plan.h's ZT_DP_ALIGN): chunk = ceil(n / W) rounded up to 8,
 * the padded unit W * chunk. Phases:
 *   all_reduce      one all-reduce of the whole model's fp32 gradients (the sum of the units'
 *                   n, in place): NCCL's own figure, the baseline;
 *   reduce_scatter  per unit, back to back, the padded unit's fp32 gradients into the rank's
 *                   chunk (stages 2-3, every micro-batch's backward);
 *   all_gather bf16 per unit, the bf16 parameters (2 bytes each) from the chunks;
 *   all_gather pair per unit, the fp32 parameters then the bf16 copy, the two calls the trainer
 *                   makes in bf16 (stage 3 before each unit's forward and backward; stages 1-2
 *                   after AdamW).
 * Bandwidths as nccl-tests defines them, with W ranks and S bytes: all-reduce S = the
 * gradients' bytes, algbw = S / t, busbw = algbw * 2 (W - 1) / W; a per-unit phase S = the
 * bytes of the full padded units (W * chunk * element size, summed), busbw = algbw * (W - 1) / W.
 * A repetition runs after a barrier (a one-float all-reduce that the host waits for), timed with
 * CUDA events on each rank's stream; its time is the slower rank's. Each phase runs WARMUP
 * times untimed (NCCL connects lazily), then REPS times: the figures are the mean over the REPS
 * (the best one too). Each rank holds about 20 GB of buffers: the padded layouts of the fp32
 * gradients, the fp32 and the bf16 parameters, and its fp32 and bf16 shards. Prints a table, then
 * one line "JSON {...}". Exits 77 with fewer than two CUDA devices. */
#include <cuda_runtime_api.h>
#include <errno.h>
/* nccl.h declares a few functions as f() */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/comm/comm.h"
#include "engine/comm/comm_nccl.h"

#define W 2
#define ALIGN 8 /* engine/plan/dp_plan.h's ZT_DP_ALIGN */
#define D_MODEL 1600
#define N_LAYERS 48
#define VOCAB 50304
#define SEQ 1024
#define N_UNITS (N_LAYERS + 2)
#define MAX_REPS 1000

enum { PH_ALL_REDUCE, PH_REDUCE_SCATTER, PH_GATHER_BF16, PH_GATHER_PAIR, N_PHASES };

static const struct {
  const char *key, *label;
} g_phase[N_PHASES] = {
    {"all_reduce", "all_reduce fp32, whole model, 1 call"},
    {"reduce_scatter", "reduce_scatter fp32, per unit"},
    {"all_gather_bf16", "all_gather bf16, per unit"},
    {"all_gather_fp32_bf16", "all_gather fp32 + bf16, per unit"},
};

/* The model's units as the trainer cuts them: element counts, chunks, offsets in the padded
 * layout (units back to back, W chunks each) and in a rank's packed shard (its chunks). */
static size_t g_numel[N_UNITS], g_chunk[N_UNITS], g_padded_off[N_UNITS], g_packed_off[N_UNITS];
static size_t g_numel_total, g_padded_total, g_packed_total;

static zt_comm_nccl_id g_id;
static unsigned g_reps = 10, g_warmup = 3;
/* per phase, per timed repetition, per rank: milliseconds */
static float g_ms[N_PHASES][MAX_REPS][W];

static void units_build(void) {
  for (int u = 0; u < N_UNITS; u++) {
    size_t n = u == 0 ? (size_t)VOCAB * D_MODEL + (size_t)SEQ * D_MODEL /* wte + wpe */
               : u == N_UNITS - 1 ? (size_t)2 * D_MODEL                  /* ln_f */
                                  : (size_t)12 * D_MODEL * D_MODEL + (size_t)13 * D_MODEL;
    size_t c = (n + W - 1) / W;
    c = (c + ALIGN - 1) / ALIGN * ALIGN;
    g_numel[u] = n;
    g_chunk[u] = c;
    g_padded_off[u] = g_padded_total;
    g_packed_off[u] = g_packed_total;
    g_numel_total += n;
    g_padded_total += (size_t)W * c;
    g_packed_total += c;
  }
}

/* Bytes a phase moves by nccl-tests' S (see the header). */
static double phase_bytes(int ph) {
  switch (ph) {
  case PH_ALL_REDUCE: return (double)g_numel_total * 4;
  case PH_REDUCE_SCATTER: return (double)g_padded_total * 4;
  case PH_GATHER_BF16: return (double)g_padded_total * 2;
  default: return (double)g_padded_total * 6;
  }
}

static int phase_calls(int ph) {
  return ph == PH_ALL_REDUCE ? 1 : ph == PH_GATHER_PAIR ? 2 * N_UNITS : N_UNITS;
}

/* busbw / algbw */
static double bus_factor(int ph) {
  return ph == PH_ALL_REDUCE ? 2.0 * (W - 1) / W : (double)(W - 1) / W;
}

/* Any failure ends the process: the other rank would wait for this one forever. */
static void cu(cudaError_t e, int r, const char *what) {
  if (e != cudaSuccess) {
    fprintf(stderr, "bench_comm: rank %d: %s: %s\n", r, what, cudaGetErrorString(e));
    exit(1);
  }
}

typedef struct rank_ctx {
  int r;
  zt_comm comm;
  cudaStream_t s;
  /* as the trainer holds them: the padded layout of the gradients and of the parameters (fp32
   * and the bf16 compute copy), the rank's packed shards */
  float *grads, *params, *shard;
  char *params16, *shard16;
} rank_ctx;

static void comm_ok(rank_ctx *k, int rc, const char *what) {
  if (rc < 0) {
    fprintf(stderr, "bench_comm: rank %d: %s: %s\n", k->r, what,
            k->comm.ops->error_text(k->comm.ctx));
    exit(1);
  }
}

static void run_phase(rank_ctx *k, int ph) {
  const zt_comm_ops *o = k->comm.ops;
  void *c = k->comm.ctx;
  if (ph == PH_ALL_REDUCE) {
    comm_ok(k, o->all_reduce(c, k->grads, k->grads, g_numel_total, k->s), "all_reduce");
    return;
  }
  for (int u = 0; u < N_UNITS; u++) {
    size_t n = g_chunk[u], pad = g_padded_off[u], pk = g_packed_off[u];
    if (ph == PH_REDUCE_SCATTER) {
      comm_ok(k, o->reduce_scatter(c, k->grads + pad, k->shard + pk, n, k->s), "reduce_scatter");
      continue;
    }
    if (ph == PH_GATHER_PAIR)
      comm_ok(k, o->all_gather(c, k->shard + pk, k->params + pad, n * 4, k->s),
              "all_gather fp32");
    comm_ok(k, o->all_gather(c, k->shard16 + pk * 2, k->params16 + pad * 2, n * 2, k->s),
            "all_gather bf16");
  }
}

static void *rank_main(void *arg) {
  rank_ctx *k = arg;
  int r = k->r;
  char err[512];
  cudaEvent_t t0, t1;
  cu(cudaSetDevice(r), r, "cudaSetDevice");
  cu(cudaStreamCreateWithFlags(&k->s, cudaStreamNonBlocking), r, "cudaStreamCreate");
  if (zt_comm_nccl_open(&k->comm, W, r, &g_id, r, NULL, err, sizeof err) < 0) {
    fprintf(stderr, "bench_comm: rank %d: %s\n", r, err);
    exit(1);
  }
  /* zeros: the sums stay finite */
  struct {
    void **p;
    size_t bytes;
  } buf[] = {{(void **)&k->grads, g_padded_total * 4},   {(void **)&k->params, g_padded_total * 4},
             {(void **)&k->params16, g_padded_total * 2}, {(void **)&k->shard, g_packed_total * 4},
             {(void **)&k->shard16, g_packed_total * 2}};
  for (size_t i = 0; i < sizeof buf / sizeof buf[0]; i++) {
    cu(cudaMalloc(buf[i].p, buf[i].bytes), r, "cudaMalloc");
    cu(cudaMemset(*buf[i].p, 0, buf[i].bytes), r, "cudaMemset");
  }
  cu(cudaDeviceSynchronize(), r, "cudaDeviceSynchronize");
  cu(cudaEventCreate(&t0), r, "cudaEventCreate");
  cu(cudaEventCreate(&t1), r, "cudaEventCreate");
  for (int ph = 0; ph < N_PHASES; ph++) {
    for (unsigned rep = 0; rep < g_warmup + g_reps; rep++) {
      comm_ok(k, k->comm.ops->barrier(k->comm.ctx, k->s), "barrier");
      cu(cudaEventRecord(t0, k->s), r, "cudaEventRecord");
      run_phase(k, ph);
      cu(cudaEventRecord(t1, k->s), r, "cudaEventRecord");
      cu(cudaEventSynchronize(t1), r, "cudaEventSynchronize");
      float ms = 0;
      cu(cudaEventElapsedTime(&ms, t0, t1), r, "cudaEventElapsedTime");
      if (rep >= g_warmup) g_ms[ph][rep - g_warmup][r] = ms;
    }
  }
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  zt_comm_nccl_close(&k->comm);
  for (size_t i = 0; i < sizeof buf / sizeof buf[0]; i++) cudaFree(*buf[i].p);
  cudaStreamDestroy(k->s);
  return NULL;
}

static int parse_count(const char *name, const char *v, unsigned lo, unsigned *out) {
  char *end;
  errno = 0;
  unsigned long n = v ? strtoul(v, &end, 10) : 0;
  if (!v || errno || end == v || *end || v[0] == '-' || n < lo || n > MAX_REPS) {
    fprintf(stderr, "bench_comm: %s '%s': expected an integer in %u..%d\n", name, v ? v : "",
            lo, MAX_REPS);
    return -EINVAL;
  }
  *out = (unsigned)n;
  return 0;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i += 2) {
    int rc;
    if (!strcmp(argv[i], "--reps")) rc = parse_count("--reps", argv[i + 1], 1, &g_reps);
    else if (!strcmp(argv[i], "--warmup")) rc = parse_count("--warmup", argv[i + 1], 0, &g_warmup);
    else {
      fprintf(stderr, "usage: bench_comm [--reps N] [--warmup N]\n");
      return 2;
    }
    if (rc < 0) return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  int n_dev = 0;
  cudaError_t e = cudaGetDeviceCount(&n_dev);
  if (e != cudaSuccess || n_dev < W) {
    printf("SKIP: needs %d CUDA devices (found %d%s%s)\n", W, e == cudaSuccess ? n_dev : 0,
           e == cudaSuccess ? "" : ": ", e == cudaSuccess ? "" : cudaGetErrorString(e));
    return 77;
  }
  struct cudaDeviceProp prop;
  cu(cudaGetDeviceProperties(&prop, 0), 0, "cudaGetDeviceProperties");
  int nccl_version = 0;
  ncclGetVersion(&nccl_version);
  units_build();
  char err[512];
  /* also sets NCCL_NVLS_ENABLE=0 unless it is set */
  if (zt_comm_nccl_get_id(&g_id, err, sizeof err) < 0) {
    fprintf(stderr, "bench_comm: %s\n", err);
    return 1;
  }
  const char *nvls = getenv("NCCL_NVLS_ENABLE");
  printf("bench_comm: %d ranks on GPUs 0-%d (%s), NCCL %d.%d.%d through zt's communicator, "
         "NCCL_NVLS_ENABLE=%s\n",
         W, W - 1, prop.name, nccl_version / 10000, nccl_version / 100 % 100, nccl_version % 100,
         nvls ? nvls : "unset");
  printf("GPT-2 1.5B: %d units (embedding %zu, %d blocks of %zu, head %zu elements), %zu "
         "parameters, %zu padded (chunks of 8)\n",
         N_UNITS, g_numel[0], N_LAYERS, g_numel[1], g_numel[N_UNITS - 1], g_numel_total,
         g_padded_total);
  printf("time: mean of %u repetitions after %u warm-up ones, the slower rank's, CUDA events on "
         "each rank's stream after a barrier\n",
         g_reps, g_warmup);

  rank_ctx k[W];
  pthread_t th[W];
  for (int r = 0; r < W; r++) {
    k[r] = (rank_ctx){.r = r};
    if (pthread_create(&th[r], NULL, rank_main, &k[r]) != 0) {
      fprintf(stderr, "bench_comm: cannot start the thread of rank %d\n", r);
      return 1;
    }
  }
  for (int r = 0; r < W; r++) pthread_join(th[r], NULL);

  double mean_ms[N_PHASES], best_ms[N_PHASES], busbw[N_PHASES];
  for (int ph = 0; ph < N_PHASES; ph++) {
    double sum = 0, best = 0;
    for (unsigned i = 0; i < g_reps; i++) {
      double t = 0;
      for (int r = 0; r < W; r++)
        if (g_ms[ph][i][r] > t) t = g_ms[ph][i][r];
      sum += t;
      if (i == 0 || t < best) best = t;
    }
    mean_ms[ph] = sum / g_reps;
    best_ms[ph] = best;
    busbw[ph] = phase_bytes(ph) / (mean_ms[ph] * 1e-3) / 1e9 * bus_factor(ph);
  }
  printf("\n%-36s %5s %9s %9s %9s %11s %11s %9s\n", "phase", "calls", "GB", "mean ms", "best ms",
         "algbw GB/s", "busbw GB/s", "bus/AR");
  for (int ph = 0; ph < N_PHASES; ph++) {
    double alg = phase_bytes(ph) / (mean_ms[ph] * 1e-3) / 1e9;
    printf("%-36s %5d %9.3f %9.3f %9.3f %11.1f %11.1f %9.3f\n", g_phase[ph].label,
           phase_calls(ph), phase_bytes(ph) / 1e9, mean_ms[ph], best_ms[ph], alg, busbw[ph],
           busbw[ph] / busbw[PH_ALL_REDUCE]);
  }
  printf("(GB = 1e9 bytes; bus/AR = the phase's busbw over the all-reduce's)\n");

  printf("JSON {\"ranks\": %d, \"gpu\": \"%s\", \"nccl_version\": %d, \"nvls_enable\": \"%s\", "
         "\"reps\": %u, \"warmup\": %u, \"statistic\": \"mean of reps, slower rank\", "
         "\"model\": \"gpt2-1.5b\", \"units\": %d, \"params\": %zu, \"padded\": %zu, "
         "\"phases\": {",
         W, prop.name, nccl_version, nvls ? nvls : "unset", g_reps, g_warmup, N_UNITS,
         g_numel_total, g_padded_total);
  for (int ph = 0; ph < N_PHASES; ph++) {
    double alg = phase_bytes(ph) / (mean_ms[ph] * 1e-3) / 1e9;
    printf("%s\"%s\": {\"calls\": %d, \"bytes\": %.0f, \"mean_ms\": %.4f, \"best_ms\": %.4f, "
           "\"algbw_gb_s\": %.2f, \"busbw_gb_s\": %.2f, \"busbw_best_gb_s\": %.2f, "
           "\"busbw_vs_all_reduce\": %.4f}",
           ph ? ", " : "", g_phase[ph].key, phase_calls(ph), phase_bytes(ph), mean_ms[ph],
           best_ms[ph], alg, busbw[ph],
           phase_bytes(ph) / (best_ms[ph] * 1e-3) / 1e9 * bus_factor(ph),
           busbw[ph] / busbw[PH_ALL_REDUCE]);
  }
  printf("}}\n");
  return 0;
}
