/* GPT-2: token + learned position embeddings, pre-LN blocks (ln_1 -> fused qkv -> causal
 * attention -> c_proj -> residual; ln_2 -> c_fc -> GELU(tanh) -> c_proj -> residual), ln_f and
 * an LM head tied to wte. Tensor names are Hugging Face's GPT-2 names without the "transformer."
 * prefix; the HF Conv1D weights are stored (in, out), the transpose of our (OC, C). */
#include <stdio.h>

#include "engine/model/arch.h"

/* A block's tensors in layout order: the vectors first, then the matrices, so that the fp32
 * tensors and the compute-copy tensors of a block are each one run of the flat layout (an
 * offloaded step moves a block in two copies, into a device copy little larger than the
 * compute copy). The seeded init draws in this order; only the matrices draw. */
enum { BLK_LN1_W, BLK_LN1_B, BLK_QKV_B, BLK_PROJ_B, BLK_LN2_W, BLK_LN2_B, BLK_FC_B, BLK_FCP_B,
       BLK_QKV_W, BLK_PROJ_W, BLK_FC_W, BLK_FCP_W };

/* Activations (void *) are stored in the acts' type; the layernorm statistics are fp32. */
typedef struct gpt_layer {
  void *ln1, *qkv, *atty, *res2, *ln2, *fch, *fch_gelu, *res3;
  float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;
  void *att;
} gpt_layer;

typedef struct gpt_acts {
  void *encoded, *lnf;
  float *lnf_mean, *lnf_rstd;
  void *tmp;                                     /* projection output before the residual add */
  void *dres, *dc, *dqkv, *dfch, *dfch_gelu;     /* backward scratch */
  gpt_layer l[];
} gpt_acts;

static int layout(zt_model *m) {
  int64_t V = m->cfg.vocab, C = m->cfg.d_model, F = m->d_ff;
  /* the position table may be longer than the sequences trained (an HF GPT-2's n_positions) */
  int64_t T = m->cfg.n_positions ? m->cfg.n_positions : m->cfg.seq_len;
  char n[96];
  /* wte: looked up in fp32 by the embedding, and the head's matmul weight (tied) */
  if (zt__model_begin_unit(m, "embed") < 0 ||
      zt__model_add_tensor(m, "wte.weight", 2, V, C, 0, 1, ZT__INIT_NORMAL) < 0)
    return -1;
  zt__model_set_reads(m, ZT_READS_F32 | ZT_READS_LP);
  if (zt__model_add_tensor(m, "wpe.weight", 2, T, C, 0, 1, ZT__INIT_NORMAL) < 0) return -1;
  zt__model_set_reads(m, ZT_READS_F32);
  for (int i = 0; i < m->cfg.n_layers; i++) {
    static const struct {
      const char *name;
      int ndim, s0, s1, transposed, decay;  /* s0/s1: 0 = C, -1 = F, k > 0: k * C */
      zt__init_kind init;
    } b[] = {
        {"ln_1.weight", 1, 0, 0, 0, 0, ZT__INIT_ONES},
        {"ln_1.bias", 1, 0, 0, 0, 0, ZT__INIT_ZEROS},
        {"attn.c_attn.bias", 1, 3, 0, 0, 0, ZT__INIT_ZEROS},
        {"attn.c_proj.bias", 1, 0, 0, 0, 0, ZT__INIT_ZEROS},
        {"ln_2.weight", 1, 0, 0, 0, 0, ZT__INIT_ONES},
        {"ln_2.bias", 1, 0, 0, 0, 0, ZT__INIT_ZEROS},
        {"mlp.c_fc.bias", 1, -1, 0, 0, 0, ZT__INIT_ZEROS},
        {"mlp.c_proj.bias", 1, 0, 0, 0, 0, ZT__INIT_ZEROS},
        {"attn.c_attn.weight", 2, 0, 3, 1, 1, ZT__INIT_NORMAL},
        {"attn.c_proj.weight", 2, 0, 0, 1, 1, ZT__INIT_RESID},
        {"mlp.c_fc.weight", 2, 0, -1, 1, 1, ZT__INIT_NORMAL},
        {"mlp.c_proj.weight", 2, -1, 0, 1, 1, ZT__INIT_RESID},
    };
    snprintf(n, sizeof n, "block.%d", i);
    if (zt__model_begin_unit(m, n) < 0) return -1;
    for (size_t k = 0; k < sizeof b / sizeof b[0]; k++) {
      int64_t s0 = b[k].s0 < 0 ? F : (b[k].s0 ? b[k].s0 * C : C);
      int64_t s1 = b[k].s1 < 0 ? F : (b[k].s1 ? b[k].s1 * C : C);
      snprintf(n, sizeof n, "h.%d.%s", i, b[k].name);
      if (zt__model_add_tensor(m, n, b[k].ndim, s0, s1, b[k].transposed, b[k].decay,
                               b[k].init) < 0)
        return -1;
    }
  }
  if (zt__model_begin_unit(m, "head") < 0 ||
      zt__model_add_tensor(m, "ln_f.weight", 1, C, 0, 0, 0, ZT__INIT_ONES) < 0 ||
      zt__model_add_tensor(m, "ln_f.bias", 1, C, 0, 0, 0, ZT__INIT_ZEROS) < 0)
    return -1;
  return 0;
}

