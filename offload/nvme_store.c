/* NVMe store: extents as files, I/O through one io_uring.
 *
 * A request (one zt_nvme_read/zt_nvme_write) is cut into I/Os: its aligned body in pieces of at
 * most block_bytes, and, when its length is unaligned, a tail I/O of one full block through the
 * request's bounce block. At most queue_depth I/Os are in flight; requests wait their turn in a
 * FIFO, so a read-ahead queued first also finishes first. Every I/O is resubmitted until it has
 * moved all its bytes (short transfers happen on signals and near file limits) or fails. */
#include "offload/nvme_store.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "engine/base/log.h"
#include "engine/base/clock.h"

#define NVME_MAX_FIXED 16
#define NVME_NAME_MAX 200

typedef struct nvme_extent {
  char *path;
  int fd;
  uint64_t bytes;
} nvme_extent;

enum { REQ_FREE, REQ_ACTIVE, REQ_DONE };

typedef struct nvme_req {
  int state;
  int write;
  int ext;
  int err;           /* first error, -errno */
  int fixed;         /* index of the registered buffer holding buf, or -1 */
  int fault;         /* ZT_FAULT_NVME picked this request: its first completion is -EIO */
  uint64_t offset;
  char *buf;
  size_t len;
  size_t body;       /* aligned prefix of len moved straight to/from buf */
  size_t issued;     /* bytes of body handed to I/Os so far */
  int tail_pending;  /* the tail I/O is still to be issued */
  unsigned inflight; /* I/Os of this request in the ring */
  int next_queued;   /* FIFO of requests with I/Os left to issue */
  int next_free;
} nvme_req;

typedef struct nvme_io {
  int req;
  int tail;
  uint64_t file_off;
  char *addr;
  size_t len;
  int next_free;
} nvme_io;

struct zt_nvme_store {
  char *dir;
  zt_nvme_tunables t;
  struct io_uring ring;
  int direct;
  nvme_extent *ext;
  int n_ext, cap_ext;
  nvme_req *reqs;
  int free_req;
  int queue_head, queue_tail;
  nvme_io *ios;
  int free_io;
  unsigned inflight;
  char *bounce;         /* max_requests blocks of ZT_NVME_ALIGN bytes */
  struct iovec fixed[NVME_MAX_FIXED];
  int n_fixed;
  uint64_t busy_since;
  uint64_t fail_n;
  int fail_err;
  int fault_write;      /* ZT_FAULT_NVME: the direction counted (1 write, 0 read) */
  uint64_t fault_left;  /* requests of that direction until the faulty one; 0 disarmed */
  zt_nvme_stats stats;
  char err[512];
};

void zt_nvme_tunables_default(zt_nvme_tunables *t) {
  t->queue_depth = 32;
  t->block_bytes = 1u << 20;
  t->max_requests = 256;
  t->direct = 1;
}

static int fail(zt_nvme_store *s, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(zt_nvme_store *s, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->err, sizeof s->err, fmt, ap);
  va_end(ap);
  return rc;
}

static uint64_t align_up(uint64_t x) { return (x + ZT_NVME_ALIGN - 1) / ZT_NVME_ALIGN * ZT_NVME_ALIGN; }

int zt_nvme_buffer_alloc(size_t bytes, void **out) {
  *out = NULL;
  if (bytes == 0 || bytes > SIZE_MAX - ZT_NVME_ALIGN) return -EINVAL;
  return -posix_memalign(out, ZT_NVME_ALIGN, (size_t)align_up(bytes));
}

/* Whether files in dir accept O_DIRECT, asked of a scratch file: fcntl(F_SETFL) reports EINVAL
 * where the filesystem refuses it. */
static int probe_direct(zt_nvme_store *s) {
  size_t n = strlen(s->dir) + 32;
  char *path = malloc(n);
  int rc = 0, fd = -1;
  if (!path) return -ENOMEM;
  snprintf(path, n, "%s/.zt-nvme-probe-XXXXXX", s->dir);
  fd = mkostemp(path, O_CLOEXEC);
  if (fd < 0) {
    rc = fail(s, -errno, "%s: cannot create a file in the NVMe directory: %s", s->dir,
              strerror(errno));
    goto out;
  }
  unlink(path);
  if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_DIRECT) < 0) {
    if (errno != EINVAL) {
      rc = fail(s, -errno, "%s: fcntl(O_DIRECT): %s", s->dir, strerror(errno));
      goto out;
    }
    zt_log(ZT_LOG_WARN, "nvme", "%s refuses O_DIRECT; using buffered I/O (the page cache will "
           "hold copies of the offloaded state)", s->dir);
    s->direct = 0;
  }
