/* defines: zt__runner_main and zt__runner_interrupt (internal.h; queue.c starts the runner on
 * the job's own thread): the step loop of one job: its trainer opened (and resumed), data,
 * losses.log, checkpoints. Everything the loop thread must see goes through zt__jobs_post. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include "engine/base/sizes.h"
#include "engine/kernels/backend.h"
#include "engine/job/internal.h"
#include "engine/job/peers.h"
#include "engine/job/store.h"
#include "engine/base/log.h"
#include "engine/train/dp/dp.h"
#include "engine/base/tunables.h"
#include "proto/zt_tokens.h"

static double mono_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The bytes of a checkpoint directory's plain files, and "S GB in T s (R GB/s)" of them moved in
 * seconds secs into out, for the job's log (docs/BENCHMARKS.md "Time to the first step"). */
static void ckpt_rate(const char *dir, double secs, char *out, size_t outlen) {
  uint64_t bytes = 0;
  DIR *d = opendir(dir);
  struct dirent *e;
  struct stat st;
  while (d && (e = readdir(d)))
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
      bytes += (uint64_t)st.st_size;
  if (d) closedir(d);
  snprintf(out, outlen, "%.3f GB in %.2f s (%.2f GB/s)", bytes / 1e9, secs,
           secs > 0 ? bytes / 1e9 / secs : 0.0);
}

/* Removes the job's checkpoints but the newest keep; r->err names the failure. */
static int prune_checkpoints(runner *r, int keep) {
  int rc = zt__store_prune_checkpoints(r->job->dir, keep);
  if (rc < 0)
    snprintf(r->err, sizeof r->err, "%s/checkpoints: removing old checkpoints: %s", r->job->dir,
             strerror(-rc));
  return rc;
}

/* Saves the trainer at its current step (unless the newest checkpoint already is that step),
 * keeps the newest K, and answers the checkpoint requests up to gen. */
static int checkpoint(runner *r, uint64_t gen) {
  zt__job *job = r->job;
  pthread_mutex_t *mu = &job->jobs->mu;
  int rc = 0;
  int step = zt_trainer_step_count(r->trainer);
  char path[ZT__JOB_DIR_MAX + 64];
  zt__store_checkpoint_path(path, sizeof path, job->dir, step);

  pthread_mutex_lock(mu);
  int fresh = !(job->has_ckpt && job->ckpt_step == step);
  pthread_mutex_unlock(mu);
  if (fresh && job->part.member) {
    /* the coordinator writes the job's checkpoint; a part sends it its ranks' state */
    if ((rc = zt_trainer_dp_send_state(r->trainer, r->err, sizeof r->err)) < 0) goto out;
    snprintf(path, sizeof path, "written by %.300s", job->part.coordinator);
    pthread_mutex_lock(mu);
    job->has_ckpt = 1;
    job->ckpt_step = step;
    pthread_mutex_unlock(mu);
  } else if (fresh) {
    double t0 = mono_seconds();
    /* keep 0: the disk holds one checkpoint, so the older ones go before the new one is
     * written (a failure while writing leaves none) */
    if (job->spec.ckpt_keep == 0) {
      pthread_mutex_lock(mu);
      job->has_ckpt = 0;
      pthread_mutex_unlock(mu);
      if ((rc = prune_checkpoints(r, 0)) < 0) goto out;
    }
    if ((rc = zt_trainer_save(r->trainer, path, r->err, sizeof r->err)) < 0 ||
        (rc = zt__series_sync(&r->series, r->err, sizeof r->err)) < 0)
      goto out;
    if ((rc = prune_checkpoints(r, job->spec.ckpt_keep ? job->spec.ckpt_keep : 1)) < 0)
      goto out;
    pthread_mutex_lock(mu);
    job->has_ckpt = 1;
    job->ckpt_step = step;
    pthread_mutex_unlock(mu);
    if ((rc = zt__job_write_status(job, r->err, sizeof r->err)) < 0) goto out;
    char rate[96];
    ckpt_rate(path, mono_seconds() - t0, rate, sizeof rate);
    zt__job_log(job, ZT_LOG_INFO, "checkpoint at step %d: %s (%s)", step, path, rate);
    json_t *ev = zt__job_event(job, "checkpoint");
    json_object_set_new(ev, "step", json_integer(step));
    json_object_set_new(ev, "path", json_string(path));
    zt__jobs_post(job, ZT__MSG_EVENT, ev, 0, 0, NULL);
  }
out:
  pthread_mutex_lock(mu);
  job->ckpt_taken = gen > job->ckpt_taken ? gen : job->ckpt_taken;
  pthread_mutex_unlock(mu);
  if (rc < 0)
    zt__jobs_post(job, ZT__MSG_CHECKPOINT, NULL, rc, gen, r->err);
  else
    zt__jobs_post(job, ZT__MSG_CHECKPOINT, json_pack("{s:i, s:s}", "step", step, "path", path),
                  0, gen, NULL);
  return rc;
}

