/* The one check (DESIGN.md "House style", NCCL's NCCLCHECKGOTO the model): a failed call's
 * status becomes a negative errno at the call site, logged once with the subsystem, file, line,
 * the call and the library's own text. ZT_CHECK is the goto form for calls that return 0 or a
 * negative errno (libuv, liburing, ours): on failure it stores the code in the function's `rc`
 * and jumps to its cleanup label `out`. CUDA, cuBLAS and NCCL statuses go through the converters
 * of check_cuda.h, which log through zt_check_fail too; a module that keeps its first failure
 * for a later message (the CUDA backend, a communicator) takes the logged text from them. */
#ifndef ZT_BASE_CHECK_H
#define ZT_BASE_CHECK_H

#include <stddef.h>
#include <string.h>

/* Logs "FILE:LINE: CALL: WHY" at error level under sub, copies that text into text (when not
 * NULL, textlen bytes) and returns code. */
int zt_check_fail(const char *sub, const char *file, int line, const char *call, int code,
                  const char *why, char *text, size_t textlen);

#define ZT_CHECK(sub, expr)                                                                    \
  do {                                                                                         \
    int zt__rc = (expr);                                                                       \
    if (zt__rc < 0) {                                                                          \
      rc = zt_check_fail(sub, __FILE__, __LINE__, #expr, zt__rc, strerror(-zt__rc), NULL, 0);  \
      goto out;                                                                                \
    }                                                                                          \
  } while (0)

#endif
