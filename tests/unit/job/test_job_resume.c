/* Exact resume: a file job stopped by zt_jobs_shutdown mid-run checkpoints, stays "running" on
 * disk, resumes when the registry is reopened and ends with the same per-step losses, bit for
 * bit, as an uninterrupted run of the same spec (the file sampler is stateless). */
#include <errno.h>
#include <string.h>
#include <unistd.h>
#include "jobtest.h"

#define STEPS 40

static jt_events g_ev;
static zt_jobs *g_jobs;
static int g_shutdown_called, g_shutdown_done;

static int job_ended(void *arg) { return jt_count(&g_ev, "j000001", "end") > 0; }
static int shutdown_done(void *arg) { return g_shutdown_done; }
static void on_shutdown(void *user) { g_shutdown_done++; }

/* Stops the daemon as soon as the first step is reported: the runner is then a few steps in. */
static void stop_on_step(void *arg, const char *job, json_t *event) {
  const char *kind = json_string_value(json_object_get(event, "event"));
  if (!g_shutdown_called && strcmp(kind, "step") == 0) {
    g_shutdown_called = 1;
    zt_jobs_shutdown(g_jobs, on_shutdown, NULL);
  }
}

static json_t *spec_for(const char *tok) {
  return json_pack(
      "{s:{s:s, s:i, s:i, s:i, s:i, s:i}, s:{s:i, s:i, s:i, s:{s:f}, s:{s:s, s:i}, s:f, s:i}, "
      "s:{s:s, s:s}, s:{s:i, s:i}}",
      "model", "arch", "gpt", "vocab", 16, "seq_len", 16, "d_model", 32, "n_heads", 4,
      "n_layers", 2, "train", "steps", STEPS, "micro_batch", 4, "grad_accum", 2, "optimizer",
      "lr", 3e-3, "schedule", "name", "cosine", "warmup_steps", 5, "grad_clip", 1.0, "seed", 11,
      "data", "source", "file", "path", tok, "checkpoint", "every", 25, "keep", 1);
}

static char *run_to_end(const char *state, const char *tok, uv_loop_t *loop) {
  char err[1024], id[ZT_JOB_ID_MAX], path[800];
  json_array_clear(g_ev.all);
  zt_jobs *jobs = jt_open(loop, state, &g_ev, 4);
  json_t *spec = spec_for(tok);
  CHECK(jt_submit(jobs, spec, id, err, sizeof err) == 0);
  json_decref(spec);
  jt_run_until(loop, job_ended, NULL, 120);
  jt_close(jobs, loop);
  snprintf(path, sizeof path, "%s/jobs/j000001/losses.log", state);
  return jt_read_file(path);
}

int main(void) {
  char dir[512], state_a[600], state_b[600], tok[600], path[800], err[1024], id[ZT_JOB_ID_MAX];
  jt_tempdir(dir, sizeof dir, "resume");
  snprintf(state_a, sizeof state_a, "%s/a", dir);
  snprintf(state_b, sizeof state_b, "%s/b", dir);
  snprintf(tok, sizeof tok, "%s/data.tok", dir);
  jt_write_tokens(tok, 16, 4, 5000);
  uv_loop_t loop;
  uv_loop_init(&loop);
  g_ev.all = json_array();

  char *want = run_to_end(state_a, tok, &loop);
  CHECK(want != NULL);

  /* Interrupted run. */
  json_array_clear(g_ev.all);
  g_jobs = jt_open(&loop, state_b, &g_ev, 4);
  g_ev.hook = stop_on_step;
  json_t *spec = spec_for(tok);
  CHECK(jt_submit(g_jobs, spec, id, err, sizeof err) == 0);
  json_decref(spec);
  jt_run_until(&loop, shutdown_done, NULL, 120);
  g_ev.hook = NULL;
  CHECK(g_shutdown_done == 1);
  CHECK(jt_count(&g_ev, id, "end") == 0);
  /* Nothing new is accepted while shutting down. */
  spec = spec_for(tok);
  char id2[ZT_JOB_ID_MAX];
  CHECK(jt_submit(g_jobs, spec, id2, err, sizeof err) == -ESHUTDOWN);
  json_decref(spec);
  int rc;
  json_t *show = zt_jobs_show(g_jobs, id, &rc, err, sizeof err);
  int stopped_at = (int)json_integer_value(json_object_get(show, "step"));
  fprintf(stderr, "stopped at step %d\n", stopped_at);
  CHECK(stopped_at > 0 && stopped_at < STEPS);
  CHECK(json_integer_value(json_object_get(show, "checkpoint_step")) == stopped_at);
  json_decref(show);
  jt_close(g_jobs, &loop);

  snprintf(path, sizeof path, "%s/jobs/%s", state_b, id);
  json_error_t je;
  char status_path[900];
  snprintf(status_path, sizeof status_path, "%s/status.json", path);
  json_t *status = json_load_file(status_path, 0, &je);
  CHECK(status && strcmp(json_string_value(json_object_get(status, "state")), "running") == 0);
  json_decref(status);
  /* Losses past the checkpoint (a crash leaves them) are trained again and rewritten. */
  snprintf(status_path, sizeof status_path, "%s/losses.log", path);
  FILE *f = fopen(status_path, "a");
  CHECK(f != NULL);
  fprintf(f, "%d 99.0\n", stopped_at + 1);
  fclose(f);

  /* Reopen: the job resumes from its checkpoint and finishes. */
  json_array_clear(g_ev.all);
  g_jobs = jt_open(&loop, state_b, &g_ev, 4);
  jt_run_until(&loop, job_ended, NULL, 120);
  CHECK(jt_count(&g_ev, id, "step") == STEPS - stopped_at);
  json_t *first = NULL, *ev;
  size_t i;
  json_array_foreach(g_ev.all, i, ev) {
    if (!first && strcmp(json_string_value(json_object_get(ev, "event")), "step") == 0) first = ev;
  }
  CHECK(json_integer_value(json_object_get(first, "step")) == stopped_at + 1);
  jt_close(g_jobs, &loop);

  char *got = jt_read_file(status_path);
  CHECK(got != NULL);
  if (strcmp(got, want) != 0) {
    fprintf(stderr, "losses differ:\n--- uninterrupted\n%s--- resumed\n%s", want, got);
    return 1;
  }
  free(got);
  free(want);
  CHECK(uv_loop_close(&loop) == 0);
  json_decref(g_ev.all);
  jt_rmtree(dir);
  return 0;
}
