/* The unit streamer on the CPU copy engine: a forward and a backward walk under a budget that
 * holds three units, checked byte for byte and transfer for transfer; gradient accumulation over
 * micro-batches; gradient buffers resumed from and stored over the host's; slot mode; refusal of
 * a budget too small; prefetch hiding a slow link; random walks over mixed sizes.
 *
 * Fences, through a copy engine that records each H2D operation's `after` and hands out its own
 * compute tickets: in slot mode, copies on a fresh arena follow nothing, and a copy or zeroing
 * into a slot freed by an eviction, a clean release's discarded gradient buffer or a dirty
 * release's written-back one follows exactly that slot's last release; with exact sizes, a copy
 * overlapping two freed buffers partly follows the later fence, and past FENCES_MAX the
 * forgotten fences become a floor; random walks (slots and exact sizes) where every H2D into the
 * arena follows the last release that used its bytes (exactly so in slot mode), with bytes and
 * sums right.
 *
 * Device gradient buffers of the caller's (dev_grads): the minimum leaves their gradients out;
 * an acquire hands the buffer out zeroed after all compute, or resumed as it is with no copy; a
 * clean release leaves it, a dirty one stores it to the host (waited for before it is handed out
 * again) and keeps it, never touching the arena; micro-batches summed on the device give the
 * arena path's host gradients bit for bit with a fraction of its transfers; a device buffer
 * without gradients is refused, and one exempts its gradients from the slot size.
 *
 * NVMe homes go through the store (run with the argument "nvme"; skipped where io_uring is
 * forbidden). */
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

/* ---- fences: a copy engine that records what each H2D operation follows ---------------------- */

/* The device block, from memory whose address the test knows, so that arena offsets can be
 * named. */
typedef struct test_mem {
  char *base;
  size_t bytes;
} test_mem;

static int test_mem_alloc(void *ctx, size_t bytes, void **out) {
  test_mem *m = ctx;
  void *p = NULL;
  int rc = posix_memalign(&p, ZT_DEV_ARENA_ALIGN, bytes);
  if (rc) return -rc;
  memset(p, 0, bytes);
  m->base = p;
  m->bytes = bytes;
  *out = p;
  return 0;
}

static void test_mem_free(void *ctx, void *p, size_t bytes) { free(p); }

#define REC_T0 1000 /* compute tickets start after it: none is 0 or looks like a copy ticket */
#define REC_OPS 8192

typedef struct rec_op {
  int zero; /* a zeroing, else a copy */
  char *dev;
  size_t bytes;
  int64_t after;
} rec_op;

/* Wraps the CPU engine, which moves the bytes; hands out its own compute tickets (REC_T0 + 1,
 * + 2, ...: the streamer takes one per release, so a release's ticket is the last one) and keeps
 * every H2D operation's destination and `after`. With a shadow of the arena (per
 * ZT_DEV_ARENA_ALIGN granule, the last compute ticket before which compute may have used it; the
 * test marks buffers at their release) every H2D into the arena is checked as it is queued: it
 * must follow that ticket, and in slot mode, where a fence covers exactly the slot its buffer
 * had, be that ticket. */
typedef struct rec_engine {
  zt_copy_engine base;
  zt_copy_engine *cpu;
  int64_t ticket;   /* the last compute ticket handed out */
  int64_t last_d2h; /* the last D2H operation's ticket */
  int n_ops;        /* H2D operations queued; the first REC_OPS are in ops */
  rec_op ops[REC_OPS];
  const test_mem *mem;
  int64_t *shadow;
  int exact;
  int checked, early; /* H2D operations into the arena; those following less than all compute */
} rec_engine;

static void rec_op_queued(rec_engine *r, int zero, void *dev, size_t bytes, int64_t after) {
  if (r->n_ops < REC_OPS)
    r->ops[r->n_ops] = (rec_op){.zero = zero, .dev = dev, .bytes = bytes, .after = after};
  r->n_ops++;
  OT_CHECK(after == ZT_COPY_AFTER_ALL || (after >= 0 && after <= r->ticket),
           "an H2D operation follows compute ticket %lld, never handed out (last %lld)",
           (long long)after, (long long)r->ticket);
  char *p = dev;
  if (!r->shadow || p < r->mem->base || p >= r->mem->base + r->mem->bytes) return;
  size_t off = (size_t)(p - r->mem->base), need_at = off;
  int64_t need = 0;
  for (size_t k = off / ZT_DEV_ARENA_ALIGN; k < (off + bytes + ZT_DEV_ARENA_ALIGN - 1) / ZT_DEV_ARENA_ALIGN; k++)
    if (r->shadow[k] > need) {
      need = r->shadow[k];
      need_at = k * ZT_DEV_ARENA_ALIGN;
    }
  OT_CHECK(after != ZT_COPY_AFTER_ALL && after >= need && (!r->exact || after == need),
           "%s of %zu bytes at arena offset %zu follows compute ticket %lld; offset %zu was last "
           "used before %lld", zero ? "zeroing" : "copy", bytes, off, (long long)after, need_at,
           (long long)need);
  r->checked++;
  r->early += after < r->ticket;
}

/* The compute queued before the last ticket (a release's) may have used [p, p + bytes). */
static void rec_mark(rec_engine *r, const void *p, size_t bytes) {
  const char *c = p;
  if (!r->shadow || !c || c < r->mem->base || c >= r->mem->base + r->mem->bytes) return;
  size_t off = (size_t)(c - r->mem->base);
  for (size_t k = off / ZT_DEV_ARENA_ALIGN; k < (off + bytes + ZT_DEV_ARENA_ALIGN - 1) / ZT_DEV_ARENA_ALIGN; k++)
    r->shadow[k] = r->ticket;
}

static int64_t rec_h2d(zt_copy_engine *e, void *dev, const void *host, size_t bytes, int64_t after) {
  rec_engine *r = (rec_engine *)e;
  rec_op_queued(r, 0, dev, bytes, after);
  return r->cpu->ops->h2d(r->cpu, dev, host, bytes, after);
}

