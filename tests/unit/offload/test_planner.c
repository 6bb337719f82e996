/* The memory planner: a tiny unit list whose bytes are worked out by hand under budgets that
 * force each kind of plan, refusals with the numbers, a GPT-2 1.5B unit list from the model
 * adapter, monotonicity of the estimate in the budgets, the renderings, and the streamer moving
 * exactly the transfers a plan predicts. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/model.h"
#include "offload/device_arena.h"
#include "engine/plan/planner.h"
#include "offload/streamer.h"
#include "otest.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

static zt_plan_cost cost(void) {
  return (zt_plan_cost){.h2d_bytes_per_s = 10e9, .d2h_bytes_per_s = 10e9, .nvme_read_bytes_per_s = 3e9,
                        .nvme_write_bytes_per_s = 2e9, .cpu_adam_params_per_s = 1e9,
                        .dev_adam_params_per_s = 1e11};
}

/* Four units of 1 MiB fp32 parameters (256 Ki floats), 1 ms forward and 2 ms backward each;
 * activations 3 MiB, 1 MiB checkpointed. Sizes are whole pages, so every footprint is exact. */
static zt_plan_unit tiny_units[4];

static zt_plan_input tiny(size_t dev, size_t host, size_t nvme) {
  for (int i = 0; i < 4; i++)
    tiny_units[i] = (zt_plan_unit){.master_bytes = MiB, .param_bytes = MiB, .grad_bytes = MiB, .fwd_s = 1e-3,
                                   .bwd_s = 2e-3, .checkpointable = 1, .companion = -1};
  return (zt_plan_input){.n_units = 4, .units = tiny_units, .act_bytes = 3 * MiB, .act_ckpt_bytes = MiB,
                         .grad_accum = 1, .prefetch_depth = 1, .device_budget = dev, .host_budget = host,
                         .nvme_budget = nvme, .cost = cost(), .optimizer = ZT_TIER_AUTO,
                         .params = ZT_TIER_AUTO, .ckpt = -1};
}

#define B(t, k) p.bytes[ZT_TIER_##t][ZT_KIND_##k]

