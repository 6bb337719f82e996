/* Messages: decode (non-map, trailing bytes, truncated, deep nesting, absurd counts), field
 * accessors and their messages, request parsing, the op and errno tables, encoding helpers. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "proto/zt_proto.h"
#include "tests/unit/proto/check.h"

/* The body of a frame built by zt_out (skips the header). */
static const uint8_t *body_of(zt_out *o, size_t *len) {
  size_t n;
  const uint8_t *f = zt_out_finish(o, &n);
  *len = n - ZT_PROTO_HEADER_BYTES;
  return f + ZT_PROTO_HEADER_BYTES;
}

static void test_decode_shapes(void) {
  zt_msg m;
  zt_proto_error err;
  static const uint8_t arr[] = {0x92, 0x01, 0x02};
  CHECK(zt_msg_decode(&m, arr, sizeof arr, &err) == -EINVAL);
  CHECK(strstr(err.message, "must be a map") != NULL);
  zt_msg_close(&m);

  static const uint8_t empty_map[] = {0x80};
  CHECK(zt_msg_decode(&m, empty_map, 1, &err) == 0 && m.root && m.root->via.map.size == 0);
  zt_msg_close(&m);

  static const uint8_t trailing[] = {0x80, 0xc0};
  CHECK(zt_msg_decode(&m, trailing, sizeof trailing, &err) == -EINVAL);
  CHECK(strstr(err.message, "trailing") != NULL);

  static const uint8_t truncated[] = {0x81, 0xa2, 'i'};
  CHECK(zt_msg_decode(&m, truncated, sizeof truncated, &err) == -EINVAL);

  /* a map claiming 2^32-1 entries in 5 bytes: refused before msgpack-c allocates for it */
  static const uint8_t huge_map[] = {0xdf, 0xff, 0xff, 0xff, 0xff};
  CHECK(zt_msg_decode(&m, huge_map, sizeof huge_map, &err) == -EINVAL);
  static const uint8_t huge_str[] = {0x81, 0xa1, 'k', 0xdb, 0xff, 0xff, 0xff, 0xf0, 'x'};
  CHECK(zt_msg_decode(&m, huge_str, sizeof huge_str, &err) == -EINVAL);
  static const uint8_t reserved[] = {0x81, 0xa1, 'k', 0xc1};
  CHECK(zt_msg_decode(&m, reserved, sizeof reserved, &err) == -EINVAL);
  zt_msg_close(&m);
}

/* {"a": [[[ ... ]]]} with `depth` containers in all (the root map counts). */
static uint8_t *nested(int depth, size_t *len) {
  uint8_t *b = malloc((size_t)depth + 3);
  size_t n = 0;
  b[n++] = 0x81;
  b[n++] = 0xa1;
  b[n++] = 'a';
  for (int i = 1; i < depth; i++) b[n++] = i == depth - 1 ? 0x90 : 0x91;
  *len = n;
  return b;
}

static void test_depth(void) {
  zt_msg m;
  zt_proto_error err;
  size_t len;
  uint8_t *ok = nested(ZT_PROTO_MAX_DEPTH, &len);
  CHECK(zt_msg_decode(&m, ok, len, &err) == 0);
  zt_msg_close(&m);
  free(ok);
  uint8_t *deep = nested(ZT_PROTO_MAX_DEPTH + 1, &len);
  CHECK(zt_msg_decode(&m, deep, len, &err) == -EINVAL);
  CHECK(strstr(err.message, "deeper") != NULL);
  free(deep);
  /* far deeper than msgpack-c's own stack: still an error, not a crash */
  uint8_t *deeper = nested(5000, &len);
  CHECK(zt_msg_decode(&m, deeper, len, &err) == -EINVAL);
  free(deeper);
}

