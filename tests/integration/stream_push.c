/* A stream job fed through libztclient: submit, push every micro-batch from a token file (each
 * push waits for credit), watch the job to its end, then check that it learned.
 * usage: stream_push SOCKET SPEC.json TOKENS.zt */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "proto/zt_tokens.h"
#include "zt/client.h"

static int fail(zt_client *c, const char *what) {
  fprintf(stderr, "FAIL %s: %s %s\n", what, c ? zt_client_error_code(c) : "",
          c ? zt_client_error_message(c) : "");
  return 1;
}

/* The whole token file's tokens (version 1 or 2) as int32; *n gets the count. */
static int32_t *load_tokens(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  uint8_t hdr[ZT_TOKENS_V2_HEADER_BYTES];
  zt_tokens_header h;
  int32_t *out = NULL;
  size_t got = fread(hdr, 1, sizeof hdr, f), count, at = ZT_TOKENS_HEADER_BYTES;
  if (got < ZT_TOKENS_HEADER_BYTES || zt_tokens_header_decode(hdr, &h) < 0) goto out;
  if (h.version == ZT_TOKENS_VERSION_DOCS) {
    if (got < sizeof hdr || zt_tokens_header_decode_v2(hdr, &h) < 0) goto out;
    at = ZT_TOKENS_V2_HEADER_BYTES;
    count = (size_t)h.n_tokens;
  } else {
    fseek(f, 0, SEEK_END);
    count = ((size_t)ftell(f) - ZT_TOKENS_HEADER_BYTES) / h.token_bytes;
  }
  fseek(f, (long)at, SEEK_SET);
  out = malloc(count * sizeof *out);
  uint8_t *raw = malloc(count * h.token_bytes);
  if (!out || !raw || fread(raw, h.token_bytes, count, f) != count) {
    free(out);
    out = NULL;
  } else {
    for (size_t i = 0; i < count; i++) {
      const uint8_t *p = raw + i * h.token_bytes;
      out[i] = h.token_bytes == 2 ? (int32_t)(p[0] | p[1] << 8) : (int32_t)zt__get_le32(p);
    }
    *n = count;
  }
  free(raw);
out:
  fclose(f);
  return out;
}

static int on_event(const char *event_json, void *user) {
  int *events = user;
  (*events)++;
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: stream_push SOCKET SPEC.json TOKENS.zt\n");
    return 2;
  }
  json_error_t jerr;
  json_t *spec = json_load_file(argv[2], 0, &jerr);
  size_t n_tok = 0;
  int32_t *tokens = load_tokens(argv[3], &n_tok);
  if (!spec || !tokens) {
    fprintf(stderr, "FAIL cannot read %s or %s\n", argv[2], argv[3]);
    return 1;
  }
  json_t *model = json_object_get(spec, "model"), *train = json_object_get(spec, "train");
  size_t T = (size_t)json_integer_value(json_object_get(model, "seq_len"));
  size_t B = (size_t)json_integer_value(json_object_get(train, "micro_batch"));
  size_t steps = (size_t)json_integer_value(json_object_get(train, "steps"));
  size_t accum = json_object_get(train, "grad_accum")
                     ? (size_t)json_integer_value(json_object_get(train, "grad_accum")) : 1;
  size_t per = B * (T + 1);
  char *spec_text = json_dumps(spec, JSON_COMPACT);
  json_decref(spec);

  zt_client *c = NULL, *w = NULL;
  int rc = 1;
  char job[ZT_CLIENT_JOB_ID_MAX];
  if (zt_client_connect_unix(&c, argv[1]) < 0) return fail(c, "connect");
  if (zt_client_submit_json(c, spec_text, job) < 0) {
    rc = fail(c, "submit");
    goto out;
  }
  printf("job %s: pushing %zu micro-batches of %zu tokens\n", job, steps * accum, per);
  for (size_t i = 0; i < steps * accum; i++) {
    size_t off = (i * per) % (n_tok - per);
    if (zt_client_push_batch(c, job, tokens + off, per) < 0) {
      rc = fail(c, "push_batch");
      goto out;
    }
  }
  if (zt_client_connect_unix(&w, argv[1]) < 0) {
    rc = fail(w, "connect watcher");
    goto out;
  }
  int events = 0;
  if (zt_client_watch(w, job, on_event, &events) < 0) {
    rc = fail(w, "watch");
    goto out;
  }
  char *show = NULL;
  if (zt_client_show(c, job, &show) < 0) {
    rc = fail(c, "show");
    goto out;
  }
  json_t *j = json_loads(show, 0, &jerr);
  free(show);
  const char *state = json_string_value(json_object_get(j, "state"));
  json_t *losses = json_object_get(j, "losses");
  size_t nl = json_array_size(losses);
  /* A loss, or a [step, loss] pair. */
  for (size_t i = 0; i < nl; i++) {
    json_t *v = json_array_get(losses, i);
    if (json_is_array(v)) json_array_set(losses, i, json_array_get(v, json_array_size(v) - 1));
  }
  if (!state || strcmp(state, "done") != 0 || nl < 20) {
    fprintf(stderr, "FAIL job %s ended %s with %zu losses\n", job, state ? state : "?", nl);
  } else {
    double first = json_number_value(json_array_get(losses, 0)), last = 0;
    for (size_t i = nl - 10; i < nl; i++) last += json_number_value(json_array_get(losses, i)) / 10;
    printf("job %s: %d events, first loss %.4f, mean of last 10 %.4f\n", job, events, first, last);
    if (last < 0.85 * first) rc = 0;
    else fprintf(stderr, "FAIL the stream job did not learn\n");
  }
  json_decref(j);
out:
  zt_client_close(w);
  zt_client_close(c);
  free(spec_text);
  free(tokens);
  return rc;
}
