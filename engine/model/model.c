/* The architecture-independent half of a model: the flat parameter layout and its units, the
 * deterministic init, checkpoint I/O by tensor name, the activation buffers the per-arch
 * forward/backward use, and the loss of a micro-batch. The configuration's checks: cfg.c. */
#include "engine/model/arch.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/hf.h"
#include "engine/model/safetensors.h"


int zt__model_begin_unit(zt_model *m, const char *name) {
  if (m->nu == m->ucap) {
    int cap = m->ucap ? 2 * m->ucap : 8;
    zt_unit_info *u = realloc(m->u, (size_t)cap * sizeof *u);
    if (!u) return -ENOMEM;
    m->u = u;
    m->ucap = cap;
  }
  zt_unit_info *u = &m->u[m->nu];
  memset(u, 0, sizeof *u);
  snprintf(u->name, sizeof u->name, "%s", name);
  u->offset = m->nparams;
  u->first_tensor = m->nt;
  m->nu++;
  return 0;
}

int zt__model_add_tensor(zt_model *m, const char *name, int ndim, int64_t s0, int64_t s1,
                         int transposed, int decay, zt__init_kind init) {
  if (m->nt == m->tcap) {
    int cap = m->tcap ? 2 * m->tcap : 32;
    zt_tensor_info *t = realloc(m->t, (size_t)cap * sizeof *t);
    if (!t) return -ENOMEM;
    m->t = t;
    zt__init_kind *k = realloc(m->init, (size_t)cap * sizeof *k);
    if (!k) return -ENOMEM;
    m->init = k;
    m->tcap = cap;
  }
  zt_tensor_info *t = &m->t[m->nt];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->ndim = ndim;
  t->shape[0] = s0;
  t->shape[1] = ndim > 1 ? s1 : 0;
  t->numel = (size_t)s0 * (size_t)(ndim > 1 ? s1 : 1);
  t->transposed = transposed;
  t->offset = m->nparams;
  t->unit = m->nu - 1;
  t->decay = decay;
  /* 2-D tensors are matmul weights, read through the compute copy; an arch marks the
   * exceptions (embedding tables) with zt__model_set_reads */
  t->reads = ndim == 2 ? ZT_READS_LP : ZT_READS_F32;
  m->init[m->nt] = init;
  m->nt++;
  m->nparams += t->numel;
  m->u[m->nu - 1].numel += t->numel;
  m->u[m->nu - 1].n_tensors++;
  return 0;
}

void zt__model_set_reads(zt_model *m, unsigned reads) { m->t[m->nt - 1].reads = reads; }

int zt_model_create(zt_model **out, const zt_model_cfg *cfg, char *err, size_t errlen) {
  *out = NULL;
  int rc = zt_model_cfg_check(cfg, err, errlen);
  if (rc < 0) return rc;
  zt_model *m = calloc(1, sizeof *m);
  if (!m) goto nomem;
  m->cfg = *cfg;
  m->arch = zt__arch_of(cfg->arch);
  m->d_ff = cfg->d_ff ? cfg->d_ff
                      : (m->arch->default_d_ff > 0 ? m->arch->default_d_ff : 4 * cfg->d_model);
  m->n_kv_heads = cfg->n_kv_heads ? cfg->n_kv_heads : cfg->n_heads;
  m->head_dim = cfg->head_dim ? cfg->head_dim : cfg->d_model / cfg->n_heads;
  m->tied = cfg->arch == ZT_ARCH_GPT || (cfg->arch == ZT_ARCH_LLAMA && cfg->tie_embeddings);
  if (m->arch->layout(m) < 0) goto nomem;
  *out = m;
  return 0;
nomem:
  zt_model_destroy(m);
  snprintf(err, errlen, "out of memory building the model layout");
  return -ENOMEM;
}

void zt_model_destroy(zt_model *m) {
  if (!m) return;
  free(m->t);
  free(m->init);
  free(m->u);
  free(m);
}

