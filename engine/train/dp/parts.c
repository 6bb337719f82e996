/* A data-parallel trainer that runs a part of the world's ranks (engine/train/dp/dp.h "Parts"):
 * the state calls as collectives between steps (gathers and scatters through the flat layout,
 * the probe of a per-rank checkpoint's directory, every part's ranks moving their own files),
 * the path's state entries, which go straight to the ranks when every rank is here (state.c),
 * the other parts' send / receive, and the step flags. A rank's side runs on its thread, the
 * trainer's on the caller's. */
#include "engine/train/dp/dp.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/log.h"
#include "engine/train/dp/internal.h"
#include "engine/train/trainer_internal.h"
#include "offload/shard.h"

/* The head of a part's state call, broadcast from global rank 0 in the exchange buffer (free
 * between steps, and at least X_MICRO + 2 doubles): what the call is, for a gather which of
 * params, m, v (bits 0, 1, 2) it reads (a probe: 1 for a save, 0 for a load), the units
 * [u0, u1) it moves (all of them for a probe and the ranks' files), and for a probe the length
 * of what follows it: the token and the directory, each ended by a NUL, broadcast through the
 * state calls' scratch (bcast_host). */
#define H_OP 0
#define H_MASK 1
#define H_U0 2
#define H_U1 3
#define H_LEN 4
#define H_BYTES (5 * sizeof(double))
/* The longest probe (the token, the directory and their NULs) */
#define PROBE_MAX (ZT_PATH_MAX + 256)

/* ---- a part's state: collectives between steps ------------------------------------------- */

/* A gather of units [u0, u1): per unit and tensor, the chunks all-gathered into the scratch
 * (stages 1-2 parameters: every rank's own copy is the unit already), of which rank 0 copies
 * the unit's real elements out (out holds the range). The scratch is the unit's gradient
 * buffer (zt__dp_unit_grads), dead between steps: the step zeroes stage 1's padded gradients at
 * its start and each unit's (and the embedding's) stage 2-3 buffer before the backward writes
 * it, so it never reads what a state call left there. */
static int state_gather(dp_rank_state *k, int mask, int u0, int u1) {
  const dp_state *s = k->s;
  const zt_backend *be = &k->view.be;
  const float *src[3] = {k->params, k->m, k->v};
  size_t base = zt_model_unit(k->view.model, u0)->offset;
  for (int u = u0; u < u1; u++) {
    const zt_unit_info *ui = zt_model_unit(k->view.model, u);
    const zt_shard *sh = zt_shard_at(s->plan.tab, u, k->r);
    size_t c = s->plan.tab->chunk[u];
    float *scratch = zt__dp_unit_grads(k, u), *hx[3];
    /* the host tier's chunks it reads (stages 1-2 take the parameters from the device) */
    int from_host = zt__dp_on_host(s, u) && (mask & (s->dc.zero_stage < 3 ? 6 : 7)), rc;
    if (from_host && (rc = zt__dp_tier_get(k, u, 1, hx)) < 0) return zt__dp_nv_fail(k, rc);
    for (int i = 0; i < 3; i++) {
      if (!(mask & 1 << i)) continue;
      const float *unit = scratch;
      if (i == 0 && s->dc.zero_stage < 3) {
        unit = k->params + s->plan.tab->padded_unit[u];
      } else {
        /* a host unit's chunk goes up first, ordered before the gather on the stream */
        const float *from = i == 0 ? src[0] + zt__dp_param_at(k, sh) : src[i] + sh->packed_off;
        if (zt__dp_on_host(s, u)) {
          be->ops->to_device(be->ctx, k->gout[0], hx[i], c * sizeof(float));
          from = k->gout[0];
        }
        rc = k->comm.ops->all_gather(k->comm.ctx, from, scratch, c * sizeof(float), k->stream);
        if (rc < 0) return zt__dp_comm_fail(k, rc, "gathering the state");
      }
      /* ordered before the next unit's collective overwrites the scratch (one stream) */
      if (k->r == 0 && ui->numel)
        be->ops->to_host(be->ctx, s->out[i] + (ui->offset - base), unit,
                         ui->numel * sizeof(float));
    }
    /* an NVMe unit: the set is read into again for the next unit */
    if (from_host && zt__dp_on_nvme(s, u) && (rc = be->ops->sync(be->ctx)) < 0)
      return zt__dp_backend_fail(k, rc);
  }
  int rc = be->ops->sync(be->ctx);
  return rc < 0 ? zt__dp_backend_fail(k, rc) : 0;
}

