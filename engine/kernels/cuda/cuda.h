/* Internals of the CUDA backend: the context, the one error check, and the op functions (in
 * the .c files for cuBLAS work, in the .cu files for kernels) that backend.c puts into the
 * zt_ops table. Included by C and by CUDA C++ alike.
 *
 * Errors: ops return void, so the first failure is recorded in the context (logged with file,
 * line and the CUDA/cuBLAS text) and is sticky: every later op returns at once and sync()
 * returns it as a negative errno. A check that fails jumps to the function's `out` label.
 *
 * Determinism: every reduction has a fixed order that depends only on the shapes (no float
 * atomics), and cuBLAS is deterministic on one stream with its default atomics mode, so every
 * op gives the same bits run to run on the same GPU model. */
#ifndef ZT_KERNELS_CUDA_CUDA_H
#define ZT_KERNELS_CUDA_CUDA_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "engine/kernels/cuda/sizes.h"
#include "engine/kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Page-locked host memory for the scalars that ops return to the host. */
#define ZT__CUDA_PINNED_BYTES 4096
/* Device memory for the partial sums of the reductions (column sums, losses, norms): the
 * partial counts are chosen so that they fit, whatever the shapes. */
#define ZT__CUDA_SCRATCH_BYTES (4u << 20)

typedef struct zt__cuda_ctx {
  int device;
  cudaStream_t stream;
  cublasHandle_t cublas;
  /* Lets cuBLAS use TF32 tensor cores for fp32 matmuls (the job spec's "tf32" option, set
   * through the set_allow_tf32 op); off: results are plain fp32. */
  bool allow_tf32;
  void *pinned;  /* ZT__CUDA_PINNED_BYTES */
  void *scratch; /* ZT__CUDA_SCRATCH_BYTES, device */
  int err;       /* first error as a negative errno, 0 while none */
  char err_text[256];
} zt__cuda_ctx;

/* Record a failure: logged once with file and line by engine/base/check.h's zt_check_fail, the
 * first one kept in the context for sync() and error_text(). Return the code. */
int zt__cuda_fail(zt__cuda_ctx *ctx, int code, const char *file, int line, const char *what);
/* 0 when the status is success, else -EIO, the CUDA / cuBLAS text logged and kept
 * (engine/base/check_cuda.h's converters). ZT__CU / ZT__CUBLAS are their goto forms for the
 * void ops, which keep the error in the context instead of returning it. */
int zt__cuda_check_rt(zt__cuda_ctx *ctx, cudaError_t e, const char *what, const char *file,
                      int line);
int zt__cuda_check_blas(zt__cuda_ctx *ctx, cublasStatus_t s, const char *what, const char *file,
                        int line);

