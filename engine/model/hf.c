/* Hugging Face model directories (hf.h): config.json's names mapped onto zt's (docs/spec.md has
 * the table), and a directory's safetensors shards as one set. */
#include "engine/model/hf.h"

#include "engine/base/path.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/base/json_field.h"

/* config.json and an index are small; anything larger is not one */
#define HF_JSON_MAX ((size_t)64 << 20)

static const struct {
  const char *type, *cls;
  zt_hf_type t;
  int max_pos;  /* transformers' default max_position_embeddings */
} types[] = {
    {"llama", "LlamaForCausalLM", ZT_HF_LLAMA, 2048},
    {"mistral", "MistralForCausalLM", ZT_HF_MISTRAL, 131072},
    {"qwen2", "Qwen2ForCausalLM", ZT_HF_QWEN2, 32768},
    {"qwen3", "Qwen3ForCausalLM", ZT_HF_QWEN3, 32768},
    {"gpt2", "GPT2LMHeadModel", ZT_HF_GPT2, 1024},
};

const char *zt_hf_type_name(zt_hf_type t) {
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
    if (types[i].t == t) return types[i].type;
  return "";
}

/* err = "prefix: fmt..." */
static int refuse(char *err, size_t errlen, const char *prefix, const char *fmt, ...) {
  char why[384];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  snprintf(err, errlen, "%s: %s", prefix, why);
  return -EINVAL;
}

/* A field reader's message (json_field.h) behind the file's name. */
static int prefixed(int rc, char *err, size_t errlen, const char *prefix) {
  if (rc < 0) {
    char why[384];
    snprintf(why, sizeof why, "%s", err);
    snprintf(err, errlen, "%s: %s", prefix, why);
  }
  return rc;
}

int zt__hf_load_json(const char *path, json_t **out, char *err, size_t errlen) {
  int fd = -1;
  char *buf = NULL;
  struct stat st;
  *out = NULL;
  /* a FIFO or a device named config.json is refused from its stat, never opened: an open could
   * block ztd's worker for good */
  int rc = zt_path_open(NULL, path, 0, NULL, &fd, NULL, 0, err, errlen);
  if (rc < 0) goto out;
  if (fstat(fd, &st) < 0) {
    rc = -errno;
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    goto out;
  }
  if (!S_ISREG(st.st_mode) || (size_t)st.st_size > HF_JSON_MAX) {
    rc = -EINVAL;
    snprintf(err, errlen, "%s: %s", path, S_ISREG(st.st_mode) ? "larger than 64 MiB"
                                                              : "not a regular file");
    goto out;
  }
  size_t len = (size_t)st.st_size, got = 0;
  if (!(buf = malloc(len ? len : 1))) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", path);
    goto out;
  }
  while (got < len) {
    ssize_t r = read(fd, buf + got, len - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      rc = r < 0 ? -errno : -EIO;
      snprintf(err, errlen, "%s: %s", path, r < 0 ? strerror(errno) : "shorter than its size");
      goto out;
    }
    got += (size_t)r;
  }
  json_error_t je;
  *out = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
  if (!*out || !json_is_object(*out)) {
    rc = -EINVAL;
    if (*out)
      snprintf(err, errlen, "%s: not a JSON object", path);
    else
      snprintf(err, errlen, "%s: not valid JSON (line %d, column %d)", path, je.line, je.column);
    json_decref(*out);
    *out = NULL;
  }
out:
  if (fd >= 0) close(fd);
  free(buf);
  return rc;
}

/* transformers writes absent options as null: a null member reads as an absent one */
static void drop_nulls(json_t *o) {
  const char *key;
  json_t *v;
  void *tmp;
  json_object_foreach_safe(o, tmp, key, v) if (json_is_null(v)) json_object_del(o, key);
}

static int is_true(const json_t *o, const char *key) {
  return json_is_true(json_object_get(o, key));
}

/* RoPE in either form: transformers 5's "rope_parameters": {"rope_theta", "rope_type", "factor",
 * ...} or the hub's 4.x "rope_theta" and "rope_scaling": {"rope_type" (or "type"), ...}. */
