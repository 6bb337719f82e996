/* The offloaded step against the run without offload, on the CPU backend, for both archs: losses,
 * parameters and AdamW moments bitwise equal over STEPS steps with every unit resident, and with
 * the smallest device budget that opens (parameters streamed, evictions counted, the arena's
 * peak within its budget); with and without clipping (updates after the backward or overlapping
 * it), activation checkpointing, a micro-batch of padding alone; resume from a checkpoint of an
 * offloaded job; bf16 compute (fp32 and bf16 pieces streamed); placements and budgets that
 * cannot work are refused naming the field. With
 * the argument "nvme": the same with the optimizer state, then the parameters too, on NVMe
 * (the store's counters show the traffic). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/train/offload.h"
#include "engine/train/offload_json.h"
#include "offload/nvme_store.h"
#include "tests/unit/model/mcheck.h"

#define STEPS 10
#define B 2
#define GA 3

static zt_backend g_be; /* one cpu backend for every trainer */

static zt_model_cfg model_cfg(zt_arch arch) {
  zt_model_cfg mc = mc_tiny(arch);
  mc.n_layers = 4;
  return mc;
}

static zt_train_cfg train_cfg(float clip, int ckpt_every) {
  zt_train_cfg tc = mc_train(B, GA);
  tc.steps = STEPS;
  tc.warmup_steps = 2;
  tc.schedule = ZT_SCHED_COSINE;
  tc.min_lr = 1e-4f;
  tc.lr = 1e-2f;
  tc.weight_decay = 0.1f;
  tc.grad_clip = clip;
  tc.ckpt_every = ckpt_every;
  return tc;
}

static size_t step_tokens(const zt_model_cfg *mc) { return (size_t)GA * B * (mc->seq_len + 1); }

/* STEPS steps of tokens; step 3's last micro-batch and step 5's first are padding alone. */
static int32_t *make_tokens(const zt_model_cfg *mc, uint64_t seed) {
  size_t per = step_tokens(mc), micro = (size_t)B * (mc->seq_len + 1);
  int32_t *tok = malloc(STEPS * per * sizeof *tok);
  if (!tok) exit(1);
  mc_tokens(&seed, tok, STEPS * per, mc->vocab);
  for (size_t i = 0; i < micro; i++) {
    tok[3 * per + (GA - 1) * micro + i] = -1;
    tok[5 * per + i] = -1;
  }
  return tok;
}

static int run(zt_trainer *t, const int32_t *tok, size_t per, int from, int to, double *loss,
               const char *what) {
  char err[512];
  for (int i = from; i < to; i++) {
    zt_step_result r;
    int rc = zt_trainer_step(t, tok + (size_t)i * per, &r, err, sizeof err);
    if (MC_EXPECT(rc == 0, "%s: step %d: %s", what, i + 1, err)) return 1;
    loss[i] = r.loss;
  }
  return 0;
}

static int same_state(zt_trainer *a, zt_trainer *b, const char *what) {
  size_t n = zt_model_num_params(zt_trainer_model(a));
  int fails = 0;
  static const char *const names[] = {"parameters", "exp_avg", "exp_avg_sq"};
  float *x[3], *y[3];
  for (int i = 0; i < 3; i++) {
    x[i] = malloc(n * sizeof(float));
    y[i] = malloc(n * sizeof(float));
    if (!x[i] || !y[i]) exit(1);
  }
  zt_trainer_get_state(a, x[0], x[1], x[2]);
  zt_trainer_get_state(b, y[0], y[1], y[2]);
  for (int i = 0; i < 3; i++) {
    fails += MC_EXPECT(!memcmp(x[i], y[i], n * sizeof(float)), "%s: %s differ", what, names[i]);
    free(x[i]);
    free(y[i]);
  }
  return fails;
}

static int open_off(zt_trainer **t, const zt_model_cfg *mc, const zt_train_cfg *tc,
                    const zt_offload_cfg *oc, const zt_backend *be, char *err, size_t errlen) {
  err[0] = 0;
  return zt_trainer_open_offload(t, mc, tc, oc, be, err, errlen);
}

/* The smallest gpu_budget that opens with params streamed. The device needs the same whatever
 * the homes, so the search runs on the host tier (no files to create per try). */
