/* Multi-head attention on cuBLAS strided-batched GEMMs, reading q, k, v and writing the
 * gradients in place in the (B,T,3C) layout: within one batch element, head h's rows start
 * h*hs floats after head 0's with a row stride of 3C (C for out/dout), and element b's start
 * T*3C after element 0's, so either the NH heads of an element or the elements of a head are
 * one strided batch (no permute copies). gemm_eh issues whichever makes fewer calls: small
 * models (the encoder: B 32, NH 8) would otherwise spend their step launching B tiny batches
 * per product.
 *
 * saved = P (B,NH,T,T), the probabilities, exactly as the CPU reference keeps them, followed
 * by scratch for dP of E batch elements at a time: E = as many as fit ATT_SCRATCH_BYTES, at
 * least one. The scratch is part of saved so that the memory planner counts it with the
 * activations (the op table has no other way to size a workspace); the backward writes only
 * that tail, never P.
 *
 * Row-major S (T,T) with S[i][j] = q_i . k_j is, read column-major, X(j,i) = k_j . q_i, i.e.
 * X = op_T(cm(K^T)) * cm(Q^T) where cm(K^T) (hs,T) is the k rows with leading dimension 3C;
 * every product below is derived the same way. The typed entries (bf16/fp16) are at the end. */
#include <math.h>

#include "engine/kernels/cuda/cuda.h"
#include "engine/kernels/cuda/flash_attention.h"

#define ATT_SCRATCH_BYTES ((size_t)16 << 20)

/* The elements whose dP the backward's scratch holds at once. */
static int chunk_elems(int B, int T, int NH) {
  size_t per = (size_t)NH * T * T * sizeof(float), e = ATT_SCRATCH_BYTES / per;
  return e < 1 ? 1 : e > (size_t)B ? B : (int)e;
}

