#include "engine/job/series.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "engine/base/clock.h"
#include "engine/job/jobs.h"

/* Keeps the lines of steps up to max_step (replaced atomically); 0 when there is no file. */
static int truncate_after(const char *path, int max_step, char *err, size_t errlen) {
  char tmp[4200];
  char *line = NULL;
  size_t cap = 0;
  int rc = 0;
  FILE *in = fopen(path, "re"), *out = NULL;
  if (!in) {
    if (errno == ENOENT) return 0;
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return -errno;
  }
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  if (!(out = fopen(tmp, "we"))) goto fail;
  while (getline(&line, &cap, in) > 0) {
    json_t *j = json_loads(line, 0, NULL);
    json_int_t step = json_integer_value(json_object_get(j, "step"));
    json_decref(j);
    if (step >= 1 && step <= max_step && fputs(line, out) == EOF) goto fail;
  }
  if (fflush(out) != 0 || fsync(fileno(out)) != 0) goto fail;
  int c = fclose(out);
  out = NULL;
  if (c != 0 || rename(tmp, path) != 0) goto fail;
  goto out;
fail:
  rc = errno ? -errno : -EIO;
  snprintf(err, errlen, "%s: %s", path, strerror(-rc));
  unlink(tmp);
out:
  if (out) fclose(out);
  fclose(in);
  free(line);
  return rc;
}

int zt__series_open(zt__series *s, const char *job_dir, int resume, int tensorboard, char *err,
                    size_t errlen) {
  int rc;
  memset(s, 0, sizeof *s);
  snprintf(s->path, sizeof s->path, "%s/metrics.jsonl", job_dir);
  if ((rc = truncate_after(s->path, resume, err, errlen)) < 0) return rc;
  if (!(s->jsonl = fopen(s->path, "ae"))) {
    snprintf(err, errlen, "%s: %s", s->path, strerror(errno));
    return -errno;
  }
  if (!tensorboard) return 0;
  char dir[4200];
  snprintf(dir, sizeof dir, "%s/tb", job_dir);
  double now = zt_unix_seconds();
  if ((rc = zt__tfevents_open(&s->tb, dir, now, err, errlen)) < 0) return rc;
  s->tb_open = 1;
  /* the run goes on with step resume + 1: TensorBoard drops what an earlier run wrote from
   * there on */
  return resume > 0 ? zt__tfevents_start(&s->tb, resume + 1, now, err, errlen) : 0;
}

/* The event's point as a line of metrics.jsonl; *p gets it (0), NULL on a failure. */
static int put_line(zt__series *s, const json_t *ev, double now, json_t **p, char *err,
                    size_t errlen) {
  *p = zt_jobs_point(ev, now);
  char *line = *p ? json_dumps(*p, JSON_COMPACT) : NULL;
  int rc = 0;
  if (!line) {
    rc = -ENOMEM;
    snprintf(err, errlen, "%s: out of memory", s->path);
  } else if (fprintf(s->jsonl, "%s\n", line) < 0 || fflush(s->jsonl) != 0) {
    rc = -errno;
    snprintf(err, errlen, "%s: %s", s->path, strerror(errno));
  }
  free(line);
  if (rc < 0) {
    json_decref(*p);
    *p = NULL;
  }
  return rc;
}

int zt__series_eval(zt__series *s, const json_t *ev, char *err, size_t errlen) {
  double now = zt_unix_seconds();
  json_t *p;
  int rc = put_line(s, ev, now, &p, err, errlen);
  const json_t *v = json_object_get(p, "eval_loss");
  if (rc == 0 && s->tb_open && json_is_number(v)) {
    const char *tag = "eval/loss";
    float value = (float)json_number_value(v);
    rc = zt__tfevents_scalars(&s->tb, json_integer_value(json_object_get(p, "step")), now, &tag,
                              &value, 1, err, errlen);
  }
  json_decref(p);
  return rc;
}

int zt__series_step(zt__series *s, const json_t *ev, char *err, size_t errlen) {
  static const char *const keys[] = {"loss", "lr", "grad_norm", "tokens_per_s", "step_s", "mfu"};
  static const char *const tiers[] = {"device", "host_pinned", "nvme"};
  double now = zt_unix_seconds();
  json_t *p;
  int rc = put_line(s, ev, now, &p, err, errlen);
  if (rc < 0 || !s->tb_open) goto out;
  const char *tags[9];
  float values[9];
  int n = 0;
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    const json_t *v = json_object_get(p, keys[i]);
    if (!json_is_number(v)) continue; /* a loss that was not finite */
    tags[n] = keys[i];
    values[n++] = (float)json_number_value(v);
  }
  static const char *const tier_tags[] = {"memory/device", "memory/host_pinned", "memory/nvme"};
  const json_t *mem = json_object_get(p, "memory");
  for (size_t i = 0; i < sizeof tiers / sizeof tiers[0]; i++) {
    tags[n] = tier_tags[i];
    values[n++] = (float)json_number_value(json_object_get(mem, tiers[i]));
  }
  rc = zt__tfevents_scalars(&s->tb, json_integer_value(json_object_get(p, "step")), now, tags,
                            values, n, err, errlen);
out:
  json_decref(p);
  return rc;
}

int zt__series_sync(zt__series *s, char *err, size_t errlen) {
  if (s->jsonl && fsync(fileno(s->jsonl)) != 0) {
    snprintf(err, errlen, "%s: fsync: %s", s->path, strerror(errno));
    return -errno;
  }
  return s->tb_open ? zt__tfevents_sync(&s->tb, err, errlen) : 0;
}

void zt__series_close(zt__series *s) {
  if (s->jsonl) fclose(s->jsonl);
  s->jsonl = NULL;
  if (s->tb_open) zt__tfevents_close(&s->tb);
  s->tb_open = 0;
}