static size_t min_budget(const zt_model_cfg *mc, const zt_train_cfg *tc, zt_offload_cfg oc,
                         const zt_backend *be) {
  char err[512];
  zt_trainer *t = NULL;
  zt_offload_place streamed = ZT_PLACE_HOST;
  oc.optimizer = ZT_PLACE_HOST;
  oc.params = ZT_PLACE_GPU;
  oc.gpu_budget = 0;
  if (open_off(&t, mc, tc, &oc, be, err, sizeof err) < 0) return 0;
  zt_offload_stats st;
  zt_trainer_offload_stats(t, &st);
  zt_trainer_close(t);
  size_t lo = st.act_bytes, hi = st.device_budget; /* lo fails, hi opens */
  oc.params = streamed;
  while (hi - lo > 1) {
    oc.gpu_budget = lo + (hi - lo) / 2;
    if (open_off(&t, mc, tc, &oc, be, err, sizeof err) == 0) {
      hi = oc.gpu_budget;
      zt_trainer_close(t);
    } else {
      lo = oc.gpu_budget;
    }
  }
  return hi;
}

/* One offloaded run against the reference losses and final state. */
static int check_case(zt_arch arch, const char *name, zt_train_cfg tc, zt_offload_cfg oc,
                      int want_streaming) {
  int fails = 0;
  char err[512], what[128];
  zt_backend be = g_be;
  zt_model_cfg mc = model_cfg(arch);
  snprintf(what, sizeof what, "%s %s", zt_arch_name(arch), name);
  int32_t *tok = make_tokens(&mc, 7 + (uint64_t)arch);
  size_t per = step_tokens(&mc);
  double ref[STEPS], off[STEPS];
  zt_trainer *a = NULL, *b = NULL;
  if (want_streaming) {
    oc.gpu_budget = min_budget(&mc, &tc, oc, &be);
    fails += MC_EXPECT(oc.gpu_budget > 0, "%s: no budget opens", what);
  }
  if (MC_EXPECT(zt_trainer_open(&a, &mc, &tc, &be, err, sizeof err) == 0, "%s: %s", what, err) ||
      MC_EXPECT(open_off(&b, &mc, &tc, &oc, &be, err, sizeof err) == 0, "%s: %s", what, err)) {
    fails++;
    goto out;
  }
  fails += run(a, tok, per, 0, STEPS, ref, what);
  fails += run(b, tok, per, 0, STEPS, off, what);
  for (int i = 0; i < STEPS; i++)
    fails += MC_EXPECT(!memcmp(&ref[i], &off[i], sizeof ref[i]), "%s: step %d loss %.17g vs "
                       "%.17g without offload", what, i + 1, off[i], ref[i]);
  fails += same_state(a, b, what);
  zt_offload_stats st;
  fails += MC_EXPECT(zt_trainer_offload_stats(b, &st) == 0, "%s: stats", what);
  fails += MC_EXPECT(zt_trainer_offload_stats(a, &st) == -EINVAL, "%s: stats of a trainer "
                     "without offload", what);
  zt_trainer_offload_stats(b, &st);
  /* units with their optimizer on the device are neither streamed nor updated by the CPU */
  int nu = zt_model_num_units(zt_trainer_model(b)) - st.gpu_units;
  if (oc.gpu_units >= 0)
    fails += MC_EXPECT(st.gpu_units == oc.gpu_units, "%s: %d units on the device, asked %d",
                       what, st.gpu_units, oc.gpu_units);
  fails += MC_EXPECT(st.gpu_unit_updates == (uint64_t)STEPS * st.gpu_units, "%s: %llu device "
                     "unit updates", what, (unsigned long long)st.gpu_unit_updates);
  fails += MC_EXPECT(st.arena_peak <= st.arena_budget && st.act_bytes + st.arena_peak <=
                     st.device_budget, "%s: arena peak %zu over its budget %zu", what,
                     st.arena_peak, st.arena_budget);
  fails += MC_EXPECT(zt_trainer_backend_bytes(b) == st.device_budget, "%s: backend bytes", what);
  /* What the daemon admits at submit is exactly what the trainer took. */
  zt_offload_plan plan;
  fails += MC_EXPECT(zt_offload_estimate(&mc, &tc, &oc, be.ops, &plan, err, sizeof err) == 0,
                     "%s: estimate: %s", what, err);
  size_t est_host = plan.host_bytes, est_dev = plan.device_bytes;
  fails += MC_EXPECT(plan.gpu_units == st.gpu_units && plan.ckpt_every == st.ckpt_every &&
                     plan.params == st.params && plan.est_step_s == st.est_step_s &&
                     plan.act_bytes == st.act_bytes && plan.arena_bytes == st.arena_budget &&
                     plan.gpu_unit_bytes == st.gpu_unit_bytes,
                     "%s: the plan is not what the trainer runs", what);
  /* the expected transfers bound the real ones (micro-batches of padding alone move less) */
  fails += MC_EXPECT((uint64_t)STEPS * plan.h2d_bytes >= st.bytes_h2d &&
                     (uint64_t)STEPS * plan.d2h_bytes >= st.bytes_d2h &&
                     (want_streaming || st.bytes_h2d * 2 > (uint64_t)STEPS * plan.h2d_bytes),
                     "%s: plan expects %llu/%llu bytes H2D/D2H a step, %llu/%llu over %d steps",
                     what, (unsigned long long)plan.h2d_bytes, (unsigned long long)plan.d2h_bytes,
                     (unsigned long long)st.bytes_h2d, (unsigned long long)st.bytes_d2h, STEPS);
  if (oc.optimizer == ZT_PLACE_NVME)
    fails += MC_EXPECT(plan.nvme_bytes > 0 && plan.nvme_step_bytes == 2 * plan.nvme_bytes,
                       "%s: plan nvme %llu bytes", what, (unsigned long long)plan.nvme_bytes);
  fails += MC_EXPECT(est_host == st.host_bytes && est_dev == st.device_budget &&
                     st.device_budget == st.act_bytes + st.gpu_unit_bytes + st.arena_budget,
                     "%s: estimate host %zu device %zu, trainer host %zu device %zu", what,
                     est_host, est_dev, st.host_bytes, st.device_budget);
  fails += MC_EXPECT(st.adam_units == (uint64_t)STEPS * nu, "%s: %llu unit updates", what,
                     (unsigned long long)st.adam_units);
  fails += MC_EXPECT(st.grad_writebacks > 0 && st.bytes_d2h > 0, "%s: no write-backs", what);
  /* the timeline: every resource that worked shows busy time, none more than the steps took
   * (the pool's threads each) */
  fails += MC_EXPECT(st.step_ns > 0 && st.compute_ns > 0 && st.compute_ns <= st.step_ns &&
                     st.h2d_ns > 0 && st.d2h_ns > 0 && st.adam_ns > 0 &&
                     st.adam_ns <= st.step_ns * (uint64_t)st.adam_threads &&
                     (oc.optimizer == ZT_PLACE_NVME) == (st.nvme_ns > 0),
                     "%s: timeline step %llu compute %llu h2d %llu d2h %llu adam %llu nvme %llu ns",
                     what, (unsigned long long)st.step_ns, (unsigned long long)st.compute_ns,
                     (unsigned long long)st.h2d_ns, (unsigned long long)st.d2h_ns,
                     (unsigned long long)st.adam_ns, (unsigned long long)st.nvme_ns);
  if (tc.grad_clip > 0)
    fails += MC_EXPECT(st.adam_overlapped == 0, "%s: updates overlapped though clipping needs "
                       "the norm first", what);
  else /* one step has no counted micro-batch at its end; overlap still reaches every unit */
    fails += MC_EXPECT(st.adam_overlapped == (uint64_t)STEPS * nu, "%s: %llu updates "
                       "overlapped", what, (unsigned long long)st.adam_overlapped);
  if (oc.optimizer == ZT_PLACE_NVME)
    fails += MC_EXPECT(st.nvme_bytes_read > 0 && st.nvme_bytes_written > 0, "%s: NVMe read "
                       "%llu, written %llu bytes", what, (unsigned long long)st.nvme_bytes_read,
                       (unsigned long long)st.nvme_bytes_written);
  else
    fails += MC_EXPECT(st.nvme_bytes_read == 0 && st.nvme_bytes_written == 0, "%s: NVMe used",
                       what);
  if (want_streaming) {
    fails += MC_EXPECT(st.device_budget == oc.gpu_budget, "%s: budget %zu, asked %zu", what,
                       st.device_budget, oc.gpu_budget);
    /* all resident, each step fetches every unit once; streaming refetches in the walks */
    fails += MC_EXPECT(st.evictions > 0 && st.fetches > (uint64_t)STEPS * nu,
                       "%s: %llu fetches, %llu evictions: not streamed", what,
                       (unsigned long long)st.fetches, (unsigned long long)st.evictions);
  } else {
    fails += MC_EXPECT(st.evictions == 0 && st.fetches == (uint64_t)STEPS * nu,
                       "%s: all resident, %llu fetches %llu evictions", what,
                       (unsigned long long)st.fetches, (unsigned long long)st.evictions);
  }
out:
  zt_trainer_close(a);
  zt_trainer_close(b);
  free(tok);
  return fails;
}