out:
  if (fd >= 0) close(fd);
  free(path);
  return rc;
}

/* ZT_FAULT_NVME (nvme_store.h): "eio:read:N" or "eio:write:N", N >= 1. */
static int parse_fault(zt_nvme_store *s, const char *v) {
  const char *num = !strncmp(v, "eio:read:", 9)    ? v + 9
                    : !strncmp(v, "eio:write:", 10) ? v + 10
                                                    : NULL;
  char *end = NULL;
  unsigned long long n = 0;
  if (num && *num >= '1' && *num <= '9') {
    errno = 0;
    n = strtoull(num, &end, 10);
  }
  if (!n || errno || *end)
    return fail(s, -EINVAL, "ZT_FAULT_NVME=%s: expected eio:read:N or eio:write:N with N >= 1", v);
  s->fault_write = v[4] == 'w';
  s->fault_left = n;
  zt_log(ZT_LOG_WARN, "nvme", "%s: ZT_FAULT_NVME=%s: %s request %llu will fail with EIO (fault "
         "injection for tests)", s->dir, v, s->fault_write ? "write" : "read", n);
  return 0;
}

int zt_nvme_store_open(zt_nvme_store **out, const char *dir, const zt_nvme_tunables *t,
                       char *err, size_t errlen) {
  zt_nvme_store *s = NULL;
  struct stat st;
  int rc = 0;
  *out = NULL;
  if (err && errlen) err[0] = 0;
  s = calloc(1, sizeof *s);
  if (!s) return -ENOMEM;
  s->ring.ring_fd = -1;
  if (t)
    s->t = *t;
  else
    zt_nvme_tunables_default(&s->t);
  if (s->t.queue_depth == 0 || s->t.queue_depth > 4096 || s->t.max_requests == 0 ||
      s->t.max_requests > 65536 || s->t.block_bytes == 0 || s->t.block_bytes % ZT_NVME_ALIGN ||
      s->t.block_bytes > (1u << 30)) {
    rc = fail(s, -EINVAL, "nvme tunables out of range: queue_depth %u (1..4096), max_requests %u "
              "(1..65536), block_bytes %zu (a multiple of %u up to 1 GiB)", s->t.queue_depth,
              s->t.max_requests, s->t.block_bytes, ZT_NVME_ALIGN);
    goto out;
  }
  s->direct = s->t.direct != 0;
  s->dir = strdup(dir);
  if (!s->dir) {
    rc = -ENOMEM;
    goto out;
  }
  if (stat(dir, &st) < 0)
    rc = -errno;
  else if (!S_ISDIR(st.st_mode))
    rc = -ENOTDIR;
  if (rc < 0) {
    fail(s, rc, "%s: not a usable NVMe directory: %s", dir, strerror(-rc));
    goto out;
  }
  if (s->direct && (rc = probe_direct(s)) < 0) goto out;
  const char *fault = getenv("ZT_FAULT_NVME");
  if (fault && fault[0] && (rc = parse_fault(s, fault)) < 0) goto out;
  s->reqs = calloc(s->t.max_requests, sizeof *s->reqs);
  s->ios = calloc(s->t.queue_depth, sizeof *s->ios);
  if (!s->reqs || !s->ios ||
      posix_memalign((void **)&s->bounce, ZT_NVME_ALIGN, (size_t)s->t.max_requests * ZT_NVME_ALIGN)) {
    s->bounce = NULL;
    rc = fail(s, -ENOMEM, "nvme store: out of memory for %u requests", s->t.max_requests);
    goto out;
  }
  for (unsigned i = 0; i < s->t.max_requests; i++)
    s->reqs[i].next_free = i + 1 < s->t.max_requests ? (int)i + 1 : -1;
  for (unsigned i = 0; i < s->t.queue_depth; i++)
    s->ios[i].next_free = i + 1 < s->t.queue_depth ? (int)i + 1 : -1;
  s->free_req = 0;
  s->free_io = 0;
  s->queue_head = s->queue_tail = -1;
  rc = io_uring_queue_init(s->t.queue_depth, &s->ring, 0);
  if (rc < 0) {
    s->ring.ring_fd = -1;
    fail(s, rc, "io_uring_queue_init(%u): %s", s->t.queue_depth, strerror(-rc));
    goto out;
  }
  s->stats.direct = s->direct;
  *out = s;
  s = NULL;
out:
  if (s) {
    if (err && errlen) snprintf(err, errlen, "%s", s->err);
    zt_nvme_store_close(s);
  }
  return rc;
}

