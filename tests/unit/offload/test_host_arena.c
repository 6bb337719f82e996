/* Host arena: page-exact accounting against the limit, peak, -ENOMEM with the numbers, frees,
 * the allocator seam, and the fallback to unpinned memory when mlock is refused (a child
 * process with a tiny RLIMIT_MEMLOCK and, when run as root, without CAP_IPC_LOCK). */
#include <errno.h>
#include <linux/capability.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "offload/host_arena.h"
#include "tests/unit/offload/otest.h"

static void test_accounting(void) {
  size_t ps = (size_t)sysconf(_SC_PAGESIZE);
  size_t limit = 64 * ps;
  zt_host_arena *a;
  zt_host_arena_stats st;
  void *p1, *p2, *p3, *p4;
  OT_CHECK(zt_host_arena_open(&a, limit, NULL) == 0, "open");
  OT_CHECK(zt_host_arena_alloc(a, 1000, &p1) == 0, "alloc 1000: %s", zt_host_arena_error(a));
  OT_CHECK((uintptr_t)p1 % ps == 0, "not page-aligned");
  memset(p1, 0xab, 1000);
  /* 5 pages + 1 byte takes 6 pages, not the 8 a power-of-two allocator would */
  OT_CHECK(zt_host_arena_alloc(a, 5 * ps + 1, &p2) == 0, "alloc: %s", zt_host_arena_error(a));
  OT_CHECK(zt_host_arena_footprint(5 * ps + 1) == 6 * ps, "footprint %zu", zt_host_arena_footprint(5 * ps + 1));
  zt_host_arena_get_stats(a, &st);
  OT_CHECK(st.used == 7 * ps && st.requested == 1000 + 5 * ps + 1 && st.allocs == 2,
           "used %zu requested %zu allocs %llu", st.used, st.requested, (unsigned long long)st.allocs);
  OT_CHECK(st.pinned_bytes + st.unpinned_bytes == st.used, "pinned %zu + unpinned %zu != used %zu",
           st.pinned_bytes, st.unpinned_bytes, st.used);
  printf("accounting: %zu pinned, %zu unpinned\n", st.pinned_bytes, st.unpinned_bytes);

  /* the limit: exactly filling it works, one byte more does not */
  OT_CHECK(zt_host_arena_alloc(a, limit - 7 * ps, &p3) == 0, "fill to the limit: %s", zt_host_arena_error(a));
  int rc = zt_host_arena_alloc(a, 1, &p4);
  OT_CHECK(rc == -ENOMEM && p4 == NULL, "alloc past the limit: %d", rc);
  char want[64];
  snprintf(want, sizeof want, "of %zu in use", limit);
  OT_CHECK(strstr(zt_host_arena_error(a), want), "message lacks the numbers: %s", zt_host_arena_error(a));
  printf("limit: %s\n", zt_host_arena_error(a));

  OT_CHECK(zt_host_arena_free(a, p3) == 0, "free");
  OT_CHECK(zt_host_arena_free(a, p3) == -EINVAL, "double free accepted");
  OT_CHECK(zt_host_arena_free(a, (char *)p1 + 8) == -EINVAL, "interior pointer accepted");
  OT_CHECK(zt_host_arena_alloc(a, 0, &p4) == -EINVAL, "zero bytes accepted");
  zt_host_arena_get_stats(a, &st);
  OT_CHECK(st.used == 7 * ps && st.peak == limit, "used %zu peak %zu", st.used, st.peak);
  OT_CHECK(((unsigned char *)p1)[999] == 0xab, "memory changed under a live allocation");
  zt_host_arena_close(a); /* frees p1 and p2: ASan/LSan would see a leak otherwise */
}

/* The seam: an arena over another allocator uses it for every byte. */
static int fake_allocs, fake_frees;
static int fake_alloc(void *ctx, size_t bytes, void **out, int *pin_err) {
  *out = aligned_alloc(4096, bytes);
  *pin_err = -EPERM; /* as if pinning were refused */
  fake_allocs++;
  return *out ? 0 : -ENOMEM;
}
static void fake_free(void *ctx, void *p, size_t bytes, int pinned) {
  fake_frees++;
  free(p);
}