/* A scatter of units [u0, u1): per unit and tensor, rank 0 uploads the unit padded with zeros
 * to the padded size, broadcasts it, and every rank copies its chunk out (a same-type cast is
 * the backend's device copy); the unit's compute copies follow. Stages 1-2 parameters are
 * broadcast straight into every rank's copy of the unit. The scratch is state_gather's. */
static int state_scatter(dp_rank_state *k, int u0, int u1) {
  const dp_state *s = k->s;
  const zt_backend *be = &k->view.be;
  const zt_ops *o = be->ops;
  int stage = s->dc.zero_stage;
  size_t base = zt_model_unit(k->view.model, u0)->offset;
  for (int u = u0; u < u1; u++) {
    const zt_unit_info *ui = zt_model_unit(k->view.model, u);
    const zt_shard *sh = zt_shard_at(s->plan.tab, u, k->r);
    size_t c = s->plan.tab->chunk[u], padded = c * (size_t)s->dc.world;
    float *scratch = zt__dp_unit_grads(k, u);
    int host = zt__dp_on_host(s, u);
    /* where the rank keeps its chunk of each: the device, the host tier or both (a host unit's
     * parameters are on the device too unless params host) */
    float *dst[3] = {NULL, NULL, NULL}, *hdst[3] = {NULL, NULL, NULL};
    if (!host || (stage == 3 && !s->plan.params_host)) dst[0] = k->params + zt__dp_param_at(k, sh);
    if (!host) {
      dst[1] = k->m + sh->packed_off;
      dst[2] = k->v + sh->packed_off;
    } else {
      zt__dp_tier_get(k, u, 0, hdst);
    }
    for (int i = 0; i < 3; i++) {
      float *unit = i == 0 && stage < 3 ? k->params + s->plan.tab->padded_unit[u] : scratch;
      if (k->r == 0) {
        o->to_device(be->ctx, unit, s->in[i] + (ui->offset - base), ui->numel * sizeof(float));
        if (padded > ui->numel)
          o->zero(be->ctx, unit + ui->numel, (padded - ui->numel) * sizeof(float));
      }
      int rc = k->comm.ops->broadcast(k->comm.ctx, unit, unit, padded * sizeof(float), 0,
                                      k->stream);
      if (rc < 0) return zt__dp_comm_fail(k, rc, "scattering the state");
      if (unit == scratch && dst[i])
        o->cast(be->ctx, dst[i], ZT_F32, scratch + sh->unit_off, ZT_F32, c);
      /* synchronous: the next unit's broadcast rewrites the scratch */
      if (hdst[i]) o->to_host(be->ctx, hdst[i], unit + sh->unit_off, c * sizeof(float));
    }
    size_t at = stage < 3 ? s->plan.tab->padded_unit[u] : zt__dp_param_at(k, sh);
    if (k->params_lp && (stage < 3 || dst[0]))
      o->cast(be->ctx, (char *)k->params_lp + at * zt_dtype_size(k->view.tc.precision),
              k->view.tc.precision, k->params + at, ZT_F32, stage < 3 ? padded : c);
    int rc;
    if (host && (rc = zt__dp_tier_put(k, u, hdst)) < 0) return zt__dp_nv_fail(k, rc);
  }
  int rc = o->sync(be->ctx);
  return rc < 0 ? zt__dp_backend_fail(k, rc) : 0;
}

/* ---- a part's per-rank checkpoint: every part's ranks move their own files ----------------- */

