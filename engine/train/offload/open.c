/* The offloaded trainer's open (zt_trainer_open_offload, engine/train/offload/offload.h): the plan
 * (engine/plan/offload_plan.h) checked and allocated, tier by tier, and the initial state
 * written into it. */
#include "engine/train/offload/internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/base/clock.h"
#include "engine/base/log.h"
#include "engine/base/sizes.h"
#include "engine/kernels/backend.h"

/* AdamW worker threads. On the CPU backend one keeps the update of a unit running beside the
 * backend's own threads on the runner's backward, unpinned, since the backend's threads take the
 * cores they find. Beside a GPU the update is the host's main work: a thread per core, pinned. */
#define ADAM_THREADS_BESIDE_CPU 1

int zt_offload_adam_threads(int on_gpu, int *pin) {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  *pin = on_gpu;
  return on_gpu ? (cores > 0 ? (int)cores : 1) : ADAM_THREADS_BESIDE_CPU;
}

/* The AdamW runs: consecutive tensors of a unit sharing a decay flag, from the unit's first
 * parameter (zt_opt_run). */
static int build_runs(const zt_model *m, off_state *s) {
  int nt = zt_model_num_tensors(m);
  s->runs = calloc((size_t)nt, sizeof *s->runs);
  s->first_run = calloc((size_t)s->nu + 1, sizeof *s->first_run);
  if (!s->runs || !s->first_run) return -ENOMEM;
  int r = 0;
  for (int i = 0; i < nt; i++) {
    const zt_tensor_info *ti = zt_model_tensor(m, i);
    zt_opt_run *prev = r ? &s->runs[r - 1] : NULL;
    if (prev && prev->decay == ti->decay && zt_model_tensor(m, i - 1)->unit == ti->unit &&
        prev->offset + prev->n == ti->offset) {
      prev->n += ti->numel;
      continue;
    }
    s->runs[r++] = (zt_opt_run){.offset = ti->offset, .n = ti->numel, .decay = ti->decay};
  }
  /* tensors are in layout order, units contiguous: runs of unit u follow those of u - 1 */
  for (int u = 0, k = 0; u <= s->nu; u++) {
    while (k < r && u < s->nu && s->runs[k].offset < zt_model_unit(m, u)->offset) k++;
    s->first_run[u] = u < s->nu ? k : r;
  }
  for (int u = 0; u < s->nu; u++)
    for (int k = s->first_run[u]; k < s->first_run[u + 1]; k++)
      s->runs[k].offset -= zt_model_unit(m, u)->offset;
  return 0;
}

/* bf16/fp16: each unit's pieces, runs of consecutive tensors read in the same copy (masters or
 * compute copy), placed at the tensors' offsets in the unit's fp32 block or 16-bit block. */
static int build_pieces(zt_trainer *t) {
  off_state *s = t->path_state;
  const zt_model *m = t->model;
  int nt = zt_model_num_tensors(m);
  s->pieces = calloc(2 * (size_t)nt, sizeof *s->pieces);
  s->first_piece = calloc((size_t)s->nu + 1, sizeof *s->first_piece);
  s->lp_offset = calloc((size_t)s->nu, sizeof *s->lp_offset);
  if (!s->pieces || !s->first_piece || !s->lp_offset) return -ENOMEM;
  for (int u = 0; u < s->nu; u++)
    s->lp_offset[u] = zt_offload_unit_layout_of(m, u, s->dt).lp_offset;
  int np = 0;
  for (int u = 0; u < s->nu; u++) {
    const zt_unit_info *ui = zt_model_unit(m, u);
    s->first_piece[u] = np;
    if (u < s->ng) continue; /* not streamed */
    if (s->dt == ZT_F32) { /* delayed: the masters or the stream copy, whole */
      s->pieces[np++] = (zt_stream_piece){
          .dev_offset = 0,
          .host = u < s->nh ? (const void *)zt__off_host_at(s, ZT_OPT_MASTER, ui->offset)
                            : (const void *)(s->scopy + s->scopy_off[u]),
          .bytes = ui->numel * sizeof(float)};
      continue;
    }
    for (int i = ui->first_tensor; i < ui->first_tensor + ui->n_tensors; i++) {
      const zt_tensor_info *ti = zt_model_tensor(m, i);
      size_t in_unit = ti->offset - ui->offset;
      for (unsigned kind = ZT_READS_F32; kind <= ZT_READS_LP; kind <<= 1) {
        if (!(ti->reads & kind)) continue;
        int lp = kind == ZT_READS_LP;
        size_t es = lp ? zt_dtype_size(s->dt) : sizeof(float);
        zt_stream_piece pc = {
            .dev_offset = (lp ? s->lp_offset[u] : 0) + in_unit * es,
            .host = lp               ? (const void *)zt__off_lp_at(s, ti->offset)
                    : u < s->scopy0 ? (const void *)zt__off_host_at(s, ZT_OPT_MASTER, ti->offset)
                                     : (const void *)(s->scopy + s->scopy_off[u] + in_unit),
            .bytes = ti->numel * es};
        /* the pieces of a unit are not sorted by kind: extend any that ends where this begins */
        int merged = 0;
        for (int k = s->first_piece[u]; k < np && !merged; k++) {
          zt_stream_piece *q = &s->pieces[k];
          if (q->dev_offset + q->bytes == pc.dev_offset &&
              (const char *)q->host + q->bytes == (const char *)pc.host) {
            q->bytes += pc.bytes;
            merged = 1;
          }
        }
        if (!merged) s->pieces[np++] = pc;
      }
    }
  }
  s->first_piece[s->nu] = np;
  return 0;
}

