/* ztd --calibrate (engine/train/calibrate.h). The planner ranks plans by rates; the built-in
 * ones are one H200 machine's, so on any other machine it may pick a plan that is not the
 * fastest there. Each rate here is measured through the code a step runs, on the sizes it runs
 * them at, so that the file describes what a job will see rather than a peak from a data sheet:
 * the CPU AdamW pool with the offload's thread count, the runner's host sum of squares, the
 * NVMe store's O_DIRECT io_uring path, the copy engine on pinned memory, the backend's AdamW,
 * and the flops of zt's own forward and backward of transformer blocks (one big square matmul
 * would overstate a step about twofold). The CPU backend runs the same code on a small model,
 * so CI exercises what a GPU machine runs. */
#include "engine/train/calibrate.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "engine/base/clock.h"
#include "engine/base/sizes.h"
#include "engine/kernels/backend.h"
#include "engine/train/offload/offload.h"
#include "engine/train/trainer.h"
#include "offload/copy_engine.h"
#include "offload/cpu_adam.h"
#include "offload/host_arena.h"
#include "offload/nvme_store.h"

#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)

/* The sizes measured (quick: tests). Host AdamW: 64 Mi parameters, a large model's block or
 * two, fewer where a quarter of the free memory cannot hold them (18 bytes a parameter). */
#define ADAM_PARAMS (64 * MIB)
#define ADAM_PARAMS_QUICK (2 * MIB)
#define ADAM_PARAMS_MIN MIB
#define BEST_OF 3
/* one copy as the streamer moves a large unit; COPIES of them back to back per timing */
#define COPY_BYTES (256 * MIB)
#define COPY_BYTES_QUICK (8 * MIB)
#define COPIES 4
/* the NVMe file: at most this and a quarter of the free space, at least NVME_MIN */
#define NVME_BYTES GIB
#define NVME_BYTES_QUICK (32 * MIB)
#define NVME_MIN (8 * MIB)
/* the file moves as requests of NVME_REQ bytes, NVME_SLOTS of them in flight (the opt store's
 * read-ahead keeps a unit's moments in flight at once) */
#define NVME_REQ (8 * MIB)
#define NVME_SLOTS 8
/* the device's AdamW: parameters (cuda; cpu: the reference's figure in seconds) */
#define DEV_ADAM_PARAMS (64 * MIB)
#define DEV_ADAM_PARAMS_CPU (4 * MIB)
#define DEV_ADAM_PARAMS_QUICK MIB
/* steps per timing on cuda, where one lasts well under a millisecond */
#define DEV_ADAM_REPEAT 10
/* the cost model counts 18 bytes a parameter of the device AdamW (offload_plan.c) */
#define DEV_ADAM_BYTES 18.0
/* a step's flops: timed steps after one warm-up, until this long (at least 1, at most 50) */
#define FLOPS_SECONDS 1.0
#define FLOPS_STEPS_MAX 50

typedef struct line {
  const char *key;  /* its rates.json name */
  double value;
  const char *unit;
  double seconds;   /* the measurement's wall time, its warm-up included */
  char what[256];
} line;

static double secs(uint64_t ns) { return (double)ns * 1e-9; }

static void print_line(FILE *out, const line *l) {
  fprintf(out, "%-17s %10.3e %-8s %6.2f s  %s\n", l->key, l->value, l->unit, l->seconds,
          l->what);
  fflush(out);
}

/* the host memory a measurement may take: a quarter of what is free now */
static size_t host_share(void) {
  long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? (size_t)pages * (size_t)page / 4 : 0;
}

static void fill(float *x, size_t n, float scale) {
  uint32_t s = 12345u;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    x[i] = scale * ((float)(s >> 8) * (1.0f / 16777216.0f) - 0.5f);
  }
}

/* ---- the NVMe tier ------------------------------------------------------------------------ */