/* The side of a part's state calls an op is on: what a part without rank 0 follows in
 * zt_trainer_dp_send_state (the state read: gathers, a save's probe and files) or in
 * zt_trainer_dp_receive_state (written: scatters, a load's probe and files). */
static int side_of(int op, int mask) {
  switch (op) {
  case ST_GATHER:
  case ST_SHARDS_OUT: return ST_GATHER;
  case ST_SCATTER:
  case ST_SHARDS_IN: return ST_SCATTER;
  case ST_PROBE: return mask ? ST_GATHER : ST_SCATTER;
  default: return op;
  }
}

/* n bytes of host memory at buf broadcast from global rank 0 through the state calls' scratch
 * (the gradients, dead between steps: stage 1's padded ones, stages 2-3 a unit's buffer), a
 * scratch-full at a time. */
static int bcast_host(dp_rank_state *k, char *buf, size_t n) {
  const dp_state *s = k->s;
  const zt_backend *be = &k->view.be;
  int stage1 = s->dc.zero_stage == 1;
  void *scratch = stage1 ? (void *)k->grads : (void *)k->gunit[0];
  size_t cap = (stage1 ? s->plan.tab->padded_total : s->plan.slot_floats) * sizeof(float);
  for (size_t off = 0; off < n; off += cap) {
    size_t m = n - off < cap ? n - off : cap;
    if (k->r == 0) be->ops->to_device(be->ctx, scratch, buf + off, m);
    int rc = k->comm.ops->broadcast(k->comm.ctx, scratch, scratch, m, 0, k->stream);
    if (rc < 0) return zt__dp_comm_fail(k, rc, "broadcasting the checkpoint's directory");
    be->ops->to_host(be->ctx, buf + off, scratch, m);
    if ((rc = be->ops->sync(be->ctx)) < 0) return zt__dp_backend_fail(k, rc);
  }
  return 0;
}

/* Each rank's verdict on its share of a state call (a: its result, b: what goes with it),
 * all-gathered in the exchange buffer: every rank's record r is then at h_xchg + r * rec. */
static int share(dp_rank_state *k, double a, double b, const char *what) {
  const dp_state *s = k->s;
  const zt_backend *be = &k->view.be;
  size_t R = s->plan.rec, bytes = R * sizeof(double);
  double *rec = k->h_xchg + (size_t)k->r * R;
  rec[0] = a;
  rec[1] = b;
  be->ops->to_device(be->ctx, k->xchg + (size_t)k->r * R, rec, bytes);
  int rc = k->comm.ops->all_gather(k->comm.ctx, k->xchg + (size_t)k->r * R, k->xchg, bytes,
                                   k->stream);
  if (rc < 0) return zt__dp_comm_fail(k, rc, what);
  be->ops->to_host(be->ctx, k->h_xchg, k->xchg, (size_t)s->dc.world * bytes);
  rc = be->ops->sync(be->ctx);
  return rc < 0 ? zt__dp_backend_fail(k, rc) : 0;
}

/* ST_PROBE: rank 0's token and directory to every rank, which checks its own view of the
 * directory for the token (a save's marker, a load's manifest: zt__ckpt_probe_sees); the
 * verdicts are exchanged, so every rank of every part learns whether all saw it. */
static int rank_probe(dp_rank_state *k, int save, size_t len) {
  const dp_state *s = k->s;
  if (len < 2 || len > PROBE_MAX)
    return zt__dp_rank_fail(k, -EINVAL, "the part holding rank 0 sent a probe of %zu bytes", len);
  if (!(k->blob = malloc(len))) return zt__dp_rank_fail(k, -ENOMEM, "out of host memory");
  if (k->r == 0) memcpy(k->blob, s->blob, len);
  int rc = bcast_host(k, k->blob, len);
  if (rc < 0) return rc;
  /* the token, NUL, the directory, NUL */
  size_t tl = k->blob[len - 1] == 0 ? strlen(k->blob) : len;
  int sees = tl + 1 < len && zt__ckpt_probe_sees(k->blob + tl + 1, save, k->blob);
  if ((rc = share(k, sees, 0, "exchanging whether every part sees the checkpoint")) < 0)
    return rc;
  k->probe_all = 1;
  for (int r = 0; r < s->dc.world; r++) k->probe_all &= k->h_xchg[(size_t)r * s->plan.rec] != 0;
  return 0;
}

