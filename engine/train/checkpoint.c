/* Checkpoints: a directory written as DIR.tmp, every file and the directory fsynced, then swapped
 * into place with renameat2(RENAME_EXCHANGE) so DIR is always either the old or the new complete
 * checkpoint; the old one is then removed.
 *
 * The state moves in pieces: runs of whole units of at most the largest unit's parameters, in
 * unit order. A save reads a piece from the trainer (its backend, or its step path's tiers)
 * into one staging of parameters, m and v and writes it at its tensors' places in the files,
 * whose headers were written first from the model's tensor list; a load reads a piece from the
 * files into the staging and writes it into the trainer. So a checkpoint takes
 * zt_trainer_checkpoint_bytes of host memory, not the flat state (12 bytes a parameter). */
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/model/safetensors.h"
#include "engine/train/cfg_json.h"
#include "engine/train/trainer_internal.h"

#define CKPT_FORMAT 1
#define OPT_NOTE "AdamW exp_avg / exp_avg_sq in zt's internal layout: weights are (out, in), " \
                 "HF Conv1D weights are not transposed here as they are in model.safetensors"
/* a tensor's name in a file: its model name and the state's suffix */
#define NAME_MAX_LEN 128
/* What building a file's header takes per tensor of it, at most: the entries, the names and
 * jansson's tree of the header (about 1.2 KB measured, test_ckpt_memory); an allowance for
 * zt_trainer_checkpoint_bytes, not a count. */
#define HEADER_BYTES_PER_TENSOR 2048

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

/* ---- pieces of the state --------------------------------------------------------------------- */

static size_t unit_end(const zt_model *m, int u) {
  const zt_unit_info *ui = zt_model_unit(m, u);
  return ui->offset + ui->numel;
}

/* The staging's floats per kind: the largest unit's parameters. */
static size_t piece_cap(const zt_model *m) {
  size_t cap = 0;
  for (int u = 0; u < zt_model_num_units(m); u++)
    if (zt_model_unit(m, u)->numel > cap) cap = zt_model_unit(m, u)->numel;
  return cap;
}

/* the staging, the reader's chunk, the headers of both files (3 entries a model tensor) */
static size_t checkpoint_bytes(const zt_model *m) {
  return 3 * piece_cap(m) * sizeof(float) + ZT_ST_CHUNK_BYTES +
         3 * (size_t)zt_model_num_tensors(m) * HEADER_BYTES_PER_TENSOR;
}

size_t zt_trainer_checkpoint_bytes(const zt_trainer *t) { return checkpoint_bytes(t->model); }

size_t zt_checkpoint_estimate_bytes(const zt_model_cfg *mc) {
  char err[256];
  zt_model *m = NULL;
  if (zt_model_create(&m, mc, err, sizeof err) < 0) return SIZE_MAX;
  size_t bytes = checkpoint_bytes(m);
  zt_model_destroy(m);
  return bytes;
}

/* The end of the piece that starts at unit u0: the units after it while their parameters
 * together fit in cap floats (the largest unit always does alone). The units tile the flat
 * layout in order, so the piece is one range of it. */
static int piece_end(const zt_model *m, int u0, size_t cap) {
  int u1 = u0 + 1;
  size_t base = zt_model_unit(m, u0)->offset;
  while (u1 < zt_model_num_units(m) && unit_end(m, u1) - base <= cap) u1++;
  return u1;
}

/* The tensors of units [u0, u1): [first, end). */
static void piece_tensors(const zt_model *m, int u0, int u1, int *first, int *end) {
  const zt_unit_info *last = zt_model_unit(m, u1 - 1);
  *first = zt_model_unit(m, u0)->first_tensor;
  *end = last->first_tensor + last->n_tensors;
}

/* Units [u0, u1) of the state out of the trainer into buffers of that range (any NULL): the
 * step path's, or the backend's buffers. */
static int state_read(zt_trainer *t, int u0, int u1, float *p, float *m, float *v, char *err,
                      size_t errlen) {
  if (t->path) return t->path->read_state(t, u0, u1, p, m, v, err, errlen);
  const zt_ops *o = t->be.ops;
  size_t off = zt_model_unit(t->model, u0)->offset;
  size_t bytes = (unit_end(t->model, u1 - 1) - off) * sizeof(float);
  float *dst[3] = {p, m, v};
  const float *src[3] = {t->params, t->m, t->v};
  for (int k = 0; k < 3; k++)
    if (dst[k]) o->to_host(t->be.ctx, dst[k], src[k] + off, bytes);
  int rc = o->sync(t->be.ctx);
  if (rc < 0) snprintf(err, errlen, "backend %s: %s", o->name, o->error_text(t->be.ctx));
  return rc;
}

