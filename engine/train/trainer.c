/* The trainer: its open and close, the learning-rate schedule, and the plain strategy of the step
 * recipe (engine/train/step.h: every buffer on the backend), with AdamW in nanoGPT's two
 * parameter groups (decay for matrices and embeddings, none for biases and norms). */
#include "engine/train/trainer_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "engine/base/clock.h"
#include "engine/base/log.h"
#include "engine/base/tunables.h"
#include "engine/kernels/backend.h"
#include "engine/plan/dp_plan.h"
#include "offload/cpu_pool.h"

/* In double: warmup lr * s / warmup for s <= warmup; then lr (constant) or the cosine from lr to
 * min_lr over the remaining steps, min_lr + (lr - min_lr) (1 + cos(pi p)) / 2 with
 * p = (s - warmup) / (steps - warmup), p clamped to [0, 1] for steps past the end. */
float zt_train_lr(const zt_train_cfg *c, int step) {
  double lr = c->lr, min_lr = c->min_lr;
  if (c->warmup_steps > 0 && step <= c->warmup_steps) return (float)(lr * step / c->warmup_steps);
  if (c->schedule != ZT_SCHED_COSINE) return (float)lr;
  int span = c->steps - c->warmup_steps;
  if (span <= 0) return (float)min_lr;
  double p = (double)(step - c->warmup_steps) / span;
  p = p < 0 ? 0 : p > 1 ? 1 : p;
  return (float)(min_lr + 0.5 * (lr - min_lr) * (1.0 + cos(M_PI * p)));
}

void zt_trainer_close(zt_trainer *t) {
  if (!t) return;
  const zt_ops *o = t->be.ops;
  if (t->path) t->path->close(t);
  void *bufs[] = {t->params, t->grads, t->m, t->v};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (bufs[i]) o->free(t->be.ctx, bufs[i]);
  if (t->params_lp) o->free(t->be.ctx, t->params_lp);
  zt_acts_close(t->acts);
  zt_model_destroy(t->model);
  free(t->h_tok);
  free(t->h_tgt);
  free(t);
}

