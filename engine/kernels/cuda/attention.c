/* Grouped-query attention on cuBLAS strided-batched GEMMs, reading q, k, v and writing the
 * gradients in place in the (B,T,(NH+2*NKV)*hs) layout: within one batch element, head h's rows
 * start h*hs floats after head 0's with a row stride of R = (NH+2*NKV)*hs (C = NH*hs for
 * out/dout), and element b's start T*R after element 0's. Query heads j, j + group, j + 2 group,
 * ... (group = NH/NKV) are the j-th heads of the NKV groups: their q, P and out rows are evenly
 * spaced (a stride of group heads), and they read the NKV kv heads in order (a stride of one
 * head). So each product runs as `group` rounds j = 0, 1, ..., each one strided batch over the
 * NKV groups or over the elements (gemm_eh issues whichever makes fewer calls: small models,
 * the encoder with B 32 and NH 8, would otherwise spend their step launching B tiny batches per
 * product). K and V are read in place, never replicated; dK and dV of a group are summed over
 * its query heads by the rounds in order (beta 1 on one stream), a fixed order with no
 * atomics. With NKV == NH there is one round: plain multi-head attention, as before.
 *
 * Documents (ops.h): the products run over the whole (T,T) tiles and the softmax kernels keep
 * each query's row inside its document, zeros elsewhere, so P and dS carry the mask into every
 * product that reads them.
 *
 * saved = P (B,NH,T,T), the probabilities, exactly as the CPU reference keeps them, followed
 * by scratch for dP of E batch elements at a time: E = as many as fit
 * ZT__CUDA_ATT_SCRATCH_BYTES, at least one (sizes.c: the sizes and layouts in plain C). The
 * scratch is part of saved so that the memory planner counts it with the activations (the op
 * table has no other way to size a workspace); the backward writes only that tail, never P.
 *
 * Row-major S (T,T) with S[i][j] = q_i . k_j is, read column-major, X(j,i) = k_j . q_i, i.e.
 * X = op_T(cm(K^T)) * cm(Q^T) where cm(K^T) (hs,T) is the k rows with leading dimension R;
 * every product below is derived the same way. The typed entries (bf16/fp16) are at the end. */
#include <math.h>

#include "engine/kernels/cuda/cuda.h"
#include "engine/kernels/cuda/flash_attention.h"

typedef struct geom {
  int hs, C, R; /* head size, out row NH*hs, qkv row (NH+2*NKV)*hs */
  int group;     /* query heads per kv head */
  long long tt;  /* T*T: the stride between heads in P */
  float scale;
} geom;

static geom geometry(int T, int NH, int NKV, int hs) {
  geom g = {.hs = hs, .C = NH * hs, .R = (NH + 2 * NKV) * hs, .group = NH / NKV,
            .tt = (long long)T * T};
  g.scale = 1.0f / sqrtf((float)hs);
  return g;
}

/* The arguments every entry checks. */
#define ATT_ARGS_OK(B, T, NH, NKV, hs)                                                             \
  ((B) >= 0 && (T) >= 0 && (NH) > 0 && (NKV) > 0 && (NH) % (NKV) == 0 && (hs) > 0)

/* An operand of gemm_eh: element e, group g at p + e * se + g * sg, leading dimension ld. */
typedef struct eh_mat {
  const float *p;
  int ld;
  long long se, sg;
} eh_mat;

/* The query-side operand of round j: the j-th query head of every group. x0 is the operand of
 * query head 0 with sh the stride between query heads (hs for rows of q, out, dout; T*T for
 * P, dP). */
static eh_mat round_j(const float *x0, int ld, long long se, long long sh, int j, int group) {
  eh_mat m = {x0 + j * sh, ld, se, sh * group};
  return m;
}

