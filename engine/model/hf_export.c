/* defines: zt_hf_config_write and zt_hf_export (hf.h): a model's weights as a Hugging Face
 * directory. config.json is the inverse of hf.c's reader (docs/spec.md has the table) and is
 * checked by reading it back; the weights go a chunk at a time from zt's safetensors file into
 * transformers' names and the export's dtype, so the memory held is bounded whatever the model. */
#include "engine/model/hf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/base/tunables.h"

/* config.json's reals: %.15g gives back any decimal a person wrote; zt's floats go in as their
 * shortest decimal (real_of), so 1e-05 stays 1e-05 */
#define CONFIG_FLAGS (JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(15))
/* a copied tokenizer file larger than this is not one */
#define AUX_MAX ((off_t)1 << 30)

/* The shortest decimal that reads back as x in fp32, as a double. */
static json_t *real_of(float x) {
  char s[32];
  for (int p = 1; p <= 9; p++) {
    snprintf(s, sizeof s, "%.*g", p, (double)x);
    if (strtof(s, NULL) == x) break;
  }
  return json_real(strtod(s, NULL));
}

static const struct {
  zt_hf_type t;
  const char *type, *cls;
} classes[] = {
    {ZT_HF_LLAMA, "llama", "LlamaForCausalLM"},  {ZT_HF_MISTRAL, "mistral", "MistralForCausalLM"},
    {ZT_HF_QWEN2, "qwen2", "Qwen2ForCausalLM"},  {ZT_HF_QWEN3, "qwen3", "Qwen3ForCausalLM"},
    {ZT_HF_GPT2, "gpt2", "GPT2LMHeadModel"},
};

/* The Hugging Face class of a model: its source's, else the one whose layers it has. */
static int class_of(const zt_model_cfg *c, zt_hf_type *t, char *err, size_t errlen) {
  if (c->arch == ZT_ARCH_ENCODER) {
    snprintf(err, errlen, "arch encoder has no Hugging Face causal-LM class to export to");
    return -ENOTSUP;
  }
  if (c->hf_type != ZT_HF_NONE) *t = c->hf_type;
  else if (c->arch == ZT_ARCH_GPT) *t = ZT_HF_GPT2;
  else if (c->qk_norm && c->qkv_bias) {
    /* Qwen3's attention_bias also puts a bias on o_proj, which zt's model has not */
    snprintf(err, errlen, "model.qk_norm with model.qkv_bias: no Hugging Face class has q/k "
             "norms and q/k/v biases without an o_proj bias");
    return -ENOTSUP;
  } else {
    *t = c->qk_norm ? ZT_HF_QWEN3 : c->qkv_bias ? ZT_HF_QWEN2 : ZT_HF_LLAMA;
  }
  return 0;
}

/* Sets key (a new reference, stolen); a NULL value is out of memory. */
static int put(json_t *o, const char *key, json_t *v) {
  return v && json_object_set_new(o, key, v) == 0 ? 0 : -1;
}

static json_t *rope_scaling_json(const zt_rope_scaling *r) {
  if (r->type == ZT_ROPE_NONE) return json_null();
  json_t *o = json_object();
  const char *type = r->type == ZT_ROPE_LINEAR ? "linear" : "llama3";
  int bad = !o || put(o, "rope_type", json_string(type)) || put(o, "factor", real_of(r->factor));
  if (!bad && r->type == ZT_ROPE_LLAMA3)
    bad = put(o, "low_freq_factor", real_of(r->low_freq_factor)) ||
          put(o, "high_freq_factor", real_of(r->high_freq_factor)) ||
          put(o, "original_max_position_embeddings",
              json_integer(r->original_max_position_embeddings));
  if (bad) {
    json_decref(o);
    return NULL;
  }
  return o;
}

/* A model made from a spec has no tokenizer, so no special tokens: the class defaults would
 * name ids that mean nothing here (GPT-2's 50256 lies outside a small vocabulary). */