/* One pass over the extent, NVME_SLOTS requests of NVME_REQ in flight. */
static int nvme_pass(zt_nvme_store *s, int ext, uint64_t bytes, char *buf, int write,
                     uint64_t *ns) {
  int req[NVME_SLOTS], rc = 0;
  for (int i = 0; i < NVME_SLOTS; i++) req[i] = -1;
  uint64_t t0 = zt_now_ns();
  for (uint64_t off = 0, k = 0; off < bytes; off += NVME_REQ, k++) {
    int slot = (int)(k % NVME_SLOTS);
    if (req[slot] >= 0 && (rc = zt_nvme_wait(s, req[slot])) < 0) break;
    char *b = buf + (size_t)slot * NVME_REQ;
    req[slot] = write ? zt_nvme_write(s, ext, off, b, NVME_REQ)
                      : zt_nvme_read(s, ext, off, b, NVME_REQ);
    if ((rc = req[slot]) < 0) break;
  }
  int drc = zt_nvme_drain(s);
  *ns = zt_now_ns() - t0;
  return rc < 0 ? rc : drc;
}

static int measure_nvme(const zt_calibrate_cfg *c, FILE *out, zt_plan_rates *r, char *err,
                        size_t errlen) {
  const char *dir = c->nvme_dir;
  zt_nvme_store *s = NULL;
  char *buf = NULL, name[64], sz[32];
  int rc;
  /* a file made and removed, not access(): root passes that on a read-only mode or /proc */
  char probe[PATH_MAX];
  snprintf(probe, sizeof probe, "%s/.zt-calibrate-%ld", dir, (long)getpid());
  int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    rc = -errno;
    snprintf(err, errlen, "NVMe dir %s is not writable: %s", dir, strerror(errno));
    return rc;
  }
  close(fd);
  unlink(probe);
  struct statvfs vfs;
  if (statvfs(dir, &vfs) != 0) {
    rc = -errno;
    snprintf(err, errlen, "NVMe dir %s: %s", dir, strerror(errno));
    return rc;
  }
  uint64_t avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
  uint64_t bytes = c->quick ? NVME_BYTES_QUICK : NVME_BYTES;
  if (bytes > avail / 4) bytes = avail / 4 / NVME_REQ * NVME_REQ;
  if (bytes < NVME_MIN) {
    zt_size_format(sz, sizeof sz, (double)avail);
    snprintf(err, errlen, "NVMe dir %s has %s free; the calibration writes a file of %zu MiB "
             "to 1 GiB there (a quarter of the free space at most)", dir, sz,
             (size_t)(NVME_MIN / MIB));
    return -ENOSPC;
  }
  uint64_t t_start = zt_now_ns();
  if ((rc = zt_nvme_store_open(&s, dir, NULL, err, errlen)) < 0) goto out;
  snprintf(name, sizeof name, "zt-calibrate-%ld.bin", (long)getpid());
  int ext = zt_nvme_store_alloc(s, name, bytes);
  if (ext < 0) {
    rc = ext;
    snprintf(err, errlen, "NVMe dir %s is not writable: %s", dir, zt_nvme_store_error(s));
    goto out;
  }
  if ((rc = zt_nvme_buffer_alloc(NVME_SLOTS * NVME_REQ, (void **)&buf)) < 0) {
    snprintf(err, errlen, "NVMe: %zu MiB of aligned buffers: %s",
             (size_t)(NVME_SLOTS * NVME_REQ / MIB), strerror(-rc));
    goto out;
  }
  fill((float *)buf, NVME_SLOTS * NVME_REQ / sizeof(float), 1.0f);
  if ((rc = zt_nvme_store_register(s, buf, NVME_SLOTS * NVME_REQ)) < 0) {
    snprintf(err, errlen, "NVMe: registering the buffers: %s", zt_nvme_store_error(s));
    goto out;
  }
  /* the writes first: a read of space only reserved (fallocate) may be served without I/O */
  uint64_t wns, rns;
  if ((rc = nvme_pass(s, ext, bytes, buf, 1, &wns)) < 0 ||
      (rc = nvme_pass(s, ext, bytes, buf, 0, &rns)) < 0) {
    snprintf(err, errlen, "NVMe: %s", zt_nvme_store_error(s));
    goto out;
  }
  zt_nvme_stats st;
  zt_nvme_store_get_stats(s, &st);
  zt_size_format(sz, sizeof sz, (double)bytes);
  line l = {.key = "nvme_write_bytes", .unit = "B/s", .value = (double)bytes / secs(wns),
            .seconds = secs(zt_now_ns() - t_start)};
  snprintf(l.what, sizeof l.what, "NVMe store: %s written to %s/%s, %d requests of %zu MiB in "
           "flight, io_uring%s", sz, dir, name, NVME_SLOTS, (size_t)(NVME_REQ / MIB),
           st.direct ? ", O_DIRECT" : ", buffered (no O_DIRECT here: the page cache's speed)");
  r->nvme_write = l.value;
  print_line(out, &l);
  l = (line){.key = "nvme_read_bytes", .unit = "B/s", .value = (double)bytes / secs(rns),
             .seconds = secs(rns)};
  snprintf(l.what, sizeof l.what, "NVMe store: the same %s read back%s", sz,
           st.direct ? ", O_DIRECT" : ", buffered (from the page cache)");
  r->nvme_read = l.value;
  print_line(out, &l);
