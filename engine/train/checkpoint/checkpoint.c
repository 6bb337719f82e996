/* Checkpoints: a directory written as DIR.tmp, every file and the directory fsynced, then swapped
 * into place with renameat2(RENAME_EXCHANGE) so DIR is always either the old or the new complete
 * checkpoint; the old one is then removed. A save that fails removes DIR.tmp and leaves DIR as
 * it was.
 *
 * Two layouts. The flat one (model.safetensors, optimizer.safetensors, trainer.json) holds the
 * state in the model's layout. The per-rank one, which a data-parallel trainer running every
 * rank of its world writes (zt__train_path.shards), holds each rank's chunks of the fp32
 * parameters, m and v (offload/shard.h) in a file of its own, rank-R.safetensors, which every
 * rank writes (and, loading into the same world, reads) on its own thread at once, through a
 * staging of one chunk; manifest.json names the layout (world, stage, each unit's chunk, each
 * rank's file and size) beside trainer.json's fields; model.safetensors holds the parameters
 * gathered, as the flat one's, for the daemon's export. A load takes either layout into any
 * trainer: a per-rank one whose chunks are not the trainer's is read a piece at a time, each
 * unit's range assembled from the ranks' files, and written as a flat one is.
 *
 * A data-parallel part (dp.h, "Parts") runs only some of its world's ranks. The part holding
 * rank 0 saves and loads; every other part follows in zt_trainer_dp_send_state /
 * _receive_state. Its checkpoints are per rank where every part sees the checkpoint's directory
 * (a filesystem the daemons share at the same path): the save first puts a marker file of a
 * random token (PROBE_FILE) into DIR.tmp and asks the path to probe (zt__train_path.probe),
 * whose collective has every rank check its own view of the path for the token
 * (zt__ckpt_probe_sees); a load's marker is the manifest itself, the token a digest of its bytes.
 * Where all see it, every part's ranks write (read) their own files through the same code as
 * above, the other parts' through zt__rank_files_open, and the path exchanges their results and
 * the files' sizes for the manifest; the rank-0 part writes the manifest and model.safetensors
 * and swaps DIR.tmp into place only after that verdict. Where some do not, the state goes through
 * the flat layout, gathered into (scattered from) the rank-0 part's files. The per-rank files
 * parts write are the ones a trainer running every rank writes, byte for byte: a checkpoint
 * does not depend on the split into parts.
 *
 * The state moves in pieces: runs of whole units of at most the largest unit's parameters, in
 * unit order. A save reads a piece from the trainer (its backend, or its step path's tiers)
 * into one staging of parameters, m and v and writes it at its tensors' places in the files,
 * whose headers were written first from the model's tensor list; a load reads a piece from the
 * files into the staging and writes it into the trainer. So a checkpoint takes
 * zt_trainer_checkpoint_bytes of host memory, not the flat state (12 bytes a parameter). */
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/model/safetensors.h"
#include "engine/train/config.h"
#include "engine/train/dp/dp.h"
#include "engine/train/trainer_internal.h"

#define CKPT_FORMAT 1
#define MANIFEST_FORMAT 1
#define MANIFEST "manifest.json"
#define LAYOUT_PER_RANK "per-rank"
/* A part's save: the marker of the probe in its temporary directory (probe_parts) */
#define PROBE_FILE "probe"
#define PROBE_TOKEN_LEN 64
#define OPT_NOTE "AdamW exp_avg / exp_avg_sq in zt's internal layout: weights are (out, in), " \
                 "HF Conv1D weights are not transposed here as they are in model.safetensors"
/* a tensor's name in a rank's file: its unit's name and the state's suffix */
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

/* the staging, the reader's chunk, the headers of both files (3 entries a model tensor) */
static size_t flat_bytes(const zt_model *m) {
  return 3 * zt__trainer_piece_cap(m) * sizeof(float) + ZT_ST_CHUNK_BYTES +
         3 * (size_t)zt_model_num_tensors(m) * HEADER_BYTES_PER_TENSOR;
}

/* A per-rank checkpoint's files in parallel: every rank its staging of a chunk of each tensor,
 * a reader's chunk and its file's header (3 entries a unit), and the manifest's tree (an entry
 * a unit and a rank, and the configuration). */
static size_t rank_bytes(const zt_model *m, const zt_shard_table *tab) {
  size_t nu = (size_t)zt_model_num_units(m), W = (size_t)tab->world;
  return W * (3 * tab->max_chunk * sizeof(float) + ZT_ST_CHUNK_BYTES +
              3 * nu * HEADER_BYTES_PER_TENSOR) +
         (nu + W + 16) * HEADER_BYTES_PER_TENSOR;
}

/* Of a trainer of model m, with the shard table of its per-rank checkpoints (NULL: flat ones):
 * a per-rank save writes model.safetensors the flat way first, then the ranks' files. */
static size_t checkpoint_bytes(const zt_model *m, const zt_shard_table *tab) {
  size_t flat = flat_bytes(m), ranks = tab ? rank_bytes(m, tab) : 0;
  return ranks > flat ? ranks : flat;
}

size_t zt_trainer_checkpoint_bytes(const zt_trainer *t) {
  return checkpoint_bytes(t->model,
                          t->path && t->path->shards ? t->path->shards(t, NULL, NULL) : NULL);
}

/* world 0: a trainer of flat checkpoints; else one that runs every rank of that world. */
static size_t estimate(const zt_model_cfg *mc, int world) {
  char err[256];
  zt_model *m = NULL;
  zt_shard_table *tab = NULL;
  size_t bytes = SIZE_MAX;
  if (zt_model_create(&m, mc, err, sizeof err) == 0 &&
      (world == 0 || zt__trainer_shard_table(m, world, &tab) == 0))
    bytes = checkpoint_bytes(m, tab);
  zt_shard_table_free(tab);
  zt_model_destroy(m);
  return bytes;
}

size_t zt_checkpoint_estimate_bytes(const zt_model_cfg *mc) { return estimate(mc, 0); }

