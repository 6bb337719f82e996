/* defines: zt_jobs_export_chunk (jobs.h; called by engine/server's export): a chunk of the
 * newest checkpoint's model.safetensors; zt__export_read (internal.h; export_hf.c reads the
 * files of a Hugging Face export with it). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "engine/job/internal.h"
#include "engine/job/store.h"

/* Largest chunk zt_jobs_export_chunk reads in one call (a frame must hold it). */
#define EXPORT_CHUNK_MAX (16u << 20)

int zt_jobs_export_chunk(zt_jobs *jobs, const char *id, uint64_t offset, uint64_t length,
                         uint8_t **data, size_t *len, uint64_t *total, uint64_t *step,
                         char *err, size_t errlen) {
  zt__job *job = zt__jobs_find(jobs, id, err, errlen);
  int rc = 0, fd = -1;
  *data = NULL;
  *len = 0;
  if (!job) return -ENOENT;
  /* The runner may remove the oldest checkpoint while we look: try the newest again. */
  char path[ZT__JOB_DIR_MAX + 64];
  for (int attempt = 0; attempt < 3 && fd < 0; attempt++) {
    int *steps;
    int n = zt__store_checkpoints(job->dir, &steps);
    if (n <= 0) {
      free(steps);
      snprintf(err, errlen, "job %s has no checkpoint yet", id);
      return n < 0 ? n : -ENOENT;
    }
    *step = (uint64_t)steps[n - 1];
    zt__store_checkpoint_path(path, sizeof path, job->dir, steps[n - 1]);
    free(steps);
    strncat(path, "/model.safetensors", sizeof path - strlen(path) - 1);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno != ENOENT) break;
  }
  if (fd < 0) {
    rc = -errno;
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return rc;
  }
  rc = zt__export_read(fd, path, "the weights", offset, length, data, len, total, err, errlen);
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
