/* Checkpoints: a directory written as DIR.tmp, every file and the directory fsynced, then swapped
 * into place with renameat2(RENAME_EXCHANGE) so DIR is always either the old or the new complete
 * checkpoint; the old one is then removed. */
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/train/cfg_json.h"
#include "engine/train/trainer_internal.h"

#define CKPT_FORMAT 1
#define OPT_NOTE "AdamW exp_avg / exp_avg_sq in zt's internal layout: weights are (out, in), " \
                 "HF Conv1D weights are not transposed here as they are in model.safetensors"

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

/* A host copy of a backend buffer; with a step path, only the host buffer (its read_state
 * fills it). */
static int host_copy(zt_trainer *t, const float *src, float **dst) {
  size_t n = zt_model_num_params(t->model);
  *dst = malloc(n * sizeof(float));
  if (!*dst) return -ENOMEM;
  if (!t->path) t->be.ops->to_host(t->be.ctx, *dst, src, n * sizeof(float));
  return 0;
}

/* The call failed before the path's state call: a path whose other parts wait in theirs tells
 * them (trainer_internal.h). */
static void abandon_state(zt_trainer *t) {
  if (t->path && t->path->abandon_state) t->path->abandon_state(t);
}

static int write_json(const char *path, json_t *j, char *err, size_t errlen) {
  errno = 0;
  FILE *f = fopen(path, "w");
  int rc = 0;
  if (!f || json_dumpf(j, f, JSON_INDENT(2) | JSON_PRESERVE_ORDER) < 0 || fflush(f) != 0 ||
      fsync(fileno(f)) < 0)
    rc = errno ? -errno : -EIO;
  if (f && fclose(f) != 0 && rc == 0) rc = -errno;
  if (rc < 0) snprintf(err, errlen, "%s: %s", path, strerror(-rc));
  return rc;
}

int zt_trainer_save(zt_trainer *t, const char *dir, char *err, size_t errlen) {
  int rc = 0;
  char *tmp = NULL, *parent = NULL, *file = NULL;
  float *p = NULL, *m = NULL, *v = NULL;
  json_t *j = NULL;
  if ((rc = t->be.ops->sync(t->be.ctx)) < 0) {
    snprintf(err, errlen, "backend %s failed before the checkpoint (%d)", t->be.ops->name, rc);
    abandon_state(t);
    return rc;
  }
  if (asprintf(&tmp, "%s.tmp", dir) < 0) tmp = NULL;
  if (!tmp || !(parent = parent_of(dir)) || !(file = malloc(strlen(dir) + 64)) ||
      host_copy(t, t->params, &p) < 0 || host_copy(t, t->m, &m) < 0 ||
      host_copy(t, t->v, &v) < 0) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", dir);
    abandon_state(t);
    goto out;
  }
  char why[512] = "";
  if (t->path && (rc = t->path->read_state(t, p, m, v, why, sizeof why)) < 0) {
    snprintf(err, errlen, "%s: reading the offloaded state failed: %s", dir,
             why[0] ? why : strerror(-rc));
    goto out;
  }
  /* a leftover from a crash mid-save is incomplete by construction */
  if ((rc = remove_dir(tmp)) < 0 || (mkdir(tmp, 0755) < 0 && (rc = -errno))) {
    snprintf(err, errlen, "%s: %s", tmp, strerror(-rc));
    goto out;
  }
  zt_model_state ms = {"", p};
  sprintf(file, "%s/model.safetensors", tmp);
  if ((rc = zt_model_save_states(t->model, file, &ms, 1, 0, NULL, err, errlen)) < 0) goto out;
  zt_model_state os[2] = {{".exp_avg", m}, {".exp_avg_sq", v}};
  sprintf(file, "%s/optimizer.safetensors", tmp);
  if ((rc = zt_model_save_states(t->model, file, os, 2, 1, OPT_NOTE, err, errlen)) < 0) goto out;
  const zt_model_cfg *mc = zt_model_cfg_of(t->model);
  /* the loss scale is a power of two: a JSON real holds it exactly */
  j = json_pack("{s:i, s:i, s:i, s:f, s:i, s:s, s:o, s:o}", "format", CKPT_FORMAT, "step",
                t->step, "adam_step", t->adam_step, "loss_scale", (double)t->scaler.scale,
                "loss_scale_good_steps", t->scaler.good_steps, "arch", zt_arch_name(mc->arch),
                "model", zt_model_cfg_to_json(mc), "train", zt_train_cfg_to_json(&t->tc));
  sprintf(file, "%s/trainer.json", tmp);
  if (!j) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", file);
    goto out;
  }
  if ((rc = write_json(file, j, err, errlen)) < 0) goto out;
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
  json_decref(j);
  free(tmp);
  free(parent);
  free(file);
  free(p);
  free(m);
  free(v);
  return rc;
}

