/* The optimizer worker pool: a few threads, each pinned to its own core where the affinity mask
 * allows, that run jobs split into chunks. The runner thread submits a unit's optimizer step and
 * goes back to the GPU; it waits for the job only when it needs the result.
 *
 * Jobs run in submission order; the threads of the pool share each job's chunks. The pool is
 * thread-safe for submit and wait. */
#ifndef ZT_OFFLOAD_CPU_POOL_H
#define ZT_OFFLOAD_CPU_POOL_H

#include <stddef.h>
#include <stdint.h>

/* Processes elements [begin, end) of a job. */
typedef void (*zt_cpu_pool_fn)(void *arg, size_t begin, size_t end);

/* A job, owned by the caller until zt_cpu_pool_wait returns. Set the public fields; the rest is
 * the pool's. */
typedef struct zt_cpu_job {
  zt_cpu_pool_fn fn;
  void *arg;
  size_t n;     /* elements */
  size_t chunk; /* elements per chunk (0: the whole job as one chunk) */
  /* private */
  size_t next_chunk, chunks, chunks_done;
  int finished;
  struct zt_cpu_job *next;
} zt_cpu_job;

typedef struct zt_cpu_pool_stats {
  int threads;
  int pinned_threads; /* threads that got their own core; the rest run where the OS puts them */
  uint64_t jobs;      /* jobs finished */
  uint64_t chunks;    /* chunks finished */
  uint64_t busy_ns;   /* thread time spent in chunks, summed over threads */
  uint64_t wait_ns;   /* callers' time blocked in zt_cpu_pool_wait, summed over callers */
} zt_cpu_pool_stats;

typedef struct zt_cpu_pool zt_cpu_pool;

/* n_threads >= 1. pin: try to pin thread i to the i-th CPU the process may run on (falls back
 * to unpinned, counted in the stats). */
int zt_cpu_pool_open(zt_cpu_pool **out, int n_threads, int pin);
/* Finishes every submitted job, then joins the threads. NULL is a no-op. */
void zt_cpu_pool_close(zt_cpu_pool *p);

/* Queues a job; -EINVAL without fn. A job with n == 0 is finished at once. */
int zt_cpu_pool_submit(zt_cpu_pool *p, zt_cpu_job *job);
/* Blocks until the job has run. */
void zt_cpu_pool_wait(zt_cpu_pool *p, zt_cpu_job *job);

void zt_cpu_pool_get_stats(zt_cpu_pool *p, zt_cpu_pool_stats *out);

#endif
