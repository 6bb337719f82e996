/* CPU AdamW for host-resident optimizer state: the same operations, in the same order, as the
 * reference kernel engine/kernels/cpu/adamw.c (torch.optim.AdamW, single-tensor path), so an
 * offloaded step gives bitwise the same parameters as one on the CPU backend. The AVX2 and
 * AVX-512 paths use only correctly rounded IEEE operations (mul, add, sub, div, sqrt; never a
 * fused multiply-add), so they too are bitwise equal to the scalar path.
 *
 * Optionally the updated parameters are also written as bf16 (round to nearest even, NaN to
 * 0x7fc0 like torch) or fp16 (IEEE half: round to nearest even, overflow to inf, subnormals
 * exact, NaN to the quiet NaN of its sign; the bits of the CPU backend's cast,
 * engine/kernels/dtype.h, and of torch's .half(), whose scalar path writes NaN so too), the
 * compute-precision copy that goes back to the GPU.
 *
 * The bf16-moment variant (train.optimizer.state_dtype "bf16", zt_cpu_adam_run_bf16): m and v
 * stored as bf16, each widened exactly to fp32, updated as above, and stored rounded
 * stochastically with the counter bits of (seed, step, flat index) (engine/kernels/sround.h),
 * bit for bit the CPU backend's adamw_sr; the SIMD paths hash 8 or 16 indices at once in 64-bit
 * integer lanes, the same bits. */
#ifndef ZT_OFFLOAD_CPU_ADAM_H
#define ZT_OFFLOAD_CPU_ADAM_H

#include <stddef.h>
#include <stdint.h>

#include "engine/kernels/dtype.h"
#include "offload/cpu_pool.h"

/* Parameters a chunk of one worker covers: 64 Ki params move 2 MiB, large enough to hide the
 * hand-off, small enough to balance a few threads over one unit's tensors. */
#define ZT_CPU_ADAM_CHUNK 65536u

typedef enum zt_cpu_isa {
  ZT_CPU_ISA_AUTO = 0, /* the best this CPU supports */
  ZT_CPU_ISA_SCALAR,
  ZT_CPU_ISA_AVX2,   /* with F16C for the fp16 copy (every AVX2 CPU has it) */
  ZT_CPU_ISA_AVX512,
} zt_cpu_isa;

/* 1 when this build and this CPU can run isa (AUTO and SCALAR always). */
int zt_cpu_isa_supported(zt_cpu_isa isa);
zt_cpu_isa zt_cpu_isa_best(void);
const char *zt_cpu_isa_name(zt_cpu_isa isa);

typedef struct zt_adam_hparams {
  float lr, beta1, beta2, eps, weight_decay;
  int step; /* >= 1 */
  float grad_scale;
  uint64_t seed; /* bf16 moments: the rounding's seed (train.seed); unused with fp32 ones */
} zt_adam_hparams;

/* The step's scalars as the reference computes them: in double, rounded to float once. */
typedef struct zt_adam_consts {
  float decay;         /* 1 - lr * wd */
  float w1;            /* 1 - beta1, the lerp weight */
  float one_minus_w1;  /* 1 - w1 in float, for the w1 >= 0.5 branch of torch's lerp */
  float w2;            /* 1 - beta2 */
  float beta2;
  float eps;
  float neg_step_size; /* -lr / (1 - beta1^t) */
  float bc2_sqrt;      /* sqrt(1 - beta2^t) */
  float grad_scale;
  uint64_t sr_key;     /* bf16 moments: zt_sr_key(seed, step) */
} zt_adam_consts;

void zt_adam_consts_init(zt_adam_consts *c, const zt_adam_hparams *h);

/* One AdamW step over n params on the calling thread with the given ISA; p_bf16 and p_fp16
 * (the compute copies to write) may each be NULL. -ENOTSUP when the ISA is not available. */
int zt_cpu_adam_run(zt_cpu_isa isa, const zt_adam_hparams *h, float *p, const float *g, float *m,
                    float *v, uint16_t *p_bf16, uint16_t *p_fp16, size_t n);
/* The same with bf16 m and v; index0: element 0's index in the model's flat parameter vector,
 * which with h->seed and h->step picks the rounding bits of each element. */
int zt_cpu_adam_run_bf16(zt_cpu_isa isa, const zt_adam_hparams *h, float *p, const float *g,
                         uint16_t *m, uint16_t *v, uint16_t *p_bf16, uint16_t *p_fp16, size_t n,
                         uint64_t index0);

/* A step over one tensor on a pool. Fill the public fields, submit, wait before touching the
 * arrays; the task must live until then. */
typedef struct zt_cpu_adam_task {
  float *p;
  const float *g;
  void *m, *v;      /* float, or uint16_t with state ZT_BF16 */
  zt_dtype state;   /* m and v's type: ZT_F32 (0, the default) or ZT_BF16 */
  uint64_t index0;  /* bf16 moments: element 0's flat index (zt_cpu_adam_run_bf16) */
  uint16_t *p_bf16; /* NULL: no bf16 copy */
  uint16_t *p_fp16; /* NULL: no fp16 copy */
  size_t n;
  zt_adam_hparams h;
  zt_cpu_isa isa; /* AUTO is replaced at submit by the ISA that runs */
  /* private */
  zt_adam_consts c;
  zt_cpu_job job;
} zt_cpu_adam_task;

/* -ENOTSUP when task->isa is not available, -EINVAL for step < 1 or a state neither fp32 nor
 * bf16. */
int zt_cpu_adam_submit(zt_cpu_pool *pool, zt_cpu_adam_task *task);
void zt_cpu_adam_wait(zt_cpu_pool *pool, zt_cpu_adam_task *task);
/* submit + wait */
int zt_cpu_adam_step(zt_cpu_pool *pool, zt_cpu_adam_task *task);

#endif
