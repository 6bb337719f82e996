/* The Llama family (Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3), as transformers' LlamaForCausalLM
 * and its kin compute it: token embedding; blocks of [RMSNorm -> q|k|v projection (optional
 * biases) -> optional per-head q/k RMSNorm -> RoPE -> grouped-query causal attention -> o_proj
 * -> residual; RMSNorm -> gate|up projection -> SwiGLU -> down_proj -> residual]; the final
 * RMSNorm and an LM head, untied (lm_head.weight) or tied to the embedding. Tensor names are
 * Hugging Face's; nn.Linear's (out, in) layout is ours, so nothing is transposed.
 *
 * The head never holds a micro-batch's logits: its forward is the final norm; its backward makes
 * the logits a chunk of rows at a time, turns them into their gradient with the loss
 * (crossentropy_rows_dt, the rows' losses summed on the device) and feeds that chunk's dx and
 * dW before the next chunk reuses the buffer. */
#include <math.h>
#include <stdio.h>

#include "engine/base/tunables.h"
#include "engine/model/arch.h"

/* A block's tensors in layout order: the vectors first (norms, then the biases), then the
 * matrices, so that a block's fp32 tensors and its compute-copy tensors are each one run of the
 * flat layout (as gpt.c's). q, k, v are consecutive, so their weights are one
 * ((NH + 2 NKV) hs, C) matrix and their biases one vector; gate and up likewise one (2F, C). */
typedef struct blk_ix {
  int in_w, post_w, qn, kn, qb, qw, ow, gw, dw; /* -1: absent */
} blk_ix;

static blk_ix blk_of(const zt_model_cfg *c) {
  blk_ix x = {.in_w = 0, .post_w = 1, .qn = -1, .kn = -1, .qb = -1};
  int k = 2;
  if (c->qk_norm) x.qn = k++, x.kn = k++;
  if (c->qkv_bias) x.qb = k, k += 3;
  x.qw = k;
  k += 3;
  x.ow = k++;
  x.gw = k;
  k += 2;
  x.dw = k;
  return x;
}

/* The head's tensors: the final norm, then lm_head (untied only). */
enum { HEAD_NORM, HEAD_W };

/* Activations (void *) are stored in the acts' type; norm statistics are fp32. */
typedef struct llama_layer {
  void *xn1, *qkv, *qk_raw, *atty, *res2, *xn2, *gu, *swi, *res3;
  float *rstd1, *q_rstd, *k_rstd, *rstd2;
  void *att;
} llama_layer;

typedef struct llama_acts {
  void *encoded, *lnf, *tmp;
  float *lnf_rstd;
  float *inv_freq;      /* RoPE's (head_dim / 2), from the host at zt_acts_open */
  float *zeros, *z_rstd; /* qk_norm: a zero norm weight (head_dim) and its rstd (see below) */
  void *logits;         /* one chunk of loss_rows rows */
  void *dres, *dc, *datt, *dqkv, *dqkv2, *dgu, *dswi; /* backward scratch */
  llama_layer l[];
} llama_acts;

