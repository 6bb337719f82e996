/* Bad input on a raw socket: every malformed request gets an error reply naming its cause (or,
 * when framing is lost, an error and a close), and the connection — and the daemon — carry on.
 * usage: bad_frames SOCKET */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "proto/zt_proto.h"

static const char *g_sock;
static int g_failures;

#define CHECK(cond, ...)                                                                       \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                     \
      fprintf(stderr, __VA_ARGS__);                                                            \
      fprintf(stderr, "\n");                                                                   \
      g_failures++;                                                                            \
    }                                                                                          \
  } while (0)

static int dial(void) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", g_sock);
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
    perror("connect");
    exit(1);
  }
  return fd;
}

static void send_all(int fd, const void *p, size_t len) {
  const uint8_t *b = p;
  while (len) {
    ssize_t n = send(fd, b, len, MSG_NOSIGNAL);
    if (n <= 0) {
      perror("send");
      exit(1);
    }
    b += n;
    len -= (size_t)n;
  }
}

/* One reply frame: 1 and the decoded message (valid until the next call: it points into the
 * reader's body), 0 on EOF, -ETIMEDOUT when nothing came. */
static int recv_reply(int fd, int timeout_ms, zt_msg *m) {
  static zt_frame_reader r;
  zt_frame_reader_close(&r);
  zt_frame_reader_init(&r, 256u << 20);
  for (;;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, timeout_ms) == 0) return -ETIMEDOUT;
    uint8_t byte;
    /* One byte at a time: never read past the reply into the next one. */
    if (recv(fd, &byte, 1, 0) <= 0) return 0;
    size_t used;
    zt_proto_error err;
    int rc = zt_frame_reader_feed(&r, &byte, 1, &used, &err);
    if (rc < 0) {
      fprintf(stderr, "bad reply framing: %s\n", err.message);
      exit(1);
    }
    if (rc == 1) {
      uint32_t len;
      const uint8_t *body = zt_frame_reader_body(&r, &len);
      rc = zt_msg_decode(m, body, len, &err);
      if (rc < 0) {
        fprintf(stderr, "bad reply: %s\n", err.message);
        exit(1);
      }
      return 1;
    }
  }
}

static void send_out(int fd, zt_out *o) {
  size_t len;
  const uint8_t *f = zt_out_finish(o, &len);
  send_all(fd, f, len);
  zt_out_close(o);
}

static void send_body(int fd, const void *body, uint32_t len) {
  uint8_t hdr[4];
  zt_frame_header_encode(hdr, len);
  send_all(fd, hdr, 4);
  send_all(fd, body, len);
}

/* Expects an error reply with this id and code, whose message contains `needle`. */
static void expect_error(int fd, uint32_t id, const char *code, const char *needle, const char *what) {
  zt_msg m;
  int rc = recv_reply(fd, 10000, &m);
  CHECK(rc == 1, "%s: no reply (%d)", what, rc);
  if (rc != 1) return;
  uint64_t got_id = 99;
  bool ok = true;
  const msgpack_object *e = NULL;
  const char *c = "", *msg = "";
  size_t clen = 0, mlen = 0;
  zt_msg_get_u64(m.root, NULL, "id", true, &got_id, NULL);
  zt_msg_get_bool(m.root, NULL, "ok", true, &ok, NULL);
  zt_msg_get_map(m.root, NULL, "error", true, &e, NULL);
  if (e) {
    zt_msg_get_str(e, NULL, "code", true, &c, &clen, NULL);
    zt_msg_get_str(e, NULL, "message", true, &msg, &mlen, NULL);
  }
  CHECK(!ok, "%s: ok is true", what);
  CHECK(got_id == id, "%s: id %llu, expected %u", what, (unsigned long long)got_id, id);
  CHECK(clen == strlen(code) && !memcmp(c, code, clen), "%s: code %.*s, expected %s", what,
        (int)clen, c, code);
  CHECK(memmem(msg, mlen, needle, strlen(needle)) != NULL, "%s: message '%.*s' lacks '%s'", what,
        (int)mlen, msg, needle);
  printf("ok: %s -> %.*s %.*s\n", what, (int)clen, c, (int)mlen, msg);
  zt_msg_close(&m);
}

