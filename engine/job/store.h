/* The state directory on disk (docs/spec.md, "State directory"): the daemon's lock, each job's
 * spec.json and status.json (replaced atomically), losses.log, and its checkpoint directories. */
#ifndef ZT_JOB_STORE_H
#define ZT_JOB_STORE_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include "engine/plan/offload_plan.h"

/* Creates state_dir and state_dir/jobs if needed, checks they are writable, and takes the
 * exclusive lock state_dir/ztd.lock (-EBUSY naming the holder's pid when another daemon has it).
 * *lock_fd holds the lock until closed. */
int zt__store_open(const char *state_dir, int *lock_fd, char *err, size_t errlen);

/* dir/name replaced atomically: temp file, fsync, rename, fsync of dir. */
int zt__store_write_json(const char *dir, const char *name, const json_t *j, char *err,
                         size_t errlen);
/* NULL with err set when missing or not JSON. */
json_t *zt__store_read_json(const char *dir, const char *name, char *err, size_t errlen);
int zt__store_fsync_dir(const char *dir);

#define ZT__PLAN_FILE "plan.json"

/* job_dir/plan.json: a single-rank offloaded job's plan (engine/plan/plan_file.h), written at
 * admission and when a start plans again (queue.c), read by the start check and the runner.
 * Write: replaced atomically. Read: 0, or -ENOENT (none: a job from before plan.json) or
 * -EINVAL (not a plan, the field named), err saying which. */
int zt__store_plan_write(const char *job_dir, const zt_offload_placement *p, char *err,
                         size_t errlen);
int zt__store_plan_read(const char *job_dir, zt_offload_placement *p, char *err, size_t errlen);
/* rm -r; 0 when already absent. */
int zt__store_remove_tree(const char *path);
/* The bytes of the regular files under path (their sizes; symbolic links not followed). */
int zt__store_tree_bytes(const char *path, uint64_t *bytes);

/* job_dir/nvme.json, {"dir": path}: the directory an offloaded job's runner made under
 * offload.nvme_dir (ztd-<id>.XXXXXX) for its trainer's NVMe files, recorded while the runner
 * runs so that the files of a daemon killed mid-job can be found. Record (replaced atomically),
 * forget (0 when already absent). */
int zt__store_nvme_record(const char *job_dir, const char *nvme_dir, char *err, size_t errlen);
int zt__store_nvme_forget(const char *job_dir);
/* What a runner that never ended left: removes the recorded directory with everything in it,
 * when it is named as a runner of job `id` names it, then the record. 1 with dir_out set when a
 * directory was removed, 0 when there was no record, -errno with err (the record is dropped
 * unless the directory could not be removed). */
int zt__store_nvme_sweep(const char *job_dir, const char *id, char *dir_out, size_t dir_outlen,
                         char *err, size_t errlen);

/* state_dir/ids.json, {"next": N}: the next job id, kept when a job is removed (zt_jobs_rm) so
 * that its id is never given again, even when it was the highest on disk. Record (replaced
 * atomically); read: N, or 0 when there is none. */
int zt__store_ids_record(const char *state_dir, long next, char *err, size_t errlen);
long zt__store_ids_next(const char *state_dir);

/* job_dir/checkpoints/step-NNNNNNNN */
void zt__store_checkpoint_path(char *out, size_t outlen, const char *job_dir, int step);
/* Steps of the complete checkpoints (the step-NNNNNNNN directories), ascending; *steps is
 * malloc'd (NULL when none). Returns the count or -errno. */
int zt__store_checkpoints(const char *job_dir, int **steps);
/* The newest checkpoint's step, 0 when there is none. */
int zt__store_newest_checkpoint(const char *job_dir);
/* Removes all but the `keep` newest checkpoints, and the exports made from them (below). */
int zt__store_prune_checkpoints(const char *job_dir, int keep);

/* job_dir/export/NAME: a Hugging Face export of a checkpoint (engine/job/export_hf.c), NAME
 * hf-<step, 8 digits>-<fp32 | bf16>-<the largest shard's bytes>; name NULL: job_dir/export.
 * parse: 0 and *step for such a name, else -EINVAL. drop: removes the exports of checkpoint
 * `step` (best effort: what is left, the next export replaces). */
void zt__store_export_name(char *out, size_t outlen, int step, const char *dtype,
                           unsigned long long shard_bytes);
void zt__store_export_path(char *out, size_t outlen, const char *job_dir, const char *name);
int zt__store_export_parse(const char *name, int *step);
void zt__store_exports_drop(const char *job_dir, int step);

/* losses.log: one "step loss" line per optimizer step, from step 1 on; evals.log: one such line
 * per held-out evaluation (data.eval), the step it followed and its mean loss. Read returns the
 * losses in step order as a JSON array (a new reference, empty when the file is missing), the
 * evaluations as [[step, loss], ...]; truncate keeps the lines of both with step <= max_step (a
 * resumed job repeats the steps after its checkpoint, and their evaluations). append adds an
 * evaluation's line. */
json_t *zt__store_losses_read(const char *job_dir);
json_t *zt__store_evals_read(const char *job_dir);
int zt__store_losses_truncate(const char *job_dir, int max_step, char *err, size_t errlen);
int zt__store_evals_append(const char *job_dir, int step, double loss, char *err, size_t errlen);

#endif