out:
  zt_nvme_store_close(s); /* removes the file */
  free(buf);
  return rc;
}

/* ---- the host: AdamW pool, sum of squares ------------------------------------------------- */

/* A copy between page-locked host memory and the backend's, as the streamer moves units:
 * pinned as the host arena pins the offload's buffers (cudaHostRegister, or mlock), through the
 * copy engine the streamer uses. */
typedef struct copy_rig {
  const zt_host_mem_ops *hm;
  zt_copy_engine *e;
  void *host, *dev;
  size_t bytes;
  int pin_err; /* locking refused: the host memory is unpinned */
} copy_rig;

static void rig_close(const zt_backend *be, copy_rig *k) {
  zt_copy_close(k->e);
  if (k->dev) be->ops->free(be->ctx, k->dev);
  if (k->host) k->hm->free(k->hm->ctx, k->host, k->bytes, k->pin_err == 0);
  *k = (copy_rig){0};
}

/* what: names the measurement in err */
static int rig_open(const zt_calibrate_cfg *c, const zt_backend *be, const char *what,
                    copy_rig *k, char *err, size_t errlen) {
  int cuda = strcmp(c->backend, "cuda") == 0, rc;
  *k = (copy_rig){.hm = cuda ? zt_host_mem_cuda() : &zt_host_mem_cpu,
                  .bytes = c->quick ? COPY_BYTES_QUICK : COPY_BYTES};
  if (!k->hm) {
    snprintf(err, errlen, "%s: this build has no pinned host memory for %s", what, c->backend);
    return -ENOTSUP;
  }
  if ((rc = k->hm->alloc(k->hm->ctx, k->bytes, &k->host, &k->pin_err)) < 0) {
    snprintf(err, errlen, "%s: %zu MiB of host memory: %s", what, k->bytes / MIB, strerror(-rc));
    k->host = NULL;
    return rc;
  }
  memset(k->host, 1, k->bytes);
  if (!(k->dev = be->ops->alloc(be->ctx, k->bytes))) {
    snprintf(err, errlen, "%s: %zu MiB of %s memory: out of memory", what, k->bytes / MIB,
             c->backend);
    rig_close(be, k);
    return -ENOMEM;
  }
  be->ops->zero(be->ctx, k->dev, k->bytes);
  if ((rc = be->ops->sync(be->ctx)) < 0) {
    snprintf(err, errlen, "%s: %s", what, be->ops->error_text(be->ctx));
    rig_close(be, k);
    return rc;
  }
  rc = cuda ? zt_copy_cuda_open(&k->e, zt_backend_device(be), zt_backend_stream(be))
            : zt_copy_cpu_open(&k->e, 0);
  if (rc < 0) {
    snprintf(err, errlen, "%s: opening the %s copy engine: %s", what, c->backend,
             strerror(-rc));
    rig_close(be, k);
  }
  return rc;
}

/* The pool's AdamW step timed (best of BEST_OF) while the copy engine runs device-to-host
 * copies of COPY_BYTES into pinned memory, queued ahead enough to outlast each step. */