size_t zt_checkpoint_estimate_bytes_dp(const zt_model_cfg *mc, int world) {
  return world >= 1 && world <= ZT_DP_MAX_WORLD ? estimate(mc, world) : SIZE_MAX;
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

/* The tensors of units [u0, u1) of state k from the file into buf (the range's flat layout). */
static int read_piece(const zt_model_file *f, const zt_model *m, int k, int u0, int u1,
                      float *buf, char *err, size_t errlen) {
  int first, end;
  zt__trainer_piece_tensors(m, u0, u1, &first, &end);
  return zt_model_file_read(f, k, first, end, buf, err, errlen);
}

/* ---- save, load, export ---------------------------------------------------------------------- */

/* Where a checkpoint call is in its sequence of state calls, for its cleanup: a call that
 * fails before the sequence ended, other than inside a state call (whose path handled it),
 * tells a path whose other parts wait for the next piece (trainer_internal.h). */
typedef struct state_seq {
  int next;         /* the first unit not moved yet */
  int failed;       /* a state call failed */
  int shards;       /* a per-rank load began writing the ranks' chunks (load_shards) */
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

/* trainer.json's fields after its format: the steps, the loss scaler, the configuration (the
 * manifest holds them too). The loss scale is a power of two: a JSON real holds it exactly. */
static json_t *state_json(const zt_trainer *t, json_t *head) {
  const zt_model_cfg *mc = zt_model_cfg_of(t->model);
  json_t *j = json_pack("{s:i, s:i, s:f, s:i, s:s, s:o, s:o}", "step", t->step, "adam_step",
                        t->adam_step, "loss_scale", (double)t->scaler.scale,
                        "loss_scale_good_steps", t->scaler.good_steps, "arch",
                        zt_arch_name(mc->arch), "model", zt_config_model_to_json(mc), "train",
                        zt_config_train_to_json(&t->tc));
  int bad = !j || !head || json_object_update(head, j) < 0;
  json_decref(j);
  if (bad) {
    json_decref(head);
    return NULL;
  }
  return head;
}

/* Piece [u0, u1) of the state out of the trainer into the staging (the step path's call to
 * follow for a failure, q), for a save into `where`. */
static int piece_out(zt_trainer *t, const char *where, int u0, int u1, float *p, float *m,
                     float *v, state_seq *q, char *err, size_t errlen) {
  char why[512] = "";
  int rc = state_read(t, u0, u1, p, m, v, why, sizeof why);
  if (rc < 0) {
    q->failed = 1;
    snprintf(err, errlen, "%s: reading the trainer's %s failed: %s", where,
             m ? "state" : "parameters", why[0] ? why : strerror(-rc));
  } else {
    q->next = u1;
  }
  return rc;
}

/* ... and into it from the staging, for a load of the checkpoint dir. */
static int piece_in(zt_trainer *t, const char *dir, int u0, int u1, const float *p,
                    const float *m, const float *v, state_seq *q, char *err, size_t errlen) {
  char why[512] = "";
  int rc = state_write(t, u0, u1, p, m, v, why, sizeof why);
  if (rc < 0) {
    q->failed = 1;
    snprintf(err, errlen, "%s: writing the state into the trainer failed: %s", dir,
             why[0] ? why : strerror(-rc));
  } else {
    q->next = u1;
  }
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
    if ((rc = piece_out(t, where, u0, u1, p, m, v, q, err, errlen)) < 0) break;
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
 * (zt_trainer_export, and a per-rank checkpoint's model.safetensors). */
static int write_params(zt_trainer *t, const char *path, state_seq *q, char *err,
                        size_t errlen) {
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
  zt_model_writer_close(w);
  free(buf);
  return rc;
}

/* The flat layout into the directory tmp. */
static int save_flat(zt_trainer *t, const char *tmp, state_seq *q, char *err, size_t errlen) {
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
  if ((rc = writer_open(&wo, t->model, file, opt_file, OPT_NOTE, err, errlen)) < 0 ||
      (rc = save_pieces(t, tmp, wm, wo, buf, cap, q, err, errlen)) < 0)
    goto out;
  sprintf(file, "%s/trainer.json", tmp);
  if (!(j = state_json(t, json_pack("{s:i}", "format", CKPT_FORMAT)))) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", file);
    goto out;
  }
  rc = write_json(file, j, err, errlen);
out:
  zt_model_writer_close(wm);
  zt_model_writer_close(wo);
  json_decref(j);
  free(file);
  free(buf);
  return rc;
}

/* ---- per-rank checkpoints ------------------------------------------------------------------- */

/* The layout: each unit of the model split into world chunks of chunk[u] elements, rank r's
 * the unit's elements [r * chunk, (r + 1) * chunk) (offload/shard.h; the padding is not kept). */
typedef struct rank_layout {
  int world, zero_stage;
  size_t align;
  const size_t *chunk;
} rank_layout;

/* Rank r's real elements of unit u. */
static size_t rank_count(const zt_model *m, const rank_layout *l, int u, int r) {
  size_t n = zt_model_unit(m, u)->numel, at = (size_t)r * l->chunk[u];
  return at >= n ? 0 : n - at < l->chunk[u] ? n - at : l->chunk[u];
}

/* A rank file's tensors: per unit where the rank has elements, "<unit>.params", then its m and
 * v, 1-D, in unit order. */
static const char *const rank_suffix[3] = {".params", ".exp_avg", ".exp_avg_sq"};

/* One rank's file: a save's writer or a load's reader with its tensors. */
typedef struct rank_file {
  char *path;
  const char *name;             /* in path: the file's name in the directory */
  int *first;                   /* a save: unit u's params entry (-1: none of its elements) */
  zt_st_writer *w;
  zt_st_file *f;
  const zt_st_tensor **found;   /* a load: unit u's state k, [3 * u + k] */
} rank_file;

typedef struct rank_set {
  const zt_model *m;
  rank_layout l;
  rank_file *rf;                /* world */
  long long *bytes;             /* world: a save's finished files' sizes (zt__shard_io.bytes) */
} rank_set;

static void rank_set_close(rank_set *x) {
  for (int r = 0; x->rf && r < x->l.world; r++) {
    rank_file *f = &x->rf[r];
    zt_st_writer_close(f->w);
    zt_st_close(f->f);
    free(f->path);
    free(f->first);
    free(f->found);
  }
  free(x->rf);
  free(x->bytes);
  x->rf = NULL;
  x->bytes = NULL;
}

/* The files of layout l in dir, called names[r] (a manifest's) or rank-R.safetensors. */
static int rank_set_open(rank_set *x, const zt_model *m, const rank_layout *l, const char *dir,
                         const char *const *names, char *err, size_t errlen) {
  size_t nu = (size_t)zt_model_num_units(m), dl = strlen(dir);
  x->m = m;
  x->l = *l;
  if (!(x->rf = calloc((size_t)l->world, sizeof *x->rf)) ||
      !(x->bytes = calloc((size_t)l->world, sizeof *x->bytes)))
    goto oom;
  for (int r = 0; r < l->world; r++) {
    rank_file *f = &x->rf[r];
    int n = names ? asprintf(&f->path, "%s/%s", dir, names[r])
                  : asprintf(&f->path, "%s/rank-%d.safetensors", dir, r);
    if (n < 0) {
      f->path = NULL;
      goto oom;
    }
    f->name = f->path + dl + 1;
    if (!(f->first = malloc(nu * sizeof *f->first)) ||
        !(f->found = calloc(3 * nu, sizeof *f->found)))
      goto oom;
  }
  return 0;
oom:
  snprintf(err, errlen, "%s: out of memory", dir);
  return -ENOMEM;
}

/* Rank r's file opened and checked against the layout: every chunk of the rank there as a 1-D
 * tensor of its elements in a dtype that converts to fp32, nothing else. */
static int rank_file_open(rank_set *x, int r, char *err, size_t errlen) {
  rank_file *f = &x->rf[r];
  const zt_model *m = x->m;
  int rc = zt_st_open(&f->f, f->path, err, errlen);
  if (rc < 0) return rc;
  char *used = calloc((size_t)zt_st_count(f->f) + 1, 1);
  if (!used) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", f->path);
  }
  for (int u = 0; u < zt_model_num_units(m) && rc == 0; u++) {
    const char *un = zt_model_unit(m, u)->name;
    size_t c = rank_count(m, &x->l, u, r);
    for (int k = 0; c && k < 3 && rc == 0; k++) {
      char nm[NAME_MAX_LEN];
      snprintf(nm, sizeof nm, "%s%s", un, rank_suffix[k]);
      const zt_st_tensor *ft = zt_st_find(f->f, nm);
      rc = -EINVAL;
      if (!ft)
        snprintf(err, errlen, "%s: tensor %s is missing (rank %d's %zu elements of unit %s in "
                 MANIFEST ")", f->path, nm, r, c, un);
      else if (ft->ndim != 1 || ft->numel != c)
        snprintf(err, errlen, "%s: tensor %s has %zu elements in %d dimensions, expected %zu "
                 "in 1 (rank %d's of unit %s in " MANIFEST ")", f->path, nm, ft->numel,
                 ft->ndim, c, r, un);
      else if (ft->dtype != ZT_ST_F32 && ft->dtype != ZT_ST_BF16 && ft->dtype != ZT_ST_F16)
        snprintf(err, errlen, "%s: tensor %s: dtype does not convert to fp32 (F32, BF16, F16 "
                 "do)", f->path, nm);
      else {
        rc = 0;
        f->found[3 * u + k] = ft;
        used[ft - zt_st_tensor_at(f->f, 0)] = 1;
      }
    }
  }
  for (int i = 0; i < zt_st_count(f->f) && rc == 0; i++)
    if (!used[i]) {
      rc = -EINVAL;
      snprintf(err, errlen, "%s: unexpected tensor %s (not one of rank %d's chunks in "
               MANIFEST ")", f->path, zt_st_tensor_at(f->f, i)->name, r);
    }
  free(used);
  if (rc < 0) {
    zt_st_close(f->f);
    f->f = NULL;
  }
  return rc;
}

static void rank_file_close(rank_file *f) {
  zt_st_close(f->f);
  f->f = NULL;
}

/* zt__shard_io of a save, on rank r's thread: its file's header first, from the layout. */
static int save_begin(void *arg, int r, char *err, size_t errlen) {
  rank_set *x = arg;
  rank_file *f = &x->rf[r];
  const zt_model *m = x->m;
  int nu = zt_model_num_units(m), n = 0, rc;
  zt_st_entry *e = calloc(3 * (size_t)nu + 1, sizeof *e);
  char *names = malloc(3 * (size_t)nu * NAME_MAX_LEN + 1);
  if (!e || !names) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", f->path);
    goto out;
  }
  for (int u = 0; u < nu; u++) {
    size_t c = rank_count(m, &x->l, u, r);
    f->first[u] = c ? n : -1;
    for (int k = 0; c && k < 3; k++, n++) {
      char *name = names + (size_t)n * NAME_MAX_LEN;
      snprintf(name, NAME_MAX_LEN, "%s%s", zt_model_unit(m, u)->name, rank_suffix[k]);
      e[n] = (zt_st_entry){.name = name, .ndim = 1, .shape = {(int64_t)c}};
    }
  }
  char rank[16], world[16];
  snprintf(rank, sizeof rank, "%d", r);
  snprintf(world, sizeof world, "%d", x->l.world);
  const char *meta[8] = {"format", "pt", "arch", zt_arch_name(zt_model_cfg_of(m)->arch),
                         "rank", rank, "world", world};
  rc = zt_st_writer_open(&f->w, f->path, e, n, meta, 4, err, errlen);
out:
  free(e);
  free(names);
  return rc;
}

static int save_put(void *arg, int r, int u, const float *p, const float *m, const float *v,
                    char *err, size_t errlen) {
  rank_file *f = &((rank_set *)arg)->rf[r];
  const float *x[3] = {p, m, v};
  int rc = 0;
  for (int k = 0; k < 3 && rc == 0; k++)
    rc = zt_st_writer_put(f->w, f->first[u] + k, x[k], err, errlen);
  return rc;
}

/* Finished (fsynced, renamed into place, its directory fsynced) and its size taken for the
 * manifest. */
static int save_end(void *arg, int r, int ok, char *err, size_t errlen) {
  rank_set *x = arg;
  rank_file *f = &x->rf[r];
  struct stat st;
  int rc = 0;
  if (ok && (rc = zt_st_writer_finish(f->w, err, errlen)) == 0) {
    if (stat(f->path, &st) < 0) {
      rc = -errno;
      snprintf(err, errlen, "%s: %s", f->path, strerror(errno));
    } else {
      x->bytes[r] = (long long)st.st_size;
    }
  }
  zt_st_writer_close(f->w);
  f->w = NULL;
  return rc;
}

static int load_begin(void *arg, int r, char *err, size_t errlen) {
  return rank_file_open(arg, r, err, errlen);
}

static int load_get(void *arg, int r, int u, float *p, float *m, float *v, char *err,
                    size_t errlen) {
  rank_file *f = &((rank_set *)arg)->rf[r];
  float *x[3] = {p, m, v};
  int rc = 0;
  for (int k = 0; k < 3 && rc == 0; k++)
    rc = zt_st_read_f32(f->f, f->found[3 * u + k], x[k], 0, err, errlen);
  return rc;
}

static int load_end(void *arg, int r, int ok, char *err, size_t errlen) {
  (void)ok;
  (void)err;
  (void)errlen;
  rank_file_close(&((rank_set *)arg)->rf[r]);
  return 0;
}

static const char *rank_path(void *arg, int r) { return ((rank_set *)arg)->rf[r].path; }

/* The manifest: the layout, each unit's range and chunk, each rank's file and size, then
 * trainer.json's fields. */
static json_t *manifest_json(const zt_trainer *t, const rank_set *x) {
  const zt_model *m = t->model;
  json_t *units = json_array(), *ranks = json_array();
  int bad = !units || !ranks;
  for (int u = 0; !bad && u < zt_model_num_units(m); u++) {
    const zt_unit_info *ui = zt_model_unit(m, u);
    bad = json_array_append_new(units, json_pack("{s:s, s:I, s:I, s:I}", "name", ui->name,
                                                 "offset", (json_int_t)ui->offset, "numel",
                                                 (json_int_t)ui->numel, "chunk",
                                                 (json_int_t)x->l.chunk[u])) < 0;
  }
  for (int r = 0; !bad && r < x->l.world; r++)
    bad = json_array_append_new(ranks, json_pack("{s:s, s:I}", "file", x->rf[r].name, "bytes",
                                                 (json_int_t)x->bytes[r])) < 0;
  if (bad) {
    json_decref(units);
    json_decref(ranks);
    return NULL;
  }
  json_t *head = json_pack("{s:i, s:s, s:i, s:i, s:I, s:s, s:o, s:o}", "format", MANIFEST_FORMAT,
                           "layout", LAYOUT_PER_RANK, "world", x->l.world, "zero_stage",
                           x->l.zero_stage, "align", (json_int_t)x->l.align, "model_file",
                           "model.safetensors", "units", units, "ranks", ranks);
  return state_json(t, head);
}

/* The per-rank layout into the directory tmp: every rank's file at once (a part's ranks and
 * the other parts' together, each part writing its own), then the parameters gathered
 * (model.safetensors; for a part a sequence of state calls the other parts follow to its last
 * unit, so it comes last), then the manifest. */
static int save_ranked(zt_trainer *t, const zt_shard_table *tab, int stage, const char *tmp,
                       state_seq *q, char *err, size_t errlen) {
  rank_layout l = {tab->world, stage, tab->align, tab->chunk};
  rank_set x = {0};
  json_t *j = NULL;
  char *file = malloc(strlen(tmp) + 64), why[512] = "";
  int rc;
  if (!file) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", tmp);
    goto out;
  }
  if ((rc = rank_set_open(&x, t->model, &l, tmp, NULL, err, errlen)) < 0) goto out;
  zt__shard_io io = {&x, save_begin, save_put, NULL, save_end, x.bytes, rank_path};
  if ((rc = t->path->save_shards(t, &io, why, sizeof why)) < 0) {
    q->failed = 1; /* a part's: every part's call ended with the exchanged verdict */
    snprintf(err, errlen, "%s: writing the ranks' files failed: %s", tmp, why);
    goto out;
  }
  sprintf(file, "%s/model.safetensors", tmp);
  if ((rc = write_params(t, file, q, err, errlen)) < 0) goto out;
  sprintf(file, "%s/" MANIFEST, tmp);
  if (!(j = manifest_json(t, &x))) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", file);
    goto out;
  }
  rc = write_json(file, j, err, errlen);