static int no_special_tokens(json_t *o) {
  return put(o, "bos_token_id", json_null()) || put(o, "eos_token_id", json_null()) ||
         put(o, "pad_token_id", json_null());
}

/* The fields the reader maps (hf.c's read_llama, read_gpt2), from m. */
static int mapped_fields(json_t *o, const zt_model *m, zt_hf_type t, int from_source) {
  const zt_model_cfg *c = zt_model_cfg_of(m);
  if (t == ZT_HF_GPT2) {
    int rows = c->n_positions ? c->n_positions : c->seq_len;
    int bad = put(o, "vocab_size", json_integer(c->vocab)) ||
           put(o, "n_embd", json_integer(c->d_model)) ||
           put(o, "n_head", json_integer(c->n_heads)) ||
           put(o, "n_layer", json_integer(c->n_layers)) ||
           put(o, "n_inner", c->d_ff ? json_integer(c->d_ff) : json_null()) ||
           put(o, "n_positions", json_integer(rows)) || put(o, "n_ctx", json_integer(rows)) ||
           put(o, "activation_function", json_string("gelu_new")) ||
           put(o, "layer_norm_epsilon", real_of(1e-5f)) ||
           put(o, "tie_word_embeddings", json_true()) ||
           put(o, "scale_attn_weights", json_true()) ||
           put(o, "scale_attn_by_inverse_layer_idx", json_false()) ||
           put(o, "add_cross_attention", json_false());
    return bad || from_source ? bad : no_special_tokens(o);
  }
  int hs = c->head_dim ? c->head_dim : c->d_model / c->n_heads;
  int kv = c->n_kv_heads ? c->n_kv_heads : c->n_heads;
  int bad = put(o, "vocab_size", json_integer(c->vocab)) ||
            put(o, "hidden_size", json_integer(c->d_model)) ||
            put(o, "intermediate_size", json_integer(zt_model_d_ff(m))) ||
            put(o, "num_attention_heads", json_integer(c->n_heads)) ||
            put(o, "num_key_value_heads", json_integer(kv)) ||
            put(o, "head_dim", json_integer(hs)) ||
            put(o, "num_hidden_layers", json_integer(c->n_layers)) ||
            put(o, "rms_norm_eps", real_of(c->rms_eps)) ||
            put(o, "hidden_act", json_string("silu")) ||
            put(o, "tie_word_embeddings", json_boolean(c->tie_embeddings)) ||
            put(o, "rope_theta", real_of(c->rope_theta)) ||
            put(o, "rope_scaling", rope_scaling_json(&c->rope_scaling));
  if (!bad && (t == ZT_HF_LLAMA || t == ZT_HF_QWEN3)) bad = put(o, "attention_bias", json_false());
  if (!bad && t == ZT_HF_LLAMA) bad = put(o, "mlp_bias", json_false());
  if (bad || from_source) return bad;
  /* a model made from a spec: what its class would otherwise default differently */
  bad = put(o, "max_position_embeddings", json_integer(c->seq_len)) ||
        put(o, "initializer_range", real_of(0.02f)) ||
        put(o, "attention_dropout", json_real(0.0)) || put(o, "use_cache", json_true());
  if (!bad && (t == ZT_HF_QWEN2 || t == ZT_HF_QWEN3))
    bad = put(o, "use_sliding_window", json_false());
  return bad || no_special_tokens(o);
}

/* The source directory's config.json without what the export writes anew, or NULL (note set). */
static json_t *source_config(const zt_model_cfg *c, char *note, size_t notelen) {
  char path[ZT_PATH_MAX + 16], why[512];
  json_t *o = NULL;
  snprintf(path, sizeof path, "%s/config.json", c->hf_dir);
  if (zt__hf_load_json(path, &o, why, sizeof why) < 0) {
    if (note) snprintf(note, notelen, "%s: config.json written from the job's model alone", why);
    return NULL;
  }
  /* transformers 5's RoPE form, replaced by the hub's; the dtype is the export's; the version
   * of transformers that wrote it did not write this file */
  static const char *const drop[] = {"rope_parameters", "rope_scaling", "rope_theta",
                                     "torch_dtype", "dtype", "transformers_version"};
  for (size_t i = 0; i < sizeof drop / sizeof drop[0]; i++) json_object_del(o, drop[i]);
  return o;
}

