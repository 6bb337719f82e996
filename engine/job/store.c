#include "engine/job/store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include "engine/base/json_file.h"
#include "engine/plan/plan_file.h"

static int make_dir(const char *path, char *err, size_t errlen) {
  if (mkdir(path, 0755) == 0 || errno == EEXIST) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
    snprintf(err, errlen, "state dir %s: not a directory", path);
    return -ENOTDIR;
  }
  int rc = -errno;
  if (errno == EACCES || errno == EROFS || errno == EPERM)
    snprintf(err, errlen, "state dir %s is not writable", path);
  else
    snprintf(err, errlen, "state dir %s: %s", path, strerror(errno));
  return rc;
}

int zt__store_open(const char *state_dir, int *lock_fd, char *err, size_t errlen) {
  int rc = 0, fd = -1;
  char path[4096];
  *lock_fd = -1;
  if ((rc = make_dir(state_dir, err, errlen)) < 0) goto out;
  if (access(state_dir, W_OK | X_OK) != 0) {
    rc = -EACCES;
    snprintf(err, errlen, "state dir %s is not writable", state_dir);
    goto out;
  }
  snprintf(path, sizeof path, "%s/jobs", state_dir);
  if ((rc = make_dir(path, err, errlen)) < 0) goto out;
  snprintf(path, sizeof path, "%s/ztd.lock", state_dir);
  fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    rc = -errno;
    if (errno == EACCES || errno == EROFS)
      snprintf(err, errlen, "state dir %s is not writable", state_dir);
    else
      snprintf(err, errlen, "%s: %s", path, strerror(errno));
    goto out;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    rc = errno == EWOULDBLOCK ? -EBUSY : -errno;
    char pid[32] = "";
    ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
    pid[n > 0 ? n : 0] = '\0';
    pid[strcspn(pid, "\n")] = '\0';
    if (rc == -EBUSY && pid[0])
      snprintf(err, errlen, "state dir %s is in use by another ztd (pid %s)", state_dir, pid);
    else if (rc == -EBUSY)
      snprintf(err, errlen, "state dir %s is in use by another ztd", state_dir);
    else
      snprintf(err, errlen, "%s: flock: %s", path, strerror(-rc));
    goto out;
  }
  char pid[32];
  int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)len, 0) != len) {
    rc = -errno;
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    goto out;
  }
  *lock_fd = fd;
  fd = -1;
out:
  if (fd >= 0) close(fd);
  return rc;
}

int zt__store_fsync_dir(const char *dir) { return zt_fsync_dir(dir); }

int zt__store_write_json(const char *dir, const char *name, const json_t *j, char *err,
                         size_t errlen) {
  return zt_json_write_file(dir, name, j, err, errlen);
}

json_t *zt__store_read_json(const char *dir, const char *name, char *err, size_t errlen) {
  char path[4096];
  json_error_t je;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  json_t *j = json_load_file(path, 0, &je);
  if (!j) snprintf(err, errlen, "%s: %s", path, je.text);
  return j;
}

