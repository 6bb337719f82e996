/* msgpack <-> JSON. Errors name the path of the offending value ("spec.model.layers[2]"). */
#include "proto/zt_proto_json.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* Appends a map key or an array index to the path; returns the old length to restore. */
static size_t path_push_key(char *path, size_t cap, const char *key, size_t klen) {
  size_t n = strlen(path);
  snprintf(path + n, cap - n, "%s%.*s", n ? "." : "", (int)(klen > 64 ? 64 : klen), key);
  return n;
}

static size_t path_push_index(char *path, size_t cap, uint32_t i) {
  size_t n = strlen(path);
  snprintf(path + n, cap - n, "[%u]", i);
  return n;
}

static json_t *to_json(const msgpack_object *o, char *path, size_t cap, zt_proto_error *err) {
  const char *where = path[0] ? path : "message";
  switch (o->type) {
  case MSGPACK_OBJECT_NIL: return json_null();
  case MSGPACK_OBJECT_BOOLEAN: return json_boolean(o->via.boolean);
  case MSGPACK_OBJECT_POSITIVE_INTEGER:
    if (o->via.u64 > (uint64_t)INT64_MAX) {
      zt_proto_error_set(err, -EOVERFLOW, "'%s' is an integer too large for JSON", where);
      return NULL;
    }
    return json_integer((json_int_t)o->via.u64);
  case MSGPACK_OBJECT_NEGATIVE_INTEGER: return json_integer((json_int_t)o->via.i64);
  case MSGPACK_OBJECT_FLOAT32:
  case MSGPACK_OBJECT_FLOAT64:
    /* JSON has no NaN or infinity; a diverged loss is reported as null */
    return isfinite(o->via.f64) ? json_real(o->via.f64) : json_null();
  case MSGPACK_OBJECT_STR: {
    /* msgpack-c leaves ptr NULL for empty strings */
    json_t *s = json_stringn(o->via.str.size ? o->via.str.ptr : "", o->via.str.size);
    if (!s) zt_proto_error_set(err, -EINVAL, "'%s' is not valid UTF-8", where);
    return s;
  }
  case MSGPACK_OBJECT_ARRAY: {
    json_t *a = json_array();
    if (!a) goto nomem;
    for (uint32_t i = 0; i < o->via.array.size; i++) {
      size_t mark = path_push_index(path, cap, i);
      json_t *v = to_json(&o->via.array.ptr[i], path, cap, err);
      path[mark] = '\0';
      if (!v || json_array_append_new(a, v) != 0) {
        if (v) zt_proto_error_set(err, -ENOMEM, "out of memory");
        json_decref(a);
        return NULL;
      }
    }
    return a;
  }
  case MSGPACK_OBJECT_MAP: {
    json_t *m = json_object();
    if (!m) goto nomem;
    for (uint32_t i = 0; i < o->via.map.size; i++) {
      const msgpack_object_kv *kv = &o->via.map.ptr[i];
      if (kv->key.type != MSGPACK_OBJECT_STR) {
        zt_proto_error_set(err, -EINVAL, "'%s' has a map key that is not a string", where);
        json_decref(m);
        return NULL;
      }
      char key[256];
      size_t klen = kv->key.via.str.size;
      if (klen >= sizeof key || (klen && memchr(kv->key.via.str.ptr, 0, klen))) {
        zt_proto_error_set(err, -EINVAL, "'%s' has a map key that is too long or holds NUL", where);
        json_decref(m);
        return NULL;
      }
      if (klen) memcpy(key, kv->key.via.str.ptr, klen);
      key[klen] = '\0';
      size_t mark = path_push_key(path, cap, key, klen);
      json_t *v = to_json(&kv->val, path, cap, err);
      path[mark] = '\0';
      if (!v) {
        json_decref(m);
        return NULL;
      }
      if (json_object_set_new(m, key, v) != 0) {
        zt_proto_error_set(err, -EINVAL, "'%s' key '%s' is not valid UTF-8", where, key);
        json_decref(m);
        return NULL;
      }
    }
    return m;
  }
  case MSGPACK_OBJECT_BIN:
    zt_proto_error_set(err, -EINVAL, "'%s' is binary, which JSON cannot carry", where);
    return NULL;
  case MSGPACK_OBJECT_EXT:
    zt_proto_error_set(err, -EINVAL, "'%s' is a msgpack extension, which JSON cannot carry", where);
    return NULL;
  }
  zt_proto_error_set(err, -EINVAL, "'%s' has an unknown msgpack type", where);
  return NULL;
nomem:
  zt_proto_error_set(err, -ENOMEM, "out of memory");
  return NULL;
}

json_t *zt_proto_to_json(const msgpack_object *o, zt_proto_error *err) {
  char path[512] = "";
  return to_json(o, path, sizeof path, err);
}

int zt_proto_pack_json(msgpack_packer *pk, const json_t *j) {
  int rc = 0;
  switch (json_typeof(j)) {
  case JSON_OBJECT: {
    const char *k;
    json_t *v;
    rc = msgpack_pack_map(pk, json_object_size(j));
    json_object_foreach((json_t *)j, k, v) {
      size_t n = strlen(k);
      if (rc == 0) rc = msgpack_pack_str(pk, n);
      if (rc == 0) rc = msgpack_pack_str_body(pk, k, n);
      if (rc == 0) rc = zt_proto_pack_json(pk, v);
      if (rc < 0) break;
    }
    break;
  }
  case JSON_ARRAY: {
    size_t i;
    json_t *v;
    rc = msgpack_pack_array(pk, json_array_size(j));
    json_array_foreach(j, i, v) {
      if (rc == 0) rc = zt_proto_pack_json(pk, v);
      if (rc < 0) break;
    }
    break;
  }
  case JSON_STRING: {
    size_t n = json_string_length(j);
    rc = msgpack_pack_str(pk, n);
    if (rc == 0) rc = msgpack_pack_str_body(pk, json_string_value(j), n);
    break;
  }
  case JSON_INTEGER: {
    json_int_t v = json_integer_value(j);
    rc = v < 0 ? msgpack_pack_int64(pk, v) : msgpack_pack_uint64(pk, (uint64_t)v);
    break;
  }
  case JSON_REAL: rc = msgpack_pack_double(pk, json_real_value(j)); break;
  case JSON_TRUE: rc = msgpack_pack_true(pk); break;
  case JSON_FALSE: rc = msgpack_pack_false(pk); break;
  case JSON_NULL: rc = msgpack_pack_nil(pk); break;
  }
  /* the packer reports a failed write (allocation) as a non-zero status */
  return rc != 0 ? -ENOMEM : 0;
}