/* ... and into it, the compute copy following the parameters. */
static int state_write(zt_trainer *t, int u0, int u1, const float *p, const float *m,
                       const float *v, char *err, size_t errlen) {
  if (t->path) return t->path->write_state(t, u0, u1, p, m, v, err, errlen);
  const zt_ops *o = t->be.ops;
  size_t off = zt_model_unit(t->model, u0)->offset, n = unit_end(t->model, u1 - 1) - off;
  o->to_device(t->be.ctx, t->params + off, p, n * sizeof(float));
  o->to_device(t->be.ctx, t->m + off, m, n * sizeof(float));
  o->to_device(t->be.ctx, t->v + off, v, n * sizeof(float));
  if (t->params_lp)
    o->cast(t->be.ctx, (char *)t->params_lp + off * zt_dtype_size(t->tc.precision),
            t->tc.precision, t->params + off, ZT_F32, n);
  int rc = o->sync(t->be.ctx);
  if (rc < 0) snprintf(err, errlen, "backend %s: %s", o->name, o->error_text(t->be.ctx));
  return rc;
}

/* ---- the files' tensors ---------------------------------------------------------------------- */

/* The shape a tensor has in a file of the checkpoint layout (HF Conv1D weights transposed) or
 * the internal one, as zt_model_save_states writes them. */
static void file_shape(const zt_tensor_info *ti, int internal, int64_t out[2]) {
  int swap = internal && ti->transposed;
  out[0] = ti->shape[swap ? 1 : 0];
  out[1] = ti->shape[swap ? 0 : 1];
}

/* A file of n states of the model's tensors (their suffixes), in zt_model_save_states's order:
 * state by state, the tensors in layout order; tensor i of state k is entry k * nt + i. */
typedef struct st_layout {
  const char *const *suffix;
  int n, internal;
} st_layout;

static const char *const model_suffix[] = {""};
static const char *const opt_suffix[] = {".exp_avg", ".exp_avg_sq"};
static const st_layout model_file = {model_suffix, 1, 0};
static const st_layout opt_file = {opt_suffix, 2, 1};

static void entry_name(const zt_tensor_info *ti, const char *suffix, char *out) {
  snprintf(out, NAME_MAX_LEN, "%s%s", ti->name, suffix);
}

/* The file's header, written first; the data follows piece by piece (write_piece). */
static int writer_open(zt_st_writer **w, const zt_model *m, const char *path, st_layout l,
                       const char *note, char *err, size_t errlen) {
  int nt = zt_model_num_tensors(m), ne = nt * l.n, rc;
  zt_st_entry *e = calloc((size_t)ne + 1, sizeof *e);
  char *names = malloc((size_t)ne * NAME_MAX_LEN + 1);
  if (!e || !names) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", path);
    goto out;
  }
  for (int k = 0; k < l.n; k++)
    for (int i = 0; i < nt; i++) {
      const zt_tensor_info *ti = zt_model_tensor(m, i);
      zt_st_entry *x = &e[k * nt + i];
      char *name = names + (size_t)(k * nt + i) * NAME_MAX_LEN;
      entry_name(ti, l.suffix[k], name);
      x->name = name;
      x->ndim = ti->ndim;
      file_shape(ti, l.internal, x->shape);
    }
  const char *meta[6] = {"format", "pt", "arch", zt_arch_name(zt_model_cfg_of(m)->arch),
                         "note", note};
  rc = zt_st_writer_open(w, path, e, ne, meta, note ? 3 : 2, err, errlen);
out:
  free(e);
  free(names);
  return rc;
}

/* The tensors of units [u0, u1) of state k, from buf (the range's flat layout); a tensor stored
 * transposed (HF Conv1D, checkpoint layout) goes through scratch (as many floats as the range). */