/* optimizer auto under a budget: as many leading units on the device as fit beside the
 * streaming of the others; more budget, more units; bitwise the run without offload. */
static int check_auto_units(zt_arch arch) {
  int fails = 0;
  char err[512];
  zt_model_cfg mc = model_cfg(arch);
  zt_train_cfg tc = train_cfg(0, 0);
  zt_offload_cfg oc;
  zt_offload_cfg_defaults(&oc);
  oc.gpu_budget = min_budget(&mc, &tc, oc, &g_be);
  int prev = -1;
  for (int k = 0; k < 3; k++) {
    zt_trainer *t = NULL;
    zt_offload_stats st;
    if (MC_EXPECT(open_off(&t, &mc, &tc, &oc, &g_be, err, sizeof err) == 0, "%s", err))
      return fails + 1;
    zt_trainer_offload_stats(t, &st);
    zt_trainer_close(t);
    fails += MC_EXPECT(st.device_budget <= oc.gpu_budget && st.gpu_units >= prev, "%s auto: "
                       "budget %zu: %d device units, %zu bytes", zt_arch_name(arch),
                       oc.gpu_budget, st.gpu_units, st.device_budget);
    prev = st.gpu_units;
    oc.gpu_budget *= 2;
  }
  fails += MC_EXPECT(prev > 0, "%s auto: no unit on the device at 4x the minimum budget",
                     zt_arch_name(arch));
  oc.params = ZT_PLACE_GPU; /* the others resident: every fetch counted once a step */
  fails += check_case(arch, "optimizer auto, units on the device", tc, oc, 0);
  return fails;
}

