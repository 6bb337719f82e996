#include "engine/kernels/backend.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "engine/kernels/cuda/sizes.h"
#include "engine/kernels/mem.h"

#ifdef ZT_HAVE_CUDA
#include "engine/kernels/cuda/cuda_backend.h"
#endif

int zt_backend_have_cuda(void) {
#ifdef ZT_HAVE_CUDA
  return 1;
#else
  return 0;
#endif
}

int zt_backend_cuda_devices(zt_device_info *out, int max) {
#ifdef ZT_HAVE_CUDA
  return zt_cuda_devices(out, max);
#else
  (void)out;
  (void)max;
  return 0;
#endif
}

const zt_ops *zt_backend_ops_of(const char *kind) {
  if (strcmp(kind, "cpu") == 0) return zt_backend_cpu_ops();
#ifdef ZT_HAVE_CUDA
  if (strcmp(kind, "cuda") == 0) return zt_backend_cuda_ops();
#else
  if (strcmp(kind, "cuda") == 0) return zt__cuda_sizing_ops();
#endif
  return NULL;
}

int zt_backend_open(zt_backend *be, const char *kind, int device, int cpu_threads, char *err,
                    size_t errlen) {
  int rc;
  memset(be, 0, sizeof *be);
  if (strcmp(kind, "cpu") == 0) {
    if ((rc = zt_backend_cpu_open(be, cpu_threads)) < 0)
      snprintf(err, errlen, "cpu backend: %s", strerror(-rc));
    return rc;
  }
  if (strcmp(kind, "cuda") == 0) {
#ifdef ZT_HAVE_CUDA
    if ((rc = zt_backend_cuda_open(be, device)) < 0)
      snprintf(err, errlen, "cuda backend on GPU %d: %s", device,
               rc == -ENODEV ? "no such device" : strerror(-rc));
    return rc;
#else
    snprintf(err, errlen, "cuda backend: this build of zt has no CUDA support");
    return -ENOTSUP;
#endif
  }
  snprintf(err, errlen, "unknown backend '%s'", kind);
  return -EINVAL;
}

void zt_backend_close(zt_backend *be) {
  if (!be->ops) return;
#ifdef ZT_HAVE_CUDA
  if (strcmp(be->ops->name, "cuda") == 0) {
    zt_backend_cuda_close(be);
    return;
  }
#endif
  zt_backend_cpu_close(be);
}

int zt_backend_device(const zt_backend *be) {
#ifdef ZT_HAVE_CUDA
  if (be->ops && strcmp(be->ops->name, "cuda") == 0) return zt_backend_cuda_device(be);
#endif
  (void)be;
  return -1;
}

int zt_backend_bind_thread(const zt_backend *be) {
#ifdef ZT_HAVE_CUDA
  if (be->ops && strcmp(be->ops->name, "cuda") == 0) return zt_backend_cuda_bind_thread(be);
#endif
  (void)be;
  return 0;
}

void *zt_backend_stream(const zt_backend *be) {
#ifdef ZT_HAVE_CUDA
  if (be->ops && strcmp(be->ops->name, "cuda") == 0) return zt_backend_cuda_stream(be);
#endif
  (void)be;
  return NULL;
}

static zt__mem *mem_of(const zt_backend *be) {
  if (!be || !be->ops || !be->ctx) return NULL;
#ifdef ZT_HAVE_CUDA
  if (strcmp(be->ops->name, "cuda") == 0) return zt__cuda_mem(be->ctx);
#endif
  if (strcmp(be->ops->name, "cpu") == 0) return zt__cpu_mem(be->ctx);
  return NULL;
}

int zt_backend_mem_stats(const zt_backend *be, zt_backend_mem *out) {
  zt__mem *m = mem_of(be);
  if (!m) return -EINVAL;
  zt__mem_stats(m, out);
  return 0;
}

int zt_backend_reserve(const zt_backend *be, size_t bytes) {
  zt__mem *m = mem_of(be);
  return m ? zt__mem_reserve(m, bytes) : -EINVAL;
}

void zt_backend_reserve_end(const zt_backend *be) {
  zt__mem *m = mem_of(be);
  if (m) zt__mem_reserve_end(m);
}
