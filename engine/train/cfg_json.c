/* Configuration structs <-> JSON, field by field, every error naming "model.x" / "train.x". */
#include "engine/train/cfg_json.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static int get_int(const json_t *o, const char *pre, const char *key, int *dst, char *err,
                   size_t errlen) {
  json_t *v = json_object_get(o, key);
  if (!v) return 0;
  if (!json_is_integer(v) || json_integer_value(v) < INT_MIN || json_integer_value(v) > INT_MAX) {
    snprintf(err, errlen, "%s.%s must be an integer", pre, key);
    return -EINVAL;
  }
  *dst = (int)json_integer_value(v);
  return 1;
}

static int get_u64(const json_t *o, const char *pre, const char *key, uint64_t *dst, char *err,
                   size_t errlen) {
  json_t *v = json_object_get(o, key);
  if (!v) return 0;
  if (!json_is_integer(v) || json_integer_value(v) < 0) {
    snprintf(err, errlen, "%s.%s must be a non-negative integer", pre, key);
    return -EINVAL;
  }
  *dst = (uint64_t)json_integer_value(v);
  return 1;
}

static int get_float(const json_t *o, const char *pre, const char *key, float *dst, char *err,
                     size_t errlen) {
  json_t *v = json_object_get(o, key);
  if (!v) return 0;
  if (!json_is_number(v) || !isfinite(json_number_value(v))) {
    snprintf(err, errlen, "%s.%s must be a number", pre, key);
    return -EINVAL;
  }
  *dst = (float)json_number_value(v);
  return 1;
}

static int only_keys(const json_t *o, const char *pre, const char *const *keys, char *err,
                     size_t errlen) {
  if (!json_is_object(o)) {
    snprintf(err, errlen, "%s must be an object", pre);
    return -EINVAL;
  }
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)o, k, v) {
    int known = 0;
    for (int i = 0; keys[i]; i++) known |= !strcmp(k, keys[i]);
    if (!known) {
      snprintf(err, errlen, "%s.%s is not a known field", pre, k);
      return -EINVAL;
    }
  }
  return 0;
}

int zt_model_cfg_from_json(const json_t *o, zt_model_cfg *c, char *err, size_t errlen) {
  static const char *const keys[] = {"arch", "vocab", "seq_len", "d_model", "n_heads", "n_layers",
                                     "d_ff", "init_seed", "init_path", NULL};
  static const char *const required[] = {"arch", "vocab", "seq_len", "d_model", "n_heads",
                                         "n_layers", NULL};
  int rc = only_keys(o, "model", keys, err, errlen);
  if (rc < 0) return rc;
  memset(c, 0, sizeof *c);
  for (int i = 0; required[i]; i++)
    if (!json_object_get(o, required[i])) {
      snprintf(err, errlen, "model.%s is required", required[i]);
      return -EINVAL;
    }
  const char *arch = json_string_value(json_object_get(o, "arch"));
  if (!arch || zt_arch_parse(arch, &c->arch) < 0) {
    snprintf(err, errlen, "model.arch must be gpt or encoder");
    return -EINVAL;
  }
  if ((rc = get_int(o, "model", "vocab", &c->vocab, err, errlen)) < 0 ||
      (rc = get_int(o, "model", "seq_len", &c->seq_len, err, errlen)) < 0 ||
      (rc = get_int(o, "model", "d_model", &c->d_model, err, errlen)) < 0 ||
      (rc = get_int(o, "model", "n_heads", &c->n_heads, err, errlen)) < 0 ||
      (rc = get_int(o, "model", "n_layers", &c->n_layers, err, errlen)) < 0 ||
      (rc = get_int(o, "model", "d_ff", &c->d_ff, err, errlen)) < 0 ||
      (rc = get_u64(o, "model", "init_seed", &c->init_seed, err, errlen)) < 0)
    return rc;
  json_t *ip = json_object_get(o, "init_path");
  if (ip) {
    if (!json_is_string(ip) || json_string_length(ip) >= sizeof c->init_path) {
      snprintf(err, errlen, "model.init_path must be a path of fewer than %d bytes", ZT_PATH_MAX);
      return -EINVAL;
    }
    memcpy(c->init_path, json_string_value(ip), json_string_length(ip) + 1);
  }
  return zt_model_cfg_check(c, err, errlen);
}

json_t *zt_model_cfg_to_json(const zt_model_cfg *c) {
  return json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:I, s:s}", "arch", zt_arch_name(c->arch),
                   "vocab", c->vocab, "seq_len", c->seq_len, "d_model", c->d_model, "n_heads",
                   c->n_heads, "n_layers", c->n_layers, "d_ff", c->d_ff, "init_seed",
                   (json_int_t)c->init_seed, "init_path", c->init_path);
}

const char *zt_schedule_name(zt_schedule s) {
  return s == ZT_SCHED_COSINE ? "cosine" : s == ZT_SCHED_CONSTANT ? "constant" : "unknown";
}