/* 1 when the model of cfg b has m's tensors (names and shapes) and numbers. */
static int same_model(const zt_model *m, const zt_model_cfg *b) {
  const zt_model_cfg *a = zt_model_cfg_of(m);
  zt_model *mb = NULL;
  char err[256];
  if (zt_model_create(&mb, b, err, sizeof err) < 0) return 0;
  int same = zt_model_num_tensors(mb) == zt_model_num_tensors(m) && a->arch == b->arch;
  for (int i = 0; same && i < zt_model_num_tensors(m); i++) {
    const zt_tensor_info *x = zt_model_tensor(m, i), *y = zt_model_tensor(mb, i);
    same = !strcmp(x->name, y->name) && x->ndim == y->ndim &&
           !memcmp(x->shape, y->shape, sizeof x->shape) && x->transposed == y->transposed;
  }
  zt_model_destroy(mb);
  if (!same || a->arch != ZT_ARCH_LLAMA) return same;
  const zt_rope_scaling *r = &a->rope_scaling, *s = &b->rope_scaling;
  return a->rms_eps == b->rms_eps && a->rope_theta == b->rope_theta && r->type == s->type &&
         (r->type == ZT_ROPE_NONE ||
          (r->factor == s->factor &&
           (r->type != ZT_ROPE_LLAMA3 ||
            (r->low_freq_factor == s->low_freq_factor &&
             r->high_freq_factor == s->high_freq_factor &&
             r->original_max_position_embeddings == s->original_max_position_embeddings))));
}

/* len bytes of buf as dir/name, fsynced. */
static int write_file(const char *dir, const char *name, const void *buf, size_t len, char *err,
                      size_t errlen) {
  char path[ZT_PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int rc = 0, fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const char *p = buf;
  if (fd < 0) rc = -errno;
  while (rc == 0 && len > 0) {
    ssize_t w = write(fd, p, len);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) rc = -errno;
    else p += w, len -= (size_t)w;
  }
  if (rc == 0 && fsync(fd) < 0) rc = -errno;
  if (fd >= 0 && close(fd) < 0 && rc == 0) rc = -errno;
  if (rc < 0) snprintf(err, errlen, "%s: %s", path, strerror(-rc));
  return rc;
}

static int write_json(const char *dir, const char *name, const json_t *o, char *err,
                      size_t errlen) {
  char *text = json_dumps(o, CONFIG_FLAGS);
  int rc;
  if (!text) {
    snprintf(err, errlen, "%s/%s: out of memory", dir, name);
    return -ENOMEM;
  }
  size_t n = strlen(text);
  text[n] = '\n';  /* the string's NUL becomes the file's last newline */
  rc = write_file(dir, name, text, n + 1, err, errlen);
  free(text);
  return rc;
}

int zt_hf_config_write(const zt_model *m, zt_st_dtype dt, const char *dir, char *note,
                       size_t notelen, char *err, size_t errlen) {
  const zt_model_cfg *c = zt_model_cfg_of(m);
  zt_hf_type t;
  int rc = class_of(c, &t, err, errlen);
  if (rc < 0) return rc;
  if (note && notelen) note[0] = 0;
  json_t *o = c->hf_dir[0] ? source_config(c, note, notelen) : NULL;
  int from_source = o != NULL;
  if (!o) o = json_object();
  size_t k = 0;
  while (classes[k].t != t) k++;
  const char *dtype = dt == ZT_ST_BF16 ? "bfloat16" : "float32";
  if (!o || put(o, "model_type", json_string(classes[k].type)) ||
      put(o, "architectures", json_pack("[s]", classes[k].cls)) ||
      mapped_fields(o, m, t, from_source) || put(o, "torch_dtype", json_string(dtype)) ||
      put(o, "dtype", json_string(dtype))) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s/config.json: out of memory", dir);
    goto out;
  }
  if ((rc = write_json(dir, "config.json", o, err, errlen)) < 0) goto out;
  /* read back as a job would read it: a field written wrong, or a source config.json edited
   * since the job read it, shows here and not in someone's from_pretrained */
  zt_model_cfg *back = malloc(sizeof *back);
  char why[512];
  if (!back) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s/config.json: out of memory", dir);
    goto out;
  }
  rc = zt_hf_config_read(dir, c->seq_len, back, why, sizeof why);
  if (rc < 0 || !same_model(m, back)) {
    if (rc < 0)
      snprintf(err, errlen, "the exported config.json does not read back: %s", why);
    else
      snprintf(err, errlen, "%s/config.json describes another model than the job's%s", dir,
               from_source ? " (has the source directory's config.json changed?)" : "");
    rc = -EIO;
  }
  free(back);