static int64_t rec_zero(zt_copy_engine *e, void *dev, size_t bytes, int64_t after) {
  rec_engine *r = (rec_engine *)e;
  rec_op_queued(r, 1, dev, bytes, after);
  return r->cpu->ops->zero(r->cpu, dev, bytes, after);
}

static int64_t rec_accumulate(zt_copy_engine *e, float *host, const float *dev, size_t n) {
  rec_engine *r = (rec_engine *)e;
  int64_t t = r->cpu->ops->grad_accumulate(r->cpu, host, dev, n);
  if (t > 0) r->last_d2h = t;
  return t;
}

static int64_t rec_d2h(zt_copy_engine *e, void *host, const void *dev, size_t bytes) {
  rec_engine *r = (rec_engine *)e;
  int64_t t = r->cpu->ops->d2h(r->cpu, host, dev, bytes);
  if (t > 0) r->last_d2h = t;
  return t;
}

static int rec_query(zt_copy_engine *e, zt_copy_queue q, int64_t ticket) {
  zt_copy_engine *cpu = ((rec_engine *)e)->cpu;
  return cpu->ops->query(cpu, q, ticket);
}

static int rec_wait(zt_copy_engine *e, zt_copy_queue q, int64_t ticket) {
  zt_copy_engine *cpu = ((rec_engine *)e)->cpu;
  return cpu->ops->wait(cpu, q, ticket);
}

static int rec_compute_wait(zt_copy_engine *e, zt_copy_queue q, int64_t ticket) {
  zt_copy_engine *cpu = ((rec_engine *)e)->cpu;
  return cpu->ops->compute_wait(cpu, q, ticket);
}

static int64_t rec_compute_ticket(zt_copy_engine *e) { return ++((rec_engine *)e)->ticket; }

static int rec_compute_mark(zt_copy_engine *e, int end) {
  zt_copy_engine *cpu = ((rec_engine *)e)->cpu;
  return cpu->ops->compute_mark(cpu, end);
}

static void rec_busy(zt_copy_engine *e, zt_copy_busy *out) {
  zt_copy_engine *cpu = ((rec_engine *)e)->cpu;
  cpu->ops->busy(cpu, out);
}

static void rec_close(zt_copy_engine *e) {
  rec_engine *r = (rec_engine *)e;
  zt_copy_close(r->cpu);
  free(r->shadow);
  free(r);
}

static const zt_copy_ops rec_ops = {
    .name = "recording",
    .h2d = rec_h2d,
    .zero = rec_zero,
    .grad_accumulate = rec_accumulate,
    .d2h = rec_d2h,
    .query = rec_query,
    .wait = rec_wait,
    .compute_wait = rec_compute_wait,
    .compute_ticket = rec_compute_ticket,
    .compute_mark = rec_compute_mark,
    .busy = rec_busy,
    .close = rec_close,
};

static int rec_open(rec_engine **out, double link_rate) {
  rec_engine *r = calloc(1, sizeof *r);
  *out = NULL;
  if (!r) return -ENOMEM;
  int rc = zt_copy_cpu_open(&r->cpu, link_rate);
  if (rc < 0) {
    free(r);
    return rc;
  }
  r->base.ops = &rec_ops;
  r->ticket = REC_T0;
  *out = r;
  return 0;
}

/* A streamer over units of the given sizes, on the recording engine and a test_mem arena. */
#define FR_MAX 301
typedef struct frig {
  int n;
  size_t slot_bytes;
  uint8_t *home[FR_MAX];
  float *hg[FR_MAX];
  float *dg[FR_MAX];     /* dev_grads buffers (with_dev) */
  zt_stream_unit units[FR_MAX];
  void *p[FR_MAX];       /* each unit's parameters at its last acquire */
  float *g[FR_MAX];      /* each unit's gradient buffer while held */
  test_mem mem;
  zt_dev_mem_ops mops;
  zt_dev_arena *dev;
  rec_engine *r;
  zt_streamer *s;
  char err[256];
} frig;

static void frig_units(frig *f, int n, const size_t *pbytes, const size_t *gfloats, int with_dev) {
  memset(f, 0, sizeof *f);
  f->n = n;
  for (int i = 0; i < n; i++) {
    f->home[i] = malloc(pbytes[i]);
    fill_params(f->home[i], pbytes[i], i, 0);
    f->hg[i] = gfloats[i] ? calloc(gfloats[i], sizeof(float)) : NULL;
    f->dg[i] = with_dev && gfloats[i] ? calloc(gfloats[i], sizeof(float)) : NULL;
    f->units[i] = (zt_stream_unit){.param_bytes = pbytes[i], .host_params = f->home[i],
                                   .grad_floats = gfloats[i], .host_grads = f->hg[i],
                                   .dev_grads = f->dg[i]};
  }
}

/* cfg: prefetch_depth, max_acquired, slot_bytes; the rest is the rig's. */
static int frig_start(frig *f, zt_streamer_cfg cfg, size_t budget, double link_rate) {
  f->mops = (zt_dev_mem_ops){.name = "test", .alloc = test_mem_alloc, .free = test_mem_free,
                             .ctx = &f->mem};
  int rc = zt_dev_arena_open(&f->dev, budget, &f->mops, f->err, sizeof f->err);
  if (rc < 0) return rc;
  if ((rc = rec_open(&f->r, link_rate)) < 0) return rc;
  f->r->mem = &f->mem;
  f->r->exact = cfg.slot_bytes != 0;
  if (!(f->r->shadow = calloc(f->mem.bytes / ZT_DEV_ARENA_ALIGN, sizeof *f->r->shadow))) return -ENOMEM;
  f->slot_bytes = cfg.slot_bytes;
  cfg.n_units = f->n;
  cfg.units = f->units;
  cfg.dev = f->dev;
  cfg.copy = &f->r->base;
  return zt_streamer_open(&f->s, &cfg, f->err, sizeof f->err);
}

static void frig_close(frig *f) {
  zt_streamer_close(f->s);
  if (f->r) zt_copy_close(&f->r->base);
  zt_dev_arena_close(f->dev);
  for (int i = 0; i < f->n; i++) {
    free(f->home[i]);
    free(f->hg[i]);
    free(f->dg[i]);
  }
}