static int layout(zt_model *m) {
  const zt_model_cfg *c = &m->cfg;
  int64_t V = c->vocab, C = c->d_model, F = m->d_ff, hs = m->head_dim;
  int64_t Q = c->n_heads * hs, KV = m->n_kv_heads * hs;
  char n[96];
  /* looked up in fp32; a tied head's matmul reads it in the compute copy too */
  if (zt__model_begin_unit(m, "embed") < 0 ||
      zt__model_add_tensor(m, "model.embed_tokens.weight", 2, V, C, 0, 1, ZT__INIT_NORMAL) < 0)
    return -1;
  zt__model_set_reads(m, ZT_READS_F32 | (c->tie_embeddings ? ZT_READS_LP : 0));
  for (int i = 0; i < c->n_layers; i++) {
    const struct {
      const char *name;
      int ndim;
      int64_t s0, s1;
      int on;
      zt__init_kind init;
    } b[] = {
        {"input_layernorm.weight", 1, C, 0, 1, ZT__INIT_ONES},
        {"post_attention_layernorm.weight", 1, C, 0, 1, ZT__INIT_ONES},
        {"self_attn.q_norm.weight", 1, hs, 0, c->qk_norm, ZT__INIT_ONES},
        {"self_attn.k_norm.weight", 1, hs, 0, c->qk_norm, ZT__INIT_ONES},
        {"self_attn.q_proj.bias", 1, Q, 0, c->qkv_bias, ZT__INIT_ZEROS},
        {"self_attn.k_proj.bias", 1, KV, 0, c->qkv_bias, ZT__INIT_ZEROS},
        {"self_attn.v_proj.bias", 1, KV, 0, c->qkv_bias, ZT__INIT_ZEROS},
        {"self_attn.q_proj.weight", 2, Q, C, 1, ZT__INIT_NORMAL},
        {"self_attn.k_proj.weight", 2, KV, C, 1, ZT__INIT_NORMAL},
        {"self_attn.v_proj.weight", 2, KV, C, 1, ZT__INIT_NORMAL},
        {"self_attn.o_proj.weight", 2, C, Q, 1, ZT__INIT_NORMAL},
        {"mlp.gate_proj.weight", 2, F, C, 1, ZT__INIT_NORMAL},
        {"mlp.up_proj.weight", 2, F, C, 1, ZT__INIT_NORMAL},
        {"mlp.down_proj.weight", 2, C, F, 1, ZT__INIT_NORMAL},
    };
    snprintf(n, sizeof n, "block.%d", i);
    if (zt__model_begin_unit(m, n) < 0) return -1;
    for (size_t k = 0; k < sizeof b / sizeof b[0]; k++) {
      if (!b[k].on) continue;
      snprintf(n, sizeof n, "model.layers.%d.%s", i, b[k].name);
      /* decay on the matrices only */
      if (zt__model_add_tensor(m, n, b[k].ndim, b[k].s0, b[k].s1, 0, b[k].ndim == 2,
                               b[k].init) < 0)
        return -1;
    }
  }
  if (zt__model_begin_unit(m, "head") < 0 ||
      zt__model_add_tensor(m, "model.norm.weight", 1, C, 0, 0, 0, ZT__INIT_ONES) < 0)
    return -1;
  if (!c->tie_embeddings &&
      zt__model_add_tensor(m, "lm_head.weight", 2, V, C, 0, 1, ZT__INIT_NORMAL) < 0)
    return -1;
  return 0;
}

/* transformers' inv_freq (modeling_rope_utils: _compute_default_rope_parameters and the linear
 * and llama3 variants) in fp32, as torch computes it there: python floats meet the fp32
 * tensors rounded to fp32, and a scalar over a tensor is the tensor's reciprocal times the
 * scalar (Tensor.__rtruediv__). 1 / theta^(2i / hs), then the scaling's division or ramp. */
void zt__rope_inv_freq(const zt_model_cfg *c, int hs, float *out) {
  const zt_rope_scaling *r = &c->rope_scaling;
  double old = r->original_max_position_embeddings, lo = r->low_freq_factor,
         hi = r->high_freq_factor;
  float factor = r->factor, low_wavelen = (float)(old / lo), high_wavelen = (float)(old / hi);
  for (int i = 0; i < hs / 2; i++) {
    float f = 1.0f / powf(c->rope_theta, (float)(2 * i) / (float)hs);
    if (r->type == ZT_ROPE_LINEAR) {
      f = f / factor;
    } else if (r->type == ZT_ROPE_LLAMA3) {
      float wavelen = (1.0f / f) * (float)(2.0 * M_PI);
      float scaled = wavelen > low_wavelen ? f / factor : f;
      float smooth = ((1.0f / wavelen) * (float)old - (float)lo) / (float)(hi - lo);
      float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
      f = !(wavelen < high_wavelen) && !(wavelen > low_wavelen) ? smoothed : scaled;
    }
    out[i] = f;
  }
}

/* A block's own activations, everything its backward reads except its input. */
static void bind_internals(llama_layer *l, const zt_acts *a, zt__bump *b) {
  const zt_model *m = a->m;
  size_t N = (size_t)a->B * (size_t)a->T, C = (size_t)m->cfg.d_model, F = (size_t)m->d_ff;
  size_t hs = (size_t)m->head_dim, NH = (size_t)m->cfg.n_heads, NKV = (size_t)m->n_kv_heads;
  size_t QKV = (NH + 2 * NKV) * hs;
  l->xn1 = zt__bump_acts(b, a, N * C);
  l->rstd1 = zt__bump_floats(b, N);
  l->qkv = zt__bump_acts(b, a, N * QKV);
  if (m->cfg.qk_norm) {
    l->qk_raw = zt__bump_acts(b, a, N * QKV);
    l->q_rstd = zt__bump_floats(b, N * NH);
    l->k_rstd = zt__bump_floats(b, N * NKV);
  }
  l->att = zt__bump_bytes(b, a->be.ops->attention_saved_bytes_dt(a->dt, a->B, a->T, (int)NH,
                                                                  (int)NKV, (int)hs));
  l->atty = zt__bump_acts(b, a, N * NH * hs);
  l->res2 = zt__bump_acts(b, a, N * C);
  l->xn2 = zt__bump_acts(b, a, N * C);
  l->rstd2 = zt__bump_floats(b, N);
  l->gu = zt__bump_acts(b, a, N * 2 * F);
  l->swi = zt__bump_acts(b, a, N * F);
}

