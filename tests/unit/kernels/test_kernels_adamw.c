/* AdamW: one and three steps against the update written out in double, with weight decay and a
 * gradient scale. The kernel computes in fp32 in torch's operation order; the double formula
 * is the mathematical definition, so they agree to a few fp32 ulps per step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine/kernels/ops.h"
#include "tests/unit/kernels/kcheck.h"

#define N 203

typedef struct hyper {
  float lr, beta1, beta2, eps, wd, grad_scale;
} hyper;

/* One step of the definition, in double, on the reference state. */
static void adamw_ref(double *p, double *m, double *v, const float *g, hyper h, int t) {
  double b1 = h.beta1, b2 = h.beta2;
  for (int i = 0; i < N; i++) {
    double gi = (double)g[i] * h.grad_scale;
    m[i] = b1 * m[i] + (1.0 - b1) * gi;
    v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
    p[i] -= (double)h.lr * h.wd * p[i];
    double mhat = m[i] / (1.0 - pow(b1, t));
    double vhat = v[i] / (1.0 - pow(b2, t));
    p[i] -= (double)h.lr * mhat / (sqrt(vhat) + h.eps);
  }
}

static int run(zt_backend *be, kc_rng *rng, hyper h, int steps) {
  float *p = kc_random(rng, N, -1, 1), *m = kc_floats(N), *v = kc_floats(N), *g = kc_floats(N);
  double ref_p[N], ref_m[N] = {0}, ref_v[N] = {0};
  for (int i = 0; i < N; i++)
    ref_p[i] = p[i];
  int fail = 0;
  for (int t = 1; t <= steps; t++) {
    /* gradients away from zero so that eps does not dominate the denominators */
    for (int i = 0; i < N; i++) {
      float mag = kc_uniform(rng, 0.05f, 2.0f);
      g[i] = kc_int(rng, 2) ? mag : -mag;
    }
    be->ops->adamw(be->ctx, p, g, m, v, N, h.lr, h.beta1, h.beta2, h.eps, h.wd, t,
                   h.grad_scale);
    adamw_ref(ref_p, ref_m, ref_v, g, h, t);
  }
  /* Moments can cancel towards zero, so their absolute tolerance follows the size of the
   * scaled gradients (at most gmax) rather than their own. */
  double gmax = 2.0 * h.grad_scale;
  char what[64];
  snprintf(what, sizeof(what), "adamw p after %d step(s)", steps);
  fail |= kc_close(what, p, ref_p, N, 2e-7 * steps, 4e-7 * steps);
  snprintf(what, sizeof(what), "adamw m after %d step(s)", steps);
  fail |= kc_close(what, m, ref_m, N, 2e-7 * gmax, 1e-6);
  snprintf(what, sizeof(what), "adamw v after %d step(s)", steps);
  fail |= kc_close(what, v, ref_v, N, 2e-7 * gmax * gmax, 1e-6);
  free(p), free(m), free(v), free(g);
  return fail;
}

int main(void) {
  zt_backend be;
  if (zt_backend_cpu_open(&be, 0) < 0)
    return 1;
  kc_rng rng;
  kc_seed(&rng, 99);
  hyper typical = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .wd = 0.1f,
                   .grad_scale = 0.25f};
  /* beta1 below 0.5 takes the other branch of torch's lerp; a large lr makes the decay and
   * the step visible well above fp32 rounding. */
  hyper unusual = {.lr = 0.05f, .beta1 = 0.3f, .beta2 = 0.95f, .eps = 1e-6f, .wd = 0.5f,
                   .grad_scale = 3.0f};
  int fail = 0;
  fail |= run(&be, &rng, typical, 1);
  fail |= run(&be, &rng, typical, 3);
  fail |= run(&be, &rng, unusual, 1);
  fail |= run(&be, &rng, unusual, 3);
  zt_backend_cpu_close(&be);
  if (!fail)
    printf("adamw matches the reference\n");
  return fail;
}