out:
  rank_set_close(&x);
  json_decref(j);
  free(file);
  return rc;
}

/* ---- a part's probe: does every part see the directory? ----------------------------------- */

/* A load's probe token: the manifest's FNV-1a digest (64 bits) and length, so that a part
 * sees the checkpoint when its view of the path holds a manifest of the same bytes (the same
 * checkpoint: the manifest names every rank's file and size). 0 or -errno. */
static int manifest_token(const char *file, char *token, size_t len) {
  FILE *f = fopen(file, "rbe");
  if (!f) return -errno;
  uint64_t h = 14695981039346656037ull;
  long long n = 0;
  unsigned char buf[16384];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
    for (size_t i = 0; i < got; i++) h = (h ^ buf[i]) * 1099511628211ull;
    n += (long long)got;
  }
  int rc = ferror(f) ? -EIO : 0;
  fclose(f);
  snprintf(token, len, "manifest %016llx %lld", (unsigned long long)h, n);
  return rc;
}

int zt__ckpt_probe_sees(const char *dir, int save, const char *token) {
  char *file = NULL, got[PROBE_TOKEN_LEN];
  int sees = 0;
  if (asprintf(&file, "%s/%s", dir, save ? PROBE_FILE : MANIFEST) < 0) return 0;
  if (save) {
    FILE *f = fopen(file, "rbe");
    size_t n = f ? fread(got, 1, sizeof got - 1, f) : 0;
    got[n] = 0;
    /* and can write its ranks' files there (daemons of other users see a directory they
     * cannot write: the flat layout then, rather than a failed checkpoint) */
    sees = f && n == strlen(token) && !memcmp(got, token, n) && access(dir, W_OK) == 0;
    if (f) fclose(f);
  } else {
    sees = manifest_token(file, got, sizeof got) == 0 && !strcmp(got, token);
  }
  free(file);
  return sees;
}

