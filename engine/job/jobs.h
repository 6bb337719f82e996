/* The job layer of ztd: spec validation, the registry and FIFO queue, the per-job state
 * directory, the data sources, and the runner threads that drive the trainer.
 *
 * Threading: every function here is called on the daemon's loop thread (libuv), and every
 * callback (events, batch credit, checkpoint completion, shutdown) is invoked on that thread too:
 * runners hand results back through a locked queue and uv_async_send. Nothing here blocks the
 * loop for long (no training, no waiting on runners) and nothing here opens a user's path on it:
 * what reads the files a job names runs on libuv's thread pool (engine/job/work.c).
 *
 * Requests and replies are jansson objects: the server packs them to msgpack. Every error is a
 * negative errno plus a message naming the cause (field name for spec errors). */
#ifndef ZT_JOBS_H
#define ZT_JOBS_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include <uv.h>

#define ZT_JOB_ID_MAX 64
/* The most devices a daemon schedules jobs on (engine/train/dp/dp.h's ZT_DP_MAX_WORLD). */
#define ZT_JOBS_MAX_GPUS 64

typedef enum zt_job_state {
  ZT_JOB_QUEUED = 1,
  ZT_JOB_RUNNING,
  ZT_JOB_DONE,
  ZT_JOB_FAILED,
  ZT_JOB_CANCELLED,
} zt_job_state;

const char *zt_job_state_name(zt_job_state s);

/* An event for the watchers of one job, e.g. {"event": "step", "job": "j000001", ...}; the
 * callee must not keep the reference. Kinds: "state" (any state change, with "error" on
 * failure), "step" (step, steps, loss, lr, grad_norm, tokens_per_s, eta_s, memory, skipped,
 * loss_scale),
 * "checkpoint" (step, path), "end" (the final state; the last event of a job). */
typedef void (*zt_jobs_event_cb)(void *user, const char *job, json_t *event);

typedef struct zt_jobs_config {
  uv_loop_t *loop;
  const char *state_dir;        /* jobs/<id>/ live under it; must be writable */
  const char *backend;          /* "cpu" or "cuda" (engine/kernels/backend.h) */
  int cpu_threads;              /* 0 = all cores, split between the cpu_ranks */
  /* The device set jobs are scheduled on, a rank per device (a job takes parallel.gpus of them,
   * FIFO): on cuda the GPUs the daemon owns (n_gpus 0: GPU 0 alone); on cpu cpu_ranks
   * simulated ranks (0: one), each a CPU backend of cpu_threads / cpu_ranks threads. */
  int gpus[ZT_JOBS_MAX_GPUS];
  int n_gpus;
  int cpu_ranks;
  uint64_t host_mem_limit;      /* 0 = no limit; a cpu job whose backend bytes exceed it is refused */
  uint64_t gpu_mem_limit;       /* 0 = the device's memory; a cuda job above it is refused */
  const char *nvme_dir;         /* --nvme-dir: an offloaded job's NVMe tier unless its spec
                                   names one; NULL = none */
  /* Where jobs may reach, as resolved directories (symlinks followed). offload.nvme_dir must lie
   * inside one of nvme_dirs (--nvme-dir, nvme_dir the first); with none a Unix-socket client's
   * job may name any directory, a TCP client's none. A TCP client's job reads its files
   * (data.path, model.init.safetensors) only inside data_roots (--data-root; none: it may name
   * no file); a Unix-socket client's anywhere (the socket is 0600: it is the daemon's user). */
  const char *const *nvme_dirs;
  int n_nvme_dirs;
  const char *const *data_roots;
  int n_data_roots;
  uint32_t batch_queue_depth;   /* micro-batches a stream job buffers before credit stops */
  /* Quotas of submit: --max-queued, the jobs queued at once (0: none), refused with -EBUSY;
   * --max-state-bytes, the size of state_dir's jobs/ (0: none), at or over which a submit is
   * refused with -ENOSPC. Both with the numbers. */
  int max_queued;
  uint64_t max_state_bytes;
  /* A job spanning daemons (parallel.peers): the token this daemon sends its peers (its own
   * --token-file: the daemons of such a job share one), NULL = such jobs are refused; and how
   * the parts name this daemon in their messages ("host 10.0.0.1:7070"). */
  const char *peer_token;
  const char *name;
  /* Set in the view of a machine that a plan describes rather than this one (a plan request's
   * target, engine/job/target.h): its GPUs are not asked (each has gpu_mem_limit bytes) nor its
   * disks read: disk_bytes is the free space assumed at offload.nvme_dir and at the state dir
   * (0: not described, not checked). */
  int described;
  uint64_t disk_bytes;
  zt_jobs_event_cb on_event;
  void *user;
} zt_jobs_config;

typedef struct zt_jobs zt_jobs;

/* Scans state_dir/jobs: every earlier job is listed again; a job that was running when the
 * daemon stopped resumes from its last checkpoint when its data source is a file. */