static void test_accessors(void) {
  zt_out o;
  zt_msg m;
  zt_proto_error err;
  size_t len;
  zt_out_init(&o);
  msgpack_pack_map(&o.pk, 8);
  zt_out_kv_str(&o, "s", "text");
  zt_out_kv_u64(&o, "u", 42);
  zt_out_kv_i64(&o, "neg", -3);
  zt_out_kv_f64(&o, "f", 2.5);
  zt_out_kv_bool(&o, "b", true);
  zt_out_kv_bin(&o, "bin", "\x01\x02\x03", 3);
  zt_out_str(&o, "m");
  msgpack_pack_map(&o.pk, 1);
  zt_out_kv_u64(&o, "n_heads", 3);
  zt_out_kv_str(&o, "id", "not a number");
  const uint8_t *body = body_of(&o, &len);
  CHECK(zt_msg_decode(&m, body, len, &err) == 0);

  const char *s;
  size_t slen;
  uint64_t u;
  double f;
  bool b;
  const uint8_t *bin;
  const msgpack_object *sub;
  CHECK(zt_msg_get_str(m.root, NULL, "s", true, &s, &slen, &err) == 0 && slen == 4 && !memcmp(s, "text", 4));
  CHECK(zt_msg_get_u64(m.root, NULL, "u", true, &u, &err) == 0 && u == 42);
  CHECK(zt_msg_get_f64(m.root, NULL, "f", true, &f, &err) == 0 && f == 2.5);
  CHECK(zt_msg_get_f64(m.root, NULL, "u", true, &f, &err) == 0 && f == 42.0);
  CHECK(zt_msg_get_f64(m.root, NULL, "neg", true, &f, &err) == 0 && f == -3.0);
  CHECK(zt_msg_get_bool(m.root, NULL, "b", true, &b, &err) == 0 && b);
  CHECK(zt_msg_get_bin(m.root, NULL, "bin", true, &bin, &slen, &err) == 0 && slen == 3 && bin[2] == 3);
  CHECK(zt_msg_get_map(m.root, NULL, "m", true, &sub, &err) == 0);
  CHECK(zt_msg_get_u64(sub, "model.", "n_heads", true, &u, &err) == 0 && u == 3);

  /* wrong types name the field */
  CHECK(zt_msg_get_u64(m.root, NULL, "neg", true, &u, &err) == -EINVAL);
  CHECK(strstr(err.message, "field 'neg' must be an unsigned integer") != NULL);
  CHECK(zt_msg_get_u64(m.root, NULL, "id", true, &u, &err) == -EINVAL);
  CHECK(strstr(err.message, "field 'id' must be an unsigned integer") != NULL);
  CHECK(zt_msg_get_str(sub, "model.", "n_heads", true, &s, &slen, &err) == -EINVAL);
  CHECK(strstr(err.message, "'model.n_heads' must be a string") != NULL);
  CHECK(zt_msg_get_bool(m.root, NULL, "s", true, &b, &err) == -EINVAL);
  CHECK(zt_msg_get_bin(m.root, NULL, "s", true, &bin, &slen, &err) == -EINVAL);
  CHECK(zt_msg_get_map(m.root, NULL, "u", true, &sub, &err) == -EINVAL);
  CHECK(zt_msg_get_f64(m.root, NULL, "s", true, &f, &err) == -EINVAL);

  /* absent: -ENOENT; the message only when required */
  memset(&err, 0, sizeof err);
  CHECK(zt_msg_get_u64(m.root, NULL, "absent", false, &u, &err) == -ENOENT && err.message[0] == 0);
  CHECK(zt_msg_get_u64(m.root, "train.", "steps", true, &u, &err) == -ENOENT);
  CHECK(err.code == -EINVAL && strcmp(err.message, "missing field 'train.steps'") == 0);
  CHECK(zt_msg_find(m.root, "s") != NULL && zt_msg_find(m.root, "S") == NULL);
  zt_msg_close(&m);
  zt_out_close(&o);
}

/* Parses {"id": id, "op": op} built here; id < 0 leaves it out. */
static int parse(int64_t id, const char *op, zt_request *req, zt_proto_error *err) {
  zt_out o;
  zt_msg m;
  size_t len;
  zt_out_init(&o);
  msgpack_pack_map(&o.pk, (id >= 0) + (op != NULL));
  if (id >= 0) zt_out_kv_u64(&o, "id", (uint64_t)id);
  if (op) zt_out_kv_str(&o, "op", op);
  const uint8_t *body = body_of(&o, &len);
  int rc = zt_msg_decode(&m, body, len, err);
  if (rc == 0) rc = zt_request_parse(&m, req, err);
  zt_msg_close(&m);
  zt_out_close(&o);
  return rc;
}

