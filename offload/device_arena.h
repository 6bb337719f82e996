/* The device arena: the plan's device bytes taken as one block at job start and sub-allocated,
 * so nothing in the step loop asks the backend for memory and the device budget is enforced to
 * the byte. On the CPU backend the block is ordinary host memory standing in for the GPU's, so CI
 * exercises the same budget as a GPU run.
 *
 * Best fit over a free list kept in address order, neighbours merged on free; every allocation is
 * rounded up to ZT_DEV_ARENA_ALIGN bytes (the alignment vectorised kernels and cudaMemcpy like).
 * Bookkeeping lives outside the block (device memory is not addressable from the host).
 * Not thread-safe: one owner, the job's runner. */
#ifndef ZT_OFFLOAD_DEVICE_ARENA_H
#define ZT_OFFLOAD_DEVICE_ARENA_H

#include <stddef.h>
#include <stdint.h>

#define ZT_DEV_ARENA_ALIGN 256u

/* Where the block comes from: the CPU backend maps host pages; CUDA supplies cudaMalloc. */
typedef struct zt_dev_mem_ops {
  const char *name;
  int (*alloc)(void *ctx, size_t bytes, void **out); /* aligned to at least ZT_DEV_ARENA_ALIGN */
  void (*free)(void *ctx, void *p, size_t bytes);
  void *ctx;
} zt_dev_mem_ops;

/* anonymous mmap (pages are only backed once touched) */
extern const zt_dev_mem_ops zt_dev_mem_cpu;

typedef struct zt_dev_arena_stats {
  size_t budget;
  size_t used;          /* bytes of live allocations, after rounding */
  size_t peak;
  size_t largest_free;  /* the biggest allocation that would succeed now */
  uint64_t allocs;      /* live allocations */
  uint64_t free_blocks; /* holes in the block (fragmentation) */
} zt_dev_arena_stats;

typedef struct zt_dev_arena zt_dev_arena;

/* The bytes an allocation of `bytes` takes from the budget. */
size_t zt_dev_arena_footprint(size_t bytes);

/* Takes `budget` bytes (rounded up to ZT_DEV_ARENA_ALIGN) from ops (NULL: zt_dev_mem_cpu). */
int zt_dev_arena_open(zt_dev_arena **out, size_t budget, const zt_dev_mem_ops *ops, char *err,
                      size_t errlen);
/* Returns the block; allocations still live die with it. NULL is a no-op. */
void zt_dev_arena_close(zt_dev_arena *a);

/* 0, or -ENOMEM with the numbers (budget, in use, largest hole) in zt_dev_arena_error; -EINVAL
 * for bytes == 0. */
int zt_dev_arena_alloc(zt_dev_arena *a, size_t bytes, void **out);
/* -EINVAL when p is not the start of a live allocation. */
int zt_dev_arena_free(zt_dev_arena *a, void *p);

const char *zt_dev_arena_error(const zt_dev_arena *a);
void zt_dev_arena_get_stats(const zt_dev_arena *a, zt_dev_arena_stats *out);

#endif
