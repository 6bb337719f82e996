/* defines: plan.json, the stored plan of a single-rank offloaded job: zt_offload_plan_to_json,
 * zt_offload_plan_from_json, zt_offload_plan_describe (called by engine/job's store at
 * admission and at a start, its start check's log, tests). The record holds the choices auto
 * leaves open, the budgets they were made under and the estimate (what they came to when the
 * plan was made); zt_offload_plan_check recomputes every size from the choices.
 * docs/offload.md "The stored plan" lists the fields. */
#ifndef ZT_PLAN_PLAN_FILE_H
#define ZT_PLAN_PLAN_FILE_H

#include <jansson.h>
#include <stddef.h>
#include "engine/plan/offload_plan.h"

#define ZT_PLAN_FILE_VERSION 1

/* NULL: out of memory. */
json_t *zt_offload_plan_to_json(const zt_offload_placement *p);
/* The choices, budgets and estimate of a record into out (the estimate's figures in their
 * fields, the other sizes zero until zt_offload_plan_check): 0, or -EINVAL naming the field
 * that is missing, of the wrong type or out of range, or unknown. */
int zt_offload_plan_from_json(const json_t *j, zt_offload_placement *out, char *err,
                              size_t errlen);
/* The plan in a line, for a job's log: "ckpt_every 0, params host, ...: device 1.2 MiB, ...". */
void zt_offload_plan_describe(const zt_offload_placement *p, char *out, size_t outlen);

#endif