/* The device-resident units' buffers: backend memory, or with d_alias (the cpu backend with the
 * optimizer on the host and the flat gradients) the host tier's buffers themselves (from float
 * 0), which makes the norm and the state reads those of the run without offload. Called once
 * the host's buffers are all there; the initial state comes with zt__off_write_state. */
static int open_device_units(zt_trainer *t) {
  off_state *s = t->path_state;
  if (!s->ng) return 0;
  if (s->d_alias) {
    s->d_master = s->h[ZT_OPT_MASTER];
    s->d_m = s->h[ZT_OPT_M];
    s->d_v = s->h[ZT_OPT_V];
    s->d_grad = s->grads;
    s->d_lp = s->lp;
    return 0;
  }
  size_t bytes = s->ng_floats * sizeof(float), sbytes = s->ng_floats * zt_dtype_size(s->sd);
  if (!(s->d_master = t->be.ops->alloc(t->be.ctx, bytes)) ||
      !(s->d_grad = t->be.ops->alloc(t->be.ctx, bytes)) ||
      !(s->d_m = t->be.ops->alloc(t->be.ctx, sbytes)) ||
      !(s->d_v = t->be.ops->alloc(t->be.ctx, sbytes)))
    return -ENOMEM;
  if (s->dt != ZT_F32 &&
      !(s->d_lp = t->be.ops->alloc(t->be.ctx, s->ng_floats * zt_dtype_size(s->dt))))
    return -ENOMEM;
  return 0;
}

/* The device arena's block from the backend (cudaMalloc, 256-byte aligned). */
static int dev_block_alloc(void *ctx, size_t bytes, void **out) {
  zt_backend *be = ctx;
  *out = be->ops->alloc(be->ctx, bytes);
  return *out ? 0 : -ENOMEM;
}

static void dev_block_free(void *ctx, void *p, size_t bytes) {
  zt_backend *be = ctx;
  (void)bytes;
  be->ops->free(be->ctx, p);
}

/* The NVMe store in a directory of its own under nvme_dir (open_opt_store makes its files). */
static int open_nvme(zt_trainer *t, char *err, size_t errlen) {
  off_state *s = t->path_state;
  int rc = 0;
  /* a directory of its own, so that trainers can share nvme_dir */
  snprintf(s->nvme_dir, sizeof s->nvme_dir, "%s/zt-offload.XXXXXX", s->oc.nvme_dir);
  if (strlen(s->oc.nvme_dir) + 20 >= sizeof s->nvme_dir || !mkdtemp(s->nvme_dir)) {
    rc = strlen(s->oc.nvme_dir) + 20 >= sizeof s->nvme_dir ? -ENAMETOOLONG : -errno;
    snprintf(err, errlen, "offload.nvme_dir: %s: %s", s->oc.nvme_dir, strerror(-rc));
    s->nvme_dir[0] = 0;
    return rc;
  }
  if ((rc = zt_nvme_store_open(&s->nvme, s->nvme_dir, NULL, err, errlen)) < 0) {
    char why[256];
    snprintf(why, sizeof why, "%s", err);
    snprintf(err, errlen, "offload.nvme_dir: %s", why);
    return rc;
  }
  return 0;
}

