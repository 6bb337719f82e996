/* The CUDA backend: its op table, device memory, the context (stream, cuBLAS handle, pinned and
 * scratch buffers) and the sticky error that void ops leave for sync(). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/check_cuda.h"
#include "engine/kernels/cuda/cuda.h"
#include "engine/kernels/cuda/cuda_backend.h"
#include "engine/kernels/mem.h"
#include "engine/base/log.h"

/* The context: what the ops see (cuda.h) first, so that their ctx is this, and the accounting
 * of alloc/free, which only this file and backend.h's calls use. */
typedef struct cuda_backend {
  zt__cuda_ctx ops_ctx;
  zt__mem mem;
} cuda_backend;

zt__mem *zt__cuda_mem(void *ctx) { return &((cuda_backend *)ctx)->mem; }

/* The first failure stays in the context for sync() and error_text(); each is logged once, by
 * engine/base's check. */
static int keep(zt__cuda_ctx *ctx, int code, const char *text) {
  if (!ctx->err) {
    ctx->err = code;
    snprintf(ctx->err_text, sizeof ctx->err_text, "%s", text);
  }
  return code;
}

int zt__cuda_fail(zt__cuda_ctx *ctx, int code, const char *file, int line, const char *what) {
  char text[256];
  zt_check_fail("cuda", file, line, what, code, strerror(-code), text, sizeof text);
  return keep(ctx, code, text);
}

int zt__cuda_check_rt(zt__cuda_ctx *ctx, cudaError_t e, const char *what, const char *file,
                      int line) {
  char text[256];
  int rc = zt_check_cuda(e, "cuda", what, file, line, text, sizeof text);
  return rc < 0 ? keep(ctx, rc, text) : 0;
}

int zt__cuda_check_blas(zt__cuda_ctx *ctx, cublasStatus_t s, const char *what, const char *file,
                        int line) {
  char text[256];
  int rc = zt_check_cublas(s, "cuda", what, file, line, text, sizeof text);
  return rc < 0 ? keep(ctx, rc, text) : 0;
}

/* A failed cudaMalloc returns NULL to the caller (who reports it) without poisoning the
 * context: running out of memory at job start is an answer, not a broken device. */
static void *raw_alloc(void *vctx, size_t bytes) {
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    (void)cudaGetLastError(); /* clear it, so that the next launch check does not see it */
    zt_log(ZT_LOG_ERROR, "cuda", "cudaMalloc(%zu) failed: %s", bytes, cudaGetErrorString(e));
    return NULL;
  }
  return p;
}

static void raw_free(void *vctx, void *p) {
  zt__cuda_check_rt(vctx, cudaFree(p), "cudaFree", __FILE__, __LINE__);
}

/* From the reserved block while one is open (zt_backend_reserve), else one cudaMalloc. */
static void *cuda_alloc(void *vctx, size_t bytes) {
  zt__cuda_ctx *ctx = vctx;
  return ctx->err ? NULL : zt__mem_alloc(zt__cuda_mem(ctx), bytes);
}

static void cuda_free(void *vctx, void *p) { zt__mem_free(zt__cuda_mem(vctx), p); }

static void cuda_zero(void *vctx, void *p, size_t bytes) {
  zt__cuda_ctx *ctx = vctx;
  if (ctx->err || !bytes)
    return;
  ZT__CU(ctx, cudaMemsetAsync(p, 0, bytes, ctx->stream));
out:
  return;
}

static void cuda_to_device(void *vctx, void *dst, const void *host_src, size_t bytes) {
  zt__cuda_ctx *ctx = vctx;
  if (ctx->err || !bytes)
    return;
  ZT__CU(ctx, cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, ctx->stream));
out:
  return;
}

/* Synchronises: the host data is valid when this returns (unless the context failed). */
static void cuda_to_host(void *vctx, void *host_dst, const void *src, size_t bytes) {
  zt__cuda_ctx *ctx = vctx;
  if (ctx->err || !bytes)
    return;
  ZT__CU(ctx, cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, ctx->stream));
  ZT__CU(ctx, cudaStreamSynchronize(ctx->stream));
out:
  return;
}

static const char *cuda_error_text(void *ctx) { return ((const zt__cuda_ctx *)ctx)->err_text; }

static int cuda_sync(void *vctx) {
  zt__cuda_ctx *ctx = vctx;
  if (!ctx->err)
    zt__cuda_check_rt(ctx, cudaStreamSynchronize(ctx->stream), "cudaStreamSynchronize",
                      __FILE__, __LINE__);
  if (ctx->err)
    zt_log(ZT_LOG_ERROR, "cuda", "device %d: backend failed: %s", ctx->device, ctx->err_text);
  return ctx->err;
}