const char *zt_nvme_store_error(const zt_nvme_store *s) { return s->err; }

void zt_nvme_store_get_stats(const zt_nvme_store *s, zt_nvme_stats *out) {
  *out = s->stats;
  /* the busy time up to now of I/O still in flight: the deltas of two calls then partition the
   * time between them (a busy span is otherwise counted whole when it ends, in whichever
   * interval that falls) */
  if (s->inflight) out->busy_ns += zt_now_ns() - s->busy_since;
}

const char *zt_nvme_extent_path(const zt_nvme_store *s, int ext) {
  return ext >= 0 && ext < s->n_ext ? s->ext[ext].path : NULL;
}

void zt_nvme_store_fail_nth(zt_nvme_store *s, uint64_t n, int err) {
  s->fail_n = n;
  s->fail_err = err;
}

int zt_nvme_store_alloc(zt_nvme_store *s, const char *name, uint64_t bytes) {
  nvme_extent e = {.fd = -1, .bytes = bytes};
  size_t n;
  int rc = 0, created = 0;
  if (!name || !name[0] || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, "..") ||
      strlen(name) > NVME_NAME_MAX)
    return fail(s, -EINVAL, "nvme extent name '%s' must be 1..%d characters without '/'",
                name ? name : "(null)", NVME_NAME_MAX);
  if (bytes == 0 || bytes > (uint64_t)INT64_MAX - ZT_NVME_ALIGN)
    return fail(s, -EINVAL, "nvme extent '%s': size %llu out of range", name,
                (unsigned long long)bytes);
  if (s->n_ext == s->cap_ext) {
    int cap = s->cap_ext ? 2 * s->cap_ext : 16;
    nvme_extent *grown = realloc(s->ext, (size_t)cap * sizeof *grown);
    if (!grown) return -ENOMEM;
    s->ext = grown;
    s->cap_ext = cap;
  }
  n = strlen(s->dir) + strlen(name) + 2;
  e.path = malloc(n);
  if (!e.path) return -ENOMEM;
  snprintf(e.path, n, "%s/%s", s->dir, name);
  e.fd = open(e.path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | (s->direct ? O_DIRECT : 0), 0600);
  if (e.fd < 0) {
    rc = fail(s, -errno, "%s: cannot create extent file: %s", e.path, strerror(errno));
    goto out;
  }
  created = 1;
  /* The file is padded to whole blocks so the tail I/O of an unaligned extent stays inside it. */
  if (fallocate(e.fd, 0, 0, (off_t)align_up(bytes)) < 0) {
    if (errno != EOPNOTSUPP) {
      rc = fail(s, -errno, "%s: cannot reserve %llu bytes: %s", e.path,
                (unsigned long long)align_up(bytes), strerror(errno));
      goto out;
    }
    /* No reservation here: a full disk will show as ENOSPC on a write instead. */
    if (ftruncate(e.fd, (off_t)align_up(bytes)) < 0) {
      rc = fail(s, -errno, "%s: cannot size to %llu bytes: %s", e.path,
                (unsigned long long)align_up(bytes), strerror(errno));
      goto out;
    }
  }
  s->ext[s->n_ext] = e;
  s->stats.extents++;
  s->stats.extent_bytes += bytes;
  return s->n_ext++;
out:
  if (e.fd >= 0) close(e.fd);
  if (created) unlink(e.path);
  free(e.path);
  return rc;
}