out:
  json_decref(o);
  return rc;
}

/* ---- weights ------------------------------------------------------------------------------ */

/* A shard: tensors [first, end) of the model. */
typedef struct shard {
  int first, end;
  char name[64];
} shard;

static size_t dtype_size(zt_st_dtype dt) { return dt == ZT_ST_BF16 ? 2 : 4; }

/* Tensor i's name in the export: GPT2LMHeadModel's behind "transformer.". */
static void export_name(const zt_model *m, int i, char *out, size_t len) {
  snprintf(out, len, "%s%s", zt_model_cfg_of(m)->arch == ZT_ARCH_GPT ? "transformer." : "",
           zt_model_tensor(m, i)->name);
}

/* The checkpoint's tensor for model tensor i, its file shape and a dtype that converts. */
static int source_tensor(const zt_st_file *f, const zt_tensor_info *ti, const zt_st_tensor **out,
                         char *err, size_t errlen) {
  const zt_st_tensor *t = zt_st_find(f, ti->name);
  if (!t || t->ndim != ti->ndim || (t->dtype != ZT_ST_F32 && t->dtype != ZT_ST_BF16 &&
                                    t->dtype != ZT_ST_F16)) {
    snprintf(err, errlen, "%s: tensor %s is %s", zt_st_path(f), ti->name,
             t ? "not the model's (its dtype or dimensions)" : "missing");
    return -EINVAL;
  }
  for (int d = 0; d < ti->ndim; d++)
    if (t->shape[d] != ti->shape[d]) {
      snprintf(err, errlen, "%s: tensor %s does not have the model's shape", zt_st_path(f),
               ti->name);
      return -EINVAL;
    }
  *out = t;
  return 0;
}

/* Shard s of the weights: each tensor a chunk of buf (ZT_TUNE_HF_CHUNK_ELEMS floats) at a time. */
static int write_shard(const zt_model *m, const zt_st_file *f, const shard *s, const char *dir,
                       const zt_hf_export_opts *o, float *buf, char *err, size_t errlen) {
  int n = s->end - s->first, rc = 0;
  char path[ZT_PATH_MAX + 96];
  zt_st_entry *e = calloc((size_t)n, sizeof *e);
  char (*names)[128] = calloc((size_t)n, sizeof *names);
  const zt_st_tensor **src = calloc((size_t)n, sizeof *src);
  zt_st_writer *w = NULL;
  static const char *const meta[] = {"format", "pt"};
  snprintf(path, sizeof path, "%s/%s", dir, s->name);
  if (!e || !names || !src) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", path);
    goto out;
  }
  for (int k = 0; k < n; k++) {
    const zt_tensor_info *ti = zt_model_tensor(m, s->first + k);
    if ((rc = source_tensor(f, ti, &src[k], err, errlen)) < 0) goto out;
    export_name(m, s->first + k, names[k], sizeof names[k]);
    e[k] = (zt_st_entry){.name = names[k], .ndim = ti->ndim, .dtype = o->dtype};
    memcpy(e[k].shape, ti->shape, sizeof ti->shape);
  }
  /* transformers refuses a safetensors file whose metadata lacks format "pt" */
  if ((rc = zt_st_writer_open(&w, path, e, n, meta, 1, err, errlen)) < 0) goto out;
  for (int k = 0; k < n && rc == 0; k++) {
    size_t numel = src[k]->numel;
    for (size_t at = 0; at < numel && rc == 0; at += ZT_TUNE_HF_CHUNK_ELEMS) {
      size_t len = numel - at < ZT_TUNE_HF_CHUNK_ELEMS ? numel - at : ZT_TUNE_HF_CHUNK_ELEMS;
      if (o->stop && atomic_load(o->stop)) {
        rc = -ECANCELED;
        snprintf(err, errlen, "%s: the export was stopped", path);
      } else if ((rc = zt_st_read_f32_range(f, src[k], at, len, buf, err, errlen)) == 0) {
        rc = zt_st_writer_put_range(w, k, at, len, buf, err, errlen);
      }
    }
  }
  if (rc == 0) rc = zt_st_writer_finish(w, err, errlen);
