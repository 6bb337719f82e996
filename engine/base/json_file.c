/* A JSON file replaced atomically (engine/base/json_file.h). */
#include "engine/base/json_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int zt_fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -errno;
  int rc = fsync(fd) == 0 ? 0 : -errno;
  close(fd);
  return rc;
}

int zt_json_write_file(const char *dir, const char *name, const json_t *j, char *err,
                       size_t errlen) {
  int rc = 0, fd = -1;
  char tmp[4096], path[4096];
  char *text = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
  snprintf(tmp, sizeof tmp, "%s/.%s.tmp", dir, name);
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (!text) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", path);
    goto out;
  }
  fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) goto fail;
  size_t len = strlen(text), off = 0;
  while (off < len) {
    ssize_t n = write(fd, text + off, len - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) goto fail;
    off += (size_t)n;
  }
  if (write(fd, "\n", 1) != 1 || fsync(fd) != 0) goto fail;
  if (close(fd) != 0) {
    fd = -1;
    goto fail;
  }
  fd = -1;
  if (rename(tmp, path) != 0) goto fail;
  if ((rc = zt_fsync_dir(dir)) < 0) {
    snprintf(err, errlen, "%s: fsync: %s", dir, strerror(-rc));
    goto out;
  }
  goto out;
fail:
  rc = errno ? -errno : -EIO;
  snprintf(err, errlen, "%s: %s", path, strerror(-rc));
  unlink(tmp);
out:
  if (fd >= 0) close(fd);
  free(text);
  return rc;
}