static int write_piece(zt_st_writer *w, const zt_model *m, st_layout l, int k, int u0, int u1,
                       const float *buf, float *scratch, char *err, size_t errlen) {
  int nt = zt_model_num_tensors(m), first, end, rc = 0;
  size_t base = zt_model_unit(m, u0)->offset;
  piece_tensors(m, u0, u1, &first, &end);
  for (int i = first; i < end && rc == 0; i++) {
    const zt_tensor_info *ti = zt_model_tensor(m, i);
    const float *x = buf + (ti->offset - base);
    if (ti->transposed && !l.internal) {
      /* internal (shape[1], shape[0]) -> the file's (shape[0], shape[1]) */
      size_t R = (size_t)ti->shape[0], C = (size_t)ti->shape[1];
      for (size_t a = 0; a < R; a++)
        for (size_t b = 0; b < C; b++) scratch[a * C + b] = x[b * R + a];
      x = scratch;
    }
    rc = zt_st_writer_put(w, k * nt + i, x, err, errlen);
  }
  return rc;
}

/* The tensors of file f for a layout of m's tensors, found and checked before anything is
 * read: each present with its shape and a dtype that converts to fp32, nothing else in the
 * file. found[k * nt + i]. */
static int resolve(const zt_model *m, const zt_st_file *f, const char *path, st_layout l,
                   const zt_st_tensor **found, char *err, size_t errlen) {
  int nt = zt_model_num_tensors(m), rc = 0;
  char *used = calloc((size_t)zt_st_count(f) + 1, 1);
  if (!used) {
    snprintf(err, errlen, "%s: out of memory", path);
    return -ENOMEM;
  }
  for (int k = 0; k < l.n && rc == 0; k++)
    for (int i = 0; i < nt && rc == 0; i++) {
      const zt_tensor_info *ti = zt_model_tensor(m, i);
      char nm[NAME_MAX_LEN];
      entry_name(ti, l.suffix[k], nm);
      const zt_st_tensor *ft = zt_st_find(f, nm);
      int64_t want[2];
      file_shape(ti, l.internal, want);
      rc = -EINVAL;
      if (!ft) {
        snprintf(err, errlen, "%s: tensor %s is missing", path, nm);
      } else if (ft->ndim != ti->ndim || ft->shape[0] != want[0] ||
                 (ti->ndim > 1 && ft->shape[1] != want[1])) {
        char got[128] = "";
        for (int d = 0; d < ft->ndim; d++)
          snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "",
                   (long long)ft->shape[d]);
        if (ti->ndim > 1)
          snprintf(err, errlen, "%s: tensor %s has shape [%s], expected [%lld, %lld]", path, nm,
                   got, (long long)want[0], (long long)want[1]);
        else
          snprintf(err, errlen, "%s: tensor %s has shape [%s], expected [%lld]", path, nm, got,
                   (long long)want[0]);
      } else if (ft->dtype != ZT_ST_F32 && ft->dtype != ZT_ST_BF16 && ft->dtype != ZT_ST_F16) {
        snprintf(err, errlen, "%s: tensor %s: dtype does not convert to fp32 (F32, BF16, F16 do)",
                 path, nm);
      } else {
        rc = 0;
        found[k * nt + i] = ft;
        used[ft - zt_st_tensor_at(f, 0)] = 1;
      }
    }
  for (int i = 0; i < zt_st_count(f) && rc == 0; i++)
    if (!used[i]) {
      rc = -EINVAL;
      snprintf(err, errlen, "%s: unexpected tensor %s (not part of this %s model)", path,
               zt_st_tensor_at(f, i)->name, zt_arch_name(zt_model_cfg_of(m)->arch));
    }
  free(used);
  return rc;
}

/* The tensors of units [u0, u1) of state k from the file into buf (the range's flat layout). */
static int read_piece(const zt_st_file *f, const zt_st_tensor *const *found, const zt_model *m,
                      st_layout l, int k, int u0, int u1, float *buf, char *err, size_t errlen) {
  int nt = zt_model_num_tensors(m), first, end, rc = 0;
  size_t base = zt_model_unit(m, u0)->offset;
  piece_tensors(m, u0, u1, &first, &end);
  for (int i = first; i < end && rc == 0; i++) {
    const zt_tensor_info *ti = zt_model_tensor(m, i);
    rc = zt_st_read_f32(f, found[k * nt + i], buf + (ti->offset - base),
                        ti->transposed && !l.internal, err, errlen);
  }
  return rc;
}