/* C(e,g) = alpha op(A(e,g)) op(B(e,g)) + beta C(e,g) for E elements and G groups. */
static int gemm_eh(zt__cuda_ctx *ctx, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                   int k, float alpha, eh_mat a, eh_mat b, float beta, eh_mat c, int E, int G) {
  int by_group = E > G, calls = by_group ? G : E;
  for (int i = 0; i < calls; i++) {
    long long oa = by_group ? i * a.sg : i * a.se, ob = by_group ? i * b.sg : i * b.se;
    long long oc = by_group ? i * c.sg : i * c.se;
    if (zt__cuda_check_blas(
            ctx,
            cublasSgemmStridedBatched(ctx->cublas, ta, tb, m, n, k, &alpha, a.p + oa, a.ld,
                                      by_group ? a.se : a.sg, b.p + ob, b.ld,
                                      by_group ? b.se : b.sg, &beta, (float *)c.p + oc, c.ld,
                                      by_group ? c.se : c.sg, by_group ? E : G),
            "cublasSgemmStridedBatched", __FILE__, __LINE__) < 0)
      return ctx->err;
  }
  return 0;
}

void zt__cuda_attention_fwd(void *vctx, float *out, void *saved, const float *qkv, int B, int T,
                            int NH, int NKV, int hs, int causal, const int32_t *pos) {
  zt__cuda_ctx *ctx = vctx;
  float *att = saved;
  geom g;
  if (ctx->err)
    return;
  ZT__ARG(ctx, ATT_ARGS_OK(B, T, NH, NKV, hs));
  if (B == 0 || T == 0)
    return;
  g = geometry(T, NH, NKV, hs);
  long long sq = (long long)T * g.R, sp = NH * g.tt, so = (long long)T * g.C;
  eh_mat k = {qkv + g.C, g.R, sq, g.hs}, v = {qkv + g.C + (size_t)NKV * hs, g.R, sq, g.hs};
  /* S = scale * q k^T: cm(S) (T,T) = op_T(cm(K^T)) cm(Q^T) */
  for (int j = 0; j < g.group; j++)
    if (gemm_eh(ctx, CUBLAS_OP_T, CUBLAS_OP_N, T, T, g.hs, g.scale, k,
                round_j(qkv, g.R, sq, g.hs, j, g.group), 0.0f,
                round_j(att, T, sp, g.tt, j, g.group), B, NKV) < 0)
      goto out;
  if (zt__cuda_softmax_rows(ctx, att, (size_t)B * NH * T, T, causal, pos, NH) < 0)
    goto out;
  /* O = P v: cm(O^T) (hs,T) = cm(V^T) (hs,T) * cm(P^T) (T,T) */
  for (int j = 0; j < g.group; j++)
    if (gemm_eh(ctx, CUBLAS_OP_N, CUBLAS_OP_N, g.hs, T, T, 1.0f, v,
                round_j(att, T, sp, g.tt, j, g.group), 0.0f,
                round_j(out, g.C, so, g.hs, j, g.group), B, NKV) < 0)
      goto out;
out:
  return;
}

/* dV += P^T dO;  dP = dO V^T;  dS = P * (dP - rowsum(P * dP)) * scale;
 * dQ += dS K;  dK += dS^T Q  (the scale of S is folded into dS, as in the CPU reference),
 * E elements at a time (the scratch holds their dP, then dS). dV and dK take the rounds j in
 * order: the fixed sum over a group's query heads. */
