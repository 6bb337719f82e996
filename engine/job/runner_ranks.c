/* defines: zt__runner_open_ranks and zt__runner_close_ranks (internal.h; called by runner.c):
 * a job's backends, a rank per device it holds here, and with several ranks their
 * communicators: the CPU group, or NCCL's, whose id the coordinator of a job spanning daemons
 * hands to the parts it starts on its peers (peers.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine/comm/comm.h"
#ifdef ZT_HAVE_NCCL
#include "engine/comm/comm_nccl.h"
#endif
#include "engine/kernels/backend.h"
#include "engine/job/internal.h"
#include "engine/job/peers.h"

#ifdef ZT_HAVE_NCCL
/* The NCCL communicators of a job's ranks. ncclCommInitRank returns once every rank has called
 * it, so each rank calls it on a thread of its own; all the threads exist before any of them
 * calls, because ranks whose thread could not be made would leave the others waiting forever. */
typedef struct nccl_group {
  runner *r;
  zt_comm_nccl_id id;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int go; /* 0 wait, 1 open, -1 leave */
  int rank_rc[ZT_JOBS_MAX_GPUS];
  char rank_err[ZT_JOBS_MAX_GPUS][256];
} nccl_group;

typedef struct nccl_arg {
  nccl_group *g;
  int rank;
} nccl_arg;

static void *nccl_open_main(void *arg) {
  nccl_arg *a = arg;
  nccl_group *g = a->g;
  runner *r = g->r;
  pthread_mutex_lock(&g->mu);
  while (!g->go) pthread_cond_wait(&g->cv, &g->mu);
  int go = g->go;
  pthread_mutex_unlock(&g->mu);
  if (go > 0)
    g->rank_rc[a->rank] =
        zt_comm_nccl_open(&r->ranks[a->rank].comm, r->world, r->rank0 + a->rank, &g->id,
                          r->job->held[a->rank], r->cancel, g->rank_err[a->rank],
                          sizeof g->rank_err[0]);
  return NULL;
}

/* A part lost by the coordinator (engine/job/peers.h): its ranks here stop waiting for it. */
static void on_peer_lost(void *arg, const char *why) {
  runner *r = arg;
  zt__job_log(r->job, ZT_LOG_ERROR, "%s", why);
  zt_comm_nccl_cancel_fire(r->cancel, why);
}

/* The NCCL group's id: a part takes the coordinator's; the coordinator makes it and, when the
 * job spans daemons, starts the parts on its peers with it before its own ranks wait in
 * ncclCommInitRank for theirs. */
static int group_id(runner *r, zt_comm_nccl_id *id) {
  const zt__job *job = r->job;
  char hex[sizeof job->part.nccl_id];
  if (job->part.member) {
    for (size_t i = 0; i < sizeof id->bytes; i++) {
      unsigned v;
      sscanf(job->part.nccl_id + 2 * i, "%2x", &v);
      id->bytes[i] = (char)v;
    }
    return 0;
  }
  int rc = zt_comm_nccl_get_id(id, r->err, sizeof r->err);
  if (rc < 0 || !r->spans) return rc;
  for (size_t i = 0; i < sizeof id->bytes; i++)
    snprintf(hex + 2 * i, 3, "%02x", (unsigned char)id->bytes[i]);
  return zt__peers_start(&r->peers, job, hex, r->resume_step, on_peer_lost, r, r->err,
                         sizeof r->err);
}

