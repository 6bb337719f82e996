/* One client connection: reads bytes into the frame reader, hands whole frames to dispatch, and
 * queues reply and event frames for writing.
 *
 * Memory is bounded per connection. Reading: the frame reader allocates at most the announced
 * (checked) body; bytes read past a frame while reading is paused wait in a stash no larger than
 * one read. Writing: a request is not read while more than ZT_TUNE_CONN_WRITE_QUEUE_MAX bytes of
 * replies wait (the client is slow: it gets back-pressure, nothing is lost). Events are pushed,
 * not requested, so back-pressure cannot hold them: a watcher whose queue is over the cap is
 * dropped (closed) rather than let a client that does not read grow the daemon's memory; it can
 * reconnect and watch again, and `show` has the whole loss history.
 *
 * Before its hello is accepted (the token too, on TCP) a connection may send only small frames
 * (ZT_TUNE_PREAUTH_FRAME_MAX: a longer one is refused from its header, before it is read), must
 * say hello within ZT_TUNE_HELLO_TIMEOUT_MS, and counts against its listener's cap of such
 * connections; every listener caps its connections too. A client that half-closes keeps its
 * connection until the replies of its pending requests (a checkpoint) are written. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/log.h"
#include "engine/server/server.h"

typedef struct zt_write {
  uv_write_t req;
  zt_conn *conn;
  size_t len;
  uint8_t data[];
} zt_write;

static void conn_on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

static void conn_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  zt_conn *c = h->data;
  buf->base = (char *)c->rbuf;
  buf->len = sizeof c->rbuf;
}

static void conn_on_close(uv_handle_t *h) {
  zt_conn *c = h->data;
  zt_server *srv = c->srv;
  if (--c->handles > 0) return;
  zt_frame_reader_close(&c->reader);
  free(c->stash);
  free(c);
  zt__server_conn_gone(srv);
}

void zt__conn_close(zt_conn *c) {
  if (c->closing) return;
  c->closing = true;
  zt_server *srv = c->srv;
  /* Callbacks the job layer still holds for this connection must never fire. */
  while (c->pending) {
    if (srv->jobs) zt_jobs_forget(srv->jobs, c->pending);
    zt__conn_pending_drop(c, c->pending);
  }
  /* the parts this connection joined (the connection itself is their owner) */
  if (srv->jobs) zt_jobs_forget(srv->jobs, c);
  zt__watch_drop_conn(srv, c);
  if (c->prev) c->prev->next = c->next;
  else srv->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  c->prev = c->next = NULL;
  if (c->reading) uv_read_stop(&c->h.stream);
  c->reading = false;
  srv->n_conns[c->is_tcp]--;
  if (!c->hello_done) srv->n_preauth[c->is_tcp]--;
  if (srv->n_conns[c->is_tcp] < ZT_TUNE_MAX_CONNS &&
      srv->n_preauth[c->is_tcp] < ZT_TUNE_MAX_PREAUTH_CONNS)
    srv->cap_logged[c->is_tcp] = false;
  uv_close((uv_handle_t *)&c->hello_timer, conn_on_close);
  uv_close(&c->h.handle, conn_on_close);
}

void zt__conn_authenticated(zt_conn *c) {
  if (c->hello_done) return;
  c->hello_done = true;
  c->srv->n_preauth[c->is_tcp]--;
  uv_timer_stop(&c->hello_timer);
  /* from the next frame's header on */
  c->reader.max_frame = c->srv->cfg->max_frame;
}

void zt__conn_close_when_flushed(zt_conn *c) {
  if (c->closing) return;
  c->close_when_flushed = true;
  if (c->reading) uv_read_stop(&c->h.stream);
  c->reading = false;
  if (c->wq_bytes == 0) zt__conn_close(c);
}

zt_pending *zt__conn_pending_add(zt_conn *c, uint32_t id, zt_proto_op op) {
  zt_pending *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->conn = c;
  p->id = id;
  p->op = op;
  p->next = c->pending;
  c->pending = p;
  return p;
}

void zt__conn_pending_drop(zt_conn *c, zt_pending *p) {
  for (zt_pending **pp = &c->pending; *pp; pp = &(*pp)->next) {
    if (*pp == p) {
      *pp = p->next;
      free(p);
      break;
    }
  }
  /* a half-closed client waited for this reply; it was queued before the drop */
  if (c->eof && !c->pending && !c->closing) zt__conn_close_when_flushed(c);
}

