/* The data-parallel trainer's state between steps with every rank here (engine/train/dp/dp.h):
 * each rank's chunks copied between its buffers and the flat layout, and moved to and from its
 * file of a per-rank checkpoint, on its own thread. A part's state calls build on these
 * (parts.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/train/dp/internal.h"
#include "engine/train/trainer_internal.h"
#include "offload/shard.h"

/* ---- the flat layout <-> the rank's buffers ----------------------------------------------- */

/* Whether the host tier's masters (and compute copy) hold host unit u's parameters. */
static int hm_holds(const dp_state *s, int u) {
  return u < s->plan.nv0 || (s->plan.params_host && !s->plan.params_nvme);
}

/* Where a state call finds host unit u's chunk of masters, m and v: the host tier, or for an
 * NVMe unit the store's set 0, read from the unit's files when `fetch` (zt_opt_store_sync, in
 * full). A negative errno from the store (zt__dp_nv_why). */
int zt__dp_tier_get(dp_rank_state *k, int u, int fetch, float *x[3]) {
  const dp_state *s = k->s;
  if (!zt__dp_on_nvme(s, u)) {
    size_t at = zt__dp_host_at(s, zt_shard_at(s->plan.tab, u, k->r));
    x[0] = k->hm + at;
    x[1] = k->hmom + at;
    x[2] = k->hvar + at;
    return 0;
  }
  for (int i = 0; i < ZT_OPT_KINDS; i++) x[i] = k->sets[0].buf[i];
  return fetch ? zt_opt_store_sync(k->opt, u, 0) : 0;
}

/* A state call wrote host unit u's whole chunk (its padding zero) into zt__dp_tier_get's x: an
 * NVMe unit's goes to its files, and with params host to the host's parameters; the host's
 * compute copy follows the masters where the host keeps them. */
int zt__dp_tier_put(dp_rank_state *k, int u, float *x[3]) {
  const dp_state *s = k->s;
  size_t at = zt__dp_host_at(s, zt_shard_at(s->plan.tab, u, k->r)), c = s->plan.tab->chunk[u];
  int nv = zt__dp_on_nvme(s, u);
  if (nv) {
    int rc = zt_opt_store_sync(k->opt, u, 1);
    if (rc < 0) return rc;
    if (hm_holds(s, u)) memcpy(k->hm + at, x[0], c * sizeof(float));
  }
  if (k->hlp && hm_holds(s, u))
    k->hbe.ops->cast(k->hbe.ctx, k->hlp + at, k->view.tc.precision, x[0], ZT_F32, c);
  return 0;
}

/* Each rank copies out its own chunks of units [u0, u1): the ranks' chunks cover the flat
 * layout once (so only with every rank here). */
static int rank_read(dp_rank_state *k) {
  const dp_state *s = k->s;
  const zt_backend *be = &k->view.be;
  const float *src[3] = {k->params, k->m, k->v};
  size_t base = zt_model_unit(k->view.model, s->u0)->offset;
  for (int u = s->u0; u < s->u1; u++) {
    const zt_shard *sh = zt_shard_at(s->plan.tab, u, k->r);
    size_t at[3] = {zt__dp_param_at(k, sh), sh->packed_off, sh->packed_off};
    float *hx[3];
    int rc;
    if (zt__dp_on_host(s, u) && sh->count && (s->out[0] || s->out[1] || s->out[2]) &&
        (rc = zt__dp_tier_get(k, u, 1, hx)) < 0)
      return zt__dp_nv_fail(k, rc);
    for (int i = 0; i < 3; i++) {
      if (!s->out[i] || !sh->count) continue;
      float *dst = s->out[i] + (sh->flat_off - base);
      if (zt__dp_on_host(s, u))
        memcpy(dst, hx[i], sh->count * sizeof(float));
      else
        be->ops->to_host(be->ctx, dst, src[i] + at[i], sh->count * sizeof(float));
    }
  }
  int rc = be->ops->sync(be->ctx);
  return rc < 0 ? zt__dp_backend_fail(k, rc) : 0;
}

/* Units [u0, u1): stages 1-2 take every unit's parameters (the padding stays zero), stage 3
 * its chunks; the compute copies follow, unit by unit. Needs only the rank's own share of the
 * flat layout, so a part writes its ranks alone. */
