/* Internals of the CPU reference backend: the context, the OpenMP helpers and the op functions
 * that backend.c puts into the zt_ops table.
 *
 * Determinism rule for every file here: results are bitwise identical run to run and for any
 * thread count. Threads only ever split independent output elements (rows, channels); every
 * reduction runs inside one thread in a fixed order that does not depend on the thread count. */
#ifndef ZT_KERNELS_CPU_CPU_H
#define ZT_KERNELS_CPU_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "engine/kernels/ops.h"

typedef struct zt__cpu_ctx {
  int n_threads; /* >= 1, used as num_threads() of every parallel region */
  int err;       /* -ENOMEM once a typed op could not allocate its temporaries (lowp.c) */
} zt__cpu_ctx;

static inline int zt__cpu_threads(void *ctx) { return ((const zt__cpu_ctx *)ctx)->n_threads; }

/* `#pragma omp parallel for` over independent outputs with nt threads, run by the calling
 * thread alone unless cond holds (enough work to pay for waking the team). Without OpenMP it
 * vanishes, arguments included. */
#ifdef _OPENMP
#define ZT__PRAGMA(...) _Pragma(#__VA_ARGS__)
#define ZT__PARALLEL_FOR(nt, cond)                                                             \
  ZT__PRAGMA(omp parallel for schedule(static) num_threads(nt) if(cond))
#else
#define ZT__PARALLEL_FOR(nt, cond)
#endif

/* Below this many elements a pointwise op runs on the calling thread: waking the team costs
 * more than the work. */
#define ZT__CPU_PAR_MIN 32768

/* embedding.c */
void zt__cpu_embedding_fwd(void *ctx, float *out, const int32_t *tok, const float *wte,
                           const float *wpe, int B, int T, int C, const int32_t *pos);
void zt__cpu_embedding_bwd(void *ctx, float *dwte, float *dwpe, const float *dout,
                           const int32_t *tok, int B, int T, int C, const int32_t *pos);

/* linear.c */
void zt__cpu_matmul_fwd(void *ctx, float *out, const float *inp, const float *w,
                        const float *bias, int N, int C, int OC);
void zt__cpu_matmul_bwd(void *ctx, float *dinp, float *dw, float *dbias, const float *dout,
                        const float *inp, const float *w, int N, int C, int OC);

/* layernorm.c */
void zt__cpu_layernorm_fwd(void *ctx, float *out, float *mean, float *rstd, const float *inp,
                           const float *w, const float *b, int N, int C);
void zt__cpu_layernorm_bwd(void *ctx, float *dinp, float *dw, float *db, const float *dout,
                           const float *inp, const float *w, const float *mean,
                           const float *rstd, int N, int C);

/* rmsnorm.c */
void zt__cpu_rmsnorm_fwd(void *ctx, float *out, float *rstd, const float *inp, const float *w,
                         int N, int H, int C, ptrdiff_t stride, float eps);
void zt__cpu_rmsnorm_bwd(void *ctx, float *dinp, float *dw, const float *dout, const float *inp,
                         const float *w, const float *rstd, int N, int H, int C,
                         ptrdiff_t stride);

/* attention.c */
size_t zt__cpu_attention_saved_bytes(int B, int T, int NH, int NKV, int hs);
void zt__cpu_attention_fwd(void *ctx, float *out, void *saved, const float *qkv, int B, int T,
                           int NH, int NKV, int hs, int causal, const int32_t *pos);
void zt__cpu_attention_bwd(void *ctx, float *dqkv, const float *dout, const float *qkv,
                           const void *saved, int B, int T, int NH, int NKV, int hs, int causal,
                               const int32_t *pos);

/* rope.c */
void zt__cpu_rope_fwd(void *ctx, float *x, const float *inv_freq, const int32_t *pos, int N,
                      int H, int hs, ptrdiff_t stride);
void zt__cpu_rope_bwd(void *ctx, float *dx, const float *inv_freq, const int32_t *pos, int N,
                      int H, int hs, ptrdiff_t stride);

/* swiglu.c */
void zt__cpu_swiglu_fwd(void *ctx, float *out, const float *inp, int N, int F);
void zt__cpu_swiglu_bwd(void *ctx, float *dinp, const float *inp, const float *dout, int N,
                        int F);

/* pointwise.c */
void zt__cpu_gelu_fwd(void *ctx, float *out, const float *inp, size_t n);
void zt__cpu_gelu_bwd(void *ctx, float *dinp, const float *inp, const float *dout, size_t n);
void zt__cpu_relu_fwd(void *ctx, float *out, const float *inp, size_t n);
void zt__cpu_relu_bwd(void *ctx, float *dinp, const float *inp, const float *dout, size_t n);
void zt__cpu_add(void *ctx, float *out, const float *a, const float *b, size_t n);
void zt__cpu_scale(void *ctx, float *x, float s, size_t n);

/* loss.c */
void zt__cpu_crossentropy_fwd_bwd(void *ctx, float *logits, const int32_t *targets, int N, int V,
                                  int V_alloc, int ignore_index, float dscale,
                                  double *loss_sum, int *n_counted);
void zt__cpu_crossentropy_fwd(void *ctx, const float *logits, const int32_t *targets, int N,
                              int V, int V_alloc, int ignore_index, double *loss_sum,
                              int *n_counted);
/* crossentropy_fwd_bwd without the host results: row_loss[n] += row n's loss (fp32), the
 * fp32 case of ops.h's crossentropy_rows_dt */
void zt__cpu_crossentropy_rows(void *ctx, float *logits, const int32_t *targets, int N, int V,
                               int V_alloc, int ignore_index, float dscale, float *row_loss);

