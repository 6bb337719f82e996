/* Sends one join request, as a coordinator does, and reports the answer: "job ID" (exit 0) or
 * "CODE: message" (exit 1). With --hold SECONDS the connection stays open that long after a
 * join that succeeded (the part lives while it is open), then closes.
 * usage: join_part HOST:PORT TOKEN_FILE SPEC.json PART_JSON [--hold SECONDS] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zt/client.h"

/* The file's text, without a trailing newline (the token file's). */
static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = calloc(1, 1 << 20);
  size_t n = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
  fclose(f);
  while (buf && n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) buf[--n] = 0;
  return buf;
}

int main(int argc, char **argv) {
  if (argc != 5 && !(argc == 7 && strcmp(argv[5], "--hold") == 0)) {
    fprintf(stderr, "usage: join_part HOST:PORT TOKEN_FILE SPEC.json PART_JSON [--hold S]\n");
    return 2;
  }
  char host[256];
  const char *colon = strrchr(argv[1], ':');
  if (!colon || (size_t)(colon - argv[1]) >= sizeof host) return 2;
  memcpy(host, argv[1], (size_t)(colon - argv[1]));
  host[colon - argv[1]] = 0;
  char *token = slurp(argv[2]), *spec = slurp(argv[3]);
  if (!token || !spec) {
    fprintf(stderr, "cannot read %s or %s\n", argv[2], argv[3]);
    return 2;
  }
  zt_client *c = NULL;
  char job[ZT_CLIENT_JOB_ID_MAX];
  int rc = zt_client_connect_tcp(&c, host, atoi(colon + 1), token);
  if (rc == 0) rc = zt_client_join(c, spec, argv[4], job);
  if (rc < 0) printf("%s: %s\n", zt_client_error_code(c), zt_client_error_message(c));
  else printf("job %s\n", job);
  fflush(stdout);
  if (rc == 0 && argc == 7) sleep((unsigned)atoi(argv[6]));
  zt_client_close(c);
  free(token);
  free(spec);
  return rc < 0;
}
