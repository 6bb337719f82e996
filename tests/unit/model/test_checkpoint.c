/* Checkpoints, for every arch (llama's under Hugging Face's tensor names): save -> load restores
 * parameters and AdamW moments bit for bit; 6 steps straight
 * equal 3 steps, save, a fresh trainer, load, 3 steps (losses and parameters bitwise); saving over
 * an existing checkpoint; a checkpoint of another model is refused; export reloads as init. The
 * files, written a piece of units at a time, are byte for byte those zt_model_save_states
 * writes from the whole state; an optimizer file with a tensor missing, misshapen or extra is
 * refused, named, before anything is written: the trainer keeps its state and steps on. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/model/safetensors.h"
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

/* The checkpoint t saved in dir, as zt_model_save_states writes t's whole state. */
static int files_of_flat_state(zt_trainer *t, const char *dir, const char *tmp) {
  const zt_model *m = zt_trainer_model(t);
  size_t n = zt_model_num_params(m);
  float *x = malloc(3 * n * sizeof *x);
  if (!x) exit(1);
  zt_trainer_get_state(t, x, x + n, x + 2 * n);
  char err[512], a[700], b[700];
  zt_model_state ms = {"", x}, os[2] = {{".exp_avg", x + n}, {".exp_avg_sq", x + 2 * n}};
  snprintf(a, sizeof a, "%s/flat-model.safetensors", tmp);
  int fails = MC_EXPECT(zt_model_save_states(m, a, &ms, 1, 0, NULL, err, sizeof err) == 0, "%s",
                        err);
  snprintf(b, sizeof b, "%s/model.safetensors", dir);
  fails += mc_same_file(a, b);
  snprintf(a, sizeof a, "%s/flat-optimizer.safetensors", tmp);
  fails += MC_EXPECT(zt_model_save_states(m, a, os, 2, 1, "AdamW exp_avg / exp_avg_sq in zt's "
                                          "internal layout: weights are (out, in), HF Conv1D "
                                          "weights are not transposed here as they are in "
                                          "model.safetensors", err, sizeof err) == 0, "%s", err);
  snprintf(b, sizeof b, "%s/optimizer.safetensors", dir);
  fails += mc_same_file(a, b);
  free(x);
  return fails;
}

/* dir's optimizer.safetensors replaced by one of states s (n), which t must refuse naming
 * `want` without changing its state or refusing a step after. */
static int refuses_optimizer(zt_trainer *t, const char *dir, const zt_model_state *s, int n,
                             int misshapen, const char *want, const int32_t *tok) {
  const zt_model *m = zt_trainer_model(t);
  char err[512], path[700], bad[700];
  snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
  snprintf(bad, sizeof bad, "%s/optimizer.bad", dir);
  if (rename(path, bad) < 0) exit(1);
  int fails = 0;
  if (misshapen) {
    /* the moments in the checkpoint layout: every Conv1D weight transposed */
    fails += MC_EXPECT(zt_model_save_states(m, path, s, n, 0, NULL, err, sizeof err) == 0, "%s",
                       err);
  } else {
    fails += MC_EXPECT(zt_model_save_states(m, path, s, n, 1, NULL, err, sizeof err) == 0, "%s",
                       err);
  }
  size_t np = zt_model_num_params(m);
  float *x = malloc(np * sizeof *x), *y = malloc(np * sizeof *y);
  if (!x || !y) exit(1);
  zt_trainer_get_state(t, x, NULL, NULL);
  int steps = zt_trainer_step_count(t);
  int rc = zt_trainer_load(t, dir, err, sizeof err);
  fails += MC_EXPECT(rc == -EINVAL && strstr(err, want), "load of %s: %d %s", want, rc, err);
  zt_trainer_get_state(t, y, NULL, NULL);
  fails += MC_EXPECT(!memcmp(x, y, np * sizeof *x) && zt_trainer_step_count(t) == steps,
                     "a refused load (%s) changed the trainer", want);
  double loss;
  fails += step(t, tok, &loss);
  if (rename(bad, path) < 0) exit(1);
  free(x);
  free(y);
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
  fails += files_of_flat_state(b, dir, tmp);

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
  if (arch == ZT_ARCH_LLAMA) {
    /* the file holds HF's names; a llama of other heads, or another RoPE, is refused by name */
    zt_st_file *sf = NULL;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    fails += MC_EXPECT(zt_st_open(&sf, path, err, sizeof err) == 0, "%s", err);
    static const char *const hf[] = {"model.embed_tokens.weight",
                                     "model.layers.1.self_attn.k_proj.weight",
                                     "model.layers.0.mlp.gate_proj.weight", "model.norm.weight"};
    for (size_t i = 0; sf && i < sizeof hf / sizeof hf[0]; i++)
      fails += MC_EXPECT(zt_st_find(sf, hf[i]) != NULL, "%s: no tensor %s", path, hf[i]);
    fails += MC_EXPECT(sf && !zt_st_find(sf, "lm_head.weight"), "a tied head saved lm_head");
    zt_st_close(sf);
    zt_model_cfg kv = mc, theta = mc;
    kv.n_kv_heads = 2;
    theta.rope_theta = 500000.0f;
    zt_trainer *x = open_trainer(kv, &be), *y = open_trainer(theta, &be);
    fails += MC_EXPECT(zt_trainer_load(x, dir, err, sizeof err) == -EINVAL &&
                       strstr(err, "model.n_kv_heads"), "other kv heads: %s", err);
    fails += MC_EXPECT(zt_trainer_load(y, dir, err, sizeof err) == -EINVAL &&
                       strstr(err, "model.rope_theta"), "another rope_theta: %s", err);
    zt_trainer_close(x);
    zt_trainer_close(y);
  }

  /* optimizer files that do not match the model: one state, three, misshapen */
  char last[160];
  const zt_model *mm = zt_trainer_model(a);
  snprintf(last, sizeof last, "%s.exp_avg_sq is missing", zt_model_tensor(mm, 0)->name);
  zt_model_state os[3] = {{".exp_avg", pa}, {".exp_avg_sq", pa}, {".extra", pa}};
  fails += refuses_optimizer(d, dir, os, 1, 0, last, tok);
  snprintf(last, sizeof last, "unexpected tensor %s.extra", zt_model_tensor(mm, 0)->name);
  fails += refuses_optimizer(d, dir, os, 3, 0, last, tok);
  /* gpt: its Conv1D weights are not square */
  if (arch == ZT_ARCH_GPT) fails += refuses_optimizer(d, dir, os, 2, 1, "has shape", tok);

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
  int fails = test_arch(ZT_ARCH_GPT, tmp) + test_arch(ZT_ARCH_ENCODER, tmp) +
              test_arch(ZT_ARCH_LLAMA, tmp);
  mc_rmtree(tmp);
  return fails ? 1 : 0;
}