static int time_adam_beside_copies(const zt_calibrate_cfg *c, const zt_backend *be,
                                   zt_cpu_pool *pool, zt_cpu_adam_task *task, uint64_t *best,
                                   char *err, size_t errlen) {
  copy_rig k;
  *best = UINT64_MAX;
  int rc = rig_open(c, be, "AdamW beside copies", &k, err, errlen);
  for (int i = 0; i < BEST_OF && rc == 0; i++) {
    int64_t ticket = 0;
    /* at the link's speed 4 * COPIES copies take longer than a step of the pool */
    for (int j = 0; j < 4 * COPIES && ticket >= 0; j++)
      ticket = k.e->ops->d2h(k.e, k.host, k.dev, k.bytes);
    task->h.step++;
    uint64_t t0 = zt_now_ns();
    int arc = ticket < 0 ? 0 : zt_cpu_adam_step(pool, task);
    uint64_t dt = zt_now_ns() - t0;
    rc = ticket < 0 ? (int)ticket : k.e->ops->wait(k.e, ZT_COPY_D2H, ticket);
    if (rc == 0) rc = arc;
    if (rc < 0) snprintf(err, errlen, "AdamW beside copies: %s", strerror(-rc));
    else if (dt < *best) *best = dt;
  }
  rig_close(be, &k);
  return rc;
}

static int measure_host(const zt_calibrate_cfg *c, const zt_backend *be, FILE *out,
                        zt_plan_rates *r, char *err, size_t errlen) {
  int on_gpu = strcmp(c->backend, "cpu") != 0, pin, rc = 0;
  int threads = zt_offload_adam_threads(on_gpu, &pin);
  size_t n = c->quick ? ADAM_PARAMS_QUICK : ADAM_PARAMS, share = host_share() / 18;
  if (n > share) n = share / ZT_CPU_ADAM_CHUNK * ZT_CPU_ADAM_CHUNK;
  if (n < ADAM_PARAMS_MIN) n = ADAM_PARAMS_MIN;
  zt_cpu_pool *pool = NULL;
  zt_backend hbe = *be;
  int own_hbe = 0;
  uint64_t t_start = zt_now_ns();
  float *p = aligned_alloc(64, n * 4), *g = aligned_alloc(64, n * 4);
  float *m = aligned_alloc(64, n * 4), *v = aligned_alloc(64, n * 4);
  uint16_t *lp = aligned_alloc(64, n * 2);
  if (!p || !g || !m || !v || !lp) {
    snprintf(err, errlen, "AdamW: %zu MiB of host memory: out of memory", n * 18 / MIB);
    rc = -ENOMEM;
    goto out;
  }
  fill(p, n, 0.1f);
  fill(g, n, 1e-3f);
  memset(m, 0, n * 4);
  memset(v, 0, n * 4);
  memset(lp, 0, n * 2);
  if ((rc = zt_cpu_pool_open(&pool, threads, pin)) < 0) {
    snprintf(err, errlen, "AdamW: starting a pool of %d threads: %s", threads, strerror(-rc));
    goto out;
  }
  zt_cpu_adam_task task = {.p = p, .g = g, .m = m, .v = v, .p_bf16 = lp, .n = n,
                           .h = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                 .weight_decay = 0.01f, .grad_scale = 1.0f}};
  uint64_t best = UINT64_MAX;
  for (int i = 0; i <= BEST_OF; i++) { /* the first warms the pool's threads up */
    task.h.step = i + 1;
    uint64_t t0 = zt_now_ns();
    if ((rc = zt_cpu_adam_step(pool, &task)) < 0) {
      snprintf(err, errlen, "AdamW: the pool's step: %s", strerror(-rc));
      goto out;
    }
    uint64_t dt = zt_now_ns() - t0;
    if (i > 0 && dt < best) best = dt;
  }
  zt_cpu_pool_stats ps;
  zt_cpu_pool_get_stats(pool, &ps);
  line l = {.key = "adamw_alone_params", .unit = "param/s", .value = (double)n / secs(best),
            .seconds = secs(zt_now_ns() - t_start)};
  snprintf(l.what, sizeof l.what, "CPU AdamW pool alone: %d thread(s)%s, %s, %zu Mi params "
           "(fp32 moments, bf16 copy written), best of %d", threads,
           ps.pinned_threads == threads ? " pinned" : ps.pinned_threads ? " partly pinned" : "",
           zt_cpu_isa_name(task.isa), n / MIB, BEST_OF);
  r->adamw_alone_params = l.value;
  print_line(out, &l);

  /* beside the backward: the same while the copy engine streams gradients to pinned host
   * memory as a backward does (its memory traffic is what slows the pool there) */
  t_start = zt_now_ns();
  if ((rc = time_adam_beside_copies(c, be, pool, &task, &best, err, errlen)) < 0) goto out;
  l = (line){.key = "adamw_params", .unit = "param/s", .value = (double)n / secs(best),
             .seconds = secs(zt_now_ns() - t_start)};
  snprintf(l.what, sizeof l.what, "CPU AdamW pool beside device-to-host copies into pinned "
           "memory (a backward's write-backs), as above");
  r->adamw_params = l.value;
  print_line(out, &l);

  /* the runner's norm over host gradients: on a GPU job a cpu backend of every core
   * (engine/train/offload/open.c), on the cpu backend the job's own */
  t_start = zt_now_ns();
  if (on_gpu) {
    if ((rc = zt_backend_cpu_open(&hbe, 0)) < 0) {
      snprintf(err, errlen, "sum of squares: opening a cpu backend: %s", strerror(-rc));
      goto out;
    }
    own_hbe = 1;
  }
  best = UINT64_MAX;
  double sink = 0;
  for (int i = 0; i <= BEST_OF; i++) {
    int nonfinite = 0;
    uint64_t t0 = zt_now_ns();
    sink += hbe.ops->sum_squares(hbe.ctx, g, n, &nonfinite);
    uint64_t dt = zt_now_ns() - t0;
    if (i > 0 && dt < best) best = dt;
  }
  l = (line){.key = "sumsq_bytes", .unit = "B/s", .value = (double)n * 4 / secs(best),
             .seconds = secs(zt_now_ns() - t_start)};
  snprintf(l.what, sizeof l.what, "host gradients' sum of squares (the runner's norm), %zu MiB "
           "of fp32 on the %s backend's threads, best of %d%s", n * 4 / MIB,
           on_gpu ? "host tier's cpu" : "job's cpu", BEST_OF, sink >= 0 ? "" : " (nan)");
  r->sumsq_bytes = l.value;
  print_line(out, &l);
