/* defines: what both layouts share (internal.h): the trainer's state a piece at a time,
 * trainer.json's fields, the model check of a load; the host memory a checkpoint takes
 * (zt_trainer_checkpoint_bytes, zt_checkpoint_estimate_bytes*: job admission) and
 * zt_trainer_get_state (the tests).
 *
 * The state moves in pieces: runs of whole units of at most the largest unit's parameters, in
 * unit order. A save reads a piece from the trainer (its backend, or its step path's tiers)
 * into one staging of parameters, m and v and writes it at its tensors' places in the files,
 * whose headers were written first from the model's tensor list; a load reads a piece from the
 * files into the staging and writes it into the trainer. So a checkpoint takes
 * zt_trainer_checkpoint_bytes of host memory, not the flat state (12 bytes a parameter). */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "engine/model/safetensors.h"
#include "engine/train/config.h"
#include "engine/train/checkpoint/internal.h"
#include "engine/train/dp/dp.h"

/* What building a file's header takes per tensor of it, at most: the entries, the names and
 * jansson's tree of the header (about 1.2 KB measured, test_ckpt_memory); an allowance for
 * zt_trainer_checkpoint_bytes, not a count. */
#define HEADER_BYTES_PER_TENSOR 2048

static size_t unit_end(const zt_model *m, int u) {
  const zt_unit_info *ui = zt_model_unit(m, u);
  return ui->offset + ui->numel;
}

/* the staging, the reader's chunk, the headers of both files (3 entries a model tensor) */
static size_t flat_bytes(const zt_model *m) {
  return 3 * zt__trainer_piece_cap(m) * sizeof(float) + ZT_ST_CHUNK_BYTES +
         3 * (size_t)zt_model_num_tensors(m) * HEADER_BYTES_PER_TENSOR;
}

/* A per-rank checkpoint's files in parallel: every rank its staging of a chunk of each tensor,
 * a reader's chunk and its file's header (3 entries a unit), and the manifest's tree (an entry
 * a unit and a rank, and the configuration). */
static size_t rank_bytes(const zt_model *m, const zt_shard_table *tab) {
  size_t nu = (size_t)zt_model_num_units(m), W = (size_t)tab->world;
  return W * (3 * tab->max_chunk * sizeof(float) + ZT_ST_CHUNK_BYTES +
              3 * nu * HEADER_BYTES_PER_TENSOR) +
         (nu + W + 16) * HEADER_BYTES_PER_TENSOR;
}

/* Of a trainer of model m, with the shard table of its per-rank checkpoints (NULL: flat ones):
 * a per-rank save writes model.safetensors the flat way first, then the ranks' files. */
static size_t checkpoint_bytes(const zt_model *m, const zt_shard_table *tab) {
  size_t flat = flat_bytes(m), ranks = tab ? rank_bytes(m, tab) : 0;
  return ranks > flat ? ranks : flat;
}

size_t zt_trainer_checkpoint_bytes(const zt_trainer *t) {
  return checkpoint_bytes(t->model,
                          t->path && t->path->shards ? t->path->shards(t, NULL, NULL) : NULL);
}

/* world 0: a trainer of flat checkpoints; else one that runs every rank of that world. */
static size_t estimate(const zt_model_cfg *mc, int world) {
  char err[256];
  zt_model *m = NULL;
  zt_shard_table *tab = NULL;
  size_t bytes = SIZE_MAX;
  if (zt_model_create(&m, mc, err, sizeof err) == 0 &&
      (world == 0 || zt__trainer_shard_table(m, world, &tab) == 0))
    bytes = checkpoint_bytes(m, tab);
  zt_shard_table_free(tab);
  zt_model_destroy(m);
  return bytes;
}

size_t zt_checkpoint_estimate_bytes(const zt_model_cfg *mc) { return estimate(mc, 0); }

size_t zt_checkpoint_estimate_bytes_dp(const zt_model_cfg *mc, int world) {
  return world >= 1 && world <= ZT_DP_MAX_WORLD ? estimate(mc, world) : SIZE_MAX;
}

/* Units [u0, u1) of the state out of the trainer into buffers of that range (any NULL): the
 * step path's, or the backend's buffers. */