/* Stream: waits for one micro-batch. 1 = got it; 0 = woken for a stop or a checkpoint request
 * (the batches already taken stay in r->batch for the step), or with r->starved set when no
 * producer has been connected for data.stream_timeout seconds. A job spanning daemons
 * checkpoints after its next step (the flags), so a request does not interrupt its wait; its
 * parts wait for their coordinator, not for producers. */
static int take_micro_batch(runner *r, int32_t *dst, uint8_t *marks) {
  zt__job *job = r->job;
  pthread_mutex_t *mu = &job->jobs->mu;
  int got = 0, timeout = job->part.member ? 0 : job->spec.stream_timeout;
  pthread_mutex_lock(mu);
  while (job->ring.count == 0 && job->stop == ZT__STOP_NONE &&
         (r->spans || job->ckpt_requested == job->ckpt_taken)) {
    if (!timeout || job->n_producers) {
      pthread_cond_wait(&job->cond, mu);
      continue;
    }
    double deadline = job->idle_since + timeout;
    if (zt__mono() >= deadline) {
      r->starved = 1;
      break;
    }
    struct timespec ts = {.tv_sec = (time_t)deadline,
                          .tv_nsec = (long)((deadline - (double)(time_t)deadline) * 1e9)};
    pthread_cond_timedwait(&job->cond, mu, &ts);
  }
  if (job->ring.count > 0 && job->stop == ZT__STOP_NONE &&
      (r->spans || job->ckpt_requested == job->ckpt_taken)) {
    zt__batch_ring_take(&job->ring, dst, marks);
    got = 1;
  }
  pthread_mutex_unlock(mu);
  if (got) zt__jobs_post(job, ZT__MSG_CONSUMED, NULL, 0, 0, NULL);
  return got;
}

/* A plan with NVMe files: the trainer keeps them in a directory of the job's own,
 * <nvme_dir>/ztd-<id>.XXXXXX, recorded in the job's directory until the runner removes it, so
 * that a daemon killed mid-job finds and removes the files when it restarts (load_job). */
static int make_nvme_dir(runner *r, zt_offload_cfg *oc) {
  zt__job *job = r->job;
  int rc;
  if ((size_t)snprintf(r->nvme_dir, sizeof r->nvme_dir, "%s/ztd-%s.XXXXXX", oc->nvme_dir,
                       job->id) >= sizeof r->nvme_dir) {
    r->nvme_dir[0] = 0;
    snprintf(r->err, sizeof r->err, "offload.nvme_dir: %.1500s: %s", oc->nvme_dir,
             strerror(ENAMETOOLONG));
    return -ENAMETOOLONG;
  }
  if (!mkdtemp(r->nvme_dir)) {
    rc = -errno;
    r->nvme_dir[0] = 0;
    snprintf(r->err, sizeof r->err, "offload.nvme_dir: %.1500s: %s", oc->nvme_dir, strerror(-rc));
    return rc;
  }
  if ((rc = zt__store_nvme_record(job->dir, r->nvme_dir, r->err, sizeof r->err)) < 0) return rc;
  snprintf(oc->nvme_dir, sizeof oc->nvme_dir, "%s", r->nvme_dir);
  return 0;
}

/* A full disk (or a file size limit) while the trainer reserves its files: the numbers for the
 * whole tier, after the trainer's message naming the file that did not fit. */
static void explain_nvme_space(runner *r, int rc) {
  const zt_job_spec *s = &r->job->spec;
  char why[ZT__ERR_MAX], bytes[32];
  uint64_t need = r->nvme_bytes;
  if (rc != -ENOSPC && rc != -EFBIG && rc != -EDQUOT) return;
  zt_size_format(bytes, sizeof bytes, (double)need);
  snprintf(why, sizeof why, "%s", r->err);
  /* cut to fit: the trainer's message first, then the directory */
  snprintf(r->err, sizeof r->err, "%.1400s (the job's NVMe tier needs %s, %" PRIu64 " bytes, in "
           "offload.nvme_dir %.500s)", why, bytes, need, s->offload.nvme_dir);
}

/* The step's rows in the trainer's planes. */
static int alloc_rows(runner *r) {
  const zt_job_spec *s = &r->job->spec;
  size_t n = (size_t)r->micros * (size_t)s->train.micro_batch * (size_t)s->model.seq_len;
  r->rows.inputs = malloc(3 * n * sizeof(int32_t));
  if (!r->rows.inputs) return -ENOMEM;
  r->rows.targets = r->rows.inputs + n;
  r->rows.positions = r->rows.targets + n;
  return 0;
}

