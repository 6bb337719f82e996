/* Fuzz target for everything the daemon does with bytes from a client before dispatch: the frame
 * reader, message decode, request parse, the JSON bridge; and a connection's states before and
 * after its hello as engine/server/conn.c keeps them: frames of at most the pre-hello limit
 * (ZT_TUNE_PREAUTH_FRAME_MAX, a longer header refused before its body is read, the connection
 * closed), any request but hello answered "send hello first", then after a hello the limit
 * raised from the next frame's header on (zt__conn_authenticated). Built two ways:
 *   - libFuzzer: clang -fsanitize=fuzzer,address,undefined -DZT_FUZZ_LIBFUZZER ... (no main here);
 *   - otherwise: a deterministic driver (below) that runs N iterations of random bytes and
 *     mutated valid frames; the unit suite runs it with N from the `fuzz_iterations` option. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/tunables.h"
#include "proto/zt_proto.h"
#include "proto/zt_proto_json.h"

#define FUZZ_MAX_FRAME (1u << 20)
#define PREAUTH_MAX ZT_TUNE_PREAUTH_FRAME_MAX

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* How far inputs got; the driver checks that its inputs reach the decoder and the parser, the
 * connection model its hellos, a refused pre-hello header and a frame over the pre-hello limit
 * accepted after a hello. */
static unsigned long g_decoded, g_parsed, g_hellos, g_preauth_refused, g_big_after_hello;

/* A broken invariant of the connection model: abort, which both builds report. */
#define MUST(cond)                                                                             \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #cond);                                \
      abort();                                                                                 \
    }                                                                                          \
  } while (0)

/* 1 when the body is a hello dispatch accepts (its version, on a Unix socket: no token). */
static int is_hello(const uint8_t *body, uint32_t len) {
  zt_msg m;
  zt_request req;
  zt_proto_error err;
  uint64_t version = 0;
  int ok = 0;
  if (zt_msg_decode(&m, body, len, &err) < 0) return 0;
  ok = zt_request_parse(&m, &req, &err) == 0 && req.op == ZT_OP_HELLO &&
       zt_msg_get_u64(req.body, NULL, "version", true, &version, &err) == 0 &&
       version == ZT_PROTO_VERSION;
  zt_msg_close(&m);
  return ok;
}

static void handle_body(const uint8_t *body, uint32_t len) {
  zt_msg m;
  zt_proto_error err = {.code = -EIO, .message = "no error"};
  if (zt_msg_decode(&m, body, len, &err) < 0) return;
  g_decoded++;
  zt_request req;
  if (zt_request_parse(&m, &req, &err) == 0) {
    g_parsed++;
    /* what handlers do next: read typed fields */
    const char *s;
    size_t n;
    uint64_t u;
    const uint8_t *bin;
    const msgpack_object *spec;
    zt_msg_get_str(req.body, NULL, "job", false, &s, &n, &err);
    zt_msg_get_u64(req.body, NULL, "offset", false, &u, &err);
    zt_msg_get_bin(req.body, NULL, "tokens", false, &bin, &n, &err);
    zt_msg_get_map(req.body, NULL, "spec", false, &spec, &err);
  }
  json_t *j = zt_proto_to_json(m.root, &err);
  json_decref(j);
  /* and the error reply that would go back */
  zt_out o;
  size_t flen;
  zt_out_init(&o);
  zt_out_error(&o, req.id, err.code, err.message);
  zt_out_finish(&o, &flen);
  zt_out_close(&o);
  zt_msg_close(&m);
}

/* The stream of a connection from its first byte: before its hello the reader holds at most
 * PREAUTH_MAX (a header announcing more ends the connection, its body unread: nothing is
 * allocated for it), a request other than hello is answered and the connection stays before
 * hello; the hello raises the limit for the frames after it. Reads in pieces of `chunk`
 * bytes, as reads from a socket come. */
