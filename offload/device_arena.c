/* Device arena: the block is described by an array of spans in address order that tile it
 * exactly (each free or used). Allocation splits the best-fitting free span; free merges a span
 * with free neighbours, so two adjacent holes never exist. A job has at most a few thousand
 * spans, so linear best-fit search and memmove insertion are cheap next to a step. */
#include "offload/device_arena.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef struct span {
  size_t off;
  size_t size;
  int used;
} span;

struct zt_dev_arena {
  zt_dev_mem_ops ops;
  char *base;
  span *spans;
  size_t n_spans, cap_spans;
  zt_dev_arena_stats st;
  char err[256];
};

static int cpu_alloc(void *ctx, size_t bytes, void **out) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return -errno;
  *out = p;
  return 0;
}

static void cpu_free(void *ctx, void *p, size_t bytes) { munmap(p, bytes); }

const zt_dev_mem_ops zt_dev_mem_cpu = {.name = "cpu", .alloc = cpu_alloc, .free = cpu_free};

static int fail(zt_dev_arena *a, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(zt_dev_arena *a, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(a->err, sizeof a->err, fmt, ap);
  va_end(ap);
  return rc;
}

size_t zt_dev_arena_footprint(size_t bytes) {
  if (bytes > SIZE_MAX - ZT_DEV_ARENA_ALIGN) return SIZE_MAX;
  return (bytes + ZT_DEV_ARENA_ALIGN - 1) / ZT_DEV_ARENA_ALIGN * ZT_DEV_ARENA_ALIGN;
}

int zt_dev_arena_open(zt_dev_arena **out, size_t budget, const zt_dev_mem_ops *ops, char *err,
                      size_t errlen) {
  zt_dev_arena *a = calloc(1, sizeof *a);
  void *base = NULL;
  int rc = 0;
  *out = NULL;
  if (err && errlen) err[0] = 0;
  if (!a) return -ENOMEM;
  a->ops = ops ? *ops : zt_dev_mem_cpu;
  budget = zt_dev_arena_footprint(budget);
  if (budget == 0 || budget == SIZE_MAX) {
    rc = fail(a, -EINVAL, "device arena: budget %zu out of range", budget);
    goto out;
  }
  a->cap_spans = 64;
  a->spans = malloc(a->cap_spans * sizeof *a->spans);
  if (!a->spans) {
    rc = fail(a, -ENOMEM, "device arena: out of memory for its span table");
    goto out;
  }
  rc = a->ops.alloc(a->ops.ctx, budget, &base);
  if (rc < 0) {
    fail(a, rc, "device arena (%s): cannot take the %zu-byte budget: %s", a->ops.name, budget,
         strerror(-rc));
    goto out;
  }
  a->base = base;
  a->spans[0] = (span){.off = 0, .size = budget, .used = 0};
  a->n_spans = 1;
  a->st.budget = budget;
  a->st.largest_free = budget;
  a->st.free_blocks = 1;
  *out = a;
  a = NULL;
out:
  if (a) {
    if (err && errlen) snprintf(err, errlen, "%s", a->err);
    free(a->spans);
    free(a);
  }
  return rc;
}

void zt_dev_arena_close(zt_dev_arena *a) {
  if (!a) return;
  a->ops.free(a->ops.ctx, a->base, a->st.budget);
  free(a->spans);
  free(a);
}

/* Recounts the holes after a change; O(spans), like the allocation itself. */
static void recount_free(zt_dev_arena *a) {
  a->st.largest_free = 0;
  a->st.free_blocks = 0;
  for (size_t i = 0; i < a->n_spans; i++) {
    if (a->spans[i].used) continue;
    a->st.free_blocks++;
    if (a->spans[i].size > a->st.largest_free) a->st.largest_free = a->spans[i].size;
  }
}

int zt_dev_arena_alloc(zt_dev_arena *a, size_t bytes, void **out) {
  size_t need, best = SIZE_MAX;
  *out = NULL;
  if (bytes == 0) return fail(a, -EINVAL, "device arena: zero-byte allocation");
  need = zt_dev_arena_footprint(bytes);
  for (size_t i = 0; i < a->n_spans; i++)
    if (!a->spans[i].used && a->spans[i].size >= need &&
        (best == SIZE_MAX || a->spans[i].size < a->spans[best].size))
      best = i;
  if (best == SIZE_MAX)
    return fail(a, -ENOMEM, "device arena: %zu bytes requested (%zu aligned), %zu of %zu budget "
                "in use, %zu free, largest free block %zu", bytes, need, a->st.used, a->st.budget,
                a->st.budget - a->st.used, a->st.largest_free);
  if (a->spans[best].size > need) {
    if (a->n_spans == a->cap_spans) {
      span *grown = realloc(a->spans, 2 * a->cap_spans * sizeof *grown);
      if (!grown) return fail(a, -ENOMEM, "device arena: out of memory for its span table");
      a->spans = grown;
      a->cap_spans *= 2;
    }
    memmove(&a->spans[best + 2], &a->spans[best + 1], (a->n_spans - best - 1) * sizeof(span));
    a->spans[best + 1] = (span){.off = a->spans[best].off + need,
                                .size = a->spans[best].size - need, .used = 0};
    a->spans[best].size = need;
    a->n_spans++;
  }
  a->spans[best].used = 1;
  a->st.used += need;
  a->st.allocs++;
  if (a->st.used > a->st.peak) a->st.peak = a->st.used;
  recount_free(a);
  *out = a->base + a->spans[best].off;
  return 0;
}

static void remove_span(zt_dev_arena *a, size_t i) {
  memmove(&a->spans[i], &a->spans[i + 1], (a->n_spans - i - 1) * sizeof(span));
  a->n_spans--;
}

int zt_dev_arena_free(zt_dev_arena *a, void *p) {
  size_t lo = 0, hi = a->n_spans, off;
  if ((char *)p < a->base || (char *)p >= a->base + a->st.budget)
    return fail(a, -EINVAL, "device arena: %p is outside the arena", p);
  off = (size_t)((char *)p - a->base);
  while (lo < hi) { /* the span starting at off */
    size_t mid = lo + (hi - lo) / 2;
    if (a->spans[mid].off < off)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == a->n_spans || a->spans[lo].off != off || !a->spans[lo].used)
    return fail(a, -EINVAL, "device arena: %p is not a live allocation", p);
  a->spans[lo].used = 0;
  a->st.used -= a->spans[lo].size;
  a->st.allocs--;
  if (lo + 1 < a->n_spans && !a->spans[lo + 1].used) {
    a->spans[lo].size += a->spans[lo + 1].size;
    remove_span(a, lo + 1);
  }
  if (lo > 0 && !a->spans[lo - 1].used) {
    a->spans[lo - 1].size += a->spans[lo].size;
    remove_span(a, lo);
  }
  recount_free(a);
  return 0;
}

const char *zt_dev_arena_error(const zt_dev_arena *a) { return a->err; }

void zt_dev_arena_get_stats(const zt_dev_arena *a, zt_dev_arena_stats *out) { *out = a->st; }
