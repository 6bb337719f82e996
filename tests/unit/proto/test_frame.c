/* Framing: header encode/decode, the size limit checked before the body, the incremental reader
 * fed in one chunk and byte by byte, several frames in one buffer, empty frames. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "proto/zt_proto.h"
#include "tests/unit/proto/check.h"

static void test_header(void) {
  uint8_t h[4];
  uint32_t n = 0;
  zt_proto_error err;
  zt_frame_header_encode(h, 0x01020304);
  CHECK(h[0] == 1 && h[1] == 2 && h[2] == 3 && h[3] == 4);
  CHECK(zt_frame_header_decode(h, 0x01020304, &n, &err) == 0 && n == 0x01020304);
  CHECK(zt_frame_header_decode(h, 0x01020303, &n, &err) == -EMSGSIZE);
  CHECK(err.code == -EMSGSIZE && strstr(err.message, "16909060"));
  zt_frame_header_encode(h, 0);
  CHECK(zt_frame_header_decode(h, 100, &n, &err) == -EINVAL);
}

/* A frame holding the bytes 0..len-1. */
static uint8_t *make_frame(uint32_t len) {
  uint8_t *f = malloc(4 + len);
  zt_frame_header_encode(f, len);
  for (uint32_t i = 0; i < len; i++) f[4 + i] = (uint8_t)i;
  return f;
}

static void test_reader_chunks(void) {
  zt_frame_reader r;
  zt_proto_error err;
  size_t used;
  uint32_t len;
  uint8_t *f = make_frame(300);
  zt_frame_reader_init(&r, 1000);
  CHECK(zt_frame_reader_feed(&r, f, 304, &used, &err) == 1 && used == 304);
  const uint8_t *body = zt_frame_reader_body(&r, &len);
  CHECK(body && len == 300 && memcmp(body, f + 4, 300) == 0);
  zt_frame_reader_reset(&r);
  CHECK(zt_frame_reader_body(&r, &len) == NULL && len == 0);

  /* byte by byte: incomplete until the last byte */
  int rc = 0;
  for (size_t i = 0; i < 304; i++) {
    rc = zt_frame_reader_feed(&r, f + i, 1, &used, &err);
    CHECK(used == 1);
    CHECK(rc == (i == 303 ? 1 : 0));
  }
  body = zt_frame_reader_body(&r, &len);
  CHECK(body && len == 300 && memcmp(body, f + 4, 300) == 0);
  zt_frame_reader_reset(&r);

  /* two frames in one buffer: the reader stops after the first */
  uint8_t two[608];
  memcpy(two, f, 304);
  memcpy(two + 304, f, 304);
  two[308] = 0xaa; /* the second body differs */
  CHECK(zt_frame_reader_feed(&r, two, sizeof two, &used, &err) == 1 && used == 304);
  /* feeding again before reset consumes nothing */
  size_t used2;
  CHECK(zt_frame_reader_feed(&r, two + used, sizeof two - used, &used2, &err) == 1 && used2 == 0);
  zt_frame_reader_reset(&r);
  CHECK(zt_frame_reader_feed(&r, two + used, sizeof two - used, &used2, &err) == 1 && used2 == 304);
  body = zt_frame_reader_body(&r, &len);
  CHECK(body && body[0] == 0xaa && len == 300);
  zt_frame_reader_close(&r);
  free(f);
}

static void test_reader_limits(void) {
  zt_frame_reader r;
  zt_proto_error err;
  size_t used;
  uint8_t h[4];
  /* 4 GiB - 1 announced: refused on the header, before any body allocation */
  zt_frame_reader_init(&r, ZT_PROTO_FRAME_MAX_DEFAULT);
  zt_frame_header_encode(h, UINT32_MAX);
  CHECK(zt_frame_reader_feed(&r, h, 4, &used, &err) == -EMSGSIZE);
  CHECK(r.body == NULL);
  /* the stream has lost its framing: the reader keeps refusing */
  CHECK(zt_frame_reader_feed(&r, h, 4, &used, &err) < 0 && used == 0);
  zt_frame_reader_close(&r);

  zt_frame_reader_init(&r, 100);
  zt_frame_header_encode(h, 0);
  CHECK(zt_frame_reader_feed(&r, h, 4, &used, &err) == -EINVAL);
  CHECK(strstr(err.message, "empty") != NULL);
  zt_frame_reader_close(&r);

  /* exactly the maximum is fine */
  zt_frame_reader_init(&r, 300);
  uint8_t *f = make_frame(300);
  CHECK(zt_frame_reader_feed(&r, f, 304, &used, &err) == 1);
  zt_frame_reader_close(&r);
  free(f);

  /* an empty feed is harmless */
  zt_frame_reader_init(&r, 300);
  CHECK(zt_frame_reader_feed(&r, NULL, 0, &used, &err) == 0 && used == 0);
  zt_frame_reader_close(&r);
}

int main(void) {
  test_header();
  test_reader_chunks();
  test_reader_limits();
  return TEST_DONE();
}