static int read_rope(const json_t *o, zt_model_cfg *c, const char *pfx, char *err, size_t errlen) {
  json_t *rp = json_object_get(o, "rope_parameters");
  json_t *rs = rp ? rp : json_object_get(o, "rope_scaling");
  const char *where = rp ? "rope_parameters" : "rope_scaling";
  const json_t *theta_in = rp ? rp : o;
  int rc;
  if (rs && !json_is_object(rs)) return refuse(err, errlen, pfx, "%s must be an object", where);
  if (rs) drop_nulls(rs);
  if ((rc = prefixed(zt_json_get_num(theta_in, rp ? "rope_parameters" : "", "rope_theta", 0, 1,
                                     ZT_MODEL_MAX_ROPE_THETA, 0, 10000.0f, &c->rope_theta, err,
                                     errlen),
                     err, errlen, pfx)) < 0)
    return rc;
  float partial = 1.0f;
  for (int k = 0; k < 2; k++) {
    const json_t *in = k ? o : rs;
    if (in && (rc = prefixed(zt_json_get_num(in, k ? "" : where, "partial_rotary_factor", 0, 1,
                                             1, 0, 1.0f, &partial, err, errlen),
                             err, errlen, pfx)) < 0)
      return rc;
    if (partial != 1.0f)
      return refuse(err, errlen, pfx, "%s%spartial_rotary_factor: zt rotates the whole head",
                    k ? "" : where, k ? "" : ".");
  }
  if (!rs) return 0;
  const json_t *type = json_object_get(rs, "rope_type");
  if (!type) type = json_object_get(rs, "type");
  const char *ts = json_is_string(type) ? json_string_value(type) : NULL;
  zt_rope_scaling *r = &c->rope_scaling;
  if (!type || (ts && !strcmp(ts, "default"))) {
    r->type = ZT_ROPE_NONE;
    return 0;
  }
  if (ts && !strcmp(ts, "linear")) r->type = ZT_ROPE_LINEAR;
  else if (ts && !strcmp(ts, "llama3")) r->type = ZT_ROPE_LLAMA3;
  else
    return refuse(err, errlen, pfx, "%s.rope_type must be \"default\", \"linear\" or \"llama3\" "
                  "(the scalings zt implements)", where);
  if ((rc = prefixed(zt_json_get_num(rs, where, "factor", 1, 0, 1e6, 0, 0.0f, &r->factor, err,
                                     errlen),
                     err, errlen, pfx)) < 0)
    return rc;
  if (!json_object_get(rs, "factor"))
    return refuse(err, errlen, pfx, "%s.factor is required", where);
  if (r->type != ZT_ROPE_LLAMA3) return 0;
  static const char *const need[] = {"low_freq_factor", "high_freq_factor",
                                     "original_max_position_embeddings"};
  for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
    if (!json_object_get(rs, need[i]))
      return refuse(err, errlen, pfx, "%s.%s is required with rope_type llama3", where, need[i]);
  if ((rc = prefixed(zt_json_get_num(rs, where, "low_freq_factor", 0, 1, 1e6, 0, 0.0f,
                                     &r->low_freq_factor, err, errlen),
                     err, errlen, pfx)) < 0 ||
      (rc = prefixed(zt_json_get_num(rs, where, "high_freq_factor", 0, 1, 1e6, 0, 0.0f,
                                     &r->high_freq_factor, err, errlen),
                     err, errlen, pfx)) < 0 ||
      (rc = prefixed(zt_json_get_int32(rs, where, "original_max_position_embeddings", 1, 1,
                                       ZT_MODEL_MAX_SEQ, 0, &r->original_max_position_embeddings,
                                       err, errlen),
                     err, errlen, pfx)) < 0)
    return rc;
  return 0;
}

