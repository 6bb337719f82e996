/* The cost model's rates (engine/plan/rates.h). */
#include "engine/plan/rates.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/base/json_file.h"
#include "engine/base/tunables.h"

static const zt_plan_rates k_default = {
    .name = "default",
    .flops_lp = ZT_TUNE_PLAN_DEVICE_FLOPS_LP,
    .flops_f32 = ZT_TUNE_PLAN_DEVICE_FLOPS_F32,
    .h2d_bytes = ZT_TUNE_PLAN_LINK_BYTES,
    .d2h_bytes = ZT_TUNE_PLAN_LINK_BYTES,
    .adamw_params = ZT_TUNE_PLAN_CPU_ADAM_PARAMS,
    .adamw_alone_params = ZT_TUNE_PLAN_CPU_ADAM_ALONE_PARAMS,
    .sumsq_bytes = ZT_TUNE_PLAN_HOST_SUMSQ_BYTES,
    .nvme_read = ZT_TUNE_PLAN_NVME_BYTES,
    .nvme_write = ZT_TUNE_PLAN_NVME_BYTES,
    .hbm_bytes = ZT_TUNE_PLAN_HBM_BYTES,
    .flops_knee = ZT_TUNE_PLAN_FLOPS_KNEE,
};

/* The H200 machine's figures as measured (docs/BENCHMARKS.md; tunables.h's comments): the
 * default's, with the disk's read and write apart (bench_nvme). */
static const zt_plan_rates k_h200 = {
    .name = "h200",
    .flops_lp = ZT_TUNE_PLAN_DEVICE_FLOPS_LP,
    .flops_f32 = ZT_TUNE_PLAN_DEVICE_FLOPS_F32,
    .h2d_bytes = ZT_TUNE_PLAN_LINK_BYTES,
    .d2h_bytes = ZT_TUNE_PLAN_LINK_BYTES,
    .adamw_params = ZT_TUNE_PLAN_CPU_ADAM_PARAMS,
    .adamw_alone_params = ZT_TUNE_PLAN_CPU_ADAM_ALONE_PARAMS,
    .sumsq_bytes = ZT_TUNE_PLAN_HOST_SUMSQ_BYTES,
    .nvme_read = 1.59e9,
    .nvme_write = 1.90e9,
    .hbm_bytes = ZT_TUNE_PLAN_HBM_BYTES,
    .flops_knee = ZT_TUNE_PLAN_FLOPS_KNEE,
};

static const zt_plan_rates *const k_named[] = {&k_default, &k_h200};

static zt_plan_rates g_active = k_default;
static _Thread_local const zt_plan_rates *g_here;

double zt_plan_rates_flops(const zt_plan_rates *r, int fp32, int d_model) {
  double k = r->flops_knee, d = d_model > 0 ? d_model : ZT_PLAN_FLOPS_WIDTH;
  double rate = fp32 ? r->flops_f32 : r->flops_lp;
  return rate * (d / (d + k)) / (ZT_PLAN_FLOPS_WIDTH / (ZT_PLAN_FLOPS_WIDTH + k));
}

const zt_plan_rates *zt_plan_rates_active(void) { return g_here ? g_here : &g_active; }

void zt_plan_rates_use(const zt_plan_rates *r) { g_active = *r; }

void zt_plan_rates_use_here(const zt_plan_rates *r) { g_here = r; }

int zt_plan_rates_named(const char *name, zt_plan_rates *out, char *err, size_t errlen) {
  for (size_t i = 0; i < sizeof k_named / sizeof k_named[0]; i++)
    if (!strcmp(k_named[i]->name, name)) {
      *out = *k_named[i];
      return 0;
    }
  snprintf(err, errlen, "no built-in rates named \"%.64s\" (the sets: default, h200)", name);
  return -ENOENT;
}

/* the file's fields: JSON name, offset in the struct */
static const struct {
  const char *key;
  size_t off;
} k_fields[] = {
    {"flops_bf16", offsetof(zt_plan_rates, flops_lp)},
    {"flops_fp32", offsetof(zt_plan_rates, flops_f32)},
    {"h2d_bytes", offsetof(zt_plan_rates, h2d_bytes)},
    {"d2h_bytes", offsetof(zt_plan_rates, d2h_bytes)},
    {"adamw_params", offsetof(zt_plan_rates, adamw_params)},
    {"adamw_alone_params", offsetof(zt_plan_rates, adamw_alone_params)},
    {"sumsq_bytes", offsetof(zt_plan_rates, sumsq_bytes)},
    {"nvme_read_bytes", offsetof(zt_plan_rates, nvme_read)},
    {"nvme_write_bytes", offsetof(zt_plan_rates, nvme_write)},
    {"hbm_bytes", offsetof(zt_plan_rates, hbm_bytes)},
    {"flops_knee", offsetof(zt_plan_rates, flops_knee)},
};
#define N_FIELDS (sizeof k_fields / sizeof k_fields[0])

