/* The model, train and offload objects of a job spec <-> their structs (config.h). */
#include "engine/train/config.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "engine/base/json_field.h"
#include "engine/model/hf.h"

static const char *const k_model[] = {
    "arch",       "vocab",      "seq_len",  "d_model",        "n_heads",  "n_layers",
    "d_ff",       "init",       "n_kv_heads", "head_dim",     "rms_eps",  "rope_theta",
    "rope_scaling", "tie_embeddings", "qkv_bias", "qk_norm",  "hf",       NULL};
static const char *const k_init[] = {"seed", "safetensors", "job", NULL};
static const char *const k_rope[] = {"type", "factor", "low_freq_factor", "high_freq_factor",
                                     "original_max_position_embeddings", NULL};
static const char *const k_train[] = {"steps",     "epochs",      "micro_batch", "grad_accum",
                                      "batch_tokens", "precision", "tf32",       "optimizer",
                                      "schedule",  "grad_clip",   "seed",
                                      "activation_checkpointing", NULL};
static const char *const k_act_ckpt[] = {"every", NULL};
static const char *const k_opt[] = {"name", "lr", "betas", "eps", "weight_decay", "state_dtype",
                                    NULL};
static const char *const k_sched[] = {"name", "warmup_steps", "min_lr", NULL};
static const char *const k_offload[] = {"params",      "grads",       "optimizer",  "gpu_budget",
                                        "host_budget", "nvme_budget", "prefetch",   "gpu_units",
                                        "host_units",  "grad_slots",  "delayed_update",
                                        "nvme_dir",    "order",       NULL};

/* "model": {"hf": "/abs/dir", "seq_len": N}: the rest comes from the directory's config.json,
 * read here with read 1; with read 0 c gets the directory and seq_len only (hf_type ZT_HF_NONE:
 * not read yet) for zt_config_model_read_hf. */
static int model_from_hf(const json_t *m, int read, zt_model_cfg *c, char *err, size_t errlen) {
  const char *key;
  json_t *v;
  char dir[ZT_PATH_MAX];
  int seq_len, rc;
  json_object_foreach((json_t *)m, key, v) if (strcmp(key, "hf") && strcmp(key, "seq_len")) {
    snprintf(err, errlen, "model.%s: not with model.hf (the directory's config.json gives the "
             "model, its weights the init)", key);
    return -EINVAL;
  }
  if ((rc = zt_json_get_abs_path(m, "model", "hf", dir, sizeof dir, err, errlen)) < 0 ||
      (rc = zt_json_get_int32(m, "model", "seq_len", 1, 1, ZT_MODEL_MAX_SEQ, 0, &seq_len, err,
                              errlen)) < 0)
    return rc;
  if (read) return zt_hf_config_read(dir, seq_len, c, err, errlen);
  if (strlen(dir) >= sizeof c->hf_dir) {
    snprintf(err, errlen, "model.hf is longer than %zu bytes", sizeof c->hf_dir - 1);
    return -EINVAL;
  }
  snprintf(c->hf_dir, sizeof c->hf_dir, "%s", dir);
  c->seq_len = seq_len;
  return 0;
}

int zt_config_model_read_hf(zt_model_cfg *c, char *err, size_t errlen) {
  if (!c->hf_dir[0] || c->hf_type != ZT_HF_NONE) return 0;
  char dir[ZT_PATH_MAX];
  snprintf(dir, sizeof dir, "%s", c->hf_dir);
  return zt_hf_config_read(dir, c->seq_len, c, err, errlen);
}

