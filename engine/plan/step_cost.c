/* The offloaded step's cost model (engine/plan/step_cost.h): the walk of
 * engine/train/offload/step.c played on queues. Each queue runs its work in the order the walk
 * issues it, an item starting when the queue is free and what it needs is done; the runner
 * thread issues work without waiting except where the walk waits (for a unit's gradients on the
 * host, a landing update, the norm's device sum, the step's end). Four steps are played; the
 * step time is the period of the last two, so that the updates one step leaves running (behind
 * the next forward, or deferred by the delayed update) are charged where they land. */
#include "engine/plan/step_cost.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/plan/rates.h"
#include "offload/device_arena.h"
#include "offload/opt_store.h"

#define STEPS 4
/* the walk's lag between a unit's backward and its unit_done (engine/plan/recipe.h) */
#define DONE_LAG ZT_OFFLOAD_UNIT_DONE_LAG

enum { Q_DEV, Q_H2D, Q_D2H, Q_ADAM, Q_NVME, Q_RUN, QUEUES };

typedef struct unit_cost {
  double fwd, bwd, rec;  /* device seconds a micro-batch: forward, backward, recompute */
  double fetch, grads;   /* seconds on the link: its device copy, its fp32 gradients */
  double adam, adam_alone; /* the pool's AdamW beside the backward, and after it */
  double sumsq;          /* the runner's sum of squares of its gradients */
  double dev_adam;       /* the device AdamW of a device unit */
  double nvme_r, nvme_w; /* an NVMe unit's state read and written */
} unit_cost;

/* an arena slot: free, a unit's parameter copy, its gradient buffer held by the walk, or that
 * buffer's write-back in flight (memory the streamer takes back once the copy is done) */
enum { SLOT_FREE, SLOT_PARAM, SLOT_GRAD, SLOT_WB };
typedef struct slot {
  int kind, unit;
} slot;

typedef struct sim {
  int nu, ng, nh, ga, prefetch, head_embed, clip_waits, delayed;
  int unit_major, um_back, dsum;
  unit_cost *c;
  double q[QUEUES], busy[QUEUES];
  slot *slots;
  int n_slots;
  int cur, dir;          /* the walk's unit and direction, for the streamer's victim */
  /* per unit */
  int *copy_slot;        /* the slot of its device copy, -1: none */
  int *grad_slot;        /* the slot of its gradient buffer while the walk holds it */
  char *pending;         /* prefetched, not acquired yet (a prefetch does not evict it) */
  long *touch;           /* its copy's last use */
  double *copy_at;       /* its copy is on the device */
  double *used_to;       /* its copy's last compute ends */
  double *grads_at;      /* its gradients are on the host */
  double *updated_at;    /* its last update is done */
  double *pending_at;    /* delayed: the deferred update of the step before is done */
  char *updated;         /* updated this step */
  long clock;
  int landing;
  double stage_free[2];  /* the NVMe store's two staging sets */
  int stage;
} sim;

/* work of dur on queue k once ready: its end */
static double run_on(sim *s, int k, double ready, double dur) {
  double start = fmax(s->q[k], ready);
  s->q[k] = start + dur;
  s->busy[k] += dur;
  return s->q[k];
}

static void wait_for(sim *s, double t) { s->q[Q_RUN] = fmax(s->q[Q_RUN], t); }

/* The streamer's victim (streamer.c pick_victim): a copy not held (pin, pin2) nor, for a
 * prefetch, prefetched and unused; those behind the walk first, least recently used, then
 * those ahead, farthest first. -1: none. */
static int victim(const sim *s, int for_prefetch, int pin, int pin2) {
  int best = -1, best_ahead = 2;
  long best_key = 0;
  for (int u = s->ng; u < s->nu; u++) {
    if (s->copy_slot[u] < 0 || u == pin || u == pin2 || (for_prefetch && s->pending[u])) continue;
    int ahead = (u - s->cur) * s->dir >= 0;
    long key = ahead ? s->nu - labs(u - s->cur) : s->touch[u];
    if (best < 0 || ahead < best_ahead || (ahead == best_ahead && key < best_key)) {
      best = u;
      best_ahead = ahead;
      best_key = key;
    }
  }
  return best;
}

