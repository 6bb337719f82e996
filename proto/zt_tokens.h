/* Token files: the data format shared by `ztctl tokenize` (writer) and ztd's file data source
 * (reader). Layout (little-endian):
 *   bytes 0..7   magic "ZTTOKENS"
 *   bytes 8..11  u32 format version (1)
 *   bytes 12..15 u32 bytes per token (2 or 4)
 *   bytes 16..19 u32 vocabulary size (every token is < vocab)
 *   bytes 20..23 u32 reserved, 0
 *   bytes 24..   the tokens, unsigned, back to back; the count is (file size - 24) / bytes per token
 * docs/spec.md documents it for users. */
#ifndef ZT_TOKENS_H
#define ZT_TOKENS_H

#include <errno.h>
#include <stdint.h>
#include <string.h>

#define ZT_TOKENS_MAGIC "ZTTOKENS"
#define ZT_TOKENS_VERSION 1u
#define ZT_TOKENS_HEADER_BYTES 24

typedef struct zt_tokens_header {
  uint32_t version;
  uint32_t token_bytes;
  uint32_t vocab;
} zt_tokens_header;

static inline void zt__put_le32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}
static inline uint32_t zt__get_le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void zt_tokens_header_encode(uint8_t out[ZT_TOKENS_HEADER_BYTES],
                                           const zt_tokens_header *h) {
  memcpy(out, ZT_TOKENS_MAGIC, 8);
  zt__put_le32(out + 8, h->version);
  zt__put_le32(out + 12, h->token_bytes);
  zt__put_le32(out + 16, h->vocab);
  zt__put_le32(out + 20, 0);
}

/* 0, or -EINVAL for a bad magic, version or token width. */
static inline int zt_tokens_header_decode(const uint8_t in[ZT_TOKENS_HEADER_BYTES],
                                          zt_tokens_header *h) {
  if (memcmp(in, ZT_TOKENS_MAGIC, 8) != 0) return -EINVAL;
  h->version = zt__get_le32(in + 8);
  h->token_bytes = zt__get_le32(in + 12);
  h->vocab = zt__get_le32(in + 16);
  if (h->version != ZT_TOKENS_VERSION) return -EINVAL;
  if (h->token_bytes != 2 && h->token_bytes != 4) return -EINVAL;
  if (h->vocab == 0) return -EINVAL;
  return 0;
}

#endif