static void test_tiny(void) {
  zt_plan p;
  char err[256];
  zt_plan_input in = tiny(64 * MiB, 64 * MiB, 0);

  /* everything fits on the device: fp32 params share the master */
  int rc = zt_plan_make(&in, &p, err, sizeof err);
  OT_CHECK(rc == 0, "%s", err);
  OT_CHECK(p.tier[ZT_KIND_MASTER] == ZT_TIER_DEVICE && !p.streamed && !p.ckpt && p.resident_units == 4,
           "all on device: opt %d streamed %d ckpt %d", p.tier[ZT_KIND_MASTER], p.streamed, p.ckpt);
  OT_CHECK(B(DEVICE, MASTER) == 4 * MiB && B(DEVICE, MOMENTS) == 8 * MiB && B(DEVICE, GRADS) == 4 * MiB &&
               B(DEVICE, PARAMS) == 0 && B(DEVICE, ACTS) == 3 * MiB && p.total[ZT_TIER_DEVICE] == 19 * MiB,
           "device total %zu", p.total[ZT_TIER_DEVICE]);
  OT_CHECK(p.total[ZT_TIER_HOST] == 0 && p.total[ZT_TIER_NVME] == 0 && p.h2d_bytes == 0 && p.fetches == 0,
           "nothing off the device");
  double all_device = p.step_s;

  /* 12 MiB: optimizer state to the host, every unit still resident (fetched once per step) */
  in.device_budget = 12 * MiB;
  rc = zt_plan_make(&in, &p, err, sizeof err);
  OT_CHECK(rc == 0, "%s", err);
  OT_CHECK(p.tier[ZT_KIND_MASTER] == ZT_TIER_HOST && p.tier[ZT_KIND_GRADS] == ZT_TIER_HOST && p.streamed &&
               p.resident_units == 4 && !p.ckpt, "opt host: opt %d k %d ckpt %d", p.tier[ZT_KIND_MASTER],
           p.resident_units, p.ckpt);
  /* device: acts 3 + params 4 + grads (1 held + 1 written back) 2 */
  OT_CHECK(B(DEVICE, ACTS) == 3 * MiB && B(DEVICE, PARAMS) == 4 * MiB && B(DEVICE, GRADS) == 2 * MiB &&
               p.total[ZT_TIER_DEVICE] == 9 * MiB && p.streamer_device_bytes == 6 * MiB,
           "device %zu streamer %zu", p.total[ZT_TIER_DEVICE], p.streamer_device_bytes);
  /* host: master 4 + m, v 8 + fp32 grads 4; params share the master */
  OT_CHECK(B(HOST, MASTER) == 4 * MiB && B(HOST, MOMENTS) == 8 * MiB && B(HOST, GRADS) == 4 * MiB &&
               B(HOST, PARAMS) == 0 && B(HOST, STAGING) == 0 && p.total[ZT_TIER_HOST] == 16 * MiB,
           "host %zu", p.total[ZT_TIER_HOST]);
  OT_CHECK(p.fetches == 4 && p.h2d_bytes == 4 * MiB && p.d2h_bytes == 4 * MiB, "fetches %llu h2d %llu d2h %llu",
           (unsigned long long)p.fetches, (unsigned long long)p.h2d_bytes, (unsigned long long)p.d2h_bytes);
  OT_CHECK(p.step_s > all_device, "offloading the optimizer cannot be faster here: %g vs %g", p.step_s, all_device);

  /* 7 MiB: two units resident (one held, one prefetched); checkpointing would keep all four but
   * costs a recompute per block, more than refetching two units under the backward */
  in.device_budget = 7 * MiB;
  rc = zt_plan_make(&in, &p, err, sizeof err);
  OT_CHECK(rc == 0, "%s", err);
  OT_CHECK(p.streamed && p.resident_units == 2 && !p.ckpt && p.total[ZT_TIER_DEVICE] == 7 * MiB,
           "streamed: k %d ckpt %d device %zu", p.resident_units, p.ckpt, p.total[ZT_TIER_DEVICE]);
  OT_CHECK(p.fetches == 6 && p.h2d_bytes == 6 * MiB, "streamed: fetches %llu", (unsigned long long)p.fetches);
  in.grad_accum = 3; /* later micro-batches refetch the two units the backward let go, both walks */
  rc = zt_plan_make(&in, &p, err, sizeof err);
  OT_CHECK(rc == 0 && p.fetches == 4 + 5 * 2 && p.d2h_bytes == 12 * MiB, "3 micro-batches: %llu fetches",
           (unsigned long long)p.fetches);
  in.grad_accum = 1;
  in.ckpt = 1;
  rc = zt_plan_make(&in, &p, err, sizeof err);
  OT_CHECK(rc == 0 && p.ckpt && p.resident_units == 4 && B(DEVICE, ACTS) == MiB && p.total[ZT_TIER_DEVICE] == 7 * MiB,
           "forced ckpt: k %d", p.resident_units);
  OT_CHECK(p.compute_s > 4 * 3e-3 + 3.9e-3, "recompute counted: %g", p.compute_s);
  in.ckpt = -1;

  /* 4 MiB: even one unit held plus one in flight does not fit with checkpointed activations */
  in.device_budget = 4 * MiB;
  rc = zt_plan_make(&in, &p, err, sizeof err);
  OT_CHECK(rc == -ENOMEM, "4 MiB: %d", rc);
  OT_CHECK(strstr(err, "needs at least 5.0 MiB (5242880 bytes) of device memory for 2 units in flight; "
                       "budget 4.0 MiB (4194304 bytes)"), "message: %s", err);

  /* host too small for the optimizer state, no NVMe: the least host need is named */
  in = tiny(7 * MiB, 8 * MiB, 0);
  rc = zt_plan_make(&in, &p, err, sizeof err);
  OT_CHECK(rc == -ENOMEM && strstr(err, "needs at least 12.0 MiB (12582912 bytes) of host memory with the "
                                        "optimizer state on the nvme; budget 8.0 MiB"), "host: %d %s", rc, err);

  /* NVMe for the optimizer state; params at home on the host (host: grads 4, params 4, two
   * staging sets of master + m + v 6) */
  in = tiny(7 * MiB, 14 * MiB, 64 * MiB);
  rc = zt_plan_make(&in, &p, err, sizeof err);
  OT_CHECK(rc == 0, "%s", err);
  OT_CHECK(p.tier[ZT_KIND_MASTER] == ZT_TIER_NVME && p.tier[ZT_KIND_PARAMS] == ZT_TIER_HOST &&
               B(HOST, GRADS) == 4 * MiB && B(HOST, PARAMS) == 4 * MiB && B(HOST, STAGING) == 6 * MiB &&
               p.total[ZT_TIER_HOST] == 14 * MiB && B(NVME, MASTER) == 4 * MiB && B(NVME, MOMENTS) == 8 * MiB &&
               p.total[ZT_TIER_NVME] == 12 * MiB,
           "opt nvme: params %d host %zu nvme %zu", p.tier[ZT_KIND_PARAMS], p.total[ZT_TIER_HOST], p.total[ZT_TIER_NVME]);
  OT_CHECK(p.nvme_read_bytes == 12 * MiB && p.nvme_write_bytes == 12 * MiB, "nvme traffic %llu/%llu",
           (unsigned long long)p.nvme_read_bytes, (unsigned long long)p.nvme_write_bytes);

  /* 12 MiB of host: params read from the master's extent (fp32, shared) through 2 staging buffers */
  in.host_budget = 12 * MiB;
  rc = zt_plan_make(&in, &p, err, sizeof err);
  OT_CHECK(rc == 0, "%s", err);
  OT_CHECK(p.tier[ZT_KIND_PARAMS] == ZT_TIER_NVME && B(HOST, STAGING) == 8 * MiB && B(HOST, PARAMS) == 0 &&
               p.total[ZT_TIER_HOST] == 12 * MiB && p.total[ZT_TIER_NVME] == 12 * MiB &&
               p.nvme_read_bytes == 12 * MiB + p.h2d_bytes,
           "params on nvme: home %d host %zu", p.tier[ZT_KIND_PARAMS], p.total[ZT_TIER_HOST]);

  /* policy: NVMe forced, nothing forbids it */
  in = tiny(64 * MiB, 64 * MiB, 64 * MiB);
  in.optimizer = ZT_TIER_NVME;
  rc = zt_plan_make(&in, &p, err, sizeof err);
  OT_CHECK(rc == 0 && p.tier[ZT_KIND_MASTER] == ZT_TIER_NVME, "forced nvme: %d %s", rc, err);
  in.optimizer = ZT_TIER_DEVICE;
  in.params = ZT_TIER_NVME;
  rc = zt_plan_make(&in, &p, err, sizeof err);
  OT_CHECK(rc == -EINVAL && strstr(err, "allows no combination"), "contradictory policy: %d %s", rc, err);

  /* bad input names the field */
  in = tiny(64 * MiB, 64 * MiB, 0);
  in.cost.h2d_bytes_per_s = 0;
  rc = zt_plan_make(&in, &p, err, sizeof err);
  OT_CHECK(rc == -EINVAL && strstr(err, "cost.h2d_bytes_per_s"), "bad cost: %d %s", rc, err);
  in = tiny(64 * MiB, 64 * MiB, 0);
  tiny_units[2].companion = 2;
  rc = zt_plan_make(&in, &p, err, sizeof err);
  OT_CHECK(rc == -EINVAL && strstr(err, "companion"), "bad companion: %d %s", rc, err);
}