/* Acquires and checks the parameters' bytes; remembers the buffers for frel. */
static int facq(frig *f, int unit, unsigned flags, void **p, float **g) {
  void *pp = NULL;
  float *gg = NULL;
  int rc = zt_streamer_acquire(f->s, unit, flags, &pp, &gg);
  if (rc < 0) return rc;
  OT_CHECK(params_ok(pp, f->units[unit].param_bytes, unit, 0), "unit %d's parameters are wrong on the device", unit);
  f->p[unit] = pp;
  if (flags & ZT_STREAM_GRADS) f->g[unit] = gg;
  if (p) *p = pp;
  if (g) *g = gg;
  return 0;
}

/* Releases, checks that the release took one compute ticket and returns it; the unit's buffers
 * were last used by the compute before it. */
static int64_t frel(frig *f, int unit, unsigned flags) {
  int64_t before = f->r->ticket;
  int rc = zt_streamer_release(f->s, unit, flags);
  OT_CHECK(rc == 0 && f->r->ticket == before + 1, "release %d: %d, took %lld compute tickets (%s)", unit, rc,
           (long long)(f->r->ticket - before), zt_streamer_error(f->s));
  size_t pb = f->units[unit].param_bytes, gb = f->units[unit].grad_floats * sizeof(float);
  rec_mark(f->r, f->p[unit], f->slot_bytes ? f->slot_bytes : pb);
  if (f->g[unit]) rec_mark(f->r, f->g[unit], f->slot_bytes ? f->slot_bytes : gb);
  f->g[unit] = NULL;
  return f->r->ticket;
}

/* The H2D operations queued since n0 are one: a copy (zero 0) or a zeroing of dev following
 * `after`. */
static void expect_op(const rec_engine *r, int n0, int zero, const void *dev, int64_t after, const char *what) {
  OT_CHECK(r->n_ops == n0 + 1, "%s: %d H2D operations queued, want 1", what, r->n_ops - n0);
  if (r->n_ops != n0 + 1 || n0 >= REC_OPS) return;
  const rec_op *o = &r->ops[n0];
  OT_CHECK(o->zero == zero && o->dev == (const char *)dev && o->after == after,
           "%s: %s of %p following %lld, want %s of %p following %lld", what, o->zero ? "zeroing" : "copy",
           (void *)o->dev, (long long)o->after, zero ? "zeroing" : "copy", dev, (long long)after);
}

#define FN 4
#define FS 1024u /* slot test: each unit's parameter bytes, gradient bytes and slot */

/* Slot mode: n units of FS parameter and gradient bytes each, three slots of FS. */
static int frig_slots(frig *f, int n, int prefetch_depth) {
  size_t pb[FN], gf[FN];
  for (int i = 0; i < n; i++) {
    pb[i] = FS;
    gf[i] = FS / sizeof(float);
  }
  frig_units(f, n, pb, gf, 0);
  return frig_start(f, (zt_streamer_cfg){.prefetch_depth = prefetch_depth, .slot_bytes = FS},
                    3 * FS, 0);
}

/* Slot mode, three slots, prefetch depth 1: a fetch into memory nothing used follows no compute;
 * one into a slot freed by an eviction, a clean release's discarded gradient buffer or a dirty
 * release's written-back one follows exactly the release that last used the slot, not the
 * compute queued since. */