void zt__cuda_attention_bwd(void *vctx, float *dqkv, const float *dout, const float *qkv,
                            const void *saved, int B, int T, int NH, int NKV, int hs,
                            int causal, const int32_t *pos) {
  zt__cuda_ctx *ctx = vctx;
  const float *att = saved;
  float *ds; /* the scratch tail of saved (see the top of the file) */
  geom g;
  if (ctx->err)
    return;
  ZT__ARG(ctx, ATT_ARGS_OK(B, T, NH, NKV, hs));
  if (B == 0 || T == 0)
    return;
  g = geometry(T, NH, NKV, hs);
  ds = (float *)saved + (size_t)B * NH * g.tt;
  int E = zt__cuda_att_chunk_elems(B, T, NH);
  long long sq = (long long)T * g.R, sp = NH * g.tt, so = (long long)T * g.C;
  size_t v0 = g.C + (size_t)NKV * hs;
  for (int b0 = 0; b0 < B; b0 += E) {
    int n = B - b0 < E ? B - b0 : E;
    const float *q0 = qkv + (size_t)b0 * sq, *p0 = att + (size_t)b0 * sp;
    const float *do0 = dout + (size_t)b0 * so;
    float *dq0 = dqkv + (size_t)b0 * sq;
    eh_mat k = {q0 + g.C, g.R, sq, g.hs}, v = {q0 + v0, g.R, sq, g.hs};
    eh_mat dk = {dq0 + g.C, g.R, sq, g.hs}, dv = {dq0 + v0, g.R, sq, g.hs};
#define QJ(x0, ld, se, sh) round_j((x0), (ld), (se), (sh), j, g.group)
    /* dV += P^T dO: cm(dV^T) (hs,T) += cm(dO^T) (hs,T) * op_T(cm(P^T)) */
    for (int j = 0; j < g.group; j++)
      if (gemm_eh(ctx, CUBLAS_OP_N, CUBLAS_OP_T, g.hs, T, T, 1.0f, QJ(do0, g.C, so, g.hs),
                  QJ(p0, T, sp, g.tt), 1.0f, dv, n, NKV) < 0)
        goto out;
    /* dP = dO V^T: cm(dP^T) (T,T) = op_T(cm(V^T)) * cm(dO^T) */
    for (int j = 0; j < g.group; j++)
      if (gemm_eh(ctx, CUBLAS_OP_T, CUBLAS_OP_N, T, T, g.hs, 1.0f, v, QJ(do0, g.C, so, g.hs),
                  0.0f, QJ(ds, T, sp, g.tt), n, NKV) < 0)
        goto out;
    if (zt__cuda_softmax_bwd_rows(ctx, ds, p0, (size_t)n * NH * T, T, causal, g.scale,
                                  pos ? pos + (size_t)b0 * T : NULL, NH) < 0)
      goto out;
    /* dQ += dS K: cm(dQ^T) (hs,T) += cm(K^T) (hs,T) * cm(dS^T) */
    for (int j = 0; j < g.group; j++)
      if (gemm_eh(ctx, CUBLAS_OP_N, CUBLAS_OP_N, g.hs, T, T, 1.0f, k, QJ(ds, T, sp, g.tt), 1.0f,
                  QJ(dq0, g.R, sq, g.hs), n, NKV) < 0)
        goto out;
    /* dK += dS^T Q: cm(dK^T) (hs,T) += cm(Q^T) (hs,T) * op_T(cm(dS^T)) */
    for (int j = 0; j < g.group; j++)
      if (gemm_eh(ctx, CUBLAS_OP_N, CUBLAS_OP_T, g.hs, T, T, 1.0f, QJ(q0, g.R, sq, g.hs),
                  QJ(ds, T, sp, g.tt), 1.0f, dk, n, NKV) < 0)
        goto out;
#undef QJ
  }
out:
  return;
}

/* ---- typed entries (bf16/fp16 q, k, v, out and their gradients) ------------------------------
 * Where zt__cuda_flash_supported says so (head sizes 32, 64, 80, 96, 128: GPT-2's 64 and the
 * llama family's among them) the entries run the fused kernels of flash_attention.cu, which
 * keep no (T,T) matrix; the choice depends only on (dt, B, NH, NKV, hs), so saved_bytes, forward
 * and backward always agree on it. fp32 stays on the cuBLAS path above: without bf16/fp16
 * tensor-core fragments a SIMT flash kernel would lose to cuBLAS's SGEMM, and fp32 runs are the
 * accuracy baseline, not the fast path. The other head sizes run the cuBLAS path below.
 *
 * The same products, in the same rounds over a group's query heads, on
 * cublasGemmStridedBatchedEx with fp32 accumulation. Per batch element the scores S go to an
 * fp32 scratch, the softmax runs there in fp32, and P is stored rounded to dt (the saved
 * probabilities, half the bytes of fp32) for P v and the backward. The backward's dP and dS are
 * fp32 in the same scratch; dS is rounded to dt (a second scratch) for the two products that
 * read it. saved = P (B,NH,T,T) in dt | S/dS (NH,T,T) fp32 | dS (NH,T,T) in dt, each part
 * 256-byte aligned. */
