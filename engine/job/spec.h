/* The job spec: JSON in, a checked struct out (docs/spec.md is the normative text). Parsing is
 * split in two because a spec is read twice: at submit every check runs; when the daemon
 * reopens its state dir the stored spec is parsed again, but its files and the memory budget are
 * checked only when the job is about to start (a finished job stays listed even if its data file
 * is gone). */
#ifndef ZT_JOB_SPEC_H
#define ZT_JOB_SPEC_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include "engine/base/path.h"
#include "engine/job/jobs.h"
#include "engine/model/model.h"
#include "engine/train/dp/dp.h"
#include "engine/train/offload/offload.h"
#include "engine/train/trainer.h"

/* The bounds of the job's own fields (the model's and the recipe's are in engine/model/model.h
 * and engine/plan/recipe.h); docs/spec.md states them (tests/unit/layout/check_limits.py). */
#define ZT_JOB_NAME_MAX 64
#define ZT_JOB_MAX_KEEP 1000 /* checkpoint.keep */
/* zt_job_spec.gpus of "parallel": {"gpus": "all"} until admission makes it the daemon's count */
#define ZT_JOB_GPUS_ALL (-1)
/* parallel.peers: other ztd daemons ("host:port" of their TCP listeners) that run the job's
 * other ranks, each with parallel.gpus GPUs */
#define ZT_JOB_MAX_PEERS 15
#define ZT_JOB_PEER_MAX 256

typedef enum zt_data_source { ZT_DATA_FILE = 1, ZT_DATA_STREAM = 2 } zt_data_source;
/* data.packing; AUTO (not given): documents for a version 2 token file, windows for version 1 */
typedef enum zt_data_packing {
  ZT_PACKING_AUTO = 0, ZT_PACKING_WINDOWS = 1, ZT_PACKING_DOCUMENTS = 2
} zt_data_packing;

/* data.stream_timeout: seconds a running stream job waits with no producer connected before it
 * checkpoints and fails (0: for ever); the default, and the most (30 days). */
#define ZT_JOB_STREAM_TIMEOUT_DEFAULT 600
#define ZT_JOB_MAX_STREAM_TIMEOUT 2592000
/* data.eval.batches: a held-out evaluation's batches of a step's rows, at most */
#define ZT_JOB_MAX_EVAL_BATCHES 100000

typedef struct zt_job_spec {
  char name[ZT_JOB_NAME_MAX + 1];
  zt_model_cfg model;
  zt_train_cfg train;
  zt_data_source source;
  char data_path[ZT_PATH_MAX];   /* file source: absolute path of the token file */
  int stream_timeout;            /* stream source: data.stream_timeout, seconds */
  zt_data_packing packing;       /* file source: data.packing */
  int shuffle;                   /* file source: data.shuffle (documents packing) */
  /* data.eval: held-out evaluation (docs/spec.md "Held-out evaluation"), either source */
  char eval_path[ZT_PATH_MAX];   /* absolute path of its token file; "" none */
  int eval_every;                /* steps between evaluations; 0: at the end only */
  int eval_batches;              /* batches of a step's rows each evaluation */
  int ckpt_every;                /* 0 = only at the end and on shutdown */
  int ckpt_keep;                 /* newest checkpoints kept, >= 1 */
  int has_offload;               /* an "offload" object: the offloaded step (engine/train/offload/offload.h) */
  zt_offload_cfg offload;
  int offload_off;               /* "offload": false: never offloaded, refused where it does not
                                    fit the device (admission.c offloads by default otherwise) */
  int ckpt_given;                /* train.activation_checkpointing is in the submitted spec
                                    (admission.c: the planner leaves it as given, else makes it
                                    "auto"); not set by the parse */
  int gpus;                      /* parallel.gpus: ranks, one per device (engine/train/dp/dp.h) */
  int zero_stage;                /* parallel.zero_stage: 1, 2 or 3 (no effect with one rank) */
  int n_peers;                   /* parallel.peers: the daemons running ranks gpus * (i + 1) .. */
  char peers[ZT_JOB_MAX_PEERS][ZT_JOB_PEER_MAX];
  int log_tensorboard;           /* log.tensorboard: TensorBoard event files too (series.h) */
  size_t data_bytes;             /* host bytes of a "documents" file source's packer tables
                                    (zt__packer_bytes), set by zt__job_spec_check_files from the
                                    token file's header; not part of the parse */
} zt_job_spec;