int zt_trainer_open(zt_trainer **out, const zt_model_cfg *mc, const zt_train_cfg *tc,
                    const zt_backend *be, char *err, size_t errlen) {
  int rc = 0, reserved = 0;
  float *host = NULL;
  uint64_t t_open = zt_now_ns();
  *out = NULL;
  if ((rc = zt_train_cfg_check(tc, err, errlen)) < 0) return rc;
  zt_trainer *t = calloc(1, sizeof *t);
  if (!t) {
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  t->tc = *tc;
  t->be = *be;
  zt_loss_scaler_init(&t->scaler);
  if ((rc = be->ops->set_allow_tf32(be->ctx, tc->tf32)) < 0) {
    if (rc == -ENOTSUP)
      snprintf(err, errlen, "train.tf32: the %s backend has no TF32 mode", be->ops->name);
    else
      snprintf(err, errlen, "backend %s: setting the matmul mode failed: %s", be->ops->name,
               be->ops->error_text(be->ctx));
    goto out;
  }
  if ((rc = zt_model_create(&t->model, mc, err, errlen)) < 0) goto out;
  /* The buffers below come from one block of their exact sum: one cudaMalloc per job. A size
   * the estimate refuses (SIZE_MAX) is left to the opens below to explain. */
  size_t need = zt_trainer_estimate_bytes(mc, tc, be->ops);
  if (need != SIZE_MAX && (rc = zt_backend_reserve(be, need)) < 0) {
    snprintf(err, errlen, "backend %s: cannot reserve %zu bytes for the job's buffers",
             be->ops->name, need);
    goto out;
  }
  reserved = need != SIZE_MAX;
  size_t n = zt_model_num_params(t->model), N = (size_t)tc->micro_batch * (size_t)mc->seq_len;
  size_t sd = zt_dtype_size(tc->state_dtype);
  t->params = be->ops->alloc(be->ctx, n * sizeof(float));
  t->grads = be->ops->alloc(be->ctx, n * sizeof(float));
  t->m = be->ops->alloc(be->ctx, n * sd);
  t->v = be->ops->alloc(be->ctx, n * sd);
  if (!t->params || !t->grads || !t->m || !t->v) {
    rc = -ENOMEM;
    snprintf(err, errlen, "backend %s: cannot allocate %zu bytes for parameters, gradients "
             "and AdamW state", be->ops->name, 2 * n * (sizeof(float) + sd));
    goto out;
  }
  if (tc->precision != ZT_F32 &&
      !(t->params_lp = be->ops->alloc(be->ctx, n * zt_dtype_size(tc->precision)))) {
    rc = -ENOMEM;
    snprintf(err, errlen, "backend %s: cannot allocate %zu bytes for the %s copy of the "
             "parameters", be->ops->name, n * zt_dtype_size(tc->precision),
             zt_dtype_name(tc->precision));
    goto out;
  }
  /* auto is the offload planner's; without offload it is none */
  if (t->tc.ckpt_every == ZT_CKPT_AUTO) t->tc.ckpt_every = 0;
  rc = zt_acts_open_dt(&t->acts, t->model, be, tc->micro_batch, t->tc.ckpt_every, tc->precision,
                       err, errlen);
  if (rc < 0) goto out;
  t->h_tok = malloc(N * sizeof *t->h_tok);
  t->h_tgt = malloc(N * sizeof *t->h_tgt);
  host = malloc(n * sizeof *host);
  if (!t->h_tok || !t->h_tgt || !host) {
    rc = -ENOMEM;
    snprintf(err, errlen, "out of memory");
    goto out;
  }
  /* where the time to a first step goes (docs/BENCHMARKS.md "Time to the first step") */
  uint64_t t_init = zt_now_ns();
  if ((rc = zt__trainer_init_params(t->model, host, err, errlen)) < 0) goto out;
  uint64_t t_copy = zt_now_ns();
  t_init = t_copy - t_init;
  be->ops->to_device(be->ctx, t->params, host, n * sizeof(float));
  if (t->params_lp) be->ops->cast(be->ctx, t->params_lp, tc->precision, t->params, ZT_F32, n);
  be->ops->zero(be->ctx, t->grads, n * sizeof(float));
  be->ops->zero(be->ctx, t->m, n * sd);
  be->ops->zero(be->ctx, t->v, n * sd);
  if ((rc = be->ops->sync(be->ctx)) < 0) {
    snprintf(err, errlen, "backend %s: initialising the parameters failed: %s", be->ops->name,
             be->ops->error_text(be->ctx));
    goto out;
  }
  ZT_LOGI("train", "open in %.2f s: initial weights in %.2f s, copied, cast and zeroed on the "
          "backend in %.2f s", (double)(zt_now_ns() - t_open) * 1e-9, (double)t_init * 1e-9,
          (double)(zt_now_ns() - t_copy) * 1e-9);
  *out = t;
  t = NULL;
out:
  if (reserved) zt_backend_reserve_end(be);
  free(host);
  zt_trainer_close(t);
  return rc;
}

size_t zt__trainer_piece_cap(const zt_model *m) {
  size_t cap = 0;
  for (int u = 0; u < zt_model_num_units(m); u++)
    if (zt_model_unit(m, u)->numel > cap) cap = zt_model_unit(m, u)->numel;
  return cap;
}

int zt__trainer_piece_end(const zt_model *m, int u0, size_t cap) {
  int u1 = u0 + 1;
  size_t base = zt_model_unit(m, u0)->offset;
  while (u1 < zt_model_num_units(m)) {
    const zt_unit_info *ui = zt_model_unit(m, u1);
    if (ui->offset + ui->numel - base > cap) break;
    u1++;
  }
  return u1;
}

void zt__trainer_piece_tensors(const zt_model *m, int u0, int u1, int *first, int *end) {
  const zt_unit_info *last = zt_model_unit(m, u1 - 1);
  *first = zt_model_unit(m, u0)->first_tensor;
  *end = last->first_tensor + last->n_tensors;
}

int zt__trainer_shard_table(const zt_model *m, int world, zt_shard_table **tab) {
  return zt_dp_plan_shard_table(m, world, tab);
}

int zt__trainer_init_open_threads(zt__trainer_init *in, const zt_model *m, int threads, char *err,
                                  size_t errlen) {
  static const char *const params[] = {""};
  const zt_model_cfg *mc = zt_model_cfg_of(m);
  /* a Hugging Face directory's shards, or one safetensors file */
  const char *path = mc->hf_dir[0] ? mc->hf_dir : mc->init_path;
  in->m = m;
  in->file = NULL;
  in->pool = NULL;
  in->zeros = mc->init_loaded;
  if (path[0] && !in->zeros)
    return zt_model_file_open(&in->file, m, path, params, 1, 0, err, errlen);
  /* Box-Muller costs ~40 ns an element: a 1.5 B model took a minute on one core before its first
   * step. The pool runs beside nothing yet (the job has not started), so every core. */
  if (threads <= 0) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    threads = cores > 0 ? (int)cores : 1;
  }
  if (threads == 1) return 0;
  int rc = zt_cpu_pool_open(&in->pool, threads, 0);
  if (rc < 0) snprintf(err, errlen, "starting %d threads for the random init failed: %s",
                       threads, strerror(-rc));
  return rc;
}

