/* Fused (flash-style) attention for bf16/fp16 activations on tensor cores (flash_attention.cu),
 * which attention.c's typed entries choose at run time where it applies; the cuBLAS path keeps
 * fp32 and the head sizes not covered here. Same math as the CPU reference (scale 1/sqrt(hs),
 * max subtracted, causal masks keys after the query, keys of other documents hidden (ops.h),
 * query head h reading kv head h/(NH/NKV)) without the (B,NH,T,T) probabilities.
 *
 * saved (zt__cuda_flash_saved_bytes, each part 256-byte aligned):
 *   LSE (B,NH,T) fp32  the log-sum-exp of each query's scaled scores, from which the backward
 *                      recomputes P = exp(s - LSE) tile by tile;
 *   O   (B,T,NH*hs) dt a copy of the output: the backward needs D = rowsum(dO * O) and the op
 *                      does not receive out (recomputing O would cost a second forward);
 *   D   (B,NH,T) fp32  scratch the backward writes (kept here so the memory planner counts it;
 *                      the forward leaves it alone). */
#ifndef ZT_KERNELS_CUDA_FLASH_ATTENTION_H
#define ZT_KERNELS_CUDA_FLASH_ATTENTION_H

#include "engine/kernels/cuda/cuda.h"
#include "engine/kernels/cuda/sizes.h"

#ifdef __cplusplus
extern "C" {
#endif

/* (zt__cuda_flash_supported and the layout of saved: sizes.h.) Both return 0 or the
 * context's error; callers check zt__cuda_flash_supported first. */
int zt__cuda_flash_fwd(zt__cuda_ctx *ctx, zt_dtype dt, void *out, void *saved, const void *qkv,
                       int B, int T, int NH, int NKV, int hs, int causal, const int32_t *pos);
int zt__cuda_flash_bwd(zt__cuda_ctx *ctx, zt_dtype dt, void *dqkv, const void *dout,
                       const void *qkv, const void *saved, int B, int T, int NH, int NKV,
                       int hs, int causal, const int32_t *pos);

#ifdef __cplusplus
}
#endif

#endif