/* What the llama family's config may hold that zt does not train. */
static int llama_refusals(const json_t *o, zt_hf_type t, int seq_len, const char *pfx, char *err,
                          size_t errlen) {
  static const char *const moe[] = {"num_experts", "num_local_experts", "n_routed_experts",
                                    "num_experts_per_tok", "moe_intermediate_size"};
  for (size_t i = 0; i < sizeof moe / sizeof moe[0]; i++) {
    const json_t *v = json_object_get(o, moe[i]);
    if (v && !(json_is_integer(v) && json_integer_value(v) == 0))
      return refuse(err, errlen, pfx, "%s: mixture-of-experts models are not supported", moe[i]);
  }
  if (json_object_get(o, "quantization_config"))
    return refuse(err, errlen, pfx, "quantization_config: quantized weights are not supported");
  const json_t *act = json_object_get(o, "hidden_act");
  if (act && !(json_is_string(act) && !strcmp(json_string_value(act), "silu")))
    return refuse(err, errlen, pfx, "hidden_act must be \"silu\" (SwiGLU)");
  /* Llama's and Qwen3's attention_bias puts biases on o_proj too; Qwen2's q/k/v biases are
   * always there, and Mistral has none, whatever the field says */
  if ((t == ZT_HF_LLAMA || t == ZT_HF_QWEN3) && is_true(o, "attention_bias"))
    return refuse(err, errlen, pfx, "attention_bias true: o_proj with a bias is not supported");
  if (t == ZT_HF_LLAMA && is_true(o, "mlp_bias"))
    return refuse(err, errlen, pfx, "mlp_bias true: MLP biases are not supported");
  /* the attention is full causal: a window that binds is refused */
  if ((t == ZT_HF_QWEN2 || t == ZT_HF_QWEN3) && is_true(o, "use_sliding_window"))
    return refuse(err, errlen, pfx, "use_sliding_window true: sliding-window attention is not "
                  "supported");
  const json_t *sw = json_object_get(o, "sliding_window");
  if (t == ZT_HF_MISTRAL && sw &&
      !(json_is_integer(sw) && json_integer_value(sw) >= seq_len))
    return refuse(err, errlen, pfx, "sliding_window must be null or at least model.seq_len %d "
                  "(zt's attention is full causal)", seq_len);
  const json_t *lt = json_object_get(o, "layer_types");
  for (size_t i = 0; lt && i < json_array_size(lt); i++) {
    const json_t *x = json_array_get(lt, i);
    if (!json_is_string(x) || strcmp(json_string_value(x), "full_attention"))
      return refuse(err, errlen, pfx, "layer_types[%zu] is not \"full_attention\"", i);
  }
  if (lt && !json_is_array(lt)) return refuse(err, errlen, pfx, "layer_types must be an array");
  return 0;
}

static int read_llama(json_t *o, zt_hf_type t, int seq_len, zt_model_cfg *c, const char *pfx,
                      char *err, size_t errlen) {
  int rc;
  if ((rc = llama_refusals(o, t, seq_len, pfx, err, errlen)) < 0) return rc;
  c->arch = ZT_ARCH_LLAMA;
  float eps;
  int tie;
  if ((rc = zt_json_get_int32(o, "", "hidden_size", 1, 1, ZT_MODEL_MAX_DMODEL, 0, &c->d_model,
                              err, errlen)) < 0 ||
      (rc = zt_json_get_int32(o, "", "num_attention_heads", 1, 1, ZT_MODEL_MAX_DMODEL, 0,
                              &c->n_heads, err, errlen)) < 0 ||
      (rc = zt_json_get_int32(o, "", "num_key_value_heads", 0, 1, ZT_MODEL_MAX_DMODEL, 0,
                              &c->n_kv_heads, err, errlen)) < 0 ||
      (rc = zt_json_get_int32(o, "", "head_dim", 0, 1, ZT_MODEL_MAX_HEAD_DIM, 0, &c->head_dim,
                              err, errlen)) < 0 ||
      (rc = zt_json_get_int32(o, "", "intermediate_size", 1, 1, ZT_MODEL_MAX_DFF, 0, &c->d_ff,
                              err, errlen)) < 0 ||
      (rc = zt_json_get_int32(o, "", "num_hidden_layers", 1, 1, ZT_MODEL_MAX_LAYERS, 0,
                              &c->n_layers, err, errlen)) < 0 ||
      (rc = zt_json_get_int32(o, "", "vocab_size", 1, 1, ZT_MODEL_MAX_VOCAB, 0, &c->vocab, err,
                              errlen)) < 0 ||
      (rc = zt_json_get_num(o, "", "rms_norm_eps", 0, 1, 1, 0, 1e-6f, &eps, err, errlen)) < 0 ||
      (rc = zt_json_get_bool(o, "", "tie_word_embeddings", 0, &tie, err, errlen)) < 0)
    return prefixed(rc, err, errlen, pfx);
  c->rms_eps = eps;
  c->tie_embeddings = tie;
  c->qkv_bias = t == ZT_HF_QWEN2;
  c->qk_norm = t == ZT_HF_QWEN3;
  return read_rope(o, c, pfx, err, errlen);
}

