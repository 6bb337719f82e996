/* The "offload" object of a spec file (engine/train/offload/offload.h, docs/spec.md):
 * {"params": "gpu|host|nvme|auto", "grads": "gpu|host|auto", "optimizer": "host|nvme|auto",
 *  "gpu_budget": SIZE, "prefetch": N, "gpu_units": N, "host_units": N, "host_budget": SIZE,
 *  "nvme_budget": SIZE, "nvme_dir": "/abs/dir", "grad_slots": N, "delayed_update": BOOL}; SIZE is an
 * integer of bytes or a string "<number> <unit>" with unit B, KiB, MiB, GiB or TiB ("512MiB",
 * "1.5 GiB"). */
#include "engine/train/offload/offload_json.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_size(const json_t *v, size_t *out) {
  if (json_is_integer(v)) {
    if (json_integer_value(v) < 0) return -EINVAL;
    *out = (size_t)json_integer_value(v);
    return 0;
  }
  if (!json_is_string(v)) return -EINVAL;
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  const char *s = json_string_value(v);
  char *end;
  errno = 0;
  double x = strtod(s, &end);
  if (errno || end == s || !(x >= 0)) return -EINVAL;
  while (*end == ' ') end++;
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
    if (!strcmp(end, units[i])) {
      double bytes = ldexp(x, 10 * (int)i);
      if (bytes >= 18446744073709551616.0 || bytes != floor(bytes)) return -EINVAL;
      *out = (size_t)bytes;
      return 0;
    }
  return -EINVAL;
}

int zt_offload_cfg_from_json(const json_t *o, zt_offload_cfg *c, char *err, size_t errlen) {
  zt_offload_cfg_defaults(c);
  if (!json_is_object(o)) {
    snprintf(err, errlen, "offload must be an object");
    return -EINVAL;
  }
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)o, key, v) {
    zt_offload_place *place = !strcmp(key, "params")      ? &c->params
                              : !strcmp(key, "grads")     ? &c->grads
                              : !strcmp(key, "optimizer") ? &c->optimizer
                                                          : NULL;
    if (place) {
      if (!json_is_string(v) || zt_offload_place_parse(json_string_value(v), place) < 0) {
        snprintf(err, errlen, "offload.%s must be \"gpu\", \"host\", \"nvme\" or \"auto\"", key);
        return -EINVAL;
      }
    } else if (!strcmp(key, "gpu_budget") || !strcmp(key, "host_budget") ||
               !strcmp(key, "nvme_budget")) {
      size_t *field = !strcmp(key, "gpu_budget")    ? &c->gpu_budget
                      : !strcmp(key, "host_budget") ? &c->host_budget
                                                    : NULL;
      size_t bytes;
      if (parse_size(v, &bytes) < 0) {
        snprintf(err, errlen, "offload.%s must be a byte count or a size such as \"512MiB\" "
                 "(units B, KiB, MiB, GiB, TiB)", key);
        return -EINVAL;
      }
      if (field)
        *field = bytes;
      else
        c->nvme_budget = bytes;
    } else if (!strcmp(key, "prefetch")) {
      if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1 << 20) {
        snprintf(err, errlen, "offload.prefetch must be an integer >= 0");
        return -EINVAL;
      }
      c->prefetch = (int)json_integer_value(v);
    } else if (!strcmp(key, "grad_slots")) {
      if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1 << 20) {
        snprintf(err, errlen, "offload.grad_slots must be an integer >= 0");
        return -EINVAL;
      }
      c->grad_slots = (int)json_integer_value(v);
    } else if (!strcmp(key, "gpu_units") || !strcmp(key, "host_units")) {
      if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1 << 20) {
        snprintf(err, errlen, "offload.%s must be an integer >= 0", key);
        return -EINVAL;
      }
      *(!strcmp(key, "gpu_units") ? &c->gpu_units : &c->host_units) = (int)json_integer_value(v);
    } else if (!strcmp(key, "delayed_update")) {
      if (!json_is_boolean(v)) {
        snprintf(err, errlen, "offload.delayed_update must be true or false");
        return -EINVAL;
      }
      c->delayed_update = json_is_true(v);
    } else if (!strcmp(key, "nvme_dir")) {
      const char *d = json_is_string(v) ? json_string_value(v) : NULL;
      if (!d || d[0] != '/' || strlen(d) >= sizeof c->nvme_dir) {
        snprintf(err, errlen, "offload.nvme_dir must be an absolute path shorter than %zu bytes",
                 sizeof c->nvme_dir);
        return -EINVAL;
      }
      strcpy(c->nvme_dir, d);
    } else {
      snprintf(err, errlen, "unknown field 'offload.%s'", key);
      return -EINVAL;
    }
  }
  return zt_offload_cfg_check(c, err, errlen);
}

int zt_offload_spec_load(const char *path, zt_offload_cfg *c, int *present, char *err,
                         size_t errlen) {
  json_error_t je;
  json_t *j = json_load_file(path, 0, &je);
  *present = 0;
  if (!j) {
    snprintf(err, errlen, "%s:%d: %s", path, je.line, je.text);
    return -EINVAL;
  }
  const json_t *o = json_object_get(j, "offload");
  int rc = 0;
  if (o) {
    *present = 1;
    rc = zt_offload_cfg_from_json(o, c, err, errlen);
  } else {
    zt_offload_cfg_defaults(c);
  }
  json_decref(j);
  return rc;
}
