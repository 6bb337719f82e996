/* safetensors reader and writer. The reader keeps the file open and reads each tensor with
 * pread when asked, so a checkpoint of many GB is never in memory whole (a mapping would be, in
 * the process's resident pages, as it is read); every offset is checked against the file's size
 * first. */
#include "engine/model/safetensors.h"

#include "engine/base/checksum.h"
#include "engine/base/path.h"
#include "engine/base/pio.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/kernels/dtype.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader copies it as host floats"
#endif

/* The reference implementation refuses headers above 100 MB; so do we, before allocating. */
/* What a file that is not safetensors is told: no value read from it (its length, its bytes)
 * goes into a message, which may reach a client that could not read the file itself. Names
 * from a header that parsed are fine, its numbers are not. */
#define NOT_ST "not a safetensors file (bad header)"
#define ST_HEADER_MAX (100u * 1000u * 1000u)

struct zt_st_file {
  char *path;
  int fd;
  uint64_t data_at;     /* the data section's first byte in the file */
  size_t data_len;
  zt_st_tensor *t;
  int n;
  char *names;          /* all names, NUL-separated */
};

static const struct {
  const char *name;
  zt_st_dtype dtype;
  size_t size;
} dtypes[] = {
    {"F32", ZT_ST_F32, 4},       {"F16", ZT_ST_F16, 2},   {"BF16", ZT_ST_BF16, 2},
    {"F64", ZT_ST_F64, 8},       {"I64", ZT_ST_I64, 8},   {"I32", ZT_ST_I32, 4},
    {"I16", ZT_ST_I16, 2},       {"I8", ZT_ST_I8, 1},     {"U64", ZT_ST_U64, 8},
    {"U32", ZT_ST_U32, 4},       {"U16", ZT_ST_U16, 2},   {"U8", ZT_ST_U8, 1},
    {"BOOL", ZT_ST_BOOL, 1},     {"F8_E4M3", ZT_ST_F8_E4M3, 1},
    {"F8_E5M2", ZT_ST_F8_E5M2, 1},
};

void zt_st_close(zt_st_file *f) {
  if (!f) return;
  if (f->fd >= 0) close(f->fd);
  free(f->t);
  free(f->names);
  free(f->path);
  free(f);
}

static int cmp_begin(const void *a, const void *b) {
  const zt_st_tensor *x = *(const zt_st_tensor *const *)a, *y = *(const zt_st_tensor *const *)b;
  return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Parses one header entry into t (name pointer set by the caller). */
static int parse_entry(zt_st_file *f, const char *name, json_t *v, zt_st_tensor *t, char *err,
                       size_t errlen) {
  if (!json_is_object(v)) {
    snprintf(err, errlen, "%s: tensor %s: header entry is not an object", f->path, name);
    return -EINVAL;
  }
  json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
         *jo = json_object_get(v, "data_offsets");
  if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) || json_array_size(jo) != 2) {
    snprintf(err, errlen, "%s: tensor %s: needs dtype (string), shape (array), data_offsets "
             "([begin, end])", f->path, name);
    return -EINVAL;
  }
  const char *ds = json_string_value(jd);
  t->dtype = 0;
  size_t esize = 0;
  for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
    if (!strcmp(dtypes[i].name, ds)) t->dtype = dtypes[i].dtype, esize = dtypes[i].size;
  if (!t->dtype) {
    snprintf(err, errlen, "%s: tensor %s: unknown dtype", f->path, name);
    return -EINVAL;
  }
  size_t nd = json_array_size(js);
  if (nd > ZT_ST_MAX_DIM) {
    snprintf(err, errlen, "%s: tensor %s: more than %d dimensions", f->path, name, ZT_ST_MAX_DIM);
    return -EINVAL;
  }
  t->ndim = (int)nd;
  size_t numel = 1;
  for (size_t i = 0; i < nd; i++) {
    json_t *d = json_array_get(js, i);
    json_int_t x = json_is_integer(d) ? json_integer_value(d) : -1;
    if (x < 0 || (x > 0 && numel > SIZE_MAX / 16 / (size_t)x)) {
      snprintf(err, errlen, "%s: tensor %s: shape[%zu] is not a valid size", f->path, name, i);
      return -EINVAL;
    }
    t->shape[i] = x;
    numel *= (size_t)x;
  }
  t->numel = numel;
  json_t *b = json_array_get(jo, 0), *e = json_array_get(jo, 1);
  json_int_t bi = json_is_integer(b) ? json_integer_value(b) : -1;
  json_int_t ei = json_is_integer(e) ? json_integer_value(e) : -1;
  if (bi < 0 || ei < bi || (uint64_t)ei > f->data_len) {
    snprintf(err, errlen, "%s: tensor %s: data_offsets out of the file's data section", f->path,
             name);
    return -EINVAL;
  }
  t->begin = (size_t)bi;
  t->end = (size_t)ei;
  if (t->end - t->begin != numel * esize) {
    snprintf(err, errlen, "%s: tensor %s: data_offsets do not span its shape x dtype", f->path,
             name);
    return -EINVAL;
  }
  return 0;
}

