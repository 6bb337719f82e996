/* The data-parallel step (engine/train/dp.h): the rank threads, the per-stage buffers, the
 * step's walk over the units with its collectives, the gather/scatter between the shards and
 * the flat layout (direct copies when every rank is here, collectives for a part), and the
 * ranks' files of per-rank checkpoints (all ranks here, or every part's at once). */
#include "engine/train/dp.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/kernels/backend.h"
#include "engine/log.h"
#include "engine/train/trainer_internal.h"
#include "offload/copy_engine.h"
#include "offload/cpu_adam.h"
#include "offload/cpu_pool.h"
#include "offload/host_arena.h"
#include "offload/nvme_store.h"
#include "offload/shard.h"

/* A rank's record in the exchange after the backward: its sum of squares, non-finite flag, its
 * part's step flags (an unsigned int: exact in a double) and the host units its AdamW updated
 * during the backward, then for each of its micro-batches the mean loss and whether it
 * counted. */
#define X_SUMSQ 0
#define X_NONFINITE 1
#define X_FLAGS 2
#define X_UPDATED 3
#define X_MICRO 4

/* How many units behind the one the backward just queued a host unit's gradients are taken up
 * (waited for, added, summed, their AdamW started): the device always has the next unit's work
 * queued when the host waits for a copy. */
#define TAKE_UP_LAG 2

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
/* A part's state calls: a gather or scatter of a piece of units, rank 0's part giving up its
 * call, and a per-rank checkpoint's: the probe of its directory, every rank's file written or
 * read (dp.h). */
enum { ST_GATHER = 1, ST_SCATTER, ST_ABANDON, ST_PROBE, ST_SHARDS_OUT, ST_SHARDS_IN };
/* The longest probe (the token, the directory and their NULs) */
#define PROBE_MAX (ZT_PATH_MAX + 256)

/* An AdamW call: consecutive elements of one chunk sharing a decay flag. */
typedef struct adam_seg {
  int unit;
  size_t off, n; /* within the rank's chunk of the unit */
  int decay;
} adam_seg;

/* CMD_READ / CMD_WRITE: every rank copies its own chunks (all ranks here); CMD_SHARDS_OUT /
 * _IN: every rank moves its own chunks to / from its file of a per-rank checkpoint, and
 * CMD_SHARDS_GATHER then all-gathers stages 1-2's parameters; CMD_STATE: the collective state
 * call of a part. */
typedef enum dp_cmd {
  CMD_OPEN, CMD_STEP, CMD_READ, CMD_WRITE, CMD_SHARDS_OUT, CMD_SHARDS_IN, CMD_SHARDS_GATHER,
  CMD_STATE, CMD_CLOSE
} dp_cmd;

struct dp_state;

/* optimizer nvme: a staging of one host unit's chunk of masters, m and v (and the compute copy
 * the AdamW writes), moving FREE -> READING -> UPDATING -> WRITING -> FREE as offload_step.c's
 * sets do; the state calls use set 0 synchronously between steps. */
typedef enum nv_state { NV_FREE, NV_READING, NV_UPDATING, NV_WRITING } nv_state;
typedef struct nv_set {
  float *buf[3];
  uint16_t *lp;             /* bf16 / fp16; NULL in fp32 */
  int unit;                 /* -1 none */
  nv_state st;
  int req[3];
} nv_set;

typedef struct dp_rank_state {
  struct dp_state *s;
  int r;                    /* the global rank */
  /* the rank as a trainer of its own for the shared helpers (zt__trainer_stage_micro): the
   * model (shared, read only), the config, its backend, activations and host staging */
  zt_trainer view;
  zt_comm comm;
  void *stream;
  pthread_t thread;
  /* backend memory; see dp.h for what each stage keeps */
  float *params;            /* stages 1-2: the padded layout; 3: the packed shard */
  void *params_lp;          /* the bf16 compute copy, same layout; NULL in fp32 */
  float *grads;             /* stage 1: the padded layout; 2-3: the packed shard */
  float *m, *v;             /* the packed shard */
  float *gunit[2], *gembed; /* 2-3: a unit's gradients (padded), alternating by unit so that
                               one is reduced while the next unit's backward fills the other;
                               gpt: the embedding's */
  float *gscratch;          /* 2-3: a reduce-scattered chunk of a later micro-batch */
  float *pslot[2];          /* 3: gathered units */
  void *lpslot[2];
  float *pembed;            /* 3, gpt: the gathered embedding */
  void *lpembed;
  double *xchg;             /* W exchange records */
  double *h_xchg;           /* host copy of them */
  /* the host tier (optimizer host, dp.h): units ng.. in the packed layout from dev_packed */
  zt_host_arena *host;
  zt_copy_engine *copy;
  zt_backend hbe;           /* math on the host tier: the rank's own backend on the cpu, a cpu
                               backend of its own beside a GPU */
  int own_hbe;
  float *hm, *hmom, *hvar, *hgrad; /* masters, m, v, gradients (optimizer nvme: the gradients,
                                      the host units' masters, m and v (host_units), and with
                                      params host hm, every unit's parameters the gathers read;
                                      params nvme: the host units' alone) */
  float *hstage;            /* stages 2-3 with grad_accum > 1: a later micro-batch's gradients */
  uint16_t *hlp;            /* bf16 / fp16: the compute copy the AdamW writes, beside hm */
  /* optimizer nvme: the rank's store in dir, a file per NVMe unit and kind (unit u's kind i:
   * ext[3 * u + i]), and two staging sets (unit u's in sets[u & 1]: one updated while the
   * next is read ahead) */
  zt_nvme_store *store;
  int *ext;
  nv_set sets[2];
  int64_t up_tick;          /* the H2D ticket of the last chunk uploaded from a set */
  uint64_t nvme_bytes;      /* the files' whole blocks */
  char nvdir[ZT_PATH_MAX + 64]; /* its directory rank-R; "" none */
  float *gout[2];           /* device chunks: a host unit's reduce-scattered gradients (stages
                               2-3, alternating by unit) and the state calls' uploads ([0]) */
  int64_t gout_tick[2];     /* the D2H ticket that last read each */
  float *pchunk[2];         /* params host / nvme: a host unit's chunk staged for its gather */
  void *lpchunk[2];
  int chunk_unit[2];        /* the unit staged in each, -1 none */
  int64_t chunk_tick[2], h2d_last; /* copy tickets (h2d_last: the last from hm); 0 none */
  /* params nvme: two page-locked stagings of an NVMe unit's parameter chunk, read from its
   * master file ahead of the walk (unit u's into pstage[u & 1]) and copied from there into
   * chunk buffer u & 1 */
  float *pstage[2];
  int pstage_unit[2];       /* the unit read or being read into each, -1 none */
  int pstage_req[2];        /* the read's request while not waited for, -1 none */
  int64_t pstage_tick[2];   /* the H2D ticket that last read each; 0 none */
  int dir;                  /* the walk: 1 forward, -1 backward */
  zt_cpu_adam_task *tasks;  /* per AdamW call (segs), those of host units */
  int *first_seg;           /* unit u's calls: segs[first_seg[u] .. first_seg[u + 1]) */
  int64_t *unit_tick;       /* per unit: the D2H ticket of its gradients this micro-batch */
  double *usumsq;           /* per host unit: its sum of squares, taken up in the backward */
  char *submitted;          /* per unit: its host AdamW started and not waited for */
  char *began;              /* per unit: its host update began this step */
  int take_up;              /* the next unit (walking down) the backward takes up */
  int updated, nonfinite;   /* host units updated during the backward; one was not finite */
  int slot_unit[2];         /* 3: the unit in each slot, -1 none */
  int embed_gathered;
  /* The communicator's queue (comm.h): the tickets of the collectives that overlap the compute
   * (0: none pending, or run on the compute stream, which orders them): the last reduction
   * that read each unit gradient buffer and the embedding's, each slot's and the embedding's
   * gather (3), each unit's gather of its updated parameters (1-2, read by the next step);
   * the latest ticket the compute waited for, which covers every earlier one (the queue runs
   * in order). A later micro-batch's reduced chunk is added to the shard one unit late
   * (add_unit, -1 none), so that its reduction overlaps the next unit's backward. */
  long long gunit_tick[2], gembed_tick, slot_tick[2], embed_tick, *gather_tick, q_waited;
  long long add_tick;
  int add_unit;
  adam_seg *segs;
  int nsegs;
  size_t bytes;             /* backend bytes held */
  int rc;
  /* CMD_STATE: the call failed alike on every rank without a failure of the collectives, the
   * communicators intact (rank 0's part gave up its call; a rank's file of a per-rank save
   * failed, which every rank learned from the exchange) */
  int abandoned;
  int got_op;               /* CMD_STATE: the call rank 0's part said (ST_*) */
  int piece[2];             /* CMD_STATE: the units [u0, u1) rank 0's part said it moves */
  int probe_all;            /* ST_PROBE: every rank of every part saw the directory */
  char *blob;               /* ST_PROBE: the token and the directory (rank 0's) */
  char err[512];            /* room for a checkpoint file's path */
  /* the step's results, the same on every rank */
  double loss, norm;
  unsigned flags;
  int skipped;              /* fp16: the gradient overflowed, nothing was updated */
} dp_rank_state;

typedef struct dp_state {
  zt_dp_cfg dc;
  zt_shard_table *tab;
  int nu;
  int tied;                 /* gpt: the head reads (and adds the gradient of) the embedding */
  size_t slot_floats;       /* the largest unit a slot or gunit holds (padded) */
  size_t rec;               /* doubles per exchange record */
  int nl;                   /* the part's ranks: global dc.rank0 .. dc.rank0 + nl - 1 */
  dp_rank_state *ranks;     /* nl, in rank order */
  /* offload: units 0..ng-1 on the device (all without), the rest on the host tier; the
   * device's packed buffers hold dev_packed elements, the host's host_n */
  int ng, params_host;      /* params_host: the host units' parameters are not on the device
                               between uses (params host or nvme, stage 3) */
  int params_nvme;          /* params nvme: the NVMe units' chunks are read from their master
                               files before each gather; the host tier holds none of them */
  size_t dev_packed, host_n;
  int nvme;                 /* optimizer nvme: units nv0.. keep masters, m and v in files */
  int nv0;                  /* the first NVMe unit: ng + dc.host_units with optimizer nvme, else
                               nu; units ng..nv0-1 keep theirs on the host tier */
  size_t hopt_n;            /* those host units' elements (a prefix of host_n) */
  size_t nv_chunk;          /* the largest NVMe unit's chunk (a set's floats) */
  char nvme_dir[ZT_PATH_MAX + 32]; /* the trainer's zt-offload.XXXXXX under dc.nvme_dir */
  zt_cpu_pool *pool;        /* the host units' AdamW, shared by the part's ranks */
  int n_threads;            /* rank threads started */
  pthread_mutex_t mu;
  pthread_cond_t cmd_cv, done_cv;
  dp_cmd cmd;
  uint64_t gen;
  int done;
  /* the command's arguments */
  const int32_t *tokens;
  float lr;
  int adam_step;
  float loss_scale;         /* fp16: the scaler's scale for this step; 1 otherwise */
  float *out[3];            /* CMD_READ, a gather: params, m, v (any NULL) */
  const float *in[3];       /* CMD_WRITE, a scatter */
  int u0, u1;               /* the units out / in hold (from unit u0's first parameter) */
  /* CMD_STATE: this part's call (rank 0's part: ST_*; the others: ST_GATHER for send,
   * ST_SCATTER for receive); rank 0: the gather's tensors or whether a probe is a save's */
  int op, mask;
  const char *blob;         /* rank 0's ST_PROBE: the token and the directory, blob_len bytes */
  size_t blob_len;
  /* CMD_SHARDS_OUT / _IN, ST_SHARDS_OUT / _IN: the checkpoint's files. A part without rank 0
   * opens its ranks' own after a probe every part passed (files, fio; io NULL with io_rc and
   * io_err when that failed, which its ranks then report in the call) */
  const zt__shard_io *io;
  zt__rank_files *files;
  zt__shard_io fio;
  int io_rc;
  char io_err[512];
  /* a part's sequence of state calls (trainer_internal.h): its op (ST_GATHER, ST_SCATTER) and
   * the units moved so far (0: none open) */
  int seq_op, seq_next;
  unsigned flags;           /* this part's flags for its next step */
  int broken;               /* a rank failed mid-step and aborted the communicators */
} dp_state;

