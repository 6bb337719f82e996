#include "jobtest.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "proto/zt_tokens.h"

void jt_tempdir(char *out, size_t outlen, const char *tag) {
  const char *base = getenv("TMPDIR");
  snprintf(out, outlen, "%s/zt-%s-XXXXXX", base && base[0] ? base : "/tmp", tag);
  CHECK(mkdtemp(out) != NULL);
}

static int rm_entry(const char *path, const struct stat *st, int type, struct FTW *ftw) {
  return remove(path);
}

void jt_rmtree(const char *path) { nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

void jt_write_file(const char *path, const void *data, size_t len) {
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL);
  CHECK(fwrite(data, 1, len, f) == len);
  CHECK(fclose(f) == 0);
}

void jt_write_tokens(const char *path, uint32_t vocab, uint32_t token_bytes, size_t n) {
  size_t len = ZT_TOKENS_HEADER_BYTES + n * token_bytes;
  uint8_t *buf = calloc(1, len);
  CHECK(buf != NULL);
  zt_tokens_header h = {.version = ZT_TOKENS_VERSION, .token_bytes = token_bytes, .vocab = vocab};
  zt_tokens_header_encode(buf, &h);
  uint32_t t = 1;
  for (size_t i = 0; i < n; i++) {
    uint8_t *p = buf + ZT_TOKENS_HEADER_BYTES + i * token_bytes;
    p[0] = (uint8_t)t;
    p[1] = (uint8_t)(t >> 8);
    if (token_bytes == 4) zt__put_le32(p, t);
    t = (t * 5 + 3) % vocab;
  }
  jt_write_file(path, buf, len);
  free(buf);
}

char *jt_read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 4096, n = 0;
  char *s = malloc(cap);
  CHECK(s != NULL);
  size_t got;
  while ((got = fread(s + n, 1, cap - n - 1, f)) > 0) {
    n += got;
    if (n + 1 == cap) {
      cap *= 2;
      s = realloc(s, cap);
      CHECK(s != NULL);
    }
  }
  s[n] = '\0';
  fclose(f);
  return s;
}

void jt_on_event(void *user, const char *job, json_t *event) {
  jt_events *e = user;
  CHECK(strcmp(json_string_value(json_object_get(event, "job")), job) == 0);
  json_array_append(e->all, event);
  if (e->hook) e->hook(e->hook_arg, job, event);
}

static int matches(json_t *ev, const char *job, const char *kind) {
  return strcmp(json_string_value(json_object_get(ev, "job")), job) == 0 &&
         strcmp(json_string_value(json_object_get(ev, "event")), kind) == 0;
}

int jt_count(const jt_events *e, const char *job, const char *kind) {
  int n = 0;
  size_t i;
  json_t *ev;
  json_array_foreach(e->all, i, ev) n += matches(ev, job, kind);
  return n;
}

json_t *jt_last(const jt_events *e, const char *job, const char *kind) {
  json_t *last = NULL, *ev;
  size_t i;
  json_array_foreach(e->all, i, ev) if (matches(ev, job, kind)) last = ev;
  return last;
}

static void on_tick(uv_timer_t *t) {}

void jt_run_until(uv_loop_t *loop, int (*pred)(void *), void *arg, double timeout_s) {
  uv_timer_t tick;
  uv_timer_init(loop, &tick);
  uv_timer_start(&tick, on_tick, 20, 20);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (!pred(arg)) {
    uv_run(loop, UV_RUN_ONCE);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double dt = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    if (dt > timeout_s) {
      fprintf(stderr, "timed out after %.0f s\n", timeout_s);
      exit(1);
    }
  }
  uv_close((uv_handle_t *)&tick, NULL);
  uv_run(loop, UV_RUN_NOWAIT);
}

void jt_close(zt_jobs *jobs, uv_loop_t *loop) {
  zt_jobs_close(jobs);
  uv_run(loop, UV_RUN_DEFAULT);
}

static uv_loop_t *g_loop;

void jt_set_loop(uv_loop_t *loop) { g_loop = loop; }

typedef struct jt_answer {
  int done, rc;
  json_t *reply;
  char *err;
  size_t errlen;
} jt_answer;

static void on_answer(void *owner, int rc, json_t *reply, const char *message) {
  jt_answer *a = owner;
  a->done = 1;
  a->rc = rc;
  a->reply = json_incref(reply);
  if (rc < 0) snprintf(a->err, a->errlen, "%s", message ? message : "");
}

static int answered(void *arg) { return ((jt_answer *)arg)->done; }

int jt_submit(zt_jobs *jobs, const json_t *spec, char id[ZT_JOB_ID_MAX], char *err,
              size_t errlen) {
  jt_answer a = {.err = err, .errlen = errlen};
  int rc = zt_jobs_submit(jobs, spec, 0, on_answer, &a, err, errlen);
  if (rc < 0) return rc;
  CHECK(g_loop != NULL);
  jt_run_until(g_loop, answered, &a, 60);
  if (a.rc == 0)
    snprintf(id, ZT_JOB_ID_MAX, "%s", json_string_value(json_object_get(a.reply, "job")));
  json_decref(a.reply);
  return a.rc;
}

json_t *jt_plan(zt_jobs *jobs, const json_t *spec, int *rc, char *err, size_t errlen) {
  jt_answer a = {.err = err, .errlen = errlen};
  if ((*rc = zt_jobs_plan(jobs, spec, NULL, 0, on_answer, &a, err, errlen)) < 0) return NULL;
  CHECK(g_loop != NULL);
  jt_run_until(g_loop, answered, &a, 60);
  *rc = a.rc;
  return a.reply;
}

typedef struct jt_chunk {
  jt_answer a;
  uint8_t **data;
  size_t *len;
  uint64_t *total, *step;
} jt_chunk;

static void on_chunk(void *owner, int rc, const uint8_t *data, size_t len, uint64_t total,
                     uint64_t step, const char *message) {
  jt_chunk *c = owner;
  c->a.done = 1;
  c->a.rc = rc;
  if (rc < 0) {
    snprintf(c->a.err, c->a.errlen, "%s", message ? message : "");
    return;
  }
  *c->data = malloc(len ? len : 1);
  CHECK(*c->data != NULL);
  memcpy(*c->data, data, len);
  *c->len = len;
  *c->total = total;
  *c->step = step;
}

int jt_export_chunk(zt_jobs *jobs, const char *id, uint64_t offset, uint64_t length,
                    uint8_t **data, size_t *len, uint64_t *total, uint64_t *step, char *err,
                    size_t errlen) {
  jt_chunk c = {.a = {.err = err, .errlen = errlen}, data, len, total, step};
  int rc = zt_jobs_export(jobs, id, offset, length, on_chunk, &c, err, errlen);
  if (rc < 0) return rc;
  CHECK(g_loop != NULL);
  jt_run_until(g_loop, answered, &c.a, 60);
  return c.a.rc;
}

zt_jobs *jt_open(uv_loop_t *loop, const char *state_dir, jt_events *ev, uint32_t depth) {
  g_loop = loop;
  zt_jobs_config cfg = {.loop = loop,
                        .state_dir = state_dir,
                        .backend = "cpu",
                        .cpu_threads = 1,
                        .batch_queue_depth = depth,
                        .on_event = jt_on_event,
                        .user = ev};
  char err[512] = "";
  zt_jobs *jobs = NULL;
  int rc = zt_jobs_open(&jobs, &cfg, err, sizeof err);
  if (rc < 0) fprintf(stderr, "zt_jobs_open: %d %s\n", rc, err);
  CHECK(rc == 0);
  return jobs;
}