static int rope_from_json(const json_t *r, zt_rope_scaling *s, char *err, size_t errlen) {
  static const char *const names[] = {"none", "linear", "llama3"};
  const char *type;
  int rc;
  if ((rc = zt_json_check_keys(r, "model.rope_scaling", k_rope, err, errlen)) < 0 ||
      (rc = zt_json_get_string(r, "model.rope_scaling", "type", NULL, &type, err, errlen)) < 0)
    return rc;
  size_t k = 0;
  while (k < 3 && strcmp(type, names[k])) k++;
  if (k == 3) {
    snprintf(err, errlen, "model.rope_scaling.type must be \"none\", \"linear\" or \"llama3\"");
    return -EINVAL;
  }
  s->type = (zt_rope_type)k;
  if ((rc = zt_json_get_num(r, "model.rope_scaling", "factor", 1, 0, 1e6, 0, 0.0f, &s->factor,
                            err, errlen)) < 0 ||
      (rc = zt_json_get_num(r, "model.rope_scaling", "low_freq_factor", 0, 1, 1e6, 0, 0.0f,
                            &s->low_freq_factor, err, errlen)) < 0 ||
      (rc = zt_json_get_num(r, "model.rope_scaling", "high_freq_factor", 0, 1, 1e6, 0, 0.0f,
                            &s->high_freq_factor, err, errlen)) < 0 ||
      (rc = zt_json_get_int32(r, "model.rope_scaling", "original_max_position_embeddings", 0, 1,
                              ZT_MODEL_MAX_SEQ, 0, &s->original_max_position_embeddings, err,
                              errlen)) < 0)
    return rc;
  if (s->type != ZT_ROPE_NONE && !json_object_get(r, "factor")) {
    snprintf(err, errlen, "model.rope_scaling.factor is required with type %s", type);
    return -EINVAL;
  }
  return 0;
}

/* The llama fields; defaults rms_eps 1e-5, rope_theta 10000, the rest off (docs/spec.md);
 * refused by name on another arch. */
static int llama_from_json(const json_t *m, zt_model_cfg *c, char *err, size_t errlen) {
  static const char *const only[] = {"n_kv_heads", "head_dim", "rms_eps", "rope_theta",
                                     "rope_scaling", "tie_embeddings", "qkv_bias", "qk_norm"};
  int rc, llama = c->arch == ZT_ARCH_LLAMA;
  const json_t *rope;
  for (size_t i = 0; !llama && i < sizeof only / sizeof only[0]; i++)
    if (json_object_get(m, only[i])) {
      snprintf(err, errlen, "model.%s applies to arch llama only (this model is %s)", only[i],
               zt_arch_name(c->arch));
      return -EINVAL;
    }
  if ((rc = zt_json_get_int32(m, "model", "n_kv_heads", 0, 0, ZT_MODEL_MAX_DMODEL, 0,
                              &c->n_kv_heads, err, errlen)) < 0 ||
      (rc = zt_json_get_int32(m, "model", "head_dim", 0, 0, ZT_MODEL_MAX_HEAD_DIM, 0,
                              &c->head_dim, err, errlen)) < 0 ||
      (rc = zt_json_get_num(m, "model", "rms_eps", 0, 1, 1, 0, llama ? 1e-5f : 0.0f, &c->rms_eps,
                            err, errlen)) < 0 ||
      (rc = zt_json_get_num(m, "model", "rope_theta", 0, 1, ZT_MODEL_MAX_ROPE_THETA, 0,
                            llama ? 10000.0f : 0.0f, &c->rope_theta, err, errlen)) < 0 ||
      (rc = zt_json_get_bool(m, "model", "tie_embeddings", 0, &c->tie_embeddings, err,
                             errlen)) < 0 ||
      (rc = zt_json_get_bool(m, "model", "qkv_bias", 0, &c->qkv_bias, err, errlen)) < 0 ||
      (rc = zt_json_get_bool(m, "model", "qk_norm", 0, &c->qk_norm, err, errlen)) < 0 ||
      (rc = zt_json_get_object(m, "model", "rope_scaling", 0, &rope, err, errlen)) < 0)
    return rc;
  return rope ? rope_from_json(rope, &c->rope_scaling, err, errlen) : 0;
}

