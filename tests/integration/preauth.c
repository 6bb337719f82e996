/* What a client may do before its hello is accepted, on both listeners, and the token backoff:
 * a frame over the pre-hello limit is refused from its header and the connection closed while
 * other clients are served; a connection that never says hello is closed; the cap on
 * connections before hello; wrong tokens back off per peer; a half-closed client still gets its
 * checkpoint reply; replies are valid UTF-8 whatever the request held.
 * usage: preauth SOCKET PORT TOKEN RUNNING_JOB */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "proto/zt_proto.h"

static const char *g_sock, *g_token;
static int g_port, g_failures;

#define CHECK(cond, ...)                                                                       \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                     \
      fprintf(stderr, __VA_ARGS__);                                                            \
      fprintf(stderr, "\n");                                                                   \
      g_failures++;                                                                            \
    }                                                                                          \
  } while (0)

static int dial_unix(void) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", g_sock);
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
    perror("connect unix");
    exit(1);
  }
  return fd;
}

static int dial_tcp(void) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
    perror("connect tcp");
    exit(1);
  }
  return fd;
}

/* Sends what it can; a peer that closed makes the rest fail, which is what some cases expect. */
static int send_all(int fd, const void *p, size_t len) {
  const uint8_t *b = p;
  while (len) {
    ssize_t n = send(fd, b, len, MSG_NOSIGNAL);
    if (n <= 0) return -1;
    b += n;
    len -= (size_t)n;
  }
  return 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* 1 and a reply, 0 on EOF (or a reset), -ETIMEDOUT when nothing came in timeout_ms. */
static int recv_reply(int fd, int timeout_ms, zt_msg *m, uint8_t **raw, uint32_t *raw_len) {
  static zt_frame_reader r;
  zt_frame_reader_close(&r);
  zt_frame_reader_init(&r, 256u << 20);
  for (;;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, timeout_ms) == 0) return -ETIMEDOUT;
    uint8_t byte;
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
      if (raw) *raw = (uint8_t *)body, *raw_len = len;
      if (zt_msg_decode(m, body, len, &err) < 0) {
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

/* The reply's error code ("" for ok) into code. */
static int reply_code(int fd, int timeout_ms, char code[32], char msg[512]) {
  zt_msg m;
  int rc = recv_reply(fd, timeout_ms, &m, NULL, NULL);
  if (rc != 1) return rc;
  bool ok = false;
  const msgpack_object *e = NULL;
  const char *c = "", *s = "";
  size_t cl = 0, sl = 0;
  zt_msg_get_bool(m.root, NULL, "ok", true, &ok, NULL);
  code[0] = msg[0] = 0;
  if (!ok && zt_msg_get_map(m.root, NULL, "error", true, &e, NULL) == 0) {
    zt_msg_get_str(e, NULL, "code", true, &c, &cl, NULL);
    zt_msg_get_str(e, NULL, "message", true, &s, &sl, NULL);
    snprintf(code, 32, "%.*s", (int)cl, c);
    snprintf(msg, 512, "%.*s", (int)sl, s);
  }
  zt_msg_close(&m);
  return 1;
}

static int hello(int fd, const char *token, char code[32], char msg[512]) {
  zt_out o;
  zt_out_init(&o);
  zt_out_hello(&o, 1, token);
  send_out(fd, &o);
  return reply_code(fd, 10000, code, msg);
}

static void status_ok(int fd, const char *what) {
  zt_out o;
  zt_out_init(&o);
  msgpack_pack_map(&o.pk, 2);
  zt_out_kv_u64(&o, "id", 2);
  zt_out_kv_str(&o, "op", "status");
  send_out(fd, &o);
  char code[32], msg[512];
  double t0 = now_s();
  int rc = reply_code(fd, 5000, code, msg);
  CHECK(rc == 1 && !code[0], "%s: status rc %d %s %s", what, rc, code, msg);
  printf("ok: %s (status answered in %.0f ms)\n", what, (now_s() - t0) * 1e3);
}

static void expect_closed(int fd, int timeout_ms, const char *what) {
  zt_msg m;
  int rc;
  /* an error reply may come first */
  while ((rc = recv_reply(fd, timeout_ms, &m, NULL, NULL)) == 1) zt_msg_close(&m);
  CHECK(rc == 0, "%s: not closed within %d ms (%d)", what, timeout_ms, rc);
  if (rc == 0) printf("ok: %s\n", what);
}

/* 64 MiB announced before hello: refused from the header, the connection closed; a client that
 * said hello is served meanwhile. */
static void big_frame_before_hello(int (*dial)(void), const char *listener, int *served) {
  int fd = dial();
  uint8_t hdr[4];
  zt_frame_header_encode(hdr, 64u << 20);
  send_all(fd, hdr, 4);
  static uint8_t junk[1 << 16];
  send_all(fd, junk, sizeof junk); /* the start of the "body": may fail once the daemon closes */
  char code[32], msg[512];
  int rc = reply_code(fd, 5000, code, msg);
  CHECK(rc == 1 && !strcmp(code, "EMSGSIZE"), "%s: 64 MiB before hello: rc %d %s %s", listener,
        rc, code, msg);
  expect_closed(fd, 5000, "64 MiB frame before hello: refused and closed");
  status_ok(*served, "another client while the big frame was refused");
  close(fd);
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: preauth SOCKET PORT TOKEN RUNNING_JOB\n");
    return 2;
  }
  g_sock = argv[1];
  g_port = atoi(argv[2]);
  g_token = argv[3];
  const char *job = argv[4];
  char code[32], msg[512];

  int served = dial_unix();
  CHECK(hello(served, NULL, code, msg) == 1 && !code[0], "hello: %s %s", code, msg);
  big_frame_before_hello(dial_unix, "unix", &served);
  big_frame_before_hello(dial_tcp, "tcp", &served);

  /* A status of 16 KiB (over the pre-hello limit, under --max-frame) before and after hello. */
  zt_out o;
  for (int after = 0; after < 2; after++) {
    int fd = dial_unix();
    if (after) CHECK(hello(fd, NULL, code, msg) == 1 && !code[0], "hello: %s", msg);
    static char pad[16 << 10];
    memset(pad, 'p', sizeof pad - 1);
    zt_out_init(&o);
    msgpack_pack_map(&o.pk, 3);
    zt_out_kv_u64(&o, "id", 3);
    zt_out_kv_str(&o, "op", "status");
    zt_out_kv_str(&o, "pad", pad);
    send_out(fd, &o);
    int rc = reply_code(fd, 5000, code, msg);
    if (after)
      CHECK(rc == 1 && !code[0], "16 KiB status after hello: %s %s", code, msg);
    else
      CHECK(rc == 1 && !strcmp(code, "EMSGSIZE"), "16 KiB before hello: rc %d %s", rc, code);
    printf("ok: 16 KiB frame %s hello -> %s\n", after ? "after" : "before", code[0] ? code : "ok");
    close(fd);
  }

  /* The cap on connections before hello: 64 idle ones fill it, the next is closed at once while
   * the authenticated client is served; one that leaves makes room. */
  int idle[64];
  for (int i = 0; i < 64; i++) idle[i] = dial_unix();
  usleep(200 * 1000);
  int over = dial_unix();
  expect_closed(over, 2000, "a connection over the cap of 64 before hello is closed");
  close(over);
  status_ok(served, "the authenticated client with the cap full");
  close(idle[0]);
  usleep(200 * 1000);
  idle[0] = dial_unix();
  CHECK(hello(idle[0], NULL, code, msg) == 1 && !code[0], "hello after room was made: %s %s",
        code, msg);
  printf("ok: a connection that left made room\n");
  for (int i = 0; i < 64; i++) close(idle[i]);

  /* A connection that says nothing is closed after the hello timeout (10 s). */
  int mute = dial_unix();
  double t0 = now_s();
  expect_closed(mute, 15000, "a connection without hello is closed");
  double waited = now_s() - t0;
  CHECK(waited > 8 && waited < 14, "closed after %.1f s, expected about 10", waited);
  close(mute);

  /* Wrong tokens: three are answered EACCES, the fourth starts a backoff in which even the right
   * token is refused (EAGAIN) without being looked at; after it the right token works. */
  for (int i = 0; i < 4; i++) {
    int fd = dial_tcp();
    int rc = hello(fd, "wrong-token-wrong-token-wrong", code, msg);
    CHECK(rc == 1 && !strcmp(code, "EACCES"), "wrong token %d: %s %s", i + 1, code, msg);
    close(fd);
  }
  int fd = dial_tcp();
  int rc = hello(fd, g_token, code, msg);
  CHECK(rc == 1 && !strcmp(code, "EAGAIN") && strstr(msg, "too many wrong tokens"),
        "right token during the backoff: %s %s", code, msg);
  printf("ok: backoff -> %s %s\n", code, msg);
  close(fd);
  usleep(1200 * 1000);
  fd = dial_tcp();
  CHECK(hello(fd, g_token, code, msg) == 1 && !code[0], "right token after the backoff: %s %s",
        code, msg);
  printf("ok: the right token after the backoff\n");
  close(fd);

  /* Invalid UTF-8 in a request: the reply that quotes it is valid UTF-8 (a job id of bytes
   * 0xff 0xfe). */
  zt_out_init(&o);
  msgpack_pack_map(&o.pk, 3);
  zt_out_kv_u64(&o, "id", 4);
  zt_out_kv_str(&o, "op", "show");
  zt_out_kv_str(&o, "job", "j\xff\xfe");
  send_out(served, &o);
  zt_msg m;
  uint8_t *raw = NULL;
  uint32_t raw_len = 0;
  rc = recv_reply(served, 5000, &m, &raw, &raw_len);
  CHECK(rc == 1, "show of a bad id: no reply");
  if (rc == 1) {
    const msgpack_object *e = NULL;
    const char *s = "";
    size_t sl = 0;
    zt_msg_get_map(m.root, NULL, "error", true, &e, NULL);
    if (e) zt_msg_get_str(e, NULL, "message", true, &s, &sl, NULL);
    int bad = 0;
    for (size_t i = 0; i < sl; i++) bad |= (unsigned char)s[i] >= 0x80;
    CHECK(!bad, "the reply carries non-ASCII bytes: %.*s", (int)sl, s);
    printf("ok: bad UTF-8 quoted as: %.*s\n", (int)sl, s);
    zt_msg_close(&m);
  }

  /* A checkpoint of a running job, then a half-close: the reply still comes. */
  int ck = dial_unix();
  CHECK(hello(ck, NULL, code, msg) == 1 && !code[0], "hello: %s", msg);
  zt_out_init(&o);
  msgpack_pack_map(&o.pk, 3);
  zt_out_kv_u64(&o, "id", 5);
  zt_out_kv_str(&o, "op", "checkpoint");
  zt_out_kv_str(&o, "job", job);
  send_out(ck, &o);
  shutdown(ck, SHUT_WR);
  rc = reply_code(ck, 60000, code, msg);
  CHECK(rc == 1 && !code[0], "checkpoint after a half-close: rc %d %s %s", rc, code, msg);
  if (rc == 1 && !code[0]) printf("ok: the checkpoint reply survived the half-close\n");
  close(ck);
  close(served);
  if (g_failures) fprintf(stderr, "%d checks failed\n", g_failures);
  return g_failures ? 1 : 0;
}
