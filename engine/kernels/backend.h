/* Choosing a backend by name and listing the devices it can use. The CUDA backend exists only in
 * builds with the toolkit (meson's `cuda` feature); elsewhere these calls answer for the CPU
 * alone, so callers need no #ifdefs. */
#ifndef ZT_KERNELS_BACKEND_H
#define ZT_KERNELS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "engine/kernels/ops.h"

/* The most devices a daemon describes. */
#define ZT_MAX_DEVICES 64

typedef struct zt_device_info {
  int index;
  char name[256];
  uint64_t mem_total;
  uint64_t mem_free;
} zt_device_info;

/* 1 when this build has the CUDA backend. */
int zt_backend_have_cuda(void);
/* The CUDA devices present (at most max described in out); 0 without the backend, a driver or
 * a device. Never fails: a broken driver reads as no device, with the reason logged once. */
int zt_backend_cuda_devices(zt_device_info *out, int max);

/* The op table of backend `kind` without opening it (NULL for an unknown kind): its
 * context-free entries size a job the way that backend will allocate it. A build without CUDA
 * has the cuda table's name and sizing entries alone (engine/kernels/cuda/sizes.h), so it
 * plans cuda jobs as a GPU machine does. */
const zt_ops *zt_backend_ops_of(const char *kind);

/* What a backend's alloc/free have taken, like torch.cuda.memory_stats. Bytes are the sizes
 * asked of alloc (not rounded). */
typedef struct zt_backend_mem {
  uint64_t allocated;         /* bytes of the live allocations */
  uint64_t peak;              /* the highest `allocated` since the backend opened */
  uint64_t reserved;          /* bytes of the reserved blocks still held (zt_backend_reserve):
                                 device memory on cuda, a budget on the cpu */
  uint64_t allocations;       /* live allocations */
  uint64_t allocations_total; /* allocations since the backend opened */
  uint64_t system_allocs;     /* of them, and of the blocks, those taken from the system
                                 (cudaMalloc, posix_memalign): a sub-allocation takes none */
  uint64_t own_device;        /* device bytes the backend holds for itself (cuda: reductions'
                                 scratch), outside `allocated` */
  uint64_t host_pinned;       /* page-locked host bytes the backend holds itself (cuda) */
} zt_backend_mem;

/* 0, or -EINVAL for a backend that is not open. Callable from any thread while it is open. */
int zt_backend_mem_stats(const zt_backend *be, zt_backend_mem *out);

/* How many allocations a reserved block has alignment room for beyond its bytes. */
#define ZT_BACKEND_RESERVE_ALLOCS 16

/* One block for a job's buffers, taken at job start: every alloc from now until
 * zt_backend_reserve_end is served from a block of `bytes` (plus alignment room for
 * ZT_BACKEND_RESERVE_ALLOCS allocations), so that the job's buffers cost one cudaMalloc; an
 * alloc the block cannot hold returns NULL (logged with the bytes asked and left). After
 * reserve_end, allocations are the backend's own again; the block is given back once its last
 * allocation is freed (or when the backend closes). cuda: one cudaMalloc, sub-allocated at
 * 256-byte alignment; cpu: a budget only, each allocation still its own (a sanitizer sees every
 * buffer's bounds) and counted against it with the same rounding, so that the CPU tests check
 * the sizes a GPU job will fit. 0, -EBUSY while a block is open, -ENOMEM (the block cannot be
 * taken), -EINVAL (no backend). */
int zt_backend_reserve(const zt_backend *be, size_t bytes);
void zt_backend_reserve_end(const zt_backend *be);

/* kind "cpu" (cpu_threads, 0 = all cores) or "cuda" (device). 0, or -errno with a message. */
int zt_backend_open(zt_backend *be, const char *kind, int device, int cpu_threads, char *err,
                    size_t errlen);
void zt_backend_close(zt_backend *be);

/* The device a cuda backend runs on and its compute stream (a cudaStream_t), so that a copy
 * engine can order its copies against the compute (offload/copy_engine.h); -1 and NULL for the
 * CPU. */
int zt_backend_device(const zt_backend *be);
void *zt_backend_stream(const zt_backend *be);
/* Makes the backend's device current on the calling thread, for a thread other than the one
 * that opened it (a data-parallel rank's); 0, or -EIO (cuda, logged). A no-op on the CPU. */
int zt_backend_bind_thread(const zt_backend *be);

#endif