/* ---- save, load, export ---------------------------------------------------------------------- */

/* Where a checkpoint call is in its sequence of state calls, for its cleanup: a call that
 * fails before the sequence ended, other than inside a state call (whose path handled it),
 * tells a path whose other parts wait for the next piece (trainer_internal.h). */
typedef struct state_seq {
  int next;         /* the first unit not moved yet */
  int failed;       /* a state call failed */
} state_seq;

static void seq_end(zt_trainer *t, const state_seq *q, int rc) {
  if (rc < 0 && !q->failed && q->next < zt_model_num_units(t->model) && t->path &&
      t->path->abandon_state)
    t->path->abandon_state(t);
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
  int rc = 0, nu = zt_model_num_units(t->model);
  state_seq q = {0, 0};
  char *tmp = NULL, *parent = NULL, *file = NULL;
  float *buf = NULL;
  zt_st_writer *wm = NULL, *wo = NULL;
  json_t *j = NULL;
  if ((rc = t->be.ops->sync(t->be.ctx)) < 0) {
    snprintf(err, errlen, "backend %s failed before the checkpoint (%d)", t->be.ops->name, rc);
    goto out;
  }
  size_t cap = piece_cap(t->model);
  if (asprintf(&tmp, "%s.tmp", dir) < 0) tmp = NULL;
  if (!tmp || !(parent = parent_of(dir)) || !(file = malloc(strlen(dir) + 64)) ||
      !(buf = malloc(3 * cap * sizeof *buf))) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", dir);
    goto out;
  }
  float *p = buf, *m = buf + cap, *v = buf + 2 * cap;
  /* a leftover from a crash mid-save is incomplete by construction */
  if ((rc = remove_dir(tmp)) < 0 || (mkdir(tmp, 0755) < 0 && (rc = -errno))) {
    snprintf(err, errlen, "%s: %s", tmp, strerror(-rc));
    goto out;
  }
  sprintf(file, "%s/model.safetensors", tmp);
  if ((rc = writer_open(&wm, t->model, file, model_file, NULL, err, errlen)) < 0) goto out;
  sprintf(file, "%s/optimizer.safetensors", tmp);
  if ((rc = writer_open(&wo, t->model, file, opt_file, OPT_NOTE, err, errlen)) < 0) goto out;
  for (int u0 = 0, u1; u0 < nu; u0 = u1) {
    u1 = piece_end(t->model, u0, cap);
    char why[512] = "";
    if ((rc = state_read(t, u0, u1, p, m, v, why, sizeof why)) < 0) {
      q.failed = 1;
      snprintf(err, errlen, "%s: reading the trainer's state failed: %s", dir,
               why[0] ? why : strerror(-rc));
      goto out;
    }
    q.next = u1;
    /* the moments first: m's staging is then free for the transposed parameters */
    if ((rc = write_piece(wo, t->model, opt_file, 0, u0, u1, m, NULL, err, errlen)) < 0 ||
        (rc = write_piece(wo, t->model, opt_file, 1, u0, u1, v, NULL, err, errlen)) < 0 ||
        (rc = write_piece(wm, t->model, model_file, 0, u0, u1, p, m, err, errlen)) < 0)
      goto out;
  }
  if ((rc = zt_st_writer_finish(wm, err, errlen)) < 0 ||
      (rc = zt_st_writer_finish(wo, err, errlen)) < 0)
    goto out;
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
  seq_end(t, &q, rc);
  zt_st_writer_close(wm);
  zt_st_writer_close(wo);
  json_decref(j);
  free(tmp);
  free(parent);
  free(file);
  free(buf);
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
  int rc = 0, nu = zt_model_num_units(t->model), nt = zt_model_num_tensors(t->model);
  state_seq q = {0, 0};
  char *file = malloc(strlen(dir) + 64);
  float *buf = NULL;
  zt_st_file *fm = NULL, *fo = NULL;
  const zt_st_tensor **found = calloc(3 * (size_t)nt, sizeof *found);
  json_t *j = NULL;
  if (!file || !found) {
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
  /* both files whole before any of the state is written */
  sprintf(file, "%s/model.safetensors", dir);
  if ((rc = zt_st_open(&fm, file, err, errlen)) < 0 ||
      (rc = resolve(t->model, fm, file, model_file, found, err, errlen)) < 0)
    goto out;
  sprintf(file, "%s/optimizer.safetensors", dir);
  if ((rc = zt_st_open(&fo, file, err, errlen)) < 0 ||
      (rc = resolve(t->model, fo, file, opt_file, found + nt, err, errlen)) < 0)
    goto out;
  size_t cap = piece_cap(t->model);
  if (!(buf = malloc(3 * cap * sizeof *buf))) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", dir);
    goto out;
  }
  float *p = buf, *m = buf + cap, *v = buf + 2 * cap;
  for (int u0 = 0, u1; u0 < nu; u0 = u1) {
    u1 = piece_end(t->model, u0, cap);
    if ((rc = read_piece(fm, found, t->model, model_file, 0, u0, u1, p, err, errlen)) < 0 ||
        (rc = read_piece(fo, found + nt, t->model, opt_file, 0, u0, u1, m, err, errlen)) < 0 ||
        (rc = read_piece(fo, found + nt, t->model, opt_file, 1, u0, u1, v, err, errlen)) < 0)
      goto out;
    char why[512] = "";
    if ((rc = state_write(t, u0, u1, p, m, v, why, sizeof why)) < 0) {
      q.failed = 1;
      snprintf(err, errlen, "%s: writing the state into the trainer failed: %s", dir,
               why[0] ? why : strerror(-rc));
      goto out;
    }
    q.next = u1;
  }
  t->step = (int)json_integer_value(step);
  t->adam_step = adam_step ? (int)json_integer_value(adam_step) : t->step;
  zt_loss_scaler_init(&t->scaler);
  if (ls) t->scaler.scale = (float)json_number_value(ls);
  if (good) t->scaler.good_steps = (int)json_integer_value(good);