/* activation checkpointing auto: a budget that only a checkpointed plan fits makes the planner
 * checkpoint (and train bitwise as without offload); a roomy one makes it not. */
static int check_auto_ckpt(zt_arch arch) {
  int fails = 0;
  char err[512];
  zt_model_cfg mc = model_cfg(arch);
  zt_train_cfg tc = train_cfg(0, 1), plain = train_cfg(0, 0);
  zt_offload_cfg oc;
  zt_offload_cfg_defaults(&oc);
  size_t tight = min_budget(&mc, &tc, oc, &g_be), loose = min_budget(&mc, &plain, oc, &g_be);
  fails += MC_EXPECT(tight < loose, "%s: checkpointing does not lower the budget (%zu, %zu)",
                     zt_arch_name(arch), tight, loose);
  tc.ckpt_every = ZT_CKPT_AUTO;
  int32_t *tok = make_tokens(&mc, 17);
  size_t per = step_tokens(&mc);
  double ref[STEPS], off[STEPS];
  zt_trainer *a = NULL, *b = NULL, *c = NULL;
  zt_offload_stats st;
  oc.gpu_budget = tight;
  if (MC_EXPECT(zt_trainer_open(&a, &mc, &tc, &g_be, err, sizeof err) == 0, "%s", err) ||
      MC_EXPECT(open_off(&b, &mc, &tc, &oc, &g_be, err, sizeof err) == 0, "auto at %zu: %s",
                tight, err)) {
    fails++;
    goto out;
  }
  zt_trainer_offload_stats(b, &st);
  fails += MC_EXPECT(st.ckpt_every > 0 && st.device_budget <= tight && st.est_step_s > 0,
                     "%s auto at the checkpointed minimum: every %d, %zu bytes, est %g s",
                     zt_arch_name(arch), st.ckpt_every, st.device_budget, st.est_step_s);
  fails += run(a, tok, per, 0, STEPS, ref, "auto ckpt reference");
  fails += run(b, tok, per, 0, STEPS, off, "auto ckpt");
  for (int i = 0; i < STEPS; i++)
    fails += MC_EXPECT(!memcmp(&ref[i], &off[i], sizeof ref[i]), "%s auto ckpt: step %d",
                       zt_arch_name(arch), i + 1);
  oc.gpu_budget = 4 * loose;
  if (MC_EXPECT(open_off(&c, &mc, &tc, &oc, &g_be, err, sizeof err) == 0, "%s", err)) {
    fails++;
    goto out;
  }
  zt_trainer_offload_stats(c, &st);
  fails += MC_EXPECT(st.ckpt_every == 0, "%s auto with room: checkpointing every %d",
                     zt_arch_name(arch), st.ckpt_every);
out:
  zt_trainer_close(a);
  zt_trainer_close(b);
  zt_trainer_close(c);
  free(tok);
  return fails;
}

/* A checkpoint whose read of the NVMe state fails (the store's first read, injected) is refused
 * with the file and the cause, and the trainer still saves once the fault is gone. */