static void test_seam(void) {
  const zt_host_mem_ops ops = {.name = "fake", .alloc = fake_alloc, .free = fake_free};
  zt_host_arena *a;
  zt_host_arena_stats st;
  void *p;
  OT_CHECK(zt_host_arena_open(&a, 1 << 20, &ops) == 0, "open");
  OT_CHECK(zt_host_arena_alloc(a, 10000, &p) == 0, "alloc");
  zt_host_arena_get_stats(a, &st);
  OT_CHECK(st.unpinned_bytes == zt_host_arena_footprint(10000) && st.pinned_bytes == 0 &&
           st.pin_failures == 1, "unpinned %zu pinned %zu failures %llu", st.unpinned_bytes,
           st.pinned_bytes, (unsigned long long)st.pin_failures);
  zt_host_arena_close(a);
  OT_CHECK(fake_allocs == 1 && fake_frees == 1, "allocs %d frees %d", fake_allocs, fake_frees);
}

/* Drops CAP_IPC_LOCK from the effective set (it lets root lock without limit). */
static int drop_ipc_lock(void) {
  struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
  struct __user_cap_data_struct d[2];
  if (syscall(SYS_capget, &h, d) < 0) return -errno;
  d[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
  if (syscall(SYS_capset, &h, d) < 0) return -errno;
  return 0;
}

static void test_pin_fallback(void) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    struct rlimit rl = {.rlim_cur = 16 * ps, .rlim_max = 16 * ps};
    zt_host_arena *a;
    zt_host_arena_stats st;
    void *small, *big;
    int rc = drop_ipc_lock();
    if (rc < 0 || setrlimit(RLIMIT_MEMLOCK, &rl) < 0) {
      printf("pin fallback skipped: cannot limit locking here (%s)\n", strerror(rc < 0 ? -rc : errno));
      fflush(stdout);
      _exit(77);
    }
    OT_CHECK(zt_host_arena_open(&a, 64 << 20, NULL) == 0, "open");
    OT_CHECK(zt_host_arena_alloc(a, 4 * ps, &small) == 0, "small alloc: %s", zt_host_arena_error(a));
    OT_CHECK(zt_host_arena_alloc(a, 1 << 20, &big) == 0, "big alloc: %s", zt_host_arena_error(a));
    memset(big, 1, 1 << 20);
    zt_host_arena_get_stats(a, &st);
    OT_CHECK(st.pinned_bytes == 4 * ps, "pinned %zu, want %zu", st.pinned_bytes, 4 * ps);
    OT_CHECK(st.unpinned_bytes == (1 << 20) && st.pin_failures == 1, "unpinned %zu failures %llu",
             st.unpinned_bytes, (unsigned long long)st.pin_failures);
    zt_host_arena_close(a);
    fflush(stdout);
    _exit(ot_failures ? 1 : 0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  OT_CHECK(WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 77),
           "pin fallback child: status %d", status);
}

/* The contract the open relies on to skip its zeroing passes: a fresh allocation is zero, also
 * after a freed one was written over (its pages go back to the kernel), huge-page advice or not, and where several threads faulted its pages in.
 * Stats are the same as without the advice. */
static void test_fresh_is_zero(size_t bytes) {
  size_t ps = (size_t)sysconf(_SC_PAGESIZE);
  zt_host_arena *a;
  zt_host_arena_stats st;
  unsigned char *p;
  OT_CHECK(zt_host_arena_open(&a, 4 * bytes, NULL) == 0, "open");
  for (int round = 0; round < 2; round++) {
    OT_CHECK(zt_host_arena_alloc(a, bytes + 1, (void **)&p) == 0, "alloc: %s", zt_host_arena_error(a));
    size_t nz = 0;
    for (size_t i = 0; i < bytes + 1; i++) nz += p[i] != 0;
    OT_CHECK(nz == 0, "round %d: %zu non-zero bytes in a fresh allocation", round, nz);
    zt_host_arena_get_stats(a, &st);
    OT_CHECK(st.used == bytes + ps && st.requested == bytes + 1 && st.allocs == 1 &&
             st.pinned_bytes + st.unpinned_bytes == st.used, "stats");
    memset(p, 0xcd, bytes + 1);
    OT_CHECK(zt_host_arena_free(a, p) == 0, "free");
  }
  zt_host_arena_close(a);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  test_accounting();
  test_seam();
  test_pin_fallback();
  test_fresh_is_zero((size_t)8 << 20);
  test_fresh_is_zero((size_t)300 << 20); /* past zt_host_mem_prepare's split: faulted in by a thread a core */
  if (ot_failures) fprintf(stderr, "%d failures\n", ot_failures);
  return ot_failures ? 1 : 0;
}
