/* ztctl logs JOB [-f]: the job's log (what happened to it: queued, running, checkpoints, the
 * end), read in pieces with the logs request; -f follows it, polling, until the job ends. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/ztctl/ztctl.h"

#define FOLLOW_POLL_MS 500

static bool terminal(const char *state) {
  return state && (!strcmp(state, "done") || !strcmp(state, "failed") || !strcmp(state, "cancelled"));
}

int ztctl_cmd_logs(const ztctl_opts *o, int argc, char **argv) {
  const char *job = NULL;
  bool follow = false;
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "-f") || !strcmp(argv[i], "--follow")) follow = true;
    else if (argv[i][0] == '-' && argv[i][1]) return ztctl_usage_error("logs", "unknown option '%s'", argv[i]);
    else if (job) return ztctl_usage_error("logs", "logs takes 1 argument");
    else job = argv[i];
  }
  if (!job) return ztctl_usage_error("logs", "logs takes 1 argument, not 0");
  zt_client *c = ztctl_connect(o);
  if (!c) return ZTCTL_FAILED;
  int rc = ZTCTL_OK;
  uint64_t offset = 0;
  int ended_seen = 0;
  for (;;) {
    char *text = NULL;
    if (zt_client_logs(c, job, offset, &text) < 0) {
      rc = ztctl_fail(c);
      break;
    }
    json_t *j = json_loads(text, 0, NULL);
    if (o->json) printf("%s\n", text);
    free(text);
    const char *data = json_string_value(json_object_get(j, "data"));
    uint64_t next = (uint64_t)json_integer_value(json_object_get(j, "offset"));
    uint64_t size = (uint64_t)json_integer_value(json_object_get(j, "size"));
    bool ended = terminal(json_string_value(json_object_get(j, "state")));
    if (!o->json && data) fputs(data, stdout);
    fflush(stdout);
    json_decref(j);
    if (!data) {
      rc = ztctl_fail_msg("EPROTO", "the logs reply has no data");
      break;
    }
    bool at_end = next >= size;
    offset = next;
    if (!at_end) continue;
    /* a job that ends writes its last lines just after its state changes: read once more a
     * poll later */
    if (!follow || (ended && ended_seen++)) break;
    struct timespec ts = {0, FOLLOW_POLL_MS * 1000000L};
    nanosleep(&ts, NULL);
  }
  zt_client_close(c);
  return rc;
}
