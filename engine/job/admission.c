/* defines: admission: zt_jobs_submit, zt_jobs_plan and zt_jobs_join (jobs.h; called by
 * engine/server on the loop thread, answered through their done callbacks). A spec is filled
 * with the operator's defaults and parsed on the loop thread; a worker (work.c) checks the files
 * it names and sizes it against this daemon's backend and limits, or a plan's target's
 * (engine/job/target.h; auto activation checkpointing resolved there); back on the loop thread
 * a new job gets its directory with the stored spec. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include "engine/job/internal.h"
#include "engine/job/store.h"
#include "engine/job/target.h"
#include "engine/base/sizes.h"
#include "engine/kernels/backend.h"
#include "engine/plan/auto_ckpt.h"
#include "engine/plan/batch.h"
#include "engine/plan/plan_file.h"
#include "engine/plan/rates.h"
#include "proto/zt_tokens.h"

/* "activation_checkpointing": {"every": "auto"} without offload (or with several ranks and no
 * gpu_budget): the planner's order of the choices (engine/plan/auto_ckpt.h), each sized against
 * this daemon; the job is refused with the numbers of every block recomputed when even that
 * does not fit. The stored spec records the choice, so a restart runs the same. */
typedef struct ckpt_try {
  const zt_jobs_config *cfg;
  zt_job_spec *spec;
  zt__job_needs *needs;
} ckpt_try;

static int ckpt_fits(void *ctx, int every, char *err, size_t errlen) {
  ckpt_try *t = ctx;
  t->spec->train.ckpt_every = every;
  return zt__job_spec_check_resources(t->spec, t->cfg, t->needs, err, errlen);
}

static int resolve_auto_ckpt(const zt_jobs_config *cfg, zt_job_spec *spec, zt__job_needs *needs,
                             char *err, size_t errlen) {
  ckpt_try t = {cfg, spec, needs};
  int rc = zt_plan_auto_ckpt(spec->model.n_layers, ckpt_fits, &t, err, errlen);
  return rc < 0 ? rc : 0;
}

/* model.init.job: the other job's newest checkpoint's weights, a file of the state dir (the
 * daemon's own, read on the worker's header check as any init file; create_job links it into
 * the new job's directory, so that the other job's pruning or removal cannot take it away). A
 * TCP client names only jobs submitted over TCP (resume.c says why). */
static int resolve_init_job(zt_jobs *jobs, zt_job_spec *spec, int tcp, char *err, size_t errlen) {
  const char *id = spec->model.init_job;
  if (!id[0]) return 0;
  zt__job *from = zt__jobs_find(jobs, id, err, errlen);
  if (!from) {
    snprintf(err, errlen, "model.init.job: no job %s", id);
    return -ENOENT;
  }
  if (tcp && !from->tcp) {
    snprintf(err, errlen, "model.init.job: job %s was submitted over the Unix socket; a TCP "
             "client's job starts only from jobs submitted over TCP", id);
    return -EACCES;
  }
  int step = zt__store_newest_checkpoint(from->dir);
  if (step <= 0) {
    snprintf(err, errlen, "model.init.job: job %s has no checkpoint yet", id);
    return -ENOENT;
  }
  char ck[ZT__JOB_DIR_MAX + 64];
  zt__store_checkpoint_path(ck, sizeof ck, from->dir, step);
  if (snprintf(spec->model.init_path, sizeof spec->model.init_path, "%s/model.safetensors", ck) >=
      (int)sizeof spec->model.init_path) {
    snprintf(err, errlen, "model.init.job: the state dir's path is too long");
    return -ENAMETOOLONG;
  }
  return 0;
}

/* What submit, plan and join share, on the loop thread: the operator's defaults filled in and
 * the spec parsed (its structure only: nothing read from the machine, model.hf's config.json
 * read by admit on the worker); stored: a join's, the coordinator's stored spec. */