size_t zt__cuda_attention_saved_bytes(int B, int T, int NH, int NKV, int hs) {
  if (B <= 0 || T <= 0 || NH <= 0)
    return 0;
  size_t tt = (size_t)T * T;
  return ((size_t)B * NH * tt + (size_t)chunk_elems(B, T, NH) * NH * tt) * sizeof(float);
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

/* An operand of gemm_eh: element e, head h at p + e * se + h * sh, leading dimension ld. */
typedef struct eh_mat {
  const float *p;
  int ld;
  long long se, sh;
} eh_mat;

/* C(e,h) = alpha op(A(e,h)) op(B(e,h)) + beta C(e,h) for E elements and NH heads. */
static int gemm_eh(zt__cuda_ctx *ctx, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                   int k, float alpha, eh_mat a, eh_mat b, float beta, eh_mat c, int E, int NH) {
  int by_head = E > NH, calls = by_head ? NH : E;
  for (int i = 0; i < calls; i++) {
    long long oa = by_head ? i * a.sh : i * a.se, ob = by_head ? i * b.sh : i * b.se;
    long long oc = by_head ? i * c.sh : i * c.se;
    if (zt__cuda_check_blas(
            ctx,
            cublasSgemmStridedBatched(ctx->cublas, ta, tb, m, n, k, &alpha, a.p + oa, a.ld,
                                      by_head ? a.se : a.sh, b.p + ob, b.ld,
                                      by_head ? b.se : b.sh, &beta, (float *)c.p + oc, c.ld,
                                      by_head ? c.se : c.sh, by_head ? E : NH),
            "cublasSgemmStridedBatched", __FILE__, __LINE__) < 0)
      return ctx->err;
  }
  return 0;
}

void zt__cuda_attention_fwd(void *vctx, float *out, void *saved, const float *qkv, int B, int T,
                            int NH, int NKV, int hs, int causal) {
  zt__cuda_ctx *ctx = vctx;
  float *att = saved;
  int C = NH * hs;
  geom g;
  if (ctx->err)
    return;
  ZT__ARG(ctx, B >= 0 && T >= 0 && NH > 0 && hs > 0 && NKV == NH);
  if (B == 0 || T == 0)
    return;
  g = geometry(T, C, NH);
  long long sq = (long long)T * g.C3, sp = NH * g.tt;
  eh_mat q = {qkv, g.C3, sq, g.hs}, k = {qkv + C, g.C3, sq, g.hs};
  eh_mat v = {qkv + 2 * (size_t)C, g.C3, sq, g.hs}, p = {att, T, sp, g.tt};
  eh_mat o = {out, C, (long long)T * C, g.hs};
  /* S = scale * q k^T: cm(S) (T,T) = op_T(cm(K^T)) cm(Q^T) */
  if (gemm_eh(ctx, CUBLAS_OP_T, CUBLAS_OP_N, T, T, g.hs, g.scale, k, q, 0.0f, p, B, NH) < 0 ||
      zt__cuda_softmax_rows(ctx, att, (size_t)B * NH * T, T, causal) < 0)
    goto out;
  /* O = P v: cm(O^T) (hs,T) = cm(V^T) (hs,T) * cm(P^T) (T,T) */
  gemm_eh(ctx, CUBLAS_OP_N, CUBLAS_OP_N, g.hs, T, T, 1.0f, v, p, 0.0f, o, B, NH);
out:
  return;
}

/* dV += P^T dO;  dP = dO V^T;  dS = P * (dP - rowsum(P * dP)) * scale;
 * dQ += dS K;  dK += dS^T Q  (the scale of S is folded into dS, as in the CPU reference),
 * E elements at a time (the scratch holds their dP, then dS). */
void zt__cuda_attention_bwd(void *vctx, float *dqkv, const float *dout, const float *qkv,
                            const void *saved, int B, int T, int NH, int NKV, int hs,
                            int causal) {
  zt__cuda_ctx *ctx = vctx;
  const float *att = saved;
  float *ds; /* the scratch tail of saved (see the top of the file) */
  int C = NH * hs;
  geom g;
  if (ctx->err)
    return;
  ZT__ARG(ctx, B >= 0 && T >= 0 && NH > 0 && hs > 0 && NKV == NH);
  if (B == 0 || T == 0)
    return;
  g = geometry(T, C, NH);
  ds = (float *)saved + (size_t)B * NH * g.tt;
  int E = chunk_elems(B, T, NH);
  long long sq = (long long)T * g.C3, sp = NH * g.tt, so = (long long)T * C;
  for (int b0 = 0; b0 < B; b0 += E) {
    int n = B - b0 < E ? B - b0 : E;
    const float *q0 = qkv + (size_t)b0 * sq;
    float *dq0 = dqkv + (size_t)b0 * sq;
    eh_mat q = {q0, g.C3, sq, g.hs}, k = {q0 + C, g.C3, sq, g.hs};
    eh_mat v = {q0 + 2 * (size_t)C, g.C3, sq, g.hs};
    eh_mat dq = {dq0, g.C3, sq, g.hs}, dk = {dq0 + C, g.C3, sq, g.hs};
    eh_mat dv = {dq0 + 2 * (size_t)C, g.C3, sq, g.hs};
    eh_mat dob = {dout + (size_t)b0 * so, C, so, g.hs};
    eh_mat p = {att + (size_t)b0 * sp, T, sp, g.tt}, dsm = {ds, T, sp, g.tt};
    /* dV += P^T dO: cm(dV^T) (hs,T) += cm(dO^T) (hs,T) * op_T(cm(P^T)) */
    if (gemm_eh(ctx, CUBLAS_OP_N, CUBLAS_OP_T, g.hs, T, T, 1.0f, dob, p, 1.0f, dv, n, NH) < 0)
      goto out;
    /* dP = dO V^T: cm(dP^T) (T,T) = op_T(cm(V^T)) * cm(dO^T) */
    if (gemm_eh(ctx, CUBLAS_OP_T, CUBLAS_OP_N, T, T, g.hs, 1.0f, v, dob, 0.0f, dsm, n, NH) < 0)
      goto out;
    if (zt__cuda_softmax_bwd_rows(ctx, ds, p.p, (size_t)n * NH * T, T, causal, g.scale) < 0)
      goto out;
    /* dQ += dS K: cm(dQ^T) (hs,T) += cm(K^T) (hs,T) * cm(dS^T) */
    if (gemm_eh(ctx, CUBLAS_OP_N, CUBLAS_OP_N, g.hs, T, T, 1.0f, k, dsm, 1.0f, dq, n, NH) < 0)
      goto out;
    /* dK += dS^T Q: cm(dK^T) (hs,T) += cm(Q^T) (hs,T) * op_T(cm(dS^T)) */
    if (gemm_eh(ctx, CUBLAS_OP_N, CUBLAS_OP_T, g.hs, T, T, 1.0f, q, dsm, 1.0f, dk, n, NH) < 0)
      goto out;
  }
out:
  return;
}

/* ---- typed entries (bf16/fp16 q, k, v, out and their gradients) ------------------------------
 * Where zt__cuda_flash_supported says so (head sizes 32, 64, 128: GPT-2's 64 among them) the
 * entries run the fused kernels of flash_attention.cu, which keep no (T,T) matrix; the choice
 * depends only on (dt, B, C, NH), so saved_bytes, forward and backward always agree on it.
 * fp32 stays on the cuBLAS path above: without bf16/fp16 tensor-core fragments a SIMT flash
 * kernel would lose to cuBLAS's SGEMM, and fp32 runs are the accuracy baseline, not the fast
 * path. The other head sizes run the cuBLAS path below.
 *
 * The same products on cublasGemmStridedBatchedEx with fp32 accumulation. Per batch element the
 * scores S go to an fp32 scratch, the softmax runs there in fp32, and P is stored rounded to dt
 * (the saved probabilities, half the bytes of fp32) for P v and the backward. The backward's dP
 * and dS are fp32 in the same scratch; dS is rounded to dt (a second scratch) for the two
 * products that read it. saved = P (B,NH,T,T) in dt | S/dS (NH,T,T) fp32 | dS (NH,T,T) in dt,
 * each part 256-byte aligned. */
typedef struct lp_saved {
  size_t s_off, ds_off, bytes;
} lp_saved;

static size_t align256(size_t x) { return (x + 255) / 256 * 256; }

static lp_saved lp_layout(int B, int T, int NH, size_t es) {
  size_t tt = (size_t)T * T;
  lp_saved l;
  l.s_off = align256((size_t)B * NH * tt * es);
  l.ds_off = l.s_off + align256((size_t)NH * tt * sizeof(float));
  l.bytes = l.ds_off + (size_t)NH * tt * es;
  return l;
}

size_t zt__cuda_attention_saved_bytes_dt(zt_dtype dt, int B, int T, int NH, int NKV, int hs) {
  int C = NH * hs;
  if (dt == ZT_F32)
    return zt__cuda_attention_saved_bytes(B, T, NH, NKV, hs);
  if (B <= 0 || T <= 0 || NH <= 0)
    return 0;
  if (zt__cuda_flash_supported(dt, B, C, NH))
    return zt__cuda_flash_saved_bytes(dt, B, T, C, NH);
  return lp_layout(B, T, NH, zt_dtype_size(dt)).bytes;
}

static cudaDataType cuda_type(zt_dtype dt) {
  return dt == ZT_BF16 ? CUDA_R_16BF : dt == ZT_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* gemm_heads with each operand's type given. */
static int gemm_heads_ex(zt__cuda_ctx *ctx, cublasOperation_t ta, cublasOperation_t tb, int m,
                         int n, int k, float alpha, const void *a, zt_dtype at, int lda,
                         long long sa, const void *b, zt_dtype bt, int ldb, long long sb,
                         float beta, void *c, zt_dtype ct, int ldc, long long sc, int NH) {
  return zt__cuda_check_blas(
      ctx,
      cublasGemmStridedBatchedEx(ctx->cublas, ta, tb, m, n, k, &alpha, a, cuda_type(at), lda, sa,
                                 b, cuda_type(bt), ldb, sb, &beta, c, cuda_type(ct), ldc, sc, NH,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmStridedBatchedEx", __FILE__, __LINE__);
}

void zt__cuda_attention_fwd_dt(void *vctx, zt_dtype dt, void *out, void *saved, const void *qkv,
                               int B, int T, int NH, int NKV, int hs, int causal) {
  zt__cuda_ctx *ctx = vctx;
  size_t es = zt_dtype_size(dt);
  int C = NH * hs;
  lp_saved lay;
  float *s32;
  geom g;
  if (dt == ZT_F32) {
    zt__cuda_attention_fwd(vctx, out, saved, qkv, B, T, NH, NKV, hs, causal);
    return;
  }
  if (ctx->err)
    return;
  ZT__ARG(ctx, B >= 0 && T >= 0 && NH > 0 && hs > 0 && NKV == NH);
  if (B == 0 || T == 0)
    return;
  if (zt__cuda_flash_supported(dt, B, C, NH)) {
    zt__cuda_flash_fwd(ctx, dt, out, saved, qkv, B, T, C, NH, causal);
    return;
  }
  g = geometry(T, C, NH);
  lay = lp_layout(B, T, NH, es);
  s32 = (float *)((char *)saved + lay.s_off);
  for (int b = 0; b < B; b++) {
    const char *q = (const char *)qkv + (size_t)b * T * g.C3 * es, *k = q + (size_t)C * es;
    const char *v = q + 2 * (size_t)C * es;
    char *p = (char *)saved + (size_t)b * NH * g.tt * es;
    /* S = scale * q k^T into the fp32 scratch, its softmax there, then P rounded to dt */
    if (gemm_heads_ex(ctx, CUBLAS_OP_T, CUBLAS_OP_N, T, T, g.hs, g.scale, k, dt, g.C3, g.hs, q,
                      dt, g.C3, g.hs, 0.0f, s32, ZT_F32, T, g.tt, NH) < 0)
      goto out;
    if (zt__cuda_softmax_rows(ctx, s32, (size_t)NH * T, T, causal) < 0)
      goto out;
    zt__cuda_cast(ctx, p, dt, s32, ZT_F32, (size_t)NH * g.tt);
    /* O = P v */
    if (gemm_heads_ex(ctx, CUBLAS_OP_N, CUBLAS_OP_N, g.hs, T, T, 1.0f, v, dt, g.C3, g.hs, p, dt,
                      T, g.tt, 0.0f, (char *)out + (size_t)b * T * C * es, dt, C, g.hs, NH) < 0)
      goto out;
  }
out:
  return;
}

void zt__cuda_attention_bwd_dt(void *vctx, zt_dtype dt, void *dqkv, const void *dout,
                               const void *qkv, const void *saved, int B, int T, int NH, int NKV,
                               int hs, int causal) {
  zt__cuda_ctx *ctx = vctx;
  size_t es = zt_dtype_size(dt);
  int C = NH * hs;
  lp_saved lay;
  float *s32;
  char *ds;
  geom g;
  if (dt == ZT_F32) {
    zt__cuda_attention_bwd(vctx, dqkv, dout, qkv, saved, B, T, NH, NKV, hs, causal);
    return;
  }
  if (ctx->err)
    return;
  ZT__ARG(ctx, B >= 0 && T >= 0 && NH > 0 && hs > 0 && NKV == NH);
  if (B == 0 || T == 0)
    return;
  if (zt__cuda_flash_supported(dt, B, C, NH)) {
    zt__cuda_flash_bwd(ctx, dt, dqkv, dout, qkv, saved, B, T, C, NH, causal);
    return;
  }
  g = geometry(T, C, NH);
  lay = lp_layout(B, T, NH, es);
  /* the scratch parts of saved (see above); P itself is only read */
  s32 = (float *)((char *)saved + lay.s_off);
  ds = (char *)saved + lay.ds_off;
  for (int b = 0; b < B; b++) {
    const char *q = (const char *)qkv + (size_t)b * T * g.C3 * es, *k = q + (size_t)C * es;
    const char *v = q + 2 * (size_t)C * es;
    char *dq = (char *)dqkv + (size_t)b * T * g.C3 * es, *dk = dq + (size_t)C * es;
    char *dv = dq + 2 * (size_t)C * es;
    const char *dob = (const char *)dout + (size_t)b * T * C * es;
    const char *p = (const char *)saved + (size_t)b * NH * g.tt * es;
    /* dV += P^T dO */
    if (gemm_heads_ex(ctx, CUBLAS_OP_N, CUBLAS_OP_T, g.hs, T, T, 1.0f, dob, dt, C, g.hs, p, dt, T,
                      g.tt, 1.0f, dv, dt, g.C3, g.hs, NH) < 0)
      goto out;
    /* dP = dO V^T (fp32), dS = P * (dP - rowsum(P * dP)) * scale, then dS rounded to dt */
    if (gemm_heads_ex(ctx, CUBLAS_OP_T, CUBLAS_OP_N, T, T, g.hs, 1.0f, v, dt, g.C3, g.hs, dob, dt,
                      C, g.hs, 0.0f, s32, ZT_F32, T, g.tt, NH) < 0)
      goto out;
    if (zt__cuda_softmax_bwd_rows_dt(ctx, dt, s32, p, (size_t)NH * T, T, causal, g.scale) < 0)
      goto out;
    zt__cuda_cast(ctx, ds, dt, s32, ZT_F32, (size_t)NH * g.tt);
    /* dQ += dS K;  dK += dS^T Q */
    if (gemm_heads_ex(ctx, CUBLAS_OP_N, CUBLAS_OP_N, g.hs, T, T, 1.0f, k, dt, g.C3, g.hs, ds, dt,
                      T, g.tt, 1.0f, dq, dt, g.C3, g.hs, NH) < 0)
      goto out;
    if (gemm_heads_ex(ctx, CUBLAS_OP_N, CUBLAS_OP_T, g.hs, T, T, 1.0f, q, dt, g.C3, g.hs, ds, dt,
                      T, g.tt, 1.0f, dk, dt, g.C3, g.hs, NH) < 0)
      goto out;
  }
out:
  return;
}
