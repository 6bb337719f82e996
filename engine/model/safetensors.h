/* safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian header
 * length, a JSON header {"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
 * "__metadata__": {...}}, then the raw little-endian data. The reader maps the file and checks
 * every entry against the file before anything is read; F32, BF16 and F16 convert to fp32. The
 * writer writes F32 only, to a temporary file that is fsynced and renamed into place. */
#ifndef ZT_MODEL_SAFETENSORS_H
#define ZT_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ZT_ST_MAX_DIM 8

typedef enum zt_st_dtype {
  ZT_ST_F32 = 1, ZT_ST_F16, ZT_ST_BF16,
  /* recognised (sizes are checked) but not convertible to fp32 */
  ZT_ST_F64, ZT_ST_I64, ZT_ST_I32, ZT_ST_I16, ZT_ST_I8, ZT_ST_U64, ZT_ST_U32, ZT_ST_U16,
  ZT_ST_U8, ZT_ST_BOOL, ZT_ST_F8_E4M3, ZT_ST_F8_E5M2,
} zt_st_dtype;

typedef struct zt_st_tensor {
  const char *name;     /* owned by the file handle */
  zt_st_dtype dtype;
  int ndim;
  int64_t shape[ZT_ST_MAX_DIM];
  size_t numel;
  size_t begin, end;    /* byte range inside the data section */
} zt_st_tensor;

typedef struct zt_st_file zt_st_file;

/* Maps and validates path: header length within the file, JSON header, known dtypes, shapes,
 * offsets inside the data section, sizes matching shape x dtype, no two tensors overlapping. */
int zt_st_open(zt_st_file **f, const char *path, char *err, size_t errlen);
void zt_st_close(zt_st_file *f);

int zt_st_count(const zt_st_file *f);
const zt_st_tensor *zt_st_tensor_at(const zt_st_file *f, int i);
/* The tensor called name, or NULL. */
const zt_st_tensor *zt_st_find(const zt_st_file *f, const char *name);

/* Converts tensor t to fp32 into dst (t->numel floats). With transpose, t must be 2-D (R, C) and
 * dst receives the (C, R) transpose. -EINVAL for dtypes that are not F32/BF16/F16. */
int zt_st_read_f32(const zt_st_file *f, const zt_st_tensor *t, float *dst, int transpose,
                   char *err, size_t errlen);

typedef struct zt_st_entry {
  const char *name;
  int ndim;
  int64_t shape[ZT_ST_MAX_DIM];   /* as written to the file */
  const float *data;
  int transpose;                  /* 2-D only: data holds (shape[1], shape[0]), written transposed */
} zt_st_entry;

/* Writes n F32 tensors to path (via path.tmp, fsync, rename). metadata: NULL or string pairs
 * meta[0]=key, meta[1]=value, ... n_meta pairs, stored under "__metadata__". */
int zt_st_write(const char *path, const zt_st_entry *e, int n, const char *const *meta,
                int n_meta, char *err, size_t errlen);

#endif