/* A part holding rank 0 asks every part whether it sees dir as this process does (the path's
 * probe): a save's dir is its temporary directory, given a marker file of a random token for
 * the probe's time; a load's holds the manifest `file`. 1 or 0; a negative errno before the
 * probe (nothing asked: the caller tells the other parts, seq_end) or from it (q->failed). */
static int probe_parts(zt_trainer *t, const char *dir, int save, const char *file, state_seq *q,
                       char *err, size_t errlen) {
  char token[PROBE_TOKEN_LEN], *marker = NULL;
  int rc = 0;
  if (save) {
    unsigned char rnd[16];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
      rc = -errno;
      snprintf(err, errlen, "%s: drawing the probe's random token: %s", dir, strerror(errno));
      return rc;
    }
    for (size_t i = 0; i < sizeof rnd; i++) sprintf(token + 2 * i, "%02x", rnd[i]);
    if (asprintf(&marker, "%s/" PROBE_FILE, dir) < 0) {
      snprintf(err, errlen, "%s: out of memory", dir);
      return -ENOMEM;
    }
    errno = 0;
    int fd = open(marker, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    size_t n = strlen(token);
    if (fd < 0 || write(fd, token, n) != (ssize_t)n) rc = errno ? -errno : -EIO;
    if (fd >= 0 && close(fd) < 0 && rc == 0) rc = -errno;
    if (rc < 0) snprintf(err, errlen, "%s: %s", marker, strerror(-rc));
  } else if ((rc = manifest_token(file, token, sizeof token)) < 0) {
    snprintf(err, errlen, "%s: %s", file, strerror(-rc));
  }
  if (rc == 0 && (rc = t->path->probe(t, dir, save, token, err, errlen)) < 0) q->failed = 1;
  if (marker) {
    unlink(marker);
    free(marker);
  }
  return rc;
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
    if ((rc = probe_parts(t, tmp, 1, NULL, &q, err, errlen)) < 0) goto out;
    if (rc == 0) tab = NULL;
  }
  rc = tab ? save_ranked(t, tab, stage, tmp, &q, err, errlen)
           : save_flat(t, tmp, &q, err, errlen);
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
  seq_end(t, &q, rc);
  /* the previous checkpoint stays as it was; what this one wrote goes (best effort: what a
   * failure leaves behind, the next save removes first) */
  if (rc < 0 && made) remove_dir(tmp);
  free(tmp);
  free(parent);
  return rc;
}

