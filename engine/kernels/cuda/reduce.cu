// sum_squares and sum (in double, two passes: per-block partials, then one block adds them in
// order) and the column sums of the bias gradient.
#include <math.h>

#include "engine/kernels/cuda/lowp.cuh"
#include "engine/kernels/cuda/reduce.cuh"

#define SUM_MAX_BLOCKS 1024

template <bool SQUARE>
static __global__ void sum_partial(double *part, const float *x, size_t n) {
  double acc = 0.0;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    acc += SQUARE ? (double)x[i] * x[i] : (double)x[i];
  acc = zt__block_sum(acc);
  if (threadIdx.x == 0)
    part[blockIdx.x] = acc;
}

// One block: thread i adds partials i, i + blockDim, ... in order, then the block tree.
static __global__ void sum_partials(double *result, const double *part, int nparts) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < nparts; i += blockDim.x)
    acc += part[i];
  acc = zt__block_sum(acc);
  if (threadIdx.x == 0)
    *result = acc;
}

// The sum of x[i] (or of x[i]^2) on the host; NaN after a failure.
template <bool SQUARE> static double sum_on_host(zt__cuda_ctx *ctx, const float *x, size_t n) {
  double *part = (double *)ctx->scratch, *result = part + SUM_MAX_BLOCKS;
  double total = NAN;
  unsigned blocks;
  if (ctx->err)
    goto out;
  if (n == 0) {
    total = 0.0;
    goto out;
  }
  blocks = zt__cuda_blocks(n, ZT__CUDA_THREADS);
  if (blocks > SUM_MAX_BLOCKS)
    blocks = SUM_MAX_BLOCKS;
  sum_partial<SQUARE><<<blocks, ZT__CUDA_THREADS, 0, ctx->stream>>>(part, x, n);
  ZT__CU(ctx, cudaGetLastError());
  sum_partials<<<1, ZT__CUDA_THREADS, 0, ctx->stream>>>(result, part, (int)blocks);
  ZT__CU(ctx, cudaGetLastError());
  ZT__CU(ctx, cudaMemcpyAsync(ctx->pinned, result, sizeof(double), cudaMemcpyDeviceToHost,
                              ctx->stream));
  ZT__CU(ctx, cudaStreamSynchronize(ctx->stream));
  total = *(const double *)ctx->pinned;
out:
  return total;
}

extern "C" double zt__cuda_sum_squares(void *vctx, const float *x, size_t n, int *nonfinite) {
  double total = sum_on_host<true>((zt__cuda_ctx *)vctx, x, n);
  // A square of a finite float cannot overflow a double, so the sum is finite exactly when
  // every value is (and NaN after a failure, which callers treat as an overflow).
  if (nonfinite)
    *nonfinite = !isfinite(total);
  return total;
}

extern "C" double zt__cuda_sum(void *vctx, const float *x, size_t n) {
  return sum_on_host<false>((zt__cuda_ctx *)vctx, x, n);
}

namespace {
template <class T> struct column_of {
  const T *src;
  int C;
  __device__ void operator()(int n, int c, float acc[1]) const {
    acc[0] += zt__ld(src[(size_t)n * C + c]);
  }
};
} // namespace

extern "C" int zt__cuda_column_sums_add(zt__cuda_ctx *ctx, float *dst, const float *src, int N,
                                        int C) {
  return zt__cuda_column_sums_add_dt(ctx, ZT_F32, dst, src, N, C);
}

extern "C" int zt__cuda_column_sums_add_dt(zt__cuda_ctx *ctx, zt_dtype dt, float *dst,
                                           const void *src, int N, int C) {
  int rc = 0;
  if (N <= 0 || C <= 0)
    return ctx->err;
  ZT__DISPATCH(dt, T,
               rc = zt__colsum_add<1>(ctx, dst, nullptr, column_of<T>{(const T *)src, C}, N, C));
  return rc;
}
