#include "engine/base/crc32c.h"

#include <pthread.h>

/* the reflected Castagnoli polynomial */
#define POLY 0x82f63b78u

static uint32_t g_table[256];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void table_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
    g_table[i] = c;
  }
}

uint32_t zt_crc32c(uint32_t crc, const void *data, size_t len) {
  pthread_once(&g_once, table_init);
  const unsigned char *p = data;
  crc = ~crc;
  while (len--) crc = g_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
  return ~crc;
}
