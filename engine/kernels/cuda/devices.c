/* Device enumeration for ztd's status and for choosing the backend: names and memory. */
#include <cuda_runtime_api.h>
#include <stdio.h>

#include "engine/kernels/cuda/cuda_backend.h"
#include "engine/base/log.h"

int zt_cuda_devices(zt_device_info *out, int max) {
  static int logged;
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    if (!logged++) ZT_LOGI("cuda", "no CUDA device: %s", cudaGetErrorString(e));
    return 0;
  }
  int prev = -1;
  cudaGetDevice(&prev);
  for (int i = 0; i < count && i < max; i++) {
    struct cudaDeviceProp p;
    size_t free_b = 0, total_b = 0;
    out[i] = (zt_device_info){.index = i};
    if (cudaGetDeviceProperties(&p, i) == cudaSuccess)
      snprintf(out[i].name, sizeof out[i].name, "%s", p.name);
    if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
      out[i].mem_total = total_b;
      out[i].mem_free = free_b;
    }
  }
  if (prev >= 0) cudaSetDevice(prev);
  return count;
}