/* A slot for a parameter copy or a gradient buffer (streamer.c make_room): a free one; else a
 * gradient buffer takes a write-back's (the runner waits for that copy to finish) before it
 * evicts a copy, except that while streaming (fewer slots than streamed units) a copy behind
 * the walk goes first; a copy takes a write-back's only where no copy can go. An evicted copy's slot is reused in the device's order:
 * *fence, the end of its last compute. -1: no room (a prefetch then leaves it to the acquire). */
static int take_slot(sim *s, int is_param, int for_prefetch, int pin, int pin2, double *fence) {
  *fence = 0;
  int wb = -1;
  for (int i = 0; i < s->n_slots; i++) {
    if (s->slots[i].kind == SLOT_FREE) return i;
    if (s->slots[i].kind == SLOT_WB &&
        (wb < 0 || s->grads_at[s->slots[i].unit] < s->grads_at[s->slots[wb].unit]))
      wb = i;
  }
  int v = victim(s, for_prefetch, pin, pin2);
  if (!is_param && s->n_slots < s->nu - s->ng && v >= 0 && (v - s->cur) * s->dir < 0) wb = -1;
  if (wb >= 0 && (!is_param || v < 0)) {
    wait_for(s, s->grads_at[s->slots[wb].unit]);
    s->slots[wb].kind = SLOT_FREE;
    return wb;
  }
  if (v < 0) return -1;
  int i = s->copy_slot[v];
  *fence = s->used_to[v];
  s->copy_slot[v] = -1;
  s->slots[i].kind = SLOT_FREE;
  return i;
}

/* unit u's device copy: current, or fetched into a slot; after an update (landing) of its new
 * parameters. A prefetch without room fetches nothing (-1). */
static double fetch(sim *s, int u, int for_prefetch, int pin, int pin2) {
  if (u < s->ng) return 0;
  s->touch[u] = ++s->clock;
  if (!for_prefetch) s->pending[u] = 0;
  if (s->copy_slot[u] >= 0) return s->copy_at[u];
  double fence;
  int i = take_slot(s, 1, for_prefetch, pin, pin2, &fence);
  if (i < 0 && for_prefetch) return -1;
  if (i >= 0) {
    s->slots[i] = (slot){SLOT_PARAM, u};
    s->copy_slot[u] = i;
    s->pending[u] = (char)for_prefetch;
  }
  double ready = fmax(s->q[Q_RUN], fmax(fence, s->landing ? s->updated_at[u] : 0));
  return s->copy_at[u] = run_on(s, Q_H2D, ready, s->c[u].fetch);
}

/* the streamed units the walk prefetches after u in direction dir (step.c prefetch_from): in
 * the forward through the device units, the first streamed ones */
static void prefetch_after(sim *s, int u, int dir, int pin2) {
  s->cur = u;
  s->dir = dir;
  int v0 = dir > 0 && u + 1 < s->ng ? s->ng : u + dir;
  for (int d = 0; d < s->prefetch; d++) {
    int v = v0 + d * dir;
    if (v < s->ng || v >= s->nu) break;
    if (s->landing) wait_for(s, s->updated_at[v]);
    fetch(s, v, 1, u, pin2);
  }
}

static double compute(sim *s, int u, double ready, double dur) {
  double end = run_on(s, Q_DEV, fmax(ready, s->q[Q_RUN]), dur);
  if (u >= s->ng) s->used_to[u] = end;
  return end;
}

/* the forward of n micro-batches (unit-major: n = grad_accum); the head that reads the
 * embedding holds unit 0 too */
static void forward(sim *s, int n) {
  for (int u = 0; u < s->nu; u++) {
    int embed = s->head_embed && u == s->nu - 1, pin2 = embed ? 0 : -1;
    s->cur = u;
    s->dir = 1;
    if (s->landing && u >= s->ng) wait_for(s, s->updated_at[u]);
    double ready = fetch(s, u, 0, u, pin2);
    if (embed) ready = fmax(ready, fetch(s, 0, 0, u, 0));
    if (!s->landing) prefetch_after(s, u, 1, pin2);
    compute(s, u, ready, n * s->c[u].fwd);
    if (s->landing) prefetch_after(s, u, 1, pin2);
  }
}

