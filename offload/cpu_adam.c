/* CPU AdamW: the step's constants, the scalar path, run-time choice of the SIMD path, and the
 * glue that splits a tensor over the worker pool. */
#include "offload/cpu_adam.h"

#include <errno.h>
#include <math.h>

#include "offload/cpu_adam_kernels.h"

void zt_adam_consts_init(zt_adam_consts *c, const zt_adam_hparams *h) {
  double bc1 = 1.0 - pow(h->beta1, h->step);
  double bc2 = 1.0 - pow(h->beta2, h->step);
  c->decay = (float)(1.0 - (double)h->lr * h->weight_decay);
  c->w1 = (float)(1.0 - (double)h->beta1);
  c->one_minus_w1 = 1.0f - c->w1;
  c->w2 = (float)(1.0 - (double)h->beta2);
  c->beta2 = h->beta2;
  c->eps = h->eps;
  c->neg_step_size = (float)(-((double)h->lr / bc1));
  c->bc2_sqrt = (float)sqrt(bc2);
  c->grad_scale = h->grad_scale;
  c->sr_key = zt_sr_key(h->seed, h->step);
}

void zt__cpu_adam_scalar(const zt_adam_consts *c, float *p, const float *g, float *m, float *v,
                         uint16_t *p_bf16, uint16_t *p_fp16, size_t n) {
  for (size_t i = 0; i < n; i++) zt__adam_one(c, p, g, m, v, p_bf16, p_fp16, i);
}

void zt__cpu_adam_bf16_scalar(const zt_adam_consts *c, float *p, const float *g, uint16_t *m,
                              uint16_t *v, uint16_t *p_bf16, uint16_t *p_fp16, size_t n,
                              uint64_t index0) {
  for (size_t i = 0; i < n; i++) zt__adam_one_bf16(c, p, g, m, v, p_bf16, p_fp16, i, index0);
}

int zt_cpu_isa_supported(zt_cpu_isa isa) {
  switch (isa) {
  case ZT_CPU_ISA_AUTO:
  case ZT_CPU_ISA_SCALAR:
    return 1;
#ifdef ZT_OFFLOAD_X86
  case ZT_CPU_ISA_AVX2:
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  case ZT_CPU_ISA_AVX512:
    return __builtin_cpu_supports("avx512f");
#else
  case ZT_CPU_ISA_AVX2:
  case ZT_CPU_ISA_AVX512:
    return 0;
#endif
  }
  return 0;
}

zt_cpu_isa zt_cpu_isa_best(void) {
  if (zt_cpu_isa_supported(ZT_CPU_ISA_AVX512)) return ZT_CPU_ISA_AVX512;
  if (zt_cpu_isa_supported(ZT_CPU_ISA_AVX2)) return ZT_CPU_ISA_AVX2;
  return ZT_CPU_ISA_SCALAR;
}

const char *zt_cpu_isa_name(zt_cpu_isa isa) {
  switch (isa) {
  case ZT_CPU_ISA_AUTO: return "auto";
  case ZT_CPU_ISA_SCALAR: return "scalar";
  case ZT_CPU_ISA_AVX2: return "avx2";
  case ZT_CPU_ISA_AVX512: return "avx512";
  }
  return "?";
}

typedef void (*adam_kernel)(const zt_adam_consts *c, float *p, const float *g, float *m,
                            float *v, uint16_t *p_bf16, uint16_t *p_fp16, size_t n);
typedef void (*adam_kernel_bf16)(const zt_adam_consts *c, float *p, const float *g, uint16_t *m,
                                 uint16_t *v, uint16_t *p_bf16, uint16_t *p_fp16, size_t n,
                                 uint64_t index0);

/* The kernels of each ISA this build has. */
static const struct {
  adam_kernel f32;
  adam_kernel_bf16 bf16;
} kernels[] = {
    [ZT_CPU_ISA_SCALAR] = {zt__cpu_adam_scalar, zt__cpu_adam_bf16_scalar},
#ifdef ZT_OFFLOAD_X86
    [ZT_CPU_ISA_AVX2] = {zt__cpu_adam_avx2, zt__cpu_adam_bf16_avx2},
    [ZT_CPU_ISA_AVX512] = {zt__cpu_adam_avx512, zt__cpu_adam_bf16_avx512},
#endif
};

