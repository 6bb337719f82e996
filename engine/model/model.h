/* Architectures as data: a model is a flat fp32 parameter layout (named tensors with offsets),
 * cut into units (embeddings, each block, head) that are the grain of streaming for the offload
 * engine, plus the forward/backward that walks the units through the op interface. */
#ifndef ZT_MODEL_H
#define ZT_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include "engine/kernels/ops.h"

typedef enum zt_arch { ZT_ARCH_GPT = 1, ZT_ARCH_ENCODER = 2, ZT_ARCH_LLAMA = 3 } zt_arch;

#define ZT_PATH_MAX 4096

/* The bounds of every model dimension, far above anything trained here: they keep every size
 * representable and catch a typo before it turns into a huge allocation. zt_model_cfg_check and
 * the config reader (engine/train/config.c) use these; docs/spec.md lists them. */
#define ZT_MODEL_MAX_VOCAB (1 << 24)
#define ZT_MODEL_MAX_SEQ (1 << 17) /* 131072, Llama 3.1's context */
#define ZT_MODEL_MAX_DMODEL 65536
#define ZT_MODEL_MAX_LAYERS 1024
#define ZT_MODEL_MAX_DFF (1 << 20)
#define ZT_MODEL_MAX_PARAMS (1ull << 36)
#define ZT_MODEL_MAX_HEAD_DIM 1024
#define ZT_MODEL_MAX_ROPE_THETA 1e12

/* RoPE's frequency scaling (transformers' rope_type): none ("default"), "linear" (every
 * frequency divided by factor), "llama3" (Llama 3.1's: low frequencies divided by factor, high
 * ones kept, a smooth ramp between, bounded by original_max_position_embeddings over
 * low_freq_factor and high_freq_factor). */
typedef enum zt_rope_type { ZT_ROPE_NONE = 0, ZT_ROPE_LINEAR = 1, ZT_ROPE_LLAMA3 = 2 } zt_rope_type;

typedef struct zt_rope_scaling {
  zt_rope_type type;
  float factor;                           /* linear, llama3: >= 1 */
  float low_freq_factor, high_freq_factor; /* llama3: 0 < low < high */
  int original_max_position_embeddings;   /* llama3: >= 1 */
} zt_rope_scaling;

/* The Hugging Face model_type a model was read from (engine/model/hf.h), which names the class
 * an export writes; ZT_HF_NONE for a model made from a spec. */
typedef enum zt_hf_type {
  ZT_HF_NONE = 0, ZT_HF_LLAMA, ZT_HF_MISTRAL, ZT_HF_QWEN2, ZT_HF_QWEN3, ZT_HF_GPT2,
} zt_hf_type;

typedef struct zt_model_cfg {
  zt_arch arch;
  int vocab;
  int seq_len;    /* T: the longest sequence (gpt: size of the position table) */
  int d_model;    /* C */
  int n_heads;    /* NH */
  int n_layers;   /* L */
  int d_ff;       /* feed-forward width; 0 = the arch default (gpt and llama 4C, encoder 2048) */
  uint64_t init_seed;                 /* used when init_path is empty */
  char init_path[ZT_PATH_MAX];        /* init.safetensors; "" = random init from init_seed */
  /* init.job: a ztd job whose newest weights start this one; ztd links its checkpoint's
   * model.safetensors into the new job's directory and points init_path there. "" = none. */
  char init_job[24];
  /* Not in the spec: the caller loads a checkpoint over the initial state (ztd's resume), so the
   * open writes zeros where the init would go, without reading or drawing it. */
  int init_loaded;
  /* llama only (zt_model_cfg_check refuses them on the other archs): */
  int n_kv_heads;       /* key/value heads (grouped-query attention); 0 = n_heads */
  int head_dim;         /* hs; 0 = d_model / n_heads (then n_heads must divide d_model) */
  float rms_eps;        /* RMSNorm's eps, > 0 */
  float rope_theta;     /* RoPE's base, > 0 */
  zt_rope_scaling rope_scaling;
  int tie_embeddings;   /* 1: the LM head is the token embedding (no lm_head.weight) */
  int qkv_bias;         /* 1: q/k/v projections have biases (Qwen2) */
  int qk_norm;          /* 1: per-head RMSNorm of q and k before RoPE (Qwen3) */
  /* gpt only: rows of the position table, >= seq_len (an HF GPT-2 directory's n_positions);
   * 0 = seq_len */
  int n_positions;
  /* gpt and llama: the Hugging Face directory the model and its initial weights come from
   * (engine/model/hf.h), "" otherwise; init_path is then "" */
  char hf_dir[ZT_PATH_MAX];
  zt_hf_type hf_type;   /* its model_type; ZT_HF_NONE without hf_dir */
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
  unsigned reads;       /* which copies the unit's ops read with mixed precision: ZT_READS_F32
                           (the fp32 parameters), ZT_READS_LP (the compute copy), or both */
} zt_tensor_info;

