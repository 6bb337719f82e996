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

uint64_t zt__token_file_doc_start(const zt__token_file *f, uint64_t d) {
  if (f->version == ZT_TOKENS_VERSION) return d ? f->n_tokens : 0;
  return zt__get_le64(f->map + f->starts_at + 8 * d);
}

int32_t zt__token_file_token(const zt__token_file *f, uint64_t i) {
  const uint8_t *p = f->map + f->tokens_at + i * f->token_bytes;
  /* Token ids are < vocab <= INT32_MAX in practice; a larger id wraps negative and the
   * trainer refuses it as out of range rather than training on garbage. */
  return f->token_bytes == 2 ? (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8)
                             : (int32_t)zt__get_le32(p);
}

int zt__token_file_counted(const zt__token_file *f, uint64_t i) {
  if (f->version == ZT_TOKENS_VERSION) return 1;
  return f->map[f->mask_at + i / 8] >> (i % 8) & 1;
}

/* The document table (starts[0] = 0, increasing, the last = n_tokens) and every token below
 * the file's vocabulary: one pass at admission, naming the first index that is wrong. */
static int check_v2(const zt__token_file *f, const char *field, const char *path, char *err,
                    size_t errlen) {
  uint64_t prev = zt__token_file_doc_start(f, 0);
  if (prev != 0) {
    snprintf(err, errlen, "%s: %s: document table: document 0 does not start at token 0",
             field, path);
    return -EINVAL;
  }
  for (uint64_t d = 1; d <= f->n_docs; d++) {
    uint64_t s = zt__token_file_doc_start(f, d);
    if (s <= prev || s > f->n_tokens || (d == f->n_docs && s != f->n_tokens)) {
      snprintf(err, errlen, "%s: %s: document table: entry %llu is not between the "
               "previous start and the token count %llu (a document is never empty)", field, path,
               (unsigned long long)d, (unsigned long long)f->n_tokens);
      return -EINVAL;
    }
    for (uint64_t i = prev; i < s; i++)
      if ((uint32_t)zt__token_file_token(f, i) >= f->vocab) {
        snprintf(err, errlen, "%s: %s: document %llu, token %llu (index %llu of the "
                 "file) is not below the file's vocabulary %u", field, path,
                 (unsigned long long)(d - 1), (unsigned long long)(i - prev),
                 (unsigned long long)i, f->vocab);
        return -EINVAL;
      }
    prev = s;
  }
  return 0;
}