/* Reads len bytes at off; -EIO for a file shorter than that. */
static int pread_full(int fd, void *buf, size_t len, uint64_t off) {
  char *p = buf;
  while (len > 0) {
    ssize_t r = pread(fd, p, len, (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -errno;
    if (r == 0) return -EIO;
    p += r;
    len -= (size_t)r;
    off += (uint64_t)r;
  }
  return 0;
}

int zt_st_open(zt_st_file **out, const char *path, char *err, size_t errlen) {
  int rc = 0;
  json_t *root = NULL;
  zt_st_tensor **order = NULL;
  char *hdr = NULL;
  zt_st_file *f = calloc(1, sizeof *f);
  *out = NULL;
  if (f) f->fd = -1;
  if (!f || !(f->path = strdup(path))) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", path);
    goto out;
  }
  /* a regular file, opened without blocking on a FIFO or a device */
  if ((rc = zt_path_open(NULL, path, 0, NULL, &f->fd, NULL, 0, err, errlen)) < 0) goto out;
  struct stat st;
  if (fstat(f->fd, &st) < 0) {
    rc = -errno;
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    goto out;
  }
  if (st.st_size < 8) {
    rc = -EINVAL;
    snprintf(err, errlen, "%s: " NOT_ST, path);
    goto out;
  }
  size_t file_len = (size_t)st.st_size;
  uint8_t len8[8];
  if ((rc = pread_full(f->fd, len8, 8, 0)) < 0) {
    snprintf(err, errlen, "%s: reading the header length: %s", path, strerror(-rc));
    goto out;
  }
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len8[i];
  if (hlen > file_len - 8 || hlen > ST_HEADER_MAX) {
    rc = -EINVAL;
    snprintf(err, errlen, "%s: " NOT_ST, path);
    goto out;
  }
  f->data_at = 8 + hlen;
  f->data_len = file_len - 8 - hlen;
  if (!(hdr = malloc(hlen ? hlen : 1))) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", path);
    goto out;
  }
  if ((rc = pread_full(f->fd, hdr, hlen, 8)) < 0) {
    snprintf(err, errlen, "%s: reading the header: %s", path, strerror(-rc));
    goto out;
  }
  json_error_t jerr;
  root = json_loadb(hdr, hlen, JSON_REJECT_DUPLICATES, &jerr);
  if (!root || !json_is_object(root)) {
    rc = -EINVAL;
    snprintf(err, errlen, "%s: " NOT_ST, path);
    goto out;
  }
  size_t cap = json_object_size(root), names_len = 0;
  const char *key;
  json_t *v;
  json_object_foreach(root, key, v) names_len += strlen(key) + 1;
  f->t = calloc(cap ? cap : 1, sizeof *f->t);
  f->names = malloc(names_len ? names_len : 1);
  order = calloc(cap ? cap : 1, sizeof *order);
  if (!f->t || !f->names || !order) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", path);
    goto out;
  }
  char *np = f->names;
  json_object_foreach(root, key, v) {
    if (!strcmp(key, "__metadata__")) continue;
    zt_st_tensor *t = &f->t[f->n];
    rc = parse_entry(f, key, v, t, err, errlen);
    if (rc < 0) goto out;
    size_t kl = strlen(key) + 1;
    memcpy(np, key, kl);
    t->name = np;
    np += kl;
    order[f->n] = t;
    f->n++;
  }
  qsort(order, (size_t)f->n, sizeof *order, cmp_begin);
  for (int i = 1; i < f->n; i++)
    if (order[i]->begin < order[i - 1]->end) {
      rc = -EINVAL;
      snprintf(err, errlen, "%s: tensors %s and %s overlap in the data section", path,
               order[i - 1]->name, order[i]->name);
      goto out;
    }
  *out = f;
  f = NULL;