/* zt_tensor_info.reads: an offloaded step moves only the copies a tensor's ops read. */
#define ZT_READS_F32 1u
#define ZT_READS_LP 2u

typedef struct zt_unit_info {
  char name[32];        /* "embed", "block.3", "head" */
  size_t offset;        /* first float of the unit's parameters in the flat buffer */
  size_t numel;         /* the unit's parameters are contiguous */
  int first_tensor;     /* its tensors are zt_model_tensor(first_tensor .. + n_tensors - 1) */
  int n_tensors;
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
/* The feed-forward width in use (cfg.d_ff, or the arch default when that is 0). */
int zt_model_d_ff(const zt_model *m);
/* 1 when the head unit reads a tensor of the embedding unit (the tied token embedding: gpt, a
 * llama with tie_embeddings): the unit calls below then take embed / dembed, and a step path
 * that streams units holds the embedding unit with the head. */
int zt_model_head_reads_embed(const zt_model *m);

/* Host-side init of a flat parameter buffer (GPT-2 init from the seed; deterministic). */
void zt_model_init_params(const zt_model *m, float *params_host);
/* Tensors [first, end) of that init into dst, which holds their range of the flat layout (dst[0]
 * is tensor first's first parameter): the bits zt_model_init_params writes there, for any range
 * asked in any order, so that a model larger than memory is initialised a piece at a time. */
void zt_model_init_params_range(const zt_model *m, int first, int end, float *dst);
/* Elements [begin, stop) of that range (0 is tensor first's first parameter) into the same
 * places of dst, the bits the whole range has there: threads fill disjoint slices of one range
 * in any order and any number (engine/train/trainer.c runs them on the CPU pool). */
void zt_model_init_params_slice(const zt_model *m, int first, int end, float *dst, size_t begin,
                                size_t stop);
/* The parameters of tensors [first, end), which tile one range of the flat layout. */
size_t zt_model_range_numel(const zt_model *m, int first, int end);

/* ---- checkpoints (safetensors) ---------------------------------------------------------------
 * A model state buffer is a flat host buffer in the parameter layout (parameters, or an AdamW
 * moment). In the checkpoint layout every tensor is written under its name with its file shape
 * (HF Conv1D weights transposed); in the internal layout the shape is the internal one, (OC, C),
 * and nothing is transposed. */
typedef struct zt_model_state {
  const char *suffix;   /* appended to each tensor name ("" for parameters, ".exp_avg", ...) */
  float *data;          /* zt_model_num_params floats on the host */
} zt_model_state;

/* Writes n buffers into one F32 safetensors file atomically; note goes into __metadata__.
 * internal_layout: 0 = checkpoint layout, 1 = internal layout. */
int zt_model_save_states(const zt_model *m, const char *path, const zt_model_state *s, int n,
                         int internal_layout, const char *note, char *err, size_t errlen);
/* Fills n buffers from a safetensors file (F32/BF16/F16). Accepts the "transformer." prefix HF
 * GPT-2 files use and ignores the buffers they carry (lm_head.weight, *.attn.bias,
 * *.attn.masked_bias); any other missing, extra or wrongly shaped tensor is refused, named. */
int zt_model_load_states(const zt_model *m, const char *path, const zt_model_state *s, int n,
                         int internal_layout, char *err, size_t errlen);

/* The same file a range of tensors at a time, for states larger than memory: open reads the
 * header and refuses what zt_model_load_states refuses (and a dtype that does not convert to
 * fp32) before any data is read; read fills dst with tensors [first, end) of state k (suffix[k])
 * in their range of the flat layout (dst[0] is tensor first's first parameter), in any order.
 * zt_model_load_states is open, read of every tensor of each state, close. flags: any of
 * ZT_MODEL_FILE_INTERNAL (the internal layout, else the checkpoint layout) and
 * ZT_MODEL_FILE_STRICT (zt's own files, as zt_model_save_states writes them: the names exactly,
 * no "transformer." prefix, and no tensor but the states', HF buffers included). */
#define ZT_MODEL_FILE_INTERNAL 1u
#define ZT_MODEL_FILE_STRICT 2u
/* zt_model_writer_open only: every tensor stored as BF16 (rounded to nearest even; the bf16
 * AdamW state, exact in it) */
#define ZT_MODEL_FILE_BF16 4u
typedef struct zt_model_file zt_model_file;
int zt_model_file_open(zt_model_file **f, const zt_model *m, const char *path,
                       const char *const *suffix, int n, unsigned flags, char *err,
                       size_t errlen);
int zt_model_file_read(const zt_model_file *f, int k, int first, int end, float *dst, char *err,
                       size_t errlen);
/* The same, and sums[i - first] the checksum of tensor i's bytes in the file
 * (engine/base/checksum.h), for a checkpoint's verification. */
int zt_model_file_read_sum(const zt_model_file *f, int k, int first, int end, float *dst,
                           uint64_t *sums, char *err, size_t errlen);
void zt_model_file_close(zt_model_file *f);

/* The same file written a range of tensors at a time: open writes the header of the n states
 * (suffix[k]; flags: any of ZT_MODEL_FILE_INTERNAL and ZT_MODEL_FILE_BF16) and note; put
 * writes tensors [first, end) of state k from src, their range of the flat layout (src[0] is
 * tensor first's first parameter), in any order, a tensor stored transposed (HF Conv1D in the
 * checkpoint layout) through scratch (as many floats as the range; unused in the internal
 * layout); finish once every tensor of every state is put; close also after a failure (an
 * unfinished file is removed). The file is zt_model_save_states's of the same states, byte for
 * byte (without ZT_MODEL_FILE_BF16). */
typedef struct zt_model_writer zt_model_writer;
int zt_model_writer_open(zt_model_writer **w, const zt_model *m, const char *path,
                         const char *const *suffix, int n, unsigned flags, const char *note,
                         char *err, size_t errlen);
int zt_model_writer_put(zt_model_writer *w, int k, int first, int end, const float *src,
                        float *scratch, char *err, size_t errlen);
int zt_model_writer_finish(zt_model_writer *w, char *err, size_t errlen);
/* The checksum of tensor i of state k as put (engine/base/checksum.h). */
uint64_t zt_model_writer_sum(const zt_model_writer *w, int k, int i);
void zt_model_writer_close(zt_model_writer *w);

/* ---- forward and backward --------------------------------------------------------------------
 * The activations of one micro-batch (B rows of seq_len tokens) and the backward scratch live in
 * one backend allocation made when the job starts. The step walks the units: forward 0..U-1, the
 * loss on the logits, backward U-1..0; each unit function takes only that unit's parameter and
 * gradient pointers (backend memory), which is the grain the offload engine streams. The gpt
 * head also reads the tied wte in the embedding unit (embed / dembed).
 *
 * Activation checkpointing: with ckpt_every = k > 0, blocks 0, k, 2k, ... keep only the residual
 * stream entering and leaving them; their internal activations live in one set shared by all of
 * them, and their unit backward first recomputes the block's forward from its input. The
 * results are bitwise those without checkpointing on a deterministic backend; the memory saved is
 * (number of checkpointed blocks - 1) sets of block internals. 0 = none. */
typedef struct zt_acts zt_acts;

/* -ENOTSUP, naming the op, on a backend whose table lacks an op the arch calls. */
int zt_acts_open(zt_acts **a, const zt_model *m, const zt_backend *be, int B, int ckpt_every,
                 char *err, size_t errlen);
void zt_acts_close(zt_acts *a);
size_t zt_acts_bytes(const zt_acts *a);
/* The bytes zt_acts_open would allocate for B rows on a backend with these ops, without
 * allocating backend memory; 0 if B or ckpt_every is out of range or the host is out of memory. */
size_t zt_acts_size(const zt_model *m, const zt_ops *ops, int B, int ckpt_every);
/* Mixed precision: every activation (and activation gradient, and the logits) stored as dt,
 * the layernorm statistics fp32 (ops.h's typed entries). zt_acts_open/zt_acts_size are these
 * with ZT_F32. */
int zt_acts_open_dt(zt_acts **a, const zt_model *m, const zt_backend *be, int B, int ckpt_every,
                    zt_dtype dt, char *err, size_t errlen);
size_t zt_acts_size_dt(const zt_model *m, const zt_ops *ops, int B, int ckpt_every,
                       zt_dtype dt);
zt_dtype zt_acts_dtype(const zt_acts *a);
/* Backend buffers of B*T ints the caller fills before forward: input tokens (all in [0, vocab))
 * and next-token targets (-1 = ignored). */
int32_t *zt_acts_tokens(zt_acts *a);
int32_t *zt_acts_targets(zt_acts *a);
/* The position of each of the B*T tokens in its document (ops.h, "Documents"), a backend
 * buffer of every arch that the caller fills before forward: attention stays inside documents,
 * and learned positions (gpt) and RoPE (llama) read it. zt_acts_open fills 0..T-1 (one
 * document a row). */
int32_t *zt_acts_positions(zt_acts *a);
/* (B*T, vocab) logits (of the acts' type) after forward; the loss op turns them into their
 * gradient in place. NULL for llama, whose head never holds a micro-batch's logits: its
 * backward makes them a chunk of rows at a time (zt_model_loss). */
void *zt_acts_logits(zt_acts *a);

/* The loss of a micro-batch, between the forward of every unit and the backward of any: the
 * mean-free softmax cross-entropy of the targets, its gradient scaled by dscale (1 / the
 * counted targets, over grad_accum, times the fp16 loss scale). gpt and encoder compute it here
 * on the logits (crossentropy_fwd_bwd_dt); llama records dscale, and its head's backward
 * computes logits, loss and gradient a chunk of rows at a time. */
void zt_model_loss(const zt_model *m, zt_acts *a, float dscale);
/* After the head's backward: the sum of the micro-batch's per-token losses and the number of
 * targets counted (llama sums its per-row losses once, and counts the targets, here; this
 * synchronises). 0, or -EINVAL when zt_model_loss did not run since the last call. */
int zt_acts_loss(zt_acts *a, double *loss_sum, int *n_counted);
/* The loss of a micro-batch without its gradient (held-out evaluation): after the forward of
 * every unit, as zt_model_loss, then zt_acts_loss gives its sum and count. The ops are
 * training's, so the loss of the same rows and parameters is the training forward's, bit for
 * bit. head_lp is the head unit's compute copy (its unit_forward's p_lp) and embed_lp the
 * embedding unit's (the tied head reads it): llama's head makes its logits a chunk of rows at a
 * time here too, in the chunk buffer its backward uses (no buffer beyond the step's). */
void zt_model_eval_loss(const zt_model *m, zt_acts *a, const void *head_lp,
                        const void *embed_lp);

void zt_model_unit_forward(const zt_model *m, zt_acts *a, int unit, const float *p,
                           const float *embed);
/* Adds the unit's parameter gradients into g (and the tied wte's into dembed for the gpt head).
 * A checkpointed block recomputes its forward first, from its input as the forward left it. */
void zt_model_unit_backward(const zt_model *m, zt_acts *a, int unit, const float *p, float *g,
                            const float *embed, float *dembed);
/* All units over flat parameter / gradient buffers. */
void zt_model_forward(const zt_model *m, zt_acts *a, const float *params);
void zt_model_backward(const zt_model *m, zt_acts *a, const float *params, float *grads);
/* The same with a compute copy of the parameters in the acts' type (params_lp, the flat layout;
 * the matmul weights are read from it, everything else from the fp32 params); the calls above
 * are these with params_lp = params and are for fp32 acts only. Gradients are fp32. */
void zt_model_unit_forward_dt(const zt_model *m, zt_acts *a, int unit, const float *p,
                              const void *p_lp, const float *embed, const void *embed_lp);
void zt_model_unit_backward_dt(const zt_model *m, zt_acts *a, int unit, const float *p,
                               const void *p_lp, float *g, const float *embed,
                               const void *embed_lp, float *dembed);
void zt_model_forward_dt(const zt_model *m, zt_acts *a, const float *params,
                         const void *params_lp);
void zt_model_backward_dt(const zt_model *m, zt_acts *a, const float *params,
                          const void *params_lp, float *grads);
/* zt_model_forward_dt, then zt_model_eval_loss with the flat buffers' head and embedding. */
void zt_model_eval_dt(const zt_model *m, zt_acts *a, const float *params,
                      const void *params_lp);

#endif
