/* The NCCL communicator (engine/comm/comm_nccl.h): each collective is the NCCL call of the same
 * name, queued on the rank backend's stream. A failed call is logged with file and line, turned
 * into -errno, and is sticky: the ranks are out of step after it, so every later call returns
 * the first error until the communicator is closed. */
#include "engine/comm/comm_nccl.h"

#include <cuda_runtime_api.h>
#include <errno.h>
/* nccl.h declares a few functions as f() */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/log.h"

_Static_assert(sizeof(zt_comm_nccl_id) == sizeof(ncclUniqueId),
               "zt_comm_nccl_id holds an ncclUniqueId");

typedef struct nccl_ctx {
  ncclComm_t comm;
  int rank, world, device;
  int aborted;
  float *one;   /* a device float for the barrier's all-reduce */
  int err;      /* the first error as -errno, 0 while none */
  char err_text[256];
} nccl_ctx;

static int nccl_errno(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return 0;
  case ncclInvalidArgument:
  case ncclInvalidUsage: return -EINVAL;
  case ncclRemoteError: return -ECONNRESET;
  case ncclInProgress: return -EINPROGRESS;
  default: return -EIO; /* CUDA, system and internal errors */
  }
}

/* Records the first failure (logged with where it happened) and returns it. */
static int fail(nccl_ctx *c, int code, const char *what, const char *why, const char *file,
                int line) {
  zt_log(ZT_LOG_ERROR, "comm", "%s:%d: rank %d: %s: %s", file, line, c->rank, what, why);
  if (!c->err) {
    c->err = code;
    snprintf(c->err_text, sizeof c->err_text, "rank %d (device %d): %s: %s", c->rank, c->device,
             what, why);
  }
  return c->err;
}

static int check_nccl(nccl_ctx *c, ncclResult_t r, const char *what, const char *file,
                      int line) {
  if (r == ncclSuccess) return 0;
  char why[192];
  const char *last = c->comm ? ncclGetLastError(c->comm) : "";
  snprintf(why, sizeof why, "%s%s%s", ncclGetErrorString(r), last && last[0] ? ": " : "",
           last ? last : "");
  return fail(c, nccl_errno(r), what, why, file, line);
}

static int check_cuda(nccl_ctx *c, cudaError_t e, const char *what, const char *file, int line) {
  return e == cudaSuccess ? 0 : fail(c, -EIO, what, cudaGetErrorString(e), file, line);
}

#define NCCL_CALL(c, expr) check_nccl((c), (expr), #expr, __FILE__, __LINE__)
#define CUDA_CALL(c, expr) check_cuda((c), (expr), #expr, __FILE__, __LINE__)

static int usable(nccl_ctx *c) {
  if (c->err) return c->err;
  if (c->aborted) {
    c->err = -ECANCELED;
    snprintf(c->err_text, sizeof c->err_text, "rank %d: the communicator was aborted", c->rank);
  }
  return c->err;
}

static int n_rank(void *ctx) { return ((const nccl_ctx *)ctx)->rank; }
static int n_world(void *ctx) { return ((const nccl_ctx *)ctx)->world; }

static int n_all_reduce(void *ctx, const float *send, float *recv, size_t count, void *stream) {
  nccl_ctx *c = ctx;
  int rc = usable(c);
  if (rc == 0)
    rc = NCCL_CALL(c, ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, c->comm,
                                    (cudaStream_t)stream));
  return rc;
}

static int n_reduce_scatter(void *ctx, const float *send, float *recv, size_t count,
                            void *stream) {
  nccl_ctx *c = ctx;
  int rc = usable(c);
  if (rc == 0)
    rc = NCCL_CALL(c, ncclReduceScatter(send, recv, count, ncclFloat32, ncclSum, c->comm,
                                        (cudaStream_t)stream));
  return rc;
}

static int n_all_gather(void *ctx, const void *send, void *recv, size_t bytes, void *stream) {
  nccl_ctx *c = ctx;
  int rc = usable(c);
  if (rc == 0)
    rc = NCCL_CALL(c, ncclAllGather(send, recv, bytes, ncclUint8, c->comm, (cudaStream_t)stream));
  return rc;
}

static int n_broadcast(void *ctx, const void *send, void *recv, size_t bytes, int root,
                       void *stream) {
  nccl_ctx *c = ctx;
  int rc = usable(c);
  if (rc == 0)
    rc = NCCL_CALL(c, ncclBroadcast(send, recv, bytes, ncclUint8, root, c->comm,
                                    (cudaStream_t)stream));
  return rc;
}

