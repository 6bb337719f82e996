/* defines: what a job answers later, on the loop thread: zt_jobs_push_batch,
 * zt_jobs_checkpoint and zt_jobs_forget (jobs.h; called by engine/server), and their answers
 * (internal.h; zt__jobs_on_async and the queue call them). A stream job's pushed batches go
 * into its bounded queue (job->ring) while it has room, else wait behind it: the client's
 * credit is the answer, so a fast client cannot grow the daemon's memory. A checkpoint request
 * is answered by the runner's next checkpoint. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine/job/internal.h"

static void credit(zt_jobs_done_cb done, void *owner, uint32_t queued) {
  json_t *reply = json_pack("{s:i}", "queued", (int)queued);
  done(owner, 0, reply, NULL);
  json_decref(reply);
}

/* Moves pending pushes into the ring while it has room and grants their credit. */
void zt__job_refill(zt__job *job) {
  zt_jobs *jobs = job->jobs;
  for (;;) {
    pthread_mutex_lock(&jobs->mu);
    zt__pending_push *p = job->pushes;
    if (!p || job->ring.count == job->ring.cap) {
      pthread_mutex_unlock(&jobs->mu);
      return;
    }
    zt__batch_ring_put(&job->ring, p->tokens, p->marks);
    uint32_t queued = job->ring.count;
    pthread_cond_signal(&job->cond);
    job->pushes = p->next;
    if (!job->pushes) job->pushes_tail = NULL;
    pthread_mutex_unlock(&jobs->mu);
    zt_jobs_done_cb done = p->done;
    void *owner = p->owner;
    free(p->tokens);
    free(p->marks);
    free(p);
    credit(done, owner, queued);
  }
}

/* Answers every pending push and checkpoint request of a job that will not serve them. */
void zt__job_fail_pending(zt__job *job, int rc, const char *message) {
  while (job->pushes) {
    zt__pending_push *p = job->pushes;
    job->pushes = p->next;
    zt_jobs_done_cb done = p->done;
    void *owner = p->owner;
    free(p->tokens);
    free(p->marks);
    free(p);
    done(owner, rc, NULL, message);
  }
  job->pushes_tail = NULL;
  while (job->ckpt_requests) {
    zt__ckpt_request *q = job->ckpt_requests;
    job->ckpt_requests = q->next;
    zt_jobs_done_cb done = q->done;
    void *owner = q->owner;
    free(q);
    done(owner, rc, NULL, message);
  }
}

void zt__job_answer_checkpoints(zt__job *job, const zt__msg *m) {
  zt__ckpt_request **pp = &job->ckpt_requests;
  while (*pp) {
    zt__ckpt_request *q = *pp;
    if (q->gen > m->gen) {
      pp = &q->next;
      continue;
    }
    *pp = q->next;
    zt_jobs_done_cb done = q->done;
    void *owner = q->owner;
    free(q);
    if (m->rc < 0)
      done(owner, m->rc, NULL, m->text);
    else
      done(owner, 0, m->obj, NULL);
  }
}

/* The connection that pushed is a producer of the job until zt_jobs_forget reports it gone. */
static int add_producer(zt__job *job, void *producer) {
  for (int i = 0; i < job->n_producers; i++)
    if (job->producers[i] == producer) return 0;
  if (job->n_producers == job->cap_producers) {
    int cap = job->cap_producers ? 2 * job->cap_producers : 4;
    void **p = realloc(job->producers, (size_t)cap * sizeof *p);
    if (!p) return -ENOMEM;
    job->producers = p;
    job->cap_producers = cap;
  }
  job->producers[job->n_producers++] = producer;
  return 0;
}

/* The marks of a pushed micro-batch from its loss_mask and doc_starts, each checked byte by
 * byte (0 or 1), the error naming the field, the row and the index. */
static int pushed_marks(const zt__job *job, const uint8_t *loss_mask, const uint8_t *doc_starts,
                        uint8_t *marks, char *err, size_t errlen) {
  size_t n = job->micro_tokens, row = (size_t)job->spec.model.seq_len + 1;
  for (size_t i = 0; i < n; i++) {
    uint8_t m = loss_mask ? loss_mask[i] : 1, s = doc_starts ? doc_starts[i] : 0;
    if (m > 1 || s > 1) {
      snprintf(err, errlen, "batch %s row %zu index %zu: %u is neither 0 nor 1",
               m > 1 ? "loss_mask" : "doc_starts", i / row, i % row, m > 1 ? m : s);
      return -EINVAL;
    }
    marks[i] = (uint8_t)((m ? ZT__MARK_COUNTED : 0) | (s ? ZT__MARK_START : 0));
  }
  return 0;
}

