/* defines: the reply of a `plan` request (docs/protocol.md "plan"): an admitted spec's sizes,
 * its batch split, its parallel layout and its offload placement (a single rank's as plan.json
 * holds it, or each rank's). Called by admission.c on the worker. */
#include <stdio.h>

#include "engine/job/internal.h"
#include "engine/kernels/backend.h"
#include "engine/plan/plan_file.h"
#include "engine/plan/rates.h"

json_t *zt__job_plan_reply(const zt_jobs_config *cfg, const zt_job_spec *sp,
                          const zt__job_needs *nd, int *rc, char *err, size_t errlen) {
  zt_model *m = NULL;
  if ((*rc = zt_model_create(&m, &sp->model, err, errlen)) < 0) return NULL;
  json_t *ranks = json_array();
  for (int i = 0; ranks && i < zt__job_world(sp); i++)
    if (json_array_append_new(ranks, json_integer((json_int_t)nd->rank_bytes)) < 0) {
      json_decref(ranks);
      ranks = NULL;
    }
  json_t *j = ranks ? json_pack("{s:s, s:s, s:I, s:I, s:{s:i, s:i, s:o}}", "backend",
                                cfg->backend, "arch", zt_arch_name(sp->model.arch),
                                "params", (json_int_t)zt_model_num_params(m), "backend_bytes",
                                (json_int_t)nd->backend_bytes, "parallel", "gpus", sp->gpus,
                                "zero_stage", sp->zero_stage, "rank_bytes", ranks)
                    : NULL;
  json_t *par = json_object_get(j, "parallel");
  if (par) json_object_set_new(par, "world", json_integer(zt__job_world(sp)));
  if (j) json_object_set_new(j, "rates", json_string(zt_plan_rates_active()->name));
  /* the host memory it takes while it runs, the packed documents' tables in it */
  if (j) json_object_set_new(j, "host_bytes", json_integer((json_int_t)nd->host_bytes));
  if (j) json_object_set_new(j, "data_table_bytes", json_integer((json_int_t)sp->data_bytes));
  /* the steps, train.epochs' as resolved */
  if (j) json_object_set_new(j, "steps", json_integer(sp->train.steps));
  if (j && sp->train.epochs) json_object_set_new(j, "epochs", json_integer(sp->train.epochs));
  /* the step's split, the planner's where train.batch_tokens left it open */
  if (j)
    json_object_set_new(
        j, "batch",
        json_pack("{s:i, s:i, s:I}", "micro_batch", sp->train.micro_batch, "grad_accum",
                  sp->train.grad_accum, "tokens",
                  (json_int_t)sp->train.micro_batch * sp->train.grad_accum *
                      zt__job_world(sp) * sp->model.seq_len));
  if (par && sp->n_peers) {
    json_t *peers = json_array();
    for (int i = 0; peers && i < sp->n_peers; i++)
      json_array_append_new(peers, json_string(sp->peers[i]));
    json_object_set_new(par, "peers", peers);
  }
  int units = zt_model_num_units(m);
  zt_model_destroy(m);
  zt_offload_plan p = zt_offload_plan_summary(&nd->plan);
  if (j && sp->has_offload && zt__job_world(sp) > 1) {
    /* each rank's placement as resolved (engine/job/dp_placement.c) */
    zt_train_cfg tc = zt__job_rank_train_cfg(sp);
    zt_dp_cfg dc = zt__job_dp_cfg(sp, 0, 0);
    json_object_set_new(
        j, "offload",
        json_pack("{s:s, s:s, s:i, s:i, s:i, s:I, s:I, s:I}", "optimizer",
                  zt_offload_place_name(dc.optimizer), "params",
                  zt_offload_place_name(dc.params), "units", units, "gpu_units",
                  dc.optimizer == ZT_PLACE_HOST || dc.optimizer == ZT_PLACE_NVME ? dc.gpu_units
                                                                                 : units,
                  "ckpt_every", tc.ckpt_every, "host_bytes_per_rank",
                  (json_int_t)zt_dp_estimate_host_bytes(&sp->model, &tc, &dc),
                  "device_bytes_per_rank", (json_int_t)nd->rank_bytes, "nvme_bytes_per_rank",
                  (json_int_t)zt_dp_estimate_nvme_bytes(&sp->model, &tc, &dc)));
    /* the walk's order as the ranks run it (engine/train/dp/dp.h "Unit-major") */
    json_t *off = json_object_get(j, "offload");
    int um = dc.order == ZT_ORDER_UNIT && tc.grad_accum > 1 &&
             tc.grad_accum <= ZT_UNIT_MAJOR_MICROS_MAX;
    if (off) json_object_set_new(off, "order", json_string(um ? "unit" : "micro"));
  } else if (j && nd->has_plan) {
    /* the plan the job would store as plan.json, and its figures */
    json_object_set_new(j, "plan", zt_offload_plan_to_json(&nd->plan));
    json_object_set_new(
        j, "offload",
        json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:i, s:i, s:i, s:i, s:i, s:s, s:s, s:I, s:f, "
                  "s:I, s:I, s:I}",
                  "host_bytes",
                  (json_int_t)p.host_bytes, "device_bytes", (json_int_t)p.device_bytes,
                  "nvme_bytes", (json_int_t)p.nvme_bytes, "act_bytes", (json_int_t)p.act_bytes,
                  "gpu_unit_bytes", (json_int_t)p.gpu_unit_bytes, "arena_bytes",
                  (json_int_t)p.arena_bytes, "units", p.units, "gpu_units", p.gpu_units,
                  "host_units", p.host_units, "grad_slots", p.grad_slots,
                  "ckpt_every", p.ckpt_every, "params", zt_offload_place_name(p.params),
                  "grads", zt_offload_place_name(p.grads), "dsum_bytes", (json_int_t)p.dsum_bytes,
                  "est_step_s", p.est.step_s, "h2d_bytes", (json_int_t)p.h2d_bytes,
                  "d2h_bytes", (json_int_t)p.d2h_bytes, "nvme_step_bytes",
                  (json_int_t)p.nvme_step_bytes));
  }
  json_t *off = j && zt__job_world(sp) == 1 ? json_object_get(j, "offload") : NULL;
  if (off) {
    json_object_set_new(off, "order", json_string(p.unit_major ? "unit" : "micro"));
    /* the cost model's busy time of each queue in that step: what bounds it */
    json_object_set_new(off, "est", json_pack("{s:f, s:f, s:f, s:f, s:f, s:f}", "compute_s",
                                              p.est.compute_s, "h2d_s", p.est.h2d_s, "d2h_s",
                                              p.est.d2h_s, "adam_s", p.est.adam_s, "nvme_s",
                                              p.est.nvme_s, "runner_s", p.est.runner_s));
  }
  if (!j) {
    *rc = -ENOMEM;
    snprintf(err, errlen, "out of memory");
  }
  return j;
}
