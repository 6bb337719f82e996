/* NVMe store on a real io_uring over a temporary directory: patterns written and read back with
 * many requests in flight, ranges and unaligned tails, registered buffers, buffered mode,
 * counters, and every error path (bad ranges, EBUSY, EEXIST, EFBIG from RLIMIT_FSIZE with the
 * short write before it, ENOSPC on a small tmpfs where one can be mounted, injected EIO and
 * EAGAIN, ZT_FAULT_NVME). Each I/O error's message must name the file. */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "offload/nvme_store.h"
#include "tests/unit/offload/otest.h"

static char tmpdir[256];

static unsigned char pattern(int ext, uint64_t i) { return (unsigned char)(ext * 131 + i * 7 + (i >> 9)); }

static void *abuf(size_t bytes) {
  void *p = NULL;
  if (posix_memalign(&p, ZT_NVME_ALIGN, bytes ? bytes : 1)) abort();
  return p;
}

static void fill(unsigned char *b, int ext, uint64_t off, size_t len) {
  for (size_t i = 0; i < len; i++) b[i] = pattern(ext, off + i);
}

static size_t first_mismatch(const unsigned char *b, int ext, uint64_t off, size_t len) {
  for (size_t i = 0; i < len; i++)
    if (b[i] != pattern(ext, off + i)) return i;
  return SIZE_MAX;
}

/* Opens a store; exits 77 where io_uring is forbidden. */
static zt_nvme_store *open_store(const char *dir, const zt_nvme_tunables *t) {
  zt_nvme_store *s;
  char err[512];
  int rc = zt_nvme_store_open(&s, dir, t, err, sizeof err);
  if (rc == -ENOSYS || rc == -EPERM) {
    printf("SKIP: io_uring unavailable here: %s\n", err);
    exit(77);
  }
  OT_CHECK(rc == 0, "open %s: %d %s", dir, rc, err);
  if (rc) exit(1);
  return s;
}