/* The file source's packing and the step's rows. */
static int open_rows(runner *r) {
  const zt_job_spec *s = &r->job->spec;
  r->packing = zt__job_packing_of(s->packing, r->tokens.version);
  if (alloc_rows(r) < 0 ||
      (r->packing == ZT_PACKING_DOCUMENTS &&
       zt__packer_init(&r->packer, &r->tokens, s->model.seq_len, s->train.seed, s->shuffle,
                       s->train.epochs) < 0)) {
    snprintf(r->err, sizeof r->err, "out of memory for the data's rows");
    return -ENOMEM;
  }
  return 0;
}

static int resume_load(runner *r);

static int open_job(runner *r) {
  zt__job *job = r->job;
  const zt_job_spec *s = &job->spec;
  const zt_backend *be = &r->ranks[0].be;
  zt_offload_cfg oc = s->offload;
  int rc;
  /* the files again, confined as at the submit: a name may lead elsewhere by now */
  zt_path_roots files = zt__job_roots(&job->jobs->cfg, job->tcp, 0);
  if (s->source == ZT_DATA_FILE &&
      (rc = zt__token_file_open(&r->tokens, "data.path", s->data_path, 1, &files, r->err,
                                sizeof r->err)) < 0)
    return rc;
  if (s->source == ZT_DATA_FILE && (rc = open_rows(r)) < 0) return rc;
  /* the trainer reads the init file by the name it resolved to here */
  zt_model_cfg *mc = &r->model;
  *mc = s->model;
  /* a resume's checkpoint replaces the initial weights: drawing or reading them is wasted (the
   * seeded init of an 8 B model is minutes of CPU) */
  mc->init_loaded = r->resume_step > 0;
  /* model.init.job's file is the daemon's own (its job directory), not the client's */
  if (mc->init_path[0] &&
      (rc = zt_path_open(mc->init_job[0] ? "model.init.job" : "model.init.safetensors",
                         s->model.init_path, 0, mc->init_job[0] ? NULL : &files, NULL,
                         mc->init_path, sizeof mc->init_path, r->err, sizeof r->err)) < 0)
    return rc;
  /* one rank runs the plan admission stored (plan.json, checked or made again by the start
   * check, queue.c); the open checks it again, it does not search. With NVMe files (optimizer
   * nvme, or auto's host/NVMe split) they get their directory. */
  zt_offload_placement plan;
  if (s->has_offload && r->world == 1) {
    if ((rc = zt__store_plan_read(job->dir, &plan, r->err, sizeof r->err)) < 0) return rc;
    r->nvme_bytes = plan.nvme_bytes;
  }
  zt_train_cfg tc = zt__job_rank_train_cfg(s);
  zt_dp_cfg dpc = zt__job_dp_cfg(s, r->rank0, r->local);
  if (s->has_offload && r->world > 1) {
    /* optimizer nvme: every rank here reserves its files */
    uint64_t per = zt_dp_estimate_nvme_bytes(&s->model, &tc, &dpc);
    if (per != UINT64_MAX) r->nvme_bytes = per * (uint64_t)r->local;
  }
  if (r->nvme_bytes > 0 && (rc = make_nvme_dir(r, &oc)) < 0) return rc;
  if (r->world > 1) {
    dpc.nvme_dir = oc.nvme_dir; /* the job's directory under it */
    rc = zt_trainer_open_dp(&r->trainer, mc, &tc, &dpc, r->ranks, r->err, sizeof r->err);
  } else if (s->has_offload) {
    rc = zt_trainer_open_offload(&r->trainer, mc, &s->train, &oc, &plan, be, r->err,
                                 sizeof r->err);
  } else {
    rc = zt_trainer_open(&r->trainer, mc, &s->train, be, r->err, sizeof r->err);
  }
  if (rc < 0) {
    if (r->nvme_dir[0]) explain_nvme_space(r, rc);
    return rc;
  }
  int newest = r->resume_step;
  if (newest > 0 && job->part.member) {
    /* the coordinator reads its checkpoint and scatters it to every rank (dp.h) */
    if ((rc = zt_trainer_dp_receive_state(r->trainer, newest, newest, r->err, sizeof r->err)) < 0)
      return rc;
    zt__job_log(job, ZT_LOG_INFO, "resumes from %s's checkpoint at step %d",
                job->part.coordinator, newest);
  } else if (newest > 0) {
    if ((rc = resume_load(r)) < 0) return rc;
    newest = r->resume_step;  /* an older one where the newest was corrupt */
  }
  int step = zt_trainer_step_count(r->trainer);
  /* Steps after the checkpoint are trained again (the sampler makes them identical). */
  if ((rc = zt__store_losses_truncate(job->dir, step, r->err, sizeof r->err)) < 0) return rc;
  char path[ZT__JOB_DIR_MAX + 16];
  snprintf(path, sizeof path, "%s/losses.log", job->dir);
  r->losses = fopen(path, "ae");
  if (!r->losses) {
    rc = -errno;
    snprintf(r->err, sizeof r->err, "%s: %s", path, strerror(errno));
    return rc;
  }
  if ((rc = zt__series_open(&r->series, job->dir, step, s->log_tensorboard, r->err,
                            sizeof r->err)) < 0)
    return rc;
  /* zeros: a part fills only its ranks' micro-batches of a pushed step (a file's rows are in
   * r->rows; a stream's are made there from r->batch and r->marks) */
  if (s->source == ZT_DATA_STREAM) {
    r->batch = calloc((size_t)r->micros * job->micro_tokens, sizeof(int32_t));
    r->marks = calloc((size_t)r->micros * job->micro_tokens, 1);
    if (r->batch && r->marks && alloc_rows(r) < 0) {
      free(r->marks);
      r->marks = NULL;
    }
  }
  if (s->source == ZT_DATA_STREAM && (!r->batch || !r->marks)) {
    snprintf(r->err, sizeof r->err, "out of memory for the batch buffer");
    return -ENOMEM;
  }
  if ((rc = zt__runner_open_eval(r)) < 0) return rc;
  pthread_mutex_lock(&job->jobs->mu);
  job->step = step;
  job->has_ckpt = newest > 0;
  job->ckpt_step = newest;
  job->backend_bytes = zt_trainer_backend_bytes(r->trainer);
  pthread_mutex_unlock(&job->jobs->mu);
  return 0;
}

