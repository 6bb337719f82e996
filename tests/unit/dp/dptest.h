/* Shared by the data-parallel trainer tests (test_dp_train, test_dp_parts): the model and recipe
 * they train, the ranks of a CPU communicator group, their tokens, the trainers they open and a
 * model whose every gradient is nan. Setup that fails exits the test (1). */
#ifndef ZT_TESTS_DP_DPTEST_H
#define ZT_TESTS_DP_DPTEST_H

#include <stddef.h>
#include <stdint.h>

#include "engine/comm/comm.h"
#include "engine/train/dp/dp.h"

#define DPT_STEPS 5 /* the steps of every run */
#define DPT_MAXW 4  /* the largest group a test opens */

/* V 37, T 16, C 32, NH 4, L 2 (d_ff 64 for the encoder), init seed 7. */
zt_model_cfg dpt_model_cfg(zt_arch arch);
/* DPT_STEPS steps of micro-batch 2, AdamW lr 1e-2 with weight decay, cosine to 1e-4 after 2
 * warmup steps. */
zt_train_cfg dpt_train_cfg(int grad_accum, float clip, zt_dtype dt);

/* The W ranks a data-parallel trainer is given: a CPU backend of one thread each and the
 * group's communicators. */
typedef struct dpt_ranks {
  int W;
  zt_comm_cpu_group *g;
  zt_dp_rank r[DPT_MAXW];
} dpt_ranks;

void dpt_ranks_open(dpt_ranks *x, int W);
void dpt_ranks_close(dpt_ranks *x);

/* The tokens of one step of `micros` micro-batches. */
size_t dpt_step_tokens(const zt_model_cfg *mc, int micros);
/* DPT_STEPS such steps (malloc'd), drawn from seed. */
int32_t *dpt_tokens(const zt_model_cfg *mc, int micros, uint64_t seed);

/* What a run of steps reports, per step. */
typedef struct dpt_run {
  double loss[DPT_STEPS], norm[DPT_STEPS];
} dpt_run;

/* Steps from .. to - 1 of tok (`per` tokens each) into o; 1 (with a message) if one fails. */
int dpt_run_steps(zt_trainer *t, const int32_t *tok, size_t per, int from, int to, dpt_run *o,
                  const char *what);

/* t's params, m and v back to back (malloc'd, 3 * the parameters floats). */
float *dpt_state_of(zt_trainer *t);

zt_trainer *dpt_open_plain(const zt_model_cfg *mc, const zt_train_cfg *tc, zt_backend *be);
/* dc's ranks of x (dc->world must be x->W). */
zt_trainer *dpt_open_dp_cfg(const zt_model_cfg *mc, const zt_train_cfg *tc, dpt_ranks *x,
                            const zt_dp_cfg *dc);
/* Ranks rank0 .. rank0 + local - 1 of x (local 0: all of them). */
zt_trainer *dpt_open_dp(const zt_model_cfg *mc, const zt_train_cfg *tc, dpt_ranks *x, int stage,
                        int rank0, int local);

/* mc's initial parameters with one made nan (its index in *nan_at unless NULL), written to
 * dir/init.safetensors, which becomes mc's init: every gradient of a step from them is nan.
 * Returns the parameters (malloc'd); a failed write adds to *fails. */
float *dpt_nan_init(zt_model_cfg *mc, const char *dir, size_t *nan_at, int *fails);

#endif