static void test_roundtrip(int direct) {
  static const uint64_t sizes[] = {100, 4096, 4097, 3 * 4096 + 17, 65536, (1 << 20) + 1000,
                                   (1 << 20), 5000, 200000, 12288};
  enum { N = sizeof sizes / sizeof sizes[0] };
  zt_nvme_tunables t;
  zt_nvme_stats st;
  unsigned char *w[N], *r[N];
  int ext[N], req[N], rc;
  uint64_t total = 0;
  zt_nvme_tunables_default(&t);
  t.queue_depth = 8;
  t.block_bytes = 64 << 10; /* several I/Os per request, more I/Os than ring entries */
  t.direct = direct;
  zt_nvme_store *s = open_store(tmpdir, &t);
  zt_nvme_store_get_stats(s, &st);
  printf("roundtrip: %s I/O\n", st.direct ? "O_DIRECT" : "buffered");
  if (!direct) OT_CHECK(st.direct == 0, "buffered store reports direct");
  for (int i = 0; i < N; i++) {
    char name[32];
    snprintf(name, sizeof name, "ext%d", i);
    ext[i] = zt_nvme_store_alloc(s, name, sizes[i]);
    OT_CHECK(ext[i] == i, "alloc %s: %d %s", name, ext[i], zt_nvme_store_error(s));
    w[i] = abuf(sizes[i]);
    r[i] = abuf(sizes[i]);
    fill(w[i], i, 0, sizes[i]);
    memset(r[i], 0xee, sizes[i]);
    total += sizes[i];
  }
  for (int i = 0; i < N; i++) {
    req[i] = zt_nvme_write(s, ext[i], 0, w[i], sizes[i]);
    OT_CHECK(req[i] >= 0, "write %d: %d %s", i, req[i], zt_nvme_store_error(s));
  }
  rc = zt_nvme_drain(s);
  OT_CHECK(rc == 0, "drain writes: %d %s", rc, zt_nvme_store_error(s));
  for (int i = 0; i < N; i++) {
    req[i] = zt_nvme_read(s, ext[i], 0, r[i], sizes[i]);
    OT_CHECK(req[i] >= 0, "read %d: %d %s", i, req[i], zt_nvme_store_error(s));
  }
  for (int i = N - 1; i >= 0; i--) { /* waited out of order on purpose */
    rc = zt_nvme_wait(s, req[i]);
    OT_CHECK(rc == 0, "wait read %d: %d %s", i, rc, zt_nvme_store_error(s));
    size_t bad = first_mismatch(r[i], i, 0, sizes[i]);
    OT_CHECK(bad == SIZE_MAX, "extent %d (%llu bytes) differs at byte %zu", i,
             (unsigned long long)sizes[i], bad);
  }
  OT_CHECK(zt_nvme_wait(s, req[0]) == -EINVAL, "a waited request must be released");

  /* Ranges: an aligned middle piece, and the unaligned tail read into a buffer of exactly its
   * length (ASan catches any write past it). */
  {
    unsigned char *mid = abuf(8192);
    int q = zt_nvme_read(s, ext[5], 8192, mid, 8192);
    OT_CHECK(q >= 0 && zt_nvme_wait(s, q) == 0, "middle read: %s", zt_nvme_store_error(s));
    OT_CHECK(first_mismatch(mid, 5, 8192, 8192) == SIZE_MAX, "middle range differs");
    free(mid);
    uint64_t off = (1 << 20);
    size_t len = 1000;
    unsigned char *tail = abuf(len);
    q = zt_nvme_read(s, ext[5], off, tail, len);
    OT_CHECK(q >= 0 && zt_nvme_wait(s, q) == 0, "tail read: %s", zt_nvme_store_error(s));
    OT_CHECK(first_mismatch(tail, 5, off, len) == SIZE_MAX, "tail range differs");
    /* Overwrite just the tail, then check the block before it is intact. */
    for (size_t i = 0; i < len; i++) tail[i] = (unsigned char)~pattern(5, off + i);
    q = zt_nvme_write(s, ext[5], off, tail, len);
    OT_CHECK(q >= 0 && zt_nvme_wait(s, q) == 0, "tail write: %s", zt_nvme_store_error(s));
    memset(r[5], 0, sizes[5]);
    q = zt_nvme_read(s, ext[5], 0, r[5], sizes[5]);
    OT_CHECK(q >= 0 && zt_nvme_wait(s, q) == 0, "reread: %s", zt_nvme_store_error(s));
    OT_CHECK(first_mismatch(r[5], 5, 0, off) == SIZE_MAX, "body changed by a tail write");
    int tail_ok = 1;
    for (size_t i = 0; i < len; i++) tail_ok &= r[5][off + i] == (unsigned char)~pattern(5, off + i);
    OT_CHECK(tail_ok, "tail write not read back");
    free(tail);
    total += 8192 + 1000 + sizes[5]; /* read */
  }

  /* Misuse is refused before any I/O. */
  OT_CHECK(zt_nvme_read(s, ext[4], 100, r[4], 4096) == -EINVAL, "unaligned offset accepted");
  OT_CHECK(zt_nvme_read(s, ext[4], 0, r[4] + 1, 4096) == -EINVAL, "unaligned buffer accepted");
  OT_CHECK(zt_nvme_read(s, ext[4], 0, r[4], 5000) == -EINVAL, "unaligned non-tail length accepted");
  OT_CHECK(zt_nvme_read(s, ext[4], 61440, r[4], 8192) == -EINVAL, "range past the end accepted");
  OT_CHECK(zt_nvme_read(s, 99, 0, r[4], 4096) == -EINVAL, "bad extent accepted");
  OT_CHECK(zt_nvme_store_alloc(s, "ext0", 10) == -EEXIST, "existing name accepted");
  OT_CHECK(strstr(zt_nvme_store_error(s), "/ext0"), "EEXIST message: %s", zt_nvme_store_error(s));
  OT_CHECK(zt_nvme_store_alloc(s, "a/b", 10) == -EINVAL, "name with '/' accepted");

  zt_nvme_store_get_stats(s, &st);
  uint64_t written = 0;
  for (int i = 0; i < N; i++) written += sizes[i];
  OT_CHECK(st.bytes_written == written + 1000, "bytes_written %llu, want %llu",
           (unsigned long long)st.bytes_written, (unsigned long long)written + 1000);
  OT_CHECK(st.bytes_read == total, "bytes_read %llu, want %llu", (unsigned long long)st.bytes_read,
           (unsigned long long)total);
  OT_CHECK(st.requests == 2 * N + 4, "requests %llu, want %d", (unsigned long long)st.requests,
           2 * N + 4);
  OT_CHECK(st.ios > st.requests, "ios %llu: requests must be split into blocks",
           (unsigned long long)st.ios);
  OT_CHECK(st.extents == N && st.extent_bytes == written, "extents %llu / %llu bytes",
           (unsigned long long)st.extents, (unsigned long long)st.extent_bytes);
  OT_CHECK(st.errors == 0 && st.busy_ns > 0, "errors %llu busy %llu",
           (unsigned long long)st.errors, (unsigned long long)st.busy_ns);

  char *paths[N];
  for (int i = 0; i < N; i++) paths[i] = strdup(zt_nvme_extent_path(s, ext[i]));
  zt_nvme_store_close(s);
  for (int i = 0; i < N; i++) {
    struct stat sb;
    OT_CHECK(stat(paths[i], &sb) < 0 && errno == ENOENT, "%s left behind by close", paths[i]);
    free(paths[i]);
    free(w[i]);
    free(r[i]);
  }
}

