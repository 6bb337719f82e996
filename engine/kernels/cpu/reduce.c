/* sum_squares: the squared L2 norm used for gradient clipping and overflow checks.
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

static double block_sum_squares(const float *x, size_t n) {
  double lane[SUM_LANES] = {0};
  size_t i = 0;
  for (; i + SUM_LANES <= n; i += SUM_LANES)
    for (int l = 0; l < SUM_LANES; l++)
      lane[l] += (double)x[i + l] * x[i + l];
  for (; i < n; i++)
    lane[i % SUM_LANES] += (double)x[i] * x[i];
  double s = 0.0;
  for (int l = 0; l < SUM_LANES; l++)
    s += lane[l];
  return s;
}

double zt__cpu_sum_squares(void *ctx, const float *x, size_t n, int *nonfinite) {
  double block[SUM_BLOCKS];
  int nblocks = n < SUM_BLOCKS ? (int)n : SUM_BLOCKS;
  ZT__PARALLEL_FOR(zt__cpu_threads(ctx), n > ZT__CPU_PAR_MIN)
  for (int b = 0; b < nblocks; b++) {
    size_t i0 = n / nblocks * b + (n % nblocks < (size_t)b ? n % nblocks : (size_t)b);
    size_t len = n / nblocks + ((size_t)b < n % nblocks);
    block[b] = block_sum_squares(x + i0, len);
  }
  double total = 0.0;
  for (int b = 0; b < nblocks; b++)
    total += block[b];
  /* A square of a finite float cannot overflow a double (FLT_MAX^2 ~ 1e77), so the sum is
   * finite exactly when every value is. */
  if (nonfinite)
    *nonfinite = !isfinite(total);
  return total;
}