out:
  free(hdr);
  json_decref(root);
  free(order);
  zt_st_close(f);
  return rc;
}

int zt_st_count(const zt_st_file *f) { return f->n; }
const char *zt_st_path(const zt_st_file *f) { return f->path; }
const zt_st_tensor *zt_st_tensor_at(const zt_st_file *f, int i) { return &f->t[i]; }

const zt_st_tensor *zt_st_find(const zt_st_file *f, const char *name) {
  for (int i = 0; i < f->n; i++)
    if (!strcmp(f->t[i].name, name)) return &f->t[i];
  return NULL;
}

static float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}

/* IEEE binary16 -> binary32, exact for every value (subnormals, inf, nan included). */
static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | man << 13;
  } else if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  /* subnormal: renormalise */
      int e = -1;
      do {
        e++;
        man <<= 1;
      } while (!(man & 0x400));
      u = sign | (uint32_t)(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else {
    u = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float x;
  memcpy(&x, &u, 4);
  return x;
}

static float elem_f32(zt_st_dtype d, const uint8_t *p, size_t i) {
  uint16_t h;
  float x;
  switch (d) {
  case ZT_ST_F32:
    memcpy(&x, p + 4 * i, 4);
    return x;
  case ZT_ST_BF16:
    memcpy(&h, p + 2 * i, 2);
    return bf16_to_f32(h);
  default:
    memcpy(&h, p + 2 * i, 2);
    return f16_to_f32(h);
  }
}

static int convertible(const zt_st_file *f, const zt_st_tensor *t, char *err, size_t errlen) {
  if (t->dtype == ZT_ST_F32 || t->dtype == ZT_ST_BF16 || t->dtype == ZT_ST_F16) return 0;
  snprintf(err, errlen, "%s: tensor %s: dtype does not convert to fp32 (F32, BF16, F16 do)",
           f->path, t->name);
  return -EINVAL;
}

/* The conversion of one chunk: elements [a, b) of chunk (elements i0.. of the tensor's range)
 * into dst, at dst[i0 + i], or at dst[(i % C) * R + i / C] (i counted from the range's start)
 * transposed; zt_pio_for runs the ranges on several threads. */
typedef struct conv_job {
  zt_st_dtype dtype;
  const uint8_t *chunk;
  float *dst;
  size_t i0, R, C;
  int transpose;
} conv_job;

static void conv_range(void *ctx, size_t a, size_t b) {
  const conv_job *j = ctx;
  if (!j->transpose) {
    float *d = j->dst + j->i0;
    if (j->dtype == ZT_ST_BF16) {
      const uint8_t *p = j->chunk;
      for (size_t i = a; i < b; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        d[i] = bf16_to_f32(h);
      }
    } else {
      for (size_t i = a; i < b; i++) d[i] = elem_f32(j->dtype, j->chunk, i);
    }
    return;
  }
  size_t R = j->R, C = j->C, r = (j->i0 + a) / C, c = (j->i0 + a) % C;
  for (size_t i = a; i < b; i++) {
    j->dst[c * R + r] = elem_f32(j->dtype, j->chunk, i);
    if (++c == C) c = 0, r++;
  }
}

/* What one thread of a chunk's conversion takes at least, in elements. */
#define CONV_GRAIN ((size_t)256 << 10)

/* Elements [first, first + n) of t into dst, or transposed (t 2-D (R, C), first 0, n its numel)
 * into the (C, R) transpose; *sum (unless NULL) the checksum of the bytes read as they lie in the
 * file (engine/base/checksum.h), summed in the same pass as the load: each byte is read once. */
static int read_elems(const zt_st_file *f, const zt_st_tensor *t, size_t first, size_t n,
                      float *dst, int transpose, uint64_t *sum, char *err, size_t errlen) {
  size_t es = t->dtype == ZT_ST_F32 ? 4 : 2;
  uint64_t at = f->data_at + t->begin + first * es;
  int rc = 0;
  uint8_t *chunk = NULL;
  zt_checksum_state *cs = NULL;
  if (!transpose && t->dtype == ZT_ST_F32) {
    rc = zt_pio_pread(f->fd, dst, n * 4, at);
    if (rc == 0 && sum) *sum = zt_checksum(dst, n * 4);
    goto out;
  }
  /* through a bounded chunk, read as several pieces at once, then converted on several threads */
  size_t bytes = n * es;
  size_t per = ZT_ST_CHUNK_BYTES / es;
  conv_job cj = {.dtype = t->dtype, .dst = dst, .transpose = transpose,
                 .R = transpose ? (size_t)t->shape[0] : 0, .C = transpose ? (size_t)t->shape[1] : 0};
  if (!(chunk = malloc(bytes < ZT_ST_CHUNK_BYTES ? (bytes ? bytes : 1) : ZT_ST_CHUNK_BYTES)) ||
      (sum && !(cs = zt_checksum_new()))) {
    free(chunk);
    snprintf(err, errlen, "%s: tensor %s: out of memory", f->path, t->name);
    return -ENOMEM;
  }
  cj.chunk = chunk;
  for (size_t i0 = 0; i0 < n && rc == 0; i0 += per) {
    size_t k = n - i0 < per ? n - i0 : per;
    if ((rc = zt_pio_pread(f->fd, chunk, k * es, at + i0 * es)) < 0) break;
    if (cs) zt_checksum_update(cs, chunk, k * es);
    cj.i0 = i0;
    zt_pio_for(k, CONV_GRAIN, conv_range, &cj);
  }
  if (rc == 0 && cs) *sum = zt_checksum_digest(cs);
out:
  free(chunk);
  zt_checksum_free(cs);
  if (rc < 0)
    snprintf(err, errlen, "%s: tensor %s: reading its data: %s", f->path, t->name,
             rc == -EIO ? "the file is shorter than its header says" : strerror(-rc));
  return rc;
}

int zt_st_read_f32(const zt_st_file *f, const zt_st_tensor *t, float *dst, int transpose,
                   char *err, size_t errlen) {
  return zt_st_read_f32_sum(f, t, dst, transpose, NULL, err, errlen);
}

int zt_st_read_f32_sum(const zt_st_file *f, const zt_st_tensor *t, float *dst, int transpose,
                       uint64_t *sum, char *err, size_t errlen) {
  int rc = convertible(f, t, err, errlen);
  if (rc < 0) return rc;
  if (transpose && t->ndim != 2) {
    snprintf(err, errlen, "%s: tensor %s: only 2-D tensors can be transposed", f->path, t->name);
    return -EINVAL;
  }
  return read_elems(f, t, 0, t->numel, dst, transpose, sum, err, errlen);
}

int zt_st_read_f32_range(const zt_st_file *f, const zt_st_tensor *t, size_t first, size_t n,
                         float *dst, char *err, size_t errlen) {
  int rc = convertible(f, t, err, errlen);
  if (rc < 0) return rc;
  if (first > t->numel || n > t->numel - first) {
    snprintf(err, errlen, "%s: tensor %s: elements [%zu, %zu + %zu) are outside its %zu",
             f->path, t->name, first, first, n, t->numel);
    return -EINVAL;
  }
  return read_elems(f, t, first, n, dst, 0, NULL, err, errlen);
}

void zt_st_willneed(const zt_st_file *f, const zt_st_tensor *t) {
  if (t->end > t->begin)
    (void)posix_fadvise(f->fd, (off_t)(f->data_at + t->begin), (off_t)(t->end - t->begin),
                        POSIX_FADV_WILLNEED);
}

int zt_st_sum(const zt_st_file *f, const zt_st_tensor *t, uint64_t *sum, char *err,
              size_t errlen) {
  size_t bytes = t->end - t->begin, cap = bytes < ZT_ST_CHUNK_BYTES ? bytes : ZT_ST_CHUNK_BYTES;
  uint8_t *chunk = malloc(cap ? cap : 1);
  zt_checksum_state *cs = zt_checksum_new();
  int rc = 0;
  if (!chunk || !cs) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: tensor %s: out of memory", f->path, t->name);
    goto out;
  }
  for (size_t off = 0; off < bytes && rc == 0; off += cap) {
    size_t k = bytes - off < cap ? bytes - off : cap;
    if ((rc = zt_pio_pread(f->fd, chunk, k, f->data_at + t->begin + off)) == 0)
      zt_checksum_update(cs, chunk, k);
  }
  if (rc < 0)
    snprintf(err, errlen, "%s: tensor %s: reading its data: %s", f->path, t->name,
             rc == -EIO ? "the file is shorter than its header says" : strerror(-rc));
  else
    *sum = zt_checksum_digest(cs);
out:
  free(chunk);
  zt_checksum_free(cs);
  return rc;
}

