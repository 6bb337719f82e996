/* The export to Hugging Face directories (engine/model/hf.h): config.json of every llama variant
 * and of GPT-2 made from a spec (the class by the layers: Llama, Qwen2 for q/k/v biases, Qwen3
 * for q/k norms), read back by zt's own reader into the same model, RoPE as rope_theta and
 * rope_scaling, decimals as written; the classes no Hugging Face model has refused; a model read
 * from a directory keeps that config.json's other fields and gets its tokenizer files, and one
 * whose directory is gone is exported from the model alone with a note; the weights of a
 * checkpoint file in fp32 (bitwise) and bf16 (each value rounded as dtype.h rounds), GPT-2's
 * "transformer." names, no lm_head.weight when tied, shards of at most the size asked with an
 * index that maps every tensor; a stop asked ends the export; a checkpoint lacking a tensor is
 * refused naming it. */
#include <errno.h>
#include <jansson.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/kernels/dtype.h"
#include "engine/model/hf.h"
#include "engine/model/safetensors.h"
#include "tests/unit/model/mcheck.h"

static char root[512];

/* root/name, made empty */
static const char *dir_of(const char *name) {
  static char p[700];
  snprintf(p, sizeof p, "%s/%s", root, name);
  mc_rmtree(p);
  mkdir(p, 0755);
  return p;
}

static void put_file(const char *dir, const char *file, const char *text) {
  char p[1024];
  snprintf(p, sizeof p, "%s/%s", dir, file);
  FILE *f = fopen(p, "w");
  if (!f || fputs(text, f) < 0 || fclose(f) != 0) exit(1);
}

static json_t *load(const char *dir, const char *file) {
  char p[1024];
  snprintf(p, sizeof p, "%s/%s", dir, file);
  json_error_t je;
  return json_load_file(p, 0, &je);
}

static int has_file(const char *dir, const char *file) {
  char p[1024];
  snprintf(p, sizeof p, "%s/%s", dir, file);
  return access(p, F_OK) == 0;
}

static const char *str(const json_t *o, const char *key) {
  const char *s = json_string_value(json_object_get(o, key));
  return s ? s : "";
}

/* config.json of cfg's model in dt: its class, the hub's RoPE form, dtype; zt_hf_config_write
 * reads it back itself and fails when it describes another model. */
static int check_config(const zt_model_cfg *cfg, const char *name, const char *want_type,
                        const char *want_cls) {
  int fails = 0;
  char err[512];
  zt_model *m = NULL;
  if (zt_model_create(&m, cfg, err, sizeof err) < 0) {
    fprintf(stderr, "FAIL %s: %s\n", name, err);
    return 1;
  }
  const char *d = dir_of("cfg");
  fails += MC_EXPECT(zt_hf_config_write(m, ZT_ST_BF16, d, NULL, 0, err, sizeof err) == 0,
                     "%s: %s", name, err);
  json_t *o = load(d, "config.json");
  fails += MC_EXPECT(o && !strcmp(str(o, "model_type"), want_type) &&
                     !strcmp(json_string_value(json_array_get(json_object_get(o, "architectures"),
                                                              0)), want_cls),
                     "%s: model_type %s, architectures %s", name, str(o, "model_type"), want_cls);
  fails += MC_EXPECT(!strcmp(str(o, "torch_dtype"), "bfloat16") &&
                     !strcmp(str(o, "dtype"), "bfloat16"), "%s: dtype", name);
  if (cfg->arch == ZT_ARCH_LLAMA) {
    const json_t *rs = json_object_get(o, "rope_scaling");
    fails += MC_EXPECT(json_is_real(json_object_get(o, "rope_theta")) &&
                       !json_object_get(o, "rope_parameters") &&
                       (cfg->rope_scaling.type == ZT_ROPE_NONE
                            ? json_is_null(rs)
                            : !strcmp(str(rs, "rope_type"), cfg->rope_scaling.type ==
                                                                    ZT_ROPE_LINEAR ? "linear"
                                                                                   : "llama3")),
                       "%s: RoPE in the hub's form", name);
    fails += MC_EXPECT(json_integer_value(json_object_get(o, "max_position_embeddings")) ==
                       cfg->seq_len, "%s: max_position_embeddings", name);
  }
  json_decref(o);
  zt_model_destroy(m);
  return fails;
}