static int model_from_json(const json_t *m, int read, zt_model_cfg *c, char *err, size_t errlen) {
  int rc;
  const char *arch;
  const json_t *init;
  memset(c, 0, sizeof *c);
  if (!json_is_object(m)) {
    snprintf(err, errlen, "model must be an object");
    return -EINVAL;
  }
  if ((rc = zt_json_check_keys(m, "model", k_model, err, errlen)) < 0) return rc;
  if (json_object_get(m, "hf")) return model_from_hf(m, read, c, err, errlen);
  if ((rc = zt_json_get_string(m, "model", "arch", NULL, &arch, err, errlen)) < 0) return rc;
  if (zt_arch_parse(arch, &c->arch) < 0) {
    snprintf(err, errlen, "model.arch must be \"gpt\", \"encoder\" or \"llama\", not \"%.64s\"",
             arch);
    return -EINVAL;
  }
  if ((rc = zt_json_get_int32(m, "model", "vocab", 1, 1, ZT_MODEL_MAX_VOCAB, 0, &c->vocab, err,
                              errlen)) < 0 ||
      (rc = zt_json_get_int32(m, "model", "seq_len", 1, 1, ZT_MODEL_MAX_SEQ, 0, &c->seq_len, err,
                              errlen)) < 0 ||
      (rc = zt_json_get_int32(m, "model", "d_model", 1, 1, ZT_MODEL_MAX_DMODEL, 0, &c->d_model,
                              err, errlen)) < 0 ||
      (rc = zt_json_get_int32(m, "model", "n_heads", 1, 1, ZT_MODEL_MAX_DMODEL, 0, &c->n_heads,
                              err, errlen)) < 0 ||
      (rc = zt_json_get_int32(m, "model", "n_layers", 1, 1, ZT_MODEL_MAX_LAYERS, 0, &c->n_layers,
                              err, errlen)) < 0 ||
      (rc = zt_json_get_int32(m, "model", "d_ff", 0, 0, ZT_MODEL_MAX_DFF, 0, &c->d_ff, err,
                              errlen)) < 0 ||
      (rc = llama_from_json(m, c, err, errlen)) < 0)
    return rc;
  if ((rc = zt_json_get_object(m, "model", "init", 0, &init, err, errlen)) < 0) return rc;
  if (init) {
    if ((rc = zt_json_check_keys(init, "model.init", k_init, err, errlen)) < 0) return rc;
    int has_seed = json_object_get(init, "seed") != NULL;
    int has_file = json_object_get(init, "safetensors") != NULL;
    json_t *job = json_object_get(init, "job");
    if (has_seed + has_file + (job != NULL) != 1) {
      snprintf(err, errlen, "model.init takes exactly one of seed, safetensors or job");
      return -EINVAL;
    }
    const char *id = json_string_value(job);
    size_t idlen = id ? strlen(id) : 0;
    if (job && (!id || idlen < 2 || idlen >= sizeof c->init_job || id[0] != 'j' ||
                strspn(id + 1, "0123456789") != idlen - 1)) {
      snprintf(err, errlen, "model.init.job must be a job id such as \"j000004\"");
      return -EINVAL;
    }
    if (job) memcpy(c->init_job, id, idlen + 1);
    int64_t seed;
    if (has_seed && (rc = zt_json_get_int(init, "model.init", "seed", 1, 0, INT64_MAX, 0, &seed,
                                          err, errlen)) < 0)
      return rc;
    if (has_seed) c->init_seed = (uint64_t)seed;
    if (has_file && (rc = zt_json_get_abs_path(init, "model.init", "safetensors", c->init_path,
                                               sizeof c->init_path, err, errlen)) < 0)
      return rc;
  }
  return zt_model_cfg_check(c, err, errlen);
}

int zt_config_model_from_json(const json_t *m, zt_model_cfg *c, char *err, size_t errlen) {
  return model_from_json(m, 1, c, err, errlen);
}

int zt_config_model_from_json_unread(const json_t *m, zt_model_cfg *c, char *err,
                                     size_t errlen) {
  return model_from_json(m, 0, c, err, errlen);
}

