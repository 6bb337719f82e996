/* Encoding: a frame is built in one growing buffer whose first 4 bytes are the header, patched
 * with the body length at the end. A failed allocation poisons the frame instead of leaving a
 * silently truncated one: zt_out_finish then returns NULL. */
#include "proto/zt_proto.h"

#include <errno.h>
#include <string.h>

static int out_write(void *data, const char *buf, size_t len) {
  zt_out *o = data;
  if (o->err) return -1;
  if (msgpack_sbuffer_write(&o->buf, buf, len) != 0) {
    o->err = -ENOMEM;
    return -1;
  }
  return 0;
}

void zt_out_init(zt_out *o) {
  msgpack_sbuffer_init(&o->buf);
  o->err = 0;
  msgpack_packer_init(&o->pk, o, out_write);
  static const char zero[ZT_PROTO_HEADER_BYTES];
  out_write(o, zero, sizeof zero);
}

void zt_out_close(zt_out *o) {
  msgpack_sbuffer_destroy(&o->buf);
  memset(&o->buf, 0, sizeof o->buf);
}

const uint8_t *zt_out_finish(zt_out *o, size_t *len) {
  *len = 0;
  if (o->err) return NULL;
  size_t body = o->buf.size - ZT_PROTO_HEADER_BYTES;
  if (body > UINT32_MAX) {
    o->err = -EMSGSIZE;
    return NULL;
  }
  zt_frame_header_encode((uint8_t *)o->buf.data, (uint32_t)body);
  *len = o->buf.size;
  return (const uint8_t *)o->buf.data;
}

size_t zt_proto_utf8_seq(const unsigned char *s, size_t n) {
  if (s[0] < 0x80) return 1;
  size_t len = s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 ? 2 : 0;
  if (!len || len > n || s[0] > 0xf4) return 0;
  for (size_t i = 1; i < len; i++)
    if ((s[i] & 0xc0) != 0x80) return 0;
  if (len == 3 && ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] >= 0xa0))) return 0;
  if (len == 4 && ((s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] >= 0x90))) return 0;
  return len;
}

/* Strings go out as valid UTF-8 whatever a request put in them (a message may quote a field
 * name or value): each byte of an invalid sequence becomes the four characters \xNN. */
void zt_out_str(zt_out *o, const char *s) {
  const unsigned char *u = (const unsigned char *)s;
  size_t n = strlen(s), out = 0;
  for (size_t i = 0; i < n;) {
    size_t k = zt_proto_utf8_seq(u + i, n - i);
    out += k ? k : 4;
    i += k ? k : 1;
  }
  msgpack_pack_str(&o->pk, out);
  if (out == n) {
    msgpack_pack_str_body(&o->pk, s, n);
    return;
  }
  for (size_t i = 0; i < n;) {
    size_t k = zt_proto_utf8_seq(u + i, n - i);
    if (k) {
      msgpack_pack_str_body(&o->pk, s + i, k);
      i += k;
      continue;
    }
    static const char hex[] = "0123456789abcdef";
    char esc[4] = {'\\', 'x', hex[u[i] >> 4], hex[u[i] & 15]};
    msgpack_pack_str_body(&o->pk, esc, 4);
    i++;
  }
}

void zt_out_kv_str(zt_out *o, const char *k, const char *v) {
  zt_out_str(o, k);
  zt_out_str(o, v);
}

void zt_out_kv_u64(zt_out *o, const char *k, uint64_t v) {
  zt_out_str(o, k);
  msgpack_pack_uint64(&o->pk, v);
}

void zt_out_kv_i64(zt_out *o, const char *k, int64_t v) {
  zt_out_str(o, k);
  msgpack_pack_int64(&o->pk, v);
}

void zt_out_kv_f64(zt_out *o, const char *k, double v) {
  zt_out_str(o, k);
  msgpack_pack_double(&o->pk, v);
}

void zt_out_kv_bool(zt_out *o, const char *k, bool v) {
  zt_out_str(o, k);
  if (v)
    msgpack_pack_true(&o->pk);
  else
    msgpack_pack_false(&o->pk);
}

void zt_out_kv_bin(zt_out *o, const char *k, const void *data, size_t len) {
  zt_out_str(o, k);
  msgpack_pack_bin(&o->pk, len);
  msgpack_pack_bin_body(&o->pk, data, len);
}

void zt_out_hello(zt_out *o, uint32_t id, const char *token) {
  msgpack_pack_map(&o->pk, token ? 4 : 3);
  zt_out_kv_u64(o, "id", id);
  zt_out_kv_str(o, "op", "hello");
  zt_out_kv_u64(o, "version", ZT_PROTO_VERSION);
  if (token) zt_out_kv_str(o, "token", token);
}

void zt_out_error(zt_out *o, uint32_t id, int neg_errno, const char *message) {
  msgpack_pack_map(&o->pk, 3);
  zt_out_kv_u64(o, "id", id);
  zt_out_kv_bool(o, "ok", false);
  zt_out_str(o, "error");
  msgpack_pack_map(&o->pk, 2);
  zt_out_kv_str(o, "code", zt_proto_errname(neg_errno));
  zt_out_kv_str(o, "message", message);
}
