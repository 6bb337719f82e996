/* Activation checkpointing: with every = 1 and 2 on 3 layers, every arch (llama with q/k norm
 * and a tied head) gives bitwise the
 * gradients of one forward/backward and the losses, gradient norms, parameters and AdamW moments
 * of several optimizer steps that the run without gives; the activations shrink by exactly the
 * shared blocks' internals, and the trainer holds what the estimate says; the JSON form. */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "engine/train/config.h"
#include "tests/unit/model/mcheck.h"

#define LAYERS 3
#define B 2
#define STEPS 4

static zt_model_cfg cfg3(zt_arch arch) {
  zt_model_cfg c = mc_tiny(arch);
  c.n_layers = LAYERS;
  if (arch == ZT_ARCH_LLAMA) c.qk_norm = c.tie_embeddings = 1;
  return c;
}

static int bits_equal(const float *a, const float *b, size_t n, size_t *first) {
  for (size_t i = 0; i < n; i++)
    if (memcmp(&a[i], &b[i], sizeof *a)) {
      *first = i;
      return 0;
    }
  return 1;
}

/* One forward, loss and backward through the model API with the given checkpointing. */
static int grads_of(const zt_model *m, int every, const float *p, const int32_t *tok,
                    const int32_t *tgt, float *g, double *loss) {
  char err[256];
  zt_backend be = mc_backend();
  zt_acts *a;
  const zt_model_cfg *mc = zt_model_cfg_of(m);
  int N = B * mc->seq_len;
  if (zt_acts_open(&a, m, &be, B, every, err, sizeof err) < 0) {
    fprintf(stderr, "FAIL acts: %s\n", err);
    zt_backend_cpu_close(&be);
    return 1;
  }
  memcpy(zt_acts_tokens(a), tok, (size_t)N * 4);  /* cpu backend: host memory */
  memcpy(zt_acts_targets(a), tgt, (size_t)N * 4);
  mc_positions(&be, a, B, mc->seq_len);
  memset(g, 0, zt_model_num_params(m) * sizeof *g);
  zt_model_forward(m, a, p);
  int cnt;
  zt_model_loss(m, a, 1.0f / (float)N);
  zt_model_backward(m, a, p, g);
  zt_acts_loss(a, loss, &cnt);
  zt_acts_close(a);
  zt_backend_cpu_close(&be);
  return 0;
}

static int test_model_grads(zt_arch arch, int every) {
  char err[256];
  int fails = 0;
  zt_model_cfg mc = cfg3(arch);
  zt_model *m;
  if (zt_model_create(&m, &mc, err, sizeof err) < 0) {
    fprintf(stderr, "FAIL model: %s\n", err);
    return 1;
  }
  size_t n = zt_model_num_params(m), N = (size_t)B * (size_t)mc.seq_len, at;
  float *p = malloc(n * 4), *g0 = malloc(n * 4), *g1 = malloc(n * 4);
  int32_t *tok = malloc(N * 4), *tgt = malloc(N * 4);
  uint64_t s = 31 + (uint64_t)every;
  mc_tokens(&s, tok, N, mc.vocab);
  mc_tokens(&s, tgt, N, mc.vocab);
  tgt[3] = -1;
  zt_model_init_params(m, p);
  double l0 = 0, l1 = 0;
  fails += grads_of(m, 0, p, tok, tgt, g0, &l0) + grads_of(m, every, p, tok, tgt, g1, &l1);
  fails += MC_EXPECT(!memcmp(&l0, &l1, sizeof l0), "%s every=%d: loss %.17g vs %.17g",
                     zt_arch_name(arch), every, l0, l1);
  if (!bits_equal(g0, g1, n, &at)) {
    int k = 0;
    while (k + 1 < zt_model_num_tensors(m) && zt_model_tensor(m, k + 1)->offset <= at) k++;
    fails += MC_EXPECT(0, "%s every=%d: gradient of %s[%zu] %.9g vs %.9g", zt_arch_name(arch),
                       every, zt_model_tensor(m, k)->name, at - zt_model_tensor(m, k)->offset,
                       (double)g0[at], (double)g1[at]);
  }
  zt_model_destroy(m);
  free(p);
  free(g0);
  free(g1);
  free(tok);
  free(tgt);
  return fails;
}

