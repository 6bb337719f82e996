/* The typed entries (bf16/fp16 activations) of the CPU reference. Each one widens its dt inputs
 * to fp32 temporaries, runs the fp32 op on them and rounds its dt outputs once (an output the
 * op adds into is widened first, so the fp32 sum is what gets rounded): the definition of the
 * typed ops in ops.h, written as directly as possible. With dt = ZT_F32 each entry calls the
 * fp32 op on the caller's buffers.
 *
 * The temporaries are host memory taken per call (this backend's "device" is the host); a
 * failed allocation leaves the outputs untouched and makes sync() return -ENOMEM. */
#include <errno.h>
#include <stdlib.h>

#include "engine/kernels/cpu/cpu.h"

static inline float load(const void *p, zt_dtype t, size_t i) {
  if (t == ZT_BF16) return zt_bf16_to_f32(((const uint16_t *)p)[i]);
  if (t == ZT_F16) return zt_f16_to_f32(((const uint16_t *)p)[i]);
  return ((const float *)p)[i];
}

static inline void store(void *p, zt_dtype t, size_t i, float v) {
  if (t == ZT_BF16) ((uint16_t *)p)[i] = zt_f32_to_bf16(v);
  else if (t == ZT_F16) ((uint16_t *)p)[i] = zt_f32_to_f16(v);
  else ((float *)p)[i] = v;
}

void zt__cpu_cast(void *ctx, void *dst, zt_dtype dst_t, const void *src, zt_dtype src_t,
                  size_t n) {
  ZT__PARALLEL_FOR(zt__cpu_threads(ctx), n > ZT__CPU_PAR_MIN)
  for (size_t i = 0; i < n; i++)
    store(dst, dst_t, i, load(src, src_t, i));
}

/* The temporaries of one call, freed together. */
#define MAX_TMP 4
typedef struct tmps {
  void *ctx;
  float *p[MAX_TMP];
  int n, failed;
} tmps;

/* n fp32 values: a copy of x (of type dt) widened, or uninitialised when x is NULL. NULL after
 * a failure (recorded in the context). */
static float *tmp(tmps *t, const void *x, zt_dtype dt, size_t n) {
  float *p = t->failed || t->n == MAX_TMP ? NULL : malloc(n ? n * sizeof(float) : 1);
  if (!p) {
    t->failed = 1;
    ((zt__cpu_ctx *)t->ctx)->err = -ENOMEM;
    return NULL;
  }
  t->p[t->n++] = p;
  if (x) zt__cpu_cast(t->ctx, p, ZT_F32, x, dt, n);
  return p;
}

static void tmps_free(tmps *t) {
  for (int i = 0; i < t->n; i++) free(t->p[i]);
}

void zt__cpu_embedding_fwd_dt(void *ctx, zt_dtype dt, void *out, const int32_t *tok,
                              const float *wte, const float *wpe, int B, int T, int C,
                                  const int32_t *pos) {
  if (dt == ZT_F32) {
    zt__cpu_embedding_fwd(ctx, out, tok, wte, wpe, B, T, C, pos);
    return;
  }
  size_t n = (size_t)B * T * C;
  tmps t = {.ctx = ctx};
  float *o = tmp(&t, NULL, dt, n);
  if (t.failed) goto out;
  zt__cpu_embedding_fwd(ctx, o, tok, wte, wpe, B, T, C, pos);
  zt__cpu_cast(ctx, out, dt, o, ZT_F32, n);
out:
  tmps_free(&t);
}

void zt__cpu_embedding_bwd_dt(void *ctx, zt_dtype dt, float *dwte, float *dwpe, const void *dout,
                              const int32_t *tok, int B, int T, int C, const int32_t *pos) {
  if (dt == ZT_F32) {
    zt__cpu_embedding_bwd(ctx, dwte, dwpe, dout, tok, B, T, C, pos);
    return;
  }
  tmps t = {.ctx = ctx};
  float *d = tmp(&t, dout, dt, (size_t)B * T * C);
  if (t.failed) goto out;
  zt__cpu_embedding_bwd(ctx, dwte, dwpe, d, tok, B, T, C, pos);
out:
  tmps_free(&t);
}

