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
#include "engine/job/jobs.h"
#include "engine/model/model.h"
#include "engine/train/offload.h"
#include "engine/train/trainer.h"

#define ZT_JOB_NAME_MAX 64

typedef enum zt_data_source { ZT_DATA_FILE = 1, ZT_DATA_STREAM = 2 } zt_data_source;

typedef struct zt_job_spec {
  char name[ZT_JOB_NAME_MAX + 1];
  zt_model_cfg model;
  zt_train_cfg train;
  zt_data_source source;
  char data_path[ZT_PATH_MAX];   /* file source: absolute path of the token file */
  int ckpt_every;                /* 0 = only at the end and on shutdown */
  int ckpt_keep;                 /* newest checkpoints kept, >= 1 */
  int has_offload;               /* an "offload" object: the offloaded step (engine/train/offload.h) */
  zt_offload_cfg offload;
} zt_job_spec;

/* Structure, types, ranges and the model/train constraints; fills defaults. 0 or -EINVAL with a
 * message naming the field. */
int zt__job_spec_parse(const json_t *j, zt_job_spec *s, char *err, size_t errlen);
/* What the machine must provide: the init and data files (the token file's header, vocab and
 * length) and the memory: the trainer's estimate against, on the cpu backend, host_mem_limit or
 * physical RAM when the limit is 0; on the cuda backend, the device's memory or gpu_mem_limit
 * when smaller; an offloaded job's NVMe files against the free space of offload.nvme_dir
 * (-ENOSPC). *backend_bytes gets the estimate. 0 or -errno with the path or the numbers. */
int zt__job_spec_check_resources(const zt_job_spec *s, const zt_jobs_config *cfg,
                                 size_t *backend_bytes, char *err, size_t errlen);
/* The normalised spec (every default written out): what jobs/<id>/spec.json holds. */
json_t *zt__job_spec_to_json(const zt_job_spec *s);

/* "1.21 TiB", "24 GiB", "512 B" */
void zt__format_bytes(char *out, size_t outlen, double bytes);

#endif