/* NCCL has no barrier: a one-float all-reduce that every rank waits for on the host. */
static int n_barrier(void *ctx, void *stream) {
  nccl_ctx *c = ctx;
  int rc = usable(c);
  if (rc == 0)
    rc = NCCL_CALL(c, ncclAllReduce(c->one, c->one, 1, ncclFloat32, ncclSum, c->comm,
                                    (cudaStream_t)stream));
  if (rc == 0) rc = CUDA_CALL(c, cudaStreamSynchronize((cudaStream_t)stream));
  return rc;
}

static void n_abort(void *ctx) {
  nccl_ctx *c = ctx;
  if (c->aborted) return;
  ncclResult_t r = ncclCommAbort(c->comm);
  if (r != ncclSuccess)
    ZT_LOGE("comm", "rank %d: ncclCommAbort: %s", c->rank, ncclGetErrorString(r));
  c->aborted = 1;
}

static const char *n_error_text(void *ctx) { return ((const nccl_ctx *)ctx)->err_text; }

static const zt_comm_ops nccl_ops = {
    .name = "nccl",
    .rank = n_rank,
    .world = n_world,
    .all_reduce = n_all_reduce,
    .reduce_scatter = n_reduce_scatter,
    .all_gather = n_all_gather,
    .broadcast = n_broadcast,
    .barrier = n_barrier,
    .abort = n_abort,
    .error_text = n_error_text,
};

int zt_comm_nccl_get_id(zt_comm_nccl_id *id, char *err, size_t errlen) {
  if (setenv("NCCL_NVLS_ENABLE", "0", 0) < 0) {
    int e = errno;
    snprintf(err, errlen, "setenv NCCL_NVLS_ENABLE: %s", strerror(e));
    return -e;
  }
  ncclUniqueId u;
  ncclResult_t r = ncclGetUniqueId(&u);
  if (r != ncclSuccess) {
    ZT_LOGE("comm", "%s:%d: ncclGetUniqueId: %s", __FILE__, __LINE__, ncclGetErrorString(r));
    snprintf(err, errlen, "ncclGetUniqueId: %s", ncclGetErrorString(r));
    return nccl_errno(r);
  }
  memcpy(id->bytes, u.internal, sizeof id->bytes);
  return 0;
}

int zt_comm_nccl_open(zt_comm *out, int world, int rank, const zt_comm_nccl_id *id, int device,
                      char *err, size_t errlen) {
  out->ops = NULL;
  out->ctx = NULL;
  if (world < 1 || rank < 0 || rank >= world || device < 0) {
    snprintf(err, errlen, "nccl: rank %d of world %d on device %d is out of range", rank, world,
             device);
    return -EINVAL;
  }
  nccl_ctx *c = calloc(1, sizeof *c);
  if (!c) {
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  *c = (nccl_ctx){.rank = rank, .world = world, .device = device};
  ncclUniqueId u;
  memcpy(u.internal, id->bytes, sizeof u.internal);
  int rc = CUDA_CALL(c, cudaSetDevice(device));
  if (rc == 0) rc = CUDA_CALL(c, cudaMalloc((void **)&c->one, sizeof(float)));
  if (rc == 0) rc = CUDA_CALL(c, cudaMemset(c->one, 0, sizeof(float)));
  if (rc == 0) rc = NCCL_CALL(c, ncclCommInitRank(&c->comm, world, u, rank));
  if (rc < 0) {
    snprintf(err, errlen, "%s", c->err_text);
    c->comm = NULL; /* nothing to destroy: ncclCommInitRank failed or was not called */
    out->ctx = c;
    zt_comm_nccl_close(out);
    return rc;
  }
  out->ops = &nccl_ops;
  out->ctx = c;
  return 0;
}

void zt_comm_nccl_close(zt_comm *cm) {
  if (!cm || !cm->ctx) return;
  nccl_ctx *c = cm->ctx;
  if (c->comm && !c->aborted) {
    ncclResult_t r = ncclCommDestroy(c->comm);
    if (r != ncclSuccess)
      ZT_LOGE("comm", "rank %d: ncclCommDestroy: %s", c->rank, ncclGetErrorString(r));
  }
  if (c->one) cudaFree(c->one);
  free(c);
  cm->ops = NULL;
  cm->ctx = NULL;
}
