/* Token files: the data format shared by its writers (`ztctl tokenize`, `ztctl pack`, the Python
 * binding's write_tokens) and ztd's file data source (reader). Layout (little-endian):
 *   bytes 0..7   magic "ZTTOKENS"
 *   bytes 8..11  u32 format version (1 or 2)
 *   bytes 12..15 u32 bytes per token (2 or 4)
 *   bytes 16..19 u32 vocabulary size (every token is < vocab)
 *   bytes 20..23 u32 reserved, 0
 * Version 1: bytes 24.. the tokens, unsigned, back to back; the count is (file size - 24) / bytes
 * per token; one document, every token a target.
 * Version 2 (documents and a loss mask; every section starts on 8 bytes, so a mapped file is
 * read in place, and the file's size is fixed by its counts, so a truncated table is found by
 * one fstat):
 *   bytes 24..31 u64 n_tokens
 *   bytes 32..39 u64 n_docs (>= 1)
 *   bytes 40..47 u64 reserved, 0
 *   bytes 48..   the tokens, zero-padded to a multiple of 8 bytes
 *   then         the mask, ceil(n_tokens / 8) bytes, zero-padded to a multiple of 8: bit (i % 8)
 *                of byte i / 8 set = token i counts in the loss as a target (the writers clear
 *                it at each document's first token, which nothing predicts)
 *   then         n_docs + 1 u64 document starts: document d is tokens [starts[d], starts[d+1]),
 *                starts[0] = 0, strictly increasing, starts[n_docs] = n_tokens
 * docs/spec.md documents it for users. */
#ifndef ZT_TOKENS_H
#define ZT_TOKENS_H

#include <errno.h>
#include <stdint.h>
#include <string.h>

#define ZT_TOKENS_MAGIC "ZTTOKENS"
#define ZT_TOKENS_VERSION 1u
#define ZT_TOKENS_VERSION_DOCS 2u
#define ZT_TOKENS_HEADER_BYTES 24
#define ZT_TOKENS_V2_HEADER_BYTES 48

typedef struct zt_tokens_header {
  uint32_t version;
  uint32_t token_bytes;
  uint32_t vocab;
  uint64_t n_tokens, n_docs; /* version 2 */
} zt_tokens_header;

/* Where a version 2 file's sections lie, from its counts; size is the whole file's. */
typedef struct zt_tokens_layout {
  uint64_t tokens, mask, starts, size;
} zt_tokens_layout;

static inline void zt__put_le32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}
static inline uint32_t zt__get_le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline void zt__put_le64(uint8_t *p, uint64_t v) {
  zt__put_le32(p, (uint32_t)v);
  zt__put_le32(p + 4, (uint32_t)(v >> 32));
}
static inline uint64_t zt__get_le64(const uint8_t *p) {
  return (uint64_t)zt__get_le32(p) | (uint64_t)zt__get_le32(p + 4) << 32;
}

static inline uint64_t zt__tokens_pad8(uint64_t n) { return (n + 7) & ~(uint64_t)7; }

/* -EOVERFLOW for counts whose file would not fit in 64 bits. */
static inline int zt_tokens_layout_of(const zt_tokens_header *h, zt_tokens_layout *l) {
  if (h->n_tokens > (UINT64_MAX >> 4) || h->n_docs > (UINT64_MAX >> 5)) return -EOVERFLOW;
  l->tokens = ZT_TOKENS_V2_HEADER_BYTES;
  l->mask = l->tokens + zt__tokens_pad8(h->n_tokens * h->token_bytes);
  l->starts = l->mask + zt__tokens_pad8((h->n_tokens + 7) / 8);
  l->size = l->starts + (h->n_docs + 1) * 8;
  return 0;
}

/* Writes the header: ZT_TOKENS_HEADER_BYTES for version 1, ZT_TOKENS_V2_HEADER_BYTES for 2. */
static inline void zt_tokens_header_encode(uint8_t *out, const zt_tokens_header *h) {
  memcpy(out, ZT_TOKENS_MAGIC, 8);
  zt__put_le32(out + 8, h->version);
  zt__put_le32(out + 12, h->token_bytes);
  zt__put_le32(out + 16, h->vocab);
  zt__put_le32(out + 20, 0);
  if (h->version == ZT_TOKENS_VERSION_DOCS) {
    zt__put_le64(out + 24, h->n_tokens);
    zt__put_le64(out + 32, h->n_docs);
    zt__put_le64(out + 40, 0);
  }
}

/* The first ZT_TOKENS_HEADER_BYTES: 0, or -EINVAL for a bad magic, version or token width. A
 * version 2 header then needs zt_tokens_header_decode_v2 on its first 48 bytes. */
static inline int zt_tokens_header_decode(const uint8_t *in, zt_tokens_header *h) {
  if (memcmp(in, ZT_TOKENS_MAGIC, 8) != 0) return -EINVAL;
  h->version = zt__get_le32(in + 8);
  h->token_bytes = zt__get_le32(in + 12);
  h->vocab = zt__get_le32(in + 16);
  h->n_tokens = h->n_docs = 0;
  if (h->version != ZT_TOKENS_VERSION && h->version != ZT_TOKENS_VERSION_DOCS) return -EINVAL;
  if (h->token_bytes != 2 && h->token_bytes != 4) return -EINVAL;
  if (h->vocab == 0) return -EINVAL;
  return 0;
}

/* Version 2's counts from bytes 24..47: 0, or -EINVAL (no document, a reserved field set). */
static inline int zt_tokens_header_decode_v2(const uint8_t *in, zt_tokens_header *h) {
  h->n_tokens = zt__get_le64(in + 24);
  h->n_docs = zt__get_le64(in + 32);
  if (h->n_docs == 0 || h->n_docs > h->n_tokens || zt__get_le64(in + 40) != 0) return -EINVAL;
  return 0;
}

#endif
