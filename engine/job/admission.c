/* defines: admission, on the loop thread: zt_jobs_submit, zt_jobs_plan and zt_jobs_join
 * (jobs.h; called by engine/server). A spec is filled with the operator's defaults, parsed and
 * sized against this daemon's backend and limits (auto activation checkpointing resolved
 * here), and a new job gets its directory with the stored spec. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include "engine/job/internal.h"
#include "engine/job/store.h"
#include "engine/kernels/backend.h"

/* "activation_checkpointing": {"every": "auto"} without offload (or with several ranks and no
 * gpu_budget): the least recompute that fits the device (the offload planner decides it with
 * its plan otherwise). No checkpointing first,
 * then the fewest blocks recomputed (every L blocks recomputes 1, every L-1 2, ... every 1 all
 * L); the job is refused with the numbers of every block recomputed when even that does not
 * fit. The stored spec records the choice, so a restart runs the same. */
static int resolve_auto_ckpt(zt_jobs *jobs, zt_job_spec *spec, zt__job_needs *needs, char *err,
                             size_t errlen) {
  int L = spec->model.n_layers, rc = 0;
  for (int i = 0; i <= L; i++) {
    spec->train.ckpt_every = i == 0 ? 0 : L + 1 - i;
    rc = zt__job_spec_check_resources(spec, &jobs->cfg, needs, err, errlen);
    if (rc != -ENOMEM) return rc;
  }
  return rc;
}

/* What submit and plan share: the operator's defaults filled in, the spec validated and sized
 * against this daemon's backend and limits. */
static int admit(zt_jobs *jobs, const json_t *spec_in, zt_job_spec *spec, zt__job_needs *needs,
                 char *err, size_t errlen) {
  /* The operator's --nvme-dir is where an offloaded job keeps its NVMe tier unless the spec
   * names a directory; the stored spec records the one used. */
  json_t *filled = NULL;
  const json_t *off = json_is_object(spec_in) ? json_object_get(spec_in, "offload") : NULL;
  if (jobs->cfg.nvme_dir && json_is_object(off) && !json_object_get(off, "nvme_dir")) {
    filled = json_deep_copy(spec_in);
    if (!filled) {
      snprintf(err, errlen, "out of memory");
      return -ENOMEM;
    }
    json_object_set_new(json_object_get(filled, "offload"), "nvme_dir",
                        json_string(jobs->cfg.nvme_dir));
    spec_in = filled;
  }
  int rc = zt__job_spec_parse(spec_in, spec, err, errlen);
  json_decref(filled);
  if (rc < 0) return rc;
  /* the stored spec records the count, so that a restart resumes the same split of the data */
  if (spec->gpus == ZT_JOB_GPUS_ALL) spec->gpus = jobs->n_dev;
  if ((rc = zt__job_resolve_dp_offload(spec, zt_backend_ops_of(jobs->cfg.backend), err,
                                       errlen)) < 0)
    return rc;
  /* an offloaded job of one rank has it from its planner, of several from its gpu_budget
   * (zt__job_resolve_dp_offload) */
  if ((!spec->has_offload || zt__job_world(spec) > 1) && spec->train.ckpt_every == ZT_CKPT_AUTO)
    return resolve_auto_ckpt(jobs, spec, needs, err, errlen);
  return zt__job_spec_check_resources(spec, &jobs->cfg, needs, err, errlen);
}