const zt_model_cfg *zt_model_cfg_of(const zt_model *m) { return &m->cfg; }
size_t zt_model_num_params(const zt_model *m) { return m->nparams; }
int zt_model_num_tensors(const zt_model *m) { return m->nt; }
const zt_tensor_info *zt_model_tensor(const zt_model *m, int i) { return &m->t[i]; }
int zt_model_num_units(const zt_model *m) { return m->nu; }
const zt_unit_info *zt_model_unit(const zt_model *m, int i) { return &m->u[i]; }
int zt_model_d_ff(const zt_model *m) { return m->d_ff; }
int zt_model_head_reads_embed(const zt_model *m) { return m->tied; }

/* splitmix64 (Steele, Lea, Flood 2014): a tiny generator whose stream depends only on the seed.
 * Its state only adds the increment per draw, so the state before draw k is seed + k * GAMMA. */
#define SPLITMIX_GAMMA 0x9e3779b97f4a7c15ull

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += SPLITMIX_GAMMA);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Box-Muller in double from two 53-bit uniforms; u1 is in (0, 1] so log() is finite. Both
 * branches are used: two normals per two draws, one log and one sincos for a pair of elements
 * (the cosine branch alone cost a log and a cos per element, 60 ns of the init's 64). */
static void normal_pair(uint64_t *s, double z[2]) {
  /* below 2^53: the signed conversion is exact, and one instruction where the unsigned is not */
  double u1 = (double)(int64_t)((splitmix64(s) >> 11) + 1) * 0x1.0p-53;
  double u2 = (double)(int64_t)(splitmix64(s) >> 11) * 0x1.0p-53;
  double r = sqrt(-2.0 * log(u1)), t = 2.0 * M_PI * u2;
  z[0] = r * cos(t);
  z[1] = r * sin(t);
}

static int init_draws(zt__init_kind k) { return k == ZT__INIT_NORMAL || k == ZT__INIT_RESID; }

/* GPT-2's init for both archs: weights and embeddings N(0, 0.02), projections into the residual
 * stream N(0, 0.02/sqrt(2L)), biases 0, norms 1/0. Tensors are filled in layout order from one
 * splitmix64 stream seeded with cfg.init_seed. (The encoder therefore does not start from
 * PyTorch's default init; parity runs load their init from safetensors.) Elements 2p and 2p + 1
 * of a random tensor are the cosine and sine of the pair made from draws 2p and 2p + 1 of the
 * tensor's part of the stream (2 * ceil(n / 2) draws), so any slice starts its stream without
 * drawing what comes before: an offloaded open makes its pieces in any order and threads fill
 * one piece in parts, with the flat init's bits. */
void zt_model_init_params_slice(const zt_model *m, int first, int end, float *dst, size_t begin,
                                size_t stop) {
  uint64_t draws = 0;
  for (int i = 0; i < first; i++)
    if (init_draws(m->init[i])) draws += 2 * (((uint64_t)m->t[i].numel + 1) / 2);
  double resid = 0.02 / sqrt(2.0 * m->cfg.n_layers);
  size_t base = first < end ? m->t[first].offset : 0;
  for (int i = first; i < end; i++) {
    size_t at = m->t[i].offset - base, n = m->t[i].numel;
    size_t j0 = begin > at ? begin - at : 0, j1 = stop < at + n ? stop - at : n;
    int random = init_draws(m->init[i]);
    if (stop > at && j0 < n) {
      float *x = dst + at;
      uint64_t s = m->cfg.init_seed + (draws + 2 * (uint64_t)(j0 / 2)) * SPLITMIX_GAMMA;
      double sd = m->init[i] == ZT__INIT_RESID ? resid : 0.02, z[2];
      if (random)
        for (size_t j = j0; j < j1;) {
          normal_pair(&s, z);
          for (size_t k = j & 1; k < 2 && j < j1; k++, j++) x[j] = (float)(sd * z[k]);
        }
      else if (m->init[i] == ZT__INIT_ZEROS)
        memset(x + j0, 0, (j1 - j0) * sizeof *x);
      else
        for (size_t j = j0; j < j1; j++) x[j] = 1.0f;
    }
    if (random) draws += 2 * (((uint64_t)n + 1) / 2);
  }
}

size_t zt_model_range_numel(const zt_model *m, int first, int end) {
  if (first >= end) return 0;
  return m->t[end - 1].offset + m->t[end - 1].numel - m->t[first].offset;
}

void zt_model_init_params_range(const zt_model *m, int first, int end, float *dst) {
  zt_model_init_params_slice(m, first, end, dst, 0, zt_model_range_numel(m, first, end));
}

void zt_model_init_params(const zt_model *m, float *p) {
  zt_model_init_params_range(m, 0, m->nt, p);
}

/* ---- checkpoints ------------------------------------------------------------------------- */

static void file_shape(const zt_tensor_info *t, int internal, int64_t out[2]) {
  int swap = internal && t->transposed;
  out[0] = t->shape[swap ? 1 : 0];
  out[1] = t->shape[swap ? 0 : 1];
}

/* A tensor's name in a file: its name and its state's suffix. */
#define FILE_NAME_LEN 128

/* The entries of a file of n states (suffix[k]) of m's tensors, in zt_model_save_states's order
 * (state by state, the tensors in layout order: tensor i of state k is entry k * nt + i), their
 * names in *names; no data. */
static int file_entries(const zt_model *m, const char *path, const char *const *suffix, int n,
                        int internal, zt_st_entry **e, char **names, char *err, size_t errlen) {
  size_t ne = (size_t)(m->nt * n);
  *e = calloc(ne + 1, sizeof **e);
  *names = malloc(ne * FILE_NAME_LEN + 1);
  if (!*e || !*names) {
    snprintf(err, errlen, "%s: out of memory", path);
    return -ENOMEM;
  }
  for (int k = 0; k < n; k++)
    for (int i = 0; i < m->nt; i++) {
      const zt_tensor_info *t = &m->t[i];
      size_t x = (size_t)(k * m->nt + i);
      char *nm = *names + x * FILE_NAME_LEN;
      snprintf(nm, FILE_NAME_LEN, "%s%s", t->name, suffix[k]);
      (*e)[x].name = nm;
      (*e)[x].ndim = t->ndim;
      file_shape(t, internal, (*e)[x].shape);
      (*e)[x].transpose = t->transposed && !internal;
    }
  return 0;
}

/* The suffixes of n states (malloc'd). */
static const char **suffixes_of(const zt_model_state *s, int n) {
  const char **suffix = calloc((size_t)n + 1, sizeof *suffix);
  for (int k = 0; suffix && k < n; k++) suffix[k] = s[k].suffix;
  return suffix;
}

int zt_model_save_states(const zt_model *m, const char *path, const zt_model_state *s, int n,
                         int internal_layout, const char *note, char *err, size_t errlen) {
  zt_st_entry *e = NULL;
  char *names = NULL;
  const char **suffix = suffixes_of(s, n);
  int rc = -ENOMEM;
  if (!suffix) snprintf(err, errlen, "%s: out of memory", path);
  else rc = file_entries(m, path, suffix, n, internal_layout, &e, &names, err, errlen);
  if (rc == 0) {
    for (int k = 0; k < n; k++)
      for (int i = 0; i < m->nt; i++) e[k * m->nt + i].data = s[k].data + m->t[i].offset;
    const char *meta[6] = {"format", "pt", "arch", m->arch->name, "note", note};
    rc = zt_st_write(path, e, m->nt * n, meta, note ? 3 : 2, err, errlen);
  }
  free(e);
  free(names);
  free(suffix);
  return rc;
}

struct zt_model_writer {
  const zt_model *m;
  zt_st_writer *w;
  int internal;
};

int zt_model_writer_open(zt_model_writer **out, const zt_model *m, const char *path,
                         const char *const *suffix, int n, unsigned flags, const char *note,
                         char *err, size_t errlen) {
  zt_st_entry *e = NULL;
  char *names = NULL;
  int rc = -ENOMEM, internal = (flags & ZT_MODEL_FILE_INTERNAL) != 0;
  zt_model_writer *mw = calloc(1, sizeof *mw);
  *out = NULL;
  if (!mw) snprintf(err, errlen, "%s: out of memory", path);
  else rc = file_entries(m, path, suffix, n, internal, &e, &names, err, errlen);
  for (int x = 0; rc == 0 && (flags & ZT_MODEL_FILE_BF16) && x < m->nt * n; x++)
    e[x].dtype = ZT_ST_BF16;
  if (rc == 0) {
    const char *meta[6] = {"format", "pt", "arch", m->arch->name, "note", note};
    mw->m = m;
    mw->internal = internal;
    rc = zt_st_writer_open(&mw->w, path, e, m->nt * n, meta, note ? 3 : 2, err, errlen);
  }
  free(e);
  free(names);
  if (rc < 0) zt_model_writer_close(mw);
  else *out = mw;
  return rc;
}

int zt_model_writer_put(zt_model_writer *mw, int k, int first, int end, const float *src,
                        float *scratch, char *err, size_t errlen) {
  const zt_model *m = mw->m;
  int rc = 0;
  for (int i = first; i < end && rc == 0; i++) {
    const zt_tensor_info *t = &m->t[i];
    const float *x = src + (t->offset - m->t[first].offset);
    if (t->transposed && !mw->internal) {
      /* internal (shape[1], shape[0]) -> the file's (shape[0], shape[1]) */
      size_t R = (size_t)t->shape[0], C = (size_t)t->shape[1];
      for (size_t a = 0; a < R; a++)
        for (size_t b = 0; b < C; b++) scratch[a * C + b] = x[b * R + a];
      x = scratch;
    }
    rc = zt_st_writer_put(mw->w, k * m->nt + i, x, err, errlen);
  }
  return rc;
}

int zt_model_writer_finish(zt_model_writer *mw, char *err, size_t errlen) {
  return zt_st_writer_finish(mw->w, err, errlen);
}

uint64_t zt_model_writer_sum(const zt_model_writer *mw, int k, int i) {
  return zt_st_writer_sum(mw->w, k * mw->m->nt + i);
}

void zt_model_writer_close(zt_model_writer *mw) {
  if (!mw) return;
  zt_st_writer_close(mw->w);
  free(mw);
}

/* Tensors HF files carry that are not parameters: GPT-2's attention masks and its tied
 * lm_head.weight, a tied llama's lm_head.weight, old Llama checkpoints' RoPE buffers. */
static int ignorable(const zt_model *m, const char *name) {
  size_t n = strlen(name);
  static const char *const gpt[] = {".attn.bias", ".attn.masked_bias"};
  static const char *const llama[] = {".rotary_emb.inv_freq"};
  const char *const *ends = m->cfg.arch == ZT_ARCH_GPT ? gpt : llama;
  size_t ne = m->cfg.arch == ZT_ARCH_GPT ? 2 : m->cfg.arch == ZT_ARCH_LLAMA ? 1 : 0;
  if (!strcmp(name, "lm_head.weight") && m->tied) return 1;
  for (size_t i = 0; i < ne; i++) {
    size_t k = strlen(ends[i]);
    if (n >= k && !strcmp(name + n - k, ends[i])) return 1;
  }
  return 0;
}

struct zt_model_file {
  const zt_model *m;
  char *path;
  zt__st_set *set;
  const zt_st_tensor **found;   /* tensor i of state k: found[k * nt + i] */
  const zt_st_file **in;        /* and the file of the set holding it */
  int n, internal, strict;
};

void zt_model_file_close(zt_model_file *mf) {
  if (!mf) return;
  zt__st_set_close(mf->set);
  free(mf->found);
  free(mf->in);
  free(mf->path);
  free(mf);
}

/* Every tensor of every state found, with its shape and a dtype that converts to fp32, and
 * nothing else in the files but (unless strict) the buffers HF files carry, before anything is
 * read. */
static int resolve(zt_model_file *mf, const char *const *suffix, char *err, size_t errlen) {
  const zt_model *m = mf->m;
  const char *path = mf->path;
  int count = zt__st_set_count(mf->set);
  char *used = calloc((size_t)count + 1, 1);
  if (!used) {
    snprintf(err, errlen, "%s: out of memory", path);
    return -ENOMEM;
  }
  int rc = 0;
  for (int k = 0; k < mf->n && rc == 0; k++)
    for (int i = 0; i < m->nt && rc == 0; i++) {
      const zt_tensor_info *t = &m->t[i];
      const zt_st_file *in = NULL;
      int at = -1;
      char nm[FILE_NAME_LEN];
      snprintf(nm, sizeof nm, "%s%s", t->name, suffix[k]);
      const zt_st_tensor *ft = zt__st_set_find(mf->set, nm, &in, &at);
      /* HF GPT-2 files name the transformer's tensors under its module */
      if (!ft && !mf->strict && m->cfg.arch == ZT_ARCH_GPT) {
        char pre[176];
        snprintf(pre, sizeof pre, "transformer.%s", nm);
        ft = zt__st_set_find(mf->set, pre, &in, &at);
      }
      int64_t want[2];
      file_shape(t, mf->internal, want);
      rc = -EINVAL;
      if (!ft) {
        snprintf(err, errlen, "%s: tensor %s is missing", path, nm);
      } else if (ft->ndim != t->ndim || ft->shape[0] != want[0] ||
                 (t->ndim > 1 && ft->shape[1] != want[1])) {
        char got[128] = "";
        for (int d = 0; d < ft->ndim; d++)
          snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "",
                   (long long)ft->shape[d]);
        if (t->ndim > 1)
          snprintf(err, errlen, "%s: tensor %s has shape [%s], expected [%lld, %lld]",
                   zt_st_path(in), ft->name, got, (long long)want[0], (long long)want[1]);
        else
          snprintf(err, errlen, "%s: tensor %s has shape [%s], expected [%lld]", zt_st_path(in),
                   ft->name, got, (long long)want[0]);
      } else if (ft->dtype != ZT_ST_F32 && ft->dtype != ZT_ST_BF16 && ft->dtype != ZT_ST_F16) {
        snprintf(err, errlen, "%s: tensor %s: dtype does not convert to fp32 (F32, BF16, F16 do)",
                 zt_st_path(in), ft->name);
      } else {
        rc = 0;
        mf->found[k * m->nt + i] = ft;
        mf->in[k * m->nt + i] = in;
        used[at] = 1;
      }
    }
  for (int i = 0; i < count && rc == 0; i++) {
    const zt_st_file *f;
    const char *nm = zt__st_set_tensor_at(mf->set, i, &f)->name;
    if (!used[i] && (mf->strict || !ignorable(m, nm))) {
      rc = -EINVAL;
      snprintf(err, errlen, "%s: unexpected tensor %s (not part of this %s model)",
               zt_st_path(f), nm, m->arch->name);
    }
  }
  free(used);
  return rc;
}