static int rank_write(dp_rank_state *k) {
  const dp_state *s = k->s;
  const zt_backend *be = &k->view.be;
  const zt_model *m = k->view.model;
  int stage = s->dc.zero_stage;
  size_t base = zt_model_unit(m, s->u0)->offset;
  for (int u = s->u0; u < s->u1; u++) {
    const zt_shard *sh = zt_shard_at(s->plan.tab, u, k->r);
    size_t c = s->plan.tab->chunk[u];
    /* the device's parameters of the unit: stages 1-2 the unit padded, 3 the rank's chunk
     * (none for a host unit with params host) */
    size_t at = stage < 3 ? s->plan.tab->padded_unit[u] : sh->packed_off;
    size_t pn = stage < 3 ? c * (size_t)s->dc.world : c;
    int on_dev = stage < 3 || !zt__dp_on_host(s, u) || !s->plan.params_host;
    if (stage < 3) {
      const zt_unit_info *ui = zt_model_unit(m, u);
      be->ops->to_device(be->ctx, k->params + at, s->in[0] + (ui->offset - base),
                         ui->numel * sizeof(float));
    } else if (sh->count && on_dev) {
      be->ops->to_device(be->ctx, k->params + at, s->in[0] + (sh->flat_off - base),
                         sh->count * sizeof(float));
    }
    if (k->params_lp && on_dev)
      be->ops->cast(be->ctx, (char *)k->params_lp + at * zt_dtype_size(k->view.tc.precision),
                    k->view.tc.precision, k->params + at, ZT_F32, pn);
    /* in[1] and in[2] NULL: the moments stay the zeros they were allocated as (the open);
     * an NVMe unit's files get its whole chunk, zeros where nothing is given */
    if (zt__dp_on_host(s, u)) {
      float *x[3];
      int rc;
      zt__dp_tier_get(k, u, 0, x);
      for (int i = 0; i < 3; i++) {
        if (s->in[i] && sh->count)
          memcpy(x[i], s->in[i] + (sh->flat_off - base), sh->count * sizeof(float));
        else if (zt__dp_on_nvme(s, u))
          memset(x[i], 0, sh->count * sizeof(float));
        if (zt__dp_on_nvme(s, u)) memset(x[i] + sh->count, 0, (c - sh->count) * sizeof(float));
      }
      if ((rc = zt__dp_tier_put(k, u, x)) < 0) return zt__dp_nv_fail(k, rc);
    } else if (sh->count && s->in[1]) {
      be->ops->to_device(be->ctx, k->m + sh->packed_off, s->in[1] + (sh->flat_off - base),
                         sh->count * sizeof(float));
      be->ops->to_device(be->ctx, k->v + sh->packed_off, s->in[2] + (sh->flat_off - base),
                         sh->count * sizeof(float));
    }
  }
  int rc = be->ops->sync(be->ctx);
  return rc < 0 ? zt__dp_backend_fail(k, rc) : 0;
}

const zt__dp_cmd zt__dp_cmd_read = {.run = rank_read, .after_queue = 1};
const zt__dp_cmd zt__dp_cmd_write = {.run = rank_write, .after_queue = 1};

/* ---- a per-rank checkpoint: each rank's own chunks (all ranks here) ------------------------ */

/* The start of shards_out / _in: a staging of one chunk of each tensor (for the device
 * units) and the rank's file begun. */
static int shards_begin(dp_rank_state *k, float **buf, char *why, size_t len) {
  const dp_state *s = k->s;
  size_t bytes = 3 * s->plan.tab->max_chunk * sizeof(float);
  *buf = s->plan.ng ? malloc(bytes) : NULL;
  if (s->plan.ng && !*buf) {
    snprintf(why, len, "out of host memory for a staging of %zu bytes", bytes);
    return -ENOMEM;
  }
  return s->io->begin(s->io->arg, k->r, why, len);
}

/* ... and its end: the file finished, or closed unfinished after a failure (rc < 0, whose
 * message why holds). */
static int shards_end(dp_rank_state *k, int rc, float *buf, char *why, size_t len) {
  const zt__shard_io *io = k->s->io;
  char ewhy[400] = "";
  free(buf);
  int erc = io->end(io->arg, k->r, rc == 0, ewhy, sizeof ewhy);
  if (rc == 0 && erc < 0) {
    rc = erc;
    snprintf(why, len, "%s", ewhy);
  }
  return rc < 0 ? zt__dp_rank_fail(k, rc, "%s", why) : 0;
}

static int shards_backend_fail(dp_rank_state *k, int rc, char *why, size_t len) {
  const zt_backend *be = &k->view.be;
  snprintf(why, len, "backend %s: %s", be->ops->name, be->ops->error_text(be->ctx));
  return rc;
}

/* shards_out: the rank's chunks, unit by unit, to its file: a host unit's straight from the
 * host tier, a device unit's through the staging (the rank's stream, on its thread, so a cuda
 * rank reads its own device). */
