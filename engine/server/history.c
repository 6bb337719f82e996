/* defines: the HTTP listener's history of step and evaluation points (http.h; fed by http.c
 * from the job events, read by http.c's /api/jobs/ID/metrics and by metrics.c). A point is kept as its JSON
 * text (about 300 bytes; a jansson object of it would take several times that), so the whole
 * history is bounded by ZT_TUNE_HTTP_HISTORY_JOBS * ZT_TUNE_HTTP_HISTORY_POINTS such texts. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/log.h"
#include "engine/server/http.h"

typedef struct hist_job {
  char job[ZT_JOB_ID_MAX];
  char *text[ZT_TUNE_HTTP_HISTORY_POINTS];   /* oldest first */
  int64_t step[ZT_TUNE_HTTP_HISTORY_POINTS];
  int n;
  int64_t stride;      /* the steps between kept points; doubles each time they fill up */
  json_t *last;        /* the newest point */
  /* evaluations (data.eval): their points, oldest first; the oldest goes when full */
  char *etext[ZT_TUNE_HTTP_HISTORY_POINTS];
  int64_t estep[ZT_TUNE_HTTP_HISTORY_POINTS];
  int en;
  uint64_t touched;    /* the history's clock at its last step, for eviction */
} hist_job;

struct zt__history {
  hist_job *jobs[ZT_TUNE_HTTP_HISTORY_JOBS];
  int n;
  uint64_t clock;
};

zt__history *zt__history_new(void) { return calloc(1, sizeof(zt__history)); }

static void job_clear(hist_job *j) {
  for (int i = 0; i < j->n; i++) free(j->text[i]);
  for (int i = 0; i < j->en; i++) free(j->etext[i]);
  j->n = j->en = 0;
  j->stride = 1;
  json_decref(j->last);
  j->last = NULL;
}

void zt__history_free(zt__history *h) {
  if (!h) return;
  for (int i = 0; i < h->n; i++) {
    job_clear(h->jobs[i]);
    free(h->jobs[i]);
  }
  free(h);
}

static hist_job *job_find(const zt__history *h, const char *job) {
  for (int i = 0; i < h->n; i++)
    if (!strcmp(h->jobs[i]->job, job)) return h->jobs[i];
  return NULL;
}

/* The job's entry, made (in place of the least recently stepped one when full) if new. */
static hist_job *job_get(zt__history *h, const char *job) {
  hist_job *j = job_find(h, job);
  if (j) return j;
  if (h->n < ZT_TUNE_HTTP_HISTORY_JOBS) {
    if (!(j = calloc(1, sizeof *j))) return NULL;
    h->jobs[h->n++] = j;
  } else {
    j = h->jobs[0];
    for (int i = 1; i < h->n; i++)
      if (h->jobs[i]->touched < j->touched) j = h->jobs[i];
    job_clear(j);
  }
  snprintf(j->job, sizeof j->job, "%s", job);
  j->stride = 1;
  return j;
}

/* Full: every other point goes (the first and the newest stay), the stride doubles. */
static void job_thin(hist_job *j) {
  int k = 0;
  for (int i = 0; i < j->n; i++) {
    if (i % 2 == 0 || i == j->n - 1) {
      j->text[k] = j->text[i];
      j->step[k++] = j->step[i];
    } else {
      free(j->text[i]);
    }
  }
  j->n = k;
  j->stride *= 2;
}

/* An evaluation's point; one of an evaluation at or after its step (the job resumed) first
 * drops those. */
static void eval_add(hist_job *j, char *text, int64_t step) {
  while (j->en > 0 && j->estep[j->en - 1] >= step) free(j->etext[--j->en]);
  if (j->en == ZT_TUNE_HTTP_HISTORY_POINTS) {
    free(j->etext[0]);
    memmove(j->etext, j->etext + 1, (size_t)(j->en - 1) * sizeof *j->etext);
    memmove(j->estep, j->estep + 1, (size_t)(j->en - 1) * sizeof *j->estep);
    j->en--;
  }
  j->etext[j->en] = text;
  j->estep[j->en++] = step;
}

void zt__history_on_event(zt__history *h, const char *job, const json_t *ev, double now) {
  const char *kind = json_string_value(json_object_get(ev, "event"));
  int eval = kind && !strcmp(kind, "eval");
  if (!h || !kind || (strcmp(kind, "step") != 0 && !eval)) return;
  hist_job *j = job_get(h, job);
  json_t *p = j ? zt_jobs_point(ev, now) : NULL;
  char *text = p ? json_dumps(p, JSON_COMPACT) : NULL;
  if (!text) {
    ZT_LOGW("http", "out of memory: a%s of job %s is missing from its history",
            eval ? "n evaluation" : " step", job);
    json_decref(p);
    return;
  }
  int64_t step = json_integer_value(json_object_get(p, "step"));
  if (eval) {
    json_decref(p);
    eval_add(j, text, step);
    return;
  }
  /* steps trained again after a resume replace the ones after the checkpoint */
  while (j->n > 0 && j->step[j->n - 1] >= step) free(j->text[--j->n]);
  /* the newest point stands in for the steps since the last kept one until the stride is
   * reached */
  if (j->n >= 2 && j->step[j->n - 1] - j->step[j->n - 2] < j->stride) free(j->text[--j->n]);
  if (j->n == ZT_TUNE_HTTP_HISTORY_POINTS) job_thin(j);
  j->text[j->n] = text;
  j->step[j->n++] = step;
  json_decref(j->last);
  j->last = p;
  j->touched = ++h->clock;
}

const json_t *zt__history_last(const zt__history *h, const char *job) {
  const hist_job *j = h ? job_find(h, job) : NULL;
  return j ? j->last : NULL;
}

/* The points of texts[0..n) with a step above since, as a new array (NULL: out of memory). */
static json_t *points_since(char *const *texts, const int64_t *steps, int n, int64_t since) {
  json_t *a = json_array();
  for (int i = 0; a && i < n; i++) {
    if (steps[i] <= since) continue;
    if (json_array_append_new(a, json_loads(texts[i], 0, NULL)) < 0) {
      json_decref(a);
      a = NULL;
    }
  }
  return a;
}

json_t *zt__history_points(const zt__history *h, const char *job, int64_t since, int *nomem) {
  *nomem = 0;
  const hist_job *j = h ? job_find(h, job) : NULL;
  if (!j || !j->n) return NULL;
  json_t *a = points_since(j->text, j->step, j->n, since);
  *nomem = !a;
  return a;
}

json_t *zt__history_evals(const zt__history *h, const char *job, int64_t since) {
  const hist_job *j = h ? job_find(h, job) : NULL;
  return j ? points_since(j->etext, j->estep, j->en, since) : json_array();
}