static int parse_spec(zt_jobs *jobs, const zt_jobs_config *cfg, const json_t *spec_in, int tcp,
                      int stored, zt_job_spec *spec, char *err, size_t errlen) {
  /* The operator's --nvme-dir is where an offloaded job keeps its NVMe tier unless the spec
   * names a directory (cfg: the machine planned for, a target's has none); the stored spec
   * records the one used. */
  json_t *filled = NULL;
  const json_t *off = json_is_object(spec_in) ? json_object_get(spec_in, "offload") : NULL;
  if (cfg->nvme_dir && json_is_object(off) && !json_object_get(off, "nvme_dir")) {
    filled = json_deep_copy(spec_in);
    if (!filled) {
      snprintf(err, errlen, "out of memory");
      return -ENOMEM;
    }
    json_object_set_new(json_object_get(filled, "offload"), "nvme_dir",
                        json_string(cfg->nvme_dir));
    spec_in = filled;
  }
  int rc = zt__job_spec_parse_unread(spec_in, spec, err, errlen);
  const json_t *train = json_object_get(spec_in, "train");
  /* not part of the parse: a stored spec always gives it, as resolved */
  if (rc == 0) spec->ckpt_given = json_object_get(train, "activation_checkpointing") != NULL;
  /* a stored spec records both (the steps its epochs made); a client gives one (a join's spec
   * is its coordinator's stored one) */
  if (rc == 0 && !stored && spec->train.epochs && json_object_get(train, "steps")) {
    snprintf(err, errlen, "train.epochs and train.steps: give one (ztd makes train.epochs steps "
             "from data.path's token file)");
    rc = -EINVAL;
  }
  json_decref(filled);
  return rc < 0 ? rc : resolve_init_job(jobs, spec, tcp, err, errlen);
}

/* The spec sized as it stands: a parallel job's offload placement, auto checkpointing, then
 * the memory against cfg's limits (this daemon's, or a plan target's). */
static int size_spec(const zt_jobs_config *cfg, zt_job_spec *spec, zt__job_needs *needs,
                     char *err, size_t errlen) {
  int rc = zt__job_resolve_dp_offload(spec, zt_backend_ops_of(cfg->backend), err, errlen);
  if (rc < 0) return rc;
  /* an offloaded job of one rank has it from its planner, of several from its gpu_budget
   * (zt__job_resolve_dp_offload) */
  if ((!spec->has_offload || zt__job_world(spec) > 1) && spec->train.ckpt_every == ZT_CKPT_AUTO)
    return resolve_auto_ckpt(cfg, spec, needs, err, errlen);
  return zt__job_spec_check_resources(spec, cfg, needs, err, errlen);
}

/* The daemon's device budget is an offloaded job's: offload.gpu_budget is filled with it where
 * the spec leaves it out and may only lower it. */
static int apply_device_budget(const zt_jobs_config *cfg, zt_job_spec *spec, char *err,
                               size_t errlen) {
  const char *what;
  double budget = zt__jobs_device_budget(cfg, &what);
  if (!spec->has_offload || budget <= 0) return 0;
  if (!spec->offload.gpu_budget) {
    spec->offload.gpu_budget = (size_t)budget;
    return 0;
  }
  if ((double)spec->offload.gpu_budget <= budget) return 0;
  char a[32], b[32];
  zt_size_format(a, sizeof a, (double)spec->offload.gpu_budget);
  zt_size_format(b, sizeof b, budget);
  snprintf(err, errlen, "offload.gpu_budget %s is more than this daemon's device budget (%s %s): "
           "leave it out to take the daemon's", a, what, b);
  return -EINVAL;
}

/* A job with no "offload" object that does not fit the device is offloaded by default: offload
 * auto under the daemon's device budget, checkpointing auto unless the spec gives it. The
 * stored spec records the offload object, so a restart runs the same. `why` gets the refusal
 * of the job as given (logged with the job); on failure err has both refusals. */
