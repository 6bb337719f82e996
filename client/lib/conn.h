/* libztclient internals: one blocking connection, its frame reader, request/reply matching and
 * the last error. The public calls in ops.c are built from these. */
#ifndef ZT_CLIENT_CONN_H
#define ZT_CLIENT_CONN_H

#include <stdint.h>
#include "client/include/zt/client.h"
#include "proto/zt_proto.h"

/* Replies may carry export chunks up to the daemon's maximum frame; this bounds what a garbled
 * peer can make the client allocate. */
#define ZT__CLIENT_REPLY_MAX (1u << 30)

struct zt_client {
  int fd;
  uint32_t next_id;
  uint32_t server_max_frame; /* from the hello reply; 0 when the daemon did not say */
  zt_frame_reader rd;
  uint8_t buf[64 * 1024];
  size_t buf_pos, buf_len;
  char code[32];
  char message[512];
};

/* Records a failure (code is a negative errno) and returns it. */
int zt__client_fail(zt_client *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Opens a request map of 2 + nfields entries with a fresh id and the op name. */
uint32_t zt__client_begin(zt_client *c, zt_out *o, const char *op, uint32_t nfields);
int zt__client_send(zt_client *c, zt_out *o);
/* The next frame, decoded (a map). Valid until the next read; close it with zt_msg_close. */
int zt__client_read(zt_client *c, zt_msg *m);
/* Sends the request and waits for the reply with its id, skipping events and other replies.
 * On success *reply is an open message (the ok reply); a server error is recorded and returned. */
int zt__client_call(zt_client *c, zt_out *o, uint32_t id, zt_msg *reply);
/* A reply or event as JSON text without the "id" and "ok" keys. */
int zt__client_to_json(zt_client *c, const msgpack_object *map, char **json_out);
/* The hello exchange on a freshly connected handle; records the daemon's frame limit. */
int zt__client_hello(zt_client *c, const char *token);

#endif
