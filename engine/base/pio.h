/* defines: file reads and writes of many MB issued as several pieces in flight, and a small
 * parallel loop (called by engine/model/safetensors.c: checkpoint and Hugging Face loads, and
 * the checkpoint and model writers). A buffered pread of 100 MB on one thread waits on the
 * kernel's readahead one window at a time; the same bytes as ZT_TUNE_PIO_PIECE_BYTES pieces on
 * ZT_TUNE_PIO_THREADS threads keep the disk's queue full. The bytes are the same either way. */
#ifndef ZT_BASE_PIO_H
#define ZT_BASE_PIO_H

#include <stddef.h>
#include <stdint.h>

/* len bytes at off into buf: 0, -EIO for a file that ends before off + len, or -errno. */
int zt_pio_pread(int fd, void *buf, size_t len, uint64_t off);
/* len bytes of buf to off: 0 or -errno. */
int zt_pio_pwrite(int fd, const void *buf, size_t len, uint64_t off);
/* fn(ctx, a, b) over [0, n) cut into ranges of at least grain, on up to ZT_TUNE_PIO_THREADS
 * threads (the caller's one of them); returns when every range is done. */
void zt_pio_for(size_t n, size_t grain, void (*fn)(void *ctx, size_t a, size_t b), void *ctx);

#endif