static int fsync_dir_of(const char *path) {
  char *dir = strdup(path);
  if (!dir) return -ENOMEM;
  char *slash = strrchr(dir, '/');
  if (slash == dir) slash[1] = 0;
  else if (slash) *slash = 0;
  else strcpy(dir, ".");
  int rc = 0, fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || fsync(fd) < 0) rc = -errno;
  if (fd >= 0) close(fd);
  free(dir);
  return rc;
}

struct zt_st_writer {
  char *path, *tmp;
  int fd;
  uint64_t data_at;     /* the data section's first byte in the file */
  int n;
  size_t *begin, *numel; /* per entry: its first byte in the data section, its elements */
  size_t *left;         /* per entry: elements not put yet */
  char *half;           /* per entry: stored as BF16 */
  uint16_t *conv;       /* BF16 entries' conversion buffer (conv_cap), NULL without any */
  size_t conv_cap;      /* elements: CONV_ELEMS, or the largest BF16 entry's where smaller */
  uint64_t *sum;        /* per entry put whole: the checksum of its bytes (engine/base/checksum.h) */
  char (*names)[96];    /* per entry, for messages: the name's start */
  int finished;
};

/* What put converts through at a time for a BF16 entry. */
#define CONV_ELEMS (ZT_ST_CHUNK_BYTES / 2)

