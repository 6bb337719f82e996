/* The offloaded step against the run without offload, on the CPU backend, for both archs: losses,
 * parameters and AdamW moments bitwise equal over STEPS steps with every unit resident, and with
 * the smallest device budget that opens (parameters streamed, evictions counted, the arena's
 * peak within its budget); with and without clipping (updates after the backward or overlapping
 * it), activation checkpointing, a micro-batch of padding alone; one micro-batch a step without
 * clipping (the gradient ring instead of the flat host gradients) and two; resume from a
 * checkpoint of an offloaded job, into the same placement or another; bf16 compute (fp32 and
 * bf16 pieces streamed); the plan's host bytes are what the host arena holds; placements and
 * budgets that cannot work are refused naming the field. With the argument "nvme": the same
 * with the optimizer state, then the parameters too, on NVMe (the store's counters show the
 * traffic), and split between the host and NVMe (host_units, and optimizer auto under a
 * host_budget). fp16 (the loss scaled, the compute copy in fp16) in every placement bf16 runs
 * in, started at a loss scale that overflows and with a short growth interval: the same steps
 * skipped and the same scales as without offload, the skipped steps updating nothing (not even
 * a refetch of the resident units), a checkpoint in the middle carrying the scaler; a step
 * whose gradients are nan is skipped, never an error. The step's gradient sums over several
 * micro-batches on the device (grads gpu, which also takes the ring without clipping) and on the
 * host (grads host, each later micro-batch resuming from them) in the placements above.
 * Clipping at 0.5 clips, at NOCLIP never; without NVMe units each step's updates land behind the
 * next step's forward (counted exactly).
 * offload.order: parsed, auto's choice is the cost model's, unit refused past its limit; with the
 * argument "unit" (beside "nvme" or not) every case above runs unit-major (llama untied, so
 * that its backward is unit-major too; gpt's head reads the embedding), each streamed unit
 * fetched at most once a pass and its gradients written back once a step. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/train/offload/offload.h"
#include "engine/train/config.h"
#include "engine/train/trainer_internal.h"
#include "offload/nvme_store.h"
#include "tests/unit/model/mcheck.h"
#include "tests/unit/offload_train/otrain.h"

#define STEPS 10
#define B 2
#define GA 3

static int g_ga = GA; /* micro-batches a step of the cases that follow */
static int g_wide;    /* the cases that follow on d_model 64: units of many pages each */
static zt_dtype g_dt = ZT_F32; /* the compute precision of the cases that follow */
/* offload.order of every offloaded trainer whose spec leaves it to auto ("unit": argv) */
static zt_offload_order g_order = ZT_ORDER_AUTO;

/* fp16: the initial loss scale of both trainers of a case, past what the first steps' gradients
 * can take in fp16, so that they are skipped until the scale has backed off; with check_case's
 * growth interval of 2 clean steps the scale grows and overflows again. */
#define F16_SCALE0 0x1p22f
#define F16_GROWTH 2
/* a grad_clip no norm of these cases reaches */
#define NOCLIP 1e6f

static zt_backend g_be; /* one cpu backend for every trainer */

static zt_model_cfg model_cfg(zt_arch arch) {
  zt_model_cfg mc = mc_tiny(arch);
  mc.n_layers = 4;
  /* unit-major: llama untied (Llama 3 8B's head), whose backward is unit-major too; gpt keeps
   * the head that reads the embedding */
  if (arch == ZT_ARCH_LLAMA && g_order) mc.tie_embeddings = 0;
  if (g_wide) {
    mc.d_model = 64;
    mc.d_ff = arch == ZT_ARCH_ENCODER ? 128 : 0;
  }
  return mc;
}

static zt_train_cfg train_cfg(float clip, int ckpt_every) {
  zt_train_cfg tc = mc_train(B, g_ga);
  tc.steps = STEPS;
  tc.warmup_steps = 2;
  tc.schedule = ZT_SCHED_COSINE;
  tc.min_lr = 1e-4f;
  tc.lr = 1e-2f;
  tc.weight_decay = 0.1f;
  tc.grad_clip = clip;
  tc.ckpt_every = ckpt_every;
  tc.precision = g_dt;
  return tc;
}

/* fp16: the scaler a case starts from (GradScaler(init_scale=F16_SCALE0,
 * growth_interval=growth)); the interval is not in checkpoints, so a resumed case keeps 2000. */
static void start_scaler(zt_trainer *t, int growth) {
  if (t->tc.precision != ZT_F16) return;
  t->scaler.scale = F16_SCALE0;
  t->scaler.growth_interval = growth;
}

/* Step i (0-based) of make_tokens counts a target: all but two with one micro-batch a step. */
static int step_counts(int i) { return g_ga > 1 || (i != 3 && i != 5); }

static size_t step_tokens(const zt_model_cfg *mc) {
  return (size_t)g_ga * B * (mc->seq_len + 1);
}

/* STEPS steps of tokens; step 3's last micro-batch and step 5's first are padding alone (with
 * one micro-batch a step, steps 3 and 5 count nothing); step 1's first micro-batch counts fewer
 * targets than its others (the step's normaliser is its counted targets). */
static int32_t *make_tokens(const zt_model_cfg *mc, uint64_t seed) {
  size_t per = step_tokens(mc), micro = (size_t)B * (mc->seq_len + 1);
  int32_t *tok = malloc(STEPS * per * sizeof *tok);
  if (!tok) exit(1);
  mc_tokens(&seed, tok, STEPS * per, mc->vocab);
  for (size_t i = 0; i < micro; i++) {
    tok[3 * per + (size_t)(g_ga - 1) * micro + i] = -1;
    tok[5 * per + i] = -1;
  }
  tok[1 * per + 3] = tok[1 * per + 4] = -1;
  return tok;
}

/* Steps [from, to) of two runs: the same losses bitwise, the same steps skipped, the same loss
 * scales. */
static int same_steps(const zt_step_result *got, const zt_step_result *want, int from, int to,
                      const char *what) {
  int fails = 0;
  for (int i = from; i < to; i++)
    fails += MC_EXPECT(!memcmp(&got[i].loss, &want[i].loss, sizeof got[i].loss) &&
                           got[i].skipped == want[i].skipped &&
                           !memcmp(&got[i].loss_scale, &want[i].loss_scale, sizeof(float)),
                       "%s: step %d loss %.17g skipped %d scale %g; without offload %.17g, %d, "
                       "%g", what, i + 1, got[i].loss, got[i].skipped, (double)got[i].loss_scale,
                       want[i].loss, want[i].skipped, (double)want[i].loss_scale);
  return fails;
}

