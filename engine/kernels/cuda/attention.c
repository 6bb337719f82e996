/* Multi-head attention on cuBLAS strided-batched GEMMs, reading q, k, v and writing the
 * gradients in place in the (B,T,3C) layout: within one batch element, head h's rows start
 * h*hs floats after head 0's with a row stride of 3C (C for out/dout), so the NH heads are
 * one strided batch and the B elements are a loop (no permute copies).
 *
 * saved = P (B,NH,T,T), the probabilities, exactly as the CPU reference keeps them, followed
 * by NH*T*T floats of scratch that the backward uses for dP of one batch element at a time.
 * The scratch is part of saved so that the memory planner counts it with the activations
 * (the op table has no other way to size a workspace); the backward writes only that tail,
 * never P.
 *
 * Row-major S (T,T) with S[i][j] = q_i . k_j is, read column-major, X(j,i) = k_j . q_i, i.e.
 * X = op_T(cm(K^T)) * cm(Q^T) where cm(K^T) (hs,T) is the k rows with leading dimension 3C;
 * every product below is derived the same way. */
#include <math.h>

#include "engine/kernels/cuda/cuda.h"

size_t zt__cuda_attention_saved_bytes(int B, int T, int C, int NH) {
  if (B <= 0 || T <= 0 || NH <= 0)
    return 0;
  size_t tt = (size_t)T * T;
  return ((size_t)B * NH * tt + (size_t)NH * tt) * sizeof(float);
}

typedef struct geom {
  int hs, C3;
  long long tt; /* T*T: the stride between heads in P */
  float scale;
} geom;

static geom geometry(int T, int C, int NH) {
  geom g = {.hs = C / NH, .C3 = 3 * C, .tt = (long long)T * T};
  g.scale = 1.0f / sqrtf((float)g.hs);
  return g;
}

/* C_batch = alpha op(A_batch) op(B_batch) + beta C_batch over the NH heads of one element. */
static int gemm_heads(zt__cuda_ctx *ctx, cublasOperation_t ta, cublasOperation_t tb, int m,
                      int n, int k, float alpha, const float *a, int lda, long long sa,
                      const float *b, int ldb, long long sb, float beta, float *c, int ldc,
                      long long sc, int NH) {
  return zt__cuda_check_blas(ctx,
                             cublasSgemmStridedBatched(ctx->cublas, ta, tb, m, n, k, &alpha, a,
                                                       lda, sa, b, ldb, sb, &beta, c, ldc, sc,
                                                       NH),
                             "cublasSgemmStridedBatched", __FILE__, __LINE__);
}

void zt__cuda_attention_fwd(void *vctx, float *out, void *saved, const float *qkv, int B, int T,
                            int C, int NH, int causal) {
  zt__cuda_ctx *ctx = vctx;
  float *att = saved;
  geom g;
  if (ctx->err)
    return;
  ZT__ARG(ctx, B >= 0 && T >= 0 && NH > 0 && C > 0 && C % NH == 0);
  if (B == 0 || T == 0)
    return;
  g = geometry(T, C, NH);
  for (int b = 0; b < B; b++) {
    const float *q = qkv + (size_t)b * T * g.C3, *k = q + C;
    float *p = att + (size_t)b * NH * g.tt;
    /* S = scale * q k^T: cm(S) (T,T) = op_T(cm(K^T)) cm(Q^T) */
    if (gemm_heads(ctx, CUBLAS_OP_T, CUBLAS_OP_N, T, T, g.hs, g.scale, k, g.C3, g.hs, q, g.C3,
                   g.hs, 0.0f, p, T, g.tt, NH) < 0)
      goto out;
  }
  if (zt__cuda_softmax_rows(ctx, att, (size_t)B * NH * T, T, causal) < 0)
    goto out;
  for (int b = 0; b < B; b++) {
    const float *v = qkv + (size_t)b * T * g.C3 + 2 * (size_t)C;
    const float *p = att + (size_t)b * NH * g.tt;
    /* O = P v: cm(O^T) (hs,T) = cm(V^T) (hs,T) * cm(P^T) (T,T) */
    if (gemm_heads(ctx, CUBLAS_OP_N, CUBLAS_OP_N, g.hs, T, T, 1.0f, v, g.C3, g.hs, p, T, g.tt,
                   0.0f, out + (size_t)b * T * C, C, g.hs, NH) < 0)
      goto out;
  }
out:
  return;
}

/* dV += P^T dO;  dP = dO V^T;  dS = P * (dP - rowsum(P * dP)) * scale;
 * dQ += dS K;  dK += dS^T Q  (the scale of S is folded into dS, as in the CPU reference). */
void zt__cuda_attention_bwd(void *vctx, float *dqkv, const float *dout, const float *qkv,
                            const void *saved, int B, int T, int C, int NH, int causal) {
  zt__cuda_ctx *ctx = vctx;
  const float *att = saved;
  float *ds; /* the scratch tail of saved (see the top of the file) */
  geom g;
  if (ctx->err)
    return;
  ZT__ARG(ctx, B >= 0 && T >= 0 && NH > 0 && C > 0 && C % NH == 0);
  if (B == 0 || T == 0)
    return;
  g = geometry(T, C, NH);
  ds = (float *)saved + (size_t)B * NH * g.tt;
  for (int b = 0; b < B; b++) {
    const float *q = qkv + (size_t)b * T * g.C3, *k = q + C, *v = q + 2 * (size_t)C;
    float *dq = dqkv + (size_t)b * T * g.C3, *dk = dq + C, *dv = dq + 2 * (size_t)C;
    const float *dob = dout + (size_t)b * T * C;
    const float *p = att + (size_t)b * NH * g.tt;
    /* dV += P^T dO: cm(dV^T) (hs,T) += cm(dO^T) (hs,T) * op_T(cm(P^T)) */
    if (gemm_heads(ctx, CUBLAS_OP_N, CUBLAS_OP_T, g.hs, T, T, 1.0f, dob, C, g.hs, p, T, g.tt,
                   1.0f, dv, g.C3, g.hs, NH) < 0)
      goto out;
    /* dP = dO V^T: cm(dP^T) (T,T) = op_T(cm(V^T)) * cm(dO^T) */
    if (gemm_heads(ctx, CUBLAS_OP_T, CUBLAS_OP_N, T, T, g.hs, 1.0f, v, g.C3, g.hs, dob, C,
                   g.hs, 0.0f, ds, T, g.tt, NH) < 0)
      goto out;
    if (zt__cuda_softmax_bwd_rows(ctx, ds, p, (size_t)NH * T, T, causal, g.scale) < 0)
      goto out;
    /* dQ += dS K: cm(dQ^T) (hs,T) += cm(K^T) (hs,T) * cm(dS^T) */
    if (gemm_heads(ctx, CUBLAS_OP_N, CUBLAS_OP_N, g.hs, T, T, 1.0f, k, g.C3, g.hs, ds, T, g.tt,
                   1.0f, dq, g.C3, g.hs, NH) < 0)
      goto out;
    /* dK += dS^T Q: cm(dK^T) (hs,T) += cm(Q^T) (hs,T) * op_T(cm(dS^T)) */
    if (gemm_heads(ctx, CUBLAS_OP_N, CUBLAS_OP_T, g.hs, T, T, 1.0f, q, g.C3, g.hs, ds, T, g.tt,
                   1.0f, dk, g.C3, g.hs, NH) < 0)
      goto out;
  }
out:
  return;
}