/* CUBLAS_TF32_TENSOR_OP_MATH lets cublasSgemm (and the strided-batched products of attention)
 * round fp32 inputs to TF32 on tensor cores, as torch.backends.cuda.matmul.allow_tf32; the
 * bf16/fp16 products use tensor cores in either mode. */
static int cuda_set_allow_tf32(void *vctx, int allow) {
  zt__cuda_ctx *ctx = vctx;
  if (ctx->err)
    return ctx->err;
  ZT__CUBLAS(ctx, cublasSetMathMode(ctx->cublas, allow ? CUBLAS_TF32_TENSOR_OP_MATH
                                                       : CUBLAS_DEFAULT_MATH));
  ctx->allow_tf32 = allow != 0;
out:
  return ctx->err;
}

static const zt_ops cuda_ops = {
    .name = "cuda",
    .alloc = cuda_alloc,
    .free = cuda_free,
    .zero = cuda_zero,
    .to_device = cuda_to_device,
    .to_host = cuda_to_host,
    .sync = cuda_sync,
    .error_text = cuda_error_text,
    .embedding_fwd = zt__cuda_embedding_fwd,
    .embedding_bwd = zt__cuda_embedding_bwd,
    .matmul_fwd = zt__cuda_matmul_fwd,
    .matmul_bwd = zt__cuda_matmul_bwd,
    .layernorm_fwd = zt__cuda_layernorm_fwd,
    .layernorm_bwd = zt__cuda_layernorm_bwd,
    .rmsnorm_fwd = zt__cuda_rmsnorm_fwd,
    .rmsnorm_bwd = zt__cuda_rmsnorm_bwd,
    .attention_saved_bytes = zt__cuda_attention_saved_bytes,
    .attention_fwd = zt__cuda_attention_fwd,
    .attention_bwd = zt__cuda_attention_bwd,
    .rope_fwd = zt__cuda_rope_fwd,
    .rope_bwd = zt__cuda_rope_bwd,
    .gelu_fwd = zt__cuda_gelu_fwd,
    .gelu_bwd = zt__cuda_gelu_bwd,
    .relu_fwd = zt__cuda_relu_fwd,
    .relu_bwd = zt__cuda_relu_bwd,
    .add = zt__cuda_add,
    .swiglu_fwd = zt__cuda_swiglu_fwd,
    .swiglu_bwd = zt__cuda_swiglu_bwd,
    .crossentropy_fwd_bwd = zt__cuda_crossentropy_fwd_bwd,
    .crossentropy_fwd = zt__cuda_crossentropy_fwd,
    .sum_squares = zt__cuda_sum_squares,
    .sum = zt__cuda_sum,
    .scale = zt__cuda_scale,
    .adamw = zt__cuda_adamw,
    .cast = zt__cuda_cast,
    .adamw_dt = zt__cuda_adamw_dt,
    .adamw_sr = zt__cuda_adamw_sr,
    .set_allow_tf32 = cuda_set_allow_tf32,
    .embedding_fwd_dt = zt__cuda_embedding_fwd_dt,
    .embedding_bwd_dt = zt__cuda_embedding_bwd_dt,
    .matmul_fwd_dt = zt__cuda_matmul_fwd_dt,
    .matmul_bwd_dt = zt__cuda_matmul_bwd_dt,
    .layernorm_fwd_dt = zt__cuda_layernorm_fwd_dt,
    .layernorm_bwd_dt = zt__cuda_layernorm_bwd_dt,
    .rmsnorm_fwd_dt = zt__cuda_rmsnorm_fwd_dt,
    .rmsnorm_bwd_dt = zt__cuda_rmsnorm_bwd_dt,
    .attention_saved_bytes_dt = zt__cuda_attention_saved_bytes_dt,
    .attention_fwd_dt = zt__cuda_attention_fwd_dt,
    .attention_bwd_dt = zt__cuda_attention_bwd_dt,
    .rope_fwd_dt = zt__cuda_rope_fwd_dt,
    .rope_bwd_dt = zt__cuda_rope_bwd_dt,
    .gelu_fwd_dt = zt__cuda_gelu_fwd_dt,
    .gelu_bwd_dt = zt__cuda_gelu_bwd_dt,
    .relu_fwd_dt = zt__cuda_relu_fwd_dt,
    .relu_bwd_dt = zt__cuda_relu_bwd_dt,
    .add_dt = zt__cuda_add_dt,
    .swiglu_fwd_dt = zt__cuda_swiglu_fwd_dt,
    .swiglu_bwd_dt = zt__cuda_swiglu_bwd_dt,
    .crossentropy_fwd_bwd_dt = zt__cuda_crossentropy_fwd_bwd_dt,
    .crossentropy_fwd_dt = zt__cuda_crossentropy_fwd_dt,
    .crossentropy_rows_dt = zt__cuda_crossentropy_rows_dt,
};