/* The pool's AdamW of unit u, submitted now, beside the step's copies or with the host's memory
 * its own (alone: after the backward, the step waiting); an NVMe unit's state read first (one of the store's two staging
 * sets, free once its last write is done) and written after. */
static double update(sim *s, int u, int alone) {
  double adam = alone ? s->c[u].adam_alone : s->c[u].adam;
  double ready = s->q[Q_RUN];
  if (u >= s->nh) {
    double *st = &s->stage_free[s->stage++ & 1];
    ready = run_on(s, Q_NVME, *st, s->c[u].nvme_r);
    double done = run_on(s, Q_ADAM, fmax(ready, s->q[Q_RUN]), adam);
    *st = run_on(s, Q_NVME, done, s->c[u].nvme_w);
    return s->updated_at[u] = *st;
  }
  return s->updated_at[u] = run_on(s, Q_ADAM, ready, adam);
}

/* unit_done: with the overlap, the unit's gradients read and summed on the runner, its update
 * started */
static void unit_done(sim *s, int u) {
  if (u < s->ng) return;
  wait_for(s, s->grads_at[u]);
  run_on(s, Q_RUN, 0, s->c[u].sumsq);
  s->updated[u] = 1;
  update(s, u, 0);
}

/* Unit u's gradient buffer for its backward: a device unit's, or the sums on the device
 * (dsum), in place; else a slot, into which a later micro-batch first brings the host's
 * running sum (resume). Ready when its returned time is past. */
static double grads_in(sim *s, int u, int resume, int pin, int pin2) {
  if (u < s->ng || s->dsum) return 0;
  double fence;
  int i = take_slot(s, 0, 0, pin, pin2, &fence);
  if (i >= 0) s->slots[i] = (slot){SLOT_GRAD, u};
  s->grad_slot[u] = i;
  return resume ? run_on(s, Q_H2D, fmax(s->q[Q_RUN], fence), s->c[u].grads) : fence;
}

/* unit u's gradients to the host once its backward (ending at end) is done: its slot becomes a
 * write-back */
static void write_back(sim *s, int u, double end) {
  if (s->grad_slot[u] >= 0) s->slots[s->grad_slot[u]].kind = SLOT_WB;
  s->grad_slot[u] = -1;
  s->grads_at[u] = run_on(s, Q_D2H, fmax(end, s->q[Q_RUN]), s->c[u].grads);
}

/* the backward of n micro-batches into the units' gradient buffers: first, the step's first
 * (buffers from zero), last, its last (with the overlap the updates start); the head that
 * reads the embedding holds unit 0 and its gradient buffer from the head to unit 0 */
static void backward(sim *s, int n, int first, int last, int overlap) {
  int resume = !first && !s->dsum, to_host = !s->dsum || last;
  int done = s->nu - 1;
  for (int u = s->nu - 1; u >= 0; u--) {
    int embed = s->head_embed && u == s->nu - 1, pin2 = embed ? 0 : -1;
    s->cur = u;
    s->dir = -1;
    double ready = fetch(s, u, 0, u, pin2);
    if (embed) ready = fmax(ready, fetch(s, 0, 0, u, 0));
    if (!(s->head_embed && u == 0)) ready = fmax(ready, grads_in(s, u, resume, u, pin2));
    if (embed) ready = fmax(ready, grads_in(s, 0, resume, u, 0));
    prefetch_after(s, u, -1, pin2);
    double end = compute(s, u, ready, n * (s->c[u].bwd + s->c[u].rec));
    if (to_host && u >= s->ng) {
      /* delayed: the first write-back waits for the deferred update that reads the buffer */
      if ((s->dsum ? last : first) && s->delayed) wait_for(s, s->pending_at[u]);
      write_back(s, u, end);
    }
    for (; overlap && (done > u + DONE_LAG || (u == 0 && done >= 0)); done--) unit_done(s, done);
  }
}

static void wait_all(sim *s, const double *at) {
  for (int u = s->ng; u < s->nu; u++) wait_for(s, at[u]);
}

/* One step; step index k (0-based). Micro-major: each micro-batch's forward and backward;
 * unit-major: one forward of them all, then one backward of them all or (um_back 0) each
 * micro-batch's. The first backward lands the updates the step before left running. */
