/* The one JSON reader and writer of the model, train and offload configuration, in the job
 * spec's vocabulary (docs/spec.md is the normative text): ztd's job specs
 * (engine/job/spec.c), ztrain's specs (tools/ztrain.c) and the configuration a checkpoint's
 * trainer.json records (engine/train/checkpoint). Readers check types, ranges and the
 * model/train constraints; every error names the field by its full path. */
#ifndef ZT_TRAIN_CONFIG_H
#define ZT_TRAIN_CONFIG_H

#include <stddef.h>
#include <jansson.h>

#include "engine/model/model.h"
#include "engine/plan/recipe.h"

/* The "model" object: arch, vocab, seq_len, d_model, n_heads, n_layers, d_ff, init ({"seed": N}
 * or {"safetensors": "/abs/path"}), and for arch llama n_kv_heads, head_dim, rms_eps,
 * rope_theta, rope_scaling {type, factor, ...}, tie_embeddings, qkv_bias, qk_norm; or
 * {"hf": "/abs/dir", "seq_len": N}, a Hugging Face directory whose config.json is read here
 * (engine/model/hf.h). to_json writes what was given: every field with its default, or hf and
 * seq_len. */
int zt_config_model_from_json(const json_t *o, zt_model_cfg *c, char *err, size_t errlen);
/* The same without reading a file: model.hf gives c its hf_dir and seq_len only (hf_type
 * ZT_HF_NONE), for zt_config_model_read_hf to complete where a read may block (ztd parses on its
 * loop thread and reads on a worker). */
int zt_config_model_from_json_unread(const json_t *o, zt_model_cfg *c, char *err,
                                     size_t errlen);
/* config.json of an unread model.hf into c (0 at once for any other c). */
int zt_config_model_read_hf(zt_model_cfg *c, char *err, size_t errlen);
json_t *zt_config_model_to_json(const zt_model_cfg *c);
/* The "train" object: steps, micro_batch, grad_accum, precision, tf32, optimizer {name, lr,
 * betas, eps, weight_decay}, schedule {name, warmup_steps, min_lr}, grad_clip, seed,
 * activation_checkpointing {every}. Starts from zt_train_cfg_defaults. */
int zt_config_train_from_json(const json_t *o, zt_train_cfg *c, char *err, size_t errlen);
json_t *zt_config_train_to_json(const zt_train_cfg *c);
/* The "offload" object (docs/spec.md "Offload"). Starts from zt_offload_cfg_defaults. */
int zt_config_offload_from_json(const json_t *o, zt_offload_cfg *c, char *err, size_t errlen);
json_t *zt_config_offload_to_json(const zt_offload_cfg *c);

#endif
