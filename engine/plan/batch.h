/* defines: the split of a step's tokens into micro-batches (train.batch_tokens, docs/spec.md):
 * the candidates admission sizes (engine/job/admission.c) and the cost model's time of a step
 * kept on the device, which ranks them where no offloaded plan gives its own. */
#ifndef ZT_PLAN_BATCH_H
#define ZT_PLAN_BATCH_H

#include <stddef.h>
#include <stdint.h>
#include "engine/model/model.h"
#include "engine/plan/recipe.h"

/* The most micro_batch candidates a step's tokens give (the divisors of a count of rows). */
#define ZT_BATCH_MAX_SPLITS 256

/* The micro_batch values m, largest first, with m × grad_accum × ranks × seq_len = batch_tokens
 * for a whole grad_accum (tc's micro_batch or grad_accum kept where not ZT_BATCH_AUTO, both
 * within ZT_TRAIN_MAX_BATCH). A count >= 1, or -EINVAL naming the fields and the nearest
 * batch_tokens that split. */
int zt_batch_splits(const zt_train_cfg *tc, int ranks, int seq_len, int *micro, int max,
                    char *err, size_t errlen);
/* The cost model's step time of the job on the device (no offload; engine/base/tunables.h's
 * rates): the compute of grad_accum micro-batches, a third more for the recomputed blocks. */
double zt_batch_step_s(const zt_model *m, const zt_train_cfg *tc);

#endif