static int check_ckpt_read_fault(zt_offload_cfg oc, const char *tmp) {
  int fails = 0;
  char err[1024], dir[600];
  zt_model_cfg mc = model_cfg(ZT_ARCH_GPT);
  zt_train_cfg tc = train_cfg(0, 0);
  zt_trainer *t = NULL;
  oc.optimizer = ZT_PLACE_NVME;
  oc.params = ZT_PLACE_HOST;
  oc.gpu_units = -1;
  snprintf(dir, sizeof dir, "%s/fault-ckpt", tmp);
  setenv("ZT_FAULT_NVME", "eio:read:1", 1);
  int rc = open_off(&t, &mc, &tc, &oc, &g_be, err, sizeof err);
  unsetenv("ZT_FAULT_NVME");
  if (MC_EXPECT(rc == 0, "open with a read fault armed: %s", err)) return 1;
  rc = zt_trainer_save(t, dir, err, sizeof err);
  fails += MC_EXPECT(rc == -EIO && strstr(err, "reading the offloaded state failed") &&
                     strstr(err, ".master") && strstr(err, "Input/output error"),
                     "checkpoint read fault: rc %d, '%s'", rc, err);
  fails += MC_EXPECT(zt_trainer_save(t, dir, err, sizeof err) == 0, "save after the fault: %s",
                     err);
  zt_trainer_close(t);
  return fails;
}

/* 5 steps offloaded, a checkpoint, a fresh offloaded trainer (which ran a step of its own) loads
 * it, 5 more: the losses and state of 10 steps without offload; a trainer without offload
 * resumes from the same checkpoint alike. */
static int check_resume(zt_arch arch, zt_offload_cfg oc, const char *tmp) {
  int fails = 0;
  char err[512], dir[600];
  zt_backend be = g_be;
  zt_model_cfg mc = model_cfg(arch);
  zt_train_cfg tc = train_cfg(0.5f, 0);
  int32_t *tok = make_tokens(&mc, 11 + (uint64_t)arch);
  size_t per = step_tokens(&mc);
  double ref[STEPS], off[STEPS];
  zt_trainer *a = NULL, *b = NULL, *c = NULL;
  snprintf(dir, sizeof dir, "%s/%s-ckpt", tmp, zt_arch_name(arch));
  oc.gpu_budget = min_budget(&mc, &tc, oc, &be);
  if (MC_EXPECT(zt_trainer_open(&a, &mc, &tc, &be, err, sizeof err) == 0, "%s", err) ||
      MC_EXPECT(open_off(&b, &mc, &tc, &oc, &be, err, sizeof err) == 0, "%s", err) ||
      MC_EXPECT(open_off(&c, &mc, &tc, &oc, &be, err, sizeof err) == 0, "%s", err)) {
    fails++;
    goto out;
  }
  fails += run(a, tok, per, 0, STEPS, ref, "resume reference");
  fails += run(b, tok, per, 0, STEPS / 2, off, "resume first half");
  fails += MC_EXPECT(zt_trainer_save(b, dir, err, sizeof err) == 0, "save: %s", err);
  /* c has run a step of its own first: the load must replace its state and device copies */
  double scratch[STEPS];
  fails += run(c, tok, per, STEPS - 1, STEPS, scratch, "resume scratch step");
  fails += MC_EXPECT(zt_trainer_load(c, dir, err, sizeof err) == 0, "load: %s", err);
  fails += MC_EXPECT(zt_trainer_step_count(c) == STEPS / 2, "step count %d after load",
                     zt_trainer_step_count(c));
  fails += run(c, tok, per, STEPS / 2, STEPS, off, "resume second half");
  for (int i = 0; i < STEPS; i++)
    fails += MC_EXPECT(!memcmp(&ref[i], &off[i], sizeof ref[i]), "%s resume: step %d loss "
                       "%.17g vs %.17g", zt_arch_name(arch), i + 1, off[i], ref[i]);
  fails += same_state(a, c, "resume");
  /* the checkpoint of an offloaded job resumes without offload too */
  double plain[STEPS];
  zt_trainer *d = NULL;
  if (MC_EXPECT(zt_trainer_open(&d, &mc, &tc, &be, err, sizeof err) == 0, "%s", err) ||
      MC_EXPECT(zt_trainer_load(d, dir, err, sizeof err) == 0, "plain load: %s", err)) {
    fails++;
  } else {
    fails += run(d, tok, per, STEPS / 2, STEPS, plain, "resume without offload");
    for (int i = STEPS / 2; i < STEPS; i++)
      fails += MC_EXPECT(!memcmp(&ref[i], &plain[i], sizeof ref[i]), "resume without offload: "
                         "step %d", i + 1);
  }
  zt_trainer_close(d);
out:
  zt_trainer_close(a);
  zt_trainer_close(b);
  zt_trainer_close(c);
  free(tok);
  return fails;
}

