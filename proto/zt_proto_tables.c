/* The data tables of the protocol: operation names and errno names on the wire. */
#include "proto/zt_proto.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const struct {
  const char *name;
  const char *summary;
} g_ops[ZT_OP__COUNT] = {
    [ZT_OP_UNKNOWN] = {"unknown", "not an operation"},
#define ZT_X(n, NAME, sum) [ZT_OP_##NAME] = {#n, sum},
    ZT_PROTO_OPS(ZT_X)
#undef ZT_X
};

const char *zt_proto_op_name(zt_proto_op op) {
  if ((int)op <= ZT_OP_UNKNOWN || op >= ZT_OP__COUNT) return g_ops[ZT_OP_UNKNOWN].name;
  return g_ops[op].name;
}

const char *zt_proto_op_summary(zt_proto_op op) {
  if ((int)op <= ZT_OP_UNKNOWN || op >= ZT_OP__COUNT) return g_ops[ZT_OP_UNKNOWN].summary;
  return g_ops[op].summary;
}

zt_proto_op zt_proto_op_lookup(const char *name, size_t len) {
  for (int i = ZT_OP_UNKNOWN + 1; i < ZT_OP__COUNT; i++) {
    if (strlen(g_ops[i].name) == len && memcmp(g_ops[i].name, name, len) == 0)
      return (zt_proto_op)i;
  }
  return ZT_OP_UNKNOWN;
}

/* Only codes a daemon or client can meaningfully report; aliases (EWOULDBLOCK, EOPNOTSUPP) are
 * left out so that the name of a number is unique. */
#define ZT_ERRNOS(X)                                                                           \
  X(EINVAL) X(ENOENT) X(EPROTO) X(EMSGSIZE) X(EBUSY) X(EACCES) X(ENOSPC) X(ENOMEM)             \
  X(ECANCELED) X(EEXIST) X(ENOTSUP) X(EAGAIN) X(EIO) X(EPERM) X(ECONNREFUSED) X(ECONNRESET)    \
  X(ETIMEDOUT) X(EROFS) X(ENOTDIR) X(EISDIR) X(EFBIG) X(EOVERFLOW) X(ENAMETOOLONG)            \
  X(ESHUTDOWN) X(EPIPE) X(ENOTCONN) X(ECONNABORTED) X(EHOSTUNREACH) X(ENETUNREACH)             \
  X(EADDRINUSE) X(EADDRNOTAVAIL) X(ENOSYS) X(ERANGE) X(EDOM) X(E2BIG) X(EBADF) X(EFAULT)       \
  X(EINTR) X(ENXIO) X(ENODEV) X(EMFILE) X(ENFILE) X(EDQUOT) X(ENOTEMPTY) X(ELOOP) X(EXDEV)     \
  X(ENODATA) X(EBADMSG) X(EILSEQ) X(EDEADLK) X(ENOBUFS) X(ETXTBSY) X(ESTALE)

static const struct {
  int num;
  const char *name;
} g_errnos[] = {
#define ZT_E(e) {e, #e},
    ZT_ERRNOS(ZT_E)
#undef ZT_E
};

const char *zt_proto_errname(int neg_errno) {
  for (size_t i = 0; i < sizeof g_errnos / sizeof g_errnos[0]; i++)
    if (g_errnos[i].num == -neg_errno) return g_errnos[i].name;
  return "EIO";
}

int zt_proto_errnum(const char *name, size_t len) {
  for (size_t i = 0; i < sizeof g_errnos / sizeof g_errnos[0]; i++) {
    if (strlen(g_errnos[i].name) == len && memcmp(g_errnos[i].name, name, len) == 0)
      return -g_errnos[i].num;
  }
  return -EIO;
}

int zt_proto_error_set(zt_proto_error *err, int code, const char *fmt, ...) {
  if (err) {
    va_list ap;
    va_start(ap, fmt);
    err->code = code;
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
  }
  return code;
}
