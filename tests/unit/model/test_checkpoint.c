/* Checkpoints: save -> load restores parameters and AdamW moments bit for bit; 6 steps straight
 * equal 3 steps, save, a fresh trainer, load, 3 steps (losses and parameters bitwise); saving over
 * an existing checkpoint; a checkpoint of another model is refused; export reloads as init. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/unit/model/mcheck.h"

#define STEPS 6

static zt_trainer *open_trainer(zt_model_cfg mc, const zt_backend *be) {
  char err[256];
  zt_train_cfg tc = mc_train(2, 2);
  tc.steps = STEPS;
  tc.warmup_steps = 2;
  tc.schedule = ZT_SCHED_COSINE;
  tc.min_lr = 1e-4f;
  tc.grad_clip = 1.0f;
  tc.weight_decay = 0.1f;
  zt_trainer *t = NULL;
  if (zt_trainer_open(&t, &mc, &tc, be, err, sizeof err) < 0) {
    fprintf(stderr, "FAIL open: %s\n", err);
    exit(1);
  }
  return t;
}

static int step(zt_trainer *t, const int32_t *tok, double *loss) {
  char err[256];
  zt_step_result r;
  if (zt_trainer_step(t, tok, &r, err, sizeof err) < 0) {
    fprintf(stderr, "FAIL step: %s\n", err);
    return 1;
  }
  *loss = r.loss;
  return 0;
}

static int same_state(zt_trainer *a, zt_trainer *b, const char *what) {
  size_t n = zt_model_num_params(zt_trainer_model(a));
  float *x[3], *y[3];
  for (int i = 0; i < 3; i++) x[i] = malloc(n * 4), y[i] = malloc(n * 4);
  zt_trainer_get_state(a, x[0], x[1], x[2]);
  zt_trainer_get_state(b, y[0], y[1], y[2]);
  int fails = 0;
  static const char *const names[] = {"parameters", "exp_avg", "exp_avg_sq"};
  for (int i = 0; i < 3; i++) {
    fails += MC_EXPECT(!memcmp(x[i], y[i], n * 4), "%s: %s differ", what, names[i]);
    free(x[i]);
    free(y[i]);
  }
  fails += MC_EXPECT(zt_trainer_step_count(a) == zt_trainer_step_count(b), "%s: step %d vs %d",
                     what, zt_trainer_step_count(a), zt_trainer_step_count(b));
  return fails;
}

static int test_arch(zt_arch arch, const char *tmp) {
  int fails = 0;
  char err[512], dir[600], path[700];
  zt_backend be = mc_backend();
  zt_model_cfg mc = mc_tiny(arch);
  size_t per_step = 2 * 2 * (size_t)(mc.seq_len + 1);
  int32_t *tok = malloc(STEPS * per_step * 4);
  uint64_t s = 5 + (uint64_t)arch;
  mc_tokens(&s, tok, STEPS * per_step, mc.vocab);
  snprintf(dir, sizeof dir, "%s/%s-ckpt", tmp, zt_arch_name(arch));

  double straight[STEPS], resumed[STEPS];
  zt_trainer *a = open_trainer(mc, &be);
  for (int i = 0; i < STEPS; i++) fails += step(a, tok + i * per_step, &straight[i]);

  zt_trainer *b = open_trainer(mc, &be);
  for (int i = 0; i < 3; i++) fails += step(b, tok + i * per_step, &resumed[i]);
  /* saving twice into the same directory replaces the first checkpoint */
  fails += MC_EXPECT(zt_trainer_save(b, dir, err, sizeof err) == 0, "save: %s", err);
  fails += MC_EXPECT(zt_trainer_save(b, dir, err, sizeof err) == 0, "save again: %s", err);
  struct stat st;
  snprintf(path, sizeof path, "%s.tmp", dir);
  fails += MC_EXPECT(stat(path, &st) < 0 && errno == ENOENT, "%s left behind", path);

  zt_model_cfg other = mc;
  other.init_seed = 777;  /* the load must overwrite a different init */
  zt_trainer *c = open_trainer(other, &be);
  fails += MC_EXPECT(zt_trainer_load(c, dir, err, sizeof err) == 0, "load: %s", err);
  fails += same_state(b, c, "after load");
  for (int i = 3; i < STEPS; i++) fails += step(c, tok + i * per_step, &resumed[i]);
  fails += MC_EXPECT(!memcmp(straight, resumed, sizeof straight), "%s: resumed losses differ",
                     zt_arch_name(arch));
  fails += same_state(a, c, "resumed vs straight");

  /* export -> init of a new trainer gives the same parameters */
  snprintf(path, sizeof path, "%s/%s-export.safetensors", tmp, zt_arch_name(arch));
  fails += MC_EXPECT(zt_trainer_export(a, path, err, sizeof err) == 0, "export: %s", err);
  zt_model_cfg from = mc;
  snprintf(from.init_path, sizeof from.init_path, "%s", path);
  zt_trainer *d = open_trainer(from, &be);
  size_t n = zt_model_num_params(zt_trainer_model(a));
  float *pa = malloc(n * 4), *pd = malloc(n * 4);
  zt_trainer_get_state(a, pa, NULL, NULL);
  zt_trainer_get_state(d, pd, NULL, NULL);
  fails += MC_EXPECT(!memcmp(pa, pd, n * 4), "%s: exported parameters differ", zt_arch_name(arch));

  /* a checkpoint of another shape is refused, naming the field */
  zt_model_cfg wide = mc;
  wide.d_model = 12;
  zt_trainer *e = open_trainer(wide, &be);
  fails += MC_EXPECT(zt_trainer_load(e, dir, err, sizeof err) == -EINVAL &&
                     strstr(err, "model.d_model"), "mismatched load: %s", err);
  fails += MC_EXPECT(zt_trainer_step_count(e) == 0, "a refused load changed the step count");

  printf("%s: resume bitwise, %d steps, final loss %.6f\n", zt_arch_name(arch), STEPS,
         straight[STEPS - 1]);
  zt_trainer_close(a);
  zt_trainer_close(b);
  zt_trainer_close(c);
  zt_trainer_close(d);
  zt_trainer_close(e);
  zt_backend_cpu_close(&be);
  free(tok);
  free(pa);
  free(pd);
  return fails;
}

int main(void) {
  const char *tmp = mc_tmpdir();
  int fails = test_arch(ZT_ARCH_GPT, tmp) + test_arch(ZT_ARCH_ENCODER, tmp);
  mc_rmtree(tmp);
  return fails ? 1 : 0;
}