int zt_model_file_open(zt_model_file **out, const zt_model *m, const char *path,
                       const char *const *suffix, int n, unsigned flags, char *err,
                       size_t errlen) {
  *out = NULL;
  int rc;
  zt_model_file *mf = calloc(1, sizeof *mf);
  if (!mf || !(mf->path = strdup(path)) ||
      !(mf->found = calloc((size_t)(m->nt * n) + 1, sizeof *mf->found)) ||
      !(mf->in = calloc((size_t)(m->nt * n) + 1, sizeof *mf->in))) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", path);
    goto fail;
  }
  mf->m = m;
  mf->n = n;
  mf->internal = (flags & ZT_MODEL_FILE_INTERNAL) != 0;
  mf->strict = (flags & ZT_MODEL_FILE_STRICT) != 0;
  if ((rc = zt__st_set_open(&mf->set, path, err, errlen)) < 0 ||
      (rc = resolve(mf, suffix, err, errlen)) < 0)
    goto fail;
  *out = mf;
  return 0;
fail:
  zt_model_file_close(mf);
  return rc;
}

int zt_model_file_read(const zt_model_file *mf, int k, int first, int end, float *dst,
                       char *err, size_t errlen) {
  return zt_model_file_read_sum(mf, k, first, end, dst, NULL, err, errlen);
}