static int test_configs(void) {
  int fails = 0;
  zt_model_cfg v[MC_LLAMA_VARIANTS];
  const char *names[MC_LLAMA_VARIANTS];
  int n = mc_llama_variants(v, names);
  for (int i = 0; i < n; i++) {
    const char *type = v[i].qk_norm ? "qwen3" : v[i].qkv_bias ? "qwen2" : "llama";
    const char *cls = v[i].qk_norm    ? "Qwen3ForCausalLM"
                      : v[i].qkv_bias ? "Qwen2ForCausalLM"
                                      : "LlamaForCausalLM";
    fails += check_config(&v[i], names[i], type, cls);
  }
  zt_model_cfg c = mc_tiny(ZT_ARCH_LLAMA);
  c.rms_eps = 1e-6f, c.rope_theta = 500000.0f;
  fails += check_config(&c, "llama tied eps 1e-6", "llama", "LlamaForCausalLM");
  /* the decimals a person would write, not fp32's binary expansions */
  char p[800];
  snprintf(p, sizeof p, "%s/cfg/config.json", root);
  FILE *f = fopen(p, "r");
  char text[4096] = "";
  size_t len = f ? fread(text, 1, sizeof text - 1, f) : 0;
  text[len] = 0;
  if (f) fclose(f);
  fails += MC_EXPECT(strstr(text, "\"rms_norm_eps\": 1e-6,") &&
                     strstr(text, "\"rope_theta\": 500000.0") && len && text[len - 1] == '\n',
                     "decimals as written: %s", text);
  zt_model_cfg g = mc_tiny(ZT_ARCH_GPT);
  fails += check_config(&g, "gpt", "gpt2", "GPT2LMHeadModel");
  snprintf(p, sizeof p, "%s/cfg", root);
  json_t *gj = load(p, "config.json");
  /* GPT2Config's default eos (50256) would lie outside this 256-token vocabulary */
  fails += MC_EXPECT(gj && json_is_null(json_object_get(gj, "bos_token_id")) &&
                     json_is_null(json_object_get(gj, "eos_token_id")),
                     "a spec's GPT-2 names no special tokens");
  json_decref(gj);
  g.d_ff = 24;
  fails += check_config(&g, "gpt d_ff 24", "gpt2", "GPT2LMHeadModel");
  /* no Hugging Face class for these */
  char err[512];
  zt_model *m = NULL;
  c = mc_tiny(ZT_ARCH_LLAMA);
  c.qk_norm = c.qkv_bias = 1;
  zt_model_cfg e = mc_tiny(ZT_ARCH_ENCODER);
  const zt_model_cfg *no[] = {&c, &e};
  const char *why[] = {"model.qk_norm with model.qkv_bias", "arch encoder"};
  for (int i = 0; i < 2; i++) {
    if (zt_model_create(&m, no[i], err, sizeof err) < 0) return fails + 1;
    int rc = zt_hf_config_write(m, ZT_ST_F32, dir_of("no"), NULL, 0, err, sizeof err);
    fails += MC_EXPECT(rc == -ENOTSUP && strstr(err, why[i]), "refused: %d %s", rc, err);
    zt_model_destroy(m);
  }
  return fails;
}

/* model.safetensors of m's seeded init in the checkpoint layout at root/ckpt.safetensors; the
 * parameters in *params. */
static const char *checkpoint_of(const zt_model *m, float **params) {
  static char p[700];
  char err[512];
  snprintf(p, sizeof p, "%s/ckpt.safetensors", root);
  *params = malloc(zt_model_num_params(m) * sizeof **params);
  zt_model_init_params(m, *params);
  zt_model_state s = {"", *params};
  if (zt_model_save_states(m, p, &s, 1, 0, NULL, err, sizeof err) < 0) {
    fprintf(stderr, "FAIL checkpoint: %s\n", err);
    exit(1);
  }
  return p;
}

/* The export of m's checkpoint in dt read back by zt's reader of directories: bitwise in fp32,
 * each value dtype.h's bf16 of it in bf16; the names transformers loads. */
