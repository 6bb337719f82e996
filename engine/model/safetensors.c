/* safetensors reader and writer. The reader maps the file read-only so a checkpoint of many GB
 * is not copied before conversion; every offset is checked against the mapping first. */
#include "engine/model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader copies it as host floats"
#endif

/* The reference implementation refuses headers above 100 MB; so do we, before allocating. */
#define ST_HEADER_MAX (100u * 1000u * 1000u)

struct zt_st_file {
  char *path;
  uint8_t *map;
  size_t map_len;
  const uint8_t *data;  /* start of the data section */
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
  if (f->map) munmap(f->map, f->map_len);
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
    snprintf(err, errlen, "%s: tensor %s: unknown dtype \"%s\"", f->path, name, ds);
    return -EINVAL;
  }
  size_t nd = json_array_size(js);
  if (nd > ZT_ST_MAX_DIM) {
    snprintf(err, errlen, "%s: tensor %s: %zu dimensions (at most %d)", f->path, name, nd,
             ZT_ST_MAX_DIM);
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
    snprintf(err, errlen, "%s: tensor %s: data_offsets [%lld, %lld] out of range (data section "
             "is %zu bytes)", f->path, name, (long long)bi, (long long)ei, f->data_len);
    return -EINVAL;
  }
  t->begin = (size_t)bi;
  t->end = (size_t)ei;
  if (t->end - t->begin != numel * esize) {
    snprintf(err, errlen, "%s: tensor %s: data_offsets span %zu bytes but shape x %s needs %zu",
             f->path, name, t->end - t->begin, ds, numel * esize);
    return -EINVAL;
  }
  return 0;
}

