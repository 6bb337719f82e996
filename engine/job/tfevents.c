#include "engine/job/tfevents.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/base/crc32c.h"

/* An Event is small: its tags are ours, a handful of scalars. */
#define EVENT_MAX 4096

typedef struct pb {
  uint8_t b[EVENT_MAX];
  size_t n;
  int overflow;
} pb;

static void put(pb *p, const void *src, size_t len) {
  if (p->n + len > sizeof p->b) {
    p->overflow = 1;
    return;
  }
  memcpy(p->b + p->n, src, len);
  p->n += len;
}

static void varint(pb *p, uint64_t v) {
  uint8_t t[10];
  size_t k = 0;
  do {
    t[k++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
    v >>= 7;
  } while (v);
  put(p, t, k);
}

/* field numbers with their wire types: 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32 */
static void key(pb *p, int field, int wire) { varint(p, (uint64_t)field << 3 | (uint64_t)wire); }

static void fixed64(pb *p, int field, uint64_t v) {
  uint8_t t[8];
  for (int i = 0; i < 8; i++) t[i] = (uint8_t)(v >> (8 * i));
  key(p, field, 1);
  put(p, t, 8);
}

static void fixed32(pb *p, int field, uint32_t v) {
  uint8_t t[4];
  for (int i = 0; i < 4; i++) t[i] = (uint8_t)(v >> (8 * i));
  key(p, field, 5);
  put(p, t, 4);
}

static void bytes(pb *p, int field, const void *src, size_t len) {
  key(p, field, 2);
  varint(p, len);
  put(p, src, len);
}

/* Event.wall_time = 1 (double), Event.step = 2 (int64) */
static void event_head(pb *p, double wall_time, int64_t step) {
  uint64_t bits;
  memcpy(&bits, &wall_time, sizeof bits);
  fixed64(p, 1, bits);
  key(p, 2, 0);
  varint(p, (uint64_t)step);
}

static uint32_t masked_crc(const void *data, size_t len) {
  uint32_t c = zt_crc32c(0, data, len);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static void le32(uint8_t *o, uint32_t v) {
  for (int i = 0; i < 4; i++) o[i] = (uint8_t)(v >> (8 * i));
}

/* One record in one write: a reader never sees half of it unless the disk fills mid-way. */
static int write_record(zt__tfevents *w, const pb *ev, char *err, size_t errlen) {
  if (ev->overflow) {
    snprintf(err, errlen, "%s: an event longer than %d bytes", w->path, EVENT_MAX);
    return -EOVERFLOW;
  }
  uint8_t rec[12 + EVENT_MAX + 4];
  uint64_t len = ev->n;
  for (int i = 0; i < 8; i++) rec[i] = (uint8_t)(len >> (8 * i));
  le32(rec + 8, masked_crc(rec, 8));
  memcpy(rec + 12, ev->b, ev->n);
  le32(rec + 12 + ev->n, masked_crc(ev->b, ev->n));
  size_t total = 16 + ev->n, off = 0;
  while (off < total) {
    ssize_t k = write(w->fd, rec + off, total - off);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) {
      snprintf(err, errlen, "%s: %s", w->path, strerror(errno));
      return -errno;
    }
    off += (size_t)k;
  }
  return 0;
}

int zt__tfevents_open(zt__tfevents *w, const char *dir, double wall_time, char *err,
                      size_t errlen) {
  char host[128] = "localhost";
  gethostname(host, sizeof host - 1);
  host[strcspn(host, "/")] = '\0';
  w->fd = -1;
  if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
    snprintf(err, errlen, "%s: %s", dir, strerror(errno));
    return -errno;
  }
  /* a run that starts again within the same second gets a file of its own */
  for (int k = 0; k < 100 && w->fd < 0; k++) {
    int n = k ? snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%010lld.%s.%d", dir,
                         (long long)wall_time, host, k)
              : snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%010lld.%s", dir,
                         (long long)wall_time, host);
    if (n < 0 || (size_t)n >= sizeof w->path) {
      snprintf(err, errlen, "%s: %s", dir, strerror(ENAMETOOLONG));
      return -ENAMETOOLONG;
    }
    w->fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (w->fd < 0 && errno != EEXIST) {
      snprintf(err, errlen, "%s: %s", w->path, strerror(errno));
      return -errno;
    }
  }
  if (w->fd < 0) {
    snprintf(err, errlen, "%s: %s", w->path, strerror(EEXIST));
    return -EEXIST;
  }
  pb ev = {0};
  event_head(&ev, wall_time, 0);
  bytes(&ev, 3, "brain.Event:2", 13); /* Event.file_version */
  int rc = write_record(w, &ev, err, errlen);
  if (rc < 0) zt__tfevents_close(w);
  return rc;
}

int zt__tfevents_start(zt__tfevents *w, int64_t step, double wall_time, char *err, size_t errlen) {
  pb ev = {0}, log = {0};
  key(&log, 1, 0); /* SessionLog.status = START (1) */
  varint(&log, 1);
  event_head(&ev, wall_time, step);
  bytes(&ev, 7, log.b, log.n); /* Event.session_log */
  return write_record(w, &ev, err, errlen);
}

int zt__tfevents_scalars(zt__tfevents *w, int64_t step, double wall_time, const char *const *tags,
                         const float *values, int n, char *err, size_t errlen) {
  pb ev = {0}, summary = {0};
  for (int i = 0; i < n; i++) {
    pb value = {0};
    bytes(&value, 1, tags[i], strlen(tags[i])); /* Summary.Value.tag */
    uint32_t bits;
    memcpy(&bits, &values[i], sizeof bits);
    fixed32(&value, 2, bits); /* Summary.Value.simple_value */
    bytes(&summary, 1, value.b, value.n); /* Summary.value */
    summary.overflow |= value.overflow;
  }
  event_head(&ev, wall_time, step);
  bytes(&ev, 5, summary.b, summary.n); /* Event.summary */
  ev.overflow |= summary.overflow;
  return write_record(w, &ev, err, errlen);
}

int zt__tfevents_sync(zt__tfevents *w, char *err, size_t errlen) {
  if (w->fd >= 0 && fsync(w->fd) < 0) {
    snprintf(err, errlen, "%s: fsync: %s", w->path, strerror(errno));
    return -errno;
  }
  return 0;
}

void zt__tfevents_close(zt__tfevents *w) {
  if (w->fd >= 0) close(w->fd);
  w->fd = -1;
}