static int read_gpt2(const json_t *o, zt_model_cfg *c, const char *pfx, char *err,
                     size_t errlen) {
  int rc, tie, scale;
  float eps;
  const char *act;
  c->arch = ZT_ARCH_GPT;
  if ((rc = zt_json_get_int32(o, "", "n_embd", 1, 1, ZT_MODEL_MAX_DMODEL, 0, &c->d_model, err,
                              errlen)) < 0 ||
      (rc = zt_json_get_int32(o, "", "n_head", 1, 1, ZT_MODEL_MAX_DMODEL, 0, &c->n_heads, err,
                              errlen)) < 0 ||
      (rc = zt_json_get_int32(o, "", "n_layer", 1, 1, ZT_MODEL_MAX_LAYERS, 0, &c->n_layers, err,
                              errlen)) < 0 ||
      (rc = zt_json_get_int32(o, "", "n_inner", 0, 1, ZT_MODEL_MAX_DFF, 0, &c->d_ff, err,
                              errlen)) < 0 ||
      (rc = zt_json_get_int32(o, "", "vocab_size", 1, 1, ZT_MODEL_MAX_VOCAB, 0, &c->vocab, err,
                              errlen)) < 0 ||
      (rc = zt_json_get_string(o, "", "activation_function", "gelu_new", &act, err, errlen)) < 0 ||
      (rc = zt_json_get_num(o, "", "layer_norm_epsilon", 0, 1, 1, 0, 1e-5f, &eps, err,
                            errlen)) < 0 ||
      (rc = zt_json_get_bool(o, "", "tie_word_embeddings", 1, &tie, err, errlen)) < 0 ||
      (rc = zt_json_get_bool(o, "", "scale_attn_weights", 1, &scale, err, errlen)) < 0)
    return prefixed(rc, err, errlen, pfx);
  if (strcmp(act, "gelu_new") && strcmp(act, "gelu_pytorch_tanh"))
    return refuse(err, errlen, pfx, "activation_function must be \"gelu_new\" (GELU, tanh)");
  if (eps != 1e-5f) return refuse(err, errlen, pfx, "layer_norm_epsilon must be 1e-05");
  if (!tie) return refuse(err, errlen, pfx, "tie_word_embeddings false: zt's gpt is tied");
  if (!scale || is_true(o, "scale_attn_by_inverse_layer_idx") ||
      is_true(o, "add_cross_attention"))
    return refuse(err, errlen, pfx, "%s: GPT-2's attention as zt computes it has "
                  "scale_attn_weights true, scale_attn_by_inverse_layer_idx and "
                  "add_cross_attention false",
                  !scale ? "scale_attn_weights"
                  : is_true(o, "add_cross_attention") ? "add_cross_attention"
                                                      : "scale_attn_by_inverse_layer_idx");
  return 0;
}

