/* defines: the per-rank layout (internal.h; dir.c saves and loads it) and a part's ranks' files
 * (zt__rank_files, shard_io.h; called by engine/train/dp/parts.c).
 *
 * A data-parallel trainer running every rank of its world (zt__train_path.shards), or the part
 * holding rank 0 where every part sees the directory (probe.c), writes each rank's chunks of
 * the fp32 parameters, m and v (offload/shard.h) in a file of its own, rank-R.safetensors,
 * which every rank writes (and, loading into the same world, reads) on its own thread at once,
 * through a staging of one chunk; manifest.json names the layout (world, stage, each unit's
 * chunk, each rank's file and size) beside trainer.json's fields; model.safetensors holds the
 * parameters gathered, as the flat one's, for the daemon's export. A per-rank checkpoint whose
 * chunks are not the trainer's is read a piece at a time, each unit's range assembled from the
 * ranks' files, and written as a flat one is. The per-rank files parts write are the ones a
 * trainer running every rank writes, byte for byte: a checkpoint does not depend on the split
 * into parts. */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/base/checksum.h"
#include "engine/model/safetensors.h"
#include "engine/train/checkpoint/internal.h"
#include "engine/train/dp/dp.h"

#define MANIFEST_FORMAT 1
#define LAYOUT_PER_RANK "per-rank"
/* a tensor's name in a rank's file: its unit's name and the state's suffix */
#define NAME_MAX_LEN 128

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
  json_t *sums;                 /* a save: its tensors' sums once finished; a load: the
                                   manifest's of it (NULL: none recorded) */
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
    json_decref(f->sums);
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

/* Rank r's file's tensors' sums, as its writer put them ({name: hex}). */
static json_t *writer_sums(const rank_set *x, int r) {
  const rank_file *f = &x->rf[r];
  json_t *o = json_object();
  for (int u = 0; o && u < zt_model_num_units(x->m); u++)
    for (int k = 0; f->first[u] >= 0 && k < 3; k++) {
      char name[NAME_MAX_LEN], hex[ZT_CHECKSUM_HEX];
      snprintf(name, sizeof name, "%s%s", zt_model_unit(x->m, u)->name, rank_suffix[k]);
      zt_checksum_hex(zt_st_writer_sum(f->w, f->first[u] + k), hex);
      if (json_object_set_new(o, name, json_string(hex)) < 0) {
        json_decref(o);
        return NULL;
      }
    }
  return o;
}

/* A rank file another part wrote (its writer's sums are that part's): summed from the file,
 * which every part sees (probe.c). */
static json_t *file_sums(const rank_file *f, char *err, size_t errlen) {
  zt_st_file *sf = NULL;
  json_t *o = NULL;
  if (zt_st_open(&sf, f->path, err, errlen) < 0) return NULL;
  if (!(o = json_object())) snprintf(err, errlen, "%s: out of memory", f->path);
  for (int i = 0; o && i < zt_st_count(sf); i++) {
    uint64_t sum;
    char hex[ZT_CHECKSUM_HEX];
    const zt_st_tensor *t = zt_st_tensor_at(sf, i);
    int rc = zt_st_sum(sf, t, &sum, err, errlen);
    if (rc == 0) {
      zt_checksum_hex(sum, hex);
      if (json_object_set_new(o, t->name, json_string(hex)) < 0) {
        rc = -ENOMEM;
        snprintf(err, errlen, "%s: out of memory", f->path);
      }
    }
    if (rc < 0) {
      json_decref(o);
      o = NULL;
    }
  }
  zt_st_close(sf);
  return o;
}

/* Finished (fsynced, renamed into place, its directory fsynced), its size taken for the
 * manifest and its sums (the writer's: the bytes as they were written). */
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
  if (ok && rc == 0 && !(f->sums = writer_sums(x, r))) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", f->path);
  }
  zt_st_writer_close(f->w);
  f->w = NULL;
  return rc;
}

static int load_begin(void *arg, int r, char *err, size_t errlen) {
  return rank_file_open(arg, r, err, errlen);
}

