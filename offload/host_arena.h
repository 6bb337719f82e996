/* The pinned host tier: every host buffer of the offload path (master params, Adam moments,
 * staging buffers) is allocated here at its exact size, page-locked so that copies to the GPU
 * and O_DIRECT I/O run at full speed, and accounted against the job's host budget.
 *
 * Memory comes in whole pages (locked memory has page granularity), so an allocation of `bytes`
 * is accounted as zt_host_arena_footprint(bytes): the planner sums the same figure, so its peak
 * is exact. Where pages cannot be locked (mlock refused under RLIMIT_MEMLOCK) the allocation still
 * succeeds unpinned: the arena logs it and the stats count pinned and unpinned bytes apart.
 *
 * Not thread-safe: one owner (the job's runner) allocates at job start and frees at its end. */
#ifndef ZT_OFFLOAD_HOST_ARENA_H
#define ZT_OFFLOAD_HOST_ARENA_H

#include <stddef.h>
#include <stdint.h>

/* Where host memory comes from: the seam between accounting and the backend. The CPU backend
 * maps anonymous pages and mlocks them; the CUDA backend supplies cudaHostAlloc here. */
typedef struct zt_host_mem_ops {
  const char *name;
  /* Allocates `bytes` (a whole number of pages), page-aligned and zeroed (fresh anonymous
   * pages; zt_host_arena_alloc promises zeros on this). *pin_err is 0 when the pages are
   * locked, else the -errno of the failed lock (the memory is still usable). Returns 0/-errno. */
  int (*alloc)(void *ctx, size_t bytes, void **out, int *pin_err);
  void (*free)(void *ctx, void *p, size_t bytes, int pinned);
  void *ctx;
} zt_host_mem_ops;

/* What every alloc does to its fresh mapping before pinning it: transparent huge pages advised
 * where the kernel has them, and a large mapping's pages faulted in by a thread a core (the
 * kernel zeroes each page at its first touch, which the pinning would do on one thread); the
 * contents stay zero. */
void zt_host_mem_prepare(void *p, size_t bytes);

/* mmap + mlock */
extern const zt_host_mem_ops zt_host_mem_cpu;
/* mmap + cudaHostRegister (offload/copy_cuda.c); NULL in a build without CUDA */
const zt_host_mem_ops *zt_host_mem_cuda(void);

typedef struct zt_host_arena_stats {
  size_t limit;          /* the budget */
  size_t used;           /* footprint of live allocations, counted against the limit */
  size_t requested;      /* bytes asked for by live allocations */
  size_t peak;           /* highest `used` so far */
  size_t pinned_bytes;   /* of `used`, locked */
  size_t unpinned_bytes; /* of `used`, not locked because locking failed */
  uint64_t allocs;       /* live allocations */
  uint64_t pin_failures; /* allocations that could not be locked, ever */
} zt_host_arena_stats;

typedef struct zt_host_arena zt_host_arena;

/* The bytes an allocation of `bytes` takes from the limit: rounded up to whole pages. */
size_t zt_host_arena_footprint(size_t bytes);

/* ops NULL: zt_host_mem_cpu. */
int zt_host_arena_open(zt_host_arena **out, size_t limit, const zt_host_mem_ops *ops);
/* Frees every allocation still live. NULL is a no-op. */
void zt_host_arena_close(zt_host_arena *a);

/* A fresh allocation is zeroed: its pages come straight from mmap (anonymous memory is zero),
 * so a caller that needs zeros needs no pass of its own. 0, or -ENOMEM (limit exceeded or the system is out of memory) with a message giving the
 * numbers, -EINVAL for bytes == 0. */
int zt_host_arena_alloc(zt_host_arena *a, size_t bytes, void **out);
/* -EINVAL when p was not allocated here (or was freed already). */
int zt_host_arena_free(zt_host_arena *a, void *p);

const char *zt_host_arena_error(const zt_host_arena *a);
void zt_host_arena_get_stats(const zt_host_arena *a, zt_host_arena_stats *out);

#endif