out:
  if (own_hbe) zt_backend_cpu_close(&hbe);
  zt_cpu_pool_close(pool);
  free(p);
  free(g);
  free(m);
  free(v);
  free(lp);
  return rc;
}

/* ---- copies and device memory ------------------------------------------------------------- */

static int time_copies(zt_copy_engine *e, zt_copy_queue q, void *dev, void *host, size_t bytes,
                       uint64_t *best, char *err, size_t errlen) {
  *best = UINT64_MAX;
  for (int i = 0; i <= BEST_OF; i++) {
    int64_t ticket = 0;
    uint64_t t0 = zt_now_ns();
    for (int k = 0; k < COPIES; k++) {
      ticket = q == ZT_COPY_H2D ? e->ops->h2d(e, dev, host, bytes, 0)
                                : e->ops->d2h(e, host, dev, bytes);
      if (ticket < 0) break;
    }
    int rc = ticket < 0 ? (int)ticket : e->ops->wait(e, q, ticket);
    if (rc < 0) {
      snprintf(err, errlen, "%s copies: %s", q == ZT_COPY_H2D ? "host to device"
               : "device to host", strerror(-rc));
      return rc;
    }
    uint64_t dt = zt_now_ns() - t0;
    if (i > 0 && dt < *best) *best = dt;
  }
  return 0;
}

