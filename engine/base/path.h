/* defines: a user's path opened the one safe way (zt_path_open), for every reader of a file a
 * job or a client names: the job layer's checks and its runners (engine/job), the safetensors
 * reader (engine/model). The path is resolved (symlinks followed) and its type read with stat
 * before anything opens it, so a FIFO or a device is refused without an open that could block;
 * the open is O_NONBLOCK | O_CLOEXEC and fstat checks the type again (the name may have changed
 * in between). Confinement: where roots are given, the resolved path must lie inside one. */
#ifndef ZT_BASE_PATH_H
#define ZT_BASE_PATH_H

#include <stddef.h>
#include <sys/types.h>

/* Where paths may lead: any = 1, anywhere; else inside one of dir[0 .. n-1] (resolved paths of
 * directories; n = 0: nowhere). what names the limit in a refusal ("ztd --data-root"). */
typedef struct zt_path_roots {
  int any;
  const char *const *dir;
  int n;
  const char *what;
} zt_path_roots;

/* "a FIFO", "a directory", "a socket", ... for messages. */
const char *zt_path_type_name(mode_t mode);

/* Opens path, which must resolve to a regular file (want_dir 0) or a directory (want_dir 1)
 * inside roots (NULL: anywhere). *fd gets the descriptor (O_RDONLY, with O_DIRECTORY for a
 * directory; the caller closes it) or, fd NULL, it is closed; resolved (when not NULL) gets the
 * resolved path. Refusals name field (NULL: none) and the path as given, e.g. "data.path:
 * /tmp/f is a FIFO, not a regular file", "data.path: /srv/x.zt is outside ztd --data-root
 * (/data)": -ENOENT and the like from the system, -EINVAL for a wrong type, -EACCES outside the
 * roots. A path outside the roots is refused before its existence shows. */
int zt_path_open(const char *field, const char *path, int want_dir, const zt_path_roots *roots,
                 int *fd, char *resolved, size_t resolved_len, char *err, size_t errlen);

/* Whether the resolved path p lies inside the resolved directory root (or is it). */
int zt_path_inside(const char *p, const char *root);

#endif
