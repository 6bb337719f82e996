/* Offload for a job of several ranks (engine/train/dp/dp.h "Offload"): the spec's "offload" object
 * resolved into each rank's placement at admission, so that the stored spec says what runs and a
 * restart runs the same. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "engine/base/sizes.h"
#include "engine/job/spec.h"
#include "engine/model/model.h"

zt_dp_cfg zt__job_dp_cfg(const zt_job_spec *s, int rank0, int local) {
  zt_dp_cfg d = {.world = zt__job_world(s), .zero_stage = s->zero_stage, .rank0 = rank0,
                 .local = local};
  if (s->has_offload) {
    d.optimizer = s->offload.optimizer;
    d.params = s->offload.params;
    d.gpu_units = s->offload.gpu_units < 0 ? 0 : s->offload.gpu_units;
    /* with optimizer nvme the units after the device ones keeping theirs on the host (resolved
     * at admission: an optimizer other than nvme has none) */
    if (d.optimizer == ZT_PLACE_NVME && s->offload.host_units > 0)
      d.host_units = s->offload.host_units;
    d.nvme_dir = s->offload.nvme_dir;
  }
  return d;
}

/* A rank's device bytes with this placement and activation checkpointing. */
static size_t rank_bytes(const zt_job_spec *s, const zt_ops *ops, zt_offload_place opt,
                         zt_offload_place params, int gpu_units, int ckpt_every) {
  zt_train_cfg tc = s->train;
  tc.ckpt_every = ckpt_every;
  zt_dp_cfg d = {.world = zt__job_world(s), .zero_stage = s->zero_stage, .optimizer = opt,
                 .params = params, .gpu_units = gpu_units, .nvme_dir = s->offload.nvme_dir};
  return zt_dp_estimate_rank_bytes(&s->model, &tc, &d, ops);
}

/* Where the units the device does not keep have their optimizer: nvme where the spec says so
 * (a rank's device bytes are those of host), else host. */
static zt_offload_place off_place(const zt_job_spec *s) {
  return s->offload.optimizer == ZT_PLACE_NVME ? ZT_PLACE_NVME : ZT_PLACE_HOST;
}

/* The most leading units whose optimizer fits the budget on the device with the rest on the
 * host or NVMe (a rank's bytes grow with them), or -1 when not even none does. */