int zt_st_open(zt_st_file **out, const char *path, char *err, size_t errlen) {
  int rc = 0, fd = -1;
  json_t *root = NULL;
  zt_st_tensor **order = NULL;
  zt_st_file *f = calloc(1, sizeof *f);
  *out = NULL;
  if (!f || !(f->path = strdup(path))) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", path);
    goto out;
  }
  fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) < 0) {
    rc = -errno;
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    goto out;
  }
  if (st.st_size < 8) {
    rc = -EINVAL;
    snprintf(err, errlen, "%s: file is %lld bytes, shorter than the 8-byte header length", path,
             (long long)st.st_size);
    goto out;
  }
  f->map_len = (size_t)st.st_size;
  f->map = mmap(NULL, f->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
  if (f->map == MAP_FAILED) {
    f->map = NULL;
    rc = -errno;
    snprintf(err, errlen, "%s: mmap: %s", path, strerror(errno));
    goto out;
  }
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | f->map[i];
  if (hlen > f->map_len - 8 || hlen > ST_HEADER_MAX) {
    rc = -EINVAL;
    snprintf(err, errlen, "%s: truncated: header length %llu but only %zu bytes follow", path,
             (unsigned long long)hlen, f->map_len - 8);
    goto out;
  }
  f->data = f->map + 8 + hlen;
  f->data_len = f->map_len - 8 - hlen;
  json_error_t jerr;
  root = json_loadb((const char *)f->map + 8, hlen, JSON_REJECT_DUPLICATES, &jerr);
  if (!root || !json_is_object(root)) {
    rc = -EINVAL;
    snprintf(err, errlen, "%s: header is not a JSON object: %s", path, root ? "" : jerr.text);
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
  if (fd >= 0) close(fd);
  json_decref(root);
  free(order);
  zt_st_close(f);
  return rc;
}

int zt_st_count(const zt_st_file *f) { return f->n; }
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

int zt_st_read_f32(const zt_st_file *f, const zt_st_tensor *t, float *dst, int transpose,
                   char *err, size_t errlen) {
  if (t->dtype != ZT_ST_F32 && t->dtype != ZT_ST_BF16 && t->dtype != ZT_ST_F16) {
    snprintf(err, errlen, "%s: tensor %s: dtype does not convert to fp32 (F32, BF16, F16 do)",
             f->path, t->name);
    return -EINVAL;
  }
  if (transpose && t->ndim != 2) {
    snprintf(err, errlen, "%s: tensor %s: only 2-D tensors can be transposed", f->path, t->name);
    return -EINVAL;
  }
  const uint8_t *p = f->data + t->begin;
  if (!transpose) {
    if (t->dtype == ZT_ST_F32) {
      memcpy(dst, p, t->numel * 4);
    } else {
      for (size_t i = 0; i < t->numel; i++) dst[i] = elem_f32(t->dtype, p, i);
    }
    return 0;
  }
  size_t R = (size_t)t->shape[0], C = (size_t)t->shape[1];
  for (size_t i = 0; i < R; i++)
    for (size_t j = 0; j < C; j++) dst[j * R + i] = elem_f32(t->dtype, p, i * C + j);
  return 0;
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

int zt_st_write(const char *path, const zt_st_entry *e, int n, const char *const *meta,
                int n_meta, char *err, size_t errlen) {
  int rc = 0;
  json_t *root = json_object();
  char *hdr = NULL, *tmp = NULL, *row = NULL;
  FILE *fp = NULL;
  size_t off = 0, row_cap = 0;
  if (!root || asprintf(&tmp, "%s.tmp", path) < 0) {
    tmp = NULL;
    rc = -ENOMEM;
    goto nomem;
  }
  if (n_meta > 0) {
    json_t *m = json_object();
    if (!m || json_object_set_new(root, "__metadata__", m) < 0) goto nomem_rc;
    for (int i = 0; i < n_meta; i++)
      if (json_object_set_new(m, meta[2 * i], json_string(meta[2 * i + 1])) < 0) goto nomem_rc;
  }
  for (int i = 0; i < n; i++) {
    size_t numel = 1;
    json_t *shape = json_array(), *t = json_object();
    for (int d = 0; d < e[i].ndim; d++) {
      numel *= (size_t)e[i].shape[d];
      json_array_append_new(shape, json_integer(e[i].shape[d]));
    }
    if (e[i].transpose && e[i].ndim != 2) {
      json_decref(shape);
      json_decref(t);
      rc = -EINVAL;
      snprintf(err, errlen, "%s: tensor %s: only 2-D tensors can be transposed", path, e[i].name);
      goto out;
    }
    json_object_set_new(t, "dtype", json_string("F32"));
    json_object_set_new(t, "shape", shape);
    json_object_set_new(t, "data_offsets",
                        json_pack("[II]", (json_int_t)off, (json_int_t)(off + numel * 4)));
    if (json_object_set_new(root, e[i].name, t) < 0) goto nomem_rc;
    off += numel * 4;
    if (e[i].transpose && (size_t)e[i].shape[1] > row_cap) row_cap = (size_t)e[i].shape[1];
  }
  hdr = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
  row = malloc((row_cap ? row_cap : 1) * sizeof(float));
  if (!hdr || !row) goto nomem_rc;
  size_t hl = strlen(hdr), padded = (hl + 7) / 8 * 8;
  fp = fopen(tmp, "wb");
  if (!fp) {
    rc = -errno;
    snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
    goto out;
  }
  uint8_t lenb[8];
  for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)((uint64_t)padded >> (8 * i));
  int ok = fwrite(lenb, 1, 8, fp) == 8 && fwrite(hdr, 1, hl, fp) == hl;
  for (size_t i = hl; ok && i < padded; i++) ok = fputc(' ', fp) != EOF;
  for (int i = 0; ok && i < n; i++) {
    if (!e[i].transpose) {
      size_t numel = 1;
      for (int d = 0; d < e[i].ndim; d++) numel *= (size_t)e[i].shape[d];
      ok = fwrite(e[i].data, sizeof(float), numel, fp) == numel;
      continue;
    }
    size_t R = (size_t)e[i].shape[0], C = (size_t)e[i].shape[1];
    float *r = (float *)row;
    for (size_t a = 0; ok && a < R; a++) {
      for (size_t b = 0; b < C; b++) r[b] = e[i].data[b * R + a];
      ok = fwrite(r, sizeof(float), C, fp) == C;
    }
  }
  if (!ok || fflush(fp) != 0 || fsync(fileno(fp)) != 0) {
    rc = errno ? -errno : -EIO;
    snprintf(err, errlen, "%s: write: %s", tmp, strerror(-rc));
    goto out;
  }
  if (fclose(fp) != 0) {
    fp = NULL;
    rc = -errno;
    snprintf(err, errlen, "%s: close: %s", tmp, strerror(errno));
    goto out;
  }
  fp = NULL;
  if (rename(tmp, path) < 0) {
    rc = -errno;
    snprintf(err, errlen, "rename %s -> %s: %s", tmp, path, strerror(errno));
    goto out;
  }
  rc = fsync_dir_of(path);
  if (rc < 0) snprintf(err, errlen, "%s: fsync of its directory: %s", path, strerror(-rc));
  goto out;
nomem_rc:
  rc = -ENOMEM;
nomem:
  snprintf(err, errlen, "%s: out of memory", path);
out:
  if (fp) fclose(fp);
  if (rc < 0 && tmp) unlink(tmp);
  json_decref(root);
  free(hdr);
  free(row);
  free(tmp);
  return rc;
}