json_t *zt_config_model_to_json(const zt_model_cfg *c) {
  if (c->hf_dir[0]) return json_pack("{s:s, s:i}", "hf", c->hf_dir, "seq_len", c->seq_len);
  json_t *init = c->init_job[0]    ? json_pack("{s:s}", "job", c->init_job)
                 : c->init_path[0] ? json_pack("{s:s}", "safetensors", c->init_path)
                                   : json_pack("{s:I}", "seed", (json_int_t)c->init_seed);
  json_t *o = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:o}", "arch", zt_arch_name(c->arch),
                        "vocab", c->vocab, "seq_len", c->seq_len, "d_model", c->d_model,
                        "n_heads", c->n_heads, "n_layers", c->n_layers, "d_ff", c->d_ff, "init",
                        init);
  if (!o || c->arch != ZT_ARCH_LLAMA) return o;
  static const char *const rope[] = {"none", "linear", "llama3"};
  const zt_rope_scaling *r = &c->rope_scaling;
  json_t *rs = json_pack("{s:s}", "type", rope[r->type]);
  if (rs && r->type != ZT_ROPE_NONE) json_object_set_new(rs, "factor", json_real(r->factor));
  if (rs && r->type == ZT_ROPE_LLAMA3 &&
      (json_object_set_new(rs, "low_freq_factor", json_real(r->low_freq_factor)) < 0 ||
       json_object_set_new(rs, "high_freq_factor", json_real(r->high_freq_factor)) < 0 ||
       json_object_set_new(rs, "original_max_position_embeddings",
                           json_integer(r->original_max_position_embeddings)) < 0)) {
    json_decref(rs);
    rs = NULL;
  }
  json_t *l = rs ? json_pack("{s:i, s:i, s:f, s:f, s:o, s:b, s:b, s:b}", "n_kv_heads",
                             c->n_kv_heads, "head_dim", c->head_dim, "rms_eps",
                             (double)c->rms_eps, "rope_theta", (double)c->rope_theta,
                             "rope_scaling", rs, "tie_embeddings", c->tie_embeddings,
                             "qkv_bias", c->qkv_bias, "qk_norm", c->qk_norm)
                 : NULL;
  if (!l || json_object_update(o, l) < 0) {
    json_decref(l);
    json_decref(o);
    return NULL;
  }
  json_decref(l);
  return o;
}

static int parse_optimizer(const json_t *opt, zt_train_cfg *c, char *err, size_t errlen) {
  const char *s;
  int rc;
  if ((rc = zt_json_check_keys(opt, "train.optimizer", k_opt, err, errlen)) < 0) return rc;
  if ((rc = zt_json_get_string(opt, "train.optimizer", "name", "adamw", &s, err, errlen)) < 0)
    return rc;
  if (strcmp(s, "adamw") != 0) {
    snprintf(err, errlen, "train.optimizer.name must be \"adamw\"");
    return -EINVAL;
  }
  if ((rc = zt_json_get_string(opt, "train.optimizer", "state_dtype", "fp32", &s, err,
                               errlen)) < 0)
    return rc;
  if (zt_dtype_parse(s, &c->state_dtype) < 0 || c->state_dtype == ZT_F16) {
    snprintf(err, errlen, "train.optimizer.state_dtype must be \"fp32\" or \"bf16\"");
    return -EINVAL;
  }
  if ((rc = zt_json_get_num(opt, "train.optimizer", "lr", 0, 1, ZT_TRAIN_MAX_LR, 0, c->lr, &c->lr,
                            err, errlen)) < 0 ||
      (rc = zt_json_get_num(opt, "train.optimizer", "eps", 0, 1, 1, 0, c->eps, &c->eps, err,
                            errlen)) < 0 ||
      (rc = zt_json_get_num(opt, "train.optimizer", "weight_decay", 0, 0, 1, 0, c->weight_decay,
                            &c->weight_decay, err, errlen)) < 0)
    return rc;
  const json_t *betas = json_object_get(opt, "betas");
  if (!betas) return 0;
  if (!json_is_array(betas) || json_array_size(betas) != 2) {
    snprintf(err, errlen, "train.optimizer.betas must be an array of two numbers");
    return -EINVAL;
  }
  if ((rc = zt_json_check_num(json_array_get(betas, 0), "train.optimizer.betas[0]", 0, 0, 1, 1,
                              &c->beta1, err, errlen)) < 0)
    return rc;
  return zt_json_check_num(json_array_get(betas, 1), "train.optimizer.betas[1]", 0, 0, 1, 1,
                           &c->beta2, err, errlen);
}

static int parse_schedule(const json_t *sched, zt_train_cfg *c, char *err, size_t errlen) {
  const char *s;
  int rc;
  if ((rc = zt_json_check_keys(sched, "train.schedule", k_sched, err, errlen)) < 0) return rc;
  if ((rc = zt_json_get_string(sched, "train.schedule", "name", "constant", &s, err, errlen)) < 0)
    return rc;
  if (strcmp(s, "constant") == 0) {
    c->schedule = ZT_SCHED_CONSTANT;
  } else if (strcmp(s, "cosine") == 0) {
    c->schedule = ZT_SCHED_COSINE;
  } else {
    snprintf(err, errlen, "train.schedule.name must be \"constant\" or \"cosine\"");
    return -EINVAL;
  }
  if ((rc = zt_json_get_int32(sched, "train.schedule", "warmup_steps", 0, 0, ZT_TRAIN_MAX_STEPS,
                              0, &c->warmup_steps, err, errlen)) < 0)
    return rc;
  return zt_json_get_num(sched, "train.schedule", "min_lr", 0, 0, ZT_TRAIN_MAX_LR, 0, 0.0f,
                         &c->min_lr, err, errlen);
}

