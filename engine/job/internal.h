/* Internals shared by the loop thread's files (registry.c, queue.c, admission.c, plan_reply.c,
 * credit.c, report.c, export.c, export_hf.c, recover.c, work.c and the workers it runs) and the
 * runner (runner.c, runner_ranks.c, runner_memory.c, runner_eval.c: one thread per running
 * job). The fields a runner and the loop both touch are guarded by
 * zt_jobs.mu; the rest belong to the loop thread, or to the runner while it runs. */
#ifndef ZT_JOB_INTERNAL_H
#define ZT_JOB_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <jansson.h>
#include <uv.h>
#include "engine/job/data.h"
#include "engine/job/jobs.h"
#include "engine/base/log.h"
#include "engine/job/series.h"
#include "engine/job/spec.h"
#ifdef ZT_HAVE_NCCL
#include "engine/comm/comm_nccl.h"
#endif

/* Paths under the state dir are bounded so that every message naming one fits ZT__ERR_MAX. */
#define ZT__STATE_DIR_MAX 960
#define ZT__JOB_DIR_MAX (ZT__STATE_DIR_MAX + 128)
#define ZT__ERR_MAX 2048
#define ZT__PART_NAME_MAX 320
/* model.init.job's weights, linked into the job's directory (admission.c, recover.c). */
#define ZT__INIT_FILE "init.safetensors"

/* Why a runner should leave its step loop. */
typedef enum zt__stop {
  ZT__STOP_NONE = 0,
  ZT__STOP_CANCEL,    /* end the job as cancelled */
  ZT__STOP_SHUTDOWN,  /* checkpoint, stay "running" on disk, exit */
  ZT__STOP_ABORT,     /* exit now (zt_jobs_close) */
} zt__stop;

typedef struct zt__pending_push {
  struct zt__pending_push *next;
  int32_t *tokens;
  uint8_t *marks;         /* ZT__MARK_* a token (data.h) */
  zt_jobs_done_cb done;
  void *owner;
} zt__pending_push;

typedef struct zt__ckpt_request {
  struct zt__ckpt_request *next;
  uint64_t gen;           /* answered by the first checkpoint taken at or after this request */
  zt_jobs_done_cb done;
  void *owner;
} zt__ckpt_request;

/* A job spanning daemons (parallel.peers): the coordinator (the daemon it was submitted to) runs
 * ranks 0 .. gpus-1 and starts a part on each peer with the join request; a part is a job of the
 * peer's own registry that runs ranks rank0 .. rank0+gpus-1 (engine/job/peers.c). */
typedef struct zt__job_part {
  int member;                 /* 1: this job is a part started by a coordinator's join */
  int rank0;                  /* member: its first rank */
  int resume_step;            /* member: the coordinator's checkpoint it starts from, 0 none */
  char nccl_id[2 * 128 + 1];  /* member: the NCCL group's id (zt_comm_nccl_id), hex */
  char coordinator[ZT__PART_NAME_MAX]; /* member: "host job", for messages */
  void *owner;                /* member: the join's connection; the part ends if it closes */
} zt__job_part;