static void connection(const uint8_t *data, size_t size, size_t chunk) {
  zt_frame_reader r;
  zt_proto_error err;
  int authenticated = 0;
  zt_frame_reader_init(&r, PREAUTH_MAX);
  size_t pos = 0;
  while (pos < size) {
    size_t used, n = size - pos < chunk ? size - pos : chunk;
    uint32_t limit = r.max_frame;
    int rc = zt_frame_reader_feed(&r, data + pos, n, &used, &err);
    pos += used;
    /* never more held than the limit in force when the header came */
    MUST(r.body_len <= limit && r.body_have <= r.body_len);
    if (rc < 0) {
      /* framing lost: the daemon answers and closes, reading nothing more */
      MUST(rc == -EMSGSIZE || rc == -EINVAL);
      MUST(r.body == NULL);
      if (!authenticated && rc == -EMSGSIZE) g_preauth_refused++;
      break;
    }
    if (rc == 0) continue;
    uint32_t len;
    const uint8_t *body = zt_frame_reader_body(&r, &len);
    MUST(len <= (authenticated ? FUZZ_MAX_FRAME : PREAUTH_MAX));
    if (authenticated && len > PREAUTH_MAX) g_big_after_hello++;
    handle_body(body, len);
    if (!authenticated && is_hello(body, len)) {
      authenticated = 1;
      g_hellos++;
      r.max_frame = FUZZ_MAX_FRAME; /* from the next frame's header on */
    }
    zt_frame_reader_reset(&r);
  }
  zt_frame_reader_close(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* a connection past its hello, whole reads; then the same bytes from the first one, in reads
   * of a size the first byte picks */
  zt_frame_reader r;
  zt_proto_error err;
  zt_frame_reader_init(&r, FUZZ_MAX_FRAME);
  size_t pos = 0;
  while (pos < size) {
    size_t used;
    int rc = zt_frame_reader_feed(&r, data + pos, size - pos, &used, &err);
    pos += used;
    if (rc < 0) break;
    if (rc == 0) continue;
    uint32_t len;
    const uint8_t *body = zt_frame_reader_body(&r, &len);
    handle_body(body, len);
    zt_frame_reader_reset(&r);
  }
  zt_frame_reader_close(&r);
  connection(data, size, size && data[0] % 2 ? (size_t)(1 + data[0] % 61) : size);
  return 0;
}

#ifndef ZT_FUZZ_LIBFUZZER

static uint64_t g_rng = 0x9e3779b97f4a7c15ull; /* fixed seed: failures reproduce */

static uint64_t rnd(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return g_rng;
}

/* A random msgpack value, nested up to `depth` more levels. */
static void random_value(msgpack_packer *pk, int depth) {
  switch (rnd() % (depth > 0 ? 9 : 6)) {
  case 0: msgpack_pack_uint64(pk, rnd() >> (rnd() % 64)); break;
  case 1: msgpack_pack_int64(pk, -(int64_t)(rnd() >> (1 + rnd() % 63))); break;
  case 2: msgpack_pack_double(pk, (double)(int64_t)rnd() / 1e6); break;
  case 3: {
    static const char *const words[] = {"id", "op", "job", "spec", "hello", "batch", "tokens",
                                        "export", "offset", "\xff\xfe", ""};
    const char *w = words[rnd() % (sizeof words / sizeof words[0])];
    msgpack_pack_str_with_body(pk, w, strlen(w));
    break;
  }
  case 4: msgpack_pack_bin_with_body(pk, "\x00\x01\x02\x03", rnd() % 5); break;
  case 5: msgpack_pack_nil(pk); break;
  case 6: case 7: {
    uint32_t n = rnd() % 4;
    msgpack_pack_map(pk, n);
    for (uint32_t i = 0; i < n; i++) {
      if (rnd() % 8)
        random_value(pk, 0);
      else
        msgpack_pack_uint64(pk, i);
      random_value(pk, depth - 1);
    }
    break;
  }
  default: {
    uint32_t n = rnd() % 4;
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++) random_value(pk, depth - 1);
  }
  }
}

/* A plausible request frame: valid header, a map with id, op and random fields; sometimes a
 * bin larger than the pre-hello limit. */
