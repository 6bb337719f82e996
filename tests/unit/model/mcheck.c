/* Test helpers; see mcheck.h. */
#include "tests/unit/model/mcheck.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

zt_model_cfg mc_tiny(zt_arch arch) {
  zt_model_cfg c = {.arch = arch, .vocab = 11, .seq_len = 5, .d_model = 8, .n_heads = 2,
                    .n_layers = 2, .d_ff = arch == ZT_ARCH_ENCODER ? 16 : 0, .init_seed = 1234};
  return c;
}

zt_train_cfg mc_train(int B, int grad_accum) {
  zt_train_cfg c;
  zt_train_cfg_defaults(&c);
  c.steps = 100;
  c.micro_batch = B;
  c.grad_accum = grad_accum;
  return c;
}

uint64_t mc_next(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 0x2545f4914f6cdd1dull;
}

double mc_uniform(uint64_t *s, double lo, double hi) {
  return lo + (hi - lo) * (double)(mc_next(s) >> 11) * 0x1.0p-53;
}

void mc_tokens(uint64_t *s, int32_t *tok, size_t n, int vocab) {
  for (size_t i = 0; i < n; i++) tok[i] = (int32_t)(mc_next(s) % (uint64_t)vocab);
}

const char *mc_tmpdir(void) {
  static char buf[512];
  const char *base = getenv("TMPDIR");
  snprintf(buf, sizeof buf, "%s/ztmodel.XXXXXX", base && *base ? base : "/tmp");
  if (!mkdtemp(buf)) {
    perror("mkdtemp");
    exit(1);
  }
  return buf;
}

void mc_rmtree(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char p[1024];
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    if (unlink(p) < 0) mc_rmtree(p);
  }
  closedir(d);
  rmdir(dir);
}

zt_backend mc_backend(void) {
  zt_backend be;
  if (zt_backend_cpu_open(&be, 0) < 0) {
    fprintf(stderr, "cannot open the cpu backend\n");
    exit(1);
  }
  return be;
}
