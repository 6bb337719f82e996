/* The NVMe tier: named fixed-size extents, one file each under a directory (--nvme-dir), read and
 * written asynchronously through io_uring with several requests in flight, so optimizer state
 * can be read ahead of its update and written behind it.
 *
 * Files are opened with O_DIRECT (the page cache would only double the host memory we are trying
 * to save); a filesystem that refuses O_DIRECT (EINVAL) gets buffered I/O with a warning, and the
 * stats say which mode is in use. O_DIRECT needs 4096-aligned buffer addresses and offsets: the
 * store checks both. Lengths may be unaligned only where the range ends at the extent's end (the
 * tail): the store moves that last partial block through its own aligned bounce block, so the
 * caller's buffer needs only `len` bytes.
 *
 * A store belongs to one thread (the job's runner owns its io_uring); it is not thread-safe.
 * Every call that fails returns a negative errno; zt_nvme_store_error() then holds a message
 * that names the file. Closing the store removes every file it created. */
#ifndef ZT_OFFLOAD_NVME_STORE_H
#define ZT_OFFLOAD_NVME_STORE_H

#include <stddef.h>
#include <stdint.h>

/* Alignment of buffers, offsets and on-disk extent sizes (the largest logical block size of
 * the devices we target; 512-byte devices accept it too). */
#define ZT_NVME_ALIGN 4096u

typedef struct zt_nvme_tunables {
  unsigned queue_depth;  /* io_uring entries = I/Os in flight at once (default 32) */
  size_t block_bytes;    /* one request is cut into I/Os of at most this many bytes, a multiple
                            of ZT_NVME_ALIGN (default 1 MiB) */
  unsigned max_requests; /* requests submitted and not yet waited for (default 256) */
  int direct;            /* 1: O_DIRECT, buffered where the filesystem refuses it (default);
                            0: buffered I/O */
} zt_nvme_tunables;

void zt_nvme_tunables_default(zt_nvme_tunables *t);

typedef struct zt_nvme_stats {
  int direct;                /* 1 when the files are opened with O_DIRECT */
  uint64_t extents;          /* extents allocated */
  uint64_t extent_bytes;     /* their sizes as asked for */
  uint64_t bytes_read;       /* bytes delivered to callers' buffers */
  uint64_t bytes_written;    /* bytes taken from callers' buffers */
  uint64_t requests;         /* zt_nvme_read/zt_nvme_write calls accepted */
  uint64_t ios;              /* I/Os submitted to the ring, resubmissions included */
  uint64_t short_resubmits;  /* short reads/writes resubmitted for their remainder */
  uint64_t retries;          /* I/Os retried after -EAGAIN/-EINTR */
  uint64_t fixed_ios;        /* I/Os that used a registered buffer */
  uint64_t errors;           /* requests that failed */
  uint64_t busy_ns;          /* wall time with at least one I/O in flight */
  uint64_t wait_ns;          /* the caller's time blocked in zt_nvme_wait and zt_nvme_drain */
} zt_nvme_stats;

typedef struct zt_nvme_store zt_nvme_store;

/* Opens a store over the existing directory `dir` (t NULL: defaults). On failure *out is NULL
 * and err holds the reason. io_uring setup failing with -ENOSYS/-EPERM means the kernel or a
 * sandbox forbids io_uring. */
int zt_nvme_store_open(zt_nvme_store **out, const char *dir, const zt_nvme_tunables *t,
                       char *err, size_t errlen);
/* Waits for every I/O still in flight, then removes the files the store created. NULL is a
 * no-op. */
void zt_nvme_store_close(zt_nvme_store *s);

/* Creates the file `dir/name` (which must not exist; name has no '/') for an extent of `bytes`
 * bytes and reserves its space with fallocate where the filesystem supports it, so a full disk
 * shows here rather than in a write-behind later. Returns the extent id (>= 0). */
int zt_nvme_store_alloc(zt_nvme_store *s, const char *name, uint64_t bytes);

/* Registers a staging buffer (address ZT_NVME_ALIGN-aligned) with the ring so that I/O to or
 * from any part of it skips the kernel's per-I/O page pinning. Only with no request in flight;
 * at most 16 buffers. The buffer must stay allocated until the store is closed. */
int zt_nvme_store_register(zt_nvme_store *s, void *buf, size_t bytes);

/* An aligned staging buffer of at least `bytes` bytes (rounded up to ZT_NVME_ALIGN); free it
 * with free(). */
int zt_nvme_buffer_alloc(size_t bytes, void **out);

/* Starts reading/writing len bytes at offset of extent ext from/to buf. Returns a request id
 * (>= 0) for zt_nvme_wait; the buffer must stay untouched until then. -EBUSY when max_requests
 * are outstanding (wait for one first), -EINVAL for a range or alignment the rules above
 * forbid. */
int zt_nvme_read(zt_nvme_store *s, int ext, uint64_t offset, void *buf, size_t len);
int zt_nvme_write(zt_nvme_store *s, int ext, uint64_t offset, const void *buf, size_t len);

/* Waits for one request and releases its id: 0, or the request's first error as -errno. */
int zt_nvme_wait(zt_nvme_store *s, int req);
/* Waits for every outstanding request and releases them all: 0 or the first error. */
int zt_nvme_drain(zt_nvme_store *s);

/* The message of the last failure (names the file for I/O errors); "" when none. */
const char *zt_nvme_store_error(const zt_nvme_store *s);
void zt_nvme_store_get_stats(const zt_nvme_store *s, zt_nvme_stats *out);
/* The path of an extent's file (for messages and tests); NULL for a bad id. */
const char *zt_nvme_extent_path(const zt_nvme_store *s, int ext);

/* Fault injection for tests: the nth I/O completion from now (1 = the next) is replaced by
 * -err, as if the device had failed it. n = 0 disarms. */
void zt_nvme_store_fail_nth(zt_nvme_store *s, uint64_t n, int err);

/* Fault injection from outside the process (a testing aid, e.g. for a job run by ztd): the
 * environment variable ZT_FAULT_NVME, read by every zt_nvme_store_open, arms the store it opens.
 *   ZT_FAULT_NVME=eio:read:N    the Nth zt_nvme_read request of the store (N >= 1, counted from
 *   ZT_FAULT_NVME=eio:write:N   the open) or the Nth zt_nvme_write completes with -EIO
 * The request's first I/O goes to the device and its completion is replaced by -EIO, so a
 * faulty write may have written its bytes, as a real one may; the message names the file and
 * says "Input/output error (injected by ZT_FAULT_NVME)". Unset or empty: no fault. Any other
 * value fails the open with -EINVAL naming the variable, so a mistyped test cannot pass by
 * injecting nothing. The open logs a warning when a fault is armed. */

#endif
