/* The CPU reference backend: its op table, host memory as "device" memory, and the context that
 * carries the thread count. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "engine/kernels/cpu/cpu.h"
#include "engine/kernels/mem.h"

/* A cache line, so that no two threads' output rows share one at a buffer's start and vector
 * loads are aligned. */
#define ZT__CPU_ALIGN 64

/* The context: what the ops see (cpu.h) first, so that their ctx is this, and the accounting of
 * alloc/free, which only this file and backend.c use. */
typedef struct cpu_backend {
  zt__cpu_ctx ops_ctx;
  zt__mem mem;
} cpu_backend;

zt__mem *zt__cpu_mem(void *ctx) { return &((cpu_backend *)ctx)->mem; }

static void *raw_alloc(void *ctx, size_t bytes) {
  /* Rounded up so that a size that is not a multiple of the alignment (and 0) is still valid. */
  if (bytes > SIZE_MAX - ZT__CPU_ALIGN)
    return NULL;
  size_t rounded = (bytes + ZT__CPU_ALIGN - 1) / ZT__CPU_ALIGN * ZT__CPU_ALIGN;
  if (rounded == 0)
    rounded = ZT__CPU_ALIGN;
  void *p = NULL;
  if (posix_memalign(&p, ZT__CPU_ALIGN, rounded) != 0)
    return NULL;
  return p;
}

static void raw_free(void *ctx, void *p) { free(p); }

static void *cpu_alloc(void *ctx, size_t bytes) { return zt__mem_alloc(zt__cpu_mem(ctx), bytes); }

static void cpu_free(void *ctx, void *p) { zt__mem_free(zt__cpu_mem(ctx), p); }

static void cpu_zero(void *ctx, void *p, size_t bytes) {
  if (bytes)
    memset(p, 0, bytes);
}

static void cpu_copy(void *ctx, void *dst, const void *src, size_t bytes) {
  if (bytes)
    memcpy(dst, src, bytes);
}

/* The one failure the CPU ops can have: a typed op that could not allocate its temporaries. */
static int cpu_sync(void *ctx) { return ((const zt__cpu_ctx *)ctx)->err; }

static const char *cpu_error_text(void *ctx) {
  return ((const zt__cpu_ctx *)ctx)->err ? "out of host memory for a bf16/fp16 op's temporaries"
                                         : "";
}

static const zt_ops cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .zero = cpu_zero,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .sync = cpu_sync,
    .error_text = cpu_error_text,
    .embedding_fwd = zt__cpu_embedding_fwd,
    .embedding_bwd = zt__cpu_embedding_bwd,
    .matmul_fwd = zt__cpu_matmul_fwd,
    .matmul_bwd = zt__cpu_matmul_bwd,
    .layernorm_fwd = zt__cpu_layernorm_fwd,
    .layernorm_bwd = zt__cpu_layernorm_bwd,
    .rmsnorm_fwd = zt__cpu_rmsnorm_fwd,
    .rmsnorm_bwd = zt__cpu_rmsnorm_bwd,
    .attention_saved_bytes = zt__cpu_attention_saved_bytes,
    .attention_fwd = zt__cpu_attention_fwd,
    .attention_bwd = zt__cpu_attention_bwd,
    .rope_fwd = zt__cpu_rope_fwd,
    .rope_bwd = zt__cpu_rope_bwd,
    .gelu_fwd = zt__cpu_gelu_fwd,
    .gelu_bwd = zt__cpu_gelu_bwd,
    .relu_fwd = zt__cpu_relu_fwd,
    .relu_bwd = zt__cpu_relu_bwd,
    .add = zt__cpu_add,
    .swiglu_fwd = zt__cpu_swiglu_fwd,
    .swiglu_bwd = zt__cpu_swiglu_bwd,
    .crossentropy_fwd_bwd = zt__cpu_crossentropy_fwd_bwd,
    .crossentropy_fwd = zt__cpu_crossentropy_fwd,
    .sum_squares = zt__cpu_sum_squares,
    .sum = zt__cpu_sum,
    .scale = zt__cpu_scale,
    .adamw = zt__cpu_adamw,
    .cast = zt__cpu_cast,
    .adamw_dt = zt__cpu_adamw_dt,
    .adamw_sr = zt__cpu_adamw_sr,
    .set_allow_tf32 = zt__cpu_set_allow_tf32,
    .embedding_fwd_dt = zt__cpu_embedding_fwd_dt,
    .embedding_bwd_dt = zt__cpu_embedding_bwd_dt,
    .matmul_fwd_dt = zt__cpu_matmul_fwd_dt,
    .matmul_bwd_dt = zt__cpu_matmul_bwd_dt,
    .layernorm_fwd_dt = zt__cpu_layernorm_fwd_dt,
    .layernorm_bwd_dt = zt__cpu_layernorm_bwd_dt,
    .rmsnorm_fwd_dt = zt__cpu_rmsnorm_fwd_dt,
    .rmsnorm_bwd_dt = zt__cpu_rmsnorm_bwd_dt,
    .attention_saved_bytes_dt = zt__cpu_attention_saved_bytes_dt,
    .attention_fwd_dt = zt__cpu_attention_fwd_dt,
    .attention_bwd_dt = zt__cpu_attention_bwd_dt,
    .rope_fwd_dt = zt__cpu_rope_fwd_dt,
    .rope_bwd_dt = zt__cpu_rope_bwd_dt,
    .gelu_fwd_dt = zt__cpu_gelu_fwd_dt,
    .gelu_bwd_dt = zt__cpu_gelu_bwd_dt,
    .relu_fwd_dt = zt__cpu_relu_fwd_dt,
    .relu_bwd_dt = zt__cpu_relu_bwd_dt,
    .add_dt = zt__cpu_add_dt,
    .swiglu_fwd_dt = zt__cpu_swiglu_fwd_dt,
    .swiglu_bwd_dt = zt__cpu_swiglu_bwd_dt,
    .crossentropy_fwd_bwd_dt = zt__cpu_crossentropy_fwd_bwd_dt,
    .crossentropy_fwd_dt = zt__cpu_crossentropy_fwd_dt,
    .crossentropy_rows_dt = zt__cpu_crossentropy_rows_dt,
};

const zt_ops *zt_backend_cpu_ops(void) { return &cpu_ops; }

int zt_backend_cpu_open(zt_backend *be, int n_threads) {
  if (!be || n_threads < 0)
    return -EINVAL;
  cpu_backend *cb = malloc(sizeof(*cb));
  if (!cb)
    return -ENOMEM;
  int rc = zt__mem_init(&cb->mem, &(zt__mem_raw){.alloc = raw_alloc, .free = raw_free});
  if (rc < 0) {
    free(cb);
    return rc;
  }
  zt__cpu_ctx *ctx = &cb->ops_ctx;
#ifdef _OPENMP
  ctx->n_threads = n_threads ? n_threads : omp_get_num_procs();
#else
  ctx->n_threads = 1; /* built without OpenMP: every op runs on the calling thread */
#endif
  ctx->err = 0;
  be->ops = &cpu_ops;
  be->ctx = ctx;
  return 0;
}

void zt_backend_cpu_close(zt_backend *be) {
  if (!be || !be->ctx)
    return;
  zt__mem_destroy(zt__cpu_mem(be->ctx));
  free(be->ctx);
  be->ctx = NULL;
  be->ops = NULL;
}