static void conn_on_write(uv_write_t *req, int status) {
  zt_write *w = (zt_write *)req;
  zt_conn *c = w->conn;
  c->wq_bytes -= w->len;
  free(w);
  if (c->closing) return;
  if (status < 0) {
    ZT_LOGD("conn", "write failed: %s", uv_strerror(status));
    zt__conn_close(c);
    return;
  }
  if (c->close_when_flushed) {
    if (c->wq_bytes == 0) zt__conn_close(c);
    return;
  }
  if ((c->pause & ZT_CONN_PAUSE_WRITES) && c->wq_bytes <= ZT_TUNE_CONN_WRITE_QUEUE_MAX / 2)
    zt__conn_resume(c, ZT_CONN_PAUSE_WRITES);
}

int zt__conn_send(zt_conn *c, const uint8_t *frame, size_t len, bool is_event) {
  if (c->closing) return -EPIPE;
  if (is_event && c->wq_bytes + len > ZT_TUNE_CONN_WRITE_QUEUE_MAX) {
    ZT_LOGW("conn", "dropping a watcher that does not read (%zu bytes queued)", c->wq_bytes);
    zt__conn_close(c);
    return -ENOBUFS;
  }
  zt_write *w = malloc(sizeof *w + len);
  if (!w) {
    /* A lost reply would leave the client waiting forever: better to hang up. */
    zt__conn_close(c);
    return -ENOMEM;
  }
  w->conn = c;
  w->len = len;
  memcpy(w->data, frame, len);
  uv_buf_t buf = uv_buf_init((char *)w->data, (unsigned)len);
  int rc = uv_write(&w->req, &c->h.stream, &buf, 1, conn_on_write);
  if (rc < 0) {
    free(w);
    zt__conn_close(c);
    return rc;
  }
  c->wq_bytes += len;
  if (!is_event && c->wq_bytes > ZT_TUNE_CONN_WRITE_QUEUE_MAX) zt__conn_pause(c, ZT_CONN_PAUSE_WRITES);
  return 0;
}

/* Feeds bytes to the frame reader and dispatches every whole frame, stopping as soon as the
 * connection pauses or closes. Returns the bytes consumed. */
static size_t conn_consume(zt_conn *c, const uint8_t *data, size_t len) {
  size_t off = 0;
  c->in_consume = true;
  while (off < len && !c->pause && !c->closing && !c->close_when_flushed) {
    size_t used = 0;
    zt_proto_error err = {0};
    int rc = zt_frame_reader_feed(&c->reader, data + off, len - off, &used, &err);
    off += used;
    if (rc < 0) {
      /* The header announced a frame we will not read: framing is lost, so answer and hang up. */
      zt__reply_error(c, 0, rc, err.message[0] ? err.message : "bad frame header");
      zt__conn_close_when_flushed(c);
      break;
    }
    if (rc == 1) {
      uint32_t blen = 0;
      const uint8_t *body = zt_frame_reader_body(&c->reader, &blen);
      zt__dispatch(c, body, blen);
      zt_frame_reader_reset(&c->reader);
    }
  }
  c->in_consume = false;
  return off;
}

static int conn_start_reading(zt_conn *c) {
  if (c->reading || c->closing || c->close_when_flushed || c->pause) return 0;
  int rc = uv_read_start(&c->h.stream, conn_alloc, conn_on_read);
  if (rc < 0) {
    zt__conn_close(c);
    return rc;
  }
  c->reading = true;
  return 0;
}

/* Parses what is stashed; reading restarts once the stash is empty. */
static void conn_drain_stash(zt_conn *c) {
  while (c->stash && !c->pause && !c->closing && !c->close_when_flushed) {
    size_t used = conn_consume(c, c->stash + c->stash_off, c->stash_len - c->stash_off);
    c->stash_off += used;
    if (c->stash_off == c->stash_len) {
      free(c->stash);
      c->stash = NULL;
      c->stash_off = c->stash_len = 0;
    }
  }
  if (!c->stash) conn_start_reading(c);
}

void zt__conn_pause(zt_conn *c, unsigned why) {
  c->pause |= why;
  if (c->reading) uv_read_stop(&c->h.stream);
  c->reading = false;
}

void zt__conn_resume(zt_conn *c, unsigned why) {
  c->pause &= ~why;
  if (c->pause || c->closing) return;
  /* Inside conn_consume the loop itself carries on with the remaining bytes. */
  if (c->in_consume) return;
  conn_drain_stash(c);
}