static int offload_by_default(const zt_jobs_config *cfg, zt_job_spec *spec, zt__job_needs *needs,
                              char *why, size_t whylen, char *err, size_t errlen) {
  const char *what;
  double budget = zt__jobs_device_budget(cfg, &what);
  zt_job_spec *off = malloc(sizeof *off);
  if (!off) {
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  snprintf(why, whylen, "%s", err);
  *off = *spec;
  off->has_offload = 1;
  zt_offload_cfg_defaults(&off->offload);
  off->offload.gpu_budget = (size_t)budget;
  if (cfg->nvme_dir)
    snprintf(off->offload.nvme_dir, sizeof off->offload.nvme_dir, "%s", cfg->nvme_dir);
  if (!off->ckpt_given) off->train.ckpt_every = ZT_CKPT_AUTO;
  char how[ZT__ERR_MAX];
  int rc = size_spec(cfg, off, needs, how, sizeof how);
  if (rc == 0) {
    *spec = *off;
  } else {
    char b[32];
    zt_size_format(b, sizeof b, budget);
    snprintf(err, errlen, "%.600s; offloaded (offload auto under %s %s): %.1300s", why, what, b,
             how);
  }
  free(off);
  return rc;
}

/* The spec sized, and where it does not fit the device and may be offloaded by default
 * (offload 1), offloaded. */
static int fit(const zt_jobs_config *cfg, zt_job_spec *spec, int offload, zt__job_needs *needs,
               char *why, size_t whylen, char *err, size_t errlen) {
  const char *what;
  zt_train_cfg given = spec->train;
  int rc = size_spec(cfg, spec, needs, err, errlen);
  if (rc != -ENOMEM || !offload || spec->has_offload || spec->offload_off ||
      zt__jobs_device_budget(cfg, &what) <= 0)
    return rc;
  spec->train = given;
  return offload_by_default(cfg, spec, needs, why, whylen, err, errlen);
}

/* The cost model's step time of a sized spec: an offloaded rank's plan, else its compute. */
static double step_s(const zt_job_spec *spec, const zt__job_needs *needs) {
  char why[ZT__ERR_MAX];
  if (needs->has_plan) return needs->plan.est.step_s;
  zt_model *m = NULL;
  if (zt_model_create(&m, &spec->model, why, sizeof why) < 0) return HUGE_VAL;
  zt_train_cfg tc = zt__job_rank_train_cfg(spec);
  double s = zt_batch_step_s(m, &tc);
  zt_model_destroy(m);
  return s;
}

/* train.batch_tokens: each split of the step's tokens into micro_batch x grad_accum (largest
 * micro-batch first) sized with the checkpointing auto unless the spec gives it, the fastest
 * by the cost model kept (a tie to the fewer micro-batches). Offloaded by default only where no
 * split fits the device as it is; nothing fitting, the refusal of the one-row micro-batch,
 * which needs the least memory. */
static int fit_batch(const zt_jobs_config *cfg, zt_job_spec *spec, zt__job_needs *needs,
                     char *why, size_t whylen, char *err, size_t errlen) {
  int micro[ZT_BATCH_MAX_SPLITS];
  int n = zt_batch_splits(&spec->train, zt__job_world(spec), spec->model.seq_len, micro,
                          ZT_BATCH_MAX_SPLITS, err, errlen);
  if (n < 0) return n;
  zt_job_spec *cand = malloc(2 * sizeof *cand), *best = cand + 1;
  if (!cand) {
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  int64_t rows = spec->train.batch_tokens / ((int64_t)zt__job_world(spec) * spec->model.seq_len);
  int rc = -ENOMEM, found = 0;
  double best_s = 0;
  zt__job_needs nd;
  char w[ZT__ERR_MAX];
  for (int offload = 0; offload < 2 && !found; offload++)
    for (int i = 0; i < n; i++) {
      *cand = *spec;
      cand->train.micro_batch = micro[i];
      cand->train.grad_accum = (int)(rows / micro[i]);
      if (!cand->ckpt_given) cand->train.ckpt_every = ZT_CKPT_AUTO;
      w[0] = 0;
      rc = fit(cfg, cand, offload, &nd, w, sizeof w, err, errlen);
      if (rc == -ENOMEM || rc == -ENOSPC) continue;
      if (rc < 0) goto out;
      double s = step_s(cand, &nd);
      if (!found || s < best_s) {
        *best = *cand;
        *needs = nd;
        best_s = s;
        snprintf(why, whylen, "%s", w);
      }
      found = 1;
    }
  if (found) {
    *spec = *best;
    rc = 0;
  } else {
    snprintf(w, sizeof w, "%s", err);
    snprintf(err, errlen, "train.batch_tokens %lld fits in no split (the least memory: "
             "train.micro_batch 1 x train.grad_accum %lld): %.1800s",
             (long long)spec->train.batch_tokens, (long long)rows, w);
  }
out:
  free(cand);
  return rc;
}

/* A refusal for memory says what change would fit, with the field's full path: the first of
 * checkpointing "auto", a smaller micro-batch (a divisor of the given one, the grad_accum
 * that keeps the step's tokens), the offload "offload": false opts out of, that fits
 * (appended to err with what a device then holds). Nothing appended where none does. */
static void advise(const zt_jobs_config *cfg, const zt_job_spec *given, char *err, size_t errlen) {
  /* a batch_tokens split was searched with the checkpointing already */
  if (given->train.batch_tokens) return;
  zt_job_spec *c = malloc(sizeof *c);
  if (!c) return;
  char w[ZT__ERR_MAX], e[ZT__ERR_MAX], size[32], fix[160] = "";
  zt__job_needs nd;
  int offload = !given->offload_off, B = given->train.micro_batch;
  *c = *given;
  if (given->train.ckpt_every != ZT_CKPT_AUTO && given->train.ckpt_every != 1) {
    c->train.ckpt_every = ZT_CKPT_AUTO;
    if (fit(cfg, c, offload, &nd, w, sizeof w, e, sizeof e) == 0)
      snprintf(fix, sizeof fix, "train.activation_checkpointing.every \"auto\"");
  }
  for (int m = B - 1; !fix[0] && m >= 1; m--) {
    if (B % m) continue;
    *c = *given;
    c->train.micro_batch = m;
    c->train.grad_accum = given->train.grad_accum * (B / m);
    if (c->train.grad_accum <= ZT_TRAIN_MAX_BATCH &&
        fit(cfg, c, offload, &nd, w, sizeof w, e, sizeof e) == 0)
      snprintf(fix, sizeof fix, "train.micro_batch %d and train.grad_accum %d", m,
               c->train.grad_accum);
  }
  if (!fix[0] && given->offload_off) {
    *c = *given;
    c->offload_off = 0;
    if (fit(cfg, c, 1, &nd, w, sizeof w, e, sizeof e) == 0)
      snprintf(fix, sizeof fix, "the \"offload\": false left out (offloaded by default)");
  }
  if (fix[0]) {
    size_t n = strlen(err);
    zt_size_format(size, sizeof size, (double)nd.rank_bytes);
    snprintf(err + n, errlen - n, "; fits with %s (%s a device)", fix, size);
  }
  free(c);
}

/* The checkpoints a job keeps live in its directory under the state dir: checkpoint.keep of
 * them and the one being written (keep 0: the older ones go first, so one at a time), each 12 bytes a parameter (the fp32 parameters, AdamW's m and
 * v; 8 with bf16 moments, train.optimizer.state_dtype) and a header of up to 2 KB a tensor a file. A disk without room for them is refused at
 * submit with the sizes, not at the job's first save (an 8 B job's checkpoint is ~96 GB). */
static int check_checkpoint_space(const zt_jobs_config *cfg, const zt_job_spec *s, char *err,
                                  size_t errlen) {
  zt_model *m = NULL;
  struct statvfs v;
  int rc = zt_model_create(&m, &s->model, err, errlen);
  if (rc < 0) return rc;
  double per = 4.0 + 2.0 * (double)zt_dtype_size(s->train.state_dtype);
  double one = per * (double)zt_model_num_params(m) + 2.0 * 2048 * zt_model_num_tensors(m);
  zt_model_destroy(m);
  /* a described machine's disk as given (not described: not checked), nothing of this one read */
  if (cfg->described && !cfg->disk_bytes) return 0;
  if (!cfg->described && statvfs(cfg->state_dir, &v) < 0) {
    rc = -errno;
    snprintf(err, errlen, "%s: %s", cfg->state_dir, strerror(-rc));
    return rc;
  }
  double avail = cfg->described ? (double)cfg->disk_bytes
                                : (double)v.f_bavail * (double)v.f_frsize;
  int at_once = s->ckpt_keep ? s->ckpt_keep + 1 : 1;
  double all = one * at_once;
  if (all <= avail) return 0;
  char a[32], b[32], c[32];
  zt_size_format(a, sizeof a, one);
  zt_size_format(b, sizeof b, all);
  zt_size_format(c, sizeof c, avail);
  snprintf(err, errlen, "checkpoint: the job's checkpoints take %s each (fp32 parameters, AdamW's "
           "m and v in %s), %d at once with checkpoint.keep %d: %s; %s%s has %s free%s",
           a, zt_dtype_name(s->train.state_dtype), at_once, s->ckpt_keep, b,
           cfg->described ? "the target (target.nvme_bytes)" : "the state dir ",
           cfg->described ? "" : cfg->state_dir, c,
           s->ckpt_keep > 0 ? ": lower checkpoint.keep (0: one at a time) or free space"
                            : ": free space");
  return -ENOSPC;
}

/* train.epochs made steps from data.path's token file (docs/spec.md "Epochs"): the rows of that
 * many epochs (documents: each epoch's packing in its order; windows: zt__token_file_epoch_rows
 * each) over a step's rows, rounded up: the last step's rows past the epochs are padding, a
 * partial step as transformers' Trainer makes the last batch of an epoch (drop_last false), so
 * every document is trained on exactly train.epochs times. A step's rows are micro_batch x
 * grad_accum x ranks, with batch_tokens its tokens over seq_len whatever split the planner then
 * picks, so the steps are known before the sizing, which checks them (warmup_steps among
 * them). The stored spec records the steps, so a restart runs the same. */
static int resolve_epochs(zt_jobs *jobs, zt_job_spec *spec, int tcp, char *err, size_t errlen) {
  zt_train_cfg *t = &spec->train;
  if (!t->epochs || t->steps) return 0;
  int T = spec->model.seq_len, W = zt__job_world(spec), rc;
  int64_t per_step = (int64_t)t->micro_batch * t->grad_accum * W;
  if (t->batch_tokens) {
    int micro[ZT_BATCH_MAX_SPLITS];
    if ((rc = zt_batch_splits(t, W, T, micro, ZT_BATCH_MAX_SPLITS, err, errlen)) < 0) return rc;
    per_step = t->batch_tokens / T;
  }
  zt_path_roots files = zt__job_roots(&jobs->cfg, tcp, 0);
  zt__token_file tf;
  if ((rc = zt__token_file_open(&tf, "data.path", spec->data_path, 1, &files, err, errlen)) < 0) return rc;
  uint64_t rows;
  int windows = spec->packing == ZT_PACKING_WINDOWS ||
                (spec->packing == ZT_PACKING_AUTO && tf.version == ZT_TOKENS_VERSION);
  if (windows)
    rows = zt__token_file_epoch_rows(&tf, T) * (uint64_t)t->epochs;
  else if ((rc = zt__packer_rows(&tf, T, t->seed, spec->shuffle, t->epochs, &rows)) < 0)
    snprintf(err, errlen, "out of memory counting the rows of data.path %.1500s", spec->data_path);
  zt__token_file_close(&tf);
  if (rc < 0) return rc;
  uint64_t steps = (rows + (uint64_t)per_step - 1) / (uint64_t)per_step;
  if (steps > ZT_TRAIN_MAX_STEPS) {
    snprintf(err, errlen, "train.epochs %d of data.path %.1500s: %llu rows of model.seq_len %d make "
             "%llu steps of %lld rows, more than %d", t->epochs, spec->data_path,
             (unsigned long long)rows, T, (unsigned long long)steps, (long long)per_step,
             ZT_TRAIN_MAX_STEPS);
    return -EINVAL;
  }
  if ((uint64_t)t->warmup_steps > steps) {
    snprintf(err, errlen, "train.schedule.warmup_steps %d is more than the %llu steps that "
             "train.epochs %d makes of data.path %.1500s (%llu rows, %lld a step)", t->warmup_steps,
             (unsigned long long)steps, t->epochs, spec->data_path, (unsigned long long)rows,
             (long long)per_step);
    return -EINVAL;
  }
  t->steps = (int)steps;
  return 0;
}

/* ... and on a worker: the spec sized against cfg (this daemon's backend and limits, or a plan
 * target's), its files checked where this daemon's job would read them. */
static int admit(zt_jobs *jobs, const zt_jobs_config *cfg, zt_job_spec *spec, int tcp,
                 zt__job_needs *needs, char *why, size_t whylen, char *err, size_t errlen) {
  int rc;
  why[0] = 0;
  /* the stored spec records the count, so that a restart resumes the same split of the data */
  if (spec->gpus == ZT_JOB_GPUS_ALL) spec->gpus = zt__jobs_devices(cfg, NULL);
  if ((rc = zt__job_spec_read_model(spec, &jobs->cfg, tcp, err, errlen)) < 0 ||
      (rc = zt__job_spec_check_files(spec, &jobs->cfg, tcp, err, errlen)) < 0 ||
      (rc = resolve_epochs(jobs, spec, tcp, err, errlen)) < 0 ||
      (rc = apply_device_budget(cfg, spec, err, errlen)) < 0)
    return rc;
  zt_job_spec *given = malloc(sizeof *given);
  if (!given) {
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  *given = *spec;
  rc = spec->train.batch_tokens ? fit_batch(cfg, spec, needs, why, whylen, err, errlen)
                                : fit(cfg, spec, 1, needs, why, whylen, err, errlen);
  if (rc == -ENOMEM) advise(cfg, given, err, errlen);
  free(given);
  /* refused at submit, not at the job's start: the strategy as fitted */
  if (rc == 0 && zt__job_world(spec) > 1)
    rc = zt_train_cfg_check_strategy(&spec->train, "data parallelism", err, errlen);
  return rc < 0 ? rc : check_checkpoint_space(cfg, spec, err, errlen);
}

/* model.init.job's file, a hard link in the job's own directory (init.safetensors) from then
 * on: the same bytes, whatever becomes of the other job's checkpoints. */
static int link_init(zt__job *job, char *err, size_t errlen) {
  char own[ZT__JOB_DIR_MAX + 32];
  snprintf(own, sizeof own, "%s/" ZT__INIT_FILE, job->dir);
  if (link(job->spec.model.init_path, own) < 0) {
    int rc = -errno;
    snprintf(err, errlen, "model.init.job: job %s's newest checkpoint: %s%s", job->spec.model.init_job,
             strerror(errno), errno == ENOENT ? " (a newer one replaced it meanwhile: submit "
             "again)" : "");
    return rc;
  }
  zt__job_log(job, ZT_LOG_INFO, "starts from the weights of job %s: %s",
              job->spec.model.init_job, job->spec.model.init_path);
  snprintf(job->spec.model.init_path, sizeof job->spec.model.init_path, "%s", own);
  return 0;
}

/* A new job in the registry: the next id, jobs/<id>/ with its checkpoints directory, spec.json,
 * plan.json for a single-rank offloaded job (the plan admission made: the start reuses it),
 * part.json for a part, status.json ("queued"). On failure nothing is left but a consumed id
 * (taken once its directory exists). */
static int create_job(zt_jobs *jobs, const zt_job_spec *spec, int tcp, const zt__job_part *part,
                      const zt__job_needs *needs, zt__job **out, char *err, size_t errlen) {
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
  job->tcp = tcp;
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
  if (spec->model.init_job[0] && (rc = link_init(job, err, errlen)) < 0) goto out;
  if ((rc = zt__store_write_json(job->dir, "spec.json", job->spec_json, err, errlen)) < 0 ||
      (needs->has_plan && (rc = zt__store_plan_write(job->dir, &needs->plan, err, errlen)) < 0) ||
      (pj && (rc = zt__store_write_json(job->dir, "part.json", pj, err, errlen)) < 0) ||
      (rc = zt__job_write_status(job, err, errlen)) < 0)
    goto out;
  if ((rc = zt__jobs_add(jobs, job)) < 0) {
    snprintf(err, errlen, "out of memory");
    goto out;
  }
  job->has_plan = needs->has_plan;
  job->plan = needs->plan;
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

/* A submit, plan or join on its way: parsed on the loop thread, admitted on a worker (admit,
 * and for a plan its reply), finished back on the loop thread. */
typedef enum admit_kind { ADMIT_SUBMIT, ADMIT_PLAN, ADMIT_JOIN } admit_kind;

typedef struct admit_task {
  zt__work w;
  admit_kind kind;
  int tcp;
  zt_job_spec spec;
  zt__job_part part;      /* join */
  zt__job_needs needs;
  int rc;                 /* the worker's verdict */
  char offloaded[ZT__ERR_MAX]; /* offloaded by default: the refusal of the job as given */
  json_t *plan;           /* plan: the reply */
  int has_target;         /* plan: for the machine target describes, not this one */
  zt__job_target target;
  char err[ZT__ERR_MAX];
} admit_task;

/* --max-state-bytes: what the jobs' directories hold now (their checkpoints above all). */
static int check_state_bytes(zt_jobs *jobs, char *err, size_t errlen) {
  uint64_t limit = jobs->cfg.max_state_bytes, used;
  char path[ZT__STATE_DIR_MAX + 8], a[32], b[32];
  if (!limit) return 0;
  snprintf(path, sizeof path, "%s/jobs", jobs->state_dir);
  int rc = zt__store_tree_bytes(path, &used);
  if (rc < 0) {
    snprintf(err, errlen, "%s: %s", path, strerror(-rc));
    return rc;
  }
  if (used < limit) return 0;
  zt_size_format(a, sizeof a, (double)used);
  zt_size_format(b, sizeof b, (double)limit);
  snprintf(err, errlen, "the state dir's jobs hold %s (%" PRIu64 " bytes), at or over ztd "
           "--max-state-bytes %s (%" PRIu64 " bytes): remove jobs that ended (ztctl rm)", a, used,
           b, limit);
  return -ENOSPC;
}

/* --max-queued: checked when the submit comes and again when its job would be queued. */
static int check_queued(zt_jobs *jobs, char *err, size_t errlen) {
  if (!jobs->cfg.max_queued || jobs->n_queue < jobs->cfg.max_queued) return 0;
  snprintf(err, errlen, "%d jobs are queued, ztd --max-queued %d: wait for them to start, or "
           "cancel some", jobs->n_queue, jobs->cfg.max_queued);
  return -EBUSY;
}

static void admit_run(zt__work *w) {
  admit_task *t = (admit_task *)w;
  zt_jobs *jobs = w->jobs;
  const zt_jobs_config *cfg = t->has_target ? &t->target.cfg : &jobs->cfg;
  if (t->kind == ADMIT_SUBMIT && (t->rc = check_state_bytes(jobs, t->err, sizeof t->err)) < 0)
    return;
  /* a target's plan ranks by its rates, on this worker alone */
  if (t->has_target) zt_plan_rates_use_here(&t->target.rates);
  t->rc = admit(jobs, cfg, &t->spec, t->tcp, &t->needs, t->offloaded, sizeof t->offloaded,
                t->err, sizeof t->err);
  if (t->rc == 0 && t->kind == ADMIT_PLAN)
    t->plan = zt__job_plan_reply(cfg, &t->spec, &t->needs, &t->rc, t->err, sizeof t->err);
  zt_plan_rates_use_here(NULL);
  if (t->plan && t->offloaded[0])
    json_object_set_new(t->plan, "offloaded_by_default", json_string(t->offloaded));
  if (t->plan && t->has_target)
    json_object_set_new(t->plan, "target", zt__job_target_json(&t->target));
}

static void answer(admit_task *t, int rc, json_t *reply) {
  if (t->w.done) t->w.done(t->w.owner, rc, reply, rc < 0 ? t->err : NULL);
}

static int finish_submit(admit_task *t, char id[ZT_JOB_ID_MAX]) {
  zt_jobs *jobs = t->w.jobs;
  zt__job *job;
  int rc;
  if (jobs->shutting_down) {
    snprintf(t->err, sizeof t->err, "the daemon is shutting down");
    return -ESHUTDOWN;
  }
  if ((rc = check_queued(jobs, t->err, sizeof t->err)) < 0) return rc;
  /* the queue checks the machine again when the job reaches its head (zt__jobs_maybe_start) */
  if ((rc = create_job(jobs, &t->spec, t->tcp, NULL, &t->needs, &job, t->err,
                       sizeof t->err)) < 0) return rc;
  snprintf(id, ZT_JOB_ID_MAX, "%s", job->id);
  zt__jobs_enqueue(jobs, job);
  zt__job_log(job, ZT_LOG_INFO, "queued%s%s", t->spec.name[0] ? ": " : "", t->spec.name);
  if (t->offloaded[0])
    zt__job_log(job, ZT_LOG_INFO, "offloaded by default (\"offload\": false opts out): %s",
                t->offloaded);
  zt__jobs_maybe_start(jobs);
  return 0;
}

static int finish_join(admit_task *t, char id[ZT_JOB_ID_MAX]) {
  zt_jobs *jobs = t->w.jobs;
  zt__job *job;
  int rc;
  if (jobs->shutting_down) {
    snprintf(t->err, sizeof t->err, "the daemon is shutting down");
    return -ESHUTDOWN;
  }
  /* the coordinator's connection closed while the part was admitted: nobody would drive it */
  if (!t->w.done) return -ECANCELED;
  /* the coordinator waits for every part: one that cannot start now is refused, not queued */
  int free_now = zt__jobs_free_devices(jobs);
  if (free_now < t->spec.gpus) {
    snprintf(t->err, sizeof t->err, "busy: %d of this daemon's %d GPUs are free, the part needs %d",
             free_now, jobs->n_dev, t->spec.gpus);
    return -EBUSY;
  }
  if ((rc = create_job(jobs, &t->spec, t->tcp, &t->part, &t->needs, &job, t->err,
                       sizeof t->err)) < 0) return rc;
  job->needs = t->needs;
  job->has_needs = 1;
  snprintf(id, ZT_JOB_ID_MAX, "%s", job->id);
  zt__job_log(job, ZT_LOG_INFO, "joined %s as ranks %d..%d of %d", t->part.coordinator,
              t->part.rank0, t->part.rank0 + t->spec.gpus - 1, zt__job_world(&t->spec));
  zt__jobs_start(jobs, job);
  return 0;
}

static void admit_finish(zt__work *w) {
  admit_task *t = (admit_task *)w;
  char id[ZT_JOB_ID_MAX] = "";
  int rc = t->rc;
  if (rc == 0 && t->kind == ADMIT_PLAN) {
    answer(t, 0, t->plan);
    return;
  }
  if (rc == 0) rc = t->kind == ADMIT_SUBMIT ? finish_submit(t, id) : finish_join(t, id);
  json_t *reply = rc == 0 ? json_pack("{s:s}", "job", id) : NULL;
  if (rc == 0 && !reply) {
    /* the job exists: its id is in the log, the list has it */
    rc = -ENOMEM;
    snprintf(t->err, sizeof t->err, "out of memory (job %s was queued)", id);
  }
  answer(t, rc, reply);
  json_decref(reply);
}

static void admit_release(zt__work *w) {
  admit_task *t = (admit_task *)w;
  json_decref(t->plan);
  free(t);
}

/* The parsed spec's task, handed to a worker. */
static int admit_async(zt_jobs *jobs, admit_kind kind, const json_t *spec_in,
                       const json_t *target, int tcp, const zt__job_part *part,
                       zt_jobs_done_cb done, void *owner, char *err, size_t errlen) {
  if (jobs->shutting_down) {
    snprintf(err, errlen, "the daemon is shutting down");
    return -ESHUTDOWN;
  }
  int rc = kind == ADMIT_SUBMIT ? check_queued(jobs, err, errlen) : 0;
  if (rc < 0) return rc;
  admit_task *t = calloc(1, sizeof *t);
  if (!t) {
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  t->has_target = target != NULL;
  if ((target && (rc = zt__job_target_parse(target, &jobs->cfg, &t->target, err, errlen)) < 0) ||
      (rc = parse_spec(jobs, target ? &t->target.cfg : &jobs->cfg, spec_in, tcp,
                       kind == ADMIT_JOIN, &t->spec, err, errlen)) < 0) {
    free(t);
    return rc;
  }
  t->kind = kind;
  t->tcp = tcp;
  if (part) t->part = *part;
  t->w.run = admit_run;
  t->w.finish = admit_finish;
  t->w.release = admit_release;
  t->w.done = done;
  t->w.owner = owner;
  zt__jobs_work(jobs, &t->w);
  return 0;
}

int zt_jobs_submit(zt_jobs *jobs, const json_t *spec_in, int tcp, zt_jobs_done_cb done,
                   void *owner, char *err, size_t errlen) {
  return admit_async(jobs, ADMIT_SUBMIT, spec_in, NULL, tcp, NULL, done, owner, err, errlen);
}

int zt_jobs_plan(zt_jobs *jobs, const json_t *spec_in, const json_t *target, int tcp,
                 zt_jobs_done_cb done, void *owner, char *err, size_t errlen) {
  return admit_async(jobs, ADMIT_PLAN, spec_in, target, tcp, NULL, done, owner, err, errlen);
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

int zt_jobs_join(zt_jobs *jobs, const json_t *spec_in, const json_t *part_in, void *conn,
                 int tcp, zt_jobs_done_cb done, void *owner, char *err, size_t errlen) {
  zt_job_spec spec;
  zt__job_part part;
  int rc;
  /* the request's shape first, then what this daemon can do */
  if ((rc = zt__job_spec_parse_unread(spec_in, &spec, err, errlen)) < 0) return rc;
  if (spec.n_peers == 0) {
    snprintf(err, errlen, "join: the spec has no parallel.peers: it is not a job spanning daemons");
    return -EINVAL;
  }
  if ((rc = parse_part(part_in, &spec, &part, err, errlen)) < 0) return rc;
  part.owner = conn;
  return admit_async(jobs, ADMIT_JOIN, spec_in, NULL, tcp, &part, done, owner, err, errlen);
}
