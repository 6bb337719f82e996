/* defines: zt_crc32c, the CRC-32C (Castagnoli) of a buffer, for the TFRecord framing of
 * TensorBoard's event files (engine/job/tfevents.c). Written here rather than taken from
 * libisal (Debian ships it shared only, and the static_deps build links everything statically);
 * tests/unit/base/test_crc32c.c checks it against RFC 3720's vectors. */
#ifndef ZT_BASE_CRC32C_H
#define ZT_BASE_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* The CRC of len bytes continuing from crc (0 to start): zt_crc32c(0, "123456789", 9) is
 * 0xe3069283. */
uint32_t zt_crc32c(uint32_t crc, const void *data, size_t len);

#endif