void zt__cpu_matmul_fwd_dt(void *ctx, zt_dtype dt, void *out, const void *inp, const void *w,
                           const float *bias, int N, int C, int OC) {
  if (dt == ZT_F32) {
    zt__cpu_matmul_fwd(ctx, out, inp, w, bias, N, C, OC);
    return;
  }
  tmps t = {.ctx = ctx};
  float *i = tmp(&t, inp, dt, (size_t)N * C), *wf = tmp(&t, w, dt, (size_t)OC * C);
  float *o = tmp(&t, NULL, dt, (size_t)N * OC);
  if (t.failed) goto out;
  zt__cpu_matmul_fwd(ctx, o, i, wf, bias, N, C, OC);
  zt__cpu_cast(ctx, out, dt, o, ZT_F32, (size_t)N * OC);
out:
  tmps_free(&t);
}

void zt__cpu_matmul_bwd_dt(void *ctx, zt_dtype dt, void *dinp, float *dw, float *dbias,
                           const void *dout, const void *inp, const void *w, int N, int C,
                           int OC) {
  if (dt == ZT_F32) {
    zt__cpu_matmul_bwd(ctx, dinp, dw, dbias, dout, inp, w, N, C, OC);
    return;
  }
  tmps t = {.ctx = ctx};
  float *d = tmp(&t, dout, dt, (size_t)N * OC), *i = tmp(&t, inp, dt, (size_t)N * C);
  float *wf = tmp(&t, w, dt, (size_t)OC * C);
  float *di = dinp ? tmp(&t, dinp, dt, (size_t)N * C) : NULL;
  if (t.failed) goto out;
  zt__cpu_matmul_bwd(ctx, di, dw, dbias, d, i, wf, N, C, OC);
  if (dinp) zt__cpu_cast(ctx, dinp, dt, di, ZT_F32, (size_t)N * C);
out:
  tmps_free(&t);
}

void zt__cpu_layernorm_fwd_dt(void *ctx, zt_dtype dt, void *out, float *mean, float *rstd,
                              const void *inp, const float *w, const float *b, int N, int C) {
  if (dt == ZT_F32) {
    zt__cpu_layernorm_fwd(ctx, out, mean, rstd, inp, w, b, N, C);
    return;
  }
  size_t n = (size_t)N * C;
  tmps t = {.ctx = ctx};
  float *i = tmp(&t, inp, dt, n), *o = tmp(&t, NULL, dt, n);
  if (t.failed) goto out;
  zt__cpu_layernorm_fwd(ctx, o, mean, rstd, i, w, b, N, C);
  zt__cpu_cast(ctx, out, dt, o, ZT_F32, n);
out:
  tmps_free(&t);
}