static int state_read(zt_trainer *t, int u0, int u1, float *p, float *m, float *v, char *err,
                      size_t errlen) {
  if (t->path) return t->path->read_state(t, u0, u1, p, m, v, err, errlen);
  const zt_ops *o = t->be.ops;
  size_t off = zt_model_unit(t->model, u0)->offset, n = unit_end(t->model, u1 - 1) - off;
  float *dst[3] = {p, m, v};
  const void *src[3] = {t->params, t->m, t->v};
  for (int k = 0; k < 3; k++) {
    if (!dst[k]) continue;
    if (k && t->tc.state_dtype == ZT_BF16) {
      /* widened on the backend into the gradients, free between steps (every step zeroes
       * them first) */
      o->cast(t->be.ctx, t->grads + off, ZT_F32, (const uint16_t *)src[k] + off, ZT_BF16, n);
      o->to_host(t->be.ctx, dst[k], t->grads + off, n * sizeof(float));
    } else {
      o->to_host(t->be.ctx, dst[k], (const float *)src[k] + off, n * sizeof(float));
    }
  }
  int rc = o->sync(t->be.ctx);
  if (rc < 0) snprintf(err, errlen, "backend %s: %s", o->name, o->error_text(t->be.ctx));
  return rc;
}

/* ... and into it, the compute copy following the parameters. */
static int state_write(zt_trainer *t, int u0, int u1, const float *p, const float *m,
                       const float *v, char *err, size_t errlen) {
  if (t->path) return t->path->write_state(t, u0, u1, p, m, v, err, errlen);
  const zt_ops *o = t->be.ops;
  size_t off = zt_model_unit(t->model, u0)->offset, n = unit_end(t->model, u1 - 1) - off;
  o->to_device(t->be.ctx, t->params + off, p, n * sizeof(float));
  if (t->tc.state_dtype == ZT_BF16) {
    /* narrowed on the backend from the gradients (as in state_read); exact for a bf16
     * checkpoint's values */
    o->to_device(t->be.ctx, t->grads + off, m, n * sizeof(float));
    o->cast(t->be.ctx, (uint16_t *)t->m + off, ZT_BF16, t->grads + off, ZT_F32, n);
    o->to_device(t->be.ctx, t->grads + off, v, n * sizeof(float));
    o->cast(t->be.ctx, (uint16_t *)t->v + off, ZT_BF16, t->grads + off, ZT_F32, n);
  } else {
    o->to_device(t->be.ctx, (float *)t->m + off, m, n * sizeof(float));
    o->to_device(t->be.ctx, (float *)t->v + off, v, n * sizeof(float));
  }
  if (t->params_lp)
    o->cast(t->be.ctx, (char *)t->params_lp + off * zt_dtype_size(t->tc.precision),
            t->tc.precision, t->params + off, ZT_F32, n);
  int rc = o->sync(t->be.ctx);
  if (rc < 0) snprintf(err, errlen, "backend %s: %s", o->name, o->error_text(t->be.ctx));
  return rc;
}

void zt__ckpt_seq_end(zt_trainer *t, const state_seq *q, int rc) {
  if (rc < 0 && !q->failed && q->next < zt_model_num_units(t->model) && t->path &&
      t->path->abandon_state)
    t->path->abandon_state(t);
}

int zt__ckpt_write_json(const char *path, json_t *j, char *err, size_t errlen) {
  errno = 0;
  FILE *f = fopen(path, "w");
  int rc = 0;
  if (!f || json_dumpf(j, f, JSON_INDENT(2) | JSON_PRESERVE_ORDER) < 0 || fflush(f) != 0 ||
      fsync(fileno(f)) < 0)
    rc = errno ? -errno : -EIO;
  if (f && fclose(f) != 0 && rc == 0) rc = -errno;
  if (rc < 0) snprintf(err, errlen, "%s: %s", path, strerror(-rc));
  return rc;
}

/* trainer.json's fields after its format: the steps, the loss scaler, the configuration, the
 * newest evaluation's loss (the manifest holds them too). The loss scale is a power of two: a JSON real holds it exactly. */
