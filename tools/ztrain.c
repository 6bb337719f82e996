/* ztrain: trains one model straight through the trainer, no daemon, on the cpu or the cuda
 * backend, for PyTorch parity runs and benchmarks. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "engine/job/spec.h"
#include "engine/plan/rates.h"
#include "engine/train/trainer.h"
#include "engine/kernels/backend.h"

static const char usage[] =
    "usage: ztrain --spec SPEC.json --batches FILE [--backend cpu|cuda] [--threads N]\n"
    "              [--device N] [--ckpt-every K] [--init X.safetensors] [--save DIR] [--json]\n"
    "              [--offload] [--rates h200|RATES.json]\n"
    "\n"
    "SPEC.json is a ztd job spec (docs/spec.md): its \"model\", \"train\" and \"offload\"\n"
    "objects; \"data\" is ignored (the tokens come from FILE) and \"parallel\" must be one GPU.\n"
    "FILE: raw little-endian int32 tokens, steps * grad_accum micro-batches of\n"
    "  micro_batch rows of seq_len + 1 tokens (inputs x[0:T], targets x[1:T+1]; -1 = padding).\n"
    "--backend cuda runs on GPU --device N (default 0) when the build has CUDA;\n"
    "  --threads N sets the cpu backend's threads (0 = all).\n"
    "--ckpt-every K overrides train.activation_checkpointing.every.\n"
    "--init overrides model.init (safetensors, HF GPT-2 / PyTorch names).\n"
    "--save DIR writes a checkpoint after the last step.\n"
    "--rates: the cost model's rates the offload plan is ranked and estimated by (a built-in\n"
    "  set or a rates file, docs/offload.md \"Rates\"; default: the built-in default).\n"
    "An \"offload\" object in SPEC.json (params, grads, optimizer: \"gpu\" | \"host\" | \"nvme\" |\n"
    "  \"auto\"; gpu_budget: bytes or \"512MiB\"; prefetch; gpu_units; nvme_dir; docs/spec.md)\n"
    "  runs the offloaded step (cpu or cuda backend, fp32 or bf16); --offload runs it with the\n"
    "  defaults when the spec has none. The JSON output then has an \"offload\" object with the\n"
    "  tiers' bytes and the timeline (seconds each resource was busy over all steps, and\n"
    "  wait_*: seconds the trainer's thread waited on copies, the CPU AdamW, NVMe).\n"
    "Prints one line per step, or with --json one object {\"losses\": [...], ...} on stdout;\n"
    "  step_ms and tokens_per_s are means over the steps after the first (the warm-up);\n"
    "  open_s is the trainer's open (its buffers and the init: the time to the first step),\n"
    "  first_step_s the first step's own time.\n";

/* A whole decimal int in [lo, hi], or -EINVAL. */
static int parse_int(const char *s, int lo, int hi, int *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return -EINVAL;
  *out = (int)v;
  return 0;
}

static double seconds_between(const struct timespec *a, const struct timespec *b) {
  return (double)(b->tv_sec - a->tv_sec) + 1e-9 * (double)(b->tv_nsec - a->tv_nsec);
}

static int read_file(const char *path, int32_t **out, size_t *n_tok, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  int rc = 0;
  *out = NULL;
  if (!f || fseek(f, 0, SEEK_END) < 0) {
    rc = -errno;
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    goto out;
  }
  long len = ftell(f);
  rewind(f);
  if (len < 0 || len % 4) {
    rc = -EINVAL;
    snprintf(err, errlen, "%s: %ld bytes is not a whole number of int32 tokens", path, len);
    goto out;
  }
  *out = malloc((size_t)len + 4);
  if (!*out || fread(*out, 1, (size_t)len, f) != (size_t)len) {
    rc = *out ? -EIO : -ENOMEM;
    snprintf(err, errlen, "%s: cannot read %ld bytes", path, len);
    goto out;
  }
  *n_tok = (size_t)len / 4;
out:
  if (f) fclose(f);
  if (rc < 0) {
    free(*out);
    *out = NULL;
  }
  return rc;
}

