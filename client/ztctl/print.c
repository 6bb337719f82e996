/* Human-readable output: replies flattened to "key: value" lines, sizes, durations, rates. */
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "client/ztctl/ztctl.h"

static bool is_scalar_array(const json_t *a) {
  size_t i;
  json_t *v;
  json_array_foreach(a, i, v) {
    if (json_is_object(v) || json_is_array(v)) return false;
  }
  return true;
}

void ztctl_print_flat(FILE *f, const json_t *j, const char *prefix) {
  char key[512];
  if (json_is_object(j)) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)j, k, v) {
      snprintf(key, sizeof key, "%s%s%s", prefix, prefix[0] ? "." : "", k);
      ztctl_print_flat(f, v, key);
    }
  } else if (json_is_array(j) && !is_scalar_array(j)) {
    size_t i;
    json_t *v;
    json_array_foreach(j, i, v) {
      snprintf(key, sizeof key, "%s[%zu]", prefix, i);
      ztctl_print_flat(f, v, key);
    }
  } else if (json_is_string(j)) {
    fprintf(f, "%s: %s\n", prefix, json_string_value(j));
  } else {
    char *s = json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(10));
    fprintf(f, "%s: %s\n", prefix, s ? s : "?");
    free(s);
  }
}

void ztctl_fmt_bytes(char *buf, size_t cap, double bytes) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    u++;
  }
  if (u == 0)
    snprintf(buf, cap, "%.0f B", bytes);
  else
    snprintf(buf, cap, "%.1f %s", bytes, units[u]);
}

void ztctl_fmt_duration(char *buf, size_t cap, double seconds) {
  if (!(seconds >= 0) || seconds > 1e9) {
    snprintf(buf, cap, "?");
    return;
  }
  unsigned long s = (unsigned long)llround(seconds);
  if (s >= 3600)
    snprintf(buf, cap, "%lu:%02lu:%02lu", s / 3600, s / 60 % 60, s % 60);
  else
    snprintf(buf, cap, "%lu:%02lu", s / 60, s % 60);
}

void ztctl_fmt_rate(char *buf, size_t cap, double per_s) {
  if (per_s >= 1e6)
    snprintf(buf, cap, "%.1fM", per_s / 1e6);
  else if (per_s >= 1e3)
    snprintf(buf, cap, "%.1fk", per_s / 1e3);
  else
    snprintf(buf, cap, "%.0f", per_s);
}

double ztctl_memory_bytes(const json_t *mem) {
  if (json_is_number(mem)) return json_number_value(mem);
  if (!json_is_object(mem)) return -1;
  double sum = 0;
  const char *k;
  json_t *v;
  bool any = false;
  json_object_foreach((json_t *)mem, k, v) {
    if (json_is_number(v)) {
      sum += json_number_value(v);
      any = true;
    }
  }
  return any ? sum : -1;
}
