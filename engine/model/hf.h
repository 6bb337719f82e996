/* Hugging Face model directories as models (engine/model/hf.c): config.json read into a
 * zt_model_cfg (called by the config reader, engine/train/config.c), and the directory's
 * safetensors files, model.safetensors or model.safetensors.index.json and its shards, as one
 * set of named tensors (called by model.c's zt_model_file_open when its path is a directory).
 * Nothing of a user's file but the tensor names of a valid safetensors header goes into a
 * message. */
#ifndef ZT_MODEL_HF_H
#define ZT_MODEL_HF_H

#include <stddef.h>

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

#endif