int zt_model_file_read_sum(const zt_model_file *mf, int k, int first, int end, float *dst,
                           uint64_t *sums, char *err, size_t errlen) {
  const zt_model *m = mf->m;
  int rc = 0;
  for (int i = first; i < end && rc == 0; i++) {
    const zt_tensor_info *t = &m->t[i];
    /* the next tensor (the next piece's first, after the last) on its way from the disk while
     * this one is read, summed and converted, and the caller copies the piece in */
    if (i + 1 < m->nt && mf->found[k * m->nt + i + 1])
      zt_st_willneed(mf->in[k * m->nt + i + 1], mf->found[k * m->nt + i + 1]);
    rc = zt_st_read_f32_sum(mf->in[k * m->nt + i], mf->found[k * m->nt + i],
                            dst + (t->offset - m->t[first].offset),
                            t->transposed && !mf->internal, sums ? &sums[i - first] : NULL, err,
                            errlen);
  }
  return rc;
}

int zt_model_load_states(const zt_model *m, const char *path, const zt_model_state *s, int n,
                         int internal_layout, char *err, size_t errlen) {
  zt_model_file *mf = NULL;
  const char **suffix = suffixes_of(s, n);
  if (!suffix) {
    snprintf(err, errlen, "%s: out of memory", path);
    return -ENOMEM;
  }
  int rc = zt_model_file_open(&mf, m, path, suffix, n,
                              internal_layout ? ZT_MODEL_FILE_INTERNAL : 0, err, errlen);
  for (int k = 0; k < n && rc == 0; k++)
    rc = zt_model_file_read(mf, k, 0, m->nt, s[k].data, err, errlen);
  zt_model_file_close(mf);
  free(suffix);
  return rc;
}

