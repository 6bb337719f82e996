// Fused softmax-cross-entropy, following cpu/loss.c: per row the max is subtracted, each
// exponential is an fp32 expf and their sum is accumulated (in double across threads); the
// gradient is (e * (float)(1/sum) * dscale) - dscale at the target, padding columns zeroed.
//
// The loss is a sum over rows whose order must not depend on timing: a fixed number of blocks
// (a function of N only) each take rows blk, blk + G, ... in order and keep their own double
// sum; one block then adds the G partials in a fixed tree, and the result travels through the
// pinned buffer. Targets outside [0, V) (other than ignore_index) would index out of the row
// on the device; they are counted as ignored rather than read. crossentropy_rows_dt adds each
// row's loss (rounded to fp32) to row_loss instead and returns nothing: no partials, no copy,
// no synchronisation.
#include <math.h>

#include "engine/kernels/cuda/lowp.cuh"
#include "engine/kernels/cuda/reduce.cuh"

#define CE_THREADS 256
#define CE_MAX_BLOCKS 1024

namespace {
struct ce_totals {
  double loss;
  int count;
};
// Scratch layout: the partials of every block, then the final sums (copied to the pinned
// buffer).
struct ce_scratch {
  double loss[CE_MAX_BLOCKS];
  int count[CE_MAX_BLOCKS];
  ce_totals total;
};
static_assert(sizeof(ce_scratch) <= ZT__CUDA_SCRATCH_BYTES, "scratch too small");
static_assert(sizeof(ce_totals) <= ZT__CUDA_PINNED_BYTES, "pinned buffer too small");
} // namespace

// grad NULL: loss only; else grad may be logits itself. sc NULL: the row losses go to
// row_loss instead of the block partials. T: the logits' storage type
// (lowp.cuh), float for fp32; the arithmetic is fp32/double either way. V8: rows read and
// written eight elements a thread with 16-byte accesses (V_alloc a multiple of 8, the rows
// 16-byte aligned).
//
// One read of the row finds its max and sum of exponentials together: each thread keeps a
// running max and its sum of exp(x - running max), rescaled when the max grows (an fp32 sum
// of the thread's share, where the reference adds every exponential in double: within fp32
// rounding of it); the threads' sums meet in double at the row's max. The gradient pass reads
// the row again (mostly from L2).
template <class T, bool V8>
static __global__ void crossentropy_kernel(ce_scratch *sc, float *row_loss, T *grad,
                                           const T *logits, const int32_t *targets, int N,
                                           int V, int V_alloc, int ignore_index, float dscale) {
  double block_loss = 0.0;
  int block_count = 0;
  for (int n = blockIdx.x; n < N; n += gridDim.x) {
    const T *x = logits + (size_t)n * V_alloc;
    T *g = grad ? grad + (size_t)n * V_alloc : nullptr;
    int target = targets[n];
    if (target == ignore_index || target < 0 || target >= V) {
      if (g)
        for (int j = threadIdx.x; j < V_alloc; j += blockDim.x)
          g[j] = zt__st<T>(0.0f);
      continue;
    }
    // read before the first barrier, so before any thread can overwrite it (grad == logits)
    float x_target = zt__ld(x[target]);
    float tmax = -INFINITY, tsum = 0.0f;
    if (V8) {
      for (int j = threadIdx.x * 8; j < V; j += blockDim.x * 8) {
        float v[8], cm = -INFINITY;
        zt__ld8(x + j, v);
#pragma unroll
        for (int k = 0; k < 8; k++)
          if (j + k < V)
            cm = fmaxf(cm, v[k]);
        if (cm > tmax) {
          tsum *= expf(tmax - cm);
          tmax = cm;
        }
#pragma unroll
        for (int k = 0; k < 8; k++)
          if (j + k < V)
            tsum += expf(v[k] - tmax);
      }
    } else {
      for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float v = zt__ld(x[j]);
        if (v > tmax) {
          tsum *= expf(tmax - v);
          tmax = v;
        }
        tsum += expf(v - tmax);
      }
    }
    float maxv = zt__block_max(tmax);
    double sum_exp =
        zt__block_sum(tmax == -INFINITY ? 0.0 : (double)(tsum * expf(tmax - maxv)));
    if (threadIdx.x == 0) {
      double loss = maxv + log(sum_exp) - x_target;
      if (sc) {
        block_loss += loss;
        block_count++;
      } else {
        row_loss[n] += (float)loss;
      }
    }
    if (g) {
      float mul = (float)(1.0 / sum_exp) * dscale;
      if (V8) {
        for (int j = threadIdx.x * 8; j < V_alloc; j += blockDim.x * 8) {
          float v[8];
          zt__ld8(x + j, v);
#pragma unroll
          for (int k = 0; k < 8; k++) {
            float e = j + k < V ? expf(v[k] - maxv) * mul : 0.0f;
            v[k] = j + k == target ? e - dscale : e;
          }
          zt__st8(g + j, v);
        }
      } else {
        for (int j = threadIdx.x; j < V; j += blockDim.x) {
          float v = expf(zt__ld(x[j]) - maxv) * mul;
          if (j == target)
            v -= dscale;
          g[j] = zt__st<T>(v);
        }
        for (int j = V + threadIdx.x; j < V_alloc; j += blockDim.x)
          g[j] = zt__st<T>(0.0f);
      }
    }
  }
  if (sc && threadIdx.x == 0) {
    sc->loss[blockIdx.x] = block_loss;
    sc->count[blockIdx.x] = block_count;
  }
}

