/* Sizes as people write them: "24GiB", "1.5 GiB", "55GB", "4096" (bytes). The one parser of
 * ztd's SIZE flags and of the job spec's byte fields, and the one formatter of sizes in
 * messages. Called by engine/main.c, the config reader (engine/train/config.c) and every
 * refusal that prints a size. */
#ifndef ZT_BASE_SIZES_H
#define ZT_BASE_SIZES_H

#include <stddef.h>
#include <stdint.h>

/* A number (digits, an optional fraction) and an optional unit, with optional spaces between:
 * B; KiB, MiB, GiB, TiB (powers of 1024); KB, MB, GB, TB (powers of 1000); units in any case.
 * The result must be a whole number of bytes below 2^64. 0, or -EINVAL. */
int zt_size_parse(const char *s, uint64_t *out);
/* "1.21 TiB", "24 GiB", "512 B": at most two decimals, trailing zeros dropped. */
void zt_size_format(char *out, size_t outlen, double bytes);

#endif