/* The checkpoint a job resumes from is the newest that passes its checksums. A flat one (no
 * manifest) of a job on this daemon alone is verified by its load, which sums every tensor as it
 * reads it (engine/train/checkpoint/sums.c): its bytes are read once. A per-rank one, whose load
 * does not read its model.safetensors, and any of a job spanning daemons, whose parts are told
 * the step before the load, are verified first (zt_checkpoint_verify: a second read). Those
 * that fail are moved aside once one passes (step-NNNNNNNN.corrupt: kept for a look, no longer
 * the job's newest) and the job's log and a "resume" event say so; when none passes the job
 * fails rather than start over, its checkpoints left in place. */

/* A checkpoint that failed: logged, and the first failure kept for the event. */
static void ckpt_failed(runner *r, int step, const char *why) {
  zt__job_log(r->job, ZT_LOG_WARN, "checkpoint at step %d fails its verification: %s", step, why);
  if (!r->ckpt_first_bad[0]) snprintf(r->ckpt_first_bad, sizeof r->ckpt_first_bad, "%s", why);
}

/* The newest checkpoint below step `below` to try: verified here where its load would not
 * verify it (above), else taken as it is. The step, 0 for none, or -errno with r->err. */
static int intact_checkpoint(runner *r, int below) {
  zt__job *job = r->job;
  int *steps = NULL, n = zt__store_checkpoints(job->dir, &steps), pick = -1, rc = 0;
  char path[ZT__JOB_DIR_MAX + 64], why[ZT__ERR_MAX];
  if (n < 0) {
    snprintf(r->err, sizeof r->err, "%s/checkpoints: %s", job->dir, strerror(-n));
    return n;
  }
  for (int i = n - 1; i >= 0 && pick < 0; i--) {
    if (steps[i] >= below) continue;
    r->ckpt_any = 1;
    zt__store_checkpoint_path(path, sizeof path, job->dir, steps[i]);
    char manifest[sizeof path + 16];
    snprintf(manifest, sizeof manifest, "%s/manifest.json", path);
    r->ckpt_verified = r->spans || access(manifest, F_OK) == 0;
    if (!r->ckpt_verified) {
      pick = i;
      break;
    }
    rc = zt_checkpoint_verify(path, NULL, why, sizeof why);
    if (rc >= 0) {
      pick = i;
      if (rc == 1)
        zt__job_log(job, ZT_LOG_WARN, "%s has no checksums (written before zt recorded "
                    "them): resumes from it unverified", path);
    } else {
      ckpt_failed(r, steps[i], why);
    }
  }
  int step = pick >= 0 ? steps[pick] : 0;
  free(steps);
  if (r->ckpt_any && pick < 0) {
    snprintf(r->err, sizeof r->err, "no intact checkpoint to resume from (the newest: %.1900s)",
             r->ckpt_first_bad);
    return -EBADMSG;
  }
  return step;
}

/* Once the job resumes from step: the newer checkpoints, which failed, moved aside, and the
 * event that says why. */