static void conn_on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  zt_conn *c = s->data;
  if (nread == 0) return;
  if (nread < 0) {
    if (nread != UV_EOF) {
      /* a reset: nothing can be answered, close quietly */
      ZT_LOGD("conn", "read: %s", uv_strerror((int)nread));
      zt__conn_close(c);
    } else if (c->pending) {
      /* a half-close: the replies of the pending requests still go out (pending_drop) */
      c->eof = true;
      uv_read_stop(&c->h.stream);
      c->reading = false;
    } else {
      zt__conn_close_when_flushed(c);
    }
    return;
  }
  size_t len = (size_t)nread;
  size_t used = conn_consume(c, (const uint8_t *)buf->base, len);
  if (c->closing || c->close_when_flushed) return;
  if (used == len) {
    /* A pause lifted inside dispatch (a batch that got credit at once) stopped reading. */
    conn_start_reading(c);
    return;
  }
  /* Paused mid-read: keep the rest (at most one read buffer) until reading resumes. */
  c->stash = malloc(len - used);
  if (!c->stash) {
    zt__conn_close(c);
    return;
  }
  memcpy(c->stash, buf->base + used, len - used);
  c->stash_off = 0;
  c->stash_len = len - used;
  if (c->reading) uv_read_stop(&c->h.stream);
  c->reading = false;
}

static void on_hello_timeout(uv_timer_t *t) {
  zt_conn *c = t->data;
  ZT_LOGD("conn", "%s: no hello within %d ms; closing", c->is_tcp ? c->peer : "unix client",
          ZT_TUNE_HELLO_TIMEOUT_MS);
  zt__conn_close(c);
}

static void close_refused(uv_handle_t *h) { free(h->data); }

int zt__conn_accept(zt_server *srv, uv_stream_t *listener, bool is_tcp) {
  zt_conn *c = calloc(1, sizeof *c);
  if (!c) return -ENOMEM;
  c->srv = srv;
  c->is_tcp = is_tcp;
  int rc = is_tcp ? uv_tcp_init(srv->loop, &c->h.tcp) : uv_pipe_init(srv->loop, &c->h.pipe, 0);
  if (rc < 0) {
    free(c);
    return rc;
  }
  c->h.handle.data = c;
  if ((rc = uv_accept(listener, &c->h.stream)) < 0) {
    uv_close(&c->h.handle, close_refused);
    return rc;
  }
  /* over a cap the connection is taken off the backlog and closed unread */
  if (srv->n_conns[is_tcp] >= ZT_TUNE_MAX_CONNS ||
      srv->n_preauth[is_tcp] >= ZT_TUNE_MAX_PREAUTH_CONNS) {
    if (!srv->cap_logged[is_tcp])
      ZT_LOGW("conn", "%s listener: %d connections, %d of them before hello (caps %d, %d): "
              "refusing new ones", is_tcp ? "tcp" : "unix", srv->n_conns[is_tcp],
              srv->n_preauth[is_tcp], ZT_TUNE_MAX_CONNS, ZT_TUNE_MAX_PREAUTH_CONNS);
    srv->cap_logged[is_tcp] = true;
    uv_close(&c->h.handle, close_refused);
    return 0;
  }
  if (is_tcp) {
    struct sockaddr_storage sa;
    int len = sizeof sa;
    snprintf(c->peer, sizeof c->peer, "?");
    if (uv_tcp_getpeername(&c->h.tcp, (struct sockaddr *)&sa, &len) == 0) {
      if (sa.ss_family == AF_INET6)
        uv_ip6_name((const struct sockaddr_in6 *)&sa, c->peer, sizeof c->peer);
      else if (sa.ss_family == AF_INET)
        uv_ip4_name((const struct sockaddr_in *)&sa, c->peer, sizeof c->peer);
    }
    uv_tcp_nodelay(&c->h.tcp, 1);
  }
  uv_timer_init(srv->loop, &c->hello_timer);
  c->hello_timer.data = c;
  c->handles = 2;
  zt_frame_reader_init(&c->reader, ZT_TUNE_PREAUTH_FRAME_MAX < srv->cfg->max_frame
                                       ? ZT_TUNE_PREAUTH_FRAME_MAX
                                       : srv->cfg->max_frame);
  c->next = srv->conns;
  if (c->next) c->next->prev = c;
  srv->conns = c;
  srv->n_conns[is_tcp]++;
  srv->n_preauth[is_tcp]++;
  uv_timer_start(&c->hello_timer, on_hello_timeout, ZT_TUNE_HELLO_TIMEOUT_MS, 0);
  return conn_start_reading(c);
}
