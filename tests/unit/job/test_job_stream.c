/* Stream jobs: pushes are credited at once while the job's queue has room and later when the
 * runner consumes; forget(owner) drops that owner's pending pushes; bad pushes fail at once;
 * cancel and shutdown reach a runner waiting for data; checkpoint requests are answered; a stream
 * job running when the daemon stopped fails on restart. */
#include <errno.h>
#include <string.h>
#include <unistd.h>
#include "jobtest.h"

#define B 2
#define T 8
#define MICRO (B * (T + 1))

static jt_events g_ev;

typedef struct owner {
  int credits, errors;
  int last_rc;
  json_t *reply;
} owner;

static void on_done(void *arg, int rc, json_t *reply, const char *message) {
  owner *o = arg;
  o->last_rc = rc;
  if (rc == 0) o->credits++;
  else o->errors++;
  if (reply) {
    json_decref(o->reply);
    o->reply = json_deep_copy(reply);
  }
}

static void on_shutdown(void *user) { *(int *)user = 1; }
static int is_set(void *arg) { return *(int *)arg; }

typedef struct wait_for {
  const char *job, *kind;
  int n;
} wait_for;

static int seen(void *arg) {
  wait_for *w = arg;
  return jt_count(&g_ev, w->job, w->kind) >= w->n;
}

static void wait_event(uv_loop_t *loop, const char *job, const char *kind, int n) {
  wait_for w = {job, kind, n};
  jt_run_until(loop, seen, &w, 60);
}

static json_t *stream_spec(int steps) {
  return json_pack("{s:{s:s, s:i, s:i, s:i, s:i, s:i}, s:{s:i, s:i, s:i}, s:{s:s}}", "model",
                   "arch", "gpt", "vocab", 16, "seq_len", T, "d_model", 16, "n_heads", 2,
                   "n_layers", 1, "train", "steps", steps, "micro_batch", B, "grad_accum", 2,
                   "data", "source", "stream");
}

static void batch(int32_t *tok, int salt) {
  for (int i = 0; i < MICRO; i++) tok[i] = (i * 3 + salt) % 16;
}

static int push(zt_jobs *jobs, const char *id, int salt, owner *o) {
  int32_t tok[MICRO];
  char err[512];
  batch(tok, salt);
  return zt_jobs_push_batch(jobs, id, tok, NULL, NULL, MICRO, o, on_done, o, err, sizeof err);
}

