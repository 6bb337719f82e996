/* defines: ztd --calibrate's measurements, the rates of engine/plan/rates.h measured on this
 * machine each the way a training step uses it (docs/offload.md "Rates"). Called by
 * engine/main.c, which writes them to the state dir's rates.json. */
#ifndef ZT_TRAIN_CALIBRATE_H
#define ZT_TRAIN_CALIBRATE_H

#include <stddef.h>
#include <stdio.h>

#include "engine/plan/rates.h"

typedef struct zt_calibrate_cfg {
  const char *backend;  /* "cpu" | "cuda" */
  int device;           /* cuda: the GPU measured (ztd's first --gpus) */
  int cpu_threads;      /* cpu: the backend's threads, 0 all cores (ztd --cpu-threads) */
  const char *nvme_dir; /* an existing directory for the NVMe tier's file (--nvme-dir, else the
                           state dir) */
  int quick;            /* every measurement on a small fraction of its bytes (tests): the
                           figures are the same code's, less steady */
} zt_calibrate_cfg;

/* Measures every rate of zt_plan_rates, printing a line for each to out as it finishes (its
 * rates.json name, the value, how long it took, what was measured), into *rates (named
 * "calibrated"). 0, or -errno with err saying which measurement failed and why (a path it
 * names, the NVMe dir's when it is not writable or too full). Takes a few GB of host memory
 * (fewer where less is free), up to 1 GiB in the NVMe dir (removed after) and, on cuda, about
 * 3 GB of the GPU; run it on a machine without jobs. */
int zt_calibrate_run(const zt_calibrate_cfg *c, FILE *out, zt_plan_rates *rates, char *err,
                     size_t errlen);

#endif
