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

/* The op table of backend `kind` without opening it (NULL for an unknown kind or a backend this
 * build lacks): its context-free entries size a job the way that backend will allocate it. */
const zt_ops *zt_backend_ops_of(const char *kind);

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
