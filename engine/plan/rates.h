/* defines: the cost model's rates (zt_plan_rates): the machine's speeds the planner ranks plans
 * by (engine/plan/offload_plan.c, batch.c). The built-in default (engine/base/tunables.h's
 * figures), the named sets, and a JSON file of them (docs/offload.md "Rates"), which ztd reads
 * from its state dir at start (engine/main.c, before any thread) and makes the process's
 * rates; ztd --calibrate measures them and writes that file (engine/train/calibrate.h). */
#ifndef ZT_PLAN_RATES_H
#define ZT_PLAN_RATES_H

#include <jansson.h>
#include <stddef.h>

#define ZT_PLAN_RATES_NAME_MAX 64
/* the file's name in the state dir */
#define ZT_PLAN_RATES_FILE "rates.json"

typedef struct zt_plan_rates {
  char name[ZT_PLAN_RATES_NAME_MAX]; /* "default", "h200", or a file's "name" */
  double flops_lp;       /* device flops/s of a bf16/fp16 step (6 * N * tokens + attention) of a
                            model of width ZT_PLAN_FLOPS_WIDTH */
  double flops_f32;      /* the same in fp32 */
  double h2d_bytes;      /* pinned host to device copies, bytes/s */
  double d2h_bytes;      /* device to pinned host */
  double adamw_params;   /* the CPU AdamW pool's parameters/s beside the backward (its copies and
                            the runner's reads of the gradients share the host's memory) */
  double adamw_alone_params; /* and after it, the host otherwise quiet (clipping, fp16, NVMe,
                                the delayed update) */
  double sumsq_bytes;    /* the runner's read of host gradients for their norm, bytes/s */
  double nvme_read;      /* the NVMe tier's optimizer-state reads, bytes/s */
  double nvme_write;     /* and writes */
  double hbm_bytes;      /* device memory, bytes/s (the device units' AdamW) */
  /* how the flops rates fall with the model's width d (its matmuls' size): the rate at d is
   * theirs times e(d) / e(ZT_PLAN_FLOPS_WIDTH), e(d) = d / (d + flops_knee); 0: flat */
  double flops_knee;
} zt_plan_rates;

#define ZT_PLAN_FLOPS_WIDTH 2048

/* the device's flops/s for a step of dt compute at model width d_model (r's rate and knee) */
double zt_plan_rates_flops(const zt_plan_rates *r, int fp32, int d_model);

/* The rates plans use: the calling thread's own (zt_plan_rates_use_here), else the process's
 * (the built-in default until zt_plan_rates_use). */
const zt_plan_rates *zt_plan_rates_active(void);
/* Makes *r the process's rates (copied); call before any thread plans. */
void zt_plan_rates_use(const zt_plan_rates *r);
/* The calling thread plans by *r (kept by pointer: it must outlive the use) until called again;
 * NULL: by the process's again. For a plan made for another machine (a plan request's target,
 * engine/job/admission.c) on the worker thread that makes it, beside other plans. */
void zt_plan_rates_use_here(const zt_plan_rates *r);
/* A built-in set by name ("default", "h200"): 0, or -ENOENT naming the sets. */
int zt_plan_rates_named(const char *name, zt_plan_rates *out, char *err, size_t errlen);
/* A rates file: a JSON object of the fields above by their JSON names (docs/offload.md), each a
 * positive number, and the strings a calibration records ("measured": when, "backend": on
 * what; checked, not kept); those left out keep the default's. 0, -ENOENT (no such file: err empty), or
 * -errno / -EINVAL naming the file and the field. */
int zt_plan_rates_load(const char *path, zt_plan_rates *out, char *err, size_t errlen);
/* The same fields from a JSON object (a file's content, a plan target's "rates"): what names
 * it in messages ("PATH: flops_bf16 must be ..."), name its name when it gives none. 0 or
 * -EINVAL naming the field, never echoing a value. */
int zt_plan_rates_from_json(const json_t *j, const char *what, const char *name,
                            zt_plan_rates *out, char *err, size_t errlen);
/* The file's object of *r: name, every field, and measured and backend where not NULL (NULL
 * when out of memory). zt_plan_rates_from_json reads it back to the same rates. */
json_t *zt_plan_rates_to_json(const zt_plan_rates *r, const char *measured, const char *backend);
/* dir/rates.json replaced atomically by zt_plan_rates_to_json's object (ztd --calibrate): 0, or
 * -errno naming the file. */
int zt_plan_rates_save(const char *dir, const zt_plan_rates *r, const char *measured,
                       const char *backend, char *err, size_t errlen);

#endif
