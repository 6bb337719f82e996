/* defines: a writer of TensorBoard event files (events.out.tfevents.*), for a job's series
 * (series.c, on its runner's thread): TFRecord framing (length, masked CRC-32C of it, data,
 * masked CRC-32C of the data), each record an Event protobuf: the file_version first, then
 * scalar summaries (Summary.Value.simple_value) and, where a run resumes, a SessionLog START
 * that makes TensorBoard drop the later steps the first run had written. The few protobuf
 * fields are encoded here (tensorflow/core/util/event.proto, core/framework/summary.proto). */
#ifndef ZT_JOB_TFEVENTS_H
#define ZT_JOB_TFEVENTS_H

#include <stddef.h>
#include <stdint.h>

typedef struct zt__tfevents {
  int fd;
  char path[4096];
} zt__tfevents;

/* Creates a new event file in dir (made if missing): events.out.tfevents.<unix time>.<host>[.N],
 * and writes its file_version event. 0 or -errno with the path in err. */
int zt__tfevents_open(zt__tfevents *w, const char *dir, double wall_time, char *err,
                      size_t errlen);
/* A SessionLog START at `step`: TensorBoard drops the events of the steps from `step` on that
 * the files before this one hold (a run resumed from a checkpoint trains them again). */
int zt__tfevents_start(zt__tfevents *w, int64_t step, double wall_time, char *err, size_t errlen);
/* One event of n scalars (tags[i], values[i]) at step. */
int zt__tfevents_scalars(zt__tfevents *w, int64_t step, double wall_time, const char *const *tags,
                         const float *values, int n, char *err, size_t errlen);
int zt__tfevents_sync(zt__tfevents *w, char *err, size_t errlen);
void zt__tfevents_close(zt__tfevents *w);

#endif