int zt__dp_rank_shards_out(dp_rank_state *k) {
  const dp_state *s = k->s;
  const zt_backend *be = &k->view.be;
  size_t mc = s->plan.tab->max_chunk;
  float *buf;
  char why[400] = "";
  int rc = shards_begin(k, &buf, why, sizeof why);
  for (int u = 0; u < s->plan.nu && rc == 0; u++) {
    const zt_shard *sh = zt_shard_at(s->plan.tab, u, k->r);
    if (!sh->count) continue;
    const float *x[3];
    if (zt__dp_on_host(s, u)) {
      float *hx[3];
      if ((rc = zt__dp_tier_get(k, u, 1, hx)) < 0) {
        zt__dp_nv_why(k, rc, why, sizeof why);
        break;
      }
      for (int i = 0; i < 3; i++) x[i] = hx[i];
    } else {
      const float *src[3] = {k->params + zt__dp_param_at(k, sh), k->m + sh->packed_off,
                             k->v + sh->packed_off};
      for (int i = 0; i < 3; i++) {
        be->ops->to_host(be->ctx, buf + i * mc, src[i], sh->count * sizeof(float));
        x[i] = buf + i * mc;
      }
      if ((rc = be->ops->sync(be->ctx)) < 0) {
        rc = shards_backend_fail(k, rc, why, sizeof why);
        break;
      }
    }
    rc = s->io->put(s->io->arg, k->r, u, x[0], x[1], x[2], why, sizeof why);
  }
  return shards_end(k, rc, buf, why, sizeof why);
}

/* shards_in: the rank's chunks from its file, unit by unit, where it keeps them (as
 * rank_write puts them: a host unit's into the host tier, and its parameters onto the
 * device too unless params host; the compute copies follow). Stages 1-2 hold the other ranks'
 * chunks of the parameters as well: shards_gather brings them once every rank has read its
 * own. */
int zt__dp_rank_shards_in(dp_rank_state *k) {
  const dp_state *s = k->s;
  const zt_backend *be = &k->view.be;
  zt_dtype dt = k->view.tc.precision;
  size_t mc = s->plan.tab->max_chunk;
  float *buf;
  char why[400] = "";
  int rc = shards_begin(k, &buf, why, sizeof why);
  for (int u = 0; u < s->plan.nu && rc == 0; u++) {
    const zt_shard *sh = zt_shard_at(s->plan.tab, u, k->r);
    if (!sh->count) continue;
    size_t c = s->plan.tab->chunk[u], at = zt__dp_param_at(k, sh);
    int host = zt__dp_on_host(s, u), dev_params = !host || !s->plan.params_host;
    float *x[3];
    if (host)
      zt__dp_tier_get(k, u, 0, x);
    else
      for (int i = 0; i < 3; i++) x[i] = buf + i * mc;
    if ((rc = s->io->get(s->io->arg, k->r, u, x[0], x[1], x[2], why, sizeof why)) < 0) break;
    for (int i = 0; host && zt__dp_on_nvme(s, u) && i < 3; i++)
      memset(x[i] + sh->count, 0, (c - sh->count) * sizeof(float));
    if (dev_params)
      be->ops->to_device(be->ctx, k->params + at, x[0], sh->count * sizeof(float));
    if (!host) {
      be->ops->to_device(be->ctx, k->m + sh->packed_off, x[1], sh->count * sizeof(float));
      be->ops->to_device(be->ctx, k->v + sh->packed_off, x[2], sh->count * sizeof(float));
    }
    /* the whole chunk: its padding is zero in both copies */
    if (k->params_lp && dev_params)
      be->ops->cast(be->ctx, zt__dp_lp_of(k, k->params_lp, at), dt, k->params + at, ZT_F32, c);
    if (host && (rc = zt__dp_tier_put(k, u, x)) < 0) {
      zt__dp_nv_why(k, rc, why, sizeof why);
      break;
    }
    /* the staging (or set) is read again for the next unit */
    if ((rc = be->ops->sync(be->ctx)) < 0) rc = shards_backend_fail(k, rc, why, sizeof why);
  }
  return shards_end(k, rc, buf, why, sizeof why);
}

/* shards_gather (stages 1-2): every unit's parameters and compute copy, from every rank's
 * chunk, as after an update. */
int zt__dp_rank_shards_gather(dp_rank_state *k) {
  const zt_backend *be = &k->view.be;
  int rc = 0;
  for (int u = 0; u < k->s->plan.nu && rc == 0; u++) rc = zt__dp_gather_updated(k, u);
  if (rc < 0) return rc;
  return (rc = be->ops->sync(be->ctx)) < 0 ? zt__dp_backend_fail(k, rc) : 0;
}

/* The command: a collective, so as in a step a rank that fails releases the others. */
static int rank_shards_gather(dp_rank_state *k) {
  int rc = zt__dp_rank_shards_gather(k);
  if (rc < 0) k->comm.ops->abort(k->comm.ctx);
  return rc;
}

const zt__dp_cmd zt__dp_cmd_shards_out = {.run = zt__dp_rank_shards_out, .after_queue = 1};
const zt__dp_cmd zt__dp_cmd_shards_in = {.run = zt__dp_rank_shards_in, .after_queue = 1};
const zt__dp_cmd zt__dp_cmd_shards_gather = {.run = rank_shards_gather, .after_queue = 1};