out:
  zt_st_writer_close(w);
  free(e);
  free(names);
  free(src);
  return rc;
}

/* Consecutive tensors, each shard's bytes at most cap unless one tensor alone is larger. */
static int plan_shards(const zt_model *m, size_t esize, uint64_t cap, shard **out) {
  int nt = zt_model_num_tensors(m), n = 0;
  shard *s = calloc((size_t)nt + 1, sizeof *s);
  if (!s) return -ENOMEM;
  uint64_t bytes = 0;
  for (int i = 0; i < nt; i++) {
    uint64_t b = (uint64_t)zt_model_tensor(m, i)->numel * esize;
    if (n == 0 || (bytes > 0 && bytes + b > cap)) {
      s[n].first = i;
      n++;
      bytes = 0;
    }
    s[n - 1].end = i + 1;
    bytes += b;
  }
  for (int k = 0; k < n; k++)
    if (n == 1) snprintf(s[k].name, sizeof s[k].name, "model.safetensors");
    else snprintf(s[k].name, sizeof s[k].name, "model-%05d-of-%05d.safetensors", k + 1, n);
  *out = s;
  return n;
}

static int write_index(const zt_model *m, const shard *s, int n, size_t esize, const char *dir,
                       char *err, size_t errlen) {
  json_t *o = json_object(), *map = json_object();
  uint64_t total = 0;
  int bad = !o || !map;
  char name[128];
  for (int k = 0; k < n && !bad; k++)
    for (int i = s[k].first; i < s[k].end && !bad; i++) {
      export_name(m, i, name, sizeof name);
      bad = put(map, name, json_string(s[k].name));
      total += (uint64_t)zt_model_tensor(m, i)->numel * esize;
    }
  bad = bad || put(o, "metadata", json_pack("{s:I}", "total_size", (json_int_t)total)) ||
        json_object_set(o, "weight_map", map) < 0;
  int rc = bad ? -ENOMEM : write_json(dir, "model.safetensors.index.json", o, err, errlen);
  if (bad) snprintf(err, errlen, "%s/model.safetensors.index.json: out of memory", dir);
  json_decref(map);
  json_decref(o);
  return rc;
}

/* src_dir/name into dir, if it is there: a regular file (a link to one, as the hub's cache
 * makes them) of at most AUX_MAX bytes. 1 copied, 0 absent. */
