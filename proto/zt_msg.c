/* Message decode and field access. Before msgpack-c sees a body, a walk over the raw bytes checks
 * its structure: every declared length and element count must fit in the bytes that remain, the
 * nesting stays within ZT_PROTO_MAX_DEPTH, and the message ends exactly at the end of the frame.
 * This bounds what msgpack-c allocates to a small multiple of the frame size: a 5-byte frame
 * announcing a map of 2^32 entries is refused here instead of asking for hundreds of GiB. */
#include "proto/zt_proto.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

typedef struct zt__scan {
  const uint8_t *p;
  size_t len;
  size_t pos;
  zt_proto_error *err;
} zt__scan;

static int scan_need(zt__scan *s, uint64_t n) {
  if (n > s->len - s->pos)
    return zt_proto_error_set(s->err, -EINVAL,
                              "malformed msgpack: %llu bytes announced at offset %zu, %zu left",
                              (unsigned long long)n, s->pos, s->len - s->pos);
  return 0;
}

/* Reads a big-endian unsigned of `bytes` width at the cursor. */
static int scan_uint(zt__scan *s, unsigned bytes, uint64_t *v) {
  int rc = scan_need(s, bytes);
  if (rc < 0) return rc;
  uint64_t x = 0;
  for (unsigned i = 0; i < bytes; i++) x = x << 8 | s->p[s->pos + i];
  s->pos += bytes;
  *v = x;
  return 0;
}

static int scan_skip(zt__scan *s, uint64_t n) {
  int rc = scan_need(s, n);
  if (rc < 0) return rc;
  s->pos += (size_t)n;
  return 0;
}

static int scan_value(zt__scan *s, int depth);

static int scan_container(zt__scan *s, int depth, uint64_t items) {
  if (depth > ZT_PROTO_MAX_DEPTH)
    return zt_proto_error_set(s->err, -EINVAL, "message nests deeper than %d maps/arrays",
                              ZT_PROTO_MAX_DEPTH);
  /* every item takes at least one byte */
  int rc = scan_need(s, items);
  if (rc < 0) return rc;
  for (uint64_t i = 0; i < items; i++) {
    rc = scan_value(s, depth);
    if (rc < 0) return rc;
  }
  return 0;
}

static int scan_value(zt__scan *s, int depth) {
  int rc = scan_need(s, 1);
  if (rc < 0) return rc;
  uint8_t b = s->p[s->pos++];
  uint64_t n = 0;
  if (b <= 0x7f || b >= 0xe0) return 0;                   /* fixint */
  if (b <= 0x8f) return scan_container(s, depth + 1, 2ull * (b & 0x0f)); /* fixmap */
  if (b <= 0x9f) return scan_container(s, depth + 1, b & 0x0f);          /* fixarray */
  if (b <= 0xbf) return scan_skip(s, b & 0x1f);                          /* fixstr */
  switch (b) {
  case 0xc0: case 0xc2: case 0xc3: return 0;
  case 0xc4: case 0xd9: rc = scan_uint(s, 1, &n); break; /* bin8, str8 */
  case 0xc5: case 0xda: rc = scan_uint(s, 2, &n); break;
  case 0xc6: case 0xdb: rc = scan_uint(s, 4, &n); break;
  case 0xc7: rc = scan_uint(s, 1, &n); n += 1; break;    /* ext: length, then a type byte */
  case 0xc8: rc = scan_uint(s, 2, &n); n += 1; break;
  case 0xc9: rc = scan_uint(s, 4, &n); n += 1; break;
  case 0xca: case 0xce: case 0xd2: n = 4; break;
  case 0xcb: case 0xcf: case 0xd3: n = 8; break;
  case 0xcc: case 0xd0: n = 1; break;
  case 0xcd: case 0xd1: n = 2; break;
  case 0xd4: n = 2; break;                                /* fixext: type + 1/2/4/8/16 */
  case 0xd5: n = 3; break;
  case 0xd6: n = 5; break;
  case 0xd7: n = 9; break;
  case 0xd8: n = 17; break;
  case 0xdc: rc = scan_uint(s, 2, &n); return rc < 0 ? rc : scan_container(s, depth + 1, n);
  case 0xdd: rc = scan_uint(s, 4, &n); return rc < 0 ? rc : scan_container(s, depth + 1, n);
  case 0xde: rc = scan_uint(s, 2, &n); return rc < 0 ? rc : scan_container(s, depth + 1, 2 * n);
  case 0xdf: rc = scan_uint(s, 4, &n); return rc < 0 ? rc : scan_container(s, depth + 1, 2 * n);
  default:
    return zt_proto_error_set(s->err, -EINVAL, "malformed msgpack: byte 0x%02x at offset %zu", b,
                              s->pos - 1);
  }
  return rc < 0 ? rc : scan_skip(s, n);
}

