/* Offload for a job of several ranks (engine/train/dp/dp.h "Offload"): the spec's "offload" object
 * checked and resolved into each rank's placement at admission by the planner
 * (engine/plan/dp_plan.h, zt_dp_plan_resolve), so that the stored spec says what runs and a
 * restart runs the same; and the spec as a data-parallel trainer's configuration. */
#include "engine/job/spec.h"
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

int zt__job_resolve_dp_offload(zt_job_spec *s, const zt_ops *ops, char *err, size_t errlen) {
  if (!s->has_offload || zt__job_world(s) == 1) return 0;
  char ranks[96];
  int no_offload;
  zt__job_ranks_text(s, ranks, sizeof ranks);
  int rc = zt_dp_plan_resolve(&s->model, &s->train, &s->offload, zt__job_world(s), s->zero_stage,
                              ranks, ops, &no_offload, err, errlen);
  /* the stored spec says what runs */
  if (rc == 0 && no_offload) s->has_offload = 0;
  return rc;
}