/* train.micro_batch or train.grad_accum: an integer, or with train.batch_tokens "auto" or left
 * out (ZT_BATCH_AUTO: the planner picks them, engine/plan/batch.h). */
static int get_batch_dim(const json_t *t, const char *key, int dflt, zt_train_cfg *c, int *out,
                         char *err, size_t errlen) {
  const json_t *v = json_object_get(t, key);
  if (c->batch_tokens && (!v || (json_is_string(v) && !strcmp(json_string_value(v), "auto")))) {
    *out = ZT_BATCH_AUTO;
    return 0;
  }
  if (json_is_string(v)) {
    snprintf(err, errlen, "train.%s must be an integer in [1, %d]%s", key, ZT_TRAIN_MAX_BATCH,
             c->batch_tokens ? " or \"auto\"" : " (\"auto\" needs train.batch_tokens)");
    return -EINVAL;
  }
  return zt_json_get_int32(t, "train", key, dflt == 0, 1, ZT_TRAIN_MAX_BATCH, dflt, out, err,
                           errlen);
}

int zt_config_train_from_json(const json_t *t, zt_train_cfg *c, char *err, size_t errlen) {
  int rc;
  const char *s;
  const json_t *opt, *sched, *act;
  zt_train_cfg_defaults(c);
  if (!json_is_object(t)) {
    snprintf(err, errlen, "train must be an object");
    return -EINVAL;
  }
  if ((rc = zt_json_check_keys(t, "train", k_train, err, errlen)) < 0) return rc;
  /* epochs alone leave the steps to ztd's admission (they need the data file); with steps too
   * they are a stored spec's, the steps its admission resolved (a client's submit may not give
   * both: engine/job/admission.c) */
  if ((rc = zt_json_get_int32(t, "train", "epochs", 0, 1, ZT_TRAIN_MAX_EPOCHS, 0, &c->epochs,
                              err, errlen)) < 0)
    return rc;
  if (!c->epochs && !json_object_get(t, "steps")) {
    snprintf(err, errlen, "train.steps is required (or train.epochs: passes over a file "
             "source's data)");
    return -EINVAL;
  }
  if ((rc = zt_json_get_int32(t, "train", "steps", 0, 1, ZT_TRAIN_MAX_STEPS, 0, &c->steps, err,
                              errlen)) < 0 ||
      (rc = zt_json_get_int(t, "train", "batch_tokens", 0, 1, ZT_TRAIN_MAX_BATCH_TOKENS, 0,
                            &c->batch_tokens, err, errlen)) < 0 ||
      (rc = get_batch_dim(t, "micro_batch", 0, c, &c->micro_batch, err, errlen)) < 0 ||
      (rc = get_batch_dim(t, "grad_accum", 1, c, &c->grad_accum, err, errlen)) < 0)
    return rc;
  if ((rc = zt_json_get_string(t, "train", "precision", "fp32", &s, err, errlen)) < 0) return rc;
  if (zt_dtype_parse(s, &c->precision) < 0) {
    snprintf(err, errlen, "train.precision must be \"fp32\", \"bf16\" or \"fp16\"");
    return -EINVAL;
  }
  if ((rc = zt_json_get_bool(t, "train", "tf32", 0, &c->tf32, err, errlen)) < 0) return rc;
  if ((rc = zt_json_get_object(t, "train", "optimizer", 0, &opt, err, errlen)) < 0) return rc;
  if (opt && (rc = parse_optimizer(opt, c, err, errlen)) < 0) return rc;
  if ((rc = zt_json_get_object(t, "train", "schedule", 0, &sched, err, errlen)) < 0) return rc;
  if (sched && (rc = parse_schedule(sched, c, err, errlen)) < 0) return rc;
  if ((rc = zt_json_get_num(t, "train", "grad_clip", 0, 0, ZT_TRAIN_MAX_GRAD_CLIP, 0, 0.0f,
                            &c->grad_clip, err, errlen)) < 0)
    return rc;
  if ((rc = zt_json_get_object(t, "train", "activation_checkpointing", 0, &act, err, errlen)) < 0)
    return rc;
  if (act) {
    const json_t *every = json_object_get(act, "every");
    if ((rc = zt_json_check_keys(act, "train.activation_checkpointing", k_act_ckpt, err,
                                 errlen)) < 0)
      return rc;
    /* "auto": the offload planner's choice, or the least recompute that fits (engine/job) */
    if (json_is_string(every) && !strcmp(json_string_value(every), "auto")) {
      c->ckpt_every = ZT_CKPT_AUTO;
    } else if (json_is_string(every)) {
      snprintf(err, errlen, "train.activation_checkpointing.every must be a non-negative "
               "integer or \"auto\"");
      return -EINVAL;
    } else if ((rc = zt_json_get_int32(act, "train.activation_checkpointing", "every", 0, 0,
                                       ZT_TRAIN_MAX_CKPT_EVERY, 0, &c->ckpt_every, err,
                                       errlen)) < 0) {
      return rc;
    }
  }
  int64_t seed;
  if ((rc = zt_json_get_int(t, "train", "seed", 0, 0, INT64_MAX, 0, &seed, err, errlen)) < 0)
    return rc;
  c->seed = (uint64_t)seed;
  if (c->steps) return zt_train_cfg_check(c, err, errlen);
  /* the rest checked now; warmup_steps against the steps once they are resolved */
  zt_train_cfg any = *c;
  any.steps = ZT_TRAIN_MAX_STEPS;
  return zt_train_cfg_check(&any, err, errlen);
}

