/* defines: what the offloaded trainer's tests share: the open by a plan made first, a run of
 * steps, the smallest device budget that streams. Called by test_offload_train.c,
 * test_offload_state16.c and test_delayed_update.c. */
#ifndef ZT_TESTS_OTRAIN_H
#define ZT_TESTS_OTRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "engine/kernels/backend.h"
#include "engine/train/offload/offload.h"
#include "engine/train/trainer.h"

/* zt_trainer_open_offload of the plan zt_offload_plan_make gives; an order left auto (0) is
 * `order` (the tests' "unit" argument). */
int ot_open(zt_trainer **t, const zt_model_cfg *mc, const zt_train_cfg *tc,
            const zt_offload_cfg *oc, const zt_backend *be, zt_offload_order order, char *err,
            size_t errlen);
/* Steps [from, to) of the token batches tok (per tokens each) into res; 1 (reported, naming
 * `what`) on the first that fails. */
int ot_run(zt_trainer *t, const int32_t *tok, size_t per, int from, int to, zt_step_result *res,
           const char *what);
/* The smallest gpu_budget that opens with the parameters streamed (0: none does). The device
 * needs the same whatever the optimizer's homes, so the search runs with it on the host (no
 * files to create per try). */
size_t ot_min_budget(const zt_model_cfg *mc, const zt_train_cfg *tc, zt_offload_cfg oc,
                     const zt_backend *be, zt_offload_order order);

#endif