static int most_gpu_units(const zt_job_spec *s, const zt_ops *ops, zt_offload_place params,
                          int units, int ckpt_every, size_t budget) {
  zt_offload_place opt = off_place(s);
  if (rank_bytes(s, ops, opt, params, 0, ckpt_every) > budget) return -1;
  int lo = 0, hi = units; /* lo fits; find the largest that does */
  while (lo < hi) {
    int mid = lo + (hi - lo + 1) / 2;
    if (rank_bytes(s, ops, opt, params, mid, ckpt_every) <= budget)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

/* The fastest placement that fits the budget with this checkpointing: everything on the device
 * (*on_gpu set: no offload), else as many units' optimizer on the device as fit, else (stage 3)
 * the host units' parameters on the host too; params nvme (the spec's alone) stays nvme. 0 with
 * the choice in *o, or -ENOMEM. (The spec's parser refuses optimizer "gpu": that is the job
 * without an offload object.) */
static int fit(const zt_job_spec *s, const zt_ops *ops, int units, int ckpt_every,
               zt_offload_cfg *o, int *on_gpu) {
  const zt_offload_cfg *want = &s->offload;
  size_t budget = want->gpu_budget;
  *on_gpu = want->optimizer == ZT_PLACE_AUTO && want->gpu_units < 0 &&
            (want->params == ZT_PLACE_AUTO || want->params == ZT_PLACE_GPU) &&
            rank_bytes(s, ops, ZT_PLACE_GPU, ZT_PLACE_GPU, 0, ckpt_every) <= budget;
  if (*on_gpu) return 0;
  /* the parameters' homes to try, fastest first */
  zt_offload_place homes[2];
  int nh = 0;
  if (want->params == ZT_PLACE_NVME) homes[nh++] = ZT_PLACE_NVME;
  if (want->params == ZT_PLACE_AUTO || want->params == ZT_PLACE_GPU) homes[nh++] = ZT_PLACE_GPU;
  if ((want->params == ZT_PLACE_AUTO || want->params == ZT_PLACE_HOST) && s->zero_stage == 3)
    homes[nh++] = ZT_PLACE_HOST;
  for (int i = 0; i < nh; i++) {
    zt_offload_place params = homes[i];
    int ng = want->gpu_units;
    if (ng >= 0 ? rank_bytes(s, ops, off_place(s), params, ng, ckpt_every) > budget
                : (ng = most_gpu_units(s, ops, params, units, ckpt_every, budget)) < 0)
      continue;
    o->optimizer = off_place(s);
    o->params = params;
    o->gpu_units = ng;
    return 0;
  }
  return -ENOMEM;
}

/* gpu_units, params and checkpointing: what the budget (if any) holds, fastest first. */
static int resolve_placement(zt_job_spec *s, const zt_ops *ops, int units, int L, char *err,
                             size_t errlen) {
  zt_offload_cfg *o = &s->offload;
  char ranks[96];
  zt__job_ranks_text(s, ranks, sizeof ranks);
  int auto_ckpt = s->train.ckpt_every == ZT_CKPT_AUTO;
  if (!o->gpu_budget) {
    /* no budget: auto means host for the optimizer (as with one rank; nvme stays nvme), gpu
     * for the rest */
    o->optimizer = off_place(s);
    if (o->params == ZT_PLACE_AUTO) o->params = ZT_PLACE_GPU;
    if (o->gpu_units < 0) o->gpu_units = 0;
    return 0; /* "auto" checkpointing: the least recompute that fits the device (jobs.c) */
  }
  /* the least recompute first (every L blocks recomputes 1, ... every 1 all L), and for each
   * the fastest placement */
  for (int i = 0; i <= (auto_ckpt ? L : 0); i++) {
    int every = !auto_ckpt ? s->train.ckpt_every : i == 0 ? 0 : L + 1 - i;
    zt_offload_cfg got = *o;
    int on_gpu;
    if (fit(s, ops, units, every, &got, &on_gpu) == 0) {
      /* everything fits on the device: the job runs without offload, and its stored spec
       * says so */
      if (on_gpu) s->has_offload = 0;
      *o = got;
      s->train.ckpt_every = every;
      return 0;
    }
  }
  /* the least a rank can take with what the spec allows, for the message (params nvme takes as
   * little of the device as host) */
  zt_offload_place params = o->params == ZT_PLACE_NVME ? ZT_PLACE_NVME
                            : s->zero_stage == 3 && o->params != ZT_PLACE_GPU ? ZT_PLACE_HOST
                                                                             : ZT_PLACE_GPU;
  int every = auto_ckpt ? 1 : s->train.ckpt_every;
  size_t least = rank_bytes(s, ops, off_place(s), params, o->gpu_units > 0 ? o->gpu_units : 0,
                            every);
  char a[32], b[32];
  zt_size_format(a, sizeof a, (double)least);
  zt_size_format(b, sizeof b, (double)o->gpu_budget);
  snprintf(err, errlen, "offload.gpu_budget %s per GPU is too small for %s: with the optimizer "
           "of %d unit(s) on the GPU and the rest's on the %s, the parameters %s%s a rank "
           "needs %s", b, ranks, o->gpu_units > 0 ? o->gpu_units : 0,
           o->optimizer == ZT_PLACE_NVME ? "NVMe" : "host",
           params == ZT_PLACE_NVME   ? "in NVMe files"
           : params == ZT_PLACE_HOST ? "on the host"
                                     : "on the GPU",
           every == 1 ? " and every block recomputed" : "", a);
  return -ENOMEM;
}

int zt__job_resolve_dp_offload(zt_job_spec *s, const zt_ops *ops, char *err, size_t errlen) {
  zt_offload_cfg *o = &s->offload;
  int W = zt__job_world(s);
  if (!s->has_offload || W == 1) return 0;
  char ranks[96];
  zt__job_ranks_text(s, ranks, sizeof ranks);
  if (o->delayed_update) {
    snprintf(err, errlen, "offload.delayed_update with %s is not supported (only the offloaded "
             "step of one rank delays its update)", ranks);
    return -ENOTSUP;
  }
  if (o->grads == ZT_PLACE_GPU) {
    snprintf(err, errlen, "offload.grads gpu with %s is not supported (the ranks reduce their "
             "gradients where their placement puts them, engine/train/dp/dp.h); use auto", ranks);
    return -ENOTSUP;
  }
  /* each rank reads its chunks of the parameters from its master files (engine/train/dp/dp.h):
   * stage 3's chunks, optimizer nvme's files */
  if (o->params == ZT_PLACE_NVME &&
      (s->zero_stage != 3 || o->optimizer != ZT_PLACE_NVME)) {
    snprintf(err, errlen, "offload.params: nvme with %s needs parallel.zero_stage 3 and "
             "offload.optimizer nvme (each rank reads its chunks of the parameters from its "
             "optimizer's master files) (got zero_stage %d, optimizer %s)", ranks,
             s->zero_stage, zt_offload_place_name(o->optimizer));
    return -EINVAL;
  }
  if (o->params == ZT_PLACE_HOST && s->zero_stage != 3) {
    snprintf(err, errlen, "offload.params: host with %s needs parallel.zero_stage 3 (stages 1-2 "
             "keep every unit's parameters on every GPU)", ranks);
    return -EINVAL;
  }
  zt_model *m;
  int rc = zt_model_create(&m, &s->model, err, errlen);
  if (rc < 0) return rc;
  int units = zt_model_num_units(m), L = s->model.n_layers;
  zt_model_destroy(m);
  if (o->gpu_units > units) {
    snprintf(err, errlen, "offload.gpu_units must be in [0, %d] (the model's units) (got %d)",
             units, o->gpu_units);
    return -EINVAL;
  }
  /* the host / NVMe split of the units the device does not keep is nvme's (a rank's device
   * bytes do not depend on it, so gpu_units is resolved as without it, then checked) */
  if (o->host_units >= 0 && o->optimizer != ZT_PLACE_NVME) {
    snprintf(err, errlen, "offload.host_units with %s needs offload.optimizer nvme (the units "
             "after the host ones keep their optimizer on NVMe) (got optimizer %s)", ranks,
             zt_offload_place_name(o->optimizer));
    return -ENOTSUP;
  }
  if ((rc = resolve_placement(s, ops, units, L, err, errlen)) < 0) return rc;
  if (s->has_offload && o->host_units > units - o->gpu_units) {
    snprintf(err, errlen, "offload.host_units is %d; after %d unit(s) on the device the model "
             "has %d", o->host_units, o->gpu_units, units - o->gpu_units);
    return -EINVAL;
  }
  return 0;
}
