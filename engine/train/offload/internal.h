/* The offloaded step's internals (engine/train/offload/offload.h), shared by its files:
 * step.c: the walks and the step; update.c: a unit's update (device, host, NVMe: the store);
 * delayed.c: the delayed update; open.c: zt_trainer_open_offload; state.c: where the state is,
 * the path's state calls, close, stats.
 * Here: the path's state and the functions one file calls in another. */
#ifndef ZT_TRAIN_OFFLOAD_INTERNAL_H
#define ZT_TRAIN_OFFLOAD_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/train/offload/offload.h"
#include "engine/train/trainer_internal.h"
#include "offload/copy_engine.h"
#include "offload/cpu_adam.h"
#include "offload/cpu_pool.h"
#include "offload/device_arena.h"
#include "offload/host_arena.h"
#include "offload/nvme_store.h"
#include "offload/opt_store.h"
#include "offload/streamer.h"

typedef struct off_state {
  zt_offload_cfg oc;
  zt_dtype dt;         /* the compute precision: fp32, or bf16/fp16 with a host compute copy */
  zt_dtype sd;         /* train.optimizer.state_dtype: m and v's type in every tier (fp32, bf16) */
  /* Units [ng, nh) keep masters, m and v in the host arena, units [nh, nu) on NVMe. The host's
   * flat-layout buffers start at float lo: 0 where the device units alias them (the cpu
   * backend without NVMe units or gradient ring), else the first streamed unit's offset. */
  int nh;
  size_t lo;
  void *h[ZT_OPT_KINDS]; /* masters (fp32), m, v (sd) over [lo, lo + h_floats): up to the offset
                            of unit nh (zt__off_host_at) */
  size_t h_floats;
  float *grads;        /* the fp32 gradients over [lo, n); NULL with the ring */
  int ring;            /* the gradient ring's slots (0: none): unit u's in slot[(u - ng) % ring] */
  float **slot;
  size_t ring_floats;  /* a slot's floats: the largest streamed unit's */
  float *scopy;        /* NVMe units, params not nvme: the fp32 parameters their ops read, which
                          they stream from; unit u's [scopy_off[u], scopy_off[u + 1]) */
  size_t *scopy_off;
  uint16_t *lp;        /* bf16/fp16: the host compute copy over [lo, n), rewritten by the
                          AdamW */
  int scopy0;          /* the first unit with a stream copy: nh, or ng with delayed bf16/fp16 */
  /* delayed_update: the other buffer of each pair the update writes while the step reads the
   * current one (docs/offload.md "Delayed update"), swapped with it at the drain; NULL where
   * unused */
  int delayed;
  float *m_nxt;        /* fp32: the host units' masters, alternating with h[ZT_OPT_MASTER] */
  uint16_t *lp_nxt;    /* bf16/fp16: the compute copy */
  float *scopy_nxt;    /* the stream copy */
  /* the update deferred by step pend_step, with pend_hp: units pend_next down to ng are still to
   * be started (an NVMe unit's read waits, so the walks start them one by one) */
  int pend, pend_next, pend_step;
  zt_adam_hparams pend_hp;
  zt_stream_piece *pieces; /* bf16/fp16: what each unit's device copy is made of: unit u's are */
  int *first_piece;        /* pieces[first_piece[u] .. first_piece[u + 1]) */
  size_t *lp_offset;       /* bf16/fp16: per unit, its compute-copy block in its device copy */
  zt_backend hbe;      /* math on host buffers (norm, casts): the trainer's backend on the CPU,
                          a CPU backend of its own beside a GPU */
  int own_hbe;
  zt_dev_mem_ops dev_mem; /* the device arena's block from the backend (cuda) */
  /* Units 0..ng-1 keep their optimizer on the device (zt_offload_cfg.gpu_units): masters, m, v,
   * the compute copy and the gradients in backend buffers over their ng_floats parameters,
   * updated by the backend's AdamW after the backward; the streamer handles units ng.. only
   * (its unit i is unit ng + i). On the cpu backend the device buffers are the host tier's. */
  int ng;
  size_t ng_floats;
  float *d_master, *d_grad;
  void *d_m, *d_v;     /* of type sd */
  void *d_lp;
  /* grads gpu (docs/offload.md "Gradient sums"): the streamed units' running sums in a
   * backend buffer over their parameters [ng_floats, n), each unit's its streamer dev_grads */
  int dsum;
  float *d_sum;
  size_t dsum_bytes;   /* its footprint in the plan */
  int d_alias;
  size_t dev_unit_bytes;
  uint64_t gpu_unit_updates;
  uint64_t step_ns;    /* wall time of the steps that succeeded */
  zt_step_cost est;    /* the plan's step by the cost model */
  int adam_threads;
  zt_host_arena *host;
  zt_nvme_store *nvme; /* optimizer nvme: the NVMe units' files */
  char nvme_dir[ZT_PATH_MAX + 32]; /* this trainer's directory under oc.nvme_dir, "" none */
  zt_opt_set sets[2];  /* optimizer nvme: the store's staging, in the host arena; the state calls
                          read and write the NVMe units through sets[0] */
  zt_opt_store *opt;   /* the streamed units' AdamW, the NVMe units' state */
  zt_dev_arena *dev;
  zt_copy_engine *copy;
  zt_cpu_pool *pool;
  zt_streamer *st;
  int nu;
  /* offload.order unit: the activations of each micro-batch of the step (macts[0] is t->acts),
   * and whether the backward is unit-major too (zt_offload_backward_unit_major) */
  int unit_major, um_back;
  zt_acts **macts;
  int head;            /* the unit that also reads the embedding unit (gpt head), or -1 */
  float *embed_grads;  /* the embedding unit's gradient buffer, held from the head to unit 0 */
  zt_opt_run *runs;    /* the AdamW runs (the store has its copy; these the device units') */
  int *first_run;      /* runs of unit u: [first_run[u], first_run[u + 1]) */
  size_t act_bytes, arena_budget, host_bytes;
  char *updated;       /* per unit: its update of this step has started */
  uint64_t adam_units, adam_overlapped, adam_landed;
  int landing;         /* the last step's updates of the streamed units may still run: each
                          lands behind the next step's forward of it (zt__off_land) */
  int broken;          /* a failed step left part of the parameters updated */
} off_state;