/* A block's own activations, everything its backward reads except its input. */
static void bind_internals(gpt_layer *l, const zt_acts *a, zt__bump *b) {
  size_t N = (size_t)a->B * (size_t)a->T, C = (size_t)a->m->cfg.d_model, F = (size_t)a->m->d_ff;
  l->ln1 = zt__bump_acts(b, a, N * C);
  l->ln1_mean = zt__bump_floats(b, N);
  l->ln1_rstd = zt__bump_floats(b, N);
  l->qkv = zt__bump_acts(b, a, N * 3 * C);
  int NH = a->m->cfg.n_heads;
  l->att = zt__bump_bytes(b, a->be.ops->attention_saved_bytes_dt(a->dt, a->B, a->T, NH, NH,
                                                                  (int)C / NH));
  l->atty = zt__bump_acts(b, a, N * C);
  l->res2 = zt__bump_acts(b, a, N * C);
  l->ln2 = zt__bump_acts(b, a, N * C);
  l->ln2_mean = zt__bump_floats(b, N);
  l->ln2_rstd = zt__bump_floats(b, N);
  l->fch = zt__bump_acts(b, a, N * F);
  l->fch_gelu = zt__bump_acts(b, a, N * F);
}

static void bind_acts(zt_acts *a, zt__bump *b) {
  gpt_acts *g = a->arch;
  size_t N = (size_t)a->B * (size_t)a->T, C = (size_t)a->m->cfg.d_model, F = (size_t)a->m->d_ff;
  size_t V = (size_t)a->m->cfg.vocab;
  a->tok = zt__bump_bytes(b, N * sizeof(int32_t));
  a->tgt = zt__bump_bytes(b, N * sizeof(int32_t));
  a->pos = zt__bump_bytes(b, N * sizeof(int32_t));
  a->logits = zt__bump_acts(b, a, N * V);
  g->encoded = zt__bump_acts(b, a, N * C);
  g->lnf = zt__bump_acts(b, a, N * C);
  g->lnf_mean = zt__bump_floats(b, N);
  g->lnf_rstd = zt__bump_floats(b, N);
  g->tmp = zt__bump_acts(b, a, N * C);
  g->dres = zt__bump_acts(b, a, N * C);
  g->dc = zt__bump_acts(b, a, N * C);
  g->dqkv = zt__bump_acts(b, a, N * 3 * C);
  g->dfch = zt__bump_acts(b, a, N * F);
  g->dfch_gelu = zt__bump_acts(b, a, N * F);
  /* Recomputed blocks share one set of internals: only the block being recomputed needs them. */
  gpt_layer shared = {0};
  int have_shared = 0;
  for (int i = 0; i < a->m->cfg.n_layers; i++) {
    gpt_layer *l = &g->l[i];
    if (zt__acts_recomputed(a, i)) {
      if (!have_shared) bind_internals(&shared, a, b);
      have_shared = 1;
      *l = shared;
    } else {
      bind_internals(l, a, b);
    }
    l->res3 = zt__bump_acts(b, a, N * C);  /* the next block's input: always kept */
  }
}