static void test_fence_slots(void) {
  frig f;
  int rc = frig_slots(&f, FN, 1);
  OT_CHECK(rc == 0, "open: %d %s", rc, f.err);
  if (rc < 0) goto out;
  rec_engine *r = f.r;
  char *slot[3] = {f.mem.base, f.mem.base + FS, f.mem.base + 2 * FS};
  void *p = NULL;
  float *g = NULL;

  int n0 = r->n_ops;
  OT_CHECK(facq(&f, 0, 0, &p, NULL) == 0 && p == slot[0], "acquire 0 at %p", p);
  expect_op(r, n0, 0, slot[0], 0, "unit 0's fetch on a fresh arena");
  n0 = r->n_ops;
  OT_CHECK(zt_streamer_prefetch(f.s, 1) == 0, "prefetch 1");
  expect_op(r, n0, 0, slot[1], 0, "unit 1's prefetch on a fresh arena");
  int64_t t0 = frel(&f, 0, 0);
  OT_CHECK(facq(&f, 1, 0, &p, NULL) == 0 && p == slot[1], "acquire 1 at %p", p);
  n0 = r->n_ops;
  OT_CHECK(zt_streamer_prefetch(f.s, 2) == 0, "prefetch 2");
  expect_op(r, n0, 0, slot[2], 0, "unit 2's prefetch on a fresh arena");
  int64_t t1 = frel(&f, 1, 0);
  OT_CHECK(facq(&f, 2, 0, &p, NULL) == 0 && p == slot[2], "acquire 2 at %p", p);

  /* unit 3's prefetch evicts unit 0 (behind the walk, least recently used) */
  n0 = r->n_ops;
  OT_CHECK(zt_streamer_prefetch(f.s, 3) == 0, "prefetch 3: %s", zt_streamer_error(f.s));
  OT_CHECK(!zt_streamer_is_resident(f.s, 0), "unit 0 should be evicted");
  expect_op(r, n0, 0, slot[0], t0, "unit 3's prefetch into unit 0's slot");
  OT_CHECK(t0 < t1 && t1 == r->ticket, "tickets %lld %lld, last %lld: the copy must follow an older one",
           (long long)t0, (long long)t1, (long long)r->ticket);
  int64_t t2 = frel(&f, 2, 0);

  /* unit 3's gradient buffer evicts unit 1: its zeroing follows unit 1's release */
  n0 = r->n_ops;
  OT_CHECK(facq(&f, 3, ZT_STREAM_GRADS, &p, &g) == 0 && p == slot[0] && g == (float *)slot[1],
           "acquire 3 with gradients: %p %p", p, (void *)g);
  expect_op(r, n0, 1, slot[1], t1, "unit 3's gradient zeroing in unit 1's slot");
  for (size_t k = 0; g && k < FS / sizeof(float); k++) g[k] = 1.0f;
  int64_t t3 = frel(&f, 3, 0); /* clean: the buffer is discarded */
  zt_streamer_stats st;
  zt_streamer_get_stats(f.s, &st);
  size_t nz = 0;
  for (size_t k = 0; k < FS / sizeof(float); k++) nz += f.hg[3][k] != 0.0f;
  OT_CHECK(st.grad_writebacks == 0 && nz == 0, "a clean release wrote back (%llu, %zu nonzero)",
           (unsigned long long)st.grad_writebacks, nz);

  /* the discarded buffer's slot: the fetch into it follows that clean release */
  n0 = r->n_ops;
  OT_CHECK(facq(&f, 0, 0, &p, NULL) == 0 && p == slot[1], "acquire 0 at %p", p);
  expect_op(r, n0, 0, slot[1], t3, "unit 0's fetch into the discarded gradient buffer's slot");
  frel(&f, 0, 0);

  /* unit 0's gradient buffer evicts unit 2 (behind the walk, now going down, and older than 3) */
  n0 = r->n_ops;
  OT_CHECK(facq(&f, 0, ZT_STREAM_GRADS, &p, &g) == 0 && g == (float *)slot[2], "acquire 0 with gradients: %p",
           (void *)g);
  expect_op(r, n0, 1, slot[2], t2, "unit 0's gradient zeroing in unit 2's slot");
  for (size_t k = 0; g && k < FS / sizeof(float); k++) g[k] = grad_value(0, k, 0);
  int64_t t5 = frel(&f, 0, ZT_STREAM_DIRTY);
  OT_CHECK(zt_streamer_wait_grads(f.s, 0) == 0, "wait_grads");
  size_t bad = 0;
  for (size_t k = 0; k < FS / sizeof(float); k++) bad += f.hg[0][k] != grad_value(0, k, 0);
  OT_CHECK(bad == 0, "%zu host gradients of unit 0 wrong after its write-back", bad);

  /* the written-back buffer's slot: the fetch follows the dirty release */
  n0 = r->n_ops;
  OT_CHECK(facq(&f, 1, 0, &p, NULL) == 0 && p == slot[2], "acquire 1 at %p", p);
  expect_op(r, n0, 0, slot[2], t5, "unit 1's fetch into the written-back gradient buffer's slot");
  frel(&f, 1, 0);

  zt_streamer_get_stats(f.s, &st);
  OT_CHECK(st.fetches == 6 && st.bytes_h2d == 6 * FS && st.grad_writebacks == 1,
           "%llu fetches, %llu bytes H2D, %llu write-backs", (unsigned long long)st.fetches,
           (unsigned long long)st.bytes_h2d, (unsigned long long)st.grad_writebacks);
  OT_CHECK(r->checked == r->n_ops && r->n_ops == 8, "%d H2D operations, %d into the arena", r->n_ops, r->checked);
out:
  frig_close(&f);
}

/* Slot mode, three slots, a backward walk from the last unit: unit n-1 with its gradients,
 * released dirty (its write-back in flight), then unit n-2 with its gradients, no slot free.
 * With n 3 every copy fits the arena: the gradient buffer takes the write-back's slot and the
 * copies stay. With n 4 (streaming) it takes unit n-1's copy, behind the walk, without waiting
 * for the write-back: its zeroing follows unit n-1's release on the device. */
static void test_grads_take_behind(int n) {
  frig f;
  int rc = frig_slots(&f, n, 0);
  OT_CHECK(rc == 0, "open: %d %s", rc, f.err);
  if (rc < 0) goto out;
  char *slot[3] = {f.mem.base, f.mem.base + FS, f.mem.base + 2 * FS};
  void *p = NULL;
  float *g = NULL;
  OT_CHECK(facq(&f, n - 1, ZT_STREAM_GRADS, &p, &g) == 0 && p == slot[0] && g == (float *)slot[1],
           "acquire %d with gradients: %p %p", n - 1, p, (void *)g);
  for (size_t k = 0; g && k < FS / sizeof(float); k++) g[k] = grad_value(n - 1, k, 0);
  int64_t t = frel(&f, n - 1, ZT_STREAM_DIRTY);
  int n0 = f.r->n_ops;
  OT_CHECK(facq(&f, n - 2, ZT_STREAM_GRADS, &p, &g) == 0 && p == slot[2], "acquire %d at %p", n - 2, p);
  zt_streamer_stats st;
  zt_streamer_get_stats(f.s, &st);
  if (n == 4) {
    OT_CHECK(g == (float *)slot[0] && !zt_streamer_is_resident(f.s, n - 1) && st.evictions == 1,
             "streaming: the gradient buffer at %p, %llu evictions: want unit %d's copy's slot",
             (void *)g, (unsigned long long)st.evictions, n - 1);
    expect_op(f.r, n0 + 1, 1, slot[0], t, "the gradient zeroing in the evicted copy's slot");
  } else {
    OT_CHECK(g == (float *)slot[1] && zt_streamer_is_resident(f.s, n - 1) && st.evictions == 0,
             "every copy fits: the gradient buffer at %p, %llu evictions: want the write-back's slot",
             (void *)g, (unsigned long long)st.evictions);
  }
  frel(&f, n - 2, ZT_STREAM_DIRTY);
  OT_CHECK(zt_streamer_wait_grads(f.s, -1) == 0, "wait_grads");
  size_t bad = 0;
  for (size_t k = 0; k < FS / sizeof(float); k++) bad += f.hg[n - 1][k] != grad_value(n - 1, k, 0);
  OT_CHECK(bad == 0, "%zu host gradients of unit %d wrong after its write-back", bad, n - 1);
out:
  frig_close(&f);
}

/* Exact sizes: units 0 and 1 (1024 bytes each, side by side) are dropped, 1 first, leaving one
 * hole with two fences, unit 1's the later. A 512-byte copy at the hole's start overlaps only
 * unit 0's old bytes; a 1024-byte one after it overlaps both partly and follows the later. */
