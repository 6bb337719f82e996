/* The PyTorch encoder: nn.Embedding(V, d) -> nn.TransformerEncoder(nn.TransformerEncoderLayer(
 * d, nhead, dim_feedforward), L) -> nn.Linear(d, V), with the layer's defaults: post-LN
 * (x = norm1(x + sa(x)); x = norm2(x + linear2(relu(linear1(x))))), ReLU, bidirectional
 * attention, no position embedding, dropout 0, LayerNorm eps 1e-5. Tensor names are that module
 * stack's state_dict names; PyTorch's layouts are ours, so nothing is transposed. */
#include <stdio.h>

#include "engine/model/arch.h"

/* A layer's tensors in layout order: vectors first, then matrices (as gpt.c's blocks). */
enum { ENC_IN_B, ENC_OUT_B, ENC_L1_B, ENC_L2_B, ENC_N1_W, ENC_N1_B, ENC_N2_W, ENC_N2_B,
       ENC_IN_W, ENC_OUT_W, ENC_L1_W, ENC_L2_W };
/* The head's: the bias, then the decoder matrix. */
enum { HEAD_B, HEAD_W };

/* Activations (void *) are stored in the acts' type; the layernorm statistics are fp32. */
typedef struct enc_layer {
  void *qkv, *atty, *r1, *h1, *f1, *f1r, *r2, *h2;
  float *m1, *s1, *m2, *s2;
  void *att;
} enc_layer;

typedef struct enc_acts {
  void *encoded, *tmp;
  void *dres, *dtmp, *datty, *dqkv, *df1, *df1r;    /* backward scratch */
  enc_layer l[];
} enc_acts;

static int layout(zt_model *m) {
  int64_t V = m->cfg.vocab, C = m->cfg.d_model, F = m->d_ff;
  char n[96];
  if (zt__model_begin_unit(m, "embed") < 0 ||
      zt__model_add_tensor(m, "embedding.weight", 2, V, C, 0, 1, ZT__INIT_NORMAL) < 0)
    return -1;
  zt__model_set_reads(m, ZT_READS_F32);
  for (int i = 0; i < m->cfg.n_layers; i++) {
    static const struct {
      const char *name;
      int ndim, s0, s1, decay;  /* s0/s1: 0 = C, -1 = F, k > 0: k * C */
      zt__init_kind init;
    } b[] = {
        {"self_attn.in_proj_bias", 1, 3, 0, 0, ZT__INIT_ZEROS},
        {"self_attn.out_proj.bias", 1, 0, 0, 0, ZT__INIT_ZEROS},
        {"linear1.bias", 1, -1, 0, 0, ZT__INIT_ZEROS},
        {"linear2.bias", 1, 0, 0, 0, ZT__INIT_ZEROS},
        {"norm1.weight", 1, 0, 0, 0, ZT__INIT_ONES},
        {"norm1.bias", 1, 0, 0, 0, ZT__INIT_ZEROS},
        {"norm2.weight", 1, 0, 0, 0, ZT__INIT_ONES},
        {"norm2.bias", 1, 0, 0, 0, ZT__INIT_ZEROS},
        {"self_attn.in_proj_weight", 2, 3, 0, 1, ZT__INIT_NORMAL},
        {"self_attn.out_proj.weight", 2, 0, 0, 1, ZT__INIT_RESID},
        {"linear1.weight", 2, -1, 0, 1, ZT__INIT_NORMAL},
        {"linear2.weight", 2, 0, -1, 1, ZT__INIT_RESID},
    };
    snprintf(n, sizeof n, "block.%d", i);
    if (zt__model_begin_unit(m, n) < 0) return -1;
    for (size_t k = 0; k < sizeof b / sizeof b[0]; k++) {
      int64_t s0 = b[k].s0 < 0 ? F : (b[k].s0 ? b[k].s0 * C : C);
      int64_t s1 = b[k].s1 < 0 ? F : (b[k].s1 ? b[k].s1 * C : C);
      snprintf(n, sizeof n, "encoder.layers.%d.%s", i, b[k].name);
      if (zt__model_add_tensor(m, n, b[k].ndim, s0, s1, 0, b[k].decay, b[k].init) < 0) return -1;
    }
  }
  if (zt__model_begin_unit(m, "head") < 0 ||
      zt__model_add_tensor(m, "decoder.bias", 1, V, 0, 0, 0, ZT__INIT_ZEROS) < 0 ||
      zt__model_add_tensor(m, "decoder.weight", 2, V, C, 0, 1, ZT__INIT_NORMAL) < 0)
    return -1;
  return 0;
}

