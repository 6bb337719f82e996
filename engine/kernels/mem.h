/* The memory accounting both backends share, behind zt_backend_mem_stats and
 * zt_backend_reserve (backend.h): every allocation is recorded with its size, the figures are
 * kept as allocations come and go, and a reserved block serves a job's allocations. A backend
 * hands in its raw allocator; this file decides where each allocation goes. Thread-safe. */
#ifndef ZT_KERNELS_MEM_H
#define ZT_KERNELS_MEM_H

#include <pthread.h>
#include <stddef.h>

#include "engine/kernels/backend.h"

/* Where allocations start inside a block, as cudaMalloc aligns its own. */
#define ZT__MEM_ALIGN 256

typedef struct zt__mem_raw {
  /* One allocation of the backend's memory; NULL when it fails (the backend logs why). */
  void *(*alloc)(void *ctx, size_t bytes);
  void (*free)(void *ctx, void *p);
  void *ctx;
  /* 1: a block is one raw allocation whose range its allocations share (cuda); 0: a block is a
   * budget and each allocation stays a raw allocation of its own (cpu: a sanitizer keeps seeing
   * every buffer's bounds). */
  int carve;
} zt__mem_raw;

typedef struct zt__mem_rec {
  void *p;
  size_t bytes;
  int block; /* index in blocks, -1 for a raw allocation */
} zt__mem_rec;

typedef struct zt__mem_block {
  void *base;   /* carve: the raw allocation; else NULL */
  size_t size;  /* 0: a free slot */
  size_t used;  /* bytes handed out from the start, each allocation at ZT__MEM_ALIGN */
  size_t live;  /* its allocations not yet freed */
} zt__mem_block;

typedef struct zt__mem {
  zt__mem_raw raw;
  pthread_mutex_t mu;
  zt__mem_rec *recs; /* the live allocations */
  size_t n_recs, cap_recs;
  zt__mem_block *blocks;
  int n_blocks;
  int open; /* the block that serves allocations now, -1 none */
  zt_backend_mem st;
} zt__mem;

/* 0 or -errno. The backend sets st.own_device / st.host_pinned itself. */
int zt__mem_init(zt__mem *m, const zt__mem_raw *raw);
/* Gives back the blocks still held and forgets the table; a raw allocation still live stays
 * allocated, as it would without the accounting (logged: a leak). */
void zt__mem_destroy(zt__mem *m);

/* The open block's next slot when there is one (NULL when it cannot hold `bytes`: logged with
 * the bytes asked and left), else a raw allocation. */
void *zt__mem_alloc(zt__mem *m, size_t bytes);
void zt__mem_free(zt__mem *m, void *p);
/* zt_backend_reserve / zt_backend_reserve_end (backend.h). */
int zt__mem_reserve(zt__mem *m, size_t bytes);
void zt__mem_reserve_end(zt__mem *m);
void zt__mem_stats(zt__mem *m, zt_backend_mem *out);

/* The accounting of a CPU backend's context (cpu/backend.c). */
zt__mem *zt__cpu_mem(void *ctx);

#endif