int zt_jobs_open(zt_jobs **jobs, const zt_jobs_config *cfg, char *err, size_t errlen);
/* Stops runners without checkpointing (use zt_jobs_shutdown first for a graceful stop); running
 * jobs stay "running" on disk and resume from their last checkpoint. Pending done callbacks are
 * dropped without being called (zt_jobs_forget every owner first). The loop must run once more
 * afterwards to finish closing the registry's uv_async handle. */
void zt_jobs_close(zt_jobs *jobs);

/* {"queued": n, "running": n, "jobs": n, "memory": {...}, "gpus": [{"index", "job"}, ...]} for
 * the status reply: "gpus" is the device set, each with the job holding it (null: free). */
json_t *zt_jobs_status(zt_jobs *jobs);

/* Completion of an asynchronous request: rc 0 with a reply object (may be NULL), or -errno and
 * a message. Called exactly once unless zt_jobs_forget(owner) ran first. */
typedef void (*zt_jobs_done_cb)(void *owner, int rc, json_t *reply, const char *message);

/* Submit, plan and join answer later: the spec's structure is checked at once (-errno and the
 * message naming the field, done not called), then a worker checks the files it names and sizes
 * it (the loop never opens a user's file), and done gets the answer on the loop thread.
 *
 * tcp: the request came over TCP, whose clients' jobs reach only the directories the daemon
 * allows them (zt_jobs_config: data_roots, nvme_dirs); the job remembers it for its start.
 *
 * Submit: validates the spec (every field; the error names it), writes jobs/<id>/ and queues
 * the job; done gets {"job": id}. */
int zt_jobs_submit(zt_jobs *jobs, const json_t *spec, int tcp, zt_jobs_done_cb done,
                   void *owner, char *err, size_t errlen);
/* Daemon to daemon (the coordinator of a job spanning daemons calls it over TCP): validates the
 * job's normalised spec and its part ({"world", "rank0", "nccl_id", "resume_step",
 * "coordinator"}: engine/job/internal.h) and starts the part now on parallel.gpus free devices
 * (-EBUSY when they are not free: the coordinator waits for its parts, so they never queue);
 * done gets {"job": id}. The part belongs to conn: it ends when zt_jobs_forget(conn) reports the
 * connection gone. */
int zt_jobs_join(zt_jobs *jobs, const json_t *spec, const json_t *part, void *conn, int tcp,
                 zt_jobs_done_cb done, void *owner, char *err, size_t errlen);
/* The same validation and sizing as submit, without queueing; done gets {"backend", "arch",
 * "params", "backend_bytes", "parallel": {"gpus", "zero_stage", "rank_bytes": [per rank]}[,
 * "offload": {"host_bytes", "device_bytes", "nvme_bytes", ...}]}, or the refusal submit would
 * give (ENOMEM with the numbers when it cannot fit, ENOSPC when its NVMe files do not fit
 * offload.nvme_dir). target (NULL: this machine) describes another machine to plan for as a
 * daemon there would (engine/job/target.h; checked at once, -EINVAL naming the field): its
 * backend, devices, limits and rates, none of this machine's asked; the spec's files are
 * checked here as for any plan; the reply's "target" says what it was planned for. */
int zt_jobs_plan(zt_jobs *jobs, const json_t *spec, const json_t *target, int tcp,
                 zt_jobs_done_cb done, void *owner, char *err, size_t errlen);
/* {"jobs": [ {job, name, state, arch, step, steps, loss, created, gpus}, ... ]}; gpus: the
 * devices a running job holds ([] otherwise). */
json_t *zt_jobs_list(zt_jobs *jobs);
/* {job, name, state, arch, spec (normalised), step, steps, loss, tokens_per_s, created, started,
 * ended, checkpoint_step, gpus (as in the list), memory: {backend, backend_bytes, allocated,
 * peak, reserved, host_pinned, ...; offload: {...}} (docs/protocol.md),
 * losses: [loss of step 1, 2, ...],
 * error (failed jobs only)}; NULL + -ENOENT if unknown. */
json_t *zt_jobs_show(zt_jobs *jobs, const char *id, int *rc, char *err, size_t errlen);
/* A step event's figures as one flat record: {"kind": "step", step, time (the given Unix time),
 * loss, lr, grad_norm, loss_scale, skipped, tokens, tokens_per_s, step_s, mfu, memory: {device,
 * device_peak, host_pinned, nvme}, moved?: {h2d, d2h, nvme_read, nvme_written}, timeline?} (a
 * figure the event lacks is null; moved and timeline of an offloaded step): a line of the job's
 * metrics.jsonl, and the server's points for its dashboard and /metrics. An "eval" event's
 * (data.eval): {"kind": "eval", step, time, eval_loss, tokens (its counted targets), batches,
 * eval_s}. NULL: out of memory. */
json_t *zt_jobs_point(const json_t *event, double time);
/* A piece of the job's log (jobs/<id>/log) from byte `offset`, at most `length` bytes and
 * ZT_TUNE_LOG_CHUNK: {"data": text (valid UTF-8: other bytes as \xNN), "offset": where the
 * next piece starts, "size": the file's bytes now, "state": the job's}; an offset past the end
 * gives "" at the end. NULL + -ENOENT for an unknown job. */
