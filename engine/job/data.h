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
  uint32_t token_bytes;     /* 2 or 4 */
  uint32_t vocab;           /* from the header: every token is below it */
  uint64_t n_tokens;
} zt__token_file;

/* Opens and checks a token file, a regular file inside roots (NULL: anywhere; engine/base/path.h);
 * map = 1 maps it for sampling. Errors name the path and cause ("data.path: /x.tok: No such file
 * or directory"), never a value read from a file that is not a token file. */
int zt__token_file_open(zt__token_file *f, const char *path, int map, const zt_path_roots *roots,
                        char *err, size_t errlen);
void zt__token_file_close(zt__token_file *f);

uint64_t zt__splitmix64(uint64_t x);
/* The grad_accum micro-batches of optimizer step `step` (1-based), back to back, each B rows of
 * T+1 tokens: row r = ((step-1)*grad_accum + m)*B + b starts at
 * splitmix64(seed ^ (r * 0x9E3779B97F4A7C15)) % (n_tokens - T). Needs n_tokens > T. */
void zt__token_file_sample(const zt__token_file *f, uint64_t seed, int step, int grad_accum,
                           int B, int T, int32_t *out);

/* A fixed ring of micro-batches (the stream job's queue); the caller locks. */
typedef struct zt__batch_ring {
  int32_t *buf;
  size_t micro_tokens;
  uint32_t cap, head, count;
} zt__batch_ring;

int zt__batch_ring_init(zt__batch_ring *r, uint32_t cap, size_t micro_tokens);
void zt__batch_ring_free(zt__batch_ring *r);
/* Copy one micro-batch in (the ring must not be full) / out (must not be empty). */
void zt__batch_ring_put(zt__batch_ring *r, const int32_t *tokens);
void zt__batch_ring_take(zt__batch_ring *r, int32_t *out);

#endif
