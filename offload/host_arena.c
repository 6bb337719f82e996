/* Host arena: accounting over a page allocator. Live allocations are kept in an array searched
 * from its end on free: a job holds tens to hundreds of host buffers, allocated at start and freed
 * together at the end, so nothing faster is needed. */
#include "offload/host_arena.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "engine/base/log.h"

typedef struct host_block {
  void *p;
  size_t bytes;
  size_t footprint;
  int pinned;
} host_block;

struct zt_host_arena {
  zt_host_mem_ops ops;
  host_block *blocks;
  size_t n_blocks, cap_blocks;
  zt_host_arena_stats st;
  char err[256];
};

/* the pages of [p, p + n) faulted in by a write (a fresh page is zero: writing zero keeps it) */
typedef struct touch_range {
  volatile char *p;
  size_t n, page;
} touch_range;

static void *touch(void *arg) {
  touch_range *r = arg;
  for (size_t off = 0; off < r->n; off += r->page) r->p[off] = 0;
  return NULL;
}

void zt_host_mem_prepare(void *p, size_t bytes) {
#ifdef MADV_HUGEPAGE
  /* Transparent huge pages: 2 MiB a fault, 512 times fewer faults for a tier of tens of GB.
   * Advice only: where THP is off it changes nothing. */
  (void)madvise(p, bytes, MADV_HUGEPAGE);
#endif
  /* The kernel zeroes each page at its first touch; the pinning that follows touches them on
   * one thread (3-4 GB/s), so large mappings are faulted in here by one thread a core. */
  enum { THREADS_MAX = 16, SPLIT_MIN = 256u << 20, CHUNK_ALIGN = 2u << 20 };
  long cpus = sysconf(_SC_NPROCESSORS_ONLN), page = sysconf(_SC_PAGESIZE);
  int nt = cpus < 1 ? 1 : cpus > THREADS_MAX ? THREADS_MAX : (int)cpus;
  if (bytes < SPLIT_MIN || nt == 1) return;
  size_t chunk = (bytes / (size_t)nt + CHUNK_ALIGN - 1) / CHUNK_ALIGN * CHUNK_ALIGN;
  pthread_t th[THREADS_MAX];
  touch_range r[THREADS_MAX];
  int started[THREADS_MAX] = {0};
  for (int i = 0; i < nt; i++) {
    size_t lo = (size_t)i * chunk, hi = lo + chunk < bytes ? lo + chunk : bytes;
    r[i] = (touch_range){(volatile char *)p + lo, hi > lo ? hi - lo : 0, (size_t)page};
    if (r[i].n) started[i] = pthread_create(&th[i], NULL, touch, &r[i]) == 0;
    if (r[i].n && !started[i]) touch(&r[i]); /* no thread: this one does it */
  }
  for (int i = 0; i < nt; i++)
    if (started[i]) pthread_join(th[i], NULL);
}

static int cpu_alloc(void *ctx, size_t bytes, void **out, int *pin_err) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return -errno;
  zt_host_mem_prepare(p, bytes);
  /* The raw system call: sanitizer runtimes replace mlock() with a no-op that reports success,
   * which would hide exactly the failures the stats must show. */
  *pin_err = syscall(SYS_mlock, p, bytes) < 0 ? -errno : 0;
  *out = p;
  return 0;
}

static void cpu_free(void *ctx, void *p, size_t bytes, int pinned) {
  /* munmap unlocks the pages as it unmaps them */
  munmap(p, bytes);
}

const zt_host_mem_ops zt_host_mem_cpu = {.name = "cpu-mlock", .alloc = cpu_alloc, .free = cpu_free};

static size_t page_size(void) {
  long ps = sysconf(_SC_PAGESIZE);
  return ps > 0 ? (size_t)ps : 4096;
}

size_t zt_host_arena_footprint(size_t bytes) {
  size_t ps = page_size();
  if (bytes > SIZE_MAX - ps) return SIZE_MAX;
  return (bytes + ps - 1) / ps * ps;
}