/* SPEC.json: a ztd job spec of one rank. */
static int load_spec(const char *path, zt_model_cfg *mc, zt_train_cfg *tc, zt_offload_cfg *oc,
                     int *has_offload, char *err, size_t errlen) {
  zt_job_spec s;
  int rc = zt_job_spec_load(path, &s, err, errlen);
  if (rc < 0) return rc;
  if (s.gpus != 1) {
    snprintf(err, errlen, "%s: parallel.gpus %d: ztrain runs one rank (submit it to ztd)", path,
             s.gpus);
    return -ENOTSUP;
  }
  if (s.train.micro_batch == ZT_BATCH_AUTO || s.train.grad_accum == ZT_BATCH_AUTO) {
    snprintf(err, errlen, "%s: train.batch_tokens without train.micro_batch and "
             "train.grad_accum: ztd's planner splits it (ztctl plan prints its split); ztrain "
             "runs the split given", path);
    return -ENOTSUP;
  }
  if (!s.train.steps) {
    snprintf(err, errlen, "%s: train.epochs without train.steps: ztd makes them steps from "
             "data.path's token file at admission (ztctl plan prints them); ztrain runs the "
             "train.steps given", path);
    return -ENOTSUP;
  }
  *mc = s.model;
  *tc = s.train;
  *oc = s.offload;
  *has_offload = s.has_offload;
  return 0;
}