static int check_weights(const zt_model_cfg *cfg, const char *name, zt_st_dtype dt,
                         uint64_t shard, int want_shards) {
  int fails = 0;
  char err[512];
  zt_model *m = NULL;
  float *p = NULL, *back = NULL;
  zt__st_set *set = NULL;
  if (zt_model_create(&m, cfg, err, sizeof err) < 0) return 1;
  const char *ck = checkpoint_of(m, &p), *d = dir_of("w");
  zt_hf_export_opts o = {.dtype = dt, .max_shard_bytes = shard};
  fails += MC_EXPECT(zt_hf_export(m, ck, d, &o, err, sizeof err) == 0, "%s: %s", name, err);
  size_t np = zt_model_num_params(m);
  back = calloc(np, sizeof *back);
  zt_model_state s = {"", back};
  fails += MC_EXPECT(zt_model_load_states(m, d, &s, 1, 0, err, sizeof err) == 0, "%s: %s", name,
                     err);
  size_t bad = 0;
  for (size_t i = 0; i < np; i++) {
    float want = dt == ZT_ST_BF16 ? zt_bf16_to_f32(zt_f32_to_bf16(p[i])) : p[i];
    bad += memcmp(&want, &back[i], 4) != 0;
  }
  fails += MC_EXPECT(bad == 0, "%s: %zu of %zu parameters differ", name, bad, np);
  fails += MC_EXPECT(has_file(d, "model.safetensors") == (want_shards == 1) &&
                     has_file(d, "model.safetensors.index.json") == (want_shards > 1),
                     "%s: one file or shards and an index", name);
  if (zt__st_set_open(&set, d, err, sizeof err) < 0) {
    fprintf(stderr, "FAIL %s: %s\n", name, err);
    fails++;
    goto out;
  }
  fails += MC_EXPECT(zt__st_set_count(set) == zt_model_num_tensors(m), "%s: %d tensors", name,
                     zt__st_set_count(set));
  const char *prefix = cfg->arch == ZT_ARCH_GPT ? "transformer." : "";
  for (int i = 0; i < zt__st_set_count(set); i++) {
    const zt_st_file *f;
    const zt_st_tensor *t = zt__st_set_tensor_at(set, i, &f);
    int tied = cfg->arch == ZT_ARCH_GPT || cfg->tie_embeddings;
    fails += MC_EXPECT(t->dtype == dt && !strncmp(t->name, prefix, strlen(prefix)) &&
                       (!tied || strcmp(t->name, "lm_head.weight")),
                       "%s: tensor %s", name, t->name);
  }
  if (want_shards > 1) {
    json_t *idx = load(d, "model.safetensors.index.json");
    json_t *wm = json_object_get(idx, "weight_map");
    uint64_t total = 0, per[16] = {0};
    char shard_name[64];
    for (int i = 0; i < zt__st_set_count(set); i++) {
      const zt_st_file *f;
      const zt_st_tensor *t = zt__st_set_tensor_at(set, i, &f);
      total += t->end - t->begin;
      for (int k = 0; k < want_shards && k < 16; k++) {
        snprintf(shard_name, sizeof shard_name, "model-%05d-of-%05d.safetensors", k + 1,
                 want_shards);
        if (strstr(zt_st_path(f), shard_name)) per[k] += t->end - t->begin;
      }
      fails += MC_EXPECT(strstr(zt_st_path(f), str(wm, t->name)), "%s: %s in the index", name,
                         t->name);
    }
    fails += MC_EXPECT(json_object_size(wm) == (size_t)zt__st_set_count(set) &&
                       (uint64_t)json_integer_value(json_object_get(
                           json_object_get(idx, "metadata"), "total_size")) == total,
                       "%s: the index's weight_map and total_size", name);
    /* a shard over the size holds one tensor: the llama's blocks here are larger */
    for (int k = 0; k < want_shards && k < 16; k++)
      fails += MC_EXPECT(per[k] > 0, "%s: shard %d is empty", name, k + 1);
    json_decref(idx);
  }
out:
  zt__st_set_close(set);
  zt_model_destroy(m);
  free(p);
  free(back);
  return fails;
}

