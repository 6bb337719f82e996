/* Offload for a job of several ranks (engine/train/dp/dp.h "Offload"): the spec's "offload" object
 * checked and resolved into each rank's placement at admission by the planner
 * (engine/plan/dp_plan.h), so that the stored spec says what runs and a restart runs the same;
 * and the spec as a data-parallel trainer's configuration. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "engine/base/sizes.h"
#include "engine/job/spec.h"
#include "engine/model/model.h"
#include "engine/plan/dp_plan.h"

zt_dp_cfg zt__job_dp_cfg(const zt_job_spec *s, int rank0, int local) {
  zt_dp_cfg d = {.world = zt__job_world(s), .zero_stage = s->zero_stage, .rank0 = rank0,
                 .local = local};
  if (s->has_offload) {
    d.optimizer = s->offload.optimizer;
    d.params = s->offload.params;
    d.gpu_units = s->offload.gpu_units < 0 ? 0 : s->offload.gpu_units;
    /* with optimizer nvme the units after the device ones keeping theirs on the host (resolved
     * at admission: an optimizer other than nvme has none) */
    if (d.optimizer == ZT_PLACE_NVME && s->offload.host_units > 0)
      d.host_units = s->offload.host_units;
    d.nvme_dir = s->offload.nvme_dir;
    d.order = s->offload.order;
  }
  return d;
}

/* gpu_units, params, checkpointing and (auto) offload.order: what the budget (if any) holds,
 * fastest first (engine/plan/dp_plan.h), and the job without offload where everything fits on
 * the device. */
static int resolve_placement(zt_job_spec *s, const zt_model *m, const zt_ops *ops, char *err,
                             size_t errlen) {
  zt_offload_cfg *o = &s->offload;
  zt_dp_plan_least least;
  int no_offload;
  int rc = zt_dp_plan_place(m, &s->train, o, zt__job_world(s), s->zero_stage, ops, &no_offload,
                            &least);
  if (rc == 0) {
    /* the stored spec says what runs */
    if (no_offload) s->has_offload = 0;
    return 0;
  }
  char ranks[96], a[32], b[32];
  zt__job_ranks_text(s, ranks, sizeof ranks);
  zt_size_format(a, sizeof a, (double)least.bytes);
  zt_size_format(b, sizeof b, (double)o->gpu_budget);
  snprintf(err, errlen, "offload.gpu_budget %s per GPU is too small for %s: with the optimizer "
           "of %d unit(s) on the GPU and the rest's on the %s, the parameters %s%s a rank "
           "needs %s", b, ranks, o->gpu_units > 0 ? o->gpu_units : 0,
           o->optimizer == ZT_PLACE_NVME ? "NVMe" : "host",
           least.params == ZT_PLACE_NVME   ? "in NVMe files"
           : least.params == ZT_PLACE_HOST ? "on the host"
                                           : "on the GPU",
           least.ckpt_every == 1 ? " and every block recomputed" : "", a);
  return rc;
}

int zt__job_resolve_dp_offload(zt_job_spec *s, const zt_ops *ops, char *err, size_t errlen) {
  zt_offload_cfg *o = &s->offload;
  int W = zt__job_world(s);
  if (!s->has_offload || W == 1) return 0;
  char ranks[96];
  zt__job_ranks_text(s, ranks, sizeof ranks);
  if (o->delayed_update) {
    snprintf(err, errlen, "offload.delayed_update with %s is not supported (only the offloaded "
             "step of one rank delays its update)", ranks);
    return -ENOTSUP;
  }
  if (o->order == ZT_ORDER_UNIT && s->train.grad_accum > ZT_UNIT_MAJOR_MICROS_MAX) {
    snprintf(err, errlen, "offload.order: unit walks at most %d micro-batches at once "
             "(train.grad_accum is %d)", ZT_UNIT_MAJOR_MICROS_MAX, s->train.grad_accum);
    return -EINVAL;
  }
  if (o->grads == ZT_PLACE_GPU) {
    snprintf(err, errlen, "offload.grads gpu with %s is not supported (the ranks reduce their "
             "gradients where their placement puts them, engine/train/dp/dp.h); use auto", ranks);
    return -ENOTSUP;
  }
  /* each rank reads its chunks of the parameters from its master files (engine/train/dp/dp.h):
   * stage 3's chunks, optimizer nvme's files */
  if (o->params == ZT_PLACE_NVME &&
      (s->zero_stage != 3 || o->optimizer != ZT_PLACE_NVME)) {
    snprintf(err, errlen, "offload.params: nvme with %s needs parallel.zero_stage 3 and "
             "offload.optimizer nvme (each rank reads its chunks of the parameters from its "
             "optimizer's master files) (got zero_stage %d, optimizer %s)", ranks,
             s->zero_stage, zt_offload_place_name(o->optimizer));
    return -EINVAL;
  }
  if (o->params == ZT_PLACE_HOST && s->zero_stage != 3) {
    snprintf(err, errlen, "offload.params: host with %s needs parallel.zero_stage 3 (stages 1-2 "
             "keep every unit's parameters on every GPU)", ranks);
    return -EINVAL;
  }
  zt_model *m;
  int rc = zt_model_create(&m, &s->model, err, errlen);
  if (rc < 0) return rc;
  int units = zt_model_num_units(m);
  if (o->gpu_units > units) {
    snprintf(err, errlen, "offload.gpu_units must be in [0, %d] (the model's units) (got %d)",
             units, o->gpu_units);
    rc = -EINVAL;
    goto out;
  }
  /* the host / NVMe split of the units the device does not keep is nvme's (a rank's device
   * bytes do not depend on it, so gpu_units is resolved as without it, then checked) */
  if (o->host_units >= 0 && o->optimizer != ZT_PLACE_NVME) {
    snprintf(err, errlen, "offload.host_units with %s needs offload.optimizer nvme (the units "
             "after the host ones keep their optimizer on NVMe) (got optimizer %s)", ranks,
             zt_offload_place_name(o->optimizer));
    rc = -ENOTSUP;
    goto out;
  }
  if ((rc = resolve_placement(s, m, ops, err, errlen)) < 0) goto out;
  if (s->has_offload && o->host_units > units - o->gpu_units) {
    snprintf(err, errlen, "offload.host_units is %d; after %d unit(s) on the device the model "
             "has %d", o->host_units, o->gpu_units, units - o->gpu_units);
    rc = -EINVAL;
  }
out:
  zt_model_destroy(m);
  return rc;
}
