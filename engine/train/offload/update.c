/* A unit's update in the offloaded step: on the device by the backend's AdamW, on the host tier by
 * the CPU pool's, or from NVMe through two staging sets read ahead of the update and written
 * behind it. */
#include "engine/train/offload/internal.h"

#include <errno.h>
#include <string.h>

void zt__off_wait_unit_runs(off_state *s, int u) {
  for (int r = s->first_run[u]; r < s->first_run[u + 1]; r++)
    if (s->runs[r].submitted) {
      zt_cpu_pool_wait(s->pool, &s->tasks[r].job);
      s->runs[r].submitted = 0;
    }
}

static void run_task_chunk(void *arg, size_t begin, size_t end) {
  run_task *k = arg;
  size_t n = end - begin;
  if (k->src) memcpy(k->p + begin, k->src + begin, n * sizeof(float));
  zt_cpu_adam_run(k->isa, &k->h, k->p + begin, k->g + begin, k->m + begin, k->v + begin,
                  k->p_bf16 ? k->p_bf16 + begin : NULL, k->p_fp16 ? k->p_fp16 + begin : NULL, n);
  if (begin < k->out_n)
    memcpy(k->out + begin, k->p + begin, ((end < k->out_n ? end : k->out_n) - begin) * sizeof(float));
}

/* p, m, v: the unit's masters and moments (in the flat host buffers or a staging set); src: NULL,
 * or (delayed fp32) the current masters, which p receives before its update. */
static int submit_unit_adam(zt_trainer *t, int u, float *p, const float *src, float *m, float *v,
                            const zt_adam_hparams *hp) {
  off_state *s = t->path_state;
  size_t base = zt_model_unit(t->model, u)->offset;
  /* delayed: the compute copy and the stream copy go to the next buffers */
  uint16_t *lp = s->lp_nxt ? s->lp_nxt : s->lp;
  size_t pre = u < s->nh && s->scopy_nxt && u >= s->scopy0
                   ? s->scopy_off[u + 1] - s->scopy_off[u] : 0;
  if (hp->step < 1) return -EINVAL;
  for (int r = s->first_run[u]; r < s->first_run[u + 1]; r++) {
    adam_run *a = &s->runs[r];
    run_task *k = &s->tasks[r];
    size_t d = a->offset - base;
    *k = (run_task){.isa = zt_cpu_isa_best(), .h = *hp, .src = src ? src + d : NULL, .p = p + d,
                    .g = zt__off_grads_of(t, u) + d, .m = m + d, .v = v + d,
                    .p_bf16 = s->dt == ZT_BF16 ? lp + (a->offset - s->lo) : NULL,
                    .p_fp16 = s->dt == ZT_F16 ? lp + (a->offset - s->lo) : NULL};
    k->h.weight_decay = a->decay ? hp->weight_decay : 0.0f;
    if (d < pre) {
      k->out = s->scopy_nxt + s->scopy_off[u] + d;
      k->out_n = pre - d < a->n ? pre - d : a->n;
    }
    k->job = (zt_cpu_job){.fn = run_task_chunk, .arg = k, .n = a->n, .chunk = ZT_CPU_ADAM_CHUNK};
    int rc = zt_cpu_pool_submit(s->pool, &k->job);
    if (rc < 0) return rc;
    a->submitted = 1;
  }
  s->adam_units++;
  return 0;
}

/* Starts the reads (write 0) or writes of the set's unit; on a failure waits for those started. */
int zt__off_set_io(zt_trainer *t, opt_set *x, int write) {
  off_state *s = t->path_state;
  size_t bytes = zt_model_unit(t->model, x->unit)->numel * sizeof(float);
  for (int k = 0; k < KINDS; k++) {
    int ext = s->ext[KINDS * x->unit + k];
    int rc = write ? zt_nvme_write(s->nvme, ext, 0, x->buf[k], bytes)
                   : zt_nvme_read(s->nvme, ext, 0, x->buf[k], bytes);
    if (rc < 0) {
      while (k-- > 0) zt_nvme_wait(s->nvme, x->req[k]);
      return rc;
    }
    x->req[k] = rc;
  }
  return 0;
}

int zt__off_set_wait(off_state *s, opt_set *x) {
  int rc = 0;
  for (int k = 0; k < KINDS; k++) {
    int r = zt_nvme_wait(s->nvme, x->req[k]);
    if (r < 0 && rc == 0) rc = r;
  }
  return rc;
}

