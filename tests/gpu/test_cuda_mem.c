/* The memory accounting of the cuda backend (zt_backend_mem_stats) and its reserved block: the
 * backend's own pinned and scratch bytes; allocated, peak and the counts; a reserved block is
 * one cudaMalloc whose allocations are consecutive 256-byte aligned slots holding their own
 * data, refusing an allocation beyond it and freed with its last allocation; a trainer (fp32
 * and bf16) takes its buffers from one block of its exact estimate, its steps allocate nothing
 * and give the losses of the cpu backend, and closing it leaves nothing. Exits 77 without a
 * GPU. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/backend.h"
#include "engine/train/trainer.h"
#include "tests/unit/kernels/kcheck.h"

#define ALIGN 256
#define ROOM ((uint64_t)ZT_BACKEND_RESERVE_ALLOCS * ALIGN)

static uint64_t slot(uint64_t bytes) { return bytes ? (bytes + ALIGN - 1) / ALIGN * ALIGN : ALIGN; }

static zt_backend_mem stats(const zt_backend *be) {
  zt_backend_mem m;
  memset(&m, 0xff, sizeof m);
  if (zt_backend_mem_stats(be, &m) < 0) fprintf(stderr, "FAIL: zt_backend_mem_stats\n");
  return m;
}

static int test_block(zt_backend *be) {
  int fail = 0;
  zt_backend_mem m = stats(be);
  fail |= KC_EXPECT(m.allocated == 0 && m.reserved == 0 && m.host_pinned == 4096 &&
                        m.own_device == (4u << 20),
                    "a new context: allocated %llu pinned %llu own %llu",
                    (unsigned long long)m.allocated, (unsigned long long)m.host_pinned,
                    (unsigned long long)m.own_device);
  void *q = be->ops->alloc(be->ctx, 1000);
  zt_backend_mem a = stats(be);
  fail |= KC_EXPECT(q && a.allocated == 1000 && a.peak == 1000 && a.system_allocs == 1,
                    "one cudaMalloc: allocated %llu", (unsigned long long)a.allocated);
  be->ops->free(be->ctx, q);

  const size_t sizes[3] = {1000, 1000, 1010};
  fail |= KC_EXPECT(zt_backend_reserve(be, 3010) == 0, "reserve");
  m = stats(be);
  fail |= KC_EXPECT(m.reserved == slot(3010) + ROOM && m.system_allocs == 2,
                    "the block: reserved %llu, %llu cudaMallocs", (unsigned long long)m.reserved,
                    (unsigned long long)m.system_allocs);
  unsigned char *p[3];
  for (int i = 0; i < 3; i++) {
    p[i] = be->ops->alloc(be->ctx, sizes[i]);
    fail |= KC_EXPECT(p[i] && (uintptr_t)p[i] % ALIGN == 0, "slot %d at %p", i, (void *)p[i]);
  }
  fail |= KC_EXPECT(p[1] == p[0] + 1024 && p[2] == p[1] + 1024, "slots not consecutive");
  m = stats(be);
  fail |= KC_EXPECT(m.system_allocs == 2 && m.allocated == 3010 && m.allocations == 3,
                    "sub-allocations: %llu cudaMallocs, allocated %llu",
                    (unsigned long long)m.system_allocs, (unsigned long long)m.allocated);
  /* each slot holds its own bytes */
  unsigned char *h = malloc(1010), *back = malloc(1010);
  for (int i = 0; i < 3; i++) {
    memset(h, 0x10 + i, sizes[i]);
    be->ops->to_device(be->ctx, p[i], h, sizes[i]);
  }
  for (int i = 0; i < 3; i++) {
    be->ops->to_host(be->ctx, back, p[i], sizes[i]);
    size_t bad = 0;
    for (size_t k = 0; k < sizes[i]; k++) bad += back[k] != 0x10 + i;
    fail |= KC_EXPECT(bad == 0, "slot %d: %zu bytes overwritten", i, bad);
  }
  free(h);
  free(back);
  fail |= KC_EXPECT(be->ops->sync(be->ctx) == 0, "sync: %s", be->ops->error_text(be->ctx));
  /* 3 slots of 1024 taken of 3072 + ROOM */
  fail |= KC_EXPECT(be->ops->alloc(be->ctx, ROOM + 1) == NULL, "an allocation beyond the block");
  fail |= KC_EXPECT(be->ops->sync(be->ctx) == 0, "a refused allocation poisoned the context");
  zt_backend_reserve_end(be);
  for (int i = 0; i < 3; i++) be->ops->free(be->ctx, p[i]);
  m = stats(be);
  fail |= KC_EXPECT(m.reserved == 0 && m.allocated == 0 && m.peak == 3010 &&
                        m.allocations_total == 4,
                    "after the frees: reserved %llu allocated %llu peak %llu",
                    (unsigned long long)m.reserved, (unsigned long long)m.allocated,
                    (unsigned long long)m.peak);
  return fail;
}

