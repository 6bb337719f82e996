/* defines: the job layer's work off the loop thread (internal.h: zt__jobs_work, and the
 * registry's close waiting for it): what reads a user's files (a spec's checks at submit, plan,
 * join and a queued job's start, a checkpoint's verification before export) runs on libuv's
 * thread pool, so that a FIFO or a slow disk never freezes the loop. A task's finish runs back
 * on the loop thread; a task still out when the registry closes is cancelled, or, already
 * running, finishes into nothing: the registry's memory outlives it (zt__jobs_work_closed). */
#include <stdlib.h>
#include "engine/job/internal.h"

static void work_run(uv_work_t *req) {
  zt__work *w = req->data;
  w->run(w);
}

static void work_after(uv_work_t *req, int status) {
  zt__work *w = req->data;
  zt_jobs *jobs = w->jobs;
  if (w->prev) w->prev->next = w->next;
  else jobs->works = w->next;
  if (w->next) w->next->prev = w->prev;
  if (!jobs->closing && status == 0) w->finish(w);
  w->release(w);
  if (jobs->closing && !jobs->works) zt__jobs_free(jobs);
}

void zt__jobs_work(zt_jobs *jobs, zt__work *w) {
  w->jobs = jobs;
  w->req.data = w;
  w->prev = NULL;
  w->next = jobs->works;
  if (w->next) w->next->prev = w;
  jobs->works = w;
  /* uv_queue_work fails only for a missing callback */
  uv_queue_work(jobs->cfg.loop, &w->req, work_run, work_after);
}

void zt__jobs_work_forget(zt_jobs *jobs, void *owner) {
  for (zt__work *w = jobs->works; w; w = w->next)
    if (w->owner == owner) {
      w->owner = NULL;
      w->done = NULL;
    }
}

int zt__jobs_work_closed(zt_jobs *jobs) {
  jobs->closing = 1;
  for (zt__work *w = jobs->works; w; w = w->next) uv_cancel((uv_req_t *)&w->req);
  return jobs->works != NULL;
}