static void test_fence_overlap(void) {
  frig f;
  size_t pb[5] = {1024, 1024, 1024, 512, 1024}, gf[5] = {0};
  frig_units(&f, 5, pb, gf, 0);
  int rc = frig_start(&f, (zt_streamer_cfg){.prefetch_depth = 0}, 8192, 0);
  OT_CHECK(rc == 0, "open: %d %s", rc, f.err);
  if (rc < 0) goto out;
  char *b = f.mem.base;
  void *p = NULL;
  int64_t t[3];
  for (int i = 0; i < 3; i++) {
    int n0 = f.r->n_ops;
    OT_CHECK(facq(&f, i, 0, &p, NULL) == 0 && p == b + 1024 * i, "acquire %d at %p", i, p);
    expect_op(f.r, n0, 0, b + 1024 * i, 0, "a fetch on a fresh arena");
    t[i] = frel(&f, i, 0);
  }
  OT_CHECK(zt_streamer_invalidate(f.s, 1) == 0 && zt_streamer_invalidate(f.s, 0) == 0, "invalidate");
  int n0 = f.r->n_ops;
  OT_CHECK(facq(&f, 3, 0, &p, NULL) == 0 && p == b, "acquire 3 at %p", p);
  expect_op(f.r, n0, 0, b, t[0], "512 bytes over the head of unit 0's old copy");
  frel(&f, 3, 0);
  n0 = f.r->n_ops;
  OT_CHECK(facq(&f, 4, 0, &p, NULL) == 0 && p == b + 512, "acquire 4 at %p", p);
  expect_op(f.r, n0, 0, b + 512, t[1], "1024 bytes over the tail of unit 0's copy and the head of unit 1's");
  frel(&f, 4, 0);
  OT_CHECK(t[0] < t[1] && t[1] < t[2], "tickets %lld %lld %lld", (long long)t[0], (long long)t[1], (long long)t[2]);
out:
  frig_close(&f);
}

/* Past FENCES_MAX (256 in streamer.c) fences the streamer forgets them into a floor, the latest
 * of those forgotten: 300 units of 256 bytes fill the arena and are dropped in order, so units
 * 0..255's fences go into the floor (unit 255's ticket) and 256..299's stay. */
#define FF 300
static void test_fence_floor(void) {
  frig f;
  size_t pb[FF + 1], gf[FF + 1] = {0};
  for (int i = 0; i < FF; i++) pb[i] = ZT_DEV_ARENA_ALIGN;
  pb[FF] = 255 * ZT_DEV_ARENA_ALIGN;
  frig_units(&f, FF + 1, pb, gf, 0);
  int rc = frig_start(&f, (zt_streamer_cfg){.prefetch_depth = 0}, FF * ZT_DEV_ARENA_ALIGN, 0);
  OT_CHECK(rc == 0, "open: %d %s", rc, f.err);
  if (rc < 0) goto out;
  char *b = f.mem.base;
  int64_t t[FF];
  void *p = NULL;
  int fresh = 1;
  for (int i = 0; i < FF; i++) {
    int n0 = f.r->n_ops;
    rc = facq(&f, i, 0, &p, NULL);
    OT_CHECK(rc == 0 && p == b + i * ZT_DEV_ARENA_ALIGN, "acquire %d: %d at %p", i, rc, p);
    fresh &= f.r->n_ops == n0 + 1 && f.r->ops[n0].after == 0;
    t[i] = frel(&f, i, 0);
  }
  OT_CHECK(fresh, "a fetch into memory nothing used follows compute");
  for (int i = 0; i < FF; i++) OT_CHECK(zt_streamer_invalidate(f.s, i) == 0, "invalidate %d", i);
  int n0 = f.r->n_ops;
  OT_CHECK(facq(&f, 0, 0, &p, NULL) == 0 && p == b, "acquire 0 at %p", p);
  expect_op(f.r, n0, 0, b, t[255], "a copy over a forgotten fence follows the floor");
  frel(&f, 0, 0);
  n0 = f.r->n_ops;
  OT_CHECK(facq(&f, FF, 0, &p, NULL) == 0 && p == b + ZT_DEV_ARENA_ALIGN, "acquire %d at %p", FF, p);
  expect_op(f.r, n0, 0, b + ZT_DEV_ARENA_ALIGN, t[255], "a copy over units 1..255's forgotten fences");
  frel(&f, FF, 0);
  n0 = f.r->n_ops;
  OT_CHECK(facq(&f, 1, 0, &p, NULL) == 0 && p == b + 256 * ZT_DEV_ARENA_ALIGN, "acquire 1 at %p", p);
  expect_op(f.r, n0, 0, b + 256 * ZT_DEV_ARENA_ALIGN, t[256], "a copy over unit 256's kept fence");
  frel(&f, 1, 0);
out:
  frig_close(&f);
}

/* Random walks (two units held, gradients, dirty and clean releases, invalidations) through the
 * recording engine: every H2D into the arena follows the last release that used its bytes
 * (exactly, in slot mode), most follow less than all the compute, and the bytes and the
 * gradient sums stay right. Exact sizes may fragment: -ENOMEM and -EAGAIN are allowed there. */
