/* defines: a job's series on disk, written by its runner (runner.c) after every step and
 * evaluation: the point (zt_jobs_point) as a line of jobs/<id>/metrics.jsonl, and with the spec's
 * "log": {"tensorboard": true} its scalars in TensorBoard event files under jobs/<id>/tb/
 * (tfevents.h). Both are fsynced at each checkpoint; a run resumed from a checkpoint drops the
 * lines after it (they are trained again) and tells TensorBoard so (a SessionLog START). */
#ifndef ZT_JOB_SERIES_H
#define ZT_JOB_SERIES_H

#include <stdio.h>
#include <jansson.h>
#include "engine/job/tfevents.h"

typedef struct zt__series {
  FILE *jsonl;
  int tb_open;
  zt__tfevents tb;
  char path[4096];    /* metrics.jsonl's, for messages */
} zt__series;

/* Opens the series of the job in job_dir, resumed at step `resume` (0: from the start). 0 or
 * -errno with the file in err. */
int zt__series_open(zt__series *s, const char *job_dir, int resume, int tensorboard, char *err,
                    size_t errlen);
int zt__series_step(zt__series *s, const json_t *step_event, char *err, size_t errlen);
/* An evaluation (data.eval): its point as a line, and TensorBoard's scalar "eval/loss" at its
 * step. */
int zt__series_eval(zt__series *s, const json_t *eval_event, char *err, size_t errlen);
int zt__series_sync(zt__series *s, char *err, size_t errlen);
void zt__series_close(zt__series *s);

#endif
