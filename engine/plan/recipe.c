/* The recipe's defaults and checks (recipe.h); every message names the field. */
#include "engine/plan/recipe.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

void zt_train_cfg_defaults(zt_train_cfg *c) {
  memset(c, 0, sizeof *c);
  c->steps = 1;
  c->micro_batch = 1;
  c->grad_accum = 1;
  c->lr = 1e-3f;
  c->beta1 = 0.9f;
  c->beta2 = 0.999f;
  c->eps = 1e-8f;
  c->weight_decay = 0.01f;
  c->schedule = ZT_SCHED_CONSTANT;
  c->warmup_steps = 0;
  c->min_lr = 0.0f;
  c->grad_clip = 0.0f;
  c->seed = 0;
  c->precision = ZT_F32;
  c->tf32 = 0;
}

static int range_i(char *err, size_t errlen, const char *f, int v, int lo, int hi) {
  if (v >= lo && v <= hi) return 0;
  snprintf(err, errlen, "train.%s must be in [%d, %d] (got %d)", f, lo, hi, v);
  return -EINVAL;
}

static int range_f(char *err, size_t errlen, const char *f, float v, double lo, int lo_open,
                   double hi, int hi_open) {
  if (isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi)) return 0;
  snprintf(err, errlen, "train.%s must be in %c%g, %g%c (got %g)", f, lo_open ? '(' : '[', lo,
           hi, hi_open ? ')' : ']', (double)v);
  return -EINVAL;
}

int zt_train_cfg_check_strategy(const zt_train_cfg *c, const char *strategy, char *err,
                                size_t errlen) {
  if (c->state_dtype == ZT_F32) return 0;
  snprintf(err, errlen, "train.optimizer.state_dtype \"%s\" is not supported with %s yet "
           "(only on one rank, with or without offload)", zt_dtype_name(c->state_dtype),
           strategy);
  return -ENOTSUP;
}

/* The fields by their paths in the job spec (docs/spec.md), the bounds of recipe.h. */
int zt_train_cfg_check(const zt_train_cfg *c, char *err, size_t errlen) {
  int rc;
  if ((rc = range_i(err, errlen, "steps", c->steps, 1, ZT_TRAIN_MAX_STEPS)) < 0 ||
      (rc = range_i(err, errlen, "micro_batch", c->micro_batch, c->batch_tokens ? 0 : 1,
                    ZT_TRAIN_MAX_BATCH)) < 0 ||
      (rc = range_i(err, errlen, "grad_accum", c->grad_accum, c->batch_tokens ? 0 : 1,
                    ZT_TRAIN_MAX_BATCH)) < 0 ||
      (rc = range_f(err, errlen, "optimizer.lr", c->lr, 0, 1, ZT_TRAIN_MAX_LR, 0)) < 0 ||
      (rc = range_f(err, errlen, "optimizer.betas[0]", c->beta1, 0, 0, 1, 1)) < 0 ||
      (rc = range_f(err, errlen, "optimizer.betas[1]", c->beta2, 0, 0, 1, 1)) < 0 ||
      (rc = range_f(err, errlen, "optimizer.eps", c->eps, 0, 1, 1, 0)) < 0 ||
      (rc = range_f(err, errlen, "optimizer.weight_decay", c->weight_decay, 0, 0, 1, 0)) < 0 ||
      (rc = range_i(err, errlen, "schedule.warmup_steps", c->warmup_steps, 0, c->steps)) < 0 ||
      (rc = range_f(err, errlen, "schedule.min_lr", c->min_lr, 0, 0, c->lr, 0)) < 0 ||
      (rc = range_f(err, errlen, "grad_clip", c->grad_clip, 0, 0, ZT_TRAIN_MAX_GRAD_CLIP, 0)) < 0 ||
      (rc = range_i(err, errlen, "activation_checkpointing.every", c->ckpt_every, ZT_CKPT_AUTO,
                    ZT_TRAIN_MAX_CKPT_EVERY)) < 0)
    return rc;
  if (c->precision != ZT_F32 && c->precision != ZT_BF16 && c->precision != ZT_F16) {
    snprintf(err, errlen, "train.precision must be fp32, bf16 or fp16");
    return -EINVAL;
  }
  if (c->state_dtype != ZT_F32 && c->state_dtype != ZT_BF16) {
    snprintf(err, errlen, "train.optimizer.state_dtype must be fp32 or bf16");
    return -EINVAL;
  }
  if (c->tf32 != 0 && c->tf32 != 1) {
    snprintf(err, errlen, "train.tf32 must be true or false");
    return -EINVAL;
  }
  if (c->schedule != ZT_SCHED_CONSTANT && c->schedule != ZT_SCHED_COSINE) {
    snprintf(err, errlen, "train.schedule.name must be constant or cosine");
    return -EINVAL;
  }
  return 0;
}