static int open_nccl(runner *r) {
  nccl_group *g = calloc(1, sizeof *g);
  pthread_t th[ZT_JOBS_MAX_GPUS];
  nccl_arg args[ZT_JOBS_MAX_GPUS];
  int rc, started = 0;
  if (!g) {
    snprintf(r->err, sizeof r->err, "out of memory");
    return -ENOMEM;
  }
  g->r = r;
  r->comm_close = zt_comm_nccl_close;
  if ((rc = group_id(r, &g->id)) < 0) goto out;
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  for (; started < r->local; started++) {
    args[started] = (nccl_arg){g, started};
    g->rank_rc[started] = -ECANCELED;
    if ((rc = -pthread_create(&th[started], NULL, nccl_open_main, &args[started])) < 0) break;
  }
  pthread_mutex_lock(&g->mu);
  g->go = rc < 0 ? -1 : 1;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
  for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
  pthread_mutex_destroy(&g->mu);
  pthread_cond_destroy(&g->cv);
  if (rc < 0) {
    snprintf(r->err, sizeof r->err, "starting the NCCL thread of rank %d: %s", started,
             strerror(-rc));
    goto out;
  }
  for (int i = 0; i < r->local; i++) {
    r->comm_open[i] = g->rank_rc[i] == 0;
    if (g->rank_rc[i] < 0 && rc == 0) {
      rc = g->rank_rc[i];
      snprintf(r->err, sizeof r->err, "%s", g->rank_err[i]); /* names the rank and device */
    }
  }
out:
  free(g);
  return rc;
}
#endif

/* A backend per device the job holds (cuda: that GPU; cpu: a simulated rank of the daemon's
 * threads split between its ranks), and with several ranks their communicators. */
int zt__runner_open_ranks(runner *r) {
  zt__job *job = r->job;
  const zt_jobs_config *cfg = &job->jobs->cfg;
  int cuda = strcmp(cfg->backend, "cuda") == 0, threads = zt__jobs_rank_threads(cfg), rc;
  for (; r->n_be < r->local; r->n_be++) {
    char why[ZT__ERR_MAX - 64];
    rc = zt_backend_open(&r->ranks[r->n_be].be, cfg->backend, job->held[r->n_be], threads, why,
                         sizeof why);
    if (rc < 0) {
      if (r->local == 1) snprintf(r->err, sizeof r->err, "%s", why);
      else snprintf(r->err, sizeof r->err, "rank %d (%s %d): %s", r->n_be,
                    cuda ? "GPU" : "simulated rank", job->held[r->n_be], why);
      return rc;
    }
  }
  if (r->world == 1) return 0;
  /* the backends' ops run on the current device: the runner's own calls (checkpoints) go
   * through rank 0 */
  if ((rc = zt_backend_bind_thread(&r->ranks[0].be)) < 0) {
    snprintf(r->err, sizeof r->err, "rank 0 (GPU %d): cannot make it current", job->held[0]);
    return rc;
  }
  if (cuda) {
#ifdef ZT_HAVE_NCCL
    if ((rc = zt_comm_nccl_cancel_create(&r->cancel)) < 0) {
      snprintf(r->err, sizeof r->err, "out of memory");
      return rc;
    }
    pthread_mutex_lock(&job->jobs->mu);
    job->interrupt = r->cancel;
    pthread_mutex_unlock(&job->jobs->mu);
    return open_nccl(r);
#else
    /* refused before the start (check_parallel); the CPU group must never get device memory */
    snprintf(r->err, sizeof r->err, "parallel.gpus %d needs NCCL, which this build of ztd lacks",
             r->local);
    return -ENOTSUP;
#endif
  }
  r->comm_close = zt_comm_cpu_close;
  if ((rc = zt_comm_cpu_group_open(&r->group, r->local)) < 0) {
    snprintf(r->err, sizeof r->err, "the CPU group of %d ranks: %s", r->local, strerror(-rc));
    return rc;
  }
  for (int i = 0; i < r->local; i++) {
    if ((rc = zt_comm_cpu_open(&r->ranks[i].comm, r->group, i)) < 0) {
      snprintf(r->err, sizeof r->err, "rank %d of the CPU group: %s", i, strerror(-rc));
      return rc;
    }
    r->comm_open[i] = 1;
  }
  return 0;
}

/* After the trainer, which uses but does not own them. */
void zt__runner_close_ranks(runner *r) {
  for (int i = 0; i < r->local; i++)
    if (r->comm_open[i]) r->comm_close(&r->ranks[i].comm);
  zt_comm_cpu_group_close(r->group);
  for (int i = 0; i < r->n_be; i++) {
    /* a cuda backend frees its device's memory with that device current */
    zt_backend_bind_thread(&r->ranks[i].be);
    zt_backend_close(&r->ranks[i].be);
  }
}
