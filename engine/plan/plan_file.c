/* plan.json (engine/plan/plan_file.h): a placement written and read back field by field. */
#include "engine/plan/plan_file.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "engine/base/sizes.h"

json_t *zt_offload_plan_to_json(const zt_offload_placement *p) {
  zt_offload_plan s = zt_offload_plan_summary(p);
  return json_pack(
      "{s:i, s:i, s:s, s:s, s:i, s:i, s:i, s:s, s:b, s:{s:I, s:I, s:I}, "
      "s:{s:f, s:i, s:I, s:I, s:I, s:I, s:I}}",
      "version", ZT_PLAN_FILE_VERSION, "ckpt_every", p->ckpt_every, "params",
      zt_offload_place_name(p->params), "order", p->unit_major ? "unit" : "micro", "gpu_units",
      s.gpu_units, "host_units", s.host_units, "grad_slots", s.grad_slots, "grads",
      zt_offload_place_name(s.grads), "delayed_update", p->delayed, "budgets", "gpu",
      (json_int_t)p->gpu_budget, "host", (json_int_t)p->host_budget, "nvme",
      (json_int_t)p->nvme_budget, "estimate", "step_s", s.est.step_s, "units", s.units,
      "device_bytes", (json_int_t)s.device_bytes, "host_bytes", (json_int_t)s.host_bytes,
      "nvme_bytes", (json_int_t)s.nvme_bytes, "act_bytes", (json_int_t)s.act_bytes,
      "arena_bytes", (json_int_t)s.arena_bytes);
}

/* An object's keys, each one of names[] (NULL-terminated): 0, or -EINVAL naming the first
 * other one. */
static int known_keys(const json_t *o, const char *where, const char *const *names, char *err,
                      size_t errlen) {
  const char *key;
  const json_t *v;
  json_object_foreach((json_t *)o, key, v) {
    int i = 0;
    while (names[i] && strcmp(names[i], key) != 0) i++;
    if (!names[i]) {
      snprintf(err, errlen, "plan.json: %s%s is not a field of a plan", where, key);
      return -EINVAL;
    }
  }
  return 0;
}

/* o.key, an integer in [lo, hi]. */
static int get_int(const json_t *o, const char *where, const char *key, int64_t lo, int64_t hi,
                   int64_t *out, char *err, size_t errlen) {
  const json_t *v = json_object_get(o, key);
  if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
    snprintf(err, errlen, "plan.json: %s%s must be an integer in [%lld, %lld]", where, key,
             (long long)lo, (long long)hi);
    return -EINVAL;
  }
  *out = json_integer_value(v);
  return 0;
}

/* o.key, a place of the ones allowed (a mask of 1 << zt_offload_place). */
static int get_place(const json_t *o, const char *key, unsigned allowed, zt_offload_place *out,
                     char *err, size_t errlen) {
  const char *s = json_string_value(json_object_get(o, key));
  if (!s || zt_offload_place_parse(s, out) < 0 || !(allowed & (1u << *out))) {
    snprintf(err, errlen, "plan.json: %s must be %s", key,
             allowed & (1u << ZT_PLACE_NVME) ? "\"gpu\", \"host\" or \"nvme\""
                                             : "\"gpu\" or \"host\"");
    return -EINVAL;
  }
  return 0;
}