static int test_weights(void) {
  int fails = 0;
  zt_model_cfg v[MC_LLAMA_VARIANTS];
  const char *names[MC_LLAMA_VARIANTS];
  int n = mc_llama_variants(v, names);
  for (int i = 0; i < n; i++) {
    fails += check_weights(&v[i], names[i], ZT_ST_F32, 0, 1);
    fails += check_weights(&v[i], names[i], ZT_ST_BF16, 0, 1);
  }
  zt_model_cfg g = mc_tiny(ZT_ARCH_GPT);
  fails += check_weights(&g, "gpt", ZT_ST_F32, 0, 1);
  fails += check_weights(&g, "gpt", ZT_ST_BF16, 0, 1);
  /* 1 byte a shard: a tensor a shard */
  zt_model *m = NULL;
  char err[256];
  if (zt_model_create(&m, &v[0], err, sizeof err) < 0) return fails + 1;
  int nt = zt_model_num_tensors(m);
  zt_model_destroy(m);
  fails += check_weights(&v[0], "llama a tensor a shard", ZT_ST_BF16, 1, nt);
  /* 2 KiB: small tensors share a shard, the 4 KiB MLP matrices are alone; the count as the
   * sizes give it */
  const uint64_t cap = 2048;
  if (zt_model_create(&m, &v[0], err, sizeof err) < 0) return fails + 1;
  int want = 0;
  uint64_t bytes = 0;
  for (int i = 0; i < nt; i++) {
    uint64_t b = zt_model_tensor(m, i)->numel * 4;
    if (want == 0 || (bytes > 0 && bytes + b > cap)) want++, bytes = 0;
    bytes += b;
  }
  zt_model_destroy(m);
  fails += MC_EXPECT(want > 2 && want < nt, "a split into %d shards", want);
  fails += check_weights(&v[0], "llama 2 KiB shards", ZT_ST_F32, cap, want);
  return fails;
}

/* A model read from a directory: that config.json's other fields kept, its tokenizer files
 * copied byte for byte; once the directory is gone, the model alone and a note. A stop and a
 * checkpoint lacking a tensor. */