/* Rank r's chunk of unit u's state k into dst, checked against the manifest's sum. */
static int read_chunk(rank_set *x, int r, int u, int k, float *dst, char *err, size_t errlen) {
  rank_file *f = &x->rf[r];
  const zt_st_tensor *t = f->found[3 * u + k];
  uint64_t sum;
  int rc = zt_st_read_f32_sum(f->f, t, dst, 0, &sum, err, errlen);
  return rc < 0 ? rc : zt__ckpt_sums_check(f->sums, f->path, t->name, sum, err, errlen);
}

static int load_get(void *arg, int r, int u, float *p, float *m, float *v, char *err,
                    size_t errlen) {
  float *x[3] = {p, m, v};
  int rc = 0;
  for (int k = 0; k < 3 && rc == 0; k++) rc = read_chunk(arg, r, u, k, x[k], err, errlen);
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

/* The io of x's files for the step path: a save's writers (the sizes into x->bytes) or a load's
 * readers. */
static zt__shard_io rank_io(rank_set *x, int save) {
  return save ? (zt__shard_io){x, save_begin, save_put, NULL, save_end, x->bytes, rank_path}
              : (zt__shard_io){x, load_begin, NULL, load_get, load_end, NULL, rank_path};
}

/* The manifest: the layout, each unit's range and chunk, each rank's file and size, then
 * trainer.json's fields. */
static json_t *manifest_json(const zt_trainer *t, rank_set *x, json_t *model_sums, char *err,
                             size_t errlen) {
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
  bad = !head || zt__ckpt_sums_add(head, "model.safetensors", model_sums) < 0;
  for (int r = 0; !bad && r < x->l.world; r++) {
    rank_file *f = &x->rf[r];
    if (!f->sums && !(f->sums = file_sums(f, err, errlen))) {
      json_decref(head);
      return NULL;
    }
    bad = zt__ckpt_sums_add(head, f->name, json_incref(f->sums)) < 0;
  }
  if (bad) {
    json_decref(head);
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  return zt__ckpt_state_json(t, head);
}

/* The per-rank layout into the directory tmp: every rank's file at once (a part's ranks and
 * the other parts' together, each part writing its own), then the parameters gathered
 * (model.safetensors; for a part a sequence of state calls the other parts follow to its last
 * unit, so it comes last), then the manifest. */
int zt__ckpt_save_ranked(zt_trainer *t, const zt_shard_table *tab, int stage, const char *tmp,
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
  zt__shard_io io = rank_io(&x, 1);
  if ((rc = t->path->save_shards(t, &io, why, sizeof why)) < 0) {
    q->failed = 1; /* a part's: every part's call ended with the exchanged verdict */
    snprintf(err, errlen, "%s: writing the ranks' files failed: %s", tmp, why);
    goto out;
  }
  sprintf(file, "%s/model.safetensors", tmp);
  json_t *model_sums = NULL;
  if ((rc = zt__ckpt_write_params(t, file, q, &model_sums, err, errlen)) < 0) goto out;
  sprintf(file, "%s/" MANIFEST, tmp);
  why[0] = '\0';
  if (!(j = manifest_json(t, &x, model_sums, why, sizeof why))) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: %s", file, why[0] ? why : "out of memory");
    goto out;
  }
  rc = zt__ckpt_write_json(file, j, err, errlen);
out:
  rank_set_close(&x);
  json_decref(j);
  free(file);
  return rc;
}

/* A load's manifest: its tree, and the layout read_layout takes from it (names point into j). */
typedef struct manifest {
  json_t *j;
  rank_layout l;
  size_t *chunk;        /* a unit's chunk */
  const char **names;   /* a rank's file */
  long long *bytes;     /* a rank's file's size */
} manifest;

/* A manifest's non-negative integer field. */
static int json_size(const json_t *o, const char *key, long long max, long long *v) {
  const json_t *x = json_object_get(o, key);
  if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > max) return -1;
  *v = (long long)json_integer_value(x);
  return 0;
}