json_t *zt__ckpt_state_json(const zt_trainer *t, json_t *head) {
  const zt_model_cfg *mc = zt_model_cfg_of(t->model);
  json_t *j = json_pack("{s:i, s:i, s:f, s:i, s:s, s:o, s:o}", "step", t->step, "adam_step",
                        t->adam_step, "loss_scale", (double)t->scaler.scale,
                        "loss_scale_good_steps", t->scaler.good_steps, "arch",
                        zt_arch_name(mc->arch), "model", zt_config_model_to_json(mc), "train",
                        zt_config_train_to_json(&t->tc));
  /* the newest evaluation of the state saved (zt_trainer_note_eval): a record, not state */
  if (j && t->eval_step > 0 && t->eval_step <= t->step && isfinite(t->eval_loss))
    json_object_set_new(j, "eval", json_pack("{s:i, s:f}", "step", t->eval_step, "loss",
                                             t->eval_loss));
  int bad = !j || !head || json_object_update(head, j) < 0;
  json_decref(j);
  if (bad) {
    json_decref(head);
    return NULL;
  }
  return head;
}

/* Piece [u0, u1) of the state out of the trainer into the staging (the step path's call to
 * follow for a failure, q), for a save into `where`. */
int zt__ckpt_piece_out(zt_trainer *t, const char *where, int u0, int u1, float *p, float *m,
                       float *v, state_seq *q, char *err, size_t errlen) {
  char why[512] = "";
  int rc = state_read(t, u0, u1, p, m, v, why, sizeof why);
  if (rc < 0) {
    q->failed = 1;
    snprintf(err, errlen, "%s: reading the trainer's %s failed: %s", where,
             m ? "state" : "parameters", why[0] ? why : strerror(-rc));
  } else {
    q->next = u1;
  }
  return rc;
}

/* ... and into it from the staging, for a load of the checkpoint dir. */
int zt__ckpt_piece_in(zt_trainer *t, const char *dir, int u0, int u1, const float *p,
                      const float *m, const float *v, state_seq *q, char *err, size_t errlen) {
  char why[512] = "";
  int rc = state_write(t, u0, u1, p, m, v, why, sizeof why);
  if (rc < 0) {
    q->failed = 1;
    snprintf(err, errlen, "%s: writing the state into the trainer failed: %s", dir,
             why[0] ? why : strerror(-rc));
  } else {
    q->next = u1;
  }
  return rc;
}

/* The checkpoint's model must be this trainer's model, field by field. */
static int check_model(const zt_model *m, const json_t *jm, const char *path, char *err,
                       size_t errlen) {
  zt_model_cfg c;
  zt_model *saved = NULL;
  /* only the dimensions are compared: the init (named init_seed / init_path by checkpoints
   * written before the job spec's vocabulary, init since) is not read */
  json_t *dims = json_is_object(jm) ? json_deep_copy(jm) : NULL;
  if (dims) {
    json_object_del(dims, "init");
    json_object_del(dims, "init_seed");
    json_object_del(dims, "init_path");
  }
  int rc = zt_config_model_from_json(dims, &c, err, errlen);
  json_decref(dims);
  if (rc < 0 || (rc = zt_model_create(&saved, &c, err, errlen)) < 0) {
    char why[256];
    snprintf(why, sizeof why, "%s", err);
    snprintf(err, errlen, "%s: %s", path, why);
    return rc;
  }
  const zt_model_cfg *h = zt_model_cfg_of(m);
  /* the numbers, then (differs: 1) what is compared bit for bit */
  const struct {
    const char *name;
    long long a, b;
  } f[] = {{"arch", c.arch, h->arch},         {"vocab", c.vocab, h->vocab},
           {"seq_len", c.seq_len, h->seq_len}, {"d_model", c.d_model, h->d_model},
           {"n_heads", c.n_heads, h->n_heads}, {"n_layers", c.n_layers, h->n_layers},
           {"d_ff", zt_model_d_ff(saved), zt_model_d_ff(m)},
           {"n_kv_heads", c.n_kv_heads, h->n_kv_heads},
           {"head_dim", c.head_dim, h->head_dim},
           {"tie_embeddings", c.tie_embeddings, h->tie_embeddings},
           {"qkv_bias", c.qkv_bias, h->qkv_bias},
           {"qk_norm", c.qk_norm, h->qk_norm},
           {"rope_scaling",
            memcmp(&c.rope_scaling, &h->rope_scaling, sizeof c.rope_scaling) != 0, 0},
           {"rms_eps", memcmp(&c.rms_eps, &h->rms_eps, sizeof c.rms_eps) != 0, 0},
           {"rope_theta", memcmp(&c.rope_theta, &h->rope_theta, sizeof c.rope_theta) != 0, 0}};
  const size_t numbers = 12;
  zt_model_destroy(saved);
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
    if (f[i].a != f[i].b) {
      if (i == 0)
        snprintf(err, errlen, "%s: checkpoint is a %s model, this job is %s", path,
                 zt_arch_name((zt_arch)f[i].a), zt_arch_name((zt_arch)f[i].b));
      else if (i < numbers)
        snprintf(err, errlen, "%s: checkpoint has model.%s %lld, this job has %lld", path,
                 f[i].name, f[i].a, f[i].b);
      else
        snprintf(err, errlen, "%s: checkpoint has another model.%s than this job", path,
                 f[i].name);
      return -EINVAL;
    }
  return 0;
}