static cudaDataType cuda_type(zt_dtype dt) {
  return dt == ZT_BF16 ? CUDA_R_16BF : dt == ZT_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* An operand of gemm_groups_ex: group g at p + g * sg (in elements of type t), leading
 * dimension ld. */
typedef struct g_mat {
  const void *p;
  zt_dtype t;
  int ld;
  long long sg;
} g_mat;

/* The query-side operand of round j (see the top of the file): x0 for query head 0, sh the
 * stride between query heads. */
static g_mat round_j_ex(const void *x0, zt_dtype t, int ld, long long sh, int j, int group) {
  g_mat m = {(const char *)x0 + (size_t)(j * sh) * zt_dtype_size(t), t, ld, sh * group};
  return m;
}

/* C(g) = alpha op(A(g)) op(B(g)) + beta C(g) for the G groups of one batch element. */
static int gemm_groups_ex(zt__cuda_ctx *ctx, cublasOperation_t ta, cublasOperation_t tb, int m,
                          int n, int k, float alpha, g_mat a, g_mat b, float beta, g_mat c,
                          int G) {
  return zt__cuda_check_blas(
      ctx,
      cublasGemmStridedBatchedEx(ctx->cublas, ta, tb, m, n, k, &alpha, a.p, cuda_type(a.t), a.ld,
                                 a.sg, b.p, cuda_type(b.t), b.ld, b.sg, &beta, (void *)c.p,
                                 cuda_type(c.t), c.ld, c.sg, G, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT),
      "cublasGemmStridedBatchedEx", __FILE__, __LINE__);
}

void zt__cuda_attention_fwd_dt(void *vctx, zt_dtype dt, void *out, void *saved, const void *qkv,
                               int B, int T, int NH, int NKV, int hs, int causal,
                                   const int32_t *pos) {
  zt__cuda_ctx *ctx = vctx;
  size_t es = zt_dtype_size(dt);
  zt__cuda_lp_layout lay;
  float *s32;
  geom g;
  if (dt == ZT_F32) {
    zt__cuda_attention_fwd(vctx, out, saved, qkv, B, T, NH, NKV, hs, causal, pos);
    return;
  }
  if (ctx->err)
    return;
  ZT__ARG(ctx, ATT_ARGS_OK(B, T, NH, NKV, hs));
  if (B == 0 || T == 0)
    return;
  if (zt__cuda_flash_supported(dt, B, NH, NKV, hs)) {
    zt__cuda_flash_fwd(ctx, dt, out, saved, qkv, B, T, NH, NKV, hs, causal, pos);
    return;
  }
  g = geometry(T, NH, NKV, hs);
  lay = zt__cuda_att_lp_layout(B, T, NH, es);
  s32 = (float *)((char *)saved + lay.s_off);
  for (int b = 0; b < B; b++) {
    const char *q = (const char *)qkv + (size_t)b * T * g.R * es;
    g_mat k = {q + (size_t)g.C * es, dt, g.R, hs};
    g_mat v = {q + ((size_t)g.C + (size_t)NKV * hs) * es, dt, g.R, hs};
    char *p = (char *)saved + (size_t)b * NH * g.tt * es;
    char *o = (char *)out + (size_t)b * T * g.C * es;
    /* S = scale * q k^T into the fp32 scratch, its softmax there, then P rounded to dt */
    for (int j = 0; j < g.group; j++)
      if (gemm_groups_ex(ctx, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, g.scale, k,
                         round_j_ex(q, dt, g.R, hs, j, g.group), 0.0f,
                         round_j_ex(s32, ZT_F32, T, g.tt, j, g.group), NKV) < 0)
        goto out;
    if (zt__cuda_softmax_rows(ctx, s32, (size_t)NH * T, T, causal,
                              pos ? pos + (size_t)b * T : NULL, NH) < 0)
      goto out;
    zt__cuda_cast(ctx, p, dt, s32, ZT_F32, (size_t)NH * g.tt);
    /* O = P v */
    for (int j = 0; j < g.group; j++)
      if (gemm_groups_ex(ctx, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, v,
                         round_j_ex(p, dt, T, g.tt, j, g.group), 0.0f,
                         round_j_ex(o, dt, g.C, hs, j, g.group), NKV) < 0)
        goto out;
  }
out:
  return;
}

void zt__cuda_attention_bwd_dt(void *vctx, zt_dtype dt, void *dqkv, const void *dout,
                               const void *qkv, const void *saved, int B, int T, int NH, int NKV,
                               int hs, int causal, const int32_t *pos) {
  zt__cuda_ctx *ctx = vctx;
  size_t es = zt_dtype_size(dt);
  zt__cuda_lp_layout lay;
  float *s32;
  char *ds;
  geom g;
  if (dt == ZT_F32) {
    zt__cuda_attention_bwd(vctx, dqkv, dout, qkv, saved, B, T, NH, NKV, hs, causal, pos);
    return;
  }
  if (ctx->err)
    return;
  ZT__ARG(ctx, ATT_ARGS_OK(B, T, NH, NKV, hs));
  if (B == 0 || T == 0)
    return;
  if (zt__cuda_flash_supported(dt, B, NH, NKV, hs)) {
    zt__cuda_flash_bwd(ctx, dt, dqkv, dout, qkv, saved, B, T, NH, NKV, hs, causal, pos);
    return;
  }
  g = geometry(T, NH, NKV, hs);
  lay = zt__cuda_att_lp_layout(B, T, NH, es);
  /* the scratch parts of saved (see above); P itself is only read */
  s32 = (float *)((char *)saved + lay.s_off);
  ds = (char *)saved + lay.ds_off;
  for (int b = 0; b < B; b++) {
    size_t kv0 = (size_t)g.C * es, v0 = ((size_t)g.C + (size_t)NKV * hs) * es;
    const char *q = (const char *)qkv + (size_t)b * T * g.R * es;
    char *dq = (char *)dqkv + (size_t)b * T * g.R * es;
    g_mat k = {q + kv0, dt, g.R, hs}, v = {q + v0, dt, g.R, hs};
    g_mat dk = {dq + kv0, dt, g.R, hs}, dv = {dq + v0, dt, g.R, hs};
    const char *dob = (const char *)dout + (size_t)b * T * g.C * es;
    const char *p = (const char *)saved + (size_t)b * NH * g.tt * es;
#define QJ(x0, t, ld, sh) round_j_ex((x0), (t), (ld), (sh), j, g.group)
    /* dV += P^T dO (the rounds in order: the sum over the group's query heads) */
    for (int j = 0; j < g.group; j++)
      if (gemm_groups_ex(ctx, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, QJ(dob, dt, g.C, hs),
                         QJ(p, dt, T, g.tt), 1.0f, dv, NKV) < 0)
        goto out;
    /* dP = dO V^T (fp32), dS = P * (dP - rowsum(P * dP)) * scale, then dS rounded to dt */
    for (int j = 0; j < g.group; j++)
      if (gemm_groups_ex(ctx, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, 1.0f, v, QJ(dob, dt, g.C, hs),
                         0.0f, QJ(s32, ZT_F32, T, g.tt), NKV) < 0)
        goto out;
    if (zt__cuda_softmax_bwd_rows_dt(ctx, dt, s32, p, (size_t)NH * T, T, causal, g.scale,
                                     pos ? pos + (size_t)b * T : NULL, NH) < 0)
      goto out;
    zt__cuda_cast(ctx, ds, dt, s32, ZT_F32, (size_t)NH * g.tt);
    /* dQ += dS K;  dK += dS^T Q (the rounds in order) */
    for (int j = 0; j < g.group; j++)
      if (gemm_groups_ex(ctx, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, k, QJ(ds, dt, T, g.tt),
                         1.0f, QJ(dq, dt, g.R, hs), NKV) < 0)
        goto out;
    for (int j = 0; j < g.group; j++)
      if (gemm_groups_ex(ctx, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, QJ(q, dt, g.R, hs),
                         QJ(ds, dt, T, g.tt), 1.0f, dk, NKV) < 0)
        goto out;
#undef QJ
  }
out:
  return;
}
