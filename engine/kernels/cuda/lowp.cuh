// Loads and stores of activations in the three storage types (ops.h's typed entries): a value
// is widened to fp32 on load and rounded to nearest even once on store, like the CPU
// reference's conversions (engine/kernels/dtype.h). With T = float both are the identity, so
// the fp32 ops compiled from the same templates are unchanged.
#ifndef ZT_KERNELS_CUDA_LOWP_CUH
#define ZT_KERNELS_CUDA_LOWP_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

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

// Eight consecutive elements widened to fp32, and eight rounded back: one 16-byte access for
// the 16-bit types, two for fp32. p must be 16-byte aligned (zt__aligned8).
template <class T> __device__ __forceinline__ void zt__ld8(const T *p, float (&v)[8]) {
  if constexpr (sizeof(T) == 4) {
    float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
    v[7] = b.w;
  } else {
    union {
      int4 q;
      T e[8];
    } u;
    u.q = *(const int4 *)p;
#pragma unroll
    for (int i = 0; i < 8; i++)
      v[i] = zt__ld(u.e[i]);
  }
}
template <class T> __device__ __forceinline__ void zt__st8(T *p, const float (&v)[8]) {
  if constexpr (sizeof(T) == 4) {
    ((float4 *)p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    ((float4 *)p)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    union {
      int4 q;
      T e[8];
    } u;
#pragma unroll
    for (int i = 0; i < 8; i++)
      u.e[i] = zt__st<T>(v[i]);
    *(int4 *)p = u.q;
  }
}
// Whether every pointer is 16-byte aligned and n (elements) is a multiple of 8: the
// condition of the ld8/st8 paths.
static inline bool zt__aligned8(size_t n, const void *a, const void *b = nullptr,
                                const void *c = nullptr) {
  return n % 8 == 0 && (uintptr_t)a % 16 == 0 && (uintptr_t)b % 16 == 0 &&
         (uintptr_t)c % 16 == 0;
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