static int check_refusals(void) {
  int fails = 0;
  char err[512];
  zt_backend be = g_be;
  zt_model_cfg mc = model_cfg(ZT_ARCH_GPT);
  zt_train_cfg tc = train_cfg(0, 0);
  zt_offload_cfg oc;
  zt_trainer *t = NULL;
  zt_offload_place p;
  fails += MC_EXPECT(zt_offload_place_parse("nvme", &p) == 0 && p == ZT_PLACE_NVME &&
                     zt_offload_place_parse("disk", &p) == -EINVAL, "place parse");
  zt_offload_cfg_defaults(&oc);
  oc.optimizer = ZT_PLACE_NVME;
  fails += MC_EXPECT(open_off(&t, &mc, &tc, &oc, &be, err, sizeof err) == -EINVAL &&
                     strstr(err, "offload.nvme_dir"), "nvme without a directory: %s", err);
  snprintf(oc.nvme_dir, sizeof oc.nvme_dir, "/nonexistent/zt-offload");
  fails += MC_EXPECT(open_off(&t, &mc, &tc, &oc, &be, err, sizeof err) < 0 &&
                     strstr(err, "offload.nvme_dir"), "missing nvme_dir: %s", err);
  zt_offload_cfg_defaults(&oc);
  oc.params = ZT_PLACE_NVME;
  snprintf(oc.nvme_dir, sizeof oc.nvme_dir, "/tmp");
  fails += MC_EXPECT(open_off(&t, &mc, &tc, &oc, &be, err, sizeof err) == -ENOTSUP &&
                     strstr(err, "offload.params"), "params nvme, optimizer host: %s", err);
  zt_offload_cfg_defaults(&oc);
  oc.grads = ZT_PLACE_NVME;
  fails += MC_EXPECT(open_off(&t, &mc, &tc, &oc, &be, err, sizeof err) == -ENOTSUP &&
                     strstr(err, "offload.grads"), "nvme grads: %s", err);
  zt_offload_cfg_defaults(&oc);
  oc.grads = ZT_PLACE_GPU;
  fails += MC_EXPECT(open_off(&t, &mc, &tc, &oc, &be, err, sizeof err) == -ENOTSUP &&
                     strstr(err, "offload.grads"), "gpu grads: %s", err);
  zt_offload_cfg_defaults(&oc);
  oc.prefetch = 17;
  fails += MC_EXPECT(open_off(&t, &mc, &tc, &oc, &be, err, sizeof err) == -EINVAL &&
                     strstr(err, "offload.prefetch"), "prefetch: %s", err);
  zt_offload_cfg_defaults(&oc);
  oc.gpu_budget = 4096;
  fails += MC_EXPECT(open_off(&t, &mc, &tc, &oc, &be, err, sizeof err) == -ENOMEM &&
                     strstr(err, "offload.gpu_budget is 4096"), "tiny budget: %s", err);
  oc.params = ZT_PLACE_GPU;
  fails += MC_EXPECT(open_off(&t, &mc, &tc, &oc, &be, err, sizeof err) == -ENOMEM &&
                     strstr(err, "offload.params gpu"), "resident in a tiny budget: %s", err);
  zt_offload_cfg_defaults(&oc);
  tc.precision = ZT_F16;
  fails += MC_EXPECT(open_off(&t, &mc, &tc, &oc, &be, err, sizeof err) == -ENOTSUP &&
                     strstr(err, "train.precision fp16"), "fp16: %s", err);
  tc.precision = ZT_BF16;
  oc.params = oc.optimizer = ZT_PLACE_NVME;
  snprintf(oc.nvme_dir, sizeof oc.nvme_dir, "/tmp");
  fails += MC_EXPECT(open_off(&t, &mc, &tc, &oc, &be, err, sizeof err) == -ENOTSUP &&
                     strstr(err, "offload.params: nvme"), "bf16 params nvme: %s", err);
  fails += MC_EXPECT(t == NULL, "a refused open returned a trainer");
  return fails;
}

/* An inf in the head's parameters: every gradient is nan. The step fails with -ERANGE as
 * without offload and changes nothing, with the updates overlapped (no clipping) or not. */
