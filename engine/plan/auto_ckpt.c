/* Auto activation checkpointing without the offload planner (engine/plan/auto_ckpt.h). */
#include "engine/plan/auto_ckpt.h"

#include <errno.h>

int zt_plan_auto_ckpt(int n_layers, zt_plan_ckpt_fits fits, void *ctx, char *err,
                      size_t errlen) {
  int rc = -ENOMEM;
  for (int i = 0; i <= n_layers; i++) {
    int every = i == 0 ? 0 : n_layers + 1 - i;
    if ((rc = fits(ctx, every, err, errlen)) != -ENOMEM) return rc < 0 ? rc : every;
  }
  return rc;
}