/* The checkpoint's model must be this trainer's model, field by field. */
static int check_model(const zt_model *m, const json_t *jm, const char *path, char *err,
                       size_t errlen) {
  zt_model_cfg c;
  zt_model *saved = NULL;
  int rc = zt_model_cfg_from_json(jm, &c, err, errlen);
  if (rc < 0 || (rc = zt_model_create(&saved, &c, err, errlen)) < 0) {
    char why[256];
    snprintf(why, sizeof why, "%s", err);
    snprintf(err, errlen, "%s: %s", path, why);
    return rc;
  }
  const zt_model_cfg *h = zt_model_cfg_of(m);
  const struct {
    const char *name;
    long long a, b;
  } f[] = {{"arch", c.arch, h->arch},         {"vocab", c.vocab, h->vocab},
           {"seq_len", c.seq_len, h->seq_len}, {"d_model", c.d_model, h->d_model},
           {"n_heads", c.n_heads, h->n_heads}, {"n_layers", c.n_layers, h->n_layers},
           {"d_ff", zt_model_d_ff(saved), zt_model_d_ff(m)}};
  zt_model_destroy(saved);
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
    if (f[i].a != f[i].b) {
      if (i == 0)
        snprintf(err, errlen, "%s: checkpoint is a %s model, this job is %s", path,
                 zt_arch_name((zt_arch)f[i].a), zt_arch_name((zt_arch)f[i].b));
      else
        snprintf(err, errlen, "%s: checkpoint has model.%s %lld, this job has %lld", path,
                 f[i].name, f[i].a, f[i].b);
      return -EINVAL;
    }
  return 0;
}

int zt_trainer_load(zt_trainer *t, const char *dir, char *err, size_t errlen) {
  int rc = 0, reached = 0;
  size_t n = zt_model_num_params(t->model);
  char *file = malloc(strlen(dir) + 64);
  float *p = malloc(n * sizeof(float)), *m = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
  json_t *j = NULL;
  if (!file || !p || !m || !v) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", dir);
    goto out;
  }
  sprintf(file, "%s/trainer.json", dir);
  json_error_t je;
  j = json_load_file(file, 0, &je);
  json_t *step = json_object_get(j, "step");
  if (!j || json_integer_value(json_object_get(j, "format")) != CKPT_FORMAT ||
      !json_is_integer(step) || json_integer_value(step) < 0 ||
      json_integer_value(step) > (1 << 30)) {
    rc = -EINVAL;
    snprintf(err, errlen, "%s: not a format-%d trainer state (%s)", file, CKPT_FORMAT,
             j ? "format, step" : je.text);
    goto out;
  }
  if ((rc = check_model(t->model, json_object_get(j, "model"), file, err, errlen)) < 0) goto out;
  /* Absent in checkpoints of fp32-only versions: AdamW's step was the step, no scaler state. */
  json_t *adam_step = json_object_get(j, "adam_step"), *ls = json_object_get(j, "loss_scale");
  json_t *good = json_object_get(j, "loss_scale_good_steps");
  if ((adam_step && (!json_is_integer(adam_step) || json_integer_value(adam_step) < 0 ||
                     json_integer_value(adam_step) > json_integer_value(step))) ||
      (ls && (!json_is_number(ls) || !(json_number_value(ls) > 0) ||
              !isfinite((float)json_number_value(ls)))) ||
      (good && (!json_is_integer(good) || json_integer_value(good) < 0 ||
                json_integer_value(good) >= t->scaler.growth_interval))) {
    rc = -EINVAL;
    snprintf(err, errlen, "%s: adam_step, loss_scale or loss_scale_good_steps out of range",
             file);
    goto out;
  }
  zt_model_state ms = {"", p};
  sprintf(file, "%s/model.safetensors", dir);
  if ((rc = zt_model_load_states(t->model, file, &ms, 1, 0, err, errlen)) < 0) goto out;
  zt_model_state os[2] = {{".exp_avg", m}, {".exp_avg_sq", v}};
  sprintf(file, "%s/optimizer.safetensors", dir);
  if ((rc = zt_model_load_states(t->model, file, os, 2, 1, err, errlen)) < 0) goto out;
  const zt_ops *o = t->be.ops;
  reached = 1;
  if (t->path) {
    if ((rc = t->path->write_state(t, p, m, v, err, errlen)) < 0) goto out;
  } else {
    o->to_device(t->be.ctx, t->params, p, n * sizeof(float));
    o->to_device(t->be.ctx, t->m, m, n * sizeof(float));
    o->to_device(t->be.ctx, t->v, v, n * sizeof(float));
    if (t->params_lp) o->cast(t->be.ctx, t->params_lp, t->tc.precision, t->params, ZT_F32, n);
  }
  if ((rc = o->sync(t->be.ctx)) < 0) {
    snprintf(err, errlen, "backend %s failed restoring %s (%d)", o->name, dir, rc);
    goto out;
  }
  t->step = (int)json_integer_value(step);
  t->adam_step = adam_step ? (int)json_integer_value(adam_step) : t->step;
  zt_loss_scaler_init(&t->scaler);
  if (ls) t->scaler.scale = (float)json_number_value(ls);
  if (good) t->scaler.good_steps = (int)json_integer_value(good);
out:
  if (rc < 0 && !reached) abandon_state(t);
  json_decref(j);
  free(file);
  free(p);
  free(m);
  free(v);
  return rc;
}

int zt_trainer_export(zt_trainer *t, const char *path, char *err, size_t errlen) {
  float *p = NULL;
  int rc = t->be.ops->sync(t->be.ctx);
  if (rc < 0) {
    snprintf(err, errlen, "backend %s failed before the export (%d)", t->be.ops->name, rc);
    abandon_state(t);
    return rc;
  }
  if (host_copy(t, t->params, &p) < 0) {
    snprintf(err, errlen, "%s: out of memory", path);
    abandon_state(t);
    return -ENOMEM;
  }
  char why[512] = "";
  if (t->path && (rc = t->path->read_state(t, p, NULL, NULL, why, sizeof why)) < 0) {
    snprintf(err, errlen, "%s: reading the offloaded parameters failed: %s", path,
             why[0] ? why : strerror(-rc));
    free(p);
    return rc;
  }
  zt_model_state ms = {"", p};
  rc = zt_model_save_states(t->model, path, &ms, 1, 0, NULL, err, errlen);
  free(p);
  return rc;
}
