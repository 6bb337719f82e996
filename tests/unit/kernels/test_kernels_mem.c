/* The backends' memory accounting on the CPU backend (zt_backend_mem_stats): allocated, peak
 * and the counts through allocs and frees; a reserved block (zt_backend_reserve) serving
 * allocations up to its size with 256-byte slots, refusing beyond it, busy while open and given
 * back with its last allocation; the trainer taking its buffers from one block of its exact
 * estimate, with no allocation in its steps and nothing left after it closes. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
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

static int test_counts(zt_backend *be) {
  int fail = 0;
  zt_backend_mem m = stats(be);
  fail |= KC_EXPECT(m.allocated == 0 && m.peak == 0 && m.reserved == 0 && m.allocations == 0 &&
                        m.allocations_total == 0 && m.system_allocs == 0 && m.host_pinned == 0 &&
                        m.own_device == 0,
                    "a new backend has figures: allocated %llu", (unsigned long long)m.allocated);
  unsigned char *a = be->ops->alloc(be->ctx, 1000), *b = be->ops->alloc(be->ctx, 0),
                *c = be->ops->alloc(be->ctx, 24);
  m = stats(be);
  fail |= KC_EXPECT(a && b && c, "allocations failed");
  fail |= KC_EXPECT(m.allocated == 1024 && m.peak == 1024 && m.allocations == 3 &&
                        m.allocations_total == 3 && m.system_allocs == 3,
                    "after 3 allocations: allocated %llu peak %llu allocations %llu",
                    (unsigned long long)m.allocated, (unsigned long long)m.peak,
                    (unsigned long long)m.allocations);
  be->ops->free(be->ctx, a);
  be->ops->free(be->ctx, NULL);
  m = stats(be);
  fail |= KC_EXPECT(m.allocated == 24 && m.peak == 1024 && m.allocations == 2,
                    "after a free: allocated %llu peak %llu", (unsigned long long)m.allocated,
                    (unsigned long long)m.peak);
  /* a failed allocation counts nothing */
  fail |= KC_EXPECT(be->ops->alloc(be->ctx, SIZE_MAX) == NULL, "alloc(SIZE_MAX) succeeded");
  be->ops->free(be->ctx, c);
  be->ops->free(be->ctx, b);
  m = stats(be);
  fail |= KC_EXPECT(m.allocated == 0 && m.peak == 1024 && m.allocations == 0 &&
                        m.allocations_total == 3,
                    "all freed: allocated %llu allocations_total %llu",
                    (unsigned long long)m.allocated, (unsigned long long)m.allocations_total);
  return fail;
}

static int test_reserve(zt_backend *be) {
  int fail = 0;
  zt_backend_mem m0 = stats(be);
  fail |= KC_EXPECT(zt_backend_reserve(be, 1000) == 0, "reserve 1000");
  zt_backend_mem m = stats(be);
  const uint64_t size = slot(1000) + ROOM;
  fail |= KC_EXPECT(m.reserved == size, "reserved %llu, want %llu", (unsigned long long)m.reserved,
                    (unsigned long long)size);
  fail |= KC_EXPECT(zt_backend_reserve(be, 10) == -EBUSY, "a second block while one is open");
  /* slots of 256: 1000 takes 1024, then 17 slots of 1 byte fill the rest of it and the room */
  void *p[32];
  int n = 0;
  fail |= KC_EXPECT((p[n++] = be->ops->alloc(be->ctx, 1000)) != NULL, "1000 in the block");
  while (n < 1 + ZT_BACKEND_RESERVE_ALLOCS) {
    p[n] = be->ops->alloc(be->ctx, 1);
    fail |= KC_EXPECT(p[n] != NULL, "slot %d of the block", n);
    n++;
  }
  m = stats(be);
  fail |= KC_EXPECT(m.allocated == 1000 + ZT_BACKEND_RESERVE_ALLOCS &&
                        m.allocations == (uint64_t)n,
                    "block allocations: allocated %llu", (unsigned long long)m.allocated);
  /* the block is full: an allocation beyond it fails, and is not taken elsewhere */
  fail |= KC_EXPECT(be->ops->alloc(be->ctx, 1) == NULL, "an allocation beyond the block");
  zt_backend_mem full = stats(be);
  fail |= KC_EXPECT(full.allocations == m.allocations && full.allocated == m.allocated,
                    "the refused allocation was counted");
  zt_backend_reserve_end(be);
  /* after the end: ordinary allocations again; the block stays while it has allocations */
  void *q = be->ops->alloc(be->ctx, 5000);
  m = stats(be);
  fail |= KC_EXPECT(q && m.reserved == size &&
                        m.allocated == 1000 + ZT_BACKEND_RESERVE_ALLOCS + 5000,
                    "after reserve_end: reserved %llu allocated %llu",
                    (unsigned long long)m.reserved, (unsigned long long)m.allocated);
  for (int i = 0; i < n; i++) {
    fail |= KC_EXPECT(stats(be).reserved == size, "block given back with %d allocations left",
                      n - i);
    be->ops->free(be->ctx, p[i]);
  }
  m = stats(be);
  fail |= KC_EXPECT(m.reserved == 0 && m.allocated == 5000, "after the block's last free: "
                    "reserved %llu allocated %llu", (unsigned long long)m.reserved,
                    (unsigned long long)m.allocated);
  be->ops->free(be->ctx, q);
  /* an empty block goes at reserve_end; a size the block cannot take is refused */
  fail |= KC_EXPECT(zt_backend_reserve(be, 64) == 0 && stats(be).reserved == slot(64) + ROOM,
                    "reserve 64");
  zt_backend_reserve_end(be);
  fail |= KC_EXPECT(stats(be).reserved == 0, "an empty block stayed after reserve_end");
  fail |= KC_EXPECT(zt_backend_reserve(be, SIZE_MAX) == -ENOMEM, "reserve(SIZE_MAX)");
  zt_backend_reserve_end(be); /* none open: nothing happens */
  m = stats(be);
  fail |= KC_EXPECT(m.allocated == 0 && m.reserved == 0 && m.allocations == 0 &&
                        m.allocations_total == m0.allocations_total + (uint64_t)n + 1,
                    "at the end: allocated %llu allocations %llu",
                    (unsigned long long)m.allocated, (unsigned long long)m.allocations);
  fail |= KC_EXPECT(zt_backend_mem_stats(&(zt_backend){0}, &m) == -EINVAL,
                    "stats of a backend that is not open");
  return fail;
}

