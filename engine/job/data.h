/* Where a job's tokens come from: a token file on the daemon's host (proto/zt_tokens.h),
 * sampled statelessly so a resumed job sees exactly the batches it would have seen, or a stream
 * the client pushes into a bounded ring of micro-batches. */
#ifndef ZT_JOB_DATA_H
#define ZT_JOB_DATA_H

#include <stddef.h>
#include <stdint.h>
#include "engine/base/path.h"

typedef struct zt__token_file {
  int fd;
  const uint8_t *map;       /* the whole file, read-only; NULL when opened for checking only */
  size_t map_len;
  uint32_t version;         /* 1 or 2 */
  uint32_t token_bytes;     /* 2 or 4 */
  uint32_t vocab;           /* from the header: every token is below it */
  uint64_t n_tokens;
  uint64_t n_docs;          /* 1 for version 1 */
  uint64_t tokens_at, mask_at, starts_at; /* the sections' offsets (mask and starts: version 2) */
} zt__token_file;

/* Opens and checks a token file, a regular file inside roots (NULL: anywhere; engine/base/path.h);
 * map = 1 maps it for sampling. A version 2 file's document table and tokens are checked here
 * (one pass), so a sampler trusts them. Errors name the spec's field, the path and the cause
 * ("data.path: /x.tok: No such file or directory"), and the index where a table or token is
 * wrong, never a value read from a file that is not a token file. */
int zt__token_file_open(zt__token_file *f, const char *field, const char *path, int map,
                        const zt_path_roots *roots, char *err, size_t errlen);
void zt__token_file_close(zt__token_file *f);
/* Of a mapped file: token i; whether it counts as a target (1 for version 1); the first token
 * of document d (d = n_docs: n_tokens). */
int32_t zt__token_file_token(const zt__token_file *f, uint64_t i);
int zt__token_file_counted(const zt__token_file *f, uint64_t i);
uint64_t zt__token_file_doc_start(const zt__token_file *f, uint64_t d);

uint64_t zt__splitmix64(uint64_t x);

/* A step's rows in zt_batch's planes (engine/train/trainer.h): micros * B * T each. */
typedef struct zt__rows {
  int32_t *inputs, *targets, *positions;
} zt__rows;

/* "windows": the `micros` micro-batches of optimizer step `step` (1-based), each B rows of T
 * slots: row r = ((step-1)*micros + m)*B + b reads the T + 1 tokens from
 * splitmix64(seed ^ (r * 0x9E3779B97F4A7C15)) % (n_tokens - T), positions 0..T-1, a target -1
 * where its token does not count. Needs n_tokens > T. */
void zt__token_file_windows(const zt__token_file *f, uint64_t seed, int step, int micros, int B,
                            int T, const zt__rows *out);

/* "documents": whole documents in an epoch's order fill rows of T slots; a document that does
 * not fit in the rest of a row starts the next; one longer than a row starts a row and is split
 * at row ends, each fragment's positions restarting at 0; the rest of a row is padding (input
 * and target -1). An epoch's order is the file's, or with shuffle a permutation drawn from the
 * seed and the epoch (docs/spec.md); the rows of the epochs follow each other, so a step's rows
 * are a function of the step alone (a resumed job sees the batches it would have). */
typedef struct zt__packer {
  const zt__token_file *f;
  int T, shuffle;
  int epochs;               /* train.epochs: the rows after that many epochs are padding; 0: none */
  uint64_t seed;
  uint64_t *order;          /* the held epoch's documents in order */
  uint64_t *row_k, *row_off; /* each of its rows' first document (index into order), offset */
  uint64_t n_rows, cap_rows;
  uint64_t epoch, epoch_row0; /* the epoch held and its first row */
} zt__packer;

int zt__packer_init(zt__packer *p, const zt__token_file *f, int T, uint64_t seed, int shuffle,
                    int epochs);
/* The host bytes zt__packer_init allocates for a file of n_docs documents and n_tokens tokens
 * (its order and row tables), for the admission's count of a job's host memory. */
size_t zt__packer_bytes(uint64_t n_docs, uint64_t n_tokens, int T);
void zt__packer_close(zt__packer *p);
/* The rows of step `step` (1-based), as windows' numbering: row r = ((step-1)*micros + m)*B + b;
 * with p->epochs, a row past the last epoch's is padding. */
void zt__packer_fill(zt__packer *p, int step, int micros, int B, const zt__rows *out);
/* *rows = the rows of the first `epochs` epochs of a mapped file (train.epochs; each epoch's
 * order drawn, no row tables kept). 0 or -ENOMEM. */
int zt__packer_rows(const zt__token_file *f, int T, uint64_t seed, int shuffle, int epochs,
                    uint64_t *rows);

/* "windows" with train.epochs: an epoch is floor((n_tokens - 1) / T) rows, as many as the
 * file's n_tokens - 1 targets fill at T a row; a step's rows from row `end` (the epochs' rows)
 * on are padding (input and target -1, positions 0..T-1). step 1-based, as
 * zt__token_file_windows. */
uint64_t zt__token_file_epoch_rows(const zt__token_file *f, int T);
void zt__rows_pad_from(uint64_t end, int step, int micros, int B, int T, const zt__rows *out);

/* Held-out evaluation's rows (data.eval), the same at every evaluation: from a cursor zeroed
 * when it starts, the next n_rows rows of T slots in zt__rows's planes. documents: the file's
 * documents in its order packed as above (no shuffle; after the last, the first again);
 * else windows: consecutive, row r (from 0) reading the T + 1 tokens from
 * r * T % (n_tokens - T), its targets as "windows" makes them. No memory beyond the rows. */
typedef struct zt__eval_cursor {
  uint64_t k, off;  /* documents: the next row's document and offset in it */
  uint64_t row;     /* windows: the next row */
} zt__eval_cursor;
void zt__eval_rows(const zt__token_file *f, int documents, int T, zt__eval_cursor *c,
                   size_t n_rows, const zt__rows *out);

/* A pushed token's marks (one byte a token beside the rows of T + 1 tokens): it counts as a
 * target (of the token before it); it starts a document (its row's first token always does). */
#define ZT__MARK_COUNTED 1u
#define ZT__MARK_START 2u

/* Pushed rows of T + 1 tokens and their marks (micros * B rows) in zt_batch's planes: slot j's
 * input is token j, its target token j + 1 where that one counts and starts no document (else
 * -1), its position counts from its document's start. Marks all ZT__MARK_COUNTED: the rows as
 * zt_trainer_step reads them. */
void zt__rows_from_pushed(const int32_t *tokens, const uint8_t *marks, int micros, int B, int T,
                          const zt__rows *out);

/* A fixed ring of micro-batches and their marks (the stream job's queue); the caller locks. */
typedef struct zt__batch_ring {
  int32_t *buf;
  uint8_t *marks;
  size_t micro_tokens;
  uint32_t cap, head, count;
} zt__batch_ring;

int zt__batch_ring_init(zt__batch_ring *r, uint32_t cap, size_t micro_tokens);
void zt__batch_ring_free(zt__batch_ring *r);
/* Copy one micro-batch in (the ring must not be full) / out (must not be empty). */
void zt__batch_ring_put(zt__batch_ring *r, const int32_t *tokens, const uint8_t *marks);
void zt__batch_ring_take(zt__batch_ring *r, int32_t *tokens, uint8_t *marks);

#endif
