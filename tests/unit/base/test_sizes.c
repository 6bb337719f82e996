/* engine/base/sizes.h: the one SIZE parser (ztd's flags, the spec's byte fields) and formatter. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "engine/base/sizes.h"

static int fails;

static void ok(const char *s, uint64_t want) {
  uint64_t got = 0;
  int rc = zt_size_parse(s, &got);
  if (rc != 0 || got != want) {
    fprintf(stderr, "FAIL \"%s\": rc %d, %llu, want %llu\n", s, rc, (unsigned long long)got,
            (unsigned long long)want);
    fails++;
  }
}

static void bad(const char *s) {
  uint64_t got = 0;
  if (zt_size_parse(s, &got) != -EINVAL) {
    fprintf(stderr, "FAIL \"%s\" accepted as %llu\n", s, (unsigned long long)got);
    fails++;
  }
}

static void fmt(double bytes, const char *want) {
  char out[64];
  zt_size_format(out, sizeof out, bytes);
  if (strcmp(out, want)) {
    fprintf(stderr, "FAIL format %g: \"%s\", want \"%s\"\n", bytes, out, want);
    fails++;
  }
}

int main(void) {
  ok("4096", 4096);
  ok("0", 0);
  ok("24GiB", 24ull << 30);
  ok("1.5 GiB", 3ull << 29);
  ok("512MiB", 512ull << 20);
  ok("55GB", 55000000000ull);
  ok("2 gb", 2000000000ull);
  ok("1KB", 1000);
  ok("7B", 7);
  ok("18446744073709551615", UINT64_MAX);
  bad("");
  bad("lots");
  bad("-5");
  bad("24XB");
  bad("0x10");
  bad("1e3");
  bad("inf");
  bad("0.1B");
  bad("1.");
  bad("16EiB");
  bad("16777216TiB");
  bad("18446744073709551616");
  fmt(512, "512 B");
  fmt(24.0 * (1ull << 30), "24 GiB");
  fmt(1.5 * (1ull << 20), "1.5 MiB");
  fmt(1.2345 * (1ull << 40), "1.23 TiB");
  if (!fails) printf("sizes: ok\n");
  return fails ? 1 : 0;
}