/* A block's own activations, everything its backward reads except its input. */
static void bind_internals(enc_layer *l, const zt_acts *a, zt__bump *b) {
  size_t N = (size_t)a->B * (size_t)a->T, C = (size_t)a->m->cfg.d_model, F = (size_t)a->m->d_ff;
  l->qkv = zt__bump_acts(b, a, N * 3 * C);
  int NH = a->m->cfg.n_heads;
  l->att = zt__bump_bytes(b, a->be.ops->attention_saved_bytes_dt(a->dt, a->B, a->T, NH, NH,
                                                                  (int)C / NH));
  l->atty = zt__bump_acts(b, a, N * C);
  l->r1 = zt__bump_acts(b, a, N * C);
  l->h1 = zt__bump_acts(b, a, N * C);
  l->m1 = zt__bump_floats(b, N);
  l->s1 = zt__bump_floats(b, N);
  l->f1 = zt__bump_acts(b, a, N * F);
  l->f1r = zt__bump_acts(b, a, N * F);
  l->r2 = zt__bump_acts(b, a, N * C);
  l->m2 = zt__bump_floats(b, N);
  l->s2 = zt__bump_floats(b, N);
}

static void bind_acts(zt_acts *a, zt__bump *b) {
  enc_acts *e = a->arch;
  size_t N = (size_t)a->B * (size_t)a->T, C = (size_t)a->m->cfg.d_model, F = (size_t)a->m->d_ff;
  size_t V = (size_t)a->m->cfg.vocab;
  a->tok = zt__bump_bytes(b, N * sizeof(int32_t));
  a->tgt = zt__bump_bytes(b, N * sizeof(int32_t));
  a->pos = zt__bump_bytes(b, N * sizeof(int32_t));
  a->logits = zt__bump_acts(b, a, N * V);
  e->encoded = zt__bump_acts(b, a, N * C);
  e->tmp = zt__bump_acts(b, a, N * C);
  e->dres = zt__bump_acts(b, a, N * C);
  e->dtmp = zt__bump_acts(b, a, N * C);
  e->datty = zt__bump_acts(b, a, N * C);
  e->dqkv = zt__bump_acts(b, a, N * 3 * C);
  e->df1 = zt__bump_acts(b, a, N * F);
  e->df1r = zt__bump_acts(b, a, N * F);
  /* Recomputed blocks share one set of internals: only the block being recomputed needs them. */
  enc_layer shared = {0};
  int have_shared = 0;
  for (int i = 0; i < a->m->cfg.n_layers; i++) {
    enc_layer *l = &e->l[i];
    if (zt__acts_recomputed(a, i)) {
      if (!have_shared) bind_internals(&shared, a, b);
      have_shared = 1;
      *l = shared;
    } else {
      bind_internals(l, a, b);
    }
    l->h2 = zt__bump_acts(b, a, N * C);  /* the next block's input: always kept */
  }
}

static void unit_forward(const zt_model *m, zt_acts *a, int u, const float *p, const void *p_lp,
                         const float *embed, const void *embed_lp) {
  const zt_ops *o = a->be.ops;
  void *ctx = a->be.ctx;
  zt_dtype dt = a->dt;
  enc_acts *e = a->arch;
  int B = a->B, T = a->T, C = m->cfg.d_model, F = m->d_ff, NH = m->cfg.n_heads, L = m->cfg.n_layers;
  int N = B * T;
  if (u == 0) {
    o->embedding_fwd_dt(ctx, dt, e->encoded, a->tok, zt__unit_tensor(m, p, 0, 0), NULL, B, T,
                        C, NULL);
    return;
  }
  if (u == L + 1) {
    o->matmul_fwd_dt(ctx, dt, a->logits, e->l[L - 1].h2,
                     zt__unit_tensor_dt(m, p_lp, dt, u, HEAD_W), zt__unit_tensor(m, p, u, HEAD_B),
                     N, C, m->cfg.vocab);
    return;
  }
  int i = u - 1;
  enc_layer *l = &e->l[i];
  const void *x = i ? e->l[i - 1].h2 : e->encoded;
#define W(k) zt__unit_tensor(m, p, u, k)
#define WL(k) zt__unit_tensor_dt(m, p_lp, dt, u, k)
  o->matmul_fwd_dt(ctx, dt, l->qkv, x, WL(ENC_IN_W), W(ENC_IN_B), N, C, 3 * C);
  o->attention_fwd_dt(ctx, dt, l->atty, l->att, l->qkv, B, T, NH, NH, C / NH, 0, a->pos);
  o->matmul_fwd_dt(ctx, dt, e->tmp, l->atty, WL(ENC_OUT_W), W(ENC_OUT_B), N, C, C);
  o->add_dt(ctx, dt, l->r1, x, e->tmp, (size_t)N * C);
  o->layernorm_fwd_dt(ctx, dt, l->h1, l->m1, l->s1, l->r1, W(ENC_N1_W), W(ENC_N1_B), N, C);
  o->matmul_fwd_dt(ctx, dt, l->f1, l->h1, WL(ENC_L1_W), W(ENC_L1_B), N, C, F);
  o->relu_fwd_dt(ctx, dt, l->f1r, l->f1, (size_t)N * F);
  o->matmul_fwd_dt(ctx, dt, e->tmp, l->f1r, WL(ENC_L2_W), W(ENC_L2_B), N, F, C);
  o->add_dt(ctx, dt, l->r2, l->h1, e->tmp, (size_t)N * C);
  o->layernorm_fwd_dt(ctx, dt, l->h2, l->m2, l->s2, l->r2, W(ENC_N2_W), W(ENC_N2_B), N, C);
#undef W
#undef WL
}

