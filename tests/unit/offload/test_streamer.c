/* The unit streamer on the CPU copy engine: a forward and a backward walk under a budget that
 * holds three units, checked byte for byte and transfer for transfer; gradient accumulation over
 * micro-batches; gradient buffers resumed from and stored over the host's; slot mode; refusal of a budget too small; prefetch hiding a slow link; NVMe homes going
 * through the store (run with the argument "nvme"; skipped where io_uring is forbidden). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "offload/streamer.h"
#include "otest.h"

#define N 12
#define P (64u * 1024u) /* parameter bytes per unit; gradients are as many fp32 bytes */

static uint8_t param_byte(int unit, size_t k, int version) {
  return (uint8_t)(unit * 31 + (int)(k * 7) + version * 101 + 1);
}

static float grad_value(int unit, size_t k, int mb) {
  return (float)(unit + 1) * 0.5f + (float)(k % 64) * 0.25f + (float)mb * 8.0f;
}

static void fill_params(uint8_t *p, size_t bytes, int unit, int version) {
  for (size_t k = 0; k < bytes; k++) p[k] = param_byte(unit, k, version);
}

static int params_ok(const uint8_t *p, size_t bytes, int unit, int version) {
  for (size_t k = 0; k < bytes; k++)
    if (p[k] != param_byte(unit, k, version)) return 0;
  return 1;
}

static void sleep_ms(int ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
  }
}

typedef struct rig {
  uint8_t *host_params[N];
  float *host_grads[N];
  zt_stream_unit units[N];
  zt_dev_arena *dev;
  zt_copy_engine *copy;
  zt_streamer *s;
} rig;

static int rig_open(rig *r, size_t budget, int depth, double link_rate, char *err, size_t errlen) {
  memset(r, 0, sizeof *r);
  for (int i = 0; i < N; i++) {
    r->host_params[i] = malloc(P);
    r->host_grads[i] = calloc(P / sizeof(float), sizeof(float));
    fill_params(r->host_params[i], P, i, 0);
    r->units[i] = (zt_stream_unit){.param_bytes = P, .host_params = r->host_params[i],
                                   .grad_floats = P / sizeof(float), .host_grads = r->host_grads[i]};
  }
  int rc = zt_dev_arena_open(&r->dev, budget, NULL, err, errlen);
  if (rc < 0) return rc;
  rc = zt_copy_cpu_open(&r->copy, link_rate);
  if (rc < 0) return rc;
  zt_streamer_cfg cfg = {.n_units = N, .units = r->units, .dev = r->dev, .copy = r->copy,
                         .prefetch_depth = depth};
  return zt_streamer_open(&r->s, &cfg, err, errlen);
}

static void rig_close(rig *r) {
  zt_streamer_close(r->s);
  zt_copy_close(r->copy);
  zt_dev_arena_close(r->dev);
  for (int i = 0; i < N; i++) {
    free(r->host_params[i]);
    free(r->host_grads[i]);
  }
}

static void forward(rig *r, int depth, int compute_ms) {
  for (int i = 0; i < N; i++) {
    void *p = NULL;
    int rc = zt_streamer_acquire(r->s, i, 0, &p, NULL);
    OT_CHECK(rc == 0, "forward acquire %d: %d %s", i, rc, zt_streamer_error(r->s));
    if (rc < 0) continue;
    OT_CHECK(params_ok(p, P, i, 0), "forward: unit %d's parameters are wrong on the device", i);
    for (int d = 1; d <= depth && i + d < N; d++)
      OT_CHECK(zt_streamer_prefetch(r->s, i + d) == 0, "prefetch %d: %s", i + d, zt_streamer_error(r->s));
    if (compute_ms) sleep_ms(compute_ms);
    OT_CHECK(zt_streamer_release(r->s, i, 0) == 0, "release %d", i);
  }
}

