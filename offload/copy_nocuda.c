/* A build without the CUDA toolkit: the CUDA copy engine and pinned memory answer that they are
 * absent, so callers need no #ifdefs (as engine/kernels/backend.h). */
#include <errno.h>

#include "offload/copy_engine.h"
#include "offload/host_arena.h"

int zt_copy_cuda_open(zt_copy_engine **out, int device, void *compute_stream) {
  (void)device;
  (void)compute_stream;
  *out = NULL;
  return -ENOTSUP;
}

const zt_host_mem_ops *zt_host_mem_cuda(void) { return NULL; }
