/* defines: zt_plan_auto_ckpt, "activation_checkpointing": {"every": "auto"} where the offload
 * planner does not decide it (a job without offload, or of several ranks with no gpu_budget):
 * the order the choices are tried in and when to stop (called by engine/job's admission, which
 * says what fits this daemon). The offloaded plan decides it in its own search
 * (engine/plan/offload_plan.h). */
#ifndef ZT_PLAN_AUTO_CKPT_H
#define ZT_PLAN_AUTO_CKPT_H

#include <stddef.h>

/* Whether checkpointing every `every` blocks (0: none) fits: 0, -ENOMEM where it does not
 * (the next choice is tried), any other -errno stops the search. */
typedef int (*zt_plan_ckpt_fits)(void *ctx, int every, char *err, size_t errlen);

/* The least recompute that fits a model of n_layers blocks: no checkpointing first, then the
 * fewest blocks recomputed (every L recomputes 1, every L-1 2, ... every 1 all L). Returns the
 * first `every` that fits (the last fits call was its), else the refusal of fits for every
 * block recomputed, or the first error other than -ENOMEM. */
int zt_plan_auto_ckpt(int n_layers, zt_plan_ckpt_fits fits, void *ctx, char *err,
                      size_t errlen);

#endif
