/* PyTorch parity on stored data (tools/parity/pytorch_parity.py wrote it): for each arch, zt
 * trains from the same init.safetensors on the same batches.bin with the recipe of spec.json,
 * and its per-step losses must match PyTorch's losses.json within 1e-4 relative. The same for
 * the Llama family against transformers itself (tools/parity/hf_parity.py wrote hf/<variant>/:
 * a spec whose "hf" is the directory save_pretrained wrote there, relative to the variant).
 * Arguments: the data directory, then the backend (cpu, the default, or cuda: the gpu suite
 * builds this file again with ZT_HAVE_CUDA). Skips (77) while the data directory is absent, and
 * on cuda when there is no device. */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/train/config.h"
#include "tests/unit/model/mcheck.h"
#ifdef ZT_HAVE_CUDA
#include "engine/kernels/cuda/cuda_backend.h"
#endif

#define TOLERANCE 1e-4

/* arch: a directory of root; hf: its spec's model.hf is relative to it (else the init is its
 * init.safetensors). */
static int run_arch(const zt_backend *be, const char *root, const char *arch, int hf,
                    double *worst) {
  char p[1024], err[512];
  zt_model_cfg mc;
  zt_train_cfg tc;
  snprintf(p, sizeof p, "%s/%s/spec.json", root, arch);
  json_error_t je;
  json_t *spec = json_load_file(p, JSON_REJECT_DUPLICATES, &je);
  json_t *model = json_object_get(spec, "model");
  if (hf && json_is_string(json_object_get(model, "hf"))) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s/%s", root, arch,
             json_string_value(json_object_get(model, "hf")));
    json_object_set_new(model, "hf", json_string(dir));
  }
  int bad = !spec || zt_config_model_from_json(model, &mc, err, sizeof err) < 0 ||
            zt_config_train_from_json(json_object_get(spec, "train"), &tc, err, sizeof err) < 0;
  json_decref(spec);
  if (bad) {
    fprintf(stderr, "FAIL %s: %s\n", p, spec ? err : je.text);
    return 1;
  }
  if (!hf) snprintf(mc.init_path, sizeof mc.init_path, "%s/%s/init.safetensors", root, arch);
  snprintf(p, sizeof p, "%s/%s/losses.json", root, arch);
  json_t *j = json_load_file(p, 0, &je);
  json_t *want = json_object_get(j, "losses");
  if (!json_is_array(want) || json_array_size(want) != (size_t)tc.steps) {
    fprintf(stderr, "FAIL %s: needs \"losses\" with %d numbers\n", p, tc.steps);
    json_decref(j);
    return 1;
  }
  snprintf(p, sizeof p, "%s/%s/batches.bin", root, arch);
  FILE *f = fopen(p, "rb");
  zt_trainer *t = NULL;
  int fails = 0;
  if (zt_trainer_open(&t, &mc, &tc, be, err, sizeof err) < 0) {
    fprintf(stderr, "FAIL %s\n", err);
    fails = 1;
    goto out;
  }
  size_t per_step = zt_trainer_micro_tokens(t) * (size_t)tc.grad_accum;
  int32_t *tok = malloc(per_step * 4);
  for (int s = 0; s < tc.steps && !fails; s++) {
    zt_step_result r;
    if (!f || fread(tok, 4, per_step, f) != per_step) {
      fails += MC_EXPECT(0, "%s: too short for step %d", p, s + 1);
      break;
    }
    if (zt_trainer_step(t, tok, &r, err, sizeof err) < 0) {
      fails += MC_EXPECT(0, "step %d: %s", s + 1, err);
      break;
    }
    double w = json_number_value(json_array_get(want, (size_t)s)), rel = fabs(r.loss - w) / fabs(w);
    if (rel > *worst) *worst = rel;
    fails += MC_EXPECT(rel <= TOLERANCE, "%s step %d: zt %.9g, %s %.9g (relative %.3g)", arch,
                       s + 1, r.loss, hf ? "transformers" : "PyTorch", w, rel);
  }
  free(tok);
  printf("%s on %s: %d steps, max relative loss difference %.3g\n", arch, be->ops->name,
         tc.steps, *worst);
out:
  if (f) fclose(f);
  json_decref(j);
  zt_trainer_close(t);
  return fails;
}

/* 0, 77 (no such backend here: skip) or 1. */
static int backend_open(const char *name, zt_backend *be) {
  if (!strcmp(name, "cpu")) {
    *be = mc_backend();
    return 0;
  }
#ifdef ZT_HAVE_CUDA
  if (!strcmp(name, "cuda")) {
    int rc = zt_backend_cuda_open(be, 0);
    if (rc == -ENODEV) printf("SKIP: no CUDA device\n");
    else if (rc < 0) fprintf(stderr, "FAIL: cannot open the cuda backend (%d)\n", rc);
    return rc == -ENODEV ? 77 : rc < 0;
  }
#endif
  fprintf(stderr, "FAIL: backend %s is not in this build\n", name);
  return 1;
}

static void backend_close(zt_backend *be) {
#ifdef ZT_HAVE_CUDA
  if (!strcmp(be->ops->name, "cuda")) {
    zt_backend_cuda_close(be);
    return;
  }
#endif
  zt_backend_cpu_close(be);
}

int main(int argc, char **argv) {
  struct stat st;
  if (argc < 2 || stat(argv[1], &st) < 0) {
    printf("SKIP: no parity data at %s (run tools/parity/pytorch_parity.py on a machine with "
           "PyTorch and commit its output there)\n", argc < 2 ? "(no path given)" : argv[1]);
    return 77;
  }
  /* a spec's model.hf must be absolute (engine/model/hf.c), and the variants' are made from this */
  char root[PATH_MAX];
  if (!realpath(argv[1], root)) {
    perror(argv[1]);
    return 1;
  }
  zt_backend be;
  int rc = backend_open(argc > 2 ? argv[2] : "cpu", &be);
  if (rc) return rc;
  /* tools/parity/hf_parity.py's variants */
  static const char *const hf[] = {"hf/llama_gqa42",  "hf/llama3_gqa82_tied", "hf/llama_linear",
                                   "hf/mistral",      "hf/qwen2_bias",        "hf/qwen3_qknorm"};
  double wg = 0, we = 0, wh = 0;
  int fails = run_arch(&be, root, "gpt", 0, &wg) + run_arch(&be, root, "encoder", 0, &we);
  for (size_t i = 0; i < sizeof hf / sizeof hf[0]; i++) {
    double w = 0;
    fails += run_arch(&be, root, hf[i], 1, &w);
    if (w > wh) wh = w;
  }
  printf("%s: max relative per-step loss difference: gpt %.3g, encoder %.3g, llama family %.3g "
         "(tolerance %g)\n", be.ops->name, wg, we, wh, TOLERANCE);
  backend_close(&be);
  return fails ? 1 : 0;
}
