/* The streamer: per unit a small state machine for its parameter copy (home -> NVMe read into a
 * staging buffer -> H2D copy in flight -> resident) and at most one gradient buffer held plus
 * one being written back. Everything that decides (what to fetch, what to evict) looks only at
 * the calls made so far; the copy engine's progress is observed only by waiting, so runs with
 * the same calls make the same transfers. */
#include "offload/streamer.h"
#include "engine/base/clock.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum pstate { P_HOME, P_READING, P_COPYING, P_RESIDENT } pstate;

typedef struct unit_state {
  zt_stream_unit u;
  pstate st;
  void *dev;         /* the parameter copy, from P_READING on */
  int64_t ticket;    /* H2D ticket of the copy (P_COPYING) */
  int64_t fence;     /* the compute its copy followed: its buffer's last user (copy_engine.h) */
  int64_t used;      /* the compute ticket of its last release since the copy; 0: none */
  int req;           /* NVMe request (P_READING) */
  int slot;          /* staging buffer in use, -1 none */
  int holds;
  int pending;       /* prefetched and not acquired since: a prefetch must not evict it */
  uint64_t last_use;
  float *grad;       /* gradient buffer held */
  int64_t zero_ticket; /* its zeroing or resumed sum's copy; 0: none queued */
  int64_t gfence;    /* the compute that zeroing or copy followed */
  float *wb;         /* gradient buffer being accumulated into the host */
  int64_t wb_ticket;
} unit_state;

/* Device bytes whose last user is the compute queued before `after` (a compute ticket). */
typedef struct fence {
  char *p;
  size_t bytes;
  int64_t after;
} fence;
#define FENCES_MAX 256

struct zt_streamer {
  zt_streamer_cfg cfg;
  unit_state *u;
  int n;
  void **staging;
  int *slot_owner; /* unit using each staging buffer, -1 free */
  int n_staging;
  int cur, dir;    /* the unit acquired last and the direction of the walk (+1, -1, 0 unknown) */
  size_t param_used; /* arena footprints of the parameter copies */
  int streaming;     /* the arena cannot hold every unit's copy: a copy behind the walk is
                        evicted before the walk comes round to it again */
  fence *fences;     /* freed device buffers that queued compute may still use */
  int n_fences;
  int64_t floor;     /* every fence forgotten (FENCES_MAX) is at most this compute ticket */
  uint64_t tick;
  zt_streamer_stats st;
  char err[256];
};

static int fail(zt_streamer *s, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(zt_streamer *s, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->err, sizeof s->err, fmt, ap);
  va_end(ap);
  return rc;
}

