/* The NVMe tier against the disk itself (issue 5: the store moves >= 90% of what a raw io_uring
 * O_DIRECT loop moves, measured in the same run on the same directory).
 *
 *   bench_nvme [DIR] [--size BYTES] [--unit BYTES] [--inflight N] [--reps N]
 *
 * DIR (default: the current directory) gets one scratch file, then a scratch directory of
 * extents, each removed before the other is made (so the disk needs SIZE free, not twice it).
 * BYTES take a K, M or G suffix (powers of 1024) and must be multiples of 4096.
 *   raw:   one file of SIZE written then read sequentially by a minimal io_uring loop, O_DIRECT,
 *          with the store's default queue depth and block size (zt_nvme_tunables_default);
 *   store: the same bytes as extents of UNIT bytes (default 120 MiB, about one GPT-2 1.5B layer's
 *          fp32 master, m or v) through zt_nvme_store with its defaults, written then read
 *          with INFLIGHT requests outstanding (default 6: the offloaded step's two sets of
 *          master, m and v, one set read ahead while the other is in use).
 * The two sides alternate order from one repetition to the next, so a drive that slows as it
 * fills does not favour one side; the ratios are given from the best of each side and as the
 * median of each repetition's pair (steadier on a disk whose speed drifts). Every block carries
 * a stamp written with it and checked when read back: wrong data fails the run (exit 1). Prints
 * GB/s (1e9 bytes/s) and the ratios store/raw, then one JSON line. Exits 77 where io_uring is
 * forbidden or DIR refuses O_DIRECT (there would be nothing to compare against). SIGINT and
 * SIGTERM remove the scratch files before exiting. */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "offload/nvme_store.h"

#define STAMP_STRIDE (1u << 20) /* one stamp per MiB of data */
#define SKIP 77
#define MAX_REPS 100

typedef struct opts {
  const char *dir;
  uint64_t size, unit;
  unsigned inflight, reps;
} opts;

typedef struct result {
  double write_gbs, read_gbs;
} result;

/* What a signal handler must remove: the store's directory and its extent files (the raw file
 * is unlinked as soon as it is open). Set before the files exist. */
static char *volatile cleanup_dir;
static char **volatile cleanup_files;
static volatile unsigned cleanup_n;

