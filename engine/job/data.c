#include "engine/job/data.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "engine/base/path.h"
#include "proto/zt_tokens.h"

int zt__token_file_open(zt__token_file *f, const char *path, int map, const zt_path_roots *roots,
                        char *err, size_t errlen) {
  int rc = 0;
  memset(f, 0, sizeof *f);
  if ((rc = zt_path_open("data.path", path, 0, roots, &f->fd, NULL, 0, err, errlen)) < 0)
    goto out;
  struct stat st;
  if (fstat(f->fd, &st) != 0) {
    rc = -errno;
    snprintf(err, errlen, "data.path: %s: %s", path, strerror(errno));
    goto out;
  }
  uint8_t hdr[ZT_TOKENS_HEADER_BYTES];
  ssize_t n = pread(f->fd, hdr, sizeof hdr, 0);
  if (n < 0) {
    rc = -errno;
    snprintf(err, errlen, "data.path: %s: %s", path, strerror(errno));
    goto out;
  }
  zt_tokens_header h;
  if ((size_t)n < sizeof hdr || zt_tokens_header_decode(hdr, &h) != 0) {
    rc = -EINVAL;
    snprintf(err, errlen, "data.path: %s: not a token file (bad header; see docs/spec.md)", path);
    goto out;
  }
  uint64_t body = (uint64_t)st.st_size - ZT_TOKENS_HEADER_BYTES;
  if (body % h.token_bytes != 0) {
    rc = -EINVAL;
    snprintf(err, errlen, "data.path: %s: truncated (its tokens are not a whole number of "
             "%u-byte tokens)", path, h.token_bytes);
    goto out;
  }
  f->token_bytes = h.token_bytes;
  f->vocab = h.vocab;
  f->n_tokens = body / h.token_bytes;
  if (map) {
    f->map_len = (size_t)st.st_size;
    void *p = mmap(NULL, f->map_len, PROT_READ, MAP_PRIVATE, f->fd, 0);
    if (p == MAP_FAILED) {
      rc = -errno;
      snprintf(err, errlen, "data.path: %s: mmap: %s", path, strerror(errno));
      f->map_len = 0;
      goto out;
    }
    f->map = p;
  }
out:
  if (rc < 0) zt__token_file_close(f);
  return rc;
}

void zt__token_file_close(zt__token_file *f) {
  if (f->map) munmap((void *)f->map, f->map_len);
  if (f->fd >= 0) close(f->fd);
  memset(f, 0, sizeof *f);
  f->fd = -1;
}

uint64_t zt__splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void zt__token_file_sample(const zt__token_file *f, uint64_t seed, int step, int grad_accum,
                           int B, int T, int32_t *out) {
  const uint8_t *tok = f->map + ZT_TOKENS_HEADER_BYTES;
  uint64_t span = f->n_tokens - (uint64_t)T;
  for (int m = 0; m < grad_accum; m++) {
    for (int b = 0; b < B; b++) {
      uint64_t r = ((uint64_t)(step - 1) * (uint64_t)grad_accum + (uint64_t)m) * (uint64_t)B +
                   (uint64_t)b;
      uint64_t start = zt__splitmix64(seed ^ (r * 0x9E3779B97F4A7C15ull)) % span;
      int32_t *row = out + ((size_t)m * (size_t)B + (size_t)b) * (size_t)(T + 1);
      for (int t = 0; t <= T; t++) {
        const uint8_t *p = tok + (start + (uint64_t)t) * f->token_bytes;
        /* Token ids are < vocab <= INT32_MAX in practice; a larger id wraps negative and the
         * trainer refuses it as out of range rather than training on garbage. */
        row[t] = f->token_bytes == 2 ? (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8)
                                     : (int32_t)zt__get_le32(p);
      }
    }
  }
}

int zt__batch_ring_init(zt__batch_ring *r, uint32_t cap, size_t micro_tokens) {
  memset(r, 0, sizeof *r);
  r->buf = malloc((size_t)cap * micro_tokens * sizeof(int32_t));
  if (!r->buf) return -ENOMEM;
  r->cap = cap;
  r->micro_tokens = micro_tokens;
  return 0;
}

void zt__batch_ring_free(zt__batch_ring *r) {
  free(r->buf);
  memset(r, 0, sizeof *r);
}

void zt__batch_ring_put(zt__batch_ring *r, const int32_t *tokens) {
  uint32_t slot = (r->head + r->count) % r->cap;
  memcpy(r->buf + (size_t)slot * r->micro_tokens, tokens, r->micro_tokens * sizeof(int32_t));
  r->count++;
}

void zt__batch_ring_take(zt__batch_ring *r, int32_t *out) {
  memcpy(out, r->buf + (size_t)r->head * r->micro_tokens, r->micro_tokens * sizeof(int32_t));
  r->head = (r->head + 1) % r->cap;
  r->count--;
}
