/* The transport of libztclient: blocking socket I/O, frames, id matching, error recording. */
#include "client/lib/conn.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proto/zt_proto_json.h"

int zt__client_fail(zt_client *c, int code, const char *fmt, ...) {
  snprintf(c->code, sizeof c->code, "%s", zt_proto_errname(code));
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->message, sizeof c->message, fmt, ap);
  va_end(ap);
  return code;
}

static int fail_transport(zt_client *c, int err) {
  if (err == EPIPE || err == ECONNRESET) return zt__client_fail(c, -ECONNRESET, "ztd closed the connection");
  return zt__client_fail(c, -err, "connection to ztd: %s", strerror(err));
}

uint32_t zt__client_begin(zt_client *c, zt_out *o, const char *op, uint32_t nfields) {
  uint32_t id = c->next_id++;
  if (c->next_id == 0) c->next_id = 1;
  msgpack_pack_map(&o->pk, 2 + nfields);
  zt_out_kv_u64(o, "id", id);
  zt_out_kv_str(o, "op", op);
  return id;
}

int zt__client_send(zt_client *c, zt_out *o) {
  size_t len;
  const uint8_t *p = zt_out_finish(o, &len);
  if (!p) {
    if (o->err == -EMSGSIZE) return zt__client_fail(c, -EMSGSIZE, "request larger than 4 GiB");
    return zt__client_fail(c, -ENOMEM, "out of memory building a request");
  }
  if (c->server_max_frame && len - ZT_PROTO_HEADER_BYTES > c->server_max_frame)
    return zt__client_fail(c, -EMSGSIZE, "request of %zu bytes exceeds ztd's maximum frame of %u bytes",
                           len - ZT_PROTO_HEADER_BYTES, c->server_max_frame);
  if (c->fd < 0) return zt__client_fail(c, -ENOTCONN, "not connected to ztd");
  while (len > 0) {
    ssize_t n = send(c->fd, p, len, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail_transport(c, errno);
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

int zt__client_read(zt_client *c, zt_msg *m) {
  zt_proto_error perr;
  zt_frame_reader_reset(&c->rd);
  if (c->fd < 0) return zt__client_fail(c, -ENOTCONN, "not connected to ztd");
  for (;;) {
    if (c->buf_pos == c->buf_len) {
      ssize_t n = recv(c->fd, c->buf, sizeof c->buf, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return fail_transport(c, errno);
      if (n == 0) return zt__client_fail(c, -ECONNRESET, "ztd closed the connection");
      c->buf_pos = 0;
      c->buf_len = (size_t)n;
    }
    size_t used;
    int rc = zt_frame_reader_feed(&c->rd, c->buf + c->buf_pos, c->buf_len - c->buf_pos, &used, &perr);
    c->buf_pos += used;
    if (rc < 0) return zt__client_fail(c, -EPROTO, "bad frame from ztd: %s", perr.message);
    if (rc == 1) break;
  }
  uint32_t len;
  const uint8_t *body = zt_frame_reader_body(&c->rd, &len);
  int rc = zt_msg_decode(m, body, len, &perr);
  if (rc < 0) return zt__client_fail(c, -EPROTO, "bad message from ztd: %s", perr.message);
  return 0;
}

/* Copies the server's error into the handle and returns its errno. */
static int server_error(zt_client *c, const msgpack_object *root) {
  const msgpack_object *e = NULL;
  const char *code = "EIO", *msg = "ztd sent an error without details";
  size_t clen = 3, mlen = strlen(msg);
  if (zt_msg_get_map(root, NULL, "error", false, &e, NULL) == 0) {
    zt_msg_get_str(e, NULL, "code", false, &code, &clen, NULL);
    zt_msg_get_str(e, NULL, "message", false, &msg, &mlen, NULL);
  }
  int num = zt_proto_errnum(code, clen);
  zt__client_fail(c, num, "%.*s", (int)mlen, msg);
  /* keep the server's name even when this build does not know it */
  if (clen < sizeof c->code) {
    for (size_t i = 0; i < clen; i++) c->code[i] = code[i] >= 'A' && code[i] <= 'Z' ? code[i] : '?';
    c->code[clen] = '\0';
  }
  return num;
}

int zt__client_call(zt_client *c, zt_out *o, uint32_t id, zt_msg *reply) {
  int rc = zt__client_send(c, o);
  if (rc < 0) return rc;
  for (;;) {
    rc = zt__client_read(c, reply);
    if (rc < 0) return rc;
    uint64_t rid;
    if (zt_msg_find(reply->root, "event") ||
        zt_msg_get_u64(reply->root, NULL, "id", false, &rid, NULL) < 0 || rid != id) {
      zt_msg_close(reply);
      continue;
    }
    bool ok = false;
    if (zt_msg_get_bool(reply->root, NULL, "ok", false, &ok, NULL) == 0 && ok) return 0;
    rc = server_error(c, reply->root);
    zt_msg_close(reply);
    return rc;
  }
}

int zt__client_to_json(zt_client *c, const msgpack_object *map, char **json_out) {
  zt_proto_error perr;
  json_t *j = zt_proto_to_json(map, &perr);
  if (!j) return zt__client_fail(c, -EPROTO, "reply from ztd: %s", perr.message);
  json_object_del(j, "id");
  json_object_del(j, "ok");
  *json_out = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(15));
  json_decref(j);
  if (!*json_out) return zt__client_fail(c, -ENOMEM, "out of memory");
  return 0;
}

int zt__client_hello(zt_client *c, const char *token) {
  zt_out o;
  zt_msg reply;
  zt_out_init(&o);
  uint32_t id = c->next_id++;
  zt_out_hello(&o, id, token);
  int rc = zt__client_call(c, &o, id, &reply);
  zt_out_close(&o);
  if (rc < 0) return rc;
  uint64_t version = 0, max_frame = 0;
  zt_msg_get_u64(reply.root, NULL, "version", false, &version, NULL);
  if (zt_msg_get_u64(reply.root, NULL, "max_frame", false, &max_frame, NULL) == 0 &&
      max_frame <= UINT32_MAX)
    c->server_max_frame = (uint32_t)max_frame;
  zt_msg_close(&reply);
  if (version != ZT_PROTO_VERSION)
    return zt__client_fail(c, -EPROTO, "ztd speaks protocol version %llu, this client version %d",
                           (unsigned long long)version, ZT_PROTO_VERSION);
  return 0;
}