static void backward(rig *r, int depth, int mb) {
  for (int i = N - 1; i >= 0; i--) {
    void *p = NULL;
    float *g = NULL;
    int rc = zt_streamer_acquire(r->s, i, ZT_STREAM_GRADS, &p, &g);
    OT_CHECK(rc == 0, "backward acquire %d: %d %s", i, rc, zt_streamer_error(r->s));
    if (rc < 0) continue;
    OT_CHECK(params_ok(p, P, i, 0), "backward: unit %d's parameters are wrong on the device", i);
    size_t nz = 0;
    for (size_t k = 0; k < P / sizeof(float); k++) nz += g[k] != 0.0f;
    OT_CHECK(nz == 0, "unit %d: gradient buffer not zeroed (%zu nonzero)", i, nz);
    for (int d = 1; d <= depth && i - d >= 0; d++)
      OT_CHECK(zt_streamer_prefetch(r->s, i - d) == 0, "prefetch %d: %s", i - d, zt_streamer_error(r->s));
    for (size_t k = 0; k < P / sizeof(float); k++) g[k] = grad_value(i, k, mb);
    OT_CHECK(zt_streamer_release(r->s, i, ZT_STREAM_DIRTY) == 0, "release %d", i);
  }
}

static int resident_count(const rig *r) {
  int n = 0;
  for (int i = 0; i < N; i++) n += zt_streamer_is_resident(r->s, i);
  return n;
}

/* Budget: three units' parameters and one gradient buffer; prefetch depth 1. */
static void test_walks(void) {
  rig r;
  char err[256];
  const size_t budget = 4 * (size_t)P;
  int rc = rig_open(&r, budget, 1, 0, err, sizeof err);
  OT_CHECK(rc == 0, "open: %d %s", rc, err);
  if (rc < 0) goto out;
  zt_streamer_stats st;

  forward(&r, 1, 0);
  zt_streamer_get_stats(r.s, &st);
  OT_CHECK(st.fetches == N && st.misses == 1 && st.hits == N - 1,
           "forward: fetches %llu misses %llu hits %llu", (unsigned long long)st.fetches,
           (unsigned long long)st.misses, (unsigned long long)st.hits);
  OT_CHECK(st.bytes_h2d == (uint64_t)N * P, "forward: %llu bytes H2D", (unsigned long long)st.bytes_h2d);
  /* without gradients four parameter copies fit: units 8..11 stay, the backward starts on them */
  OT_CHECK(resident_count(&r) == 4 && zt_streamer_is_resident(r.s, 8) && zt_streamer_is_resident(r.s, 11),
           "after forward: %d resident", resident_count(&r));
  OT_CHECK(st.evictions == N - 4, "forward: %llu evictions", (unsigned long long)st.evictions);

  backward(&r, 1, 0);
  OT_CHECK(zt_streamer_wait_grads(r.s, -1) == 0, "wait_grads");
  zt_streamer_get_stats(r.s, &st);
  /* unit 11's gradient buffer evicts unit 8 (of 8, 9, 10, the one the backward needs last), so
   * the backward fetches units 8..0, every one prefetched */
  OT_CHECK(st.fetches == N + N - 3 && st.misses == 1 && st.hits == 2 * N - 1,
           "fwd+bwd: fetches %llu misses %llu hits %llu", (unsigned long long)st.fetches,
           (unsigned long long)st.misses, (unsigned long long)st.hits);
  OT_CHECK(st.bytes_h2d == (uint64_t)(2 * N - 3) * P, "fwd+bwd: %llu bytes H2D", (unsigned long long)st.bytes_h2d);
  OT_CHECK(st.bytes_d2h == (uint64_t)N * P && st.grad_writebacks == N, "fwd+bwd: %llu bytes D2H, %llu write-backs",
           (unsigned long long)st.bytes_d2h, (unsigned long long)st.grad_writebacks);
  OT_CHECK(st.fetches - st.evictions == (uint64_t)resident_count(&r), "fetches %llu - evictions %llu != %d resident",
           (unsigned long long)st.fetches, (unsigned long long)st.evictions, resident_count(&r));

  /* a second micro-batch accumulates on the host */
  forward(&r, 1, 0);
  backward(&r, 1, 1);
  OT_CHECK(zt_streamer_wait_grads(r.s, -1) == 0, "wait_grads");
  size_t bad = 0;
  for (int i = 0; i < N; i++)
    for (size_t k = 0; k < P / sizeof(float); k++)
      bad += r.host_grads[i][k] != (0.0f + grad_value(i, k, 0)) + grad_value(i, k, 1);
  OT_CHECK(bad == 0, "%zu host gradients differ from the sum of two micro-batches", bad);

  zt_dev_arena_stats a;
  zt_dev_arena_get_stats(r.dev, &a);
  zt_streamer_get_stats(r.s, &st);
  OT_CHECK(a.peak <= budget && st.device_peak == a.peak, "peak %zu budget %zu (streamer says %zu)", a.peak,
           budget, st.device_peak);
  OT_CHECK(a.peak == budget, "the walk should fill the budget exactly, peak %zu", a.peak);
  OT_CHECK(a.used == (size_t)resident_count(&r) * P, "only parameter copies left: %zu used, %d resident", a.used,
           resident_count(&r));

  /* the optimizer changed unit 11's home: the device copy goes, the next acquire fetches it */
  void *p = NULL;
  OT_CHECK(zt_streamer_acquire(r.s, 11, 0, &p, NULL) == 0, "acquire 11");
  OT_CHECK(zt_streamer_invalidate(r.s, -1) == -EBUSY, "invalidating a held unit must fail");
  OT_CHECK(zt_streamer_release(r.s, 11, 0) == 0, "release 11");
  fill_params(r.host_params[11], P, 11, 1);
  OT_CHECK(zt_streamer_invalidate(r.s, -1) == 0, "invalidate: %s", zt_streamer_error(r.s));
  OT_CHECK(resident_count(&r) == 0, "%d resident after invalidate", resident_count(&r));
  zt_dev_arena_get_stats(r.dev, &a);
  OT_CHECK(a.used == 0, "%zu device bytes left after invalidating all", a.used);
  zt_streamer_get_stats(r.s, &st);
  uint64_t misses = st.misses;
  rc = zt_streamer_acquire(r.s, 11, 0, &p, NULL);
  OT_CHECK(rc == 0 && params_ok(p, P, 11, 1), "unit 11 after invalidate: %d", rc);
  zt_streamer_get_stats(r.s, &st);
  OT_CHECK(st.misses == misses + 1, "acquire after invalidate must fetch");

  /* misuse */
  float *g = NULL;
  OT_CHECK(zt_streamer_acquire(r.s, 11, ZT_STREAM_GRADS, &p, &g) == 0, "grads 11");
  OT_CHECK(zt_streamer_acquire(r.s, 11, ZT_STREAM_GRADS, &p, &g) == -EBUSY, "second gradient buffer");
  OT_CHECK(zt_streamer_release(r.s, 11, 0) == 0 && zt_streamer_release(r.s, 11, 0) == 0, "two releases");
  OT_CHECK(zt_streamer_release(r.s, 11, 0) == -EINVAL, "release of a unit not held");
  OT_CHECK(zt_streamer_acquire(r.s, N, 0, &p, NULL) == -EINVAL, "unit out of range");
  OT_CHECK(strstr(zt_streamer_error(r.s), "out of range") != NULL, "message: %s", zt_streamer_error(r.s));
out:
  rig_close(&r);
}