static void on_signal(int sig) {
  char **files = cleanup_files;
  for (unsigned i = 0; files && i < cleanup_n; i++) unlink(files[i]);
  if (cleanup_dir) rmdir(cleanup_dir);
  _exit(128 + sig);
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The stamp of the MiB at byte `pos` of stream `id` (raw: 0; store: unit index + 1). */
static uint64_t stamp(uint64_t id, uint64_t pos) {
  return ((id << 48) ^ pos) * 0x9E3779B97F4A7C15ull | 1;
}

static void put_stamps(char *buf, size_t len, uint64_t id, uint64_t pos) {
  for (size_t o = 0; o < len; o += STAMP_STRIDE) {
    uint64_t v = stamp(id, pos + o);
    memcpy(buf + o, &v, sizeof v);
  }
}

static void clear_stamps(char *buf, size_t len) {
  for (size_t o = 0; o < len; o += STAMP_STRIDE) memset(buf + o, 0, sizeof(uint64_t));
}

/* -EILSEQ naming the first wrong stamp, or 0. */
static int check_stamps(const char *buf, size_t len, uint64_t id, uint64_t pos, const char *what) {
  for (size_t o = 0; o < len; o += STAMP_STRIDE) {
    uint64_t v;
    memcpy(&v, buf + o, sizeof v);
    if (v != stamp(id, pos + o)) {
      fprintf(stderr, "bench_nvme: %s: wrong data read back at byte %llu\n", what,
              (unsigned long long)(pos + o));
      return -EILSEQ;
    }
  }
  return 0;
}

static void fill_pattern(char *buf, size_t len, uint64_t seed) {
  uint64_t x = seed | 1;
  for (size_t i = 0; i + 8 <= len; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* not zeros: no drive gets to compress them */
    memcpy(buf + i, &x, 8);
  }
}

static int parse_bytes(const char *name, const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  unsigned shift = 0;
  if (*end == 'K' || *end == 'k') shift = 10, end++;
  else if (*end == 'M' || *end == 'm') shift = 20, end++;
  else if (*end == 'G' || *end == 'g') shift = 30, end++;
  if (errno || end == s || *end || s[0] == '-' || v == 0 || v > (UINT64_MAX >> shift) ||
      (v << shift) % ZT_NVME_ALIGN) {
    fprintf(stderr, "bench_nvme: %s '%s': expected a positive multiple of %u bytes, e.g. 4G, "
            "120M\n", name, s, ZT_NVME_ALIGN);
    return -EINVAL;
  }
  *out = (uint64_t)v << shift;
  return 0;
}

static int parse_count(const char *name, const char *s, unsigned max, unsigned *out) {
  char *end;
  errno = 0;
  unsigned long v = strtoul(s, &end, 10);
  if (errno || end == s || *end || s[0] == '-' || v == 0 || v > max) {
    fprintf(stderr, "bench_nvme: %s '%s': expected 1..%u\n", name, s, max);
    return -EINVAL;
  }
  *out = (unsigned)v;
  return 0;
}

static int parse_args(int argc, char **argv, opts *o) {
  *o = (opts){.dir = ".", .size = 4ull << 30, .unit = 120ull << 20, .inflight = 6, .reps = 1};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int rc;
    if (a[0] != '-') {
      o->dir = a;
      continue;
    }
    if (!v) {
      fprintf(stderr, "bench_nvme: %s needs a value\n", a);
      return -EINVAL;
    }
    if (!strcmp(a, "--size")) rc = parse_bytes(a, v, &o->size);
    else if (!strcmp(a, "--unit")) rc = parse_bytes(a, v, &o->unit);
    else if (!strcmp(a, "--inflight")) rc = parse_count(a, v, 256, &o->inflight);
    else if (!strcmp(a, "--reps")) rc = parse_count(a, v, MAX_REPS, &o->reps);
    else {
      fprintf(stderr, "bench_nvme: unknown option %s\nusage: bench_nvme [DIR] [--size BYTES] "
              "[--unit BYTES] [--inflight N] [--reps N]\n", a);
      return -EINVAL;
    }
    if (rc < 0) return rc;
    i++;
  }
  if (o->unit > o->size) o->unit = o->size;
  if (o->unit > SIZE_MAX / o->inflight) {
    fprintf(stderr, "bench_nvme: --unit %llu x --inflight %u does not fit in memory\n",
            (unsigned long long)o->unit, o->inflight);
    return -EINVAL;
  }
  return 0;
}

static const char *fs_name(long type) {
  switch ((unsigned long)type) {
  case 0xEF53: return "ext4";
  case 0x58465342: return "xfs";
  case 0x9123683E: return "btrfs";
  case 0xF2F52010: return "f2fs";
  case 0x2FC12FC1: return "zfs";
  case 0x01021994: return "tmpfs";
  case 0x794C7630: return "overlayfs";
  case 0x65735546: return "fuse";
  case 0x01021997: return "9p";
  case 0x6969: return "nfs";
  default: return "other";
  }
}

/* ---- raw: the disk through the plainest io_uring loop ---------------------------------------- */

typedef struct raw_slot {
  uint64_t off;  /* where this I/O's block starts */
  size_t done;   /* bytes of it moved so far (short transfers resubmit the rest) */
  size_t len;
} raw_slot;

static void raw_prep(struct io_uring *ring, int fd, int write, char *buf, raw_slot *sl, size_t bs,
                     unsigned i) {
  struct io_uring_sqe *sqe = io_uring_get_sqe(ring); /* never NULL: one entry per slot */
  char *addr = buf + (size_t)i * bs + sl[i].done;
  if (write)
    io_uring_prep_write(sqe, fd, addr, (unsigned)(sl[i].len - sl[i].done), sl[i].off + sl[i].done);
  else
    io_uring_prep_read(sqe, fd, addr, (unsigned)(sl[i].len - sl[i].done), sl[i].off + sl[i].done);
  io_uring_sqe_set_data64(sqe, i);
}

