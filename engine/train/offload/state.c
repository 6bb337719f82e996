/* The offloaded trainer's state between steps: where a unit's state lives, the path's state calls
 * (read and write a range of units, the trainer's checkpoints), its close and its statistics. */
#include "engine/train/offload/internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/kernels/backend.h"

/* The host's state at flat offset off (a host unit's, or a device unit's where they alias): a
 * float of the masters, an element of type sd of m and v */
void *zt__off_host_at(const off_state *s, int k, size_t off) {
  return (char *)s->h[k] + (off - s->lo) * zt_opt_store_kind_bytes(k, s->sd);
}

/* The state calls move m and v in fp32, as checkpoints hold them (checkpoint/state.c): kind k's
 * n elements from the tier's type into dst, widened where the moments are bf16 (exact)... */
static void kind_out(const off_state *s, int k, float *dst, const void *src, size_t n) {
  if (k == ZT_OPT_MASTER || s->sd == ZT_F32)
    memcpy(dst, src, n * sizeof(float));
  else
    s->hbe.ops->cast(s->hbe.ctx, dst, ZT_F32, src, ZT_BF16, n);
}

/* ... and back, narrowed (exact for the values of a bf16 checkpoint or read out of a bf16
 * state); src NULL: zeros. */
static void kind_in(const off_state *s, int k, void *dst, const float *src, size_t n) {
  if (!src)
    memset(dst, 0, n * zt_opt_store_kind_bytes(k, s->sd));
  else if (k == ZT_OPT_MASTER || s->sd == ZT_F32)
    memcpy(dst, src, n * sizeof(float));
  else
    s->hbe.ops->cast(s->hbe.ctx, dst, ZT_BF16, src, ZT_F32, n);
}

uint16_t *zt__off_lp_at(const off_state *s, size_t off) { return s->lp + (off - s->lo); }

/* Streamed unit u's fp32 gradients on the host: its part of the flat buffer, or its ring slot */
float *zt__off_grads_of(const zt_trainer *t, int u) {
  const off_state *s = t->path_state;
  if (s->ring) return s->slot[(u - s->ng) % s->ring];
  return s->grads + (zt_model_unit(t->model, u)->offset - s->lo);
}

/* The device-resident units' part of the flat range [base, end) (they are its first ng_floats
 * floats), out[k] holding the range; nothing to do where the device buffers are the host's.
 * bf16 moments are widened on the backend into the device units' gradients, free between steps
 * (each step zeroes them first), as the trainer without offload does. */
static int read_device_units(zt_trainer *t, size_t base, size_t end, float *out[ZT_OPT_KINDS]) {
  off_state *s = t->path_state;
  const zt_ops *o = t->be.ops;
  if (!s->ng || s->d_alias || base >= s->ng_floats) return 0;
  size_t n = (end < s->ng_floats ? end : s->ng_floats) - base;
  const void *dev[ZT_OPT_KINDS] = {s->d_master, s->d_m, s->d_v};
  for (int k = 0; k < ZT_OPT_KINDS; k++) {
    if (!out[k]) continue;
    const float *from = (const float *)dev[k] + base;
    if (k != ZT_OPT_MASTER && s->sd == ZT_BF16) {
      o->cast(t->be.ctx, s->d_grad + base, ZT_F32, (const uint16_t *)dev[k] + base, ZT_BF16, n);
      from = s->d_grad + base;
    }
    o->to_host(t->be.ctx, out[k], from, n * sizeof(float));
  }
  return o->sync(t->be.ctx);
}

/* in[k] NULL: zeros */
static int write_device_units(zt_trainer *t, size_t base, size_t end,
                              const float *in[ZT_OPT_KINDS]) {
  off_state *s = t->path_state;
  if (!s->ng || s->d_alias || base >= s->ng_floats) return 0;
  size_t n = (end < s->ng_floats ? end : s->ng_floats) - base;
  const zt_ops *o = t->be.ops;
  void *dev[ZT_OPT_KINDS] = {s->d_master, s->d_m, s->d_v};
  for (int k = 0; k < ZT_OPT_KINDS; k++) {
    size_t es = zt_opt_store_kind_bytes(k, s->sd);
    void *to = (char *)dev[k] + base * es;
    if (!in[k]) {
      o->zero(t->be.ctx, to, n * es);
    } else if (es == sizeof(float)) {
      o->to_device(t->be.ctx, to, in[k], n * sizeof(float));
    } else { /* narrowed on the backend from the gradients (read_device_units) */
      o->to_device(t->be.ctx, s->d_grad + base, in[k], n * sizeof(float));
      o->cast(t->be.ctx, to, ZT_BF16, s->d_grad + base, ZT_F32, n);
    }
  }
  if (s->d_lp)
    t->be.ops->cast(t->be.ctx, (char *)s->d_lp + base * zt_dtype_size(s->dt), s->dt,
                    s->d_master + base, ZT_F32, n);
  return t->be.ops->sync(t->be.ctx);
}

