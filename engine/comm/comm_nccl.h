/* The NCCL communicator (engine/comm/comm.h's table on NCCL): one rank per CUDA device, each
 * driven by its own thread. Built only with the cuda feature and NCCL (ZT_HAVE_NCCL); plain C,
 * no NCCL or CUDA types here. */
#ifndef ZT_COMM_COMM_NCCL_H
#define ZT_COMM_COMM_NCCL_H

#include <stddef.h>

#include "engine/comm/comm.h"

/* The group's identity, made once (by the thread that starts the ranks) and handed to every
 * rank: ncclUniqueId's bytes. */
typedef struct zt_comm_nccl_id {
  char bytes[128];
} zt_comm_nccl_id;

/* ncclGetUniqueId. Sets NCCL_NVLS_ENABLE=0 in the environment unless it is set (NVLink SHARP
 * multicast stays off, as the GPU machines we are lent require), here because this
 * runs before any rank thread exists and before NCCL reads its environment. */
int zt_comm_nccl_get_id(zt_comm_nccl_id *id, char *err, size_t errlen);
/* Rank `rank` of `world` on CUDA device `device`, called from the thread that will use it (the
 * device becomes current there). ncclCommInitRank blocks until every rank has called it, so the
 * ranks call it from their own threads at the same time. 0 or -errno with the NCCL text. */
int zt_comm_nccl_open(zt_comm *c, int world, int rank, const zt_comm_nccl_id *id, int device,
                      char *err, size_t errlen);
/* Destroys the NCCL communicator (unless aborted) and frees what open took. */
void zt_comm_nccl_close(zt_comm *c);

#endif