static const char *type_name(msgpack_object_type t) {
  switch (t) {
  case MSGPACK_OBJECT_NIL: return "nil";
  case MSGPACK_OBJECT_BOOLEAN: return "a boolean";
  case MSGPACK_OBJECT_POSITIVE_INTEGER: case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "an integer";
  case MSGPACK_OBJECT_FLOAT32: case MSGPACK_OBJECT_FLOAT64: return "a float";
  case MSGPACK_OBJECT_STR: return "a string";
  case MSGPACK_OBJECT_ARRAY: return "an array";
  case MSGPACK_OBJECT_MAP: return "a map";
  case MSGPACK_OBJECT_BIN: return "binary";
  case MSGPACK_OBJECT_EXT: return "an extension";
  }
  return "unknown";
}

int zt_msg_decode(zt_msg *m, const uint8_t *body, size_t len, zt_proto_error *err) {
  msgpack_unpacked_init(&m->up);
  m->root = NULL;
  zt__scan s = {.p = body, .len = len, .pos = 0, .err = err};
  int rc = scan_value(&s, 0);
  if (rc < 0) goto out;
  if (s.pos != len) {
    rc = zt_proto_error_set(err, -EINVAL, "%zu trailing bytes after the message", len - s.pos);
    goto out;
  }
  size_t off = 0;
  msgpack_unpack_return ur = msgpack_unpack_next(&m->up, (const char *)body, len, &off);
  if (ur == MSGPACK_UNPACK_NOMEM_ERROR) {
    rc = zt_proto_error_set(err, -ENOMEM, "out of memory decoding a %zu-byte message", len);
    goto out;
  }
  if (ur != MSGPACK_UNPACK_SUCCESS || off != len) {
    rc = zt_proto_error_set(err, -EINVAL, "malformed msgpack message");
    goto out;
  }
  if (m->up.data.type != MSGPACK_OBJECT_MAP) {
    rc = zt_proto_error_set(err, -EINVAL, "message must be a map, not %s",
                            type_name(m->up.data.type));
    goto out;
  }
  m->root = &m->up.data;
out:
  if (rc < 0) zt_msg_close(m);
  return rc;
}

void zt_msg_close(zt_msg *m) {
  msgpack_unpacked_destroy(&m->up);
  m->root = NULL;
}

const msgpack_object *zt_msg_find(const msgpack_object *map, const char *key) {
  if (!map || map->type != MSGPACK_OBJECT_MAP) return NULL;
  size_t klen = strlen(key);
  for (uint32_t i = 0; i < map->via.map.size; i++) {
    const msgpack_object_kv *kv = &map->via.map.ptr[i];
    if (kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == klen &&
        (klen == 0 || memcmp(kv->key.via.str.ptr, key, klen) == 0))
      return &kv->val;
  }
  return NULL;
}

/* Looks the field up; returns it, or NULL with -ENOENT in *rc (err filled when required). */
static const msgpack_object *field(const msgpack_object *map, const char *prefix, const char *key,
                                   bool required, int *rc, zt_proto_error *err) {
  const msgpack_object *o = zt_msg_find(map, key);
  *rc = 0;
  if (!o) {
    *rc = -ENOENT;
    if (required) zt_proto_error_set(err, -EINVAL, "missing field '%s%s'", prefix ? prefix : "", key);
  }
  return o;
}

static int wrong_type(const msgpack_object *o, const char *prefix, const char *key,
                      const char *want, zt_proto_error *err) {
  return zt_proto_error_set(err, -EINVAL, "field '%s%s' must be %s, not %s", prefix ? prefix : "",
                            key, want, type_name(o->type));
}

