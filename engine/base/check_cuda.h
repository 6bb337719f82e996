/* The check's converters for CUDA, cuBLAS and NCCL (check.h): a status becomes 0 or a negative
 * errno, a failure logged once through zt_check_fail with the library's text. Header-only, so
 * that engine/base needs no CUDA: included by the CUDA backend (engine/kernels/cuda), the NCCL
 * communicator (engine/comm/nccl.c) and the CUDA copy engine (offload/copy_cuda.c), each built
 * only with the toolkit; the backend's ZT__CU / ZT__CUBLAS (engine/kernels/cuda/cuda.h) are
 * their goto forms for its void ops. ZT_CUDA_STATUS(sub, status, what) is the expression form
 * for a status in hand, named by what was being done. NCCL's converter exists where nccl.h was
 * included before this header. text / textlen: where a module keeps the failure's text (NULL:
 * nowhere). */
#ifndef ZT_BASE_CHECK_CUDA_H
#define ZT_BASE_CHECK_CUDA_H

#include <errno.h>
#include <stdio.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "engine/base/check.h"

static inline int zt_check_cuda(cudaError_t e, const char *sub, const char *call,
                                const char *file, int line, char *text, size_t textlen) {
  if (e == cudaSuccess) return 0;
  char why[160];
  snprintf(why, sizeof why, "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
  return zt_check_fail(sub, file, line, call, -EIO, why, text, textlen);
}

static inline int zt_check_cublas(cublasStatus_t s, const char *sub, const char *call,
                                  const char *file, int line, char *text, size_t textlen) {
  if (s == CUBLAS_STATUS_SUCCESS) return 0;
  char why[160];
  snprintf(why, sizeof why, "%s (%s)", cublasGetStatusString(s), cublasGetStatusName(s));
  return zt_check_fail(sub, file, line, call, -EIO, why, text, textlen);
}

#define ZT_CUDA_STATUS(sub, status, what)                                                      \
  zt_check_cuda((status), (sub), (what), __FILE__, __LINE__, NULL, 0)

#ifdef NCCL_H_
/* NCCL's result as an errno: a remote peer's failure is a reset connection, bad arguments are
 * EINVAL, the rest (CUDA, system, internal) EIO. */
static inline int zt_nccl_errno(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return 0;
  case ncclInvalidArgument:
  case ncclInvalidUsage: return -EINVAL;
  case ncclRemoteError: return -ECONNRESET;
  case ncclInProgress: return -EINPROGRESS;
  default: return -EIO;
  }
}

/* ncclGetLastError's comm is unused (NCCL's docs: "can be set to NULL"). */
static inline int zt_check_nccl(ncclResult_t r, const char *sub, const char *call,
                                const char *file, int line, char *text, size_t textlen) {
  if (r == ncclSuccess) return 0;
  char why[192];
  const char *last = ncclGetLastError(NULL);
  snprintf(why, sizeof why, "%s%s%s", ncclGetErrorString(r), last && last[0] ? ": " : "",
           last ? last : "");
  return zt_check_fail(sub, file, line, call, zt_nccl_errno(r), why, text, textlen);
}
#endif

#endif