int main(int argc, char **argv) {
  const char *spec = NULL, *batches = NULL, *backend = "cpu", *init = NULL, *save = NULL;
  const char *rates = NULL;
  int json = 0, offload = 0, threads = 0, device = -1, ckpt_every = -1, rc = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int bad = 0, took = 0;  /* took: the option consumed v */
    if (!strcmp(a, "--json")) json = 1;
    else if (!strcmp(a, "--offload")) offload = 1;
    else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(usage, stdout);
      return 0;
    } else if (v && !strcmp(a, "--spec")) spec = v, took = 1;
    else if (v && !strcmp(a, "--batches")) batches = v, took = 1;
    else if (v && !strcmp(a, "--backend")) backend = v, took = 1;
    else if (v && !strcmp(a, "--init")) init = v, took = 1;
    else if (v && !strcmp(a, "--save")) save = v, took = 1;
    else if (v && !strcmp(a, "--rates")) rates = v, took = 1;
    else if (v && !strcmp(a, "--threads")) bad = parse_int(v, 0, 4096, &threads), took = 1;
    else if (v && !strcmp(a, "--device")) bad = parse_int(v, 0, 1023, &device), took = 1;
    else if (v && !strcmp(a, "--ckpt-every")) bad = parse_int(v, 0, 1 << 20, &ckpt_every), took = 1;
    else bad = 1;
    if (bad) {
      fprintf(stderr, "ztrain: unknown, incomplete or out-of-range argument: %s%s%s\n%s", a,
              took ? " " : "", took ? v : "", usage);
      return 2;
    }
    i += took;
  }
  if (!spec || !batches) {
    fputs(usage, stderr);
    return 2;
  }
  if (device >= 0 && strcmp(backend, "cuda")) {
    fprintf(stderr, "ztrain: --device applies to --backend cuda only\n");
    return 2;
  }
  char err[512];
  zt_model_cfg mc;
  zt_train_cfg tc;
  zt_backend be = {0};
  zt_trainer *t = NULL;
  int32_t *tok = NULL;
  size_t n_tok = 0;
  double *losses = NULL;
  zt_offload_cfg oc;
  int has_offload = 0;
  zt_offload_cfg_defaults(&oc);
  if ((rc = load_spec(spec, &mc, &tc, &oc, &has_offload, err, sizeof err)) < 0) goto fail;
  /* the cost model's rates, as ztd takes them from its state dir (docs/offload.md "Rates") */
  if (rates) {
    zt_plan_rates r;
    if ((rc = zt_plan_rates_named(rates, &r, err, sizeof err)) == -ENOENT &&
        (rc = zt_plan_rates_load(rates, &r, err, sizeof err)) == -ENOENT)
      snprintf(err, sizeof err, "--rates %s: no such file or built-in set", rates);
    if (rc < 0) goto fail;
    zt_plan_rates_use(&r);
  }
  offload |= has_offload;
  if (ckpt_every >= 0) tc.ckpt_every = ckpt_every;
  if (init) {
    if (strlen(init) >= sizeof mc.init_path) {
      snprintf(err, sizeof err, "--init path too long");
      rc = -EINVAL;
      goto fail;
    }
    strcpy(mc.init_path, init);
  }
  if ((rc = read_file(batches, &tok, &n_tok, err, sizeof err)) < 0) goto fail;
  if ((rc = zt_backend_open(&be, backend, device < 0 ? 0 : device, threads, err, sizeof err)) < 0)
    goto fail;
  struct timespec o0, o1;
  clock_gettime(CLOCK_MONOTONIC, &o0);
  zt_offload_placement plan;
  if (!offload)
    rc = zt_trainer_open(&t, &mc, &tc, &be, err, sizeof err);
  else if ((rc = zt_offload_plan_make(&mc, &tc, &oc, be.ops, &plan, err, sizeof err)) == 0)
    rc = zt_trainer_open_offload(&t, &mc, &tc, &oc, &plan, &be, err, sizeof err);
  if (rc < 0) goto fail;
  clock_gettime(CLOCK_MONOTONIC, &o1);
  double open_s = seconds_between(&o0, &o1), first_step_s = 0;
  size_t per_step = zt_trainer_micro_tokens(t) * (size_t)tc.grad_accum;
  if (n_tok < per_step * (size_t)tc.steps) {
    snprintf(err, sizeof err, "%s holds %zu tokens; %d steps need %zu", batches, n_tok, tc.steps,
             per_step * (size_t)tc.steps);
    rc = -EINVAL;
    goto fail;
  }
  losses = calloc((size_t)tc.steps, sizeof *losses);
  if (!losses) {
    rc = -ENOMEM;
    snprintf(err, sizeof err, "out of memory");
    goto fail;
  }
  /* zt_trainer_step ends with the backend's sync, so a step's wall time is its compute time. The
   * first step pays one-time costs (cuBLAS heuristics, page faults on fresh buffers): the means
   * leave it out when there are others. */
  struct timespec t0, ts, te;
  double secs = 0, timed = 0;
  int64_t step_tokens = 0;
  int skipped = 0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int s = 0; s < tc.steps; s++) {
    zt_step_result r;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    if ((rc = zt_trainer_step(t, tok + per_step * (size_t)s, &r, err, sizeof err)) < 0) goto fail;
    clock_gettime(CLOCK_MONOTONIC, &te);
    if (s > 0 || tc.steps == 1) timed += seconds_between(&ts, &te);
    if (s == 0) first_step_s = seconds_between(&ts, &te);
    step_tokens = r.tokens;
    losses[s] = r.loss;
    skipped += r.skipped;
    if (!json)
      printf("step %d/%d loss %.6f lr %.3e grad_norm %.4f%s\n", r.step, tc.steps, r.loss,
             (double)r.lr, r.grad_norm, r.skipped ? " (skipped: fp16 overflow)" : "");
  }
  secs = seconds_between(&t0, &te);
  int n_timed = tc.steps > 1 ? tc.steps - 1 : 1;
  double step_ms = 1e3 * timed / n_timed, tok_s = (double)step_tokens * n_timed / timed;
  if (save && (rc = zt_trainer_save(t, save, err, sizeof err)) < 0) goto fail;
  if (json) {
    printf("{\"arch\": \"%s\", \"backend\": \"%s\", \"params\": %zu, \"ckpt_every\": %d, "
           "\"precision\": \"%s\", \"tf32\": %s, \"skipped_steps\": %d, "
           "\"backend_bytes\": %zu, \"open_s\": %.3f, \"first_step_s\": %.3f, "
           "\"seconds\": %.3f, \"step_ms\": %.3f, "
           "\"tokens_per_s\": %.1f, \"losses\": [", zt_arch_name(mc.arch), be.ops->name,
           zt_model_num_params(zt_trainer_model(t)), tc.ckpt_every, zt_dtype_name(tc.precision),
           tc.tf32 ? "true" : "false", skipped, zt_trainer_backend_bytes(t), open_s,
           first_step_s, secs, step_ms, tok_s);
    for (int s = 0; s < tc.steps; s++) printf("%s%.9g", s ? ", " : "", losses[s]);
    printf("]");
    zt_offload_stats os;
    if (offload && zt_trainer_offload_stats(t, &os) == 0)
      printf(", \"offload\": {\"device_budget\": %zu, \"act_bytes\": %zu, \"arena_budget\": %zu, "
             "\"arena_peak\": %zu, \"host_bytes\": %zu, \"params\": \"%s\", \"grads\": \"%s\", "
             "\"dsum_bytes\": %zu, \"ckpt_every\": %d, \"order\": \"%s\", "
             "\"adam_landed\": %llu, \"est_step_s\": %.4f, \"est\": {\"compute\": %.4f, "
             "\"h2d\": %.4f, \"d2h\": %.4f, \"adam\": %.4f, \"nvme\": %.4f, \"runner\": %.4f}, "
             "\"gpu_units\": %d, "
             "\"gpu_unit_bytes\": %zu, \"fetches\": %llu, \"evictions\": %llu, "
             "\"bytes_h2d\": %llu, \"bytes_d2h\": %llu, "
             "\"nvme_bytes_read\": %llu, \"nvme_bytes_written\": %llu, "
             "\"timeline\": {\"step\": %.4f, \"compute\": %.4f, \"h2d\": %.4f, \"d2h\": %.4f, "
             "\"adam\": %.4f, \"adam_threads\": %d, \"nvme\": %.4f, \"wait_copy\": %.4f, "
             "\"wait_adam\": %.4f, \"wait_nvme\": %.4f}}",
             os.device_budget, os.act_bytes, os.arena_budget, os.arena_peak, os.host_bytes,
             zt_offload_place_name(os.params), zt_offload_place_name(os.grads), os.dsum_bytes,
             os.ckpt_every, os.unit_major ? "unit" : "micro",
             (unsigned long long)os.adam_landed, os.est.step_s, os.est.compute_s, os.est.h2d_s,
             os.est.d2h_s, os.est.adam_s, os.est.nvme_s, os.est.runner_s, os.gpu_units,
             os.gpu_unit_bytes,
             (unsigned long long)os.fetches,
             (unsigned long long)os.evictions, (unsigned long long)os.bytes_h2d,
             (unsigned long long)os.bytes_d2h, (unsigned long long)os.nvme_bytes_read,
             (unsigned long long)os.nvme_bytes_written, os.step_ns / 1e9, os.compute_ns / 1e9,
             os.h2d_ns / 1e9, os.d2h_ns / 1e9, os.adam_ns / 1e9, os.adam_threads,
             os.nvme_ns / 1e9, os.wait_copy_ns / 1e9, os.wait_adam_ns / 1e9,
             os.wait_nvme_ns / 1e9);
    printf("}\n");
  } else {
    printf("opened in %.3f s, first step %.3f s; %d steps in %.3f s on %s; after the first: "
           "%.3f ms/step, %.1f tokens/s\n", open_s, first_step_s, tc.steps, secs, be.ops->name,
           step_ms, tok_s);
  }
  goto out;
fail:
  fprintf(stderr, "ztrain: %s\n", err);
out:
  zt_trainer_close(t);
  zt_backend_close(&be);
  free(tok);
  free(losses);
  return rc < 0 ? 1 : 0;
}
