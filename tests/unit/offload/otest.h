/* Shared by the offload tests: a check that records a failure and goes on (so one run reports
 * every broken property), and a seeded generator. */
#ifndef ZT_TESTS_OFFLOAD_OTEST_H
#define ZT_TESTS_OFFLOAD_OTEST_H

#include <stdint.h>
#include <stdio.h>

static int ot_failures;

#define OT_CHECK(cond, ...)                                                                    \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                          \
      fprintf(stderr, __VA_ARGS__);                                                            \
      fputc('\n', stderr);                                                                     \
      ot_failures++;                                                                           \
    }                                                                                          \
  } while (0)

/* xorshift64*: the same numbers on every machine. */
static inline uint64_t ot_next(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 0x2545F4914F6CDD1DULL;
}

#endif
