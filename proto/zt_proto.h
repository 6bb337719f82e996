/* zt wire protocol: framing, the operation table, message decode/encode helpers, error codes.
 * Pure functions over byte buffers; no I/O. docs/protocol.md is the normative description.
 * Depends on msgpack-c only (zt_proto_json.h adds the JSON bridge, which needs jansson). */
#ifndef ZT_PROTO_H
#define ZT_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <msgpack.h>

#define ZT_PROTO_VERSION 1
#define ZT_PROTO_FRAME_MAX_DEFAULT (64u << 20)
#define ZT_PROTO_HEADER_BYTES 4
/* Deepest nesting of maps/arrays a frame may carry; deeper frames are refused (EINVAL). */
#define ZT_PROTO_MAX_DEPTH 16

/* ---- operations: one table drives dispatch, validation and docs ---------------------------
 * X(name, ENUM, summary). Every request is {"id": u32, "op": name, ...fields}. */
#define ZT_PROTO_OPS(X)                                                                        \
  X(hello, HELLO, "first request: protocol version check and (TCP) token")                     \
  X(status, STATUS, "daemon version, backend, devices, memory per tier, queue")                \
  X(submit, SUBMIT, "validate a job spec and queue the job; replies with its id")              \
  X(plan, PLAN, "size a job spec without queueing it: bytes per tier, or the refusal")         \
  X(join, JOIN, "daemon to daemon: run a part of a job spanning daemons, started at once")     \
  X(jobs, JOBS, "list every job the daemon knows, newest last")                                \
  X(show, SHOW, "one job: spec, state, progress, memory, loss history")                        \
  X(batch, BATCH, "push one micro-batch of tokens into a stream job (blocks on credit)")       \
  X(watch, WATCH, "subscribe this connection to a job's events")                               \
  X(cancel, CANCEL, "cancel a queued or running job")                                          \
  X(rm, RM, "remove a job that ended (done, failed, cancelled) and its directory")             \
  X(resume, RESUME, "continue a done or cancelled job from its checkpoint to more steps")      \
  X(checkpoint, CHECKPOINT, "ask a running job to write a checkpoint now")                     \
  X(export, EXPORT, "a job's weights: one safetensors file, or a Hugging Face directory")      \
  X(logs, LOGS, "read a job's log from an offset")                                           \
  X(shutdown, SHUTDOWN, "checkpoint running jobs, then stop the daemon")

typedef enum zt_proto_op {
  ZT_OP_UNKNOWN = 0,
#define ZT_X(name, NAME, summary) ZT_OP_##NAME,
  ZT_PROTO_OPS(ZT_X)
#undef ZT_X
  ZT_OP__COUNT
} zt_proto_op;

const char *zt_proto_op_name(zt_proto_op op);
const char *zt_proto_op_summary(zt_proto_op op);
zt_proto_op zt_proto_op_lookup(const char *name, size_t len);

/* ---- error codes: errno names on the wire ---------------------------------------------- */
/* "EINVAL" for -EINVAL etc.; unknown values give "EIO". */
const char *zt_proto_errname(int neg_errno);
/* Inverse of zt_proto_errname; unknown names give -EIO. */
int zt_proto_errnum(const char *name, size_t len);

/* A decode or validation failure: a negative errno and a message naming the field. */
typedef struct zt_proto_error {
  int code;
  char message[256];
} zt_proto_error;