/* A bigger budget never gives a slower plan: sweep each budget over a geometric range. */
static void check_monotone(zt_plan_input in, const char *what) {
  size_t *budgets[3] = {&in.device_budget, &in.host_budget, &in.nvme_budget};
  for (int b = 0; b < 3; b++) {
    zt_plan_input x = in;
    size_t *v = b == 0 ? &x.device_budget : b == 1 ? &x.host_budget : &x.nvme_budget;
    size_t top = *budgets[b];
    double last = -1;
    int fits = 0;
    for (int step = 0; step <= 40; step++) {
      *v = (size_t)((double)top * step / 40.0);
      zt_plan p;
      char err[256];
      int rc = zt_plan_make(&x, &p, err, sizeof err);
      OT_CHECK(rc == 0 || rc == -ENOMEM, "%s: %d %s", what, rc, err);
      if (rc == -ENOMEM) {
        OT_CHECK(!fits, "%s: budget %d grew to %zu and the plan stopped fitting", what, b, *v);
        continue;
      }
      OT_CHECK(p.total[0] <= x.device_budget && p.total[1] <= x.host_budget && p.total[2] <= x.nvme_budget,
               "%s: plan over budget", what);
      if (fits) OT_CHECK(p.step_s <= last, "%s: budget %d at %zu gives %g s, slower than %g s", what, b, *v,
                         p.step_s, last);
      fits = 1;
      last = p.step_s;
    }
    OT_CHECK(fits, "%s: budget %d never fits", what, b);
  }
}