static void step(sim *s, int k) {
  int defer = s->delayed && k > 0;
  int overlap = !s->clip_waits && !defer;
  memset(s->updated, 0, (size_t)s->nu);
  if (s->dsum) wait_all(s, s->grads_at);
  for (int j = 0; j < s->ga; j++) {
    if (!s->unit_major || j == 0) forward(s, s->unit_major ? s->ga : 1);
    if (s->landing) wait_all(s, s->updated_at); /* the backward's land() */
    s->landing = 0;
    if (s->um_back && j == 0) backward(s, s->ga, 1, 1, overlap);
    if (!s->um_back) backward(s, 1, j == 0, j == s->ga - 1, overlap && j == s->ga - 1);
  }
  /* the norm: every write-back, the deferred update of the step before, the host's sum where
   * the overlap did not take it, the device units' (a sync) */
  wait_all(s, s->grads_at);
  if (defer) wait_all(s, s->pending_at);
  if (!overlap) {
    double sum = 0;
    for (int u = s->ng; u < s->nu; u++) sum += s->c[u].sumsq;
    run_on(s, Q_RUN, 0, sum);
  }
  if (s->ng) wait_for(s, s->q[Q_DEV]);
  /* the updates the overlap did not reach (off_update): landing in the forward's order, the
   * device units' after the streamed ones; else in the backward's order, waited for */
  int landing = !defer && !s->delayed && s->nh == s->nu;
  for (int i = 0; i < s->nu; i++) {
    int u = !landing ? s->nu - 1 - i : i + s->ng < s->nu ? i + s->ng : i + s->ng - s->nu;
    if (s->updated[u] || (defer && u >= s->ng)) continue;
    if (u < s->ng) run_on(s, Q_DEV, s->q[Q_RUN], s->c[u].dev_adam);
    else update(s, u, !landing); /* landing: beside the next forward's copies */
  }
  if (!landing) wait_all(s, s->updated_at);
  /* the masters changed: every copy is stale */
  for (int u = s->ng; u < s->nu; u++)
    if (s->copy_slot[u] >= 0) {
      s->slots[s->copy_slot[u]].kind = SLOT_FREE;
      s->copy_slot[u] = -1;
    }
  wait_for(s, s->q[Q_DEV]);
  /* delayed: this step's streamed updates run during the next step */
  if (defer)
    for (int u = s->ng; u < s->nu; u++) s->pending_at[u] = update(s, u, 0);
  s->landing = landing;
}

/* Device seconds of each unit's forward, backward and recompute a micro-batch: 6 * its
 * parameters * tokens (the embedding's counted in the head, which does the matmul over the
 * vocabulary), plus each block's attention, 12 * B * T^2 * d_model, by the device's rate. */
static void unit_compute(const zt_model *m, const zt_train_cfg *tc, int ckpt_every,
                         unit_cost *c) {
  const zt_model_cfg *mc = zt_model_cfg_of(m);
  const zt_plan_rates *R = zt_plan_rates_active();
  int nu = zt_model_num_units(m);
  double N = (double)tc->micro_batch * mc->seq_len;
  double rate = zt_plan_rates_flops(R, tc->precision == ZT_F32, mc->d_model);
  double attn = 12.0 * tc->micro_batch * mc->seq_len * mc->seq_len * mc->d_model;
  int head = nu > 1 && !strcmp(zt_model_unit(m, nu - 1)->name, "head") &&
             !strcmp(zt_model_unit(m, 0)->name, "embed");
  for (int u = 0; u < nu; u++) {
    const zt_unit_info *ui = zt_model_unit(m, u);
    double numel = (double)ui->numel;
    if (head && u == 0) numel = 0;
    if (head && u == nu - 1) numel += (double)zt_model_unit(m, 0)->numel;
    double flops = 6 * numel * N;
    int block = !strncmp(ui->name, "block.", 6);
    if (block) flops += attn;
    c[u].fwd = flops / 3 / rate;
    c[u].bwd = flops * 2 / 3 / rate;
    c[u].rec = block && ckpt_every > 0 && atoi(ui->name + 6) % ckpt_every == 0 ? c[u].fwd : 0;
  }
}