static int test_source_dir(void) {
  int fails = 0;
  char err[512];
  const char *src = dir_of("src");
  char srcdir[700];
  snprintf(srcdir, sizeof srcdir, "%s", src);
  put_file(srcdir, "config.json",
           "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", "
           "\"hidden_size\": 16, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
           "\"intermediate_size\": 24, \"num_hidden_layers\": 2, \"vocab_size\": 32, "
           "\"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-06, \"hidden_act\": \"silu\", "
           "\"bos_token_id\": 7, \"eos_token_id\": [8, 9], \"use_sliding_window\": false, "
           "\"sliding_window\": 4096, \"max_window_layers\": 21, \"tie_word_embeddings\": true, "
           "\"rope_parameters\": {\"rope_theta\": 1000000.0, \"rope_type\": \"linear\", "
           "\"factor\": 4.0}, \"dtype\": \"float32\", \"transformers_version\": \"5.0.0\"}");
  put_file(srcdir, "tokenizer.json", "{\"version\": \"1.0\", \"model\": {\"type\": \"BPE\"}}");
  put_file(srcdir, "tokenizer_config.json", "{\"model_max_length\": 64}\n");
  put_file(srcdir, "generation_config.json", "{\"bos_token_id\": 7}");
  put_file(srcdir, "unrelated.txt", "not copied");
  zt_model_cfg c;
  zt_model *m = NULL;
  float *p = NULL;
  if (zt_hf_config_read(srcdir, 16, &c, err, sizeof err) < 0 ||
      zt_model_create(&m, &c, err, sizeof err) < 0) {
    fprintf(stderr, "FAIL source: %s\n", err);
    return 1;
  }
  const char *ck = checkpoint_of(m, &p);
  char out[700];
  snprintf(out, sizeof out, "%s", dir_of("out"));
  zt_hf_export_opts o = {.dtype = ZT_ST_F32};
  fails += MC_EXPECT(zt_hf_export(m, ck, out, &o, err, sizeof err) == 0 && !o.note[0], "%s", err);
  json_t *j = load(out, "config.json");
  fails += MC_EXPECT(json_integer_value(json_object_get(j, "bos_token_id")) == 7 &&
                     json_array_size(json_object_get(j, "eos_token_id")) == 2 &&
                     json_integer_value(json_object_get(j, "sliding_window")) == 4096 &&
                     json_integer_value(json_object_get(j, "max_window_layers")) == 21 &&
                     json_integer_value(json_object_get(j, "max_position_embeddings")) == 64,
                     "the source's other fields kept");
  fails += MC_EXPECT(!json_object_get(j, "rope_parameters") &&
                     !json_object_get(j, "transformers_version") &&
                     json_real_value(json_object_get(j, "rope_theta")) == 1e6 &&
                     !strcmp(str(json_object_get(j, "rope_scaling"), "rope_type"), "linear") &&
                     !strcmp(str(j, "torch_dtype"), "float32"),
                     "RoPE rewritten in the hub's form, the export's dtype");
  json_decref(j);
  char a[800], b[800];
  const char *copied[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json"};
  for (int i = 0; i < 3; i++) {
    snprintf(a, sizeof a, "%s/%s", srcdir, copied[i]);
    snprintf(b, sizeof b, "%s/%s", out, copied[i]);
    fails += mc_same_file(a, b);
  }
  fails += MC_EXPECT(!has_file(out, "unrelated.txt") && !has_file(out, "special_tokens_map.json"),
                     "only the tokenizer and generation files there");
  /* a FIFO where a tokenizer file would be: refused, not waited on */
  snprintf(a, sizeof a, "%s/tokenizer.model", srcdir);
  mkfifo(a, 0644);
  int rc = zt_hf_export(m, ck, dir_of("out"), &o, err, sizeof err);
  fails += MC_EXPECT(rc == -EINVAL && strstr(err, "tokenizer.model: not a regular file"),
                     "a FIFO: %d %s", rc, err);
  unlink(a);
  /* the source gone: exported from the model, a note saying why, no tokenizer */
  snprintf(a, sizeof a, "%s/config.json", srcdir);
  unlink(a);
  fails += MC_EXPECT(zt_hf_export(m, ck, dir_of("out"), &o, err, sizeof err) == 0 &&
                     strstr(o.note, "config.json") && !has_file(out, "tokenizer.json"),
                     "no source: %s / %s", err, o.note);
  j = load(out, "config.json");
  fails += MC_EXPECT(!strcmp(str(j, "model_type"), "qwen2") &&
                     json_is_null(json_object_get(j, "bos_token_id")) &&
                     json_is_null(json_object_get(j, "eos_token_id")), "the model alone");
  json_decref(j);
  /* a stop asked before the first chunk */
  atomic_int stop = 1;
  o.stop = &stop;
  rc = zt_hf_export(m, ck, dir_of("out"), &o, err, sizeof err);
  fails += MC_EXPECT(rc == -ECANCELED && strstr(err, "stopped"), "stop: %d %s", rc, err);
  o.stop = NULL;
  /* a checkpoint of another model (a layer less) lacks tensors */
  zt_model_cfg c1 = c;
  c1.n_layers = 1;
  c1.hf_dir[0] = 0, c1.hf_type = ZT_HF_NONE;
  zt_model *m1 = NULL;
  float *p1 = NULL;
  if (zt_model_create(&m1, &c1, err, sizeof err) < 0) return fails + 1;
  ck = checkpoint_of(m1, &p1);
  rc = zt_hf_export(m, ck, dir_of("out"), &o, err, sizeof err);
  fails += MC_EXPECT(rc == -EINVAL && strstr(err, "tensor model.layers.1.") &&
                     strstr(err, "missing"), "a tensor missing: %d %s", rc, err);
  zt_model_destroy(m1);
  zt_model_destroy(m);
  free(p);
  free(p1);
  return fails;
}

int main(void) {
  snprintf(root, sizeof root, "%s", mc_tmpdir());
  int fails = test_configs() + test_weights() + test_source_dir();
  mc_rmtree(root);
  return fails ? 1 : 0;
}
