/* Hugging Face directories as models (engine/model/hf.h) and the spec's model object:
 * config.json of each model_type into zt_model_cfg, RoPE in transformers 5's rope_parameters and
 * the hub's rope_theta + rope_scaling ("rope_type" or "type"), every refusal naming its field
 * (and no byte of the user's file in a message); the weights of a single-file and of a sharded
 * directory read a unit at a time bitwise as written, tied checkpoints without lm_head.weight,
 * GPT-2's "transformer." names and longer position table; a bad directory (a missing shard, an
 * index naming a file outside it or a tensor its shard lacks, a shard holding a tensor the index
 * does not map there, a wrong shape, a dtype zt does not read) refused with the file and tensor
 * named before any data is read; {"hf", "seq_len"} through the config reader and back; the llama
 * spec fields, their defaults and refusals. */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/model/hf.h"
#include "engine/model/safetensors.h"
#include "engine/train/config.h"
#include "tests/unit/model/mcheck.h"

static char root[512];

static const char *dir_of(const char *name) {
  static char p[700];
  snprintf(p, sizeof p, "%s/%s", root, name);
  mkdir(p, 0755);
  return p;
}

static void put(const char *dir, const char *file, const char *text) {
  char p[1024];
  snprintf(p, sizeof p, "%s/%s", dir, file);
  FILE *f = fopen(p, "w");
  if (!f || fputs(text, f) < 0 || fclose(f) != 0) exit(1);
}

/* A tiny Llama's config.json, extra's members (JSON text of members, or "") replacing or added
 * to the base's. */
static void llama_config(const char *dir, const char *type, const char *extra) {
  char t[2048];
  snprintf(t, sizeof t,
           "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", \"hidden_size\": 16, "
           "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 24, "
           "\"num_hidden_layers\": 2, \"vocab_size\": 32, \"max_position_embeddings\": 64, "
           "\"rms_norm_eps\": 1e-06, \"hidden_act\": \"silu\", \"head_dim\": null, "
           "\"pad_token_id\": null}",
           !strcmp(type, "llama")     ? "LlamaForCausalLM"
           : !strcmp(type, "mistral") ? "MistralForCausalLM"
           : !strcmp(type, "qwen2")   ? "Qwen2ForCausalLM"
                                      : "Qwen3ForCausalLM",
           type);
  json_error_t je;
  json_t *o = json_loads(t, 0, &je);
  char x[1024];
  snprintf(x, sizeof x, "{%s}", extra);
  json_t *e = json_loads(x, 0, &je);
  if (!o || !e || json_object_update(o, e) < 0) exit(1);
  char *text = json_dumps(o, 0);
  put(dir, "config.json", text);
  free(text);
  json_decref(o);
  json_decref(e);
}

static int read_ok(const char *dir, int seq_len, zt_model_cfg *c, const char *what) {
  char err[512];
  int rc = zt_hf_config_read(dir, seq_len, c, err, sizeof err);
  return MC_EXPECT(rc == 0, "%s: %s", what, err);
}

/* refused naming `field` (a substring of the message), and nothing of `secret` in it */
static int refused(const char *dir, int seq_len, const char *field, const char *secret) {
  char err[512] = "";
  zt_model_cfg c;
  int rc = zt_hf_config_read(dir, seq_len, &c, err, sizeof err);
  return MC_EXPECT(rc < 0 && strstr(err, field) && (!secret || !strstr(err, secret)),
                   "expected a refusal naming %s: %d \"%s\"", field, rc, err);
}

