/* The trainer's batch (zt_batch) and the step's loss over counted targets: the planes form of
 * today's rows gives the tokens form's bits; with micro-batches of different counted targets the
 * step's loss and gradient are those of the sum over all of them divided by their number (one
 * micro-batch holding every row), not the mean of the micro-batches' means; a micro-batch with
 * no counted target changes nothing; positions that break the contract are refused naming the
 * micro-batch, row and index. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/model/mcheck.h"

#define B 2
#define STEPS 3

/* the trainers' backends, closed at the end (a trainer does not own its backend) */
static zt_backend g_be[16];
static int g_n_be;

static zt_trainer *open_trainer(const zt_model_cfg *mc, int micro_batch, int grad_accum) {
  zt_train_cfg tc = mc_train(micro_batch, grad_accum);
  tc.steps = STEPS;
  tc.lr = 1e-2f;
  if (g_n_be == 16) exit(1);
  zt_backend be = g_be[g_n_be++] = mc_backend();
  zt_trainer *t = NULL;
  char err[256];
  if (zt_trainer_open(&t, mc, &tc, &be, err, sizeof err) < 0) {
    fprintf(stderr, "open: %s\n", err);
    exit(1);
  }
  return t;
}

static float *params_of(zt_trainer *t) {
  size_t n = zt_model_num_params(zt_trainer_model(t));
  float *p = malloc(n * sizeof *p);
  if (!p || zt_trainer_get_state(t, p, NULL, NULL) < 0) exit(1);
  return p;
}

/* The planes of rows of T + 1 tokens (inputs, next-token targets, positions 0..T-1). */
static void to_planes(const int32_t *rows, size_t n_rows, int T, int32_t *x, int32_t *y,
                      int32_t *pos) {
  for (size_t r = 0; r < n_rows; r++)
    for (int j = 0; j < T; j++) {
      x[r * (size_t)T + (size_t)j] = rows[r * (size_t)(T + 1) + (size_t)j];
      y[r * (size_t)T + (size_t)j] = rows[r * (size_t)(T + 1) + (size_t)j + 1];
      pos[r * (size_t)T + (size_t)j] = j;
    }
}