/* One unit held plus one prefetched plus its gradients is the least the walk needs. */
static void test_refusal(void) {
  rig r;
  char err[256] = "";
  int rc = rig_open(&r, 3 * (size_t)P - ZT_DEV_ARENA_ALIGN, 1, 0, err, sizeof err);
  OT_CHECK(rc == -ENOMEM, "open under the minimum: %d", rc);
  char want[64];
  snprintf(want, sizeof want, "needs at least %zu device bytes", 3 * (size_t)P);
  OT_CHECK(strstr(err, want) && strstr(err, "196352-byte budget"), "message: %s", err);
  rig_close(&r);
  rc = rig_open(&r, 3 * (size_t)P, 1, 0, err, sizeof err);
  OT_CHECK(rc == 0, "open at the minimum: %d %s", rc, err);
  if (rc == 0) {
    forward(&r, 1, 0);
    backward(&r, 1, 0);
    zt_streamer_stats st;
    zt_streamer_get_stats(r.s, &st);
    OT_CHECK(st.device_peak <= 3 * (size_t)P, "peak %zu", st.device_peak);
  }
  rig_close(&r);
}

/* ZT_STREAM_GRADS_RESUME starts the buffer from the host gradients; ZT_STREAM_STORE writes it
 * over them (a -0.0 stays -0.0, which an accumulation into +0.0 would not keep). */