/* The optimizer-state store: the streamed units' AdamW on the pool and, with NVMe units, a file
 * per unit and kind, which zt__off_write_state fills. */
static int open_opt_store(zt_trainer *t, char *err, size_t errlen) {
  off_state *s = t->path_state;
  int rc = -ENOMEM;
  size_t *floats = malloc((size_t)s->nu * sizeof *floats);
  const char **names = malloc((size_t)s->nu * sizeof *names);
  if (!floats || !names) {
    snprintf(err, errlen, "out of memory");
    goto out;
  }
  for (int u = 0; u < s->nu; u++) {
    floats[u] = zt_model_unit(t->model, u)->numel;
    names[u] = zt_model_unit(t->model, u)->name;
  }
  zt_opt_store_cfg c = {.n_units = s->nu, .floats = floats, .runs = s->runs,
                        .first_run = s->first_run, .dt = s->dt, .state = s->sd,
                        .pool = s->pool,
                        .nvme = s->nvme, .nvme_first = s->nh, .names = names,
                        .sets = {s->sets[0], s->sets[1]}, .updated = zt__off_opt_updated,
                        .ctx = t};
  char why[512];
  if ((rc = zt_opt_store_open(&s->opt, &c, why, sizeof why)) < 0)
    snprintf(err, errlen, "%s%s", s->nvme && zt_nvme_store_error(s->nvme)[0]
                                      ? "offload.nvme_dir: " : "", why);
out:
  free(floats);
  free(names);
  return rc;
}

/* The initial parameters (init_path or the seed) and zero moments, in every tier but the host
 * units' m and v, which the open allocates after it (zeroed by the arena). The parameters come a piece of
 * units at a time through one staging of the largest unit's parameters outside the arena (with
 * an init file, its header and the reader's chunk beside it), not a flat copy of the model (for
 * a 10 B model that would be 41 GB beside the arena). That is less than a checkpoint's staging
 * (zt_checkpoint_estimate_bytes: three such stagings, the chunk, the headers of three entries a
 * tensor), which the job's admission counts on top of the plan's host tier and which no
 * checkpoint needs while the open runs (test_ckpt_memory measures both). */
static int write_initial_state(zt_trainer *t, char *err, size_t errlen) {
  int nu = zt_model_num_units(t->model);
  size_t cap = zt__trainer_piece_cap(t->model);
  zt__trainer_init in;
  float *buf = NULL;
  int rc = zt__trainer_init_open(&in, t->model, err, errlen);
  if (rc < 0) goto out;
  if (!(buf = malloc(cap * sizeof *buf))) {
    rc = -ENOMEM;
    snprintf(err, errlen, "out of memory");
    goto out;
  }
  for (int u0 = 0, u1; u0 < nu && rc == 0; u0 = u1) {
    u1 = zt__trainer_piece_end(t->model, u0, cap);
    if ((rc = zt__trainer_init_read(&in, u0, u1, buf, err, errlen)) == 0)
      rc = zt__off_write_state(t, u0, u1, buf, NULL, NULL, err, errlen);
  }
out:
  free(buf);
  zt__trainer_init_close(&in);
  return rc;
}

/* offload.order unit: every micro-batch of the step keeps its activations (t->acts the first's)
 * from its forward to its backward, as the plan counts them. */
