#include "tests/unit/kernels/kcheck.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kc_seed(kc_rng *r, uint64_t seed) { r->s = seed ? seed : 0x9E3779B97F4A7C15ull; }

static uint64_t next(kc_rng *r) {
  r->s ^= r->s >> 12;
  r->s ^= r->s << 25;
  r->s ^= r->s >> 27;
  return r->s * 0x2545F4914F6CDD1Dull;
}

float kc_uniform(kc_rng *r, float lo, float hi) {
  double u = (double)(next(r) >> 40) / (double)(1ull << 24);
  return (float)(lo + (hi - lo) * u);
}

int kc_int(kc_rng *r, int n) { return (int)(next(r) % (uint64_t)n); }

float *kc_floats(size_t n) {
  float *x = calloc(n ? n : 1, sizeof(float));
  if (!x) {
    fprintf(stderr, "out of memory for %zu floats\n", n);
    exit(1);
  }
  return x;
}

void kc_fill(kc_rng *r, float *x, size_t n, float lo, float hi) {
  for (size_t i = 0; i < n; i++)
    x[i] = kc_uniform(r, lo, hi);
}

float *kc_random(kc_rng *r, size_t n, float lo, float hi) {
  float *x = kc_floats(n);
  kc_fill(r, x, n, lo, hi);
  return x;
}

float *kc_copy(const float *x, size_t n) {
  float *y = kc_floats(n);
  memcpy(y, x, n * sizeof(float));
  return y;
}

int kc_close(const char *what, const float *got, const double *want, size_t n, double atol,
             double rtol) {
  size_t worst = 0;
  double worst_excess = -INFINITY;
  for (size_t i = 0; i < n; i++) {
    double err = fabs((double)got[i] - want[i]);
    double excess = err - (atol + rtol * fabs(want[i]));
    if (!(excess <= worst_excess)) /* also catches NaN */
      worst_excess = isnan(excess) ? INFINITY : excess, worst = i;
  }
  if (n == 0 || worst_excess <= 0)
    return 0;
  fprintf(stderr, "FAIL %s: element %zu of %zu: got %.9g want %.9g (atol %g rtol %g)\n", what,
          worst, n, got[worst], want[worst], atol, rtol);
  return 1;
}