out:
  /* a failure after the first piece leaves part of the checkpoint in the trainer (one inside
   * the first is its path's to refuse steps after, as a failed step is) */
  if (q.next > 0) t->part_loaded = rc < 0;
  seq_end(t, &q, rc);
  zt_st_close(fm);
  zt_st_close(fo);
  json_decref(j);
  free(file);
  free(found);
  free(buf);
  return rc;
}

int zt_trainer_export(zt_trainer *t, const char *path, char *err, size_t errlen) {
  int rc = t->be.ops->sync(t->be.ctx), nu = zt_model_num_units(t->model);
  state_seq q = {0, 0};
  size_t cap = piece_cap(t->model);
  float *buf = NULL;
  zt_st_writer *w = NULL;
  if (rc < 0) {
    snprintf(err, errlen, "backend %s failed before the export (%d)", t->be.ops->name, rc);
    goto out;
  }
  /* the parameters and the transposition's scratch */
  if (!(buf = malloc(2 * cap * sizeof *buf))) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", path);
    goto out;
  }
  if ((rc = writer_open(&w, t->model, path, model_file, NULL, err, errlen)) < 0) goto out;
  for (int u0 = 0, u1; u0 < nu; u0 = u1) {
    u1 = piece_end(t->model, u0, cap);
    char why[512] = "";
    if ((rc = state_read(t, u0, u1, buf, NULL, NULL, why, sizeof why)) < 0) {
      q.failed = 1;
      snprintf(err, errlen, "%s: reading the trainer's parameters failed: %s", path,
               why[0] ? why : strerror(-rc));
      goto out;
    }
    q.next = u1;
    if ((rc = write_piece(w, t->model, model_file, 0, u0, u1, buf, buf + cap, err, errlen)) < 0)
      goto out;
  }
  rc = zt_st_writer_finish(w, err, errlen);
out:
  seq_end(t, &q, rc);
  zt_st_writer_close(w);
  free(buf);
  return rc;
}

int zt_trainer_get_state(zt_trainer *t, float *params, float *exp_avg, float *exp_avg_sq) {
  state_seq q = {0, 0};
  char why[512];
  int rc = t->be.ops->sync(t->be.ctx);
  if (rc == 0) {
    /* the caller holds the whole flat layout: one piece */
    rc = state_read(t, 0, zt_model_num_units(t->model), params, exp_avg, exp_avg_sq, why,
                    sizeof why);
    q.failed = rc < 0;
  }
  seq_end(t, &q, rc);
  return rc;
}
