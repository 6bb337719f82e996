/* defines: the flat layout (internal.h; dir.c saves and loads it) and zt_trainer_export
 * (engine/train/trainer.h; the tests: ztd's export serves a checkpoint's model.safetensors).
 *
 * model.safetensors, optimizer.safetensors and trainer.json hold the state in the model's
 * layout; any trainer loads it. A per-rank checkpoint's model.safetensors is the same file
 * (the parameters gathered, for the daemon's export), and an export writes it alone. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/train/checkpoint/internal.h"

#define CKPT_FORMAT 1
#define OPT_NOTE "AdamW exp_avg / exp_avg_sq in zt's internal layout: weights are (out, in), " \
                 "HF Conv1D weights are not transposed here as they are in model.safetensors"

/* A file of n states of the model's tensors (their suffixes), in the checkpoint layout (HF
 * Conv1D weights transposed) or the internal one (zt_model_save_states's files). */
typedef struct st_layout {
  const char *const *suffix;
  int n;
  unsigned flags;
} st_layout;

static const char *const model_suffix[] = {""};
static const char *const opt_suffix[] = {".exp_avg", ".exp_avg_sq"};
static const st_layout model_file = {model_suffix, 1, 0};
static const st_layout opt_file = {opt_suffix, 2, ZT_MODEL_FILE_INTERNAL};

/* The file's header, written first; the data follows piece by piece (write_piece). */
static int writer_open(zt_model_writer **w, const zt_model *m, const char *path, st_layout l,
                       const char *note, char *err, size_t errlen) {
  return zt_model_writer_open(w, m, path, l.suffix, l.n, l.flags, note, err, errlen);
}

/* The tensors of units [u0, u1) of state k, from buf (the range's flat layout), through scratch
 * (as many floats as the range) where the file holds a tensor transposed. */
static int write_piece(zt_model_writer *w, const zt_model *m, int k, int u0, int u1,
                       const float *buf, float *scratch, char *err, size_t errlen) {
  int first, end;
  zt__trainer_piece_tensors(m, u0, u1, &first, &end);
  return zt_model_writer_put(w, k, first, end, buf, scratch, err, errlen);
}

/* The file's tensors, found and checked before anything is read (zt_model_file_open, strict:
 * each present with its shape and a dtype that converts to fp32, nothing else in the file). */
static int file_open(zt_model_file **f, const zt_model *m, const char *path, st_layout l,
                     char *err, size_t errlen) {
  return zt_model_file_open(f, m, path, l.suffix, l.n, l.flags | ZT_MODEL_FILE_STRICT, err,
                            errlen);
}

/* The tensors of units [u0, u1) of state k from the file (at path, of layout l) into buf (the
 * range's flat layout), each checked against sums (sums.c; NULL: none recorded). */
static int read_piece(const zt_model_file *f, const char *path, st_layout l, const json_t *sums,
                      const zt_model *m, int k, int u0, int u1, float *buf, char *err,
                      size_t errlen) {
  int first, end, rc;
  zt__trainer_piece_tensors(m, u0, u1, &first, &end);
  uint64_t *got = malloc((size_t)(end - first + 1) * sizeof *got);
  if (!got) {
    snprintf(err, errlen, "%s: out of memory", path);
    return -ENOMEM;
  }
  rc = zt_model_file_read_sum(f, k, first, end, buf, got, err, errlen);
  for (int i = first; i < end && rc == 0; i++) {
    char name[160];
    snprintf(name, sizeof name, "%s%s", zt_model_tensor(m, i)->name, l.suffix[k]);
    rc = zt__ckpt_sums_check(sums, path, name, got[i - first], err, errlen);
  }
  free(got);
  return rc;
}

/* The state, a piece at a time, into wm (the parameters) and, unless NULL, wo (m and v), both
 * then finished: through buf, the staging of the parameters and the transposition's scratch,
 * and m and v's after them with wo (3 x cap floats; 2 x cap without). m's staging is the
 * scratch: the moments are written first. */