/* The checkpoint's model must be this trainer's model, field by field. */
static int check_model(const zt_model *m, const json_t *jm, const char *path, char *err,
                       size_t errlen) {
  zt_model_cfg c;
  zt_model *saved = NULL;
  /* only the dimensions are compared: the init (named init_seed / init_path by checkpoints
   * written before the job spec's vocabulary, init since) is not read */
  json_t *dims = json_is_object(jm) ? json_deep_copy(jm) : NULL;
  if (dims) {
    json_object_del(dims, "init");
    json_object_del(dims, "init_seed");
    json_object_del(dims, "init_path");
  }
  int rc = zt_config_model_from_json(dims, &c, err, errlen);
  json_decref(dims);
  if (rc < 0 || (rc = zt_model_create(&saved, &c, err, errlen)) < 0) {
    char why[256];
    snprintf(why, sizeof why, "%s", err);
    snprintf(err, errlen, "%s: %s", path, why);
    return rc;
  }
  const zt_model_cfg *h = zt_model_cfg_of(m);
  /* the numbers, then (differs: 1) what is compared bit for bit */
  const struct {
    const char *name;
    long long a, b;
  } f[] = {{"arch", c.arch, h->arch},         {"vocab", c.vocab, h->vocab},
           {"seq_len", c.seq_len, h->seq_len}, {"d_model", c.d_model, h->d_model},
           {"n_heads", c.n_heads, h->n_heads}, {"n_layers", c.n_layers, h->n_layers},
           {"d_ff", zt_model_d_ff(saved), zt_model_d_ff(m)},
           {"n_kv_heads", c.n_kv_heads, h->n_kv_heads},
           {"head_dim", c.head_dim, h->head_dim},
           {"tie_embeddings", c.tie_embeddings, h->tie_embeddings},
           {"qkv_bias", c.qkv_bias, h->qkv_bias},
           {"qk_norm", c.qk_norm, h->qk_norm},
           {"rope_scaling",
            memcmp(&c.rope_scaling, &h->rope_scaling, sizeof c.rope_scaling) != 0, 0},
           {"rms_eps", memcmp(&c.rms_eps, &h->rms_eps, sizeof c.rms_eps) != 0, 0},
           {"rope_theta", memcmp(&c.rope_theta, &h->rope_theta, sizeof c.rope_theta) != 0, 0}};
  const size_t numbers = 12;
  zt_model_destroy(saved);
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
    if (f[i].a != f[i].b) {
      if (i == 0)
        snprintf(err, errlen, "%s: checkpoint is a %s model, this job is %s", path,
                 zt_arch_name((zt_arch)f[i].a), zt_arch_name((zt_arch)f[i].b));
      else if (i < numbers)
        snprintf(err, errlen, "%s: checkpoint has model.%s %lld, this job has %lld", path,
                 f[i].name, f[i].a, f[i].b);
      else
        snprintf(err, errlen, "%s: checkpoint has another model.%s than this job", path,
                 f[i].name);
      return -EINVAL;
    }
  return 0;
}

