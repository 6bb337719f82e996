/* Held-out evaluation (zt_trainer_eval_batch) of the data-parallel trainer on simulated ranks,
 * for gpt and llama, W in {2, 3}, ZeRO stages 1, 2 and 3, and stage 3 with the parameters on
 * the host: each rank's micro-batches (one of padding alone) walked forward with the
 * collectives, the world's sums added in micro-batch order: bitwise the evaluation of one
 * trainer of the same parameters (before any step, and after steps through a checkpoint of the
 * world loaded into the plain trainer); steps with an evaluation between them bitwise those of
 * a world never evaluated (losses, state). */
#include <stdlib.h>
#include <string.h>

#include "tests/unit/dp/dptest.h"
#include "tests/unit/model/mcheck.h"

#define G 2

static zt_backend g_be; /* the plain trainers' */

static int eval_of(zt_trainer *t, const int32_t *tok, double *sum, int64_t *n, const char *what) {
  char err[512];
  zt_batch b = {.tokens = tok};
  int rc = zt_trainer_eval_batch(t, &b, sum, n, err, sizeof err);
  return MC_EXPECT(rc == 0, "%s: eval: %s", what, err);
}

static int same_eval(zt_trainer *dp, zt_trainer *plain, const int32_t *ev, const char *what) {
  double a, b;
  int64_t na, nb;
  int fails = eval_of(dp, ev, &a, &na, what) + eval_of(plain, ev, &b, &nb, what);
  return fails + MC_EXPECT(!memcmp(&a, &b, sizeof a) && na == nb && na > 0,
                           "%s: the world's eval %.17g over %lld, one trainer's %.17g over %lld",
                           what, a, (long long)na, b, (long long)nb);
}

static int check_case(zt_arch arch, int W, int stage, zt_offload_place params) {
  int fails = 0;
  char what[128], err[512];
  snprintf(what, sizeof what, "%s W %d stage %d%s", zt_arch_name(arch), W, stage,
           params == ZT_PLACE_HOST ? " params host" : "");
  zt_model_cfg mc = dpt_model_cfg(arch);
  zt_train_cfg tc = dpt_train_cfg(G, 0, ZT_F32), one = dpt_train_cfg(W * G, 0, ZT_F32);
  size_t per = dpt_step_tokens(&mc, W * G), micro = per / (size_t)(W * G);
  int32_t *tok = dpt_tokens(&mc, W * G, 11), *ev = dpt_tokens(&mc, W * G, 12);
  /* rank 1's first micro-batch of the evaluation is padding alone */
  for (size_t i = 0; i < micro; i++) ev[(size_t)G * micro + i] = -1;
  dpt_ranks x, y;
  dpt_ranks_open(&x, W);
  dpt_ranks_open(&y, W);
  zt_dp_cfg dc = {.world = W, .zero_stage = stage};
  if (params == ZT_PLACE_HOST) {
    dc.optimizer = ZT_PLACE_HOST;
    dc.params = ZT_PLACE_HOST;
  }
  zt_trainer *dp = dpt_open_dp_cfg(&mc, &tc, &x, &dc), *ref = dpt_open_dp_cfg(&mc, &tc, &y, &dc);
  zt_trainer *plain = dpt_open_plain(&mc, &one, &g_be);
  fails += same_eval(dp, plain, ev, what);
  dpt_run a, b;
  for (int s = 0; s < 2; s++) {
    fails += dpt_run_steps(dp, tok, per, s, s + 1, &a, what);
    fails += dpt_run_steps(ref, tok, per, s, s + 1, &b, what);
    double sum;
    int64_t n;
    fails += eval_of(dp, ev, &sum, &n, what);
    fails += MC_EXPECT(!memcmp(&a.loss[s], &b.loss[s], sizeof a.loss[s]),
                       "%s: step %d's loss %.17g evaluated, %.17g not", what, s + 1, a.loss[s],
                       b.loss[s]);
  }
  fails += dpt_run_steps(dp, tok, per, 2, 3, &a, what);
  fails += dpt_run_steps(ref, tok, per, 2, 3, &b, what);
  fails += MC_EXPECT(!memcmp(&a.loss[2], &b.loss[2], sizeof a.loss[2]),
                     "%s: step 3's loss after evaluations %.17g, without %.17g", what, a.loss[2],
                     b.loss[2]);
  float *sa = dpt_state_of(dp), *sb = dpt_state_of(ref);
  size_t np = zt_model_num_params(zt_trainer_model(dp));
  fails += MC_EXPECT(!memcmp(sa, sb, 3 * np * sizeof *sa), "%s: the state after evaluations "
                     "differs", what);
  free(sa);
  free(sb);
  /* the world's parameters after its steps, in one trainer */
  const char *dir = mc_tmpdir();
  char path[600];
  snprintf(path, sizeof path, "%s/ckpt", dir);
  if (!MC_EXPECT(zt_trainer_save(dp, path, err, sizeof err) == 0 &&
                     zt_trainer_load(plain, path, err, sizeof err) == 0,
                 "%s: checkpoint: %s", what, err))
    fails += same_eval(dp, plain, ev, what);
  else
    fails++;
  mc_rmtree(dir);
  zt_trainer_close(dp);
  zt_trainer_close(ref);
  zt_trainer_close(plain);
  dpt_ranks_close(&x);
  dpt_ranks_close(&y);
  free(tok);
  free(ev);
  return fails;
}

int main(void) {
  int fails = 0;
  g_be = mc_backend();
  static const zt_arch archs[] = {ZT_ARCH_GPT, ZT_ARCH_LLAMA};
  for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
    for (int W = 2; W <= 3; W++)
      for (int stage = 1; stage <= 3; stage++) fails += check_case(archs[i], W, stage, 0);
  fails += check_case(ZT_ARCH_GPT, 2, 3, ZT_PLACE_HOST);
  fails += check_case(ZT_ARCH_LLAMA, 2, 3, ZT_PLACE_HOST);
  if (fails) fprintf(stderr, "%d failure(s)\n", fails);
  return fails ? 1 : 0;
}
