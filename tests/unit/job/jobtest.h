/* Shared by the job-layer tests: a temp state dir, token files, a loop driven until a condition
 * holds, and a record of the events the registry posts. */
#ifndef ZT_JOBTEST_H
#define ZT_JOBTEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <jansson.h>
#include <uv.h>
#include "engine/job/jobs.h"

#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);      \
      exit(1);                                                                      \
    }                                                                               \
  } while (0)

/* A new empty directory under $TMPDIR (or /tmp); the caller removes it with jt_rmtree. */
void jt_tempdir(char *out, size_t outlen, const char *tag);
void jt_rmtree(const char *path);

/* A token file of n tokens that follow t[i+1] = (t[i] * 5 + 3) % vocab: predictable, so a tiny
 * model's loss falls fast. token_bytes 2 or 4. */
void jt_write_tokens(const char *path, uint32_t vocab, uint32_t token_bytes, size_t n);
void jt_write_file(const char *path, const void *data, size_t len);
/* The whole file as a string (malloc'd), NULL if missing. */
char *jt_read_file(const char *path);

/* The events seen, in order. */
typedef struct jt_events {
  json_t *all;            /* array of event objects */
  void (*hook)(void *arg, const char *job, json_t *event);
  void *hook_arg;
} jt_events;

void jt_on_event(void *user, const char *job, json_t *event);
/* Count of events of kind for job. */
int jt_count(const jt_events *e, const char *job, const char *kind);
/* The last event of kind for job, or NULL. */
json_t *jt_last(const jt_events *e, const char *job, const char *kind);

/* Runs the loop until pred(arg) holds; fails the test after timeout_s. */
void jt_run_until(uv_loop_t *loop, int (*pred)(void *), void *arg, double timeout_s);
/* zt_jobs_close and let the loop finish closing its handle. */
void jt_close(zt_jobs *jobs, uv_loop_t *loop);

zt_jobs *jt_open(uv_loop_t *loop, const char *state_dir, jt_events *ev, uint32_t depth);
/* The loop jt_submit and jt_plan run (jt_open sets it; a test that opens its registry itself
 * names it here). */
void jt_set_loop(uv_loop_t *loop);
/* zt_jobs_submit and zt_jobs_plan run to their answer: the refusal of either step (the spec's
 * structure at once, the worker's checks later) comes back as rc and err, as one call. */
int jt_submit(zt_jobs *jobs, const json_t *spec, char id[ZT_JOB_ID_MAX], char *err,
              size_t errlen);
json_t *jt_plan(zt_jobs *jobs, const json_t *spec, int *rc, char *err, size_t errlen);
/* zt_jobs_export run to its answer; *data malloc'd. */
int jt_export_chunk(zt_jobs *jobs, const char *id, uint64_t offset, uint64_t length,
                    uint8_t **data, size_t *len, uint64_t *total, uint64_t *step, char *err,
                    size_t errlen);

#endif