static void expect_ok(int fd, uint32_t id, const char *what) {
  zt_msg m;
  int rc = recv_reply(fd, 10000, &m);
  CHECK(rc == 1, "%s: no reply (%d)", what, rc);
  if (rc != 1) return;
  uint64_t got_id = 0;
  bool ok = false;
  zt_msg_get_u64(m.root, NULL, "id", true, &got_id, NULL);
  zt_msg_get_bool(m.root, NULL, "ok", true, &ok, NULL);
  CHECK(ok && got_id == id, "%s: ok %d id %llu", what, ok, (unsigned long long)got_id);
  zt_msg_close(&m);
}

static void expect_closed(int fd, const char *what) {
  zt_msg m;
  int rc = recv_reply(fd, 10000, &m);
  CHECK(rc == 0, "%s: connection still open (%d)", what, rc);
  if (rc == 1) zt_msg_close(&m);
}

static void req_simple(int fd, uint32_t id, const char *op) {
  zt_out o;
  zt_out_init(&o);
  msgpack_pack_map(&o.pk, 2);
  zt_out_kv_u64(&o, "id", id);
  zt_out_kv_str(&o, "op", op);
  send_out(fd, &o);
}

static int hello_conn(void) {
  int fd = dial();
  zt_out o;
  zt_out_init(&o);
  zt_out_hello(&o, 1, NULL);
  send_out(fd, &o);
  expect_ok(fd, 1, "hello");
  return fd;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: bad_frames SOCKET\n");
    return 2;
  }
  g_sock = argv[1];
  zt_out o;

  /* Before hello, and a hello of another protocol version. */
  int fd = dial();
  req_simple(fd, 3, "status");
  expect_error(fd, 3, "EPROTO", "hello", "request before hello");
  zt_out_init(&o);
  msgpack_pack_map(&o.pk, 3);
  zt_out_kv_u64(&o, "id", 4);
  zt_out_kv_str(&o, "op", "hello");
  zt_out_kv_u64(&o, "version", 999);
  send_out(fd, &o);
  expect_error(fd, 4, "EPROTO", "999", "hello with a wrong version");
  close(fd);

  fd = hello_conn();
  /* Garbage inside a well-formed frame: 0xc1 is never valid msgpack. */
  static const uint8_t garbage[] = {0xc1, 0xc1, 0xff, 0x00, 0x13, 0x37};
  send_body(fd, garbage, sizeof garbage);
  expect_error(fd, 0, "EINVAL", "msgpack", "garbage body");
  /* A value that is not a map. */
  static const uint8_t array[] = {0x92, 0x01, 0x02};
  send_body(fd, array, sizeof array);
  expect_error(fd, 0, "EINVAL", "map", "non-map value");
  /* Deep nesting: {"id": 5, "op": "status", "x": [[[[...]]]]}. */
  zt_out_init(&o);
  msgpack_pack_map(&o.pk, 3);
  zt_out_kv_u64(&o, "id", 5);
  zt_out_kv_str(&o, "op", "status");
  zt_out_str(&o, "x");
  for (int i = 0; i < 200; i++) msgpack_pack_array(&o.pk, 1);
  msgpack_pack_nil(&o.pk);
  send_out(fd, &o);
  expect_error(fd, 0, "EINVAL", "deeper", "deep nesting");
  /* Wrong field types. */
  zt_out_init(&o);
  msgpack_pack_map(&o.pk, 3);
  zt_out_kv_u64(&o, "id", 6);
  zt_out_kv_str(&o, "op", "show");
  zt_out_kv_u64(&o, "job", 123);
  send_out(fd, &o);
  expect_error(fd, 6, "EINVAL", "job", "job of the wrong type");
  zt_out_init(&o);
  msgpack_pack_map(&o.pk, 2);
  zt_out_kv_str(&o, "id", "seven");
  zt_out_kv_str(&o, "op", "status");
  send_out(fd, &o);
  expect_error(fd, 0, "EINVAL", "id", "id of the wrong type");
  zt_out_init(&o);
  msgpack_pack_map(&o.pk, 3);
  zt_out_kv_u64(&o, "id", 7);
  zt_out_kv_str(&o, "op", "export");
  zt_out_str(&o, "job");
  msgpack_pack_array(&o.pk, 0);
  send_out(fd, &o);
  expect_error(fd, 7, "EINVAL", "job", "job as an array");
  /* The spec of submit and plan: of the wrong type, missing, not JSON. */
  static const char *const spec_ops[] = {"submit", "plan"};
  for (int k = 0; k < 2; k++) {
    zt_out_init(&o);
    msgpack_pack_map(&o.pk, 3);
    zt_out_kv_u64(&o, "id", 20 + k);
    zt_out_kv_str(&o, "op", spec_ops[k]);
    zt_out_kv_u64(&o, "spec", 5);
    send_out(fd, &o);
    expect_error(fd, 20 + (uint32_t)k, "EINVAL", "spec", "spec of the wrong type");
    req_simple(fd, 22 + (uint32_t)k, spec_ops[k]);
    expect_error(fd, 22 + (uint32_t)k, "EINVAL", "spec", "spec missing");
    zt_out_init(&o);
    msgpack_pack_map(&o.pk, 3);
    zt_out_kv_u64(&o, "id", 24 + k);
    zt_out_kv_str(&o, "op", spec_ops[k]);
    zt_out_kv_str(&o, "spec_json", "{\"model\": ");
    send_out(fd, &o);
    expect_error(fd, 24 + (uint32_t)k, "EINVAL", "spec_json", "spec_json not JSON");
  }
  /* Unknown op, missing id, missing op. */
  req_simple(fd, 8, "frobnicate");
  expect_error(fd, 8, "ENOTSUP", "frobnicate", "unknown op");
  zt_out_init(&o);
  msgpack_pack_map(&o.pk, 1);
  zt_out_kv_str(&o, "op", "status");
  send_out(fd, &o);
  expect_error(fd, 0, "EINVAL", "id", "missing id");
  zt_out_init(&o);
  msgpack_pack_map(&o.pk, 1);
  zt_out_kv_u64(&o, "id", 9);
  send_out(fd, &o);
  expect_error(fd, 9, "EINVAL", "op", "missing op");
  /* A batch for a job that does not exist. */
  int32_t toks[17] = {0};
  zt_out_init(&o);
  msgpack_pack_map(&o.pk, 4);
  zt_out_kv_u64(&o, "id", 10);
  zt_out_kv_str(&o, "op", "batch");
  zt_out_kv_str(&o, "job", "j999999");
  zt_out_kv_bin(&o, "tokens", toks, sizeof toks);
  send_out(fd, &o);
  expect_error(fd, 10, "ENOENT", "j999999", "batch for an unknown job");
  /* Tokens that are not whole int32s. */
  zt_out_init(&o);
  msgpack_pack_map(&o.pk, 4);
  zt_out_kv_u64(&o, "id", 11);
  zt_out_kv_str(&o, "op", "batch");
  zt_out_kv_str(&o, "job", "j999999");
  zt_out_kv_bin(&o, "tokens", toks, 7);
  send_out(fd, &o);
  expect_error(fd, 11, "EINVAL", "tokens", "tokens of 7 bytes");
  /* A batch of the wrong size for a real stream job. */
  static const char stream_spec[] =
      "{\"model\": {\"arch\": \"gpt\", \"vocab\": 256, \"seq_len\": 16, \"d_model\": 32, "
      "\"n_heads\": 2, \"n_layers\": 2}, \"train\": {\"steps\": 5, \"micro_batch\": 2}, "
      "\"data\": {\"source\": \"stream\"}}";
  zt_out_init(&o);
  msgpack_pack_map(&o.pk, 3);
  zt_out_kv_u64(&o, "id", 12);
  zt_out_kv_str(&o, "op", "submit");
  zt_out_kv_str(&o, "spec_json", stream_spec);
  send_out(fd, &o);
  zt_msg m;
  char job[64] = "";
  CHECK(recv_reply(fd, 10000, &m) == 1, "submit: no reply");
  const char *s = NULL;
  size_t slen = 0;
  if (zt_msg_get_str(m.root, NULL, "job", true, &s, &slen, NULL) == 0 && slen < sizeof job)
    memcpy(job, s, slen);
  zt_msg_close(&m);
  CHECK(job[0], "submit of a stream job gave no job id");
  zt_out_init(&o);
  msgpack_pack_map(&o.pk, 4);
  zt_out_kv_u64(&o, "id", 13);
  zt_out_kv_str(&o, "op", "batch");
  zt_out_kv_str(&o, "job", job);
  zt_out_kv_bin(&o, "tokens", toks, sizeof toks);
  send_out(fd, &o);
  expect_error(fd, 13, "EINVAL", "token", "batch with the wrong token count");
  zt_out_init(&o);
  msgpack_pack_map(&o.pk, 3);
  zt_out_kv_u64(&o, "id", 14);
  zt_out_kv_str(&o, "op", "cancel");
  zt_out_kv_str(&o, "job", job);
  send_out(fd, &o);
  expect_ok(fd, 14, "cancel the stream job");
  /* A truncated frame waits for the rest; then it is served. */
  zt_out_init(&o);
  msgpack_pack_map(&o.pk, 3);
  zt_out_kv_u64(&o, "id", 15);
  zt_out_kv_str(&o, "op", "status");
  zt_out_kv_str(&o, "pad", "some padding so that the frame has a tail to hold back");
  size_t flen;
  const uint8_t *frame = zt_out_finish(&o, &flen);
  send_all(fd, frame, 10);
  CHECK(recv_reply(fd, 300, &m) == -ETIMEDOUT, "truncated frame: a reply came early");
  send_all(fd, frame + 10, flen - 10);
  zt_out_close(&o);
  expect_ok(fd, 15, "truncated frame completed later");
  /* The connection survived all of that. */
  req_simple(fd, 16, "status");
  expect_ok(fd, 16, "status after the bad requests");
  close(fd);

  /* A header announcing more than --max-frame: an error, then the daemon hangs up. */
  fd = hello_conn();
  static const uint8_t huge[] = {0x7f, 0xff, 0xff, 0xff};
  send_all(fd, huge, sizeof huge);
  expect_error(fd, 0, "EMSGSIZE", "", "frame over max");
  expect_closed(fd, "frame over max");
  close(fd);
  /* Raw garbage (no frame at all): its first bytes read as an absurd length. */
  fd = dial();
  static const char http[] = "GET / HTTP/1.1\r\nHost: ztd\r\n\r\n";
  send_all(fd, http, sizeof http - 1);
  expect_error(fd, 0, "EMSGSIZE", "", "raw garbage bytes");
  expect_closed(fd, "raw garbage bytes");
  close(fd);
  /* An empty frame. */
  fd = hello_conn();
  static const uint8_t empty[] = {0, 0, 0, 0};
  send_all(fd, empty, sizeof empty);
  expect_error(fd, 0, "EINVAL", "", "empty frame");
  expect_closed(fd, "empty frame");
  close(fd);
  /* EOF in the middle of a frame: the daemon closes quietly. */
  fd = hello_conn();
  static const uint8_t partial[] = {0, 0, 0, 100, 0x83, 0xa2};
  send_all(fd, partial, sizeof partial);
  close(fd);

  /* Still serving. */
  fd = hello_conn();
  req_simple(fd, 17, "status");
  expect_ok(fd, 17, "status on a new connection");
  close(fd);
  if (g_failures) fprintf(stderr, "%d checks failed\n", g_failures);
  return g_failures ? 1 : 0;
}