static int rank_fail(dp_rank_state *k, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int rank_fail(dp_rank_state *k, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = snprintf(k->err, sizeof k->err, "rank %d: ", k->r);
  vsnprintf(k->err + n, sizeof k->err - (size_t)n, fmt, ap);
  va_end(ap);
  return rc;
}

static int comm_fail(dp_rank_state *k, int rc, const char *what) {
  return rank_fail(k, rc, "%s: %s", what, k->comm.ops->error_text(k->comm.ctx));
}

static int backend_fail(dp_rank_state *k, int rc) {
  const zt_backend *be = &k->view.be;
  return rank_fail(k, rc, "backend %s: %s", be->ops->name, be->ops->error_text(be->ctx));
}

/* ---- open and close (on the rank's thread) ------------------------------------------------ */

static void *rank_alloc(dp_rank_state *k, size_t bytes, int *rc) {
  if (*rc < 0 || !bytes) return NULL;
  const zt_backend *be = &k->view.be;
  void *p = be->ops->alloc(be->ctx, bytes);
  if (!p) {
    *rc = rank_fail(k, -ENOMEM, "backend %s: cannot allocate %zu bytes (%zu held)",
                    be->ops->name, bytes, k->bytes);
    return NULL;
  }
  be->ops->zero(be->ctx, p, bytes);
  k->bytes += bytes;
  return p;
}

/* The AdamW calls of rank k: its chunk of each unit cut where the decay flag changes. */
static int build_segs(dp_rank_state *k) {
  const dp_state *s = k->s;
  const zt_model *m = k->view.model;
  int nt = zt_model_num_tensors(m);
  k->segs = calloc((size_t)nt, sizeof *k->segs);
  k->first_seg = calloc((size_t)s->nu + 1, sizeof *k->first_seg);
  if (!k->segs || !k->first_seg) return -ENOMEM;
  for (int i = 0; i < nt; i++) {
    const zt_tensor_info *ti = zt_model_tensor(m, i);
    const zt_shard *sh = zt_shard_at(s->tab, ti->unit, k->r);
    size_t t0 = ti->offset - zt_model_unit(m, ti->unit)->offset, t1 = t0 + ti->numel;
    size_t lo = t0 > sh->unit_off ? t0 : sh->unit_off;
    size_t hi = t1 < sh->unit_off + sh->count ? t1 : sh->unit_off + sh->count;
    if (lo >= hi) continue;
    adam_seg *prev = k->nsegs ? &k->segs[k->nsegs - 1] : NULL;
    if (prev && prev->unit == ti->unit && prev->decay == ti->decay &&
        prev->off + prev->n == lo - sh->unit_off) {
      prev->n += hi - lo;
      continue;
    }
    k->segs[k->nsegs++] =
        (adam_seg){.unit = ti->unit, .off = lo - sh->unit_off, .n = hi - lo, .decay = ti->decay};
  }
  /* the calls follow the tensors, which follow the units */
  for (int u = s->nu, i = k->nsegs; u >= 0; u--) {
    while (i > 0 && k->segs[i - 1].unit >= u) i--;
    k->first_seg[u] = i;
  }
  return 0;
}

/* Elements of the device's parameter buffer: stages 1-2 the padded layout, stage 3 the packed
 * shard (of the device units only with params host). */
static size_t dev_param_floats(const dp_state *s) {
  if (s->dc.zero_stage < 3) return s->tab->padded_total;
  return s->params_host ? s->dev_packed : s->tab->packed_total;
}

/* Stage 1's gradients are the padded layout; 2-3 the device units' packed shard. */
static size_t dev_grad_floats(const dp_state *s) {
  return s->dc.zero_stage == 1 ? s->tab->padded_total : s->dev_packed;
}

static int gout_count(const dp_state *s) {
  return !s->host_n ? 0 : s->dc.zero_stage >= 2 ? 2 : 1;
}

static int has_hstage(const dp_state *s, const zt_train_cfg *tc) {
  return s->host_n && s->dc.zero_stage >= 2 && tc->grad_accum > 1;
}

/* The elements of the host tier's masters and compute copy: the host units' (ng..nv0-1), and
 * with optimizer nvme and params host the NVMe units' too, as the parameters the gathers are
 * staged from (params nvme reads those from the files). m and v are the host units' alone
 * (hopt_n). */
static size_t host_master_floats(const dp_state *s) {
  return !s->nvme || (s->params_host && !s->params_nvme) ? s->host_n : s->hopt_n;
}

/* Whether the host tier's masters (and compute copy) hold host unit u's parameters. */
static int hm_holds(const dp_state *s, int u) {
  return u < s->nv0 || (s->params_host && !s->params_nvme);
}

/* The host tier's arena: gradients, the staging, masters, m, v and the bf16 copy, each as far
 * as it goes (above), with optimizer nvme two sets (their compute copy unless params nvme,
 * whose gathers cast it on the device), and with params nvme two parameter stagings. */
static size_t host_tier_bytes(const dp_state *s, const zt_train_cfg *tc) {
  if (!s->host_n) return 0;
  size_t hm = host_master_floats(s);
  int lp = tc->precision != ZT_F32;
  size_t b = (1 + (size_t)has_hstage(s, tc)) *
             zt_host_arena_footprint(s->host_n * sizeof(float));
  if (hm) b += zt_host_arena_footprint(hm * sizeof(float));
  if (hm && lp) b += zt_host_arena_footprint(hm * sizeof(uint16_t));
  if (s->hopt_n) b += 2 * zt_host_arena_footprint(s->hopt_n * sizeof(float));
  if (s->nvme)
    b += 2 * (3 * zt_host_arena_footprint(s->nv_chunk * sizeof(float)) +
              (lp && !s->params_nvme ? zt_host_arena_footprint(s->nv_chunk * sizeof(uint16_t))
                                     : 0));
  if (s->params_nvme) b += 2 * zt_host_arena_footprint(s->nv_chunk * sizeof(float));
  return b;
}

/* The rank's files: a master, exp_avg and exp_avg_sq of its chunk per NVMe unit, each in the
 * store's whole blocks. */
static uint64_t nvme_file_bytes(const dp_state *s) {
  uint64_t sum = 0;
  for (int u = s->nv0; u < s->nu; u++) {
    uint64_t file = s->tab->chunk[u] * sizeof(float);
    sum += 3 * ((file + ZT_NVME_ALIGN - 1) / ZT_NVME_ALIGN * ZT_NVME_ALIGN);
  }
  return sum;
}

/* A host unit's first element in the host tier. */
static size_t host_at(const dp_state *s, const zt_shard *sh) {
  return sh->packed_off - s->dev_packed;
}

static int on_host(const dp_state *s, int u) { return u >= s->ng; }

/* A host unit whose masters, m and v are in files (optimizer nvme, past host_units). */
static int on_nvme(const dp_state *s, int u) { return u >= s->nv0; }

static int host_fail(dp_rank_state *k, int rc) {
  return rank_fail(k, rc, "host tier: %s", zt_host_arena_error(k->host));
}

static const char *const kind_names[3] = {"master", "exp_avg", "exp_avg_sq"};

/* optimizer nvme: the rank's directory rank-R under the trainer's, its store (opened on the
 * rank's thread, which alone uses it) and a file per NVMe unit and kind, reserved in full. */
static int nv_open(dp_rank_state *k) {
  const dp_state *s = k->s;
  const zt_model *m = k->view.model;
  char why[400];
  int rc;
  if ((size_t)snprintf(k->nvdir, sizeof k->nvdir, "%s/rank-%d", s->nvme_dir, k->r) >=
      sizeof k->nvdir) {
    k->nvdir[0] = 0;
    return rank_fail(k, -ENAMETOOLONG, "offload.nvme_dir: %s: %s", s->nvme_dir,
                     strerror(ENAMETOOLONG));
  }
  if (mkdir(k->nvdir, 0700) < 0) {
    rc = -errno;
    k->nvdir[0] = 0;
    return rank_fail(k, rc, "offload.nvme_dir: %s/rank-%d: %s", s->nvme_dir, k->r,
                     strerror(-rc));
  }
  if (!(k->ext = malloc(3 * (size_t)s->nu * sizeof *k->ext)))
    return rank_fail(k, -ENOMEM, "out of host memory");
  if ((rc = zt_nvme_store_open(&k->store, k->nvdir, NULL, why, sizeof why)) < 0)
    return rank_fail(k, rc, "offload.nvme_dir: %s", why);
  for (int u = s->nv0; u < s->nu; u++)
    for (int i = 0; i < 3; i++) {
      char name[64];
      uint64_t bytes = s->tab->chunk[u] * sizeof(float);
      snprintf(name, sizeof name, "%s.%s", zt_model_unit(m, u)->name, kind_names[i]);
      if ((rc = zt_nvme_store_alloc(k->store, name, bytes)) < 0)
        return rank_fail(k, rc, "offload.nvme_dir: %s", zt_nvme_store_error(k->store));
      k->ext[3 * u + i] = rc;
      k->nvme_bytes += (bytes + ZT_NVME_ALIGN - 1) / ZT_NVME_ALIGN * ZT_NVME_ALIGN;
    }
  return 0;
}

/* The host tier of rank k, its copy engine and its math, on the rank's thread (a cuda rank's
 * pages are registered with its device). */
static int host_open(dp_rank_state *k) {
  const dp_state *s = k->s;
  const zt_backend *be = &k->view.be;
  const zt_train_cfg *tc = &k->view.tc;
  int on_gpu = strcmp(be->ops->name, "cuda") == 0, rc;
  if ((rc = zt_host_arena_open(&k->host, host_tier_bytes(s, tc),
                               on_gpu ? zt_host_mem_cuda() : NULL)) < 0)
    return rank_fail(k, rc, "opening the host tier failed: %s", strerror(-rc));
  float **bufs[5];
  size_t len[5], hm = host_master_floats(s);
  int nb = 0, lp = tc->precision != ZT_F32;
  bufs[nb] = &k->hgrad;
  len[nb++] = s->host_n;
  if (has_hstage(s, tc)) {
    bufs[nb] = &k->hstage;
    len[nb++] = s->host_n;
  }
  if (hm) {
    bufs[nb] = &k->hm;
    len[nb++] = hm;
  }
  if (s->hopt_n) {
    bufs[nb] = &k->hmom;
    len[nb++] = s->hopt_n;
    bufs[nb] = &k->hvar;
    len[nb++] = s->hopt_n;
  }
  for (int i = 0; i < nb; i++) {
    if ((rc = zt_host_arena_alloc(k->host, len[i] * sizeof(float), (void **)bufs[i])) < 0)
      return host_fail(k, rc);
    memset(*bufs[i], 0, len[i] * sizeof(float));
  }
  if (lp && hm && (rc = zt_host_arena_alloc(k->host, hm * sizeof(uint16_t), (void **)&k->hlp)) < 0)
    return host_fail(k, rc);
  /* page-aligned and pinned: O_DIRECT reads and writes, and the uploads, straight from them */
  for (int i = 0; s->nvme && i < 2; i++) {
    nv_set *x = &k->sets[i];
    for (int j = 0; j < 3; j++) {
      if ((rc = zt_host_arena_alloc(k->host, s->nv_chunk * sizeof(float),
                                    (void **)&x->buf[j])) < 0)
        return host_fail(k, rc);
      memset(x->buf[j], 0, s->nv_chunk * sizeof(float));
    }
    if (lp && !s->params_nvme &&
        (rc = zt_host_arena_alloc(k->host, s->nv_chunk * sizeof(uint16_t), (void **)&x->lp)) < 0)
      return host_fail(k, rc);
    x->unit = -1;
  }
  for (int i = 0; i < 2; i++) {
    k->pstage_unit[i] = k->pstage_req[i] = -1;
    if (s->params_nvme && (rc = zt_host_arena_alloc(k->host, s->nv_chunk * sizeof(float),
                                                    (void **)&k->pstage[i])) < 0)
      return host_fail(k, rc);
  }
  if (s->nvme && (rc = nv_open(k)) < 0) return rc;
  k->hbe = *be;
  if (on_gpu) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = cores > s->nl ? (int)(cores / s->nl) : 1;
    if ((rc = zt_backend_cpu_open(&k->hbe, threads)) < 0) {
      k->hbe = *be;
      return rank_fail(k, rc, "opening a cpu backend for the host tier failed (%d)", rc);
    }
    k->own_hbe = 1;
  }
  rc = on_gpu ? zt_copy_cuda_open(&k->copy, zt_backend_device(be), k->stream)
              : zt_copy_cpu_open(&k->copy, 0);
  if (rc < 0) return rank_fail(k, rc, "opening the copy engine failed: %s", strerror(-rc));
  k->tasks = calloc((size_t)k->nsegs, sizeof *k->tasks);
  k->unit_tick = calloc((size_t)s->nu, sizeof *k->unit_tick);
  k->usumsq = calloc((size_t)s->nu, sizeof *k->usumsq);
  k->submitted = calloc((size_t)s->nu, 1);
  k->began = calloc((size_t)s->nu, 1);
  if (!k->tasks || !k->unit_tick || !k->usumsq || !k->submitted || !k->began)
    return rank_fail(k, -ENOMEM, "out of host memory");
  k->chunk_unit[0] = k->chunk_unit[1] = -1;
  return 0;
}

static int rank_open(dp_rank_state *k) {
  dp_state *s = k->s;
  const zt_train_cfg *tc = &k->view.tc;
  const zt_backend *be = &k->view.be;
  const zt_model_cfg *mc = zt_model_cfg_of(k->view.model);
  const zt_shard_table *tab = s->tab;
  size_t ds = zt_dtype_size(tc->precision), N = (size_t)tc->micro_batch * (size_t)mc->seq_len;
  int stage = s->dc.zero_stage, rc = be->ops->set_allow_tf32(be->ctx, tc->tf32);
  if (rc < 0)
    return rank_fail(k, rc, "train.tf32: the %s backend cannot set this matmul mode",
                     be->ops->name);
  char why[200];
  rc = zt_acts_open_dt(&k->view.acts, k->view.model, be, tc->micro_batch, tc->ckpt_every,
                       tc->precision, why, sizeof why);
  if (rc < 0) return rank_fail(k, rc, "%s", why);
  k->bytes += zt_acts_bytes(k->view.acts);
  k->view.h_tok = malloc(N * sizeof *k->view.h_tok);
  k->view.h_tgt = malloc(N * sizeof *k->view.h_tgt);
  k->h_xchg = malloc((size_t)s->dc.world * s->rec * sizeof *k->h_xchg);
  k->gather_tick = calloc((size_t)s->nu, sizeof *k->gather_tick);
  if (!k->view.h_tok || !k->view.h_tgt || !k->h_xchg || !k->gather_tick || build_segs(k) < 0)
    return rank_fail(k, -ENOMEM, "out of host memory");
  size_t pn = dev_param_floats(s);
  k->params = rank_alloc(k, pn * sizeof(float), &rc);
  if (tc->precision != ZT_F32) k->params_lp = rank_alloc(k, pn * ds, &rc);
  k->grads = rank_alloc(k, dev_grad_floats(s) * sizeof(float), &rc);
  k->m = rank_alloc(k, s->dev_packed * sizeof(float), &rc);
  k->v = rank_alloc(k, s->dev_packed * sizeof(float), &rc);
  k->xchg = rank_alloc(k, (size_t)s->dc.world * s->rec * sizeof(double), &rc);
  for (int i = 0; i < gout_count(s); i++)
    k->gout[i] = rank_alloc(k, tab->max_chunk * sizeof(float), &rc);
  for (int i = 0; s->params_host && i < 2; i++) {
    k->pchunk[i] = rank_alloc(k, tab->max_chunk * sizeof(float), &rc);
    if (tc->precision != ZT_F32) k->lpchunk[i] = rank_alloc(k, tab->max_chunk * ds, &rc);
  }
  if (stage >= 2) {
    for (int i = 0; i < 2; i++) k->gunit[i] = rank_alloc(k, s->slot_floats * sizeof(float), &rc);
    if (s->tied)
      k->gembed = rank_alloc(k, tab->chunk[0] * (size_t)s->dc.world * sizeof(float), &rc);
    k->gscratch = rank_alloc(k, tab->max_chunk * sizeof(float), &rc);
  }
  if (stage == 3) {
    for (int i = 0; i < 2; i++) {
      k->pslot[i] = rank_alloc(k, s->slot_floats * sizeof(float), &rc);
      if (tc->precision != ZT_F32) k->lpslot[i] = rank_alloc(k, s->slot_floats * ds, &rc);
    }
    if (s->tied) {
      size_t e = tab->chunk[0] * (size_t)s->dc.world;
      k->pembed = rank_alloc(k, e * sizeof(float), &rc);
      if (tc->precision != ZT_F32) k->lpembed = rank_alloc(k, e * ds, &rc);
    }
  }
  if (rc == 0 && s->host_n) rc = host_open(k);
  if (rc == 0 && (rc = be->ops->sync(be->ctx)) < 0)
    rank_fail(k, rc, "backend %s: %s", be->ops->name, be->ops->error_text(be->ctx));
  return rc;
}

/* The backend bytes rank_open allocates besides the activations, from the same layout: what
 * zt_dp_estimate_rank_bytes adds up without opening (tests compare the two). */
static size_t rank_buffer_bytes(const dp_state *s, const zt_train_cfg *tc) {
  const zt_shard_table *tab = s->tab;
  size_t f = sizeof(float), W = (size_t)s->dc.world;
  size_t lp = tc->precision != ZT_F32 ? zt_dtype_size(tc->precision) : 0;
  int stage = s->dc.zero_stage;
  size_t b = dev_param_floats(s) * (f + lp) + dev_grad_floats(s) * f + 2 * s->dev_packed * f +
             W * s->rec * sizeof(double) + (size_t)gout_count(s) * tab->max_chunk * f;
  if (s->params_host) b += 2 * tab->max_chunk * (f + lp);
  if (stage >= 2)
    b += 2 * s->slot_floats * f + (s->tied ? tab->chunk[0] * W * f : 0) + tab->max_chunk * f;
  if (stage == 3)
    b += 2 * s->slot_floats * (f + lp) + (s->tied ? tab->chunk[0] * W * (f + lp) : 0);
  return b;
}

static void rank_close(dp_rank_state *k) {
  const zt_backend *be = &k->view.be;
  /* the copies in flight read or write device buffers */
  zt_copy_close(k->copy);
  /* the I/O in flight reads or writes the sets; the files go with the store */
  zt_nvme_store_close(k->store);
  if (k->nvdir[0]) rmdir(k->nvdir);
  free(k->ext);
  void *bufs[] = {k->params,    k->params_lp, k->grads,     k->m,         k->v,
                  k->xchg,      k->gunit[0],  k->gunit[1],  k->gembed,    k->gscratch,
                  k->pslot[0],  k->pslot[1],  k->lpslot[0], k->lpslot[1], k->pembed,
                  k->lpembed,   k->gout[0],   k->gout[1],   k->pchunk[0], k->pchunk[1],
                  k->lpchunk[0], k->lpchunk[1]};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (bufs[i]) be->ops->free(be->ctx, bufs[i]);
  zt_host_arena_close(k->host);
  if (k->own_hbe) zt_backend_close(&k->hbe);
  free(k->tasks);
  free(k->first_seg);
  free(k->unit_tick);
  free(k->usumsq);
  free(k->submitted);
  free(k->began);
  free(k->gather_tick);
  zt_acts_close(k->view.acts);
  free(k->blob);
  free(k->view.h_tok);
  free(k->view.h_tgt);
  free(k->h_xchg);
  free(k->segs);
}

/* ---- the flat layout <-> the rank's buffers ----------------------------------------------- */

/* Where rank k keeps unit u's parameters of its chunk sh (stage 3: the shard; else the padded
 * copy) */