int zt__store_plan_write(const char *job_dir, const zt_offload_placement *p, char *err,
                         size_t errlen) {
  json_t *j = zt_offload_plan_to_json(p);
  if (!j) {
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  int rc = zt__store_write_json(job_dir, ZT__PLAN_FILE, j, err, errlen);
  json_decref(j);
  return rc;
}

int zt__store_plan_read(const char *job_dir, zt_offload_placement *p, char *err, size_t errlen) {
  char path[4096];
  snprintf(path, sizeof path, "%s/" ZT__PLAN_FILE, job_dir);
  if (access(path, F_OK) < 0 && errno == ENOENT) {
    snprintf(err, errlen, ZT__PLAN_FILE " is missing");
    return -ENOENT;
  }
  json_t *j = zt__store_read_json(job_dir, ZT__PLAN_FILE, err, errlen);
  if (!j) return -EINVAL;
  int rc = zt_offload_plan_from_json(j, p, err, errlen);
  json_decref(j);
  return rc;
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw) {
  return remove(path) == 0 || errno == ENOENT ? 0 : -errno;
}

/* nftw has no argument for its callback: the sum is the calling thread's */
static _Thread_local uint64_t g_tree_bytes;

static int add_entry(const char *path, const struct stat *st, int type, struct FTW *ftw) {
  if (type == FTW_F && S_ISREG(st->st_mode)) g_tree_bytes += (uint64_t)st->st_size;
  return 0;
}

int zt__store_tree_bytes(const char *path, uint64_t *bytes) {
  g_tree_bytes = 0;
  if (nftw(path, add_entry, 16, FTW_PHYS) == -1) return -errno;
  *bytes = g_tree_bytes;
  return 0;
}

int zt__store_remove_tree(const char *path) {
  int rc = nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  if (rc == -1) return errno == ENOENT ? 0 : -errno;
  return rc;
}

int zt__store_nvme_record(const char *job_dir, const char *nvme_dir, char *err, size_t errlen) {
  json_t *j = json_pack("{s:s}", "dir", nvme_dir);
  if (!j) {
    snprintf(err, errlen, "%s/nvme.json: out of memory", job_dir);
    return -ENOMEM;
  }
  int rc = zt__store_write_json(job_dir, "nvme.json", j, err, errlen);
  json_decref(j);
  return rc;
}

int zt__store_nvme_forget(const char *job_dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/nvme.json", job_dir);
  return unlink(path) == 0 || errno == ENOENT ? 0 : -errno;
}

int zt__store_nvme_sweep(const char *job_dir, const char *id, char *dir_out, size_t dir_outlen,
                         char *err, size_t errlen) {
  char path[4096], prefix[64];
  int rc = 0, keep = 0;
  snprintf(path, sizeof path, "%s/nvme.json", job_dir);
  if (access(path, F_OK) != 0) {
    if (errno == ENOENT) return 0;
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return -errno;
  }
  json_t *j = zt__store_read_json(job_dir, "nvme.json", err, errlen);
  const char *dir = json_string_value(json_object_get(j, "dir"));
  const char *base = dir ? strrchr(dir, '/') : NULL;
  /* Only a name the runner makes (ztd-<id>.XXXXXX): a record pointing elsewhere is not
   * trusted with a recursive delete. */
  int n = snprintf(prefix, sizeof prefix, "ztd-%s.", id);
  if (!base || strncmp(base + 1, prefix, (size_t)n) != 0 || strlen(base + 1) != (size_t)n + 6) {
    if (j) snprintf(err, errlen, "%s: no job NVMe directory (ztd-%s.XXXXXX) in it", path, id);
    rc = -EINVAL;
  } else if ((rc = zt__store_remove_tree(dir)) < 0) {
    snprintf(err, errlen, "%s: %s", dir, strerror(-rc));
    keep = 1; /* tried again at the next start */
  } else {
    snprintf(dir_out, dir_outlen, "%s", dir);
    rc = 1;
  }
  json_decref(j);
  /* A record that cannot be acted on is dropped too: it would fail the same way every start. */
  if (!keep && unlink(path) < 0 && rc >= 0) {
    rc = -errno;
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
  }
  return rc;
}

int zt__store_ids_record(const char *state_dir, long next, char *err, size_t errlen) {
  json_t *j = json_pack("{s:I}", "next", (json_int_t)next);
  if (!j) {
    snprintf(err, errlen, "%s/ids.json: out of memory", state_dir);
    return -ENOMEM;
  }
  int rc = zt__store_write_json(state_dir, "ids.json", j, err, errlen);
  json_decref(j);
  return rc;
}

long zt__store_ids_next(const char *state_dir) {
  char err[64];
  json_t *j = zt__store_read_json(state_dir, "ids.json", err, sizeof err);
  json_t *v = json_object_get(j, "next");
  long next = json_is_integer(v) && json_integer_value(v) > 0 ? (long)json_integer_value(v) : 0;
  json_decref(j);
  return next;
}

void zt__store_checkpoint_path(char *out, size_t outlen, const char *job_dir, int step) {
  snprintf(out, outlen, "%s/checkpoints/step-%08d", job_dir, step);
}

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

int zt__store_checkpoints(const char *job_dir, int **steps) {
  char path[4096];
  int n = 0, cap = 0;
  int *v = NULL;
  *steps = NULL;
  snprintf(path, sizeof path, "%s/checkpoints", job_dir);
  DIR *d = opendir(path);
  if (!d) return errno == ENOENT ? 0 : -errno;
  struct dirent *e;
  while ((e = readdir(d))) {
    /* Only exact step-NNNNNNNN names: the trainer's temp directories are incomplete. */
    const char *s = e->d_name;
    if (strncmp(s, "step-", 5) != 0 || strlen(s) != 13 || strspn(s + 5, "0123456789") != 8)
      continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 8;
      int *nv = realloc(v, (size_t)cap * sizeof *v);
      if (!nv) {
        free(v);
        closedir(d);
        return -ENOMEM;
      }
      v = nv;
    }
    v[n++] = atoi(s + 5);
  }
  closedir(d);
  if (n) qsort(v, (size_t)n, sizeof *v, cmp_int);
  *steps = v;
  return n;
}

int zt__store_newest_checkpoint(const char *job_dir) {
  int *steps;
  int n = zt__store_checkpoints(job_dir, &steps);
  int newest = n > 0 ? steps[n - 1] : 0;
  free(steps);
  return n < 0 ? n : newest;
}