/* One sequential pass over [0, size) with qd blocks of bs bytes in flight. */
static int raw_pass(struct io_uring *ring, int fd, int write, char *buf, raw_slot *sl, unsigned qd,
                    size_t bs, uint64_t size, const char *path) {
  uint64_t next = 0;
  unsigned busy = 0;
  for (unsigned i = 0; i < qd && next < size; i++, busy++) {
    sl[i] = (raw_slot){.off = next, .len = size - next < bs ? (size_t)(size - next) : bs};
    if (write) put_stamps(buf + (size_t)i * bs, sl[i].len, 0, next);
    else clear_stamps(buf + (size_t)i * bs, sl[i].len);
    raw_prep(ring, fd, write, buf, sl, bs, i);
    next += sl[i].len;
  }
  while (busy) {
    struct io_uring_cqe *cqe;
    int rc = io_uring_submit_and_wait(ring, 1);
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
      fprintf(stderr, "bench_nvme: %s: io_uring_submit: %s\n", path, strerror(-rc));
      return rc;
    }
    while (io_uring_peek_cqe(ring, &cqe) == 0) {
      unsigned i = (unsigned)io_uring_cqe_get_data64(cqe);
      int res = cqe->res;
      io_uring_cqe_seen(ring, cqe);
      if (res == -EAGAIN || res == -EINTR) {
        raw_prep(ring, fd, write, buf, sl, bs, i);
        continue;
      }
      if (res <= 0) {
        res = res ? res : -EIO;
        fprintf(stderr, "bench_nvme: %s: raw %s of %zu bytes at offset %llu failed: %s\n", path,
                write ? "write" : "read", sl[i].len - sl[i].done,
                (unsigned long long)(sl[i].off + sl[i].done), strerror(-res));
        return res;
      }
      sl[i].done += (size_t)res;
      if (sl[i].done < sl[i].len) {
        raw_prep(ring, fd, write, buf, sl, bs, i);
        continue;
      }
      if (!write && (rc = check_stamps(buf + (size_t)i * bs, sl[i].len, 0, sl[i].off, path)) < 0)
        return rc;
      if (next == size) {
        busy--;
        continue;
      }
      sl[i] = (raw_slot){.off = next, .len = size - next < bs ? (size_t)(size - next) : bs};
      if (write) put_stamps(buf + (size_t)i * bs, sl[i].len, 0, next);
      else clear_stamps(buf + (size_t)i * bs, sl[i].len);
      raw_prep(ring, fd, write, buf, sl, bs, i);
      next += sl[i].len;
    }
  }
  return 0;
}

/* Reserves the file's space up front like zt_nvme_store_alloc, so a full disk shows here and
 * both sides write into reserved blocks. */
static int reserve(int fd, uint64_t size, const char *path) {
  if (fallocate(fd, 0, 0, (off_t)size) == 0) return 0;
  if (errno == EOPNOTSUPP && ftruncate(fd, (off_t)size) == 0) return 0;
  int rc = -errno;
  fprintf(stderr, "bench_nvme: %s: cannot reserve %llu bytes: %s%s\n", path,
          (unsigned long long)size, strerror(-rc),
          rc == -ENOSPC ? " (the disk is full: free space or pass a smaller --size)" : "");
  return rc;
}

static int bench_raw(const opts *o, const zt_nvme_tunables *t, result *r) {
  struct io_uring ring;
  size_t n = strlen(o->dir) + 40;
  char *path = malloc(n), *buf = NULL;
  raw_slot *sl = calloc(t->queue_depth, sizeof *sl);
  int fd = -1, rc, ring_up = 0;
  size_t buf_bytes = (size_t)t->queue_depth * t->block_bytes;
  if (!path || !sl || zt_nvme_buffer_alloc(buf_bytes, (void **)&buf)) {
    rc = -ENOMEM;
    fprintf(stderr, "bench_nvme: out of memory for the raw loop's buffers\n");
    goto out;
  }
  fill_pattern(buf, buf_bytes, 7);
  snprintf(path, n, "%s/.zt-bench-nvme-raw.%ld", o->dir, (long)getpid());
  fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT, 0600);
  if (fd < 0) {
    rc = -errno;
    if (rc == -EINVAL)
      fprintf(stderr, "bench_nvme: %s refuses O_DIRECT: nothing to measure the store against "
              "here; give a directory on a local disk\n", o->dir);
    else
      fprintf(stderr, "bench_nvme: %s: cannot create the raw file: %s\n", path, strerror(-rc));
    if (rc == -EINVAL) rc = SKIP;
    goto out;
  }
  unlink(path); /* no file left behind, whatever happens next */
  if ((rc = reserve(fd, o->size, path)) < 0) goto out;
  rc = io_uring_queue_init(t->queue_depth, &ring, 0);
  if (rc < 0) {
    fprintf(stderr, "bench_nvme: io_uring_queue_init(%u): %s%s\n", t->queue_depth, strerror(-rc),
            rc == -ENOSYS || rc == -EPERM ? ": io_uring is forbidden here (kernel or sandbox); "
            "skipping" : "");
    if (rc == -ENOSYS || rc == -EPERM) rc = SKIP;
    goto out;
  }
  ring_up = 1;
  double t0 = now();
  if ((rc = raw_pass(&ring, fd, 1, buf, sl, t->queue_depth, t->block_bytes, o->size, path)) < 0)
    goto out;
  double t1 = now();
  if ((rc = raw_pass(&ring, fd, 0, buf, sl, t->queue_depth, t->block_bytes, o->size, path)) < 0)
    goto out;
  double t2 = now();
  r->write_gbs = (double)o->size / (t1 - t0) / 1e9;
  r->read_gbs = (double)o->size / (t2 - t1) / 1e9;
