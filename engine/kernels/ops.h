/* The op interface: every layer op of the models, forward and backward, plus the optimizer and
 * reductions, behind one table of function pointers. kernels/cpu is the plain-C reference (the
 * truth); kernels/cuda implements the same table on a stream. Model code calls only this.
 *
 * Conventions (both backends):
 * - All tensors are row-major fp32 in backend memory (device memory for cuda). Shapes are given in
 *   the comments as (B, T, C) etc.; N = B*T rows where an op does not care about B and T.
 * - Linear weights use PyTorch nn.Linear layout: w is (OC, C) and out = inp @ w^T + bias.
 * - Every backward ADDS into its gradient outputs (input gradients and parameter gradients), so
 *   residual branches, tied weights and micro-batch accumulation need no extra copies; the caller
 *   zeroes gradient buffers when a new accumulation starts.
 * - Ops are asynchronous on the cuda backend; the ones that return a host scalar synchronise.
 * - ctx is the backend's context (zt_backend.ctx).
 *
 * Mixed precision (the typed entries, suffix _dt, at the end of the table): precision is a
 * property of the job, so these entries take the storage type dt of the activations at run
 * time. In them:
 * - every activation-shaped tensor (inputs, outputs, saved activations, the gradients of
 *   activations, the logits and their in-place gradient) is stored as dt, as is the weight w of
 *   the matmuls (the compute copy of the parameters);
 * - every other parameter (biases, norm weights, embedding tables), every parameter gradient,
 *   every saved statistic (layernorm mean/rstd, rmsnorm rstd), the rotary inv_freq and the
 *   row losses are fp32;
 * - arithmetic is fp32: a dt value is widened, computed on as the fp32 op does, and the
 *   result rounded (nearest even) to dt once when stored; an op that adds into a dt output
 *   rounds the fp32 sum. Matmuls accumulate in fp32; layernorm statistics, softmax, the loss and
 *   every reduction are fp32 (or double, as in the fp32 ops).
 * With dt = ZT_F32 each typed entry is its fp32 entry, bit for bit. */
#ifndef ZT_KERNELS_OPS_H
#define ZT_KERNELS_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "engine/kernels/dtype.h"