static void unit_forward(const zt_model *m, zt_acts *a, int u, const float *p, const void *p_lp,
                         const float *embed, const void *embed_lp) {
  const zt_ops *o = a->be.ops;
  void *ctx = a->be.ctx;
  zt_dtype dt = a->dt;
  gpt_acts *g = a->arch;
  int B = a->B, T = a->T, C = m->cfg.d_model, F = m->d_ff, NH = m->cfg.n_heads, L = m->cfg.n_layers;
  int N = B * T;
  if (u == 0) {
    o->embedding_fwd_dt(ctx, dt, g->encoded, a->tok, zt__unit_tensor(m, p, 0, 0),
                     zt__unit_tensor(m, p, 0, 1), B, T, C, a->pos);
    return;
  }
  if (u == L + 1) {
    o->layernorm_fwd_dt(ctx, dt, g->lnf, g->lnf_mean, g->lnf_rstd, g->l[L - 1].res3,
                        zt__unit_tensor(m, p, u, 0), zt__unit_tensor(m, p, u, 1), N, C);
    o->matmul_fwd_dt(ctx, dt, a->logits, g->lnf, embed_lp, NULL, N, C, m->cfg.vocab);
    return;
  }
  int i = u - 1;
  gpt_layer *l = &g->l[i];
  const void *in = i ? g->l[i - 1].res3 : g->encoded;
#define W(k) zt__unit_tensor(m, p, u, k)
#define WL(k) zt__unit_tensor_dt(m, p_lp, dt, u, k)
  o->layernorm_fwd_dt(ctx, dt, l->ln1, l->ln1_mean, l->ln1_rstd, in, W(BLK_LN1_W), W(BLK_LN1_B),
                      N, C);
  o->matmul_fwd_dt(ctx, dt, l->qkv, l->ln1, WL(BLK_QKV_W), W(BLK_QKV_B), N, C, 3 * C);
  o->attention_fwd_dt(ctx, dt, l->atty, l->att, l->qkv, B, T, NH, NH, C / NH, 1, a->pos);
  o->matmul_fwd_dt(ctx, dt, g->tmp, l->atty, WL(BLK_PROJ_W), W(BLK_PROJ_B), N, C, C);
  o->add_dt(ctx, dt, l->res2, in, g->tmp, (size_t)N * C);
  o->layernorm_fwd_dt(ctx, dt, l->ln2, l->ln2_mean, l->ln2_rstd, l->res2, W(BLK_LN2_W),
                      W(BLK_LN2_B), N, C);
  o->matmul_fwd_dt(ctx, dt, l->fch, l->ln2, WL(BLK_FC_W), W(BLK_FC_B), N, C, F);
  o->gelu_fwd_dt(ctx, dt, l->fch_gelu, l->fch, (size_t)N * F);
  o->matmul_fwd_dt(ctx, dt, g->tmp, l->fch_gelu, WL(BLK_FCP_W), W(BLK_FCP_B), N, F, C);
  o->add_dt(ctx, dt, l->res3, l->res2, g->tmp, (size_t)N * C);
#undef W
#undef WL
}

/* g->dres carries the gradient of the residual stream from unit to unit; the backward ops add
 * into it, which is exactly the residual's "gradient flows to both branches". */