static int open_micro_acts(zt_trainer *t, off_state *s, int unit_major, char *err,
                           size_t errlen) {
  int G = t->tc.grad_accum, rc;
  s->unit_major = unit_major;
  s->um_back = unit_major && zt_offload_backward_unit_major(t->model);
  if (!unit_major) return 0;
  if (!(s->macts = calloc((size_t)G, sizeof *s->macts))) {
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  s->macts[0] = t->acts;
  for (int k = 1; k < G; k++) {
    if ((rc = zt_acts_open_dt(&s->macts[k], t->model, &t->be, t->tc.micro_batch,
                              t->tc.ckpt_every, t->tc.precision, err, errlen)) < 0)
      return rc;
    s->act_bytes += zt_acts_bytes(s->macts[k]);
  }
  return 0;
}

int zt_trainer_open_offload(zt_trainer **out, const zt_model_cfg *mc, const zt_train_cfg *tc,
                            const zt_offload_cfg *oc, const zt_offload_placement *given,
                            const zt_backend *be, char *err, size_t errlen) {
  int rc;
  zt_stream_unit *units = NULL;
  *out = NULL;
  if ((rc = zt_train_cfg_check(tc, err, errlen)) < 0 ||
      (rc = zt_offload_cfg_check(oc, err, errlen)) < 0)
    return rc;
  if ((rc = zt_offload_supported(be->ops->name, tc, oc, err, errlen)) < 0) return rc;
  int on_gpu = strcmp(be->ops->name, "cuda") == 0;
  zt_trainer *t = calloc(1, sizeof *t);
  off_state *s = calloc(1, sizeof *s);
  if (!t || !s) {
    free(t);
    free(s);
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  t->tc = *tc;
  t->be = *be;
  t->path = &zt__offload_path;
  t->path_state = s;
  s->oc = *oc;
  s->dt = tc->precision;
  s->sd = tc->state_dtype;
  s->head = -1;
  s->hbe = *be;
  if (on_gpu) {
    /* the host tier's own math (the norm over the host gradients, the compute-copy casts of a
     * loaded state) on every core */
    if ((rc = zt_backend_cpu_open(&s->hbe, 0)) < 0) {
      snprintf(err, errlen, "offload: opening a cpu backend for the host tier failed (%d)", rc);
      s->hbe = *be;
      goto out;
    }
    s->own_hbe = 1;
  }
  zt_loss_scaler_init(&t->scaler);
  if ((rc = be->ops->set_allow_tf32(be->ctx, tc->tf32)) < 0) {
    snprintf(err, errlen, "train.tf32: the %s backend has no TF32 mode", be->ops->name);
    goto out;
  }
  if ((rc = zt_model_create(&t->model, mc, err, errlen)) < 0) goto out;
  size_t n = zt_model_num_params(t->model), N = (size_t)tc->micro_batch * (size_t)mc->seq_len;
  s->nu = zt_model_num_units(t->model);
  if (zt_model_head_reads_embed(t->model)) s->head = s->nu - 1;
  /* the plan is checked, not searched: its sizes are what this open allocates */
  zt_offload_placement plan;
  if ((rc = zt_offload_plan_check(t->model, tc, oc, be->ops, given, &plan, err, errlen)) < 0)
    goto out;
  t->tc.ckpt_every = plan.ckpt_every;
  s->oc.params = plan.params;
  s->est = plan.est;
  if ((rc = zt_acts_open_dt(&t->acts, t->model, be, tc->micro_batch, plan.ckpt_every,
                            tc->precision, err, errlen)) < 0)
    goto out;
  s->act_bytes = zt_acts_bytes(t->acts);
  if ((rc = open_micro_acts(t, s, plan.unit_major, err, errlen)) < 0) goto out;
  t->h_tok = malloc(N * sizeof *t->h_tok);
  t->h_tgt = malloc(N * sizeof *t->h_tgt);
  units = calloc((size_t)s->nu, sizeof *units);
  if (!t->h_tok || !t->h_tgt || !units || (rc = build_runs(t->model, s)) < 0) {
    rc = -ENOMEM;
    snprintf(err, errlen, "out of memory");
    goto out;
  }
  s->updated = calloc((size_t)s->nu, 1);
  if (!s->updated) {
    rc = -ENOMEM;
    snprintf(err, errlen, "out of memory");
    goto out;
  }
  int params_nvme = oc->params == ZT_PLACE_NVME;
  zt_offload_sizes z = plan.z;
  int held = z.held;
  s->ng = z.ng;
  s->nh = z.nh;
  s->lo = z.lo;
  s->h_floats = z.h_floats;
  s->ring = z.ring;
  s->ring_floats = z.ring_floats;
  s->ng_floats = s->ng ? zt_model_unit(t->model, s->ng)->offset : 0;
  s->dev_unit_bytes = z.dev_units;
  s->dsum = z.dsum;
  s->dsum_bytes = z.dsum_bytes;
  s->host_bytes = z.host;
  /* where the time to a first step goes (docs/BENCHMARKS.md "Time to the first step") */
  uint64_t t_open = zt_now_ns(), t_host = 0, t_state = 0, t_moments = 0;
  if ((rc = zt_host_arena_open(&s->host, s->host_bytes, on_gpu ? zt_host_mem_cuda() : NULL)) < 0) {
    snprintf(err, errlen, "offload: opening the host arena failed (%d)", rc);
    goto out;
  }
  /* host_sizes' buffers; the host units' m and v once the initial state is written */
  t_host = zt_now_ns() - t_open;
  s->d_alias = z.alias;
  if (s->h_floats && (rc = zt_host_arena_alloc(s->host, s->h_floats * sizeof(float),
                                               &s->h[ZT_OPT_MASTER])) < 0)
    goto host_full;
  if (s->ring) {
    if (!(s->slot = calloc((size_t)s->ring, sizeof *s->slot))) goto no_memory;
    for (int i = 0; i < s->ring; i++)
      if ((rc = zt_host_arena_alloc(s->host, s->ring_floats * sizeof(float),
                                    (void **)&s->slot[i])) < 0)
        goto host_full;
  } else if ((rc = zt_host_arena_alloc(s->host, (n - s->lo) * sizeof(float),
                                       (void **)&s->grads)) < 0) {
    goto host_full;
  }
  if (s->dt != ZT_F32 &&
      (rc = zt_host_arena_alloc(s->host, (n - s->lo) * zt_dtype_size(s->dt), (void **)&s->lp)) < 0)
    goto host_full;
  /* delayed_update: the next buffers (host_sizes) */
  s->delayed = oc->delayed_update;
  if (s->delayed && s->dt == ZT_F32 && s->h_floats &&
      (rc = zt_host_arena_alloc(s->host, s->h_floats * sizeof(float), (void **)&s->m_nxt)) < 0)
    goto host_full;
  if (s->delayed && s->dt != ZT_F32 &&
      (rc = zt_host_arena_alloc(s->host, (n - s->lo) * zt_dtype_size(s->dt),
                                (void **)&s->lp_nxt)) < 0)
    goto host_full;
  s->scopy0 = z.scopy0;
  if (z.scopy_floats) {
    if (!(s->scopy_off = calloc((size_t)s->nu + 1, sizeof *s->scopy_off))) goto no_memory;
    for (int u = s->scopy0; u < s->nu; u++)
      s->scopy_off[u + 1] = s->scopy_off[u] + zt_offload_stream_copy_floats(t->model, u, s->dt);
    if ((rc = zt_host_arena_alloc(s->host, z.scopy_floats * sizeof(float),
                                  (void **)&s->scopy)) < 0 ||
        (s->delayed && (rc = zt_host_arena_alloc(s->host, z.scopy_floats * sizeof(float),
                                                 (void **)&s->scopy_nxt)) < 0))
      goto host_full;
  }
  if (s->nh < s->nu) {
    for (int i = 0; i < 2; i++)
      for (int k = 0; k < ZT_OPT_KINDS; k++)
        if ((rc = zt_host_arena_alloc(s->host, z.nvme_f32 / sizeof(float) *
                                                   zt_opt_store_kind_bytes(k, s->sd),
                                      &s->sets[i].buf[k])) < 0)
          goto host_full;
    if ((rc = open_nvme(t, err, errlen)) < 0) goto out;
  }
  int pin;
  s->adam_threads = zt_offload_adam_threads(on_gpu, &pin);
  if ((rc = zt_cpu_pool_open(&s->pool, s->adam_threads, pin)) < 0) {
    snprintf(err, errlen, "offload: starting the copy engine or the AdamW pool failed: %s",
             strerror(-rc));
    goto out;
  }
  if ((rc = open_opt_store(t, err, errlen)) < 0) goto out;
  if (!s->d_alias && (rc = open_device_units(t)) < 0) {
    snprintf(err, errlen, "offload: allocating %zu device bytes for %d unit(s) with their "
             "optimizer on the device failed", z.dev_units, s->ng);
    goto out;
  }
  t_state = zt_now_ns();
  uint64_t t_bufs = t_state - t_open - t_host; /* the tiers' buffers, the pool, the device units */
  if ((rc = write_initial_state(t, err, errlen)) < 0) goto out;
  t_moments = zt_now_ns();
  t_state = t_moments - t_state;
  /* The flat gradients and the host moments start at zero: both fresh from the arena, whose
   * allocations are zeroed (zt_host_arena_alloc), so no pass clears them (it cost 18 s at 8 B). */
  for (int k = ZT_OPT_M; k < ZT_OPT_KINDS && s->h_floats; k++) {
    size_t bytes = s->h_floats * zt_dtype_size(s->sd);
    if ((rc = zt_host_arena_alloc(s->host, bytes, &s->h[k])) < 0) goto host_full;
  }
  uint64_t t_dev = zt_now_ns();
  t_moments = t_dev - t_moments;
  if (s->d_alias) open_device_units(t);
  /* fp32 compute: the device copy of a unit is its masters, fetched from the host copy or from
   * their file; bf16/fp16: the pieces its ops read, from the masters and the compute copy;
   * delayed: pieces too, which the drain points at the buffers made current */
  if ((s->dt != ZT_F32 || s->delayed) && (rc = build_pieces(t)) < 0) goto no_memory;
  if (s->dsum && !(s->d_sum = be->ops->alloc(be->ctx, (n - s->ng_floats) * sizeof(float)))) {
    rc = -ENOMEM;
    snprintf(err, errlen, "offload: allocating %zu device bytes for the streamed units' gradient "
             "sums failed", (n - s->ng_floats) * sizeof(float));
    goto out;
  }
  /* the streamer's unit i is unit ng + i */
  for (int u = s->ng; u < s->nu; u++) {
    const zt_unit_info *ui = zt_model_unit(t->model, u);
    zt_stream_unit *x = &units[u - s->ng];
    *x = (zt_stream_unit){.param_bytes = zt_offload_unit_param_bytes(t->model, u, s->dt),
                          .grad_floats = ui->numel,
                          .host_grads = zt__off_grads_of(t, u),
                          .dev_grads = s->d_sum ? s->d_sum + (ui->offset - s->ng_floats) : NULL};
    if (s->pieces) {
      x->pieces = s->pieces + s->first_piece[u];
      x->n_pieces = s->first_piece[u + 1] - s->first_piece[u];
    } else if (u < s->nh) {
      x->host_params = zt__off_host_at(s, ZT_OPT_MASTER, ui->offset);
    } else if (params_nvme) {
      x->nvme_ext = zt_opt_store_ext(s->opt, u, ZT_OPT_MASTER);
    } else {
      x->host_params = s->scopy + s->scopy_off[u];
    }
  }
  zt_streamer_cfg sc = {.n_units = s->nu - s->ng, .units = units, .host = s->host, .nvme = s->nvme,
                        .prefetch_depth = oc->prefetch, .max_acquired = held,
                        .slot_bytes = z.slot};
  s->arena_budget = z.arena;
  s->dev_mem = (zt_dev_mem_ops){.name = be->ops->name, .alloc = dev_block_alloc,
                                 .free = dev_block_free, .ctx = &t->be};
  if ((rc = zt_dev_arena_open(&s->dev, s->arena_budget, on_gpu ? &s->dev_mem : NULL, err,
                              errlen)) < 0)
    goto out;
  rc = on_gpu ? zt_copy_cuda_open(&s->copy, zt_backend_device(be), zt_backend_stream(be))
              : zt_copy_cpu_open(&s->copy, 0);
  if (rc < 0) {
    snprintf(err, errlen, "offload: starting the copy engine or the AdamW pool failed: %s",
             strerror(-rc));
    goto out;
  }
  sc.dev = s->dev;
  sc.copy = s->copy;
  if ((rc = zt_streamer_open(&s->st, &sc, err, errlen)) < 0) goto out;
  char host[32];
  zt_size_format(host, sizeof host, (double)s->host_bytes);
  uint64_t t_end = zt_now_ns();
  ZT_LOGI("offload", "open in %.2f s: host tier %s%s in %.2f s, its buffers, the pool and the "
          "device units in %.2f s, initial state in %.2f s, the host moments allocated in "
          "%.2f s, the streamer in %.2f s", (double)(t_end - t_open) * 1e-9, host,
          on_gpu ? " (pinned)" : "", (double)t_host * 1e-9, (double)t_bufs * 1e-9,
          (double)t_state * 1e-9, (double)t_moments * 1e-9, (double)(t_end - t_dev) * 1e-9);
  *out = t;
  t = NULL;
  goto out;
no_memory:
  rc = -ENOMEM;
  snprintf(err, errlen, "out of memory");
  goto out;
host_full:
  snprintf(err, errlen, "offload: host tier: %s", zt_host_arena_error(s->host));
out:
  free(units);
  zt_trainer_close(t);
  return rc;
}