static int check_nonfinite(const char *tmp) {
  int fails = 0;
  char err[512], path[600];
  zt_model_cfg mc = model_cfg(ZT_ARCH_GPT);
  zt_model *m = NULL;
  if (MC_EXPECT(zt_model_create(&m, &mc, err, sizeof err) == 0, "%s", err)) return 1;
  size_t n = zt_model_num_params(m);
  float *init = malloc(n * sizeof(float)), *after = malloc(n * sizeof(float));
  if (!init || !after) exit(1);
  zt_model_init_params(m, init);
  const zt_tensor_info *ti = zt_model_tensor(m, zt_model_num_tensors(m) - 1);
  init[ti->offset] = INFINITY;
  snprintf(path, sizeof path, "%s/inf.safetensors", tmp);
  zt_model_state st = {"", init};
  fails += MC_EXPECT(zt_model_save_states(m, path, &st, 1, 0, NULL, err, sizeof err) == 0, "%s",
                     err);
  snprintf(mc.init_path, sizeof mc.init_path, "%s", path);
  int32_t *tok = make_tokens(&mc, 3);
  for (int clip = 0; clip < 2; clip++) {
    zt_train_cfg tc = train_cfg(clip ? 0.5f : 0.0f, 0);
    zt_offload_cfg oc;
    zt_offload_cfg_defaults(&oc);
    zt_trainer *t = NULL;
    if (MC_EXPECT(open_off(&t, &mc, &tc, &oc, &g_be, err, sizeof err) == 0, "%s", err)) {
      fails++;
      continue;
    }
    for (int i = 0; i < 2; i++) {
      zt_step_result r;
      int rc = zt_trainer_step(t, tok, &r, err, sizeof err);
      fails += MC_EXPECT(rc == -ERANGE && strstr(err, "left unchanged"), "clip %d try %d: rc "
                         "%d, %s", clip, i, rc, err);
    }
    zt_trainer_get_state(t, after, NULL, NULL);
    fails += MC_EXPECT(!memcmp(init, after, n * sizeof(float)) &&
                       zt_trainer_step_count(t) == 0, "clip %d: the state changed", clip);
    zt_trainer_close(t);
  }
  free(tok);
  free(init);
  free(after);
  zt_model_destroy(m);
  return fails;
}

