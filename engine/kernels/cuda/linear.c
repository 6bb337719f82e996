/* Linear layers on cuBLAS. Our tensors are row-major and cuBLAS is column-major: a row-major
 * (R, K) matrix is the column-major (K, R) matrix with leading dimension K, so each product
 * below is written for the transposes:
 *   forward  cm(out)  (OC,N) = cm(W)^T (OC,C) * cm(inp) (C,N)     [+ bias, preset per row]
 *   dinp     cm(dinp) (C,N)  += cm(W) (C,OC) * cm(dout) (OC,N)
 *   dW       cm(dW)   (C,OC) += cm(inp) (C,N) * cm(dout)^T (N,OC)
 * where cm(X) is X's memory read column-major. */
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