/* Registered staging buffer: I/O inside it goes through the fixed-buffer opcodes. */
static void test_registered(void) {
  zt_nvme_stats st;
  size_t len = 256 << 10;
  unsigned char *stage;
  OT_CHECK(zt_nvme_buffer_alloc(len, (void **)&stage) == 0, "buffer alloc");
  zt_nvme_store *s = open_store(tmpdir, NULL);
  int e = zt_nvme_store_alloc(s, "fixed", len);
  int rc = zt_nvme_store_register(s, stage, len);
  OT_CHECK(rc == 0, "register: %d %s", rc, zt_nvme_store_error(s));
  fill(stage, 7, 0, len);
  int q = zt_nvme_write(s, e, 0, stage, len);
  OT_CHECK(q >= 0 && zt_nvme_wait(s, q) == 0, "fixed write: %s", zt_nvme_store_error(s));
  memset(stage, 0, len);
  q = zt_nvme_read(s, e, 0, stage, len);
  OT_CHECK(q >= 0 && zt_nvme_wait(s, q) == 0, "fixed read: %s", zt_nvme_store_error(s));
  OT_CHECK(first_mismatch(stage, 7, 0, len) == SIZE_MAX, "fixed-buffer roundtrip differs");
  zt_nvme_store_get_stats(s, &st);
  OT_CHECK(rc < 0 || st.fixed_ios == st.ios, "fixed_ios %llu of %llu", (unsigned long long)st.fixed_ios,
           (unsigned long long)st.ios);
  OT_CHECK(zt_nvme_store_register(s, stage + 1, 4096) == -EINVAL, "unaligned registration accepted");
  zt_nvme_store_close(s);
  free(stage);
}

/* max_requests outstanding: the next one is refused until one is waited for. */
static void test_busy(void) {
  zt_nvme_tunables t;
  zt_nvme_tunables_default(&t);
  t.max_requests = 4;
  zt_nvme_store *s = open_store(tmpdir, &t);
  unsigned char *b = abuf(4096);
  fill(b, 1, 0, 4096);
  int e = zt_nvme_store_alloc(s, "busy", 4 * 4096);
  int q[4];
  for (int i = 0; i < 4; i++) q[i] = zt_nvme_write(s, e, (uint64_t)i * 4096, b, 4096);
  OT_CHECK(zt_nvme_write(s, e, 0, b, 4096) == -EBUSY, "fifth request accepted");
  OT_CHECK(zt_nvme_wait(s, q[2]) == 0, "wait: %s", zt_nvme_store_error(s));
  int q5 = zt_nvme_read(s, e, 0, b, 4096);
  OT_CHECK(q5 >= 0, "request after a wait: %d", q5);
  OT_CHECK(zt_nvme_drain(s) == 0, "drain: %s", zt_nvme_store_error(s));
  zt_nvme_store_close(s);
  free(b);
}