static int fail(zt_host_arena *a, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(zt_host_arena *a, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(a->err, sizeof a->err, fmt, ap);
  va_end(ap);
  return rc;
}

int zt_host_arena_open(zt_host_arena **out, size_t limit, const zt_host_mem_ops *ops) {
  zt_host_arena *a = calloc(1, sizeof *a);
  *out = NULL;
  if (!a) return -ENOMEM;
  a->ops = ops ? *ops : zt_host_mem_cpu;
  a->st.limit = limit;
  *out = a;
  return 0;
}

int zt_host_arena_alloc(zt_host_arena *a, size_t bytes, void **out) {
  host_block b = {.bytes = bytes};
  int rc, pin_err = 0;
  *out = NULL;
  if (bytes == 0) return fail(a, -EINVAL, "host arena: zero-byte allocation");
  b.footprint = zt_host_arena_footprint(bytes);
  if (b.footprint > a->st.limit - a->st.used)
    return fail(a, -ENOMEM, "host arena: %zu bytes (%zu in pages) requested, %zu of %zu in use, "
                "%zu left", bytes, b.footprint, a->st.used, a->st.limit, a->st.limit - a->st.used);
  if (a->n_blocks == a->cap_blocks) {
    size_t cap = a->cap_blocks ? 2 * a->cap_blocks : 32;
    host_block *grown = realloc(a->blocks, cap * sizeof *grown);
    if (!grown) return fail(a, -ENOMEM, "host arena: out of memory for its block table");
    a->blocks = grown;
    a->cap_blocks = cap;
  }
  rc = a->ops.alloc(a->ops.ctx, b.footprint, &b.p, &pin_err);
  if (rc < 0)
    return fail(a, rc, "host arena (%s): allocating %zu bytes failed: %s (%zu of %zu in use)",
                a->ops.name, b.footprint, strerror(-rc), a->st.used, a->st.limit);
  b.pinned = pin_err == 0;
  if (!b.pinned) {
    struct rlimit rl = {0};
    getrlimit(RLIMIT_MEMLOCK, &rl);
    /* The first failure is a warning: the job runs, slower. Later ones only count. */
    zt_log(a->st.pin_failures ? ZT_LOG_DEBUG : ZT_LOG_WARN, "host-arena",
           "cannot pin %zu bytes (%s; RLIMIT_MEMLOCK %llu, %zu bytes pinned so far): using "
           "unpinned memory", b.footprint, strerror(-pin_err),
           (unsigned long long)rl.rlim_cur, a->st.pinned_bytes);
    a->st.pin_failures++;
    a->st.unpinned_bytes += b.footprint;
  } else {
    a->st.pinned_bytes += b.footprint;
  }
  a->blocks[a->n_blocks++] = b;
  a->st.used += b.footprint;
  a->st.requested += bytes;
  a->st.allocs++;
  if (a->st.used > a->st.peak) a->st.peak = a->st.used;
  *out = b.p;
  return 0;
}

int zt_host_arena_free(zt_host_arena *a, void *p) {
  size_t i = a->n_blocks;
  while (i > 0 && a->blocks[i - 1].p != p) i--;
  if (i == 0) return fail(a, -EINVAL, "host arena: %p was not allocated here", p);
  host_block b = a->blocks[i - 1];
  a->blocks[i - 1] = a->blocks[--a->n_blocks];
  a->ops.free(a->ops.ctx, b.p, b.footprint, b.pinned);
  a->st.used -= b.footprint;
  a->st.requested -= b.bytes;
  a->st.allocs--;
  if (b.pinned)
    a->st.pinned_bytes -= b.footprint;
  else
    a->st.unpinned_bytes -= b.footprint;
  return 0;
}

const char *zt_host_arena_error(const zt_host_arena *a) { return a->err; }

void zt_host_arena_get_stats(const zt_host_arena *a, zt_host_arena_stats *out) { *out = a->st; }

void zt_host_arena_close(zt_host_arena *a) {
  if (!a) return;
  while (a->n_blocks) zt_host_arena_free(a, a->blocks[a->n_blocks - 1].p);
  free(a->blocks);
  free(a);
}
