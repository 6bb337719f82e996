/* The HTTP listener of ztd (`ztd --http`, built with the meson feature 'http'): what it serves
 * and the figures behind it. defines: the listener (http.c: libmicrohttpd driven from the loop
 * thread), the per-job history of step points (history.c), the Prometheus text of /metrics
 * (metrics.c) and the embedded dashboard files (web/, generated into web_assets.c). Called by
 * server.c; everything runs on the loop thread. */
#ifndef ZT_SERVER_HTTP_H
#define ZT_SERVER_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "engine/server/server.h"

/* ---- history.c: the last steps of the jobs that ran since the daemon started ----------- */

typedef struct zt__history zt__history;

zt__history *zt__history_new(void);
void zt__history_free(zt__history *h);
/* Keeps a point of every step event (zt_jobs_point at Unix time `now`): at most
 * ZT_TUNE_HTTP_HISTORY_POINTS per job, thinned to every other one each time they fill up (so
 * that they span the whole run), the newest always kept; a job that steps again from an earlier
 * step (resumed from a checkpoint) drops the points after it. The ZT_TUNE_HTTP_HISTORY_JOBS
 * jobs that stepped last are kept. */
void zt__history_on_event(zt__history *h, const char *job, const json_t *ev, double now);
/* The newest point of the job (borrowed), NULL when it has none. */
const json_t *zt__history_last(const zt__history *h, const char *job);
/* The job's points with a step above `since`, oldest first, as a new JSON array; NULL when the
 * job has no history (or out of memory: *nomem). */
json_t *zt__history_points(const zt__history *h, const char *job, int64_t since, int *nomem);
/* The job's evaluation points (data.eval's "eval" events, zt_jobs_point) with a step above
 * `since`, oldest first, the newest ZT_TUNE_HTTP_HISTORY_POINTS kept, as a new JSON array
 * (empty when it has none; NULL: out of memory). */
json_t *zt__history_evals(const zt__history *h, const char *job, int64_t since);

/* ---- metrics.c -------------------------------------------------------------------------- */

/* The Prometheus text exposition (format 0.0.4) of the daemon and its jobs: malloc'd, *len its
 * length; NULL when out of memory. http_conns: the HTTP listener's open connections. */
char *zt__metrics_text(zt_server *srv, const zt__history *h, unsigned http_conns, size_t *len);

/* ---- web_assets.c (generated from engine/server/web by web/embed.py) -------------------- */

typedef struct zt__web_asset {
  const char *path;          /* "/", "/app.js", ... */
  const char *content_type;
  const unsigned char *data;
  size_t len;
} zt__web_asset;
extern const zt__web_asset zt__web_assets[];
extern const size_t zt__web_assets_count;

/* ---- http.c ----------------------------------------------------------------------------- */

typedef struct zt__http zt__http;

/* Listens on cfg->http_host:http_port and serves until zt__http_stop. A non-loopback address
 * needs the token (cfg->token) as "Authorization: Bearer TOKEN" on every request for data
 * (/metrics, /api/...; the dashboard's static files carry none). Logs the address (with the
 * port picked when the flag asked for port 0). */
int zt__http_start(zt_server *srv, zt__http **out, char *err, size_t errlen);
/* A job's event (the server's zt_jobs_event_cb): its step points go into the history. */
void zt__http_on_event(zt__http *http, const char *job, const json_t *ev);
/* Closes the listener and its connections; frees once the loop has closed its handles. */
void zt__http_stop(zt__http *http);

#endif
