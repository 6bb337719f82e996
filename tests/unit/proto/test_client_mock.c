/* libztclient against a scripted stand-in for ztd (a child process speaking the protocol with
 * proto/): hello, JSON replies without id/ok, server errors, skipped events, batch encoding,
 * watch until "end", chunked export into a renamed file, a closed connection. */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/include/zt/client.h"
#include "proto/zt_proto.h"
#include "tests/unit/proto/check.h"

#define EXPORT_TOTAL 2500u
#define SERVER_MAX_FRAME 5000u /* export chunks are capped to this minus 4 KiB: 904 bytes */

static int send_out(int fd, zt_out *o) {
  size_t len;
  const uint8_t *p = zt_out_finish(o, &len);
  int rc = p && write(fd, p, len) == (ssize_t)len ? 0 : -1;
  zt_out_close(o);
  return rc;
}

static void reply_head(zt_out *o, uint32_t id, uint32_t nfields) {
  zt_out_init(o);
  msgpack_pack_map(&o->pk, 2 + nfields);
  zt_out_kv_u64(o, "id", id);
  zt_out_kv_bool(o, "ok", true);
}

/* Handles one request; returns -1 to close the connection. */
static int serve_one(int fd, const zt_request *req) {
  zt_out o;
  const char *s;
  size_t n;
  switch (req->op) {
  case ZT_OP_HELLO:
    reply_head(&o, req->id, 3);
    zt_out_kv_u64(&o, "version", ZT_PROTO_VERSION);
    zt_out_kv_str(&o, "server", "mock");
    zt_out_kv_u64(&o, "max_frame", SERVER_MAX_FRAME);
    return send_out(fd, &o);
  case ZT_OP_STATUS:
    /* an event first: a client waiting for a reply must skip it */
    zt_out_init(&o);
    msgpack_pack_map(&o.pk, 2);
    zt_out_kv_str(&o, "event", "step");
    zt_out_kv_str(&o, "job", "j000001");
    send_out(fd, &o);
    reply_head(&o, req->id, 2);
    zt_out_kv_str(&o, "backend", "cpu");
    zt_out_kv_f64(&o, "loss", 0.0 / 0.0);
    return send_out(fd, &o);
  case ZT_OP_SUBMIT: {
    const msgpack_object *spec;
    uint64_t d = 0;
    zt_msg_get_map(req->body, NULL, "spec", true, &spec, NULL);
    const msgpack_object *model = zt_msg_find(spec, "model");
    zt_msg_get_u64(model, NULL, "d_model", true, &d, NULL);
    if (d != 64) {
      zt_out_init(&o);
      zt_out_error(&o, req->id, -EINVAL, "model.n_heads must divide model.d_model");
      return send_out(fd, &o);
    }
    reply_head(&o, req->id, 1);
    zt_out_kv_str(&o, "job", "j000001");
    return send_out(fd, &o);
  }
  case ZT_OP_BATCH: {
    const uint8_t *t;
    zt_msg_get_bin(req->body, NULL, "tokens", true, &t, &n, NULL);
    bool good = n == 12 && t[0] == 1 && t[4] == 2 && t[8] == 0x70 && t[9] == 0x11 && t[10] == 1;
    reply_head(&o, req->id, 1);
    zt_out_kv_u64(&o, "queued", good ? 1 : 999);
    return send_out(fd, &o);
  }
  case ZT_OP_WATCH:
    reply_head(&o, req->id, 0);
    send_out(fd, &o);
    for (int e = 0; e < 3; e++) {
      zt_out_init(&o);
      msgpack_pack_map(&o.pk, 3);
      zt_out_kv_str(&o, "event", e == 2 ? "end" : "step");
      zt_out_kv_str(&o, "job", e == 1 ? "j000999" : "j000001"); /* another job's event: skipped */
      zt_out_kv_str(&o, "state", e == 2 ? "done" : "running");
      send_out(fd, &o);
    }
    return 0;
  case ZT_OP_EXPORT: {
    uint64_t off = 0, len = 0;
    zt_msg_get_u64(req->body, NULL, "offset", true, &off, NULL);
    zt_msg_get_u64(req->body, NULL, "length", true, &len, NULL);
    uint8_t chunk[EXPORT_TOTAL];
    if (len > SERVER_MAX_FRAME - 4096) len = SERVER_MAX_FRAME - 4096;
    if (off > EXPORT_TOTAL) off = EXPORT_TOTAL;
    if (len > EXPORT_TOTAL - off) len = EXPORT_TOTAL - off;
    for (uint64_t i = 0; i < len; i++) chunk[i] = (uint8_t)((off + i) * 7);
    reply_head(&o, req->id, 3);
    zt_out_kv_bin(&o, "data", chunk, len);
    zt_out_kv_u64(&o, "total", EXPORT_TOTAL);
    zt_out_kv_u64(&o, "step", 10);
    return send_out(fd, &o);
  }
  case ZT_OP_SHOW:
    zt_msg_get_str(req->body, NULL, "job", true, &s, &n, NULL);
    zt_out_init(&o);
    zt_out_error(&o, req->id, -ENOENT, "no job");
    return send_out(fd, &o);
  default: return -1; /* shutdown: hang up */
  }
}