/* The manifest's layout, checked against the model: its units the model's, chunks that cover
 * them, a file of a plain name and a size per rank. */
static int read_layout(const zt_model *m, manifest *mf, const char *file, char *err,
                       size_t errlen) {
  const json_t *j = mf->j;
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
    mf->chunk[u] = (size_t)c;
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
    mf->names[r] = name;
    mf->bytes[r] = v;
  }
  mf->l = (rank_layout){(int)world, (int)stage, (size_t)align, mf->chunk};
  return 0;
}

/* The manifest `file` of the checkpoint dir parsed; its layout is read_layout's to check. Close
 * after a failed open too. */
static int manifest_open(manifest *mf, const zt_model *m, const char *dir, const char *file,
                         char *err, size_t errlen) {
  json_error_t je;
  mf->chunk = calloc((size_t)zt_model_num_units(m), sizeof *mf->chunk);
  mf->names = calloc(ZT_DP_MAX_WORLD, sizeof *mf->names);
  mf->bytes = calloc(ZT_DP_MAX_WORLD, sizeof *mf->bytes);
  if (!mf->chunk || !mf->names || !mf->bytes) {
    snprintf(err, errlen, "%s: out of memory", dir);
    return -ENOMEM;
  }
  if (!(mf->j = json_load_file(file, 0, &je))) {
    /* jansson's text would quote the file */
    snprintf(err, errlen, "%s: not a JSON manifest", file);
    return -EINVAL;
  }
  return 0;
}

/* The manifest's sums of each rank's file, which its reads check (a manifest from before the
 * sums: none, with a warning). */
static int expect_sums(rank_set *x, const manifest *mf, const char *file, char *err,
                       size_t errlen) {
  if (!json_object_get(mf->j, "checksums")) {
    zt__ckpt_sums_missing(file);
    return 0;
  }
  for (int r = 0; r < x->l.world; r++) {
    const json_t *sums;
    int rc = zt__ckpt_sums_file(mf->j, file, mf->names[r], &sums, err, errlen);
    if (rc < 0) return rc;
    x->rf[r].sums = json_incref((json_t *)sums);
  }
  return 0;
}

static void manifest_close(manifest *mf) {
  json_decref(mf->j);
  free(mf->chunk);
  free(mf->names);
  free(mf->bytes);
}

/* Whether layout l (of nu units) is tab's: the same world, each unit's chunk the same. */
static int layout_is(const rank_layout *l, const zt_shard_table *tab, int nu) {
  int same = tab && tab->world == l->world;
  for (int u = 0; same && u < nu; u++) same = tab->chunk[u] == l->chunk[u];
  return same;
}

/* The per-rank layout: the manifest and every rank's file checked, then the state: each rank's
 * file into its own chunks when the trainer's are the checkpoint's (load_shards), else a piece
 * at a time, each unit assembled from the ranks' chunks, as from a flat checkpoint. */