#define ZT__CU(ctx, expr)                                                                      \
  do {                                                                                         \
    if (zt__cuda_check_rt((ctx), (expr), #expr, __FILE__, __LINE__) < 0)                       \
      goto out;                                                                                \
  } while (0)
#define ZT__CUBLAS(ctx, expr)                                                                  \
  do {                                                                                         \
    if (zt__cuda_check_blas((ctx), (expr), #expr, __FILE__, __LINE__) < 0)                     \
      goto out;                                                                                \
  } while (0)
/* Bad arguments (negative sizes, ...) poison the context like a failed call: -EINVAL. */
#define ZT__ARG(ctx, cond)                                                                     \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      zt__cuda_fail((ctx), -EINVAL, __FILE__, __LINE__, "argument check failed: " #cond);     \
      goto out;                                                                                \
    }                                                                                          \
  } while (0)

/* Launch geometry for grid-stride loops over n elements: enough blocks to fill the GPU, never
 * more than the work needs. n > 0. */
#define ZT__CUDA_THREADS 256
static inline unsigned zt__cuda_blocks(size_t n, unsigned threads) {
  size_t b = (n + threads - 1) / threads;
  return b < 65536 ? (unsigned)b : 65536u;
}

/* embedding.cu */
void zt__cuda_embedding_fwd(void *ctx, float *out, const int32_t *tok, const float *wte,
                            const float *wpe, int B, int T, int C, const int32_t *pos);
void zt__cuda_embedding_bwd(void *ctx, float *dwte, float *dwpe, const float *dout,
                            const int32_t *tok, int B, int T, int C, const int32_t *pos);

/* linear.c */
void zt__cuda_matmul_fwd(void *ctx, float *out, const float *inp, const float *w,
                         const float *bias, int N, int C, int OC);
void zt__cuda_matmul_bwd(void *ctx, float *dinp, float *dw, float *dbias, const float *dout,
                         const float *inp, const float *w, int N, int C, int OC);

/* layernorm.cu */
void zt__cuda_layernorm_fwd(void *ctx, float *out, float *mean, float *rstd, const float *inp,
                            const float *w, const float *b, int N, int C);
void zt__cuda_layernorm_bwd(void *ctx, float *dinp, float *dw, float *db, const float *dout,
                            const float *inp, const float *w, const float *mean,
                            const float *rstd, int N, int C);

/* rmsnorm.cu */
void zt__cuda_rmsnorm_fwd(void *ctx, float *out, float *rstd, const float *inp, const float *w,
                          int N, int H, int C, ptrdiff_t stride, float eps);
void zt__cuda_rmsnorm_bwd(void *ctx, float *dinp, float *dw, const float *dout,
                          const float *inp, const float *w, const float *rstd, int N, int H,
                          int C, ptrdiff_t stride);

/* attention.c (cuBLAS) and its kernels in attention.cu; its sizing entries are sizes.h's */
void zt__cuda_attention_fwd(void *ctx, float *out, void *saved, const float *qkv, int B, int T,
                            int NH, int NKV, int hs, int causal, const int32_t *pos);
void zt__cuda_attention_bwd(void *ctx, float *dqkv, const float *dout, const float *qkv,
                            const void *saved, int B, int T, int NH, int NKV, int hs,
                            int causal, const int32_t *pos);
/* att holds rows (b, h, t) of T scores, b from 0; each becomes its softmax over the keys query
 * t sees (causal: up to t; pos non-NULL: in t's document, pos[b*T + t] its position, ops.h),
 * the rest 0. */
int zt__cuda_softmax_rows(zt__cuda_ctx *ctx, float *att, size_t rows, int T, int causal,
                          const int32_t *pos, int NH);
/* dp (rows of T) becomes dS = P * (dP - rowsum(P * dP)) * scale, 0 where the mask hides. */
int zt__cuda_softmax_bwd_rows(zt__cuda_ctx *ctx, float *dp, const float *att, size_t rows,
                              int T, int causal, float scale, const int32_t *pos, int NH);

/* rope.cu */
void zt__cuda_rope_fwd(void *ctx, float *x, const float *inv_freq, const int32_t *pos, int N,
                       int H, int hs, ptrdiff_t stride);
void zt__cuda_rope_bwd(void *ctx, float *dx, const float *inv_freq, const int32_t *pos, int N,
                       int H, int hs, ptrdiff_t stride);

/* swiglu.cu */
void zt__cuda_swiglu_fwd(void *ctx, float *out, const float *inp, int N, int F);
void zt__cuda_swiglu_bwd(void *ctx, float *dinp, const float *inp, const float *dout, int N,
                         int F);

/* pointwise.cu */
void zt__cuda_gelu_fwd(void *ctx, float *out, const float *inp, size_t n);
void zt__cuda_gelu_bwd(void *ctx, float *dinp, const float *inp, const float *dout, size_t n);
void zt__cuda_relu_fwd(void *ctx, float *out, const float *inp, size_t n);
void zt__cuda_relu_bwd(void *ctx, float *dinp, const float *inp, const float *dout, size_t n);
void zt__cuda_add(void *ctx, float *out, const float *a, const float *b, size_t n);
void zt__cuda_scale(void *ctx, float *x, float s, size_t n);
/* out (N, OC): every row = bias */
int zt__cuda_broadcast_rows(zt__cuda_ctx *ctx, float *out, const float *bias, int N, int OC);

/* reduce.cu */
double zt__cuda_sum_squares(void *ctx, const float *x, size_t n, int *nonfinite);
double zt__cuda_sum(void *ctx, const float *x, size_t n);
/* dst[c] += sum_n src[n][c] for src (N, C), in a fixed order. */
int zt__cuda_column_sums_add(zt__cuda_ctx *ctx, float *dst, const float *src, int N, int C);

/* loss.cu */
void zt__cuda_crossentropy_fwd_bwd(void *ctx, float *logits, const int32_t *targets, int N,
                                   int V, int V_alloc, int ignore_index, float dscale,
                                   double *loss_sum, int *n_counted);
void zt__cuda_crossentropy_fwd(void *ctx, const float *logits, const int32_t *targets, int N,
                               int V, int V_alloc, int ignore_index, double *loss_sum,
                               int *n_counted);

/* adamw.cu */
void zt__cuda_adamw(void *ctx, float *p, const float *g, float *m, float *v, size_t n, float lr,
                    float beta1, float beta2, float eps, float weight_decay, int step,
                    float grad_scale);

/* ---- mixed precision (ops.h's typed entries); the .cu kernels are templates over the storage
 * type (lowp.cuh) whose float instances are the fp32 ops above ---------------------------- */
void zt__cuda_cast(void *ctx, void *dst, zt_dtype dst_t, const void *src, zt_dtype src_t,
                   size_t n);
void zt__cuda_adamw_dt(void *ctx, float *p, const float *g, float *m, float *v, size_t n,
                       float lr, float beta1, float beta2, float eps, float weight_decay,
                       int step, float grad_scale, void *p_lp, zt_dtype lp_t);
void zt__cuda_adamw_sr(void *ctx, float *p, const float *g, uint16_t *m, uint16_t *v, size_t n,
                       float lr, float beta1, float beta2, float eps, float weight_decay,
                       int step, float grad_scale, void *p_lp, zt_dtype lp_t, uint64_t seed,
                       uint64_t index0);
void zt__cuda_embedding_fwd_dt(void *ctx, zt_dtype dt, void *out, const int32_t *tok,
                               const float *wte, const float *wpe, int B, int T, int C,
                                   const int32_t *pos);
void zt__cuda_embedding_bwd_dt(void *ctx, zt_dtype dt, float *dwte, float *dwpe,
                               const void *dout, const int32_t *tok, int B, int T, int C,
                                   const int32_t *pos);
void zt__cuda_matmul_fwd_dt(void *ctx, zt_dtype dt, void *out, const void *inp, const void *w,
                            const float *bias, int N, int C, int OC);
void zt__cuda_matmul_bwd_dt(void *ctx, zt_dtype dt, void *dinp, float *dw, float *dbias,
                            const void *dout, const void *inp, const void *w, int N, int C,
                            int OC);
void zt__cuda_layernorm_fwd_dt(void *ctx, zt_dtype dt, void *out, float *mean, float *rstd,
                               const void *inp, const float *w, const float *b, int N, int C);
void zt__cuda_layernorm_bwd_dt(void *ctx, zt_dtype dt, void *dinp, float *dw, float *db,
                               const void *dout, const void *inp, const float *w,
                               const float *mean, const float *rstd, int N, int C);
void zt__cuda_rmsnorm_fwd_dt(void *ctx, zt_dtype dt, void *out, float *rstd, const void *inp,
                             const float *w, int N, int H, int C, ptrdiff_t stride, float eps);
void zt__cuda_rmsnorm_bwd_dt(void *ctx, zt_dtype dt, void *dinp, float *dw, const void *dout,
                             const void *inp, const float *w, const float *rstd, int N, int H,
                             int C, ptrdiff_t stride);
void zt__cuda_attention_fwd_dt(void *ctx, zt_dtype dt, void *out, void *saved, const void *qkv,
                               int B, int T, int NH, int NKV, int hs, int causal,
                                   const int32_t *pos);
void zt__cuda_attention_bwd_dt(void *ctx, zt_dtype dt, void *dqkv, const void *dout,
                               const void *qkv, const void *saved, int B, int T, int NH, int NKV,
                               int hs, int causal, const int32_t *pos);
void zt__cuda_rope_fwd_dt(void *ctx, zt_dtype dt, void *x, const float *inv_freq,
                          const int32_t *pos, int N, int H, int hs, ptrdiff_t stride);
void zt__cuda_rope_bwd_dt(void *ctx, zt_dtype dt, void *dx, const float *inv_freq,
                          const int32_t *pos, int N, int H, int hs, ptrdiff_t stride);
/* zt__cuda_softmax_bwd_rows with the probabilities stored as att_t */
int zt__cuda_softmax_bwd_rows_dt(zt__cuda_ctx *ctx, zt_dtype att_t, float *dp, const void *att,
                                 size_t rows, int T, int causal, float scale,
                                 const int32_t *pos, int NH);
void zt__cuda_gelu_fwd_dt(void *ctx, zt_dtype dt, void *out, const void *inp, size_t n);
void zt__cuda_gelu_bwd_dt(void *ctx, zt_dtype dt, void *dinp, const void *inp, const void *dout,
                          size_t n);
void zt__cuda_relu_fwd_dt(void *ctx, zt_dtype dt, void *out, const void *inp, size_t n);
void zt__cuda_relu_bwd_dt(void *ctx, zt_dtype dt, void *dinp, const void *inp, const void *dout,
                          size_t n);
void zt__cuda_add_dt(void *ctx, zt_dtype dt, void *out, const void *a, const void *b, size_t n);
void zt__cuda_swiglu_fwd_dt(void *ctx, zt_dtype dt, void *out, const void *inp, int N, int F);
void zt__cuda_swiglu_bwd_dt(void *ctx, zt_dtype dt, void *dinp, const void *inp,
                            const void *dout, int N, int F);
/* out (N, OC) of type dt: every row = bias rounded to dt */
int zt__cuda_broadcast_rows_dt(zt__cuda_ctx *ctx, zt_dtype dt, void *out, const float *bias,
                               int N, int OC);
/* dst[c] += sum_n src[n][c] for src (N, C) of type dt, in a fixed order. */
int zt__cuda_column_sums_add_dt(zt__cuda_ctx *ctx, zt_dtype dt, float *dst, const void *src,
                                int N, int C);
void zt__cuda_crossentropy_fwd_bwd_dt(void *ctx, zt_dtype dt, void *logits,
                                      const int32_t *targets, int N, int V, int V_alloc,
                                      int ignore_index, float dscale, double *loss_sum,
                                      int *n_counted);
void zt__cuda_crossentropy_fwd_dt(void *ctx, zt_dtype dt, const void *logits,
                                  const int32_t *targets, int N, int V, int V_alloc,
                                  int ignore_index, double *loss_sum, int *n_counted);
void zt__cuda_crossentropy_rows_dt(void *ctx, zt_dtype dt, void *logits, const int32_t *targets,
                                   int N, int V, int V_alloc, int ignore_index, float dscale,
                                   float *row_loss);

#ifdef __cplusplus
}
#endif

#endif