json_t *zt_jobs_plan(zt_jobs *jobs, const json_t *spec_in, int *rc, char *err, size_t errlen) {
  zt_job_spec spec;
  zt__job_needs needs = {0};
  zt_model *m = NULL;
  if ((*rc = admit(jobs, spec_in, &spec, &needs, err, errlen)) < 0 ||
      (*rc = zt_model_create(&m, &spec.model, err, errlen)) < 0)
    return NULL;
  json_t *ranks = json_array();
  for (int i = 0; ranks && i < zt__job_world(&spec); i++)
    if (json_array_append_new(ranks, json_integer((json_int_t)needs.rank_bytes)) < 0) {
      json_decref(ranks);
      ranks = NULL;
    }
  json_t *j = ranks ? json_pack("{s:s, s:s, s:I, s:I, s:{s:i, s:i, s:o}}", "backend",
                                jobs->cfg.backend, "arch", zt_arch_name(spec.model.arch),
                                "params", (json_int_t)zt_model_num_params(m), "backend_bytes",
                                (json_int_t)needs.backend_bytes, "parallel", "gpus", spec.gpus,
                                "zero_stage", spec.zero_stage, "rank_bytes", ranks)
                    : NULL;
  json_t *par = json_object_get(j, "parallel");
  if (par) json_object_set_new(par, "world", json_integer(zt__job_world(&spec)));
  if (par && spec.n_peers) {
    json_t *peers = json_array();
    for (int i = 0; peers && i < spec.n_peers; i++)
      json_array_append_new(peers, json_string(spec.peers[i]));
    json_object_set_new(par, "peers", peers);
  }
  int units = zt_model_num_units(m);
  zt_model_destroy(m);
  zt_offload_plan p;
  if (j && spec.has_offload && zt__job_world(&spec) > 1) {
    /* each rank's placement as resolved (engine/job/dp_placement.c) */
    zt_train_cfg tc = zt__job_rank_train_cfg(&spec);
    zt_dp_cfg dc = zt__job_dp_cfg(&spec, 0, 0);
    json_object_set_new(
        j, "offload",
        json_pack("{s:s, s:s, s:i, s:i, s:i, s:I, s:I, s:I}", "optimizer",
                  zt_offload_place_name(dc.optimizer), "params",
                  zt_offload_place_name(dc.params), "units", units, "gpu_units",
                  dc.optimizer == ZT_PLACE_HOST || dc.optimizer == ZT_PLACE_NVME ? dc.gpu_units
                                                                                 : units,
                  "ckpt_every", tc.ckpt_every, "host_bytes_per_rank",
                  (json_int_t)zt_dp_estimate_host_bytes(&spec.model, &tc, &dc),
                  "device_bytes_per_rank", (json_int_t)needs.rank_bytes, "nvme_bytes_per_rank",
                  (json_int_t)zt_dp_estimate_nvme_bytes(&spec.model, &tc, &dc)));
  } else if (j && spec.has_offload &&
      zt_offload_estimate(&spec.model, &spec.train, &spec.offload,
                          zt_backend_ops_of(jobs->cfg.backend), &p, err, errlen) == 0)
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
                  "est_step_s", p.est_step_s, "h2d_bytes", (json_int_t)p.h2d_bytes,
                  "d2h_bytes", (json_int_t)p.d2h_bytes, "nvme_step_bytes",
                  (json_int_t)p.nvme_step_bytes));
  if (!j) {
    *rc = -ENOMEM;
    snprintf(err, errlen, "out of memory");
  }
  return j;
}

/* A new job in the registry: the next id, jobs/<id>/ with its checkpoints directory, spec.json,
 * part.json for a part, status.json ("queued"). On failure nothing is left but a consumed id
 * (taken once its directory exists). */
static int create_job(zt_jobs *jobs, const zt_job_spec *spec, const zt__job_part *part,
                      zt__job **out, char *err, size_t errlen) {
  zt__job *job = NULL;
  json_t *pj = NULL;
  int rc, made_dir = 0;
  char new_id[ZT_JOB_ID_MAX];
  snprintf(new_id, sizeof new_id, "j%06ld", jobs->next_id);
  if ((rc = zt__job_new(jobs, new_id, spec, &job)) < 0) {
    snprintf(err, errlen, "out of memory");
    return rc;
  }
  job->state = ZT_JOB_QUEUED;
  job->created = zt__now();
  if (part) {
    job->part = *part;
    pj = json_pack("{s:i, s:i, s:s}", "rank0", part->rank0, "resume_step", part->resume_step,
                   "coordinator", part->coordinator);
    if (!pj) {
      rc = -ENOMEM;
      snprintf(err, errlen, "out of memory");
      goto out;
    }
  }
  char ckdir[ZT__JOB_DIR_MAX + 16];
  snprintf(ckdir, sizeof ckdir, "%s/checkpoints", job->dir);
  if (mkdir(job->dir, 0755) != 0 || (made_dir = 1, mkdir(ckdir, 0755) != 0)) {
    rc = -errno;
    snprintf(err, errlen, "%s: %s", job->dir, strerror(errno));
    goto out;
  }
  /* The id is taken once its directory exists, even if writing it fails below. */
  jobs->next_id++;
  if ((rc = zt__store_write_json(job->dir, "spec.json", job->spec_json, err, errlen)) < 0 ||
      (pj && (rc = zt__store_write_json(job->dir, "part.json", pj, err, errlen)) < 0) ||
      (rc = zt__job_write_status(job, err, errlen)) < 0)
    goto out;
  if ((rc = zt__jobs_add(jobs, job)) < 0) {
    snprintf(err, errlen, "out of memory");
    goto out;
  }
  *out = job;
  job = NULL;
out:
  json_decref(pj);
  if (job) {
    if (made_dir) zt__store_remove_tree(job->dir);
    zt__job_free(job);
  }
  return rc;
}

