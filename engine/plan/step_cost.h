/* defines: the cost model of the single-rank offloaded step: a plan's step time, found by
 * playing the step's walk unit by unit on five queues (the device's compute, the two copy
 * directions, the CPU AdamW pool, the NVMe tier) and the runner thread that feeds them, with
 * the waits the walk makes (engine/train/offload/step.c): a fetch waits for a free slot and, after
 * an update, for that unit's new parameters; a backward's write-back for its compute; an update
 * for its gradients, or with clipping for the whole backward and the norm. Used by the planner
 * (engine/plan/offload_plan.c) to rank plans and to state their step; the rates are
 * engine/plan/rates.h's. */
#ifndef ZT_PLAN_STEP_COST_H
#define ZT_PLAN_STEP_COST_H

#include "engine/model/model.h"
#include "engine/plan/offload_plan.h"
#include "engine/plan/recipe.h"

/* The step time of placement p (its sizes computed) for model m trained by tc, the streamer
 * prefetching `prefetch` units ahead (offload.prefetch). */
void zt_plan_step_cost(const zt_model *m, const zt_train_cfg *tc, const zt_offload_placement *p,
                       int prefetch, zt_step_cost *out);

#endif