static void test_gpt2_xl(void) {
  zt_model_cfg mc = {.arch = ZT_ARCH_GPT, .vocab = 50257, .seq_len = 1024, .d_model = 1600, .n_heads = 25,
                     .n_layers = 48, .init_seed = 1};
  zt_model *m = NULL;
  zt_backend be = {0};
  char err[256];
  zt_plan_unit units[64];
  size_t acts = 0, acts_ckpt = 0;
  OT_CHECK(zt_model_create(&m, &mc, err, sizeof err) == 0, "model: %s", err);
  OT_CHECK(zt_backend_cpu_open(&be, 1) == 0, "cpu backend");
  if (!m || !be.ops) goto out;
  int n = zt_plan_units_from_model(m, be.ops, 2, 1, 100e12, units, 64, &acts, &acts_ckpt);
  OT_CHECK(n == 50, "units: %d", n);
  if (n != 50) goto out;
  OT_CHECK(zt_plan_units_from_model(m, be.ops, 2, 1, 0, units, 49, &acts, &acts_ckpt) == -ENOSPC, "cap");
  n = zt_plan_units_from_model(m, be.ops, 2, 1, 100e12, units, 64, &acts, &acts_ckpt);
  /* GPT-2 XL: wte + wpe, 12C^2 + 13C per block, ln_f */
  OT_CHECK(units[0].master_bytes == 4 * (size_t)82049600 && units[1].master_bytes == 4 * (size_t)30740800 &&
               units[49].master_bytes == 4 * 3200 && units[1].param_bytes == 2 * (size_t)30740800,
           "unit sizes %zu %zu %zu", units[0].master_bytes, units[1].master_bytes, units[49].master_bytes);
  OT_CHECK(units[49].companion == 0 && units[0].companion == -1 && units[1].checkpointable &&
               !units[0].checkpointable && !units[49].checkpointable, "companions/checkpointable");
  OT_CHECK(acts > acts_ckpt && acts_ckpt > 0, "acts %zu ckpt %zu", acts, acts_ckpt);
  OT_CHECK(units[1].fwd_s > 0 && units[1].bwd_s == 2 * units[1].fwd_s, "compute times");

  zt_plan_input in = {.n_units = n, .units = units, .act_bytes = acts, .act_ckpt_bytes = acts_ckpt,
                      .grad_accum = 1, .prefetch_depth = 1, .device_budget = 140 * GiB,
                      .host_budget = 256 * GiB, .nvme_budget = 0, .cost = cost(),
                      .optimizer = ZT_TIER_AUTO, .params = ZT_TIER_AUTO, .ckpt = -1};
  zt_plan p;
  int rc = zt_plan_make(&in, &p, err, sizeof err);
  OT_CHECK(rc == 0 && p.tier[ZT_KIND_MASTER] == ZT_TIER_DEVICE && !p.ckpt, "140 GiB: all on device: %s", err);
  /* master 6230444800, m + v, fp32 grads; the bf16 copy apart */
  OT_CHECK(p.total[ZT_TIER_DEVICE] == zt_dev_arena_footprint(acts) + 4 * (size_t)6230444800 + 3115228672u,
           "device %zu", p.total[ZT_TIER_DEVICE]);

  /* the device holds the bf16 params, not the optimizer state: ZeRO-Offload */
  size_t device_acts = zt_dev_arena_footprint(acts);
  in.device_budget = device_acts + 3115228672u + 574124800u;
  rc = zt_plan_make(&in, &p, err, sizeof err);
  OT_CHECK(rc == 0 && p.tier[ZT_KIND_MASTER] == ZT_TIER_HOST && p.resident_units == 50 && !p.ckpt,
           "optimizer to host: %d %s k %d", rc, err, p.resident_units);
  OT_CHECK(p.total[ZT_TIER_DEVICE] == in.device_budget, "device %zu", p.total[ZT_TIER_DEVICE]);
  /* host: master, m, v, fp32 grads page-rounded per unit, the bf16 params */
  OT_CHECK(p.total[ZT_TIER_HOST] == 4 * (size_t)6230585344 + 3115393024u && B(HOST, PARAMS) == 3115393024u,
           "host %zu", p.total[ZT_TIER_HOST]);
  OT_CHECK(p.fetches == 50 && p.h2d_bytes == 3115222400u && p.d2h_bytes == 6230444800u + 328198400u,
           "fetches %llu h2d %llu d2h %llu", (unsigned long long)p.fetches, (unsigned long long)p.h2d_bytes,
           (unsigned long long)p.d2h_bytes);

  /* params streamed: checkpointed, 10 units resident (the embedding and 9 blocks, each bf16
   * copy rounded up to the arena's 256 bytes) */
  in.ckpt = 1;
  in.device_budget = zt_dev_arena_footprint(acts_ckpt) + 574124800u + 164099328u + 9 * (size_t)61481728;
  rc = zt_plan_make(&in, &p, err, sizeof err);
  OT_CHECK(rc == 0 && p.streamed && p.resident_units == 10 && p.total[ZT_TIER_DEVICE] == in.device_budget,
           "streamed: %d %s k %d", rc, err, p.resident_units);
  /* forward 50 + the embedding again for the head; backward the 40 units that fell out */
  OT_CHECK(p.fetches == 91 && p.h2d_bytes == 5841203200u, "streamed: fetches %llu h2d %llu",
           (unsigned long long)p.fetches, (unsigned long long)p.h2d_bytes);
  char text[2048], json[2048];
  int tl = zt_plan_render_text(&p, &in, text, sizeof text);
  OT_CHECK(tl > 0 && (size_t)tl < sizeof text && strstr(text, "10 of 50 units resident") &&
               strstr(text, "91 unit fetches"), "text:\n%s", text);
  int jl = zt_plan_render_json(&p, &in, json, sizeof json);
  json_error_t je;
  json_t *j = (size_t)jl < sizeof json ? json_loads(json, 0, &je) : NULL;
  OT_CHECK(j != NULL, "json does not parse: %s", json);
  if (j) {
    json_t *dev = json_object_get(json_object_get(json_object_get(j, "bytes"), "device"), "total");
    OT_CHECK(json_integer_value(dev) == (json_int_t)p.total[0] &&
                 !strcmp(json_string_value(json_object_get(j, "optimizer")), "host") &&
                 json_integer_value(json_object_get(j, "resident_units")) == 10 &&
                 json_integer_value(json_object_get(json_object_get(j, "per_step"), "fetches")) == 91,
             "json fields: %s", json);
    json_decref(j);
  }
  char small[16];
  OT_CHECK(zt_plan_render_text(&p, &in, small, sizeof small) == tl && strlen(small) == sizeof small - 1,
           "truncation keeps the full length and terminates");

  /* refused: not even the checkpointed activations and three units in flight */
  in.device_budget = zt_dev_arena_footprint(acts_ckpt) + 574124800u;
  rc = zt_plan_make(&in, &p, err, sizeof err);
  OT_CHECK(rc == -ENOMEM && strstr(err, "of device memory for 3 units in flight; budget"), "refusal: %s", err);

  in.ckpt = -1;
  in.device_budget = 40 * GiB;
  in.nvme_budget = 64 * GiB;
  check_monotone(in, "gpt2-xl");
out:
  if (be.ops) zt_backend_cpu_close(&be);
  zt_model_destroy(m);
}