/* micro_batch or grad_accum as stored: "auto" only in a spec not yet planned (ztrain's) */
static json_t *batch_dim_json(int v) {
  return v == ZT_BATCH_AUTO ? json_string("auto") : json_integer(v);
}

json_t *zt_config_train_to_json(const zt_train_cfg *t) {
  json_t *j = json_pack(
      "{s:i, s:o, s:o, s:s, s:b, s:{s:s, s:f, s:[f, f], s:f, s:f}, s:{s:s, s:i, s:f}, s:f, "
      "s:I, s:{s:o}}",
      "steps", t->steps, "micro_batch", batch_dim_json(t->micro_batch), "grad_accum",
      batch_dim_json(t->grad_accum),
      "precision", zt_dtype_name(t->precision), "tf32", t->tf32,
      "optimizer", "name", "adamw", "lr", (double)t->lr, "betas", (double)t->beta1,
      (double)t->beta2, "eps", (double)t->eps, "weight_decay", (double)t->weight_decay,
      "schedule", "name", t->schedule == ZT_SCHED_COSINE ? "cosine" : "constant",
      "warmup_steps", t->warmup_steps, "min_lr", (double)t->min_lr,
      "grad_clip", (double)t->grad_clip, "seed", (json_int_t)t->seed,
      "activation_checkpointing", "every",
      t->ckpt_every == ZT_CKPT_AUTO ? json_string("auto") : json_integer(t->ckpt_every));
  json_t *opt = json_object_get(j, "optimizer");
  if (opt) json_object_set_new(opt, "state_dtype", json_string(zt_dtype_name(t->state_dtype)));
  if (j && t->batch_tokens)
    json_object_set_new(j, "batch_tokens", json_integer((json_int_t)t->batch_tokens));
  if (j && t->epochs) json_object_set_new(j, "epochs", json_integer(t->epochs));
  /* not resolved yet (a spec ztd has not admitted): the epochs alone */
  if (j && !t->steps) json_object_del(j, "steps");
  return j;
}

static int get_place(const json_t *o, const char *key, zt_offload_place *out, char *err,
                     size_t errlen) {
  const json_t *v = json_object_get(o, key);
  if (!v) return 0;
  if (!json_is_string(v) || zt_offload_place_parse(json_string_value(v), out) < 0) {
    snprintf(err, errlen, "offload.%s must be \"gpu\", \"host\", \"nvme\" or \"auto\"", key);
    return -EINVAL;
  }
  return 0;
}

static const char *const order_names[] = {"auto", "micro", "unit"};