/* Back to FREE: a read finished, an update waited for and written behind, a write landed. */
static int set_retire(zt_trainer *t, opt_set *x) {
  off_state *s = t->path_state;
  int rc = 0;
  if (x->st == SET_READING) rc = zt__off_set_wait(s, x);
  if (x->st == SET_UPDATING) {
    zt__off_wait_unit_runs(s, x->unit);
    /* the host copy the streamer fetches from, when the parameters live on the host */
    size_t a = s->scopy ? s->scopy_off[x->unit] : 0, b = s->scopy ? s->scopy_off[x->unit + 1] : 0;
    if (b > a)
      memcpy((s->scopy_nxt ? s->scopy_nxt : s->scopy) + a, x->buf[K_MASTER], (b - a) * sizeof(float));
    if ((rc = zt__off_set_io(t, x, 1)) == 0) x->st = SET_WRITING;
  }
  if (x->st == SET_WRITING) rc = zt__off_set_wait(s, x);
  x->st = SET_FREE;
  x->unit = -1;
  return rc;
}

/* Starts reading unit u's master, m and v into its set, unless they are there or coming. */
int zt__off_opt_read(zt_trainer *t, int u) {
  off_state *s = t->path_state;
  opt_set *x = &s->sets[u & 1];
  if (x->unit == u) return 0;
  int rc = set_retire(t, x);
  if (rc < 0) return rc;
  x->unit = u;
  if ((rc = zt__off_set_io(t, x, 0)) < 0) {
    x->unit = -1;
    return rc;
  }
  x->st = SET_READING;
  return 0;
}

/* Starts unit u's AdamW: in place on the host tier; on NVMe from its set once read, then reads
 * the next unit's state ahead (the update of u and the write-behind of u + 1 run meanwhile). */
int zt__off_update_unit(zt_trainer *t, int u, const zt_adam_hparams *hp) {
  off_state *s = t->path_state;
  if (u < s->ng) {
    /* on the device, queued behind the backward; the compute copy rewritten in the same pass */
    const zt_ops *o = t->be.ops;
    size_t es = zt_dtype_size(s->dt);
    s->copy->ops->compute_mark(s->copy, 0);
    for (int r = s->first_run[u]; r < s->first_run[u + 1]; r++) {
      const adam_run *a = &s->runs[r];
      o->adamw_dt(t->be.ctx, s->d_master + a->offset, s->d_grad + a->offset, s->d_m + a->offset,
                  s->d_v + a->offset, a->n, hp->lr, hp->beta1, hp->beta2, hp->eps,
                  a->decay ? hp->weight_decay : 0.0f, hp->step, hp->grad_scale,
                  s->d_lp ? (char *)s->d_lp + a->offset * es : NULL, s->dt);
    }
    s->copy->ops->compute_mark(s->copy, 1);
    s->gpu_unit_updates++;
    return 0;
  }
  if (u < s->nh) {
    size_t o = zt_model_unit(t->model, u)->offset;
    float *p = zt__off_host_at(s, K_MASTER, o);
    const float *src = NULL;
    if (s->m_nxt) { /* delayed fp32: into the other masters, which the step does not read */
      src = p;
      p = s->m_nxt + (o - s->lo);
    }
    return submit_unit_adam(t, u, p, src, zt__off_host_at(s, K_M, o), zt__off_host_at(s, K_V, o),
                            hp);
  }
  opt_set *x = &s->sets[u & 1];
  int rc = zt__off_opt_read(t, u);
  if (rc == 0 && x->st == SET_READING && (rc = zt__off_set_wait(s, x)) < 0) {
    x->st = SET_FREE;
    x->unit = -1;
  }
  if (rc < 0) return rc;
  x->st = SET_UPDATING;
  if ((rc = submit_unit_adam(t, u, x->buf[K_MASTER], NULL, x->buf[K_M], x->buf[K_V], hp)) < 0)
    return rc;
  return u > s->nh ? zt__off_opt_read(t, u - 1) : 0;
}

/* Every update started has finished and, on NVMe, been written back. */
int zt__off_finish_updates(zt_trainer *t) {
  off_state *s = t->path_state;
  int rc = 0;
  for (int u = 0; u < s->nu; u++) zt__off_wait_unit_runs(s, u);
  for (int i = 0; s->nvme && i < 2; i++) {
    int r = set_retire(t, &s->sets[i]);
    if (r < 0 && rc == 0) rc = r;
  }
  return rc;
}