/* STEPS optimizer steps with accumulation and clipping, from the same init on the same batches. */
static int test_training(zt_arch arch, int every) {
  char err[256];
  int fails = 0;
  zt_model_cfg mc = cfg3(arch);
  zt_train_cfg a = mc_train(B, 2), c;
  a.grad_clip = 0.5f;
  a.lr = 1e-2f;
  c = a;
  c.ckpt_every = every;
  zt_backend be = mc_backend();
  zt_trainer *ta = NULL, *tc = NULL;
  if (zt_trainer_open(&ta, &mc, &a, &be, err, sizeof err) < 0 ||
      zt_trainer_open(&tc, &mc, &c, &be, err, sizeof err) < 0) {
    fprintf(stderr, "FAIL open: %s\n", err);
    zt_trainer_close(ta);
    zt_backend_cpu_close(&be);
    return 1;
  }
  size_t n = zt_model_num_params(zt_trainer_model(ta)), per = 2 * zt_trainer_micro_tokens(ta), at;
  int32_t *rows = malloc(per * 4);
  uint64_t s = 5;
  for (int k = 0; k < STEPS && !fails; k++) {
    mc_tokens(&s, rows, per, mc.vocab);
    zt_step_result ra, rc;
    if (zt_trainer_step(ta, rows, &ra, err, sizeof err) < 0 ||
        zt_trainer_step(tc, rows, &rc, err, sizeof err) < 0) {
      fails += MC_EXPECT(0, "step %d: %s", k + 1, err);
      break;
    }
    fails += MC_EXPECT(!memcmp(&ra.loss, &rc.loss, sizeof ra.loss) &&
                       !memcmp(&ra.grad_norm, &rc.grad_norm, sizeof ra.grad_norm),
                       "%s every=%d step %d: loss %.17g vs %.17g, grad_norm %.17g vs %.17g",
                       zt_arch_name(arch), every, k + 1, ra.loss, rc.loss, ra.grad_norm,
                       rc.grad_norm);
  }
  float *x[2][3];
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 3; j++) x[i][j] = malloc(n * 4);
  zt_trainer_get_state(ta, x[0][0], x[0][1], x[0][2]);
  zt_trainer_get_state(tc, x[1][0], x[1][1], x[1][2]);
  static const char *const what[] = {"parameter", "exp_avg", "exp_avg_sq"};
  for (int j = 0; j < 3; j++)
    fails += MC_EXPECT(bits_equal(x[0][j], x[1][j], n, &at), "%s every=%d: %s %zu differs",
                       zt_arch_name(arch), every, what[j], at);
  printf("%s every=%d: %d steps bitwise equal: %s\n", zt_arch_name(arch), every, STEPS,
         fails ? "no" : "yes");
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 3; j++) free(x[i][j]);
  free(rows);
  zt_trainer_close(ta);
  zt_trainer_close(tc);
  zt_backend_cpu_close(&be);
  return fails;
}

static size_t al(size_t floats) { return (floats * 4 + 255) / 256 * 256; }

/* The bytes of one block's internals on the CPU backend, written out buffer by buffer from the
 * architectures' descriptions (everything a block's backward reads except its input). */
static size_t block_internals(const zt_model_cfg *mc, int F) {
  size_t N = (size_t)B * mc->seq_len, C = mc->d_model;
  size_t att = al((size_t)B * mc->n_heads * mc->seq_len * mc->seq_len);
  /* llama (1 kv head, q/k norm): xn1, rstd1, qkv, qk_raw, q_rstd, k_rstd, att, atty, res2, xn2,
   * rstd2, gu, swi */
  if (mc->arch == ZT_ARCH_LLAMA) {
    size_t hs = C / mc->n_heads, QKV = (mc->n_heads + 2) * hs;
    return al(N * C) + al(N) + 2 * al(N * QKV) + al(N * mc->n_heads) + al(N) + att +
           al(N * mc->n_heads * hs) + 2 * al(N * C) + al(N) + al(2 * N * F) + al(N * F);
  }
  /* gpt: ln1, mean, rstd, qkv, att, atty, res2, ln2, mean, rstd, fch, fch_gelu */
  if (mc->arch == ZT_ARCH_GPT)
    return al(N * C) + 2 * al(N) + al(3 * N * C) + att + 2 * al(N * C) + al(N * C) + 2 * al(N) +
           2 * al(N * F);
  /* qkv, att, atty, r1, h1, m1, s1, f1, f1r, r2, m2, s2 */
  return al(3 * N * C) + att + 3 * al(N * C) + 2 * al(N) + 2 * al(N * F) + al(N * C) + 2 * al(N);
}

