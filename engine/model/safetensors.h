/* safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian header
 * length, a JSON header {"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
 * "__metadata__": {...}}, then the raw little-endian data. The reader reads the header and
 * checks every entry against the file before any data is read, then reads a tensor at a time
 * (pread), so it holds no more of the file than the caller asks for; F32, BF16 and F16 convert
 * to fp32. The writer writes F32 or BF16 (rounded to nearest even, as the kernels' dtype.h
 * does) from fp32 data, to a temporary file that is fsynced and renamed into place: the header
 * first, from the tensors' names, dtypes and shapes, then each tensor's data at its place, in
 * any order and in pieces, so that a caller can write a file much larger than its memory. */
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

/* Opens and validates path: header length within the file, JSON header, known dtypes, shapes,
 * offsets inside the data section, sizes matching shape x dtype, no two tensors overlapping. */
int zt_st_open(zt_st_file **f, const char *path, char *err, size_t errlen);
void zt_st_close(zt_st_file *f);

int zt_st_count(const zt_st_file *f);
/* The path it was opened with. */
const char *zt_st_path(const zt_st_file *f);
const zt_st_tensor *zt_st_tensor_at(const zt_st_file *f, int i);
/* The tensor called name, or NULL. */
const zt_st_tensor *zt_st_find(const zt_st_file *f, const char *name);

/* What zt_st_read_f32 converts or transposes through: at most this many bytes of the file at a
 * time, converted on several threads (engine/base/pio.h); F32 data read as it lies goes
 * straight into dst, as several pieces in flight. The checkpoint's memory bound counts it
 * (engine/train/checkpoint/state.c; its tests hold the bound below a flat copy of a small model). */
#define ZT_ST_CHUNK_BYTES ((size_t)1 << 20)

/* Converts tensor t to fp32 into dst (t->numel floats). With transpose, t must be 2-D (R, C) and
 * dst receives the (C, R) transpose. -EINVAL for dtypes that are not F32/BF16/F16, -EIO (or the
 * read's error) when the file does not hold the data its header promised. */
int zt_st_read_f32(const zt_st_file *f, const zt_st_tensor *t, float *dst, int transpose,
                   char *err, size_t errlen);
/* Elements [first, first + n) of tensor t, in the file's order, converted to fp32 into dst (n
 * floats); -EINVAL for a range outside the tensor or a dtype zt_st_read_f32 refuses. */
int zt_st_read_f32_range(const zt_st_file *f, const zt_st_tensor *t, size_t first, size_t n,
                         float *dst, char *err, size_t errlen);
/* The same, and *sum (unless NULL) the checksum of the tensor's bytes as they lie in the file
 * (engine/base/checksum.h), summed as they are read. */
int zt_st_read_f32_sum(const zt_st_file *f, const zt_st_tensor *t, float *dst, int transpose,
                       uint64_t *sum, char *err, size_t errlen);
/* Asks the kernel to start reading tensor t's bytes into the page cache now (posix_fadvise
 * WILLNEED), so that the disk works on them while the caller converts or copies what it read
 * before; nothing is read into the caller's memory, and a failure is ignored. */
void zt_st_willneed(const zt_st_file *f, const zt_st_tensor *t);
/* The checksum of tensor t's bytes in the file, read a chunk at a time (nothing converted). */
int zt_st_sum(const zt_st_file *f, const zt_st_tensor *t, uint64_t *sum, char *err,
              size_t errlen);

typedef struct zt_st_entry {
  const char *name;
  int ndim;
  int64_t shape[ZT_ST_MAX_DIM];   /* as written to the file */
  const float *data;
  int transpose;                  /* 2-D only: data holds (shape[1], shape[0]), written transposed */
  zt_st_dtype dtype;              /* as stored: ZT_ST_F32 (0 too) or ZT_ST_BF16 */
} zt_st_entry;

/* Writes n tensors (F32, or BF16 where the entry says) to path (via path.tmp, fsync, rename). metadata: NULL or string pairs
 * meta[0]=key, meta[1]=value, ... n_meta pairs, stored under "__metadata__". The data follows
 * the header in the entries' order. */
int zt_st_write(const char *path, const zt_st_entry *e, int n, const char *const *meta,
                int n_meta, char *err, size_t errlen);

/* zt_st_write in pieces, for data that is not all in memory at once; the file is the one
 * zt_st_write makes of the same entries, byte for byte. open creates path.tmp and writes the
 * header of the n entries (their names, dtypes and shapes; data and transpose are not used);
 * put writes entry i's data (fp32), already in the file's layout (shape[0] rows of shape[1] for
 * a 2-D entry), at its place, converted to the entry's dtype; put_range writes its elements
 * [first, first + n) alone (each element once); finish checks that every element of every entry
 * was put, fsyncs, renames to path and fsyncs the directory; close frees the writer and, unless
 * finished, removes path.tmp. The writer holds no data of its own but, for BF16, a bounded
 * conversion buffer. */
typedef struct zt_st_writer zt_st_writer;
int zt_st_writer_open(zt_st_writer **w, const char *path, const zt_st_entry *e, int n,
                      const char *const *meta, int n_meta, char *err, size_t errlen);
int zt_st_writer_put(zt_st_writer *w, int i, const float *data, char *err, size_t errlen);
int zt_st_writer_put_range(zt_st_writer *w, int i, size_t first, size_t n, const float *data,
                           char *err, size_t errlen);
int zt_st_writer_finish(zt_st_writer *w, char *err, size_t errlen);
/* Entry i's checksum (engine/base/checksum.h) of the bytes put, once put. */
uint64_t zt_st_writer_sum(const zt_st_writer *w, int i);
void zt_st_writer_close(zt_st_writer *w);

#endif