/* The job's world: parallel.gpus ranks on this daemon and as many on each peer. */
static inline int zt__job_world(const zt_job_spec *s) { return s->gpus * (1 + s->n_peers); }

/* What a job takes from the machine while it runs. */
typedef struct zt__job_needs {
  size_t backend_bytes;          /* on the backend, every rank together */
  size_t rank_bytes;             /* on each rank's device (all ranks hold the same) */
  size_t host_bytes;             /* host memory, counted with the other running jobs' against
                                    the host limit (cpu: the backend's; cuda: an offload host
                                    tier) */
  int has_plan;                  /* a single-rank offloaded job: plan, what it runs */
  zt_offload_placement plan;
} zt__job_needs;

/* Structure, types, ranges and the model/train constraints; fills defaults. 0 or -EINVAL with a
 * message naming the field. */
int zt__job_spec_parse(const json_t *j, zt_job_spec *s, char *err, size_t errlen);
/* The same without reading a file, for ztd's loop thread: a model.hf directory's config.json is
 * left for zt__job_spec_read_model, which a worker calls before anything else uses s->model
 * (the directory confined first, as zt__job_spec_check_files confines it). */
int zt__job_spec_parse_unread(const json_t *j, zt_job_spec *s, char *err, size_t errlen);
int zt__job_spec_read_model(zt_job_spec *s, const zt_jobs_config *cfg, int tcp, char *err,
                            size_t errlen);
/* A job spec file parsed as submit parses it (the structure, not the machine's resources), for
 * programs that run a job's recipe without the daemon (tools/ztrain). 0 or -errno with the file
 * or the field named. */
int zt_job_spec_load(const char *path, zt_job_spec *s, char *err, size_t errlen);
/* The files the spec names, where the job will read them (engine/base/path.h: each must resolve
 * to a regular file, or offload.nvme_dir to a directory, inside what its client may reach:
 * zt__job_roots): the init file, the token files of data.path and data.eval.path (their headers,
 * vocab and length; s->data_bytes from data.path's counts), the NVMe directory. 0 or -errno with
 * the field and the path. Reads the files: call it off the loop thread. */
int zt__job_spec_check_files(zt_job_spec *s, const zt_jobs_config *cfg, int tcp, char *err,
                             size_t errlen);
/* Where a job of a TCP client (tcp 1) or a Unix-socket one may read files (dirs 0) or keep its
 * NVMe tier (dirs 1), as jobs.h's zt_jobs_config says. */
zt_path_roots zt__job_roots(const zt_jobs_config *cfg, int tcp, int dirs);
/* The packing of a token file of version `version` under data.packing `p`: p, or for AUTO
 * documents for version 2 and windows for version 1. data.eval's rows take data.path's (a
 * stream job's: its own file's). */
zt_data_packing zt__job_packing_of(zt_data_packing p, uint32_t version);
/* What the machine must provide: parallel.gpus devices of the daemon's set (zt__jobs_devices; s->gpus resolved, not
 * ZT_JOB_GPUS_ALL) and the memory: the trainer's estimate (per rank with several) against, on
 * the cpu backend, host_mem_limit or physical RAM when the limit is 0 (all ranks together); on
 * the cuda backend, each device's memory (the smallest the daemon owns) or gpu_mem_limit when
 * smaller; an offloaded job's NVMe files against the free space of offload.nvme_dir
 * (-ENOSPC); the host memory of the runner's data (s->data_bytes, the step's rows) with the
 * rest against the host limit. *needs gets the estimates. 0 or -errno with the path or the
 * numbers. Reads offload.nvme_dir's free space: off the loop thread too. A described machine
 * (cfg->described, a plan's target) is sized by its config alone: gpu_mem_limit each GPU,
 * disk_bytes free at offload.nvme_dir. */
