/* defines: the checksum of checkpoint data (XXH3, 64 bits: xxHash's fastest, tens of GB/s, so a
 * tensor is summed as it is written or read at no cost the disk would notice). The checkpoint
 * writers and readers (engine/model/safetensors.c, engine/train/checkpoint) sum each tensor's
 * bytes as they lie in the file; trainer.json and manifest.json record the sums as 16 hex
 * digits under ZT_CHECKSUM_NAME. */
#ifndef ZT_BASE_CHECKSUM_H
#define ZT_BASE_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

#define ZT_CHECKSUM_NAME "xxh3-64"
#define ZT_CHECKSUM_HEX 17 /* 16 digits and the NUL */

/* The sum of n bytes at once. */
uint64_t zt_checksum(const void *p, size_t n);

/* The same sum of bytes that come in pieces: new (NULL when out of memory), update with each
 * piece in order, digest (any time), free. */
typedef struct zt_checksum_state zt_checksum_state;
zt_checksum_state *zt_checksum_new(void);
void zt_checksum_update(zt_checksum_state *s, const void *p, size_t n);
uint64_t zt_checksum_digest(const zt_checksum_state *s);
void zt_checksum_free(zt_checksum_state *s);

/* "0123456789abcdef" and back (0, or -1 for anything but 16 lowercase hex digits). */
void zt_checksum_hex(uint64_t sum, char out[ZT_CHECKSUM_HEX]);
int zt_checksum_parse(const char *s, uint64_t *sum);

#endif
