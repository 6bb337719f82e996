/* defines: zt_trainer_save and zt_trainer_load (engine/train/trainer.h; called by the job's
 * runner and ztrain): the checkpoint directory.
 *
 * A save writes DIR.tmp, every file and the directory fsynced, then swaps it into place with
 * renameat2(RENAME_EXCHANGE) so DIR is always either the old or the new complete checkpoint; the
 * old one is then removed. A save that fails removes DIR.tmp and leaves DIR as it was. Keeping
 * the newest K is the job's (engine/job/store.c). A load takes the per-rank layout where DIR
 * holds a manifest, else the flat one. */
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/train/checkpoint/internal.h"

static int fsync_path(const char *path, int dir) {
  int fd = open(path, (dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  int rc = fd < 0 || fsync(fd) < 0 ? -errno : 0;
  if (fd >= 0) close(fd);
  return rc;
}

/* Removes a checkpoint directory: its plain files, then itself. */
static int remove_dir(const char *path) {
  DIR *d = opendir(path);
  if (!d) return errno == ENOENT ? 0 : -errno;
  int rc = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && unlinkat(dirfd(d), e->d_name, 0) < 0)
      rc = -errno;
  closedir(d);
  if (rc == 0 && rmdir(path) < 0) rc = -errno;
  return rc;
}

static char *parent_of(const char *path) {
  char *p = strdup(path);
  if (!p) return NULL;
  size_t n = strlen(p);
  while (n > 1 && p[n - 1] == '/') p[--n] = 0;
  char *slash = strrchr(p, '/');
  if (!slash) strcpy(p, ".");
  else if (slash == p) slash[1] = 0;
  else *slash = 0;
  return p;
}

int zt_trainer_save(zt_trainer *t, const char *dir, char *err, size_t errlen) {
  int rc = 0, stage = 0, part = 0, made = 0;
  state_seq q = {0, 0, 0};
  char *tmp = NULL, *parent = NULL;
  const zt_shard_table *tab =
      t->path && t->path->shards ? t->path->shards(t, &stage, &part) : NULL;
  if ((rc = t->be.ops->sync(t->be.ctx)) < 0) {
    snprintf(err, errlen, "backend %s failed before the checkpoint (%d)", t->be.ops->name, rc);
    goto out;
  }
  if (asprintf(&tmp, "%s.tmp", dir) < 0) tmp = NULL;
  if (!tmp || !(parent = parent_of(dir))) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", dir);
    goto out;
  }
  /* a leftover from a crash mid-save is incomplete by construction */
  if ((rc = remove_dir(tmp)) < 0 || (mkdir(tmp, 0755) < 0 && (rc = -errno))) {
    snprintf(err, errlen, "%s: %s", tmp, strerror(-rc));
    goto out;
  }
  made = 1;
  /* a part's ranks write their own files only where every part sees this directory */
  if (tab && part) {
    if ((rc = zt__ckpt_probe_parts(t, tmp, 1, NULL, &q, err, errlen)) < 0) goto out;
    if (rc == 0) tab = NULL;
  }
  rc = tab ? zt__ckpt_save_ranked(t, tab, stage, tmp, &q, err, errlen)
           : zt__ckpt_save_flat(t, tmp, &q, err, errlen);
  if (rc < 0) goto out;
  if ((rc = fsync_path(tmp, 1)) < 0) {
    snprintf(err, errlen, "%s: fsync: %s", tmp, strerror(-rc));
    goto out;
  }
  if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE) == 0) {
    rc = remove_dir(tmp);  /* the old checkpoint, now under the temporary name */
    if (rc < 0) {
      snprintf(err, errlen, "%s: removing the previous checkpoint: %s", tmp, strerror(-rc));
      goto out;
    }
  } else if (errno == ENOENT) {
    if (rename(tmp, dir) < 0) {
      rc = -errno;
      snprintf(err, errlen, "rename %s -> %s: %s", tmp, dir, strerror(errno));
      goto out;
    }
  } else {
    rc = -errno;
    snprintf(err, errlen, "exchange %s <-> %s: %s", tmp, dir, strerror(errno));
    goto out;
  }
  if ((rc = fsync_path(parent, 1)) < 0) snprintf(err, errlen, "%s: fsync: %s", parent, strerror(-rc));
out:
  zt__ckpt_seq_end(t, &q, rc);
  /* the previous checkpoint stays as it was; what this one wrote goes (best effort: what a
   * failure leaves behind, the next save removes first) */
  if (rc < 0 && made) remove_dir(tmp);
  free(tmp);
  free(parent);
  return rc;
}

int zt_trainer_load(zt_trainer *t, const char *dir, char *err, size_t errlen) {
  state_seq q = {0, 0, 0};
  ckpt_head h;
  char *file = NULL;
  int rc;
  if (asprintf(&file, "%s/" MANIFEST, dir) < 0) {
    file = NULL;
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", dir);
  } else {
    /* a manifest makes it the per-rank layout */
    rc = access(file, F_OK) == 0 || errno != ENOENT
             ? zt__ckpt_load_ranked(t, dir, file, &q, &h, err, errlen)
             : zt__ckpt_load_flat(t, dir, &q, &h, err, errlen);
  }
  if (rc == 0) {
    t->step = h.step;
    t->adam_step = h.adam_step;
    zt_loss_scaler_init(&t->scaler);
    if (h.scale > 0) t->scaler.scale = h.scale;
    if (h.good >= 0) t->scaler.good_steps = h.good;
    zt_trainer_note_eval(t, h.eval_step, h.eval_loss);
  }
  /* a failure after the first piece (or in the ranks' own reads) leaves part of the checkpoint
   * in the trainer (one inside the first piece is its path's to refuse steps after, as a failed
   * step is) */
  if (q.next > 0 || q.shards) t->part_loaded = rc < 0;
  zt__ckpt_seq_end(t, &q, rc);
  free(file);
  return rc;
}
