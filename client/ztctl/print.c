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
  } else if (json_is_real(j)) {
    /* seven significant digits: a float32 the daemon keeps shows as the number it was set to
     * (0.002, not 0.0020000000949949) */
    fprintf(f, "%s: %.7g\n", prefix, json_real_value(j));
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

/* -1 when absent, so that a figure the daemon did not send prints as "-" */
static double field(const json_t *o, const char *key) {
  const json_t *v = json_object_get(o, key);
  return json_is_number(v) ? json_number_value(v) : -1;
}

static void fmt_figure(char *buf, size_t cap, double bytes) {
  if (bytes >= 0) ztctl_fmt_bytes(buf, cap, bytes);
  else snprintf(buf, cap, "-");
}

void ztctl_fmt_job_memory(char *buf, size_t cap, const json_t *mem, ztctl_mem_part part) {
  char a[32], b[32], c[32], d[32];
  const json_t *off = json_object_get(mem, "offload");
  const json_t *tl = json_object_get(off, "timeline");
  buf[0] = 0;
  switch (part) {
  case ZTCTL_MEM_FIGURES:
    fmt_figure(a, sizeof a, field(mem, "allocated"));
    fmt_figure(b, sizeof b, field(mem, "peak"));
    fmt_figure(c, sizeof c, field(mem, "reserved"));
    fmt_figure(d, sizeof d, field(mem, "host_pinned"));
    snprintf(buf, cap, "%s allocated, peak %s, reserved %s, host pinned %s", a, b, c, d);
    break;
  case ZTCTL_MEM_BRIEF:
    fmt_figure(a, sizeof a, field(mem, "allocated"));
    fmt_figure(b, sizeof b, field(mem, "peak"));
    fmt_figure(c, sizeof c, field(mem, "reserved"));
    snprintf(buf, cap, "%s (peak %s, reserved %s)", a, b, c);
    break;
  case ZTCTL_MEM_TIERS:
    if (!json_is_object(off)) break;
    fmt_figure(a, sizeof a, field(off, "device_budget"));
    fmt_figure(b, sizeof b, field(off, "host_bytes"));
    fmt_figure(c, sizeof c, field(off, "host_pinned"));
    fmt_figure(d, sizeof d, field(off, "nvme_bytes"));
    snprintf(buf, cap, "device %s, host %s (%s pinned), nvme %s", a, b, c, d);
    break;
  case ZTCTL_MEM_TIMELINE: {
    if (!json_is_object(tl)) break;
    int n = snprintf(buf, cap, "%s %.0f%% h2d %.0f%% d2h %.0f%% cpu-adam %.0f%% nvme %.0f%%",
                     strcmp(json_string_value(json_object_get(mem, "backend")) ?: "", "cuda") == 0
                         ? "gpu" : "compute",
                     100 * field(tl, "compute"), 100 * field(tl, "h2d"), 100 * field(tl, "d2h"),
                     100 * field(tl, "optimizer"), 100 * field(tl, "nvme"));
    /* what the trainer stood waiting for, where the daemon reports it */
    const json_t *w = json_object_get(tl, "waits");
    if (json_is_object(w) && n > 0 && (size_t)n < cap)
      snprintf(buf + n, cap - (size_t)n, "; waited on copies %.0f%% cpu-adam %.0f%% nvme %.0f%%",
               100 * field(w, "copy"), 100 * field(w, "optimizer"), 100 * field(w, "nvme"));
    break;
  }
  }
}
