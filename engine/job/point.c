/* defines: zt_jobs_point (jobs.h): a step's or an evaluation's event's figures as one flat
 * record, the line the runner appends to a job's metrics.jsonl (series.c) and the point the
 * server keeps of each for its dashboard and /metrics (engine/server/history.c). One definition, so that the file,
 * the dashboard and Prometheus agree on what a step reported. */
#include "engine/job/jobs.h"

#include <string.h>

static json_t *number_or_null(const json_t *v) {
  return json_is_number(v) ? json_real(json_number_value(v)) : json_null();
}

static json_int_t int_of(const json_t *o, const char *key) {
  return json_integer_value(json_object_get(o, key));
}

/* Copies the listed number fields of `from` into `to` (null where one is absent). */
static int copy_numbers(json_t *to, const json_t *from, const char *const *keys) {
  int bad = 0;
  for (; *keys; keys++) bad |= json_object_set_new(to, *keys, number_or_null(json_object_get(from, *keys)));
  return bad;
}

/* An eval event's: {"kind": "eval", step, time, eval_loss, tokens, batches, eval_s}. */
static json_t *eval_point(const json_t *ev, double time) {
  static const char *const figures[] = {"eval_loss", "eval_s", NULL};
  json_t *p = json_pack("{s:s, s:I, s:f, s:I, s:I}", "kind", "eval", "step", int_of(ev, "step"),
                        "time", time, "tokens", int_of(ev, "tokens"), "batches",
                        int_of(ev, "batches"));
  if (p && copy_numbers(p, ev, figures)) {
    json_decref(p);
    return NULL;
  }
  return p;
}

json_t *zt_jobs_point(const json_t *ev, double time) {
  static const char *const figures[] = {"loss", "lr", "grad_norm", "loss_scale", "tokens_per_s",
                                        "step_s", "mfu", NULL};
  if (!strcmp(json_string_value(json_object_get(ev, "event")) ?: "", "eval"))
    return eval_point(ev, time);
  const json_t *mem = json_object_get(ev, "memory");
  const json_t *off = json_object_get(mem, "offload");
  json_t *p = json_pack("{s:s, s:I, s:f, s:I, s:b}", "kind", "step", "step", int_of(ev, "step"),
                        "time", time, "tokens", int_of(ev, "tokens"), "skipped",
                        json_is_true(json_object_get(ev, "skipped")));
  /* the tiers: the backend's allocations (the device, or the host on the cpu backend), the
   * page-locked host memory, an offloaded job's NVMe files */
  json_t *tiers = json_pack("{s:I, s:I, s:I, s:I}", "device", int_of(mem, "allocated"),
                            "device_peak", int_of(mem, "peak"), "host_pinned",
                            int_of(mem, "host_pinned"), "nvme", int_of(off, "nvme_bytes"));
  if (!p || !tiers || json_object_set_new(p, "memory", tiers) < 0) {
    if (!p) json_decref(tiers); /* else set_new took it, even on failure */
    json_decref(p);
    return NULL;
  }
  const json_t *moved = json_object_get(off, "step_bytes");
  const json_t *tl = json_object_get(off, "timeline");
  int bad = copy_numbers(p, ev, figures);
  if (!bad && moved) bad = json_object_set_new(p, "moved", json_deep_copy(moved));
  if (!bad && tl) bad = json_object_set_new(p, "timeline", json_deep_copy(tl));
  if (bad) {
    json_decref(p);
    return NULL;
  }
  return p;
}