int main(void) {
  char dir[512], state[600], tok[600], err[1024], path[900];
  jt_tempdir(dir, sizeof dir, "stream");
  snprintf(state, sizeof state, "%s/state", dir);
  snprintf(tok, sizeof tok, "%s/data.tok", dir);
  jt_write_tokens(tok, 16, 2, 4096);
  uv_loop_t loop;
  uv_loop_init(&loop);
  g_ev.all = json_array();
  zt_jobs *jobs = jt_open(&loop, state, &g_ev, 2);

  /* A long file job holds the CPU so the stream job waits in the queue with nobody consuming. */
  char fid[ZT_JOB_ID_MAX], sid[ZT_JOB_ID_MAX];
  json_t *spec = json_pack("{s:{s:s, s:i, s:i, s:i, s:i, s:i}, s:{s:i, s:i}, s:{s:s, s:s}}",
                           "model", "arch", "gpt", "vocab", 16, "seq_len", T, "d_model", 16,
                           "n_heads", 2, "n_layers", 1, "train", "steps", 100000, "micro_batch",
                           B, "data", "source", "file", "path", tok);
  CHECK(jt_submit(jobs, spec, fid, err, sizeof err) == 0);
  json_decref(spec);
  spec = stream_spec(3);
  CHECK(jt_submit(jobs, spec, sid, err, sizeof err) == 0);
  json_decref(spec);
  json_t *st = zt_jobs_status(jobs);
  CHECK(json_integer_value(json_object_get(st, "queued")) == 1);
  CHECK(json_integer_value(json_object_get(st, "running")) == 1);
  json_decref(st);

  /* Bad pushes fail at once, done not called. */
  owner a = {0}, b = {0};
  int32_t tokens[MICRO];
  batch(tokens, 0);
  CHECK(zt_jobs_push_batch(jobs, sid, tokens, NULL, NULL, 100, &a, on_done, &a, err,
                           sizeof err) == -EINVAL);
  char want[200];
  snprintf(want, sizeof want, "batch has 100 tokens; job %s takes micro_batch*(seq_len+1) = %d",
           sid, MICRO);
  CHECK(strcmp(err, want) == 0);
  CHECK(zt_jobs_push_batch(jobs, fid, tokens, NULL, NULL, MICRO, &a, on_done, &a, err,
                           sizeof err) == -EINVAL);
  CHECK(strstr(err, fid));
  CHECK(zt_jobs_push_batch(jobs, "j000099", tokens, NULL, NULL, MICRO, &a, on_done, &a, err,
                           sizeof err) == -ENOENT);
  tokens[5] = 16;
  CHECK(zt_jobs_push_batch(jobs, sid, tokens, NULL, NULL, MICRO, &a, on_done, &a, err,
                           sizeof err) == -EINVAL);
  CHECK(strstr(err, "model.vocab"));
  /* a loss mask or document starts of another byte than 0 or 1: the row and the index */
  batch(tokens, 0);
  uint8_t mask[MICRO], starts[MICRO];
  memset(mask, 1, sizeof mask);
  memset(starts, 0, sizeof starts);
  mask[MICRO - 1] = 2;
  CHECK(zt_jobs_push_batch(jobs, sid, tokens, mask, starts, MICRO, &a, on_done, &a, err,
                           sizeof err) == -EINVAL);
  snprintf(want, sizeof want, "batch loss_mask row %d index %d: 2 is neither 0 nor 1", B - 1, T);
  CHECK(strcmp(err, want) == 0);
  mask[MICRO - 1] = 1;
  starts[T + 1 + 2] = 5;
  CHECK(zt_jobs_push_batch(jobs, sid, tokens, mask, starts, MICRO, &a, on_done, &a, err,
                           sizeof err) == -EINVAL);
  CHECK(strcmp(err, "batch doc_starts row 1 index 2: 5 is neither 0 nor 1") == 0);
  CHECK(a.credits == 0 && a.errors == 0);
  /* A queued job takes no checkpoint request. */
  CHECK(zt_jobs_checkpoint(jobs, sid, on_done, &a, err, sizeof err) == -EINVAL);

  /* Room for two: credited at once; then the queue is full and credit stops. */
  CHECK(push(jobs, sid, 1, &a) == 0 && a.credits == 1);
  CHECK(json_integer_value(json_object_get(a.reply, "queued")) == 1);
  CHECK(push(jobs, sid, 2, &a) == 0 && a.credits == 2);
  CHECK(json_integer_value(json_object_get(a.reply, "queued")) == 2);
  CHECK(push(jobs, sid, 3, &a) == 0 && a.credits == 2);
  CHECK(push(jobs, sid, 4, &b) == 0 && b.credits == 0);
  CHECK(push(jobs, sid, 5, &b) == 0 && b.credits == 0);
  zt_jobs_forget(jobs, &b);
  CHECK(push(jobs, sid, 6, &a) == 0 && a.credits == 2);
  uv_run(&loop, UV_RUN_NOWAIT);
  CHECK(a.credits == 2);

  /* The file job ends; the stream job runs and consumes: the pending pushes are credited. */
  CHECK(zt_jobs_cancel(jobs, fid, err, sizeof err) == 0);
  wait_event(&loop, fid, "end", 1);
  CHECK(strcmp(json_string_value(json_object_get(jt_last(&g_ev, fid, "end"), "state")),
               "cancelled") == 0);
  wait_event(&loop, sid, "step", 1);
  CHECK(a.credits >= 3);
  /* 4 micro-batches in (2 + 2 pending); the job needs 6. */
  CHECK(push(jobs, sid, 7, &a) == 0);
  CHECK(push(jobs, sid, 8, &a) == 0);
  wait_event(&loop, sid, "end", 1);
  CHECK(a.credits == 6 && a.errors == 0);
  CHECK(b.credits == 0 && b.errors == 0);
  json_decref(a.reply);
  a.reply = NULL;
  CHECK(strcmp(json_string_value(json_object_get(jt_last(&g_ev, sid, "end"), "state")), "done") ==
        0);
  snprintf(path, sizeof path, "%s/jobs/%s/losses.log", state, sid);
  char *log = jt_read_file(path);
  CHECK(log && strncmp(log, "1 ", 2) == 0 && strstr(log, "\n3 ") && !strstr(log, "\n4 "));
  free(log);
  CHECK(push(jobs, sid, 9, &a) == -EINVAL);

  /* Cancel reaches a runner waiting for data (one of two micro-batches given). */
  char cid[ZT_JOB_ID_MAX];
  spec = stream_spec(5);
  CHECK(jt_submit(jobs, spec, cid, err, sizeof err) == 0);
  json_decref(spec);
  CHECK(push(jobs, cid, 1, &a) == 0);
  wait_event(&loop, cid, "state", 1);
  CHECK(zt_jobs_cancel(jobs, cid, err, sizeof err) == 0);
  wait_event(&loop, cid, "end", 1);
  CHECK(strcmp(json_string_value(json_object_get(jt_last(&g_ev, cid, "end"), "state")),
               "cancelled") == 0);
  CHECK(jt_count(&g_ev, cid, "step") == 0);
  int32_t one[MICRO];
  batch(one, 0);
  CHECK(zt_jobs_push_batch(jobs, cid, one, NULL, NULL, MICRO, &a, on_done, &a, err,
                           sizeof err) == -EINVAL);
  CHECK(strstr(err, "cancelled"));

  /* A checkpoint request is answered while the runner waits for data; then shutdown stops the
   * waiting runner, and the restarted daemon fails the job (its stream cannot be replayed). */
  char wid[ZT_JOB_ID_MAX];
  spec = stream_spec(5);
  CHECK(jt_submit(jobs, spec, wid, err, sizeof err) == 0);
  json_decref(spec);
  CHECK(push(jobs, wid, 1, &a) == 0);
  CHECK(push(jobs, wid, 2, &a) == 0);
  wait_event(&loop, wid, "step", 1);
  owner c = {0};
  CHECK(zt_jobs_checkpoint(jobs, wid, on_done, &c, err, sizeof err) == 0);
  wait_event(&loop, wid, "checkpoint", 1);
  uv_run(&loop, UV_RUN_NOWAIT);
  CHECK(c.credits == 1 && c.reply);
  CHECK(json_integer_value(json_object_get(c.reply, "step")) == 1);
  CHECK(strstr(json_string_value(json_object_get(c.reply, "path")), "step-00000001"));
  json_decref(c.reply);
  int down = 0;
  zt_jobs_shutdown(jobs, on_shutdown, &down);
  jt_run_until(&loop, is_set, &down, 60);
  CHECK(jt_count(&g_ev, wid, "end") == 0);
  jt_close(jobs, &loop);

  json_array_clear(g_ev.all);
  jobs = jt_open(&loop, state, &g_ev, 2);
  int rc;
  json_t *show = zt_jobs_show(jobs, wid, &rc, err, sizeof err);
  CHECK(rc == 0);
  CHECK(strcmp(json_string_value(json_object_get(show, "state")), "failed") == 0);
  CHECK(strcmp(json_string_value(json_object_get(show, "error")),
               "interrupted by daemon restart; stream data cannot be replayed") == 0);
  json_decref(show);
  jt_close(jobs, &loop);

  json_decref(a.reply);
  CHECK(uv_loop_close(&loop) == 0);
  json_decref(g_ev.all);
  jt_rmtree(dir);
  return 0;
}
