/* The coordinator's side of a job spanning daemons (parallel.peers): the daemon a job was
 * submitted to runs ranks 0 .. gpus-1 and asks every peer ztd, over its TCP listener with the
 * shared token, to run the next ranks as a part (the protocol's join). Each part's connection
 * stays open for the job's life, watching that part's events: a part that fails, or a connection
 * that drops, is reported at once so that the coordinator's ranks stop waiting for it in NCCL.
 * When the coordinator's runner ends, it waits a while for the parts to end by themselves (they
 * stop at the same step, decided together: engine/train/dp/dp.h's step flags), then closes the
 * connections, which ends any part still running.
 *
 * Pushed data (a stream job): the client pushes every rank's micro-batches to the coordinator,
 * which forwards each part its ranks' micro-batches of the step over a second connection to
 * that peer (the part is a stream job there), before the step; a push waits for the part's
 * credit as a client's does. */
#ifndef ZT_JOB_PEERS_H
#define ZT_JOB_PEERS_H

#include <stddef.h>

#include "engine/job/internal.h"

typedef struct zt__peers zt__peers;

/* Called from a watching thread, at most once per zt__peers, with why a part is lost. */
typedef void (*zt__peers_lost_cb)(void *arg, const char *why);

/* Starts a part on every peer of job->spec: ranks gpus * (i + 1) .. of the group nccl_id_hex
 * (2 * 128 hex digits), from the coordinator's checkpoint at resume_step (0: none). On failure
 * (a peer unreachable, refusing the token or the part: err names the peer and its reason) the
 * parts already started are ended. */
int zt__peers_start(zt__peers **out, const zt__job *job, const char *nccl_id_hex,
                    int resume_step, zt__peers_lost_cb lost, void *arg, char *err,
                    size_t errlen);

/* Stream jobs: forwards the step's micro-batches (world * grad_accum of micro_tokens tokens,
 * back to back, with their ZT__MARK_* marks, engine/job/data.h) of each peer's ranks to its
 * part. 0, or -errno with err naming the peer. */
int zt__peers_push(zt__peers *p, const int32_t *batch, const uint8_t *marks, size_t micro_tokens,
                   char *err, size_t errlen);

/* Waits up to wait_s seconds for every part to end, then closes the connections (ending the
 * parts still running), joins the watching threads and frees. No lost callback runs once this
 * has started. NULL is a no-op. */
void zt__peers_finish(zt__peers *p, int wait_s);

#endif
