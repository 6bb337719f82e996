/* defines: zt_jobs_log (jobs.h; called by engine/server for the logs request): a piece of a
 * job's own log (jobs/<id>/log, written by zt__job_log) from an offset, as text that is valid
 * UTF-8 whatever bytes the file holds. The log is the daemon's own file in its state directory
 * and a piece is at most ZT_TUNE_LOG_CHUNK bytes: one bounded pread on the loop thread. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "engine/base/tunables.h"
#include "engine/job/internal.h"
#include "proto/zt_proto.h"

/* The bytes as text: invalid sequences as \xNN, a sequence cut by the end of the piece left for
 * the next one when the file goes on (*used: the bytes taken). NULL: out of memory. */
static char *as_text(const unsigned char *b, size_t n, int more, size_t *used) {
  char *out = malloc(4 * n + 1);
  size_t o = 0, i = 0;
  if (!out) return NULL;
  while (i < n) {
    size_t k = zt_proto_utf8_seq(b + i, n - i);
    if (k) {
      memcpy(out + o, b + i, k);
      o += k;
      i += k;
      continue;
    }
    /* a lead byte whose sequence goes past the piece: the rest comes with the next one */
    size_t want = b[i] >= 0xf0 ? 4 : b[i] >= 0xe0 ? 3 : b[i] >= 0xc2 ? 2 : 0;
    if (more && want > n - i && b[i] <= 0xf4 && i > 0) break;
    static const char hex[] = "0123456789abcdef";
    out[o++] = '\\';
    out[o++] = 'x';
    out[o++] = hex[b[i] >> 4];
    out[o++] = hex[b[i] & 15];
    i++;
  }
  out[o] = '\0';
  *used = i;
  return out;
}

json_t *zt_jobs_log(zt_jobs *jobs, const char *id, uint64_t offset, uint64_t length, int *rc,
                    char *err, size_t errlen) {
  zt__job *job = zt__jobs_find(jobs, id, err, errlen);
  json_t *r = NULL;
  unsigned char *buf = NULL;
  char *text = NULL;
  int fd = -1;
  if (!job) {
    *rc = -ENOENT;
    return NULL;
  }
  char path[ZT__JOB_DIR_MAX + 8];
  snprintf(path, sizeof path, "%s/log", job->dir);
  struct stat st = {0};
  fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0 && errno != ENOENT) goto fail;
  if (fd >= 0 && fstat(fd, &st) < 0) goto fail;
  uint64_t size = (uint64_t)st.st_size, at = offset < size ? offset : size;
  size_t n = (size_t)(size - at);
  if (length > ZT_TUNE_LOG_CHUNK) length = ZT_TUNE_LOG_CHUNK;
  if (n > length) n = (size_t)length;
  if (!(buf = malloc(n + 1))) goto nomem;
  ssize_t got = n ? pread(fd, buf, n, (off_t)at) : 0;
  if (got < 0) goto fail;
  size_t used = 0;
  if (!(text = as_text(buf, (size_t)got, at + (uint64_t)got < size, &used))) goto nomem;
  pthread_mutex_lock(&jobs->mu);
  const char *state = zt_job_state_name(job->state);
  pthread_mutex_unlock(&jobs->mu);
  r = json_pack("{s:s, s:I, s:I, s:s}", "data", text, "offset", (json_int_t)(at + used), "size",
                (json_int_t)size, "state", state);
  if (!r) goto nomem;
  *rc = 0;
  goto out;
fail:
  *rc = -errno;
  snprintf(err, errlen, "%s: %s", path, strerror(errno));
  goto out;
nomem:
  *rc = -ENOMEM;
  snprintf(err, errlen, "out of memory");
out:
  if (fd >= 0) close(fd);
  free(buf);
  free(text);
  return r;
}
