/* A unit's update in the offloaded step: on the device by the backend's AdamW, on the host tier by
 * the CPU pool's, or from NVMe through the optimizer-state store's staging, read ahead of the
 * update and written behind it (offload/opt_store.h). */
#include "engine/train/offload/internal.h"

#include <string.h>

/* p, m, v: the unit's masters and moments (in the flat host buffers or a staging set); src: NULL,
 * or (delayed fp32) the current masters, which p receives before its update. */
static int submit_unit_adam(zt_trainer *t, int u, float *p, const float *src, void *m, void *v,
                            const zt_adam_hparams *hp) {
  off_state *s = t->path_state;
  size_t base = zt_model_unit(t->model, u)->offset;
  /* delayed: the compute copy and the stream copy go to the next buffers */
  uint16_t *lp = s->lp_nxt ? s->lp_nxt : s->lp;
  size_t pre = u < s->nh && s->scopy_nxt && u >= s->scopy0
                   ? s->scopy_off[u + 1] - s->scopy_off[u] : 0;
  zt_opt_io io = {.p = p, .src = src, .m = m, .v = v, .g = zt__off_grads_of(t, u),
                  .index0 = base, .lp = lp ? lp + (base - s->lo) : NULL,
                  .out = pre ? s->scopy_nxt + s->scopy_off[u] : NULL, .out_n = pre};
  int rc = zt_opt_store_submit(s->opt, u, &io, hp);
  if (rc == 0) s->adam_units++;
  return rc;
}

int zt__off_opt_updated(void *ctx, int u, const zt_opt_set *set) {
  off_state *s = ((zt_trainer *)ctx)->path_state;
  /* the host copy the streamer fetches from, when the parameters live on the host */
  size_t a = s->scopy ? s->scopy_off[u] : 0, b = s->scopy ? s->scopy_off[u + 1] : 0;
  if (b > a)
    memcpy((s->scopy_nxt ? s->scopy_nxt : s->scopy) + a, set->buf[ZT_OPT_MASTER],
           (b - a) * sizeof(float));
  return 0;
}

/* Starts unit u's AdamW: in place on the host tier; on NVMe from its set once read, then reads
 * the next unit's state ahead (the update of u and the write-behind of u + 1 run meanwhile). */
int zt__off_update_unit(zt_trainer *t, int u, const zt_adam_hparams *hp) {
  off_state *s = t->path_state;
  if (u < s->ng) {
    /* on the device, queued behind the backward; the compute copy rewritten in the same pass;
     * bf16 moments rounded with the bits of their flat index, as without offload */
    const zt_ops *o = t->be.ops;
    size_t es = zt_dtype_size(s->dt);
    s->copy->ops->compute_mark(s->copy, 0);
    size_t base = zt_model_unit(t->model, u)->offset;
    for (int r = s->first_run[u]; r < s->first_run[u + 1]; r++) {
      const zt_opt_run *a = &s->runs[r];
      size_t o0 = base + a->offset;
      float wd = a->decay ? hp->weight_decay : 0.0f;
      void *lp = s->d_lp ? (char *)s->d_lp + o0 * es : NULL;
      if (s->sd == ZT_BF16)
        o->adamw_sr(t->be.ctx, s->d_master + o0, s->d_grad + o0, (uint16_t *)s->d_m + o0,
                    (uint16_t *)s->d_v + o0, a->n, hp->lr, hp->beta1, hp->beta2, hp->eps, wd,
                    hp->step, hp->grad_scale, lp, lp ? s->dt : ZT_F32, hp->seed, o0);
      else
        o->adamw_dt(t->be.ctx, s->d_master + o0, s->d_grad + o0, (float *)s->d_m + o0,
                    (float *)s->d_v + o0, a->n, hp->lr, hp->beta1, hp->beta2, hp->eps, wd,
                    hp->step, hp->grad_scale, lp, s->dt);
    }
    s->copy->ops->compute_mark(s->copy, 1);
    s->gpu_unit_updates++;
    return 0;
  }
  if (u < s->nh) {
    size_t o = zt_model_unit(t->model, u)->offset;
    float *p = zt__off_host_at(s, ZT_OPT_MASTER, o);
    const float *src = NULL;
    if (s->m_nxt) { /* delayed fp32: into the other masters, which the step does not read */
      src = p;
      p = s->m_nxt + (o - s->lo);
    }
    return submit_unit_adam(t, u, p, src, zt__off_host_at(s, ZT_OPT_M, o),
                            zt__off_host_at(s, ZT_OPT_V, o), hp);
  }
  zt_opt_set x;
  int rc = zt_opt_store_stage(s->opt, u, &x);
  if (rc < 0) return rc;
  if ((rc = submit_unit_adam(t, u, x.buf[ZT_OPT_MASTER], NULL, x.buf[ZT_OPT_M], x.buf[ZT_OPT_V],
                             hp)) < 0)
    return rc;
  return u > s->nh ? zt_opt_store_read(s->opt, u - 1) : 0;
}

int zt__off_land(zt_trainer *t) {
  off_state *s = t->path_state;
  if (!s->landing) return 0;
  s->landing = 0;
  int rc = zt_opt_store_finish(s->opt);
  if (rc < 0) s->broken = 1;
  return rc;
}