int zt__store_prune_checkpoints(const char *job_dir, int keep) {
  int *steps;
  int n = zt__store_checkpoints(job_dir, &steps);
  int rc = n < 0 ? n : 0;
  for (int i = 0; i < n - keep && rc == 0; i++) {
    char path[4096];
    zt__store_checkpoint_path(path, sizeof path, job_dir, steps[i]);
    rc = zt__store_remove_tree(path);
    if (rc == 0) zt__store_exports_drop(job_dir, steps[i]);
  }
  free(steps);
  return rc;
}

void zt__store_export_name(char *out, size_t outlen, int step, const char *dtype,
                           unsigned long long shard_bytes) {
  snprintf(out, outlen, "hf-%08d-%s-%llu", step, dtype, shard_bytes);
}

void zt__store_export_path(char *out, size_t outlen, const char *job_dir, const char *name) {
  snprintf(out, outlen, "%s/export%s%s", job_dir, name ? "/" : "", name ? name : "");
}

int zt__store_export_parse(const char *name, int *step) {
  size_t n = strlen(name);
  if (n < 20 || n > 64 || strncmp(name, "hf-", 3) || strspn(name + 3, "0123456789") != 8 ||
      (strncmp(name + 11, "-fp32-", 6) && strncmp(name + 11, "-bf16-", 6)) ||
      strspn(name + 17, "0123456789") != n - 17)
    return -EINVAL;
  *step = atoi(name + 3);
  return 0;
}

void zt__store_exports_drop(const char *job_dir, int step) {
  char path[4096];
  zt__store_export_path(path, sizeof path, job_dir, NULL);
  DIR *d = opendir(path);
  if (!d) return;
  struct dirent *e;
  int s;
  /* an export being made (NAME.tmp) is its maker's to check once done */
  while ((e = readdir(d)))
    if (zt__store_export_parse(e->d_name, &s) == 0 && s == step) {
      char p[4096 + 256];
      snprintf(p, sizeof p, "%s/%s", path, e->d_name);
      zt__store_remove_tree(p);
    }
  closedir(d);
}

/* One of the job's "step value" logs: its values, or (with_step) [step, value] pairs. */
static json_t *log_read(const char *job_dir, const char *name, int with_step) {
  char path[4096], line[128];
  json_t *arr = json_array();
  snprintf(path, sizeof path, "%s/%s", job_dir, name);
  FILE *f = fopen(path, "re");
  if (!f) return arr;
  int step;
  double v;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "%d %lf", &step, &v) == 2)
      json_array_append_new(arr, with_step ? json_pack("[i, f]", step, v) : json_real(v));
  }
  fclose(f);
  return arr;
}

json_t *zt__store_losses_read(const char *job_dir) { return log_read(job_dir, "losses.log", 0); }

json_t *zt__store_evals_read(const char *job_dir) { return log_read(job_dir, "evals.log", 1); }

int zt__store_evals_append(const char *job_dir, int step, double loss, char *err, size_t errlen) {
  char path[4096];
  snprintf(path, sizeof path, "%s/evals.log", job_dir);
  FILE *f = fopen(path, "ae");
  int rc = f && fprintf(f, "%d %.17g\n", step, loss) > 0 ? 0 : -errno;
  if (f && fclose(f) != 0 && rc == 0) rc = -errno;
  if (rc < 0) snprintf(err, errlen, "%s: %s", path, strerror(-rc));
  return rc;
}

/* One of the job's "step value" logs without its lines of steps above max_step. */
static int log_truncate(const char *job_dir, const char *name, int max_step, char *err,
                        size_t errlen) {
  char path[4096], tmp[4096], line[128];
  int rc = 0;
  FILE *in = NULL, *out = NULL;
  snprintf(path, sizeof path, "%s/%s", job_dir, name);
  snprintf(tmp, sizeof tmp, "%s/.%s.tmp", job_dir, name);
  in = fopen(path, "re");
  if (!in) return errno == ENOENT ? 0 : -errno;
  out = fopen(tmp, "we");
  if (!out) goto fail;
  int step;
  while (fgets(line, sizeof line, in)) {
    if (sscanf(line, "%d", &step) == 1 && step <= max_step && fputs(line, out) == EOF) goto fail;
  }
  if (fflush(out) != 0 || fsync(fileno(out)) != 0) goto fail;
  if (fclose(out) != 0) {
    out = NULL;
    goto fail;
  }
  out = NULL;
  if (rename(tmp, path) != 0) goto fail;
  goto done;
fail:
  rc = errno ? -errno : -EIO;
  snprintf(err, errlen, "%s: %s", path, strerror(-rc));
  unlink(tmp);
done:
  if (out) fclose(out);
  fclose(in);
  return rc;
}

int zt__store_losses_truncate(const char *job_dir, int max_step, char *err, size_t errlen) {
  int rc = log_truncate(job_dir, "losses.log", max_step, err, errlen);
  return rc < 0 ? rc : log_truncate(job_dir, "evals.log", max_step, err, errlen);
}