static void test_fence_random(int slots) {
  frig f;
  uint64_t seed = slots ? 0x51075 : 0xfe5ce;
  size_t pb[NR], gf[NR], slot = 4 * 4096;
  float *want[NR];
  for (int i = 0; i < NR; i++) {
    pb[i] = 4 * (1 + ot_next(&seed) % 4096);
    gf[i] = pb[i] / 4;
    want[i] = calloc(gf[i], sizeof(float));
  }
  frig_units(&f, NR, pb, gf, 0);
  zt_streamer_cfg cfg = {.n_units = NR, .units = f.units, .prefetch_depth = 2, .max_acquired = 2,
                         .slot_bytes = slots ? slot : 0};
  int rc = frig_start(&f, cfg, zt_streamer_min_device_bytes(&cfg) * 3 / 2, 0);
  OT_CHECK(rc == 0, "open: %d %s", rc, f.err);
  int held[2] = {-1, -1}, acquired = 0, refused = 0, writebacks = 0;
  for (int op = 0; rc == 0 && op < 3000; op++) {
    int u = (int)(ot_next(&seed) % NR), k = (int)(ot_next(&seed) % 2), r;
    switch (ot_next(&seed) % 5) {
    case 0:
      r = zt_streamer_prefetch(f.s, u);
      OT_CHECK(r == 0 || r == -EAGAIN, "prefetch %d: %d %s", u, r, zt_streamer_error(f.s));
      break;
    case 1:
    case 2: {
      if (held[k] >= 0 || held[!k] == u) break;
      float *g = NULL;
      unsigned flags = ot_next(&seed) % 2 ? ZT_STREAM_GRADS : 0;
      r = facq(&f, u, flags, NULL, &g);
      OT_CHECK(r == 0 || (!slots && r == -ENOMEM), "acquire %d: %d %s", u, r, zt_streamer_error(f.s));
      refused += r < 0;
      if (r < 0) break;
      acquired++;
      held[k] = u;
      for (size_t j = 0; g && j < gf[u]; j++) OT_CHECK(g[j] == 0.0f, "unit %d: gradient buffer not zero", u);
      break;
    }
    case 3: {
      if (held[k] < 0) break;
      int h = held[k];
      float *g = f.g[h];
      int dirty = g && ot_next(&seed) % 4 != 0;
      for (size_t j = 0; g && j < gf[h]; j++) {
        g[j] = (float)(op % 7 + 1);
        if (dirty) want[h][j] += (float)(op % 7 + 1);
      }
      frel(&f, h, dirty ? ZT_STREAM_DIRTY : 0);
      writebacks += dirty;
      held[k] = -1;
      break;
    }
    case 4:
      if (held[0] == u || held[1] == u) break;
      OT_CHECK(zt_streamer_invalidate(f.s, u) == 0, "invalidate %d: %s", u, zt_streamer_error(f.s));
      break;
    }
  }
  for (int k = 0; rc == 0 && k < 2; k++)
    if (held[k] >= 0) frel(&f, held[k], 0);
  if (rc == 0) OT_CHECK(zt_streamer_wait_grads(f.s, -1) == 0, "wait_grads");
  fprintf(stderr, "fence walk (%s): %d acquires, %d refused, %d write-backs, %d H2D checked, %d early\n",
          slots ? "slots" : "exact", acquired, refused, writebacks, f.r ? f.r->checked : 0, f.r ? f.r->early : 0);
  OT_CHECK(acquired > 300 && writebacks > 100 && refused < acquired / 10, "the walk did too little");
  OT_CHECK(f.r && f.r->checked > 300 && f.r->early > f.r->checked / 4,
           "too few H2D operations follow less than all the compute");
  size_t bad = 0;
  for (int i = 0; i < NR; i++)
    for (size_t j = 0; j < gf[i]; j++) bad += f.hg[i][j] != want[i][j];
  OT_CHECK(bad == 0, "%zu host gradients differ from the dirty releases' sum", bad);
  frig_close(&f);
  for (int i = 0; i < NR; i++) free(want[i]);
}

/* ---- gradients in a device buffer of the caller's (dev_grads) ------------------------------- */

#define DN 4
#define DP 4096u /* parameter bytes per unit */
#define DG 1024u /* gradient floats per unit */

static void dev_sizes(size_t *pb, size_t *gf) {
  for (int i = 0; i < DN; i++) {
    pb[i] = DP;
    gf[i] = DG;
  }
}

static size_t arena_used(const frig *f) {
  zt_dev_arena_stats a;
  zt_dev_arena_get_stats(f->dev, &a);
  return a.used;
}

/* The minimum leaves out the gradients of units with device buffers; the arena, at that
 * minimum, never gives them one: acquires hand out the caller's buffer zeroed (the zeroing
 * follows all compute: the caller's kernels may use it any time) or, resumed, as it is with no
 * copy; a clean release leaves it, a dirty one copies it to the host and keeps it. A slow link
 * shows that an acquire waits for the buffer's write-back before handing it out again. */