static void ctx_destroy(zt__cuda_ctx *ctx) {
  /* Teardown errors are logged only: there is nothing left to tell. */
  zt__mem_destroy(zt__cuda_mem(ctx));
  if (ctx->scratch)
    zt__cuda_check_rt(ctx, cudaFree(ctx->scratch), "cudaFree(scratch)", __FILE__, __LINE__);
  if (ctx->pinned)
    zt__cuda_check_rt(ctx, cudaFreeHost(ctx->pinned), "cudaFreeHost", __FILE__, __LINE__);
  if (ctx->cublas)
    zt__cuda_check_blas(ctx, cublasDestroy(ctx->cublas), "cublasDestroy", __FILE__, __LINE__);
  if (ctx->stream)
    zt__cuda_check_rt(ctx, cudaStreamDestroy(ctx->stream), "cudaStreamDestroy", __FILE__,
                      __LINE__);
  free(ctx);
}

const zt_ops *zt_backend_cuda_ops(void) { return &cuda_ops; }

int zt_backend_cuda_open(zt_backend *be, int device) {
  int rc = 0, count = 0;
  zt__cuda_ctx *ctx = NULL;
  if (!be || device < 0)
    return -EINVAL;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || device >= count) {
    (void)cudaGetLastError();
    zt_log(ZT_LOG_ERROR, "cuda", "no CUDA device %d (%d found: %s)", device,
           e == cudaSuccess ? count : 0, cudaGetErrorString(e));
    return -ENODEV;
  }
  cuda_backend *cb = calloc(1, sizeof(*cb));
  if (!cb)
    return -ENOMEM;
  if ((rc = zt__mem_init(&cb->mem, &(zt__mem_raw){.alloc = raw_alloc, .free = raw_free,
                                                  .ctx = cb, .carve = 1})) < 0) {
    free(cb);
    return rc;
  }
  ctx = &cb->ops_ctx;
  ctx->device = device;
  ZT__CU(ctx, cudaSetDevice(device));
  /* Non-blocking: the legacy default stream must not serialise us with other threads' work. */
  ZT__CU(ctx, cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking));
  ZT__CUBLAS(ctx, cublasCreate(&ctx->cublas));
  ZT__CUBLAS(ctx, cublasSetStream(ctx->cublas, ctx->stream));
  /* DEFAULT_MATH runs cublasSgemm in plain fp32 (TF32 needs TF32_TENSOR_OP_MATH, which the
   * job's tf32 option selects through set_allow_tf32). */
  ZT__CUBLAS(ctx, cublasSetMathMode(ctx->cublas, ctx->allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                                 : CUBLAS_DEFAULT_MATH));
  ZT__CU(ctx, cudaMallocHost(&ctx->pinned, ZT__CUDA_PINNED_BYTES));
  ZT__CU(ctx, cudaMalloc(&ctx->scratch, ZT__CUDA_SCRATCH_BYTES));
  cb->mem.st.own_device = ZT__CUDA_SCRATCH_BYTES;
  cb->mem.st.host_pinned = ZT__CUDA_PINNED_BYTES;
  be->ops = &cuda_ops;
  be->ctx = ctx;
out:
  if (ctx->err) {
    rc = ctx->err;
    ctx_destroy(ctx);
  }
  return rc;
}

void zt_backend_cuda_close(zt_backend *be) {
  if (!be || !be->ctx)
    return;
  zt__cuda_ctx *ctx = be->ctx;
  if (!ctx->err)
    zt__cuda_check_rt(ctx, cudaStreamSynchronize(ctx->stream), "cudaStreamSynchronize",
                      __FILE__, __LINE__);
  ctx_destroy(ctx);
  be->ctx = NULL;
  be->ops = NULL;
}


int zt_backend_cuda_device(const zt_backend *be) { return ((zt__cuda_ctx *)be->ctx)->device; }

void *zt_backend_cuda_stream(const zt_backend *be) { return ((zt__cuda_ctx *)be->ctx)->stream; }

int zt_backend_cuda_bind_thread(const zt_backend *be) {
  zt__cuda_ctx *ctx = be->ctx;
  return zt__cuda_check_rt(ctx, cudaSetDevice(ctx->device), "cudaSetDevice", __FILE__, __LINE__);
}
