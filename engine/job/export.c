/* defines: zt_jobs_export (jobs.h; called by engine/server's export): a chunk of the newest
 * checkpoint's model.safetensors, read on a worker (work.c). The first chunk a job serves of a
 * checkpoint comes after the file's checksums are verified (zt_checkpoint_verify, the whole
 * file read once), so a corrupt checkpoint is refused naming the tensor, not served.
 * zt__export_read (internal.h): a chunk of an open file, also for the files of a Hugging Face
 * export (export_hf.c). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "engine/job/internal.h"
#include "engine/job/store.h"

/* Largest chunk zt_jobs_export reads in one call (a frame must hold it). */
#define EXPORT_CHUNK_MAX (16u << 20)

typedef struct export_task {
  zt__work w;
  zt_jobs_export_cb done;
  char id[ZT_JOB_ID_MAX];
  char dir[ZT__JOB_DIR_MAX];
  uint64_t offset, length;
  int verified_step;          /* the job's checkpoint whose file was verified already, 0 none */
  int rc;
  uint8_t *data;
  size_t len;
  uint64_t total, step;
  char err[ZT__ERR_MAX];
} export_task;

/* The chunk, on the worker. */
static int read_chunk(export_task *t, char *err, size_t errlen) {
  int rc = 0, fd = -1;
  const char *id = t->id;
  uint64_t offset = t->offset, length = t->length, *total = &t->total, *step = &t->step;
  uint8_t **data = &t->data;
  /* The runner may remove the oldest checkpoint while we look: try the newest again. */
  char path[ZT__JOB_DIR_MAX + 64];
  for (int attempt = 0; attempt < 3 && fd < 0; attempt++) {
    int *steps;
    int n = zt__store_checkpoints(t->dir, &steps);
    if (n <= 0) {
      free(steps);
      snprintf(err, errlen, "job %s has no checkpoint yet", id);
      return n < 0 ? n : -ENOENT;
    }
    *step = (uint64_t)steps[n - 1];
    zt__store_checkpoint_path(path, sizeof path, t->dir, steps[n - 1]);
    free(steps);
    /* what is served is checked first, once per checkpoint */
    if ((int)*step != t->verified_step) {
      int vrc = zt_checkpoint_verify(path, "model.safetensors", err, errlen);
      if (vrc < 0 && access(path, F_OK) != 0) {
        errno = ENOENT; /* removed meanwhile: the newest again */
        continue;
      }
      if (vrc < 0) return vrc;
      if (vrc == 1)
        ZT_LOGW("job", "%s: %s has no checksums (written before zt recorded them): exported "
                "unverified", id, path);
    }
    strncat(path, "/model.safetensors", sizeof path - strlen(path) - 1);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno != ENOENT) break;
  }
  if (fd < 0) {
    rc = errno ? -errno : -ENOENT;
    snprintf(err, errlen, "%s: %s", path, strerror(-rc));
    return rc;
  }
  rc = zt__export_read(fd, path, "the weights", offset, length, data, &t->len, total, err,
                       errlen);
  close(fd);
  return rc;
}

int zt__export_read(int fd, const char *path, const char *what, uint64_t offset,
                    uint64_t length, uint8_t **data, size_t *len, uint64_t *total, char *err,
                    size_t errlen) {
  int rc = 0;
  *data = NULL;
  *len = 0;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    rc = -errno;
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    goto out;
  }
  *total = (uint64_t)st.st_size;
  if (offset > *total) {
    rc = -EINVAL;
    snprintf(err, errlen, "offset %llu is past the end of %s (%llu bytes)",
             (unsigned long long)offset, what, (unsigned long long)*total);
    goto out;
  }
  uint64_t want = *total - offset;
  if (want > length) want = length;
  if (want > EXPORT_CHUNK_MAX) want = EXPORT_CHUNK_MAX;
  *data = malloc(want ? want : 1);
  if (!*data) {
    rc = -ENOMEM;
    snprintf(err, errlen, "out of memory");
    goto out;
  }
  size_t got = 0;
  while (got < want) {
    ssize_t n = pread(fd, *data + got, want - got, (off_t)(offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      rc = n < 0 ? -errno : -EIO;
      snprintf(err, errlen, "%s: %s", path, strerror(-rc));
      goto out;
    }
    got += (size_t)n;
  }
  *len = got;
out:
  if (rc < 0) {
    free(*data);
    *data = NULL;
  }
  return rc;
}

static void export_run(zt__work *w) {
  export_task *t = (export_task *)w;
  t->rc = read_chunk(t, t->err, sizeof t->err);
}

static void export_finish(zt__work *w) {
  export_task *t = (export_task *)w;
  char none[ZT__ERR_MAX];
  zt__job *job = zt__jobs_find(w->jobs, t->id, none, sizeof none);
  if (job && t->rc == 0) job->export_verified = (int)t->step;
  if (t->done && w->owner)
    t->done(w->owner, t->rc, t->data, t->len, t->total, t->step, t->rc < 0 ? t->err : NULL);
}

static void export_release(zt__work *w) {
  export_task *t = (export_task *)w;
  free(t->data);
  free(t);
}

int zt_jobs_export(zt_jobs *jobs, const char *id, uint64_t offset, uint64_t length,
                   zt_jobs_export_cb done, void *owner, char *err, size_t errlen) {
  zt__job *job = zt__jobs_find(jobs, id, err, errlen);
  if (!job) return -ENOENT;
  export_task *t = calloc(1, sizeof *t);
  if (!t) {
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  snprintf(t->id, sizeof t->id, "%s", id);
  snprintf(t->dir, sizeof t->dir, "%s", job->dir);
  t->offset = offset;
  t->length = length;
  t->verified_step = job->export_verified;
  t->done = done;
  t->w.owner = owner;
  t->w.run = export_run;
  t->w.finish = export_finish;
  t->w.release = export_release;
  zt__jobs_work(jobs, &t->w);
  return 0;
}