/* e->dres holds the gradient of the current layer's output between units. Post-LN puts the norm
 * on the residual stream itself, so each norm's input gradient is built in a scratch buffer that
 * the residual branch then adds into. */
static void unit_backward(const zt_model *m, zt_acts *a, int u, const float *p, const void *p_lp,
                          float *gr, const float *embed, const void *embed_lp, float *dembed) {
  const zt_ops *o = a->be.ops;
  void *ctx = a->be.ctx;
  zt_dtype dt = a->dt;
  size_t es = zt_dtype_size(dt);
  enc_acts *e = a->arch;
  int B = a->B, T = a->T, C = m->cfg.d_model, F = m->d_ff, NH = m->cfg.n_heads, L = m->cfg.n_layers;
  int N = B * T;
  size_t NC = (size_t)N * C, NF = (size_t)N * F;
  if (u == 0) {
    o->embedding_bwd_dt(ctx, dt, zt__unit_tensor(m, gr, 0, 0), NULL, e->dres, a->tok, B, T,
                        C, NULL);
    return;
  }
  if (u == L + 1) {
    o->zero(ctx, e->dres, NC * es);
    o->matmul_bwd_dt(ctx, dt, e->dres, zt__unit_tensor(m, gr, u, HEAD_W),
                     zt__unit_tensor(m, gr, u, HEAD_B), a->logits, e->l[L - 1].h2,
                     zt__unit_tensor_dt(m, p_lp, dt, u, HEAD_W), N, C, m->cfg.vocab);
    return;
  }
  int i = u - 1;
  enc_layer *l = &e->l[i];
  const void *x = i ? e->l[i - 1].h2 : e->encoded;
  /* The same ops on the same input give the same bits: the recomputed internals are the ones
   * the forward had (and h2 is rewritten with its own value). */
  if (zt__acts_recomputed(a, i)) unit_forward(m, a, u, p, p_lp, embed, embed_lp);
#define W(k) zt__unit_tensor(m, p, u, k)
#define WL(k) zt__unit_tensor_dt(m, p_lp, dt, u, k)
#define G(k) zt__unit_tensor(m, gr, u, k)
  o->zero(ctx, e->dtmp, NC * es);   /* dtmp = d r2, then d h1 */
  o->layernorm_bwd_dt(ctx, dt, e->dtmp, G(ENC_N2_W), G(ENC_N2_B), e->dres, l->r2, W(ENC_N2_W),
                      l->m2, l->s2, N, C);
  o->zero(ctx, e->df1r, NF * es);
  o->matmul_bwd_dt(ctx, dt, e->df1r, G(ENC_L2_W), G(ENC_L2_B), e->dtmp, l->f1r, WL(ENC_L2_W), N,
                   F, C);
  o->zero(ctx, e->df1, NF * es);
  o->relu_bwd_dt(ctx, dt, e->df1, l->f1, e->df1r, NF);
  o->matmul_bwd_dt(ctx, dt, e->dtmp, G(ENC_L1_W), G(ENC_L1_B), e->df1, l->h1, WL(ENC_L1_W), N,
                   C, F);
  o->zero(ctx, e->dres, NC * es);   /* dres = d r1, then d x */
  o->layernorm_bwd_dt(ctx, dt, e->dres, G(ENC_N1_W), G(ENC_N1_B), e->dtmp, l->r1, W(ENC_N1_W),
                      l->m1, l->s1, N, C);
  o->zero(ctx, e->datty, NC * es);
  o->matmul_bwd_dt(ctx, dt, e->datty, G(ENC_OUT_W), G(ENC_OUT_B), e->dres, l->atty,
                   WL(ENC_OUT_W), N, C, C);
  o->zero(ctx, e->dqkv, 3 * NC * es);
  o->attention_bwd_dt(ctx, dt, e->dqkv, e->datty, l->qkv, l->att, B, T, NH, NH, C / NH, 0, a->pos);
  o->matmul_bwd_dt(ctx, dt, e->dres, G(ENC_IN_W), G(ENC_IN_B), e->dqkv, x, WL(ENC_IN_W), N, C,
                   3 * C);
#undef W
#undef WL
#undef G
}

const zt__arch zt__arch_encoder = {
    .id = ZT_ARCH_ENCODER,
    .name = "encoder",
    .default_d_ff = 2048,
    .layout = layout,
    .host_acts_size = sizeof(enc_acts),
    .host_layer_size = sizeof(enc_layer),
    .bind_acts = bind_acts,
    .unit_forward = unit_forward,
    .unit_backward = unit_backward,
};