int zt_hf_config_read(const char *dir, int seq_len, zt_model_cfg *c, char *err, size_t errlen) {
  char path[ZT_PATH_MAX + 16], pfx[ZT_PATH_MAX + 32];
  json_t *o = NULL;
  memset(c, 0, sizeof *c);
  if (strlen(dir) >= sizeof c->hf_dir) {
    snprintf(err, errlen, "model.hf is longer than %zu bytes", sizeof c->hf_dir - 1);
    return -EINVAL;
  }
  snprintf(path, sizeof path, "%s/config.json", dir);
  snprintf(pfx, sizeof pfx, "model.hf: %s", path);
  int rc = zt__hf_load_json(path, &o, err, errlen);
  if (rc < 0) {
    char why[512];
    snprintf(why, sizeof why, "%s", err);
    snprintf(err, errlen, "model.hf: %s", why);
    return rc;
  }
  drop_nulls(o);
  const json_t *mt = json_object_get(o, "model_type");
  size_t k = 0;
  while (k < sizeof types / sizeof types[0] &&
         !(json_is_string(mt) && !strcmp(json_string_value(mt), types[k].type)))
    k++;
  if (k == sizeof types / sizeof types[0]) {
    rc = refuse(err, errlen, pfx, "model_type must be \"llama\", \"mistral\", \"qwen2\", "
                "\"qwen3\" or \"gpt2\" (the models zt trains)");
    goto out;
  }
  const json_t *archs = json_object_get(o, "architectures");
  if (archs && !(json_is_array(archs) && json_is_string(json_array_get(archs, 0)) &&
                 !strcmp(json_string_value(json_array_get(archs, 0)), types[k].cls))) {
    rc = refuse(err, errlen, pfx, "architectures must be [\"%s\"] for model_type %s",
                types[k].cls, types[k].type);
    goto out;
  }
  int max_pos;
  rc = prefixed(zt_json_get_int32(o, "", types[k].t == ZT_HF_GPT2 ? "n_positions"
                                                                  : "max_position_embeddings",
                                  0, 1, ZT_MODEL_MAX_SEQ, types[k].max_pos, &max_pos, err,
                                  errlen),
                err, errlen, pfx);
  if (rc < 0) goto out;
  if (seq_len < 1 || seq_len > max_pos) {
    rc = refuse(err, errlen, pfx, "model.seq_len %d must be in [1, %d] (its %s)", seq_len,
                max_pos, types[k].t == ZT_HF_GPT2 ? "n_positions" : "max_position_embeddings");
    goto out;
  }
  rc = types[k].t == ZT_HF_GPT2 ? read_gpt2(o, c, pfx, err, errlen)
                                : read_llama(o, types[k].t, seq_len, c, pfx, err, errlen);
  if (rc < 0) goto out;
  c->seq_len = seq_len;
  if (types[k].t == ZT_HF_GPT2) c->n_positions = max_pos;
  c->hf_type = types[k].t;
  snprintf(c->hf_dir, sizeof c->hf_dir, "%s", dir);
  rc = prefixed(zt_model_cfg_check(c, err, errlen), err, errlen, pfx);
out:
  json_decref(o);
  return rc;
}

/* ---- a directory's safetensors files as one set ------------------------------------------ */

struct zt__st_set {
  zt_st_file **f;
  char **base;          /* each file's name in its directory */
  int nf, n;
};

void zt__st_set_close(zt__st_set *s) {
  if (!s) return;
  for (int i = 0; i < s->nf; i++) {
    zt_st_close(s->f[i]);
    free(s->base[i]);
  }
  free(s->f);
  free(s->base);
  free(s);
}

/* The file of the set called base, or -1. */
static int file_of(const zt__st_set *s, const char *base) {
  for (int i = 0; i < s->nf; i++)
    if (!strcmp(s->base[i], base)) return i;
  return -1;
}

/* Safe to print and to open in the directory: [A-Za-z0-9._-], not starting with a dot. */
static int plain_name(const char *s, size_t max) {
  size_t n = strlen(s);
  if (!n || n > max || s[0] == '.') return 0;
  for (size_t i = 0; i < n; i++)
    if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-", s[i]))
      return 0;
  return 1;
}

static int add_file(zt__st_set *s, const char *path, char *err, size_t errlen) {
  zt_st_file **f = realloc(s->f, (size_t)(s->nf + 1) * sizeof *f);
  if (f) s->f = f;
  char **b = f ? realloc(s->base, (size_t)(s->nf + 1) * sizeof *b) : NULL;
  if (b) s->base = b;
  const char *slash = strrchr(path, '/');
  if (!b || !(b[s->nf] = strdup(slash ? slash + 1 : path))) {
    snprintf(err, errlen, "%s: out of memory", path);
    return -ENOMEM;
  }
  int rc = zt_st_open(&s->f[s->nf], path, err, errlen);
  if (rc < 0) {
    free(b[s->nf]);
    return rc;
  }
  s->n += zt_st_count(s->f[s->nf]);
  s->nf++;
  return 0;
}

/* The index's shards, each opened once (in the order the weight_map first names them), and
 * the index and the shards' headers agreeing tensor for tensor. */
