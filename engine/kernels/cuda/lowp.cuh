// Loads and stores of activations in the three storage types (ops.h's typed entries): a value
// is widened to fp32 on load and rounded to nearest even once on store, like the CPU
// reference's conversions (engine/kernels/dtype.h). With T = float both are the identity, so
// the fp32 ops compiled from the same templates are unchanged.
#ifndef ZT_KERNELS_CUDA_LOWP_CUH
#define ZT_KERNELS_CUDA_LOWP_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "engine/kernels/cuda/cuda.h"

__device__ __forceinline__ float zt__ld(float x) { return x; }
__device__ __forceinline__ float zt__ld(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float zt__ld(__half x) { return __half2float(x); }

template <class T> __device__ __forceinline__ T zt__st(float v);
template <> __device__ __forceinline__ float zt__st<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 zt__st<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half zt__st<__half>(float v) {
  return __float2half_rn(v);
}

// Runs the statement with T the storage type of dt.
#define ZT__DISPATCH(dt, T, ...)                                                               \
  do {                                                                                         \
    if ((dt) == ZT_BF16) {                                                                     \
      typedef __nv_bfloat16 T;                                                                 \
      __VA_ARGS__;                                                                             \
    } else if ((dt) == ZT_F16) {                                                               \
      typedef __half T;                                                                        \
      __VA_ARGS__;                                                                             \
    } else {                                                                                   \
      typedef float T;                                                                         \
      __VA_ARGS__;                                                                             \
    }                                                                                          \
  } while (0)

#endif