static int save_pieces(zt_trainer *t, const char *where, zt_model_writer *wm,
                       zt_model_writer *wo, float *buf, size_t cap, state_seq *q, char *err,
                       size_t errlen) {
  int rc = 0, nu = zt_model_num_units(t->model);
  float *p = buf, *m = wo ? buf + cap : NULL, *v = wo ? buf + 2 * cap : NULL;
  for (int u0 = 0, u1; u0 < nu && rc == 0; u0 = u1) {
    u1 = zt__trainer_piece_end(t->model, u0, cap);
    if ((rc = zt__ckpt_piece_out(t, where, u0, u1, p, m, v, q, err, errlen)) < 0) break;
    if (wo && ((rc = write_piece(wo, t->model, 0, u0, u1, m, NULL, err, errlen)) < 0 ||
               (rc = write_piece(wo, t->model, 1, u0, u1, v, NULL, err, errlen)) < 0))
      break;
    rc = write_piece(wm, t->model, 0, u0, u1, p, buf + cap, err, errlen);
  }
  if (rc == 0) rc = zt_model_writer_finish(wm, err, errlen);
  if (rc == 0 && wo) rc = zt_model_writer_finish(wo, err, errlen);
  return rc;
}

/* The parameters, gathered a piece at a time, as one file of the checkpoint layout at path
 * (zt_trainer_export, and a per-rank checkpoint's model.safetensors, whose tensors' sums go into
 * *sums unless sums is NULL). */
int zt__ckpt_write_params(zt_trainer *t, const char *path, state_seq *q, json_t **sums,
                          char *err, size_t errlen) {
  int rc;
  size_t cap = zt__trainer_piece_cap(t->model);
  float *buf = malloc(2 * cap * sizeof *buf);
  zt_model_writer *w = NULL;
  if (!buf) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", path);
  } else if ((rc = writer_open(&w, t->model, path, model_file, NULL, err, errlen)) == 0) {
    rc = save_pieces(t, path, w, NULL, buf, cap, q, err, errlen);
  }
  if (rc == 0 && sums &&
      !(*sums = zt__ckpt_sums_of_writer(w, t->model, model_file.suffix, model_file.n))) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", path);
  }
  zt_model_writer_close(w);
  free(buf);
  return rc;
}

/* The flat layout into the directory tmp. */
int zt__ckpt_save_flat(zt_trainer *t, const char *tmp, state_seq *q, char *err, size_t errlen) {
  int rc = 0;
  size_t cap = zt__trainer_piece_cap(t->model);
  char *file = malloc(strlen(tmp) + 64);
  float *buf = malloc(3 * cap * sizeof *buf);
  zt_model_writer *wm = NULL, *wo = NULL;
  json_t *j = NULL;
  if (!file || !buf) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", tmp);
    goto out;
  }
  sprintf(file, "%s/model.safetensors", tmp);
  if ((rc = writer_open(&wm, t->model, file, model_file, NULL, err, errlen)) < 0) goto out;
  sprintf(file, "%s/optimizer.safetensors", tmp);
  /* bf16 moments as BF16 tensors: exact, half the bytes */
  st_layout lo = opt_file;
  if (t->tc.state_dtype == ZT_BF16) lo.flags |= ZT_MODEL_FILE_BF16;
  if ((rc = writer_open(&wo, t->model, file, lo, OPT_NOTE, err, errlen)) < 0 ||
      (rc = save_pieces(t, tmp, wm, wo, buf, cap, q, err, errlen)) < 0)
    goto out;
  sprintf(file, "%s/trainer.json", tmp);
  json_t *head = json_pack("{s:i}", "format", CKPT_FORMAT);
  if (!head ||
      zt__ckpt_sums_add(head, "model.safetensors",
                        zt__ckpt_sums_of_writer(wm, t->model, model_file.suffix,
                                                model_file.n)) < 0 ||
      zt__ckpt_sums_add(head, "optimizer.safetensors",
                        zt__ckpt_sums_of_writer(wo, t->model, opt_file.suffix, opt_file.n)) < 0) {
    json_decref(head);
    head = NULL;
  }
  if (!(j = zt__ckpt_state_json(t, head))) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", file);
    goto out;
  }
  rc = zt__ckpt_write_json(file, j, err, errlen);
