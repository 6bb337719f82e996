/* defines: ztctl_outfile (ztctl.h), a file written the safe way: to PATH.tmp, flushed, synced
 * and renamed over PATH, nothing left behind on failure. Called by tokenize.c and pack.c. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/ztctl/ztctl.h"

int ztctl_outfile_open(ztctl_outfile *o, const char *path) {
  *o = (ztctl_outfile){.path = path};
  if (asprintf(&o->tmp, "%s.tmp", path) < 0) {
    o->tmp = NULL;
    return ztctl_fail_msg("ENOMEM", "out of memory");
  }
  if (!(o->f = fopen(o->tmp, "wb"))) {
    int rc = ztctl_fail_msg("EACCES", "cannot create %s: %s", o->tmp, strerror(errno));
    ztctl_outfile_abort(o);
    return rc;
  }
  return ZTCTL_OK;
}

void ztctl_outfile_abort(ztctl_outfile *o) {
  if (o->f) fclose(o->f);
  if (o->tmp) unlink(o->tmp);
  free(o->tmp);
  *o = (ztctl_outfile){0};
}

int ztctl_outfile_fail(ztctl_outfile *o) {
  int rc = ztctl_fail_msg(errno == ENOSPC ? "ENOSPC" : "EIO", "writing %s: %s", o->tmp,
                          strerror(errno));
  ztctl_outfile_abort(o);
  return rc;
}

int ztctl_outfile_commit(ztctl_outfile *o) {
  if (fflush(o->f) != 0 || fsync(fileno(o->f)) != 0) return ztctl_outfile_fail(o);
  FILE *f = o->f;
  o->f = NULL;
  if (fclose(f) != 0) return ztctl_outfile_fail(o);
  if (rename(o->tmp, o->path) < 0) {
    int rc = ztctl_fail_msg("EIO", "rename %s to %s: %s", o->tmp, o->path, strerror(errno));
    ztctl_outfile_abort(o);
    return rc;
  }
  free(o->tmp);
  *o = (ztctl_outfile){0};
  return ZTCTL_OK;
}