static int pwrite_full(int fd, const void *buf, size_t len, uint64_t off) {
  const char *p = buf;
  while (len > 0) {
    ssize_t r = pwrite(fd, p, len, (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -errno;
    p += r;
    len -= (size_t)r;
    off += (uint64_t)r;
  }
  return 0;
}

void zt_st_writer_close(zt_st_writer *w) {
  if (!w) return;
  if (w->fd >= 0) close(w->fd);
  if (!w->finished && w->tmp) unlink(w->tmp);
  free(w->path);
  free(w->tmp);
  free(w->begin);
  free(w->numel);
  free(w->left);
  free(w->half);
  free(w->conv);
  free(w->sum);
  free(w->names);
  free(w);
}

int zt_st_writer_open(zt_st_writer **out, const char *path, const zt_st_entry *e, int n,
                      const char *const *meta, int n_meta, char *err, size_t errlen) {
  int rc = 0;
  json_t *root = json_object();
  char *hdr = NULL;
  size_t off = 0;
  zt_st_writer *w = calloc(1, sizeof *w);
  *out = NULL;
  if (w) w->fd = -1;
  if (!root || !w || !(w->path = strdup(path)) || asprintf(&w->tmp, "%s.tmp", path) < 0) {
    if (w) w->tmp = NULL;
    goto nomem;
  }
  w->n = n;
  w->begin = calloc((size_t)n + 1, sizeof *w->begin);
  w->numel = calloc((size_t)n + 1, sizeof *w->numel);
  w->left = calloc((size_t)n + 1, sizeof *w->left);
  w->half = calloc((size_t)n + 1, 1);
  w->sum = calloc((size_t)n + 1, sizeof *w->sum);
  w->names = calloc((size_t)n + 1, sizeof *w->names);
  if (!w->begin || !w->numel || !w->left || !w->half || !w->sum || !w->names) goto nomem;
  if (n_meta > 0) {
    json_t *m = json_object();
    if (!m || json_object_set_new(root, "__metadata__", m) < 0) goto nomem;
    for (int i = 0; i < n_meta; i++)
      if (json_object_set_new(m, meta[2 * i], json_string(meta[2 * i + 1])) < 0) goto nomem;
  }
  for (int i = 0; i < n; i++) {
    size_t numel = 1;
    if (e[i].dtype && e[i].dtype != ZT_ST_F32 && e[i].dtype != ZT_ST_BF16) {
      rc = -EINVAL;
      snprintf(err, errlen, "%s: tensor %s: the writer writes F32 and BF16 only", path,
               e[i].name);
      goto out;
    }
    int half = e[i].dtype == ZT_ST_BF16;
    json_t *shape = json_array(), *t = json_object();
    for (int d = 0; d < e[i].ndim; d++) {
      numel *= (size_t)e[i].shape[d];
      json_array_append_new(shape, json_integer(e[i].shape[d]));
    }
    size_t bytes = numel * (half ? 2 : 4);
    json_object_set_new(t, "dtype", json_string(half ? "BF16" : "F32"));
    json_object_set_new(t, "shape", shape);
    json_object_set_new(t, "data_offsets",
                        json_pack("[II]", (json_int_t)off, (json_int_t)(off + bytes)));
    if (json_object_set_new(root, e[i].name, t) < 0) goto nomem;
    w->begin[i] = off;
    w->numel[i] = w->left[i] = numel;
    w->half[i] = (char)half;
    if (half && numel > w->conv_cap) w->conv_cap = numel < CONV_ELEMS ? numel : CONV_ELEMS;
    snprintf(w->names[i], sizeof w->names[i], "%s", e[i].name);
    off += bytes;
  }
  /* no more conversion buffer than the largest BF16 entry needs */
  if (w->conv_cap && !(w->conv = malloc(w->conv_cap * sizeof *w->conv))) goto nomem;
  if (!(hdr = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER))) goto nomem;
  /* the header is padded with spaces to a multiple of 8 bytes, so the data starts aligned */
  size_t hl = strlen(hdr), padded = (hl + 7) / 8 * 8;
  char *h = realloc(hdr, 8 + padded);
  if (!h) goto nomem;
  hdr = h;
  memmove(hdr + 8, hdr, hl);
  memset(hdr + 8 + hl, ' ', padded - hl);
  for (int i = 0; i < 8; i++) hdr[i] = (char)(uint8_t)((uint64_t)padded >> (8 * i));
  w->data_at = 8 + padded;
  w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (w->fd < 0 || (rc = pwrite_full(w->fd, hdr, 8 + padded, 0)) < 0) {
    rc = w->fd < 0 ? -errno : rc;
    snprintf(err, errlen, "%s: %s", w->tmp, strerror(-rc));
    goto out;
  }
  *out = w;
  w = NULL;
  goto out;
nomem:
  rc = -ENOMEM;
  snprintf(err, errlen, "%s: out of memory", path);
out:
  zt_st_writer_close(w);
  json_decref(root);
  free(hdr);
  return rc;
}

/* fp32 -> BF16 of a range of a put, on several threads (zt_pio_for). */
typedef struct bf16_job {
  uint16_t *out;
  const float *in;
} bf16_job;

static void to_bf16_range(void *ctx, size_t a, size_t b) {
  const bf16_job *j = ctx;
  for (size_t i = a; i < b; i++) j->out[i] = zt_f32_to_bf16(j->in[i]);
}

int zt_st_writer_put_range(zt_st_writer *w, int i, size_t first, size_t n, const float *data,
                           char *err, size_t errlen) {
  int rc = 0;
  if (first > w->numel[i] || n > w->numel[i] - first || n > w->left[i]) {
    snprintf(err, errlen, "%s: tensor %s: elements [%zu, %zu + %zu) are outside its %zu or put "
             "before", w->tmp, w->names[i], first, first, n, w->numel[i]);
    return -EINVAL;
  }
  uint64_t at = w->data_at + w->begin[i];
  /* an entry put whole gets the checksum of its bytes as written */
  int whole = first == 0 && n == w->numel[i];
  zt_checksum_state *cs = NULL;
  if (!w->half[i]) {
    rc = zt_pio_pwrite(w->fd, data, n * 4, at + first * 4);
    if (rc == 0 && whole) w->sum[i] = zt_checksum(data, n * 4);
  } else {
    if (whole && !(cs = zt_checksum_new())) rc = -ENOMEM;
    for (size_t i0 = 0; i0 < n && rc == 0; i0 += w->conv_cap) {
      size_t k = n - i0 < w->conv_cap ? n - i0 : w->conv_cap;
      bf16_job bj = {w->conv, data + i0};
      zt_pio_for(k, CONV_GRAIN, to_bf16_range, &bj);
      rc = zt_pio_pwrite(w->fd, w->conv, k * 2, at + (first + i0) * 2);
      if (rc == 0 && cs) zt_checksum_update(cs, w->conv, k * 2);
    }
    if (rc == 0 && cs) w->sum[i] = zt_checksum_digest(cs);
    zt_checksum_free(cs);
  }
  if (rc < 0) {
    snprintf(err, errlen, "%s: write: %s", w->tmp, strerror(-rc));
    return rc;
  }
  w->left[i] -= n;
  return 0;
}

int zt_st_writer_put(zt_st_writer *w, int i, const float *data, char *err, size_t errlen) {
  return zt_st_writer_put_range(w, i, 0, w->numel[i], data, err, errlen);
}

uint64_t zt_st_writer_sum(const zt_st_writer *w, int i) { return w->sum[i]; }

int zt_st_writer_finish(zt_st_writer *w, char *err, size_t errlen) {
  for (int i = 0; i < w->n; i++)
    if (w->left[i]) {
      snprintf(err, errlen, "%s: tensor %s was never written%s", w->tmp, w->names[i],
               w->left[i] < w->numel[i] ? " whole" : "");
      return -EINVAL;
    }
  int fd = w->fd, rc = fsync(fd) < 0 ? -errno : 0;
  w->fd = -1;
  if (close(fd) < 0 && rc == 0) rc = -errno;
  if (rc < 0) {
    snprintf(err, errlen, "%s: write: %s", w->tmp, strerror(-rc));
    return rc;
  }
  if (rename(w->tmp, w->path) < 0) {
    rc = -errno;
    snprintf(err, errlen, "rename %s -> %s: %s", w->tmp, w->path, strerror(errno));
    return rc;
  }
  w->finished = 1;
  rc = fsync_dir_of(w->path);
  if (rc < 0) snprintf(err, errlen, "%s: fsync of its directory: %s", w->path, strerror(-rc));
  return rc;
}

int zt_st_write(const char *path, const zt_st_entry *e, int n, const char *const *meta,
                int n_meta, char *err, size_t errlen) {
  zt_st_writer *w = NULL;
  float *tr = NULL;
  size_t tr_cap = 0;
  int rc = 0;
  for (int i = 0; i < n; i++) {
    if (e[i].transpose && e[i].ndim != 2) {
      snprintf(err, errlen, "%s: tensor %s: only 2-D tensors can be transposed", path, e[i].name);
      return -EINVAL;
    }
    size_t numel = e[i].transpose ? (size_t)e[i].shape[0] * (size_t)e[i].shape[1] : 0;
    if (numel > tr_cap) tr_cap = numel;
  }
  if (tr_cap && !(tr = malloc(tr_cap * sizeof *tr))) {
    snprintf(err, errlen, "%s: out of memory", path);
    return -ENOMEM;
  }
  if ((rc = zt_st_writer_open(&w, path, e, n, meta, n_meta, err, errlen)) < 0) goto out;
  for (int i = 0; i < n && rc == 0; i++) {
    const float *d = e[i].data;
    if (e[i].transpose) {
      /* data holds (shape[1], shape[0]); the file the (shape[0], shape[1]) transpose */
      size_t R = (size_t)e[i].shape[0], C = (size_t)e[i].shape[1];
      for (size_t a = 0; a < R; a++)
        for (size_t b = 0; b < C; b++) tr[a * C + b] = e[i].data[b * R + a];
      d = tr;
    }
    rc = zt_st_writer_put(w, i, d, err, errlen);
  }
  if (rc == 0) rc = zt_st_writer_finish(w, err, errlen);
out:
  zt_st_writer_close(w);
  free(tr);
  return rc;
}