static int open_index(zt__st_set *s, const char *dir, const char *ipath, char *err,
                      size_t errlen) {
  json_t *idx = NULL;
  int rc = zt__hf_load_json(ipath, &idx, err, errlen);
  if (rc < 0) return rc;
  json_t *wm = json_object_get(idx, "weight_map");
  const char *name;
  json_t *v;
  char path[ZT_PATH_MAX + 256];
  if (!json_is_object(wm)) {
    rc = refuse(err, errlen, ipath, "weight_map must be an object of tensor names and files");
    goto out;
  }
  json_object_foreach(wm, name, v) {
    const char *file = json_is_string(v) ? json_string_value(v) : "";
    /* a tensor name outside these characters is not printed */
    if (!plain_name(name, 200)) {
      rc = refuse(err, errlen, ipath, "weight_map holds a tensor name with characters outside "
                  "[A-Za-z0-9._-]");
      goto out;
    }
    size_t fl = strlen(file);
    if (!plain_name(file, 200) || fl < 13 || strcmp(file + fl - 12, ".safetensors")) {
      rc = refuse(err, errlen, ipath, "weight_map.%s must name a .safetensors file in the "
                  "directory (letters, digits, '.', '_', '-')", name);
      goto out;
    }
    if (file_of(s, file) >= 0) continue;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if ((rc = add_file(s, path, err, errlen)) < 0) {
      char why[512];
      snprintf(why, sizeof why, "%s", err);
      snprintf(err, errlen, "%s (a shard %s names, for tensor %s)", why, ipath, name);
      goto out;
    }
  }
  json_object_foreach(wm, name, v) {
    int i = file_of(s, json_string_value(v));
    if (!zt_st_find(s->f[i], name)) {
      rc = refuse(err, errlen, ipath, "weight_map maps tensor %s to %s, which does not hold it",
                  name, s->base[i]);
      goto out;
    }
  }
  for (int i = 0; i < s->nf; i++)
    for (int j = 0; j < zt_st_count(s->f[i]); j++) {
      const char *tn = zt_st_tensor_at(s->f[i], j)->name;
      const json_t *to = json_object_get(wm, tn);
      if (!to || strcmp(json_string_value(to), s->base[i])) {
        rc = refuse(err, errlen, zt_st_path(s->f[i]), "holds tensor %s, which %s does not map "
                    "to it", tn, ipath);
        goto out;
      }
    }
out:
  json_decref(idx);
  return rc;
}

int zt__st_set_open(zt__st_set **out, const char *path, char *err, size_t errlen) {
  struct stat st;
  char p[ZT_PATH_MAX + 64];
  int rc;
  zt__st_set *s = calloc(1, sizeof *s);
  *out = NULL;
  if (!s) {
    snprintf(err, errlen, "%s: out of memory", path);
    return -ENOMEM;
  }
  if (stat(path, &st) < 0 || !S_ISDIR(st.st_mode)) {
    rc = add_file(s, path, err, errlen);
  } else {
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", path);
    if (access(p, F_OK) == 0) {
      rc = open_index(s, path, p, err, errlen);
    } else {
      snprintf(p, sizeof p, "%s/model.safetensors", path);
      if (access(p, F_OK) == 0) {
        rc = add_file(s, p, err, errlen);
      } else {
        rc = -ENOENT;
        snprintf(err, errlen, "%s: holds neither model.safetensors nor "
                 "model.safetensors.index.json", path);
      }
    }
  }
  if (rc < 0) {
    zt__st_set_close(s);
    return rc;
  }
  *out = s;
  return 0;
}

const zt_st_tensor *zt__st_set_find(const zt__st_set *s, const char *name,
                                    const zt_st_file **file, int *index) {
  for (int i = 0, before = 0; i < s->nf; before += zt_st_count(s->f[i]), i++) {
    const zt_st_tensor *t = zt_st_find(s->f[i], name);
    if (t) {
      *file = s->f[i];
      *index = before + (int)(t - zt_st_tensor_at(s->f[i], 0));
      return t;
    }
  }
  return NULL;
}

int zt__st_set_count(const zt__st_set *s) { return s->n; }

const zt_st_tensor *zt__st_set_tensor_at(const zt__st_set *s, int i, const zt_st_file **file) {
  for (int k = 0; k < s->nf; i -= zt_st_count(s->f[k]), k++)
    if (i < zt_st_count(s->f[k])) {
      *file = s->f[k];
      return zt_st_tensor_at(s->f[k], i);
    }
  return NULL;
}