/* ---- activations --------------------------------------------------------------------------- */

/* Every buffer starts 256-byte aligned, as a fresh cudaMalloc would (and on its own cache lines).
 * cuBLAS picks kernels by pointer alignment too: with every buffer aligned alike the choice
 * depends on the shapes alone, so a block computes the same bits whichever buffers it is given
 * (its own, or the set checkpointed blocks share). */
void *zt__bump_bytes(zt__bump *b, size_t bytes) {
  void *p = b->base ? b->base + b->off : NULL;
  b->off += (bytes + 255) / 256 * 256;
  return p;
}

float *zt__bump_floats(zt__bump *b, size_t n) { return zt__bump_bytes(b, n * sizeof(float)); }

void *zt__bump_acts(zt__bump *b, const zt_acts *a, size_t n) {
  return zt__bump_bytes(b, n * zt_dtype_size(a->dt));
}

static int batch_ok(const zt_model *m, int B) {
  return B >= 1 && (size_t)B * (size_t)m->cfg.seq_len <= (size_t)1 << 31;
}

static int dtype_ok(zt_dtype dt) { return dt == ZT_F32 || dt == ZT_BF16 || dt == ZT_F16; }

size_t zt_acts_size(const zt_model *m, const zt_ops *ops, int B, int ckpt_every) {
  return zt_acts_size_dt(m, ops, B, ckpt_every, ZT_F32);
}