static void ckpt_resumed(runner *r, int step) {
  zt__job *job = r->job;
  int *steps = NULL, n = zt__store_checkpoints(job->dir, &steps);
  char path[ZT__JOB_DIR_MAX + 64];
  for (int i = n - 1; i >= 0 && steps[i] > step; i--) {
    char aside[sizeof path + 16];
    zt__store_checkpoint_path(path, sizeof path, job->dir, steps[i]);
    snprintf(aside, sizeof aside, "%s.corrupt", path);
    zt__store_remove_tree(aside);
    if (rename(path, aside) < 0)
      zt__job_log(job, ZT_LOG_WARN, "moving %s aside: %s", path, strerror(errno));
  }
  free(steps);
  if (r->ckpt_first_bad[0]) {
    char msg[ZT__ERR_MAX + 128];
    snprintf(msg, sizeof msg, "the newest checkpoint failed its verification (%.1800s); "
             "resumes from the newest intact one, at step %d", r->ckpt_first_bad, step);
    zt__job_log(job, ZT_LOG_WARN, "%s", msg);
    json_t *ev = zt__job_event(job, "resume");
    json_object_set_new(ev, "step", json_integer(step));
    json_object_set_new(ev, "message", json_string(msg));
    zt__jobs_post(job, ZT__MSG_EVENT, ev, 0, 0, NULL);
  }
}

/* The trainer loaded from r->resume_step's checkpoint, or an older one where a load finds the
 * newer corrupt: a load that fails with a checksum mismatch is corrupt; one that fails
 * otherwise is read again by zt_checkpoint_verify to tell a damaged file (corrupt) from a
 * checkpoint that does not fit the job (the job fails with the load's error). */
static int resume_load(runner *r) {
  zt__job *job = r->job;
  char path[ZT__JOB_DIR_MAX + 64], why[ZT__ERR_MAX];
  for (;;) {
    int step = r->resume_step, rc;
    zt__store_checkpoint_path(path, sizeof path, job->dir, step);
    double t0 = mono_seconds();
    if ((rc = zt_trainer_load(r->trainer, path, r->err, sizeof r->err)) == 0) {
      char rate[96];
      ckpt_rate(path, mono_seconds() - t0, rate, sizeof rate);
      zt__job_log(job, ZT_LOG_INFO, "resumes from %s (step %d), loaded %s", path, step, rate);
      ckpt_resumed(r, step);
      return 0;
    }
    if (r->ckpt_verified) return rc;
    if (rc == -EBADMSG)
      snprintf(why, sizeof why, "%s", r->err);
    else if (zt_checkpoint_verify(path, NULL, why, sizeof why) >= 0)
      return rc;
    ckpt_failed(r, step, why);
    if ((rc = intact_checkpoint(r, step)) <= 0) {
      if (rc == 0)
        snprintf(r->err, sizeof r->err, "no intact checkpoint to resume from (the newest: "
                 "%.1900s)", r->ckpt_first_bad);
      return rc < 0 ? rc : -EBADMSG;
    }
    r->resume_step = rc;
  }
}

/* A job spanning daemons stopped after `step` because a part asked (engine/train/dp/dp.h's
 * flags): this part's own request decides how it ends (cancelled, or stopped by its daemon's
 * shutdown: the coordinator resumes on restart); a stop asked by another part fails the
 * coordinator's job, naming why, and ends this part as cancelled. */
static void stopped_together(runner *r, zt__stop own, int step, unsigned flags,
                             zt_job_state *final, int *leave_running) {
  zt__job *job = r->job;
  int member = job->part.member;
  r->together = 1;
  const char *kept = flags & ZT_DP_FLAG_CHECKPOINT ? "; its checkpoint at that step is kept" : "";
  if (own == ZT__STOP_SHUTDOWN && !member) {
    zt__job_log(job, ZT_LOG_INFO, "stopped at step %d by the daemon's shutdown, with its parts; "
                "resumes on restart", step);
    *leave_running = 1;
  } else if (own != ZT__STOP_NONE || member) {
    zt__job_log(job, ZT_LOG_INFO, "stopped at step %d (%s)%s", step,
                own == ZT__STOP_CANCEL ? "cancelled" : own == ZT__STOP_SHUTDOWN
                ? "the daemon shuts down" : "another part asked", kept);
    *final = ZT_JOB_CANCELLED;
  } else {
    snprintf(r->err, sizeof r->err, "stopped after step %d by a part on a peer (cancelled "
             "there, or its daemon shut down)%s", step, kept);
    *final = ZT_JOB_FAILED;
  }
}

void zt__runner_interrupt(zt__job *job, const char *why) {
#ifdef ZT_HAVE_NCCL
  if (job->interrupt) zt_comm_nccl_cancel_fire(job->interrupt, why);
#else
  (void)job;
  (void)why;
#endif
}

/* The nominal peak flops/s of the devices the job's world runs on (engine/base/tunables.h). */
static double world_peak_flops(const runner *r) {
  const zt_jobs_config *cfg = &r->job->jobs->cfg;
  const zt_train_cfg *tc = &r->job->spec.train;
  double one = ZT_TUNE_PEAK_FLOPS_CPU_THREAD * zt__jobs_rank_threads(cfg);
  if (strcmp(cfg->backend, "cuda") == 0)
    one = tc->precision != ZT_F32 ? ZT_TUNE_PEAK_FLOPS_CUDA_LP
          : tc->tf32              ? ZT_TUNE_PEAK_FLOPS_CUDA_TF32
                                  : ZT_TUNE_PEAK_FLOPS_CUDA_F32;
  return one * r->world;
}

