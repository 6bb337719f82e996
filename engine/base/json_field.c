/* The field readers (json_field.h). */
#include "engine/base/json_field.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/base/sizes.h"

void zt_json_field(char *out, size_t n, const char *path, const char *key) {
  if (path[0])
    snprintf(out, n, "%s.%s", path, key);
  else
    snprintf(out, n, "%s", key);
}

int zt_json_check_keys(const json_t *obj, const char *path, const char *const *allowed,
                       char *err, size_t errlen) {
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)obj, key, v) {
    int known = 0;
    for (int i = 0; allowed[i]; i++) known |= strcmp(key, allowed[i]) == 0;
    if (!known) {
      char f[160];
      zt_json_field(f, sizeof f, path, key);
      snprintf(err, errlen, "unknown field '%s'", f);
      return -EINVAL;
    }
  }
  return 0;
}

int zt_json_get_object(const json_t *obj, const char *path, const char *key, int required,
                       const json_t **out, char *err, size_t errlen) {
  char f[160];
  zt_json_field(f, sizeof f, path, key);
  const json_t *v = json_object_get(obj, key);
  *out = NULL;
  if (!v) {
    if (!required) return 0;
    snprintf(err, errlen, "%s is required", f);
    return -EINVAL;
  }
  if (!json_is_object(v)) {
    snprintf(err, errlen, "%s must be an object", f);
    return -EINVAL;
  }
  *out = v;
  return 0;
}

int zt_json_get_int(const json_t *obj, const char *path, const char *key, int required,
                    int64_t min, int64_t max, int64_t dflt, int64_t *out, char *err,
                    size_t errlen) {
  char f[160];
  zt_json_field(f, sizeof f, path, key);
  const json_t *v = json_object_get(obj, key);
  if (!v && !required) {
    *out = dflt;
    return 0;
  }
  if (!v) {
    snprintf(err, errlen, "%s is required", f);
    return -EINVAL;
  }
  if (!json_is_integer(v) || json_integer_value(v) < min) {
    snprintf(err, errlen, "%s must be a %s integer", f, min > 0 ? "positive" : "non-negative");
    return -EINVAL;
  }
  if (json_integer_value(v) > max) {
    snprintf(err, errlen, "%s must be at most %" PRId64, f, max);
    return -EINVAL;
  }
  *out = json_integer_value(v);
  return 0;
}

int zt_json_get_int32(const json_t *obj, const char *path, const char *key, int required,
                      int min, int max, int dflt, int *out, char *err, size_t errlen) {
  int64_t v;
  int rc = zt_json_get_int(obj, path, key, required, min, max, dflt, &v, err, errlen);
  if (rc == 0) *out = (int)v;
  return rc;
}

int zt_json_check_num(const json_t *v, const char *field, double lo, int lo_open, double hi,
                      int hi_open, float *out, char *err, size_t errlen) {
  double x = json_is_number(v) ? json_number_value(v) : 0.0;
  if (!json_is_number(v) || x < lo || (lo_open && x == lo) || x > hi || (hi_open && x == hi)) {
    snprintf(err, errlen, "%s must be a number in %c%g, %g%c", field, lo_open ? '(' : '[', lo,
             hi, hi_open ? ')' : ']');
    return -EINVAL;
  }
  float f = (float)x;
  if ((x != 0 && f == 0) || isinf(f)) {
    snprintf(err, errlen, "%s is %g, which a 32-bit float holds as %g", field, x, (double)f);
    return -EINVAL;
  }
  *out = f;
  return 0;
}

int zt_json_get_num(const json_t *obj, const char *path, const char *key, double lo, int lo_open,
                    double hi, int hi_open, float dflt, float *out, char *err, size_t errlen) {
  char f[160];
  zt_json_field(f, sizeof f, path, key);
  const json_t *v = json_object_get(obj, key);
  if (!v) {
    *out = dflt;
    return 0;
  }
  return zt_json_check_num(v, f, lo, lo_open, hi, hi_open, out, err, errlen);
}

int zt_json_get_string(const json_t *obj, const char *path, const char *key, const char *dflt,
                       const char **out, char *err, size_t errlen) {
  char f[160];
  zt_json_field(f, sizeof f, path, key);
  const json_t *v = json_object_get(obj, key);
  if (!v && dflt) {
    *out = dflt;
    return 0;
  }
  if (!v) {
    snprintf(err, errlen, "%s is required", f);
    return -EINVAL;
  }
  if (!json_is_string(v)) {
    snprintf(err, errlen, "%s must be a string", f);
    return -EINVAL;
  }
  /* C strings end at a NUL: a value with one inside would be cut there silently */
  if (strlen(json_string_value(v)) != json_string_length(v)) {
    snprintf(err, errlen, "%s must not contain NUL bytes", f);
    return -EINVAL;
  }
  *out = json_string_value(v);
  return 0;
}

int zt_json_get_abs_path(const json_t *obj, const char *path, const char *key, char *out,
                         size_t outlen, char *err, size_t errlen) {
  char f[160];
  zt_json_field(f, sizeof f, path, key);
  const json_t *v = json_object_get(obj, key);
  if (!v) {
    snprintf(err, errlen, "%s is required", f);
    return -EINVAL;
  }
  const char *s = json_is_string(v) ? json_string_value(v) : NULL;
  if (s && strlen(s) != json_string_length(v)) {
    snprintf(err, errlen, "%s must not contain NUL bytes", f);
    return -EINVAL;
  }
  if (!s || s[0] != '/') {
    snprintf(err, errlen, "%s must be an absolute path", f);
    return -EINVAL;
  }
  if (strlen(s) >= outlen) {
    snprintf(err, errlen, "%s is longer than %zu bytes", f, outlen - 1);
    return -EINVAL;
  }
  snprintf(out, outlen, "%s", s);
  return 0;
}

int zt_json_get_bool(const json_t *obj, const char *path, const char *key, int dflt, int *out,
                     char *err, size_t errlen) {
  const json_t *v = json_object_get(obj, key);
  if (!v) {
    *out = dflt;
    return 0;
  }
  if (!json_is_boolean(v)) {
    char f[160];
    zt_json_field(f, sizeof f, path, key);
    snprintf(err, errlen, "%s must be true or false", f);
    return -EINVAL;
  }
  *out = json_is_true(v);
  return 0;
}

int zt_json_get_size(const json_t *obj, const char *path, const char *key, uint64_t dflt,
                     uint64_t *out, char *err, size_t errlen) {
  const json_t *v = json_object_get(obj, key);
  if (!v) {
    *out = dflt;
    return 0;
  }
  if (json_is_integer(v) && json_integer_value(v) >= 0) {
    *out = (uint64_t)json_integer_value(v);
    return 0;
  }
  if (json_is_string(v) && zt_size_parse(json_string_value(v), out) == 0) return 0;
  char f[160];
  zt_json_field(f, sizeof f, path, key);
  snprintf(err, errlen, "%s must be a byte count or a size such as \"512MiB\" or \"55GB\" "
           "(units B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)", f);
  return -EINVAL;
}
