/* A plan request's target (engine/job/target.h). */
#include "engine/job/target.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "engine/base/json_field.h"

#define TARGET_MAX_BYTES ((uint64_t)1 << 60)

static const char *const k_keys[] = {"backend",   "gpus",  "gpu_mem_limit", "host_mem_limit",
                                     "nvme_bytes", "rates", NULL};

static int parse_rates(const json_t *v, zt_plan_rates *out, char *err, size_t errlen) {
  char why[256];
  if (!v) return zt_plan_rates_named("default", out, err, errlen);
  if (json_is_object(v))
    return zt_plan_rates_from_json(v, "target.rates", "inline", out, err, errlen);
  if (!json_is_string(v)) {
    snprintf(err, errlen, "target.rates must be the name of a built-in set (default, h200) or "
             "an object of a rates file's fields (docs/offload.md \"Rates\")");
    return -EINVAL;
  }
  if (zt_plan_rates_named(json_string_value(v), out, why, sizeof why) == 0) return 0;
  snprintf(err, errlen, "target.rates: %s", why);
  return -EINVAL;
}

int zt__job_target_parse(const json_t *j, const zt_jobs_config *own, zt__job_target *out,
                         char *err, size_t errlen) {
  const char *backend;
  int gpus, rc;
  uint64_t gpu_mem, host_mem, nvme;
  if (!json_is_object(j)) {
    snprintf(err, errlen, "target must be an object (the machine to plan for)");
    return -EINVAL;
  }
  if ((rc = zt_json_check_keys(j, "target", k_keys, err, errlen)) < 0 ||
      (rc = zt_json_get_string(j, "target", "backend", NULL, &backend, err, errlen)) < 0)
    return rc;
  int cuda = !strcmp(backend, "cuda");
  if (!cuda && strcmp(backend, "cpu") != 0) {
    snprintf(err, errlen, "target.backend must be \"cpu\" or \"cuda\"");
    return -EINVAL;
  }
  if ((rc = zt_json_get_int32(j, "target", "gpus", 0, 1, ZT_JOBS_MAX_GPUS, 1, &gpus, err,
                              errlen)) < 0 ||
      (rc = zt_json_get_size(j, "target", "gpu_mem_limit", 0, &gpu_mem, err, errlen)) < 0 ||
      (rc = zt_json_get_size(j, "target", "host_mem_limit", 0, &host_mem, err, errlen)) < 0 ||
      (rc = zt_json_get_size(j, "target", "nvme_bytes", 0, &nvme, err, errlen)) < 0)
    return rc;
  /* a size given is a machine's: not 0 bytes (ztd's flags refuse 0), nor past what the reply's
   * integers hold */
  static const char *const sized[] = {"gpu_mem_limit", "host_mem_limit", "nvme_bytes"};
  const uint64_t given[] = {gpu_mem, host_mem, nvme};
  for (int i = 0; i < 3; i++)
    if (json_object_get(j, sized[i]) && (!given[i] || given[i] > TARGET_MAX_BYTES)) {
      snprintf(err, errlen, "target.%s must be more than 0 bytes and at most 1 EiB", sized[i]);
      return -EINVAL;
    }
  /* nothing of this machine stands in for the target's: there is no device or RAM to ask */
  if (cuda && !gpu_mem) {
    snprintf(err, errlen, "target.gpu_mem_limit is required with target.backend \"cuda\" (each "
             "GPU's memory, e.g. \"24GiB\")");
    return -EINVAL;
  }
  if (!host_mem) {
    snprintf(err, errlen, "target.host_mem_limit is required (the target's host memory for "
             "jobs, e.g. \"64GiB\")");
    return -EINVAL;
  }
  if ((rc = parse_rates(json_object_get(j, "rates"), &out->rates, err, errlen)) < 0) return rc;
  zt_jobs_config *c = &out->cfg;
  *c = *own;
  c->backend = cuda ? "cuda" : "cpu";
  memset(c->gpus, 0, sizeof c->gpus);
  for (int i = 0; cuda && i < gpus; i++) c->gpus[i] = i;
  c->n_gpus = cuda ? gpus : 0;
  c->cpu_ranks = cuda ? 0 : gpus;
  c->gpu_mem_limit = gpu_mem;
  c->host_mem_limit = host_mem;
  /* this daemon's --nvme-dir is not the target's: a spec names its offload.nvme_dir */
  c->nvme_dir = NULL;
  c->described = 1;
  c->disk_bytes = nvme;
  return 0;
}

json_t *zt__job_target_json(const zt__job_target *t) {
  const zt_jobs_config *c = &t->cfg;
  json_t *j = json_pack("{s:s, s:i, s:I, s:s}", "backend", c->backend, "gpus",
                        c->n_gpus ? c->n_gpus : c->cpu_ranks, "host_mem_limit",
                        (json_int_t)c->host_mem_limit, "rates", t->rates.name);
  if (j && c->gpu_mem_limit)
    json_object_set_new(j, "gpu_mem_limit", json_integer((json_int_t)c->gpu_mem_limit));
  if (j && c->disk_bytes)
    json_object_set_new(j, "nvme_bytes", json_integer((json_int_t)c->disk_bytes));
  return j;
}