/* reduce.c */
double zt__cpu_sum_squares(void *ctx, const float *x, size_t n, int *nonfinite);
double zt__cpu_sum(void *ctx, const float *x, size_t n);

/* adamw.c */
void zt__cpu_adamw(void *ctx, float *p, const float *g, float *m, float *v, size_t n, float lr,
                   float beta1, float beta2, float eps, float weight_decay, int step,
                   float grad_scale);
void zt__cpu_adamw_sr(void *ctx, float *p, const float *g, uint16_t *m, uint16_t *v, size_t n,
                      float lr, float beta1, float beta2, float eps, float weight_decay, int step,
                      float grad_scale, void *p_lp, zt_dtype lp_t, uint64_t seed,
                      uint64_t index0);

/* lowp.c: mixed precision (see ops.h) */
void zt__cpu_cast(void *ctx, void *dst, zt_dtype dst_t, const void *src, zt_dtype src_t,
                  size_t n);
void zt__cpu_adamw_dt(void *ctx, float *p, const float *g, float *m, float *v, size_t n,
                      float lr, float beta1, float beta2, float eps, float weight_decay,
                      int step, float grad_scale, void *p_lp, zt_dtype lp_t);
int zt__cpu_set_allow_tf32(void *ctx, int allow);
void zt__cpu_embedding_fwd_dt(void *ctx, zt_dtype dt, void *out, const int32_t *tok,
                              const float *wte, const float *wpe, int B, int T, int C,
                                  const int32_t *pos);
void zt__cpu_embedding_bwd_dt(void *ctx, zt_dtype dt, float *dwte, float *dwpe, const void *dout,
                              const int32_t *tok, int B, int T, int C, const int32_t *pos);
void zt__cpu_matmul_fwd_dt(void *ctx, zt_dtype dt, void *out, const void *inp, const void *w,
                           const float *bias, int N, int C, int OC);
void zt__cpu_matmul_bwd_dt(void *ctx, zt_dtype dt, void *dinp, float *dw, float *dbias,
                           const void *dout, const void *inp, const void *w, int N, int C,
                           int OC);
void zt__cpu_layernorm_fwd_dt(void *ctx, zt_dtype dt, void *out, float *mean, float *rstd,
                              const void *inp, const float *w, const float *b, int N, int C);
void zt__cpu_layernorm_bwd_dt(void *ctx, zt_dtype dt, void *dinp, float *dw, float *db,
                              const void *dout, const void *inp, const float *w,
                              const float *mean, const float *rstd, int N, int C);
void zt__cpu_rmsnorm_fwd_dt(void *ctx, zt_dtype dt, void *out, float *rstd, const void *inp,
                            const float *w, int N, int H, int C, ptrdiff_t stride, float eps);
void zt__cpu_rmsnorm_bwd_dt(void *ctx, zt_dtype dt, void *dinp, float *dw, const void *dout,
                            const void *inp, const float *w, const float *rstd, int N, int H,
                            int C, ptrdiff_t stride);
size_t zt__cpu_attention_saved_bytes_dt(zt_dtype dt, int B, int T, int NH, int NKV, int hs);
void zt__cpu_attention_fwd_dt(void *ctx, zt_dtype dt, void *out, void *saved, const void *qkv,
                              int B, int T, int NH, int NKV, int hs, int causal,
                                  const int32_t *pos);
void zt__cpu_attention_bwd_dt(void *ctx, zt_dtype dt, void *dqkv, const void *dout,
                              const void *qkv, const void *saved, int B, int T, int NH, int NKV,
                              int hs, int causal, const int32_t *pos);
void zt__cpu_rope_fwd_dt(void *ctx, zt_dtype dt, void *x, const float *inv_freq,
                         const int32_t *pos, int N, int H, int hs, ptrdiff_t stride);
void zt__cpu_rope_bwd_dt(void *ctx, zt_dtype dt, void *dx, const float *inv_freq,
                         const int32_t *pos, int N, int H, int hs, ptrdiff_t stride);
void zt__cpu_gelu_fwd_dt(void *ctx, zt_dtype dt, void *out, const void *inp, size_t n);
void zt__cpu_gelu_bwd_dt(void *ctx, zt_dtype dt, void *dinp, const void *inp, const void *dout,
                         size_t n);
void zt__cpu_relu_fwd_dt(void *ctx, zt_dtype dt, void *out, const void *inp, size_t n);
void zt__cpu_relu_bwd_dt(void *ctx, zt_dtype dt, void *dinp, const void *inp, const void *dout,
                         size_t n);
void zt__cpu_add_dt(void *ctx, zt_dtype dt, void *out, const void *a, const void *b, size_t n);
void zt__cpu_swiglu_fwd_dt(void *ctx, zt_dtype dt, void *out, const void *inp, int N, int F);
void zt__cpu_swiglu_bwd_dt(void *ctx, zt_dtype dt, void *dinp, const void *inp,
                           const void *dout, int N, int F);
void zt__cpu_crossentropy_fwd_bwd_dt(void *ctx, zt_dtype dt, void *logits,
                                     const int32_t *targets, int N, int V, int V_alloc,
                                     int ignore_index, float dscale, double *loss_sum,
                                     int *n_counted);
void zt__cpu_crossentropy_fwd_dt(void *ctx, zt_dtype dt, const void *logits,
                                 const int32_t *targets, int N, int V, int V_alloc,
                                 int ignore_index, double *loss_sum, int *n_counted);
void zt__cpu_crossentropy_rows_dt(void *ctx, zt_dtype dt, void *logits, const int32_t *targets,
                                  int N, int V, int V_alloc, int ignore_index, float dscale,
                                  float *row_loss);

#endif