/* The exchanged verdict of every rank's file (rc: this rank's, its message in k->err): 0 when
 * all went well; else the first rank that failed decides. That rank returns its own failure;
 * the other ranks of its part -ECANCELED (so that the part reports the failed rank's message);
 * the ranks of the other parts the failed rank's code (remote 0) or `remote`, with a message
 * naming its file as this part's io names it (its own part's error says more). */
static int part_verdict(dp_rank_state *k, int rc, int remote, const char *doing) {
  const dp_state *s = k->s;
  int bad = -1;
  for (int r = 0; r < s->dc.world && bad < 0; r++)
    if (k->h_xchg[(size_t)r * s->plan.rec] < 0) bad = r;
  if (bad < 0) return 0;
  if (rc < 0) return rc;
  if (bad >= s->dc.rank0 && bad < s->dc.rank0 + s->nl)
    return zt__dp_rank_fail(k, -ECANCELED, "rank %d of this part failed %s", bad, doing);
  int frc = (int)k->h_xchg[(size_t)bad * s->plan.rec];
  const char *path = s->io && s->io->path ? s->io->path(s->io->arg, bad) : NULL;
  return zt__dp_rank_fail(k, remote ? remote : frc, "%s%s%s (rank %d, of another part, failed %s; "
                          "that part's error says more)", path ? path : "", path ? ": " : "",
                          strerror(-frc), bad, doing);
}

/* ST_SHARDS_OUT: every rank of every part writes its own file (zt__dp_rank_shards_out), then
 * the ranks exchange their results and their files' sizes (for rank 0's manifest). A rank that
 * failed fails the save on every part, nothing else changed: no failure of the collectives. */
static int part_shards_out(dp_rank_state *k) {
  const dp_state *s = k->s;
  int rc = s->io ? zt__dp_rank_shards_out(k) : zt__dp_rank_fail(k, s->io_rc, "%s", s->io_err);
  double bytes = rc == 0 ? (double)s->io->bytes[k->r] : 0;
  int erc = share(k, rc, bytes, "exchanging the ranks' files of the checkpoint");
  if (erc < 0) return erc;
  rc = part_verdict(k, rc, 0, "to write its file of the checkpoint");
  k->abandoned = rc < 0;
  return rc;
}

/* ST_SHARDS_IN: every rank of every part reads its own file into its chunks
 * (zt__dp_rank_shards_in), the results exchanged, then (stages 1-2) every rank's copy of the
 * parameters all-gathered. A rank that failed leaves every part's state partly the
 * checkpoint's: every rank fails as inside the collectives (the trainers refuse what
 * follows). */
static int part_shards_in(dp_rank_state *k) {
  const dp_state *s = k->s;
  int rc = s->io ? zt__dp_rank_shards_in(k) : zt__dp_rank_fail(k, s->io_rc, "%s", s->io_err);
  int erc = share(k, rc, 0, "exchanging the ranks' reads of the checkpoint");
  if (erc < 0) return erc;
  if ((rc = part_verdict(k, rc, -EIO, "to read its file of the checkpoint: the state is partly "
                         "the checkpoint's")) < 0)
    return rc;
  return s->dc.zero_stage < 3 ? zt__dp_rank_shards_gather(k) : 0;
}

/* cmd_state on every rank of every part: rank 0 says what its part's call is and which units
 * it moves, the others check that their part's matches before anything else moves. */