static void test_resume_store(void) {
  rig r;
  char err[256] = "";
  int rc = rig_open(&r, 3 * (size_t)P, 1, 0, err, sizeof err);
  OT_CHECK(rc == 0, "open: %d %s", rc, err);
  if (rc == 0) {
    size_t n = P / sizeof(float);
    for (size_t k = 0; k < n; k++) r.host_grads[2][k] = grad_value(2, k, 0);
    void *p;
    float *g;
    rc = zt_streamer_acquire(r.s, 2, ZT_STREAM_GRADS | ZT_STREAM_GRADS_RESUME, &p, &g);
    OT_CHECK(rc == 0, "acquire resume: %d", rc);
    int same = 1;
    for (size_t k = 0; rc == 0 && k < n; k++) same &= g[k] == grad_value(2, k, 0);
    OT_CHECK(same, "the resumed buffer is not the host gradients");
    for (size_t k = 0; rc == 0 && k < n; k++) g[k] += 1.5f;
    if (rc == 0) g[0] = -0.0f;
    zt_streamer_release(r.s, 2, ZT_STREAM_DIRTY | ZT_STREAM_STORE);
    zt_streamer_wait_grads(r.s, 2);
    int stored = signbit(r.host_grads[2][0]) && r.host_grads[2][0] == 0.0f;
    for (size_t k = 1; k < n; k++) stored &= r.host_grads[2][k] == grad_value(2, k, 0) + 1.5f;
    OT_CHECK(stored, "the host gradients are not the stored buffer");
    rc = zt_streamer_acquire(r.s, 2, ZT_STREAM_GRADS, &p, &g);
    int zero = rc == 0;
    for (size_t k = 0; rc == 0 && k < n; k++) zero &= g[k] == 0.0f && !signbit(g[k]);
    OT_CHECK(zero, "without resume the buffer is not zeroed");
    if (rc == 0) zt_streamer_release(r.s, 2, 0);
  }
  rig_close(&r);
}

/* Slot mode: every device allocation takes a whole slot, the minimum counts slots, and a unit
 * larger than the slot is refused. */
static void test_slots(void) {
  char err[256] = "";
  size_t sizes[3] = {4096, 512, 3000};
  float *grads[3];
  uint8_t *params[3];
  zt_stream_unit units[3];
  for (int i = 0; i < 3; i++) {
    params[i] = calloc(sizes[i], 1);
    grads[i] = calloc(sizes[i] / sizeof(float), sizeof(float));
    units[i] = (zt_stream_unit){.param_bytes = sizes[i], .host_params = params[i],
                                .grad_floats = sizes[i] / sizeof(float), .host_grads = grads[i]};
  }
  zt_dev_arena *dev = NULL;
  zt_copy_engine *copy = NULL;
  zt_streamer *s = NULL;
  size_t slot = 4096, fp = zt_dev_arena_footprint(slot);
  zt_streamer_cfg cfg = {.n_units = 3, .units = units, .prefetch_depth = 1, .slot_bytes = slot};
  OT_CHECK(zt_streamer_min_device_bytes(&cfg) == 3 * fp, "minimum %zu, want 3 slots",
           zt_streamer_min_device_bytes(&cfg));
  int rc = zt_dev_arena_open(&dev, 3 * fp, NULL, err, sizeof err);
  if (rc == 0) rc = zt_copy_cpu_open(&copy, 0);
  OT_CHECK(rc == 0, "rig: %d %s", rc, err);
  cfg.dev = dev;
  cfg.copy = copy;
  cfg.slot_bytes = 2048;
  OT_CHECK(zt_streamer_open(&s, &cfg, err, sizeof err) == -EINVAL && strstr(err, "slot"),
           "a unit larger than the slot: %s", err);
  cfg.slot_bytes = slot;
  rc = zt_streamer_open(&s, &cfg, err, sizeof err);
  OT_CHECK(rc == 0, "open: %d %s", rc, err);
  void *p;
  float *g;
  if (rc == 0 && (rc = zt_streamer_acquire(s, 1, ZT_STREAM_GRADS, &p, &g)) == 0) {
    zt_dev_arena_stats a;
    zt_dev_arena_get_stats(dev, &a);
    OT_CHECK(a.used == 2 * fp, "a 512-byte unit and its gradients take %zu bytes", a.used);
    zt_streamer_release(s, 1, 0);
  }
  zt_streamer_close(s);
  zt_copy_close(copy);
  zt_dev_arena_close(dev);
  for (int i = 0; i < 3; i++) {
    free(params[i]);
    free(grads[i]);
  }
}

/* A link that needs 2 ms per unit and 8 ms of compute per unit: without prefetch every acquire
 * starts its own fetch and waits it out; with prefetch the fetches run under the compute. */