int zt_nvme_store_register(zt_nvme_store *s, void *buf, size_t bytes) {
  int rc;
  if (((uintptr_t)buf % ZT_NVME_ALIGN) || bytes == 0)
    return fail(s, -EINVAL, "nvme register: buffer %p (%zu bytes) not %u-aligned", buf, bytes,
                ZT_NVME_ALIGN);
  if (s->n_fixed == NVME_MAX_FIXED)
    return fail(s, -ENOSPC, "nvme register: already %d buffers registered", NVME_MAX_FIXED);
  if (s->inflight || s->queue_head >= 0)
    return fail(s, -EBUSY, "nvme register: I/O in flight");
  /* The kernel's table is replaced as a whole: it cannot grow in place on older kernels. */
  if (s->n_fixed) io_uring_unregister_buffers(&s->ring);
  s->fixed[s->n_fixed].iov_base = buf;
  s->fixed[s->n_fixed].iov_len = bytes;
  rc = io_uring_register_buffers(&s->ring, s->fixed, (unsigned)s->n_fixed + 1);
  if (rc < 0) {
    fail(s, rc, "nvme register: io_uring_register_buffers (%zu bytes): %s", bytes,
         strerror(-rc));
    if (s->n_fixed && io_uring_register_buffers(&s->ring, s->fixed, (unsigned)s->n_fixed) < 0)
      s->n_fixed = 0;
    return rc;
  }
  s->n_fixed++;
  return 0;
}

static int fixed_index(const zt_nvme_store *s, const char *buf, size_t len) {
  for (int i = 0; i < s->n_fixed; i++) {
    const char *base = s->fixed[i].iov_base;
    if (buf >= base && len <= s->fixed[i].iov_len && (size_t)(buf - base) <= s->fixed[i].iov_len - len)
      return i;
  }
  return -1;
}

static void prep_io(zt_nvme_store *s, int io_idx) {
  nvme_io *io = &s->ios[io_idx];
  nvme_req *r = &s->reqs[io->req];
  struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);
  /* Never NULL: the ring has queue_depth entries and at most queue_depth I/Os exist. */
  int fixed = io->tail ? -1 : r->fixed;
  if (fixed >= 0) {
    if (r->write)
      io_uring_prep_write_fixed(sqe, s->ext[r->ext].fd, io->addr, (unsigned)io->len, io->file_off, fixed);
    else
      io_uring_prep_read_fixed(sqe, s->ext[r->ext].fd, io->addr, (unsigned)io->len, io->file_off, fixed);
    s->stats.fixed_ios++;
  } else if (r->write) {
    io_uring_prep_write(sqe, s->ext[r->ext].fd, io->addr, (unsigned)io->len, io->file_off);
  } else {
    io_uring_prep_read(sqe, s->ext[r->ext].fd, io->addr, (unsigned)io->len, io->file_off);
  }
  io_uring_sqe_set_data64(sqe, (uint64_t)io_idx);
  s->stats.ios++;
}

static void queue_pop(zt_nvme_store *s) {
  s->queue_head = s->reqs[s->queue_head].next_queued;
  if (s->queue_head < 0) s->queue_tail = -1;
}

/* Marks the request done once all its I/Os are issued and back. */
static void settle(zt_nvme_store *s, int ri) {
  nvme_req *r = &s->reqs[ri];
  if (r->inflight || r->issued < r->body || r->tail_pending) return;
  r->state = REQ_DONE;
  if (r->err) {
    s->stats.errors++;
    return;
  }
  if (r->write) {
    s->stats.bytes_written += r->len;
  } else {
    if (r->len > r->body)
      memcpy(r->buf + r->body, s->bounce + (size_t)ri * ZT_NVME_ALIGN, r->len - r->body);
    s->stats.bytes_read += r->len;
  }
}

/* Turns queued request bytes into I/Os while there is room in the ring. */
static void pump(zt_nvme_store *s) {
  while (s->free_io >= 0 && s->queue_head >= 0) {
    int ri = s->queue_head;
    nvme_req *r = &s->reqs[ri];
    int ii = s->free_io;
    nvme_io *io = &s->ios[ii];
    if (r->err) { /* a failed request issues nothing more */
      r->issued = r->body;
      r->tail_pending = 0;
      queue_pop(s);
      settle(s, ri);
      continue;
    }
    s->free_io = io->next_free;
    io->req = ri;
    if (r->issued < r->body) {
      size_t n = r->body - r->issued;
      if (n > s->t.block_bytes) n = s->t.block_bytes;
      io->tail = 0;
      io->addr = r->buf + r->issued;
      io->file_off = r->offset + r->issued;
      io->len = n;
      r->issued += n;
    } else {
      io->tail = 1;
      io->addr = s->bounce + (size_t)ri * ZT_NVME_ALIGN;
      io->file_off = r->offset + r->body;
      io->len = ZT_NVME_ALIGN;
      r->tail_pending = 0;
    }
    if (r->issued == r->body && !r->tail_pending) queue_pop(s);
    r->inflight++;
    if (s->inflight++ == 0) s->busy_since = zt_now_ns();
    prep_io(s, ii);
  }
}