static int rank_state(dp_rank_state *k) {
  const dp_state *s = k->s;
  const zt_backend *be = &k->view.be;
  double *h = k->h_xchg;
  k->abandoned = 0;
  free(k->blob);
  k->blob = NULL;
  if (k->r == 0) {
    h[H_OP] = s->op;
    h[H_MASK] = s->mask;
    h[H_U0] = s->u0;
    h[H_U1] = s->u1;
    h[H_LEN] = (double)s->blob_len;
    be->ops->to_device(be->ctx, k->xchg, h, H_BYTES);
  }
  int rc = k->comm.ops->broadcast(k->comm.ctx, k->xchg, k->xchg, H_BYTES, 0, k->stream);
  if (rc < 0) return zt__dp_comm_fail(k, rc, "broadcasting the state call");
  be->ops->to_host(be->ctx, h, k->xchg, H_BYTES);
  if ((rc = be->ops->sync(be->ctx)) < 0) return zt__dp_backend_fail(k, rc);
  int op = (int)h[H_OP], mask = (int)h[H_MASK], u0 = (int)h[H_U0], u1 = (int)h[H_U1];
  size_t len = h[H_LEN] >= 0 && h[H_LEN] <= PROBE_MAX ? (size_t)h[H_LEN] : 0;
  k->got_op = op;
  k->piece[0] = u0;
  k->piece[1] = u1;
  /* a load given up half way leaves every part's state partly the checkpoint's: as after a
   * failure inside the collectives, every rank aborts and the trainers refuse what follows */
  if (op == ST_ABANDON && s->seq_op == ST_SCATTER && s->seq_next > 0)
    return zt__dp_rank_fail(k, -EIO, "the part holding rank 0 gave up its load "
                            "(zt_trainer_load; its error says why) after units 0..%d of %d had "
                            "been written: the state is partly the checkpoint's",
                            s->seq_next - 1, s->plan.nu);
  if (op != s->op && op == ST_ABANDON) {
    k->abandoned = 1;
    return zt__dp_rank_fail(k, -ECANCELED, "the part holding rank 0 gave up its call (its "
                            "zt_trainer_save, _load, _export or _get_state failed; its error says "
                            "why): nothing was changed here");
  }
  if (side_of(op, mask) != side_of(s->op, s->mask))
    return zt__dp_rank_fail(k, -EINVAL, "the part holding rank 0 %s while this part %s: the "
                            "parts' calls must match (engine/train/dp/dp.h)",
                            side_of(op, mask) == ST_GATHER
                                ? "reads the state (zt_trainer_save, _export or _get_state)"
                                : "writes the state (zt_trainer_load)",
                            side_of(s->op, s->mask) == ST_GATHER
                                ? "sends it (zt_trainer_dp_send_state)"
                                : "receives it (zt_trainer_dp_receive_state)");
  if (op != ST_ABANDON && !(u0 >= 0 && u0 < u1 && u1 <= s->plan.nu))
    return zt__dp_rank_fail(k, -EINVAL, "the part holding rank 0 sent units [%d, %d) of a "
                            "model of %d", u0, u1, s->plan.nu);
  switch (op) {
  case ST_GATHER: return state_gather(k, mask, u0, u1);
  case ST_SCATTER: return state_scatter(k, u0, u1);
  case ST_PROBE: return rank_probe(k, mask, len);
  case ST_SHARDS_OUT: return part_shards_out(k);
  case ST_SHARDS_IN: return part_shards_in(k);
  default: return 0;
  }
}

/* As in a step, a rank that fails mid-call releases the others; a call rank 0 gave up before it
 * began is no failure of the collectives. */
static int run_state(dp_rank_state *k) {
  int rc = rank_state(k);
  if (rc < 0 && !k->abandoned) k->comm.ops->abort(k->comm.ctx);
  return rc;
}

const zt__dp_cmd zt__dp_cmd_state = {.run = run_state, .after_queue = 1};

/* ---- the trainer's side: the path's state calls, send and receive -------------------------- */