out:
  zt_model_writer_close(wm);
  zt_model_writer_close(wo);
  json_decref(j);
  free(file);
  free(buf);
  return rc;
}

/* The flat layout: trainer.json, then both files' tensors checked, then the pieces. */
int zt__ckpt_load_flat(zt_trainer *t, const char *dir, state_seq *q, ckpt_head *h, char *err,
                       size_t errlen) {
  int rc = 0, nu = zt_model_num_units(t->model);
  char *file = malloc(strlen(dir) + 64), *file_o = malloc(strlen(dir) + 64);
  float *buf = NULL;
  zt_model_file *fm = NULL, *fo = NULL;
  json_t *j = NULL;
  if (!file || !file_o) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", dir);
    goto out;
  }
  sprintf(file, "%s/trainer.json", dir);
  json_error_t je;
  j = json_load_file(file, 0, &je);
  if (!j || json_integer_value(json_object_get(j, "format")) != CKPT_FORMAT ||
      !zt__ckpt_step_in_range(json_object_get(j, "step"))) {
    rc = -EINVAL;
    /* jansson's text would quote the file: none of a file that is not what it should be */
    snprintf(err, errlen, "%s: not a format-%d trainer state (%s)", file, CKPT_FORMAT,
             j ? "format, step" : "missing, unreadable or not JSON");
    goto out;
  }
  if ((rc = zt__ckpt_read_head(t, j, file, h, err, errlen)) < 0) goto out;
  const json_t *sums_m, *sums_o;
  if ((rc = zt__ckpt_sums_file(j, file, "model.safetensors", &sums_m, err, errlen)) < 0 ||
      (rc = zt__ckpt_sums_file(j, file, "optimizer.safetensors", &sums_o, err, errlen)) < 0)
    goto out;
  if (!sums_m) zt__ckpt_sums_missing(dir);
  /* both files whole before any of the state is written */
  sprintf(file, "%s/model.safetensors", dir);
  sprintf(file_o, "%s/optimizer.safetensors", dir);
  if ((rc = file_open(&fm, t->model, file, model_file, err, errlen)) < 0 ||
      (rc = file_open(&fo, t->model, file_o, opt_file, err, errlen)) < 0)
    goto out;
  size_t cap = zt__trainer_piece_cap(t->model);
  if (!(buf = malloc(3 * cap * sizeof *buf))) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", dir);
    goto out;
  }
  float *p = buf, *m = buf + cap, *v = buf + 2 * cap;
  for (int u0 = 0, u1; u0 < nu; u0 = u1) {
    u1 = zt__trainer_piece_end(t->model, u0, cap);
    if ((rc = read_piece(fm, file, model_file, sums_m, t->model, 0, u0, u1, p, err, errlen)) < 0 ||
        (rc = read_piece(fo, file_o, opt_file, sums_o, t->model, 0, u0, u1, m, err, errlen)) < 0 ||
        (rc = read_piece(fo, file_o, opt_file, sums_o, t->model, 1, u0, u1, v, err, errlen)) < 0 ||
        (rc = zt__ckpt_piece_in(t, dir, u0, u1, p, m, v, q, err, errlen)) < 0)
      goto out;
  }
out:
  free(file_o);
  zt_model_file_close(fm);
  zt_model_file_close(fo);
  json_decref(j);
  free(file);
  free(buf);
  return rc;
}

int zt_trainer_export(zt_trainer *t, const char *path, char *err, size_t errlen) {
  state_seq q = {0, 0, 0};
  int rc = t->be.ops->sync(t->be.ctx);
  if (rc < 0)
    snprintf(err, errlen, "backend %s failed before the export (%d)", t->be.ops->name, rc);
  else
    rc = zt__ckpt_write_params(t, path, &q, NULL, err, errlen);
  zt__ckpt_seq_end(t, &q, rc);
  return rc;
}