void zt_plan_step_cost(const zt_model *m, const zt_train_cfg *tc, const zt_offload_placement *p,
                       int prefetch, zt_step_cost *out) {
  const zt_plan_rates *R = zt_plan_rates_active();
  int nu = zt_model_num_units(m);
  sim s = {.nu = nu, .ng = p->z.ng, .nh = p->z.nh, .ga = tc->grad_accum,
           .prefetch = prefetch, .head_embed = zt_model_head_reads_embed(m),
           .clip_waits = tc->grad_clip > 0 || tc->precision == ZT_F16, .delayed = p->delayed,
           .unit_major = p->unit_major,
           .um_back = p->unit_major && zt_offload_backward_unit_major(m), .dsum = p->z.dsum};
  /* the arena's slots, each a unit's device copy or gradient buffer (offload_plan.c
   * sizes_for: equal slots of the largest) */
  size_t fp = zt_dev_arena_footprint(p->z.slot);
  int ns = nu - s.ng, n_slots = fp ? (int)(p->z.arena / fp) : ns + p->z.held + 1;
  s.n_slots = n_slots > 1 ? n_slots : 1;
  unit_cost *c = calloc((size_t)nu, sizeof *c);
  double *t = calloc((size_t)nu * 5, sizeof *t);
  int *slot_of = malloc((size_t)nu * 2 * sizeof *slot_of);
  long *touch = calloc((size_t)nu, sizeof *touch);
  char *flags = calloc((size_t)nu, 2);
  slot *slots = calloc((size_t)s.n_slots, sizeof *slots);
  memset(out, 0, sizeof *out);
  if (!c || !t || !slot_of || !touch || !flags || !slots) {
    out->step_s = INFINITY; /* unrankable: no plan is chosen for it */
    goto done;
  }
  for (int u = 0; u < 2 * nu; u++) slot_of[u] = -1;
  s.c = c;
  s.slots = slots;
  s.copy_slot = slot_of;
  s.grad_slot = slot_of + nu;
  s.touch = touch;
  s.updated = flags;
  s.pending = flags + nu;
  s.copy_at = t;
  s.used_to = t + nu;
  s.grads_at = t + 2 * nu;
  s.updated_at = t + 3 * nu;
  s.pending_at = t + 4 * nu;
  unit_compute(m, tc, p->ckpt_every, c);
  for (int u = 0; u < nu; u++) {
    const zt_unit_info *ui = zt_model_unit(m, u);
    double n = (double)ui->numel;
    c[u].fetch = (double)zt_offload_unit_fetch_bytes(m, u, tc->precision) / R->h2d_bytes;
    c[u].grads = n * sizeof(float) / R->d2h_bytes;
    /* the pool is bound by memory: bf16 moments move 22 bytes a parameter to fp32's 34 (p, g,
     * m, v read, p, m, v and the compute copy written) */
    double moved = tc->state_dtype == ZT_BF16 ? 22.0 / 34.0 : 1.0;
    c[u].adam = n * moved / R->adamw_params;
    c[u].adam_alone = n * moved / R->adamw_alone_params;
    c[u].sumsq = n * sizeof(float) / R->sumsq_bytes;
    c[u].dev_adam = n * 18 / R->hbm_bytes;
    double file = (double)zt_opt_store_file_bytes(ui->numel, tc->state_dtype);
    c[u].nvme_r = file / R->nvme_read;
    c[u].nvme_w = file / R->nvme_write;
  }
  double end1 = 0, busy1[QUEUES] = {0};
  for (int k = 0; k < STEPS; k++) {
    step(&s, k);
    if (k == STEPS - 3) {
      end1 = s.q[Q_RUN];
      memcpy(busy1, s.busy, sizeof busy1);
    }
  }
  double per = 2;
  out->step_s = (s.q[Q_RUN] - end1) / per;
  out->compute_s = (s.busy[Q_DEV] - busy1[Q_DEV]) / per;
  out->h2d_s = (s.busy[Q_H2D] - busy1[Q_H2D]) / per;
  out->d2h_s = (s.busy[Q_D2H] - busy1[Q_D2H]) / per;
  out->adam_s = (s.busy[Q_ADAM] - busy1[Q_ADAM]) / per;
  out->nvme_s = (s.busy[Q_NVME] - busy1[Q_NVME]) / per;
  out->runner_s = (s.busy[Q_RUN] - busy1[Q_RUN]) / per;
done:
  free(c);
  free(t);
  free(slot_of);
  free(touch);
  free(flags);
  free(slots);
}