/* state.c: where a unit's state is; the path's state calls */
void *zt__off_host_at(const off_state *s, int k, size_t off);
uint16_t *zt__off_lp_at(const off_state *s, size_t off);
float *zt__off_grads_of(const zt_trainer *t, int u);
int zt__off_write_state(zt_trainer *t, int u0, int u1, const float *params, const float *m,
                        const float *v, char *err, size_t errlen);
extern const zt__train_path zt__offload_path;

/* step.c: the step */
int zt__off_step(zt_trainer *t, const zt_batch *tokens, zt_step_result *res, char *err,
                 size_t errlen);
/* step.c: held-out evaluation (the path's eval) */
int zt__off_eval(zt_trainer *t, const zt_batch *b, double *loss_sum, int64_t *counted,
                 char *err, size_t errlen);

/* update.c: a unit's update */
/* zt_opt_store_cfg.updated: an NVMe unit's updated masters to the host copy it streams from */
int zt__off_opt_updated(void *ctx, int u, const zt_opt_set *set);
int zt__off_update_unit(zt_trainer *t, int u, const zt_adam_hparams *hp);
/* The last step's updates still running (landing): finished. A failure leaves the state between
 * two steps: broken. */
int zt__off_land(zt_trainer *t);

/* delayed.c: the delayed update */
void zt__off_swap_copies(zt_trainer *t);
int zt__off_pend_pump(zt_trainer *t);
int zt__off_pend_start(zt_trainer *t, const zt_adam_hparams *hp, int step);
int zt__off_pend_wait_unit(zt_trainer *t, int u);
int zt__off_pend_finish(zt_trainer *t);
void zt__off_pend_fail(zt_trainer *t, int rc, int step, char *err, size_t errlen);

#endif