size_t zt_acts_size_dt(const zt_model *m, const zt_ops *ops, int B, int ckpt_every,
                       zt_dtype dt) {
  if (!batch_ok(m, B) || ckpt_every < 0 || !dtype_ok(dt)) return 0;
  zt_acts a = {.m = m, .be = {.ops = ops}, .B = B, .T = m->cfg.seq_len,
               .ckpt_every = ckpt_every, .dt = dt};
  a.arch = calloc(1, m->arch->host_acts_size + (size_t)m->cfg.n_layers * m->arch->host_layer_size);
  if (!a.arch) return 0;
  zt__bump b = {0};
  m->arch->bind_acts(&a, &b);
  free(a.arch);
  return b.off;
}

int zt_acts_open(zt_acts **out, const zt_model *m, const zt_backend *be, int B, int ckpt_every,
                 char *err, size_t errlen) {
  return zt_acts_open_dt(out, m, be, B, ckpt_every, ZT_F32, err, errlen);
}

/* 0..T-1 in every row, one document a row: what a caller that stages no positions trains on. */
static int default_positions(zt_acts *a) {
  size_t N = (size_t)a->B * (size_t)a->T;
  int32_t *h = malloc(N * sizeof *h);
  if (!h) return -ENOMEM;
  for (size_t i = 0; i < N; i++) h[i] = (int32_t)(i % (size_t)a->T);
  a->be.ops->to_device(a->be.ctx, a->pos, h, N * sizeof *h);
  free(h);
  return 0;
}

