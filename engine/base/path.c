/* A user's path resolved, confined and opened without blocking (path.h). */
#include "engine/base/path.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *zt_path_type_name(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "of an unknown type";
}

int zt_path_inside(const char *p, const char *root) {
  size_t n = strlen(root);
  while (n > 1 && root[n - 1] == '/') n--;
  if (n == 1 && root[0] == '/') return p[0] == '/';
  return strncmp(p, root, n) == 0 && (p[n] == '\0' || p[n] == '/');
}

static int inside_any(const char *p, const zt_path_roots *roots) {
  if (!roots || roots->any) return 1;
  for (int i = 0; i < roots->n; i++)
    if (zt_path_inside(p, roots->dir[i])) return 1;
  return 0;
}

/* Where a path that does not resolve would lie: its deepest ancestor that resolves, with the
 * rest appended; 0 when that is inside the roots (so its own error may show), else -1 (".."
 * in the rest counts as outside). */
static int missing_inside(const char *path, const zt_path_roots *roots) {
  char buf[PATH_MAX], real[PATH_MAX];
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return -1;
  char *slash;
  while ((slash = strrchr(buf, '/')) && slash != buf) {
    *slash = '\0';
    if (!realpath(buf, real)) continue;
    const char *rest = path + (slash - buf);
    if (strstr(rest, "/..")) return -1;
    char joined[2 * PATH_MAX];
    snprintf(joined, sizeof joined, "%s%s", strcmp(real, "/") ? real : "", rest);
    return inside_any(joined, roots) ? 0 : -1;
  }
  return inside_any(path, roots) ? 0 : -1;
}

static void name(char *err, size_t errlen, const char *field, const char *fmt, const char *path,
                 const char *what) {
  char msg[PATH_MAX + 256];
  snprintf(msg, sizeof msg, fmt, path, what);
  if (field) snprintf(err, errlen, "%s: %s", field, msg);
  else snprintf(err, errlen, "%s", msg);
}

static int outside(const char *field, const char *path, const zt_path_roots *roots, char *err,
                   size_t errlen) {
  char list[1024] = "";
  size_t used = 0;
  for (int i = 0; i < roots->n && used < sizeof list; i++)
    used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "",
                             roots->dir[i]);
  char what[1200];
  if (roots->n)
    snprintf(what, sizeof what, "outside %s (%s)", roots->what, list);
  else
    snprintf(what, sizeof what, "not allowed: this client may name no such path (no %s)",
             roots->what);
  name(err, errlen, field, "%s is %s", path, what);
  return -EACCES;
}

int zt_path_open(const char *field, const char *path, int want_dir, const zt_path_roots *roots,
                 int *fd_out, char *resolved, size_t resolved_len, char *err, size_t errlen) {
  char real[PATH_MAX];
  struct stat st;
  int fd = -1, rc = 0;
  if (fd_out) *fd_out = -1;
  if (roots && !roots->any && roots->n == 0) return outside(field, path, roots, err, errlen);
  if (!realpath(path, real)) {
    rc = -errno;
    /* where it would lie, from its deepest ancestor that resolves (a lexical look would take
     * root/../x for inside) */
    if (missing_inside(path, roots) < 0) return outside(field, path, roots, err, errlen);
    name(err, errlen, field, "%s: %s", path, strerror(-rc));
    return rc;
  }
  if (!inside_any(real, roots)) return outside(field, path, roots, err, errlen);
  /* the type from stat first: an open of a FIFO or a device could block or act */
  if (stat(real, &st) < 0) {
    rc = -errno;
    name(err, errlen, field, "%s: %s", path, strerror(-rc));
    return rc;
  }
  if (want_dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)) goto wrong_type;
  fd = open(real, O_RDONLY | O_NONBLOCK | O_CLOEXEC | (want_dir ? O_DIRECTORY : 0));
  if (fd < 0 || fstat(fd, &st) < 0) {
    rc = -errno;
    name(err, errlen, field, "%s: %s", path, strerror(-rc));
    goto out;
  }
  if (want_dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)) goto wrong_type;
  if (resolved && (size_t)snprintf(resolved, resolved_len, "%s", real) >= resolved_len) {
    rc = -ENAMETOOLONG;
    name(err, errlen, field, "%s: %s", path, strerror(ENAMETOOLONG));
    goto out;
  }
  if (fd_out) {
    *fd_out = fd;
    fd = -1;
  }
  goto out;
wrong_type:
  rc = -EINVAL;
  {
    char what[96];
    snprintf(what, sizeof what, "%s, not %s", zt_path_type_name(st.st_mode),
             want_dir ? "a directory" : "a regular file");
    name(err, errlen, field, "%s is %s", path, what);
  }
out:
  if (fd >= 0) close(fd);
  return rc;
}