static void test_overlap(void) {
  rig r;
  char err[256];
  zt_streamer_stats st[2];
  for (int depth = 0; depth <= 1; depth++) {
    int rc = rig_open(&r, 4 * (size_t)P, depth, P / 0.002, err, sizeof err);
    OT_CHECK(rc == 0, "open: %s", err);
    if (rc == 0) forward(&r, depth, 8);
    zt_streamer_get_stats(r.s, &st[depth]);
    rig_close(&r);
  }
  OT_CHECK(st[0].misses == N && st[0].hits == 0, "no prefetch: %llu misses", (unsigned long long)st[0].misses);
  OT_CHECK(st[1].misses == 1 && st[1].hits == N - 1, "prefetch: %llu misses", (unsigned long long)st[1].misses);
  /* every acquire without prefetch waits for a copy that takes at least 2 ms after it starts */
  OT_CHECK(st[0].wait_ns >= (uint64_t)N * 1500000u && st[0].stalls >= N / 2,
           "no prefetch: waited %llu ns, %llu stalls", (unsigned long long)st[0].wait_ns,
           (unsigned long long)st[0].stalls);
  OT_CHECK(st[1].wait_ns < st[0].wait_ns / 2 && st[1].stalls < st[0].stalls,
           "prefetch: waited %llu ns (%llu stalls) vs %llu ns (%llu) without", (unsigned long long)st[1].wait_ns,
           (unsigned long long)st[1].stalls, (unsigned long long)st[0].wait_ns, (unsigned long long)st[0].stalls);
}

/* Random walks over units of mixed sizes with two held at a time: every acquire sees its bytes,
 * the arena never passes its budget, and the host gradients are the sum of every dirty release.
 * Mixed sizes may fragment the arena: -ENOMEM (acquire) and -EAGAIN (prefetch) are allowed,
 * nothing else. */
#define NR 9
static void test_random(void) {
  uint64_t seed = 0x5eed;
  uint8_t *home[NR];
  float *hg[NR], *want[NR];
  zt_stream_unit units[NR];
  for (int i = 0; i < NR; i++) {
    size_t bytes = 4 * (1 + ot_next(&seed) % 4096);
    home[i] = malloc(bytes);
    fill_params(home[i], bytes, i, 0);
    hg[i] = calloc(bytes / 4, sizeof(float));
    want[i] = calloc(bytes / 4, sizeof(float));
    units[i] = (zt_stream_unit){.param_bytes = bytes, .host_params = home[i], .grad_floats = bytes / 4,
                                .host_grads = hg[i]};
  }
  zt_dev_arena *dev = NULL;
  zt_copy_engine *copy = NULL;
  zt_streamer *s = NULL;
  char err[256];
  zt_streamer_cfg cfg = {.n_units = NR, .units = units, .prefetch_depth = 2, .max_acquired = 2};
  size_t budget = zt_streamer_min_device_bytes(&cfg) * 3 / 2;
  OT_CHECK(zt_dev_arena_open(&dev, budget, NULL, err, sizeof err) == 0, "arena");
  OT_CHECK(zt_copy_cpu_open(&copy, 0) == 0, "copy");
  cfg.dev = dev;
  cfg.copy = copy;
  OT_CHECK(dev && copy && zt_streamer_open(&s, &cfg, err, sizeof err) == 0, "open: %s", err);
  int held[2] = {-1, -1};
  float *gbuf[2] = {NULL, NULL};
  int acquired = 0, refused = 0, writebacks = 0;
  for (int op = 0; s && op < 3000; op++) {
    int u = (int)(ot_next(&seed) % NR), slot = (int)(ot_next(&seed) % 2), rc;
    switch (ot_next(&seed) % 4) {
    case 0:
      rc = zt_streamer_prefetch(s, u);
      OT_CHECK(rc == 0 || rc == -EAGAIN, "prefetch %d: %d %s", u, rc, zt_streamer_error(s));
      break;
    case 1:
    case 2: {
      if (held[slot] >= 0 || held[!slot] == u) break;
      void *p = NULL;
      float *g = NULL;
      int with_grads = ot_next(&seed) % 2;
      rc = zt_streamer_acquire(s, u, with_grads ? ZT_STREAM_GRADS : 0, &p, &g);
      OT_CHECK(rc == 0 || rc == -ENOMEM, "acquire %d: %d %s", u, rc, zt_streamer_error(s));
      refused += rc < 0;
      if (rc < 0) break;
      acquired++;
      OT_CHECK(params_ok(p, units[u].param_bytes, u, 0), "op %d: unit %d's bytes wrong", op, u);
      held[slot] = u;
      gbuf[slot] = g;
      break;
    }
    case 3: {
      if (held[slot] < 0) break;
      int h = held[slot], dirty = gbuf[slot] && ot_next(&seed) % 4 != 0;
      if (gbuf[slot]) {
        for (size_t k = 0; k < units[h].grad_floats; k++) {
          OT_CHECK(gbuf[slot][k] == 0.0f, "unit %d: gradient buffer not zero", h);
          gbuf[slot][k] = (float)(op % 7 + 1);
          if (dirty) want[h][k] += (float)(op % 7 + 1);
        }
      }
      OT_CHECK(zt_streamer_release(s, h, dirty ? ZT_STREAM_DIRTY : 0) == 0, "release %d", h);
      writebacks += dirty;
      held[slot] = -1;
      gbuf[slot] = NULL;
      break;
    }
    }
    zt_dev_arena_stats a;
    zt_dev_arena_get_stats(dev, &a);
    OT_CHECK(a.used <= budget, "op %d: %zu bytes used, budget %zu", op, a.used, budget);
  }
  for (int k = 0; k < 2; k++)
    if (s && held[k] >= 0) zt_streamer_release(s, held[k], 0);
  if (s) OT_CHECK(zt_streamer_wait_grads(s, -1) == 0, "wait_grads");
  fprintf(stderr, "random: %d acquires, %d refused, %d write-backs\n", acquired, refused, writebacks);
  OT_CHECK(acquired > 300 && writebacks > 100 && refused < acquired / 10, "the walk did too little");
  size_t bad = 0;
  for (int i = 0; i < NR; i++)
    for (size_t k = 0; k < units[i].grad_floats; k++) bad += hg[i][k] != want[i][k];
  OT_CHECK(bad == 0, "%zu host gradients differ from the dirty releases' sum", bad);
  zt_streamer_close(s);
  zt_copy_close(copy);
  zt_dev_arena_close(dev);
  for (int i = 0; i < NR; i++) {
    free(home[i]);
    free(hg[i]);
    free(want[i]);
  }
}