int zt_acts_open_dt(zt_acts **out, const zt_model *m, const zt_backend *be, int B,
                    int ckpt_every, zt_dtype dt, char *err, size_t errlen) {
  *out = NULL;
  if (!dtype_ok(dt)) {
    snprintf(err, errlen, "unknown activation type %d", (int)dt);
    return -EINVAL;
  }
  if (!batch_ok(m, B)) {
    snprintf(err, errlen, "train.micro_batch must be in [1, 2^31 / model.seq_len] (got %d)", B);
    return -EINVAL;
  }
  if (ckpt_every < 0) {
    snprintf(err, errlen, "train.activation_checkpointing.every must be >= 0 (got %d)",
             ckpt_every);
    return -EINVAL;
  }
  const char *missing = m->arch->missing_op ? m->arch->missing_op(be->ops) : NULL;
  if (missing) {
    snprintf(err, errlen, "backend %s has no %s yet, which arch %s needs", be->ops->name,
             missing, m->arch->name);
    return -ENOTSUP;
  }
  zt_acts *a = calloc(1, sizeof *a);
  if (!a) goto nomem;
  a->m = m;
  a->be = *be;
  a->B = B;
  a->T = m->cfg.seq_len;
  a->ckpt_every = ckpt_every;
  a->dt = dt;
  a->arch = calloc(1, m->arch->host_acts_size + (size_t)m->cfg.n_layers * m->arch->host_layer_size);
  if (!a->arch) goto nomem;
  zt__bump b = {0};
  m->arch->bind_acts(a, &b);
  a->bytes = b.off;
  a->base = be->ops->alloc(be->ctx, a->bytes);
  if (!a->base) {
    zt_acts_close(a);
    snprintf(err, errlen, "backend %s: cannot allocate %zu bytes of activations", be->ops->name,
             b.off);
    return -ENOMEM;
  }
  b = (zt__bump){.base = a->base};
  m->arch->bind_acts(a, &b);
  if (a->row_loss && !(a->h_tgt = malloc((size_t)B * (size_t)a->T * sizeof *a->h_tgt))) goto nomem;
  if (m->arch->acts_ready) m->arch->acts_ready(a);
  if (default_positions(a) < 0) goto nomem;
  *out = a;
  return 0;
nomem:
  zt_acts_close(a);
  snprintf(err, errlen, "out of memory");
  return -ENOMEM;
}

void zt_acts_close(zt_acts *a) {
  if (!a) return;
  if (a->base) a->be.ops->free(a->be.ctx, a->base);
  free(a->h_tgt);
  free(a->arch);
  free(a);
}

size_t zt_acts_bytes(const zt_acts *a) { return a->bytes; }
int32_t *zt_acts_tokens(zt_acts *a) { return a->tok; }
int32_t *zt_acts_targets(zt_acts *a) { return a->tgt; }
int32_t *zt_acts_positions(zt_acts *a) { return a->pos; }
void *zt_acts_logits(zt_acts *a) { return a->logits; }
zt_dtype zt_acts_dtype(const zt_acts *a) { return a->dt; }

void zt__acts_set_loss_rows(zt_acts *a, int rows) {
  if (rows >= 1 && rows < a->loss_rows) a->loss_rows = rows;
}

void zt_model_loss(const zt_model *m, zt_acts *a, float dscale) {
  const zt_ops *o = a->be.ops;
  int N = a->B * a->T;
  a->loss_pending = 1;
  if (a->logits) {
    o->crossentropy_fwd_bwd_dt(a->be.ctx, a->dt, a->logits, a->tgt, N, m->cfg.vocab,
                               m->cfg.vocab, -1, dscale, &a->loss_sum, &a->n_counted);
    return;
  }
  a->dscale = dscale;
  o->zero(a->be.ctx, a->row_loss, (size_t)N * sizeof(float));
}

