/* One request as the test writes it, the reply as JSON: for the fields ztctl never sends
 * wrong. Sends hello, then the JSON object (its "id" set to 2) as one request, and prints the
 * reply, events skipped, as one line of JSON ("bin" values as their length).
 * usage: request SOCKET JSON */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "proto/zt_proto.h"
#include "proto/zt_proto_json.h"

static int send_frame(int fd, zt_out *o) {
  size_t len;
  const uint8_t *f = zt_out_finish(o, &len);
  while (f && len) {
    ssize_t n = send(fd, f, len, MSG_NOSIGNAL);
    if (n <= 0) return -1;
    f += n;
    len -= (size_t)n;
  }
  zt_out_close(o);
  return f ? 0 : -1;
}

/* The next reply with id 2, or hello's (id 1), as JSON; NULL on EOF or a bad frame. */
static json_t *reply_of(int fd, uint64_t want) {
  zt_frame_reader r;
  zt_frame_reader_init(&r, 1u << 30);
  json_t *out = NULL;
  for (;;) {
    uint8_t byte;
    if (recv(fd, &byte, 1, 0) <= 0) break;
    size_t used;
    zt_proto_error err;
    int rc = zt_frame_reader_feed(&r, &byte, 1, &used, &err);
    if (rc < 0) break;
    if (rc == 0) continue;
    uint32_t len;
    const uint8_t *body = zt_frame_reader_body(&r, &len);
    zt_msg m;
    uint64_t id = 0;
    if (zt_msg_decode(&m, body, len, &err) < 0) break;
    /* bin (export's data) does not convert: its length stands in for it */
    const msgpack_object *data = zt_msg_find(m.root, "data");
    size_t data_len = data && data->type == MSGPACK_OBJECT_BIN ? data->via.bin.size : 0;
    if (data && data->type == MSGPACK_OBJECT_BIN)
      ((msgpack_object *)data)->type = MSGPACK_OBJECT_NIL;
    if (!zt_msg_find(m.root, "event") &&
        zt_msg_get_u64(m.root, NULL, "id", false, &id, NULL) == 0 && id == want) {
      out = zt_proto_to_json(m.root, &err);
      if (out && data) json_object_set_new(out, "data", json_integer((json_int_t)data_len));
    }
    zt_msg_close(&m);
    zt_frame_reader_reset(&r);
    if (out) break;
  }
  zt_frame_reader_close(&r);
  return out;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: request SOCKET JSON\n");
    return 2;
  }
  json_error_t je;
  json_t *req = json_loads(argv[2], 0, &je), *hello = NULL, *rep = NULL;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", argv[1]);
  int fd = socket(AF_UNIX, SOCK_STREAM, 0), rc = 1;
  if (!req || fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
    fprintf(stderr, "request: %s\n", req ? "cannot connect" : je.text);
    goto out;
  }
  zt_out o;
  zt_out_init(&o);
  zt_out_hello(&o, 1, NULL);
  if (send_frame(fd, &o) < 0 || !(hello = reply_of(fd, 1))) goto out;
  json_object_set_new(req, "id", json_integer(2));
  zt_out_init(&o);
  if (zt_proto_pack_json(&o.pk, req) < 0 || send_frame(fd, &o) < 0 || !(rep = reply_of(fd, 2)))
    goto out;
  json_object_del(rep, "id");
  char *s = json_dumps(rep, JSON_COMPACT | JSON_SORT_KEYS);
  if (s) printf("%s\n", s);
  free(s);
  rc = 0;
out:
  if (fd >= 0) close(fd);
  json_decref(req);
  json_decref(hello);
  json_decref(rep);
  return rc;
}