static size_t param_at(const dp_rank_state *k, const zt_shard *sh) {
  return k->s->dc.zero_stage == 3 ? sh->packed_off : sh->padded_off;
}

static size_t grad_at(const dp_rank_state *k, const zt_shard *sh) {
  return k->s->dc.zero_stage == 1 ? sh->padded_off : sh->packed_off;
}

/* optimizer nvme: starts the reads (write 0) or writes of set x's unit, its whole chunk (the
 * padding zero); on a failure waits for those started. The store's message names the file. */
static int nv_io(dp_rank_state *k, nv_set *x, int write) {
  size_t bytes = k->s->tab->chunk[x->unit] * sizeof(float);
  for (int i = 0; i < 3; i++) {
    int ext = k->ext[3 * x->unit + i];
    int rc = write ? zt_nvme_write(k->store, ext, 0, x->buf[i], bytes)
                   : zt_nvme_read(k->store, ext, 0, x->buf[i], bytes);
    if (rc < 0) {
      while (i-- > 0) zt_nvme_wait(k->store, x->req[i]);
      return rc;
    }
    x->req[i] = rc;
  }
  return 0;
}

static int nv_wait(dp_rank_state *k, nv_set *x) {
  int rc = 0;
  for (int i = 0; i < 3; i++) {
    int r = zt_nvme_wait(k->store, x->req[i]);
    if (r < 0 && rc == 0) rc = r;
  }
  return rc;
}

/* The message of a failed NVMe call (the store's names the file). */
static void nv_why(const dp_rank_state *k, int rc, char *why, size_t len) {
  const char *e = zt_nvme_store_error(k->store);
  snprintf(why, len, "optimizer nvme: %s", e[0] ? e : strerror(-rc));
}

static int nv_fail(dp_rank_state *k, int rc) {
  char why[400];
  nv_why(k, rc, why, sizeof why);
  return rank_fail(k, rc, "%s", why);
}

/* Set 0's unit read or written in full, synchronously (the state calls, between steps). */
static int nv_sync_io(dp_rank_state *k, int u, int write) {
  nv_set *x = &k->sets[0];
  x->unit = u;
  int rc = nv_io(k, x, write);
  if (rc == 0) rc = nv_wait(k, x);
  x->unit = -1;
  return rc;
}

/* Where a state call finds host unit u's chunk of masters, m and v: the host tier, or for an
 * NVMe unit set 0, read from the unit's files when `fetch`. A negative errno from the store
 * (nv_why). */
static int tier_get(dp_rank_state *k, int u, int fetch, float *x[3]) {
  const dp_state *s = k->s;
  if (!on_nvme(s, u)) {
    size_t at = zt_shard_at(s->tab, u, k->r)->packed_off - s->dev_packed;
    x[0] = k->hm + at;
    x[1] = k->hmom + at;
    x[2] = k->hvar + at;
    return 0;
  }
  for (int i = 0; i < 3; i++) x[i] = k->sets[0].buf[i];
  return fetch ? nv_sync_io(k, u, 0) : 0;
}

/* A state call wrote host unit u's whole chunk (its padding zero) into tier_get's x: an NVMe
 * unit's goes to its files, and with params host to the host's parameters; the host's compute
 * copy follows the masters where the host keeps them. */
static int tier_put(dp_rank_state *k, int u, float *x[3]) {
  const dp_state *s = k->s;
  size_t at = zt_shard_at(s->tab, u, k->r)->packed_off - s->dev_packed, c = s->tab->chunk[u];
  int nv = on_nvme(s, u);
  if (nv) {
    int rc = nv_sync_io(k, u, 1);
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
    const zt_shard *sh = zt_shard_at(s->tab, u, k->r);
    size_t at[3] = {param_at(k, sh), sh->packed_off, sh->packed_off};
    float *hx[3];
    int rc;
    if (on_host(s, u) && sh->count && (s->out[0] || s->out[1] || s->out[2]) &&
        (rc = tier_get(k, u, 1, hx)) < 0)
      return nv_fail(k, rc);
    for (int i = 0; i < 3; i++) {
      if (!s->out[i] || !sh->count) continue;
      float *dst = s->out[i] + (sh->flat_off - base);
      if (on_host(s, u))
        memcpy(dst, hx[i], sh->count * sizeof(float));
      else
        be->ops->to_host(be->ctx, dst, src[i] + at[i], sh->count * sizeof(float));
    }
  }
  int rc = be->ops->sync(be->ctx);
  return rc < 0 ? rank_fail(k, rc, "backend %s: %s", be->ops->name,
                            be->ops->error_text(be->ctx))
                : 0;
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
    const zt_shard *sh = zt_shard_at(s->tab, u, k->r);
    size_t c = s->tab->chunk[u];
    /* the device's parameters of the unit: stages 1-2 the unit padded, 3 the rank's chunk
     * (none for a host unit with params host) */
    size_t at = stage < 3 ? s->tab->padded_unit[u] : sh->packed_off;
    size_t pn = stage < 3 ? c * (size_t)s->dc.world : c;
    int on_dev = stage < 3 || !on_host(s, u) || !s->params_host;
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
    if (on_host(s, u)) {
      float *x[3];
      int rc;
      tier_get(k, u, 0, x);
      for (int i = 0; i < 3; i++) {
        if (s->in[i] && sh->count)
          memcpy(x[i], s->in[i] + (sh->flat_off - base), sh->count * sizeof(float));
        else if (on_nvme(s, u))
          memset(x[i], 0, sh->count * sizeof(float));
        if (on_nvme(s, u)) memset(x[i] + sh->count, 0, (c - sh->count) * sizeof(float));
      }
      if ((rc = tier_put(k, u, x)) < 0) return nv_fail(k, rc);
    } else if (sh->count && s->in[1]) {
      be->ops->to_device(be->ctx, k->m + sh->packed_off, s->in[1] + (sh->flat_off - base),
                         sh->count * sizeof(float));
      be->ops->to_device(be->ctx, k->v + sh->packed_off, s->in[2] + (sh->flat_off - base),
                         sh->count * sizeof(float));
    }
  }
  int rc = be->ops->sync(be->ctx);
  return rc < 0 ? rank_fail(k, rc, "backend %s: %s", be->ops->name,
                            be->ops->error_text(be->ctx))
                : 0;
}

/* ---- the step (on every rank's thread at once) -------------------------------------------- */

static void *lp_of(const dp_rank_state *k, void *base, size_t elem) {
  return (char *)base + elem * zt_dtype_size(k->view.tc.precision);
}

static int copy_fail(dp_rank_state *k, int rc, const char *what) {
  return rank_fail(k, rc < 0 ? rc : -EIO, "copy engine: %s failed (%s)", what,
                   strerror(rc < 0 ? -rc : EIO));
}

/* ---- the communicator's queue: collectives that overlap the compute ------------------------ */
/* The device units' collectives of a step run on the queue (comm.h), each after the compute
 * that produced its input (q_begin) and before the compute that reads its output or reuses its
 * buffer (q_wait on its ticket). The host units' run on the compute stream as before: their
 * copies to and from the host are ordered after the compute, not after the queue. */
static void *q_stream(const dp_rank_state *k) { return k->comm.ops->queue(k->comm.ctx); }

/* The queue's next collectives start after the compute queued so far. */
static int q_begin(dp_rank_state *k) {
  int rc = k->comm.ops->queue_after(k->comm.ctx, k->stream);
  return rc < 0 ? comm_fail(k, rc, "ordering a collective after the compute") : 0;
}

/* A ticket for the collectives queued so far (>= 1), or the failure. */
static long long q_mark(dp_rank_state *k) {
  long long t = k->comm.ops->queue_mark(k->comm.ctx);
  return t < 0 ? comm_fail(k, (int)t, "marking the collectives queued") : t;
}

/* The compute queued next waits for ticket t (0: nothing to wait for). */
static int q_wait(dp_rank_state *k, long long t) {
  if (t <= k->q_waited) return 0;
  int rc = k->comm.ops->stream_wait(k->comm.ctx, k->stream, t);
  if (rc < 0) return comm_fail(k, rc, "ordering the compute after a collective");
  k->q_waited = t;
  return 0;
}

/* The compute queued next waits for every collective queued so far. */
static int q_wait_all(dp_rank_state *k) {
  long long t = q_mark(k);
  return t < 0 ? (int)t : q_wait(k, t);
}

/* params host: the copy of host unit u's chunk (fp32 and the compute copy) into chunk buffer
 * u & 1, ordered after the compute queued so far (the gather that last read it). */
static int stage_chunk(dp_rank_state *k, int u) {
  const dp_state *s = k->s;
  const zt_shard *sh = zt_shard_at(s->tab, u, k->r);
  size_t c = s->tab->chunk[u], at = host_at(s, sh);
  int b = u & 1;
  int64_t t = k->copy->ops->h2d(k->copy, k->pchunk[b], k->hm + at, c * sizeof(float));
  if (t > 0 && k->hlp)
    t = k->copy->ops->h2d(k->copy, k->lpchunk[b], k->hlp + at, c * sizeof(uint16_t));
  if (t < 0) return copy_fail(k, (int)t, "copying a parameter chunk to the device");
  k->chunk_unit[b] = u;
  k->chunk_tick[b] = k->h2d_last = t;
  return 0;
}

/* ---- params nvme: the NVMe units' chunks read from their master files before each gather ---
 * The step reads a file while no write of it is in flight: the update of a unit begins after
 * its last gather of the step (the backward walks down, the updates follow it), and the last
 * step's write-behind was waited for when its sets were retired (nv_finish), before this step
 * began; a state call that writes the files runs between steps. */

static int nvp_fail(dp_rank_state *k, int rc) {
  const char *e = zt_nvme_store_error(k->store);
  return rank_fail(k, rc, "params nvme: %s", e[0] ? e : strerror(-rc));
}

/* Staging b's read waited for, if one is; a failed one leaves it holding nothing. */
static int nvp_settle(dp_rank_state *k, int b) {
  if (k->pstage_req[b] < 0) return 0;
  int rc = zt_nvme_wait(k->store, k->pstage_req[b]);
  k->pstage_req[b] = -1;
  if (rc < 0) {
    k->pstage_unit[b] = -1;
    return nvp_fail(k, rc);
  }
  return 0;
}

/* Starts reading NVMe unit u's chunk from its master file into staging u & 1 unless it is
 * there or coming, once the copy that last read the staging has landed. */
static int nvp_read(dp_rank_state *k, int u) {
  int b = u & 1, rc;
  if (k->pstage_unit[b] == u) return 0;
  if ((rc = nvp_settle(k, b)) < 0) return rc;
  if (k->pstage_tick[b] &&
      (rc = k->copy->ops->wait(k->copy, ZT_COPY_H2D, k->pstage_tick[b])) < 0)
    return copy_fail(k, rc, "copying a parameter chunk to the device");
  k->pstage_tick[b] = 0;
  k->pstage_unit[b] = -1;
  size_t bytes = k->s->tab->chunk[u] * sizeof(float);
  if ((rc = zt_nvme_read(k->store, k->ext[3 * u], 0, k->pstage[b], bytes)) < 0)
    return nvp_fail(k, rc);
  k->pstage_unit[b] = u;
  k->pstage_req[b] = rc;
  return 0;
}

/* NVMe unit u's chunk into chunk buffer u & 1: its read (started ahead, normally) waited for,
 * then the copy, ordered after the compute queued so far (the gather that last read the
 * buffer). */
static int nvp_stage(dp_rank_state *k, int u) {
  int b = u & 1, rc;
  if ((rc = nvp_read(k, u)) < 0 || (rc = nvp_settle(k, b)) < 0) return rc;
  int64_t t = k->copy->ops->h2d(k->copy, k->pchunk[b], k->pstage[b],
                                k->s->tab->chunk[u] * sizeof(float));
  if (t < 0) return copy_fail(k, (int)t, "copying a parameter chunk to the device");
  k->chunk_unit[b] = u;
  k->chunk_tick[b] = k->pstage_tick[b] = t;
  return 0;
}

/* The reads still in flight waited for (only a failed step leaves any, and its error is the
 * step's); the stagings hold nothing the next step may use (the update rewrites the files). */
static void nvp_finish(dp_rank_state *k) {
  for (int b = 0; b < 2; b++) {
    if (k->pstage_req[b] >= 0) zt_nvme_wait(k->store, k->pstage_req[b]);
    k->pstage_req[b] = k->pstage_unit[b] = -1;
  }
}

/* Whether the walk is still to gather host unit v from a chunk buffer: no slot (nor the
 * embedding's) holds it. */
static int walk_gathers(const dp_rank_state *k, int v) {
  const dp_state *s = k->s;
  if (v < 0 || v >= s->nu || !on_host(s, v)) return 0;
  return s->tied && v == 0 ? !k->embed_gathered : k->slot_unit[v & 1] != v;
}

/* params nvme: unit v's file read ahead of its staging, where the walk is to gather it from
 * NVMe and no chunk buffer holds it. */
static int nvp_ahead(dp_rank_state *k, int v) {
  if (!walk_gathers(k, v) || !on_nvme(k->s, v) || k->chunk_unit[v & 1] == v) return 0;
  return nvp_read(k, v);
}

/* A host unit's chunk into chunk buffer u & 1, from the host tier or its file. */
static int stage_unit(dp_rank_state *k, int u) {
  return k->s->params_nvme && on_nvme(k->s, u) ? nvp_stage(k, u) : stage_chunk(k, u);
}

/* Stage 3: unit u's parameters gathered into p (and the compute copy into lp), *tick the
 * compute's wait for them. A device unit's gather runs on the queue after the compute queued
 * so far (the slot's last reader). A host unit's chunk comes from its chunk buffer, gathered on
 * the compute stream, and the next unit of the walk's is copied behind it; with params nvme
 * the file of the unit after that is read meanwhile (and the next one's, after a device unit),
 * so that each read and each copy overlap the compute of a unit before theirs. */
static int gather_unit(dp_rank_state *k, int u, float *p, void *lp, long long *tick) {
  const dp_state *s = k->s;
  const zt_backend *be = &k->view.be;
  const zt_shard *sh = zt_shard_at(s->tab, u, k->r);
  size_t c = s->tab->chunk[u];
  zt_dtype dt = k->view.tc.precision;
  const zt_comm_ops *co = k->comm.ops;
  const float *src = k->params + sh->packed_off;
  const void *lsrc = k->params_lp ? lp_of(k, k->params_lp, sh->packed_off) : NULL;
  int host = s->params_host && on_host(s, u), rc;
  if (host) {
    int b = u & 1;
    if (k->chunk_unit[b] != u && (rc = stage_unit(k, u)) < 0) return rc;
    if ((rc = k->copy->ops->compute_wait(k->copy, ZT_COPY_H2D, k->chunk_tick[b])) < 0)
      return copy_fail(k, rc, "ordering a gather after its chunk's copy");
    src = k->pchunk[b];
    lsrc = k->lpchunk[b];
    /* a file holds the fp32 masters alone: the compute copy is their cast, as AdamW writes it,
     * made here where the gather waits for the copy anyway */
    if (lp && s->params_nvme && on_nvme(s, u))
      be->ops->cast(be->ctx, k->lpchunk[b], dt, k->pchunk[b], ZT_F32, c);
  } else if ((rc = q_begin(k)) < 0) {
    return rc;
  }
  void *on = host ? k->stream : q_stream(k);
  rc = co->all_gather(k->comm.ctx, src, p, c * sizeof(float), on);
  if (rc == 0 && lp) rc = co->all_gather(k->comm.ctx, lsrc, lp, c * zt_dtype_size(dt), on);
  if (rc < 0) return comm_fail(k, rc, "gathering parameters");
  *tick = 0;
  if (!host && (*tick = q_mark(k)) < 0) return (int)*tick;
  int next = u + k->dir;
  if (host && walk_gathers(k, next) && k->chunk_unit[next & 1] != next &&
      (rc = stage_unit(k, next)) < 0)
    return rc;
  for (int i = 1; s->params_nvme && i <= 2; i++)
    if ((rc = nvp_ahead(k, u + i * k->dir)) < 0) return rc;
  return 0;
}

