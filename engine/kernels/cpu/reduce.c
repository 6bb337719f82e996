/* sum_squares: the squared L2 norm used for gradient clipping and overflow checks; sum: the
 * plain sum (the per-row losses of a micro-batch).
 *
 * The values are cut into blocks whose boundaries depend only on n; one thread sums a block in
 * double through SUM_LANES interleaved accumulators (lane i takes every SUM_LANES-th element,
 * which the compiler can vectorise and which is still one fixed order), lanes are added in
 * order, and block sums are added in block order. */
#include <math.h>
#include <stddef.h>

#include "engine/kernels/cpu/cpu.h"

#define SUM_BLOCKS 64
#define SUM_LANES 8

/* The terms: x^2 or x, widened to double. */
static inline double term(float x, int square) { return square ? (double)x * x : (double)x; }

static double block_sum(const float *x, size_t n, int square) {
  double lane[SUM_LANES] = {0};
  size_t i = 0;
  for (; i + SUM_LANES <= n; i += SUM_LANES)
    for (int l = 0; l < SUM_LANES; l++)
      lane[l] += term(x[i + l], square);
  for (; i < n; i++)
    lane[i % SUM_LANES] += term(x[i], square);
  double s = 0.0;
  for (int l = 0; l < SUM_LANES; l++)
    s += lane[l];
  return s;
}

static double blocked_sum(void *ctx, const float *x, size_t n, int square) {
  double block[SUM_BLOCKS];
  int nblocks = n < SUM_BLOCKS ? (int)n : SUM_BLOCKS;
  ZT__PARALLEL_FOR(zt__cpu_threads(ctx), n > ZT__CPU_PAR_MIN)
  for (int b = 0; b < nblocks; b++) {
    size_t i0 = n / nblocks * b + (n % nblocks < (size_t)b ? n % nblocks : (size_t)b);
    size_t len = n / nblocks + ((size_t)b < n % nblocks);
    block[b] = block_sum(x + i0, len, square);
  }
  double total = 0.0;
  for (int b = 0; b < nblocks; b++)
    total += block[b];
  return total;
}

double zt__cpu_sum(void *ctx, const float *x, size_t n) { return blocked_sum(ctx, x, n, 0); }

double zt__cpu_sum_squares(void *ctx, const float *x, size_t n, int *nonfinite) {
  double total = blocked_sum(ctx, x, n, 1);
  /* A square of a finite float cannot overflow a double (FLT_MAX^2 ~ 1e77), so the sum is
   * finite exactly when every value is. */
  if (nonfinite)
    *nonfinite = !isfinite(total);
  return total;
}
