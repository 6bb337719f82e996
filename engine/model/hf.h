/* Hugging Face model directories as models (engine/model/hf.c): config.json read into a
 * zt_model_cfg (called by the config reader, engine/train/config.c), and the directory's
 * safetensors files, model.safetensors or model.safetensors.index.json and its shards, as one
 * set of named tensors (called by model.c's zt_model_file_open when its path is a directory).
 * Nothing of a user's file but the tensor names of a valid safetensors header goes into a
 * message. And the way back (engine/model/hf_export.c; called by the job layer's export,
 * engine/job/export_hf.c): a model's weights as a directory that transformers'
 * from_pretrained loads. */
#ifndef ZT_MODEL_HF_H
#define ZT_MODEL_HF_H

#include <jansson.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/model/model.h"
#include "engine/model/safetensors.h"

/* The model of DIR/config.json (model_type llama, mistral, qwen2, qwen3 or gpt2) trained at
 * seq_len tokens (at most its max_position_embeddings / n_positions): c is filled from scratch
 * (hf_dir = dir, hf_type, no init_path). What zt does not train is refused naming the field
 * (a sliding window shorter than seq_len, MoE, an activation other than silu, o_proj or MLP
 * biases, a rope_type other than default, linear or llama3, ...). 0, or -EINVAL / the errno of
 * reading the file, with a message. */
int zt_hf_config_read(const char *dir, int seq_len, zt_model_cfg *c, char *err, size_t errlen);
/* "llama", "mistral", "qwen2", "qwen3", "gpt2"; "" for ZT_HF_NONE */
const char *zt_hf_type_name(zt_hf_type t);
/* A JSON object from a regular file of at most 64 MiB (config.json, an index); messages carry
 * no byte of it. */
int zt__hf_load_json(const char *path, json_t **out, char *err, size_t errlen);

/* A set of safetensors files read as one: a file, or a directory's model.safetensors, or its
 * model.safetensors.index.json and every shard its weight_map names (each a plain file name in
 * the directory; every shard holding exactly the tensors the index maps to it). Every file's
 * header is checked when the set opens (zt_st_open); no data is read. */
typedef struct zt__st_set zt__st_set;
int zt__st_set_open(zt__st_set **s, const char *path, char *err, size_t errlen);
void zt__st_set_close(zt__st_set *s);
/* The tensor called name, the file that holds it (*file) and its index in the set (*index, for
 * zt__st_set_tensor_at), or NULL. */
const zt_st_tensor *zt__st_set_find(const zt__st_set *s, const char *name,
                                    const zt_st_file **file, int *index);
/* Every tensor of the set: i in [0, count), with its file. */
int zt__st_set_count(const zt__st_set *s);
const zt_st_tensor *zt__st_set_tensor_at(const zt__st_set *s, int i, const zt_st_file **file);

/* ---- export ------------------------------------------------------------------------------ */

typedef struct zt_hf_export_opts {
  zt_st_dtype dtype;          /* of the weights: ZT_ST_F32 or ZT_ST_BF16 */
  uint64_t max_shard_bytes;   /* a shard's tensor bytes at most (a larger tensor alone); 0:
                                 ZT_TUNE_HF_SHARD_BYTES */
  const atomic_int *stop;     /* NULL, or checked between chunks: set, the export ends -ECANCELED */
  char note[640];             /* out: "" or why the source directory's files were not used */
} zt_hf_export_opts;

/* dir/config.json for model m with weights of dtype dt: the class of its hf_type (a model made
 * from a spec: Qwen3 with qk_norm, Qwen2 with qkv_bias, else Llama; GPT-2 for gpt), every field
 * zt_hf_config_read maps, RoPE as rope_theta and rope_scaling (the hub's form, which
 * transformers 4 and 5 read), torch_dtype and dtype. A model read from a directory keeps the
 * other fields of that directory's config.json (token ids, a window, ...); when it cannot be
 * read, note (NULL, or notelen bytes) says why and the file is made from m alone. The file is
 * read back with zt_hf_config_read and must describe m (-EIO otherwise). -ENOTSUP for what no
 * Hugging Face class holds (encoder, q/k norm with q/k/v biases). */
int zt_hf_config_write(const zt_model *m, zt_st_dtype dt, const char *dir, char *note,
                       size_t notelen, char *err, size_t errlen);

/* The Hugging Face directory of model m into dir (an empty directory): config.json
 * (zt_hf_config_write); the weights of the safetensors file `weights` (m's tensors under their
 * names and file shapes: a checkpoint's model.safetensors) converted to o->dtype a chunk at a
 * time, under transformers' names (GPT-2's behind "transformer."; a tied head has no
 * lm_head.weight), as model.safetensors, or shards model-00001-of-0000N.safetensors of at most
 * o->max_shard_bytes and model.safetensors.index.json; and, for a model read from a directory,
 * the tokenizer and generation files found there (ZT_HF_AUX_FILES), copied. Every file is
 * fsynced, and dir. 0, or -errno with a message (what was written stays for the caller to
 * remove). */
int zt_hf_export(const zt_model *m, const char *weights, const char *dir, zt_hf_export_opts *o,
                 char *err, size_t errlen);

/* The files zt_hf_export copies from a model's source directory, those present. */
#define ZT_HF_AUX_FILES                                                                        \
  "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",                        \
      "generation_config.json", "tokenizer.model", "vocab.json", "merges.txt",                 \
      "added_tokens.json", "chat_template.jinja"

#endif