static int test_configs(void) {
  int fails = 0;
  zt_model_cfg c;
  const char *d = dir_of("cfg");
  /* transformers 5's rope_parameters, llama3 */
  llama_config(d, "llama", "\"tie_word_embeddings\": true, \"rope_parameters\": {\"rope_theta\": "
               "500000.0, \"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
               "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 16}");
  fails += read_ok(d, 32, &c, "llama3 rope_parameters");
  fails += MC_EXPECT(c.arch == ZT_ARCH_LLAMA && c.hf_type == ZT_HF_LLAMA && c.d_model == 16 &&
                     c.n_heads == 4 && c.n_kv_heads == 2 && c.head_dim == 0 && c.d_ff == 24 &&
                     c.n_layers == 2 && c.vocab == 32 && c.seq_len == 32 &&
                     c.rms_eps == 1e-6f && c.tie_embeddings && !c.qkv_bias && !c.qk_norm &&
                     c.rope_theta == 500000.0f && c.rope_scaling.type == ZT_ROPE_LLAMA3 &&
                     c.rope_scaling.factor == 8.0f && c.rope_scaling.low_freq_factor == 1.0f &&
                     c.rope_scaling.high_freq_factor == 4.0f &&
                     c.rope_scaling.original_max_position_embeddings == 16 &&
                     !strcmp(c.hf_dir, d) && !c.init_path[0],
                     "llama3 config read as %d %d %d %d %g", c.d_model, c.n_heads, c.n_kv_heads,
                     c.d_ff, (double)c.rope_theta);
  /* the hub's 4.x form: rope_theta and rope_scaling with "type" */
  llama_config(d, "llama", "\"rope_theta\": 10000.0, \"rope_scaling\": {\"type\": \"linear\", "
               "\"factor\": 2.0}, \"attention_bias\": false, \"mlp_bias\": false");
  fails += read_ok(d, 64, &c, "linear rope_scaling");
  fails += MC_EXPECT(c.rope_scaling.type == ZT_ROPE_LINEAR && c.rope_scaling.factor == 2.0f &&
                     c.rope_theta == 10000.0f && !c.tie_embeddings,
                     "4.x linear: %d %g %g", c.rope_scaling.type, (double)c.rope_scaling.factor,
                     (double)c.rope_theta);
  llama_config(d, "llama", "\"rope_theta\": 500000.0, \"rope_scaling\": {\"rope_type\": "
               "\"llama3\", \"factor\": 32.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": "
               "4.0, \"original_max_position_embeddings\": 8192}");
  fails += read_ok(d, 64, &c, "4.x llama3");
  fails += MC_EXPECT(c.rope_scaling.type == ZT_ROPE_LLAMA3 && c.rope_scaling.factor == 32.0f &&
                     c.rope_scaling.original_max_position_embeddings == 8192, "4.x llama3");
  llama_config(d, "llama", "\"rope_scaling\": null");
  fails += read_ok(d, 64, &c, "defaults");
  fails += MC_EXPECT(c.rope_theta == 10000.0f && c.rope_scaling.type == ZT_ROPE_NONE &&
                     c.n_kv_heads == 2, "the defaults: theta %g", (double)c.rope_theta);
  /* Qwen2 has q/k/v biases whatever attention_bias says; Qwen3 the q/k norms and head_dim */
  llama_config(d, "qwen2", "\"use_sliding_window\": false, \"sliding_window\": 4, "
               "\"layer_types\": [\"full_attention\", \"full_attention\"]");
  fails += read_ok(d, 32, &c, "qwen2");
  fails += MC_EXPECT(c.hf_type == ZT_HF_QWEN2 && c.qkv_bias && !c.qk_norm, "qwen2 biases");
  llama_config(d, "qwen3", "\"head_dim\": 32, \"attention_bias\": false");
  fails += read_ok(d, 32, &c, "qwen3");
  fails += MC_EXPECT(c.hf_type == ZT_HF_QWEN3 && c.qk_norm && c.head_dim == 32 && !c.qkv_bias,
                     "qwen3: q/k norm, head_dim %d", c.head_dim);
  /* Mistral's window: null or at least seq_len trains as full attention */
  llama_config(d, "mistral", "\"sliding_window\": 32");
  fails += read_ok(d, 32, &c, "mistral window 32 at 32");
  fails += refused(d, 33, "sliding_window", NULL);
  llama_config(d, "mistral", "\"sliding_window\": null");
  fails += read_ok(d, 64, &c, "mistral without a window");

  static const struct {
    const char *type, *extra, *field;
  } bad[] = {
      {"qwen2", "\"use_sliding_window\": true", "use_sliding_window"},
      {"qwen3", "\"layer_types\": [\"full_attention\", \"sliding_attention\"]", "layer_types[1]"},
      {"llama", "\"num_local_experts\": 8", "num_local_experts"},
      {"qwen2", "\"num_experts\": 4", "num_experts"},
      {"llama", "\"hidden_act\": \"gelu\"", "hidden_act"},
      {"llama", "\"attention_bias\": true", "attention_bias"},
      {"qwen3", "\"attention_bias\": true", "attention_bias"},
      {"llama", "\"mlp_bias\": true", "mlp_bias"},
      {"llama", "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}", "rope_type"},
      {"llama", "\"rope_parameters\": {\"rope_type\": \"dynamic\", \"factor\": 2.0}",
       "rope_parameters.rope_type"},
      {"llama", "\"rope_scaling\": {\"type\": \"linear\"}", "rope_scaling.factor"},
      {"llama", "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}",
       "low_freq_factor"},
      {"llama", "\"partial_rotary_factor\": 0.5", "partial_rotary_factor"},
      {"llama", "\"quantization_config\": {\"quant_method\": \"awq\"}", "quantization_config"},
      {"llama", "\"num_key_value_heads\": 3", "model.n_kv_heads must divide model.n_heads"},
      {"llama", "\"vocab_size\": \"32\"", "vocab_size"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    llama_config(d, bad[i].type, bad[i].extra);
    fails += refused(d, 32, bad[i].field, NULL);
  }
  fails += refused(d, 65, "max_position_embeddings", NULL);
  /* the user's bytes stay out of messages: a model_type or a JSON error near them */
  put(d, "config.json", "{\"model_type\": \"s3cr3t-type\", \"hidden_size\": 8}");
  fails += refused(d, 8, "model_type", "s3cr3t");
  put(d, "config.json", "{\"model_type\": \"llama\", s3cr3t}");
  fails += refused(d, 8, "not valid JSON", "s3cr3t");
  put(d, "config.json", "{\"model_type\": \"llama\", \"architectures\": [\"LlamaModel\"]}");
  fails += refused(d, 8, "architectures", NULL);
  put(d, "config.json", "{\"model_type\": \"llama\", \"hidden_size\": 16}");
  fails += refused(d, 8, "num_attention_heads is required", NULL);
  fails += refused(dir_of("nothing"), 8, "config.json: No such file", NULL);
  /* GPT-2: its names, tied, its position table */
  put(d, "config.json", "{\"architectures\": [\"GPT2LMHeadModel\"], \"model_type\": \"gpt2\", "
      "\"n_embd\": 16, \"n_head\": 2, \"n_layer\": 2, \"n_positions\": 64, \"n_inner\": null, "
      "\"vocab_size\": 32, \"activation_function\": \"gelu_new\", \"resid_pdrop\": 0.1}");
  fails += read_ok(d, 32, &c, "gpt2");
  fails += MC_EXPECT(c.arch == ZT_ARCH_GPT && c.hf_type == ZT_HF_GPT2 && c.n_positions == 64 &&
                     c.seq_len == 32 && c.d_ff == 0, "gpt2: %d %d", c.arch, c.n_positions);
  put(d, "config.json", "{\"model_type\": \"gpt2\", \"n_embd\": 16, \"n_head\": 2, \"n_layer\": "
      "2, \"vocab_size\": 32, \"activation_function\": \"relu\"}");
  fails += refused(d, 32, "activation_function", NULL);
  put(d, "config.json", "{\"model_type\": \"gpt2\", \"n_embd\": 16, \"n_head\": 2, \"n_layer\": "
      "2, \"vocab_size\": 32, \"tie_word_embeddings\": false}");
  fails += refused(d, 32, "tie_word_embeddings", NULL);
  return fails;
}

/* The tensors [first, end) of m with values from p into path (F32). */
static int write_shard(const zt_model *m, const float *p, int first, int end, const char *path,
                       const char *skip) {
  char err[512];
  zt_st_entry e[64];
  int n = 0;
  for (int i = first; i < end; i++) {
    const zt_tensor_info *t = zt_model_tensor(m, i);
    if (skip && !strcmp(t->name, skip)) continue;
    e[n++] = (zt_st_entry){.name = t->name, .ndim = t->ndim, .shape = {t->shape[0], t->shape[1]},
                           .data = p + t->offset};
  }
  return MC_EXPECT(zt_st_write(path, e, n, NULL, 0, err, sizeof err) == 0, "%s", err);
}

/* An index of m's tensors but `skip`: those before `split` in shard 1, the rest in shard 2;
 * `extra` is JSON text of more weight_map members. */
static void write_index(const char *dir, const zt_model *m, int split, const char *extra,
                        const char *skip) {
  size_t cap = 65536, len = 0;
  char *t = malloc(cap);
  len += (size_t)snprintf(t + len, cap - len, "{\"metadata\": {}, \"weight_map\": {");
  for (int i = 0; i < zt_model_num_tensors(m); i++)
    if (!skip || strcmp(skip, zt_model_tensor(m, i)->name))
      len += (size_t)snprintf(t + len, cap - len,
                              "%s\"%s\": \"model-0000%d-of-00002.safetensors\"", i ? ", " : "",
                              zt_model_tensor(m, i)->name, i < split ? 1 : 2);
  snprintf(t + len, cap - len, "%s%s}}", extra[0] ? ", " : "", extra);
  put(dir, "model.safetensors.index.json", t);
  free(t);
}

/* Units read backwards from dir through zt_model_file, compared with want. */
static int reads_back(const zt_model *m, const char *dir, const float *want, const char *what) {
  static const char *const params[] = {""};
  char err[512];
  zt_model_file *f = NULL;
  size_t n = zt_model_num_params(m);
  float *r = malloc(n * sizeof *r);
  memset(r, 0xff, n * sizeof *r);
  int fails = MC_EXPECT(zt_model_file_open(&f, m, dir, params, 1, 0, err, sizeof err) == 0,
                        "%s: %s", what, err);
  for (int u = zt_model_num_units(m) - 1; f && u >= 0; u--) {
    const zt_unit_info *ui = zt_model_unit(m, u);
    fails += MC_EXPECT(zt_model_file_read(f, 0, ui->first_tensor,
                                          ui->first_tensor + ui->n_tensors, r + ui->offset, err,
                                          sizeof err) == 0, "%s: %s", what, err);
  }
  fails += MC_EXPECT(f && !memcmp(r, want, n * sizeof *r), "%s: the weights read differ", what);
  zt_model_file_close(f);
  free(r);
  return fails;
}

static int dir_refused(const zt_model *m, const char *dir, const char *want1, const char *want2) {
  static const char *const params[] = {""};
  char err[512] = "";
  zt_model_file *f = NULL;
  int rc = zt_model_file_open(&f, m, dir, params, 1, 0, err, sizeof err);
  zt_model_file_close(f);
  return MC_EXPECT(rc < 0 && strstr(err, want1) && (!want2 || strstr(err, want2)),
                   "expected a refusal naming %s%s%s: %d \"%s\"", want1, want2 ? " and " : "",
                   want2 ? want2 : "", rc, err);
}

static int test_weights(void) {
  char err[512], p[1024];
  int fails = 0;
  zt_model_cfg c;
  const char *d = dir_of("qwen3");
  llama_config(d, "qwen3", "\"head_dim\": 6, \"tie_word_embeddings\": true");
  if (read_ok(d, 16, &c, "qwen3 dir")) return 1;
  zt_model *m = NULL;
  if (zt_model_create(&m, &c, err, sizeof err) < 0) return MC_EXPECT(0, "%s", err);
  size_t n = zt_model_num_params(m);
  int nt = zt_model_num_tensors(m), split = zt_model_unit(m, 2)->first_tensor;
  float *w = malloc(n * sizeof *w);
  uint64_t s = 9;
  for (size_t i = 0; i < n; i++) w[i] = (float)mc_uniform(&s, -1, 1);
  /* single file; tied: no lm_head.weight, and one carried anyway is ignored */
  snprintf(p, sizeof p, "%s/model.safetensors", d);
  fails += write_shard(m, w, 0, nt, p, NULL);
  fails += reads_back(m, d, w, "model.safetensors");
  /* sharded: the index wins over a model.safetensors beside it */
  snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", d);
  fails += write_shard(m, w, 0, split, p, NULL);
  snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", d);
  fails += write_shard(m, w, split, nt, p, NULL);
  write_index(d, m, split, "", NULL);
  fails += reads_back(m, d, w, "two shards");
  /* the trainer's init from the directory is the same */
  zt_train_cfg tc = mc_train(1, 1);
  zt_backend be = mc_backend();
  zt_trainer *t = NULL;
  fails += MC_EXPECT(zt_trainer_open(&t, &c, &tc, &be, err, sizeof err) == 0, "open: %s", err);
  float *got = malloc(n * sizeof *got);
  if (t) zt_trainer_get_state(t, got, NULL, NULL);
  fails += MC_EXPECT(t && !memcmp(got, w, n * sizeof *w), "the trainer's init from the directory");
  zt_trainer_close(t);
  zt_backend_cpu_close(&be);
  free(got);

  const char *t0 = zt_model_tensor(m, 0)->name, *tl = zt_model_tensor(m, nt - 1)->name;
  /* the index names a shard that is not there */
  write_index(d, m, split,
              "\"model.extra.weight\": \"model-00003-of-00003.safetensors\"", NULL);
  fails += dir_refused(m, d, "model-00003-of-00003.safetensors: No such file",
                       "model.extra.weight");
  /* a file outside the directory, or a name not to print */
  write_index(d, m, split,
              "\"model.extra.weight\": \"../model-00001-of-00002.safetensors\"", NULL);
  fails += dir_refused(m, d, "weight_map.model.extra.weight must name a .safetensors file", NULL);
  write_index(d, m, split,
              "\"model.s3cr3t\\n\": \"model-00001-of-00002.safetensors\"", NULL);
  fails += dir_refused(m, d, "characters outside", NULL);
  /* the index maps a tensor to a shard that lacks it; a shard holds one the index maps
   * elsewhere */
  write_index(d, m, split,
              "\"model.extra.weight\": \"model-00001-of-00002.safetensors\"", NULL);
  fails += dir_refused(m, d, "maps tensor model.extra.weight to model-00001-of-00002", NULL);
  snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", d);
  fails += write_shard(m, w, 0, nt, p, NULL);
  write_index(d, m, split, "", NULL);
  fails += dir_refused(m, d, "model-00002-of-00002.safetensors: holds tensor", t0);
  /* a tensor the index names but its shard lacks; one neither holds */
  fails += write_shard(m, w, split, nt, p, tl);
  fails += dir_refused(m, d, "which does not hold it", tl);
  write_index(d, m, split, "", tl);
  fails += dir_refused(m, d, "is missing", tl);
  write_index(d, m, split, "", NULL);
  /* a tensor of the wrong shape, or of a dtype zt does not read (I32 of the same size) */
  zt_model_cfg wide = c;
  wide.d_ff = 32;
  zt_model *mw = NULL;
  if (zt_model_create(&mw, &wide, err, sizeof err) < 0) return MC_EXPECT(0, "%s", err);
  float *ww = calloc(zt_model_num_params(mw), sizeof *ww);
  fails += write_shard(mw, ww, split, nt, p, NULL);
  fails += dir_refused(m, d, "model-00002-of-00002.safetensors: tensor", "has shape");
  fails += write_shard(m, w, split, nt, p, NULL);
  FILE *f = fopen(p, "r+b");
  char head[4096];
  size_t got_h = f ? fread(head, 1, sizeof head - 1, f) : 0;
  head[got_h] = 0;
  char *at = got_h > 8 ? strstr(head + 8, "F32") : NULL;
  if (f && at) {
    fseek(f, at - head, SEEK_SET);
    fputc('I', f);
  }
  if (f) fclose(f);
  fails += dir_refused(m, d, "model-00002-of-00002.safetensors: tensor", "dtype does not convert");
  /* neither file */
  fails += dir_refused(m, dir_of("empty"), "holds neither model.safetensors", NULL);
  zt_model_destroy(mw);
  free(ww);

  /* GPT-2: "transformer." names, a position table longer than seq_len, a tied lm_head.weight */
  const char *g = dir_of("gpt2");
  put(g, "config.json", "{\"model_type\": \"gpt2\", \"n_embd\": 16, \"n_head\": 2, \"n_layer\": "
      "2, \"n_positions\": 12, \"vocab_size\": 32}");
  zt_model_cfg gc;
  zt_model *gm = NULL;
  if (read_ok(g, 8, &gc, "gpt2 dir") || zt_model_create(&gm, &gc, err, sizeof err) < 0)
    return 1;
  fails += MC_EXPECT(zt_model_tensor(gm, 1)->shape[0] == 12, "wpe has %lld rows",
                     (long long)zt_model_tensor(gm, 1)->shape[0]);
  size_t gn = zt_model_num_params(gm);
  float *gw = malloc(gn * sizeof *gw);
  for (size_t i = 0; i < gn; i++) gw[i] = (float)mc_uniform(&s, -1, 1);
  zt_model_state st = {"", gw};
  snprintf(p, sizeof p, "%s/flat.safetensors", root);
  fails += MC_EXPECT(zt_model_save_states(gm, p, &st, 1, 0, NULL, err, sizeof err) == 0, "%s", err);
  int ng = zt_model_num_tensors(gm);
  zt_st_entry *e = calloc((size_t)ng + 1, sizeof *e);
  char (*names)[128] = calloc((size_t)ng, sizeof *names);
  zt_st_file *flat = NULL;
  fails += MC_EXPECT(zt_st_open(&flat, p, err, sizeof err) == 0, "%s", err);
  float *tmp = malloc(gn * sizeof *tmp);
  size_t off = 0;
  for (int i = 0; flat && i < ng; i++) {
    const zt_st_tensor *ft = zt_st_tensor_at(flat, i);
    snprintf(names[i], sizeof names[i], "transformer.%s", ft->name);
    zt_st_read_f32(flat, ft, tmp + off, 0, err, sizeof err);
    e[i] = (zt_st_entry){.name = names[i], .ndim = ft->ndim, .shape = {ft->shape[0], ft->shape[1]},
                         .data = tmp + off};
    off += ft->numel;
  }
  e[ng] = (zt_st_entry){.name = "lm_head.weight", .ndim = 2, .shape = {32, 16}, .data = gw};
  snprintf(p, sizeof p, "%s/model.safetensors", g);
  fails += MC_EXPECT(zt_st_write(p, e, ng + 1, NULL, 0, err, sizeof err) == 0, "%s", err);
  fails += reads_back(gm, g, gw, "gpt2 directory");
  zt_st_close(flat);
  free(tmp);
  free(e);
  free(names);
  free(gw);
  zt_model_destroy(gm);
  zt_model_destroy(m);
  free(w);
  return fails;
}

static int model_json(const char *text, zt_model_cfg *c, char *err, size_t errlen) {
  json_error_t je;
  json_t *o = json_loads(text, 0, &je);
  if (!o) {
    snprintf(err, errlen, "bad test JSON: %s", je.text);
    return -EINVAL;
  }
  int rc = zt_config_model_from_json(o, c, err, errlen);
  json_decref(o);
  return rc;
}

static int test_spec(void) {
  char err[512], t[2048];
  int fails = 0;
  zt_model_cfg c, back;
  const char *d = dir_of("spec");
  llama_config(d, "llama", "");
  snprintf(t, sizeof t, "{\"hf\": \"%s\", \"seq_len\": 16}", d);
  fails += MC_EXPECT(model_json(t, &c, err, sizeof err) == 0 && c.arch == ZT_ARCH_LLAMA &&
                     c.seq_len == 16 && !strcmp(c.hf_dir, d), "hf spec: %s", err);
  json_t *j = zt_config_model_to_json(&c);
  fails += MC_EXPECT(j && json_object_size(j) == 2 &&
                     !strcmp(json_string_value(json_object_get(j, "hf")), d) &&
                     json_integer_value(json_object_get(j, "seq_len")) == 16,
                     "hf to_json writes what was given");
  json_decref(j);
  static const char *const with[] = {"\"arch\": \"llama\"", "\"d_model\": 16",
                                     "\"init\": {\"seed\": 1}", "\"n_kv_heads\": 2"};
  for (size_t i = 0; i < sizeof with / sizeof with[0]; i++) {
    snprintf(t, sizeof t, "{\"hf\": \"%s\", \"seq_len\": 16, %s}", d, with[i]);
    fails += MC_EXPECT(model_json(t, &c, err, sizeof err) == -EINVAL &&
                       strstr(err, "not with model.hf"), "hf with %s: %s", with[i], err);
  }
  snprintf(t, sizeof t, "{\"hf\": \"%s\"}", d);
  fails += MC_EXPECT(model_json(t, &c, err, sizeof err) == -EINVAL &&
                     strstr(err, "model.seq_len is required"), "hf without seq_len: %s", err);
  fails += MC_EXPECT(model_json("{\"hf\": \"rel/dir\", \"seq_len\": 8}", &c, err, sizeof err) ==
                     -EINVAL && strstr(err, "model.hf must be an absolute path"), "%s", err);

  /* a random-init llama: the defaults, and every field written back */
#define LLAMA "\"arch\": \"llama\", \"vocab\": 32, \"seq_len\": 8, \"d_model\": 16, " \
              "\"n_heads\": 4, \"n_layers\": 2"
  fails += MC_EXPECT(model_json("{" LLAMA "}", &c, err, sizeof err) == 0 && c.rms_eps == 1e-5f &&
                     c.rope_theta == 10000.0f && !c.n_kv_heads && !c.tie_embeddings &&
                     c.rope_scaling.type == ZT_ROPE_NONE, "llama defaults: %s", err);
  fails += MC_EXPECT(model_json("{" LLAMA ", \"n_kv_heads\": 2, \"head_dim\": 6, \"rms_eps\": "
                                "1e-6, \"rope_theta\": 500000, \"rope_scaling\": {\"type\": "
                                "\"llama3\", \"factor\": 8, \"low_freq_factor\": 1, "
                                "\"high_freq_factor\": 4, \"original_max_position_embeddings\": "
                                "8192}, \"tie_embeddings\": true, \"qkv_bias\": true, "
                                "\"qk_norm\": true}", &c, err, sizeof err) == 0,
                     "llama fields: %s", err);
  j = zt_config_model_to_json(&c);
  fails += MC_EXPECT(zt_config_model_from_json(j, &back, err, sizeof err) == 0 &&
                     !memcmp(&c, &back, sizeof c), "llama round trip: %s", err);
  json_decref(j);
  static const struct {
    const char *text, *field;
  } bad[] = {
      {"{" LLAMA ", \"n_kv_heads\": 3}", "model.n_kv_heads must divide model.n_heads (4 % 3"},
      {"{" LLAMA ", \"head_dim\": 5}", "model.head_dim must be even"},
      {"{" LLAMA ", \"rms_eps\": 0}", "model.rms_eps"},
      {"{" LLAMA ", \"rope_scaling\": {\"type\": \"yarn\"}}", "model.rope_scaling.type"},
      {"{" LLAMA ", \"rope_scaling\": {\"type\": \"linear\"}}", "model.rope_scaling.factor"},
      {"{" LLAMA ", \"rope_scaling\": {\"type\": \"llama3\", \"factor\": 8}}",
       "low_freq_factor < high_freq_factor"},
      {"{" LLAMA ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2, \"low_freq_factor\": "
       "1}}", "apply to type llama3 only"},
      {"{\"arch\": \"gpt\", \"vocab\": 32, \"seq_len\": 8, \"d_model\": 16, \"n_heads\": 4, "
       "\"n_layers\": 2, \"n_kv_heads\": 2}", "model.n_kv_heads applies to arch llama only"},
      {"{\"arch\": \"encoder\", \"vocab\": 32, \"seq_len\": 8, \"d_model\": 16, \"n_heads\": 4, "
       "\"n_layers\": 2, \"qk_norm\": false}", "model.qk_norm applies to arch llama only"},
      {"{\"arch\": \"gpt2\", \"vocab\": 32}", "model.arch must be"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    err[0] = 0;
    fails += MC_EXPECT(model_json(bad[i].text, &c, err, sizeof err) == -EINVAL &&
                       strstr(err, bad[i].field), "%s: expected %s, got \"%s\"", bad[i].text,
                       bad[i].field, err);
  }
  /* the same checks for a cfg made in C */
  c = mc_tiny(ZT_ARCH_GPT);
  c.rope_theta = 1;
  fails += MC_EXPECT(zt_model_cfg_check(&c, err, sizeof err) == -EINVAL &&
                     strstr(err, "model.rope_theta applies to arch llama only"), "%s", err);
  c = mc_tiny(ZT_ARCH_LLAMA);
  c.head_dim = 6, c.n_heads = 3;  /* with head_dim, n_heads need not divide d_model */
  c.n_kv_heads = 1;
  fails += MC_EXPECT(zt_model_cfg_check(&c, err, sizeof err) == 0, "head_dim 6 x 3: %s", err);
  c.head_dim = 0;
  fails += MC_EXPECT(zt_model_cfg_check(&c, err, sizeof err) == -EINVAL &&
                     strstr(err, "model.n_heads must divide model.d_model"), "%s", err);
  return fails;
}

int main(void) {
  snprintf(root, sizeof root, "%s", mc_tmpdir());
  int fails = test_configs() + test_weights() + test_spec();
  mc_rmtree(root);
  if (fails) {
    fprintf(stderr, "%d failure(s)\n", fails);
    return 1;
  }
  printf("hf directories: ok\n");
  return 0;
}