/* Injected faults: EAGAIN/EINTR are retried invisibly, EIO fails exactly its request. */
static void test_injected(void) {
  zt_nvme_stats st;
  zt_nvme_store *s = open_store(tmpdir, NULL);
  unsigned char *b = abuf(4096);
  int e[4], q[4], failed = 0;
  fill(b, 2, 0, 4096);
  for (int i = 0; i < 4; i++) {
    char name[16];
    snprintf(name, sizeof name, "inj%d", i);
    e[i] = zt_nvme_store_alloc(s, name, 4096);
  }
  zt_nvme_store_fail_nth(s, 1, EAGAIN);
  q[0] = zt_nvme_write(s, e[0], 0, b, 4096);
  OT_CHECK(zt_nvme_wait(s, q[0]) == 0, "EAGAIN not retried: %s", zt_nvme_store_error(s));
  zt_nvme_store_fail_nth(s, 1, EINTR);
  q[0] = zt_nvme_write(s, e[0], 0, b, 4096);
  OT_CHECK(zt_nvme_wait(s, q[0]) == 0, "EINTR not retried: %s", zt_nvme_store_error(s));
  zt_nvme_store_get_stats(s, &st);
  OT_CHECK(st.retries == 2, "retries %llu", (unsigned long long)st.retries);

  zt_nvme_store_fail_nth(s, 3, EIO);
  for (int i = 0; i < 4; i++) q[i] = zt_nvme_write(s, e[i], 0, b, 4096);
  for (int i = 0; i < 4; i++) {
    int rc = zt_nvme_wait(s, q[i]);
    if (rc == 0) continue;
    failed++;
    OT_CHECK(rc == -EIO, "injected fault gave %d", rc);
    OT_CHECK(strstr(zt_nvme_store_error(s), zt_nvme_extent_path(s, e[i])),
             "EIO message does not name %s: %s", zt_nvme_extent_path(s, e[i]),
             zt_nvme_store_error(s));
  }
  OT_CHECK(failed == 1, "%d requests failed, want 1", failed);
  zt_nvme_store_get_stats(s, &st);
  OT_CHECK(st.errors == 1, "errors %llu", (unsigned long long)st.errors);
  /* The store keeps working after a failed request. */
  q[0] = zt_nvme_read(s, e[1], 0, b, 4096);
  OT_CHECK(zt_nvme_wait(s, q[0]) == 0 && first_mismatch(b, 2, 0, 4096) == SIZE_MAX,
           "read after a fault");
  zt_nvme_store_close(s);
  free(b);
}

/* ZT_FAULT_NVME: the Nth request of one direction fails with EIO naming the file and the
 * injection, the other direction and the requests around it do not; bad values fail the open. */