int zt__trainer_init_open(zt__trainer_init *in, const zt_model *m, char *err, size_t errlen) {
  return zt__trainer_init_open_threads(in, m, 0, err, errlen);
}

typedef struct init_slice {
  const zt_model *m;
  int first, end;
  float *dst;
} init_slice;

static void init_slice_run(void *arg, size_t begin, size_t end) {
  const init_slice *a = arg;
  zt_model_init_params_slice(a->m, a->first, a->end, a->dst, begin, end);
}

static void zero_slice_run(void *arg, size_t begin, size_t end) {
  const init_slice *a = arg;
  memset(a->dst + begin, 0, (end - begin) * sizeof *a->dst);
}

int zt__trainer_init_read(const zt__trainer_init *in, int u0, int u1, float *host, char *err,
                          size_t errlen) {
  int first, end;
  zt__trainer_piece_tensors(in->m, u0, u1, &first, &end);
  if (in->file) return zt_model_file_read(in->file, 0, first, end, host, err, errlen);
  if (!in->pool) {
    if (in->zeros) memset(host, 0, zt_model_range_numel(in->m, first, end) * sizeof *host);
    else zt_model_init_params_range(in->m, first, end, host);
    return 0;
  }
  init_slice a = {.m = in->m, .first = first, .end = end, .dst = host};
  zt_cpu_job job = {.fn = in->zeros ? zero_slice_run : init_slice_run, .arg = &a,
                    .n = zt_model_range_numel(in->m, first, end), .chunk = ZT_TUNE_INIT_CHUNK};
  int rc = zt_cpu_pool_submit(in->pool, &job);
  if (rc < 0) {
    snprintf(err, errlen, "the random init's threads refused the work: %s", strerror(-rc));
    return rc;
  }
  zt_cpu_pool_wait(in->pool, &job);
  return 0;
}

void zt__trainer_init_close(zt__trainer_init *in) {
  zt_model_file_close(in->file);
  zt_cpu_pool_close(in->pool);
  in->file = NULL;
  in->pool = NULL;
}

int zt__trainer_init_params(const zt_model *m, float *host, char *err, size_t errlen) {
  zt__trainer_init in;
  int rc = zt__trainer_init_open(&in, m, err, errlen);
  if (rc == 0) rc = zt__trainer_init_read(&in, 0, zt_model_num_units(m), host, err, errlen);
  zt__trainer_init_close(&in);
  return rc;
}

