/* The assertion of the proto tests: report file, line and expression, count failures. */
#ifndef ZT_TEST_CHECK_H
#define ZT_TEST_CHECK_H

#include <stdio.h>

static int g_failures;

#define CHECK(cond)                                                                            \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);                 \
      g_failures++;                                                                            \
    }                                                                                          \
  } while (0)

#define TEST_DONE() (g_failures ? (fprintf(stderr, "%d check(s) failed\n", g_failures), 1) : 0)

#endif