static int measure_copies(const zt_calibrate_cfg *c, const zt_backend *be, FILE *out,
                          zt_plan_rates *r, char *err, size_t errlen) {
  int cuda = strcmp(c->backend, "cuda") == 0;
  copy_rig k;
  uint64_t t_start = zt_now_ns(), h2d, d2h;
  int rc = rig_open(c, be, "copies", &k, err, errlen);
  if (rc < 0) return rc;
  if ((rc = time_copies(k.e, ZT_COPY_H2D, k.dev, k.host, k.bytes, &h2d, err, errlen)) < 0)
    goto out;
  line l = {.key = "h2d_bytes", .unit = "B/s", .value = (double)k.bytes * COPIES / secs(h2d),
            .seconds = secs(zt_now_ns() - t_start)};
  const char *pinned = k.pin_err ? "unpinned (locking refused)" : "pinned";
  snprintf(l.what, sizeof l.what, "%s copy engine, host to %s: %d x %zu MiB from %s host "
           "memory, best of %d", k.e->ops->name, cuda ? "device" : "backend memory (memcpy)",
           COPIES, k.bytes / MIB, pinned, BEST_OF);
  r->h2d_bytes = l.value;
  print_line(out, &l);
  t_start = zt_now_ns();
  if ((rc = time_copies(k.e, ZT_COPY_D2H, k.dev, k.host, k.bytes, &d2h, err, errlen)) < 0)
    goto out;
  l = (line){.key = "d2h_bytes", .unit = "B/s", .value = (double)k.bytes * COPIES / secs(d2h),
             .seconds = secs(zt_now_ns() - t_start)};
  snprintf(l.what, sizeof l.what, "%s copy engine, %s to host: %d x %zu MiB into %s host "
           "memory, best of %d", k.e->ops->name, cuda ? "device" : "backend memory (memcpy)",
           COPIES, k.bytes / MIB, pinned, BEST_OF);
  r->d2h_bytes = l.value;
  print_line(out, &l);
out:
  rig_close(be, &k);
  return rc;
}

/* The device units' AdamW (the backend's op on backend buffers, with the bf16 copy), in the
 * bytes the cost model counts for it. */
static int measure_hbm(const zt_calibrate_cfg *c, const zt_backend *be, FILE *out,
                       zt_plan_rates *r, char *err, size_t errlen) {
  int cuda = strcmp(c->backend, "cuda") == 0, rc = 0;
  size_t n = c->quick ? DEV_ADAM_PARAMS_QUICK : cuda ? DEV_ADAM_PARAMS : DEV_ADAM_PARAMS_CPU;
  const zt_ops *o = be->ops;
  float *p = NULL, *g = NULL, *m = NULL, *v = NULL;
  void *lp = NULL;
  uint64_t t_start = zt_now_ns();
  float *host = malloc(n * 4);
  if (!host || !(p = o->alloc(be->ctx, n * 4)) || !(g = o->alloc(be->ctx, n * 4)) ||
      !(m = o->alloc(be->ctx, n * 4)) || !(v = o->alloc(be->ctx, n * 4)) ||
      !(lp = o->alloc(be->ctx, n * 2))) {
    snprintf(err, errlen, "device AdamW: %zu MiB of %s memory: out of memory", n * 18 / MIB,
             c->backend);
    rc = -ENOMEM;
    goto out;
  }
  fill(host, n, 0.1f);
  o->to_device(be->ctx, p, host, n * 4);
  fill(host, n, 1e-3f);
  o->to_device(be->ctx, g, host, n * 4);
  o->zero(be->ctx, m, n * 4);
  o->zero(be->ctx, v, n * 4);
  int repeat = cuda ? DEV_ADAM_REPEAT : 1, step = 0;
  uint64_t best = UINT64_MAX;
  for (int i = 0; i <= BEST_OF; i++) {
    if ((rc = o->sync(be->ctx)) < 0) break;
    uint64_t t0 = zt_now_ns();
    for (int k = 0; k < repeat; k++)
      o->adamw_dt(be->ctx, p, g, m, v, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, ++step, 1.0f, lp,
                  ZT_BF16);
    if ((rc = o->sync(be->ctx)) < 0) break;
    uint64_t dt = (zt_now_ns() - t0) / (uint64_t)repeat;
    if (i > 0 && dt < best) best = dt;
  }
  if (rc < 0) {
    snprintf(err, errlen, "device AdamW: %s", o->error_text(be->ctx));
    goto out;
  }
  line l = {.key = "hbm_bytes", .unit = "B/s", .value = (double)n * DEV_ADAM_BYTES / secs(best),
            .seconds = secs(zt_now_ns() - t_start)};
  snprintf(l.what, sizeof l.what, "%s backend's AdamW over %zu Mi params in its memory (bf16 "
           "copy written), counted as the cost model does (%.0f bytes a parameter), best of %d",
           c->backend, n / MIB, DEV_ADAM_BYTES, BEST_OF);
  r->hbm_bytes = l.value;
  print_line(out, &l);
out:
  if (lp) o->free(be->ctx, lp);
  if (v) o->free(be->ctx, v);
  if (m) o->free(be->ctx, m);
  if (g) o->free(be->ctx, g);
  if (p) o->free(be->ctx, p);
  free(host);
  return rc;
}