/* A part's collective state call (dp.h): op is this part's side of it. */
static int state_call(dp_state *s, int op, int mask, char *err, size_t errlen) {
  if (s->broken) return zt__dp_refuse_broken("the state call", err, errlen);
  s->op = op;
  s->mask = mask;
  int bad = zt__dp_dispatch(s, &zt__dp_cmd_state);
  if (bad < 0) return 0;
  const dp_rank_state *k = &s->ranks[bad];
  if (!k->abandoned) s->broken = 1;
  snprintf(err, errlen, "%s", k->err);
  return k->rc;
}

/* A part without rank 0 reaches the state through send / receive only. */
static int refuse_part(const dp_state *s, const char *what, const char *instead, char *err,
                       size_t errlen) {
  snprintf(err, errlen, "%s: this data-parallel part runs ranks %d..%d of dp.world %d, not rank "
           "0: the part holding rank 0 does it while this one calls %s", what, s->dc.rank0,
           s->dc.rank0 + s->nl - 1, s->dc.world, instead);
  return -EINVAL;
}

/* The rank-0 part's piece of its sequence (trainer_internal.h): a state collective the other
 * parts follow; the sequence ends with the piece that holds the last unit, or a failure. */
static int lead_state(dp_state *s, int op, int mask, char *err, size_t errlen) {
  int rc = state_call(s, op, mask, err, errlen);
  s->seq_op = op;
  s->seq_next = rc < 0 || s->u1 >= s->plan.nu ? 0 : s->u1;
  return rc;
}

int zt__dp_read_state(zt_trainer *t, int u0, int u1, float *params, float *m, float *v,
                      char *err, size_t errlen) {
  dp_state *s = t->path_state;
  s->out[0] = params;
  s->out[1] = m;
  s->out[2] = v;
  s->u0 = u0;
  s->u1 = u1;
  if (s->nl == s->dc.world) return zt__dp_run_cmd(s, &zt__dp_cmd_read, err, errlen);
  if (s->dc.rank0 != 0)
    return refuse_part(s, "reading the state", "zt_trainer_dp_send_state", err, errlen);
  return lead_state(s, ST_GATHER, (params ? 1 : 0) | (m ? 2 : 0) | (v ? 4 : 0), err, errlen);
}

int zt__dp_write_state(zt_trainer *t, int u0, int u1, const float *params, const float *m,
                       const float *v, char *err, size_t errlen) {
  dp_state *s = t->path_state;
  s->in[0] = params;
  s->in[1] = m;
  s->in[2] = v;
  s->u0 = u0;
  s->u1 = u1;
  if (s->nl == s->dc.world) return zt__dp_run_cmd(s, &zt__dp_cmd_write, err, errlen);
  if (s->dc.rank0 != 0)
    return refuse_part(s, "writing the state", "zt_trainer_dp_receive_state", err, errlen);
  return lead_state(s, ST_SCATTER, 7, err, errlen);
}

/* The rank-0 part's save / load / export failed before its sequence of state calls ended: the
 * other parts wait for its next piece, and learn from this one that it is not coming (after
 * part of a load, every part fails: rank_state). */
void zt__dp_abandon_state(zt_trainer *t) {
  dp_state *s = t->path_state;
  char err[sizeof s->ranks[0].err];
  if (s->nl < s->dc.world && s->dc.rank0 == 0 && !s->broken)
    state_call(s, ST_ABANDON, 0, err, sizeof err);
  s->seq_next = 0;
}

/* Per-rank checkpoints: with every rank here, or by the part holding rank 0 where every part
 * sees the checkpoint's directory (zt__dp_probe; the other parts refuse checkpoints themselves, at
 * their first state call). */
const zt_shard_table *zt__dp_shards(const zt_trainer *t, int *zero_stage, int *part) {
  const dp_state *s = t->path_state;
  if (s->dc.rank0 != 0) return NULL;
  if (zero_stage) *zero_stage = s->dc.zero_stage;
  if (part) *part = s->nl < s->dc.world;
  return s->plan.tab;
}