out:
  if (ring_up) io_uring_queue_exit(&ring);
  if (fd >= 0) close(fd);
  free(buf);
  free(sl);
  free(path);
  return rc;
}

/* ---- the store, used the way the offloaded step uses it -------------------------------------- */

static int store_fail(zt_nvme_store *s, const char *what, int rc) {
  fprintf(stderr, "bench_nvme: store %s: %s%s\n", what, zt_nvme_store_error(s),
          rc == -ENOSPC ? " (the disk is full: free space or pass a smaller --size)" : "");
  return rc;
}

static int store_oom(const opts *o) {
  fprintf(stderr, "bench_nvme: out of memory for the store's %u buffers of %llu bytes\n",
          o->inflight, (unsigned long long)o->unit);
  return -ENOMEM;
}

static uint64_t unit_len(const opts *o, unsigned u) {
  uint64_t off = (uint64_t)u * o->unit;
  return o->size - off < o->unit ? o->size - off : o->unit;
}

/* Writes (write 1) or reads every unit in order, o->inflight requests outstanding: unit u goes
 * through buffer u % inflight, whose previous request is waited for first. Reads check each
 * unit's stamps as it arrives, the moment the step would start using it. On a failure the
 * requests still out are left to zt_nvme_store_close, which waits for them. */
static int store_pass(zt_nvme_store *s, const opts *o, int write, const int *ext, unsigned units,
                      char **buf, int *req) {
  int rc = 0;
  for (unsigned u = 0; u < units + o->inflight && rc == 0; u++) {
    if (u >= o->inflight) { /* the unit issued inflight units ago */
      unsigned w = u - o->inflight;
      if (w < units) {
        int k = (int)(w % o->inflight);
        if ((rc = zt_nvme_wait(s, req[k])) < 0) return store_fail(s, write ? "write" : "read", rc);
        if (!write)
          rc = check_stamps(buf[k], unit_len(o, w), w + 1, 0, zt_nvme_extent_path(s, ext[w]));
      }
    }
    if (u < units && rc == 0) {
      int k = (int)(u % o->inflight);
      size_t len = (size_t)unit_len(o, u);
      if (write) put_stamps(buf[k], len, u + 1, 0);
      else clear_stamps(buf[k], len);
      rc = write ? zt_nvme_write(s, ext[u], 0, buf[k], len)
                 : zt_nvme_read(s, ext[u], 0, buf[k], len);
      if (rc < 0) return store_fail(s, write ? "write" : "read", rc);
      req[k] = rc;
      rc = 0;
    }
  }
  return rc;
}