int zt_train_cfg_from_json(const json_t *o, zt_train_cfg *c, char *err, size_t errlen) {
  static const char *const keys[] = {"steps", "micro_batch", "grad_accum", "lr", "beta1", "beta2",
                                     "eps", "weight_decay", "schedule", "warmup_steps", "min_lr",
                                     "grad_clip", "seed", "activation_checkpointing",
                                     "precision", "tf32", NULL};
  int rc = only_keys(o, "train", keys, err, errlen);
  if (rc < 0) return rc;
  zt_train_cfg_defaults(c);
  if ((rc = get_int(o, "train", "steps", &c->steps, err, errlen)) < 0 ||
      (rc = get_int(o, "train", "micro_batch", &c->micro_batch, err, errlen)) < 0 ||
      (rc = get_int(o, "train", "grad_accum", &c->grad_accum, err, errlen)) < 0 ||
      (rc = get_float(o, "train", "lr", &c->lr, err, errlen)) < 0 ||
      (rc = get_float(o, "train", "beta1", &c->beta1, err, errlen)) < 0 ||
      (rc = get_float(o, "train", "beta2", &c->beta2, err, errlen)) < 0 ||
      (rc = get_float(o, "train", "eps", &c->eps, err, errlen)) < 0 ||
      (rc = get_float(o, "train", "weight_decay", &c->weight_decay, err, errlen)) < 0 ||
      (rc = get_int(o, "train", "warmup_steps", &c->warmup_steps, err, errlen)) < 0 ||
      (rc = get_float(o, "train", "min_lr", &c->min_lr, err, errlen)) < 0 ||
      (rc = get_float(o, "train", "grad_clip", &c->grad_clip, err, errlen)) < 0 ||
      (rc = get_u64(o, "train", "seed", &c->seed, err, errlen)) < 0)
    return rc;
  /* an object, as the job spec's other sub-recipes ("checkpoint": {"every": N}) */
  json_t *ac = json_object_get(o, "activation_checkpointing");
  if (ac) {
    static const char *const ac_keys[] = {"every", NULL};
    const char *pre = "train.activation_checkpointing";
    json_t *every = json_object_get(ac, "every");
    if ((rc = only_keys(ac, pre, ac_keys, err, errlen)) < 0) return rc;
    if (json_is_string(every) && !strcmp(json_string_value(every), "auto"))
      c->ckpt_every = ZT_CKPT_AUTO;
    else if ((rc = get_int(ac, pre, "every", &c->ckpt_every, err, errlen)) < 0)
      return rc;
    else if (c->ckpt_every < 0) {
      snprintf(err, errlen, "%s.every must be an integer >= 0 or \"auto\"", pre);
      return -EINVAL;
    }
  }
  json_t *pr = json_object_get(o, "precision");
  if (pr && zt_dtype_parse(json_string_value(pr), &c->precision) < 0) {
    snprintf(err, errlen, "train.precision must be \"fp32\", \"bf16\" or \"fp16\"");
    return -EINVAL;
  }
  json_t *tf = json_object_get(o, "tf32");
  if (tf) {
    if (!json_is_boolean(tf)) {
      snprintf(err, errlen, "train.tf32 must be true or false");
      return -EINVAL;
    }
    c->tf32 = json_is_true(tf);
  }
  json_t *s = json_object_get(o, "schedule");
  if (s) {
    const char *v = json_string_value(s);
    if (v && !strcmp(v, "constant")) c->schedule = ZT_SCHED_CONSTANT;
    else if (v && !strcmp(v, "cosine")) c->schedule = ZT_SCHED_COSINE;
    else {
      snprintf(err, errlen, "train.schedule must be \"constant\" or \"cosine\"");
      return -EINVAL;
    }
  }
  return zt_train_cfg_check(c, err, errlen);
}

json_t *zt_train_cfg_to_json(const zt_train_cfg *c) {
  json_t *every = c->ckpt_every == ZT_CKPT_AUTO ? json_string("auto")
                                                : json_integer(c->ckpt_every);
  return json_pack("{s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:s, s:i, s:f, s:f, s:I, s:{s:o}, "
                   "s:s, s:b}",
                   "steps", c->steps, "micro_batch", c->micro_batch, "grad_accum", c->grad_accum,
                   "lr", (double)c->lr, "beta1", (double)c->beta1, "beta2", (double)c->beta2,
                   "eps", (double)c->eps, "weight_decay", (double)c->weight_decay, "schedule",
                   zt_schedule_name(c->schedule), "warmup_steps", c->warmup_steps, "min_lr",
                   (double)c->min_lr, "grad_clip", (double)c->grad_clip, "seed",
                   (json_int_t)c->seed, "activation_checkpointing", "every", every,
                   "precision", zt_dtype_name(c->precision), "tf32", c->tf32);
}

int zt_spec_load(const char *path, zt_model_cfg *mc, zt_train_cfg *tc, char *err, size_t errlen) {
  json_error_t je;
  json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
  int rc = 0;
  if (!root || !json_is_object(root)) {
    snprintf(err, errlen, "%s: not a JSON object: %s (line %d)", path, root ? "" : je.text,
             root ? 0 : je.line);
    rc = -EINVAL;
    goto out;
  }
  json_t *m = json_object_get(root, "model"), *t = json_object_get(root, "train");
  if (!m || !t) {
    snprintf(err, errlen, "%s: needs \"model\" and \"train\" objects", path);
    rc = -EINVAL;
    goto out;
  }
  if ((rc = zt_model_cfg_from_json(m, mc, err, errlen)) < 0) goto out;
  rc = zt_train_cfg_from_json(t, tc, err, errlen);
out:
  json_decref(root);
  return rc;
}