static void test_request(void) {
  zt_request req;
  zt_proto_error err;
  CHECK(parse(7, "status", &req, &err) == 0 && req.id == 7 && req.op == ZT_OP_STATUS);
  CHECK(parse(-1, "status", &req, &err) < 0 && strstr(err.message, "missing field 'id'"));
  CHECK(parse(9, NULL, &req, &err) < 0 && req.id == 9 && strstr(err.message, "missing field 'op'"));
  CHECK(parse(9, "frobnicate", &req, &err) == -ENOTSUP && req.id == 9);
  CHECK(strcmp(err.message, "unknown op 'frobnicate'") == 0);
  CHECK(parse((int64_t)UINT32_MAX + 1, "status", &req, &err) == -EINVAL);
  CHECK(parse(1, "hello\x01", &req, &err) == -ENOTSUP && strstr(err.message, "'hello?'"));

  /* the op table */
  CHECK(zt_proto_op_lookup("export", 6) == ZT_OP_EXPORT);
  CHECK(zt_proto_op_lookup("expor", 5) == ZT_OP_UNKNOWN);
  CHECK(strcmp(zt_proto_op_name(ZT_OP_SHUTDOWN), "shutdown") == 0);
  CHECK(zt_proto_op_summary(ZT_OP_BATCH)[0] != '\0');
  for (int op = ZT_OP_UNKNOWN + 1; op < ZT_OP__COUNT; op++) {
    const char *n = zt_proto_op_name((zt_proto_op)op);
    CHECK(zt_proto_op_lookup(n, strlen(n)) == (zt_proto_op)op);
  }
  /* errno names both ways */
  static const int codes[] = {EINVAL, ENOENT, EPROTO, EMSGSIZE, EBUSY, EACCES, ENOSPC, ENOMEM,
                              ECANCELED, EEXIST, ENOTSUP, EAGAIN, EIO, EPERM, ECONNREFUSED,
                              ECONNRESET, ETIMEDOUT, EROFS, ENOTDIR, EISDIR, EFBIG, EOVERFLOW,
                              ENAMETOOLONG, ESHUTDOWN};
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
    const char *n = zt_proto_errname(-codes[i]);
    CHECK(zt_proto_errnum(n, strlen(n)) == -codes[i]);
  }
  CHECK(strcmp(zt_proto_errname(-EINVAL), "EINVAL") == 0);
  CHECK(strcmp(zt_proto_errname(-4242), "EIO") == 0);
  CHECK(zt_proto_errnum("EWHATEVER", 9) == -EIO);
}

static void test_encode(void) {
  zt_out o;
  zt_msg m;
  zt_proto_error err;
  size_t len;
  zt_out_init(&o);
  zt_out_error(&o, 5, -EACCES, "bad token");
  const uint8_t *frame = zt_out_finish(&o, &len);
  uint32_t blen;
  CHECK(frame && zt_frame_header_decode(frame, 1 << 20, &blen, &err) == 0 && blen == len - 4);
  CHECK(zt_msg_decode(&m, frame + 4, blen, &err) == 0);
  uint64_t id;
  bool ok = true;
  const msgpack_object *e;
  const char *s;
  size_t slen;
  CHECK(zt_msg_get_u64(m.root, NULL, "id", true, &id, &err) == 0 && id == 5);
  CHECK(zt_msg_get_bool(m.root, NULL, "ok", true, &ok, &err) == 0 && !ok);
  CHECK(zt_msg_get_map(m.root, NULL, "error", true, &e, &err) == 0);
  CHECK(zt_msg_get_str(e, NULL, "code", true, &s, &slen, &err) == 0 && slen == 6 && !memcmp(s, "EACCES", 6));
  zt_msg_close(&m);
  zt_out_close(&o);

  zt_out_init(&o);
  zt_out_hello(&o, 1, "secret");
  frame = zt_out_finish(&o, &len);
  CHECK(zt_msg_decode(&m, frame + 4, len - 4, &err) == 0);
  zt_request req;
  uint64_t v;
  CHECK(zt_request_parse(&m, &req, &err) == 0 && req.op == ZT_OP_HELLO && req.id == 1);
  CHECK(zt_msg_get_u64(m.root, NULL, "version", true, &v, &err) == 0 && v == ZT_PROTO_VERSION);
  CHECK(zt_msg_get_str(m.root, NULL, "token", true, &s, &slen, &err) == 0 && slen == 6);
  zt_msg_close(&m);
  zt_out_close(&o);
}

int main(void) {
  test_decode_shapes();
  test_depth();
  test_accessors();
  test_request();
  test_encode();
  return TEST_DONE();
}