/* A part's per-rank call: every part's ranks move their own files (part_shards_out / _in). */
static int part_files(dp_state *s, const zt__shard_io *io, int op, char *err, size_t errlen) {
  s->io = io;
  s->u0 = 0;
  s->u1 = s->plan.nu;
  int rc = state_call(s, op, 0, err, errlen);
  s->io = NULL;
  return rc;
}

int zt__dp_save_shards(zt_trainer *t, const zt__shard_io *io, char *err, size_t errlen) {
  dp_state *s = t->path_state;
  if (s->broken) return zt__dp_refuse_broken("the checkpoint", err, errlen);
  if (s->nl == s->dc.world) {
    s->io = io;
    return zt__dp_run_cmd(s, &zt__dp_cmd_shards_out, err, errlen);
  }
  int rc = part_files(s, io, ST_SHARDS_OUT, err, errlen);
  /* the other parts' files' sizes, from the exchange (this part's ranks, 0 .. nl - 1: the
   * part holding rank 0 is the one that saves, set theirs in their ends) */
  for (int r = s->nl; rc == 0 && r < s->dc.world; r++)
    io->bytes[r] = (long long)s->ranks[0].h_xchg[(size_t)r * s->plan.rec + 1];
  return rc;
}

int zt__dp_load_shards(zt_trainer *t, const zt__shard_io *io, char *err, size_t errlen) {
  dp_state *s = t->path_state;
  if (s->broken) return zt__dp_refuse_broken("the checkpoint load", err, errlen);
  if (s->nl < s->dc.world) return part_files(s, io, ST_SHARDS_IN, err, errlen);
  s->io = io;
  int rc = zt__dp_run_cmd(s, &zt__dp_cmd_shards_in, err, errlen);
  if (rc == 0 && s->dc.zero_stage < 3 &&
      (rc = zt__dp_run_cmd(s, &zt__dp_cmd_shards_gather, err, errlen)) < 0)
    s->broken = 1;
  return rc;
}

/* The part holding rank 0 asks every part whether it sees dir (trainer_internal.h): the token
 * and the directory follow the head of an ST_PROBE, every rank checks its own view and the
 * verdicts are exchanged. Those that did not see it are logged: the call then goes through the
 * flat layout, which the other parts follow as well. */
int zt__dp_probe(zt_trainer *t, const char *dir, int save, const char *token, char *err,
                 size_t errlen) {
  dp_state *s = t->path_state;
  const char *what = save ? "checkpoint" : "load";
  size_t tl = strlen(token), len = tl + strlen(dir) + 2;
  char *blob = len <= PROBE_MAX ? malloc(len) : NULL;
  if (!blob) {
    /* not asked, so no part waits for an answer */
    zt_log(ZT_LOG_WARN, "dp", "%s: not probed (%s): the %s goes through rank 0 in the flat "
           "layout", dir, len > PROBE_MAX ? "the path is too long" : "out of memory", what);
    return 0;
  }
  memcpy(blob, token, tl + 1);
  memcpy(blob + tl + 1, dir, len - tl - 1);
  s->blob = blob;
  s->blob_len = len;
  s->u0 = 0;
  s->u1 = s->plan.nu;
  int rc = state_call(s, ST_PROBE, save, err, errlen);
  s->blob = NULL;
  s->blob_len = 0;
  free(blob);
  if (rc < 0 || s->ranks[0].probe_all) return rc < 0 ? rc : 1;
  char ranks[256] = "";
  size_t n = 0;
  for (int r = 0; r < s->dc.world && n < sizeof ranks; r++)
    if (s->ranks[0].h_xchg[(size_t)r * s->plan.rec] == 0)
      n += (size_t)snprintf(ranks + n, sizeof ranks - n, "%s%d", n ? ", " : "", r);
  zt_log(ZT_LOG_WARN, "dp", "%s: not seen as rank 0 sees it%s by global ranks %s (per-rank "
         "checkpoints of a job over several daemons need a filesystem every daemon mounts at "
         "the same path): the %s goes through rank 0 in the flat layout", dir,
         save ? ", or not writable," : "", ranks, what);
  return 0;
}