static int cmp_size_desc(const void *a, const void *b) {
  size_t x = *(const size_t *)a, y = *(const size_t *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* Sum of the k largest of v[0..n) (v is sorted in place). */
static size_t largest_sum(size_t *v, int n, int k) {
  qsort(v, (size_t)n, sizeof *v, cmp_size_desc);
  size_t sum = 0;
  for (int i = 0; i < n && i < k; i++) sum += v[i];
  return sum;
}

/* The arena footprint of a device allocation of `bytes`: a whole slot in slot mode. */
static size_t dev_footprint(const zt_streamer_cfg *cfg, size_t bytes) {
  return zt_dev_arena_footprint(cfg->slot_bytes ? cfg->slot_bytes : bytes);
}

/* ---- fences: an H2D into a reused buffer waits for its last user only ------------------------ */

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* [p, p + bytes) is free; the compute queued before `after` may still use it. */
static void fence_add(zt_streamer *s, void *p, size_t bytes, int64_t after) {
  if (after <= s->floor) return;
  for (int i = 0; i < s->n_fences; i++)
    if (s->fences[i].p == (char *)p && s->fences[i].bytes == bytes) {
      s->fences[i].after = max64(s->fences[i].after, after);
      return;
    }
  if (s->n_fences == FENCES_MAX) { /* forget them behind the latest, which follows them all */
    for (int i = 0; i < s->n_fences; i++) s->floor = max64(s->floor, s->fences[i].after);
    s->n_fences = 0;
  }
  s->fences[s->n_fences++] = (fence){.p = p, .bytes = bytes, .after = after};
}

/* What an H2D into the new allocation [p, p + bytes) follows: the latest fence over any of its
 * bytes. Fences it covers whole go: the allocation's own fence, which will be given back when
 * it is freed (drop_params, free_grads), is at least theirs. */
static int64_t fence_take(zt_streamer *s, void *p, size_t bytes) {
  char *a = p, *b = a + bytes;
  int64_t after = s->floor;
  for (int i = 0; i < s->n_fences;) {
    fence *f = &s->fences[i];
    if (f->p < b && f->p + f->bytes > a) {
      after = max64(after, f->after);
      if (f->p >= a && f->p + f->bytes <= b) {
        *f = s->fences[--s->n_fences];
        continue;
      }
    }
    i++;
  }
  return after;
}

/* The parameter part of the minimum. */
static size_t min_param_bytes(const zt_streamer_cfg *cfg) {
  int held = cfg->max_acquired ? cfg->max_acquired : 1;
  size_t *v = malloc((size_t)cfg->n_units * sizeof *v);
  if (!v) return SIZE_MAX;
  for (int i = 0; i < cfg->n_units; i++) v[i] = dev_footprint(cfg, cfg->units[i].param_bytes);
  size_t params = largest_sum(v, cfg->n_units, held + cfg->prefetch_depth);
  free(v);
  return params;
}

size_t zt_streamer_min_device_bytes(const zt_streamer_cfg *cfg) {
  if (!cfg || cfg->n_units <= 0 || !cfg->units || cfg->prefetch_depth < 0 || cfg->max_acquired < 0)
    return SIZE_MAX;
  int held = cfg->max_acquired ? cfg->max_acquired : 1;
  size_t params = min_param_bytes(cfg);
  size_t *v = malloc((size_t)cfg->n_units * sizeof *v);
  if (!v || params == SIZE_MAX) {
    free(v);
    return SIZE_MAX;
  }
  for (int i = 0; i < cfg->n_units; i++)
    v[i] = cfg->units[i].grad_floats && !cfg->units[i].dev_grads
               ? dev_footprint(cfg, cfg->units[i].grad_floats * sizeof(float))
               : 0;
  size_t grads = largest_sum(v, cfg->n_units, held);
  free(v);
  return params + grads;
}

/* ---- waiting on the copy engine and the store, timed ---------------------------------------- */

static int copy_wait(zt_streamer *s, zt_copy_queue q, int64_t ticket) {
  uint64_t t0 = zt_now_ns();
  int rc = s->cfg.copy->ops->wait(s->cfg.copy, q, ticket);
  s->st.wait_ns += zt_now_ns() - t0;
  if (rc < 0) return fail(s, rc, "streamer: copy engine (%s) failed: %s", s->cfg.copy->ops->name, strerror(-rc));
  return 0;
}

static int compute_wait(zt_streamer *s, zt_copy_queue q, int64_t ticket) {
  uint64_t t0 = zt_now_ns();
  int rc = s->cfg.copy->ops->compute_wait(s->cfg.copy, q, ticket);
  s->st.wait_ns += zt_now_ns() - t0;
  if (rc < 0) return fail(s, rc, "streamer: copy engine (%s) failed: %s", s->cfg.copy->ops->name, strerror(-rc));
  return 0;
}

static void free_slot(zt_streamer *s, unit_state *x) {
  if (x->slot >= 0) s->slot_owner[x->slot] = -1;
  x->slot = -1;
}

/* src: the unit's home bytes, or NULL for its pieces */
static int submit_h2d(zt_streamer *s, int i, const void *src) {
  unit_state *x = &s->u[i];
  const zt_copy_ops *o = s->cfg.copy->ops;
  int64_t t = -EINVAL;
  size_t bytes = 0;
  if (src) {
    t = o->h2d(s->cfg.copy, x->dev, src, x->u.param_bytes, x->fence);
    bytes = x->u.param_bytes;
  }
  for (int k = 0; !src && k < x->u.n_pieces; k++) {
    const zt_stream_piece *pc = &x->u.pieces[k];
    if ((t = o->h2d(s->cfg.copy, (char *)x->dev + pc->dev_offset, pc->host, pc->bytes,
                    x->fence)) < 0)
      break;
    bytes += pc->bytes;
  }
  if (t < 0) return fail(s, (int)t, "streamer: queueing the copy of unit %d failed: %s", i, strerror((int)-t));
  x->ticket = t; /* the queue is in order: the last piece's ticket covers them all */
  x->st = P_COPYING;
  s->st.bytes_h2d += bytes;
  return 0;
}

/* Drops the device copy of a unit whose fetch failed or that is evicted/invalidated. */
static void drop_params(zt_streamer *s, unit_state *x) {
  if (x->dev) {
    size_t fp = dev_footprint(&s->cfg, x->u.param_bytes);
    fence_add(s, x->dev, fp, max64(x->fence, x->used));
    zt_dev_arena_free(s->cfg.dev, x->dev);
    s->param_used -= fp;
  }
  x->dev = NULL;
  free_slot(s, x);
  x->st = P_HOME;
  x->pending = 0;
}

/* Finishes the NVMe read of a unit in P_READING and queues its copy to the device. */
static int finish_read(zt_streamer *s, int i) {
  unit_state *x = &s->u[i];
  uint64_t t0 = zt_now_ns();
  int rc = zt_nvme_wait(s->cfg.nvme, x->req);
  s->st.wait_ns += zt_now_ns() - t0;
  if (rc < 0) {
    fail(s, rc, "streamer: reading unit %d from NVMe failed: %s", i, zt_nvme_store_error(s->cfg.nvme));
    drop_params(s, x);
    return rc;
  }
  rc = submit_h2d(s, i, s->staging[x->slot]);
  if (rc < 0) drop_params(s, x);
  return rc;
}

/* The unit's parameters are on the device for whatever compute is queued next: the compute
 * waits for their copy (copy_ops.compute_wait: on the GPU, the host does not block). A copy
 * from an NVMe staging buffer is waited for on the host, which frees the buffer. *stalled: 1 if
 * the copy or read had not finished. */
static int land(zt_streamer *s, int i, int *stalled) {
  unit_state *x = &s->u[i];
  int rc = 0;
  *stalled = 0;
  if (x->st == P_READING) {
    *stalled = 1;
    rc = finish_read(s, i);
    if (rc < 0) return rc;
  }
  if (x->st == P_COPYING) {
    int done = s->cfg.copy->ops->query(s->cfg.copy, ZT_COPY_H2D, x->ticket);
    if (done == 0) {
      *stalled = 1;
      rc = x->slot >= 0 ? copy_wait(s, ZT_COPY_H2D, x->ticket)
                        : compute_wait(s, ZT_COPY_H2D, x->ticket);
    } else if (done < 0) {
      rc = fail(s, done, "streamer: copy engine (%s) failed: %s", s->cfg.copy->ops->name, strerror(-done));
    }
    if (rc < 0) {
      drop_params(s, x);
      return rc;
    }
    free_slot(s, x);
    x->st = P_RESIDENT;
  }
  return 0;
}

/* Frees an arena gradient buffer (not a caller's dev_grads) that the compute queued before
 * `after` may still use. */
static void free_grads(zt_streamer *s, unit_state *x, float *g, int64_t after) {
  if (g == x->u.dev_grads) return;
  fence_add(s, g, dev_footprint(&s->cfg, x->u.grad_floats * sizeof(float)), after);
  zt_dev_arena_free(s->cfg.dev, g);
}

static int finish_writeback(zt_streamer *s, int i) {
  unit_state *x = &s->u[i];
  int rc = copy_wait(s, ZT_COPY_D2H, x->wb_ticket);
  /* a failed copy leaves the host gradients wrong but the buffer free to reuse; the copy
   * followed every compute queued before it, the buffer's users included */
  free_grads(s, x, x->wb, x->gfence);
  x->wb = NULL;
  return rc;
}

/* ---- making room ---------------------------------------------------------------------------- */

/* unit j lies ahead of the walk (it needs it again before it turns round) */
static int ahead_of_walk(const zt_streamer *s, int j) {
  return s->dir != 0 && (j - s->cur) * s->dir >= 0;
}

/* The unit to evict: parameters on the device, not held (nor pending, for a prefetch). Units
 * behind the walk go first, least recently used first (the walk will not need them before it
 * turns round); then units ahead of it, farthest first (needed last). */
static int pick_victim(const zt_streamer *s, int for_prefetch) {
  int best = -1, best_class = 2;
  uint64_t best_key = 0;
  for (int j = 0; j < s->n; j++) {
    const unit_state *x = &s->u[j];
    if (x->st == P_HOME || x->holds > 0 || (for_prefetch && x->pending)) continue;
    int ahead = ahead_of_walk(s, j);
    uint64_t key = ahead ? (uint64_t)(s->n - abs(j - s->cur)) : x->last_use;
    if (best < 0 || ahead < best_class || (ahead == best_class && key < best_key)) {
      best = j;
      best_class = ahead;
      best_key = key;
    }
  }
  return best;
}

/* among those that free arena memory */
static int oldest_writeback(const zt_streamer *s) {
  int best = -1;
  for (int j = 0; j < s->n; j++)
    if (s->u[j].wb && !s->u[j].u.dev_grads && (best < 0 || s->u[j].wb_ticket < s->u[best].wb_ticket)) best = j;
  return best;
}

/* is_param: the allocation is a parameter copy, which must also stay within param_budget.
 * *after: the compute a copy into it must follow (fence_take). */
static int make_room(zt_streamer *s, size_t bytes, int is_param, int for_prefetch, void **out,
                     int64_t *after) {
  size_t fp = dev_footprint(&s->cfg, bytes);
  for (;;) {
    int over = is_param && s->cfg.param_budget && s->param_used + fp > s->cfg.param_budget;
    int rc = over ? -ENOMEM
                  : zt_dev_arena_alloc(s->cfg.dev, s->cfg.slot_bytes ? s->cfg.slot_bytes : bytes,
                                       out);
    if (rc != -ENOMEM) {
      if (rc < 0) return fail(s, rc, "streamer: %s", zt_dev_arena_error(s->cfg.dev));
      if (is_param) s->param_used += fp;
      *after = fence_take(s, *out, fp);
      return 0;
    }
    /* A gradient buffer first takes the place of a write-back (dead once its copy is done:
     * waited for here, which holds the queueing of the walk's next compute until the running
     * one is done) and evicts copies only when none is left; while streaming, a copy behind the
     * walk goes before that wait (the walk would evict it before it is used again; reusing its
     * memory waits on the device for its last compute, not here). A parameter copy takes
     * write-backs only when no copy can go, and within param_budget only evictions help. */
    int wb = over ? -1 : oldest_writeback(s), v = pick_victim(s, for_prefetch);
    if (!is_param && s->streaming && v >= 0 && !ahead_of_walk(s, v)) wb = -1;
    if (wb >= 0 && (!is_param || v < 0)) {
      rc = finish_writeback(s, wb);
      if (rc < 0) return rc;
      continue;
    }
    if (v >= 0) {
      int stalled;
      rc = land(s, v, &stalled);
      if (rc < 0) return rc;
      drop_params(s, &s->u[v]);
      s->st.evictions++;
      continue;
    }
    zt_dev_arena_stats a;
    zt_dev_arena_get_stats(s->cfg.dev, &a);
    if (over)
      return fail(s, for_prefetch ? -EAGAIN : -ENOMEM,
                  "streamer: no room for %zu parameter bytes: parameter budget %zu, %zu held or in flight",
                  bytes, s->cfg.param_budget, s->param_used);
    return fail(s, for_prefetch ? -EAGAIN : -ENOMEM,
                "streamer: no room for %zu device bytes: budget %zu, %zu in use by held units "
                "and copies in flight, largest hole %zu",
                bytes, a.budget, a.used, a.largest_free);
  }
}

/* ---- fetching -------------------------------------------------------------------------------- */

static int get_slot(zt_streamer *s) {
  for (int k = 0; k < s->n_staging; k++)
    if (s->slot_owner[k] < 0) return k;
  /* every staging buffer feeds a fetch in flight: land the one in the first buffer */
  int owner = s->slot_owner[0], stalled;
  int rc = land(s, owner, &stalled);
  if (rc < 0) return rc;
  return 0;
}

static int start_fetch(zt_streamer *s, int i, int for_prefetch) {
  unit_state *x = &s->u[i];
  int rc = make_room(s, x->u.param_bytes, 1, for_prefetch, &x->dev, &x->fence);
  if (rc < 0) {
    x->dev = NULL;
    return rc;
  }
  x->used = 0;
  s->st.fetches++;
  if (x->u.host_params || x->u.n_pieces) {
    rc = submit_h2d(s, i, x->u.host_params);
    if (rc < 0) drop_params(s, x);
    return rc;
  }
  rc = get_slot(s);
  if (rc < 0) {
    drop_params(s, x);
    return rc;
  }
  x->slot = rc;
  s->slot_owner[rc] = i;
  rc = zt_nvme_read(s->cfg.nvme, x->u.nvme_ext, x->u.nvme_offset, s->staging[x->slot], x->u.param_bytes);
  if (rc < 0) {
    fail(s, rc, "streamer: reading unit %d from NVMe: %s", i, zt_nvme_store_error(s->cfg.nvme));
    drop_params(s, x);
    return rc;
  }
  x->req = rc;
  x->st = P_READING;
  s->st.nvme_reads++;
  s->st.nvme_bytes += x->u.param_bytes;
  return 0;
}

/* NVMe reads started earlier have had the compute in between to finish: queue their copies. */
static int advance_reads(zt_streamer *s) {
  for (int j = 0; j < s->n; j++) {
    if (s->u[j].st != P_READING) continue;
    int rc = finish_read(s, j);
    if (rc < 0) return rc;
  }
  return 0;
}

/* ---- the API --------------------------------------------------------------------------------- */

static int check_cfg(const zt_streamer_cfg *c, char *err, size_t errlen) {
#define BAD(...) do { snprintf(err, errlen, __VA_ARGS__); return -EINVAL; } while (0)
  if (!c->units || c->n_units <= 0) BAD("streamer: no units");
  if (!c->dev || !c->copy) BAD("streamer: a device arena and a copy engine are required");
  if (c->prefetch_depth < 0 || c->max_acquired < 0) BAD("streamer: negative prefetch_depth or max_acquired");
  for (int i = 0; i < c->n_units; i++) {
    const zt_stream_unit *u = &c->units[i];
    if (u->param_bytes == 0) BAD("streamer: unit %d has no parameter bytes", i);
    if (u->n_pieces < 0 || (u->n_pieces && (u->host_params || !u->pieces)))
      BAD("streamer: unit %d: pieces need a piece list and no host_params", i);
    for (int k = 0; k < u->n_pieces; k++)
      if (!u->pieces[k].host || !u->pieces[k].bytes ||
          u->pieces[k].dev_offset + u->pieces[k].bytes > u->param_bytes)
        BAD("streamer: unit %d: piece %d is empty or outside the unit's %zu bytes", i, k,
            u->param_bytes);
    int nvme_home = !u->host_params && !u->n_pieces;
    if (nvme_home && !c->nvme) BAD("streamer: unit %d lives on NVMe but no store is given", i);
    if (nvme_home && !c->host) BAD("streamer: unit %d lives on NVMe but no host arena is given for staging", i);
    if (u->grad_floats && !u->host_grads) BAD("streamer: unit %d has gradients but no host gradient buffer", i);
    if (u->dev_grads && !u->grad_floats) BAD("streamer: unit %d has a device gradient buffer but no gradients", i);
    if (c->slot_bytes && (u->param_bytes > c->slot_bytes ||
                          (!u->dev_grads && u->grad_floats * sizeof(float) > c->slot_bytes)))
      BAD("streamer: unit %d does not fit a slot of %zu bytes", i, c->slot_bytes);
  }
  return 0;
#undef BAD
}

int zt_streamer_open(zt_streamer **out, const zt_streamer_cfg *cfg, char *err, size_t errlen) {
  char dummy[8];
  if (!err || !errlen) {
    err = dummy;
    errlen = sizeof dummy;
  }
  err[0] = 0;
  *out = NULL;
  int rc = check_cfg(cfg, err, errlen);
  if (rc < 0) return rc;
  size_t need = zt_streamer_min_device_bytes(cfg);
  zt_dev_arena_stats a;
  zt_dev_arena_get_stats(cfg->dev, &a);
  int held = cfg->max_acquired ? cfg->max_acquired : 1;
  if (need == SIZE_MAX) return -ENOMEM;
  size_t need_params = min_param_bytes(cfg);
  if (cfg->param_budget && need_params > cfg->param_budget) {
    snprintf(err, errlen,
             "streamer: needs a parameter budget of at least %zu bytes for %d unit(s) held and %d "
             "prefetched; param_budget is %zu", need_params, held, cfg->prefetch_depth, cfg->param_budget);
    return -ENOMEM;
  }
  if (need > a.budget - a.used) {
    snprintf(err, errlen,
             "streamer: needs at least %zu device bytes for %d unit(s) held and %d prefetched with "
             "their gradients; the arena has %zu of its %zu-byte budget free",
             need, held, cfg->prefetch_depth, a.budget - a.used, a.budget);
    return -ENOMEM;
  }
  zt_streamer *s = calloc(1, sizeof *s);
  if (!s) return -ENOMEM;
  if (!(s->fences = malloc(FENCES_MAX * sizeof *s->fences))) {
    free(s);
    return -ENOMEM;
  }
  s->cfg = *cfg;
  s->n = cfg->n_units;
  s->cur = -1;
  s->u = calloc((size_t)s->n, sizeof *s->u);
  rc = s->u ? 0 : -ENOMEM;
  size_t stage_bytes = 0;
  for (int i = 0; s->u && i < s->n; i++) {
    s->u[i] = (unit_state){.u = cfg->units[i], .slot = -1};
    if (!cfg->units[i].host_params && !cfg->units[i].n_pieces &&
        cfg->units[i].param_bytes > stage_bytes)
      stage_bytes = cfg->units[i].param_bytes;
  }
  s->cfg.units = NULL; /* the copy in s->u is the one used */
  size_t copies = 0;
  for (int i = 0; s->u && i < s->n; i++) copies += dev_footprint(cfg, cfg->units[i].param_bytes);
  s->streaming = copies > a.budget;
  if (rc == 0 && stage_bytes) {
    s->n_staging = held + cfg->prefetch_depth;
    s->staging = calloc((size_t)s->n_staging, sizeof *s->staging);
    s->slot_owner = malloc((size_t)s->n_staging * sizeof *s->slot_owner);
    if (!s->staging || !s->slot_owner) rc = -ENOMEM;
    for (int k = 0; rc == 0 && k < s->n_staging; k++) {
      s->slot_owner[k] = -1;
      rc = zt_host_arena_alloc(cfg->host, stage_bytes, &s->staging[k]);
      if (rc < 0)
        snprintf(err, errlen, "streamer: %d NVMe staging buffers of %zu bytes: %s", s->n_staging,
                 stage_bytes, zt_host_arena_error(cfg->host));
    }
  }
  if (rc < 0) {
    if (!err[0]) snprintf(err, errlen, "streamer: out of memory");
    zt_streamer_close(s);
    return rc;
  }
  *out = s;
  return 0;
}

void zt_streamer_close(zt_streamer *s) {
  if (!s) return;
  for (int i = 0; s->u && i < s->n; i++) {
    unit_state *x = &s->u[i];
    int stalled;
    if (x->st != P_HOME) land(s, i, &stalled);
    drop_params(s, x);
    if (x->wb) finish_writeback(s, i);
    if (x->grad) {
      if (x->zero_ticket) copy_wait(s, ZT_COPY_H2D, x->zero_ticket);
      free_grads(s, x, x->grad, 0);
    }
  }
  for (int k = 0; s->staging && k < s->n_staging; k++)
    if (s->staging[k]) zt_host_arena_free(s->cfg.host, s->staging[k]);
  free(s->staging);
  free(s->slot_owner);
  free(s->u);
  free(s->fences);
  free(s);
}

static int bad_unit(zt_streamer *s, int unit) {
  if (unit >= 0 && unit < s->n) return 0;
  return fail(s, -EINVAL, "streamer: unit %d out of range [0, %d)", unit, s->n);
}

int zt_streamer_prefetch(zt_streamer *s, int unit) {
  int rc = bad_unit(s, unit);
  if (rc < 0) return rc;
  unit_state *x = &s->u[unit];
  if (x->st == P_HOME) {
    rc = start_fetch(s, unit, 1);
    if (rc < 0) return rc;
  }
  x->pending = x->holds == 0;
  x->last_use = ++s->tick;
  return 0;
}

int zt_streamer_acquire(zt_streamer *s, int unit, unsigned flags, void **params, float **grads) {
  int rc = bad_unit(s, unit);
  if (rc < 0) return rc;
  unit_state *x = &s->u[unit];
  int want_grads = (flags & ZT_STREAM_GRADS) != 0;
  if (!params || (want_grads && !grads)) return fail(s, -EINVAL, "streamer: acquire needs its output pointers");
  if (want_grads && !x->u.grad_floats) return fail(s, -EINVAL, "streamer: unit %d has no gradients", unit);
  if (want_grads && x->grad) return fail(s, -EBUSY, "streamer: unit %d holds a gradient buffer already", unit);
  if (unit != s->cur) {
    if (s->cur >= 0) s->dir = unit > s->cur ? 1 : -1;
    s->cur = unit;
  }
  if (x->st == P_HOME) {
    s->st.misses++;
    rc = start_fetch(s, unit, 0);
    if (rc < 0) return rc;
  } else {
    s->st.hits++;
  }
  x->holds++;
  x->pending = 0;
  x->last_use = ++s->tick;
  if (want_grads) {
    if (x->wb) {
      rc = finish_writeback(s, unit);
      if (rc < 0) goto out;
    }
    void *g = x->u.dev_grads;
    int64_t gf = ZT_COPY_AFTER_ALL, t = 0; /* the caller's buffer: any compute may use it */
    if (!g && (rc = make_room(s, x->u.grad_floats * sizeof(float), 0, 0, &g, &gf)) < 0) goto out;
    size_t gb = x->u.grad_floats * sizeof(float);
    int resume = (flags & ZT_STREAM_GRADS_RESUME) != 0;
    if (!resume || !x->u.dev_grads) /* a device buffer resumes from itself */
      t = resume ? s->cfg.copy->ops->h2d(s->cfg.copy, g, x->u.host_grads, gb, gf)
                 : s->cfg.copy->ops->zero(s->cfg.copy, g, gb, gf);
    x->gfence = gf;
    if (t < 0) {
      free_grads(s, x, g, gf);
      rc = fail(s, (int)t, "streamer: queueing the start of unit %d's gradients failed", unit);
      goto out;
    }
    x->grad = g;
    x->zero_ticket = t;
    if (t && resume) s->st.bytes_h2d += gb;
  }
  int stalled;
  rc = land(s, unit, &stalled);
  if (rc < 0) goto out;
  s->st.stalls += (uint64_t)stalled;
  if (want_grads) {
    if (x->zero_ticket && (rc = compute_wait(s, ZT_COPY_H2D, x->zero_ticket)) < 0) goto out;
    *grads = x->grad;
  }
  *params = x->dev;
out:
  if (rc < 0) {
    x->holds--;
    if (want_grads && x->grad) {
      if (x->zero_ticket) copy_wait(s, ZT_COPY_H2D, x->zero_ticket);
      free_grads(s, x, x->grad, x->gfence);
      x->grad = NULL;
    }
  }
  return rc;
}

int zt_streamer_release(zt_streamer *s, int unit, unsigned flags) {
  int rc = bad_unit(s, unit);
  if (rc < 0) return rc;
  unit_state *x = &s->u[unit];
  if (x->holds <= 0) return fail(s, -EINVAL, "streamer: unit %d released but not held", unit);
  x->holds--;
  x->last_use = ++s->tick;
  /* the compute queued while it was held is its buffers' last use so far */
  int64_t now = s->cfg.copy->ops->compute_ticket(s->cfg.copy);
  if (now < 0) { /* the release still happens; a failed engine fails every later copy too */
    rc = fail(s, (int)now, "streamer: marking the compute failed: %s", strerror((int)-now));
    now = x->used;
  }
  x->used = now;
  if (x->holds == 0 && x->grad) {
    if (rc < 0) {
      free_grads(s, x, x->grad, now);
    } else if ((flags & ZT_STREAM_DIRTY) && !(flags & ZT_STREAM_STORE) &&
        !s->cfg.copy->ops->grad_accumulate) {
      rc = fail(s, -ENOTSUP, "streamer: the %s copy engine cannot accumulate on the host; "
                "release with ZT_STREAM_STORE", s->cfg.copy->ops->name);
      free_grads(s, x, x->grad, now);
    } else if (flags & ZT_STREAM_DIRTY) {
      int64_t t = flags & ZT_STREAM_STORE
                      ? s->cfg.copy->ops->d2h(s->cfg.copy, x->u.host_grads, x->grad,
                                              x->u.grad_floats * sizeof(float))
                      : s->cfg.copy->ops->grad_accumulate(s->cfg.copy, x->u.host_grads, x->grad,
                                                          x->u.grad_floats);
      if (t < 0) {
        rc = fail(s, (int)t, "streamer: queueing the gradient write-back of unit %d failed", unit);
        free_grads(s, x, x->grad, now);
      } else {
        x->wb = x->grad;
        x->wb_ticket = t;
        x->gfence = now;
        s->st.grad_writebacks++;
        s->st.bytes_d2h += x->u.grad_floats * sizeof(float);
      }
    } else {
      free_grads(s, x, x->grad, now);
    }
    x->grad = NULL;
  }
  if (rc < 0) return rc;
  return advance_reads(s);
}

int zt_streamer_wait_grads(zt_streamer *s, int unit) {
  if (unit >= s->n) return bad_unit(s, unit);
  int first = unit < 0 ? 0 : unit, last = unit < 0 ? s->n - 1 : unit, rc = 0;
  for (int i = first; i <= last; i++) {
    if (!s->u[i].wb) continue;
    int r = finish_writeback(s, i);
    if (r < 0 && rc == 0) rc = r;
  }
  return rc;
}

int zt_streamer_invalidate(zt_streamer *s, int unit) {
  if (unit >= s->n) return bad_unit(s, unit);
  int first = unit < 0 ? 0 : unit, last = unit < 0 ? s->n - 1 : unit;
  for (int i = first; i <= last; i++)
    if (s->u[i].holds > 0) return fail(s, -EBUSY, "streamer: unit %d is held; cannot invalidate it", i);
  for (int i = first; i <= last; i++) {
    unit_state *x = &s->u[i];
    if (x->st == P_HOME) continue;
    int stalled, rc = land(s, i, &stalled); /* the copy in flight still writes the buffer */
    if (rc < 0) return rc;
    drop_params(s, x);
  }
  return 0;
}

int zt_streamer_is_resident(const zt_streamer *s, int unit) {
  return unit >= 0 && unit < s->n && s->u[unit].st != P_HOME;
}

void zt_streamer_get_stats(const zt_streamer *s, zt_streamer_stats *out) {
  zt_dev_arena_stats a;
  zt_dev_arena_get_stats(s->cfg.dev, &a);
  *out = s->st;
  out->device_peak = a.peak;
}

const char *zt_streamer_error(const zt_streamer *s) { return s->err; }
