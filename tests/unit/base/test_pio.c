/* engine/base/pio.h: a transfer of many pieces (an odd length, an odd offset) written and read
 * back byte for byte, a read past the end -EIO, a small one done alone, and the parallel loop
 * covering every index once. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/base/pio.h"
#include "engine/base/tunables.h"

static int fails;
#define CHECK(c, ...)                                                                          \
  do {                                                                                         \
    if (!(c)) {                                                                                \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                     \
      fprintf(stderr, __VA_ARGS__);                                                            \
      fputc('\n', stderr);                                                                     \
      fails++;                                                                                 \
    }                                                                                          \
  } while (0)

static atomic_uchar *seen;
static void mark(void *ctx, size_t a, size_t b) {
  (void)ctx;
  for (size_t i = a; i < b; i++) atomic_fetch_add(&seen[i], 1);
}

int main(void) {
  char path[] = "/tmp/zt_test_pio_XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return perror("mkstemp"), 1;
  unlink(path);
  size_t len = 5 * ZT_TUNE_PIO_PIECE_BYTES + 12345, off = 777;
  unsigned char *a = malloc(len), *b = malloc(len + 16);
  for (size_t i = 0; i < len; i++) a[i] = (unsigned char)(i * 2654435761u >> 13);
  CHECK(zt_pio_pwrite(fd, a, len, off) == 0, "pwrite");
  memset(b, 0, len);
  CHECK(zt_pio_pread(fd, b, len, off) == 0, "pread");
  CHECK(memcmp(a, b, len) == 0, "read back differs");
  /* past the end: the last pieces come up short */
  CHECK(zt_pio_pread(fd, b, len, off + 16) == -EIO, "a read past the end is not -EIO");
  CHECK(zt_pio_pread(fd, b, 100, off + len - 50) == -EIO, "a small read past the end");
  CHECK(zt_pio_pread(fd, b, 100, off + 5) == 0 && memcmp(a + 5, b, 100) == 0, "a small read");
  CHECK(zt_pio_pread(-1, b, len, 0) == -EBADF, "a bad fd");
  size_t ns[] = {0, 1, 7, 1000, 1000003};
  for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
    seen = calloc(ns[k] + 1, 1);
    zt_pio_for(ns[k], 100, mark, NULL);
    for (size_t i = 0; i < ns[k]; i++)
      if (seen[i] != 1) {
        CHECK(0, "n %zu: index %zu done %d times", ns[k], i, seen[i]);
        break;
      }
    free(seen);
  }
  close(fd);
  free(a);
  free(b);
  if (!fails) printf("pio: ok\n");
  return fails != 0;
}
