/* The JSON bridge: JSON -> msgpack -> JSON is the identity on specs; what JSON cannot carry is
 * refused with the path of the value. */
#include <errno.h>
#include <string.h>

#include "proto/zt_proto_json.h"
#include "tests/unit/proto/check.h"

static json_t *round_trip(const char *text) {
  json_t *in = json_loads(text, 0, NULL);
  CHECK(in != NULL);
  zt_out o;
  zt_msg m;
  zt_proto_error err;
  size_t len;
  zt_out_init(&o);
  CHECK(zt_proto_pack_json(&o.pk, in) == 0);
  const uint8_t *frame = zt_out_finish(&o, &len);
  json_t *out = NULL;
  if (zt_msg_decode(&m, frame + 4, len - 4, &err) == 0) {
    out = zt_proto_to_json(m.root, &err);
    zt_msg_close(&m);
  }
  CHECK(out && json_equal(in, out));
  zt_out_close(&o);
  json_decref(in);
  return out;
}

static void test_round_trip(void) {
  json_t *j = round_trip("{\"model\": {\"arch\": \"gpt\", \"d_model\": 64, \"n_heads\": 4},"
                         " \"train\": {\"lr\": 0.0003, \"steps\": 10, \"neg\": -7, \"big\": 9007199254740993},"
                         " \"list\": [1, 2.5, \"x\", null, true, false, [], {}], \"name\": \"\u00e9t\u00e9\", \"empty\": \"\", \"\": 0}");
  /* integers stay integers, reals stay reals */
  CHECK(json_is_integer(json_object_get(json_object_get(j, "model"), "d_model")));
  CHECK(json_is_real(json_object_get(json_object_get(j, "train"), "lr")));
  CHECK(json_integer_value(json_object_get(json_object_get(j, "train"), "big")) == 9007199254740993LL);
  json_decref(j);
}

static void test_refusals(void) {
  zt_out o;
  zt_msg m;
  zt_proto_error err;
  size_t len;
  zt_out_init(&o);
  msgpack_pack_map(&o.pk, 2);
  zt_out_kv_f64(&o, "loss", 0.0 / 0.0);
  zt_out_str(&o, "data");
  msgpack_pack_map(&o.pk, 1);
  zt_out_str(&o, "list");
  msgpack_pack_array(&o.pk, 2);
  msgpack_pack_nil(&o.pk);
  msgpack_pack_bin(&o.pk, 2);
  msgpack_pack_bin_body(&o.pk, "ab", 2);
  const uint8_t *frame = zt_out_finish(&o, &len);
  CHECK(zt_msg_decode(&m, frame + 4, len - 4, &err) == 0);
  CHECK(zt_proto_to_json(m.root, &err) == NULL);
  CHECK(err.code == -EINVAL && strstr(err.message, "'data.list[1]' is binary") != NULL);
  /* NaN has no JSON form: it becomes null */
  json_t *loss = zt_proto_to_json(zt_msg_find(m.root, "loss"), &err);
  CHECK(json_is_null(loss));
  json_decref(loss);
  zt_msg_close(&m);
  zt_out_close(&o);

  zt_out_init(&o);
  msgpack_pack_map(&o.pk, 1);
  msgpack_pack_uint64(&o.pk, 1);
  msgpack_pack_nil(&o.pk);
  frame = zt_out_finish(&o, &len);
  CHECK(zt_msg_decode(&m, frame + 4, len - 4, &err) == 0);
  CHECK(zt_proto_to_json(m.root, &err) == NULL && strstr(err.message, "not a string"));
  zt_msg_close(&m);
  zt_out_close(&o);

  zt_out_init(&o);
  msgpack_pack_map(&o.pk, 1);
  /* raw bytes: zt_out_str itself would escape them into valid UTF-8 */
  zt_out_str(&o, "bad");
  msgpack_pack_str(&o.pk, 2);
  msgpack_pack_str_body(&o.pk, "\xff\xfe", 2);
  frame = zt_out_finish(&o, &len);
  CHECK(zt_msg_decode(&m, frame + 4, len - 4, &err) == 0);
  CHECK(zt_proto_to_json(m.root, &err) == NULL && strstr(err.message, "'bad' is not valid UTF-8"));
  zt_msg_close(&m);
  zt_out_close(&o);
}

/* zt_out_str sends valid UTF-8 whatever it is given: each byte of an invalid sequence (a stray
 * 0xff, a surrogate) as the text \xNN, valid sequences (é) untouched. */
static void test_utf8_out(void) {
  zt_out o;
  zt_msg m;
  zt_proto_error err;
  size_t len;
  zt_out_init(&o);
  msgpack_pack_map(&o.pk, 1);
  zt_out_kv_str(&o, "msg", "ok \xff\xc3\xa9 \xed\xa0\x80!");
  const uint8_t *frame = zt_out_finish(&o, &len);
  CHECK(zt_msg_decode(&m, frame + 4, len - 4, &err) == 0);
  const char *got = NULL;
  size_t got_len = 0;
  CHECK(zt_msg_get_str(m.root, NULL, "msg", true, &got, &got_len, &err) == 0);
  static const char want[] = "ok \\xff\xc3\xa9 \\xed\\xa0\\x80!";
  CHECK(got_len == sizeof want - 1 && !memcmp(got, want, got_len));
  zt_msg_close(&m);
  zt_out_close(&o);
}

int main(void) {
  test_round_trip();
  test_refusals();
  test_utf8_out();
  return TEST_DONE();
}