static int bench_store(const opts *o, result *r) {
  unsigned units = (unsigned)((o->size + o->unit - 1) / o->unit);
  size_t n = strlen(o->dir) + 40;
  char err[512], *dir = malloc(n), **buf = calloc(o->inflight, sizeof *buf);
  char **files = calloc(units, sizeof *files);
  int *ext = calloc(units, sizeof *ext), *req = calloc(o->inflight, sizeof *req), rc = 0;
  zt_nvme_store *s = NULL;
  zt_nvme_stats st;
  if (!dir || !buf || !files || !ext || !req) {
    rc = store_oom(o);
    goto out;
  }
  for (unsigned k = 0; k < o->inflight; k++) {
    if (zt_nvme_buffer_alloc((size_t)o->unit, (void **)&buf[k])) {
      rc = store_oom(o);
      goto out;
    }
    fill_pattern(buf[k], (size_t)o->unit, k + 11);
  }
  snprintf(dir, n, "%s/zt-bench-nvme.XXXXXX", o->dir);
  for (unsigned u = 0; u < units; u++) {
    if (!(files[u] = malloc(strlen(dir) + 16))) {
      rc = store_oom(o);
      goto out;
    }
  }
  if (!mkdtemp(dir)) {
    rc = -errno;
    fprintf(stderr, "bench_nvme: %s: cannot create a directory for the store: %s\n", dir,
            strerror(-rc));
    goto out;
  }
  for (unsigned u = 0; u < units; u++) snprintf(files[u], strlen(dir) + 16, "%s/u%u", dir, u);
  cleanup_files = files;
  cleanup_n = units;
  cleanup_dir = dir;
  if ((rc = zt_nvme_store_open(&s, dir, NULL, err, sizeof err)) < 0) {
    fprintf(stderr, "bench_nvme: zt_nvme_store_open: %s%s\n", err,
            rc == -ENOSYS || rc == -EPERM ? ": io_uring is forbidden here (kernel or sandbox); "
            "skipping" : "");
    if (rc == -ENOSYS || rc == -EPERM) rc = SKIP;
    goto out;
  }
  zt_nvme_store_get_stats(s, &st);
  if (!st.direct) {
    fprintf(stderr, "bench_nvme: %s refuses O_DIRECT: nothing to measure the store against here; "
            "give a directory on a local disk\n", o->dir);
    rc = SKIP;
    goto out;
  }
  for (unsigned u = 0; u < units; u++) {
    if ((rc = zt_nvme_store_alloc(s, files[u] + strlen(dir) + 1, unit_len(o, u))) < 0) {
      rc = store_fail(s, "alloc", rc);
      goto out;
    }
    ext[u] = rc;
    rc = 0;
  }
  double t0 = now();
  if ((rc = store_pass(s, o, 1, ext, units, buf, req)) < 0) goto out;
  double t1 = now();
  if ((rc = store_pass(s, o, 0, ext, units, buf, req)) < 0) goto out;
  double t2 = now();
  r->write_gbs = (double)o->size / (t1 - t0) / 1e9;
  r->read_gbs = (double)o->size / (t2 - t1) / 1e9;
  zt_nvme_store_get_stats(s, &st);
  if (st.bytes_read != o->size || st.bytes_written != o->size) {
    fprintf(stderr, "bench_nvme: the store counted %llu bytes read and %llu written, expected "
            "%llu each\n", (unsigned long long)st.bytes_read, (unsigned long long)st.bytes_written,
            (unsigned long long)o->size);
    rc = -EIO;
  }
out:
  zt_nvme_store_close(s); /* removes the extent files */
  if (cleanup_dir && rmdir(dir) < 0)
    fprintf(stderr, "bench_nvme: %s: cannot remove: %s\n", dir, strerror(errno));
  cleanup_dir = NULL;
  cleanup_n = 0;
  cleanup_files = NULL;
  for (unsigned k = 0; buf && k < o->inflight; k++) free(buf[k]);
  for (unsigned u = 0; files && u < units; u++) free(files[u]);
  free(buf);
  free(files);
  free(ext);
  free(req);
  free(dir);
  return rc;
}

static void keep_best(result *best, const result *r) {
  if (r->write_gbs > best->write_gbs) best->write_gbs = r->write_gbs;
  if (r->read_gbs > best->read_gbs) best->read_gbs = r->read_gbs;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *x, unsigned n) {
  qsort(x, n, sizeof *x, cmp_double);
  return n % 2 ? x[n / 2] : (x[n / 2 - 1] + x[n / 2]) / 2;
}

static void json_str(const char *s) {
  putchar('"');
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') printf("\\%c", *s);
    else if ((unsigned char)*s < 0x20) printf("\\u%04x", *s);
    else putchar(*s);
  }
  putchar('"');
}

