/* XXH3-64 through xxHash's header alone (XXH_INLINE_ALL): no library to link or ship. */
#include "engine/base/checksum.h"

#include <stdio.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

struct zt_checksum_state {
  XXH3_state_t *st;
};

uint64_t zt_checksum(const void *p, size_t n) { return XXH3_64bits(p, n); }

zt_checksum_state *zt_checksum_new(void) {
  static_assert(sizeof(XXH64_hash_t) == sizeof(uint64_t), "a 64-bit sum");
  zt_checksum_state *s = malloc(sizeof *s);
  if (!s) return NULL;
  if (!(s->st = XXH3_createState()) || XXH3_64bits_reset(s->st) != XXH_OK) {
    XXH3_freeState(s->st);
    free(s);
    return NULL;
  }
  return s;
}

void zt_checksum_update(zt_checksum_state *s, const void *p, size_t n) {
  XXH3_64bits_update(s->st, p, n);
}

uint64_t zt_checksum_digest(const zt_checksum_state *s) { return XXH3_64bits_digest(s->st); }

void zt_checksum_free(zt_checksum_state *s) {
  if (!s) return;
  XXH3_freeState(s->st);
  free(s);
}

void zt_checksum_hex(uint64_t sum, char out[ZT_CHECKSUM_HEX]) {
  snprintf(out, ZT_CHECKSUM_HEX, "%016llx", (unsigned long long)sum);
}

int zt_checksum_parse(const char *s, uint64_t *sum) {
  uint64_t v = 0;
  if (!s || strlen(s) != 16) return -1;
  for (int i = 0; i < 16; i++) {
    int c = s[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return -1;
    v = v << 4 | (uint64_t)d;
  }
  *sum = v;
  return 0;
}