int zt_jobs_submit(zt_jobs *jobs, const json_t *spec_in, char id[ZT_JOB_ID_MAX], char *err,
                   size_t errlen) {
  zt_job_spec spec;
  zt__job *job;
  zt__job_needs needs;
  int rc;
  if (jobs->shutting_down) {
    snprintf(err, errlen, "the daemon is shutting down");
    return -ESHUTDOWN;
  }
  if ((rc = admit(jobs, spec_in, &spec, &needs, err, errlen)) < 0 ||
      (rc = create_job(jobs, &spec, NULL, &job, err, errlen)) < 0)
    return rc;
  snprintf(id, ZT_JOB_ID_MAX, "%s", job->id);
  zt__jobs_enqueue(jobs, job);
  zt__job_log(job, ZT_LOG_INFO, "queued%s%s", spec.name[0] ? ": " : "", spec.name);
  zt__jobs_maybe_start(jobs);
  return 0;
}

/* The join request's "part": {"world", "rank0", "nccl_id", "resume_step", "coordinator"}. */
static int parse_part(const json_t *p, const zt_job_spec *spec, zt__job_part *out, char *err,
                      size_t errlen) {
  const json_t *w = json_object_get(p, "world"), *r0 = json_object_get(p, "rank0");
  const json_t *rs = json_object_get(p, "resume_step");
  const char *id = json_string_value(json_object_get(p, "nccl_id"));
  const char *co = json_string_value(json_object_get(p, "coordinator"));
  int W = zt__job_world(spec), G = spec->gpus;
  if (!json_is_object(p) || !json_is_integer(w) || json_integer_value(w) != W) {
    snprintf(err, errlen, "part.world must be the spec's %d ranks (parallel.gpus %d on each of "
             "%d daemons)", W, G, 1 + spec->n_peers);
    return -EINVAL;
  }
  json_int_t rank0 = json_is_integer(r0) ? json_integer_value(r0) : -1;
  if (rank0 < G || rank0 % G != 0 || rank0 + G > W) {
    snprintf(err, errlen, "part.rank0 must be a multiple of parallel.gpus %d in [%d, %d] (rank "
             "0's GPUs are the coordinator's)", G, G, W - G);
    return -EINVAL;
  }
  if (!id || strlen(id) != sizeof out->nccl_id - 1 || strspn(id, "0123456789abcdef") != strlen(id)) {
    snprintf(err, errlen, "part.nccl_id must be %zu lowercase hex digits (the NCCL group's id)",
             sizeof out->nccl_id - 1);
    return -EINVAL;
  }
  if (!json_is_integer(rs) || json_integer_value(rs) < 0 ||
      json_integer_value(rs) > spec->train.steps) {
    snprintf(err, errlen, "part.resume_step must be an integer in [0, train.steps %d]",
             spec->train.steps);
    return -EINVAL;
  }
  if (!co || !co[0] || strlen(co) >= sizeof out->coordinator) {
    snprintf(err, errlen, "part.coordinator must name the coordinator in 1 to %zu characters",
             sizeof out->coordinator - 1);
    return -EINVAL;
  }
  *out = (zt__job_part){.member = 1, .rank0 = (int)rank0, .resume_step = (int)json_integer_value(rs)};
  memcpy(out->nccl_id, id, sizeof out->nccl_id);
  snprintf(out->coordinator, sizeof out->coordinator, "%s", co);
  return 0;
}

int zt_jobs_join(zt_jobs *jobs, const json_t *spec_in, const json_t *part_in, void *owner,
                 char id[ZT_JOB_ID_MAX], char *err, size_t errlen) {
  zt_job_spec spec;
  zt__job_part part;
  zt__job_needs needs;
  zt__job *job;
  int rc;
  if (jobs->shutting_down) {
    snprintf(err, errlen, "the daemon is shutting down");
    return -ESHUTDOWN;
  }
  /* the request's shape first, then what this daemon can do */
  if ((rc = zt__job_spec_parse(spec_in, &spec, err, errlen)) < 0) return rc;
  if (spec.n_peers == 0) {
    snprintf(err, errlen, "join: the spec has no parallel.peers: it is not a job spanning daemons");
    return -EINVAL;
  }
  if ((rc = parse_part(part_in, &spec, &part, err, errlen)) < 0 ||
      (rc = admit(jobs, spec_in, &spec, &needs, err, errlen)) < 0)
    return rc;
  /* the coordinator waits for every part: one that cannot start now is refused, not queued */
  int free_now = zt__jobs_free_devices(jobs);
  if (free_now < spec.gpus) {
    snprintf(err, errlen, "busy: %d of this daemon's %d GPUs are free, the part needs %d",
             free_now, jobs->n_dev, spec.gpus);
    return -EBUSY;
  }
  part.owner = owner;
  if ((rc = create_job(jobs, &spec, &part, &job, err, errlen)) < 0) return rc;
  job->needs = needs;
  job->has_needs = 1;
  snprintf(id, ZT_JOB_ID_MAX, "%s", job->id);
  zt__job_log(job, ZT_LOG_INFO, "joined %s as ranks %d..%d of %d", part.coordinator,
              part.rank0, part.rank0 + spec.gpus - 1, zt__job_world(&spec));
  zt__jobs_start(jobs, job);
  return 0;
}