/* ---- the step's flops --------------------------------------------------------------------- */

/* zt's own step on a GPT of a few blocks: on cuda the width of a 1-3 B model at its sequence
 * (d_model 2048, seq 1024, micro-batch 4, 4 micro-batches a step so that the update and the
 * norm weigh little); on the cpu a small one, so that it stays within seconds. */
static void flops_model(const zt_calibrate_cfg *c, zt_model_cfg *mc, zt_train_cfg *tc) {
  int cuda = strcmp(c->backend, "cuda") == 0;
  *mc = (zt_model_cfg){.arch = ZT_ARCH_GPT, .vocab = 8192, .seq_len = 1024, .d_model = 2048,
                       .n_heads = 16, .n_layers = 2, .init_seed = 1};
  zt_train_cfg_defaults(tc);
  tc->steps = 1000;
  /* 8192 tokens a micro-batch, as the benchmark rows' (B 8 x T 1024): the matmuls' row count
   * is what the rate depends on beside the width */
  tc->micro_batch = 8;
  tc->grad_accum = 2;
  if (!cuda) {
    *mc = (zt_model_cfg){.arch = ZT_ARCH_GPT, .vocab = 256, .seq_len = 128, .d_model = 128,
                         .n_heads = 4, .n_layers = 2, .init_seed = 1};
    tc->micro_batch = 2;
    tc->grad_accum = 1;
  }
  if (c->quick) {
    mc->seq_len /= 2;
    mc->d_model /= 2;
    tc->grad_accum = 1;
  }
}

/* narrow: the model 3/8 as wide and (8/3)^2 as deep, as many parameters in its blocks, so that
 * the embeddings and the loss weigh in it as in the wide one (its rate only, for the knee:
 * zt_plan_rates_flops) */
static int measure_flops(const zt_calibrate_cfg *c, const zt_backend *be, zt_dtype dt,
                         int narrow, FILE *out, zt_plan_rates *r, double *rate, char *err,
                         size_t errlen) {
  zt_model_cfg mc;
  zt_train_cfg tc;
  flops_model(c, &mc, &tc);
  if (narrow) {
    mc.d_model = mc.d_model * 3 / 8;
    mc.n_heads = mc.n_heads * 3 / 4;
    mc.n_layers = mc.n_layers * 64 / 9;
  }
  tc.precision = dt;
  zt_trainer *t = NULL;
  char why[512];
  int rc;
  uint64_t t_start = zt_now_ns();
  if ((rc = zt_trainer_open(&t, &mc, &tc, be, why, sizeof why)) < 0) {
    snprintf(err, errlen, "flops (%s): the model: %s", zt_dtype_name(dt), why);
    return rc;
  }
  size_t ntok = (size_t)tc.grad_accum * zt_trainer_micro_tokens(t);
  int32_t *tok = malloc(ntok * sizeof *tok);
  if (!tok) {
    rc = -ENOMEM;
    snprintf(err, errlen, "flops: out of memory");
    goto out;
  }
  uint32_t s = 7u;
  for (size_t i = 0; i < ntok; i++) {
    s = s * 1664525u + 1013904223u;
    tok[i] = (int32_t)((s >> 8) % (uint32_t)mc.vocab);
  }
  uint64_t t0 = 0;
  int steps = 0;
  for (int i = 0;; i++) { /* step 0 warms up (cuBLAS handles, the first kernels) */
    zt_step_result res;
    if (i == 1) t0 = zt_now_ns();
    if ((rc = zt_trainer_step(t, tok, &res, why, sizeof why)) < 0) {
      snprintf(err, errlen, "flops (%s): a step: %s", zt_dtype_name(dt), why);
      goto out;
    }
    steps = i;
    double el = i ? secs(zt_now_ns() - t0) : 0;
    if (i >= 1 && (el >= (c->quick ? 0 : FLOPS_SECONDS) || i >= FLOPS_STEPS_MAX)) break;
  }
  double el = secs(zt_now_ns() - t0);
  const zt_model *model = zt_trainer_model(t);
  double P = (double)zt_model_num_params(model), B = tc.micro_batch, T = mc.seq_len;
  double L = mc.n_layers, C = mc.d_model;
  /* the cost model's flops of a micro-batch (engine/plan/step_cost.c) */
  double flops = 6 * P * B * T + 12 * L * B * T * T * C;
  line l = {.key = dt == ZT_F32 ? "flops_fp32" : "flops_bf16", .unit = "flop/s",
            .value = flops * tc.grad_accum * steps / el, .seconds = secs(zt_now_ns() - t_start)};
  snprintf(l.what, sizeof l.what, "%s backend, %s steps of a GPT (d_model %d, %d layers, seq %d, "
           "micro-batch %d x %d, %.2f M params): %d timed, flops as the cost model counts them",
           c->backend, zt_dtype_name(dt), mc.d_model, mc.n_layers, mc.seq_len, tc.micro_batch,
           tc.grad_accum, P / 1e6, steps);
  *rate = l.value;
  if (!narrow && dt == ZT_F32) r->flops_f32 = l.value;
  if (!narrow && dt != ZT_F32) r->flops_lp = l.value;
  if (!narrow) print_line(out, &l);
out:
  free(tok);
  zt_trainer_close(t);
  return rc;
}