/* The part for send / receive: a data-parallel one without rank 0. */
static dp_state *other_part(zt_trainer *t, const char *call, char *err, size_t errlen) {
  if (t->path != &zt__dp_path) {
    snprintf(err, errlen, "%s: not a data-parallel trainer", call);
    return NULL;
  }
  dp_state *s = t->path_state;
  if (s->dc.rank0 == 0) {
    snprintf(err, errlen, "%s: this trainer holds rank 0 (dp.rank0 0), so it reads and writes "
             "the state itself (zt_trainer_save, _load, _export, _get_state); sending and "
             "receiving it are the other parts' side", call);
    return NULL;
  }
  return s;
}

/* After a probe every part passed: this part's ranks' files in the probed directory (blob: the
 * token, NUL, the directory), for the per-rank call that follows. A failure to open them is
 * the ranks' to report in that call (io NULL, io_rc, io_err). */
static void follow_files(dp_state *s, const zt_model *m, int save, const char *blob) {
  zt__rank_files_close(s->files);
  s->files = NULL;
  s->io_rc = zt__rank_files_open(&s->files, &s->fio, m, s->plan.tab, s->dc.zero_stage,
                                 blob + strlen(blob) + 1, save, s->io_err, sizeof s->io_err);
  s->io = s->io_rc == 0 ? &s->fio : NULL;
}

/* The other parts' side of the rank-0 part's sequence: a state collective per call of rank 0's
 * part, in the units rank 0 says, until the piece that holds the last unit, a load's ranks'
 * files (the call's last), or rank 0 giving up. A save's probe and files come before its
 * pieces, a load's probe before its files or its pieces. */
static int follow_state(zt_trainer *t, dp_state *s, int op, char *err, size_t errlen) {
  int rc;
  s->seq_op = op;
  s->seq_next = 0;
  s->io_rc = -EINVAL;
  snprintf(s->io_err, sizeof s->io_err, "the part holding rank 0 moves the ranks' files of a "
           "checkpoint that not every part saw");
  while ((rc = state_call(s, op, 0, err, errlen)) == 0) {
    const dp_rank_state *k0 = &s->ranks[0];
    if (k0->got_op == ST_PROBE && k0->probe_all)
      follow_files(s, t->model, op == ST_GATHER, k0->blob);
    if (k0->got_op == ST_SHARDS_IN) break;
    if (k0->got_op == ST_GATHER || k0->got_op == ST_SCATTER) {
      if (k0->piece[1] >= s->plan.nu) break;
      s->seq_next = k0->piece[1];
    }
  }
  zt__rank_files_close(s->files);
  s->files = NULL;
  s->io = NULL;
  s->seq_next = 0;
  return rc;
}

int zt_trainer_dp_send_state(zt_trainer *t, char *err, size_t errlen) {
  dp_state *s = other_part(t, "zt_trainer_dp_send_state", err, errlen);
  return s ? follow_state(t, s, ST_GATHER, err, errlen) : -EINVAL;
}

int zt_trainer_dp_receive_state(zt_trainer *t, int step, int adam_step, char *err,
                                size_t errlen) {
  const char *call = "zt_trainer_dp_receive_state";
  dp_state *s = other_part(t, call, err, errlen);
  if (!s) return -EINVAL;
  if (step < 0 || step > 1 << 30 || adam_step < 0 || adam_step > step) {
    snprintf(err, errlen, "%s: step %d and adam_step %d must satisfy 0 <= adam_step <= step <= "
             "%d", call, step, adam_step, 1 << 30);
    return -EINVAL;
  }
  int rc = follow_state(t, s, ST_SCATTER, err, errlen);
  if (rc < 0) return rc;
  t->step = step;
  t->adam_step = adam_step;
  return 0;
}

void zt_trainer_dp_set_flags(zt_trainer *t, unsigned flags) {
  if (t->path == &zt__dp_path) ((dp_state *)t->path_state)->flags = flags;
}