/* STEPS steps of a small gpt on be; its losses into loss. */
#define STEPS 3
static int train(const zt_backend *be, zt_dtype precision, double *loss) {
  int fail = 0;
  char err[512];
  zt_model_cfg mc = {.arch = ZT_ARCH_GPT, .vocab = 256, .seq_len = 64, .d_model = 128,
                     .n_heads = 4, .n_layers = 2, .init_seed = 42};
  zt_train_cfg tc;
  zt_train_cfg_defaults(&tc);
  tc.steps = STEPS;
  tc.micro_batch = 4;
  tc.grad_accum = 2;
  tc.precision = precision;
  size_t need = zt_trainer_estimate_bytes(&mc, &tc, be->ops);
  zt_backend_mem m0 = stats(be);
  zt_trainer *t = NULL;
  if (zt_trainer_open(&t, &mc, &tc, be, err, sizeof err) < 0) {
    fprintf(stderr, "FAIL trainer on %s: %s\n", be->ops->name, err);
    return 1;
  }
  zt_backend_mem m = stats(be);
  int buffers = precision == ZT_F32 ? 5 : 6; /* params, grads, m, v, acts (+ the bf16 copy) */
  fail |= KC_EXPECT(m.reserved == slot(need) + ROOM && m.allocated == need &&
                        need == zt_trainer_backend_bytes(t) &&
                        m.allocations == (uint64_t)buffers,
                    "%s %s trainer: reserved %llu allocated %llu for %zu, %llu allocations",
                    be->ops->name, zt_dtype_name(precision), (unsigned long long)m.reserved,
                    (unsigned long long)m.allocated, need, (unsigned long long)m.allocations);
  /* cuda: one cudaMalloc for all of them; cpu: one each, against the budget */
  uint64_t mallocs = m.system_allocs - m0.system_allocs;
  fail |= KC_EXPECT(mallocs == (strcmp(be->ops->name, "cuda") == 0 ? 1u : (unsigned)buffers),
                    "%s: %llu system allocations for the trainer", be->ops->name,
                    (unsigned long long)mallocs);
  size_t per_step = zt_trainer_micro_tokens(t) * (size_t)tc.grad_accum;
  int32_t *tok = malloc(per_step * sizeof *tok);
  for (int s = 0; s < STEPS; s++) {
    for (size_t i = 0; i < per_step; i++) tok[i] = (int32_t)((i * 31 + (size_t)s * 7) % 256);
    zt_step_result r;
    fail |= KC_EXPECT(zt_trainer_step(t, tok, &r, err, sizeof err) == 0, "step: %s", err);
    loss[s] = r.loss;
  }
  free(tok);
  zt_backend_mem after = stats(be);
  fail |= KC_EXPECT(after.allocations_total == m.allocations_total &&
                        after.system_allocs == m.system_allocs,
                    "%s: the steps allocated", be->ops->name);
  zt_trainer_close(t);
  m = stats(be);
  fail |= KC_EXPECT(m.allocated == 0 && m.reserved == 0 && m.allocations == 0,
                    "%s after close: allocated %llu reserved %llu", be->ops->name,
                    (unsigned long long)m.allocated, (unsigned long long)m.reserved);
  return fail;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  char err[256];
  zt_backend gpu, cpu;
  int rc = zt_backend_open(&gpu, "cuda", 0, 0, err, sizeof err);
  if (rc == -ENODEV) {
    printf("no CUDA device: skipped\n");
    return 77;
  }
  if (rc < 0 || zt_backend_open(&cpu, "cpu", 0, 0, err, sizeof err) < 0) {
    fprintf(stderr, "FAIL: %s\n", err);
    return 1;
  }
  int fail = test_block(&gpu);
  double lg[STEPS], lc[STEPS], lb[STEPS];
  fail |= train(&gpu, ZT_F32, lg) | train(&cpu, ZT_F32, lc) | train(&gpu, ZT_BF16, lb);
  for (int s = 0; s < STEPS; s++) {
    fail |= KC_EXPECT(fabs(lg[s] - lc[s]) <= 1e-4 * fabs(lc[s]),
                      "step %d: cuda loss %.9g, cpu %.9g", s + 1, lg[s], lc[s]);
    fail |= KC_EXPECT(isfinite(lb[s]), "bf16 step %d: loss %g", s + 1, lb[s]);
  }
  zt_backend_close(&gpu);
  zt_backend_close(&cpu);
  printf("%s: cuda_mem\n", fail ? "FAIL" : "PASS");
  return fail ? 1 : 0;
}