/* trainer.json's fields (in the manifest too): the model this trainer's, the steps and the
 * scaler's state in range. "step" was checked by the caller with the format. */
int zt__ckpt_read_head(const zt_trainer *t, const json_t *j, const char *file, ckpt_head *h,
                       char *err, size_t errlen) {
  int rc = check_model(t->model, json_object_get(j, "model"), file, err, errlen);
  if (rc < 0) return rc;
  /* the moments are refused in the other type, not converted: a bf16 state widened is not
   * the fp32 run's, and narrowed it would be rounded once more than the run that made it
   * (absent: written before the field, fp32) */
  json_t *sd = json_object_get(json_object_get(json_object_get(j, "train"), "optimizer"),
                               "state_dtype");
  zt_dtype saved = ZT_F32;
  if (sd && (!json_is_string(sd) || zt_dtype_parse(json_string_value(sd), &saved) < 0 ||
             saved == ZT_F16)) {
    snprintf(err, errlen, "%s: train.optimizer.state_dtype is not \"fp32\" or \"bf16\"", file);
    return -EINVAL;
  }
  if (saved != t->tc.state_dtype) {
    snprintf(err, errlen, "%s: checkpoint has train.optimizer.state_dtype %s, this job has %s",
             file, zt_dtype_name(saved), zt_dtype_name(t->tc.state_dtype));
    return -EINVAL;
  }
  h->step = (int)json_integer_value(json_object_get(j, "step"));
  /* Absent in checkpoints of fp32-only versions: AdamW's step was the step, no scaler state. */
  json_t *adam_step = json_object_get(j, "adam_step"), *ls = json_object_get(j, "loss_scale");
  json_t *good = json_object_get(j, "loss_scale_good_steps");
  if ((adam_step && (!json_is_integer(adam_step) || json_integer_value(adam_step) < 0 ||
                     json_integer_value(adam_step) > h->step)) ||
      (ls && (!json_is_number(ls) || !(json_number_value(ls) > 0) ||
              !isfinite((float)json_number_value(ls)))) ||
      (good && (!json_is_integer(good) || json_integer_value(good) < 0 ||
                json_integer_value(good) >= t->scaler.growth_interval))) {
    snprintf(err, errlen, "%s: adam_step, loss_scale or loss_scale_good_steps out of range",
             file);
    return -EINVAL;
  }
  h->adam_step = adam_step ? (int)json_integer_value(adam_step) : h->step;
  h->scale = ls ? (float)json_number_value(ls) : 0;
  h->good = good ? (int)json_integer_value(good) : -1;
  /* a record only: one out of shape is dropped, not refused */
  json_t *ev = json_object_get(j, "eval"), *es = json_object_get(ev, "step");
  json_t *el = json_object_get(ev, "loss");
  int ok = json_is_integer(es) && json_integer_value(es) >= 1 &&
           json_integer_value(es) <= h->step && json_is_number(el);
  h->eval_step = ok ? (int)json_integer_value(es) : 0;
  h->eval_loss = ok ? json_number_value(el) : 0;
  return 0;
}

int zt__ckpt_step_in_range(const json_t *step) {
  return json_is_integer(step) && json_integer_value(step) >= 0 &&
         json_integer_value(step) <= (1 << 30);
}

int zt_trainer_get_state(zt_trainer *t, float *params, float *exp_avg, float *exp_avg_sq) {
  state_seq q = {0, 0, 0};
  char why[512];
  int rc = t->be.ops->sync(t->be.ctx);
  if (rc == 0) {
    /* the caller holds the whole flat layout: one piece */
    rc = state_read(t, 0, zt_model_num_units(t->model), params, exp_avg, exp_avg_sq, why,
                    sizeof why);
    q.failed = rc < 0;
  }
  zt__ckpt_seq_end(t, &q, rc);
  return rc;
}