/* Unit u's parameters (fp32 and the compute copy; in fp32 the same) for its forward or
 * backward; stage 3 gathers them unless a slot holds them. With `use` the compute queued next
 * reads them: it waits for their gather (stages 1-2: the last step's, of the updated
 * parameters). */
static int unit_params(dp_rank_state *k, int u, int use, const float **p, const void **lp) {
  const dp_state *s = k->s;
  if (s->dc.zero_stage < 3) {
    size_t at = s->tab->padded_unit[u];
    *p = k->params + at;
    *lp = k->params_lp ? lp_of(k, k->params_lp, at) : (const void *)*p;
    return use ? q_wait(k, k->gather_tick[u]) : 0;
  }
  float *fp;
  void *l;
  long long *tick;
  if (s->tied && u == 0) {
    fp = k->pembed;
    l = k->lpembed;
    tick = &k->embed_tick;
    if (!k->embed_gathered) {
      int rc = gather_unit(k, u, fp, l, tick);
      if (rc < 0) return rc;
      k->embed_gathered = 1;
    }
  } else {
    int slot = u & 1;
    fp = k->pslot[slot];
    l = k->lpslot[slot];
    tick = &k->slot_tick[slot];
    if (k->slot_unit[slot] != u) {
      k->slot_unit[slot] = -1;
      int rc = gather_unit(k, u, fp, l, tick);
      if (rc < 0) return rc;
      k->slot_unit[slot] = u;
    }
  }
  *p = fp;
  *lp = l ? (const void *)l : (const void *)fp;
  return use ? q_wait(k, *tick) : 0;
}

/* Stage 3: the next unit's gather issued before this one computes. */
static int prefetch(dp_rank_state *k, int u) {
  const float *p;
  const void *lp;
  if (k->s->dc.zero_stage < 3 || u < 0 || u >= k->s->nu) return 0;
  return unit_params(k, u, 0, &p, &lp);
}

/* The gradient buffer unit u's backward adds into. */
static float *unit_grads(dp_rank_state *k, int u) {
  const dp_state *s = k->s;
  if (s->dc.zero_stage == 1) return k->grads + s->tab->padded_unit[u];
  return s->tied && u == 0 ? k->gembed : k->gunit[u & 1];
}

/* A host unit's reduced chunk at dev goes to the host tier behind the collective: the first
 * micro-batch's into the gradients, a later one's into the staging (added after the
 * micro-batch). */
static int grads_to_host(dp_rank_state *k, int u, int j, const float *dev) {
  const dp_state *s = k->s;
  float *h = (j == 0 ? k->hgrad : k->hstage) + host_at(s, zt_shard_at(s->tab, u, k->r));
  int64_t t = k->copy->ops->d2h(k->copy, h, dev, s->tab->chunk[u] * sizeof(float));
  if (t < 0) return copy_fail(k, (int)t, "copying gradients to the host");
  k->unit_tick[u] = t;
  return 0;
}

/* Starts host unit u's AdamW on the pool (its calls in k->tasks): on the host tier, or for an
 * NVMe unit on its set (read). */
static int submit_adam(dp_rank_state *k, int u, float scale) {
  const dp_state *s = k->s;
  const zt_train_cfg *c = &k->view.tc;
  size_t base = host_at(s, zt_shard_at(s->tab, u, k->r));
  const nv_set *x = &k->sets[u & 1];
  int nv = on_nvme(s, u);
  /* the state's chunk, and where the chunk's element 0 is */
  float *p = nv ? x->buf[0] : k->hm + base, *mo = nv ? x->buf[1] : k->hmom + base;
  float *va = nv ? x->buf[2] : k->hvar + base;
  uint16_t *lp = nv ? x->lp : k->hlp ? k->hlp + base : NULL;
  for (int i = k->first_seg[u]; i < k->first_seg[u + 1]; i++) {
    const adam_seg *g = &k->segs[i];
    size_t at = g->off;
    zt_cpu_adam_task *task = &k->tasks[i];
    *task = (zt_cpu_adam_task){
        .p = p + at, .g = k->hgrad + base + at, .m = mo + at, .v = va + at,
        .p_bf16 = lp && c->precision == ZT_BF16 ? lp + at : NULL,
        .p_fp16 = lp && c->precision == ZT_F16 ? lp + at : NULL, .n = g->n,
        .isa = ZT_CPU_ISA_AUTO,
        .h = {.lr = s->lr, .beta1 = c->beta1, .beta2 = c->beta2, .eps = c->eps,
              .weight_decay = g->decay ? c->weight_decay : 0.0f, .step = s->adam_step,
              .grad_scale = scale}};
    int rc = zt_cpu_adam_submit(s->pool, task);
    if (rc < 0) {
      while (--i >= k->first_seg[u]) zt_cpu_adam_wait(s->pool, &k->tasks[i]);
      return rank_fail(k, rc, "the host AdamW: %s", strerror(-rc));
    }
  }
  k->submitted[u] = 1;
  return 0;
}

static void wait_adam(dp_rank_state *k, int u) {
  if (!k->submitted[u]) return;
  for (int i = k->first_seg[u]; i < k->first_seg[u + 1]; i++)
    zt_cpu_adam_wait(k->s->pool, &k->tasks[i]);
  k->submitted[u] = 0;
}

/* optimizer nvme: set x's updated chunk where the step reads it: with params nvme in the
 * master file written behind (nothing more to do), with params host into the host's parameters
 * (the copies staged from them so far landed first), else onto the device on the copy engine,
 * which orders it after the compute queued so far (the backward of the unit may still read the
 * old parameters). */
static int nv_upload(dp_rank_state *k, const nv_set *x) {
  const dp_state *s = k->s;
  const zt_shard *sh = zt_shard_at(s->tab, x->unit, k->r);
  size_t c = s->tab->chunk[x->unit], at = host_at(s, sh), dev = param_at(k, sh);
  int rc;
  if (s->params_nvme) return 0;
  if (s->params_host) {
    if (k->h2d_last && (rc = k->copy->ops->wait(k->copy, ZT_COPY_H2D, k->h2d_last)) < 0)
      return copy_fail(k, rc, "copying a parameter chunk to the device");
    memcpy(k->hm + at, x->buf[0], c * sizeof(float));
    if (x->lp) memcpy(k->hlp + at, x->lp, c * sizeof(uint16_t));
    return 0;
  }
  int64_t t = k->copy->ops->h2d(k->copy, k->params + dev, x->buf[0], c * sizeof(float));
  if (t > 0 && x->lp)
    t = k->copy->ops->h2d(k->copy, lp_of(k, k->params_lp, dev), x->lp,
                          c * zt_dtype_size(k->view.tc.precision));
  if (t < 0) return copy_fail(k, (int)t, "copying updated parameters to the device");
  k->up_tick = t;
  return 0;
}

/* Back to FREE: a read landed; an update waited for, its chunk uploaded and written behind;
 * a write (and the upload, which reads the set too) landed before the set is used again. */
static int nv_retire(dp_rank_state *k, nv_set *x) {
  int rc = 0;
  if (x->st == NV_READING && (rc = nv_wait(k, x)) < 0) rc = nv_fail(k, rc);
  if (x->st == NV_UPDATING) {
    wait_adam(k, x->unit);
    if ((rc = nv_upload(k, x)) == 0) {
      if ((rc = nv_io(k, x, 1)) < 0)
        rc = nv_fail(k, rc);
      else
        x->st = NV_WRITING;
    }
  }
  if (x->st == NV_WRITING) {
    if ((rc = nv_wait(k, x)) < 0) rc = nv_fail(k, rc);
    int r = k->up_tick ? k->copy->ops->wait(k->copy, ZT_COPY_H2D, k->up_tick) : 0;
    if (r < 0 && rc == 0) rc = copy_fail(k, r, "copying updated parameters to the device");
  }
  x->st = NV_FREE;
  x->unit = -1;
  return rc;
}

/* Starts reading host unit u's state into its set, unless it is there or coming. */
static int nv_read(dp_rank_state *k, int u) {
  nv_set *x = &k->sets[u & 1];
  if (x->unit == u) return 0;
  int rc = nv_retire(k, x);
  if (rc < 0) return rc;
  x->unit = u;
  if ((rc = nv_io(k, x, 0)) < 0) {
    x->unit = -1;
    return nv_fail(k, rc);
  }
  x->st = NV_READING;
  return 0;
}

/* Host unit u's AdamW from its set once read (the compute copy cast from the masters first,
 * so that the chunk's padding is as the host tier keeps it), then the state of the unit below
 * read ahead: that retires the set of the unit above (its update waited for, uploaded and
 * written behind) while the pool updates this one. */
static int nv_update(dp_rank_state *k, int u, float scale) {
  nv_set *x = &k->sets[u & 1];
  int rc = nv_read(k, u);
  if (rc == 0 && x->st == NV_READING && (rc = nv_wait(k, x)) < 0) rc = nv_fail(k, rc);
  if (rc == 0 && x->lp)
    k->hbe.ops->cast(k->hbe.ctx, x->lp, k->view.tc.precision, x->buf[0], ZT_F32,
                     k->s->tab->chunk[u]);
  if (rc == 0) {
    x->st = NV_UPDATING;
    rc = submit_adam(k, u, scale);
  }
  if (rc < 0) {
    x->st = NV_FREE;
    x->unit = -1;
    return rc;
  }
  return u - 1 >= k->s->nv0 ? nv_read(k, u - 1) : 0;
}

/* Every set retired, the higher unit's first; the first failure's message is kept. */
static int nv_finish(dp_rank_state *k) {
  int hi = k->sets[1].unit > k->sets[0].unit, rc = 0;
  for (int i = 0; i < 2; i++) {
    char keep[sizeof k->err];
    if (rc < 0) memcpy(keep, k->err, sizeof keep);
    int r = nv_retire(k, &k->sets[i ? !hi : hi]);
    if (rc < 0)
      memcpy(k->err, keep, sizeof keep);
    else
      rc = r;
  }
  return rc;
}

/* Host unit u's AdamW, from the host tier or its files. */
static int update_host_unit(dp_rank_state *k, int u, float scale) {
  k->began[u] = 1;
  return on_nvme(k->s, u) ? nv_update(k, u, scale) : submit_adam(k, u, scale);
}

/* Host unit u's gradients of micro-batch j have landed (waited for): a later micro-batch's are
 * added to the running sum as the device adds its units'; after the last one its sum of squares
 * is taken and, when the update may overlap the backward (no clipping: no norm needed first),
 * its AdamW starts unless a gradient of this rank was not finite. */
static int take_up_unit(dp_rank_state *k, int u, int j) {
  const dp_state *s = k->s;
  const zt_shard *sh = zt_shard_at(s->tab, u, k->r);
  size_t at = host_at(s, sh), c = s->tab->chunk[u];
  int rc = k->copy->ops->wait(k->copy, ZT_COPY_D2H, k->unit_tick[u]);
  if (rc < 0) return copy_fail(k, rc, "copying gradients to the host");
  if (j > 0 && s->dc.zero_stage >= 2)
    k->hbe.ops->add(k->hbe.ctx, k->hgrad + at, k->hgrad + at, k->hstage + at, c);
  if (j < k->view.tc.grad_accum - 1) return 0;
  int nf = 0;
  k->usumsq[u] = sh->count ? k->hbe.ops->sum_squares(k->hbe.ctx, k->hgrad + at, sh->count, &nf)
                           : 0.0;
  k->nonfinite |= nf;
  /* clipping needs the norm first, fp16 the world's overflow verdict */
  if (k->view.tc.grad_clip > 0 || k->view.tc.precision == ZT_F16 || k->nonfinite) return 0;
  if ((rc = update_host_unit(k, u, 1.0f)) == 0) k->updated++;
  return rc;
}

/* Takes up the host units the backward of micro-batch j has copied, down to unit `to`. */
static int take_up_to(dp_rank_state *k, int to, int j) {
  const dp_state *s = k->s;
  if (s->dc.zero_stage == 1 && j < k->view.tc.grad_accum - 1) return 0; /* nothing copied */
  for (; k->take_up >= to && k->take_up >= s->ng; k->take_up--) {
    int rc = take_up_unit(k, k->take_up, j);
    if (rc < 0) return rc;
  }
  return 0;
}

/* Stages 2-3: the reduced chunk of a later micro-batch, waiting in gscratch, added to its
 * unit's shard once its reduction is done (before gscratch is reduced into again). */
static int flush_add(dp_rank_state *k) {
  const zt_backend *be = &k->view.be;
  int u = k->add_unit, rc;
  if (u < 0) return 0;
  k->add_unit = -1;
  if ((rc = q_wait(k, k->add_tick)) < 0) return rc;
  float *shard = k->grads + zt_shard_at(k->s->tab, u, k->r)->packed_off;
  be->ops->add(be->ctx, shard, shard, k->gscratch, k->s->tab->chunk[u]);
  return 0;
}

/* Unit u's gradients of micro-batch j are done: stage 1 all-reduces them after the last
 * micro-batch; stages 2-3 reduce-scatter them into the shard (the first micro-batch writes it,
 * later ones add). A device unit's collective runs on the queue while the compute goes on to
 * the next unit; a host unit's reduced chunk goes to the host. */
static int unit_grads_done(dp_rank_state *k, int u, int j) {
  const dp_state *s = k->s;
  const zt_comm_ops *co = k->comm.ops;
  const zt_shard *sh = zt_shard_at(s->tab, u, k->r);
  size_t c = s->tab->chunk[u], W = (size_t)s->dc.world;
  float *g = unit_grads(k, u);
  int rc = 0;
  if (s->dc.zero_stage == 1) {
    if (j < k->view.tc.grad_accum - 1) return 0;
    if (on_host(s, u)) {
      if ((rc = co->all_reduce(k->comm.ctx, g, g, c * W, k->stream)) < 0)
        return comm_fail(k, rc, "reducing gradients");
      return grads_to_host(k, u, 0, k->grads + sh->padded_off);
    }
    if ((rc = q_begin(k)) < 0) return rc;
    if ((rc = co->all_reduce(k->comm.ctx, g, g, c * W, q_stream(k))) < 0)
      return comm_fail(k, rc, "reducing gradients");
    return 0;
  }
  long long *tick = g == k->gembed ? &k->gembed_tick : &k->gunit_tick[u & 1];
  if ((rc = flush_add(k)) < 0) return rc;
  if (on_host(s, u)) {
    *tick = 0; /* on the compute stream */
    /* the chunk buffer's last copy out is done before the collective rewrites it */
    int b = u & 1;
    if (k->gout_tick[b] &&
        (rc = k->copy->ops->compute_wait(k->copy, ZT_COPY_D2H, k->gout_tick[b])) < 0)
      return copy_fail(k, rc, "ordering a reduction after a copy");
    if ((rc = co->reduce_scatter(k->comm.ctx, g, k->gout[b], c, k->stream)) < 0)
      return comm_fail(k, rc, "reducing gradients");
    if ((rc = grads_to_host(k, u, j, k->gout[b])) < 0) return rc;
    k->gout_tick[b] = k->unit_tick[u];
    return 0;
  }
  if ((rc = q_begin(k)) < 0) return rc;
  rc = co->reduce_scatter(k->comm.ctx, g, j == 0 ? k->grads + sh->packed_off : k->gscratch, c,
                          q_stream(k));
  if (rc < 0) return comm_fail(k, rc, "reducing gradients");
  if ((*tick = q_mark(k)) < 0) return (int)*tick;
  if (j > 0) {
    k->add_unit = u;
    k->add_tick = *tick;
  }
  return 0;
}

/* Micro-batch j of this rank: forward, loss, backward, the gradients reduced unit by unit. The
 * collectives run whether the micro-batch counted or not. */
