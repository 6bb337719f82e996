/* What model.c shares with the architecture files (gpt.c, encoder.c, llama.c): the model and
 * activation structs, the layout builder, and the table each architecture fills. Not public. */
#ifndef ZT_MODEL_ARCH_H
#define ZT_MODEL_ARCH_H

#include "engine/model/model.h"

typedef enum zt__init_kind {
  ZT__INIT_NORMAL = 1,  /* N(0, 0.02) */
  ZT__INIT_RESID,       /* N(0, 0.02 / sqrt(2 * n_layers)): projections into the residual stream */
  ZT__INIT_ZEROS,
  ZT__INIT_ONES,
} zt__init_kind;

/* Carves one backend allocation into buffers: a first pass with base NULL measures, the second
 * binds the pointers. */
typedef struct zt__bump {
  char *base;
  size_t off;
} zt__bump;

float *zt__bump_floats(zt__bump *b, size_t n);
void *zt__bump_bytes(zt__bump *b, size_t bytes);
/* n activation values in the activations' storage type */
void *zt__bump_acts(zt__bump *b, const zt_acts *a, size_t n);

typedef struct zt__arch {
  zt_arch id;
  const char *name;
  int default_d_ff;     /* <= 0: 4 * d_model */
  int (*layout)(zt_model *m);
  size_t host_acts_size;  /* the arch's struct of activation pointers, before the layer array */
  size_t host_layer_size; /* bytes per layer of that struct */
  void (*bind_acts)(zt_acts *a, zt__bump *b);
  /* NULL, or what the arch writes into its buffers once they are bound (zt_acts_open) */
  void (*acts_ready)(zt_acts *a);
  /* NULL, or the name of an op the arch calls that the table lacks (NULL: none lacking), so
   * that zt_acts_open refuses a backend whose twin of an op is still to come */
  const char *(*missing_op)(const zt_ops *o);
  /* p/embed are fp32, p_lp/embed_lp the same parameters in the activations' type (the matmul
   * weights are read from them; p_lp == p for fp32) */
  void (*unit_forward)(const zt_model *m, zt_acts *a, int unit, const float *p, const void *p_lp,
                       const float *embed, const void *embed_lp);
  void (*unit_backward)(const zt_model *m, zt_acts *a, int unit, const float *p,
                        const void *p_lp, float *g, const float *embed, const void *embed_lp,
                        float *dembed);
  /* zt_model_eval_loss where the head makes the loss in its backward (llama); NULL: the loss op
   * on the forward's logits (zt_model_loss) */
  void (*eval_loss)(const zt_model *m, zt_acts *a, const void *head_lp, const void *embed_lp);
} zt__arch;

extern const zt__arch zt__arch_gpt;
extern const zt__arch zt__arch_encoder;
extern const zt__arch zt__arch_llama;
/* The table of id a, or NULL (cfg.c). */
const zt__arch *zt__arch_of(zt_arch a);

struct zt_model {
  zt_model_cfg cfg;
  int d_ff;             /* resolved (cfg.d_ff or the arch default) */
  int n_kv_heads, head_dim; /* resolved (llama; gpt and encoder: n_heads, d_model / n_heads) */
  int tied;             /* zt_model_head_reads_embed */
  const zt__arch *arch;
  zt_tensor_info *t;
  zt__init_kind *init;
  int nt, tcap;
  zt_unit_info *u;
  int nu, ucap;
  size_t nparams;
};

struct zt_acts {
  const zt_model *m;
  zt_backend be;
  int B, T;
  int ckpt_every;       /* see zt_acts_open */
  zt_dtype dt;          /* storage type of every activation (zt_acts_open_dt) */
  void *base;
  size_t bytes;
  int32_t *tok, *tgt;
  int32_t *pos;         /* positions in the documents (zt_acts_positions) */
  void *logits;         /* the micro-batch's logits (gpt, encoder); NULL for a chunked head */
  /* The chunked head's loss (llama): zt_model_loss records dscale and zeroes row_loss (B*T
   * fp32 losses the head's backward adds into, a chunk of loss_rows rows of logits at a time);
   * zt_acts_loss sums it and counts the targets through h_tgt (B*T host ints). */
  float *row_loss;
  float dscale;
  int loss_rows;
  int32_t *h_tgt;
  /* the last zt_model_loss's result (gpt, encoder), and whether one is pending */
  double loss_sum;
  int n_counted, loss_pending;
  void *arch;           /* the arch's pointer struct (host memory) */
};

/* Whether block `layer` is activation-checkpointed: its forward keeps only its output (the next
 * block's input), its internals live in the set all such blocks share, and its backward
 * recomputes them from its input first. */
static inline int zt__acts_recomputed(const zt_acts *a, int layer) {
  return a->ckpt_every > 0 && layer % a->ckpt_every == 0;
}

/* Fewer rows of logits a chunk than zt_acts_open sized (rows < the allocation's; tests of the
 * chunked head's tail). */
void zt__acts_set_loss_rows(zt_acts *a, int rows);

/* RoPE's hs / 2 inverse frequencies of a llama cfg, as transformers computes them (llama.c). */
void zt__rope_inv_freq(const zt_model_cfg *c, int hs, float *out);

/* Layout builder: a unit, then its tensors (shape as stored in the checkpoint file). */
int zt__model_begin_unit(zt_model *m, const char *name);
int zt__model_add_tensor(zt_model *m, const char *name, int ndim, int64_t s0, int64_t s1,
                         int transposed, int decay, zt__init_kind init);
/* Overrides the reads of the tensor added last (model.h, zt_tensor_info.reads). */
void zt__model_set_reads(zt_model *m, unsigned reads);

/* The k-th tensor of unit u inside that unit's parameter block p. */
static inline float *zt__unit_tensor(const zt_model *m, const float *p, int u, int k) {
  return (float *)p + (m->t[m->u[u].first_tensor + k].offset - m->u[u].offset);
}

/* The same tensor in a unit's parameter block of type dt (the compute copy). */
static inline const void *zt__unit_tensor_dt(const zt_model *m, const void *p, zt_dtype dt,
                                             int u, int k) {
  return (const char *)p + (m->t[m->u[u].first_tensor + k].offset - m->u[u].offset) *
                           zt_dtype_size(dt);
}

#endif
