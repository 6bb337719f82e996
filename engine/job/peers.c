/* The coordinator's parts on its peers (engine/job/peers.h): libztclient's blocking calls, one
 * connection and one watching thread per peer. */
#include "engine/job/peers.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/include/zt/client.h"
#include "engine/job/data.h"

typedef struct peer {
  struct zt__peers *ps;
  const char *addr;
  zt_client *c;
  zt_client *push;        /* stream jobs: the connection the step's micro-batches go over */
  char job[ZT_CLIENT_JOB_ID_MAX];
  pthread_t thread;
  int has_thread;
  int ended;              /* the part's "end" event came */
  char end_state[32];
  char end_error[ZT__ERR_MAX];
} peer;

struct zt__peers {
  peer list[ZT_JOB_MAX_PEERS];
  int n;
  int ranks, accum;       /* each part's ranks (parallel.gpus) and their micro-batches each */
  zt__peers_lost_cb lost;
  void *arg;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int finishing;          /* no lost callback from now on */
  int reported;           /* the lost callback ran */
  int watching;           /* threads still watching */
};

static void report(zt__peers *ps, const char *why) {
  pthread_mutex_lock(&ps->mu);
  int call = !ps->finishing && !ps->reported;
  ps->reported |= call;
  pthread_mutex_unlock(&ps->mu);
  if (call) ps->lost(ps->arg, why);
}

static int on_event(const char *text, void *user) {
  peer *p = user;
  json_t *ev = json_loads(text, 0, NULL);
  const char *kind = json_string_value(json_object_get(ev, "event"));
  int end = kind && strcmp(kind, "end") == 0;
  if (end) {
    const char *st = json_string_value(json_object_get(ev, "state"));
    const char *e = json_string_value(json_object_get(ev, "error"));
    snprintf(p->end_state, sizeof p->end_state, "%s", st ? st : "?");
    snprintf(p->end_error, sizeof p->end_error, "%s", e ? e : "");
    p->ended = 1;
  }
  json_decref(ev);
  return end;
}

/* A part that failed, or whose connection dropped before it ended, is lost; one that ended done
 * or cancelled stopped at the step all parts agreed on. */
static void *watch_main(void *arg) {
  peer *p = arg;
  zt__peers *ps = p->ps;
  int rc = zt_client_watch(p->c, p->job, on_event, p);
  char why[ZT__ERR_MAX + 512];
  if (p->ended && strcmp(p->end_state, "failed") == 0) {
    snprintf(why, sizeof why, "peer %s: its part (job %s there) failed: %s", p->addr, p->job,
             p->end_error);
    report(ps, why);
  } else if (!p->ended) {
    snprintf(why, sizeof why, "peer %s: lost the connection to its part (job %s there): %s: %s",
             p->addr, p->job, rc < 0 ? zt_client_error_code(p->c) : "EPROTO",
             rc < 0 ? zt_client_error_message(p->c) : "the watch ended without an end event");
    report(ps, why);
  }
  pthread_mutex_lock(&ps->mu);
  ps->watching--;
  pthread_cond_broadcast(&ps->cv);
  pthread_mutex_unlock(&ps->mu);
  return NULL;
}

/* "host:port" split at the last colon (the spec parser checked the shape). */
static int split_addr(const char *addr, char *host, size_t hostlen, int *port) {
  const char *colon = strrchr(addr, ':');
  if (!colon || (size_t)(colon - addr) >= hostlen) return -EINVAL;
  memcpy(host, addr, (size_t)(colon - addr));
  host[colon - addr] = 0;
  *port = atoi(colon + 1);
  return 0;
}