static void test_dev_grads(void) {
  frig f;
  size_t pb[DN], gf[DN], fp = zt_dev_arena_footprint(DP), gfp = zt_dev_arena_footprint(DG * sizeof(float));
  dev_sizes(pb, gf);
  frig_units(&f, DN, pb, gf, 1);
  zt_streamer_cfg cfg = {.n_units = DN, .units = f.units, .prefetch_depth = 1};
  size_t with = zt_streamer_min_device_bytes(&cfg);
  for (int i = 0; i < DN; i++) f.units[i].dev_grads = NULL;
  size_t without = zt_streamer_min_device_bytes(&cfg);
  f.units[3].grad_floats = DG / 4; /* the one unit without a device buffer, and smaller */
  for (int i = 0; i < 3; i++) f.units[i].dev_grads = f.dg[i];
  size_t mixed = zt_streamer_min_device_bytes(&cfg);
  f.units[3].grad_floats = DG;
  f.units[3].dev_grads = f.dg[3];
  OT_CHECK(with == 2 * fp && without == 2 * fp + gfp && mixed == 2 * fp + zt_dev_arena_footprint(DG),
           "minimum with device buffers %zu, without %zu, one unit without %zu", with, without, mixed);

  const size_t gb = DG * sizeof(float);
  int rc = frig_start(&f, (zt_streamer_cfg){.prefetch_depth = 1}, with, DP / 0.01);
  OT_CHECK(rc == 0, "open at %zu bytes: %d %s", with, rc, f.err);
  if (rc < 0) goto out;
  float *dg = f.dg[0], *g = NULL, want[DG];
  for (size_t k = 0; k < DG; k++) dg[k] = 7.0f;
  size_t used0 = arena_used(&f);
  int n0 = f.r->n_ops;
  rc = facq(&f, 0, ZT_STREAM_GRADS, NULL, &g);
  OT_CHECK(rc == 0 && g == dg, "acquire with gradients: %d %s, %p for the device buffer %p", rc, zt_streamer_error(f.s),
           (void *)g, (void *)dg);
  if (rc < 0) goto out;
  size_t nz = 0;
  for (size_t k = 0; k < DG; k++) nz += dg[k] != 0.0f || signbit(dg[k]);
  OT_CHECK(nz == 0, "the device buffer is not zeroed (%zu elements)", nz);
  int zeroings = 0;
  for (int i = n0; i < f.r->n_ops; i++) {
    const rec_op *o = &f.r->ops[i];
    if (o->dev != (char *)dg) continue;
    zeroings++;
    OT_CHECK(o->zero && o->bytes == gb && o->after == ZT_COPY_AFTER_ALL,
             "the device buffer's %s of %zu bytes follows %lld, want a zeroing after all compute",
             o->zero ? "zeroing" : "copy", o->bytes, (long long)o->after);
  }
  OT_CHECK(zeroings == 1 && f.r->n_ops == n0 + 2, "%d zeroings of the device buffer, %d H2D operations", zeroings,
           f.r->n_ops - n0);
  OT_CHECK(arena_used(&f) == used0 + fp, "the acquire took %zu arena bytes, want the parameters' %zu",
           arena_used(&f) - used0, fp);

  /* a clean release leaves the buffer and writes nothing back */
  for (size_t k = 0; k < DG; k++) want[k] = dg[k] = grad_value(0, k, 0);
  zt_streamer_stats st0, st;
  zt_streamer_get_stats(f.s, &st0);
  frel(&f, 0, 0);
  zt_streamer_get_stats(f.s, &st);
  nz = 0;
  for (size_t k = 0; k < DG; k++) nz += f.hg[0][k] != 0.0f;
  OT_CHECK(memcmp(dg, want, gb) == 0 && st.grad_writebacks == st0.grad_writebacks && nz == 0,
           "a clean release changed the device buffer, wrote back (%llu) or touched the host (%zu)",
           (unsigned long long)(st.grad_writebacks - st0.grad_writebacks), nz);

  /* resumed: the buffer as it is, nothing copied */
  n0 = f.r->n_ops;
  rc = facq(&f, 0, ZT_STREAM_GRADS | ZT_STREAM_GRADS_RESUME, NULL, &g);
  zt_streamer_get_stats(f.s, &st0);
  OT_CHECK(rc == 0 && g == dg && memcmp(dg, want, gb) == 0, "resumed acquire: %d, %p, content changed", rc, (void *)g);
  OT_CHECK(f.r->n_ops == n0 && st0.bytes_h2d == st.bytes_h2d && st0.hits == st.hits + 1,
           "resumed acquire: %d H2D operations, %llu bytes H2D", f.r->n_ops - n0,
           (unsigned long long)(st0.bytes_h2d - st.bytes_h2d));
  if (rc < 0) goto out;

  /* a dirty release stores it over the host gradients and keeps it */
  for (size_t k = 0; k < DG; k++) want[k] = dg[k] += grad_value(0, k, 1);
  frel(&f, 0, ZT_STREAM_DIRTY | ZT_STREAM_STORE);
  zt_streamer_get_stats(f.s, &st);
  OT_CHECK(st.grad_writebacks == st0.grad_writebacks + 1 && st.bytes_d2h == st0.bytes_d2h + gb,
           "dirty release: %llu write-backs, %llu bytes D2H", (unsigned long long)(st.grad_writebacks - st0.grad_writebacks),
           (unsigned long long)(st.bytes_d2h - st0.bytes_d2h));
  OT_CHECK(arena_used(&f) == used0 + fp, "arena %zu bytes after a dirty release, want %zu", arena_used(&f),
           used0 + fp);
  /* at once again: the write-back (10 ms on this link) has landed before the buffer is given */
  rc = facq(&f, 0, ZT_STREAM_GRADS | ZT_STREAM_GRADS_RESUME, NULL, &g);
  OT_CHECK(rc == 0 && g == dg, "acquire after the dirty release: %d", rc);
  OT_CHECK(f.r->cpu->ops->query(f.r->cpu, ZT_COPY_D2H, f.r->last_d2h) == 1 && memcmp(f.hg[0], want, gb) == 0,
           "the buffer is handed out before its write-back landed");
  if (rc == 0) frel(&f, 0, 0);
  OT_CHECK(zt_streamer_wait_grads(f.s, 0) == 0, "wait_grads");
  OT_CHECK(memcmp(f.hg[0], want, gb) == 0 && memcmp(dg, want, gb) == 0,
           "after the write-back the host gradients or the device buffer are not the sum");
  OT_CHECK(arena_used(&f) == used0 + fp, "arena %zu bytes at the end, want %zu", arena_used(&f), used0 + fp);
out:
  frig_close(&f);
}

static float mb_value(int unit, size_t k, int mb) {
  return (float)((k * 37 + (size_t)unit * 11 + (size_t)mb * 5) % 101) * 0.01f + (float)mb * 0.3f + 1e-4f;
}

/* Three micro-batches walking down the units (prefetch 1, a budget for two parameter copies):
 * with device buffers the sums stay on the device (resumed, stored on the last micro-batch
 * only); without, the arena path resumes from and stores over the host each time. The host
 * gradients are bitwise the same, and those of the plain sum in that order. */
#define DMB 3
static void dev_walk(frig *f, int with_dev) {
  for (int mb = 0; mb < DMB; mb++)
    for (int i = DN - 1; i >= 0; i--) {
      float *g = NULL;
      int rc = facq(f, i, ZT_STREAM_GRADS | (mb ? ZT_STREAM_GRADS_RESUME : 0), NULL, &g);
      OT_CHECK(rc == 0, "micro-batch %d acquire %d: %d %s", mb, i, rc, zt_streamer_error(f->s));
      if (rc < 0) continue;
      OT_CHECK(!with_dev || g == f->dg[i], "unit %d: not its device buffer", i);
      if (i > 0) OT_CHECK(zt_streamer_prefetch(f->s, i - 1) == 0, "prefetch %d: %s", i - 1, zt_streamer_error(f->s));
      for (size_t k = 0; k < DG; k++) g[k] += mb_value(i, k, mb);
      unsigned flags = ZT_STREAM_DIRTY | ZT_STREAM_STORE;
      frel(f, i, with_dev && mb < DMB - 1 ? 0 : flags);
    }
  OT_CHECK(zt_streamer_wait_grads(f->s, -1) == 0, "wait_grads");
}