static int get_order(const json_t *o, zt_offload_order *out, char *err, size_t errlen) {
  const json_t *v = json_object_get(o, "order");
  if (!v) return 0;
  for (int i = 0; json_is_string(v) && i <= ZT_ORDER_UNIT; i++)
    if (!strcmp(json_string_value(v), order_names[i])) {
      *out = (zt_offload_order)i;
      return 0;
    }
  snprintf(err, errlen, "offload.order must be \"micro\", \"unit\" or \"auto\"");
  return -EINVAL;
}

/* A count of units, slots or prefetches: -1 (dflt) when absent; the policy check bounds it. */
static int get_count(const json_t *o, const char *key, int dflt, int *out, char *err,
                     size_t errlen) {
  const json_t *v = json_object_get(o, key);
  if (!v) {
    *out = dflt;
    return 0;
  }
  if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1 << 20) {
    snprintf(err, errlen, "offload.%s must be an integer >= 0", key);
    return -EINVAL;
  }
  *out = (int)json_integer_value(v);
  return 0;
}

int zt_config_offload_from_json(const json_t *o, zt_offload_cfg *c, char *err, size_t errlen) {
  int rc;
  uint64_t gpu_budget, host_budget;
  zt_offload_cfg_defaults(c);
  if (!json_is_object(o)) {
    snprintf(err, errlen, "offload must be an object");
    return -EINVAL;
  }
  if ((rc = zt_json_check_keys(o, "offload", k_offload, err, errlen)) < 0 ||
      (rc = get_place(o, "params", &c->params, err, errlen)) < 0 ||
      (rc = get_place(o, "grads", &c->grads, err, errlen)) < 0 ||
      (rc = get_place(o, "optimizer", &c->optimizer, err, errlen)) < 0 ||
      (rc = get_order(o, &c->order, err, errlen)) < 0 ||
      (rc = zt_json_get_size(o, "offload", "gpu_budget", 0, &gpu_budget, err, errlen)) < 0 ||
      (rc = zt_json_get_size(o, "offload", "host_budget", 0, &host_budget, err, errlen)) < 0 ||
      (rc = zt_json_get_size(o, "offload", "nvme_budget", 0, &c->nvme_budget, err, errlen)) < 0 ||
      (rc = get_count(o, "prefetch", c->prefetch, &c->prefetch, err, errlen)) < 0 ||
      (rc = get_count(o, "grad_slots", 0, &c->grad_slots, err, errlen)) < 0 ||
      (rc = get_count(o, "gpu_units", -1, &c->gpu_units, err, errlen)) < 0 ||
      (rc = get_count(o, "host_units", -1, &c->host_units, err, errlen)) < 0 ||
      (rc = zt_json_get_bool(o, "offload", "delayed_update", 0, &c->delayed_update, err,
                             errlen)) < 0)
    return rc;
  c->gpu_budget = (size_t)gpu_budget;
  c->host_budget = (size_t)host_budget;
  if (json_object_get(o, "nvme_dir") &&
      (rc = zt_json_get_abs_path(o, "offload", "nvme_dir", c->nvme_dir, sizeof c->nvme_dir, err,
                                 errlen)) < 0)
    return rc;
  return zt_offload_cfg_check(c, err, errlen);
}

json_t *zt_config_offload_to_json(const zt_offload_cfg *o) {
  json_t *off = json_pack("{s:s, s:s, s:s, s:I, s:i}", "params", zt_offload_place_name(o->params),
                          "grads", zt_offload_place_name(o->grads), "optimizer",
                          zt_offload_place_name(o->optimizer), "gpu_budget",
                          (json_int_t)o->gpu_budget, "prefetch", o->prefetch);
  if (!off) return NULL;
  if (o->nvme_dir[0]) json_object_set_new(off, "nvme_dir", json_string(o->nvme_dir));
  if (o->gpu_units >= 0) json_object_set_new(off, "gpu_units", json_integer(o->gpu_units));
  if (o->host_units >= 0) json_object_set_new(off, "host_units", json_integer(o->host_units));
  if (o->host_budget)
    json_object_set_new(off, "host_budget", json_integer((json_int_t)o->host_budget));
  if (o->nvme_budget)
    json_object_set_new(off, "nvme_budget", json_integer((json_int_t)o->nvme_budget));
  if (o->grad_slots) json_object_set_new(off, "grad_slots", json_integer(o->grad_slots));
  if (o->delayed_update) json_object_set_new(off, "delayed_update", json_true());
  if (o->order) json_object_set_new(off, "order", json_string(order_names[o->order]));
  return off;
}