/* Units [u0, u1): the host tier's part of their flat range [base, end), the NVMe units' files
 * one unit at a time through the first set, the device units'. err: the NVMe store's message
 * (it names the file) or the backend's. */
static int off_read_state(zt_trainer *t, int u0, int u1, float *params, float *m, float *v,
                          char *err, size_t errlen) {
  off_state *s = t->path_state;
  float *out[ZT_OPT_KINDS] = {params, m, v};
  size_t base = zt_model_unit(t->model, u0)->offset;
  size_t end = zt_model_unit(t->model, u1 - 1)->offset + zt_model_unit(t->model, u1 - 1)->numel;
  size_t a = base > s->lo ? base : s->lo, b = end < s->lo + s->h_floats ? end : s->lo + s->h_floats;
  /* delayed: the state of the last step, its update landed */
  int rc = zt__off_pend_finish(t), lrc = zt__off_land(t), frc = zt_opt_store_finish(s->opt);
  if (rc == 0) rc = lrc;
  if (rc == 0) rc = frc;
  for (int k = 0; k < ZT_OPT_KINDS && a < b && rc == 0; k++)
    if (out[k]) kind_out(s, k, out[k] + (a - base), zt__off_host_at(s, k, a), b - a);
  const zt_opt_set *x = &s->sets[0];
  for (int u = u0 > s->nh ? u0 : s->nh; u < u1 && rc == 0; u++) {
    const zt_unit_info *ui = zt_model_unit(t->model, u);
    if ((rc = zt_opt_store_sync(s->opt, u, 0)) < 0) break;
    for (int k = 0; k < ZT_OPT_KINDS; k++)
      if (out[k]) kind_out(s, k, out[k] + (ui->offset - base), x->buf[k], ui->numel);
  }
  if (rc < 0) {
    snprintf(err, errlen, "%s", zt_opt_store_error(s->opt, rc));
    return rc;
  }
  if ((rc = read_device_units(t, base, end, out)) < 0)
    snprintf(err, errlen, "the device-resident units: %s", t->be.ops->error_text(t->be.ctx));
  return rc;
}

/* m and v NULL: zeros (the trainer's initial state; the open writes it before the host units'
 * m and v exist, write_initial_state). A failure leaves part of the range written: steps are
 * refused (broken) until a write succeeds, and a load that stops between ranges is the
 * trainer's to refuse (part_loaded). */
int zt__off_write_state(zt_trainer *t, int u0, int u1, const float *params, const float *m,
                        const float *v, char *err, size_t errlen) {
  off_state *s = t->path_state;
  const float *in[ZT_OPT_KINDS] = {params, m, v};
  size_t base = zt_model_unit(t->model, u0)->offset;
  size_t end = zt_model_unit(t->model, u1 - 1)->offset + zt_model_unit(t->model, u1 - 1)->numel;
  size_t a = base > s->lo ? base : s->lo, b = end < s->lo + s->h_floats ? end : s->lo + s->h_floats;
  /* delayed: the pending update lands first (its NVMe writes must not follow these) */
  int rc = zt__off_pend_finish(t), lrc = zt__off_land(t), frc = zt_opt_store_finish(s->opt);
  if (rc == 0) rc = lrc;
  if (rc == 0) rc = frc;
  for (int k = 0; k < ZT_OPT_KINDS && a < b; k++)
    if (s->h[k]) kind_in(s, k, zt__off_host_at(s, k, a), in[k] ? in[k] + (a - base) : NULL, b - a);
  const zt_opt_set *x = &s->sets[0];
  for (int u = u0 > s->nh ? u0 : s->nh; u < u1 && rc == 0; u++) {
    const zt_unit_info *ui = zt_model_unit(t->model, u);
    for (int k = 0; k < ZT_OPT_KINDS; k++)
      kind_in(s, k, x->buf[k], in[k] ? in[k] + (ui->offset - base) : NULL, ui->numel);
    rc = zt_opt_store_sync(s->opt, u, 1);
  }
  /* the host copy the units stream from */
  for (int u = u0 > s->scopy0 ? u0 : s->scopy0; u < u1 && rc == 0 && s->scopy; u++)
    memcpy(s->scopy + s->scopy_off[u], params + (zt_model_unit(t->model, u)->offset - base),
           (s->scopy_off[u + 1] - s->scopy_off[u]) * sizeof(float));
  if (rc < 0) {
    s->broken = 1;
    snprintf(err, errlen, "offload: writing the optimizer state failed: %s",
             zt_opt_store_error(s->opt, rc));
    return rc;
  }
  if ((rc = write_device_units(t, base, end, in)) < 0) {
    s->broken = 1;
    snprintf(err, errlen, "offload: writing the device-resident units failed: %s",
             t->be.ops->error_text(t->be.ctx));
    return rc;
  }
  /* the compute copy (over [lo, n)) follows the masters */
  a = base > s->lo ? base : s->lo;
  if (s->lp && a < end)
    s->hbe.ops->cast(s->hbe.ctx, s->lp + (a - s->lo), s->dt, params + (a - base), ZT_F32,
                     end - a);
  if (s->st && (rc = zt_streamer_invalidate(s->st, -1)) < 0) {
    s->broken = 1;
    snprintf(err, errlen, "offload: %s", zt_streamer_error(s->st));
    return rc;
  }
  s->broken = 0;
  return 0;
}

