/* defines: zt__runner_open_eval and zt__runner_eval (internal.h; called by runner.c): a job's
 * held-out evaluation (data.eval, docs/spec.md "Held-out evaluation") on its runner's thread.
 * The eval file is opened again confined as at the submit; an evaluation packs its first
 * data.eval.batches batches of a step's rows into the step's own rows (no buffer of its own),
 * evaluates them forward only (zt_trainer_eval_batch) and reports the mean loss over their
 * counted targets: an "eval" event, a line of evals.log and of the job's series, the job's
 * status and the record of its next checkpoint. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "engine/job/internal.h"
#include "engine/job/store.h"

static double mono_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int zt__runner_open_eval(runner *r) {
  const zt_job_spec *s = &r->job->spec;
  zt_path_roots files = zt__job_roots(&r->job->jobs->cfg, r->job->tcp, 0);
  if (!s->eval_path[0]) return 0;
  int rc = zt__token_file_open(&r->eval_tokens, "data.eval.path", s->eval_path, 1, &files, r->err,
                               sizeof r->err);
  if (rc < 0) return rc;
  /* the training's packing; a stream job's rows are the eval file's own */
  zt_data_packing p = zt__job_packing_of(s->source == ZT_DATA_FILE ? r->packing : ZT_PACKING_AUTO,
                                         r->eval_tokens.version);
  r->eval_documents = p == ZT_PACKING_DOCUMENTS;
  /* the file may have changed since the submit checked it */
  if (r->eval_tokens.vocab > (uint32_t)s->model.vocab) {
    snprintf(r->err, sizeof r->err, "data.eval.path: %.1800s: token vocabulary %u is larger than "
             "model.vocab %d", s->eval_path, r->eval_tokens.vocab, s->model.vocab);
    return -EINVAL;
  }
  if (!r->eval_documents && r->eval_tokens.n_tokens < (uint64_t)s->model.seq_len + 1) {
    snprintf(r->err, sizeof r->err, "data.eval.path: %.1800s: holds %llu tokens; model.seq_len %d "
             "needs at least %d", s->eval_path, (unsigned long long)r->eval_tokens.n_tokens,
             s->model.seq_len, s->model.seq_len + 1);
    return -EINVAL;
  }
  return 0;
}

int zt__runner_eval(runner *r) {
  zt__job *job = r->job;
  const zt_job_spec *s = &job->spec;
  int step = zt_trainer_step_count(r->trainer), rc;
  size_t rows = (size_t)r->micros * (size_t)s->train.micro_batch;
  zt__eval_cursor cur = {0, 0, 0};
  zt_batch b = {.inputs = r->rows.inputs, .targets = r->rows.targets,
                .positions = r->rows.positions};
  char why[ZT__ERR_MAX];
  double t0 = mono_seconds(), sum = 0;
  int64_t counted = 0;
  for (int i = 0; i < s->eval_batches; i++) {
    double bs;
    int64_t bn;
    zt__eval_rows(&r->eval_tokens, r->eval_documents, s->model.seq_len, &cur, rows, &r->rows);
    if ((rc = zt_trainer_eval_batch(r->trainer, &b, &bs, &bn, why, sizeof why)) < 0) {
      snprintf(r->err, sizeof r->err, "data.eval.path: %.1000s: the evaluation after step %d, "
               "batch %d: %.900s", s->eval_path, step, i + 1, why);
      return rc;
    }
    sum += bs;
    counted += bn;
  }
  if (!counted) {
    zt__job_log(job, ZT_LOG_WARN, "evaluation after step %d: its %d batch(es) count no target "
                "(every token masked): no eval loss", step, s->eval_batches);
    return 0;
  }
  double loss = sum / (double)counted, secs = mono_seconds() - t0;
  if ((rc = zt__store_evals_append(job->dir, step, loss, r->err, sizeof r->err)) < 0) return rc;
  zt_trainer_note_eval(r->trainer, step, loss);
  pthread_mutex_lock(&job->jobs->mu);
  job->has_eval = 1;
  job->eval_step = step;
  job->eval_loss = loss;
  pthread_mutex_unlock(&job->jobs->mu);
  json_t *ev = zt__job_event(job, "eval");
  json_object_set_new(ev, "step", json_integer(step));
  json_object_set_new(ev, "steps", json_integer(s->train.steps));
  json_object_set_new(ev, "eval_loss", json_real(loss));
  json_object_set_new(ev, "tokens", json_integer(counted));
  json_object_set_new(ev, "batches", json_integer(s->eval_batches));
  json_object_set_new(ev, "eval_s", json_real(secs));
  if ((rc = zt__series_eval(&r->series, ev, r->err, sizeof r->err)) < 0) {
    json_decref(ev);
    return rc;
  }
  zt__job_log(job, ZT_LOG_INFO, "eval after step %d: loss %.6g over %lld targets (%.2f s)", step,
              loss, (long long)counted, secs);
  zt__jobs_post(job, ZT__MSG_EVENT, ev, 0, 0, NULL);
  return 0;
}