void zt_model_eval_loss(const zt_model *m, zt_acts *a, const void *head_lp,
                        const void *embed_lp) {
  zt_model_loss(m, a, 1.0f);
  if (m->arch->eval_loss) m->arch->eval_loss(m, a, head_lp, embed_lp);
}

int zt_acts_loss(zt_acts *a, double *loss_sum, int *n_counted) {
  if (!a->loss_pending) return -EINVAL;
  a->loss_pending = 0;
  if (a->row_loss) {
    const zt_ops *o = a->be.ops;
    size_t N = (size_t)a->B * (size_t)a->T;
    int n = 0;
    o->to_host(a->be.ctx, a->h_tgt, a->tgt, N * sizeof *a->h_tgt);
    a->loss_sum = o->sum(a->be.ctx, a->row_loss, N);
    for (size_t i = 0; i < N; i++) n += a->h_tgt[i] >= 0;
    a->n_counted = n;
  }
  *loss_sum = a->loss_sum;
  *n_counted = a->n_counted;
  return 0;
}

void zt_model_unit_forward(const zt_model *m, zt_acts *a, int unit, const float *p,
                           const float *embed) {
  m->arch->unit_forward(m, a, unit, p, p, embed, embed);
}

void zt_model_unit_backward(const zt_model *m, zt_acts *a, int unit, const float *p, float *g,
                            const float *embed, float *dembed) {
  m->arch->unit_backward(m, a, unit, p, p, g, embed, embed, dembed);
}

void zt_model_unit_forward_dt(const zt_model *m, zt_acts *a, int unit, const float *p,
                              const void *p_lp, const float *embed, const void *embed_lp) {
  m->arch->unit_forward(m, a, unit, p, p_lp, embed, embed_lp);
}

void zt_model_unit_backward_dt(const zt_model *m, zt_acts *a, int unit, const float *p,
                               const void *p_lp, float *g, const float *embed,
                               const void *embed_lp, float *dembed) {
  m->arch->unit_backward(m, a, unit, p, p_lp, g, embed, embed_lp, dembed);
}

/* The unit's block of a compute copy of type dt. */
static const void *lp_at(const zt_acts *a, const void *params_lp, size_t offset) {
  return (const char *)params_lp + offset * zt_dtype_size(a->dt);
}

void zt_model_forward(const zt_model *m, zt_acts *a, const float *params) {
  zt_model_forward_dt(m, a, params, params);
}

void zt_model_backward(const zt_model *m, zt_acts *a, const float *params, float *grads) {
  zt_model_backward_dt(m, a, params, params, grads);
}

void zt_model_forward_dt(const zt_model *m, zt_acts *a, const float *params,
                         const void *params_lp) {
  for (int u = 0; u < m->nu; u++)
    m->arch->unit_forward(m, a, u, params + m->u[u].offset, lp_at(a, params_lp, m->u[u].offset),
                          params + m->u[0].offset, lp_at(a, params_lp, m->u[0].offset));
}

void zt_model_eval_dt(const zt_model *m, zt_acts *a, const float *params,
                      const void *params_lp) {
  zt_model_forward_dt(m, a, params, params_lp);
  zt_model_eval_loss(m, a, lp_at(a, params_lp, m->u[m->nu - 1].offset),
                     lp_at(a, params_lp, m->u[0].offset));
}

void zt_model_backward_dt(const zt_model *m, zt_acts *a, const float *params,
                          const void *params_lp, float *grads) {
  for (int u = m->nu - 1; u >= 0; u--)
    m->arch->unit_backward(m, a, u, params + m->u[u].offset, lp_at(a, params_lp, m->u[u].offset),
                           grads + m->u[u].offset, params + m->u[0].offset,
                           lp_at(a, params_lp, m->u[0].offset), grads + m->u[0].offset);
}