static int join_one(peer *p, const zt__job *job, const char *spec, int i, const char *nccl_id,
                    int resume_step, char *err, size_t errlen) {
  const zt_job_spec *s = &job->spec;
  char host[ZT_JOB_PEER_MAX];
  int port, rc;
  if (split_addr(p->addr, host, sizeof host, &port) < 0) {
    snprintf(err, errlen, "peer %s: not a host:port", p->addr);
    return -EINVAL;
  }
  char coordinator[ZT__PART_NAME_MAX];
  snprintf(coordinator, sizeof coordinator, "%.200s, job %s", job->jobs->cfg.name ?: "ztd",
           job->id);
  json_t *part = json_pack("{s:i, s:i, s:s, s:i, s:s}", "world", zt__job_world(s), "rank0",
                           s->gpus * (i + 1), "nccl_id", nccl_id, "resume_step", resume_step,
                           "coordinator", coordinator);
  char *part_text = part ? json_dumps(part, JSON_COMPACT) : NULL;
  json_decref(part);
  if (!part_text) {
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  rc = zt_client_connect_tcp(&p->c, host, port, job->jobs->cfg.peer_token);
  if (rc == 0) rc = zt_client_join(p->c, spec, part_text, p->job);
  free(part_text);
  zt_client *bad = p->c;
  if (rc == 0 && s->source == ZT_DATA_STREAM) {
    rc = zt_client_connect_tcp(&p->push, host, port, job->jobs->cfg.peer_token);
    bad = p->push;
  }
  if (rc < 0)
    snprintf(err, errlen, "peer %s: %s: %s", p->addr, zt_client_error_code(bad),
             zt_client_error_message(bad));
  return rc;
}

int zt__peers_start(zt__peers **out, const zt__job *job, const char *nccl_id_hex,
                    int resume_step, zt__peers_lost_cb lost, void *arg, char *err,
                    size_t errlen) {
  zt__peers *ps = calloc(1, sizeof *ps);
  char *spec = job->spec_json ? json_dumps(job->spec_json, JSON_COMPACT) : NULL;
  int rc = 0;
  *out = NULL;
  if (!ps || !spec) {
    free(ps);
    free(spec);
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  ps->lost = lost;
  ps->arg = arg;
  ps->ranks = job->spec.gpus;
  ps->accum = job->spec.train.grad_accum;
  pthread_mutex_init(&ps->mu, NULL);
  pthread_cond_init(&ps->cv, NULL);
  for (int i = 0; i < job->spec.n_peers; i++) {
    peer *p = &ps->list[ps->n++];
    p->ps = ps;
    p->addr = job->spec.peers[i];
    if ((rc = join_one(p, job, spec, i, nccl_id_hex, resume_step, err, errlen)) < 0) break;
    pthread_mutex_lock(&ps->mu);
    ps->watching++;
    pthread_mutex_unlock(&ps->mu);
    if ((rc = -pthread_create(&p->thread, NULL, watch_main, p)) < 0) {
      pthread_mutex_lock(&ps->mu);
      ps->watching--;
      pthread_mutex_unlock(&ps->mu);
      snprintf(err, errlen, "peer %s: cannot start its watching thread: %s", p->addr,
               strerror(-rc));
      break;
    }
    p->has_thread = 1;
  }
  free(spec);
  if (rc < 0) {
    zt__peers_finish(ps, 0);
    return rc;
  }
  *out = ps;
  return 0;
}

int zt__peers_push(zt__peers *ps, const int32_t *batch, const uint8_t *marks, size_t micro_tokens,
                   char *err, size_t errlen) {
  size_t per_part = (size_t)ps->ranks * (size_t)ps->accum;
  /* the marks as the protocol carries them: a loss mask and the documents' starts */
  uint8_t *mask = malloc(2 * micro_tokens), *starts = mask + micro_tokens;
  if (!mask) {
    snprintf(err, errlen, "out of memory for the peers' batches");
    return -ENOMEM;
  }
  int rc = 0;
  for (int i = 0; rc == 0 && i < ps->n; i++) {
    peer *p = &ps->list[i];
    /* peer i runs ranks gpus * (i + 1) ..: the coordinator's come first */
    size_t first = (size_t)(i + 1) * per_part * micro_tokens;
    for (size_t j = 0; rc == 0 && j < per_part; j++) {
      size_t at = first + j * micro_tokens;
      for (size_t k = 0; k < micro_tokens; k++) {
        mask[k] = (marks[at + k] & ZT__MARK_COUNTED) != 0;
        starts[k] = (marks[at + k] & ZT__MARK_START) != 0;
      }
      rc = zt_client_push_batch_docs(p->push, p->job, batch + at, mask, starts, micro_tokens);
      if (rc < 0)
        snprintf(err, errlen, "peer %s: pushing its ranks' micro-batches to its part (job %s "
                 "there): %s: %s", p->addr, p->job, zt_client_error_code(p->push),
                 zt_client_error_message(p->push));
    }
  }
  free(mask);
  return rc;
}

void zt__peers_finish(zt__peers *ps, int wait_s) {
  if (!ps) return;
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += wait_s;
  pthread_mutex_lock(&ps->mu);
  ps->finishing = 1;
  while (ps->watching > 0 && pthread_cond_timedwait(&ps->cv, &ps->mu, &until) != ETIMEDOUT) {
  }
  pthread_mutex_unlock(&ps->mu);
  /* a part still running ends when its connection closes (zt_jobs_forget on its daemon) */
  for (int i = 0; i < ps->n; i++)
    if (ps->list[i].c) zt_client_interrupt(ps->list[i].c);
  for (int i = 0; i < ps->n; i++) {
    if (ps->list[i].has_thread) pthread_join(ps->list[i].thread, NULL);
    zt_client_close(ps->list[i].c);
    zt_client_close(ps->list[i].push);
  }
  pthread_mutex_destroy(&ps->mu);
  pthread_cond_destroy(&ps->cv);
  free(ps);
}