typedef struct zt_ops {
  const char *name; /* "cpu" | "cuda" */

  /* ---- memory ---------------------------------------------------------------------------- */
  /* Backend allocations are taken at job start only (never in the step loop). */
  void *(*alloc)(void *ctx, size_t bytes);
  void (*free)(void *ctx, void *p);
  void (*zero)(void *ctx, void *p, size_t bytes);
  void (*to_device)(void *ctx, void *dst, const void *host_src, size_t bytes);
  void (*to_host)(void *ctx, void *host_dst, const void *src, size_t bytes);
  /* Waits for all queued work; returns 0 or the backend's error as -errno (logged with text). */
  int (*sync)(void *ctx);
  /* The text of the backend's first error ("" when none), for the message of a failed job. */
  const char *(*error_text)(void *ctx);

  /* ---- embedding -------------------------------------------------------------------------- */
  /* out (B,T,C) = wte[tok[b,t]] + wpe[p(b,t)] (wpe may be NULL: no position embedding), p the
   * token's document-local position (see "Documents" below; pos NULL: p = t). */
  void (*embedding_fwd)(void *ctx, float *out, const int32_t *tok, const float *wte,
                        const float *wpe, int B, int T, int C, const int32_t *pos);
  /* dwte[tok] += dout; dwpe[p] += the sum of dout over the tokens at position p, in row order
   * and within a row in document order, added once (dwpe NULL when wpe was NULL). */
  void (*embedding_bwd)(void *ctx, float *dwte, float *dwpe, const float *dout,
                        const int32_t *tok, int B, int T, int C, const int32_t *pos);

  /* ---- linear ----------------------------------------------------------------------------- */
  /* out (N,OC) = inp (N,C) @ w (OC,C)^T + bias (OC) (bias may be NULL). */
  void (*matmul_fwd)(void *ctx, float *out, const float *inp, const float *w, const float *bias,
                     int N, int C, int OC);
  /* dinp += dout @ w; dw += dout^T @ inp; dbias += sum_n dout. dinp/dbias may be NULL. */
  void (*matmul_bwd)(void *ctx, float *dinp, float *dw, float *dbias, const float *dout,
                     const float *inp, const float *w, int N, int C, int OC);

  /* ---- layernorm (eps 1e-5, biased variance, like torch.nn.LayerNorm) --------------------- */
  /* out (N,C); mean, rstd (N) are saved for backward. */
  void (*layernorm_fwd)(void *ctx, float *out, float *mean, float *rstd, const float *inp,
                        const float *w, const float *b, int N, int C);
  void (*layernorm_bwd)(void *ctx, float *dinp, float *dw, float *db, const float *dout,
                        const float *inp, const float *w, const float *mean, const float *rstd,
                        int N, int C);

  /* ---- rmsnorm (as transformers' LlamaRMSNorm: y = x * rsqrt(mean(x^2) + eps) * w, the
   * statistics in fp32) --------------------------------------------------------------------- */
  /* N*H rows of C: row (n, h) starts at inp + n*stride + h*C (and at the same offset in out,
   * dout, dinp); w (C); rstd (N*H) saved for backward, row (n, h) at n*H + h. The block norms
   * are H = 1, stride = C; Qwen3's q/k norm runs on the q (or k) part of a qkv row: H heads
   * of C = hs, stride the qkv row. */
  void (*rmsnorm_fwd)(void *ctx, float *out, float *rstd, const float *inp, const float *w,
                      int N, int H, int C, ptrdiff_t stride, float eps);
  /* dinp += d(out)/d(inp) . dout;  dw += sum over the rows of dout * inp * rstd. */
  void (*rmsnorm_bwd)(void *ctx, float *dinp, float *dw, const float *dout, const float *inp,
                      const float *w, const float *rstd, int N, int H, int C, ptrdiff_t stride);

  /* ---- attention -------------------------------------------------------------------------- */
  /* qkv (B,T,(NH+2*NKV)*hs) holds per token q (NH,hs) | k (NKV,hs) | v (NKV,hs); out
   * (B,T,NH*hs). Query head h attends with key/value head h / (NH/NKV) (grouped-query
   * attention; NKV == NH is multi-head; NH % NKV == 0). softmax(q k^T / sqrt(hs)) v with the
   * max subtracted; causal masks keys after the query. K/V heads are never replicated in memory.
   * saved is backend-private state for backward of attention_saved_bytes() bytes (the CPU
   * reference keeps the probabilities (B,NH,T,T)).
   * Documents: pos (B*T, backend memory) holds each token's document-local position; tokens i
   * and j of a row are in one document iff i - pos[i] == j - pos[j]; a document (or the part
   * of a long one that a row starts with) is a run of positions 0, 1, 2, ... A key is visible
   * to a query only inside the query's document (causal: and not after the query). pos NULL
   * is one document per row: today's path and bits, and pos = 0..T-1 in every row gives the
   * same bits. A position outside [0, t] is read as the
   * nearest bound, so no pos makes an op read outside its row. */
  size_t (*attention_saved_bytes)(int B, int T, int NH, int NKV, int hs);
  void (*attention_fwd)(void *ctx, float *out, void *saved, const float *qkv, int B, int T,
                        int NH, int NKV, int hs, int causal, const int32_t *pos);
  /* dqkv += d(out)/d(qkv) . dout  (dk, dv of a shared head sum over the query heads of its
   * group) */
  void (*attention_bwd)(void *ctx, float *dqkv, const float *dout, const float *qkv,
                        const void *saved, int B, int T, int NH, int NKV, int hs, int causal,
                        const int32_t *pos);

  /* ---- rotary position embedding --------------------------------------------------------- */
  /* x (N, H, hs) rotated in place, token n at position pos[n]: for i < hs/2, with
   * a = pos[n] * inv_freq[i] (fp32 product), c = cos(a), s = sin(a):
   *   x1 = x[.., i], x2 = x[.., i + hs/2];  x[.., i] = x1*c - x2*s;  x[.., i + hs/2] = x2*c + x1*s.
   * Rows are `stride` floats apart (the q or k part of a qkv row: stride = (NH+2*NKV)*hs, H
   * heads of hs starting at x). inv_freq (hs/2) and pos (N) are backend memory.
   * rope_bwd applies the inverse rotation (angle -a) in place: the gradient of the input. */
  void (*rope_fwd)(void *ctx, float *x, const float *inv_freq, const int32_t *pos, int N,
                   int H, int hs, ptrdiff_t stride);
  void (*rope_bwd)(void *ctx, float *dx, const float *inv_freq, const int32_t *pos, int N,
                   int H, int hs, ptrdiff_t stride);

  /* ---- pointwise -------------------------------------------------------------------------- */
  /* tanh-approximated GELU, as GPT-2 and torch.nn.GELU(approximate='tanh'). */
  void (*gelu_fwd)(void *ctx, float *out, const float *inp, size_t n);
  void (*gelu_bwd)(void *ctx, float *dinp, const float *inp, const float *dout, size_t n);
  void (*relu_fwd)(void *ctx, float *out, const float *inp, size_t n);
  /* dinp += dout where inp > 0 */
  void (*relu_bwd)(void *ctx, float *dinp, const float *inp, const float *dout, size_t n);
  /* out = a + b (out may alias a or b) */
  void (*add)(void *ctx, float *out, const float *a, const float *b, size_t n);

  /* ---- SwiGLU ------------------------------------------------------------------------------ */
  /* out (N,F) = silu(inp[:, :F]) * inp[:, F:] with inp (N, 2F), silu(g) = g / (1 + exp(-g)). */
  void (*swiglu_fwd)(void *ctx, float *out, const float *inp, int N, int F);
  /* dinp (N, 2F) += the gradient of both halves. */
  void (*swiglu_bwd)(void *ctx, float *dinp, const float *inp, const float *dout, int N, int F);

  /* ---- loss ------------------------------------------------------------------------------- */
  /* Fused softmax-cross-entropy over the vocab for N rows of V logits (V_alloc >= V columns per
   * row in memory, the padding ignored). Targets equal to ignore_index contribute nothing.
   * Writes dlogits = (softmax - onehot) * dscale into logits IN PLACE (padding zeroed), and returns
   * on the host the sum of the per-token losses and the count of counted tokens. */
  void (*crossentropy_fwd_bwd)(void *ctx, float *logits, const int32_t *targets, int N, int V,
                               int V_alloc, int ignore_index, float dscale, double *loss_sum,
                               int *n_counted);
  /* Forward only (evaluation): same loss sum and count, logits untouched. */
  void (*crossentropy_fwd)(void *ctx, const float *logits, const int32_t *targets, int N, int V,
                           int V_alloc, int ignore_index, double *loss_sum, int *n_counted);

  /* ---- reductions and the optimizer ------------------------------------------------------- */
  /* sum of x[i]^2 accumulated in double, returned on the host; also reports whether any value
   * is inf or nan. */
  double (*sum_squares)(void *ctx, const float *x, size_t n, int *nonfinite);
  /* sum of x[i] accumulated in double, returned on the host (synchronises). */
  double (*sum)(void *ctx, const float *x, size_t n);
  /* x *= s */
  void (*scale)(void *ctx, float *x, float s, size_t n);
  /* One torch.optim.AdamW step (decoupled weight decay, bias correction) on n values:
   *   g' = g * grad_scale; m = b1 m + (1-b1) g'; v = b2 v + (1-b2) g'^2;
   *   p -= lr * wd * p;  p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps).
   * step t starts at 1. */
  void (*adamw)(void *ctx, float *p, const float *g, float *m, float *v, size_t n, float lr,
                float beta1, float beta2, float eps, float weight_decay, int step,
                float grad_scale);

  /* ---- mixed precision: conversions, the optimizer with the compute copy, math mode ------- */
  /* dst[i] = src[i] converted (rounded to nearest even when narrowing; any pair of types). */
  void (*cast)(void *ctx, void *dst, zt_dtype dst_t, const void *src, zt_dtype src_t, size_t n);
  /* adamw, then p_lp[i] = p[i] rounded to lp_t: the compute copy rewritten in the same pass.
   * p_lp is ignored when lp_t is ZT_F32 (the fp32 params are then their own compute copy). */
  void (*adamw_dt)(void *ctx, float *p, const float *g, float *m, float *v, size_t n, float lr,
                   float beta1, float beta2, float eps, float weight_decay, int step,
                   float grad_scale, void *p_lp, zt_dtype lp_t);
  /* adamw_dt with m and v stored as bf16 (train.optimizer.state_dtype "bf16"): each widened to
   * fp32, updated as in adamw, stored rounded stochastically (engine/kernels/sround.h) with the
   * bits of (seed, step, index0 + i), index0 being element 0's index in the model's flat
   * parameter vector; so the result does not depend on how the vector is cut into calls. */
  void (*adamw_sr)(void *ctx, float *p, const float *g, uint16_t *m, uint16_t *v, size_t n,
                   float lr, float beta1, float beta2, float eps, float weight_decay, int step,
                   float grad_scale, void *p_lp, zt_dtype lp_t, uint64_t seed, uint64_t index0);
  /* Whether fp32 matmuls may use TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32).
   * 0, or -ENOTSUP where the backend has no such mode (cpu: only 0 is accepted). */
  int (*set_allow_tf32)(void *ctx, int allow);

  /* ---- typed entries (see the top of the file); arguments as in the fp32 entries --------- */
  void (*embedding_fwd_dt)(void *ctx, zt_dtype dt, void *out, const int32_t *tok,
                           const float *wte, const float *wpe, int B, int T, int C,
                           const int32_t *pos);
  void (*embedding_bwd_dt)(void *ctx, zt_dtype dt, float *dwte, float *dwpe, const void *dout,
                           const int32_t *tok, int B, int T, int C, const int32_t *pos);
  void (*matmul_fwd_dt)(void *ctx, zt_dtype dt, void *out, const void *inp, const void *w,
                        const float *bias, int N, int C, int OC);
  void (*matmul_bwd_dt)(void *ctx, zt_dtype dt, void *dinp, float *dw, float *dbias,
                        const void *dout, const void *inp, const void *w, int N, int C, int OC);
  void (*layernorm_fwd_dt)(void *ctx, zt_dtype dt, void *out, float *mean, float *rstd,
                           const void *inp, const float *w, const float *b, int N, int C);
  void (*layernorm_bwd_dt)(void *ctx, zt_dtype dt, void *dinp, float *dw, float *db,
                           const void *dout, const void *inp, const float *w, const float *mean,
                           const float *rstd, int N, int C);
  void (*rmsnorm_fwd_dt)(void *ctx, zt_dtype dt, void *out, float *rstd, const void *inp,
                         const float *w, int N, int H, int C, ptrdiff_t stride, float eps);
  void (*rmsnorm_bwd_dt)(void *ctx, zt_dtype dt, void *dinp, float *dw, const void *dout,
                         const void *inp, const float *w, const float *rstd, int N, int H, int C,
                         ptrdiff_t stride);
  size_t (*attention_saved_bytes_dt)(zt_dtype dt, int B, int T, int NH, int NKV, int hs);
  void (*attention_fwd_dt)(void *ctx, zt_dtype dt, void *out, void *saved, const void *qkv,
                           int B, int T, int NH, int NKV, int hs, int causal,
                           const int32_t *pos);
  void (*attention_bwd_dt)(void *ctx, zt_dtype dt, void *dqkv, const void *dout,
                           const void *qkv, const void *saved, int B, int T, int NH, int NKV,
                           int hs, int causal, const int32_t *pos);
  /* x in dt, rotated in fp32 and rounded once */
  void (*rope_fwd_dt)(void *ctx, zt_dtype dt, void *x, const float *inv_freq,
                      const int32_t *pos, int N, int H, int hs, ptrdiff_t stride);
  void (*rope_bwd_dt)(void *ctx, zt_dtype dt, void *dx, const float *inv_freq,
                      const int32_t *pos, int N, int H, int hs, ptrdiff_t stride);
  void (*gelu_fwd_dt)(void *ctx, zt_dtype dt, void *out, const void *inp, size_t n);
  void (*gelu_bwd_dt)(void *ctx, zt_dtype dt, void *dinp, const void *inp, const void *dout,
                      size_t n);
  void (*relu_fwd_dt)(void *ctx, zt_dtype dt, void *out, const void *inp, size_t n);
  void (*relu_bwd_dt)(void *ctx, zt_dtype dt, void *dinp, const void *inp, const void *dout,
                      size_t n);
  void (*add_dt)(void *ctx, zt_dtype dt, void *out, const void *a, const void *b, size_t n);
  void (*swiglu_fwd_dt)(void *ctx, zt_dtype dt, void *out, const void *inp, int N, int F);
  void (*swiglu_bwd_dt)(void *ctx, zt_dtype dt, void *dinp, const void *inp, const void *dout,
                        int N, int F);
  void (*crossentropy_fwd_bwd_dt)(void *ctx, zt_dtype dt, void *logits, const int32_t *targets,
                                  int N, int V, int V_alloc, int ignore_index, float dscale,
                                  double *loss_sum, int *n_counted);
  void (*crossentropy_fwd_dt)(void *ctx, zt_dtype dt, const void *logits,
                              const int32_t *targets, int N, int V, int V_alloc,
                              int ignore_index, double *loss_sum, int *n_counted);
  /* Softmax cross-entropy of N rows as crossentropy_fwd_bwd_dt (dlogits = (softmax - onehot) *
   * dscale written into logits in place, padding zeroed, ignored rows zeroed), but nothing
   * returns to the host and nothing synchronises: row_loss[n] += the loss of row n (fp32; 0 for
   * an ignored target). For the chunked head (the logits of a micro-batch exist a chunk of rows
   * at a time) and a loss summed once per micro-batch. */
  void (*crossentropy_rows_dt)(void *ctx, zt_dtype dt, void *logits, const int32_t *targets,
                               int N, int V, int V_alloc, int ignore_index, float dscale,
                               float *row_loss);
} zt_ops;

/* A backend: its op table and context. */
typedef struct zt_backend {
  const zt_ops *ops;
  void *ctx;
} zt_backend;

/* The CPU reference backend (always available). */
int zt_backend_cpu_open(zt_backend *be, int n_threads);
/* Its op table alone, for the context-free entries (attention_saved_bytes_dt): sizing a job
 * without opening a backend. */
const zt_ops *zt_backend_cpu_ops(void);
void zt_backend_cpu_close(zt_backend *be);

#endif