int main(void) {
  int fails = 0;
  zt_model_cfg mc = mc_tiny(ZT_ARCH_GPT);
  int T = mc.seq_len;
  zt_trainer *a = open_trainer(&mc, B, 2), *b = open_trainer(&mc, B, 2);
  size_t n = zt_model_num_params(zt_trainer_model(a));
  size_t rows = (size_t)STEPS * 2 * B, slots = rows * (size_t)T;
  int32_t *tok = malloc(rows * (size_t)(T + 1) * sizeof *tok);
  int32_t *x = malloc(3 * slots * sizeof *x), *y = x + slots, *pos = y + slots;
  uint64_t seed = 5;
  mc_tokens(&seed, tok, rows * (size_t)(T + 1), mc.vocab);
  to_planes(tok, rows, T, x, y, pos);
  char err[512];

  /* the planes form of every step's rows: the tokens form's bits */
  for (int s = 0; s < STEPS; s++) {
    zt_step_result ra, rb;
    size_t at = (size_t)s * 2 * B;
    zt_batch planes = {.inputs = x + at * (size_t)T, .targets = y + at * (size_t)T,
                       .positions = pos + at * (size_t)T};
    fails += MC_EXPECT(zt_trainer_step(a, tok + at * (size_t)(T + 1), &ra, err, sizeof err) == 0,
                       "tokens: %s", err);
    fails += MC_EXPECT(zt_trainer_step_batch(b, &planes, &rb, err, sizeof err) == 0, "planes: %s",
                       err);
    fails += MC_EXPECT(!memcmp(&ra.loss, &rb.loss, sizeof ra.loss), "step %d: loss %.17g, "
                       "planes %.17g", s + 1, ra.loss, rb.loss);
  }
  float *pa = params_of(a), *pb = params_of(b);
  fails += MC_EXPECT(!memcmp(pa, pb, n * sizeof *pa), "planes: the parameters differ");
  free(pa);
  free(pb);
  zt_trainer_close(a);
  zt_trainer_close(b);

  /* micro-batch 0 counts one target, micro-batch 1 all of them: the step is that of one
   * micro-batch of both, whose loss is the mean over the counted targets */
  for (size_t i = 1; i < (size_t)B * (size_t)T; i++) y[i] = -1;
  zt_batch masked = {.inputs = x, .targets = y, .positions = pos};
  a = open_trainer(&mc, B, 2);
  b = open_trainer(&mc, 2 * B, 1);
  zt_step_result ra, rb;
  fails += MC_EXPECT(zt_trainer_step_batch(a, &masked, &ra, err, sizeof err) == 0, "%s", err);
  fails += MC_EXPECT(zt_trainer_step_batch(b, &masked, &rb, err, sizeof err) == 0, "%s", err);
  pa = params_of(a);
  pb = params_of(b);
  double worst = 0;
  for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)pa[i] - pb[i]));
  fails += MC_EXPECT(fabs(ra.loss - rb.loss) <= 1e-6 * fabs(rb.loss), "counted: loss %.9g, one "
                     "micro-batch %.9g", ra.loss, rb.loss);
  fails += MC_EXPECT(worst <= 1e-6, "counted: parameters differ by %g", worst);
  /* the mean of the two micro-batches' means is another number: the test tells them apart */
  zt_trainer *one = open_trainer(&mc, B, 1), *two = open_trainer(&mc, B, 1);
  zt_batch m0 = masked, m1 = {.inputs = x + (size_t)B * T, .targets = y + (size_t)B * T,
                              .positions = pos + (size_t)B * T};
  zt_step_result r0, r1;
  fails += MC_EXPECT(zt_trainer_step_batch(one, &m0, &r0, err, sizeof err) == 0, "%s", err);
  fails += MC_EXPECT(zt_trainer_step_batch(two, &m1, &r1, err, sizeof err) == 0, "%s", err);
  fails += MC_EXPECT(fabs((r0.loss + r1.loss) / 2 - ra.loss) > 1e-4, "the mean of means %.9g "
                     "is the counted loss %.9g", (r0.loss + r1.loss) / 2, ra.loss);
  zt_trainer_close(one);
  zt_trainer_close(two);
  free(pa);
  free(pb);
  zt_trainer_close(a);
  zt_trainer_close(b);

  /* a micro-batch without a counted target: the step of the other alone, bitwise */
  for (size_t i = 0; i < (size_t)B * (size_t)T; i++) y[i] = -1;
  a = open_trainer(&mc, B, 2);
  b = open_trainer(&mc, B, 1);
  fails += MC_EXPECT(zt_trainer_step_batch(a, &masked, &ra, err, sizeof err) == 0, "%s", err);
  fails += MC_EXPECT(zt_trainer_step_batch(b, &m1, &rb, err, sizeof err) == 0, "%s", err);
  pa = params_of(a);
  pb = params_of(b);
  fails += MC_EXPECT(!memcmp(&ra.loss, &rb.loss, sizeof ra.loss) &&
                         !memcmp(pa, pb, n * sizeof *pa),
                     "an empty micro-batch: loss %.17g, alone %.17g", ra.loss, rb.loss);
  free(pa);
  free(pb);

  /* positions: a row starts at 0 and each is 0 or the one before plus 1 */
  pos[(size_t)B * T + (size_t)T + 3] = 7;
  fails += MC_EXPECT(zt_trainer_step_batch(a, &masked, &ra, err, sizeof err) == -EINVAL &&
                         strstr(err, "micro-batch 1 row 1 index 3: position 7 is neither 0"),
                     "bad position: %s", err);
  pos[(size_t)B * T + (size_t)T + 3] = 3;
  y[5] = mc.vocab;
  fails += MC_EXPECT(zt_trainer_step_batch(a, &masked, &ra, err, sizeof err) == -EINVAL &&
                         strstr(err, "micro-batch 0 row 1 index 0: target 11 is outside [0, 11)"),
                     "bad target: %s", err);
  fails += MC_EXPECT(zt_trainer_step_count(a) == 1, "a refused batch changed the step count");
  zt_trainer_close(a);
  zt_trainer_close(b);
  free(tok);
  free(x);
  for (int i = 0; i < g_n_be; i++) zt_backend_cpu_close(&g_be[i]);
  if (fails) return 1;
  printf("model_batch: ok\n");
  return 0;
}