int zt_jobs_push_batch(zt_jobs *jobs, const char *id, const int32_t *tokens,
                       const uint8_t *loss_mask, const uint8_t *doc_starts, size_t n_tokens,
                       void *producer, zt_jobs_done_cb done, void *owner, char *err,
                       size_t errlen) {
  zt__job *job = zt__jobs_find(jobs, id, err, errlen);
  if (!job) return -ENOENT;
  if (job->spec.source != ZT_DATA_STREAM) {
    snprintf(err, errlen, "job %s reads its data from a file; it takes no batches", id);
    return -EINVAL;
  }
  zt_job_state s = zt__job_state_of(job);
  if (zt__job_state_terminal(s)) {
    snprintf(err, errlen, "job %s is %s", id, zt_job_state_name(s));
    return -EINVAL;
  }
  if (jobs->shutting_down) {
    snprintf(err, errlen, "the daemon is shutting down");
    return -ESHUTDOWN;
  }
  if (n_tokens != job->micro_tokens) {
    snprintf(err, errlen, "batch has %zu tokens; job %s takes micro_batch*(seq_len+1) = %zu",
             n_tokens, id, job->micro_tokens);
    return -EINVAL;
  }
  /* A bad token would fail the job inside the trainer; refuse it here instead. */
  for (size_t i = 0; i < n_tokens; i++) {
    if (tokens[i] < 0 || tokens[i] >= job->spec.model.vocab) {
      snprintf(err, errlen, "batch token %d at index %zu is outside [0, model.vocab %d)",
               tokens[i], i, job->spec.model.vocab);
      return -EINVAL;
    }
  }
  uint8_t *marks = malloc(n_tokens);
  if (!marks) {
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  int rc = pushed_marks(job, loss_mask, doc_starts, marks, err, errlen);
  if (rc < 0) {
    free(marks);
    return rc;
  }
  pthread_mutex_lock(&jobs->mu);
  if (add_producer(job, producer) < 0) {
    pthread_mutex_unlock(&jobs->mu);
    free(marks);
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  if (!job->pushes && job->ring.count < job->ring.cap) {
    zt__batch_ring_put(&job->ring, tokens, marks);
    free(marks);
    uint32_t queued = job->ring.count;
    pthread_cond_signal(&job->cond);
    pthread_mutex_unlock(&jobs->mu);
    credit(done, owner, queued);
    return 0;
  }
  pthread_mutex_unlock(&jobs->mu);
  zt__pending_push *p = calloc(1, sizeof *p);
  int32_t *copy = malloc(n_tokens * sizeof *copy);
  if (!p || !copy) {
    free(p);
    free(copy);
    free(marks);
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  memcpy(copy, tokens, n_tokens * sizeof *copy);
  p->tokens = copy;
  p->marks = marks;
  p->done = done;
  p->owner = owner;
  if (job->pushes_tail)
    job->pushes_tail->next = p;
  else
    job->pushes = p;
  job->pushes_tail = p;
  return 0;
}

int zt_jobs_checkpoint(zt_jobs *jobs, const char *id, zt_jobs_done_cb done, void *owner,
                       char *err, size_t errlen) {
  zt__job *job = zt__jobs_find(jobs, id, err, errlen);
  if (!job) return -ENOENT;
  zt_job_state s = zt__job_state_of(job);
  if (s != ZT_JOB_RUNNING || !job->has_thread) {
    snprintf(err, errlen, "job %s is %s; only a running job checkpoints", id,
             zt_job_state_name(s));
    return -EINVAL;
  }
  zt__ckpt_request *q = calloc(1, sizeof *q);
  if (!q) {
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  q->done = done;
  q->owner = owner;
  pthread_mutex_lock(&jobs->mu);
  q->gen = ++job->ckpt_requested;
  pthread_cond_broadcast(&job->cond);
  pthread_mutex_unlock(&jobs->mu);
  q->next = job->ckpt_requests;
  job->ckpt_requests = q;
  return 0;
}

void zt_jobs_forget(zt_jobs *jobs, void *owner) {
  zt__jobs_work_forget(jobs, owner);
  /* a part whose coordinator's connection closed cannot meet the other ranks again */
  pthread_mutex_lock(&jobs->mu);
  /* a producer gone: the last one starts its job's data.stream_timeout */
  for (int i = 0; i < jobs->n_all; i++) {
    zt__job *job = jobs->all[i];
    for (int k = 0; k < job->n_producers; k++) {
      if (job->producers[k] != owner) continue;
      job->producers[k] = job->producers[--job->n_producers];
      if (!job->n_producers) {
        job->idle_since = zt__mono();
        pthread_cond_broadcast(&job->cond);
      }
      break;
    }
  }
  for (int i = 0; i < jobs->n_all; i++) {
    zt__job *job = jobs->all[i];
    if (!job->part.member || job->part.owner != owner) continue;
    job->part.owner = NULL;
    if (!job->has_thread) continue;
    char why[ZT__PART_NAME_MAX + 64];
    snprintf(why, sizeof why, "the connection of %s closed", job->part.coordinator);
    if (job->stop == ZT__STOP_NONE) job->stop = ZT__STOP_CANCEL;
    zt__runner_interrupt(job, why);
  }
  pthread_mutex_unlock(&jobs->mu);
  for (int i = 0; i < jobs->n_all; i++) {
    zt__job *job = jobs->all[i];
    zt__pending_push **pp = &job->pushes, *last = NULL;
    while (*pp) {
      zt__pending_push *p = *pp;
      if (p->owner == owner) {
        *pp = p->next;
        free(p->tokens);
        free(p->marks);
        free(p);
      } else {
        last = p;
        pp = &p->next;
      }
    }
    job->pushes_tail = last;
    zt__ckpt_request **qq = &job->ckpt_requests;
    while (*qq) {
      zt__ckpt_request *q = *qq;
      if (q->owner == owner) {
        *qq = q->next;
        free(q);
      } else {
        qq = &q->next;
      }
    }
  }
  zt__exports_forget(jobs, owner);
}
