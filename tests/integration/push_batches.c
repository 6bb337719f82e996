/* Pushes COUNT micro-batches into a stream job and returns once the daemon has taken them all
 * (credit), so that a test can let a stream job run exactly up to a step and then wait there.
 * The tokens are made up, batch FIRST + i of a fixed sequence, sized from the job's spec (the
 * vocabulary of a model given as a Hugging Face directory from its config.json).
 * usage: push_batches SOCKET JOB COUNT [FIRST] */
#include <stdio.h>
#include <stdlib.h>
#include <jansson.h>

#include "zt/client.h"

static int spec_int(const json_t *spec, const char *obj, const char *key) {
  return (int)json_integer_value(json_object_get(json_object_get(spec, obj), key));
}

int main(int argc, char **argv) {
  if (argc != 4 && argc != 5) {
    fprintf(stderr, "usage: push_batches SOCKET JOB COUNT [FIRST]\n");
    return 2;
  }
  long count = atol(argv[3]), first = argc == 5 ? atol(argv[4]) : 0;
  zt_client *c = NULL;
  char *show = NULL;
  json_t *j = NULL;
  int32_t *tokens = NULL;
  int rc = 1;
  if (zt_client_connect_unix(&c, argv[1]) < 0 || zt_client_show(c, argv[2], &show) < 0) {
    fprintf(stderr, "FAIL %s: %s\n", zt_client_error_code(c), zt_client_error_message(c));
    goto out;
  }
  j = json_loads(show, 0, NULL);
  const json_t *spec = json_object_get(j, "spec");
  int vocab = spec_int(spec, "model", "vocab"), T = spec_int(spec, "model", "seq_len");
  const char *hf = json_string_value(json_object_get(json_object_get(spec, "model"), "hf"));
  if (hf) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", hf);
    json_t *cfg = json_load_file(path, 0, NULL);
    vocab = (int)json_integer_value(json_object_get(cfg, "vocab_size"));
    json_decref(cfg);
  }
  int B = spec_int(spec, "train", "micro_batch");
  size_t per = (size_t)B * (size_t)(T + 1);
  if (vocab <= 0 || per == 0 || !(tokens = malloc(per * sizeof *tokens))) {
    fprintf(stderr, "FAIL no usable spec in the show reply of %s\n", argv[2]);
    goto out;
  }
  for (long b = first; b < first + count; b++) {
    for (size_t i = 0; i < per; i++)
      tokens[i] = (int32_t)(((size_t)b * 131 + i * 7 + i / 5) % (size_t)vocab);
    if (zt_client_push_batch(c, argv[2], tokens, per) < 0) {
      fprintf(stderr, "FAIL push %ld: %s %s\n", b, zt_client_error_code(c),
              zt_client_error_message(c));
      goto out;
    }
  }
  rc = 0;
out:
  free(tokens);
  json_decref(j);
  free(show);
  zt_client_close(c);
  return rc;
}