int zt_calibrate_run(const zt_calibrate_cfg *c, FILE *out, zt_plan_rates *rates, char *err,
                     size_t errlen) {
  zt_plan_rates r = *zt_plan_rates_active();
  zt_backend be = {0};
  char why[512];
  int rc;
  double wide = 0, narrow = 0, f32 = 0;
  snprintf(r.name, sizeof r.name, "calibrated");
  /* the NVMe dir first: a directory that cannot take the file is refused before the rest */
  if ((rc = measure_nvme(c, out, &r, err, errlen)) < 0) return rc;
  if ((rc = zt_backend_open(&be, c->backend, c->device, c->cpu_threads, why, sizeof why)) < 0) {
    snprintf(err, errlen, "%s", why);
    return rc;
  }
  if ((rc = measure_host(c, &be, out, &r, err, errlen)) < 0 ||
      (rc = measure_copies(c, &be, out, &r, err, errlen)) < 0 ||
      (rc = measure_hbm(c, &be, out, &r, err, errlen)) < 0 ||
      (rc = measure_flops(c, &be, ZT_BF16, 0, out, &r, &wide, err, errlen)) < 0 ||
      (rc = measure_flops(c, &be, ZT_F32, 0, out, &r, &f32, err, errlen)) < 0)
    goto out;
  /* The knee: the width at which the rate halves, from the bf16 rate at two widths, where
   * e(d) = d / (d + knee) fits them (zt_plan_rates_flops); flat where narrow is not slower. */
  uint64_t t_start = zt_now_ns();
  if ((rc = measure_flops(c, &be, ZT_BF16, 1, out, &r, &narrow, err, errlen)) < 0) goto out;
  zt_model_cfg mc;
  zt_train_cfg tc;
  flops_model(c, &mc, &tc);
  double W = mc.d_model, w = mc.d_model * 3 / 8, rho = wide / narrow;
  r.flops_knee = rho > 1 && rho < W / w ? W * w * (rho - 1) / (W - w * rho) : 0;
  /* the rate is quoted at ZT_PLAN_FLOPS_WIDTH; measured at W */
  double at = ZT_PLAN_FLOPS_WIDTH, k = r.flops_knee;
  r.flops_lp *= (at / (at + k)) / (W / (W + k));
  r.flops_f32 *= (at / (at + k)) / (W / (W + k));
  line l = {.key = "flops_knee", .unit = "width", .value = r.flops_knee,
            .seconds = secs(zt_now_ns() - t_start)};
  snprintf(l.what, sizeof l.what, "bf16 %.3e flop/s at d_model %.0f, %.3e at %.0f: the rates "
           "above quoted at width %d by it", wide, W, narrow, w, ZT_PLAN_FLOPS_WIDTH);
  print_line(out, &l);
  *rates = r;
out:
  zt_backend_close(&be);
  return rc;
}