static void test_env_fault(void) {
  static const char *const bad[] = {"eio:read:0",  "eio:read:",      "eio:write:-1",
                                    "eio:write:2x", "eio:reads:1",    "enospc:write:1",
                                    "eio:write:99999999999999999999"};
  unsigned char *b = abuf(8192);
  char err[512];
  fill(b, 4, 0, 8192);
  for (int dir = 0; dir < 2; dir++) {
    setenv("ZT_FAULT_NVME", dir ? "eio:write:3" : "eio:read:2", 1);
    zt_nvme_store *s = open_store(tmpdir, NULL);
    int e = zt_nvme_store_alloc(s, "envfault", 8192);
    int rc[4];
    /* a direction's request count starts at the open: 4 of the faulty kind, the other kind
     * between them */
    for (int i = 0; i < 4; i++) {
      int q = dir ? zt_nvme_write(s, e, 0, b, 8192) : zt_nvme_read(s, e, 0, b, 8192);
      rc[i] = q < 0 ? q : zt_nvme_wait(s, q);
      if (rc[i] == -EIO) {
        OT_CHECK(strstr(zt_nvme_store_error(s), zt_nvme_extent_path(s, e)) &&
                     strstr(zt_nvme_store_error(s), "Input/output error") &&
                     strstr(zt_nvme_store_error(s), "ZT_FAULT_NVME"),
                 "injected EIO message: %s", zt_nvme_store_error(s));
        printf("env fault: %s\n", zt_nvme_store_error(s));
      }
      q = dir ? zt_nvme_read(s, e, 0, b, 8192) : zt_nvme_write(s, e, 0, b, 8192);
      OT_CHECK(q >= 0 && zt_nvme_wait(s, q) == 0, "the other direction failed: %s",
               zt_nvme_store_error(s));
    }
    int want = dir ? 2 : 1;
    for (int i = 0; i < 4; i++)
      OT_CHECK(rc[i] == (i == want ? -EIO : 0), "%s request %d: %d, want %d",
               dir ? "write" : "read", i + 1, rc[i], i == want ? -EIO : 0);
    zt_nvme_stats st;
    zt_nvme_store_get_stats(s, &st);
    OT_CHECK(st.errors == 1, "errors %llu", (unsigned long long)st.errors);
    zt_nvme_store_close(s);
  }
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    zt_nvme_store *s = NULL;
    setenv("ZT_FAULT_NVME", bad[i], 1);
    int rc = zt_nvme_store_open(&s, tmpdir, NULL, err, sizeof err);
    OT_CHECK(rc == -EINVAL && !s && strstr(err, "ZT_FAULT_NVME") && strstr(err, bad[i]),
             "ZT_FAULT_NVME=%s: open gave %d: %s", bad[i], rc, err);
    zt_nvme_store_close(s);
  }
  setenv("ZT_FAULT_NVME", "", 1); /* empty: no fault */
  zt_nvme_store *s = open_store(tmpdir, NULL);
  int e = zt_nvme_store_alloc(s, "envnone", 8192);
  for (int i = 0; i < 3; i++) {
    int q = zt_nvme_write(s, e, 0, b, 8192);
    OT_CHECK(q >= 0 && zt_nvme_wait(s, q) == 0, "write with ZT_FAULT_NVME empty: %s",
             zt_nvme_store_error(s));
  }
  zt_nvme_store_close(s);
  unsetenv("ZT_FAULT_NVME");
  free(b);
}

/* RLIMIT_FSIZE: an extent past the limit fails at alloc (fallocate: EFBIG); a write crossing
 * the limit into an extent made before it is cut short by the kernel, resubmitted, then fails
 * with EFBIG. SIGXFSZ is ignored so the error comes back as a return value. */
static void test_fsize(void) {
  struct rlimit old, lim;
  zt_nvme_stats st;
  zt_nvme_store *s = open_store(tmpdir, NULL);
  size_t len = 256 << 10;
  unsigned char *b = abuf(len);
  fill(b, 3, 0, len);
  int e = zt_nvme_store_alloc(s, "fsize", len);
  signal(SIGXFSZ, SIG_IGN);
  getrlimit(RLIMIT_FSIZE, &old);
  lim = old;
  lim.rlim_cur = 64 << 10;
  OT_CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0, "setrlimit: %s", strerror(errno));
  int rc = zt_nvme_store_alloc(s, "toobig", 1 << 20);
  OT_CHECK(rc == -EFBIG, "alloc past RLIMIT_FSIZE: %d", rc);
  OT_CHECK(strstr(zt_nvme_store_error(s), "/toobig"), "EFBIG alloc message: %s", zt_nvme_store_error(s));
  int q = zt_nvme_write(s, e, 0, b, len);
  rc = q < 0 ? q : zt_nvme_wait(s, q);
  setrlimit(RLIMIT_FSIZE, &old);
  OT_CHECK(rc == -EFBIG, "write past RLIMIT_FSIZE: %d %s", rc, zt_nvme_store_error(s));
  OT_CHECK(strstr(zt_nvme_store_error(s), zt_nvme_extent_path(s, e)), "EFBIG message: %s",
           zt_nvme_store_error(s));
  zt_nvme_store_get_stats(s, &st);
  OT_CHECK(st.short_resubmits >= 1, "no short write resubmitted (%llu)",
           (unsigned long long)st.short_resubmits);
  printf("fsize: %s\n", zt_nvme_store_error(s));
  zt_nvme_store_close(s);
  free(b);
}