int zt__ckpt_load_ranked(zt_trainer *t, const char *dir, const char *file, state_seq *q,
                         ckpt_head *h, char *err, size_t errlen) {
  const zt_model *md = t->model;
  int nu = zt_model_num_units(md), rc = 0;
  size_t cap = zt__trainer_piece_cap(md);
  manifest mf = {0};
  rank_set x = {0};
  float *buf = NULL;
  if ((rc = manifest_open(&mf, md, dir, file, err, errlen)) < 0) goto out;
  const json_t *j = mf.j;
  const rank_layout *l = &mf.l;
  const char *layout = json_string_value(json_object_get(j, "layout"));
  if (json_integer_value(json_object_get(j, "format")) != MANIFEST_FORMAT || !layout ||
      strcmp(layout, LAYOUT_PER_RANK) || !zt__ckpt_step_in_range(json_object_get(j, "step"))) {
    rc = -EINVAL;
    snprintf(err, errlen, "%s: not a format-%d %s checkpoint manifest (format, layout, step)",
             file, MANIFEST_FORMAT, LAYOUT_PER_RANK);
    goto out;
  }
  if ((rc = zt__ckpt_read_head(t, j, file, h, err, errlen)) < 0 ||
      (rc = read_layout(md, &mf, file, err, errlen)) < 0 ||
      (rc = rank_set_open(&x, md, l, dir, mf.names, err, errlen)) < 0 ||
      (rc = expect_sums(&x, &mf, file, err, errlen)) < 0)
    goto out;
  /* every file whole before any of the state is written */
  for (int r = 0; r < l->world; r++) {
    rank_file *f = &x.rf[r];
    struct stat st;
    if (stat(f->path, &st) < 0) {
      rc = -errno;
      snprintf(err, errlen, "%s: %s (" MANIFEST " ranks[%d].file)", f->path,
               errno == ENOENT ? "missing" : strerror(errno), r);
      goto out;
    }
    if ((long long)st.st_size != mf.bytes[r]) {
      rc = -EINVAL;
      snprintf(err, errlen, "%s: %lld bytes, " MANIFEST " ranks[%d].bytes says %lld", f->path,
               (long long)st.st_size, r, mf.bytes[r]);
      goto out;
    }
    if ((rc = rank_file_open(&x, r, err, errlen)) < 0) goto out;
    rank_file_close(f);
  }
  int part = 0;
  const zt_shard_table *tab =
      t->path && t->path->shards ? t->path->shards(t, NULL, &part) : NULL;
  int same = layout_is(l, tab, nu);
  /* a part's ranks read their own files only where every part sees this checkpoint */
  if (same && part) {
    if ((rc = zt__ckpt_probe_parts(t, dir, 0, file, q, err, errlen)) < 0) goto out;
    same = rc;
    rc = 0;
  }
  if (same) {
    zt__shard_io io = rank_io(&x, 0);
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
    for (int r = 0; r < l->world; r++) {
      rank_file *f = &x.rf[r];
      if ((rc = rank_file_open(&x, r, err, errlen)) < 0) goto out;
      for (int u = u0; u < u1 && rc == 0; u++) {
        size_t c = rank_count(md, l, u, r);
        size_t at = zt_model_unit(md, u)->offset + (size_t)r * l->chunk[u] - base;
        for (int k = 0; c && k < 3 && rc == 0; k++)
          rc = read_chunk(&x, r, u, k, buf + (size_t)k * cap + at, err, errlen);
      }
      rank_file_close(f);
      if (rc < 0) goto out;
    }
    if ((rc = zt__ckpt_piece_in(t, dir, u0, u1, buf, buf + cap, buf + 2 * cap, q, err, errlen)) < 0)
      goto out;
  }
out:
  rank_set_close(&x);
  manifest_close(&mf);
  free(buf);
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
  rank_layout l = {tab->world, zero_stage, tab->align, tab->chunk};
  zt__rank_files *x = calloc(1, sizeof *x);
  manifest mf = {0};
  char *file = NULL;
  *out = x;
  if (!x || (!save && asprintf(&file, "%s/" MANIFEST, dir) < 0)) {
    file = NULL;
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", dir);
    goto out;
  }
  if (!save) {
    /* the files the manifest names, in the layout it was probed for: this trainer's */
    if ((rc = manifest_open(&mf, m, dir, file, err, errlen)) < 0 ||
        (rc = read_layout(m, &mf, file, err, errlen)) < 0)
      goto out;
    if (!layout_is(&mf.l, tab, nu)) {
      rc = -EINVAL;
      snprintf(err, errlen, "%s: its layout (world %d and the units' chunks) is not this "
               "trainer's", file, mf.l.world);
      goto out;
    }
  }
  if ((rc = rank_set_open(&x->x, m, &l, dir, mf.names, err, errlen)) < 0 ||
      (!save && (rc = expect_sums(&x->x, &mf, file, err, errlen)) < 0))
    goto out;
  *io = rank_io(&x->x, save);
out:
  manifest_close(&mf);
  free(file);
  return rc;
}

void zt__rank_files_close(zt__rank_files *x) {
  if (!x) return;
  rank_set_close(&x->x);
  free(x);
}
