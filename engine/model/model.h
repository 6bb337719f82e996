/* Architectures as data: a model is a flat fp32 parameter layout (named tensors with offsets),
 * cut into units (embeddings, each block, head) that are the grain of streaming for the offload
 * engine, plus the forward/backward that walks the units through the op interface. */
#ifndef ZT_MODEL_H
#define ZT_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include "engine/kernels/ops.h"

typedef enum zt_arch { ZT_ARCH_GPT = 1, ZT_ARCH_ENCODER = 2 } zt_arch;

#define ZT_PATH_MAX 4096

typedef struct zt_model_cfg {
  zt_arch arch;
  int vocab;
  int seq_len;    /* T: the longest sequence (gpt: size of the position table) */
  int d_model;    /* C */
  int n_heads;    /* NH */
  int n_layers;   /* L */
  int d_ff;       /* feed-forward width; 0 = the arch default (gpt 4C, encoder 2048) */
  uint64_t init_seed;                 /* used when init_path is empty */
  char init_path[ZT_PATH_MAX];        /* init.safetensors; "" = random init from init_seed */
} zt_model_cfg;

/* 0, or -EINVAL with a message naming the field ("model.n_heads must divide model.d_model"). */
int zt_model_cfg_check(const zt_model_cfg *cfg, char *err, size_t errlen);
const char *zt_arch_name(zt_arch a);
int zt_arch_parse(const char *s, zt_arch *out);

typedef struct zt_tensor_info {
  char name[96];        /* the checkpoint name (HF GPT-2 names / PyTorch state_dict names) */
  int ndim;
  int64_t shape[4];     /* as stored in the checkpoint file */
  int transposed;       /* 1: stored transposed relative to the internal (OC, C) layout (HF Conv1D) */
  size_t offset;        /* in floats, into the flat parameter buffer */
  size_t numel;
  int unit;             /* owning unit */
  int decay;            /* 1 if AdamW weight decay applies (matrices/embeddings, not biases/norms) */
} zt_tensor_info;

typedef struct zt_unit_info {
  char name[32];        /* "embed", "block.3", "head" */
  size_t offset;        /* first float of the unit's parameters in the flat buffer */
  size_t numel;         /* the unit's parameters are contiguous */
} zt_unit_info;

typedef struct zt_model zt_model;

/* Builds the layout for cfg; no backend memory yet. */
int zt_model_create(zt_model **m, const zt_model_cfg *cfg, char *err, size_t errlen);
void zt_model_destroy(zt_model *m);

const zt_model_cfg *zt_model_cfg_of(const zt_model *m);
size_t zt_model_num_params(const zt_model *m);
int zt_model_num_tensors(const zt_model *m);
const zt_tensor_info *zt_model_tensor(const zt_model *m, int i);
int zt_model_num_units(const zt_model *m);
const zt_unit_info *zt_model_unit(const zt_model *m, int i);

/* Host-side init of a flat parameter buffer (GPT-2 init from the seed; deterministic). */
void zt_model_init_params(const zt_model *m, float *params_host);

#endif
