/* A tiny gpt file-source job runs to done: one step event and one losses.log line per step, the
 * loss falls, checkpoints rotate to keep K, the state dir is locked against a second registry,
 * and a reopened registry lists the job again with its state. */
#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "jobtest.h"

#define STEPS 12

static jt_events g_ev;
static char g_id[ZT_JOB_ID_MAX];

static int job_ended(void *arg) { return jt_count(&g_ev, g_id, "end") > 0; }

static json_t *tiny_spec(const char *tok) {
  return json_pack(
      "{s:s, s:{s:s, s:i, s:i, s:i, s:i, s:i}, s:{s:i, s:i, s:i, s:{s:f}, s:i}, "
      "s:{s:s, s:s}, s:{s:i, s:i}}",
      "name", "tiny-gpt", "model", "arch", "gpt", "vocab", 16, "seq_len", 8, "d_model", 16,
      "n_heads", 2, "n_layers", 1, "train", "steps", STEPS, "micro_batch", 4, "grad_accum", 2,
      "optimizer", "lr", 1e-2, "seed", 7, "data", "source", "file", "path", tok, "checkpoint",
      "every", 3, "keep", 2);
}

int main(void) {
  char dir[512], state[600], tok[600], path[800], err[1024];
  jt_tempdir(dir, sizeof dir, "run");
  snprintf(state, sizeof state, "%s/state", dir);
  snprintf(tok, sizeof tok, "%s/data.tok", dir);
  jt_write_tokens(tok, 16, 2, 4096);

  uv_loop_t loop;
  uv_loop_init(&loop);
  g_ev.all = json_array();
  zt_jobs *jobs = jt_open(&loop, state, &g_ev, 4);

  /* A second registry on the same state dir is refused while the first holds it. */
  {
    zt_jobs *other = NULL;
    zt_jobs_config cfg = {.loop = &loop, .state_dir = state, .backend = "cpu"};
    int rc = zt_jobs_open(&other, &cfg, err, sizeof err);
    CHECK(rc == -EBUSY && other == NULL);
    char want[64];
    snprintf(want, sizeof want, "(pid %ld)", (long)getpid());
    CHECK(strstr(err, state) && strstr(err, want));
    uv_run(&loop, UV_RUN_NOWAIT);
  }

  /* A state dir that cannot be one is refused, named. */
  {
    zt_jobs *other = NULL;
    zt_jobs_config cfg = {.loop = &loop, .state_dir = tok, .backend = "cpu"};
    CHECK(zt_jobs_open(&other, &cfg, err, sizeof err) == -ENOTDIR && strstr(err, tok));
    char ro[700];
    snprintf(ro, sizeof ro, "%s/readonly", dir);
    CHECK(mkdir(ro, 0555) == 0);
    cfg.state_dir = ro;
    /* root writes anywhere: the refusal is only observable for other users */
    if (geteuid() != 0) {
      CHECK(zt_jobs_open(&other, &cfg, err, sizeof err) == -EACCES);
      char want[800];
      snprintf(want, sizeof want, "state dir %s is not writable", ro);
      CHECK(strcmp(err, want) == 0);
    }
    uv_run(&loop, UV_RUN_NOWAIT);
  }

  json_t *spec = tiny_spec(tok);
  CHECK(jt_submit(jobs, spec, g_id, err, sizeof err) == 0);
  json_decref(spec);
  CHECK(strcmp(g_id, "j000001") == 0);
  jt_run_until(&loop, job_ended, NULL, 60);

  CHECK(jt_count(&g_ev, g_id, "step") == STEPS);
  json_t *end = jt_last(&g_ev, g_id, "end");
  CHECK(strcmp(json_string_value(json_object_get(end, "state")), "done") == 0);
  /* "end" is the job's last event. */
  CHECK(json_array_get(g_ev.all, json_array_size(g_ev.all) - 1) == end);
  json_t *step = jt_last(&g_ev, g_id, "step");
  CHECK(json_integer_value(json_object_get(step, "step")) == STEPS);
  CHECK(json_real_value(json_object_get(step, "tokens_per_s")) > 0);
  /* B * T * grad_accum tokens, in step_s seconds; the MFU of a 6 * N * tokens/s model */
  CHECK(json_integer_value(json_object_get(step, "tokens")) == 4 * 8 * 2);
  double step_s = json_real_value(json_object_get(step, "step_s"));
  double mfu = json_real_value(json_object_get(step, "mfu"));
  CHECK(step_s > 0 && fabs(64 / step_s - json_real_value(json_object_get(step, "tokens_per_s"))) <
                          1e-6 * (64 / step_s));
  CHECK(mfu > 0 && mfu < 1);
  json_t *mem = json_object_get(step, "memory");
  CHECK(strcmp(json_string_value(json_object_get(mem, "backend")), "cpu") == 0);
  CHECK(json_integer_value(json_object_get(mem, "backend_bytes")) > 0);
  /* checkpoints at 3, 6, 9 and the end */
  CHECK(jt_count(&g_ev, g_id, "checkpoint") == 4);

  int rc;
  json_t *show = zt_jobs_show(jobs, g_id, &rc, err, sizeof err);
  CHECK(rc == 0);
  CHECK(strcmp(json_string_value(json_object_get(show, "state")), "done") == 0);
  json_t *losses = json_object_get(show, "losses");
  CHECK(json_array_size(losses) == STEPS);
  double first = json_real_value(json_array_get(losses, 0));
  double last = json_real_value(json_array_get(losses, STEPS - 1));
  fprintf(stderr, "loss %g -> %g\n", first, last);
  CHECK(last < first * 0.9);
  CHECK(json_integer_value(json_object_get(show, "checkpoint_step")) == STEPS);
  json_decref(show);

  /* keep 2: the two newest remain */
  snprintf(path, sizeof path, "%s/jobs/%s/checkpoints/step-00000012/model.safetensors", state,
           g_id);
  CHECK(access(path, F_OK) == 0);
  snprintf(path, sizeof path, "%s/jobs/%s/checkpoints/step-00000009", state, g_id);
  CHECK(access(path, F_OK) == 0);
  snprintf(path, sizeof path, "%s/jobs/%s/checkpoints/step-00000006", state, g_id);
  CHECK(access(path, F_OK) != 0);
  snprintf(path, sizeof path, "%s/jobs/%s/checkpoints/step-00000003", state, g_id);
  CHECK(access(path, F_OK) != 0);

  /* The exported weights are the newest checkpoint's. */
  uint8_t *data;
  size_t len;
  uint64_t total, at_step;
  CHECK(jt_export_chunk(jobs, g_id, 0, 8, &data, &len, &total, &at_step, err,
                        sizeof err) == 0);
  CHECK(len == 8 && total > 8 && at_step == STEPS);
  free(data);
  CHECK(zt_jobs_cancel(jobs, g_id, err, sizeof err) == -EINVAL);
  CHECK(strstr(err, "job j000001 is already done"));
  CHECK(zt_jobs_cancel(jobs, "j000042", err, sizeof err) == -ENOENT);

  json_t *st = zt_jobs_status(jobs);
  CHECK(json_integer_value(json_object_get(st, "running")) == 0);
  CHECK(json_integer_value(json_object_get(st, "jobs")) == 1);
  json_decref(st);
  jt_close(jobs, &loop);

  /* Reopen: listed again, done, nothing restarts; the next id follows. */
  json_array_clear(g_ev.all);
  jobs = jt_open(&loop, state, &g_ev, 4);
  json_t *list = zt_jobs_list(jobs);
  json_t *arr = json_object_get(list, "jobs");
  CHECK(json_array_size(arr) == 1);
  json_t *j0 = json_array_get(arr, 0);
  CHECK(strcmp(json_string_value(json_object_get(j0, "job")), g_id) == 0);
  CHECK(strcmp(json_string_value(json_object_get(j0, "state")), "done") == 0);
  CHECK(strcmp(json_string_value(json_object_get(j0, "name")), "tiny-gpt") == 0);
  CHECK(json_integer_value(json_object_get(j0, "step")) == STEPS);
  CHECK(json_real_value(json_object_get(j0, "loss")) == last);
  json_decref(list);
  show = zt_jobs_show(jobs, g_id, &rc, err, sizeof err);
  CHECK(rc == 0 && json_array_size(json_object_get(show, "losses")) == STEPS);
  json_decref(show);
  CHECK(json_array_size(g_ev.all) == 0);

  /* A job stopped by close keeps its place; if its data file is gone when the next daemon
   * would start it, it fails naming the file. */
  spec = tiny_spec(tok);
  char id2[ZT_JOB_ID_MAX];
  CHECK(jt_submit(jobs, spec, id2, err, sizeof err) == 0);
  CHECK(strcmp(id2, "j000002") == 0);
  json_decref(spec);
  jt_close(jobs, &loop);
  CHECK(unlink(tok) == 0);
  json_array_clear(g_ev.all);
  jobs = jt_open(&loop, state, &g_ev, 4);
  snprintf(g_id, sizeof g_id, "%s", id2);
  jt_run_until(&loop, job_ended, NULL, 10);
  show = zt_jobs_show(jobs, id2, &rc, err, sizeof err);
  CHECK(rc == 0);
  CHECK(strcmp(json_string_value(json_object_get(show, "state")), "failed") == 0);
  snprintf(path, sizeof path, "data.path: %s: No such file or directory", tok);
  CHECK(strcmp(json_string_value(json_object_get(show, "error")), path) == 0);
  json_decref(show);
  jt_close(jobs, &loop);

  CHECK(uv_loop_close(&loop) == 0);
  json_decref(g_ev.all);
  jt_rmtree(dir);
  return 0;
}
