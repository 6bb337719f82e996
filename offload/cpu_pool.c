/* Worker pool: one mutex, a FIFO of jobs, two condition variables (work queued, job done). A
 * chunk is big enough (tens of thousands of elements) that taking the mutex per chunk costs
 * nothing measurable. */
#include "offload/cpu_pool.h"

#include "engine/base/check.h"
#include "engine/base/clock.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

struct zt_cpu_pool {
  pthread_mutex_t mu;
  pthread_cond_t work;
  pthread_cond_t done;
  zt_cpu_job *head, *tail;
  int stop;
  pthread_t *threads;
  int n_started;
  zt_cpu_pool_stats st;
};

static void *worker(void *arg) {
  zt_cpu_pool *p = arg;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    zt_cpu_job *job = p->head;
    if (!job) {
      if (p->stop) break;
      pthread_cond_wait(&p->work, &p->mu);
      continue;
    }
    size_t c = job->next_chunk++;
    if (job->next_chunk == job->chunks) { /* the last chunk is taken: the job leaves the queue */
      p->head = job->next;
      if (!p->head) p->tail = NULL;
    }
    pthread_mutex_unlock(&p->mu);
    size_t begin = c * job->chunk;
    size_t end = job->n - begin > job->chunk ? begin + job->chunk : job->n;
    uint64_t t0 = zt_now_ns();
    job->fn(job->arg, begin, end);
    uint64_t dt = zt_now_ns() - t0;
    pthread_mutex_lock(&p->mu);
    p->st.busy_ns += dt;
    p->st.chunks++;
    if (++job->chunks_done == job->chunks) {
      job->finished = 1;
      p->st.jobs++;
      pthread_cond_broadcast(&p->done);
    }
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

/* The i-th CPU in the process's affinity mask, or -1. */
static int nth_allowed_cpu(int i) {
  cpu_set_t set;
  int n = 0;
  if (sched_getaffinity(0, sizeof set, &set) < 0) return -1;
  int count = CPU_COUNT(&set);
  if (count == 0) return -1;
  i %= count;
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
    if (CPU_ISSET(cpu, &set) && n++ == i) return cpu;
  return -1;
}

int zt_cpu_pool_open(zt_cpu_pool **out, int n_threads, int pin) {
  zt_cpu_pool *p;
  int rc = 0;
  *out = NULL;
  if (n_threads < 1 || n_threads > 1024) return -EINVAL;
  p = calloc(1, sizeof *p);
  if (!p) return -ENOMEM;
  p->threads = calloc((size_t)n_threads, sizeof *p->threads);
  if (!p->threads) {
    free(p);
    return -ENOMEM;
  }
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->work, NULL);
  pthread_cond_init(&p->done, NULL);
  for (int i = 0; i < n_threads; i++) {
    ZT_CHECK("offload", -pthread_create(&p->threads[i], NULL, worker, p));
    p->n_started++;
    if (pin) {
      int cpu = nth_allowed_cpu(i);
      cpu_set_t set;
      CPU_ZERO(&set);
      if (cpu >= 0) CPU_SET(cpu, &set);
      if (cpu >= 0 && pthread_setaffinity_np(p->threads[i], sizeof set, &set) == 0)
        p->st.pinned_threads++;
    }
  }
  p->st.threads = n_threads;
  *out = p;
  p = NULL;
out:
  zt_cpu_pool_close(p);
  return rc;
}

void zt_cpu_pool_close(zt_cpu_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->stop = 1;
  pthread_cond_broadcast(&p->work);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->n_started; i++) pthread_join(p->threads[i], NULL);
  pthread_cond_destroy(&p->done);
  pthread_cond_destroy(&p->work);
  pthread_mutex_destroy(&p->mu);
  free(p->threads);
  free(p);
}

int zt_cpu_pool_submit(zt_cpu_pool *p, zt_cpu_job *job) {
  if (!job->fn) return -EINVAL;
  job->chunk = job->chunk ? job->chunk : job->n;
  job->chunks = job->n ? (job->n - 1) / job->chunk + 1 : 0;
  job->next_chunk = 0;
  job->chunks_done = 0;
  job->finished = job->n == 0;
  job->next = NULL;
  if (job->finished) return 0;
  pthread_mutex_lock(&p->mu);
  if (p->tail)
    p->tail->next = job;
  else
    p->head = job;
  p->tail = job;
  pthread_cond_broadcast(&p->work);
  pthread_mutex_unlock(&p->mu);
  return 0;
}

void zt_cpu_pool_wait(zt_cpu_pool *p, zt_cpu_job *job) {
  pthread_mutex_lock(&p->mu);
  if (!job->finished) {
    uint64_t t0 = zt_now_ns();
    while (!job->finished) pthread_cond_wait(&p->done, &p->mu);
    p->st.wait_ns += zt_now_ns() - t0;
  }
  pthread_mutex_unlock(&p->mu);
}

void zt_cpu_pool_get_stats(zt_cpu_pool *p, zt_cpu_pool_stats *out) {
  pthread_mutex_lock(&p->mu);
  *out = p->st;
  pthread_mutex_unlock(&p->mu);
}