int zt_offload_plan_from_json(const json_t *j, zt_offload_placement *out, char *err,
                              size_t errlen) {
  static const char *const top[] = {"version",    "ckpt_every", "params", "order",
                                    "gpu_units",  "host_units", "grad_slots", "grads",
                                    "delayed_update", "budgets", "estimate", NULL};
  static const char *const budgets[] = {"gpu", "host", "nvme", NULL};
  static const char *const estimate[] = {"step_s",     "units",     "device_bytes",
                                         "host_bytes", "nvme_bytes", "act_bytes",
                                         "arena_bytes", NULL};
  const json_t *b = json_object_get(j, "budgets"), *e = json_object_get(j, "estimate");
  const json_t *dl = json_object_get(j, "delayed_update");
  const char *order = json_string_value(json_object_get(j, "order"));
  int64_t v[16];
  zt_offload_place grads;
  int rc;
  *out = (zt_offload_placement){0};
  if (!json_is_object(j)) {
    snprintf(err, errlen, "plan.json: must be an object");
    return -EINVAL;
  }
  if ((rc = known_keys(j, "", top, err, errlen)) < 0 ||
      (rc = get_int(j, "", "version", ZT_PLAN_FILE_VERSION, ZT_PLAN_FILE_VERSION, &v[0], err,
                    errlen)) < 0 ||
      (rc = get_int(j, "", "ckpt_every", 0, INT32_MAX, &v[1], err, errlen)) < 0 ||
      (rc = get_place(j, "params", 1u << ZT_PLACE_GPU | 1u << ZT_PLACE_HOST | 1u << ZT_PLACE_NVME,
                      &out->params, err, errlen)) < 0 ||
      (rc = get_int(j, "", "gpu_units", 0, INT32_MAX, &v[2], err, errlen)) < 0 ||
      (rc = get_int(j, "", "host_units", 0, INT32_MAX - v[2], &v[3], err, errlen)) < 0 ||
      (rc = get_int(j, "", "grad_slots", 0, INT32_MAX, &v[4], err, errlen)) < 0 ||
      (rc = get_place(j, "grads", 1u << ZT_PLACE_GPU | 1u << ZT_PLACE_HOST, &grads, err,
                      errlen)) < 0)
    return rc;
  if (!order || (strcmp(order, "unit") != 0 && strcmp(order, "micro") != 0)) {
    snprintf(err, errlen, "plan.json: order must be \"unit\" or \"micro\"");
    return -EINVAL;
  }
  if (!json_is_boolean(dl)) {
    snprintf(err, errlen, "plan.json: delayed_update must be true or false");
    return -EINVAL;
  }
  if (!json_is_object(b) || !json_is_object(e)) {
    snprintf(err, errlen, "plan.json: %s must be an object", json_is_object(b) ? "estimate"
                                                                             : "budgets");
    return -EINVAL;
  }
  const json_t *step = json_object_get(e, "step_s");
  if ((rc = known_keys(b, "budgets.", budgets, err, errlen)) < 0 ||
      (rc = known_keys(e, "estimate.", estimate, err, errlen)) < 0 ||
      (rc = get_int(b, "budgets.", "gpu", 0, INT64_MAX, &v[5], err, errlen)) < 0 ||
      (rc = get_int(b, "budgets.", "host", 0, INT64_MAX, &v[6], err, errlen)) < 0 ||
      (rc = get_int(b, "budgets.", "nvme", 0, INT64_MAX, &v[7], err, errlen)) < 0 ||
      (rc = get_int(e, "estimate.", "units", 1, INT32_MAX, &v[8], err, errlen)) < 0 ||
      (rc = get_int(e, "estimate.", "device_bytes", 0, INT64_MAX, &v[9], err, errlen)) < 0 ||
      (rc = get_int(e, "estimate.", "host_bytes", 0, INT64_MAX, &v[10], err, errlen)) < 0 ||
      (rc = get_int(e, "estimate.", "nvme_bytes", 0, INT64_MAX, &v[11], err, errlen)) < 0 ||
      (rc = get_int(e, "estimate.", "act_bytes", 0, INT64_MAX, &v[12], err, errlen)) < 0 ||
      (rc = get_int(e, "estimate.", "arena_bytes", 0, INT64_MAX, &v[13], err, errlen)) < 0)
    return rc;
  if (!json_is_number(step) || json_number_value(step) < 0) {
    snprintf(err, errlen, "plan.json: estimate.step_s must be a number, at least 0");
    return -EINVAL;
  }
  out->ckpt_every = (int)v[1];
  out->unit_major = strcmp(order, "unit") == 0;
  out->z.ng = (int)v[2];
  out->z.nh = (int)(v[2] + v[3]);
  out->z.ring = (int)v[4];
  out->z.dsum = grads == ZT_PLACE_GPU;
  out->delayed = json_is_true(dl);
  out->gpu_budget = (size_t)v[5];
  out->host_budget = (size_t)v[6];
  out->nvme_budget = (uint64_t)v[7];
  out->units = (int)v[8];
  out->z.host = (size_t)v[10];
  out->nvme_bytes = (uint64_t)v[11];
  out->act_bytes = (size_t)v[12];
  out->z.arena = (size_t)v[13];
  out->est.step_s = json_number_value(step);
  return 0;
}

void zt_offload_plan_describe(const zt_offload_placement *p, char *out, size_t outlen) {
  zt_offload_plan s = zt_offload_plan_summary(p);
  char dev[32], host[32], nvme[32], gpu[32];
  zt_size_format(dev, sizeof dev, (double)s.device_bytes);
  zt_size_format(host, sizeof host, (double)s.host_bytes);
  zt_size_format(nvme, sizeof nvme, (double)s.nvme_bytes);
  zt_size_format(gpu, sizeof gpu, (double)p->gpu_budget);
  snprintf(out, outlen, "ckpt_every %d, params %s, order %s, gpu_units %d, host_units %d, "
           "grad_slots %d, grads %s: device %s, host %s, nvme %s under gpu_budget %s",
           p->ckpt_every, zt_offload_place_name(p->params), p->unit_major ? "unit" : "micro",
           s.gpu_units, s.host_units, s.grad_slots, zt_offload_place_name(s.grads), dev, host,
           nvme, p->gpu_budget ? gpu : "none");
}
