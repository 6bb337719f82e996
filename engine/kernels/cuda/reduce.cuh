/* Device building blocks of the reductions, shared by the .cu files. Every reduction here has
 * a fixed order for given shapes: warp sums use the xor butterfly (each lane ends with the
 * same bits, since a + b == b + a exactly), block sums combine warps in warp order, and column
 * sums cut the rows into chunks that depend only on the shapes. */
#ifndef ZT_KERNELS_CUDA_REDUCE_CUH
#define ZT_KERNELS_CUDA_REDUCE_CUH

#include "engine/kernels/cuda/cuda.h"

#define ZT__FULL_MASK 0xffffffffu

template <class X> __device__ inline X zt__warp_sum(X v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(ZT__FULL_MASK, v, o);
  return v;
}

__device__ inline float zt__warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(ZT__FULL_MASK, v, o));
  return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
 * Must be reached by all threads of the block. */
template <class X> __device__ inline X zt__block_sum(X v) {
  __shared__ X warp_part[32];
  __shared__ X total;
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  v = zt__warp_sum(v);
  if (lane == 0)
    warp_part[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    X s = warp_part[0];
    for (int w = 1; w < nwarps; w++)
      s += warp_part[w];
    total = s;
  }
  __syncthreads();
  X r = total;
  __syncthreads(); /* total and warp_part may be reused by the next call */
  return r;
}

__device__ inline float zt__block_max(float v) {
  __shared__ float warp_part[32];
  __shared__ float total;
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  v = zt__warp_max(v);
  if (lane == 0)
    warp_part[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = warp_part[0];
    for (int w = 1; w < nwarps; w++)
      m = fmaxf(m, warp_part[w]);
    total = m;
  }
  __syncthreads();
  float r = total;
  __syncthreads();
  return r;
}

/* Column sums of K quantities over N rows and C columns: sum_n f(n, c)[k], added into
 * dst[k][c]. Stage one: a block of 32 columns x ZT__CS_LANES row lanes takes one chunk of
 * rows, each lane summing its rows in order, the lanes added in lane order, one partial per
 * (k, chunk, column) in the scratch buffer. Stage two adds a column's partials in chunk order.
 * f is a functor: __device__ void operator()(int n, int c, float acc[K]) const. */
#define ZT__CS_COLS 32
#define ZT__CS_LANES 8
#define ZT__CS_MAX_CHUNKS 64
#define ZT__CS_MIN_ROWS 64

template <int K, class F>
__global__ void zt__colsum_partial(float *part, F f, int N, int C, int chunks, int rows_per) {
  __shared__ float sh[K][ZT__CS_LANES][ZT__CS_COLS];
  int c = blockIdx.x * ZT__CS_COLS + threadIdx.x;
  int r = blockIdx.y;
  int n0 = r * rows_per, n1 = min(N, n0 + rows_per);
  float acc[K];
  for (int k = 0; k < K; k++)
    acc[k] = 0.0f;
  if (c < C)
    for (int n = n0 + threadIdx.y; n < n1; n += ZT__CS_LANES)
      f(n, c, acc);
  for (int k = 0; k < K; k++)
    sh[k][threadIdx.y][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < C)
    for (int k = 0; k < K; k++) {
      float s = sh[k][0][threadIdx.x];
      for (int l = 1; l < ZT__CS_LANES; l++)
        s += sh[k][l][threadIdx.x];
      part[((size_t)k * chunks + r) * C + c] = s;
    }
}

template <int K>
__global__ void zt__colsum_finish(float *dst0, float *dst1, const float *part, int C,
                                  int chunks) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C)
    return;
  for (int k = 0; k < K; k++) {
    float s = part[(size_t)k * chunks * C + c];
    for (int r = 1; r < chunks; r++)
      s += part[((size_t)k * chunks + r) * C + c];
    float *dst = k == 0 ? dst0 : dst1;
    dst[c] += s;
  }
}

/* Runs both stages on the context's stream; dst1 is used when K == 2. N, C > 0. */
template <int K, class F>
int zt__colsum_add(zt__cuda_ctx *ctx, float *dst0, float *dst1, F f, int N, int C) {
  size_t room = ZT__CUDA_SCRATCH_BYTES / sizeof(float) / ((size_t)K * C);
  int chunks = (N + ZT__CS_MIN_ROWS - 1) / ZT__CS_MIN_ROWS;
  if (chunks > ZT__CS_MAX_CHUNKS)
    chunks = ZT__CS_MAX_CHUNKS;
  if ((size_t)chunks > room)
    chunks = (int)room;
  if (chunks == 0)
    return zt__cuda_fail(ctx, -E2BIG, __FILE__, __LINE__, "column sum wider than the scratch");
  int rows_per = (N + chunks - 1) / chunks;
  chunks = (N + rows_per - 1) / rows_per;
  float *part = (float *)ctx->scratch;
  dim3 grid((C + ZT__CS_COLS - 1) / ZT__CS_COLS, chunks), block(ZT__CS_COLS, ZT__CS_LANES);
  zt__colsum_partial<K><<<grid, block, 0, ctx->stream>>>(part, f, N, C, chunks, rows_per);
  if (zt__cuda_check_rt(ctx, cudaGetLastError(), "colsum_partial", __FILE__, __LINE__) < 0)
    return ctx->err;
  zt__colsum_finish<K><<<(C + 255) / 256, 256, 0, ctx->stream>>>(dst0, dst1, part, C, chunks);
  if (zt__cuda_check_rt(ctx, cudaGetLastError(), "colsum_finish", __FILE__, __LINE__) < 0)
    return ctx->err;
  return 0;
}

#endif