/* params and grads in fp32, m and v in the state type, and the compute copy in bf16/fp16 */
static size_t master_bytes(size_t n, const zt_train_cfg *tc) {
  return 2 * n * sizeof(float) + 2 * n * zt_dtype_size(tc->state_dtype) +
         (tc->precision != ZT_F32 ? n * zt_dtype_size(tc->precision) : 0);
}

size_t zt_trainer_estimate_bytes(const zt_model_cfg *mc, const zt_train_cfg *tc,
                                 const zt_ops *ops) {
  char err[256];
  zt_model *m = NULL;
  size_t bytes = SIZE_MAX;
  if (!ops || zt_train_cfg_check(tc, err, sizeof err) < 0 ||
      zt_model_create(&m, mc, err, sizeof err) < 0)
    goto out;
  size_t acts = zt_acts_size_dt(m, ops, tc->micro_batch,
                                tc->ckpt_every == ZT_CKPT_AUTO ? 0 : tc->ckpt_every, tc->precision);
  if (acts) bytes = master_bytes(zt_model_num_params(m), tc) + acts;
out:
  zt_model_destroy(m);
  return bytes;
}

const zt_model *zt_trainer_model(const zt_trainer *t) { return t->model; }
int zt_trainer_step_count(const zt_trainer *t) { return t->step; }

size_t zt_trainer_backend_bytes(const zt_trainer *t) {
  if (t->path) return t->path->backend_bytes(t);
  return master_bytes(zt_model_num_params(t->model), &t->tc) + zt_acts_bytes(t->acts);
}

size_t zt_trainer_micro_tokens(const zt_trainer *t) {
  return (size_t)t->tc.micro_batch * (size_t)(zt_model_cfg_of(t->model)->seq_len + 1);
}

/* AdamW over runs of consecutive tensors sharing a decay flag (the layout alternates, so a
 * run is rarely more than one matrix or a few vectors). */
static void adamw_all(zt_trainer *t, float lr, int step, float grad_scale) {
  const zt_ops *o = t->be.ops;
  const zt_train_cfg *c = &t->tc;
  int nt = zt_model_num_tensors(t->model);
  for (int i = 0; i < nt;) {
    const zt_tensor_info *a = zt_model_tensor(t->model, i);
    size_t off = a->offset, n = 0;
    int decay = a->decay;
    for (; i < nt && zt_model_tensor(t->model, i)->decay == decay; i++)
      n += zt_model_tensor(t->model, i)->numel;
    float wd = decay ? c->weight_decay : 0.0f;
    void *lp = t->params_lp ? (char *)t->params_lp + off * zt_dtype_size(c->precision) : NULL;
    /* the rounding bits of element off + i: the train seed, the step, its flat index */
    if (c->state_dtype == ZT_BF16)
      o->adamw_sr(t->be.ctx, t->params + off, t->grads + off, (uint16_t *)t->m + off,
                  (uint16_t *)t->v + off, n, lr, c->beta1, c->beta2, c->eps, wd, step,
                  grad_scale, lp, lp ? c->precision : ZT_F32, c->seed, off);
    else if (lp)
      o->adamw_dt(t->be.ctx, t->params + off, t->grads + off, (float *)t->m + off,
                  (float *)t->v + off, n, lr, c->beta1, c->beta2, c->eps, wd, step, grad_scale,
                  lp, c->precision);
    else
      o->adamw(t->be.ctx, t->params + off, t->grads + off, (float *)t->m + off,
               (float *)t->v + off, n, lr, c->beta1, c->beta2, c->eps, wd, step, grad_scale);
  }
}

/* ---- the plain strategy (engine/train/step.h): every buffer on the backend ---------------- */

typedef struct plain_step {
  zt_trainer *t;
  char *err;
  size_t errlen;
} plain_step;

static int plain_sync(plain_step *p, int step) {
  const zt_ops *o = p->t->be.ops;
  int rc = o->sync(p->t->be.ctx);
  if (rc < 0)
    snprintf(p->err, p->errlen, "backend %s failed during step %d: %s", o->name, step,
             o->error_text(p->t->be.ctx));
  return rc;
}

