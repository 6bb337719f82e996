/* The wait accounting of the offload tiers (the timeline's "waited on"): the AdamW pool's and
 * the CPU copy engine's callers' time blocked counts the blocking, and a wait for work already
 * done adds nothing. The work is made slow on purpose (a sleeping chunk, a 1 MB/s link). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "offload/copy_engine.h"
#include "offload/cpu_pool.h"
#include "otest.h"

#define SLOW_MS 40
#define MS 1000000ull

static void sleep_ms(int ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
  }
}

static void slow_chunk(void *arg, size_t begin, size_t end) {
  (void)arg, (void)begin, (void)end;
  sleep_ms(SLOW_MS);
}

static void test_pool(void) {
  zt_cpu_pool *pool = NULL;
  zt_cpu_pool_stats st;
  OT_CHECK(zt_cpu_pool_open(&pool, 2, 0) == 0, "pool open");
  if (!pool) return;
  zt_cpu_job job = {.fn = slow_chunk, .n = 1};
  OT_CHECK(zt_cpu_pool_submit(pool, &job) == 0, "submit");
  zt_cpu_pool_wait(pool, &job);
  zt_cpu_pool_get_stats(pool, &st);
  /* the wait began before the chunk's sleep ended: most of it was blocked */
  OT_CHECK(st.wait_ns >= SLOW_MS / 2 * MS, "waited %llu ns for a %d ms chunk",
           (unsigned long long)st.wait_ns, SLOW_MS);
  uint64_t before = st.wait_ns;
  zt_cpu_pool_wait(pool, &job); /* finished already */
  zt_cpu_pool_get_stats(pool, &st);
  OT_CHECK(st.wait_ns == before, "a wait for a finished job counted %llu ns",
           (unsigned long long)(st.wait_ns - before));
  zt_cpu_pool_close(pool);
}

static void test_copy(void) {
  zt_copy_engine *e = NULL;
  /* 1 MB/s: 40 KB take 40 ms */
  OT_CHECK(zt_copy_cpu_open(&e, 1e6) == 0, "copy engine open");
  if (!e) return;
  size_t bytes = SLOW_MS * 1000;
  char *src = calloc(1, bytes), *dst = calloc(1, bytes);
  zt_copy_busy b = {0};
  e->ops->busy(e, &b);
  OT_CHECK(b.wait_ns == 0, "waited %llu ns before any wait", (unsigned long long)b.wait_ns);
  int64_t t = e->ops->h2d(e, dst, src, bytes, ZT_COPY_AFTER_ALL);
  OT_CHECK(t > 0, "h2d: %lld", (long long)t);
  OT_CHECK(e->ops->wait(e, ZT_COPY_H2D, t) == 0, "wait");
  e->ops->busy(e, &b);
  OT_CHECK(b.wait_ns >= SLOW_MS / 2 * MS, "waited %llu ns for a %d ms copy",
           (unsigned long long)b.wait_ns, SLOW_MS);
  uint64_t before = b.wait_ns;
  OT_CHECK(e->ops->wait(e, ZT_COPY_H2D, t) == 0, "wait again");
  e->ops->busy(e, &b);
  OT_CHECK(b.wait_ns == before, "a wait for a finished copy counted %llu ns",
           (unsigned long long)(b.wait_ns - before));
  e->ops->close(e);
  free(src);
  free(dst);
}

int main(void) {
  test_pool();
  test_copy();
  if (ot_failures) {
    fprintf(stderr, "%d failure(s)\n", ot_failures);
    return 1;
  }
  printf("waits: ok\n");
  return 0;
}
