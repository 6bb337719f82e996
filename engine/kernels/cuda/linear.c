/* Linear layers on cuBLAS. Our tensors are row-major and cuBLAS is column-major: a row-major
 * (R, K) matrix is the column-major (K, R) matrix with leading dimension K, so each product
 * below is written for the transposes:
 *   forward  cm(out)  (OC,N) = cm(W)^T (OC,C) * cm(inp) (C,N)     [+ bias, preset per row]
 *   dinp     cm(dinp) (C,N)  += cm(W) (C,OC) * cm(dout) (OC,N)
 *   dW       cm(dW)   (C,OC) += cm(inp) (C,N) * cm(dout)^T (N,OC)
 * where cm(X) is X's memory read column-major. The typed entries (bf16/fp16) follow the fp32
 * ones at the end of the file. */
#include "engine/kernels/cuda/cuda.h"

static int max1(int x) { return x > 1 ? x : 1; }

void zt__cuda_matmul_fwd(void *vctx, float *out, const float *inp, const float *w,
                         const float *bias, int N, int C, int OC) {
  zt__cuda_ctx *ctx = vctx;
  const float one = 1.0f, zero = 0.0f;
  if (ctx->err)
    return;
  ZT__ARG(ctx, N >= 0 && C >= 0 && OC >= 0);
  if (N == 0 || OC == 0)
    return;
  /* The bias is the start value of every output row, as in the CPU reference. */
  if (bias && zt__cuda_broadcast_rows(ctx, out, bias, N, OC) < 0)
    goto out;
  ZT__CUBLAS(ctx, cublasSgemm(ctx->cublas, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &one, w, max1(C),
                              inp, max1(C), bias ? &one : &zero, out, OC));
out:
  return;
}

void zt__cuda_matmul_bwd(void *vctx, float *dinp, float *dw, float *dbias, const float *dout,
                         const float *inp, const float *w, int N, int C, int OC) {
  zt__cuda_ctx *ctx = vctx;
  const float one = 1.0f;
  if (ctx->err)
    return;
  ZT__ARG(ctx, N >= 0 && C >= 0 && OC >= 0);
  if (N == 0 || C == 0 || OC == 0)
    return;
  if (dinp)
    ZT__CUBLAS(ctx, cublasSgemm(ctx->cublas, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, w, C,
                                dout, OC, &one, dinp, C));
  ZT__CUBLAS(ctx, cublasSgemm(ctx->cublas, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, inp, C,
                              dout, OC, &one, dw, C));
  if (dbias && zt__cuda_column_sums_add(ctx, dbias, dout, N, OC) < 0)
    goto out;
out:
  return;
}

/* ---- typed entries: cublasGemmEx with bf16/fp16 A and B, fp32 accumulation -------------------
 * The same products as above. Outputs of type dt (out, dinp) are rounded once from the fp32
 * accumulator, including the beta = 1 terms (cuBLAS computes alpha AB + beta C in fp32); dw is
 * accumulated straight into the fp32 gradient (GemmEx takes bf16/fp16 A and B with an fp32 C).
 * The bias is preset in out rounded to dt, as the fp32 op presets it. */
static cudaDataType cuda_type(zt_dtype dt) {
  return dt == ZT_BF16 ? CUDA_R_16BF : dt == ZT_F16 ? CUDA_R_16F : CUDA_R_32F;
}

void zt__cuda_matmul_fwd_dt(void *vctx, zt_dtype dt, void *out, const void *inp, const void *w,
                            const float *bias, int N, int C, int OC) {
  zt__cuda_ctx *ctx = vctx;
  const float one = 1.0f, zero = 0.0f;
  if (dt == ZT_F32) {
    zt__cuda_matmul_fwd(vctx, out, inp, w, bias, N, C, OC);
    return;
  }
  if (ctx->err)
    return;
  ZT__ARG(ctx, N >= 0 && C >= 0 && OC >= 0);
  if (N == 0 || OC == 0)
    return;
  if (bias && zt__cuda_broadcast_rows_dt(ctx, dt, out, bias, N, OC) < 0)
    goto out;
  ZT__CUBLAS(ctx, cublasGemmEx(ctx->cublas, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &one, w,
                               cuda_type(dt), max1(C), inp, cuda_type(dt), max1(C),
                               bias ? &one : &zero, out, cuda_type(dt), OC, CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT));
out:
  return;
}

void zt__cuda_matmul_bwd_dt(void *vctx, zt_dtype dt, void *dinp, float *dw, float *dbias,
                            const void *dout, const void *inp, const void *w, int N, int C,
                            int OC) {
  zt__cuda_ctx *ctx = vctx;
  const float one = 1.0f;
  if (dt == ZT_F32) {
    zt__cuda_matmul_bwd(vctx, dinp, dw, dbias, dout, inp, w, N, C, OC);
    return;
  }
  if (ctx->err)
    return;
  ZT__ARG(ctx, N >= 0 && C >= 0 && OC >= 0);
  if (N == 0 || C == 0 || OC == 0)
    return;
  if (dinp)
    ZT__CUBLAS(ctx, cublasGemmEx(ctx->cublas, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, w,
                                 cuda_type(dt), C, dout, cuda_type(dt), OC, &one, dinp,
                                 cuda_type(dt), C, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  ZT__CUBLAS(ctx, cublasGemmEx(ctx->cublas, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, inp,
                               cuda_type(dt), C, dout, cuda_type(dt), OC, &one, dw, CUDA_R_32F, C,
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  if (dbias && zt__cuda_column_sums_add_dt(ctx, dt, dbias, dout, N, OC) < 0)
    goto out;
out:
  return;
}