static int rank_micro(dp_rank_state *k, int j, double *rec) {
  const dp_state *s = k->s;
  const zt_model *m = k->view.model;
  const zt_model_cfg *mc = zt_model_cfg_of(m);
  const zt_backend *be = &k->view.be;
  zt_acts *a = k->view.acts;
  int G = k->view.tc.grad_accum, W = s->dc.world, stage = s->dc.zero_stage;
  int N = k->view.tc.micro_batch * mc->seq_len;
  zt_dtype dt = k->view.tc.precision;
  int counted = zt__trainer_stage_micro(&k->view, s->tokens, k->r * G + j);
  const float *p, *e = NULL;
  const void *lp, *elp = NULL;
  int rc;
  k->dir = 1;
  for (int u = 0; u < s->nu; u++) {
    if ((rc = unit_params(k, u, 1, &p, &lp)) < 0 || (rc = prefetch(k, u + 1)) < 0) return rc;
    if (u == 0 && s->tied) { /* only the gpt head reads another unit's parameters */
      e = p;
      elp = lp;
    }
    if (counted) zt_model_unit_forward_dt(m, a, u, p, lp, e, elp);
  }
  /* params nvme: the files of the backward's first two gathers (below the units the slots keep)
   * read during the last forwards and the loss */
  for (int v = s->nu - 1, n = 0; s->params_nvme && v >= 0 && n < 2; v--)
    if (walk_gathers(k, v)) {
      if ((rc = nvp_ahead(k, v)) < 0) return rc;
      n++;
    }
  if (counted) {
    double loss_sum = 0;
    int n_counted = 0;
    be->ops->crossentropy_fwd_bwd_dt(be->ctx, dt, zt_acts_logits(a), zt_acts_targets(a), N,
                                     mc->vocab, mc->vocab, -1,
                                     (float)((double)s->loss_scale / ((double)counted * W * G)),
                                     &loss_sum, &n_counted);
    rec[X_MICRO + 2 * j] = loss_sum / n_counted;
    rec[X_MICRO + 2 * j + 1] = 1;
  }
  /* stages 2-3: a gradient buffer is zeroed once the reduction that last read it is done */
  if (stage >= 2 && s->tied) {
    if ((rc = q_wait(k, k->gembed_tick)) < 0) return rc;
    be->ops->zero(be->ctx, k->gembed, s->tab->chunk[0] * (size_t)W * sizeof(float));
  }
  k->dir = -1;
  k->take_up = s->nu - 1;
  for (int u = s->nu - 1; u >= 0; u--) {
    if ((rc = unit_params(k, u, 1, &p, &lp)) < 0 || (rc = prefetch(k, u - 1)) < 0) return rc;
    float *g = unit_grads(k, u);
    if (stage >= 2 && g != k->gembed) {
      if ((rc = q_wait(k, k->gunit_tick[u & 1])) < 0) return rc;
      be->ops->zero(be->ctx, g, s->tab->chunk[u] * (size_t)W * sizeof(float));
    }
    if (counted)
      zt_model_unit_backward_dt(m, a, u, p, lp, g, e, elp, s->tied ? unit_grads(k, 0) : NULL);
    if ((rc = unit_grads_done(k, u, j)) < 0 ||
        (s->host_n && (rc = take_up_to(k, u + TAKE_UP_LAG + 1, j)) < 0))
      return rc;
  }
  if ((rc = flush_add(k)) < 0) return rc;
  return s->host_n ? take_up_to(k, 0, j) : 0;
}

/* The step's scalars from every rank's record, added in rank and micro-batch order (the loss
 * then is the sum a single trainer makes), the OR of the flags, whether any gradient was not
 * finite and whether any rank updated units during the backward. */
static int exchange(dp_rank_state *k, double *rec, int *nonfinite, int *updated) {
  const dp_state *s = k->s;
  const zt_backend *be = &k->view.be;
  size_t R = s->rec, bytes = R * sizeof(double);
  be->ops->to_device(be->ctx, k->xchg + (size_t)k->r * R, rec, bytes);
  int rc = k->comm.ops->all_gather(k->comm.ctx, k->xchg + (size_t)k->r * R, k->xchg, bytes,
                                   k->stream);
  if (rc < 0) return comm_fail(k, rc, "exchanging the loss and the norm");
  be->ops->to_host(be->ctx, k->h_xchg, k->xchg, (size_t)s->dc.world * bytes);
  if ((rc = be->ops->sync(be->ctx)) < 0)
    return rank_fail(k, rc, "backend %s: %s", be->ops->name, be->ops->error_text(be->ctx));
  double sumsq = 0, loss = 0;
  int micros = 0;
  *nonfinite = *updated = 0;
  k->flags = 0;
  for (int r = 0; r < s->dc.world; r++) {
    const double *x = k->h_xchg + (size_t)r * R;
    sumsq += x[X_SUMSQ];
    *nonfinite |= x[X_NONFINITE] != 0;
    *updated |= x[X_UPDATED] != 0;
    k->flags |= (unsigned)x[X_FLAGS];
    for (int j = 0; j < k->view.tc.grad_accum; j++)
      if (x[X_MICRO + 2 * j + 1] != 0) {
        loss += x[X_MICRO + 2 * j];
        micros++;
      }
  }
  k->loss = micros ? loss / micros : 0.0;
  /* of the unscaled gradients: the fp16 loss scale is a power of two */
  k->norm = sqrt(sumsq) / s->loss_scale;
  return 0;
}

/* Host unit u's updated chunk to the device's parameters (unless params host: it is copied
 * before each gather), ordered before its all-gather on the stream. */
static void upload_unit(dp_rank_state *k, int u) {
  const dp_state *s = k->s;
  const zt_backend *be = &k->view.be;
  if (s->params_host) return;
  const zt_shard *sh = zt_shard_at(s->tab, u, k->r);
  size_t c = s->tab->chunk[u], at = host_at(s, sh), dev = param_at(k, sh);
  be->ops->to_device(be->ctx, k->params + dev, k->hm + at, c * sizeof(float));
  if (k->hlp)
    be->ops->to_device(be->ctx, lp_of(k, k->params_lp, dev), k->hlp + at,
                       c * zt_dtype_size(k->view.tc.precision));
}

/* Stages 1-2: every rank gets unit u's updated parameters back. A device unit's gather runs
 * on the queue after its update, and the next step's compute waits for it only where it reads
 * the unit (unit_params); a host unit's on the compute stream, after its upload. */
static int gather_updated(dp_rank_state *k, int u) {
  const dp_state *s = k->s;
  const zt_shard *sh = zt_shard_at(s->tab, u, k->r);
  size_t at = s->tab->padded_unit[u], c = s->tab->chunk[u];
  int dev = !on_host(s, u), rc = dev ? q_begin(k) : 0;
  void *on = dev ? q_stream(k) : k->stream;
  if (rc < 0) return rc;
  rc = k->comm.ops->all_gather(k->comm.ctx, k->params + sh->padded_off, k->params + at,
                               c * sizeof(float), on);
  if (rc == 0 && k->params_lp)
    rc = k->comm.ops->all_gather(k->comm.ctx, lp_of(k, k->params_lp, sh->padded_off),
                                 lp_of(k, k->params_lp, at),
                                 c * zt_dtype_size(k->view.tc.precision), on);
  if (rc < 0) return comm_fail(k, rc, "gathering the updated parameters");
  k->gather_tick[u] = 0;
  if (dev && (k->gather_tick[u] = q_mark(k)) < 0) return (int)k->gather_tick[u];
  return 0;
}

static int step_body(dp_rank_state *k) {
  const dp_state *s = k->s;
  const zt_train_cfg *c = &k->view.tc;
  const zt_backend *be = &k->view.be;
  const zt_ops *o = be->ops;
  int stage = s->dc.zero_stage, rc;
  double *rec = k->h_xchg + (size_t)k->r * s->rec;
  memset(rec, 0, s->rec * sizeof *rec);
  rec[X_FLAGS] = s->flags; /* every rank of the part: an OR does not count them twice */
  /* the parameters changed since the last step */
  k->slot_unit[0] = k->slot_unit[1] = -1;
  k->chunk_unit[0] = k->chunk_unit[1] = -1;
  k->embed_gathered = 0;
  k->add_unit = -1;
  if (stage == 1) o->zero(be->ctx, k->grads, s->tab->padded_total * sizeof(float));
  k->updated = k->nonfinite = 0;
  if (s->host_n) memset(k->began, 0, (size_t)s->nu);
  for (int j = 0; j < c->grad_accum; j++)
    if ((rc = rank_micro(k, j, rec)) < 0) return rc;
  /* the reductions and gathers on the queue are done before the shards are read */
  if ((rc = q_wait_all(k)) < 0) return rc;
  /* the norm over this rank's real gradient elements, unit by unit wherever they are (a host
   * unit's summed when the backward took it up) */
  for (int u = 0; u < s->nu; u++) {
    const zt_shard *sh = zt_shard_at(s->tab, u, k->r);
    int nf = 0;
    if (!sh->count) continue;
    if (on_host(s, u))
      rec[X_SUMSQ] += k->usumsq[u];
    else
      rec[X_SUMSQ] += o->sum_squares(be->ctx, k->grads + grad_at(k, sh), sh->count, &nf);
    if (nf) rec[X_NONFINITE] = 1;
  }
  if (k->nonfinite) rec[X_NONFINITE] = 1;
  rec[X_UPDATED] = k->updated;
  /* optimizer nvme, the updates after the exchange: the first one's state read meanwhile */
  if (s->nvme && !k->began[s->nu - 1] && (rc = nv_read(k, s->nu - 1)) < 0) return rc;
  int nonfinite = 0, updated = 0;
  if ((rc = exchange(k, rec, &nonfinite, &updated)) < 0) return rc;
  k->skipped = 0;
  if (nonfinite) {
    for (int u = s->ng; u < s->nu; u++) wait_adam(k, u);
    /* fp16: GradScaler skips the update (every rank sees the overflow; none updated) */
    if (c->precision == ZT_F16) {
      k->skipped = 1;
      return 0;
    }
    /* every rank sees it; with no update anywhere nothing changed */
    if (!updated) return -ERANGE;
    return rank_fail(k, -EIO, "the gradient has inf or nan values, and the AdamW overlapping "
                     "the backward had updated units of a rank already (the state is no "
                     "step's): load a checkpoint");
  }
  float scale = 1.0f;
  if (c->grad_clip > 0) {
    double coef = c->grad_clip / (k->norm + 1e-6);
    if (coef < 1.0) scale = (float)coef;
  }
  /* AdamW sees g * scale / loss_scale: the unscaled, clipped gradient */
  if (c->precision == ZT_F16) scale = (float)((double)scale / s->loss_scale);
  /* the host units' updates the backward did not start (all of them with clipping), in its
   * order, on the pool while the device runs its own; the masters they write are no copy's
   * source any more */
  if (k->h2d_last && (rc = k->copy->ops->wait(k->copy, ZT_COPY_H2D, k->h2d_last)) < 0)
    return copy_fail(k, rc, "copying a parameter chunk to the device");
  for (int u = s->nu - 1; u >= s->ng; u--)
    if (!k->began[u] && (rc = update_host_unit(k, u, scale)) < 0) return rc;
  /* the device units' updates; stages 1-2: every rank gets every unit's updated parameters
   * back, each device unit's gathered on the queue while the next one's update runs, then each
   * host unit's once its AdamW is done, uploaded and gathered while the pool updates the next */
  for (int u = 0; u < s->ng; u++) {
    for (int i = k->first_seg[u]; i < k->first_seg[u + 1]; i++) {
      const adam_seg *g = &k->segs[i];
      const zt_shard *sh = zt_shard_at(s->tab, g->unit, k->r);
      size_t pa = param_at(k, sh) + g->off, sa = sh->packed_off + g->off;
      float wd = g->decay ? c->weight_decay : 0.0f;
      if (k->params_lp)
        o->adamw_dt(be->ctx, k->params + pa, k->grads + grad_at(k, sh) + g->off, k->m + sa,
                    k->v + sa, g->n, s->lr, c->beta1, c->beta2, c->eps, wd, s->adam_step,
                    scale, lp_of(k, k->params_lp, pa), c->precision);
      else
        o->adamw(be->ctx, k->params + pa, k->grads + grad_at(k, sh) + g->off, k->m + sa,
                 k->v + sa, g->n, s->lr, c->beta1, c->beta2, c->eps, wd, s->adam_step, scale);
    }
    if (stage < 3 && (rc = gather_updated(k, u)) < 0) break;
  }
  if (s->nvme) {
    /* the sets' chunks were uploaded as each set was retired: the last two now, then the
     * gathers ordered after the uploads */
    if (rc == 0) rc = nv_finish(k);
    if (rc == 0 && k->up_tick &&
        (rc = k->copy->ops->compute_wait(k->copy, ZT_COPY_H2D, k->up_tick)) < 0)
      rc = copy_fail(k, rc, "ordering a gather after its upload");
    for (int u = s->nu - 1; rc == 0 && stage < 3 && u >= s->nv0; u--) rc = gather_updated(k, u);
  }
  /* the host units' (all of them without NVMe), updated last */
  for (int u = s->nv0 - 1; u >= s->ng; u--) {
    wait_adam(k, u);
    if (rc < 0) continue; /* the others are still waited for */
    upload_unit(k, u);
    if (stage < 3) rc = gather_updated(k, u);
  }
  if (rc < 0) return rc;
  if ((rc = o->sync(be->ctx)) < 0)
    return rank_fail(k, rc, "backend %s: %s", o->name, o->error_text(be->ctx));
  return 0;
}

/* The step of rank k; whatever its result, no host AdamW is left running and (optimizer nvme)
 * every set is retired, so that the state calls and close find the host tier at rest. */
static int rank_step(dp_rank_state *k) {
  const dp_state *s = k->s;
  int rc = step_body(k);
  for (int u = s->ng; s->host_n && u < s->nu; u++) wait_adam(k, u);
  if (s->params_nvme) nvp_finish(k);
  if (s->nvme) {
    char keep[sizeof k->err];
    memcpy(keep, k->err, sizeof keep);
    int r = nv_finish(k);
    if (rc < 0)
      memcpy(k->err, keep, sizeof keep);
    else
      rc = r;
  }
  return rc;
}

/* ---- a per-rank checkpoint: each rank's own chunks (all ranks here) ------------------------ */

/* The start of CMD_SHARDS_OUT / _IN: a staging of one chunk of each tensor (for the device
 * units) and the rank's file begun. */
