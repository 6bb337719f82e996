/* defines: a plan request's target (docs/protocol.md "plan"), the machine a spec is planned for
 * instead of this daemon's: the view of limits a ztd started with those flags has (its backend,
 * GPUs, --gpu-mem-limit, --host-mem-limit), the free disk assumed for its NVMe tier and
 * checkpoints, and the cost model's rates. Parsed on the loop thread (nothing is read: a rates
 * file comes inline); called by admission.c. */
#ifndef ZT_JOB_TARGET_H
#define ZT_JOB_TARGET_H

#include <stddef.h>
#include <jansson.h>
#include "engine/job/jobs.h"
#include "engine/plan/rates.h"

typedef struct zt__job_target {
  zt_jobs_config cfg;  /* this daemon's, with the target's backend, devices, limits, disk */
  zt_plan_rates rates;
} zt__job_target;

/* {"backend": "cpu" | "cuda", "gpus": N (default 1), "gpu_mem_limit": size (required for
 * cuda), "host_mem_limit": size, "nvme_bytes"?: size, "rates"?: "default" | "h200" | {a rates
 * file's fields}} over own (this daemon's config: its directories stay the ones the spec's
 * files are checked against). Sizes as ztd's flags take them ("24GiB") or byte counts. 0, or
 * -EINVAL naming the field ("target.gpu_mem_limit ..."). */
int zt__job_target_parse(const json_t *j, const zt_jobs_config *own, zt__job_target *out,
                         char *err, size_t errlen);
/* The target as planned for, every default written out (sizes in bytes, rates by name), for
 * the plan's reply. NULL: out of memory. */
json_t *zt__job_target_json(const zt__job_target *t);

#endif