int zt__job_spec_check_resources(const zt_job_spec *s, const zt_jobs_config *cfg,
                                 zt__job_needs *needs, char *err, size_t errlen);
/* A single-rank offloaded job's stored plan instead of a search: checked against the spec
 * (zt_offload_plan_check), then its sizes against the daemon's limits as
 * zt__job_spec_check_resources checks a plan it makes. 0 with *needs (needs->plan the
 * checked plan), or -errno with the numbers. Off the loop thread. */
int zt__job_spec_check_plan(const zt_job_spec *s, const zt_jobs_config *cfg,
                            const zt_offload_placement *plan, zt__job_needs *needs, char *err,
                            size_t errlen);
/* The normalised spec (every default written out): what jobs/<id>/spec.json holds. */
json_t *zt__job_spec_to_json(const zt_job_spec *s);

/* The daemon's device set, a rank per device: on cuda the GPUs it owns (cfg->n_gpus 0: GPU 0),
 * on cpu cfg->cpu_ranks simulated ranks numbered from 0 (0: one). Returns the count; ids (when
 * not NULL, ZT_JOBS_MAX_GPUS entries) gets the device numbers. */
int zt__jobs_devices(const zt_jobs_config *cfg, int *ids);
/* CPU threads of one rank's backend on the cpu backend: cpu_threads (0 = all cores) split
 * evenly between the simulated ranks, at least 1; cpu_threads itself with one rank. */
int zt__jobs_rank_threads(const zt_jobs_config *cfg);
/* The device budget of one rank: on cuda the device's memory (the smallest the daemon owns) or
 * gpu_mem_limit when smaller, on the cpu backend gpu_mem_limit (its simulated devices' budget);
 * 0 for none. *what names which, for messages. */
double zt__jobs_device_budget(const zt_jobs_config *cfg, const char **what);
/* The host memory every running job together may take: host_mem_limit, else physical RAM
 * (*what names which, for messages). */
double zt__jobs_host_limit(const zt_jobs_config *cfg, const char **what);
/* The training configuration each rank of a parallel job runs ("auto" activation
 * checkpointing, the offload planner's, means none without offload). */
zt_train_cfg zt__job_rank_train_cfg(const zt_job_spec *s);

/* A job of several ranks with an "offload" object: its placement resolved against
 * offload.gpu_budget per GPU (what "auto" leaves open: everything on the GPU, which drops the
 * offload object, or the most leading units' optimizer on the GPU and the rest's on the host,
 * or for stage 3 the parameters on the host too; "activation_checkpointing" "auto": the least
 * recompute with which a placement fits), the choice written into s. Without a budget "auto"
 * puts the optimizer on the host and leaves "auto" checkpointing to fit the device. No-op for
 * one rank or without offload. 0, or -EINVAL / -ENOTSUP naming the field, -ENOMEM with the
 * numbers (engine/job/dp_placement.c; the search is the planner's, zt_dp_plan_place). */
int zt__job_resolve_dp_offload(zt_job_spec *s, const zt_ops *ops, char *err, size_t errlen);
/* The data-parallel configuration of a resolved spec, for the part running ranks
 * rank0 .. rank0 + local - 1 (local 0: all). */
zt_dp_cfg zt__job_dp_cfg(const zt_job_spec *s, int rank0, int local);

/* "parallel.gpus 2", or with peers "4 ranks (parallel.gpus 2 on each of 2 daemons)" */
void zt__job_ranks_text(const zt_job_spec *s, char *out, size_t outlen);

#endif