/* The steps and the loss scaler's state of a checkpoint, checked before anything is written and
 * set once all of it is. */
typedef struct ckpt_head {
  int step, adam_step, good;
  float scale;  /* 0: none (fp32-only versions' checkpoints) */
} ckpt_head;

/* trainer.json's fields (in the manifest too): the model this trainer's, the steps and the
 * scaler's state in range. "step" was checked by the caller with the format. */
static int read_head(const zt_trainer *t, const json_t *j, const char *file, ckpt_head *h,
                     char *err, size_t errlen) {
  int rc = check_model(t->model, json_object_get(j, "model"), file, err, errlen);
  if (rc < 0) return rc;
  h->step = (int)json_integer_value(json_object_get(j, "step"));
  /* Absent in checkpoints of fp32-only versions: AdamW's step was the step, no scaler state. */
  json_t *adam_step = json_object_get(j, "adam_step"), *ls = json_object_get(j, "loss_scale");
  json_t *good = json_object_get(j, "loss_scale_good_steps");
  if ((adam_step && (!json_is_integer(adam_step) || json_integer_value(adam_step) < 0 ||
                     json_integer_value(adam_step) > h->step)) ||
      (ls && (!json_is_number(ls) || !(json_number_value(ls) > 0) ||
              !isfinite((float)json_number_value(ls)))) ||
      (good && (!json_is_integer(good) || json_integer_value(good) < 0 ||
                json_integer_value(good) >= t->scaler.growth_interval))) {
    snprintf(err, errlen, "%s: adam_step, loss_scale or loss_scale_good_steps out of range",
             file);
    return -EINVAL;
  }
  h->adam_step = adam_step ? (int)json_integer_value(adam_step) : h->step;
  h->scale = ls ? (float)json_number_value(ls) : 0;
  h->good = good ? (int)json_integer_value(good) : -1;
  return 0;
}

static int step_in_range(const json_t *step) {
  return json_is_integer(step) && json_integer_value(step) >= 0 &&
         json_integer_value(step) <= (1 << 30);
}

/* The flat layout: trainer.json, then both files' tensors checked, then the pieces. */
static int load_flat(zt_trainer *t, const char *dir, state_seq *q, ckpt_head *h, char *err,
                     size_t errlen) {
  int rc = 0, nu = zt_model_num_units(t->model);
  char *file = malloc(strlen(dir) + 64);
  float *buf = NULL;
  zt_model_file *fm = NULL, *fo = NULL;
  json_t *j = NULL;
  if (!file) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", dir);
    goto out;
  }
  sprintf(file, "%s/trainer.json", dir);
  json_error_t je;
  j = json_load_file(file, 0, &je);
  if (!j || json_integer_value(json_object_get(j, "format")) != CKPT_FORMAT ||
      !step_in_range(json_object_get(j, "step"))) {
    rc = -EINVAL;
    snprintf(err, errlen, "%s: not a format-%d trainer state (%s)", file, CKPT_FORMAT,
             j ? "format, step" : je.text);
    goto out;
  }
  if ((rc = read_head(t, j, file, h, err, errlen)) < 0) goto out;
  /* both files whole before any of the state is written */
  sprintf(file, "%s/model.safetensors", dir);
  if ((rc = file_open(&fm, t->model, file, model_file, err, errlen)) < 0) goto out;
  sprintf(file, "%s/optimizer.safetensors", dir);
  if ((rc = file_open(&fo, t->model, file, opt_file, err, errlen)) < 0) goto out;
  size_t cap = zt__trainer_piece_cap(t->model);
  if (!(buf = malloc(3 * cap * sizeof *buf))) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", dir);
    goto out;
  }
  float *p = buf, *m = buf + cap, *v = buf + 2 * cap;
  for (int u0 = 0, u1; u0 < nu; u0 = u1) {
    u1 = zt__trainer_piece_end(t->model, u0, cap);
    if ((rc = read_piece(fm, t->model, 0, u0, u1, p, err, errlen)) < 0 ||
        (rc = read_piece(fo, t->model, 0, u0, u1, m, err, errlen)) < 0 ||
        (rc = read_piece(fo, t->model, 1, u0, u1, v, err, errlen)) < 0 ||
        (rc = piece_in(t, dir, u0, u1, p, m, v, q, err, errlen)) < 0)
      goto out;
  }
out:
  zt_model_file_close(fm);
  zt_model_file_close(fo);
  json_decref(j);
  free(file);
  free(buf);
  return rc;
}

/* A manifest's non-negative integer field. */
static int json_size(const json_t *o, const char *key, long long max, long long *v) {
  const json_t *x = json_object_get(o, key);
  if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > max) return -1;
  *v = (long long)json_integer_value(x);
  return 0;
}

/* The manifest's layout, checked against the model: its units the model's, chunks that cover
 * them, a file of a plain name and a size per rank. names[r] point into j. */