static void finish_io(zt_nvme_store *s, int ii) {
  nvme_io *io = &s->ios[ii];
  io->next_free = s->free_io;
  s->free_io = ii;
  if (--s->inflight == 0) s->stats.busy_ns += zt_now_ns() - s->busy_since;
  s->reqs[io->req].inflight--;
  settle(s, io->req);
}

static void complete(zt_nvme_store *s, int ii, int res) {
  nvme_io *io = &s->ios[ii];
  nvme_req *r = &s->reqs[io->req];
  int injected = r->fault;
  if (s->fail_n && --s->fail_n == 0) res = -s->fail_err;
  if (injected) {
    r->fault = 0;
    res = -EIO;
  }
  if (res == -EAGAIN || res == -EINTR) {
    s->stats.retries++;
    prep_io(s, ii);
    return;
  }
  if (res == 0) res = -EIO; /* the file is sized to cover every I/O: no progress is a fault */
  if (res < 0) {
    if (!r->err) {
      r->err = res;
      fail(s, res, "%s: %s of %zu bytes at offset %llu failed: %s%s", s->ext[r->ext].path,
           r->write ? "write" : "read", io->len, (unsigned long long)io->file_off,
           strerror(-res), injected ? " (injected by ZT_FAULT_NVME)" : "");
    }
    finish_io(s, ii);
    return;
  }
  if ((size_t)res < io->len) {
    s->stats.short_resubmits++;
    io->addr += res;
    io->file_off += (uint64_t)res;
    io->len -= (size_t)res;
    prep_io(s, ii);
    return;
  }
  finish_io(s, ii);
}

/* Submits what is prepared, waits for at least one completion when `wait`, handles all that are
 * ready and refills the ring. */
static int reap(zt_nvme_store *s, int wait) {
  struct io_uring_cqe *cqe;
  int rc;
  if (wait) {
    do rc = io_uring_submit_and_wait(&s->ring, 1);
    while (rc == -EINTR);
  } else {
    rc = io_uring_submit(&s->ring);
  }
  if (rc < 0 && rc != -EAGAIN && rc != -EBUSY && rc != -EINTR) {
    /* EAGAIN/EBUSY: the kernel is short of resources or its completion queue is full; the
     * entries stay queued and the next call submits them once completions are reaped. */
    return fail(s, rc, "io_uring_submit: %s", strerror(-rc));
  }
  while (io_uring_peek_cqe(&s->ring, &cqe) == 0) {
    int ii = (int)io_uring_cqe_get_data64(cqe);
    int res = cqe->res;
    io_uring_cqe_seen(&s->ring, cqe);
    complete(s, ii, res);
  }
  pump(s);
  return 0;
}

