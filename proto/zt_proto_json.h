/* The JSON bridge: job specs are JSON for people and msgpack on the wire; client replies are
 * handed to programs as JSON text. Needs jansson. */
#ifndef ZT_PROTO_JSON_H
#define ZT_PROTO_JSON_H

#include <jansson.h>
#include "zt_proto.h"

/* msgpack -> JSON. Maps need string keys; bin values are refused (-EINVAL, naming the key path).
 * Returns a new reference or NULL with err set. */
json_t *zt_proto_to_json(const msgpack_object *o, zt_proto_error *err);
/* JSON -> msgpack through a packer. Integers stay integers, reals stay doubles. */
int zt_proto_pack_json(msgpack_packer *pk, const json_t *j);

#endif