int main(int argc, char **argv) {
  opts o;
  zt_nvme_tunables t;
  struct statvfs vfs;
  struct statfs fs;
  struct stat st;
  result raw[MAX_REPS], store[MAX_REPS];
  char real[PATH_MAX];
  struct sigaction sa = {.sa_handler = on_signal};
  int rc = 0;
  if (parse_args(argc, argv, &o) < 0) return 2;
  zt_nvme_tunables_default(&t);
  if (!realpath(o.dir, real) || stat(real, &st) < 0 || statvfs(real, &vfs) < 0 ||
      statfs(real, &fs) < 0 || (!S_ISDIR(st.st_mode) && (errno = ENOTDIR))) {
    fprintf(stderr, "bench_nvme: %s: not a usable directory: %s\n", o.dir, strerror(errno));
    return 1;
  }
  o.dir = real;
  uint64_t free_bytes = (uint64_t)vfs.f_bavail * vfs.f_frsize;
  if (free_bytes < o.size + (64u << 20)) {
    fprintf(stderr, "bench_nvme: %s has %.2f GiB free; the benchmark writes %.2f GiB there (and "
            "keeps 64 MiB spare): pass a smaller --size\n", o.dir, (double)free_bytes / (1 << 30),
            (double)o.size / (1 << 30));
    return 1;
  }
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGXFSZ, SIG_IGN); /* a file-size limit then fails the write with EFBIG, named */
  printf("bench_nvme: %s (%s), %.2f GiB, store units of %.1f MiB with %u requests in flight; "
         "queue depth %u, blocks of %zu KiB on both sides; %u repetitions\n", o.dir,
         fs_name(fs.f_type), (double)o.size / (1 << 30), (double)o.unit / (1 << 20), o.inflight,
         t.queue_depth, t.block_bytes >> 10, o.reps);
  fflush(stdout);
  for (unsigned rep = 0; rep < o.reps && rc == 0; rep++) {
    for (int side = 0; side < 2 && rc == 0; side++) {
      int is_raw = (side + (int)rep) % 2 == 0;
      result *r = is_raw ? &raw[rep] : &store[rep];
      if ((rc = is_raw ? bench_raw(&o, &t, r) : bench_store(&o, r)) != 0) break;
      printf("  rep %u %-5s write %6.2f GB/s  read %6.2f GB/s\n", rep + 1, is_raw ? "raw" : "store",
             r->write_gbs, r->read_gbs);
      fflush(stdout);
    }
  }
  if (rc == SKIP) return SKIP;
  if (rc) return 1;
  /* best of each side, and the median of the ratios of the two sides measured back to back
   * (steadier where the disk's speed drifts between repetitions) */
  result best_raw = {0}, best_store = {0}, med;
  double wr[MAX_REPS], rr[MAX_REPS];
  for (unsigned i = 0; i < o.reps; i++) {
    keep_best(&best_raw, &raw[i]);
    keep_best(&best_store, &store[i]);
    wr[i] = store[i].write_gbs / raw[i].write_gbs;
    rr[i] = store[i].read_gbs / raw[i].read_gbs;
  }
  med = (result){median(wr, o.reps), median(rr, o.reps)};
  double w = best_store.write_gbs / best_raw.write_gbs, r = best_store.read_gbs / best_raw.read_gbs;
  printf("  write: store %.2f GB/s, raw %.2f GB/s (best of each): %.3f of raw; median of the "
         "paired ratios %.3f (target 0.90)\n", best_store.write_gbs, best_raw.write_gbs, w,
         med.write_gbs);
  printf("  read:  store %.2f GB/s, raw %.2f GB/s (best of each): %.3f of raw; median of the "
         "paired ratios %.3f (target 0.90)\n", best_store.read_gbs, best_raw.read_gbs, r,
         med.read_gbs);
  printf("{\"bench\": \"nvme\", \"dir\": ");
  json_str(o.dir);
  printf(", \"fs\": \"%s\", \"bytes\": %llu, \"unit_bytes\": %llu, \"inflight\": %u, "
         "\"queue_depth\": %u, \"block_bytes\": %zu, \"reps\": %u, \"raw_write_gbs\": %.3f, "
         "\"raw_read_gbs\": %.3f, \"store_write_gbs\": %.3f, \"store_read_gbs\": %.3f, "
         "\"write_ratio\": %.4f, \"read_ratio\": %.4f, \"write_ratio_median\": %.4f, "
         "\"read_ratio_median\": %.4f, \"target\": 0.9}\n", fs_name(fs.f_type),
         (unsigned long long)o.size, (unsigned long long)o.unit, o.inflight, t.queue_depth,
         t.block_bytes, o.reps, best_raw.write_gbs, best_raw.read_gbs, best_store.write_gbs,
         best_store.read_gbs, w, r, med.write_gbs, med.read_gbs);
  return 0;
}