static int start(zt_nvme_store *s, int write, int ext, uint64_t offset, char *buf, size_t len) {
  nvme_req *r;
  int ri;
  if (ext < 0 || ext >= s->n_ext)
    return fail(s, -EINVAL, "nvme %s: no extent %d", write ? "write" : "read", ext);
  nvme_extent *e = &s->ext[ext];
  if (len == 0 || offset > e->bytes || len > e->bytes - offset)
    return fail(s, -EINVAL, "%s: %s of %zu bytes at offset %llu is outside the extent (%llu bytes)",
                e->path, write ? "write" : "read", len, (unsigned long long)offset,
                (unsigned long long)e->bytes);
  if (offset % ZT_NVME_ALIGN || (uintptr_t)buf % ZT_NVME_ALIGN ||
      (len % ZT_NVME_ALIGN && offset + len != e->bytes))
    return fail(s, -EINVAL, "%s: %s at offset %llu, buffer %p, %zu bytes: offset and buffer must "
                "be %u-aligned, and the length too unless the range ends at the extent's end",
                e->path, write ? "write" : "read", (unsigned long long)offset, (void *)buf, len,
                ZT_NVME_ALIGN);
  if (s->free_req < 0)
    return fail(s, -EBUSY, "nvme: %u requests outstanding; wait for one first",
                s->t.max_requests);
  ri = s->free_req;
  r = &s->reqs[ri];
  s->free_req = r->next_free;
  *r = (nvme_req){.state = REQ_ACTIVE, .write = write, .ext = ext, .offset = offset, .buf = buf,
                  .len = len, .body = len / ZT_NVME_ALIGN * ZT_NVME_ALIGN, .next_queued = -1,
                  .next_free = -1};
  r->tail_pending = r->body < len;
  r->fixed = fixed_index(s, buf, r->body);
  r->fault = s->fault_left && s->fault_write == write && --s->fault_left == 0;
  if (write && r->tail_pending) {
    char *blk = s->bounce + (size_t)ri * ZT_NVME_ALIGN;
    memcpy(blk, buf + r->body, len - r->body);
    memset(blk + (len - r->body), 0, ZT_NVME_ALIGN - (len - r->body));
  }
  if (s->queue_tail >= 0)
    s->reqs[s->queue_tail].next_queued = ri;
  else
    s->queue_head = ri;
  s->queue_tail = ri;
  s->stats.requests++;
  pump(s);
  /* The request is accepted from here on: a failing submit is reported again, and to the
   * caller, by the wait that follows. */
  reap(s, 0);
  return ri;
}

int zt_nvme_read(zt_nvme_store *s, int ext, uint64_t offset, void *buf, size_t len) {
  return start(s, 0, ext, offset, buf, len);
}

int zt_nvme_write(zt_nvme_store *s, int ext, uint64_t offset, const void *buf, size_t len) {
  /* The buffer is only read from; the request keeps one pointer type for both directions. */
  return start(s, 1, ext, offset, (char *)(uintptr_t)buf, len);
}

static void release(zt_nvme_store *s, int ri) {
  s->reqs[ri].state = REQ_FREE;
  s->reqs[ri].next_free = s->free_req;
  s->free_req = ri;
}

int zt_nvme_wait(zt_nvme_store *s, int req) {
  int rc = 0;
  if (req < 0 || (unsigned)req >= s->t.max_requests || s->reqs[req].state == REQ_FREE)
    return fail(s, -EINVAL, "nvme wait: no request %d", req);
  uint64_t t0 = zt_now_ns();
  while (s->reqs[req].state != REQ_DONE)
    if ((rc = reap(s, 1)) < 0) break;
  s->stats.wait_ns += zt_now_ns() - t0;
  if (rc < 0) return rc;
  rc = s->reqs[req].err;
  release(s, req);
  return rc;
}

int zt_nvme_drain(zt_nvme_store *s) {
  int rc = 0, err = 0;
  uint64_t t0 = zt_now_ns();
  while (s->inflight || s->queue_head >= 0)
    if ((err = reap(s, 1)) < 0) break;
  s->stats.wait_ns += zt_now_ns() - t0;
  if (err < 0) return err;
  for (unsigned i = 0; i < s->t.max_requests; i++) {
    if (s->reqs[i].state != REQ_DONE) continue;
    if (!rc) rc = s->reqs[i].err;
    release(s, (int)i);
  }
  return rc;
}

void zt_nvme_store_close(zt_nvme_store *s) {
  if (!s) return;
  if (s->ring.ring_fd >= 0) {
    if (zt_nvme_drain(s) < 0 && (s->inflight || s->queue_head >= 0))
      zt_log(ZT_LOG_ERROR, "nvme", "closing with I/O in flight: %s", s->err);
    io_uring_queue_exit(&s->ring);
  }
  for (int i = 0; i < s->n_ext; i++) {
    close(s->ext[i].fd);
    if (unlink(s->ext[i].path) < 0)
      zt_log(ZT_LOG_WARN, "nvme", "%s: cannot remove: %s", s->ext[i].path, strerror(errno));
    free(s->ext[i].path);
  }
  free(s->ext);
  free(s->reqs);
  free(s->ios);
  free(s->bounce);
  free(s->dir);
  free(s);
}