#define NV 6
#define ODD_BYTES 10000u /* not a multiple of the NVMe block: the store's tail path */

/* Odd units live on NVMe, even ones on the host; the budget holds three units. */
static int test_nvme(void) {
  char dir[] = "/tmp/zt_streamer_XXXXXX", err[256];
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  zt_nvme_store *store = NULL;
  zt_host_arena *host = NULL;
  zt_dev_arena *dev = NULL;
  zt_copy_engine *copy = NULL;
  zt_streamer *s = NULL;
  uint8_t *home[NV] = {0};
  zt_stream_unit units[NV];
  int skip = 0;
  int rc = zt_nvme_store_open(&store, dir, NULL, err, sizeof err);
  if (rc == -ENOSYS || rc == -EPERM) {
    fprintf(stderr, "skip: io_uring unavailable: %s\n", err);
    skip = 1;
    goto out;
  }
  OT_CHECK(rc == 0, "store: %s", err);
  if (rc < 0) goto out;
  uint64_t nvme_bytes = 0;
  for (int i = 0; i < NV; i++) {
    size_t bytes = i == 3 ? ODD_BYTES : P;
    units[i] = (zt_stream_unit){.param_bytes = bytes, .nvme_ext = -1};
    rc = zt_nvme_buffer_alloc(bytes, (void **)&home[i]);
    OT_CHECK(rc == 0, "buffer");
    if (rc < 0) goto out;
    fill_params(home[i], bytes, i, 0);
    if (i % 2 == 0) {
      units[i].host_params = home[i];
      continue;
    }
    char name[32];
    snprintf(name, sizeof name, "unit%d", i);
    int ext = zt_nvme_store_alloc(store, name, bytes);
    OT_CHECK(ext >= 0, "extent: %s", zt_nvme_store_error(store));
    if (ext < 0) goto out;
    int req = zt_nvme_write(store, ext, 0, home[i], bytes);
    OT_CHECK(req >= 0 && zt_nvme_wait(store, req) == 0, "write: %s", zt_nvme_store_error(store));
    memset(home[i], 0, bytes); /* the only copy is on NVMe now */
    units[i].nvme_ext = ext;
    nvme_bytes += bytes;
  }
  zt_nvme_stats before, after;
  zt_nvme_store_get_stats(store, &before);
  OT_CHECK(zt_host_arena_open(&host, 1 << 20, NULL) == 0, "host arena");
  OT_CHECK(zt_dev_arena_open(&dev, 3 * (size_t)P, NULL, err, sizeof err) == 0, "dev arena: %s", err);
  OT_CHECK(zt_copy_cpu_open(&copy, 0) == 0, "copy engine");
  if (!host || !dev || !copy) goto out;
  zt_streamer_cfg cfg = {.n_units = NV, .units = units, .dev = dev, .host = host, .nvme = store,
                         .copy = copy, .prefetch_depth = 1};
  rc = zt_streamer_open(&s, &cfg, err, sizeof err);
  OT_CHECK(rc == 0, "open: %s", err);
  if (rc < 0) goto out;
  zt_host_arena_stats hs;
  zt_host_arena_get_stats(host, &hs);
  OT_CHECK(hs.allocs == 2 && hs.used == 2 * (size_t)P, "staging: %llu buffers, %zu bytes",
           (unsigned long long)hs.allocs, hs.used);
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < NV; i++) {
      void *p = NULL;
      rc = zt_streamer_acquire(s, i, 0, &p, NULL);
      OT_CHECK(rc == 0, "acquire %d: %s", i, zt_streamer_error(s));
      if (rc < 0) continue;
      OT_CHECK(params_ok(p, units[i].param_bytes, i, 0), "unit %d wrong on the device", i);
      if (i + 1 < NV) OT_CHECK(zt_streamer_prefetch(s, i + 1) == 0, "prefetch: %s", zt_streamer_error(s));
      OT_CHECK(zt_streamer_release(s, i, 0) == 0, "release");
    }
    OT_CHECK(zt_streamer_invalidate(s, -1) == 0, "invalidate");
  }
  zt_streamer_stats st;
  zt_streamer_get_stats(s, &st);
  zt_nvme_store_get_stats(store, &after);
  /* a failed read reaches the acquire, names the unit, and leaves the unit fetchable */
  zt_nvme_store_fail_nth(store, 1, EIO);
  void *p = NULL;
  rc = zt_streamer_acquire(s, 1, 0, &p, NULL);
  OT_CHECK(rc == -EIO && strstr(zt_streamer_error(s), "unit 1"), "failed read: %d %s", rc, zt_streamer_error(s));
  OT_CHECK(!zt_streamer_is_resident(s, 1), "a failed fetch leaves nothing on the device");
  rc = zt_streamer_acquire(s, 1, 0, &p, NULL);
  OT_CHECK(rc == 0 && params_ok(p, P, 1, 0), "acquire after a failed read: %d", rc);
  if (rc == 0) zt_streamer_release(s, 1, 0);
  OT_CHECK(st.nvme_reads == NV && st.nvme_bytes == 2 * nvme_bytes, "streamer: %llu reads, %llu bytes",
           (unsigned long long)st.nvme_reads, (unsigned long long)st.nvme_bytes);
  OT_CHECK(after.bytes_read - before.bytes_read == 2 * nvme_bytes && after.requests - before.requests == NV,
           "store: %llu bytes read, %llu requests", (unsigned long long)(after.bytes_read - before.bytes_read),
           (unsigned long long)(after.requests - before.requests));
  OT_CHECK(st.fetches == 2 * NV && st.device_peak <= 3 * (size_t)P, "fetches %llu peak %zu",
           (unsigned long long)st.fetches, st.device_peak);
out:
  zt_streamer_close(s);
  zt_copy_close(copy);
  zt_dev_arena_close(dev);
  zt_host_arena_close(host);
  zt_nvme_store_close(store);
  for (int i = 0; i < NV; i++) free(home[i]);
  OT_CHECK(rmdir(dir) == 0, "%s: %s", dir, strerror(errno));
  return skip;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "nvme") == 0) {
    int skip = test_nvme();
    if (ot_failures) return 1;
    return skip ? 77 : 0;
  }
  test_walks();
  test_refusal();
  test_resume_store();
  test_slots();
  test_overlap();
  test_random();
  if (ot_failures) fprintf(stderr, "%d failures\n", ot_failures);
  return ot_failures ? 1 : 0;
}