int zt_msg_get_str(const msgpack_object *map, const char *prefix, const char *key, bool required,
                   const char **s, size_t *len, zt_proto_error *err) {
  int rc;
  const msgpack_object *o = field(map, prefix, key, required, &rc, err);
  if (!o) return rc;
  if (o->type != MSGPACK_OBJECT_STR) return wrong_type(o, prefix, key, "a string", err);
  /* msgpack-c leaves ptr NULL for empty strings; callers get a valid pointer */
  *s = o->via.str.size ? o->via.str.ptr : "";
  *len = o->via.str.size;
  return 0;
}

int zt_msg_get_u64(const msgpack_object *map, const char *prefix, const char *key, bool required,
                   uint64_t *out, zt_proto_error *err) {
  int rc;
  const msgpack_object *o = field(map, prefix, key, required, &rc, err);
  if (!o) return rc;
  if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
    return wrong_type(o, prefix, key, "an unsigned integer", err);
  *out = o->via.u64;
  return 0;
}

int zt_msg_get_f64(const msgpack_object *map, const char *prefix, const char *key, bool required,
                   double *out, zt_proto_error *err) {
  int rc;
  const msgpack_object *o = field(map, prefix, key, required, &rc, err);
  if (!o) return rc;
  switch (o->type) {
  case MSGPACK_OBJECT_FLOAT32: case MSGPACK_OBJECT_FLOAT64: *out = o->via.f64; return 0;
  case MSGPACK_OBJECT_POSITIVE_INTEGER: *out = (double)o->via.u64; return 0;
  case MSGPACK_OBJECT_NEGATIVE_INTEGER: *out = (double)o->via.i64; return 0;
  default: return wrong_type(o, prefix, key, "a number", err);
  }
}

int zt_msg_get_bool(const msgpack_object *map, const char *prefix, const char *key, bool required,
                    bool *out, zt_proto_error *err) {
  int rc;
  const msgpack_object *o = field(map, prefix, key, required, &rc, err);
  if (!o) return rc;
  if (o->type != MSGPACK_OBJECT_BOOLEAN) return wrong_type(o, prefix, key, "a boolean", err);
  *out = o->via.boolean;
  return 0;
}

int zt_msg_get_bin(const msgpack_object *map, const char *prefix, const char *key, bool required,
                   const uint8_t **data, size_t *len, zt_proto_error *err) {
  int rc;
  const msgpack_object *o = field(map, prefix, key, required, &rc, err);
  if (!o) return rc;
  if (o->type != MSGPACK_OBJECT_BIN) return wrong_type(o, prefix, key, "binary (bin)", err);
  *data = o->via.bin.size ? (const uint8_t *)o->via.bin.ptr : (const uint8_t *)"";
  *len = o->via.bin.size;
  return 0;
}

int zt_msg_get_map(const msgpack_object *map, const char *prefix, const char *key, bool required,
                   const msgpack_object **out, zt_proto_error *err) {
  int rc;
  const msgpack_object *o = field(map, prefix, key, required, &rc, err);
  if (!o) return rc;
  if (o->type != MSGPACK_OBJECT_MAP) return wrong_type(o, prefix, key, "a map", err);
  *out = o;
  return 0;
}

int zt_request_parse(const zt_msg *m, zt_request *req, zt_proto_error *err) {
  req->id = 0;
  req->op = ZT_OP_UNKNOWN;
  req->body = m->root;
  uint64_t id;
  int rc = zt_msg_get_u64(m->root, NULL, "id", true, &id, err);
  if (rc < 0) return rc;
  if (id > UINT32_MAX)
    return zt_proto_error_set(err, -EINVAL, "field 'id' must be an unsigned 32-bit integer");
  req->id = (uint32_t)id;
  const char *op;
  size_t oplen;
  rc = zt_msg_get_str(m->root, NULL, "op", true, &op, &oplen, err);
  if (rc < 0) return rc;
  req->op = zt_proto_op_lookup(op, oplen);
  if (req->op == ZT_OP_UNKNOWN) {
    /* the name is echoed back, so keep it short and printable */
    char shown[40];
    size_t n = oplen < sizeof shown - 1 ? oplen : sizeof shown - 1;
    for (size_t i = 0; i < n; i++) {
      unsigned char c = (unsigned char)op[i];
      shown[i] = c >= 0x20 && c < 0x7f && c != '\'' ? (char)c : '?';
    }
    shown[n] = '\0';
    return zt_proto_error_set(err, -ENOTSUP, "unknown op '%s'%s", shown,
                              oplen > n ? " (truncated)" : "");
  }
  return 0;
}