int zt__token_file_open(zt__token_file *f, const char *field, const char *path, int map,
                        const zt_path_roots *roots, char *err, size_t errlen) {
  int rc = 0;
  memset(f, 0, sizeof *f);
  if ((rc = zt_path_open(field, path, 0, roots, &f->fd, NULL, 0, err, errlen)) < 0)
    goto out;
  struct stat st;
  if (fstat(f->fd, &st) != 0) {
    rc = -errno;
    snprintf(err, errlen, "%s: %s: %s", field, path, strerror(errno));
    goto out;
  }
  uint8_t hdr[ZT_TOKENS_V2_HEADER_BYTES];
  ssize_t n = pread(f->fd, hdr, sizeof hdr, 0);
  if (n < 0) {
    rc = -errno;
    snprintf(err, errlen, "%s: %s: %s", field, path, strerror(errno));
    goto out;
  }
  zt_tokens_header h;
  if ((size_t)n < ZT_TOKENS_HEADER_BYTES || zt_tokens_header_decode(hdr, &h) != 0) {
    rc = -EINVAL;
    snprintf(err, errlen, "%s: %s: not a token file (bad header; see docs/spec.md)", field,
             path);
    goto out;
  }
  f->version = h.version;
  f->token_bytes = h.token_bytes;
  f->vocab = h.vocab;
  if (h.version == ZT_TOKENS_VERSION) {
    uint64_t body = (uint64_t)st.st_size - ZT_TOKENS_HEADER_BYTES;
    if (body % h.token_bytes != 0) {
      rc = -EINVAL;
      snprintf(err, errlen, "%s: %s: truncated (its tokens are not a whole number of "
               "%u-byte tokens)", field, path, h.token_bytes);
      goto out;
    }
    f->n_tokens = body / h.token_bytes;
    f->n_docs = 1;
    f->tokens_at = ZT_TOKENS_HEADER_BYTES;
  } else {
    zt_tokens_layout l;
    if ((size_t)n < sizeof hdr || zt_tokens_header_decode_v2(hdr, &h) != 0 ||
        zt_tokens_layout_of(&h, &l) != 0) {
      rc = -EINVAL;
      snprintf(err, errlen, "%s: %s: not a token file (bad version 2 header; see "
               "docs/spec.md)", field, path);
      goto out;
    }
    if ((uint64_t)st.st_size != l.size) {
      rc = -EINVAL;
      snprintf(err, errlen, "%s: %s: truncated or padded: its header's %llu tokens and "
               "%llu documents make a file of %llu bytes, not %llu", field, path,
               (unsigned long long)h.n_tokens, (unsigned long long)h.n_docs,
               (unsigned long long)l.size, (unsigned long long)st.st_size);
      goto out;
    }
    f->n_tokens = h.n_tokens;
    f->n_docs = h.n_docs;
    f->tokens_at = l.tokens;
    f->mask_at = l.mask;
    f->starts_at = l.starts;
  }
  /* version 2's tables are checked here, at admission, so that sampling trusts them */
  if (map || h.version == ZT_TOKENS_VERSION_DOCS) {
    f->map_len = (size_t)st.st_size;
    void *p = mmap(NULL, f->map_len, PROT_READ, MAP_PRIVATE, f->fd, 0);
    if (p == MAP_FAILED) {
      rc = -errno;
      snprintf(err, errlen, "%s: %s: mmap: %s", field, path, strerror(errno));
      f->map_len = 0;
      goto out;
    }
    f->map = p;
  }
  if (h.version == ZT_TOKENS_VERSION_DOCS && (rc = check_v2(f, field, path, err, errlen)) < 0)
    goto out;
  if (!map && f->map) {
    munmap((void *)f->map, f->map_len);
    f->map = NULL;
    f->map_len = 0;
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

void zt__token_file_windows(const zt__token_file *f, uint64_t seed, int step, int micros, int B,
                            int T, const zt__rows *out) {
  uint64_t span = f->n_tokens - (uint64_t)T;
  for (int m = 0; m < micros; m++) {
    for (int b = 0; b < B; b++) {
      uint64_t r = ((uint64_t)(step - 1) * (uint64_t)micros + (uint64_t)m) * (uint64_t)B +
                   (uint64_t)b;
      uint64_t start = zt__splitmix64(seed ^ (r * 0x9E3779B97F4A7C15ull)) % span;
      size_t at = ((size_t)m * (size_t)B + (size_t)b) * (size_t)T;
      for (int t = 0; t < T; t++) {
        uint64_t i = start + (uint64_t)t;
        out->inputs[at + t] = zt__token_file_token(f, i);
        out->targets[at + t] = zt__token_file_counted(f, i + 1) ? zt__token_file_token(f, i + 1)
                                                                : -1;
        out->positions[at + t] = t;
      }
    }
  }
}

uint64_t zt__token_file_epoch_rows(const zt__token_file *f, int T) {
  return (f->n_tokens - 1) / (uint64_t)T;
}

void zt__rows_pad_from(uint64_t end, int step, int micros, int B, int T, const zt__rows *out) {
  uint64_t n = (uint64_t)micros * (uint64_t)B, r0 = (uint64_t)(step - 1) * n;
  for (uint64_t i = end > r0 ? end - r0 : 0; i < n; i++)
    for (int t = 0; t < T; t++) {
      size_t s = (size_t)i * (size_t)T + (size_t)t;
      out->inputs[s] = out->targets[s] = -1;
      out->positions[s] = t;
    }
}

void zt__rows_from_pushed(const int32_t *tokens, const uint8_t *marks, int micros, int B, int T,
                          const zt__rows *out) {
  for (size_t r = 0; r < (size_t)micros * (size_t)B; r++) {
    const int32_t *row = tokens + r * (size_t)(T + 1);
    const uint8_t *mk = marks + r * (size_t)(T + 1);
    int32_t pos = 0;
    for (int j = 0; j < T; j++) {
      size_t s = r * (size_t)T + (size_t)j;
      if (j > 0 && (mk[j] & ZT__MARK_START)) pos = 0;
      out->inputs[s] = row[j];
      out->targets[s] =
          (mk[j + 1] & ZT__MARK_COUNTED) && !(mk[j + 1] & ZT__MARK_START) ? row[j + 1] : -1;
      out->positions[s] = pos++;
    }
  }
}

int zt__batch_ring_init(zt__batch_ring *r, uint32_t cap, size_t micro_tokens) {
  memset(r, 0, sizeof *r);
  r->buf = malloc((size_t)cap * micro_tokens * sizeof(int32_t));
  r->marks = malloc((size_t)cap * micro_tokens);
  if (!r->buf || !r->marks) {
    zt__batch_ring_free(r);
    return -ENOMEM;
  }
  r->cap = cap;
  r->micro_tokens = micro_tokens;
  return 0;
}

void zt__batch_ring_free(zt__batch_ring *r) {
  free(r->buf);
  free(r->marks);
  memset(r, 0, sizeof *r);
}

void zt__batch_ring_put(zt__batch_ring *r, const int32_t *tokens, const uint8_t *marks) {
  uint32_t slot = (r->head + r->count) % r->cap;
  memcpy(r->buf + (size_t)slot * r->micro_tokens, tokens, r->micro_tokens * sizeof(int32_t));
  memcpy(r->marks + (size_t)slot * r->micro_tokens, marks, r->micro_tokens);
  r->count++;
}

void zt__batch_ring_take(zt__batch_ring *r, int32_t *tokens, uint8_t *marks) {
  memcpy(tokens, r->buf + (size_t)r->head * r->micro_tokens, r->micro_tokens * sizeof(int32_t));
  memcpy(marks, r->marks + (size_t)r->head * r->micro_tokens, r->micro_tokens);
  r->head = (r->head + 1) % r->cap;
  r->count--;
}
