/* The model and train configurations as JSON objects, with the struct field names as keys
 * (model: arch, vocab, seq_len, d_model, n_heads, n_layers, d_ff, init_seed, init_path;
 * train: steps, micro_batch, grad_accum, lr, beta1, beta2, eps, weight_decay, schedule
 * ("constant" | "cosine"), warmup_steps, min_lr, grad_clip, seed, precision ("fp32" | "bf16" |
 * "fp16"), tf32 (bool), and ckpt_every as "activation_checkpointing": {"every": k}). Used by trainer.json in checkpoints and by
 * ztrain's spec files. Unknown keys are refused, named. */
#ifndef ZT_TRAIN_CFG_JSON_H
#define ZT_TRAIN_CFG_JSON_H

#include <jansson.h>

#include "engine/train/trainer.h"

/* Fills c from o (unset optional fields: d_ff 0, init_seed 0, init_path ""); then checks it. */
int zt_model_cfg_from_json(const json_t *o, zt_model_cfg *c, char *err, size_t errlen);
json_t *zt_model_cfg_to_json(const zt_model_cfg *c);
/* Starts from zt_train_cfg_defaults, overrides the keys present, then checks. */
int zt_train_cfg_from_json(const json_t *o, zt_train_cfg *c, char *err, size_t errlen);
json_t *zt_train_cfg_to_json(const zt_train_cfg *c);
const char *zt_schedule_name(zt_schedule s);

/* A spec file: {"model": {...}, "train": {...}, ...}; other top-level keys are left to others. */
int zt_spec_load(const char *path, zt_model_cfg *mc, zt_train_cfg *tc, char *err, size_t errlen);

#endif
