/* The CUDA backend of the op interface (engine/kernels/ops.h) on one device. Plain C: no CUDA
 * types here, so callers need not see the toolkit's headers. */
#ifndef ZT_KERNELS_CUDA_BACKEND_H
#define ZT_KERNELS_CUDA_BACKEND_H

#include "engine/kernels/backend.h"
#include "engine/kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Opens a context on `device`: its stream, cuBLAS handle (fp32 math, no TF32), a pinned
 * buffer for scalar results and a device scratch buffer for reductions, all taken here.
 * Returns 0, -ENODEV when there is no such device, -EINVAL, -ENOMEM or -EIO (logged).
 * The context makes `device` current on the calling thread; use it from that thread (or make
 * the device current first). After any failed CUDA/cuBLAS call the context is poisoned: every
 * later op is skipped and sync() returns the first error; close it. */
int zt_backend_cuda_open(zt_backend *be, int device);
/* The op table alone (no device touched), for the context-free sizing entries. */
const zt_ops *zt_backend_cuda_ops(void);
void zt_backend_cuda_close(zt_backend *be);
/* The context's device and stream (a cudaStream_t). */
int zt_backend_cuda_device(const zt_backend *be);
void *zt_backend_cuda_stream(const zt_backend *be);
/* cudaSetDevice(the context's device) on the calling thread: 0 or -EIO (logged). */
int zt_backend_cuda_bind_thread(const zt_backend *be);
/* The accounting of a context's alloc/free (engine/kernels/mem.h), for backend.h's memory
 * calls. */
struct zt__mem *zt__cuda_mem(void *ctx);

/* Describes up to max CUDA devices; returns how many there are (0 when the driver finds none
 * or fails: the reason is logged once). */
int zt_cuda_devices(zt_device_info *out, int max);


#ifdef __cplusplus
}
#endif

#endif