static int plain_begin(void *ctx, zt__step_walk *w) {
  zt_trainer *t = ((plain_step *)ctx)->t;
  (void)w;
  t->be.ops->zero(t->be.ctx, t->grads, zt_model_num_params(t->model) * sizeof(float));
  return 0;
}

static int plain_forward(void *ctx, const zt__step_walk *w, const zt__step_micro *mb) {
  zt_trainer *t = ((plain_step *)ctx)->t;
  (void)w;
  (void)mb;
  zt_model_forward_dt(t->model, t->acts, t->params, t->params_lp ? t->params_lp : t->params);
  return 0;
}

static int plain_backward(void *ctx, const zt__step_walk *w, const zt__step_micro *mb) {
  zt_trainer *t = ((plain_step *)ctx)->t;
  (void)w;
  (void)mb;
  zt_model_backward_dt(t->model, t->acts, t->params, t->params_lp ? t->params_lp : t->params,
                       t->grads);
  return 0;
}

static int plain_norm(void *ctx, const zt__step_walk *w, zt__step_norm *n) {
  zt_trainer *t = ((plain_step *)ctx)->t;
  (void)w;
  n->sumsq = t->be.ops->sum_squares(t->be.ctx, t->grads, zt_model_num_params(t->model),
                                    &n->nonfinite);
  return 0;
}

/* fp16's skip: the work queued so far finished (a non-finite step without fp16 is refused) */
static int plain_nonfinite(void *ctx, const zt__step_walk *w, const zt__step_norm *n) {
  (void)n;
  return w->a->fp16 ? plain_sync(ctx, w->a->step) : 0;
}

static int plain_update(void *ctx, const zt__step_walk *w, float grad_scale) {
  adamw_all(((plain_step *)ctx)->t, w->a->lr, w->a->adam_step, grad_scale);
  return plain_sync(ctx, w->a->step);
}

static const zt__step_hooks plain_hooks = {
    .begin = plain_begin, .forward = plain_forward, .backward = plain_backward,
    .norm = plain_norm, .nonfinite = plain_nonfinite, .update = plain_update};

int zt_trainer_step(zt_trainer *t, const int32_t *tokens, zt_step_result *res, char *err,
                    size_t errlen) {
  zt_batch b = {.tokens = tokens};
  return zt_trainer_step_batch(t, &b, res, err, errlen);
}

int zt_trainer_step_batch(zt_trainer *t, const zt_batch *tokens, zt_step_result *res, char *err,
                          size_t errlen) {
  if (t->part_loaded) {
    snprintf(err, errlen, "step %d: a checkpoint load failed after writing part of the state; "
             "load a checkpoint to continue", t->step + 1);
    return -EIO;
  }
  if (t->path) return t->path->step(t, tokens, res, err, errlen);
  plain_step p = {.t = t, .err = err, .errlen = errlen};
  return zt__step(t, &plain_hooks, &p, 1, tokens, res, err, errlen);
}

static int plain_eval(void *ctx, int counted, char *err, size_t errlen) {
  zt_trainer *t = ctx;
  (void)counted;
  (void)err;
  (void)errlen;
  zt_model_eval_dt(t->model, t->acts, t->params, t->params_lp ? t->params_lp : t->params);
  return 0;
}

int zt_trainer_eval_batch(zt_trainer *t, const zt_batch *b, double *loss_sum, int64_t *counted,
                          char *err, size_t errlen) {
  if (t->part_loaded) {
    snprintf(err, errlen, "evaluation after step %d: a checkpoint load failed after writing "
             "part of the state; load a checkpoint to continue", t->step);
    return -EIO;
  }
  if (t->path) return t->path->eval(t, b, loss_sum, counted, err, errlen);
  return zt__step_eval(t, plain_eval, t, t->tc.grad_accum, b, loss_sum, counted, err, errlen);
}

void zt_trainer_note_eval(zt_trainer *t, int step, double loss) {
  t->eval_step = step;
  t->eval_loss = loss;
}