void zt__cpu_layernorm_bwd_dt(void *ctx, zt_dtype dt, void *dinp, float *dw, float *db,
                              const void *dout, const void *inp, const float *w,
                              const float *mean, const float *rstd, int N, int C) {
  if (dt == ZT_F32) {
    zt__cpu_layernorm_bwd(ctx, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    return;
  }
  size_t n = (size_t)N * C;
  tmps t = {.ctx = ctx};
  float *di = tmp(&t, dinp, dt, n), *d = tmp(&t, dout, dt, n), *i = tmp(&t, inp, dt, n);
  if (t.failed) goto out;
  zt__cpu_layernorm_bwd(ctx, di, dw, db, d, i, w, mean, rstd, N, C);
  zt__cpu_cast(ctx, dinp, dt, di, ZT_F32, n);
out:
  tmps_free(&t);
}

/* Strided rows (N rows of len values, stride apart: the q or k part of qkv rows) gathered into
 * a compact fp32 temporary, and scattered back rounded. Only the rows' values are touched. */
static float *tmp_rows(tmps *t, const void *x, zt_dtype dt, int N, size_t len,
                       ptrdiff_t stride) {
  float *p = tmp(t, NULL, dt, (size_t)N * len);
  if (p && x)
    for (int n = 0; n < N; n++)
      zt__cpu_cast(t->ctx, p + (size_t)n * len, ZT_F32,
                   (const char *)x + (ptrdiff_t)n * stride * (ptrdiff_t)zt_dtype_size(dt), dt,
                   len);
  return p;
}

static void put_rows(void *ctx, void *x, zt_dtype dt, const float *p, int N, size_t len,
                     ptrdiff_t stride) {
  for (int n = 0; n < N; n++)
    zt__cpu_cast(ctx, (char *)x + (ptrdiff_t)n * stride * (ptrdiff_t)zt_dtype_size(dt), dt,
                 p + (size_t)n * len, ZT_F32, len);
}

/* The rows of the fp32 ops are computed alike whatever their stride, so the compact copies
 * (stride H*C) give the bits the fp32 op gives in place. transformers rounds x * rstd to dt
 * before the product with w; here the product stays fp32 and is rounded once (the difference
 * is within an ulp of dt). */
void zt__cpu_rmsnorm_fwd_dt(void *ctx, zt_dtype dt, void *out, float *rstd, const void *inp,
                            const float *w, int N, int H, int C, ptrdiff_t stride, float eps) {
  if (dt == ZT_F32) {
    zt__cpu_rmsnorm_fwd(ctx, out, rstd, inp, w, N, H, C, stride, eps);
    return;
  }
  size_t len = (size_t)H * C;
  tmps t = {.ctx = ctx};
  float *i = tmp_rows(&t, inp, dt, N, len, stride), *o = tmp(&t, NULL, dt, (size_t)N * len);
  if (t.failed) goto out;
  zt__cpu_rmsnorm_fwd(ctx, o, rstd, i, w, N, H, C, (ptrdiff_t)len, eps);
  put_rows(ctx, out, dt, o, N, len, stride);
out:
  tmps_free(&t);
}

void zt__cpu_rmsnorm_bwd_dt(void *ctx, zt_dtype dt, void *dinp, float *dw, const void *dout,
                            const void *inp, const float *w, const float *rstd, int N, int H,
                            int C, ptrdiff_t stride) {
  if (dt == ZT_F32) {
    zt__cpu_rmsnorm_bwd(ctx, dinp, dw, dout, inp, w, rstd, N, H, C, stride);
    return;
  }
  size_t len = (size_t)H * C;
  tmps t = {.ctx = ctx};
  float *di = tmp_rows(&t, dinp, dt, N, len, stride), *d = tmp_rows(&t, dout, dt, N, len, stride);
  float *i = tmp_rows(&t, inp, dt, N, len, stride);
  if (t.failed) goto out;
  zt__cpu_rmsnorm_bwd(ctx, di, dw, d, i, w, rstd, N, H, C, (ptrdiff_t)len);
  put_rows(ctx, dinp, dt, di, N, len, stride);
out:
  tmps_free(&t);
}

/* The reference keeps fp32 probabilities whatever dt is. */
size_t zt__cpu_attention_saved_bytes_dt(zt_dtype dt, int B, int T, int NH, int NKV, int hs) {
  (void)dt;
  return zt__cpu_attention_saved_bytes(B, T, NH, NKV, hs);
}

void zt__cpu_attention_fwd_dt(void *ctx, zt_dtype dt, void *out, void *saved, const void *qkv,
                              int B, int T, int NH, int NKV, int hs, int causal,
                                  const int32_t *pos) {
  if (dt == ZT_F32) {
    zt__cpu_attention_fwd(ctx, out, saved, qkv, B, T, NH, NKV, hs, causal, pos);
    return;
  }
  size_t bt = (size_t)B * T, n = bt * NH * hs, nqkv = bt * (NH + 2 * NKV) * hs;
  tmps t = {.ctx = ctx};
  float *q = tmp(&t, qkv, dt, nqkv), *o = tmp(&t, NULL, dt, n);
  if (t.failed) goto out;
  zt__cpu_attention_fwd(ctx, o, saved, q, B, T, NH, NKV, hs, causal, pos);
  zt__cpu_cast(ctx, out, dt, o, ZT_F32, n);
out:
  tmps_free(&t);
}

void zt__cpu_attention_bwd_dt(void *ctx, zt_dtype dt, void *dqkv, const void *dout,
                              const void *qkv, const void *saved, int B, int T, int NH, int NKV,
                              int hs, int causal, const int32_t *pos) {
  if (dt == ZT_F32) {
    zt__cpu_attention_bwd(ctx, dqkv, dout, qkv, saved, B, T, NH, NKV, hs, causal, pos);
    return;
  }
  size_t bt = (size_t)B * T, n = bt * NH * hs, nqkv = bt * (NH + 2 * NKV) * hs;
  tmps t = {.ctx = ctx};
  float *dq = tmp(&t, dqkv, dt, nqkv), *d = tmp(&t, dout, dt, n), *q = tmp(&t, qkv, dt, nqkv);
  if (t.failed) goto out;
  zt__cpu_attention_bwd(ctx, dq, d, q, saved, B, T, NH, NKV, hs, causal, pos);
  zt__cpu_cast(ctx, dqkv, dt, dq, ZT_F32, nqkv);
out:
  tmps_free(&t);
}

/* x rotated in place (forward or backward) on a compact fp32 copy of its rows. transformers
 * rounds cos and sin to dt before the products; here they stay fp32 and the result is rounded
 * once. */
static void rope_dt(void *ctx, zt_dtype dt, void *x, const float *inv_freq, const int32_t *pos,
                    int N, int H, int hs, ptrdiff_t stride,
                    void (*f)(void *, float *, const float *, const int32_t *, int, int, int,
                              ptrdiff_t)) {
  if (dt == ZT_F32) {
    f(ctx, x, inv_freq, pos, N, H, hs, stride);
    return;
  }
  size_t len = (size_t)H * hs;
  tmps t = {.ctx = ctx};
  float *r = tmp_rows(&t, x, dt, N, len, stride);
  if (t.failed) goto out;
  f(ctx, r, inv_freq, pos, N, H, hs, (ptrdiff_t)len);
  put_rows(ctx, x, dt, r, N, len, stride);
out:
  tmps_free(&t);
}

void zt__cpu_rope_fwd_dt(void *ctx, zt_dtype dt, void *x, const float *inv_freq,
                         const int32_t *pos, int N, int H, int hs, ptrdiff_t stride) {
  rope_dt(ctx, dt, x, inv_freq, pos, N, H, hs, stride, zt__cpu_rope_fwd);
}

void zt__cpu_rope_bwd_dt(void *ctx, zt_dtype dt, void *dx, const float *inv_freq,
                         const int32_t *pos, int N, int H, int hs, ptrdiff_t stride) {
  rope_dt(ctx, dt, dx, inv_freq, pos, N, H, hs, stride, zt__cpu_rope_bwd);
}

/* out = f(inp) for the elementwise forwards. */
static void unary_dt(void *ctx, zt_dtype dt, void *out, const void *inp, size_t n,
                     void (*f)(void *, float *, const float *, size_t)) {
  if (dt == ZT_F32) {
    f(ctx, out, inp, n);
    return;
  }
  tmps t = {.ctx = ctx};
  float *i = tmp(&t, inp, dt, n), *o = tmp(&t, NULL, dt, n);
  if (t.failed) goto out;
  f(ctx, o, i, n);
  zt__cpu_cast(ctx, out, dt, o, ZT_F32, n);
out:
  tmps_free(&t);
}

/* dinp += f'(inp) dout for the elementwise backwards. */
static void unary_bwd_dt(void *ctx, zt_dtype dt, void *dinp, const void *inp, const void *dout,
                         size_t n,
                         void (*f)(void *, float *, const float *, const float *, size_t)) {
  if (dt == ZT_F32) {
    f(ctx, dinp, inp, dout, n);
    return;
  }
  tmps t = {.ctx = ctx};
  float *di = tmp(&t, dinp, dt, n), *i = tmp(&t, inp, dt, n), *d = tmp(&t, dout, dt, n);
  if (t.failed) goto out;
  f(ctx, di, i, d, n);
  zt__cpu_cast(ctx, dinp, dt, di, ZT_F32, n);
out:
  tmps_free(&t);
}

void zt__cpu_gelu_fwd_dt(void *ctx, zt_dtype dt, void *out, const void *inp, size_t n) {
  unary_dt(ctx, dt, out, inp, n, zt__cpu_gelu_fwd);
}

void zt__cpu_gelu_bwd_dt(void *ctx, zt_dtype dt, void *dinp, const void *inp, const void *dout,
                         size_t n) {
  unary_bwd_dt(ctx, dt, dinp, inp, dout, n, zt__cpu_gelu_bwd);
}

void zt__cpu_relu_fwd_dt(void *ctx, zt_dtype dt, void *out, const void *inp, size_t n) {
  unary_dt(ctx, dt, out, inp, n, zt__cpu_relu_fwd);
}

void zt__cpu_relu_bwd_dt(void *ctx, zt_dtype dt, void *dinp, const void *inp, const void *dout,
                         size_t n) {
  unary_bwd_dt(ctx, dt, dinp, inp, dout, n, zt__cpu_relu_bwd);
}

void zt__cpu_add_dt(void *ctx, zt_dtype dt, void *out, const void *a, const void *b, size_t n) {
  if (dt == ZT_F32) {
    zt__cpu_add(ctx, out, a, b, n);
    return;
  }
  tmps t = {.ctx = ctx};
  float *x = tmp(&t, a, dt, n), *y = tmp(&t, b, dt, n);
  if (t.failed) goto out;
  zt__cpu_add(ctx, x, x, y, n);
  zt__cpu_cast(ctx, out, dt, x, ZT_F32, n);
out:
  tmps_free(&t);
}

void zt__cpu_swiglu_fwd_dt(void *ctx, zt_dtype dt, void *out, const void *inp, int N, int F) {
  if (dt == ZT_F32) {
    zt__cpu_swiglu_fwd(ctx, out, inp, N, F);
    return;
  }
  size_t n = (size_t)N * F;
  tmps t = {.ctx = ctx};
  float *i = tmp(&t, inp, dt, 2 * n), *o = tmp(&t, NULL, dt, n);
  if (t.failed) goto out;
  zt__cpu_swiglu_fwd(ctx, o, i, N, F);
  zt__cpu_cast(ctx, out, dt, o, ZT_F32, n);
out:
  tmps_free(&t);
}

void zt__cpu_swiglu_bwd_dt(void *ctx, zt_dtype dt, void *dinp, const void *inp,
                           const void *dout, int N, int F) {
  if (dt == ZT_F32) {
    zt__cpu_swiglu_bwd(ctx, dinp, inp, dout, N, F);
    return;
  }
  size_t n = (size_t)N * F;
  tmps t = {.ctx = ctx};
  float *di = tmp(&t, dinp, dt, 2 * n), *i = tmp(&t, inp, dt, 2 * n), *d = tmp(&t, dout, dt, n);
  if (t.failed) goto out;
  zt__cpu_swiglu_bwd(ctx, di, i, d, N, F);
  zt__cpu_cast(ctx, dinp, dt, di, ZT_F32, 2 * n);
out:
  tmps_free(&t);
}

void zt__cpu_crossentropy_fwd_bwd_dt(void *ctx, zt_dtype dt, void *logits,
                                     const int32_t *targets, int N, int V, int V_alloc,
                                     int ignore_index, float dscale, double *loss_sum,
                                     int *n_counted) {
  if (dt == ZT_F32) {
    zt__cpu_crossentropy_fwd_bwd(ctx, logits, targets, N, V, V_alloc, ignore_index,
                                        dscale, loss_sum, n_counted);
    return;
  }
  size_t n = (size_t)N * V_alloc;
  tmps t = {.ctx = ctx};
  float *x = tmp(&t, logits, dt, n);
  *loss_sum = 0.0;
  *n_counted = 0;
  if (t.failed) goto out;
  zt__cpu_crossentropy_fwd_bwd(ctx, x, targets, N, V, V_alloc, ignore_index, dscale, loss_sum,
                               n_counted);
  zt__cpu_cast(ctx, logits, dt, x, ZT_F32, n);
out:
  tmps_free(&t);
}

void zt__cpu_crossentropy_fwd_dt(void *ctx, zt_dtype dt, const void *logits,
                                 const int32_t *targets, int N, int V, int V_alloc,
                                 int ignore_index, double *loss_sum, int *n_counted) {
  if (dt == ZT_F32) {
    zt__cpu_crossentropy_fwd(ctx, logits, targets, N, V, V_alloc, ignore_index, loss_sum,
                                    n_counted);
    return;
  }
  tmps t = {.ctx = ctx};
  float *x = tmp(&t, logits, dt, (size_t)N * V_alloc);
  *loss_sum = 0.0;
  *n_counted = 0;
  if (t.failed) goto out;
  zt__cpu_crossentropy_fwd(ctx, x, targets, N, V, V_alloc, ignore_index, loss_sum, n_counted);
out:
  tmps_free(&t);
}

void zt__cpu_crossentropy_rows_dt(void *ctx, zt_dtype dt, void *logits, const int32_t *targets,
                                  int N, int V, int V_alloc, int ignore_index, float dscale,
                                  float *row_loss) {
  if (dt == ZT_F32) {
    zt__cpu_crossentropy_rows(ctx, logits, targets, N, V, V_alloc, ignore_index, dscale,
                              row_loss);
    return;
  }
  size_t n = (size_t)N * V_alloc;
  tmps t = {.ctx = ctx};
  float *x = tmp(&t, logits, dt, n);
  if (t.failed) goto out;
  zt__cpu_crossentropy_rows(ctx, x, targets, N, V, V_alloc, ignore_index, dscale, row_loss);
  zt__cpu_cast(ctx, logits, dt, x, ZT_F32, n);
out:
  tmps_free(&t);
}

void zt__cpu_adamw_dt(void *ctx, float *p, const float *g, float *m, float *v, size_t n,
                      float lr, float beta1, float beta2, float eps, float weight_decay,
                      int step, float grad_scale, void *p_lp, zt_dtype lp_t) {
  zt__cpu_adamw(ctx, p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, step, grad_scale);
  if (lp_t != ZT_F32) zt__cpu_cast(ctx, p_lp, lp_t, p, ZT_F32, n);
}

int zt__cpu_set_allow_tf32(void *ctx, int allow) {
  (void)ctx;
  return allow ? -ENOTSUP : 0;
}
