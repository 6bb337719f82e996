/* Watchers: per job, the connections that asked for its events. The job layer reports every
 * event once (zt__watch_on_event); it is encoded once and queued on each watcher. The "end"
 * event is a job's last, so it also detaches the job's watchers. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/log.h"
#include "engine/server/server.h"
#include "proto/zt_proto_json.h"

typedef struct zt_watcher {
  zt_conn *conn;
  struct zt_watcher *next;
} zt_watcher;

struct zt_watch {
  char job[ZT_JOB_ID_MAX];
  zt_watcher *watchers;
  zt_watch *next;
};

static zt_watch **watch_find(zt_server *srv, const char *job) {
  zt_watch **pw = &srv->watches;
  while (*pw && strcmp((*pw)->job, job) != 0) pw = &(*pw)->next;
  return pw;
}

static void watch_free(zt_watch *w) {
  while (w->watchers) {
    zt_watcher *next = w->watchers->next;
    free(w->watchers);
    w->watchers = next;
  }
  free(w);
}

int zt__watch_add(zt_server *srv, zt_conn *c, const char *job) {
  zt_watch **pw = watch_find(srv, job);
  zt_watch *w = *pw;
  if (!w) {
    w = calloc(1, sizeof *w);
    if (!w) return -ENOMEM;
    snprintf(w->job, sizeof w->job, "%s", job);
    *pw = w;
  }
  for (zt_watcher *it = w->watchers; it; it = it->next)
    if (it->conn == c) return 0;
  zt_watcher *n = calloc(1, sizeof *n);
  if (!n) {
    if (!w->watchers) {
      *pw = w->next;
      free(w);
    }
    return -ENOMEM;
  }
  n->conn = c;
  n->next = w->watchers;
  w->watchers = n;
  return 0;
}

void zt__watch_drop_conn(zt_server *srv, zt_conn *c) {
  zt_watch **pw = &srv->watches;
  while (*pw) {
    zt_watch *w = *pw;
    for (zt_watcher **pn = &w->watchers; *pn;) {
      if ((*pn)->conn == c) {
        zt_watcher *dead = *pn;
        *pn = dead->next;
        free(dead);
      } else {
        pn = &(*pn)->next;
      }
    }
    if (!w->watchers) {
      *pw = w->next;
      free(w);
    } else {
      pw = &w->next;
    }
  }
}

void zt__watch_free_all(zt_server *srv) {
  while (srv->watches) {
    zt_watch *next = srv->watches->next;
    watch_free(srv->watches);
    srv->watches = next;
  }
}

int zt__watch_send_event(zt_conn *c, json_t *event) {
  zt_out o;
  zt_out_init(&o);
  int rc = zt_proto_pack_json(&o.pk, event);
  if (rc < 0) {
    zt_out_close(&o);
    return rc;
  }
  size_t len = 0;
  const uint8_t *frame = zt_out_finish(&o, &len);
  rc = frame ? zt__conn_send(c, frame, len, true) : -ENOMEM;
  zt_out_close(&o);
  return rc;
}

void zt__watch_on_event(void *user, const char *job, json_t *event) {
  zt_server *srv = user;
  if (!event || !json_is_object(event)) return;
  zt_watch **pw = watch_find(srv, job);
  zt_watch *w = *pw;
  if (!w) return;
  const char *kind = json_string_value(json_object_get(event, "event"));
  bool end = kind && strcmp(kind, "end") == 0;
  /* Detach first: a watcher dropped while sending closes, and closing edits these lists. */
  if (end) *pw = w->next;
  zt_out o;
  zt_out_init(&o);
  size_t len = 0;
  const uint8_t *frame = NULL;
  if (zt_proto_pack_json(&o.pk, event) == 0) frame = zt_out_finish(&o, &len);
  if (!frame) ZT_LOGE("watch", "could not encode an event of job %s", job);
  /* Sending may drop (close) a watcher, which edits this list: walk a snapshot of the conns. */
  size_t n = 0;
  for (zt_watcher *it = w->watchers; it; it = it->next) n++;
  zt_conn **conns = n ? calloc(n, sizeof *conns) : NULL;
  if (n && !conns) ZT_LOGE("watch", "out of memory: an event of job %s is lost", job);
  if (conns) {
    size_t i = 0;
    for (zt_watcher *it = w->watchers; it; it = it->next) conns[i++] = it->conn;
  }
  if (end) watch_free(w);
  for (size_t i = 0; frame && conns && i < n; i++) {
    zt_conn *c = conns[i];
    /* A close earlier in this walk (an earlier watcher dropped) cannot free a conn: freeing
     * happens in its close callback, on a later loop turn. */
    if (!c->closing) zt__conn_send(c, frame, len, true);
  }
  free(conns);
  zt_out_close(&o);
}