static int write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  int rc = fputs(text, f) < 0 ? -1 : 0;
  return fclose(f) < 0 ? -1 : rc;
}

/* A mount namespace of our own: directly as root, else inside a user namespace where we are
 * root (mapped to our real ids, so the files we create have an owner). */
static int private_mounts(void) {
  char map[64];
  unsigned uid = getuid(), gid = getgid();
  if (unshare(CLONE_NEWNS) == 0) return 0;
  if (unshare(CLONE_NEWUSER | CLONE_NEWNS) < 0) return -1;
  snprintf(map, sizeof map, "0 %u 1", uid);
  if (write_file("/proc/self/uid_map", map) < 0) return -1;
  if (write_file("/proc/self/setgroups", "deny") < 0) return -1;
  snprintf(map, sizeof map, "0 %u 1", gid);
  return write_file("/proc/self/gid_map", map);
}

/* A full filesystem: a 64 KiB tmpfs in a private mount namespace (child process; skipped where
 * mounting is not allowed). The reservation at alloc must report ENOSPC naming the file. */
static void test_enospc(void) {
  pid_t pid = fork();
  if (pid == 0) {
    char dir[300];
    snprintf(dir, sizeof dir, "%s/small", tmpdir);
    if (mkdir(dir, 0700) < 0) _exit(1);
    if (private_mounts() < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
        mount("tmpfs", dir, "tmpfs", 0, "size=64k") < 0) {
      printf("ENOSPC case skipped: cannot mount a small tmpfs here: %s\n", strerror(errno));
      rmdir(dir);
      fflush(stdout);
      _exit(77);
    }
    zt_nvme_store *s = open_store(dir, NULL);
    zt_nvme_stats st;
    zt_nvme_store_get_stats(s, &st);
    int rc = zt_nvme_store_alloc(s, "full", 1 << 20);
    OT_CHECK(rc == -ENOSPC, "alloc on a full tmpfs: %d", rc);
    OT_CHECK(strstr(zt_nvme_store_error(s), "/small/full"), "ENOSPC message: %s", zt_nvme_store_error(s));
    printf("enospc (tmpfs, %s): %s\n", st.direct ? "O_DIRECT" : "buffered", zt_nvme_store_error(s));
    zt_nvme_store_close(s);
    umount(dir);
    rmdir(dir);
    fflush(stdout);
    _exit(ot_failures ? 1 : 0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  OT_CHECK(WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 77),
           "ENOSPC child: status %d", status);
}

int main(void) {
  unsetenv("ZT_FAULT_NVME"); /* the faults here are the test's own */
  const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  setvbuf(stdout, NULL, _IOLBF, 0); /* test_enospc forks: nothing may sit in the buffer */
  snprintf(tmpdir, sizeof tmpdir, "%s/zt-nvme-XXXXXX", base);
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 1;
  }
  test_roundtrip(1);
  test_roundtrip(0);
  test_registered();
  test_busy();
  test_injected();
  test_env_fault();
  test_fsize();
  test_enospc();
  OT_CHECK(rmdir(tmpdir) == 0, "%s not empty after every store closed: %s", tmpdir, strerror(errno));
  if (ot_failures) fprintf(stderr, "%d failures\n", ot_failures);
  return ot_failures ? 1 : 0;
}
