/* Several pieces of one transfer in flight: threads made for the call (a call moves MBs, a
 * thread costs tens of microseconds), each taking the next piece until none is left; the
 * first error wins and the others stop taking pieces. Without a thread the caller does it all. */
#include "engine/base/pio.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "engine/base/tunables.h"

typedef struct pio_job {
  int fd, write;
  char *buf;
  size_t len, piece;
  uint64_t off;
  void (*fn)(void *ctx, size_t a, size_t b);
  void *ctx;
  atomic_size_t next;  /* the next piece's index */
  atomic_int rc;
} pio_job;

static int one_piece(int fd, int write, char *p, size_t len, uint64_t off) {
  while (len > 0) {
    ssize_t r = write ? pwrite(fd, p, len, (off_t)off) : pread(fd, p, len, (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -errno;
    if (r == 0) return -EIO;  /* a read past the end; a write that writes nothing */
    p += r;
    len -= (size_t)r;
    off += (uint64_t)r;
  }
  return 0;
}

static void *worker(void *arg) {
  pio_job *j = arg;
  for (;;) {
    size_t i = atomic_fetch_add(&j->next, 1), a = i * j->piece;
    if (a >= j->len || atomic_load(&j->rc) < 0) break;
    size_t b = j->len - a < j->piece ? j->len : a + j->piece;
    if (j->fn) {
      j->fn(j->ctx, a, b);
      continue;
    }
    int rc = one_piece(j->fd, j->write, j->buf + a, b - a, j->off + a);
    if (rc < 0) {
      int zero = 0;
      atomic_compare_exchange_strong(&j->rc, &zero, rc);
    }
  }
  return NULL;
}

static int run(pio_job *j) {
  size_t pieces = (j->len + j->piece - 1) / j->piece;
  int n = pieces < ZT_TUNE_PIO_THREADS ? (int)pieces : ZT_TUNE_PIO_THREADS, made = 0;
  pthread_t th[ZT_TUNE_PIO_THREADS];
  atomic_init(&j->next, 0);
  atomic_init(&j->rc, 0);
  for (int i = 1; i < n; i++, made++)
    if (pthread_create(&th[i - 1], NULL, worker, j) != 0) break;
  worker(j);
  for (int i = 0; i < made; i++) pthread_join(th[i], NULL);
  return atomic_load(&j->rc);
}

static int transfer(int fd, int write, void *buf, size_t len, uint64_t off) {
  if (len < 2 * ZT_TUNE_PIO_PIECE_BYTES) return one_piece(fd, write, buf, len, off);
  pio_job j = {.fd = fd, .write = write, .buf = buf, .len = len,
               .piece = ZT_TUNE_PIO_PIECE_BYTES, .off = off};
  return run(&j);
}

int zt_pio_pread(int fd, void *buf, size_t len, uint64_t off) {
  return transfer(fd, 0, buf, len, off);
}

int zt_pio_pwrite(int fd, const void *buf, size_t len, uint64_t off) {
  return transfer(fd, 1, (void *)buf, len, off);
}

void zt_pio_for(size_t n, size_t grain, void (*fn)(void *ctx, size_t a, size_t b), void *ctx) {
  if (grain == 0) grain = 1;
  size_t piece = (n + ZT_TUNE_PIO_THREADS - 1) / ZT_TUNE_PIO_THREADS;
  if (piece < grain) piece = grain;
  if (n <= piece) {
    if (n) fn(ctx, 0, n);
    return;
  }
  pio_job j = {.len = n, .piece = piece, .fn = fn, .ctx = ctx};
  run(&j);
}