static int read_layout(const zt_model *m, const json_t *j, const char *file, rank_layout *l,
                       size_t *chunk, const char **names, long long *bytes, char *err,
                       size_t errlen) {
  int nu = zt_model_num_units(m);
  long long world, stage, align, v;
  const json_t *ju = json_object_get(j, "units"), *jr = json_object_get(j, "ranks");
  if (json_size(j, "world", ZT_DP_MAX_WORLD, &world) < 0 || world < 1) {
    snprintf(err, errlen, "%s: world must be an integer in [1, %d]", file, ZT_DP_MAX_WORLD);
    return -EINVAL;
  }
  if (json_size(j, "zero_stage", 3, &stage) < 0 || stage < 1) {
    snprintf(err, errlen, "%s: zero_stage must be 1, 2 or 3", file);
    return -EINVAL;
  }
  if (json_size(j, "align", 1 << 20, &align) < 0 || align < 1) {
    snprintf(err, errlen, "%s: align must be an integer in [1, %d]", file, 1 << 20);
    return -EINVAL;
  }
  if (!json_is_array(ju) || json_array_size(ju) != (size_t)nu) {
    snprintf(err, errlen, "%s: units must list this model's %d units (it has %zu)", file, nu,
             json_is_array(ju) ? json_array_size(ju) : 0);
    return -EINVAL;
  }
  for (int u = 0; u < nu; u++) {
    const zt_unit_info *ui = zt_model_unit(m, u);
    const json_t *e = json_array_get(ju, u);
    const char *name = json_string_value(json_object_get(e, "name"));
    long long off, n, c;
    const char *bad = !name || strcmp(name, ui->name) ? "name"
                      : json_size(e, "offset", LLONG_MAX, &off) < 0 || (size_t)off != ui->offset
                          ? "offset"
                      : json_size(e, "numel", LLONG_MAX, &n) < 0 || (size_t)n != ui->numel
                          ? "numel"
                      : json_size(e, "chunk", (long long)(ui->numel + (size_t)align), &c) < 0 ||
                              c < 1 || (size_t)c * (size_t)world < ui->numel
                          ? "chunk"
                          : NULL;
    if (bad) {
      snprintf(err, errlen, "%s: units[%d].%s does not match this model's unit %s (%zu elements "
               "at %zu; chunk: world chunks that cover them)", file, u, bad, ui->name,
               ui->numel, ui->offset);
      return -EINVAL;
    }
    chunk[u] = (size_t)c;
  }
  if (!json_is_array(jr) || json_array_size(jr) != (size_t)world) {
    snprintf(err, errlen, "%s: ranks must list world %lld files (it has %zu)", file, world,
             json_is_array(jr) ? json_array_size(jr) : 0);
    return -EINVAL;
  }
  for (int r = 0; r < world; r++) {
    const json_t *e = json_array_get(jr, r);
    const char *name = json_string_value(json_object_get(e, "file"));
    if (!name || !name[0] || strchr(name, '/') || name[0] == '.' || strlen(name) > 200) {
      snprintf(err, errlen, "%s: ranks[%d].file must be a file name in the checkpoint's "
               "directory", file, r);
      return -EINVAL;
    }
    if (json_size(e, "bytes", LLONG_MAX, &v) < 0) {
      snprintf(err, errlen, "%s: ranks[%d].bytes must be an integer >= 0", file, r);
      return -EINVAL;
    }
    names[r] = name;
    bytes[r] = v;
  }
  *l = (rank_layout){(int)world, (int)stage, (size_t)align, chunk};
  return 0;
}

/* The per-rank layout: the manifest and every rank's file checked, then the state: each rank's
 * file into its own chunks when the trainer's are the checkpoint's (load_shards), else a piece
 * at a time, each unit assembled from the ranks' chunks, as from a flat checkpoint. */
static int load_ranked(zt_trainer *t, const char *dir, const char *file, state_seq *q,
                       ckpt_head *h, char *err, size_t errlen) {
  const zt_model *md = t->model;
  int nu = zt_model_num_units(md), rc = 0;
  size_t cap = zt__trainer_piece_cap(md), *chunk = calloc((size_t)nu, sizeof *chunk);
  const char **names = calloc(ZT_DP_MAX_WORLD, sizeof *names);
  long long *bytes = calloc(ZT_DP_MAX_WORLD, sizeof *bytes);
  rank_set x = {0};
  rank_layout l;
  float *buf = NULL;
  json_error_t je;
  json_t *j = json_load_file(file, 0, &je);
  if (!chunk || !names || !bytes) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", dir);
    goto out;
  }
  if (!j) {
    rc = -EINVAL;
    snprintf(err, errlen, "%s: not a JSON manifest (line %d: %s)", file, je.line, je.text);
    goto out;
  }
  const char *layout = json_string_value(json_object_get(j, "layout"));
  if (json_integer_value(json_object_get(j, "format")) != MANIFEST_FORMAT || !layout ||
      strcmp(layout, LAYOUT_PER_RANK) || !step_in_range(json_object_get(j, "step"))) {
    rc = -EINVAL;
    snprintf(err, errlen, "%s: not a format-%d %s checkpoint manifest (format, layout, step)",
             file, MANIFEST_FORMAT, LAYOUT_PER_RANK);
    goto out;
  }
  if ((rc = read_head(t, j, file, h, err, errlen)) < 0 ||
      (rc = read_layout(md, j, file, &l, chunk, names, bytes, err, errlen)) < 0 ||
      (rc = rank_set_open(&x, md, &l, dir, names, err, errlen)) < 0)
    goto out;
  /* every file whole before any of the state is written */
  for (int r = 0; r < l.world; r++) {
    rank_file *f = &x.rf[r];
    struct stat st;
    if (stat(f->path, &st) < 0) {
      rc = -errno;
      snprintf(err, errlen, "%s: %s (" MANIFEST " ranks[%d].file)", f->path,
               errno == ENOENT ? "missing" : strerror(errno), r);
      goto out;
    }
    if ((long long)st.st_size != bytes[r]) {
      rc = -EINVAL;
      snprintf(err, errlen, "%s: %lld bytes, " MANIFEST " ranks[%d].bytes says %lld", f->path,
               (long long)st.st_size, r, bytes[r]);
      goto out;
    }
    if ((rc = rank_file_open(&x, r, err, errlen)) < 0) goto out;
    rank_file_close(f);
  }
  int part = 0;
  const zt_shard_table *tab =
      t->path && t->path->shards ? t->path->shards(t, NULL, &part) : NULL;
  int same = tab && tab->world == l.world;
  for (int u = 0; same && u < nu; u++) same = tab->chunk[u] == l.chunk[u];
  /* a part's ranks read their own files only where every part sees this checkpoint */
  if (same && part) {
    if ((rc = probe_parts(t, dir, 0, file, q, err, errlen)) < 0) goto out;
    same = rc;
    rc = 0;
  }
  if (same) {
    zt__shard_io io = {&x, load_begin, NULL, load_get, load_end, NULL, rank_path};
    char why[512] = "";
    q->shards = 1;
    if ((rc = t->path->load_shards(t, &io, why, sizeof why)) < 0)
      snprintf(err, errlen, "%s: reading the ranks' files into the trainer failed: %s", dir,
               why);
    goto out;
  }
  if (!(buf = malloc(3 * cap * sizeof *buf))) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", dir);
    goto out;
  }
  for (int u0 = 0, u1; u0 < nu; u0 = u1) {
    u1 = zt__trainer_piece_end(md, u0, cap);
    size_t base = zt_model_unit(md, u0)->offset;
    /* one file open at a time: its chunks of the piece's units */
    for (int r = 0; r < l.world; r++) {
      rank_file *f = &x.rf[r];
      if ((rc = rank_file_open(&x, r, err, errlen)) < 0) goto out;
      for (int u = u0; u < u1 && rc == 0; u++) {
        size_t c = rank_count(md, &l, u, r);
        size_t at = zt_model_unit(md, u)->offset + (size_t)r * l.chunk[u] - base;
        for (int k = 0; c && k < 3 && rc == 0; k++)
          rc = zt_st_read_f32(f->f, f->found[3 * u + k], buf + (size_t)k * cap + at, 0, err,
                              errlen);
      }
      rank_file_close(f);
      if (rc < 0) goto out;
    }
    if ((rc = piece_in(t, dir, u0, u1, buf, buf + cap, buf + 2 * cap, q, err, errlen)) < 0)
      goto out;
  }