static int test_memory(zt_arch arch) {
  char err[256];
  int fails = 0;
  zt_model_cfg mc = cfg3(arch);
  size_t est[3], internals = 0;
  for (int every = 0; every <= 2; every++) {
    zt_train_cfg tc = mc_train(B, 2);
    tc.ckpt_every = every;
    zt_backend be = mc_backend();
    zt_trainer *t;
    if (zt_trainer_open(&t, &mc, &tc, &be, err, sizeof err) < 0) {
      fprintf(stderr, "FAIL open: %s\n", err);
      zt_backend_cpu_close(&be);
      return 1;
    }
    est[every] = zt_trainer_estimate_bytes(&mc, &tc, zt_backend_cpu_ops());
    internals = block_internals(&mc, zt_model_d_ff(zt_trainer_model(t)));
    fails += MC_EXPECT(est[every] == zt_trainer_backend_bytes(t),
                       "%s every=%d: estimate %zu, trainer holds %zu", zt_arch_name(arch), every,
                       est[every], zt_trainer_backend_bytes(t));
    zt_trainer_close(t);
    zt_backend_cpu_close(&be);
  }
  /* every=1: blocks 0, 1, 2 share one set (two saved); every=2: blocks 0 and 2 (one saved) */
  fails += MC_EXPECT(est[0] - est[1] == 2 * internals && est[0] - est[2] == internals,
                     "%s: estimates %zu / %zu / %zu, one block's internals %zu",
                     zt_arch_name(arch), est[0], est[1], est[2], internals);
  printf("%s: backend bytes %zu, every=1 %zu, every=2 %zu (block internals %zu)\n",
         zt_arch_name(arch), est[0], est[1], est[2], internals);
  return fails;
}

/* the train object's required fields */
#define REQ "\"steps\": 3, \"micro_batch\": 1, "

static int test_json(void) {
  char err[256];
  int fails = 0;
  zt_train_cfg c;
  json_error_t je;
  json_t *o = json_loads("{" REQ "\"activation_checkpointing\": {\"every\": 2}}", 0, &je);
  fails += MC_EXPECT(zt_config_train_from_json(o, &c, err, sizeof err) == 0 && c.ckpt_every == 2,
                     "parse: %s", err);
  json_t *back = zt_config_train_to_json(&c);
  zt_train_cfg d;
  fails += MC_EXPECT(zt_config_train_from_json(back, &d, err, sizeof err) == 0 && d.ckpt_every == 2,
                     "round trip: %s", err);
  json_decref(back);
  json_decref(o);
  o = json_loads("{\"steps\": 3, \"micro_batch\": 1}", 0, &je);
  fails += MC_EXPECT(zt_config_train_from_json(o, &c, err, sizeof err) == 0 && c.ckpt_every == 0,
                     "default: %d", c.ckpt_every);
  json_decref(o);
  static const char *const bad[] = {"{" REQ "\"activation_checkpointing\": {\"every\": -1}}",
                                    "{" REQ "\"activation_checkpointing\": {\"every\": \"2\"}}",
                                    "{" REQ "\"activation_checkpointing\": {\"evry\": 1}}",
                                    "{" REQ "\"activation_checkpointing\": 1}"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    o = json_loads(bad[i], 0, &je);
    err[0] = 0;
    fails += MC_EXPECT(zt_config_train_from_json(o, &c, err, sizeof err) == -EINVAL &&
                       strstr(err, "train.activation_checkpointing"), "%s accepted or unnamed: %s",
                       bad[i], err);
    json_decref(o);
  }
  return fails;
}

int main(void) {
  int fails = test_json();
  static const zt_arch archs[] = {ZT_ARCH_GPT, ZT_ARCH_ENCODER, ZT_ARCH_LLAMA};
  for (int i = 0; i < 3; i++) {
    fails += test_memory(archs[i]);
    for (int every = 1; every <= 2; every++)
      fails += test_model_grads(archs[i], every) + test_training(archs[i], every);
  }
  return fails ? 1 : 0;
}