static __global__ void crossentropy_total_kernel(ce_scratch *sc, int nparts) {
  double loss = 0.0;
  int count = 0;
  for (int i = threadIdx.x; i < nparts; i += blockDim.x) {
    loss += sc->loss[i];
    count += sc->count[i];
  }
  loss = zt__block_sum(loss);
  count = zt__block_sum(count);
  if (threadIdx.x == 0) {
    sc->total.loss = loss;
    sc->total.count = count;
  }
}

// The row kernel on the context's stream: into the scratch's partials, or into row_loss when
// it is not NULL. 0 or the context's error.
template <class T>
static int crossentropy_launch(zt__cuda_ctx *ctx, float *row_loss, T *grad, const T *logits,
                               const int32_t *targets, int N, int V, int V_alloc,
                               int ignore_index, float dscale) {
  ce_scratch *sc = row_loss ? nullptr : (ce_scratch *)ctx->scratch;
  int blocks = N < CE_MAX_BLOCKS ? N : CE_MAX_BLOCKS;
  if (zt__aligned8((size_t)V_alloc, logits, grad))
    crossentropy_kernel<T, true><<<blocks, CE_THREADS, 0, ctx->stream>>>(
        sc, row_loss, grad, logits, targets, N, V, V_alloc, ignore_index, dscale);
  else
    crossentropy_kernel<T, false><<<blocks, CE_THREADS, 0, ctx->stream>>>(
        sc, row_loss, grad, logits, targets, N, V, V_alloc, ignore_index, dscale);
  return zt__cuda_check_rt(ctx, cudaGetLastError(), "crossentropy_kernel", __FILE__, __LINE__);
}

template <class T>
static void crossentropy(zt__cuda_ctx *ctx, T *grad, const T *logits,
                         const int32_t *targets, int N, int V, int V_alloc, int ignore_index,
                         float dscale, double *loss_sum, int *n_counted) {
  ce_scratch *sc = (ce_scratch *)ctx->scratch;
  ce_totals *host = (ce_totals *)ctx->pinned;
  int blocks;
  *loss_sum = NAN; // what a failed context reports
  *n_counted = 0;
  if (ctx->err)
    return;
  ZT__ARG(ctx, N >= 0 && V > 0 && V_alloc >= V);
  if (N == 0) {
    *loss_sum = 0.0;
    return;
  }
  blocks = N < CE_MAX_BLOCKS ? N : CE_MAX_BLOCKS;
  if (crossentropy_launch<T>(ctx, nullptr, grad, logits, targets, N, V, V_alloc, ignore_index,
                             dscale) < 0)
    goto out;
  crossentropy_total_kernel<<<1, CE_THREADS, 0, ctx->stream>>>(sc, blocks);
  ZT__CU(ctx, cudaGetLastError());
  ZT__CU(ctx, cudaMemcpyAsync(host, &sc->total, sizeof(*host), cudaMemcpyDeviceToHost,
                              ctx->stream));
  ZT__CU(ctx, cudaStreamSynchronize(ctx->stream));
  *loss_sum = host->loss;
  *n_counted = host->count;
out:
  return;
}

extern "C" void zt__cuda_crossentropy_fwd_bwd(void *ctx, float *logits, const int32_t *targets,
                                              int N, int V, int V_alloc, int ignore_index,
                                              float dscale, double *loss_sum, int *n_counted) {
  crossentropy<float>((zt__cuda_ctx *)ctx, logits, logits, targets, N, V, V_alloc, ignore_index,
                      dscale, loss_sum, n_counted);
}

extern "C" void zt__cuda_crossentropy_fwd(void *ctx, const float *logits,
                                          const int32_t *targets, int N, int V, int V_alloc,
                                          int ignore_index, double *loss_sum, int *n_counted) {
  crossentropy<float>((zt__cuda_ctx *)ctx, nullptr, logits, targets, N, V, V_alloc, ignore_index,
                      0.0f, loss_sum, n_counted);
}

extern "C" void zt__cuda_crossentropy_fwd_bwd_dt(void *ctx, zt_dtype dt, void *logits,
                                                 const int32_t *targets, int N, int V,
                                                 int V_alloc, int ignore_index, float dscale,
                                                 double *loss_sum, int *n_counted) {
  ZT__DISPATCH(dt, T,
               crossentropy<T>((zt__cuda_ctx *)ctx, (T *)logits, (const T *)logits, targets, N,
                               V, V_alloc, ignore_index, dscale, loss_sum, n_counted));
}

extern "C" void zt__cuda_crossentropy_fwd_dt(void *ctx, zt_dtype dt, const void *logits,
                                             const int32_t *targets, int N, int V, int V_alloc,
                                             int ignore_index, double *loss_sum,
                                             int *n_counted) {
  ZT__DISPATCH(dt, T,
               crossentropy<T>((zt__cuda_ctx *)ctx, (T *)nullptr, (const T *)logits, targets, N,
                               V, V_alloc, ignore_index, 0.0f, loss_sum, n_counted));
}

extern "C" void zt__cuda_crossentropy_rows_dt(void *vctx, zt_dtype dt, void *logits,
                                              const int32_t *targets, int N, int V, int V_alloc,
                                              int ignore_index, float dscale, float *row_loss) {
  zt__cuda_ctx *ctx = (zt__cuda_ctx *)vctx;
  if (ctx->err)
    return;
  ZT__ARG(ctx, N >= 0 && V > 0 && V_alloc >= V && row_loss);
  if (N == 0)
    return;
  ZT__DISPATCH(dt, T,
               crossentropy_launch<T>(ctx, row_loss, (T *)logits, (const T *)logits, targets, N,
                                      V, V_alloc, ignore_index, dscale));
out:
  return;
}
