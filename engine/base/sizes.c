/* Size parsing and formatting (sizes.h). */
#include "engine/base/sizes.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int zt_size_parse(const char *s, uint64_t *out) {
  static const struct {
    const char *unit;
    double mult;
  } units[] = {{"", 1},
               {"B", 1},
               {"KiB", 1024.0},
               {"MiB", 1048576.0},
               {"GiB", 1073741824.0},
               {"TiB", 1099511627776.0},
               {"KB", 1e3},
               {"MB", 1e6},
               {"GB", 1e9},
               {"TB", 1e12}};
  if (!s || *s < '0' || *s > '9') return -EINVAL;
  /* digits and one optional fraction only: strtod would also take hex, exponents and inf */
  const char *p = s;
  while (*p >= '0' && *p <= '9') p++;
  if (*p == '.') {
    p++;
    if (*p < '0' || *p > '9') return -EINVAL;
    while (*p >= '0' && *p <= '9') p++;
  }
  char num[64];
  if ((size_t)(p - s) >= sizeof num) return -EINVAL;
  memcpy(num, s, (size_t)(p - s));
  num[p - s] = '\0';
  double x = strtod(num, NULL);
  while (*p == ' ') p++;
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
    if (strcasecmp(p, units[i].unit) != 0) continue;
    /* whole bytes: exactly, beyond the 2^53 a double holds */
    if (units[i].mult == 1 && !strchr(num, '.')) {
      errno = 0;
      unsigned long long v = strtoull(num, NULL, 10);
      if (errno) return -EINVAL;
      *out = v;
      return 0;
    }
    double bytes = x * units[i].mult;
    if (!(bytes < 18446744073709551616.0) || bytes != floor(bytes)) return -EINVAL;
    *out = (uint64_t)bytes;
    return 0;
  }
  return -EINVAL;
}

void zt_size_format(char *out, size_t outlen, double bytes) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 6) {
    bytes /= 1024.0;
    u++;
  }
  char num[64];
  snprintf(num, sizeof num, "%.2f", bytes);
  char *end = num + strlen(num);
  while (end[-1] == '0') *--end = '\0';
  if (end[-1] == '.') end[-1] = '\0';
  snprintf(out, outlen, "%s %s", num, units[u]);
}