int zt_plan_rates_from_json(const json_t *j, const char *what, const char *name,
                            zt_plan_rates *out, char *err, size_t errlen) {
  if (!json_is_object(j)) {
    snprintf(err, errlen, "%s: a rates file is one JSON object", what);
    return -EINVAL;
  }
  zt_plan_rates r = k_default;
  snprintf(r.name, sizeof r.name, "%s", name);
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)j, key, v) {
    if (!strcmp(key, "name")) {
      const char *s = json_string_value(v);
      if (!s || !s[0] || strlen(s) >= sizeof r.name) {
        snprintf(err, errlen, "%s: name must be a string of 1 to %d characters", what,
                 ZT_PLAN_RATES_NAME_MAX - 1);
        return -EINVAL;
      }
      snprintf(r.name, sizeof r.name, "%s", s);
      continue;
    }
    if (!strcmp(key, "measured") || !strcmp(key, "backend")) {
      /* a calibration's record of when and on what it measured: read by people, not plans */
      const char *s = json_string_value(v);
      if (!s || !s[0] || strlen(s) >= ZT_PLAN_RATES_NAME_MAX) {
        snprintf(err, errlen, "%s: %s must be a string of 1 to %d characters", what, key,
                 ZT_PLAN_RATES_NAME_MAX - 1);
        return -EINVAL;
      }
      continue;
    }
    size_t i = 0;
    while (i < N_FIELDS && strcmp(k_fields[i].key, key)) i++;
    if (i == N_FIELDS) {
      snprintf(err, errlen, "%s: unknown field (the fields: name, flops_bf16, flops_fp32, "
               "h2d_bytes, d2h_bytes, adamw_params, adamw_alone_params, sumsq_bytes, "
               "nvme_read_bytes, nvme_write_bytes, hbm_bytes, flops_knee, measured, backend)", what);
      return -EINVAL;
    }
    double x = json_number_value(v);
    int knee = k_fields[i].off == offsetof(zt_plan_rates, flops_knee);
    if (!json_is_number(v) || !isfinite(x) || x < 0 || (x == 0 && !knee)) {
      snprintf(err, errlen, knee ? "%s: %s must be a width, a number >= 0"
                                 : "%s: %s must be a positive number (per second)", what, key);
      return -EINVAL;
    }
    *(double *)((char *)&r + k_fields[i].off) = x;
  }
  *out = r;
  return 0;
}

int zt_plan_rates_load(const char *path, zt_plan_rates *out, char *err, size_t errlen) {
  json_error_t je;
  FILE *f = fopen(path, "re");
  err[0] = 0;
  if (!f) {
    int rc = -errno;
    if (rc != -ENOENT) snprintf(err, errlen, "%s: %s", path, strerror(-rc));
    return rc;
  }
  json_t *j = json_loadf(f, JSON_REJECT_DUPLICATES, &je);
  fclose(f);
  /* the parser's position, never the file's bytes */
  if (!j) {
    snprintf(err, errlen, "%s: not JSON (line %d, column %d)", path, je.line, je.column);
    return -EINVAL;
  }
  int rc = zt_plan_rates_from_json(j, path, "file", out, err, errlen);
  json_decref(j);
  return rc;
}

json_t *zt_plan_rates_to_json(const zt_plan_rates *r, const char *measured, const char *backend) {
  json_t *j = json_object();
  int bad = !j || json_object_set_new(j, "name", json_string(r->name));
  if (!bad && measured) bad = json_object_set_new(j, "measured", json_string(measured));
  if (!bad && backend) bad = json_object_set_new(j, "backend", json_string(backend));
  for (size_t i = 0; !bad && i < N_FIELDS; i++)
    bad = json_object_set_new(j, k_fields[i].key,
                              json_real(*(const double *)((const char *)r + k_fields[i].off)));
  if (bad) {
    json_decref(j);
    return NULL;
  }
  return j;
}

int zt_plan_rates_save(const char *dir, const zt_plan_rates *r, const char *measured,
                       const char *backend, char *err, size_t errlen) {
  json_t *j = zt_plan_rates_to_json(r, measured, backend);
  if (!j) {
    snprintf(err, errlen, "%s/%s: out of memory", dir, ZT_PLAN_RATES_FILE);
    return -ENOMEM;
  }
  int rc = zt_json_write_file(dir, ZT_PLAN_RATES_FILE, j, err, errlen);
  json_decref(j);
  return rc;
}
