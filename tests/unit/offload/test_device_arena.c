/* Device arena: 256-byte alignment, accounting and peak, -ENOMEM with the numbers, best-fit
 * reuse of holes, neighbour merging, bad frees, and a random alloc/free run checked against a
 * shadow model (no overlaps: every live block keeps its fill pattern). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "offload/device_arena.h"
#include "tests/unit/offload/otest.h"

static void test_basics(void) {
  zt_dev_arena *a;
  zt_dev_arena_stats st;
  char err[256];
  void *x, *y, *z, *w;
  size_t budget = 1 << 20;
  OT_CHECK(zt_dev_arena_open(&a, budget, NULL, err, sizeof err) == 0, "open: %s", err);
  OT_CHECK(zt_dev_arena_alloc(a, 1, &x) == 0 && (uintptr_t)x % ZT_DEV_ARENA_ALIGN == 0, "alloc 1");
  OT_CHECK(zt_dev_arena_alloc(a, 300, &y) == 0 && (uintptr_t)y % ZT_DEV_ARENA_ALIGN == 0, "alloc 300");
  OT_CHECK((char *)y - (char *)x == 256, "blocks not packed: %td", (char *)y - (char *)x);
  zt_dev_arena_get_stats(a, &st);
  OT_CHECK(st.used == 256 + 512 && st.allocs == 2 && st.budget == budget, "used %zu", st.used);
  OT_CHECK(zt_dev_arena_alloc(a, budget - 768, &z) == 0, "fill: %s", zt_dev_arena_error(a));
  int rc = zt_dev_arena_alloc(a, 1, &w);
  OT_CHECK(rc == -ENOMEM && !w, "alloc past the budget: %d", rc);
  char want[64];
  snprintf(want, sizeof want, "of %zu budget", budget);
  OT_CHECK(strstr(zt_dev_arena_error(a), want), "message lacks the numbers: %s", zt_dev_arena_error(a));
  printf("budget: %s\n", zt_dev_arena_error(a));
  OT_CHECK(zt_dev_arena_free(a, (char *)z + 256) == -EINVAL, "interior free accepted");
  OT_CHECK(zt_dev_arena_free(a, err) == -EINVAL, "foreign free accepted");
  OT_CHECK(zt_dev_arena_free(a, y) == 0, "free y");
  OT_CHECK(zt_dev_arena_free(a, y) == -EINVAL, "double free accepted");
  OT_CHECK(zt_dev_arena_alloc(a, 0, &w) == -EINVAL, "zero bytes accepted");
  zt_dev_arena_get_stats(a, &st);
  OT_CHECK(st.peak == budget && st.used == budget - 512 && st.largest_free == 512 && st.free_blocks == 1,
           "peak %zu used %zu largest %zu holes %llu", st.peak, st.used, st.largest_free,
           (unsigned long long)st.free_blocks);
  zt_dev_arena_close(a);
}

/* Fragmentation: a hole is reused by the best-fitting request, and freed neighbours merge. */
static void test_holes(void) {
  zt_dev_arena *a;
  zt_dev_arena_stats st;
  void *b[6], *x, *y;
  size_t k = 64 << 10;
  OT_CHECK(zt_dev_arena_open(&a, 6 * k, NULL, NULL, 0) == 0, "open");
  for (int i = 0; i < 6; i++) OT_CHECK(zt_dev_arena_alloc(a, k, &b[i]) == 0, "alloc %d", i);
  zt_dev_arena_free(a, b[1]);                          /* hole of k */
  zt_dev_arena_free(a, b[3]), zt_dev_arena_free(a, b[4]); /* hole of 2k, merged */
  zt_dev_arena_get_stats(a, &st);
  OT_CHECK(st.free_blocks == 2 && st.largest_free == 2 * k, "holes %llu largest %zu",
           (unsigned long long)st.free_blocks, st.largest_free);
  /* 3k fits nowhere though 3k are free: refused, and the message says why */
  OT_CHECK(zt_dev_arena_alloc(a, 3 * k, &x) == -ENOMEM, "3k allocated in 2k holes");
  OT_CHECK(strstr(zt_dev_arena_error(a), "largest free block"), "%s", zt_dev_arena_error(a));
  /* best fit: k - 1000 goes into the k hole, not the 2k one */
  OT_CHECK(zt_dev_arena_alloc(a, k - 1000, &x) == 0 && x == b[1], "best fit missed the k hole");
  OT_CHECK(zt_dev_arena_alloc(a, 2 * k, &y) == 0 && y == b[3], "2k hole not reused");
  zt_dev_arena_free(a, x);
  zt_dev_arena_free(a, y);
  for (int i = 0; i < 6; i++)
    if (i != 1 && i != 3 && i != 4) zt_dev_arena_free(a, b[i]);
  zt_dev_arena_get_stats(a, &st);
  OT_CHECK(st.used == 0 && st.allocs == 0 && st.free_blocks == 1 && st.largest_free == 6 * k,
           "not merged back: used %zu holes %llu largest %zu", st.used,
           (unsigned long long)st.free_blocks, st.largest_free);
  zt_dev_arena_close(a);
}

static void test_random(void) {
  enum { SLOTS = 64, ROUNDS = 20000 };
  zt_dev_arena *a;
  zt_dev_arena_stats st;
  void *p[SLOTS] = {0};
  size_t sz[SLOTS] = {0}, used = 0, peak = 0;
  uint64_t rng = 12345;
  size_t budget = 4 << 20;
  OT_CHECK(zt_dev_arena_open(&a, budget, NULL, NULL, 0) == 0, "open");
  for (int r = 0; r < ROUNDS && !ot_failures; r++) {
    int i = (int)(ot_next(&rng) % SLOTS);
    if (p[i]) {
      unsigned char *c = p[i];
      OT_CHECK(c[0] == (unsigned char)i && c[sz[i] - 1] == (unsigned char)i, "slot %d overwritten", i);
      OT_CHECK(zt_dev_arena_free(a, p[i]) == 0, "free %d", i);
      used -= zt_dev_arena_footprint(sz[i]);
      p[i] = NULL;
    } else {
      size_t n = 1 + (size_t)(ot_next(&rng) % (256 << 10));
      int rc = zt_dev_arena_alloc(a, n, &p[i]);
      if (rc == -ENOMEM) continue;
      OT_CHECK(rc == 0 && (uintptr_t)p[i] % ZT_DEV_ARENA_ALIGN == 0, "alloc %zu: %d", n, rc);
      sz[i] = n;
      memset(p[i], i, n);
      used += zt_dev_arena_footprint(n);
      if (used > peak) peak = used;
    }
    zt_dev_arena_get_stats(a, &st);
    OT_CHECK(st.used == used && st.peak == peak, "round %d: used %zu/%zu peak %zu/%zu", r, st.used,
             used, st.peak, peak);
  }
  for (int i = 0; i < SLOTS; i++)
    if (p[i]) zt_dev_arena_free(a, p[i]);
  zt_dev_arena_get_stats(a, &st);
  OT_CHECK(st.free_blocks == 1 && st.largest_free == budget, "fragments left: %llu",
           (unsigned long long)st.free_blocks);
  zt_dev_arena_close(a);
}

int main(void) {
  test_basics();
  test_holes();
  test_random();
  if (ot_failures) fprintf(stderr, "%d failures\n", ot_failures);
  return ot_failures ? 1 : 0;
}