static void unit_backward(const zt_model *m, zt_acts *a, int u, const float *p, const void *p_lp,
                          float *gr, const float *embed, const void *embed_lp, float *dembed) {
  const zt_ops *o = a->be.ops;
  void *ctx = a->be.ctx;
  zt_dtype dt = a->dt;
  size_t es = zt_dtype_size(dt);
  gpt_acts *g = a->arch;
  int B = a->B, T = a->T, C = m->cfg.d_model, F = m->d_ff, NH = m->cfg.n_heads, L = m->cfg.n_layers;
  int N = B * T;
  size_t NC = (size_t)N * C;
  if (u == 0) {
    o->embedding_bwd_dt(ctx, dt, zt__unit_tensor(m, gr, 0, 0), zt__unit_tensor(m, gr, 0, 1),
                        g->dres, a->tok, B, T, C, a->pos);
    return;
  }
  if (u == L + 1) {
    o->zero(ctx, g->dc, NC * es);
    o->matmul_bwd_dt(ctx, dt, g->dc, dembed, NULL, a->logits, g->lnf, embed_lp, N, C,
                     m->cfg.vocab);
    o->zero(ctx, g->dres, NC * es);
    o->layernorm_bwd_dt(ctx, dt, g->dres, zt__unit_tensor(m, gr, u, 0),
                        zt__unit_tensor(m, gr, u, 1), g->dc, g->l[L - 1].res3,
                        zt__unit_tensor(m, p, u, 0), g->lnf_mean, g->lnf_rstd, N, C);
    return;
  }
  int i = u - 1;
  gpt_layer *l = &g->l[i];
  const void *in = i ? g->l[i - 1].res3 : g->encoded;
  /* The same ops on the same input give the same bits: the recomputed internals are the ones
   * the forward had (and res3 is rewritten with its own value). */
  if (zt__acts_recomputed(a, i)) unit_forward(m, a, u, p, p_lp, embed, embed_lp);
#define W(k) zt__unit_tensor(m, p, u, k)
#define WL(k) zt__unit_tensor_dt(m, p_lp, dt, u, k)
#define G(k) zt__unit_tensor(m, gr, u, k)
  o->zero(ctx, g->dfch_gelu, (size_t)N * F * es);
  o->matmul_bwd_dt(ctx, dt, g->dfch_gelu, G(BLK_FCP_W), G(BLK_FCP_B), g->dres, l->fch_gelu,
                   WL(BLK_FCP_W), N, F, C);
  o->zero(ctx, g->dfch, (size_t)N * F * es);
  o->gelu_bwd_dt(ctx, dt, g->dfch, l->fch, g->dfch_gelu, (size_t)N * F);
  o->zero(ctx, g->dc, NC * es);
  o->matmul_bwd_dt(ctx, dt, g->dc, G(BLK_FC_W), G(BLK_FC_B), g->dfch, l->ln2, WL(BLK_FC_W), N,
                   C, F);
  o->layernorm_bwd_dt(ctx, dt, g->dres, G(BLK_LN2_W), G(BLK_LN2_B), g->dc, l->res2,
                      W(BLK_LN2_W), l->ln2_mean, l->ln2_rstd, N, C);
  o->zero(ctx, g->dc, NC * es);
  o->matmul_bwd_dt(ctx, dt, g->dc, G(BLK_PROJ_W), G(BLK_PROJ_B), g->dres, l->atty,
                   WL(BLK_PROJ_W), N, C, C);
  o->zero(ctx, g->dqkv, 3 * NC * es);
  o->attention_bwd_dt(ctx, dt, g->dqkv, g->dc, l->qkv, l->att, B, T, NH, NH, C / NH, 1, a->pos);
  o->zero(ctx, g->dc, NC * es);
  o->matmul_bwd_dt(ctx, dt, g->dc, G(BLK_QKV_W), G(BLK_QKV_B), g->dqkv, l->ln1, WL(BLK_QKV_W),
                   N, C, 3 * C);
  o->layernorm_bwd_dt(ctx, dt, g->dres, G(BLK_LN1_W), G(BLK_LN1_B), g->dc, in, W(BLK_LN1_W),
                      l->ln1_mean, l->ln1_rstd, N, C);
#undef W
#undef WL
#undef G
}

const zt__arch zt__arch_gpt = {
    .id = ZT_ARCH_GPT,
    .name = "gpt",
    .default_d_ff = 0,
    .layout = layout,
    .host_acts_size = sizeof(gpt_acts),
    .host_layer_size = sizeof(gpt_layer),
    .bind_acts = bind_acts,
    .unit_forward = unit_forward,
    .unit_backward = unit_backward,
};