typedef struct zt__job {
  struct zt_jobs *jobs;
  char id[ZT_JOB_ID_MAX];
  char dir[ZT__JOB_DIR_MAX];
  zt_job_spec spec;
  json_t *spec_json;          /* the normalised spec, as in spec.json */
  size_t micro_tokens;        /* B * (T + 1) */
  /* The devices (zt__jobs_devices' numbers) the job holds from its start until the loop joins
   * its runner: set by the loop thread before the runner starts, read by the runner. */
  int held[ZT_JOBS_MAX_GPUS];
  int n_held;
  zt__job_part part;          /* set before the runner starts, read-only after */
  int tcp;                    /* submitted over TCP: its paths are confined (jobs.h) */

  /* guarded by jobs->mu */
  zt_job_state state;
  int step;
  int has_loss;
  double loss;
  double tokens_per_s;        /* of the last step */
  int has_eval;               /* data.eval: the newest evaluation's step and mean loss */
  int eval_step;
  double eval_loss;
  char error[ZT__ERR_MAX];
  int64_t created, started, ended;   /* unix seconds; 0 = not yet */
  int has_ckpt;
  int ckpt_step;
  size_t backend_bytes;
  json_t *memory;                /* the last step event's memory object (per-tier bytes), under mu */
  zt__stop stop;
  /* a job with several ranks on cuda: the runner's NCCL cancel token (zt_comm_nccl_cancel),
   * fired by the loop when the job must end without reaching a step boundary (its coordinator's
   * connection closed, the daemon closes); NULL outside the runner's use of it */
  void *interrupt;
  uint64_t ckpt_requested;    /* generation of the newest checkpoint request */
  uint64_t ckpt_taken;        /* generation the newest checkpoint answered */
  zt__batch_ring ring;        /* stream jobs */
  /* stream jobs: the connections that pushed batches and are still open, and since when none
   * is (CLOCK_MONOTONIC seconds): data.stream_timeout counts from then (runner.c) */
  void **producers;
  int n_producers, cap_producers;
  double idle_since;
  pthread_cond_t cond;        /* runner waits for data; push, cancel, shutdown, producers
                                 coming and going signal it (CLOCK_MONOTONIC) */

  /* loop thread only */
  zt__pending_push *pushes, *pushes_tail;
  zt__ckpt_request *ckpt_requests;
  pthread_t thread;
  int has_thread;
  zt__job_needs needs;        /* measured when the job reached the head of the queue */
  int has_needs;
  /* a single-rank offloaded job's plan (plan.json) as admission made it, the start check
   * reused or made it again, or a restart read it: what show reports */
  int has_plan;
  zt_offload_placement plan;
  int checking;               /* a worker checks the machine for its start (queue.c) */
  int export_verified;        /* the checkpoint whose model.safetensors passed its checksums
                                 for an export (export.c), 0 none */
} zt__job;

/* Work off the loop thread (work.c): run on a worker, then finish on the loop thread unless
 * the registry closed meanwhile; release always, last. done/owner: the request it answers
 * (NULL once zt_jobs_forget dropped its owner). A task refers to a job by its id, not its
 * pointer: the job may be gone by the time it finishes. */
typedef struct zt__work {
  uv_work_t req;
  struct zt_jobs *jobs;
  struct zt__work *prev, *next;
  void (*run)(struct zt__work *w);
  void (*finish)(struct zt__work *w);
  void (*release)(struct zt__work *w);
  zt_jobs_done_cb done;
  void *owner;
} zt__work;

typedef enum zt__msg_kind {
  ZT__MSG_EVENT = 1,    /* obj: an event for on_event */
  ZT__MSG_CONSUMED,     /* the runner took a batch: refill the ring from pending pushes */
  ZT__MSG_CHECKPOINT,   /* a checkpoint finished (rc, obj {"step", "path"} or text) for gen */
  ZT__MSG_EXIT,         /* the runner thread is about to return: join it */
} zt__msg_kind;

typedef struct zt__msg {
  struct zt__msg *next;
  zt__job *job;
  zt__msg_kind kind;
  json_t *obj;
  int rc;
  uint64_t gen;
  char text[ZT__ERR_MAX];
} zt__msg;

typedef struct zt__exports zt__exports; /* export_hf.c */

struct zt_jobs {
  zt_jobs_config cfg;
  char state_dir[ZT__STATE_DIR_MAX];
  int lock_fd;
  uv_async_t *async;
  pthread_mutex_t mu;
  zt__msg *msgs, *msgs_tail;  /* guarded by mu */

  /* loop thread only */
  zt__job **all;              /* every job, by id */
  int n_all, cap_all;
  zt__job **queue;            /* FIFO of queued jobs */
  int n_queue;
  int n_dev;                  /* the device set (zt__jobs_devices) */
  int dev[ZT_JOBS_MAX_GPUS];
  zt__job *holder[ZT_JOBS_MAX_GPUS]; /* the running job holding dev[i], NULL when free */
  long next_id;
  int running;
  zt__exports *exports;       /* the Hugging Face exports' worker; NULL until the first */
  int shutting_down;
  int shutdown_notified;
  void (*shutdown_done)(void *user);
  void *shutdown_user;
  zt__work *works;            /* tasks out on workers */
  int closing;                /* zt_jobs_close ran: the last task frees the registry */
};