static size_t off_backend_bytes(const zt_trainer *t) {
  const off_state *s = t->path_state;
  return s->act_bytes + s->dev_unit_bytes + s->dsum_bytes + s->arena_budget;
}

static void off_close(zt_trainer *t) {
  off_state *s = t->path_state;
  if (!s) return;
  zt_streamer_close(s->st);
  zt_opt_store_close(s->opt); /* waits for its AdamW on the pool */
  zt_cpu_pool_close(s->pool);
  zt_copy_close(s->copy);
  zt_dev_arena_close(s->dev);
  zt_nvme_store_close(s->nvme); /* its files with it */
  if (s->nvme_dir[0]) rmdir(s->nvme_dir);
  zt_host_arena_close(s->host); /* masters, m, v, gradients and the staging with it */
  for (int k = 1; s->macts && k < t->tc.grad_accum; k++) zt_acts_close(s->macts[k]);
  free(s->macts);
  free(s->slot);
  free(s->scopy_off);
  free(s->updated);
  free(s->runs);
  free(s->first_run);
  free(s->pieces);
  free(s->first_piece);
  free(s->lp_offset);
  if (!s->d_alias) {
    void *dev[] = {s->d_master, s->d_m, s->d_v, s->d_grad, s->d_lp};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
      if (dev[i]) t->be.ops->free(t->be.ctx, dev[i]);
  }
  if (s->d_sum) t->be.ops->free(t->be.ctx, s->d_sum);
  if (s->own_hbe) zt_backend_close(&s->hbe);
  free(s);
  t->path_state = NULL;
}

const zt__train_path zt__offload_path = {
    .step = zt__off_step,
    .eval = zt__off_eval,
    .read_state = off_read_state,
    .write_state = zt__off_write_state,
    .backend_bytes = off_backend_bytes,
    .close = off_close,
};

int zt_trainer_offload_stats(const zt_trainer *t, zt_offload_stats *out) {
  if (t->path != &zt__offload_path) return -EINVAL;
  const off_state *s = t->path_state;
  zt_streamer_stats ss;
  zt_streamer_get_stats(s->st, &ss);
  zt_nvme_stats ns = {0};
  if (s->nvme) zt_nvme_store_get_stats(s->nvme, &ns);
  zt_host_arena_stats hs;
  zt_host_arena_get_stats(s->host, &hs);
  zt_copy_busy cb = {0};
  s->copy->ops->busy(s->copy, &cb);
  zt_cpu_pool_stats ps;
  zt_cpu_pool_get_stats(s->pool, &ps);
  *out = (zt_offload_stats){.device_budget = s->act_bytes + s->dev_unit_bytes + s->dsum_bytes +
                                             s->arena_budget,
                            .grads = s->dsum ? ZT_PLACE_GPU : ZT_PLACE_HOST,
                            .dsum_bytes = s->dsum_bytes,
                            .gpu_units = s->ng,
                            .host_units = s->nh - s->ng,
                            .grad_slots = s->ring,
                            .ckpt_every = t->tc.ckpt_every,
                            .params = s->oc.params,
                            .est = s->est,
                            .unit_major = s->unit_major,
                            .gpu_unit_bytes = s->dev_unit_bytes,
                            .gpu_unit_updates = s->gpu_unit_updates,
                            .step_ns = s->step_ns,
                            .compute_ns = cb.compute_ns,
                            .h2d_ns = cb.queue_ns[ZT_COPY_H2D],
                            .d2h_ns = cb.queue_ns[ZT_COPY_D2H],
                            .adam_ns = ps.busy_ns,
                            .adam_threads = s->adam_threads,
                            .nvme_ns = ns.busy_ns,
                            .wait_copy_ns = cb.wait_ns,
                            .wait_adam_ns = ps.wait_ns,
                            .wait_nvme_ns = ns.wait_ns,
                            .act_bytes = s->act_bytes,
                            .arena_budget = s->arena_budget,
                            .arena_peak = ss.device_peak,
                            .host_bytes = s->host_bytes,
                            .host_used = hs.used,
                            .host_pinned = hs.pinned_bytes,
                            .nvme_bytes_read = ns.bytes_read,
                            .nvme_bytes_written = ns.bytes_written,
                            .fetches = ss.fetches,
                            .evictions = ss.evictions,
                            .grad_writebacks = ss.grad_writebacks,
                            .bytes_h2d = ss.bytes_h2d,
                            .bytes_d2h = ss.bytes_d2h,
                            .adam_units = s->adam_units,
                            .adam_overlapped = s->adam_overlapped,
                            .adam_landed = s->adam_landed};
  return 0;
}