/* Rows of logits a chunk: ZT_TUNE_LOSS_CHUNK_BYTES of them, at least one, at most the batch's. */
static int loss_rows(const zt_acts *a) {
  size_t N = (size_t)a->B * (size_t)a->T;
  size_t row = (size_t)a->m->cfg.vocab * zt_dtype_size(a->dt);
  size_t r = ZT_TUNE_LOSS_CHUNK_BYTES / row;
  return (int)(r < 1 ? 1 : r > N ? N : r);
}

static void bind_acts(zt_acts *a, zt__bump *b) {
  llama_acts *g = a->arch;
  const zt_model *m = a->m;
  size_t N = (size_t)a->B * (size_t)a->T, C = (size_t)m->cfg.d_model, F = (size_t)m->d_ff;
  size_t hs = (size_t)m->head_dim, NH = (size_t)m->cfg.n_heads, NKV = (size_t)m->n_kv_heads;
  size_t QKV = (NH + 2 * NKV) * hs;
  a->tok = zt__bump_bytes(b, N * sizeof(int32_t));
  a->tgt = zt__bump_bytes(b, N * sizeof(int32_t));
  a->pos = zt__bump_bytes(b, N * sizeof(int32_t));
  a->row_loss = zt__bump_floats(b, N);
  if (!a->loss_rows) a->loss_rows = loss_rows(a);
  g->logits = zt__bump_acts(b, a, (size_t)a->loss_rows * (size_t)m->cfg.vocab);
  g->inv_freq = zt__bump_floats(b, hs / 2);
  g->encoded = zt__bump_acts(b, a, N * C);
  g->lnf = zt__bump_acts(b, a, N * C);
  g->lnf_rstd = zt__bump_floats(b, N);
  g->tmp = zt__bump_acts(b, a, N * C);
  g->dres = zt__bump_acts(b, a, N * C);
  g->dc = zt__bump_acts(b, a, N * C);
  g->datt = zt__bump_acts(b, a, N * NH * hs);
  g->dqkv = zt__bump_acts(b, a, N * QKV);
  if (m->cfg.qk_norm) {
    g->dqkv2 = zt__bump_acts(b, a, N * QKV);
    g->zeros = zt__bump_floats(b, hs);
    g->z_rstd = zt__bump_floats(b, N * (NH + NKV));
  }
  g->dgu = zt__bump_acts(b, a, N * 2 * F);
  g->dswi = zt__bump_acts(b, a, N * F);
  /* Recomputed blocks share one set of internals: only the block being recomputed needs them. */
  llama_layer shared = {0};
  int have_shared = 0;
  for (int i = 0; i < m->cfg.n_layers; i++) {
    llama_layer *l = &g->l[i];
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

static void acts_ready(zt_acts *a) {
  llama_acts *g = a->arch;
  int hs = a->m->head_dim;
  float f[ZT_MODEL_MAX_HEAD_DIM / 2];
  zt__rope_inv_freq(&a->m->cfg, hs, f);
  a->be.ops->to_device(a->be.ctx, g->inv_freq, f, (size_t)(hs / 2) * sizeof(float));
  if (g->zeros) a->be.ops->zero(a->be.ctx, g->zeros, (size_t)hs * sizeof(float));
}

/* p + k elements of type dt */
static void *at(const void *p, zt_dtype dt, size_t k) {
  return (char *)p + k * zt_dtype_size(dt);
}

static void unit_forward(const zt_model *m, zt_acts *a, int u, const float *p, const void *p_lp,
                         const float *embed, const void *embed_lp) {
  const zt_ops *o = a->be.ops;
  void *ctx = a->be.ctx;
  zt_dtype dt = a->dt;
  llama_acts *g = a->arch;
  const zt_model_cfg *c = &m->cfg;
  int B = a->B, T = a->T, C = c->d_model, F = m->d_ff, L = c->n_layers, N = B * T;
  int NH = c->n_heads, NKV = m->n_kv_heads, hs = m->head_dim;
  int Q = NH * hs, QKV = (NH + 2 * NKV) * hs;
  float eps = c->rms_eps;
  (void)embed;
  (void)embed_lp;
  if (u == 0) {
    o->embedding_fwd_dt(ctx, dt, g->encoded, a->tok, zt__unit_tensor(m, p, 0, 0), NULL, B, T,
                        C, NULL);
    return;
  }
  if (u == L + 1) {
    o->rmsnorm_fwd_dt(ctx, dt, g->lnf, g->lnf_rstd, g->l[L - 1].res3,
                      zt__unit_tensor(m, p, u, HEAD_NORM), N, 1, C, C, eps);
    return;
  }
  int i = u - 1;
  llama_layer *l = &g->l[i];
  const void *in = i ? g->l[i - 1].res3 : g->encoded;
  blk_ix x = blk_of(c);
#define W(k) zt__unit_tensor(m, p, u, k)
#define WL(k) zt__unit_tensor_dt(m, p_lp, dt, u, k)
  o->rmsnorm_fwd_dt(ctx, dt, l->xn1, l->rstd1, in, W(x.in_w), N, 1, C, C, eps);
  o->matmul_fwd_dt(ctx, dt, l->qkv, l->xn1, WL(x.qw), x.qb >= 0 ? W(x.qb) : NULL, N, C, QKV);
  if (c->qk_norm) {
    /* the norms' backward reads their input: the projection's output is kept whole (one copy
     * instead of a strided one; its v part is the attention's too) */
    o->cast(ctx, l->qk_raw, dt, l->qkv, dt, (size_t)N * QKV);
    o->rmsnorm_fwd_dt(ctx, dt, l->qkv, l->q_rstd, l->qk_raw, W(x.qn), N, NH, hs, QKV, eps);
    o->rmsnorm_fwd_dt(ctx, dt, at(l->qkv, dt, Q), l->k_rstd, at(l->qk_raw, dt, Q), W(x.kn), N,
                      NKV, hs, QKV, eps);
  }
  o->rope_fwd_dt(ctx, dt, l->qkv, g->inv_freq, a->pos, N, NH, hs, QKV);
  o->rope_fwd_dt(ctx, dt, at(l->qkv, dt, Q), g->inv_freq, a->pos, N, NKV, hs, QKV);
  o->attention_fwd_dt(ctx, dt, l->atty, l->att, l->qkv, B, T, NH, NKV, hs, 1, a->pos);
  o->matmul_fwd_dt(ctx, dt, g->tmp, l->atty, WL(x.ow), NULL, N, Q, C);
  o->add_dt(ctx, dt, l->res2, in, g->tmp, (size_t)N * C);
  o->rmsnorm_fwd_dt(ctx, dt, l->xn2, l->rstd2, l->res2, W(x.post_w), N, 1, C, C, eps);
  o->matmul_fwd_dt(ctx, dt, l->gu, l->xn2, WL(x.gw), NULL, N, C, 2 * F);
  o->swiglu_fwd_dt(ctx, dt, l->swi, l->gu, N, F);
  o->matmul_fwd_dt(ctx, dt, g->tmp, l->swi, WL(x.dw), NULL, N, F, C);
  o->add_dt(ctx, dt, l->res3, l->res2, g->tmp, (size_t)N * C);
#undef W
#undef WL
}

/* The head's backward: a chunk of rows at a time, the logits (rows x V) of the normed stream,
 * the loss turning them into their gradient in place (each row's loss added into row_loss), and
 * that gradient into dx and dW; then the final norm's backward. */
static void head_backward(const zt_model *m, zt_acts *a, const float *p, const void *p_lp,
                          float *gr, const void *embed_lp, float *dembed) {
  const zt_ops *o = a->be.ops;
  void *ctx = a->be.ctx;
  zt_dtype dt = a->dt;
  llama_acts *g = a->arch;
  int C = m->cfg.d_model, V = m->cfg.vocab, L = m->cfg.n_layers, N = a->B * a->T, u = L + 1;
  const void *w = m->tied ? embed_lp : zt__unit_tensor_dt(m, p_lp, dt, u, HEAD_W);
  float *dw = m->tied ? dembed : zt__unit_tensor(m, gr, u, HEAD_W);
  o->zero(ctx, g->dc, (size_t)N * C * zt_dtype_size(dt));
  for (int r0 = 0; r0 < N; r0 += a->loss_rows) {
    int R = N - r0 < a->loss_rows ? N - r0 : a->loss_rows;
    const void *x = at(g->lnf, dt, (size_t)r0 * C);
    o->matmul_fwd_dt(ctx, dt, g->logits, x, w, NULL, R, C, V);
    o->crossentropy_rows_dt(ctx, dt, g->logits, a->tgt + r0, R, V, V, -1, a->dscale,
                            a->row_loss + r0);
    o->matmul_bwd_dt(ctx, dt, at(g->dc, dt, (size_t)r0 * C), dw, NULL, g->logits, x, w, R, C, V);
  }
  o->zero(ctx, g->dres, (size_t)N * C * zt_dtype_size(dt));
  o->rmsnorm_bwd_dt(ctx, dt, g->dres, zt__unit_tensor(m, gr, u, HEAD_NORM), g->dc,
                    g->l[L - 1].res3, zt__unit_tensor(m, p, u, HEAD_NORM), g->lnf_rstd, N, 1, C,
                    C);
}

/* zt_model_eval_loss: the head backward's chunks of logits and their losses, without dx or
 * dW (zt_model_loss zeroed row_loss and recorded dscale). */
static void eval_loss(const zt_model *m, zt_acts *a, const void *head_lp, const void *embed_lp) {
  const zt_ops *o = a->be.ops;
  void *ctx = a->be.ctx;
  zt_dtype dt = a->dt;
  llama_acts *g = a->arch;
  int C = m->cfg.d_model, V = m->cfg.vocab, L = m->cfg.n_layers, N = a->B * a->T;
  const void *w = m->tied ? embed_lp : zt__unit_tensor_dt(m, head_lp, dt, L + 1, HEAD_W);
  for (int r0 = 0; r0 < N; r0 += a->loss_rows) {
    int R = N - r0 < a->loss_rows ? N - r0 : a->loss_rows;
    o->matmul_fwd_dt(ctx, dt, g->logits, at(g->lnf, dt, (size_t)r0 * C), w, NULL, R, C, V);
    o->crossentropy_rows_dt(ctx, dt, g->logits, a->tgt + r0, R, V, V, -1, a->dscale,
                            a->row_loss + r0);
  }
}

/* g->dres carries the gradient of the residual stream from unit to unit; the backward ops add
 * into it, which is exactly the residual's "gradient flows to both branches". */
static void unit_backward(const zt_model *m, zt_acts *a, int u, const float *p, const void *p_lp,
                          float *gr, const float *embed, const void *embed_lp, float *dembed) {
  const zt_ops *o = a->be.ops;
  void *ctx = a->be.ctx;
  zt_dtype dt = a->dt;
  size_t es = zt_dtype_size(dt);
  llama_acts *g = a->arch;
  const zt_model_cfg *c = &m->cfg;
  int B = a->B, T = a->T, C = c->d_model, F = m->d_ff, L = c->n_layers, N = B * T;
  int NH = c->n_heads, NKV = m->n_kv_heads, hs = m->head_dim;
  int Q = NH * hs, QKV = (NH + 2 * NKV) * hs;
  if (u == 0) {
    o->embedding_bwd_dt(ctx, dt, zt__unit_tensor(m, gr, 0, 0), NULL, g->dres, a->tok, B, T,
                        C, NULL);
    return;
  }
  if (u == L + 1) {
    head_backward(m, a, p, p_lp, gr, embed_lp, dembed);
    return;
  }
  int i = u - 1;
  llama_layer *l = &g->l[i];
  const void *in = i ? g->l[i - 1].res3 : g->encoded;
  blk_ix x = blk_of(c);
  /* The same ops on the same input give the same bits: the recomputed internals are the ones
   * the forward had (and res3 is rewritten with its own value). */
  if (zt__acts_recomputed(a, i)) unit_forward(m, a, u, p, p_lp, embed, embed_lp);
#define W(k) zt__unit_tensor(m, p, u, k)
#define WL(k) zt__unit_tensor_dt(m, p_lp, dt, u, k)
#define G(k) zt__unit_tensor(m, gr, u, k)
  o->zero(ctx, g->dswi, (size_t)N * F * es);
  o->matmul_bwd_dt(ctx, dt, g->dswi, G(x.dw), NULL, g->dres, l->swi, WL(x.dw), N, F, C);
  o->zero(ctx, g->dgu, (size_t)N * 2 * F * es);
  o->swiglu_bwd_dt(ctx, dt, g->dgu, l->gu, g->dswi, N, F);
  o->zero(ctx, g->dc, (size_t)N * C * es);
  o->matmul_bwd_dt(ctx, dt, g->dc, G(x.gw), NULL, g->dgu, l->xn2, WL(x.gw), N, C, 2 * F);
  o->rmsnorm_bwd_dt(ctx, dt, g->dres, G(x.post_w), g->dc, l->res2, W(x.post_w), l->rstd2, N, 1,
                    C, C);
  o->zero(ctx, g->datt, (size_t)N * Q * es);
  o->matmul_bwd_dt(ctx, dt, g->datt, G(x.ow), NULL, g->dres, l->atty, WL(x.ow), N, Q, C);
  o->zero(ctx, g->dqkv, (size_t)N * QKV * es);
  o->attention_bwd_dt(ctx, dt, g->dqkv, g->datt, l->qkv, l->att, B, T, NH, NKV, hs, 1, a->pos);
  o->rope_bwd_dt(ctx, dt, g->dqkv, g->inv_freq, a->pos, N, NH, hs, QKV);
  o->rope_bwd_dt(ctx, dt, at(g->dqkv, dt, Q), g->inv_freq, a->pos, N, NKV, hs, QKV);
  const void *dproj = g->dqkv;
  if (c->qk_norm) {
    /* The projection's gradient: dv as the attention gave it, dq and dk through the norms'
     * backward, which adds. ops.h has no strided zero, so the q|k rows of the copy are zeroed
     * by an RMSNorm with a zero weight (x * rstd * 0; the gradients are finite where the step
     * keeps them, and a nan stays one). */
    o->cast(ctx, g->dqkv2, dt, g->dqkv, dt, (size_t)N * QKV);
    o->rmsnorm_fwd_dt(ctx, dt, g->dqkv2, g->z_rstd, g->dqkv, g->zeros, N, NH + NKV, hs, QKV,
                      c->rms_eps);
    o->rmsnorm_bwd_dt(ctx, dt, g->dqkv2, G(x.qn), g->dqkv, l->qk_raw, W(x.qn), l->q_rstd, N, NH,
                      hs, QKV);
    o->rmsnorm_bwd_dt(ctx, dt, at(g->dqkv2, dt, Q), G(x.kn), at(g->dqkv, dt, Q),
                      at(l->qk_raw, dt, Q), W(x.kn), l->k_rstd, N, NKV, hs, QKV);
    dproj = g->dqkv2;
  }
  o->zero(ctx, g->dc, (size_t)N * C * es);
  o->matmul_bwd_dt(ctx, dt, g->dc, G(x.qw), x.qb >= 0 ? G(x.qb) : NULL, dproj, l->xn1, WL(x.qw),
                   N, C, QKV);
  o->rmsnorm_bwd_dt(ctx, dt, g->dres, G(x.in_w), g->dc, in, W(x.in_w), l->rstd1, N, 1, C, C);
#undef W
#undef WL
#undef G
}

static const char *missing_op(const zt_ops *o) {
  const struct {
    const char *name;
    int have;
  } ops[] = {{"rmsnorm", o->rmsnorm_fwd_dt && o->rmsnorm_bwd_dt},
             {"rope", o->rope_fwd_dt && o->rope_bwd_dt},
             {"swiglu", o->swiglu_fwd_dt && o->swiglu_bwd_dt},
             {"crossentropy_rows", o->crossentropy_rows_dt != NULL},
             {"sum", o->sum != NULL}};
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
    if (!ops[i].have) return ops[i].name;
  return NULL;
}

const zt__arch zt__arch_llama = {
    .id = ZT_ARCH_LLAMA,
    .name = "llama",
    .default_d_ff = 0,
    .layout = layout,
    .host_acts_size = sizeof(llama_acts),
    .host_layer_size = sizeof(llama_layer),
    .bind_acts = bind_acts,
    .acts_ready = acts_ready,
    .missing_op = missing_op,
    .unit_forward = unit_forward,
    .unit_backward = unit_backward,
    .eval_loss = eval_loss,
};