static int copy_aux(const char *src_dir, const char *name, const char *dir, char *err,
                    size_t errlen) {
  char from[ZT_PATH_MAX + 64], to[ZT_PATH_MAX + 64];
  snprintf(from, sizeof from, "%s/%s", src_dir, name);
  snprintf(to, sizeof to, "%s/%s", dir, name);
  /* O_NONBLOCK: a FIFO left in the directory must not hold the export forever */
  int rc = 0, in = open(from, O_RDONLY | O_NONBLOCK | O_CLOEXEC), out = -1;
  struct stat st;
  char *buf = NULL;
  if (in < 0) {
    if (errno == ENOENT) return 0;
    rc = -errno;
    snprintf(err, errlen, "%s: %s", from, strerror(errno));
    return rc;
  }
  if (fstat(in, &st) < 0) {
    rc = -errno;
    snprintf(err, errlen, "%s: %s", from, strerror(errno));
    goto out;
  }
  if (!S_ISREG(st.st_mode) || st.st_size > AUX_MAX) {
    rc = -EINVAL;
    snprintf(err, errlen, "%s: %s", from, S_ISREG(st.st_mode) ? "larger than 1 GiB"
                                                               : "not a regular file");
    goto out;
  }
  if (!(buf = malloc(1 << 20))) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", to);
    goto out;
  }
  if ((out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0) {
    rc = -errno;
    snprintf(err, errlen, "%s: %s", to, strerror(errno));
    goto out;
  }
  for (;;) {
    ssize_t r = read(in, buf, 1 << 20);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      rc = -errno;
      snprintf(err, errlen, "%s: %s", from, strerror(errno));
      goto out;
    }
    if (r == 0) break;
    for (ssize_t done = 0; done < r;) {
      ssize_t w = write(out, buf + done, (size_t)(r - done));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        rc = -errno;
        snprintf(err, errlen, "%s: %s", to, strerror(errno));
        goto out;
      }
      done += w;
    }
  }
  if (fsync(out) < 0) {
    rc = -errno;
    snprintf(err, errlen, "%s: %s", to, strerror(errno));
  }
out:
  if (out >= 0 && close(out) < 0 && rc == 0) {
    rc = -errno;
    snprintf(err, errlen, "%s: %s", to, strerror(errno));
  }
  close(in);
  free(buf);
  return rc < 0 ? rc : 1;
}

int zt_hf_export(const zt_model *m, const char *weights, const char *dir, zt_hf_export_opts *o,
                 char *err, size_t errlen) {
  const zt_model_cfg *c = zt_model_cfg_of(m);
  zt_st_file *f = NULL;
  shard *s = NULL;
  float *buf = NULL;
  size_t esize = dtype_size(o->dtype);
  uint64_t cap = o->max_shard_bytes ? o->max_shard_bytes : ZT_TUNE_HF_SHARD_BYTES;
  int rc, n;
  if (o->dtype != ZT_ST_F32 && o->dtype != ZT_ST_BF16) {
    snprintf(err, errlen, "an export's dtype is F32 or BF16");
    return -EINVAL;
  }
  if ((rc = zt_hf_config_write(m, o->dtype, dir, o->note, sizeof o->note, err, errlen)) < 0 ||
      (rc = zt_st_open(&f, weights, err, errlen)) < 0)
    goto out;
  if ((n = rc = plan_shards(m, esize, cap, &s)) < 0 ||
      !(buf = malloc(ZT_TUNE_HF_CHUNK_ELEMS * sizeof *buf))) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", dir);
    goto out;
  }
  for (int k = 0; k < n && rc >= 0; k++) rc = write_shard(m, f, &s[k], dir, o, buf, err, errlen);
  if (rc >= 0 && n > 1) rc = write_index(m, s, n, esize, dir, err, errlen);
  /* the source's tokenizer and generation files, unless its config.json could not be read
   * (then note says why and the directory is not trusted for the rest either) */
  static const char *const aux[] = {ZT_HF_AUX_FILES};
  for (size_t i = 0; rc >= 0 && c->hf_dir[0] && !o->note[0] && i < sizeof aux / sizeof aux[0];
       i++)
    rc = copy_aux(c->hf_dir, aux[i], dir, err, errlen);
  if (rc >= 0) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    rc = fd < 0 || fsync(fd) < 0 ? -errno : 0;
    if (fd >= 0) close(fd);
    if (rc < 0) snprintf(err, errlen, "%s: fsync: %s", dir, strerror(-rc));
  }
out:
  zt_st_close(f);
  free(s);
  free(buf);
  return rc < 0 ? rc : 0;
}