/* Fills err (may be NULL) and returns code, so that `return zt_proto_error_set(...)` reads. */
int zt_proto_error_set(zt_proto_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- framing ---------------------------------------------------------------------------- */
void zt_frame_header_encode(uint8_t hdr[ZT_PROTO_HEADER_BYTES], uint32_t body_len);
/* 0 and *body_len on success; -EMSGSIZE over max_frame, -EINVAL for an empty body. */
int zt_frame_header_decode(const uint8_t hdr[ZT_PROTO_HEADER_BYTES], uint32_t max_frame,
                           uint32_t *body_len, zt_proto_error *err);

/* Incremental reader: feed whatever bytes arrived; it collects one frame at a time and never
 * allocates more than the announced (checked) body length. */
typedef struct zt_frame_reader {
  uint32_t max_frame;
  uint8_t hdr[ZT_PROTO_HEADER_BYTES];
  uint32_t hdr_have;
  uint32_t body_len;
  uint32_t body_have;
  uint8_t *body;
} zt_frame_reader;

void zt_frame_reader_init(zt_frame_reader *r, uint32_t max_frame);
/* Consumes up to len bytes (*consumed says how many). Returns 1 when a whole frame is ready
 * (read it with zt_frame_reader_body, then call zt_frame_reader_reset), 0 when more bytes are
 * needed, negative errno when framing is lost (oversize header: the connection must close). */
int zt_frame_reader_feed(zt_frame_reader *r, const uint8_t *data, size_t len, size_t *consumed,
                         zt_proto_error *err);
const uint8_t *zt_frame_reader_body(const zt_frame_reader *r, uint32_t *len);
void zt_frame_reader_reset(zt_frame_reader *r);
void zt_frame_reader_close(zt_frame_reader *r);

/* ---- messages --------------------------------------------------------------------------- */
/* A decoded frame body: the root is always a map (anything else is refused). */
typedef struct zt_msg {
  msgpack_unpacked up;
  const msgpack_object *root;
} zt_msg;

/* The message points into body (strings, bins): keep body alive until zt_msg_close. Malformed
 * msgpack, trailing bytes, nesting deeper than ZT_PROTO_MAX_DEPTH and counts or lengths that do
 * not fit in the body give -EINVAL; a non-map root too. zt_msg_close is safe after a failure. */
int zt_msg_decode(zt_msg *m, const uint8_t *body, size_t len, zt_proto_error *err);
void zt_msg_close(zt_msg *m);

/* Field accessors on a map. They return 0 on success, -ENOENT when the key is absent (the
 * error is filled only if required), -EINVAL for a wrong type or range; messages name the field
 * as "<prefix><key>" (prefix may be NULL, e.g. "model."). A missing required field returns
 * -ENOENT with err->code -EINVAL ("missing field 'job'"): on the wire, ENOENT means a missing
 * object (job, checkpoint), not a missing field. */
const msgpack_object *zt_msg_find(const msgpack_object *map, const char *key);
int zt_msg_get_str(const msgpack_object *map, const char *prefix, const char *key, bool required,
                   const char **s, size_t *len, zt_proto_error *err);
int zt_msg_get_u64(const msgpack_object *map, const char *prefix, const char *key, bool required,
                   uint64_t *out, zt_proto_error *err);
int zt_msg_get_f64(const msgpack_object *map, const char *prefix, const char *key, bool required,
                   double *out, zt_proto_error *err);
int zt_msg_get_bool(const msgpack_object *map, const char *prefix, const char *key, bool required,
                    bool *out, zt_proto_error *err);
int zt_msg_get_bin(const msgpack_object *map, const char *prefix, const char *key, bool required,
                   const uint8_t **data, size_t *len, zt_proto_error *err);
int zt_msg_get_map(const msgpack_object *map, const char *prefix, const char *key, bool required,
                   const msgpack_object **out, zt_proto_error *err);

/* A request's common header: id (required, u32) and op (required, known). req->id is set as
 * soon as it is read (0 before), so an error about the op can still be answered to that id.
 * An unknown op is -ENOTSUP ("unknown op 'frobnicate'"). */
typedef struct zt_request {
  uint32_t id;
  zt_proto_op op;
  const msgpack_object *body; /* the whole map */
} zt_request;
int zt_request_parse(const zt_msg *m, zt_request *req, zt_proto_error *err);

/* The length of the valid UTF-8 sequence at s (n > 0 bytes left), or 0: overlong forms,
 * surrogates and code points past U+10FFFF are invalid, as strict decoders have them. Strings
 * in replies are always valid UTF-8 (zt_out_str; the job layer's logs). */
size_t zt_proto_utf8_seq(const unsigned char *s, size_t n);

/* ---- encoding ---------------------------------------------------------------------------
 * A frame under construction: header space is reserved, zt_out_finish patches the length. */
typedef struct zt_out {
  msgpack_sbuffer buf;
  msgpack_packer pk; /* writes through the zt_out itself: do not copy an initialised zt_out */
  int err;           /* first failure (-ENOMEM); zt_out_finish then returns NULL */
} zt_out;

void zt_out_init(zt_out *o);
void zt_out_close(zt_out *o);
/* Writes the length into the header; returns the whole frame (header + body), or NULL (and
 * *len 0) when packing ran out of memory or the body exceeds 4 GiB - 1 (o->err says which). */
const uint8_t *zt_out_finish(zt_out *o, size_t *len);
/* Key/value helpers for maps (caller opens the map with msgpack_pack_map(&o->pk, n)). */
void zt_out_str(zt_out *o, const char *s);
void zt_out_kv_str(zt_out *o, const char *k, const char *v);
void zt_out_kv_u64(zt_out *o, const char *k, uint64_t v);
void zt_out_kv_i64(zt_out *o, const char *k, int64_t v);
void zt_out_kv_f64(zt_out *o, const char *k, double v);
void zt_out_kv_bool(zt_out *o, const char *k, bool v);
void zt_out_kv_bin(zt_out *o, const char *k, const void *data, size_t len);

/* Whole messages. */
/* {"id", "op", "version"[, "token"]} */
void zt_out_hello(zt_out *o, uint32_t id, const char *token);
/* {"id", "ok": false, "error": {"code", "message"}} */
void zt_out_error(zt_out *o, uint32_t id, int neg_errno, const char *message);

#endif
