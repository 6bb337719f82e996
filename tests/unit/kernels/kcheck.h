/* Helpers shared by the kernel tests: a seeded generator, buffers, comparisons that report the
 * worst element. */
#ifndef ZT_TESTS_KERNELS_KCHECK_H
#define ZT_TESTS_KERNELS_KCHECK_H

#include <stddef.h>
#include <stdint.h>

#include "engine/kernels/ops.h"

/* xorshift64*: the same numbers on every machine. */
typedef struct kc_rng {
  uint64_t s;
} kc_rng;

void kc_seed(kc_rng *r, uint64_t seed);
float kc_uniform(kc_rng *r, float lo, float hi);
int kc_int(kc_rng *r, int n); /* [0, n) */

/* calloc that fails the test on NULL (these buffers are the test's, not the backend's). */
float *kc_floats(size_t n);
void kc_fill(kc_rng *r, float *x, size_t n, float lo, float hi);
float *kc_random(kc_rng *r, size_t n, float lo, float hi);
float *kc_copy(const float *x, size_t n);

/* |got - want| <= atol + rtol * |want| for every element; on failure prints the worst one
 * with `what` and returns 1. */
int kc_close(const char *what, const float *got, const double *want, size_t n, double atol,
             double rtol);

/* Prints "FAIL: ..." and returns 1 when cond is false. */
#define KC_EXPECT(cond, ...)                                                                   \
  ((cond) ? 0 : (fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__),                          \
                 fprintf(stderr, __VA_ARGS__), fputc('\n', stderr), 1))

#endif