json_t *zt_jobs_log(zt_jobs *jobs, const char *id, uint64_t offset, uint64_t length, int *rc,
                    char *err, size_t errlen);
/* Terminal states answer -EINVAL ("job j000003 is already done"). */
int zt_jobs_cancel(zt_jobs *jobs, const char *id, char *err, size_t errlen);
/* Removes a job that ended (done, failed, cancelled) and its directory; its id is never given
 * again. A queued or running job (or a cancelled one whose runner is still stopping) is
 * refused with -EBUSY. */
int zt_jobs_rm(zt_jobs *jobs, const char *id, char *err, size_t errlen);

/* Continued training: a job that ended done or cancelled is queued again to train to `steps`
 * (its spec's train.steps from now on, the schedule's horizon with it) from its newest
 * checkpoint; *reply {"job", "state": "queued", "steps", "from_step"}. Refusals: -ENOENT (no such
 * job, no checkpoint), -EBUSY (queued, running, still stopping; --max-queued), -EINVAL (failed,
 * a part, steps not above the job's step), -EACCES (tcp, and the job came over the Unix socket:
 * its files are not confined). */
int zt_jobs_resume(zt_jobs *jobs, const char *id, int64_t steps, int tcp, json_t **reply,
                   char *err, size_t errlen);

/* Queues one micro-batch for a stream job. Calls done with {"queued": n} (micro-batches now in
 * the job's queue) when the batch is in that queue: at once if there is room, later if the
 * queue is full (this is the client's credit). Tokens must be in [0, model.vocab); loss_mask
 * and doc_starts (each NULL, or a byte of 0 or 1 a token) say which tokens count as targets
 * (NULL: all) and which start a document within their row (NULL: none; docs/protocol.md). Wrong
 * job, wrong source, wrong token count or a bad byte fail synchronously (return -errno naming
 * the row and index, done not called). producer (the connection) counts as the job's producer
 * until zt_jobs_forget(producer): a running stream job with none for data.stream_timeout seconds
 * checkpoints and fails. */
int zt_jobs_push_batch(zt_jobs *jobs, const char *id, const int32_t *tokens,
                       const uint8_t *loss_mask, const uint8_t *doc_starts, size_t n_tokens,
                       void *producer, zt_jobs_done_cb done, void *owner, char *err,
                       size_t errlen);
/* Asks a running job to checkpoint at its next step boundary; done gets {"step", "path"}. */
int zt_jobs_checkpoint(zt_jobs *jobs, const char *id, zt_jobs_done_cb done, void *owner,
                       char *err, size_t errlen);
/* A connection went away: drop its pending callbacks (its batches not yet queued are dropped;
 * the job keeps waiting for data, uncorrupted); parts it joined end (failed, naming it). */
void zt_jobs_forget(zt_jobs *jobs, void *owner);

/* Reads up to `length` bytes (and at most 16 MiB) at `offset` of the job's latest exported
 * weights (the newest checkpoint's model.safetensors) on a worker; done gets them (data valid
 * during the call), the file's size and the checkpoint's step, or -ENOENT when the job has no
 * checkpoint yet, -EBADMSG naming the tensor when the file fails its checksums (verified once
 * per checkpoint, before its first chunk). An unknown job fails at once (done not called).
 * Called exactly once unless zt_jobs_forget(owner) ran first. */
typedef void (*zt_jobs_export_cb)(void *owner, int rc, const uint8_t *data, size_t len,
                                  uint64_t total, uint64_t step, const char *message);
int zt_jobs_export(zt_jobs *jobs, const char *id, uint64_t offset, uint64_t length,
                   zt_jobs_export_cb done, void *owner, char *err, size_t errlen);

/* The Hugging Face export of the job's newest checkpoint (docs/protocol.md, "export"): made on
 * a worker thread into the job's directory (export/, store.h) once per checkpoint, dtype ("fp32"
 * or "bf16") and max_shard_bytes (0: 5 GB), then done gets {"export": name, "step", "dtype",
 * "files": [{"name", "size"}, ...], "note"?}: weights first, config.json last; note says why
 * the job's source directory was not used. Unknown job or dtype: -errno now (done not called). */
int zt_jobs_export_hf(zt_jobs *jobs, const char *id, const char *dtype, uint64_t max_shard_bytes,
                      zt_jobs_done_cb done, void *owner, char *err, size_t errlen);
/* A chunk of file of that export, as zt_jobs_export_chunk (*step the export's); -ESTALE when
 * the export is gone (the next export replaced it, or its checkpoint was removed): its files
 * are to be asked for again. */
int zt_jobs_export_hf_chunk(zt_jobs *jobs, const char *id, const char *export_name,
                            const char *file, uint64_t offset, uint64_t length, uint8_t **data,
                            size_t *len, uint64_t *total, uint64_t *step, char *err,
                            size_t errlen);

/* Graceful stop: running jobs checkpoint and stop (they stay "running" on disk so the next
 * daemon resumes them); done is called when all runners have stopped. */
void zt_jobs_shutdown(zt_jobs *jobs, void (*done)(void *user), void *user);

#endif
