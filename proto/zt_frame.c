/* Framing: a 4-byte big-endian body length, then the body. The length is checked against the
 * maximum before any body memory is taken, so a hostile header costs nothing. */
#include "proto/zt_proto.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void zt_frame_header_encode(uint8_t hdr[ZT_PROTO_HEADER_BYTES], uint32_t body_len) {
  hdr[0] = (uint8_t)(body_len >> 24);
  hdr[1] = (uint8_t)(body_len >> 16);
  hdr[2] = (uint8_t)(body_len >> 8);
  hdr[3] = (uint8_t)body_len;
}

int zt_frame_header_decode(const uint8_t hdr[ZT_PROTO_HEADER_BYTES], uint32_t max_frame,
                           uint32_t *body_len, zt_proto_error *err) {
  uint32_t n = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
  if (n == 0) return zt_proto_error_set(err, -EINVAL, "empty frame (length 0)");
  if (n > max_frame)
    return zt_proto_error_set(err, -EMSGSIZE, "frame of %u bytes exceeds the maximum of %u bytes",
                              n, max_frame);
  *body_len = n;
  return 0;
}

void zt_frame_reader_init(zt_frame_reader *r, uint32_t max_frame) {
  memset(r, 0, sizeof *r);
  r->max_frame = max_frame;
}

int zt_frame_reader_feed(zt_frame_reader *r, const uint8_t *data, size_t len, size_t *consumed,
                         zt_proto_error *err) {
  size_t used = 0;
  int rc = 0;
  if (r->hdr_have == ZT_PROTO_HEADER_BYTES && !r->body) {
    /* an earlier header was refused: the stream has no frame boundary any more */
    rc = zt_proto_error_set(err, -EPROTO, "framing lost after a refused frame header");
    goto out;
  }
  if (r->body && r->body_have == r->body_len) {
    rc = 1; /* a whole frame is still waiting for zt_frame_reader_reset */
    goto out;
  }
  if (len == 0) goto out;
  if (r->hdr_have < ZT_PROTO_HEADER_BYTES) {
    size_t want = ZT_PROTO_HEADER_BYTES - r->hdr_have;
    size_t take = len < want ? len : want;
    memcpy(r->hdr + r->hdr_have, data, take);
    r->hdr_have += (uint32_t)take;
    used += take;
    if (r->hdr_have < ZT_PROTO_HEADER_BYTES) goto out;
    rc = zt_frame_header_decode(r->hdr, r->max_frame, &r->body_len, err);
    if (rc < 0) goto out;
    r->body = malloc(r->body_len);
    if (!r->body) {
      rc = zt_proto_error_set(err, -ENOMEM, "cannot allocate a frame of %u bytes", r->body_len);
      goto out;
    }
    r->body_have = 0;
  }
  size_t want = r->body_len - r->body_have;
  size_t take = len - used < want ? len - used : want;
  memcpy(r->body + r->body_have, data + used, take);
  r->body_have += (uint32_t)take;
  used += take;
  rc = r->body_have == r->body_len;
out:
  *consumed = used;
  return rc;
}

const uint8_t *zt_frame_reader_body(const zt_frame_reader *r, uint32_t *len) {
  if (r->hdr_have < ZT_PROTO_HEADER_BYTES || !r->body || r->body_have != r->body_len) {
    *len = 0;
    return NULL;
  }
  *len = r->body_len;
  return r->body;
}

void zt_frame_reader_reset(zt_frame_reader *r) {
  free(r->body);
  r->body = NULL;
  r->hdr_have = 0;
  r->body_len = 0;
  r->body_have = 0;
}

void zt_frame_reader_close(zt_frame_reader *r) { zt_frame_reader_reset(r); }