/* One optimizer step with its bookkeeping; *flags gets the step's flags (dp.h). */
static int train_step(runner *r, double run_start, int run_first_step, unsigned *flags) {
  zt__job *job = r->job;
  const zt_job_spec *s = &job->spec;
  zt_step_result res;
  double t0 = mono_seconds();
  if (s->source == ZT_DATA_STREAM)
    zt__rows_from_pushed(r->batch, r->marks, r->micros, s->train.micro_batch, s->model.seq_len,
                         &r->rows);
  zt_batch b = {.inputs = r->rows.inputs, .targets = r->rows.targets,
                .positions = r->rows.positions};
  /* the timeline is the step's own: what the open, an evaluation or a checkpoint did between
   * steps is not in it */
  if (s->has_offload && zt_trainer_offload_stats(r->trainer, &r->last) < 0)
    memset(&r->last, 0, sizeof r->last);
  int rc = zt_trainer_step_batch(r->trainer, &b, &res, r->err, sizeof r->err);
  if (rc < 0) return rc;
  *flags = res.flags;
  double now = mono_seconds();
  r->have = 0;
  if (fprintf(r->losses, "%d %.17g\n", res.step, res.loss) < 0 || fflush(r->losses) != 0) {
    rc = -errno;
    snprintf(r->err, sizeof r->err, "%s/losses.log: %s", job->dir, strerror(errno));
    return rc;
  }
  double dt = now - t0;
  double tokens_per_s = dt > 0 ? (double)res.tokens / dt : 0.0;
  size_t backend_bytes;
  pthread_mutex_lock(&job->jobs->mu);
  job->step = res.step;
  job->has_loss = 1;
  job->loss = res.loss;
  job->tokens_per_s = tokens_per_s;
  backend_bytes = job->backend_bytes;
  pthread_mutex_unlock(&job->jobs->mu);

  double per_step = (now - run_start) / (double)(res.step - run_first_step);
  json_t *ev = zt__job_event(job, "step");
  json_object_set_new(ev, "step", json_integer(res.step));
  json_object_set_new(ev, "steps", json_integer(s->train.steps));
  json_object_set_new(ev, "loss", json_real(res.loss));
  json_object_set_new(ev, "lr", json_real(res.lr));
  /* a skipped fp16 step's norm is inf or nan, which JSON cannot carry: reported as null */
  json_object_set_new(ev, "grad_norm",
                      isfinite(res.grad_norm) ? json_real(res.grad_norm) : json_null());
  json_object_set_new(ev, "skipped", json_boolean(res.skipped));
  json_object_set_new(ev, "loss_scale", json_real(res.loss_scale));
  json_object_set_new(ev, "tokens_per_s", json_real(tokens_per_s));
  json_object_set_new(ev, "tokens", json_integer(res.tokens));
  json_object_set_new(ev, "step_s", json_real(dt));
  /* MFU by the 6 * N * tokens rule (tunables.h) */
  double n_params = (double)zt_model_num_params(zt_trainer_model(r->trainer));
  json_object_set_new(ev, "mfu", json_real(6.0 * n_params * tokens_per_s / world_peak_flops(r)));
  json_object_set_new(ev, "eta_s", json_real(per_step * (double)(s->train.steps - res.step)));
  zt_offload_stats os;
  int off = s->has_offload && zt_trainer_offload_stats(r->trainer, &os) == 0;
  json_t *mem = zt__runner_memory_json(r, backend_bytes, off ? &os : NULL);
  if (mem && off) {
    json_object_set_new(mem, "offload", zt__runner_offload_json(r, &os, &r->last));
  }
  zt__runner_publish_memory(r, mem);
  json_object_set_new(ev, "memory", mem);
  if ((rc = zt__series_step(&r->series, ev, r->err, sizeof r->err)) < 0) {
    json_decref(ev);
    return rc;
  }
  zt__jobs_post(job, ZT__MSG_EVENT, ev, 0, 0, NULL);
  return 0;
}