/* work.c */
void zt__jobs_work(zt_jobs *jobs, zt__work *w);
void zt__jobs_work_forget(zt_jobs *jobs, void *owner);
/* Marks the registry closed and cancels what has not started: 1 while tasks are still out (the
 * last one frees the registry), else 0. */
int zt__jobs_work_closed(zt_jobs *jobs);
/* registry.c: the registry's own memory, freed last. */
void zt__jobs_free(zt_jobs *jobs);

/* Runner -> loop (queue.c): appends under mu and wakes the loop. obj is stolen; text may be
 * NULL. */
void zt__jobs_post(zt__job *job, zt__msg_kind kind, json_t *obj, int rc, uint64_t gen,
                   const char *text);
/* report.c. Writes jobs/<id>/status.json from the job's current fields (taken under mu). */
int zt__job_write_status(zt__job *job, char *err, size_t errlen);
/* A line for the daemon's log that also goes to the job's own log, jobs/<id>/log (state
 * changes, resumes, checkpoints, errors: what a user reads to learn what happened to a job). */
void zt__job_log(const zt__job *job, zt_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* {"event": kind, "job": id} to add fields to. */
json_t *zt__job_event(const zt__job *job, const char *kind);

/* The loop thread's, by file (the definitions say more). registry.c: the jobs table, a job's
 * lifetime, its state's names. */
int zt__job_state_parse(const char *s, zt_job_state *out);
int zt__job_state_terminal(zt_job_state s);
zt_job_state zt__job_state_of(zt__job *job);
zt__job *zt__jobs_find(zt_jobs *jobs, const char *id, char *err, size_t errlen);
int zt__job_new(zt_jobs *jobs, const char *id, const zt_job_spec *spec, zt__job **out);
void zt__job_free(zt__job *job);
int zt__jobs_add(zt_jobs *jobs, zt__job *job);
int64_t zt__now(void);
/* CLOCK_MONOTONIC in seconds, the clock of job->cond's timed waits. */
double zt__mono(void);
/* queue.c: the queue, the devices, the runners' messages. */
void zt__jobs_on_async(uv_async_t *h);
int zt__jobs_free_devices(const zt_jobs *jobs);
void zt__jobs_start(zt_jobs *jobs, zt__job *job);
void zt__jobs_maybe_start(zt_jobs *jobs);
void zt__jobs_enqueue(zt_jobs *jobs, zt__job *job);
void zt__job_fail(zt_jobs *jobs, zt__job *job, const char *error);
/* credit.c: pushed batches and checkpoint requests answered. */
void zt__job_refill(zt__job *job);
void zt__job_fail_pending(zt__job *job, int rc, const char *message);
void zt__job_answer_checkpoints(zt__job *job, const zt__msg *m);
/* report.c: an event to the watchers (stolen). */
void zt__jobs_emit(zt_jobs *jobs, zt__job *job, json_t *ev);
/* export.c: bytes [offset, offset + length) of an open file (at most 16 MiB), *total its size;
 * what names it in messages ("the weights", a file name). */
int zt__export_read(int fd, const char *path, const char *what, uint64_t offset,
                    uint64_t length, uint8_t **data, size_t *len, uint64_t *total, char *err,
                    size_t errlen);
/* export_hf.c: a connection's waiting export requests dropped (zt_jobs_forget); the worker
 * stopped, what it was asked dropped unanswered (zt_jobs_close). */
void zt__exports_forget(zt_jobs *jobs, void *owner);
void zt__exports_close(zt_jobs *jobs);
/* recover.c: the state dir's jobs read back (zt_jobs_open). */
int zt__jobs_scan(zt_jobs *jobs, char *err, size_t errlen);
/* plan_reply.c: the plan request's reply of a spec admitted against cfg with needs nd; NULL with
 * *rc and err on failure. */
json_t *zt__job_plan_reply(const zt_jobs_config *cfg, const zt_job_spec *sp,
                           const zt__job_needs *nd, int *rc, char *err, size_t errlen);

/* The runner thread (runner.c). */
void *zt__runner_main(void *arg);
/* Fires a running job's interrupt (above) with the reason; under jobs->mu. */
void zt__runner_interrupt(zt__job *job, const char *why);

/* A runner's state, on its job's thread (runner.c: the step loop; runner_ranks.c: its backends
 * and communicators; runner_memory.c: what it reports of its memory). */
typedef struct zt__peers zt__peers; /* peers.h */
typedef struct runner {
  zt__job *job;
  zt_trainer *trainer;
  /* a rank per device the job holds here: its backend, and with several its communicator; the
   * job's world spans the peers' parts too (ranks rank0 .. rank0 + local - 1 are here) */
  int world, rank0, local;
  int spans;              /* the job spans daemons: this is its coordinator or a part */
#ifdef ZT_HAVE_NCCL
  zt_comm_nccl_cancel *cancel; /* ends this daemon's NCCL waits (job->interrupt) */
#endif
  zt__peers *peers;       /* the coordinator's parts on its peers */
  int resume_step;        /* the checkpoint the job starts from, 0 none */
  int ckpt_any;           /* a checkpoint was tried (runner.c's intact_checkpoint) */
  int ckpt_verified;      /* resume_step's was verified before its load */
  char ckpt_first_bad[ZT__ERR_MAX];  /* the first failure of a newer one, "" none */
  int together;           /* the parts stopped after the same step as this one */
  zt_dp_rank ranks[ZT_JOBS_MAX_GPUS];
  int n_be;                              /* backends opened, ranks 0 .. n_be-1 */
  char comm_open[ZT_JOBS_MAX_GPUS];
  void (*comm_close)(zt_comm *c);
  zt_comm_cpu_group *group;
  zt__token_file tokens;
  zt_data_packing packing; /* file source: the spec's, AUTO resolved by the file's version */
  zt__packer packer;      /* file source packed by documents */
  zt__rows rows;          /* the step's rows (one allocation at rows.inputs); a stream's are
                             made from batch and marks; an evaluation packs its own into them */
  zt__token_file eval_tokens; /* data.eval's file (fd -1: none) */
  int eval_documents;     /* its rows packed by documents, else windows */
  zt_model_cfg model;     /* the spec's, its init file by its resolved name */
  int micros;             /* micro-batches per step: world * grad_accum (engine/train/dp/dp.h) */
  int32_t *batch;         /* stream: the step's micro-batches, back to back */
  uint8_t *marks;         /* stream: their tokens' ZT__MARK_* (data.h) */
  int have;               /* stream: micro-batches of the next step already in batch */
  int starved;            /* stream: no producer for data.stream_timeout (take_micro_batch) */
  FILE *losses;
  zt__series series;          /* metrics.jsonl and TensorBoard's files (series.h) */
  char nvme_dir[ZT_PATH_MAX]; /* the job's directory under offload.nvme_dir; "" none */
  zt_offload_stats last;      /* offloaded: the stats just before this step (its timeline) */
  uint64_t nvme_bytes;        /* offloaded: the NVMe tier of its plan */
  char err[ZT__ERR_MAX];
} runner;

/* runner_ranks.c */
int zt__runner_open_ranks(runner *r);
void zt__runner_close_ranks(runner *r);
/* runner_eval.c: data.eval's file opened (nothing without data.eval), and an evaluation after
 * the trainer's current step (0, or -errno with r->err) */
int zt__runner_open_eval(runner *r);
int zt__runner_eval(runner *r);
/* runner_memory.c */
json_t *zt__runner_memory_json(const runner *r, size_t backend_bytes, const zt_offload_stats *os);
json_t *zt__runner_offload_json(const runner *r, const zt_offload_stats *os,
                                const zt_offload_stats *prev);
void zt__runner_publish_memory(runner *r, const json_t *mem);
void zt__runner_publish_closed(runner *r);
void zt__runner_publish_opened(runner *r);

#endif