static void test_dev_grads_walk(void) {
  frig a, d;
  size_t pb[DN], gf[DN];
  dev_sizes(pb, gf);
  frig_units(&a, DN, pb, gf, 0);
  frig_units(&d, DN, pb, gf, 1);
  zt_streamer_cfg cfg = {.n_units = DN, .units = a.units, .prefetch_depth = 1};
  int rc = frig_start(&a, cfg, zt_streamer_min_device_bytes(&cfg), 0);
  OT_CHECK(rc == 0, "open the arena path: %d %s", rc, a.err);
  cfg.units = d.units;
  if (rc == 0) rc = frig_start(&d, cfg, zt_streamer_min_device_bytes(&cfg), 0);
  OT_CHECK(rc == 0, "open the device path: %d %s", rc, d.err);
  if (rc < 0) goto out;
  dev_walk(&a, 0);
  dev_walk(&d, 1);
  size_t bad = 0, bad_dev = 0;
  for (int i = 0; i < DN; i++)
    for (size_t k = 0; k < DG; k++) {
      float sum = 0.0f;
      for (int mb = 0; mb < DMB; mb++) sum += mb_value(i, k, mb);
      bad += memcmp(&a.hg[i][k], &sum, sizeof sum) != 0;
      bad_dev += memcmp(&d.hg[i][k], &sum, sizeof sum) != 0;
    }
  OT_CHECK(bad == 0 && bad_dev == 0, "host gradients not the sum: %zu on the arena path, %zu with device buffers",
           bad, bad_dev);
  zt_streamer_stats sa, sd;
  zt_streamer_get_stats(a.s, &sa);
  zt_streamer_get_stats(d.s, &sd);
  const uint64_t gb = DG * sizeof(float);
  OT_CHECK(sa.grad_writebacks == DN * DMB && sa.bytes_h2d == sa.fetches * DP + (DMB - 1) * DN * gb,
           "arena path: %llu write-backs, %llu bytes H2D for %llu fetches", (unsigned long long)sa.grad_writebacks,
           (unsigned long long)sa.bytes_h2d, (unsigned long long)sa.fetches);
  OT_CHECK(sd.grad_writebacks == DN && sd.bytes_d2h == DN * gb && sd.bytes_h2d == sd.fetches * DP,
           "device path: %llu write-backs, %llu bytes D2H, %llu bytes H2D for %llu fetches",
           (unsigned long long)sd.grad_writebacks, (unsigned long long)sd.bytes_d2h,
           (unsigned long long)sd.bytes_h2d, (unsigned long long)sd.fetches);
  int zeroings = 0, copies = 0, all = 0;
  for (int j = 0; j < d.r->n_ops && j < REC_OPS; j++) {
    const rec_op *o = &d.r->ops[j];
    int own = 0;
    for (int i = 0; i < DN; i++) own |= o->dev == (char *)d.dg[i];
    zeroings += own && o->zero && o->after == ZT_COPY_AFTER_ALL;
    copies += own && !o->zero;
    all += !own && o->after == ZT_COPY_AFTER_ALL;
  }
  OT_CHECK(zeroings == DN && copies == 0 && all == 0,
           "device path: %d zeroings of the device buffers after all compute (want %d), %d copies into them, %d "
           "arena operations after all compute", zeroings, DN, copies, all);
  for (int j = 0; j < a.r->n_ops && j < REC_OPS; j++)
    OT_CHECK(a.r->ops[j].after != ZT_COPY_AFTER_ALL, "arena path: H2D %d follows all compute", j);
out:
  frig_close(&a);
  frig_close(&d);
}

/* A device buffer needs gradients; it exempts the gradients from the slot size. */
static void test_dev_grads_cfg(void) {
  frig f;
  size_t pb[2] = {DP, DP}, gf[2] = {DG, DG};
  frig_units(&f, 2, pb, gf, 1);
  f.units[1].grad_floats = 0;
  int rc = frig_start(&f, (zt_streamer_cfg){.prefetch_depth = 1}, 1 << 20, 0);
  OT_CHECK(rc == -EINVAL && strstr(f.err, "unit 1 has a device gradient buffer but no gradients"),
           "a device buffer without gradients: %d %s", rc, f.err);
  if (!f.dev || !f.r) goto out;
  /* 4096 gradient bytes over 2048-byte slots: fine in device buffers, not in the arena */
  f.units[1].grad_floats = DG;
  f.units[0].param_bytes = f.units[1].param_bytes = DP / 2;
  zt_streamer_cfg cfg = {.n_units = 2, .units = f.units, .dev = f.dev, .copy = &f.r->base,
                         .prefetch_depth = 1, .slot_bytes = DP / 2};
  char err[256] = "";
  zt_streamer *s = NULL;
  rc = zt_streamer_open(&s, &cfg, err, sizeof err);
  OT_CHECK(rc == 0, "slots smaller than gradients kept in device buffers: %d %s", rc, err);
  zt_streamer_close(s);
  s = NULL;
  f.units[0].dev_grads = NULL;
  rc = zt_streamer_open(&s, &cfg, err, sizeof err);
  OT_CHECK(rc == -EINVAL && strstr(err, "unit 0 does not fit a slot"), "gradients over the slot in the arena: %d %s",
           rc, err);
  zt_streamer_close(s);
out:
  frig_close(&f);
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
  test_fence_slots();
  test_grads_take_behind(3);
  test_grads_take_behind(4);
  test_fence_overlap();
  test_fence_floor();
  test_fence_random(1);
  test_fence_random(0);
  test_dev_grads();
  test_dev_grads_walk();
  test_dev_grads_cfg();
  if (ot_failures) fprintf(stderr, "%d failures\n", ot_failures);
  return ot_failures ? 1 : 0;
}