static int shards_begin(dp_rank_state *k, float **buf, char *why, size_t len) {
  const dp_state *s = k->s;
  size_t bytes = 3 * s->tab->max_chunk * sizeof(float);
  *buf = s->ng ? malloc(bytes) : NULL;
  if (s->ng && !*buf) {
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
  return rc < 0 ? rank_fail(k, rc, "%s", why) : 0;
}

static int shards_backend_fail(dp_rank_state *k, int rc, char *why, size_t len) {
  const zt_backend *be = &k->view.be;
  snprintf(why, len, "backend %s: %s", be->ops->name, be->ops->error_text(be->ctx));
  return rc;
}

/* CMD_SHARDS_OUT: the rank's chunks, unit by unit, to its file: a host unit's straight from the
 * host tier, a device unit's through the staging (the rank's stream, on its thread, so a cuda
 * rank reads its own device). */
static int rank_shards_out(dp_rank_state *k) {
  const dp_state *s = k->s;
  const zt_backend *be = &k->view.be;
  size_t mc = s->tab->max_chunk;
  float *buf;
  char why[400] = "";
  int rc = shards_begin(k, &buf, why, sizeof why);
  for (int u = 0; u < s->nu && rc == 0; u++) {
    const zt_shard *sh = zt_shard_at(s->tab, u, k->r);
    if (!sh->count) continue;
    const float *x[3];
    if (on_host(s, u)) {
      float *hx[3];
      if ((rc = tier_get(k, u, 1, hx)) < 0) {
        nv_why(k, rc, why, sizeof why);
        break;
      }
      for (int i = 0; i < 3; i++) x[i] = hx[i];
    } else {
      const float *src[3] = {k->params + param_at(k, sh), k->m + sh->packed_off,
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

/* CMD_SHARDS_IN: the rank's chunks from its file, unit by unit, where it keeps them (as
 * rank_write puts them: a host unit's into the host tier, and its parameters onto the device
 * too unless params host; the compute copies follow). Stages 1-2 hold the other ranks' chunks
 * of the parameters as well: CMD_SHARDS_GATHER brings them once every rank has read its own. */
static int rank_shards_in(dp_rank_state *k) {
  const dp_state *s = k->s;
  const zt_backend *be = &k->view.be;
  zt_dtype dt = k->view.tc.precision;
  size_t mc = s->tab->max_chunk;
  float *buf;
  char why[400] = "";
  int rc = shards_begin(k, &buf, why, sizeof why);
  for (int u = 0; u < s->nu && rc == 0; u++) {
    const zt_shard *sh = zt_shard_at(s->tab, u, k->r);
    if (!sh->count) continue;
    size_t c = s->tab->chunk[u], at = param_at(k, sh);
    int host = on_host(s, u), dev_params = !host || !s->params_host;
    float *x[3];
    if (host)
      tier_get(k, u, 0, x);
    else
      for (int i = 0; i < 3; i++) x[i] = buf + i * mc;
    if ((rc = s->io->get(s->io->arg, k->r, u, x[0], x[1], x[2], why, sizeof why)) < 0) break;
    for (int i = 0; host && on_nvme(s, u) && i < 3; i++)
      memset(x[i] + sh->count, 0, (c - sh->count) * sizeof(float));
    if (dev_params)
      be->ops->to_device(be->ctx, k->params + at, x[0], sh->count * sizeof(float));
    if (!host) {
      be->ops->to_device(be->ctx, k->m + sh->packed_off, x[1], sh->count * sizeof(float));
      be->ops->to_device(be->ctx, k->v + sh->packed_off, x[2], sh->count * sizeof(float));
    }
    /* the whole chunk: its padding is zero in both copies */
    if (k->params_lp && dev_params)
      be->ops->cast(be->ctx, lp_of(k, k->params_lp, at), dt, k->params + at, ZT_F32, c);
    if (host && (rc = tier_put(k, u, x)) < 0) {
      nv_why(k, rc, why, sizeof why);
      break;
    }
    /* the staging (or set) is read again for the next unit */
    if ((rc = be->ops->sync(be->ctx)) < 0) rc = shards_backend_fail(k, rc, why, sizeof why);
  }
  return shards_end(k, rc, buf, why, sizeof why);
}

/* CMD_SHARDS_GATHER (stages 1-2): every unit's parameters and compute copy, from every rank's
 * chunk, as after an update. */
static int rank_shards_gather(dp_rank_state *k) {
  const zt_backend *be = &k->view.be;
  int rc = 0;
  for (int u = 0; u < k->s->nu && rc == 0; u++) rc = gather_updated(k, u);
  if (rc < 0) return rc;
  return (rc = be->ops->sync(be->ctx)) < 0 ? backend_fail(k, rc) : 0;
}

/* ---- a part's state: collectives between steps ------------------------------------------- */

/* A gather of units [u0, u1): per unit and tensor, the chunks all-gathered into the scratch
 * (stages 1-2 parameters: every rank's own copy is the unit already), of which rank 0 copies
 * the unit's real elements out (out holds the range). The scratch is the unit's gradient
 * buffer (unit_grads), dead between steps: the step zeroes stage 1's padded gradients at its
 * start and each unit's (and the embedding's) stage 2-3 buffer before the backward writes it,
 * so it never reads what a state call left there. */
static int state_gather(dp_rank_state *k, int mask, int u0, int u1) {
  const dp_state *s = k->s;
  const zt_backend *be = &k->view.be;
  const float *src[3] = {k->params, k->m, k->v};
  size_t base = zt_model_unit(k->view.model, u0)->offset;
  for (int u = u0; u < u1; u++) {
    const zt_unit_info *ui = zt_model_unit(k->view.model, u);
    const zt_shard *sh = zt_shard_at(s->tab, u, k->r);
    size_t c = s->tab->chunk[u];
    float *scratch = unit_grads(k, u), *hx[3];
    /* the host tier's chunks it reads (stages 1-2 take the parameters from the device) */
    int from_host = on_host(s, u) && (mask & (s->dc.zero_stage < 3 ? 6 : 7)), rc;
    if (from_host && (rc = tier_get(k, u, 1, hx)) < 0) return nv_fail(k, rc);
    for (int i = 0; i < 3; i++) {
      if (!(mask & 1 << i)) continue;
      const float *unit = scratch;
      if (i == 0 && s->dc.zero_stage < 3) {
        unit = k->params + s->tab->padded_unit[u];
      } else {
        /* a host unit's chunk goes up first, ordered before the gather on the stream */
        const float *from = i == 0 ? src[0] + param_at(k, sh) : src[i] + sh->packed_off;
        if (on_host(s, u)) {
          be->ops->to_device(be->ctx, k->gout[0], hx[i], c * sizeof(float));
          from = k->gout[0];
        }
        rc = k->comm.ops->all_gather(k->comm.ctx, from, scratch, c * sizeof(float), k->stream);
        if (rc < 0) return comm_fail(k, rc, "gathering the state");
      }
      /* ordered before the next unit's collective overwrites the scratch (one stream) */
      if (k->r == 0 && ui->numel)
        be->ops->to_host(be->ctx, s->out[i] + (ui->offset - base), unit,
                         ui->numel * sizeof(float));
    }
    /* an NVMe unit: the set is read into again for the next unit */
    if (from_host && on_nvme(s, u) && (rc = be->ops->sync(be->ctx)) < 0)
      return backend_fail(k, rc);
  }
  int rc = be->ops->sync(be->ctx);
  return rc < 0 ? backend_fail(k, rc) : 0;
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
    const zt_shard *sh = zt_shard_at(s->tab, u, k->r);
    size_t c = s->tab->chunk[u], padded = c * (size_t)s->dc.world;
    float *scratch = unit_grads(k, u);
    int host = on_host(s, u);
    /* where the rank keeps its chunk of each: the device, the host tier or both (a host unit's
     * parameters are on the device too unless params host) */
    float *dst[3] = {NULL, NULL, NULL}, *hdst[3] = {NULL, NULL, NULL};
    if (!host || (stage == 3 && !s->params_host)) dst[0] = k->params + param_at(k, sh);
    if (!host) {
      dst[1] = k->m + sh->packed_off;
      dst[2] = k->v + sh->packed_off;
    } else {
      tier_get(k, u, 0, hdst);
    }
    for (int i = 0; i < 3; i++) {
      float *unit = i == 0 && stage < 3 ? k->params + s->tab->padded_unit[u] : scratch;
      if (k->r == 0) {
        o->to_device(be->ctx, unit, s->in[i] + (ui->offset - base), ui->numel * sizeof(float));
        if (padded > ui->numel)
          o->zero(be->ctx, unit + ui->numel, (padded - ui->numel) * sizeof(float));
      }
      int rc = k->comm.ops->broadcast(k->comm.ctx, unit, unit, padded * sizeof(float), 0,
                                      k->stream);
      if (rc < 0) return comm_fail(k, rc, "scattering the state");
      if (unit == scratch && dst[i])
        o->cast(be->ctx, dst[i], ZT_F32, scratch + sh->unit_off, ZT_F32, c);
      /* synchronous: the next unit's broadcast rewrites the scratch */
      if (hdst[i]) o->to_host(be->ctx, hdst[i], unit + sh->unit_off, c * sizeof(float));
    }
    size_t at = stage < 3 ? s->tab->padded_unit[u] : param_at(k, sh);
    if (k->params_lp && (stage < 3 || dst[0]))
      o->cast(be->ctx, (char *)k->params_lp + at * zt_dtype_size(k->view.tc.precision),
              k->view.tc.precision, k->params + at, ZT_F32, stage < 3 ? padded : c);
    int rc;
    if (host && (rc = tier_put(k, u, hdst)) < 0) return nv_fail(k, rc);
  }
  int rc = o->sync(be->ctx);
  return rc < 0 ? backend_fail(k, rc) : 0;
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
  size_t cap = (stage1 ? s->tab->padded_total : s->slot_floats) * sizeof(float);
  for (size_t off = 0; off < n; off += cap) {
    size_t m = n - off < cap ? n - off : cap;
    if (k->r == 0) be->ops->to_device(be->ctx, scratch, buf + off, m);
    int rc = k->comm.ops->broadcast(k->comm.ctx, scratch, scratch, m, 0, k->stream);
    if (rc < 0) return comm_fail(k, rc, "broadcasting the checkpoint's directory");
    be->ops->to_host(be->ctx, buf + off, scratch, m);
    if ((rc = be->ops->sync(be->ctx)) < 0) return backend_fail(k, rc);
  }
  return 0;
}

/* Each rank's verdict on its share of a state call (a: its result, b: what goes with it),
 * all-gathered in the exchange buffer: every rank's record r is then at h_xchg + r * rec. */
static int share(dp_rank_state *k, double a, double b, const char *what) {
  const dp_state *s = k->s;
  const zt_backend *be = &k->view.be;
  size_t R = s->rec, bytes = R * sizeof(double);
  double *rec = k->h_xchg + (size_t)k->r * R;
  rec[0] = a;
  rec[1] = b;
  be->ops->to_device(be->ctx, k->xchg + (size_t)k->r * R, rec, bytes);
  int rc = k->comm.ops->all_gather(k->comm.ctx, k->xchg + (size_t)k->r * R, k->xchg, bytes,
                                   k->stream);
  if (rc < 0) return comm_fail(k, rc, what);
  be->ops->to_host(be->ctx, k->h_xchg, k->xchg, (size_t)s->dc.world * bytes);
  rc = be->ops->sync(be->ctx);
  return rc < 0 ? backend_fail(k, rc) : 0;
}

/* ST_PROBE: rank 0's token and directory to every rank, which checks its own view of the
 * directory for the token (a save's marker, a load's manifest: zt__ckpt_probe_sees); the
 * verdicts are exchanged, so every rank of every part learns whether all saw it. */
static int rank_probe(dp_rank_state *k, int save, size_t len) {
  const dp_state *s = k->s;
  if (len < 2 || len > PROBE_MAX)
    return rank_fail(k, -EINVAL, "the part holding rank 0 sent a probe of %zu bytes", len);
  if (!(k->blob = malloc(len))) return rank_fail(k, -ENOMEM, "out of host memory");
  if (k->r == 0) memcpy(k->blob, s->blob, len);
  int rc = bcast_host(k, k->blob, len);
  if (rc < 0) return rc;
  /* the token, NUL, the directory, NUL */
  size_t tl = k->blob[len - 1] == 0 ? strlen(k->blob) : len;
  int sees = tl + 1 < len && zt__ckpt_probe_sees(k->blob + tl + 1, save, k->blob);
  if ((rc = share(k, sees, 0, "exchanging whether every part sees the checkpoint")) < 0)
    return rc;
  k->probe_all = 1;
  for (int r = 0; r < s->dc.world; r++) k->probe_all &= k->h_xchg[(size_t)r * s->rec] != 0;
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
    if (k->h_xchg[(size_t)r * s->rec] < 0) bad = r;
  if (bad < 0) return 0;
  if (rc < 0) return rc;
  if (bad >= s->dc.rank0 && bad < s->dc.rank0 + s->nl)
    return rank_fail(k, -ECANCELED, "rank %d of this part failed %s", bad, doing);
  int frc = (int)k->h_xchg[(size_t)bad * s->rec];
  const char *path = s->io && s->io->path ? s->io->path(s->io->arg, bad) : NULL;
  return rank_fail(k, remote ? remote : frc, "%s%s%s (rank %d, of another part, failed %s; "
                   "that part's error says more)", path ? path : "", path ? ": " : "",
                   strerror(-frc), bad, doing);
}

/* ST_SHARDS_OUT: every rank of every part writes its own file (rank_shards_out), then the ranks
 * exchange their results and their files' sizes (for rank 0's manifest). A rank that failed
 * fails the save on every part, nothing else changed: no failure of the collectives. */
static int part_shards_out(dp_rank_state *k) {
  const dp_state *s = k->s;
  int rc = s->io ? rank_shards_out(k) : rank_fail(k, s->io_rc, "%s", s->io_err);
  double bytes = rc == 0 ? (double)s->io->bytes[k->r] : 0;
  int erc = share(k, rc, bytes, "exchanging the ranks' files of the checkpoint");
  if (erc < 0) return erc;
  rc = part_verdict(k, rc, 0, "to write its file of the checkpoint");
  k->abandoned = rc < 0;
  return rc;
}

/* ST_SHARDS_IN: every rank of every part reads its own file into its chunks (rank_shards_in),
 * the results exchanged, then (stages 1-2) every rank's copy of the parameters all-gathered.
 * A rank that failed leaves every part's state partly the checkpoint's: every rank fails as
 * inside the collectives (the trainers refuse what follows). */
static int part_shards_in(dp_rank_state *k) {
  const dp_state *s = k->s;
  int rc = s->io ? rank_shards_in(k) : rank_fail(k, s->io_rc, "%s", s->io_err);
  int erc = share(k, rc, 0, "exchanging the ranks' reads of the checkpoint");
  if (erc < 0) return erc;
  if ((rc = part_verdict(k, rc, -EIO, "to read its file of the checkpoint: the state is partly "
                         "the checkpoint's")) < 0)
    return rc;
  return s->dc.zero_stage < 3 ? rank_shards_gather(k) : 0;
}

/* CMD_STATE on every rank of every part: rank 0 says what its part's call is and which units
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
  if (rc < 0) return comm_fail(k, rc, "broadcasting the state call");
  be->ops->to_host(be->ctx, h, k->xchg, H_BYTES);
  if ((rc = be->ops->sync(be->ctx)) < 0) return backend_fail(k, rc);
  int op = (int)h[H_OP], mask = (int)h[H_MASK], u0 = (int)h[H_U0], u1 = (int)h[H_U1];
  size_t len = h[H_LEN] >= 0 && h[H_LEN] <= PROBE_MAX ? (size_t)h[H_LEN] : 0;
  k->got_op = op;
  k->piece[0] = u0;
  k->piece[1] = u1;
  /* a load given up half way leaves every part's state partly the checkpoint's: as after a
   * failure inside the collectives, every rank aborts and the trainers refuse what follows */
  if (op == ST_ABANDON && s->seq_op == ST_SCATTER && s->seq_next > 0)
    return rank_fail(k, -EIO, "the part holding rank 0 gave up its load (zt_trainer_load; its "
                     "error says why) after units 0..%d of %d had been written: the state is "
                     "partly the checkpoint's", s->seq_next - 1, s->nu);
  if (op != s->op && op == ST_ABANDON) {
    k->abandoned = 1;
    return rank_fail(k, -ECANCELED, "the part holding rank 0 gave up its call (its "
                     "zt_trainer_save, _load, _export or _get_state failed; its error says "
                     "why): nothing was changed here");
  }
  if (side_of(op, mask) != side_of(s->op, s->mask))
    return rank_fail(k, -EINVAL, "the part holding rank 0 %s while this part %s: the parts' "
                     "calls must match (engine/train/dp.h)",
                     side_of(op, mask) == ST_GATHER
                         ? "reads the state (zt_trainer_save, _export or _get_state)"
                         : "writes the state (zt_trainer_load)",
                     side_of(s->op, s->mask) == ST_GATHER
                         ? "sends it (zt_trainer_dp_send_state)"
                         : "receives it (zt_trainer_dp_receive_state)");
  if (op != ST_ABANDON && !(u0 >= 0 && u0 < u1 && u1 <= s->nu))
    return rank_fail(k, -EINVAL, "the part holding rank 0 sent units [%d, %d) of a model of %d",
                     u0, u1, s->nu);
  switch (op) {
  case ST_GATHER: return state_gather(k, mask, u0, u1);
  case ST_SCATTER: return state_scatter(k, u0, u1);
  case ST_PROBE: return rank_probe(k, mask, len);
  case ST_SHARDS_OUT: return part_shards_out(k);
  case ST_SHARDS_IN: return part_shards_in(k);
  default: return 0;
  }
}

/* ---- the rank threads ---------------------------------------------------------------------- */

static int rank_run(dp_rank_state *k, dp_cmd cmd) {
  /* a step leaves the gathers of the updated parameters on the queue for the next step's
   * forward; every other command reads or writes the state, or frees it, after them */
  if (cmd != CMD_OPEN && cmd != CMD_STEP) {
    int rc = k->comm.ops->queue_sync(k->comm.ctx);
    if (rc < 0 && cmd != CMD_CLOSE) return comm_fail(k, rc, "finishing the step's collectives");
  }
  switch (cmd) {
  case CMD_OPEN: return rank_open(k);
  case CMD_STEP: {
    /* a rank that fails alone must not leave the others waiting in a collective; -ERANGE is
     * every rank's verdict on the same exchanged norm */
    int rc = rank_step(k);
    if (rc < 0 && rc != -ERANGE) k->comm.ops->abort(k->comm.ctx);
    return rc;
  }
  case CMD_READ: return rank_read(k);
  case CMD_WRITE: return rank_write(k);
  case CMD_SHARDS_OUT: return rank_shards_out(k);
  case CMD_SHARDS_IN: return rank_shards_in(k);
  case CMD_SHARDS_GATHER: {
    /* a collective: as a step's, a rank that fails releases the others */
    int rc = rank_shards_gather(k);
    if (rc < 0) k->comm.ops->abort(k->comm.ctx);
    return rc;
  }
  case CMD_STATE: {
    /* as a step's: a rank that fails mid-call releases the others; a call rank 0 gave up
     * before it began is no failure of the collectives */
    int rc = rank_state(k);
    if (rc < 0 && !k->abandoned) k->comm.ops->abort(k->comm.ctx);
    return rc;
  }
  case CMD_CLOSE: rank_close(k); return 0;
  }
  return -EINVAL;
}

static void *rank_main(void *arg) {
  dp_rank_state *k = arg;
  dp_state *s = k->s;
  uint64_t seen = 0;
  /* a cuda rank's device, current for every command this thread runs */
  int bound = zt_backend_bind_thread(&k->view.be);
  for (;;) {
    pthread_mutex_lock(&s->mu);
    while (s->gen == seen) pthread_cond_wait(&s->cmd_cv, &s->mu);
    seen = s->gen;
    dp_cmd cmd = s->cmd;
    pthread_mutex_unlock(&s->mu);
    k->err[0] = 0;
    k->rc = bound < 0 && cmd != CMD_CLOSE ? bound : rank_run(k, cmd);
    if (bound < 0 && cmd != CMD_CLOSE)
      snprintf(k->err, sizeof k->err, "rank %d: making its device current failed", k->r);
    pthread_mutex_lock(&s->mu);
    if (++s->done == s->n_threads) pthread_cond_signal(&s->done_cv);
    pthread_mutex_unlock(&s->mu);
    if (cmd == CMD_CLOSE) return NULL;
  }
}

static int failure_rank(int rc) {
  return rc >= 0 ? 0 : rc == -ERANGE ? 1 : rc == -ECANCELED ? 2 : 3;
}

/* Runs cmd on every rank and waits for all of them. Returns a failed rank (-1: none): one whose
 * failure is its own before one cancelled by another's, before a non-finite gradient. */
static int dispatch(dp_state *s, dp_cmd cmd) {
  pthread_mutex_lock(&s->mu);
  s->cmd = cmd;
  s->done = 0;
  s->gen++;
  pthread_cond_broadcast(&s->cmd_cv);
  while (s->done < s->n_threads) pthread_cond_wait(&s->done_cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  int bad = -1;
  for (int r = 0; r < s->n_threads; r++)
    if (failure_rank(s->ranks[r].rc) > (bad < 0 ? 0 : failure_rank(s->ranks[bad].rc))) bad = r;
  return bad;
}

/* ---- the path ------------------------------------------------------------------------------ */

static int refuse_broken(const char *what, char *err, size_t errlen) {
  snprintf(err, errlen, "%s: an earlier step or state call failed on a rank and aborted the "
           "communicators; close the trainer and open a new one (a checkpoint restores the "
           "state)", what);
  return -EIO;
}

/* cmd on every rank here; 0, or the failed rank's code and message */
static int run_cmd(dp_state *s, dp_cmd cmd, char *err, size_t errlen) {
  int bad = dispatch(s, cmd);
  if (bad < 0) return 0;
  snprintf(err, errlen, "%s", s->ranks[bad].err);
  return s->ranks[bad].rc;
}

/* A part's collective state call (dp.h): op is this part's side of it. */
static int state_call(dp_state *s, int op, int mask, char *err, size_t errlen) {
  if (s->broken) return refuse_broken("the state call", err, errlen);
  s->op = op;
  s->mask = mask;
  int bad = dispatch(s, CMD_STATE);
  if (bad < 0) return 0;
  const dp_rank_state *k = &s->ranks[bad];
  if (!k->abandoned) s->broken = 1;
  snprintf(err, errlen, "%s", k->err);
  return k->rc;
}

static int dp_step(zt_trainer *t, const int32_t *tokens, zt_step_result *res, char *err,
                   size_t errlen) {
  dp_state *s = t->path_state;
  int step = t->step + 1, W = s->dc.world;
  if (s->broken) {
    char what[32];
    snprintf(what, sizeof what, "step %d", step);
    return refuse_broken(what, err, errlen);
  }
  /* the whole step's W * G micro-batches, checked before any rank starts */
  zt_trainer whole = *t;
  whole.tc.grad_accum = W * t->tc.grad_accum;
  int rc = zt__trainer_check_tokens(&whole, tokens, err, errlen);
  if (rc < 0) return rc;
  int fp16 = t->tc.precision == ZT_F16;
  s->tokens = tokens;
  s->lr = zt_train_lr(&t->tc, step);
  s->adam_step = t->adam_step + 1;
  s->loss_scale = fp16 ? t->scaler.scale : 1.0f;
  int bad = dispatch(s, CMD_STEP);
  s->flags = 0;
  const dp_rank_state *k0 = &s->ranks[0];
  zt_step_result r = {.step = step, .loss = k0->loss, .grad_norm = k0->norm, .lr = s->lr,
                      .tokens = (int64_t)t->tc.micro_batch * zt_model_cfg_of(t->model)->seq_len *
                                W * t->tc.grad_accum,
                      .skipped = 0, .loss_scale = 1.0f, .flags = k0->flags};
  if (bad >= 0 && s->ranks[bad].rc == -ERANGE) {
    /* every rank found it in the exchange and none updated anything; the flags were
     * exchanged with it, and every part must see them */
    snprintf(err, errlen, "step %d: the gradient has inf or nan values (loss %g); parameters "
             "left unchanged", step, k0->loss);
    if (res) {
      *res = r;
      res->skipped = 1;
    }
    return -ERANGE;
  }
  if (bad >= 0) {
    s->broken = 1;
    snprintf(err, errlen, "step %d: %s", step, s->ranks[bad].err);
    return s->ranks[bad].rc;
  }
  /* fp16: every rank saw the same overflow verdict, so the scalers agree; a skipped step
   * counts, AdamW's does not */
  if (fp16) zt_loss_scaler_update(&t->scaler, k0->skipped);
  t->step = step;
  if (!k0->skipped) t->adam_step = s->adam_step;
  r.skipped = k0->skipped;
  r.loss_scale = fp16 ? t->scaler.scale : 1.0f;
  if (res) *res = r;
  return 0;
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
  s->seq_next = rc < 0 || s->u1 >= s->nu ? 0 : s->u1;
  return rc;
}

static int dp_read_state(zt_trainer *t, int u0, int u1, float *params, float *m, float *v,
                         char *err, size_t errlen) {
  dp_state *s = t->path_state;
  s->out[0] = params;
  s->out[1] = m;
  s->out[2] = v;
  s->u0 = u0;
  s->u1 = u1;
  if (s->nl == s->dc.world) return run_cmd(s, CMD_READ, err, errlen);
  if (s->dc.rank0 != 0)
    return refuse_part(s, "reading the state", "zt_trainer_dp_send_state", err, errlen);
  return lead_state(s, ST_GATHER, (params ? 1 : 0) | (m ? 2 : 0) | (v ? 4 : 0), err, errlen);
}

static int dp_write_state(zt_trainer *t, int u0, int u1, const float *params, const float *m,
                          const float *v, char *err, size_t errlen) {
  dp_state *s = t->path_state;
  s->in[0] = params;
  s->in[1] = m;
  s->in[2] = v;
  s->u0 = u0;
  s->u1 = u1;
  if (s->nl == s->dc.world) return run_cmd(s, CMD_WRITE, err, errlen);
  if (s->dc.rank0 != 0)
    return refuse_part(s, "writing the state", "zt_trainer_dp_receive_state", err, errlen);
  return lead_state(s, ST_SCATTER, 7, err, errlen);
}

/* The rank-0 part's save / load / export failed before its sequence of state calls ended: the
 * other parts wait for its next piece, and learn from this one that it is not coming (after
 * part of a load, every part fails: rank_state). */
static void dp_abandon_state(zt_trainer *t) {
  dp_state *s = t->path_state;
  char err[sizeof s->ranks[0].err];
  if (s->nl < s->dc.world && s->dc.rank0 == 0 && !s->broken)
    state_call(s, ST_ABANDON, 0, err, sizeof err);
  s->seq_next = 0;
}

/* Per-rank checkpoints: with every rank here, or by the part holding rank 0 where every part
 * sees the checkpoint's directory (dp_probe; the other parts refuse checkpoints themselves, at
 * their first state call). */
static const zt_shard_table *dp_shards(const zt_trainer *t, int *zero_stage, int *part) {
  const dp_state *s = t->path_state;
  if (s->dc.rank0 != 0) return NULL;
  if (zero_stage) *zero_stage = s->dc.zero_stage;
  if (part) *part = s->nl < s->dc.world;
  return s->tab;
}

/* A part's per-rank call: every part's ranks move their own files (part_shards_out / _in). */
static int part_files(dp_state *s, const zt__shard_io *io, int op, char *err, size_t errlen) {
  s->io = io;
  s->u0 = 0;
  s->u1 = s->nu;
  int rc = state_call(s, op, 0, err, errlen);
  s->io = NULL;
  return rc;
}

static int dp_save_shards(zt_trainer *t, const zt__shard_io *io, char *err, size_t errlen) {
  dp_state *s = t->path_state;
  if (s->broken) return refuse_broken("the checkpoint", err, errlen);
  if (s->nl == s->dc.world) {
    s->io = io;
    return run_cmd(s, CMD_SHARDS_OUT, err, errlen);
  }
  int rc = part_files(s, io, ST_SHARDS_OUT, err, errlen);
  /* the other parts' files' sizes, from the exchange (this part's ranks, 0 .. nl - 1: the
   * part holding rank 0 is the one that saves, set theirs in their ends) */
  for (int r = s->nl; rc == 0 && r < s->dc.world; r++)
    io->bytes[r] = (long long)s->ranks[0].h_xchg[(size_t)r * s->rec + 1];
  return rc;
}

static int dp_load_shards(zt_trainer *t, const zt__shard_io *io, char *err, size_t errlen) {
  dp_state *s = t->path_state;
  if (s->broken) return refuse_broken("the checkpoint load", err, errlen);
  if (s->nl < s->dc.world) return part_files(s, io, ST_SHARDS_IN, err, errlen);
  s->io = io;
  int rc = run_cmd(s, CMD_SHARDS_IN, err, errlen);
  if (rc == 0 && s->dc.zero_stage < 3 && (rc = run_cmd(s, CMD_SHARDS_GATHER, err, errlen)) < 0)
    s->broken = 1;
  return rc;
}

/* The part holding rank 0 asks every part whether it sees dir (trainer_internal.h): the token
 * and the directory follow the head of an ST_PROBE, every rank checks its own view and the
 * verdicts are exchanged. Those that did not see it are logged: the call then goes through the
 * flat layout, which the other parts follow as well. */
static int dp_probe(zt_trainer *t, const char *dir, int save, const char *token, char *err,
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
  s->u1 = s->nu;
  int rc = state_call(s, ST_PROBE, save, err, errlen);
  s->blob = NULL;
  s->blob_len = 0;
  free(blob);
  if (rc < 0 || s->ranks[0].probe_all) return rc < 0 ? rc : 1;
  char ranks[256] = "";
  size_t n = 0;
  for (int r = 0; r < s->dc.world && n < sizeof ranks; r++)
    if (s->ranks[0].h_xchg[(size_t)r * s->rec] == 0)
      n += (size_t)snprintf(ranks + n, sizeof ranks - n, "%s%d", n ? ", " : "", r);
  zt_log(ZT_LOG_WARN, "dp", "%s: not seen as rank 0 sees it%s by global ranks %s (per-rank "
         "checkpoints of a job over several daemons need a filesystem every daemon mounts at "
         "the same path): the %s goes through rank 0 in the flat layout", dir,
         save ? ", or not writable," : "", ranks, what);
  return 0;
}

static size_t dp_backend_bytes(const zt_trainer *t) {
  const dp_state *s = t->path_state;
  size_t b = 0;
  for (int i = 0; i < s->nl; i++) b += s->ranks[i].bytes;
  return b;
}

static void dp_close(zt_trainer *t) {
  dp_state *s = t->path_state;
  if (!s) return;
  if (s->n_threads) {
    dispatch(s, CMD_CLOSE);
    for (int r = 0; r < s->n_threads; r++) pthread_join(s->ranks[r].thread, NULL);
  }
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cmd_cv);
  pthread_cond_destroy(&s->done_cv);
  zt_cpu_pool_close(s->pool);
  zt_shard_table_free(s->tab);
  /* the ranks' directories and files went with their stores */
  if (s->nvme_dir[0]) rmdir(s->nvme_dir);
  free(s->ranks);
  free(s);
  t->path_state = NULL;
}

static const zt__train_path dp_path = {
    .step = dp_step,
    .read_state = dp_read_state,
    .write_state = dp_write_state,
    .abandon_state = dp_abandon_state,
    .shards = dp_shards,
    .save_shards = dp_save_shards,
    .load_shards = dp_load_shards,
    .probe = dp_probe,
    .backend_bytes = dp_backend_bytes,
    .close = dp_close,
};

size_t zt_trainer_dp_rank_bytes(const zt_trainer *t, int rank) {
  if (t->path != &dp_path) return 0;
  const dp_state *s = t->path_state;
  int i = rank - s->dc.rank0;
  return i >= 0 && i < s->nl ? s->ranks[i].bytes : 0;
}

size_t zt_trainer_dp_host_bytes(const zt_trainer *t, int rank) {
  if (t->path != &dp_path) return 0;
  const dp_state *s = t->path_state;
  int i = rank - s->dc.rank0;
  if (i < 0 || i >= s->nl || !s->ranks[i].host) return 0;
  zt_host_arena_stats st;
  zt_host_arena_get_stats(s->ranks[i].host, &st);
  return st.used;
}

static const dp_rank_state *rank_here(const zt_trainer *t, int rank) {
  if (t->path != &dp_path) return NULL;
  const dp_state *s = t->path_state;
  int i = rank - s->dc.rank0;
  return i >= 0 && i < s->nl ? &s->ranks[i] : NULL;
}

uint64_t zt_trainer_dp_nvme_bytes(const zt_trainer *t, int rank) {
  const dp_rank_state *k = rank_here(t, rank);
  return k ? k->nvme_bytes : 0;
}

int zt_trainer_dp_nvme_stats(const zt_trainer *t, int rank, zt_nvme_stats *out) {
  const dp_rank_state *k = rank_here(t, rank);
  if (!k || !k->store) return -ENOENT;
  zt_nvme_store_get_stats(k->store, out);
  return 0;
}

void zt_trainer_dp_set_flags(zt_trainer *t, unsigned flags) {
  if (t->path == &dp_path) ((dp_state *)t->path_state)->flags = flags;
}

/* The part for send / receive: a data-parallel one without rank 0. */
static dp_state *other_part(zt_trainer *t, const char *call, char *err, size_t errlen) {
  if (t->path != &dp_path) {
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
  s->io_rc = zt__rank_files_open(&s->files, &s->fio, m, s->tab, s->dc.zero_stage,
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
      if (k0->piece[1] >= s->nu) break;
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

/* ---- open ---------------------------------------------------------------------------------- */

int zt_dp_cfg_check(const zt_dp_cfg *c, char *err, size_t errlen) {
  if (c->world < 1 || c->world > ZT_DP_MAX_WORLD) {
    snprintf(err, errlen, "dp.world must be in [1, %d] (got %d)", ZT_DP_MAX_WORLD, c->world);
    return -EINVAL;
  }
  if (c->zero_stage < 1 || c->zero_stage > 3) {
    snprintf(err, errlen, "dp.zero_stage must be 1, 2 or 3 (got %d)", c->zero_stage);
    return -EINVAL;
  }
  if (c->rank0 < 0 || c->rank0 >= c->world) {
    snprintf(err, errlen, "dp.rank0 must be in [0, %d] (dp.world %d) (got %d)", c->world - 1,
             c->world, c->rank0);
    return -EINVAL;
  }
  if (c->local == 0 && c->rank0 != 0) {
    snprintf(err, errlen, "dp.rank0 must be 0 when dp.local is 0 (all ranks) (got %d)",
             c->rank0);
    return -EINVAL;
  }
  if (c->local < 0 || c->local > c->world - c->rank0) {
    snprintf(err, errlen, "dp.local must be in [0, %d] (dp.world %d - dp.rank0 %d) (got %d)",
             c->world - c->rank0, c->world, c->rank0, c->local);
    return -EINVAL;
  }
  const struct {
    const char *field;
    zt_offload_place v;
  } places[] = {{"optimizer", c->optimizer}, {"params", c->params}};
  for (int i = 0; i < 2; i++)
    if (places[i].v < ZT_PLACE_AUTO || places[i].v > ZT_PLACE_NVME) {
      snprintf(err, errlen, "dp.%s must be auto, gpu, host or nvme", places[i].field);
      return -EINVAL;
    }
  int off = c->optimizer == ZT_PLACE_HOST || c->optimizer == ZT_PLACE_NVME;
  if (c->params == ZT_PLACE_HOST && (c->zero_stage != 3 || !off)) {
    snprintf(err, errlen, "dp.params: host needs zero_stage 3 (stages 1-2 keep every unit's "
             "parameters on every device) and optimizer host or nvme (the masters the chunks "
             "are copied from) (got zero_stage %d, optimizer %s)", c->zero_stage,
             zt_offload_place_name(c->optimizer));
    return -EINVAL;
  }
  if (c->params == ZT_PLACE_NVME && (c->zero_stage != 3 || c->optimizer != ZT_PLACE_NVME)) {
    snprintf(err, errlen, "dp.params: nvme needs zero_stage 3 (stages 1-2 keep every unit's "
             "parameters on every device) and optimizer nvme (the master files the chunks are "
             "read from) (got zero_stage %d, optimizer %s)", c->zero_stage,
             zt_offload_place_name(c->optimizer));
    return -EINVAL;
  }
  if (off && c->gpu_units < 0) {
    snprintf(err, errlen, "dp.gpu_units must be >= 0 with optimizer %s (got %d)",
             zt_offload_place_name(c->optimizer), c->gpu_units);
    return -EINVAL;
  }
  if (c->host_units < 0 || (c->host_units && c->optimizer != ZT_PLACE_NVME)) {
    snprintf(err, errlen, "dp.host_units splits the host units' optimizer between the host and "
             "NVMe: it must be >= 0, and 0 unless optimizer is nvme (got %d with optimizer %s)",
             c->host_units, zt_offload_place_name(c->optimizer));
    return -EINVAL;
  }
  if (c->optimizer == ZT_PLACE_NVME && (!c->nvme_dir || !c->nvme_dir[0])) {
    snprintf(err, errlen, "dp.nvme_dir is required with optimizer nvme");
    return -EINVAL;
  }
  if (c->optimizer == ZT_PLACE_NVME && strlen(c->nvme_dir) + 20 >= ZT_PATH_MAX) {
    snprintf(err, errlen, "dp.nvme_dir is longer than %d bytes", ZT_PATH_MAX - 21);
    return -ENAMETOOLONG;
  }
  return 0;
}

/* fp16: every rank scales the loss by the trainer's scaler and skips the same overflowed steps,
 * so the scale needs no exchange; but a part's scaler is not carried by the state calls. */
static int fp16_supported(const zt_train_cfg *tc, const zt_dp_cfg *c, char *err, size_t errlen) {
  if (tc->precision != ZT_F16) return 0;
  if (c->local && c->local < c->world) {
    snprintf(err, errlen, "train.precision: fp16 with a part of the world (dp.local %d of "
             "dp.world %d: a job spanning daemons) is not supported yet (a resumed part would "
             "not have the loss scale); use bf16 or fp32", c->local, c->world);
    return -ENOTSUP;
  }
  return 0;
}

/* The units on the device and the two tiers' sizes, from the table. */
static int place_units(dp_state *s, char *err, size_t errlen) {
  s->ng = s->nu;
  if (s->dc.optimizer == ZT_PLACE_HOST || s->dc.optimizer == ZT_PLACE_NVME) {
    if (s->dc.gpu_units > s->nu) {
      snprintf(err, errlen, "dp.gpu_units must be in [0, %d] (the model's units) (got %d)",
               s->nu, s->dc.gpu_units);
      return -EINVAL;
    }
    s->ng = s->dc.gpu_units;
  }
  if (s->dc.host_units > s->nu - s->ng) {
    snprintf(err, errlen, "dp.host_units must be in [0, %d] (the units after dp.gpu_units %d "
             "of the model's %d) (got %d)", s->nu - s->ng, s->ng, s->nu, s->dc.host_units);
    return -EINVAL;
  }
  s->params_host =
      (s->dc.params == ZT_PLACE_HOST || s->dc.params == ZT_PLACE_NVME) && s->ng < s->nu;
  s->dev_packed = s->ng < s->nu ? zt_shard_at(s->tab, s->ng, 0)->packed_off
                                : s->tab->packed_total;
  s->host_n = s->tab->packed_total - s->dev_packed;
  s->nv0 = s->dc.optimizer == ZT_PLACE_NVME ? s->ng + s->dc.host_units : s->nu;
  s->nvme = s->nv0 < s->nu;
  /* without NVMe units (host_units all the rest) params nvme is params host */
  s->params_nvme = s->dc.params == ZT_PLACE_NVME && s->nvme;
  s->hopt_n = (s->nvme ? zt_shard_at(s->tab, s->nv0, 0)->packed_off : s->tab->packed_total) -
              s->dev_packed;
  for (int u = s->nv0; u < s->nu; u++)
    if (s->tab->chunk[u] > s->nv_chunk) s->nv_chunk = s->tab->chunk[u];
  return 0;
}

/* ranks[i] is global rank rank0 + i, each with a backend context of its own. */
static int check_ranks(const zt_dp_cfg *dc, int nl, const zt_dp_rank *ranks, char *err,
                       size_t errlen) {
  for (int i = 0; i < nl; i++) {
    const zt_dp_rank *k = &ranks[i];
    int r = dc->rank0 + i;
    if (!k->be.ops || !k->comm.ops) {
      snprintf(err, errlen, "dp.ranks[%d]: no %s", i, k->be.ops ? "communicator" : "backend");
      return -EINVAL;
    }
    int cr = k->comm.ops->rank(k->comm.ctx), cw = k->comm.ops->world(k->comm.ctx);
    if (cr != r || cw != dc->world) {
      snprintf(err, errlen, "dp.ranks[%d]: its communicator is rank %d of %d, not rank %d "
               "(dp.rank0 %d + %d) of dp.world %d", i, cr, cw, r, dc->rank0, i, dc->world);
      return -EINVAL;
    }
    for (int q = 0; q < i; q++)
      if (ranks[q].be.ctx == k->be.ctx) {
        snprintf(err, errlen, "dp.ranks[%d]: shares its backend context with dp.ranks[%d] "
                 "(each rank needs its own)", i, q);
        return -EINVAL;
      }
  }
  return 0;
}

/* The shard table (the checkpoint estimate builds the same: zt__trainer_shard_table) and the
 * size of a slot. */
static int build_table(zt_trainer *t, dp_state *s) {
  int rc = zt__trainer_shard_table(t->model, s->dc.world, &s->tab);
  if (rc < 0) return rc;
  /* the units a slot or the unit gradient buffer holds: all but a tied embedding */
  for (int u = s->tied; u < s->nu; u++) {
    size_t f = s->tab->chunk[u] * (size_t)s->dc.world;
    if (f > s->slot_floats) s->slot_floats = f;
  }
  return 0;
}

/* What a rank holds: with ops its device bytes (zt_dp_estimate_rank_bytes); without, its host
 * tier or (nvme) its files. */
static uint64_t estimate(const zt_model_cfg *mc, const zt_train_cfg *tc, const zt_dp_cfg *dpc,
                         const zt_ops *ops, int nvme) {
  char err[256];
  uint64_t bytes = UINT64_MAX;
  zt_trainer t = {0};
  dp_state s = {.dc = *dpc};
  if (zt_train_cfg_check(tc, err, sizeof err) < 0 ||
      zt_dp_cfg_check(dpc, err, sizeof err) < 0 || fp16_supported(tc, dpc, err, sizeof err) < 0 ||
      zt_model_create(&t.model, mc, err, sizeof err) < 0)
    return SIZE_MAX;
  s.nu = zt_model_num_units(t.model);
  s.tied = mc->arch == ZT_ARCH_GPT;
  s.rec = X_MICRO + 2 * (size_t)tc->grad_accum;
  if (build_table(&t, &s) == 0 && place_units(&s, err, sizeof err) == 0) {
    if (nvme) {
      bytes = nvme_file_bytes(&s);
    } else if (!ops) {
      bytes = host_tier_bytes(&s, tc);
    } else {
      size_t acts = zt_acts_size_dt(t.model, ops, tc->micro_batch, tc->ckpt_every,
                                    tc->precision);
      if (acts) bytes = acts + rank_buffer_bytes(&s, tc);
    }
  }
  zt_shard_table_free(s.tab);
  zt_model_destroy(t.model);
  return bytes;
}

size_t zt_dp_estimate_rank_bytes(const zt_model_cfg *mc, const zt_train_cfg *tc,
                                 const zt_dp_cfg *dpc, const zt_ops *ops) {
  uint64_t b = ops ? estimate(mc, tc, dpc, ops, 0) : UINT64_MAX;
  return b > SIZE_MAX ? SIZE_MAX : (size_t)b;
}

size_t zt_dp_estimate_host_bytes(const zt_model_cfg *mc, const zt_train_cfg *tc,
                                 const zt_dp_cfg *dpc) {
  uint64_t b = estimate(mc, tc, dpc, NULL, 0);
  return b > SIZE_MAX ? SIZE_MAX : (size_t)b;
}

uint64_t zt_dp_estimate_nvme_bytes(const zt_model_cfg *mc, const zt_train_cfg *tc,
                                   const zt_dp_cfg *dpc) {
  return estimate(mc, tc, dpc, NULL, 1);
}

int zt_trainer_open_dp(zt_trainer **out, const zt_model_cfg *mc, const zt_train_cfg *tc,
                       const zt_dp_cfg *dpc, const zt_dp_rank *ranks, char *err,
                       size_t errlen) {
  int rc;
  float *init = NULL;
  zt__trainer_init in = {0};
  *out = NULL;
  if ((rc = zt_train_cfg_check(tc, err, errlen)) < 0 ||
      (rc = zt_dp_cfg_check(dpc, err, errlen)) < 0 ||
      (rc = check_ranks(dpc, dpc->local ? dpc->local : dpc->world, ranks, err, errlen)) < 0)
    return rc;
  if ((rc = fp16_supported(tc, dpc, err, errlen)) < 0) return rc;
  zt_trainer *t = calloc(1, sizeof *t);
  dp_state *s = calloc(1, sizeof *s);
  if (!t || !s) {
    free(t);
    free(s);
    snprintf(err, errlen, "out of memory");
    return -ENOMEM;
  }
  t->tc = *tc;
  t->be = ranks[0].be; /* what checkpoint.c synchronises; the state is reached through the path */
  t->path = &dp_path;
  t->path_state = s;
  zt_loss_scaler_init(&t->scaler);
  s->dc = *dpc;
  s->nl = dpc->local ? dpc->local : dpc->world;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cmd_cv, NULL);
  pthread_cond_init(&s->done_cv, NULL);
  if ((rc = zt_model_create(&t->model, mc, err, errlen)) < 0) goto out;
  s->nu = zt_model_num_units(t->model);
  s->tied = mc->arch == ZT_ARCH_GPT;
  s->rec = X_MICRO + 2 * (size_t)tc->grad_accum;
  s->ranks = calloc((size_t)s->nl, sizeof *s->ranks);
  /* the initial parameters a piece of units at a time (as offload_step.c's
   * write_initial_state), not a flat copy of the model */
  size_t cap = zt__trainer_piece_cap(t->model);
  init = malloc(cap * sizeof *init);
  if (!s->ranks || !init || (rc = build_table(t, s)) < 0) {
    rc = rc < 0 ? rc : -ENOMEM;
    snprintf(err, errlen, rc == -EOVERFLOW ? "the model is too large to shard" : "out of memory");
    goto out;
  }
  if ((rc = place_units(s, err, errlen)) < 0) goto out;
  if (s->nvme) {
    /* a directory of its own, so that trainers can share nvme_dir; the ranks' inside it */
    snprintf(s->nvme_dir, sizeof s->nvme_dir, "%s/zt-offload.XXXXXX", dpc->nvme_dir);
    if (!mkdtemp(s->nvme_dir)) {
      rc = -errno;
      s->nvme_dir[0] = 0;
      snprintf(err, errlen, "offload.nvme_dir: %s: %s", dpc->nvme_dir, strerror(-rc));
      goto out;
    }
  }
  if (s->host_n) {
    /* beside GPUs the host's main work: a thread per core, pinned; on the cpu backend one
     * beside the ranks' own threads */
    int on_gpu = strcmp(ranks[0].be.ops->name, "cuda") == 0;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if ((rc = zt_cpu_pool_open(&s->pool, on_gpu && cores > 0 ? (int)cores : 1, on_gpu)) < 0) {
      snprintf(err, errlen, "starting the AdamW pool failed: %s", strerror(-rc));
      goto out;
    }
  }
  for (int i = 0; i < s->nl; i++) {
    dp_rank_state *k = &s->ranks[i];
    k->s = s;
    k->r = dpc->rank0 + i;
    k->comm = ranks[i].comm;
    k->stream = zt_backend_stream(&ranks[i].be);
    k->view.model = t->model;
    k->view.tc = *tc;
    k->view.be = ranks[i].be;
    if ((rc = -pthread_create(&k->thread, NULL, rank_main, k)) < 0) {
      snprintf(err, errlen, "starting the thread of rank %d: %s", k->r, strerror(-rc));
      goto out;
    }
    s->n_threads++;
  }
  int bad = dispatch(s, CMD_OPEN);
  if (bad >= 0) {
    rc = s->ranks[bad].rc;
    snprintf(err, errlen, "%s", s->ranks[bad].err);
    goto out;
  }
  /* every part computes the same init and writes its own ranks' share of it: no collective */
  if ((rc = zt__trainer_init_open(&in, t->model, err, errlen)) < 0) goto out;
  s->in[0] = init;
  s->in[1] = s->in[2] = NULL; /* the moments start as the zeros rank_open allocated */
  for (int u0 = 0, u1; u0 < s->nu; u0 = u1) {
    u1 = zt__trainer_piece_end(t->model, u0, cap);
    s->u0 = u0;
    s->u1 = u1;
    if ((rc = zt__trainer_init_read(&in, u0, u1, init, err, errlen)) < 0 ||
        (rc = run_cmd(s, CMD_WRITE, err, errlen)) < 0)
      goto out;
  }
  *out = t;
  t = NULL;
out:
  zt__trainer_init_close(&in);
  free(init);
  zt_trainer_close(t);
  return rc;
}
