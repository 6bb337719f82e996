/* The rank threads of the data-parallel trainer (engine/train/dp/dp.h): one per rank here for
 * the life of the trainer, each running the commands the trainer's side dispatches to every
 * rank at once, and the ranks' failures, which the dispatch collects. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/kernels/backend.h"
#include "engine/train/dp/internal.h"

int zt__dp_rank_fail(dp_rank_state *k, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = snprintf(k->err, sizeof k->err, "rank %d: ", k->r);
  vsnprintf(k->err + n, sizeof k->err - (size_t)n, fmt, ap);
  va_end(ap);
  return rc;
}

int zt__dp_comm_fail(dp_rank_state *k, int rc, const char *what) {
  return zt__dp_rank_fail(k, rc, "%s: %s", what, k->comm.ops->error_text(k->comm.ctx));
}

int zt__dp_backend_fail(dp_rank_state *k, int rc) {
  const zt_backend *be = &k->view.be;
  return zt__dp_rank_fail(k, rc, "backend %s: %s", be->ops->name, be->ops->error_text(be->ctx));
}

/* ---- the rank threads ---------------------------------------------------------------------- */

static int rank_run(dp_rank_state *k, const zt__dp_cmd *cmd) {
  if (cmd->after_queue) {
    int rc = k->comm.ops->queue_sync(k->comm.ctx);
    if (rc < 0 && !cmd->last) return zt__dp_comm_fail(k, rc, "finishing the step's collectives");
  }
  return cmd->run(k);
}

void *zt__dp_rank_main(void *arg) {
  dp_rank_state *k = arg;
  dp_state *s = k->s;
  uint64_t seen = 0;
  /* a cuda rank's device, current for every command this thread runs */
  int bound = zt_backend_bind_thread(&k->view.be);
  for (;;) {
    pthread_mutex_lock(&s->mu);
    while (s->gen == seen) pthread_cond_wait(&s->cmd_cv, &s->mu);
    seen = s->gen;
    const zt__dp_cmd *cmd = s->cmd;
    pthread_mutex_unlock(&s->mu);
    k->err[0] = 0;
    k->rc = bound < 0 && !cmd->last ? bound : rank_run(k, cmd);
    if (bound < 0 && !cmd->last)
      snprintf(k->err, sizeof k->err, "rank %d: making its device current failed", k->r);
    pthread_mutex_lock(&s->mu);
    if (++s->done == s->n_threads) pthread_cond_signal(&s->done_cv);
    pthread_mutex_unlock(&s->mu);
    if (cmd->last) return NULL;
  }
}

static int failure_rank(int rc) {
  return rc >= 0 ? 0 : rc == -ERANGE ? 1 : rc == -ECANCELED ? 2 : 3;
}

/* Runs cmd on every rank and waits for all of them. Returns a failed rank (-1: none): one whose
 * failure is its own before one cancelled by another's, before a non-finite gradient. */
int zt__dp_dispatch(dp_state *s, const zt__dp_cmd *cmd) {
  pthread_mutex_lock(&s->mu);
  s->cmd = cmd;
  s->done = 0;
  s->gen++;
  pthread_cond_broadcast(&s->cmd_cv);
  while (s->done < s->n_threads) pthread_cond_wait(&s->done_cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  int bad = -1;
  for (int r = 0; r < s->n_threads; r++)
    if (failure_rank(s->ranks[r].rc) > (bad < 0 ? 0 : failure_rank(s->ranks[bad].rc))) bad = r;
  return bad;
}

/* ---- the trainer's side -------------------------------------------------------------------- */

int zt__dp_refuse_broken(const char *what, char *err, size_t errlen) {
  snprintf(err, errlen, "%s: an earlier step or state call failed on a rank and aborted the "
           "communicators; close the trainer and open a new one (a checkpoint restores the "
           "state)", what);
  return -EIO;
}

/* cmd on every rank here; 0, or the failed rank's code and message */
int zt__dp_run_cmd(dp_state *s, const zt__dp_cmd *cmd, char *err, size_t errlen) {
  int bad = zt__dp_dispatch(s, cmd);
  if (bad < 0) return 0;
  snprintf(err, errlen, "%s", s->ranks[bad].err);
  return s->ranks[bad].rc;
}