/* The ISA that runs for isa, or -1 when this CPU or build lacks it. */
static int resolve(zt_cpu_isa isa) {
  if (!zt_cpu_isa_supported(isa)) return -1;
  return isa == ZT_CPU_ISA_AUTO ? (int)zt_cpu_isa_best() : (int)isa;
}

static adam_kernel kernel_for(zt_cpu_isa isa) {
  int i = resolve(isa);
  return i < 0 ? NULL : kernels[i].f32;
}

static adam_kernel_bf16 kernel_bf16_for(zt_cpu_isa isa) {
  int i = resolve(isa);
  return i < 0 ? NULL : kernels[i].bf16;
}

int zt_cpu_adam_run(zt_cpu_isa isa, const zt_adam_hparams *h, float *p, const float *g, float *m,
                    float *v, uint16_t *p_bf16, uint16_t *p_fp16, size_t n) {
  zt_adam_consts c;
  adam_kernel k = kernel_for(isa);
  if (!k) return -ENOTSUP;
  if (h->step < 1) return -EINVAL;
  zt_adam_consts_init(&c, h);
  k(&c, p, g, m, v, p_bf16, p_fp16, n);
  return 0;
}

int zt_cpu_adam_run_bf16(zt_cpu_isa isa, const zt_adam_hparams *h, float *p, const float *g,
                         uint16_t *m, uint16_t *v, uint16_t *p_bf16, uint16_t *p_fp16, size_t n,
                         uint64_t index0) {
  zt_adam_consts c;
  adam_kernel_bf16 k = kernel_bf16_for(isa);
  if (!k) return -ENOTSUP;
  if (h->step < 1) return -EINVAL;
  zt_adam_consts_init(&c, h);
  k(&c, p, g, m, v, p_bf16, p_fp16, n, index0);
  return 0;
}

static void adam_chunk(void *arg, size_t begin, size_t end) {
  zt_cpu_adam_task *t = arg;
  uint16_t *bf = t->p_bf16 ? t->p_bf16 + begin : NULL, *hf = t->p_fp16 ? t->p_fp16 + begin : NULL;
  if (t->state == ZT_BF16)
    kernel_bf16_for(t->isa)(&t->c, t->p + begin, t->g + begin, (uint16_t *)t->m + begin,
                            (uint16_t *)t->v + begin, bf, hf, end - begin, t->index0 + begin);
  else
    kernel_for(t->isa)(&t->c, t->p + begin, t->g + begin, (float *)t->m + begin,
                       (float *)t->v + begin, bf, hf, end - begin);
}

int zt_cpu_adam_submit(zt_cpu_pool *pool, zt_cpu_adam_task *task) {
  if (!kernel_for(task->isa)) return -ENOTSUP;
  if (task->h.step < 1 || (task->state != ZT_F32 && task->state != ZT_BF16)) return -EINVAL;
  if (task->isa == ZT_CPU_ISA_AUTO) task->isa = zt_cpu_isa_best();
  zt_adam_consts_init(&task->c, &task->h);
  task->job = (zt_cpu_job){.fn = adam_chunk, .arg = task, .n = task->n, .chunk = ZT_CPU_ADAM_CHUNK};
  return zt_cpu_pool_submit(pool, &task->job);
}

void zt_cpu_adam_wait(zt_cpu_pool *pool, zt_cpu_adam_task *task) { zt_cpu_pool_wait(pool, &task->job); }

int zt_cpu_adam_step(zt_cpu_pool *pool, zt_cpu_adam_task *task) {
  int rc = zt_cpu_adam_submit(pool, task);
  if (rc < 0) return rc;
  zt_cpu_adam_wait(pool, task);
  return 0;
}