out:
  rank_set_close(&x);
  json_decref(j);
  free(buf);
  free(chunk);
  free(names);
  free(bytes);
  return rc;
}

/* ---- a part without rank 0: its ranks' files of a per-rank save or load ---------------------- */

struct zt__rank_files {
  rank_set x;
};

int zt__rank_files_open(zt__rank_files **out, zt__shard_io *io, const zt_model *m,
                        const zt_shard_table *tab, int zero_stage, const char *dir, int save,
                        char *err, size_t errlen) {
  int nu = zt_model_num_units(m), rc = 0;
  rank_layout l = {tab->world, zero_stage, tab->align, tab->chunk}, ml;
  zt__rank_files *x = calloc(1, sizeof *x);
  size_t *chunk = save ? NULL : calloc((size_t)nu, sizeof *chunk);
  const char **names = save ? NULL : calloc(ZT_DP_MAX_WORLD, sizeof *names);
  long long *bytes = save ? NULL : calloc(ZT_DP_MAX_WORLD, sizeof *bytes);
  char *file = NULL;
  json_t *j = NULL;
  *out = x;
  if (!x || (!save && (!chunk || !names || !bytes || asprintf(&file, "%s/" MANIFEST, dir) < 0))) {
    file = NULL;
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", dir);
    goto out;
  }
  if (!save) {
    /* the files the manifest names, in the layout it was probed for: this trainer's */
    json_error_t je;
    if (!(j = json_load_file(file, 0, &je))) {
      rc = -EINVAL;
      snprintf(err, errlen, "%s: not a JSON manifest (line %d: %s)", file, je.line, je.text);
      goto out;
    }
    if ((rc = read_layout(m, j, file, &ml, chunk, names, bytes, err, errlen)) < 0) goto out;
    int same = ml.world == tab->world;
    for (int u = 0; same && u < nu; u++) same = ml.chunk[u] == tab->chunk[u];
    if (!same) {
      rc = -EINVAL;
      snprintf(err, errlen, "%s: its layout (world %d and the units' chunks) is not this "
               "trainer's", file, ml.world);
      goto out;
    }
  }
  if ((rc = rank_set_open(&x->x, m, &l, dir, names, err, errlen)) < 0) goto out;
  *io = save ? (zt__shard_io){&x->x, save_begin, save_put, NULL, save_end, x->x.bytes, rank_path}
             : (zt__shard_io){&x->x, load_begin, NULL, load_get, load_end, NULL, rank_path};
out:
  json_decref(j);
  free(file);
  free(chunk);
  free(names);
  free(bytes);
  return rc;
}

void zt__rank_files_close(zt__rank_files *x) {
  if (!x) return;
  rank_set_close(&x->x);
  free(x);
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
             ? load_ranked(t, dir, file, &q, &h, err, errlen)
             : load_flat(t, dir, &q, &h, err, errlen);
  }
  if (rc == 0) {
    t->step = h.step;
    t->adam_step = h.adam_step;
    zt_loss_scaler_init(&t->scaler);
    if (h.scale > 0) t->scaler.scale = h.scale;
    if (h.good >= 0) t->scaler.good_steps = h.good;
  }
  /* a failure after the first piece (or in the ranks' own reads) leaves part of the checkpoint
   * in the trainer (one inside the first piece is its path's to refuse steps after, as a failed
   * step is) */
  if (q.next > 0 || q.shards) t->part_loaded = rc < 0;
  seq_end(t, &q, rc);
  free(file);
  return rc;
}

int zt_trainer_export(zt_trainer *t, const char *path, char *err, size_t errlen) {
  state_seq q = {0, 0, 0};
  int rc = t->be.ops->sync(t->be.ctx);
  if (rc < 0)
    snprintf(err, errlen, "backend %s failed before the export (%d)", t->be.ops->name, rc);
  else
    rc = write_params(t, path, &q, err, errlen);
  seq_end(t, &q, rc);
  return rc;
}

int zt_trainer_get_state(zt_trainer *t, float *params, float *exp_avg, float *exp_avg_sq) {
  state_seq q = {0, 0, 0};
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
