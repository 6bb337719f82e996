/* engine/base/crc32c.h: the CRC-32C of TensorBoard's record framing, against RFC 3720's
 * vectors (B.4) and the usual check value, whole and in pieces. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "engine/base/crc32c.h"

static int fails;

static void want(const char *what, uint32_t got, uint32_t crc) {
  if (got != crc) {
    fprintf(stderr, "FAIL %s: %08x, want %08x\n", what, got, crc);
    fails++;
  }
}

int main(void) {
  unsigned char buf[48];
  want("123456789", zt_crc32c(0, "123456789", 9), 0xe3069283u);
  memset(buf, 0, 32);
  want("32 zeros", zt_crc32c(0, buf, 32), 0x8a9136aau);
  memset(buf, 0xff, 32);
  want("32 0xff", zt_crc32c(0, buf, 32), 0x62a8ab43u);
  for (int i = 0; i < 32; i++) buf[i] = (unsigned char)i;
  want("0..31", zt_crc32c(0, buf, 32), 0x46dd794eu);
  for (int i = 0; i < 32; i++) buf[i] = (unsigned char)(31 - i);
  want("31..0", zt_crc32c(0, buf, 32), 0x113fdb5cu);
  /* an iSCSI read command PDU */
  static const unsigned char pdu[48] = {
      0x01, 0xc0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x14, 0, 0, 0, 0, 0, 0x04, 0,
      0, 0, 0, 0x14, 0, 0, 0, 0x18, 0x28, 0, 0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0, 0, 0, 0, 0};
  want("iSCSI PDU", zt_crc32c(0, pdu, sizeof pdu), 0xd9963a56u);
  want("in pieces", zt_crc32c(zt_crc32c(0, "1234", 4), "56789", 5), 0xe3069283u);
  want("empty", zt_crc32c(0, "", 0), 0);
  if (!fails) printf("crc32c: ok\n");
  return fails ? 1 : 0;
}