/* The skipped steps of a run as a pattern ("..s.s"), and their count. */
static int skip_pattern(const zt_step_result *r, char pattern[STEPS + 1]) {
  int n = 0;
  for (int i = 0; i < STEPS; i++) {
    pattern[i] = r[i].skipped ? 's' : '.';
    n += r[i].skipped;
  }
  pattern[STEPS] = 0;
  return n;
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
  zt_step_result ref[STEPS] = {{0}}, off[STEPS] = {{0}};
  zt_trainer *a = NULL, *b = NULL;
  if (want_streaming) {
    oc.gpu_budget = ot_min_budget(&mc, &tc, oc, &be, g_order);
    fails += MC_EXPECT(oc.gpu_budget > 0, "%s: no budget opens", what);
  }
  if (MC_EXPECT(zt_trainer_open(&a, &mc, &tc, &be, err, sizeof err) == 0, "%s: %s", what, err) ||
      MC_EXPECT(ot_open(&b, &mc, &tc, &oc, &be, g_order, err, sizeof err) == 0,
                "%s: %s", what, err)) {
    fails++;
    goto out;
  }
  start_scaler(a, F16_GROWTH);
  start_scaler(b, F16_GROWTH);
  fails += ot_run(a, tok, per, 0, STEPS, ref, what);
  fails += ot_run(b, tok, per, 0, STEPS, off, what);
  fails += same_steps(off, ref, 0, STEPS, what);
  fails += same_state(a, b, what);
  /* fp16: skipped steps update nothing and invalidate no device copy, so a resident unit is not
   * fetched again for the next step */
  char pattern[STEPS + 1];
  int skipped = skip_pattern(ref, pattern), refetches_saved = 0, grown = 0;
  for (int i = 0; i + 1 < STEPS; i++) {
    refetches_saved += ref[i].skipped && step_counts(i + 1);
    grown += ref[i + 1].loss_scale > ref[i].loss_scale;
  }
  if (tc.precision == ZT_F16) {
    fails += MC_EXPECT(skipped > 0 && grown > 0, "%s: %d steps skipped (%s), the scale grew %d "
                       "times: the case does not test the scaler", what, skipped, pattern, grown);
    printf("%-60s steps %s, last scale %g\n", what, pattern, (double)ref[STEPS - 1].loss_scale);
  }
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
  if (oc.host_units >= 0)
    fails += MC_EXPECT(st.host_units == oc.host_units, "%s: %d units on the host, asked %d",
                       what, st.host_units, oc.host_units);
  /* the step's gradient sums where asked; auto without a budget: on the device with several
   * micro-batches (with one the two are the same: host) */
  zt_offload_place sums = oc.grads != ZT_PLACE_AUTO ? oc.grads
                          : tc.grad_accum > 1 && !oc.gpu_budget ? ZT_PLACE_GPU
                          : tc.grad_accum == 1 ? ZT_PLACE_HOST
                                               : st.grads;
  fails += MC_EXPECT(st.grads == sums && (st.dsum_bytes > 0) == (sums == ZT_PLACE_GPU),
                     "%s: gradient sums on the %s (%zu device bytes), expected %s", what,
                     zt_offload_place_name(st.grads), st.dsum_bytes, zt_offload_place_name(sums));
  /* with them on the device each streamed unit's gradients go to the host once a step */
  if (sums == ZT_PLACE_GPU)
    fails += MC_EXPECT(st.grad_writebacks <= (uint64_t)STEPS * nu, "%s: %llu write-backs over "
                       "%d steps of %d streamed units", what,
                       (unsigned long long)st.grad_writebacks, STEPS, nu);
  /* the gradient ring exactly when no clipping, one micro-batch a step or the sums on the
   * device, not in fp16 */
  int ring = tc.grad_clip == 0 && (tc.grad_accum == 1 || sums == ZT_PLACE_GPU) &&
             tc.precision != ZT_F16;
  /* asked: that many (at most the streamed units); the planner's: the tiny model's CPU AdamW
   * of a unit outlasts its backward by the cost model's rates, so every streamed unit, which
   * the flat buffer holds (0 slots) */
  int slots = !oc.grad_slots ? 0 : oc.grad_slots < nu ? oc.grad_slots : nu;
  fails += MC_EXPECT(ring ? st.grad_slots == slots : st.grad_slots == 0,
                     "%s: %d gradient slots (%d expected)", what, st.grad_slots, ring ? slots : 0);
  fails += MC_EXPECT(st.gpu_unit_updates == (uint64_t)(STEPS - skipped) * st.gpu_units,
                     "%s: %llu device unit updates", what,
                     (unsigned long long)st.gpu_unit_updates);
  fails += MC_EXPECT(st.arena_peak <= st.arena_budget && st.act_bytes + st.arena_peak <=
                     st.device_budget, "%s: arena peak %zu over its budget %zu", what,
                     st.arena_peak, st.arena_budget);
  fails += MC_EXPECT(zt_trainer_backend_bytes(b) == st.device_budget, "%s: backend bytes", what);
  /* What the daemon admits at submit is exactly what the trainer took. */
  zt_offload_plan plan;
  if (!oc.order) oc.order = g_order;
  int um = oc.order == ZT_ORDER_UNIT && tc.grad_accum > 1;
  fails += MC_EXPECT(st.unit_major == um, "%s: unit-major %d, expected %d", what, st.unit_major,
                     um);
  /* unit-major: a streamed unit comes to the device once for the forward of every micro-batch
   * and once for their backward (a head reading the embedding: once a micro-batch in the
   * backward), and its gradients go to the host once a step */
  int tied = zt_model_head_reads_embed(zt_trainer_model(b));
  uint64_t passes = 1 + (tied ? (uint64_t)tc.grad_accum : 1);
  if (um)
    fails += MC_EXPECT(st.fetches <= STEPS * passes * nu &&
                           (tied || st.grad_writebacks <= (uint64_t)STEPS * nu),
                       "%s: unit-major made %llu fetches, %llu write-backs in %d steps of %d "
                       "streamed units", what, (unsigned long long)st.fetches,
                       (unsigned long long)st.grad_writebacks, STEPS, nu);
  fails += MC_EXPECT(zt_offload_estimate(&mc, &tc, &oc, be.ops, &plan, err, sizeof err) == 0,
                     "%s: estimate: %s", what, err);
  size_t est_host = plan.host_bytes, est_dev = plan.device_bytes;
  fails += MC_EXPECT(plan.gpu_units == st.gpu_units && plan.host_units == st.host_units &&
                     plan.grad_slots == st.grad_slots && plan.ckpt_every == st.ckpt_every &&
                     plan.params == st.params && plan.est.step_s == st.est.step_s &&
                     plan.grads == st.grads && plan.dsum_bytes == st.dsum_bytes &&
                     plan.act_bytes == st.act_bytes && plan.arena_bytes == st.arena_budget &&
                     plan.gpu_unit_bytes == st.gpu_unit_bytes,
                     "%s: the plan is not what the trainer runs", what);
  /* the expected transfers bound the real ones (micro-batches of padding alone move less); a
   * resident run moves more than half of them over the steps that update (an fp16 step
   * skipped updates, and so moves back, nothing) */
  fails += MC_EXPECT((uint64_t)STEPS * plan.h2d_bytes >= st.bytes_h2d &&
                     (uint64_t)STEPS * plan.d2h_bytes >= st.bytes_d2h &&
                     (want_streaming ||
                      st.bytes_h2d * 2 > (uint64_t)(STEPS - skipped) * plan.h2d_bytes),
                     "%s: plan expects %llu/%llu bytes H2D/D2H a step, %llu/%llu over %d steps",
                     what, (unsigned long long)plan.h2d_bytes, (unsigned long long)plan.d2h_bytes,
                     (unsigned long long)st.bytes_h2d, (unsigned long long)st.bytes_d2h, STEPS);
  /* units past the host ones keep their optimizer on NVMe */
  int on_nvme = st.gpu_units + st.host_units < zt_model_num_units(zt_trainer_model(b));
  fails += MC_EXPECT(on_nvme == (plan.nvme_bytes > 0) &&
                     plan.nvme_step_bytes == 2 * plan.nvme_bytes,
                     "%s: plan nvme %llu bytes", what, (unsigned long long)plan.nvme_bytes);
  /* the plan's host bytes are the arena's, every one of them allocated */
  fails += MC_EXPECT(st.host_used == st.host_bytes, "%s: host arena %zu bytes, %zu used", what,
                     st.host_bytes, st.host_used);
  fails += MC_EXPECT(est_host == st.host_bytes && est_dev == st.device_budget &&
                     st.device_budget ==
                         st.act_bytes + st.gpu_unit_bytes + st.dsum_bytes + st.arena_budget,
                     "%s: estimate host %zu device %zu, trainer host %zu device %zu", what,
                     est_host, est_dev, st.host_bytes, st.device_budget);
  fails += MC_EXPECT(st.adam_units == (uint64_t)(STEPS - skipped) * nu, "%s: %llu unit "
                     "updates", what, (unsigned long long)st.adam_units);
  fails += MC_EXPECT(st.grad_writebacks > 0 && st.bytes_d2h > 0, "%s: no write-backs", what);
  /* the timeline: every resource that worked shows busy time, none more than the steps took
   * (the pool's threads each) */
  fails += MC_EXPECT(st.step_ns > 0 && st.compute_ns > 0 && st.compute_ns <= st.step_ns &&
                     st.h2d_ns > 0 && st.d2h_ns > 0 && st.adam_ns > 0 &&
                     st.adam_ns <= st.step_ns * (uint64_t)st.adam_threads &&
                     on_nvme == (st.nvme_ns > 0),
                     "%s: timeline step %llu compute %llu h2d %llu d2h %llu adam %llu nvme %llu ns",
                     what, (unsigned long long)st.step_ns, (unsigned long long)st.compute_ns,
                     (unsigned long long)st.h2d_ns, (unsigned long long)st.d2h_ns,
                     (unsigned long long)st.adam_ns, (unsigned long long)st.nvme_ns);
  if (tc.grad_clip > 0 || tc.precision == ZT_F16)
    fails += MC_EXPECT(st.adam_overlapped == 0, "%s: updates overlapped though clipping or fp16 "
                       "needs the whole backward first", what);
  else /* one step has no counted micro-batch at its end; overlap still reaches every unit, but
        * not in the steps that count nothing (make_tokens) */
    fails += MC_EXPECT(st.adam_overlapped == (uint64_t)(STEPS - (g_ga == 1 ? 2 : 0)) * nu,
                       "%s: %llu updates overlapped", what,
                       (unsigned long long)st.adam_overlapped);
  /* clipping: 0.5 clips some steps, NOCLIP none (the coefficient stays 1: the same updates,
   * after the norm) */
  int clipped = 0;
  for (int i = 0; i < STEPS; i++) clipped += !ref[i].skipped && ref[i].grad_norm > tc.grad_clip;
  if (tc.grad_clip > 0)
    fails += MC_EXPECT(tc.grad_clip < NOCLIP ? clipped > 0 : clipped == 0, "%s: %d of %d steps "
                       "clipped at %g", what, clipped, STEPS, (double)tc.grad_clip);
  /* without NVMe units a step's updates still running when it returns land behind the next
   * step's forward: each streamed unit waited for there once, after every step that updated
   * (not skipped) and is followed by one that walks */
  uint64_t landings = 0;
  for (int i = 0; i + 1 < STEPS; i++) landings += !ref[i].skipped && step_counts(i + 1);
  fails += MC_EXPECT(st.adam_landed == (on_nvme ? 0 : landings * nu), "%s: %llu updates landed "
                     "behind the next forward (%llu expected)", what,
                     (unsigned long long)st.adam_landed,
                     (unsigned long long)(on_nvme ? 0 : landings * nu));
  if (on_nvme)
    fails += MC_EXPECT(st.nvme_bytes_read > 0 && st.nvme_bytes_written > 0, "%s: NVMe read "
                       "%llu, written %llu bytes", what, (unsigned long long)st.nvme_bytes_read,
                       (unsigned long long)st.nvme_bytes_written);
  else
    fails += MC_EXPECT(st.nvme_bytes_read == 0 && st.nvme_bytes_written == 0, "%s: NVMe used",
                       what);
  /* streamed unit-major untied: the gradients exactly once a step (the plan's bytes) */
  if (want_streaming && um && !tied)
    fails += MC_EXPECT(st.bytes_d2h == (uint64_t)STEPS * plan.d2h_bytes, "%s: %llu bytes to the "
                       "host, expected %d x %llu", what, (unsigned long long)st.bytes_d2h, STEPS,
                       (unsigned long long)plan.d2h_bytes);
  if (want_streaming) {
    fails += MC_EXPECT(st.device_budget == oc.gpu_budget, "%s: budget %zu, asked %zu", what,
                       st.device_budget, oc.gpu_budget);
    /* all resident, each step fetches every unit once; streaming refetches in the walks */
    fails += MC_EXPECT(st.evictions > 0 && st.fetches > (uint64_t)STEPS * nu,
                       "%s: %llu fetches, %llu evictions: not streamed", what,
                       (unsigned long long)st.fetches, (unsigned long long)st.evictions);
  } else {
    /* steps that count nothing fetch nothing (make_tokens), nor those after a skipped one */
    uint64_t fetching = STEPS - (g_ga == 1 ? 2 : 0) - refetches_saved;
    fails += MC_EXPECT(st.evictions == 0 && st.fetches == fetching * nu,
                       "%s: all resident, %llu fetches %llu evictions", what,
                       (unsigned long long)st.fetches, (unsigned long long)st.evictions);
    /* the bytes exactly where every walk writes a unit's gradients back once a step (unit-major
     * untied, or the sums on the device): the pieces once a fetching step, the gradients once
     * a walking step, what the plan expects of a step */
    uint64_t walking = STEPS - (g_ga == 1 ? 2 : 0);
    if ((um && !tied) || sums == ZT_PLACE_GPU)
      fails += MC_EXPECT(st.bytes_h2d == fetching * plan.h2d_bytes &&
                             st.bytes_d2h == walking * plan.d2h_bytes,
                         "%s: %llu/%llu bytes H2D/D2H, expected %llu x %llu / %llu x %llu",
                         what, (unsigned long long)st.bytes_h2d,
                         (unsigned long long)st.bytes_d2h, (unsigned long long)fetching,
                         (unsigned long long)plan.h2d_bytes, (unsigned long long)walking,
                         (unsigned long long)plan.d2h_bytes);
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
  oc.gpu_budget = ot_min_budget(&mc, &tc, oc, &g_be, g_order);
  int prev = -1;
  for (int k = 0; k < 3; k++) {
    zt_trainer *t = NULL;
    zt_offload_stats st;
    if (MC_EXPECT(ot_open(&t, &mc, &tc, &oc, &g_be, g_order, err, sizeof err) == 0, "%s", err))
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
  size_t tight = ot_min_budget(&mc, &tc, oc, &g_be, g_order),
         loose = ot_min_budget(&mc, &plain, oc, &g_be, g_order);
  fails += MC_EXPECT(tight < loose, "%s: checkpointing does not lower the budget (%zu, %zu)",
                     zt_arch_name(arch), tight, loose);
  tc.ckpt_every = ZT_CKPT_AUTO;
  int32_t *tok = make_tokens(&mc, 17);
  size_t per = step_tokens(&mc);
  zt_step_result ref[STEPS] = {{0}}, off[STEPS] = {{0}};
  zt_trainer *a = NULL, *b = NULL, *c = NULL;
  zt_offload_stats st;
  oc.gpu_budget = tight;
  if (MC_EXPECT(zt_trainer_open(&a, &mc, &tc, &g_be, err, sizeof err) == 0, "%s", err) ||
      MC_EXPECT(ot_open(&b, &mc, &tc, &oc, &g_be, g_order, err, sizeof err) == 0, "auto at %zu: %s",
                tight, err)) {
    fails++;
    goto out;
  }
  zt_trainer_offload_stats(b, &st);
  fails += MC_EXPECT(st.ckpt_every > 0 && st.device_budget <= tight && st.est.step_s > 0,
                     "%s auto at the checkpointed minimum: every %d, %zu bytes, est %g s",
                     zt_arch_name(arch), st.ckpt_every, st.device_budget, st.est.step_s);
  fails += ot_run(a, tok, per, 0, STEPS, ref, "auto ckpt reference");
  fails += ot_run(b, tok, per, 0, STEPS, off, "auto ckpt");
  fails += same_steps(off, ref, 0, STEPS, "auto ckpt");
  oc.gpu_budget = 4 * loose;
  if (MC_EXPECT(ot_open(&c, &mc, &tc, &oc, &g_be, g_order, err, sizeof err) == 0, "%s", err)) {
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

/* optimizer auto with a host_budget and an nvme_dir: the units after the device ones that the
 * budget holds keep their optimizer on the host, the rest on NVMe; a budget for all of them
 * keeps none on NVMe; an nvme_budget below what the rest needs is refused. Then trained bitwise
 * as without offload with the split the budget gave. */
static int check_auto_split(zt_arch arch, zt_offload_cfg oc, zt_train_cfg tc, const char *name) {
  int fails = 0;
  char err[512], what[128];
  snprintf(what, sizeof what, "auto split, %s", name);
  g_wide = 1;
  zt_model_cfg mc = model_cfg(arch);
  zt_offload_plan all, none, p;
  oc.optimizer = ZT_PLACE_HOST;
  oc.host_units = -1;
  int rc = zt_offload_estimate(&mc, &tc, &oc, g_be.ops, &all, err, sizeof err);
  oc.optimizer = ZT_PLACE_NVME;
  if (rc == 0) rc = zt_offload_estimate(&mc, &tc, &oc, g_be.ops, &none, err, sizeof err);
  if (MC_EXPECT(rc == 0, "%s: %s", what, err)) {
    g_wide = 0;
    return 1;
  }
  int streamed = all.units - all.gpu_units;
  fails += MC_EXPECT(all.host_units == streamed && all.nvme_bytes == 0 && none.host_units == 0 &&
                     none.nvme_bytes > 0 && none.host_bytes < all.host_bytes,
                     "%s: all on the host %d units %zu bytes, none %d units %zu bytes", what,
                     all.host_units, all.host_bytes, none.host_units, none.host_bytes);
  oc.optimizer = ZT_PLACE_AUTO;
  oc.host_budget = all.host_bytes;
  rc = zt_offload_estimate(&mc, &tc, &oc, g_be.ops, &p, err, sizeof err);
  fails += MC_EXPECT(rc == 0 && p.host_units == streamed && p.nvme_bytes == 0, "%s: a budget for "
                     "all: rc %d (%s), %d units on the host", what, rc, err, p.host_units);
  oc.host_budget = (all.host_bytes + none.host_bytes) / 2;
  rc = zt_offload_estimate(&mc, &tc, &oc, g_be.ops, &p, err, sizeof err);
  fails += MC_EXPECT(rc == 0 && p.host_units > 0 && p.host_units < streamed &&
                     p.host_bytes <= oc.host_budget && p.nvme_bytes > 0 &&
                     p.nvme_bytes < none.nvme_bytes, "%s: budget %zu: rc %d (%s), %d units on "
                     "the host, %zu bytes", what, oc.host_budget, rc, err, p.host_units,
                     p.host_bytes);
  /* one unit more on the host would not fit */
  zt_offload_cfg more = oc;
  zt_offload_plan q;
  more.host_units = p.host_units + 1;
  more.host_budget = 0;
  fails += MC_EXPECT(zt_offload_estimate(&mc, &tc, &more, g_be.ops, &q, err, sizeof err) == 0 &&
                     q.host_bytes > oc.host_budget, "%s: %d host units take %zu bytes, within "
                     "the budget %zu", what, more.host_units, q.host_bytes, oc.host_budget);
  zt_offload_cfg tight = oc;
  tight.nvme_budget = p.nvme_bytes - 1;
  fails += MC_EXPECT(zt_offload_estimate(&mc, &tc, &tight, g_be.ops, &q, err, sizeof err) ==
                         -ENOSPC && strstr(err, "offload.nvme_budget"),
                     "%s: nvme budget below the plan's: %s", what, err);
  tight.nvme_budget = p.nvme_bytes;
  fails += MC_EXPECT(zt_offload_estimate(&mc, &tc, &tight, g_be.ops, &q, err, sizeof err) == 0,
                     "%s: nvme budget of the plan's: %s", what, err);
  fails += check_case(arch, what, tc, oc, 0);
  g_wide = 0;
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
  int rc = ot_open(&t, &mc, &tc, &oc, &g_be, g_order, err, sizeof err);
  unsetenv("ZT_FAULT_NVME");
  if (MC_EXPECT(rc == 0, "open with a read fault armed: %s", err)) return 1;
  rc = zt_trainer_save(t, dir, err, sizeof err);
  fails += MC_EXPECT(rc == -EIO && strstr(err, "reading the trainer's state failed") &&
                     strstr(err, ".master") && strstr(err, "Input/output error"),
                     "checkpoint read fault: rc %d, '%s'", rc, err);
  fails += MC_EXPECT(zt_trainer_save(t, dir, err, sizeof err) == 0, "save after the fault: %s",
                     err);
  zt_trainer_close(t);
  return fails;
}

/* 5 steps offloaded with one placement, a checkpoint, a fresh offloaded trainer with another
 * (which ran a step of its own) loads it, 5 more: the losses and state of 10 steps without
 * offload; a trainer without offload resumes from the same checkpoint alike. */
static int check_resume(zt_arch arch, zt_offload_cfg oc, zt_offload_cfg load_oc, float clip,
                        const char *name, const char *tmp) {
  int fails = 0;
  char err[512], dir[600], what[128];
  zt_backend be = g_be;
  zt_model_cfg mc = model_cfg(arch);
  zt_train_cfg tc = train_cfg(clip, 0);
  snprintf(what, sizeof what, "%s resume, %s", zt_arch_name(arch), name);
  int32_t *tok = make_tokens(&mc, 11 + (uint64_t)arch);
  size_t per = step_tokens(&mc);
  zt_step_result ref[STEPS] = {{0}}, off[STEPS] = {{0}};
  zt_trainer *a = NULL, *b = NULL, *c = NULL;
  snprintf(dir, sizeof dir, "%s/%s-ckpt", tmp, zt_arch_name(arch));
  oc.gpu_budget = ot_min_budget(&mc, &tc, oc, &be, g_order);
  load_oc.gpu_budget = ot_min_budget(&mc, &tc, load_oc, &be, g_order);
  if (MC_EXPECT(zt_trainer_open(&a, &mc, &tc, &be, err, sizeof err) == 0, "%s", err) ||
      MC_EXPECT(ot_open(&b, &mc, &tc, &oc, &be, g_order, err, sizeof err) == 0,
                "%s: %s", what, err) ||
      MC_EXPECT(ot_open(&c, &mc, &tc, &load_oc, &be, g_order, err, sizeof err) == 0, "%s: %s", what,
                err)) {
    fails++;
    goto out;
  }
  /* fp16: skipped steps at the start; the scale the checkpoint carries is not the default */
  start_scaler(a, ZT_LOSS_SCALE_INTERVAL);
  start_scaler(b, ZT_LOSS_SCALE_INTERVAL);
  fails += ot_run(a, tok, per, 0, STEPS, ref, "resume reference");
  fails += ot_run(b, tok, per, 0, STEPS / 2, off, what);
  fails += MC_EXPECT(zt_trainer_save(b, dir, err, sizeof err) == 0, "%s: save: %s", what, err);
  char pattern[STEPS + 1];
  if (tc.precision == ZT_F16)
    fails += MC_EXPECT(skip_pattern(ref, pattern) > 0 &&
                           ref[STEPS / 2 - 1].loss_scale != ZT_LOSS_SCALE_INIT,
                       "%s: steps %s, scale %g at the checkpoint: the scaler is not tested", what,
                       pattern, (double)ref[STEPS / 2 - 1].loss_scale);
  /* c has run a step of its own first: the load must replace its state and device copies */
  zt_step_result scratch[STEPS] = {{0}};
  fails += ot_run(c, tok, per, STEPS - 1, STEPS, scratch, what);
  fails += MC_EXPECT(zt_trainer_load(c, dir, err, sizeof err) == 0, "%s: load: %s", what, err);
  fails += MC_EXPECT(zt_trainer_step_count(c) == STEPS / 2, "%s: step count %d after load",
                     what, zt_trainer_step_count(c));
  fails += ot_run(c, tok, per, STEPS / 2, STEPS, off, what);
  fails += same_steps(off, ref, 0, STEPS, what);
  fails += same_state(a, c, what);
  /* the checkpoint of an offloaded job resumes without offload too */
  zt_step_result plain[STEPS] = {{0}};
  zt_trainer *d = NULL;
  if (MC_EXPECT(zt_trainer_open(&d, &mc, &tc, &be, err, sizeof err) == 0, "%s", err) ||
      MC_EXPECT(zt_trainer_load(d, dir, err, sizeof err) == 0, "plain load: %s", err)) {
    fails++;
  } else {
    fails += ot_run(d, tok, per, STEPS / 2, STEPS, plain, "resume without offload");
    fails += same_steps(plain, ref, STEPS / 2, STEPS, "resume without offload");
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
  fails += MC_EXPECT(ot_open(&t, &mc, &tc, &oc, &be, g_order, err, sizeof err) == -EINVAL &&
                     strstr(err, "offload.nvme_dir"), "nvme without a directory: %s", err);
  snprintf(oc.nvme_dir, sizeof oc.nvme_dir, "/nonexistent/zt-offload");
  fails += MC_EXPECT(ot_open(&t, &mc, &tc, &oc, &be, g_order, err, sizeof err) < 0 &&
                     strstr(err, "offload.nvme_dir"), "missing nvme_dir: %s", err);
  zt_offload_cfg_defaults(&oc);
  oc.params = ZT_PLACE_NVME;
  snprintf(oc.nvme_dir, sizeof oc.nvme_dir, "/tmp");
  fails += MC_EXPECT(ot_open(&t, &mc, &tc, &oc, &be, g_order, err, sizeof err) == -ENOTSUP &&
                     strstr(err, "offload.params"), "params nvme, optimizer host: %s", err);
  zt_offload_cfg_defaults(&oc);
  oc.grads = ZT_PLACE_NVME;
  fails += MC_EXPECT(ot_open(&t, &mc, &tc, &oc, &be, g_order, err, sizeof err) == -ENOTSUP &&
                     strstr(err, "offload.grads"), "nvme grads: %s", err);
  zt_offload_cfg_defaults(&oc);
  oc.prefetch = 17;
  fails += MC_EXPECT(ot_open(&t, &mc, &tc, &oc, &be, g_order, err, sizeof err) == -EINVAL &&
                     strstr(err, "offload.prefetch"), "prefetch: %s", err);
  zt_offload_cfg_defaults(&oc);
  oc.gpu_budget = 4096;
  fails += MC_EXPECT(ot_open(&t, &mc, &tc, &oc, &be, g_order, err, sizeof err) == -ENOMEM &&
                     strstr(err, "offload.gpu_budget is 4 KiB; streaming needs at least "),
                     "tiny budget: %s", err);
  oc.params = ZT_PLACE_GPU;
  fails += MC_EXPECT(ot_open(&t, &mc, &tc, &oc, &be, g_order, err, sizeof err) == -ENOMEM &&
                     strstr(err, "offload.params gpu"), "resident in a tiny budget: %s", err);
  /* the host and NVMe split */
  zt_offload_cfg_defaults(&oc);
  oc.optimizer = ZT_PLACE_HOST;
  oc.host_units = 2;
  fails += MC_EXPECT(ot_open(&t, &mc, &tc, &oc, &be, g_order, err, sizeof err) == -EINVAL &&
                     strstr(err, "offload.host_units") && strstr(err, "optimizer nvme or auto"),
                     "host_units with optimizer host: %s", err);
  oc.optimizer = ZT_PLACE_NVME;
  oc.host_units = 7;
  snprintf(oc.nvme_dir, sizeof oc.nvme_dir, "/tmp");
  fails += MC_EXPECT(ot_open(&t, &mc, &tc, &oc, &be, g_order, err, sizeof err) == -EINVAL &&
                     strstr(err, "offload.host_units is 7; after 0 unit(s) on the device the "
                            "model has 6"), "host_units past the units: %s", err);
  zt_offload_cfg_defaults(&oc);
  oc.host_units = 2;
  fails += MC_EXPECT(ot_open(&t, &mc, &tc, &oc, &be, g_order, err, sizeof err) == -EINVAL &&
                     strstr(err, "offload.host_units 2 leaves 4 unit(s) for NVMe: "
                            "offload.nvme_dir is required"), "host_units without nvme: %s", err);
  zt_offload_cfg_defaults(&oc);
  oc.host_budget = 4096;
  fails += MC_EXPECT(ot_open(&t, &mc, &tc, &oc, &be, g_order, err, sizeof err) == -ENOMEM &&
                     strstr(err, "offload.host_budget is 4 KiB (4096 bytes)") &&
                     strstr(err, "offload.nvme_dir"), "tiny host budget: %s", err);
  zt_offload_cfg_defaults(&oc);
  oc.optimizer = ZT_PLACE_NVME;
  oc.nvme_budget = 4096;
  snprintf(oc.nvme_dir, sizeof oc.nvme_dir, "/tmp");
  fails += MC_EXPECT(ot_open(&t, &mc, &tc, &oc, &be, g_order, err, sizeof err) == -ENOSPC &&
                     strstr(err, "offload.nvme_budget is 4 KiB (4096 bytes)"),
                     "tiny nvme budget: %s", err);
  oc.host_units = -2;
  fails += MC_EXPECT(ot_open(&t, &mc, &tc, &oc, &be, g_order, err, sizeof err) == -EINVAL &&
                     strstr(err, "offload.host_units must be >= 0"), "host_units -2: %s", err);
  zt_offload_cfg_defaults(&oc);
  oc.params = oc.optimizer = ZT_PLACE_NVME;
  snprintf(oc.nvme_dir, sizeof oc.nvme_dir, "/tmp");
  for (zt_dtype dt = ZT_BF16; dt <= ZT_F16; dt++) {
    tc.precision = dt;
    fails += MC_EXPECT(ot_open(&t, &mc, &tc, &oc, &be, g_order, err, sizeof err) == -ENOTSUP &&
                       strstr(err, "offload.params: nvme") && strstr(err, zt_dtype_name(dt)),
                       "%s params nvme: %s", zt_dtype_name(dt), err);
  }
  fails += MC_EXPECT(t == NULL, "a refused open returned a trainer");
  return fails;
}

/* An inf in the head's parameters: every gradient is nan. The step fails with -ERANGE as
 * without offload and changes nothing, with the updates overlapped (no clipping) or not; in
 * fp16 it is skipped instead (0, the scale halved, the step counted, nothing updated). */
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
  for (int k = 0; k < 4; k++) {
    int clip = k & 1, fp16 = k >> 1;
    zt_train_cfg tc = train_cfg(clip ? 0.5f : 0.0f, 0);
    tc.precision = fp16 ? ZT_F16 : ZT_F32;
    zt_offload_cfg oc;
    zt_offload_cfg_defaults(&oc);
    zt_trainer *t = NULL;
    if (MC_EXPECT(ot_open(&t, &mc, &tc, &oc, &g_be, g_order, err, sizeof err) == 0, "%s", err)) {
      fails++;
      continue;
    }
    for (int i = 0; i < 2; i++) {
      zt_step_result r;
      err[0] = 0;
      int rc = zt_trainer_step(t, tok, &r, err, sizeof err);
      if (fp16)
        fails += MC_EXPECT(rc == 0 && r.skipped && r.step == i + 1 &&
                               r.loss_scale == ZT_LOSS_SCALE_INIT / (float)(2 << i),
                           "fp16 clip %d try %d: rc %d (%s), skipped %d, scale %g", clip, i, rc,
                           err, r.skipped, (double)r.loss_scale);
      else
        fails += MC_EXPECT(rc == -ERANGE && strstr(err, "left unchanged"), "clip %d try %d: rc "
                           "%d, %s", clip, i, rc, err);
    }
    zt_offload_stats os;
    zt_trainer_offload_stats(t, &os);
    zt_trainer_get_state(t, after, NULL, NULL);
    fails += MC_EXPECT(!memcmp(init, after, n * sizeof(float)) && os.adam_units == 0 &&
                       zt_trainer_step_count(t) == (fp16 ? 2 : 0) && t->adam_step == 0,
                       "%s clip %d: the state changed", zt_dtype_name(tc.precision), clip);
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
      /* the units of ztd's SIZE flags: GB is 10^9 */
      {"{\"gpu_budget\": \"2 GB\"}", 2000000000, NULL},
      {"{\"gpu_budget\": \"2 XB\"}", SIZE_MAX, "offload.gpu_budget"},
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
    int rc = zt_config_offload_from_json(j, &oc, err, sizeof err);
    json_decref(j);
    if (cases[i].budget == SIZE_MAX)
      fails += MC_EXPECT(rc < 0 && strstr(err, cases[i].err), "%s: rc %d, '%s'", cases[i].json,
                         rc, err);
    else
      fails += MC_EXPECT(rc == 0 && oc.gpu_budget == cases[i].budget, "%s: rc %d (%s), budget "
                         "%zu", cases[i].json, rc, err, oc.gpu_budget);
  }
  json_t *j = json_loads("{\"params\": \"host\", \"prefetch\": 3}", 0, NULL);
  zt_config_offload_from_json(j, &oc, err, sizeof err);
  json_decref(j);
  fails += MC_EXPECT(oc.params == ZT_PLACE_HOST && oc.prefetch == 3 &&
                     oc.optimizer == ZT_PLACE_AUTO && oc.host_units == -1 && !oc.host_budget &&
                     !oc.nvme_budget, "fields not applied");
  j = json_loads("{\"optimizer\": \"nvme\", \"nvme_dir\": \"/tmp\", \"host_units\": 5, "
                 "\"host_budget\": \"110 GiB\", \"nvme_budget\": 55000000000}", 0, NULL);
  int rc = zt_config_offload_from_json(j, &oc, err, sizeof err);
  json_decref(j);
  fails += MC_EXPECT(rc == 0 && oc.host_units == 5 && oc.host_budget == (size_t)110 << 30 &&
                     oc.nvme_budget == 55000000000ull, "split fields: rc %d (%s)", rc, err);
  static const struct {
    const char *json, *err;
  } bad[] = {
      {"{\"host_units\": -1}", "offload.host_units must be an integer >= 0"},
      {"{\"host_units\": 2, \"optimizer\": \"host\"}", "offload.host_units splits"},
      {"{\"host_budget\": \"lots\"}", "offload.host_budget must be a byte count"},
      {"{\"nvme_budget\": -5}", "offload.nvme_budget must be a byte count"},
      {"{\"order\": \"units\"}", "offload.order must be \"micro\", \"unit\" or \"auto\""},
      {"{\"order\": 2}", "offload.order must be"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    j = json_loads(bad[i].json, 0, NULL);
    err[0] = 0;
    rc = zt_config_offload_from_json(j, &oc, err, sizeof err);
    json_decref(j);
    fails += MC_EXPECT(rc == -EINVAL && strstr(err, bad[i].err), "%s: rc %d, '%s'", bad[i].json,
                       rc, err);
  }
  j = json_loads("{\"order\": \"unit\"}", 0, NULL);
  rc = zt_config_offload_from_json(j, &oc, err, sizeof err);
  json_decref(j);
  j = zt_config_offload_to_json(&oc);
  fails += MC_EXPECT(rc == 0 && oc.order == ZT_ORDER_UNIT &&
                         !strcmp(json_string_value(json_object_get(j, "order")), "unit"),
                     "order unit: rc %d (%s), not kept", rc, err);
  json_decref(j);
  return fails;
}

/* offload.order: auto under a budget is the cheaper of micro and unit by the cost model, which
 * charges unit-major the activations of every micro-batch and spares it the refetches; unit
 * asked with more micro-batches than a step walks at once is refused naming the field. */
static int check_order(zt_arch arch) {
  int fails = 0;
  char err[512];
  g_wide = 1; /* units large beside the activations, as in the models that stream */
  zt_model_cfg mc = model_cfg(arch);
  g_wide = 0;
  if (arch == ZT_ARCH_LLAMA) mc.tie_embeddings = 0; /* as Llama 3 8B */
  zt_train_cfg tc = train_cfg(0, 0);
  zt_offload_cfg oc;
  zt_offload_cfg_defaults(&oc);
  oc.params = oc.optimizer = ZT_PLACE_HOST;
  oc.order = ZT_ORDER_MICRO;
  /* micro-major's smallest budget, with room for unit-major's activations beside the same
   * arena: both stream */
  oc.gpu_budget = ot_min_budget(&mc, &tc, oc, &g_be, g_order);
  zt_offload_plan micro, unit, any;
  int rc = zt_offload_estimate(&mc, &tc, &oc, g_be.ops, &micro, err, sizeof err);
  oc.gpu_budget += (size_t)(tc.grad_accum - 1) * micro.act_bytes;
  if (rc == 0) rc = zt_offload_estimate(&mc, &tc, &oc, g_be.ops, &micro, err, sizeof err);
  oc.order = ZT_ORDER_UNIT;
  if (rc == 0) rc = zt_offload_estimate(&mc, &tc, &oc, g_be.ops, &unit, err, sizeof err);
  oc.order = ZT_ORDER_AUTO;
  if (rc == 0) rc = zt_offload_estimate(&mc, &tc, &oc, g_be.ops, &any, err, sizeof err);
  if (MC_EXPECT(rc == 0, "%s order: %s", zt_arch_name(arch), err)) return 1;
  /* untied, the streamed units are fetched twice a step instead of twice a micro-batch */
  int cheaper = unit.est.step_s < micro.est.step_s * (1 - ZT_PLAN_TIE), tied = arch == ZT_ARCH_GPT;
  fails += MC_EXPECT(!micro.unit_major && unit.unit_major &&
                         unit.act_bytes == (size_t)tc.grad_accum * micro.act_bytes &&
                         (tied || (unit.h2d_bytes < micro.h2d_bytes && cheaper)) &&
                         any.unit_major == cheaper &&
                         any.est.step_s == (cheaper ? unit : micro).est.step_s,
                     "%s order: micro %g s, unit %g s (activations %zu, %zu; H2D %llu, %llu), "
                     "auto chose %s", zt_arch_name(arch), micro.est.step_s, unit.est.step_s,
                     micro.act_bytes, unit.act_bytes, (unsigned long long)micro.h2d_bytes,
                     (unsigned long long)unit.h2d_bytes, any.unit_major ? "unit" : "micro");
  /* every unit resident beside one micro-batch's activations: fetched once a step either way;
   * there is no room for unit-major's activations, so auto is micro */
  oc.order = ZT_ORDER_MICRO;
  oc.params = ZT_PLACE_GPU;
  oc.gpu_budget = 0;
  rc = zt_offload_estimate(&mc, &tc, &oc, g_be.ops, &micro, err, sizeof err);
  oc.order = ZT_ORDER_AUTO;
  oc.params = ZT_PLACE_GPU;
  oc.gpu_budget = micro.device_bytes;
  fails += MC_EXPECT(rc == 0 && zt_offload_estimate(&mc, &tc, &oc, g_be.ops, &any, err,
                                                    sizeof err) == 0 && !any.unit_major,
                     "%s order auto at %zu bytes (all resident): %s, unit-major %d",
                     zt_arch_name(arch), oc.gpu_budget, err, any.unit_major);
  oc.params = ZT_PLACE_AUTO;
  oc.order = ZT_ORDER_UNIT;
  tc.grad_accum = ZT_UNIT_MAJOR_MICROS_MAX + 1;
  err[0] = 0;
  fails += MC_EXPECT(zt_offload_estimate(&mc, &tc, &oc, g_be.ops, &unit, err, sizeof err) ==
                         -EINVAL && strstr(err, "offload.order") && strstr(err, "grad_accum"),
                     "order unit, %d micro-batches: '%s'", tc.grad_accum, err);
  return fails;
}

/* The host tier, or with "nvme" the NVMe placements (skipped where io_uring is forbidden). */
int main(int argc, char **argv) {
  int nvme = 0, fails = 0;
  for (int i = 1; i < argc; i++) {
    nvme |= !strcmp(argv[i], "nvme");
    if (!strcmp(argv[i], "unit")) g_order = ZT_ORDER_UNIT;
  }
  g_be = mc_backend();
  const char *tmp = mc_tmpdir();
  zt_arch archs[] = {ZT_ARCH_GPT, ZT_ARCH_ENCODER, ZT_ARCH_LLAMA};
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
  } else if (!g_order) {
    fails += check_refusals() + check_json() + check_nonfinite(tmp);
  }
  for (int i = 0; i < 3; i++) {
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
      zt_offload_cfg all_nvme = oc;
      fails += check_resume(archs[i], oc, oc, 0.5f, "optimizer nvme", tmp);
      if (i == 0) fails += check_ckpt_read_fault(oc, tmp);
      /* the host and NVMe together: the two units after the device ones on the host, the
       * rest on NVMe */
      oc.host_units = 2;
      fails += check_case(archs[i], "2 host units, rest nvme, streamed, clipped",
                          train_cfg(0.5f, 0), oc, 1);
      fails += check_case(archs[i], "bf16, 2 host units, rest nvme, streamed", bf, oc, 1);
      oc.params = ZT_PLACE_NVME;
      fails += check_case(archs[i], "params nvme past 2 host units, streamed", train_cfg(0, 1),
                          oc, 1);
      oc.params = ZT_PLACE_HOST;
      /* one micro-batch a step: the gradient ring, of the least slots so that the walk reuses
       * them */
      g_ga = 1;
      oc.grad_slots = 4;
      fails += check_case(archs[i], "ring, 2 host units, rest nvme, streamed", train_cfg(0, 0),
                          oc, 1);
      bf.grad_accum = 1;
      fails += check_case(archs[i], "bf16, ring, 2 host units, rest nvme, streamed", bf, oc, 1);
      oc.gpu_units = 1;
      fails += check_case(archs[i], "ring, 1 device unit, 2 host units, rest nvme",
                          train_cfg(0, 0), oc, 0);
      oc.gpu_units = -1;
      /* checkpoints across the placements */
      fails += check_resume(archs[i], oc, all_nvme, 0, "ring, 2 host units into nvme", tmp);
      zt_offload_cfg all_host;
      zt_offload_cfg_defaults(&all_host);
      fails += check_resume(archs[i], all_host, oc, 0, "ring, host into 2 host units", tmp);
      if (!g_order) fails += check_auto_split(archs[i], oc, train_cfg(0, 0), "ring");
      oc.grad_slots = 0;
      g_ga = 2;
      fails += check_case(archs[i], "2 micro-batches, 2 host units, rest nvme, streamed",
                          train_cfg(0, 0), oc, 1);
      oc.grads = ZT_PLACE_GPU;
      fails += check_case(archs[i], "grads gpu, 2 host units, rest nvme, streamed, clipped",
                          train_cfg(0.5f, 0), oc, 1);
      oc.params = ZT_PLACE_NVME;
      fails += check_case(archs[i], "grads gpu, params nvme past 2 host units, ring",
                          train_cfg(0, 1), oc, 1);
      oc.params = ZT_PLACE_HOST;
      oc.grads = ZT_PLACE_AUTO;
      g_ga = GA;
      fails += check_resume(archs[i], oc, all_host, 0.5f, "2 host units into host", tmp);
      bf = train_cfg(0.5f, 0);
      bf.precision = ZT_BF16;
      if (!g_order) fails += check_auto_split(archs[i], oc, bf, "bf16, clipped");
      /* fp16: optimizer nvme, the split, device units beside NVMe ones (their own buffers, the
       * overflow check in two parts), a resume across placements */
      g_dt = ZT_F16;
      fails += check_case(archs[i], "fp16, 2 host units, rest nvme, streamed", train_cfg(0, 0),
                          oc, 1);
      oc.host_units = -1;
      fails += check_case(archs[i], "fp16, optimizer nvme, streamed, clipped",
                          train_cfg(0.5f, 0), oc, 1);
      oc.gpu_units = 2;
      fails += check_case(archs[i], "fp16, optimizer nvme, 2 device units", train_cfg(0, 0), oc,
                          0);
      oc.gpu_units = -1;
      fails += check_resume(archs[i], oc, all_host, 0, "fp16, nvme into host", tmp);
      g_dt = ZT_F32;
      continue;
    }
    oc.prefetch = 1;
    fails += check_case(archs[i], "resident, overlapped", train_cfg(0, 0), oc, 0);
    fails += check_case(archs[i], "resident, clipped", train_cfg(0.5f, 0), oc, 0);
    fails += check_case(archs[i], "streamed, clip that never clips", train_cfg(NOCLIP, 0), oc, 1);
    oc.prefetch = 0;
    fails += check_case(archs[i], "streamed, clipped, no prefetch", train_cfg(0.5f, 0), oc, 1);
    oc.prefetch = 2;
    fails += check_case(archs[i], "streamed, overlapped, checkpointed", train_cfg(0, 1), oc, 1);
    oc.prefetch = 1;
    fails += check_resume(archs[i], oc, oc, 0.5f, "host", tmp);
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
    /* one micro-batch a step without clipping: the planner's count of slots (here the flat
     * buffer, above); each unit's gradients in a slot of a ring of four from their write-back
     * to their AdamW (six units: the walk reuses them), resident or streamed, beside device
     * units (their own buffers then), resumed; two micro-batches keep the flat buffer */
    g_ga = 1;
    fails += check_case(archs[i], "one micro-batch, the planner's slots, streamed",
                        train_cfg(0, 0), oc, 1);
    oc.grad_slots = 4;
    fails += check_case(archs[i], "ring, resident", train_cfg(0, 0), oc, 0);
    oc.prefetch = 0;
    fails += check_case(archs[i], "ring, streamed, checkpointed", train_cfg(0, 1), oc, 1);
    oc.prefetch = 1;
    bf = train_cfg(0, 0);
    bf.precision = ZT_BF16;
    fails += check_case(archs[i], "bf16, ring, streamed", bf, oc, 1);
    oc.gpu_units = 2;
    fails += check_case(archs[i], "ring, 2 device units", train_cfg(0, 0), oc, 0);
    fails += check_case(archs[i], "bf16, ring, 2 device units", bf, oc, 0);
    oc.gpu_units = -1;
    fails += check_resume(archs[i], oc, oc, 0, "ring", tmp);
    /* several micro-batches with the sums on the device: the ring too */
    oc.grads = ZT_PLACE_GPU;
    g_ga = GA;
    fails += check_case(archs[i], "grads gpu, ring, streamed", train_cfg(0, 0), oc, 1);
    bf = train_cfg(0, 0);
    bf.precision = ZT_BF16;
    oc.gpu_units = 2;
    fails += check_case(archs[i], "bf16, grads gpu, ring, 2 device units", bf, oc, 0);
    oc.gpu_units = -1;
    oc.grads = ZT_PLACE_AUTO;
    oc.grad_slots = 0;
    g_ga = 2;
    fails += check_case(archs[i], "2 micro-batches, overlapped, streamed", train_cfg(0, 0), oc,
                        1);
    g_ga = GA;
    /* the step's gradient sums on the host (each later micro-batch resumes from them) and on
     * the device, both ways of updating */
    oc.grads = ZT_PLACE_HOST;
    fails += check_case(archs[i], "grads host, streamed, overlapped", train_cfg(0, 0), oc, 1);
    fails += check_case(archs[i], "grads host, resident, clipped", train_cfg(0.5f, 0), oc, 0);
    oc.grads = ZT_PLACE_GPU;
    fails += check_case(archs[i], "grads gpu, streamed, clipped, checkpointed",
                        train_cfg(0.5f, 1), oc, 1);
    bf = train_cfg(0, 0);
    bf.precision = ZT_BF16;
    oc.gpu_units = 2;
    fails += check_case(archs[i], "bf16, grads gpu, 2 device units, streamed, overlapped", bf,
                        oc, 1);
    oc.gpu_units = -1;
    fails += check_resume(archs[i], oc, oc, 0, "grads gpu", tmp);
    oc.grads = ZT_PLACE_AUTO;
    /* the planner's auto choices are the micro-major run's */
    if (!g_order)
      fails += check_auto_units(archs[i]) + check_auto_ckpt(archs[i]) + check_order(archs[i]);
    /* fp16: the placements bf16 runs in; the updates always after the backward */
    g_dt = ZT_F16;
    fails += check_case(archs[i], "fp16, resident", train_cfg(0, 0), oc, 0);
    fails += check_case(archs[i], "fp16, streamed, clip that never clips", train_cfg(NOCLIP, 0),
                        oc, 1);
    fails += check_case(archs[i], "fp16, streamed, clipped, checkpointed", train_cfg(0.5f, 1),
                        oc, 1);
    oc.gpu_units = 2;
    oc.prefetch = 0; /* the four streamed units' smallest arena must then evict */
    fails += check_case(archs[i], "fp16, 2 device units, streamed", train_cfg(0, 0), oc, 1);
    oc.prefetch = 1;
    fails += check_case(archs[i], "fp16, 2 device units, resident, clipped", train_cfg(0.5f, 0),
                        oc, 0);
    oc.gpu_units = -1;
    g_ga = 1; /* no ring in fp16: the flat gradients */
    fails += check_case(archs[i], "fp16, one micro-batch, streamed", train_cfg(0, 0), oc, 1);
    g_ga = GA;
    oc.grads = ZT_PLACE_GPU;
    fails += check_case(archs[i], "fp16, grads gpu, streamed", train_cfg(0, 0), oc, 1);
    oc.grads = ZT_PLACE_HOST;
    fails += check_case(archs[i], "fp16, grads host, streamed", train_cfg(0, 0), oc, 1);
    oc.grads = ZT_PLACE_AUTO;
    fails += check_resume(archs[i], oc, oc, 0, "fp16, host", tmp);
    g_dt = ZT_F32;
  }
  mc_rmtree(tmp);
  zt_backend_cpu_close(&g_be);
  if (fails) fprintf(stderr, "%d failure(s)\n", fails);
  return fails ? 1 : 0;
}