static void seed_frame(zt_out *o) {
  static uint8_t big[PREAUTH_MAX + 2048];
  zt_out_init(o);
  uint32_t extra = rnd() % 4, large = rnd() % 8 == 0;
  msgpack_pack_map(&o->pk, 2 + extra + large);
  zt_out_kv_u64(o, "id", rnd() % 1000);
  zt_out_kv_str(o, "op", zt_proto_op_name((zt_proto_op)(1 + rnd() % (ZT_OP__COUNT - 1))));
  for (uint32_t i = 0; i < extra; i++) {
    random_value(&o->pk, 0);
    random_value(&o->pk, (int)(rnd() % (ZT_PROTO_MAX_DEPTH + 3)));
  }
  if (large) zt_out_kv_bin(o, "tokens", big, PREAUTH_MAX + rnd() % 2048);
}

/* The hello a client opens with (now and then another version). */
static void hello_frame(zt_out *o) {
  zt_out_init(o);
  msgpack_pack_map(&o->pk, 3);
  zt_out_kv_u64(o, "id", 1);
  zt_out_kv_str(o, "op", "hello");
  zt_out_kv_u64(o, "version", rnd() % 8 ? ZT_PROTO_VERSION : rnd() % 4);
}

int main(int argc, char **argv) {
  long iterations = argc > 1 ? atol(argv[1]) : ZT_FUZZ_ITERATIONS;
  uint8_t *buf = malloc(1 << 16);
  if (!buf) return 1;
  for (long it = 0; it < iterations; it++) {
    size_t len = 0;
    uint64_t mode = rnd() % 8;
    if (mode == 0) {
      len = rnd() % 64;
      for (size_t i = 0; i < len; i++) buf[i] = (uint8_t)rnd();
    } else {
      /* one to three frames back to back, often after a hello, then mutations */
      int frames = 1 + (int)(rnd() % 3), hello = rnd() % 2;
      for (int f = 0; f < frames + hello; f++) {
        zt_out o;
        size_t flen;
        if (hello && f == 0) hello_frame(&o);
        else seed_frame(&o);
        const uint8_t *frame = zt_out_finish(&o, &flen);
        if (frame && len + flen <= (1 << 15)) {
          memcpy(buf + len, frame, flen);
          len += flen;
        }
        zt_out_close(&o);
      }
      int mutations = mode == 1 ? 0 : 1 + (int)(rnd() % 4);
      for (int k = 0; k < mutations && len > 0; k++) {
        size_t at = rnd() % len;
        switch (rnd() % 5) {
        case 0: buf[at] ^= (uint8_t)(1u << (rnd() % 8)); break;
        case 1: buf[at] = (uint8_t)rnd(); break;
        case 2: len = at + 1; break; /* truncate */
        case 3: /* an interesting byte: container and length markers */
          buf[at] = (const uint8_t[]){0xdf, 0xdd, 0xdb, 0xc6, 0xc9, 0x8f, 0x9f, 0xc1}[rnd() % 8];
          break;
        default:
          if (len + 4 <= (1 << 16)) {
            memmove(buf + at + 4, buf + at, len - at);
            for (int b = 0; b < 4; b++) buf[at + b] = (uint8_t)rnd();
            len += 4;
          }
        }
      }
      /* mostly keep the first header honest so that mutated bodies reach the decoder; now and
       * then announce a frame over the pre-hello limit up front */
      if (len >= 4 && rnd() % 16 == 0)
        zt_frame_header_encode(buf, PREAUTH_MAX + 1 + (uint32_t)(rnd() % (64u << 20)));
      else if (len >= 4 && mutations && rnd() % 4)
        zt_frame_header_encode(buf, (uint32_t)(len - 4));
    }
    LLVMFuzzerTestOneInput(buf, len);
  }
  free(buf);
  printf("%ld iterations: %lu messages decoded, %lu requests parsed; %lu hellos, %lu pre-hello "
         "headers refused, %lu frames over the pre-hello limit after a hello\n", iterations,
         g_decoded, g_parsed, g_hellos, g_preauth_refused, g_big_after_hello);
  /* a generator whose inputs all die at the framing layer would test nothing */
  if (iterations >= 1000 && (g_decoded < (unsigned long)iterations / 10 || g_parsed == 0 ||
                             !g_hellos || !g_preauth_refused || !g_big_after_hello)) {
    fprintf(stderr, "too few inputs reached the decoder or the states of a connection\n");
    return 1;
  }
  return 0;
}

#endif