void zt_offload_cfg_defaults(zt_offload_cfg *c) {
  memset(c, 0, sizeof *c);
  c->params = ZT_PLACE_AUTO;
  c->grads = ZT_PLACE_AUTO;
  c->optimizer = ZT_PLACE_AUTO;
  c->prefetch = 1;
  c->gpu_units = -1;
  c->host_units = -1;
}

static const char *const place_names[] = {"auto", "gpu", "host", "nvme"};

const char *zt_offload_place_name(zt_offload_place p) {
  return p >= ZT_PLACE_AUTO && p <= ZT_PLACE_NVME ? place_names[p] : "?";
}

int zt_offload_place_parse(const char *s, zt_offload_place *out) {
  for (int i = 0; i <= ZT_PLACE_NVME; i++)
    if (!strcmp(s, place_names[i])) {
      *out = (zt_offload_place)i;
      return 0;
    }
  return -EINVAL;
}

int zt_offload_cfg_check(const zt_offload_cfg *c, char *err, size_t errlen) {
  const struct {
    const char *field;
    zt_offload_place v;
  } kinds[] = {{"params", c->params}, {"grads", c->grads}, {"optimizer", c->optimizer}};
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
    if (kinds[i].v < ZT_PLACE_AUTO || kinds[i].v > ZT_PLACE_NVME) {
      snprintf(err, errlen, "offload.%s must be gpu, host, nvme or auto", kinds[i].field);
      return -EINVAL;
    }
  if (c->grads == ZT_PLACE_NVME) {
    snprintf(err, errlen, "offload.grads: nvme is not supported (the step's gradients sum on "
             "the device or the host)");
    return -ENOTSUP;
  }
  if (c->params == ZT_PLACE_NVME && c->optimizer != ZT_PLACE_NVME) {
    snprintf(err, errlen, "offload.params: nvme needs offload.optimizer nvme (with fp32 "
             "compute the parameters are the masters, read from their files)");
    return -ENOTSUP;
  }
  if ((c->params == ZT_PLACE_NVME || c->optimizer == ZT_PLACE_NVME) && !c->nvme_dir[0]) {
    snprintf(err, errlen, "offload.nvme_dir is required with an nvme placement");
    return -EINVAL;
  }
  if (c->optimizer == ZT_PLACE_GPU) {
    snprintf(err, errlen, "offload.optimizer: gpu keeps the optimizer on the device, which is "
             "the run without offload; leave the offload object out for it");
    return -ENOTSUP;
  }
  if (c->gpu_units < -1) {
    snprintf(err, errlen, "offload.gpu_units must be >= 0 (got %d)", c->gpu_units);
    return -EINVAL;
  }
  if (c->host_units < -1) {
    snprintf(err, errlen, "offload.host_units must be >= 0 (got %d)", c->host_units);
    return -EINVAL;
  }
  if (c->host_units >= 0 && c->optimizer == ZT_PLACE_HOST) {
    snprintf(err, errlen, "offload.host_units splits the optimizer between the host and NVMe: "
             "it needs offload.optimizer nvme or auto (with host every streamed unit's is on "
             "the host)");
    return -EINVAL;
  }
  if (c->delayed_update != 0 && c->delayed_update != 1) {
    snprintf(err, errlen, "offload.delayed_update must be true or false");
    return -EINVAL;
  }
  if (c->delayed_update && c->params == ZT_PLACE_NVME) {
    snprintf(err, errlen, "offload.delayed_update: params nvme streams the units from their "
             "master files, which the delayed update rewrites while the next step reads them; "
             "use params host");
    return -ENOTSUP;
  }
  if (c->prefetch < 0 || c->prefetch > ZT_OFFLOAD_PREFETCH_MAX) {
    snprintf(err, errlen, "offload.prefetch must be in [0, %d] (got %d)", ZT_OFFLOAD_PREFETCH_MAX,
             c->prefetch);
    return -EINVAL;
  }
  if (c->grad_slots && (c->grad_slots < ZT_OFFLOAD_GRAD_RING_MIN || c->grad_slots > ZT_OFFLOAD_GRAD_RING_MAX)) {
    snprintf(err, errlen, "offload.grad_slots must be 0 (the planner's) or in [%d, %d] (got %d): "
             "the backward takes a unit's gradients up %d units behind it", ZT_OFFLOAD_GRAD_RING_MIN,
             ZT_OFFLOAD_GRAD_RING_MAX, c->grad_slots, ZT_OFFLOAD_UNIT_DONE_LAG);
    return -EINVAL;
  }
  return 0;
}
