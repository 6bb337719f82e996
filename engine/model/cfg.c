/* A model's configuration: the architectures by name and zt_model_cfg_check (model.h), every
 * field's bounds and the llama fields' rules. */
#include "engine/model/arch.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static const zt__arch *const archs[] = {&zt__arch_gpt, &zt__arch_encoder, &zt__arch_llama};

const zt__arch *zt__arch_of(zt_arch a) {
  for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
    if (archs[i]->id == a) return archs[i];
  return NULL;
}

const char *zt_arch_name(zt_arch a) {
  const zt__arch *x = zt__arch_of(a);
  return x ? x->name : "unknown";
}

int zt_arch_parse(const char *s, zt_arch *out) {
  for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
    if (s && !strcmp(s, archs[i]->name)) {
      *out = archs[i]->id;
      return 0;
    }
  return -EINVAL;
}

static int bad(char *err, size_t errlen, const char *field, long long v, long long lo,
               long long hi) {
  snprintf(err, errlen, "model.%s must be in [%lld, %lld] (got %lld)", field, lo, hi, v);
  return -EINVAL;
}

/* The llama-only fields, each refused by name on another arch. */
static int llama_only(const zt_model_cfg *c, char *err, size_t errlen) {
  const zt_rope_scaling *r = &c->rope_scaling;
  const struct {
    const char *name;
    int set;
  } f[] = {{"n_kv_heads", c->n_kv_heads != 0},
           {"head_dim", c->head_dim != 0},
           {"rms_eps", c->rms_eps != 0},
           {"rope_theta", c->rope_theta != 0},
           {"rope_scaling", r->type != ZT_ROPE_NONE || r->factor != 0 || r->low_freq_factor != 0 ||
                                r->high_freq_factor != 0 ||
                                r->original_max_position_embeddings != 0},
           {"tie_embeddings", c->tie_embeddings != 0},
           {"qkv_bias", c->qkv_bias != 0},
           {"qk_norm", c->qk_norm != 0}};
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
    if (f[i].set) {
      snprintf(err, errlen, "model.%s applies to arch llama only (this model is %s)", f[i].name,
               zt_arch_name(c->arch));
      return -EINVAL;
    }
  return 0;
}

static int check_rope(const zt_rope_scaling *r, char *err, size_t errlen) {
  if (r->type != ZT_ROPE_NONE && r->type != ZT_ROPE_LINEAR && r->type != ZT_ROPE_LLAMA3) {
    snprintf(err, errlen, "model.rope_scaling.type must be none, linear or llama3");
    return -EINVAL;
  }
  int llama3 = r->type == ZT_ROPE_LLAMA3;
  if (r->type == ZT_ROPE_NONE ? r->factor != 0 : !(r->factor >= 1 && r->factor <= 1e6)) {
    snprintf(err, errlen, "model.rope_scaling.factor %s",
             r->type == ZT_ROPE_NONE ? "needs a type" : "must be in [1, 1e6]");
    return -EINVAL;
  }
  if (!llama3 && (r->low_freq_factor != 0 || r->high_freq_factor != 0 ||
                  r->original_max_position_embeddings != 0)) {
    snprintf(err, errlen, "model.rope_scaling: low_freq_factor, high_freq_factor and "
             "original_max_position_embeddings apply to type llama3 only");
    return -EINVAL;
  }
  if (llama3 && !(r->low_freq_factor > 0 && r->high_freq_factor > r->low_freq_factor &&
                  r->high_freq_factor <= 1e6)) {
    snprintf(err, errlen, "model.rope_scaling needs 0 < low_freq_factor < high_freq_factor <= "
             "1e6 (got %g, %g)", (double)r->low_freq_factor, (double)r->high_freq_factor);
    return -EINVAL;
  }
  if (llama3 && (r->original_max_position_embeddings < 1 ||
                 r->original_max_position_embeddings > ZT_MODEL_MAX_SEQ))
    return bad(err, errlen, "rope_scaling.original_max_position_embeddings",
               r->original_max_position_embeddings, 1, ZT_MODEL_MAX_SEQ);
  return 0;
}

/* The heads of a llama: n_kv_heads divides n_heads; head_dim even (RoPE rotates halves). */
static int check_llama(const zt_model_cfg *c, char *err, size_t errlen) {
  if (c->n_kv_heads < 0 || c->n_kv_heads > c->n_heads)
    return bad(err, errlen, "n_kv_heads", c->n_kv_heads, 0, c->n_heads);
  if (c->n_kv_heads && c->n_heads % c->n_kv_heads) {
    snprintf(err, errlen, "model.n_kv_heads must divide model.n_heads (%d %% %d != 0)",
             c->n_heads, c->n_kv_heads);
    return -EINVAL;
  }
  if (c->head_dim < 0 || c->head_dim > ZT_MODEL_MAX_HEAD_DIM)
    return bad(err, errlen, "head_dim", c->head_dim, 0, ZT_MODEL_MAX_HEAD_DIM);
  int hs = c->head_dim ? c->head_dim : c->d_model / c->n_heads;
  if (hs % 2) {
    snprintf(err, errlen, "model.head_dim must be even for RoPE (got %d%s)", hs,
             c->head_dim ? "" : ", d_model / n_heads");
    return -EINVAL;
  }
  if (!(c->rms_eps > 0 && c->rms_eps <= 1)) {
    snprintf(err, errlen, "model.rms_eps must be a number in (0, 1] (got %g)", (double)c->rms_eps);
    return -EINVAL;
  }
  if (!(c->rope_theta > 0 && c->rope_theta <= ZT_MODEL_MAX_ROPE_THETA)) {
    snprintf(err, errlen, "model.rope_theta must be a number in (0, 1e12] (got %g)",
             (double)c->rope_theta);
    return -EINVAL;
  }
  if (c->tie_embeddings < 0 || c->tie_embeddings > 1 || c->qkv_bias < 0 || c->qkv_bias > 1 ||
      c->qk_norm < 0 || c->qk_norm > 1) {
    snprintf(err, errlen, "model.tie_embeddings, model.qkv_bias and model.qk_norm are booleans");
    return -EINVAL;
  }
  return check_rope(&c->rope_scaling, err, errlen);
}