void *zt__runner_main(void *arg) {
  runner r = {.job = arg, .tokens = {.fd = -1}, .eval_tokens = {.fd = -1}};
  zt__job *job = r.job;
  const zt_job_spec *s = &job->spec;
  pthread_mutex_t *mu = &job->jobs->mu;
  int rc = 0;
  zt_job_state final = ZT_JOB_FAILED;
  int leave_running = 0;
  r.local = job->n_held;
  r.world = zt__job_world(s);
  r.rank0 = job->part.member ? job->part.rank0 : 0;
  r.spans = r.world > r.local;
  r.micros = r.world * s->train.grad_accum;

  double admitted = mono_seconds();
  if (job->part.member) r.resume_step = job->part.resume_step;
  else if ((rc = r.resume_step = intact_checkpoint(&r, INT_MAX)) < 0) goto out;
  if ((rc = zt__job_write_status(job, r.err, sizeof r.err)) < 0) goto out;
  if ((rc = zt__runner_open_ranks(&r)) < 0 || (rc = open_job(&r)) < 0) goto out;
  zt__runner_publish_opened(&r);

  double run_start = mono_seconds();
  /* the time to a first step a user waits for (docs/BENCHMARKS.md "Time to the first step") */
  zt__job_log(job, ZT_LOG_INFO, "ready to train %.2f s after its start (devices, %s, buffers)",
              run_start - admitted, r.resume_step > 0 ? "checkpoint loaded" : "initial weights");
  int run_first_step = zt_trainer_step_count(r.trainer);
  for (;;) {
    pthread_mutex_lock(mu);
    zt__stop stop = job->stop;
    uint64_t gen = job->ckpt_requested;
    int want_ckpt = gen != job->ckpt_taken;
    pthread_mutex_unlock(mu);
    int step = zt_trainer_step_count(r.trainer);

    if (stop == ZT__STOP_ABORT) {
      leave_running = 1;
      goto out;
    }
    unsigned flags = 0;
    if (r.spans) {
      /* every part stops or checkpoints after the same step: the one whose flags ask for it */
      if (stop != ZT__STOP_NONE) flags |= ZT_DP_FLAG_STOP;
      if (stop == ZT__STOP_SHUTDOWN || want_ckpt) flags |= ZT_DP_FLAG_CHECKPOINT;
    } else if (stop == ZT__STOP_CANCEL) {
      final = ZT_JOB_CANCELLED;
      goto out;
    } else if (stop == ZT__STOP_SHUTDOWN) {
      if (step > 0 && (rc = checkpoint(&r, gen)) < 0) goto out;
      zt__job_log(job, ZT_LOG_INFO, "stopped at step %d by the daemon's shutdown; resumes on restart",
                  step);
      leave_running = 1;
      goto out;
    } else if (want_ckpt && (rc = checkpoint(&r, gen)) < 0) {
      goto out;
    }
    if (step >= s->train.steps) break;

    if (s->source == ZT_DATA_FILE) {
      if (r.packing == ZT_PACKING_DOCUMENTS)
        zt__packer_fill(&r.packer, step + 1, r.micros, s->train.micro_batch, &r.rows);
      else
        zt__token_file_windows(&r.tokens, s->train.seed, step + 1, r.micros,
                               s->train.micro_batch, s->model.seq_len, &r.rows);
      /* the last step of train.epochs: its rows past the epochs' are padding */
      if (r.packing == ZT_PACKING_WINDOWS && s->train.epochs)
        zt__rows_pad_from(zt__token_file_epoch_rows(&r.tokens, s->model.seq_len) *
                              (uint64_t)s->train.epochs,
                          step + 1, r.micros, s->train.micro_batch, s->model.seq_len, &r.rows);
    } else {
      /* a part takes its own ranks' micro-batches (the coordinator forwards them), the
       * coordinator every rank's */
      int G = s->train.grad_accum, first = job->part.member ? r.rank0 * G : 0;
      int want = job->part.member ? r.local * G : r.micros;
      while (r.have < want &&
             take_micro_batch(&r, r.batch + (size_t)(first + r.have) * job->micro_tokens,
                              r.marks + (size_t)(first + r.have) * job->micro_tokens))
        r.have++;
      if (r.have < want && r.starved) {
        /* the device is not held for a producer that is not coming back */
        int kept = !r.spans && step > 0 && (rc = checkpoint(&r, gen)) == 0;
        if (!r.spans && step > 0 && rc < 0) goto out;
        snprintf(r.err, sizeof r.err, "no producer has been connected to push data for %d s "
                 "(data.stream_timeout): stopped at step %d%s", s->stream_timeout, step,
                 kept ? ", its checkpoint kept" : "");
        rc = -ETIMEDOUT;
        goto out;
      }
      if (r.have < want && r.spans && stop != ZT__STOP_NONE) {
        /* no part is inside a step (this one lacks its data): end here, alone */
        zt__job_log(job, ZT_LOG_INFO, "stopped at step %d waiting for pushed data", step);
        if (stop == ZT__STOP_SHUTDOWN && !job->part.member) leave_running = 1;
        else final = ZT_JOB_CANCELLED;
        goto out;
      }
      if (r.have < want) continue;
      if (r.peers && (rc = zt__peers_push(r.peers, r.batch, r.marks, job->micro_tokens, r.err,
                                          sizeof r.err)) < 0)
        goto out;
    }
    if (r.spans) zt_trainer_dp_set_flags(r.trainer, flags);
    if ((rc = train_step(&r, run_start, run_first_step, &flags)) < 0) goto out;
    int now_step = zt_trainer_step_count(r.trainer);
    if (now_step == run_first_step + 1)
      zt__job_log(job, ZT_LOG_INFO, "first step (%d) done %.2f s after its start",
                  now_step, mono_seconds() - admitted);
    int last = now_step >= s->train.steps; /* the final checkpoint follows the loop */
    /* before the step's checkpoint, which records it */
    if (s->eval_path[0] && (last || (s->eval_every > 0 && now_step % s->eval_every == 0)) &&
        (rc = zt__runner_eval(&r)) < 0)
      goto out;
    if (!last && ((s->ckpt_every > 0 && now_step % s->ckpt_every == 0) ||
                  (flags & ZT_DP_FLAG_CHECKPOINT))) {
      pthread_mutex_lock(mu);
      gen = job->ckpt_requested;
      pthread_mutex_unlock(mu);
      if ((rc = checkpoint(&r, gen)) < 0) goto out;
    }
    if (!last && (flags & ZT_DP_FLAG_STOP)) {
      stopped_together(&r, stop, now_step, flags, &final, &leave_running);
      goto out;
    }
  }
  pthread_mutex_lock(mu);
  uint64_t gen = job->ckpt_requested;
  pthread_mutex_unlock(mu);
  if ((rc = checkpoint(&r, gen)) < 0) goto out;
  final = ZT_JOB_DONE;
  r.together = 1;

out:
  /* parts that stopped with this one end by themselves; after a failure here they are ended */
  zt__peers_finish(r.peers, r.together ? ZT_TUNE_PART_END_WAIT_S : 0);
  if (r.losses) fclose(r.losses);
  zt__series_close(&r.series);
  free(r.batch);
  free(r.marks);
  int final_step = r.trainer ? zt_trainer_step_count(r.trainer) : 0;
  zt_trainer_close(r.trainer); /* its NVMe files with it */
  r.trainer = NULL;
  zt__runner_publish_closed(&r);
  if (r.nvme_dir[0]) {
    int nrc = zt__store_remove_tree(r.nvme_dir);
    if (nrc < 0 || (nrc = zt__store_nvme_forget(job->dir)) < 0)
      zt__job_log(job, ZT_LOG_WARN, "removing its NVMe directory %s: %s", r.nvme_dir,
                  strerror(-nrc));
  }
  zt__runner_close_ranks(&r);
#ifdef ZT_HAVE_NCCL
  pthread_mutex_lock(mu);
  job->interrupt = NULL;
  pthread_mutex_unlock(mu);
  zt_comm_nccl_cancel_free(r.cancel);
#endif
  zt__packer_close(&r.packer);
  free(r.rows.inputs);
  zt__token_file_close(&r.tokens);
  zt__token_file_close(&r.eval_tokens);
  pthread_mutex_lock(mu);
  job->backend_bytes = 0;
  if (!leave_running) {
    job->state = final;
    job->ended = zt__now();
    if (final == ZT_JOB_FAILED) snprintf(job->error, sizeof job->error, "%s", r.err);
  }
  pthread_mutex_unlock(mu);
  if (!leave_running) {
    char err[ZT__ERR_MAX];
    if (zt__job_write_status(job, err, sizeof err) < 0)
      ZT_LOGE("job", "%s: %s", job->id, err);
    if (final == ZT_JOB_FAILED) zt__job_log(job, ZT_LOG_ERROR, "failed: %s", r.err);
    else zt__job_log(job, ZT_LOG_INFO, "%s at step %d", zt_job_state_name(final), final_step);
    json_t *ev = zt__job_event(job, "state");
    json_object_set_new(ev, "state", json_string(zt_job_state_name(final)));
    if (final == ZT_JOB_FAILED) json_object_set_new(ev, "error", json_string(r.err));
    zt__jobs_post(job, ZT__MSG_EVENT, ev, 0, 0, NULL);
    ev = zt__job_event(job, "end");
    json_object_set_new(ev, "state", json_string(zt_job_state_name(final)));
    pthread_mutex_lock(mu);
    json_object_set_new(ev, "step", json_integer(job->step));
    if (job->has_loss) json_object_set_new(ev, "loss", json_real(job->loss));
    if (job->has_eval) json_object_set_new(ev, "eval_loss", json_real(job->eval_loss));
    pthread_mutex_unlock(mu);
    if (final == ZT_JOB_FAILED) json_object_set_new(ev, "error", json_string(r.err));
    zt__jobs_post(job, ZT__MSG_EVENT, ev, 0, 0, NULL);
  }
  zt__jobs_post(job, ZT__MSG_EXIT, NULL, 0, 0, NULL);
  return NULL;
}