static int check_json(void) {
  int fails = 0;
  char err[512];
  zt_offload_cfg oc;
  static const struct {
    const char *json;
    size_t budget;      /* SIZE_MAX: refused */
    const char *err;    /* in the message when refused */
  } cases[] = {
      {"{\"params\": \"host\", \"gpu_budget\": \"1.5 KiB\", \"prefetch\": 3}", 1536, NULL},
      {"{\"gpu_budget\": 4096}", 4096, NULL},
      {"{\"gpu_budget\": \"2GiB\"}", (size_t)2 << 30, NULL},
      {"{\"gpu_budget\": \"2 GB\"}", SIZE_MAX, "offload.gpu_budget"},
      {"{\"gpu_budget\": \"0.1B\"}", SIZE_MAX, "offload.gpu_budget"},
      {"{\"optimizer\": \"disk\"}", SIZE_MAX, "offload.optimizer"},
      {"{\"optimizer\": \"nvme\", \"nvme_dir\": \"rel/dir\"}", SIZE_MAX, "offload.nvme_dir"},
      {"{\"optimizer\": \"nvme\"}", SIZE_MAX, "offload.nvme_dir is required"},
      {"{\"prefetch\": 99}", SIZE_MAX, "offload.prefetch"},
      {"{\"budget\": 1}", SIZE_MAX, "unknown field 'offload.budget'"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    json_t *j = json_loads(cases[i].json, 0, NULL);
    err[0] = 0;
    int rc = zt_offload_cfg_from_json(j, &oc, err, sizeof err);
    json_decref(j);
    if (cases[i].budget == SIZE_MAX)
      fails += MC_EXPECT(rc < 0 && strstr(err, cases[i].err), "%s: rc %d, '%s'", cases[i].json,
                         rc, err);
    else
      fails += MC_EXPECT(rc == 0 && oc.gpu_budget == cases[i].budget, "%s: rc %d (%s), budget "
                         "%zu", cases[i].json, rc, err, oc.gpu_budget);
  }
  json_t *j = json_loads("{\"params\": \"host\", \"prefetch\": 3}", 0, NULL);
  zt_offload_cfg_from_json(j, &oc, err, sizeof err);
  json_decref(j);
  fails += MC_EXPECT(oc.params == ZT_PLACE_HOST && oc.prefetch == 3 &&
                     oc.optimizer == ZT_PLACE_AUTO, "fields not applied");
  return fails;
}

/* The host tier, or with "nvme" the NVMe placements (skipped where io_uring is forbidden). */
int main(int argc, char **argv) {
  int nvme = argc > 1 && !strcmp(argv[1], "nvme"), fails = 0;
  g_be = mc_backend();
  const char *tmp = mc_tmpdir();
  zt_arch archs[] = {ZT_ARCH_GPT, ZT_ARCH_ENCODER};
  zt_offload_cfg oc;
  zt_offload_cfg_defaults(&oc);
  if (nvme) {
    zt_nvme_store *probe = NULL;
    char err[512];
    int rc = zt_nvme_store_open(&probe, tmp, NULL, err, sizeof err);
    zt_nvme_store_close(probe);
    if (rc == -ENOSYS || rc == -EPERM) {
      fprintf(stderr, "SKIP: io_uring is not available here (%s)\n", err);
      mc_rmtree(tmp);
      zt_backend_cpu_close(&g_be);
      return 77;
    }
    snprintf(oc.nvme_dir, sizeof oc.nvme_dir, "%s", tmp);
  } else {
    fails += check_refusals() + check_json() + check_nonfinite(tmp);
  }
  for (int i = 0; i < 2; i++) {
    if (nvme) {
      oc.optimizer = ZT_PLACE_NVME;
      oc.params = ZT_PLACE_AUTO;
      oc.prefetch = 1;
      fails += check_case(archs[i], "optimizer nvme, resident", train_cfg(0, 0), oc, 0);
      fails += check_case(archs[i], "optimizer nvme, streamed from the host, clipped",
                          train_cfg(0.5f, 0), oc, 1);
      oc.params = ZT_PLACE_NVME;
      oc.prefetch = 2;
      fails += check_case(archs[i], "params and optimizer nvme, streamed", train_cfg(0, 1), oc,
                          1);
      zt_train_cfg bf = train_cfg(0, 0);
      bf.precision = ZT_BF16;
      oc.params = ZT_PLACE_HOST;
      fails += check_case(archs[i], "bf16, optimizer nvme, streamed", bf, oc, 1);
      /* two units' optimizer in device buffers (not aliased to the host's here), the rest on
       * NVMe; no clipping: the norm is summed in two parts */
      oc.gpu_units = 2;
      fails += check_case(archs[i], "optimizer nvme, 2 device units", train_cfg(0, 0), oc, 0);
      oc.gpu_units = -1;
      fails += check_resume(archs[i], oc, tmp);
      if (i == 0) fails += check_ckpt_read_fault(oc, tmp);
      continue;
    }
    oc.prefetch = 1;
    fails += check_case(archs[i], "resident, overlapped", train_cfg(0, 0), oc, 0);
    fails += check_case(archs[i], "resident, clipped", train_cfg(0.5f, 0), oc, 0);
    oc.prefetch = 0;
    fails += check_case(archs[i], "streamed, clipped, no prefetch", train_cfg(0.5f, 0), oc, 1);
    oc.prefetch = 2;
    fails += check_case(archs[i], "streamed, overlapped, checkpointed", train_cfg(0, 1), oc, 1);
    oc.prefetch = 1;
    fails += check_resume(archs[i], oc, tmp);
    /* bf16: the units carry the fp32 parameters their ops read and the bf16 copy the AdamW
     * writes; still bitwise the run without offload */
    zt_train_cfg bf = train_cfg(0, 0);
    bf.precision = ZT_BF16;
    fails += check_case(archs[i], "bf16, resident, overlapped", bf, oc, 0);
    bf = train_cfg(0.5f, 1);
    bf.precision = ZT_BF16;
    fails += check_case(archs[i], "bf16, streamed, clipped, checkpointed", bf, oc, 1);
    /* the first units' optimizer on the device, the others' on the host */
    oc.gpu_units = 2;
    oc.prefetch = 0; /* the four streamed units' smallest arena must then evict */
    fails += check_case(archs[i], "2 device units, streamed, clipped", train_cfg(0.5f, 0), oc, 1);
    oc.prefetch = 1;
    fails += check_case(archs[i], "bf16, 2 device units, resident", bf, oc, 0);
    oc.gpu_units = -1;
    fails += check_auto_units(archs[i]);
    fails += check_auto_ckpt(archs[i]);
  }
  mc_rmtree(tmp);
  zt_backend_cpu_close(&g_be);
  if (fails) fprintf(stderr, "%d failure(s)\n", fails);
  return fails ? 1 : 0;
}