int zt_model_cfg_check(const zt_model_cfg *c, char *err, size_t errlen) {
  const zt__arch *a = zt__arch_of(c->arch);
  int rc, llama = c->arch == ZT_ARCH_LLAMA;
  if (!a) {
    snprintf(err, errlen, "model.arch must be gpt, encoder or llama");
    return -EINVAL;
  }
  if (c->vocab < 1 || c->vocab > ZT_MODEL_MAX_VOCAB) return bad(err, errlen, "vocab", c->vocab, 1, ZT_MODEL_MAX_VOCAB);
  if (c->seq_len < 1 || c->seq_len > ZT_MODEL_MAX_SEQ)
    return bad(err, errlen, "seq_len", c->seq_len, 1, ZT_MODEL_MAX_SEQ);
  if (c->d_model < 1 || c->d_model > ZT_MODEL_MAX_DMODEL)
    return bad(err, errlen, "d_model", c->d_model, 1, ZT_MODEL_MAX_DMODEL);
  if (c->n_heads < 1 || c->n_heads > c->d_model)
    return bad(err, errlen, "n_heads", c->n_heads, 1, c->d_model);
  /* with head_dim given (llama), the heads' width need not be d_model */
  if (!(llama && c->head_dim) && c->d_model % c->n_heads) {
    snprintf(err, errlen, "model.n_heads must divide model.d_model (%d %% %d != 0)", c->d_model,
             c->n_heads);
    return -EINVAL;
  }
  if (c->n_layers < 1 || c->n_layers > ZT_MODEL_MAX_LAYERS)
    return bad(err, errlen, "n_layers", c->n_layers, 1, ZT_MODEL_MAX_LAYERS);
  if (c->d_ff < 0 || c->d_ff > ZT_MODEL_MAX_DFF) return bad(err, errlen, "d_ff", c->d_ff, 0, ZT_MODEL_MAX_DFF);
  if (memchr(c->init_path, 0, sizeof c->init_path) == NULL ||
      memchr(c->hf_dir, 0, sizeof c->hf_dir) == NULL) {
    snprintf(err, errlen, "model.%s is not terminated",
             memchr(c->init_path, 0, sizeof c->init_path) ? "hf" : "init_path");
    return -EINVAL;
  }
  if ((rc = llama ? check_llama(c, err, errlen) : llama_only(c, err, errlen)) < 0) return rc;
  if (c->n_positions && (c->arch != ZT_ARCH_GPT || c->n_positions < c->seq_len ||
                         c->n_positions > ZT_MODEL_MAX_SEQ)) {
    snprintf(err, errlen, c->arch != ZT_ARCH_GPT ? "model n_positions applies to arch gpt only"
             : "model.seq_len %d must be at most the position table's %d rows (n_positions)",
             c->seq_len, c->n_positions);
    return -EINVAL;
  }
  if (c->hf_dir[0] && (c->arch == ZT_ARCH_ENCODER || c->init_path[0])) {
    snprintf(err, errlen, c->init_path[0] ? "model.hf replaces model.init"
                                          : "model.hf: the encoder has no Hugging Face form");
    return -EINVAL;
  }
  int want = c->arch == ZT_ARCH_GPT ? ZT_HF_GPT2 : ZT_HF_LLAMA;
  if (c->hf_type != ZT_HF_NONE &&
      (!c->hf_dir[0] || (want == ZT_HF_GPT2) != (c->hf_type == ZT_HF_GPT2) ||
       c->hf_type < ZT_HF_LLAMA || c->hf_type > ZT_HF_GPT2)) {
    snprintf(err, errlen, "model: the Hugging Face model_type does not match arch %s",
             zt_arch_name(c->arch));
    return -EINVAL;
  }
  /* An upper bound on every architecture's parameter count (two V x C matrices, the position
   * table, per layer the attention's four projections, 2 (3 for llama's gate) C x F and the
   * vectors), in double so it cannot overflow. */
  double C = c->d_model, F = c->d_ff ? c->d_ff : (a->default_d_ff > 0 ? a->default_d_ff : 4 * C);
  double hs = llama && c->head_dim ? c->head_dim : C / c->n_heads;
  double q = hs * c->n_heads, kv = llama && c->n_kv_heads ? hs * c->n_kv_heads : q;
  double rows = c->n_positions > c->seq_len ? c->n_positions : c->seq_len;
  double n = 2.0 * c->vocab * C + rows * C + c->vocab + 2 * C +
             (double)c->n_layers * (2 * C * (q + kv) + (llama ? 3 : 2) * C * F + 9 * C + F +
                                    (llama ? 2 * (q + kv) : 0));
  if (n > (double)ZT_MODEL_MAX_PARAMS) {
    snprintf(err, errlen, "model has about %.3g parameters; at most %llu (2^36) are supported "
             "(check model.d_model, model.n_layers, model.vocab, model.d_ff)", n, ZT_MODEL_MAX_PARAMS);
    return -EINVAL;
  }
  return 0;
}