static void serve(int lfd) {
  for (;;) {
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0) _exit(1);
    zt_frame_reader r;
    zt_frame_reader_init(&r, 1 << 20);
    uint8_t buf[4096];
    ssize_t got;
    bool open = true;
    while (open && (got = read(fd, buf, sizeof buf)) > 0) {
      size_t pos = 0;
      while (open && pos < (size_t)got) {
        size_t used;
        int rc = zt_frame_reader_feed(&r, buf + pos, (size_t)got - pos, &used, NULL);
        pos += used;
        if (rc < 0) open = false;
        if (rc != 1) continue;
        uint32_t len;
        const uint8_t *body = zt_frame_reader_body(&r, &len);
        zt_msg m;
        zt_request req;
        if (zt_msg_decode(&m, body, len, NULL) < 0 || zt_request_parse(&m, &req, NULL) < 0 ||
            serve_one(fd, &req) < 0)
          open = false;
        zt_msg_close(&m);
        zt_frame_reader_reset(&r);
      }
    }
    zt_frame_reader_close(&r);
    close(fd);
  }
}

static int g_events, g_end_seen;
static int on_event(const char *json, void *user) {
  (void)user;
  g_events++;
  CHECK(strstr(json, "\"job\":\"j000001\"") != NULL);
  if (strstr(json, "\"end\"")) g_end_seen = 1;
  return 0;
}

int main(void) {
  char dir[] = "/tmp/zt-client-test-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  char sock[100], out[100];
  snprintf(sock, sizeof sock, "%s/ztd.sock", dir);
  snprintf(out, sizeof out, "%s/w.safetensors", dir);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock);
  int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(lfd, 4) < 0) return 1;
  pid_t pid = fork();
  if (pid == 0) serve(lfd);
  close(lfd);

  zt_client *c = NULL;
  CHECK(zt_client_connect_unix(&c, sock) == 0);
  char *json = NULL;
  CHECK(zt_client_status(c, &json) == 0);
  CHECK(json && strcmp(json, "{\"backend\":\"cpu\",\"loss\":null}") == 0);
  free(json);

  char job[ZT_CLIENT_JOB_ID_MAX];
  CHECK(zt_client_submit_json(c, "{\"model\": {\"d_model\": 64}}", job) == 0 && !strcmp(job, "j000001"));
  CHECK(zt_client_submit_json(c, "{\"model\": {\"d_model\": 65}}", job) == -EINVAL);
  CHECK(!strcmp(zt_client_error_code(c), "EINVAL"));
  CHECK(!strcmp(zt_client_error_message(c), "model.n_heads must divide model.d_model"));
  CHECK(zt_client_submit_json(c, "{\"model\": ", job) == -EINVAL);
  CHECK(strstr(zt_client_error_message(c), "not valid JSON") != NULL);
  static const uint8_t packed_spec[] = {0x81, 0xa5, 'm', 'o', 'd', 'e', 'l', 0x81, 0xa7, 'd', '_', 'm',
                                        'o', 'd', 'e', 'l', 0x40};
  CHECK(zt_client_submit_msgpack(c, packed_spec, sizeof packed_spec, job) == 0);
  CHECK(zt_client_submit_msgpack(c, packed_spec, sizeof packed_spec - 1, job) == -EINVAL);

  CHECK(zt_client_show(c, "j000001", &json) == -ENOENT && !strcmp(zt_client_error_code(c), "ENOENT"));
  const int32_t tokens[3] = {1, 2, 70000};
  CHECK(zt_client_push_batch(c, "j000001", tokens, 3) == 0);
  /* larger than the server's announced frame limit: refused locally */
  static int32_t big[2000];
  CHECK(zt_client_push_batch(c, "j000001", big, 2000) == -EMSGSIZE);

  CHECK(zt_client_export(c, "j000001", out) == 0);
  FILE *f = fopen(out, "rb");
  uint8_t data[EXPORT_TOTAL + 1];
  size_t n = f ? fread(data, 1, sizeof data, f) : 0;
  if (f) fclose(f);
  CHECK(n == EXPORT_TOTAL);
  for (size_t i = 0; i < n; i++) CHECK(data[i] == (uint8_t)(i * 7));

  CHECK(zt_client_watch(c, "j000001", on_event, NULL) == 0);
  CHECK(g_events == 2 && g_end_seen);

  /* the stand-in hangs up on shutdown */
  CHECK(zt_client_shutdown(c) == -ECONNRESET);
  CHECK(!strcmp(zt_client_error_message(c), "ztd closed the connection"));
  zt_client_close(c);

  kill(pid, SIGTERM);
  waitpid(pid, NULL, 0);
  unlink(sock);
  unlink(out);
  rmdir(dir);
  return TEST_DONE();
}