/* The plan's transfers are the streamer's: the streamer opened with the plan's arena and
 * parameter budgets walks two micro-batches and moves exactly what the plan says. */
static void test_plan_drives_streamer(void) {
  enum { U = 12 };
  const size_t S = 64 * 1024;
  zt_plan_unit pu[U];
  zt_stream_unit su[U];
  uint8_t *home = malloc(U * S);
  float *grads = calloc(U * S / 4, sizeof(float));
  for (int i = 0; i < U; i++) {
    pu[i] = (zt_plan_unit){.master_bytes = S, .param_bytes = S, .grad_bytes = S, .fwd_s = 1e-3, .bwd_s = 2e-3,
                           .companion = -1};
    for (size_t k = 0; k < S; k++) home[i * S + k] = (uint8_t)(i * 13 + k);
    su[i] = (zt_stream_unit){.param_bytes = S, .host_params = home + i * S, .grad_floats = S / 4,
                             .host_grads = grads + i * S / 4};
  }
  zt_plan_input in = {.n_units = U, .units = pu, .act_bytes = S, .act_ckpt_bytes = S, .grad_accum = 2,
                      .prefetch_depth = 1, .device_budget = 8 * S, .host_budget = GiB, .cost = cost(),
                      .optimizer = ZT_TIER_HOST, .params = ZT_TIER_AUTO, .ckpt = 0};
  zt_plan p;
  char err[256];
  int rc = zt_plan_make(&in, &p, err, sizeof err);
  OT_CHECK(rc == 0 && p.resident_units == 5 && p.streamer_device_bytes == 7 * S && p.fetches == 12 + 3 * 7,
           "plan: %d %s k %d fetches %llu", rc, err, p.resident_units, (unsigned long long)p.fetches);
  zt_dev_arena *dev = NULL;
  zt_copy_engine *copy = NULL;
  zt_streamer *st = NULL;
  OT_CHECK(zt_dev_arena_open(&dev, p.streamer_device_bytes, NULL, err, sizeof err) == 0, "arena: %s", err);
  OT_CHECK(zt_copy_cpu_open(&copy, 0) == 0, "copy engine");
  zt_streamer_cfg cfg = {.n_units = U, .units = su, .dev = dev, .copy = copy, .prefetch_depth = p.prefetch_depth,
                         .max_acquired = p.max_acquired, .param_budget = B(DEVICE, PARAMS)};
  if (dev && copy) OT_CHECK(zt_streamer_open(&st, &cfg, err, sizeof err) == 0, "streamer: %s", err);
  for (int m = 0; st && m < in.grad_accum; m++) {
    void *pp;
    float *g;
    for (int i = 0; i < U; i++) {
      OT_CHECK(zt_streamer_acquire(st, i, 0, &pp, NULL) == 0, "fwd %d: %s", i, zt_streamer_error(st));
      if (i + 1 < U) zt_streamer_prefetch(st, i + 1);
      zt_streamer_release(st, i, 0);
    }
    for (int i = U - 1; i >= 0; i--) {
      OT_CHECK(zt_streamer_acquire(st, i, ZT_STREAM_GRADS, &pp, &g) == 0, "bwd %d: %s", i, zt_streamer_error(st));
      if (i > 0) zt_streamer_prefetch(st, i - 1);
      zt_streamer_release(st, i, ZT_STREAM_DIRTY);
    }
  }
  if (st) {
    zt_streamer_stats ss;
    OT_CHECK(zt_streamer_wait_grads(st, -1) == 0, "wait");
    zt_streamer_get_stats(st, &ss);
    OT_CHECK(ss.fetches == p.fetches && ss.bytes_h2d == p.h2d_bytes && ss.bytes_d2h == p.d2h_bytes,
             "streamer moved %llu fetches / %llu H2D / %llu D2H, the plan says %llu / %llu / %llu",
             (unsigned long long)ss.fetches, (unsigned long long)ss.bytes_h2d, (unsigned long long)ss.bytes_d2h,
             (unsigned long long)p.fetches, (unsigned long long)p.h2d_bytes, (unsigned long long)p.d2h_bytes);
    OT_CHECK(ss.device_peak <= p.streamer_device_bytes, "peak %zu", ss.device_peak);
  }
  zt_streamer_close(st);
  zt_copy_close(copy);
  zt_dev_arena_close(dev);
  free(home);
  free(grads);
}

int main(void) {
  test_tiny();
  check_monotone(tiny(24 * MiB, 24 * MiB, 24 * MiB), "tiny");
  test_gpt2_xl();
  test_plan_drives_streamer();
  if (ot_failures) fprintf(stderr, "%d failures\n", ot_failures);
  return ot_failures ? 1 : 0;
}
