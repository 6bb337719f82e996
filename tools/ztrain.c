/* ztrain: trains one model straight through the trainer, no daemon, for PyTorch parity runs and
 * benchmarks. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/train/cfg_json.h"
#include "engine/train/trainer.h"

static const char usage[] =
    "usage: ztrain --spec SPEC.json --batches FILE [--backend cpu] [--threads N]\n"
    "              [--init X.safetensors] [--save DIR] [--json]\n"
    "\n"
    "SPEC.json holds a \"model\" and a \"train\" object (other top-level keys are ignored):\n"
    "  model: arch (\"gpt\" | \"encoder\"), vocab, seq_len, d_model, n_heads, n_layers,\n"
    "         d_ff (0 = arch default: gpt 4*d_model, encoder 2048), init_seed, init_path\n"
    "  train: steps, micro_batch, grad_accum, lr, beta1, beta2, eps, weight_decay,\n"
    "         schedule (\"constant\" | \"cosine\"), warmup_steps, min_lr, grad_clip (0 = off), seed\n"
    "FILE: raw little-endian int32 tokens, steps * grad_accum micro-batches of\n"
    "  micro_batch rows of seq_len + 1 tokens (inputs x[0:T], targets x[1:T+1]; -1 = padding).\n"
    "--init overrides model.init_path (safetensors, HF GPT-2 / PyTorch names).\n"
    "--save DIR writes a checkpoint after the last step.\n"
    "Prints one line per step, or with --json one object {\"losses\": [...], ...} on stdout.\n";

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

int main(int argc, char **argv) {
  const char *spec = NULL, *batches = NULL, *backend = "cpu", *init = NULL, *save = NULL;
  int json = 0, threads = 0, rc = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--json")) json = 1;
    else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(usage, stdout);
      return 0;
    } else if (v && !strcmp(a, "--spec")) spec = v, i++;
    else if (v && !strcmp(a, "--batches")) batches = v, i++;
    else if (v && !strcmp(a, "--backend")) backend = v, i++;
    else if (v && !strcmp(a, "--init")) init = v, i++;
    else if (v && !strcmp(a, "--save")) save = v, i++;
    else if (v && !strcmp(a, "--threads")) threads = atoi(v), i++;
    else {
      fprintf(stderr, "ztrain: unknown or incomplete argument %s\n%s", a, usage);
      return 2;
    }
  }
  if (!spec || !batches) {
    fputs(usage, stderr);
    return 2;
  }
  if (strcmp(backend, "cpu")) {
    fprintf(stderr, "ztrain: backend %s is not available in this build (cpu is)\n", backend);
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
  if ((rc = zt_spec_load(spec, &mc, &tc, err, sizeof err)) < 0) goto fail;
  if (init) {
    if (strlen(init) >= sizeof mc.init_path) {
      snprintf(err, sizeof err, "--init path too long");
      rc = -EINVAL;
      goto fail;
    }
    strcpy(mc.init_path, init);
  }
  if ((rc = read_file(batches, &tok, &n_tok, err, sizeof err)) < 0) goto fail;
  if ((rc = zt_backend_cpu_open(&be, threads)) < 0) {
    snprintf(err, sizeof err, "cannot open the cpu backend (%d)", rc);
    goto fail;
  }
  if ((rc = zt_trainer_open(&t, &mc, &tc, &be, err, sizeof err)) < 0) goto fail;
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
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int s = 0; s < tc.steps; s++) {
    zt_step_result r;
    if ((rc = zt_trainer_step(t, tok + per_step * (size_t)s, &r, err, sizeof err)) < 0) goto fail;
    losses[s] = r.loss;
    if (!json)
      printf("step %d/%d loss %.6f lr %.3e grad_norm %.4f\n", r.step, tc.steps, r.loss,
             (double)r.lr, r.grad_norm);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  if (save && (rc = zt_trainer_save(t, save, err, sizeof err)) < 0) goto fail;
  if (json) {
    printf("{\"arch\": \"%s\", \"params\": %zu, \"seconds\": %.3f, \"tokens_per_s\": %.1f, "
           "\"losses\": [", zt_arch_name(mc.arch), zt_model_num_params(zt_trainer_model(t)), secs,
           (double)per_step / (double)(mc.seq_len + 1) * mc.seq_len * tc.steps / secs);
    for (int s = 0; s < tc.steps; s++) printf("%s%.9g", s ? ", " : "", losses[s]);
    printf("]}\n");
  } else {
    printf("%d steps in %.3f s\n", tc.steps, secs);
  }
  goto out;
fail:
  fprintf(stderr, "ztrain: %s\n", err);
out:
  zt_trainer_close(t);
  if (be.ops) zt_backend_cpu_close(&be);
  free(tok);
  free(losses);
  return rc < 0 ? 1 : 0;
}
