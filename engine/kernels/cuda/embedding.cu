// Token (and optional position) embedding and its backward.
//
// The backward must not use float atomics (run-to-run bits would depend on timing), and
// several positions may carry the same token, so rows of dwte are not independent outputs.
// Each vocabulary row is owned by one bucket (token % BUCKETS); a warp takes 32 channels of
// one bucket and walks all positions in order, a ballot picking out its bucket's tokens, so
// every dwte row receives its adds in position order, by one thread per channel: the same
// order (and bits) as the CPU reference, with C/32 x BUCKETS warps in flight.
// dwpe[p] += the sum of dout over the tokens at position p: one thread per (p, c), walking the
// rows in order and each row's documents in order (docs.h), as the CPU reference does; without
// positions that is sum_b dout[b,p].
#include "engine/kernels/cuda/lowp.cuh"
#include "engine/kernels/cuda/reduce.cuh"
#include "engine/kernels/docs.h"

#define BUCKETS 64

// T: the storage type of out / dout (lowp.cuh); the tables and their gradients are fp32.
template <class T>
static __global__ void embedding_fwd_kernel(T *out, const int32_t *tok, const float *wte,
                                            const float *wpe, const int32_t *pos, size_t n,
                                            int T_, int C) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t bt = i / C;
    int c = (int)(i % C);
    float e = wte[(size_t)tok[bt] * C + c];
    if (wpe) {
      int t = (int)(bt % T_);
      int p = pos ? t - zt_doc_start(pos + (bt - t), t) : t;
      e += wpe[(size_t)p * C + c];
    }
    out[i] = zt__st<T>(e);
  }
}

template <class T>
static __global__ void embedding_bwd_wte_kernel(float *dwte, const T *dout, const int32_t *tok,
                                                size_t rows, int C) {
  int lane = threadIdx.x;
  int c = blockIdx.x * 32 + lane;
  unsigned bucket = blockIdx.y;
  for (size_t base = 0; base < rows; base += 32) {
    size_t i = base + lane;
    int t = i < rows ? tok[i] : 0;
    unsigned mine = __ballot_sync(ZT__FULL_MASK, i < rows && (unsigned)t % BUCKETS == bucket);
    while (mine) {
      int l = __ffs(mine) - 1;
      mine &= mine - 1;
      int tl = __shfl_sync(ZT__FULL_MASK, t, l);
      if (c < C)
        dwte[(size_t)tl * C + c] += zt__ld(dout[(base + l) * C + c]);
    }
  }
}

template <class T>
static __global__ void embedding_bwd_wpe_kernel(float *dwpe, const T *dout, const int32_t *pos,
                                                int B, int T_, int C) {
  size_t n = (size_t)T_ * C;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    int p = (int)(i / C);
    float acc = 0.0f;
    bool any = false;
    for (int b = 0; b < B; b++) {
      if (!pos) {
        acc += zt__ld(dout[(size_t)b * n + i]);
        any = true;
        continue;
      }
      const int32_t *row = pos + (size_t)b * T_;
      for (int s = 0; s + p < T_;) { // s: the start of each document of the row
        int t = s + p;
        bool in = zt_doc_start(row, t) == s;
        if (in) {
          acc += zt__ld(dout[((size_t)b * T_ + t) * C + i % C]);
          any = true;
        }
        s = in ? zt_doc_end(row, t + 1, T_, s) : zt_doc_end(row, s + 1, t, s);
      }
    }
    if (any)
      dwpe[i] += acc;
  }
}

template <class T>
static void embedding_fwd_t(zt__cuda_ctx *ctx, T *out, const int32_t *tok, const float *wte,
                            const float *wpe, int B, int T_, int C, const int32_t *pos) {
  size_t n;
  if (ctx->err)
    return;
  ZT__ARG(ctx, B >= 0 && T_ >= 0 && C >= 0);
  n = (size_t)B * T_ * C;
  if (n == 0)
    return;
  embedding_fwd_kernel<T><<<zt__cuda_blocks(n, ZT__CUDA_THREADS), ZT__CUDA_THREADS, 0,
                            ctx->stream>>>(out, tok, wte, wpe, pos, n, T_, C);
  ZT__CU(ctx, cudaGetLastError());
out:
  return;
}

template <class T>
static void embedding_bwd_t(zt__cuda_ctx *ctx, float *dwte, float *dwpe, const T *dout,
                            const int32_t *tok, int B, int T_, int C, const int32_t *pos) {
  size_t rows;
  if (ctx->err)
    return;
  ZT__ARG(ctx, B >= 0 && T_ >= 0 && C >= 0);
  rows = (size_t)B * T_;
  if (rows == 0 || C == 0)
    return;
  embedding_bwd_wte_kernel<T><<<dim3((C + 31) / 32, BUCKETS), 32, 0, ctx->stream>>>(dwte, dout,
                                                                                    tok, rows, C);
  ZT__CU(ctx, cudaGetLastError());
  if (dwpe) {
    embedding_bwd_wpe_kernel<T><<<zt__cuda_blocks((size_t)T_ * C, ZT__CUDA_THREADS),
                                  ZT__CUDA_THREADS, 0, ctx->stream>>>(dwpe, dout, pos, B, T_, C);
    ZT__CU(ctx, cudaGetLastError());
  }
out:
  return;
}

extern "C" void zt__cuda_embedding_fwd(void *ctx, float *out, const int32_t *tok,
                                       const float *wte, const float *wpe, int B, int T, int C,
                                           const int32_t *pos) {
  embedding_fwd_t<float>((zt__cuda_ctx *)ctx, out, tok, wte, wpe, B, T, C, pos);
}

extern "C" void zt__cuda_embedding_bwd(void *ctx, float *dwte, float *dwpe, const float *dout,
                                       const int32_t *tok, int B, int T, int C,
                                           const int32_t *pos) {
  embedding_bwd_t<float>((zt__cuda_ctx *)ctx, dwte, dwpe, dout, tok, B, T, C, pos);
}

extern "C" void zt__cuda_embedding_fwd_dt(void *ctx, zt_dtype dt, void *out, const int32_t *tok,
                                          const float *wte, const float *wpe, int B, int T,
                                          int C, const int32_t *pos) {
  ZT__DISPATCH(dt, S, embedding_fwd_t<S>((zt__cuda_ctx *)ctx, (S *)out, tok, wte, wpe, B, T, C,
                                    pos));
}

extern "C" void zt__cuda_embedding_bwd_dt(void *ctx, zt_dtype dt, float *dwte, float *dwpe,
                                          const void *dout, const int32_t *tok, int B, int T,
                                          int C, const int32_t *pos) {
  ZT__DISPATCH(dt, S,
               embedding_bwd_t<S>((zt__cuda_ctx *)ctx, dwte, dwpe, (const S *)dout, tok, B, T,
                                  C, pos));
}