/* The trainer's buffers: one block of zt_trainer_estimate_bytes, each buffer within it, the
 * steps allocating nothing, all of it back at close. */
static int test_trainer(void) {
  int fail = 0;
  char err[256];
  zt_backend be;
  if (zt_backend_open(&be, "cpu", 0, 1, err, sizeof err) < 0) {
    fprintf(stderr, "FAIL: %s\n", err);
    return 1;
  }
  zt_model_cfg mc = {.arch = ZT_ARCH_GPT, .vocab = 11, .seq_len = 5, .d_model = 8, .n_heads = 2,
                     .n_layers = 2, .init_seed = 1};
  zt_train_cfg tc;
  zt_train_cfg_defaults(&tc);
  tc.steps = 3;
  tc.micro_batch = 2;
  size_t need = zt_trainer_estimate_bytes(&mc, &tc, be.ops);
  zt_trainer *t = NULL;
  if (zt_trainer_open(&t, &mc, &tc, &be, err, sizeof err) < 0) {
    fprintf(stderr, "FAIL trainer: %s\n", err);
    zt_backend_close(&be);
    return 1;
  }
  zt_backend_mem m = stats(&be);
  fail |= KC_EXPECT(m.reserved == slot(need) + ROOM, "trainer's block %llu for %zu bytes",
                    (unsigned long long)m.reserved, need);
  fail |= KC_EXPECT(m.allocated == need && need == zt_trainer_backend_bytes(t),
                    "trainer allocated %llu, estimate %zu", (unsigned long long)m.allocated, need);
  /* params, grads, m, v and the activations */
  fail |= KC_EXPECT(m.allocations == 5 && m.peak == need, "trainer: %llu allocations",
                    (unsigned long long)m.allocations);
  int32_t tok[2 * 6];
  for (int i = 0; i < 12; i++) tok[i] = (i * 7) % 11;
  for (int s = 0; s < 3; s++) {
    zt_step_result r;
    fail |= KC_EXPECT(zt_trainer_step(t, tok, &r, err, sizeof err) == 0, "step: %s", err);
  }
  zt_backend_mem after = stats(&be);
  fail |= KC_EXPECT(after.allocations_total == m.allocations_total &&
                        after.system_allocs == m.system_allocs && after.allocated == need,
                    "the steps allocated: %llu allocations",
                    (unsigned long long)(after.allocations_total - m.allocations_total));
  /* the block is closed: a later allocation is the backend's own */
  void *p = be.ops->alloc(be.ctx, 1 << 20);
  fail |= KC_EXPECT(p != NULL, "an allocation after the trainer's open");
  be.ops->free(be.ctx, p);
  zt_trainer_close(t);
  m = stats(&be);
  fail |= KC_EXPECT(m.allocated == 0 && m.reserved == 0 && m.allocations == 0 &&
                        m.peak == need + (1 << 20),
                    "after close: allocated %llu reserved %llu peak %llu",
                    (unsigned long long)m.allocated, (unsigned long long)m.reserved,
                    (unsigned long long)m.peak);
  zt_backend_close(&be);
  return fail;
}

int main(void) {
  char err[256];
  zt_backend be;
  if (zt_backend_open(&be, "cpu", 0, 1, err, sizeof err) < 0) {
    fprintf(stderr, "FAIL: %s\n", err);
    return 1;
  }
  int fail = test_counts(&be);
  fail |= test_reserve(&be);
  zt_backend_close(&be);
  fail |= test_trainer();
  if (!fail) printf("kernels_mem: ok\n");
  return fail;
}
