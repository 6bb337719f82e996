/* defines: the HTTP listener (http.h; started and stopped by server.c): GET /metrics (the
 * Prometheus text, metrics.c), /api/jobs and /api/jobs/ID/metrics (JSON for the dashboard:
 * the jobs, and a job's step points from history.c) and the dashboard's files at / (web/).
 *
 * libmicrohttpd runs inside the loop thread, so that its handlers read the job layer and the
 * history as every other handler does, without a lock: the daemon is started without a thread
 * of its own (MHD_USE_EPOLL), its epoll descriptor is watched by a uv_poll_t and a uv_timer_t
 * keeps its timeouts, and MHD_run() runs when either fires.
 *
 * What a client may send is bounded as on the protocol's listeners (tunables.h): connections
 * in all and per address, an idle timeout, the request's line and headers in a fixed pool (no
 * body is read). On an address that is not loopback every request for data must carry the
 * daemon's token as "Authorization: Bearer TOKEN", compared in constant time, wrong tokens
 * backing off per address as on TCP (auth.c); the dashboard's own files hold no data and are
 * served to anyone, so that a browser can load the page that then sends the token. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <microhttpd.h>

#include "engine/base/clock.h"
#include "engine/base/log.h"
#include "engine/server/http.h"

#ifndef ZT_VERSION
#define ZT_VERSION "unknown"
#endif

struct zt__http {
  zt_server *srv;
  struct MHD_Daemon *d;
  uv_poll_t poll;
  uv_timer_t timer;
  bool poll_open, timer_open;   /* uv_*_init succeeded: uv_close them */
  int closing;                  /* handles whose close callback is still to come */
  bool need_token;              /* not a loopback address */
  zt__history *history;
  char last_error[256];         /* libmicrohttpd's last message, for a failed start */
};

static void mhd_log(void *cls, const char *fmt, va_list ap) {
  zt__http *http = cls;
  vsnprintf(http->last_error, sizeof http->last_error, fmt, ap);
  http->last_error[strcspn(http->last_error, "\n")] = '\0';
  ZT_LOGD("http", "%s", http->last_error);
}

/* ---- responses ------------------------------------------------------------------------ */

static enum MHD_Result send_response(struct MHD_Connection *conn, unsigned status,
                                     const char *type, void *body, size_t len,
                                     enum MHD_ResponseMemoryMode mode, bool data) {
  struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
  if (!r) {
    if (mode == MHD_RESPMEM_MUST_FREE) free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
  /* the page loads its own files and asks its own listener, nothing else */
  MHD_add_response_header(r, "Content-Security-Policy",
                          "default-src 'none'; script-src 'self'; style-src 'self'; "
                          "connect-src 'self'; img-src 'self'; frame-ancestors 'none'");
  if (data) MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  enum MHD_Result rc = MHD_queue_response(conn, status, r);
  MHD_destroy_response(r);
  return rc;
}

/* A plain-text answer: an error, or a refusal with its header. */
static enum MHD_Result send_text(struct MHD_Connection *conn, unsigned status, const char *text,
                                 const char *header, const char *header_value) {
  struct MHD_Response *r =
      MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
  if (!r) return MHD_NO;
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
  if (header) MHD_add_response_header(r, header, header_value);
  enum MHD_Result rc = MHD_queue_response(conn, status, r);
  MHD_destroy_response(r);
  return rc;
}

static enum MHD_Result send_json(struct MHD_Connection *conn, json_t *j) {
  char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
  json_decref(j);
  if (!text) return send_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n", NULL, NULL);
  return send_response(conn, MHD_HTTP_OK, "application/json", text, strlen(text),
                       MHD_RESPMEM_MUST_FREE, true);
}

/* ---- routes --------------------------------------------------------------------------- */

/* The job's entry in the job layer's list (a new reference), NULL if it has none. */
static json_t *list_entry(zt_server *srv, const char *id) {
  json_t *list = zt_jobs_list(srv->jobs), *found = NULL;
  size_t i;
  json_t *j;
  json_array_foreach(json_object_get(list, "jobs"), i, j) {
    if (!strcmp(json_string_value(json_object_get(j, "job")) ?: "", id)) {
      found = json_incref(j);
      break;
    }
  }
  json_decref(list);
  return found;
}

/* {server, backend, queue, memory, jobs: [the list's entries with their last step's tokens/s and
 * MFU]}: the dashboard's table and header. */
static enum MHD_Result route_jobs(zt__http *http, struct MHD_Connection *conn) {
  json_t *st = zt_jobs_status(http->srv->jobs);
  json_t *list = zt_jobs_list(http->srv->jobs);
  json_t *jobs = json_object_get(list, "jobs");
  size_t i;
  json_t *j;
  json_array_foreach(jobs, i, j) {
    const json_t *last = zt__history_last(http->history, json_string_value(json_object_get(j, "job")));
    if (!last) continue;
    json_object_set(j, "tokens_per_s", json_object_get(last, "tokens_per_s"));
    json_object_set(j, "mfu", json_object_get(last, "mfu"));
  }
  json_t *r = st && jobs ? json_pack("{s:s, s:s, s:{s:O, s:O}, s:O, s:O}", "server",
                                     "ztd " ZT_VERSION, "backend", http->srv->cfg->backend,
                                     "queue", "queued", json_object_get(st, "queued"), "running",
                                     json_object_get(st, "running"), "memory",
                                     json_object_get(st, "memory"), "jobs", jobs)
                         : NULL;
  json_decref(st);
  json_decref(list);
  return send_json(conn, r);
}

/* A job's evaluation points from step `from` on (an evaluation follows its step's point): the
 * history's, else (none since ztd started) points of step and eval_loss from its evals.log.
 * NULL: out of memory. */
static json_t *eval_points(zt__http *http, const char *id, long long from) {
  long long since = from - 1;
  json_t *evals = zt__history_evals(http->history, id, since);
  if (!evals || json_array_size(evals)) return evals;
  int rc;
  char msg[256];
  json_t *show = zt_jobs_show(http->srv->jobs, id, &rc, msg, sizeof msg);
  size_t i;
  json_t *e;
  json_array_foreach(json_object_get(show, "evals"), i, e) {
    json_int_t step = json_integer_value(json_array_get(e, 0));
    if (step > since)
      json_array_append_new(evals, json_pack("{s:s, s:I, s:O}", "kind", "eval", "step", step,
                                             "eval_loss", json_array_get(e, 1)));
  }
  json_decref(show);
  return evals;
}

/* {job, name, state, step, steps, points: [...], evals: [...]}: the points after step `since`:
 * the history's, after the steps before them (a job that has not stepped since ztd started, or
 * ran before a restart) as points of step and loss from its losses.log; its evaluations' points
 * from step `since` on (eval_points: one may follow the step the caller has). */
static enum MHD_Result route_job_metrics(zt__http *http, struct MHD_Connection *conn,
                                         const char *id) {
  const char *since_arg = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "since");
  char *end = NULL;
  long long since = since_arg ? strtoll(since_arg, &end, 10) : 0;
  if (since_arg && (!*since_arg || *end))
    return send_text(conn, MHD_HTTP_BAD_REQUEST, "since: expected a step number\n", NULL, NULL);
  json_t *entry = list_entry(http->srv, id);
  if (!entry) return send_text(conn, MHD_HTTP_NOT_FOUND, "no such job\n", NULL, NULL);
  int nomem = 0;
  json_t *points = zt__history_points(http->history, id, since, &nomem);
  long long first = json_integer_value(json_object_get(json_array_get(points, 0), "step"));
  if (!nomem && (!points || first > since + 1)) {
    int rc;
    char msg[256];
    json_t *show = zt_jobs_show(http->srv->jobs, id, &rc, msg, sizeof msg);
    json_t *before = json_array();
    size_t i;
    json_t *l;
    json_array_foreach(json_object_get(show, "losses"), i, l) {
      long long step = (long long)i + 1;
      if (step <= since || (points && step >= first)) continue;
      json_array_append_new(before, json_pack("{s:s, s:I, s:O}", "kind", "step", "step",
                                              (json_int_t)step, "loss", l));
    }
    json_decref(show);
    if (points && before) json_array_extend(before, points);
    json_decref(points);
    points = before;
  }
  json_t *evals = eval_points(http, id, since);
  json_t *r = points && evals ? json_pack("{s:O, s:O, s:O, s:O, s:O, s:o, s:o}", "job",
                                          json_object_get(entry, "job"), "name",
                                          json_object_get(entry, "name"), "state",
                                          json_object_get(entry, "state"), "step",
                                          json_object_get(entry, "step"), "steps",
                                          json_object_get(entry, "steps"), "points", points,
                                          "evals", evals)
                              : NULL;
  if (!points || !evals) {
    json_decref(points);
    json_decref(evals);
  }
  json_decref(entry);
  return send_json(conn, r);
}

static const zt__web_asset *asset_of(const char *url) {
  for (size_t i = 0; i < zt__web_assets_count; i++)
    if (!strcmp(zt__web_assets[i].path, url)) return &zt__web_assets[i];
  return NULL;
}

/* "Authorization: Bearer TOKEN" against the daemon's token, the wrong ones backing off per
 * client address; MHD_YES with the refusal queued (*refused), or MHD_YES to go on. */
static enum MHD_Result check_token(zt__http *http, struct MHD_Connection *conn, bool *refused) {
  *refused = false;
  if (!http->need_token) return MHD_YES;
  const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
  const char *tok = h && !strncasecmp(h, "Bearer ", 7) ? h + 7 : NULL;
  char peer[64] = "?";
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  if (ci && ci->client_addr && ci->client_addr->sa_family == AF_INET)
    uv_ip4_name((const struct sockaddr_in *)ci->client_addr, peer, sizeof peer);
  else if (ci && ci->client_addr && ci->client_addr->sa_family == AF_INET6)
    uv_ip6_name((const struct sockaddr_in6 *)ci->client_addr, peer, sizeof peer);
  char why[160];
  int rc = zt__auth_token(http->srv, peer, tok, tok ? strlen(tok) : 0, why, sizeof why);
  if (rc == 0) return MHD_YES;
  *refused = true;
  char text[200];
  snprintf(text, sizeof text, "%s\n", why);
  if (rc == -EAGAIN) {
    const char *in = strstr(why, "retry in ");
    char secs[16];
    snprintf(secs, sizeof secs, "%d", in ? atoi(in + 9) : 1);
    return send_text(conn, MHD_HTTP_TOO_MANY_REQUESTS, text, MHD_HTTP_HEADER_RETRY_AFTER, secs);
  }
  return send_text(conn, MHD_HTTP_UNAUTHORIZED, text, MHD_HTTP_HEADER_WWW_AUTHENTICATE,
                   "Bearer realm=\"ztd\"");
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **req_cls) {
  zt__http *http = cls;
  /* answered at once, from the headers: no body is ever read */
  if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
    return send_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD\n",
                     MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
  ZT_LOGD("http", "%s %s", method, url);
  const zt__web_asset *a = asset_of(url);
  if (a)
    return send_response(conn, MHD_HTTP_OK, a->content_type, (void *)a->data, a->len,
                         MHD_RESPMEM_PERSISTENT, false);
  bool is_api = !strncmp(url, "/api/", 5);
  if (!is_api && strcmp(url, "/metrics") != 0)
    return send_text(conn, MHD_HTTP_NOT_FOUND, "not found\n", NULL, NULL);
  bool refused;
  enum MHD_Result rc = check_token(http, conn, &refused);
  if (refused) return rc;
  if (!strcmp(url, "/metrics")) {
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(http->d, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
    size_t len = 0;
    char *text = zt__metrics_text(http->srv, http->history, di ? di->num_connections : 0, &len);
    if (!text) return send_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n", NULL, NULL);
    return send_response(conn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", text,
                         len, MHD_RESPMEM_MUST_FREE, true);
  }
  if (!strcmp(url, "/api/jobs")) return route_jobs(http, conn);
  /* /api/jobs/ID/metrics */
  const char *id = url + strlen("/api/jobs/");
  size_t n = strspn(id, "abcdefghijklmnopqrstuvwxyz0123456789");
  if (!strncmp(url, "/api/jobs/", 10) && n > 0 && n < ZT_JOB_ID_MAX && !strcmp(id + n, "/metrics")) {
    char job[ZT_JOB_ID_MAX];
    memcpy(job, id, n);
    job[n] = '\0';
    return route_job_metrics(http, conn, job);
  }
  return send_text(conn, MHD_HTTP_NOT_FOUND, "not found\n", NULL, NULL);
}

/* ---- the loop's side ------------------------------------------------------------------ */

static void on_timer(uv_timer_t *t);

/* MHD asks to be run again within its timeout (0 when it has work left). */
static void schedule(zt__http *http) {
  MHD_UNSIGNED_LONG_LONG ms = 0;
  if (MHD_get_timeout(http->d, &ms) == MHD_YES)
    uv_timer_start(&http->timer, on_timer, ms, 0);
  else
    uv_timer_stop(&http->timer);
}

static void run(zt__http *http) {
  MHD_run(http->d);
  schedule(http);
}

static void on_timer(uv_timer_t *t) { run(t->data); }

static void on_poll(uv_poll_t *p, int status, int events) {
  if (status < 0) ZT_LOGW("http", "poll: %s", uv_strerror(status));
  run(p->data);
}

static void http_free(zt__http *http) {
  zt__history_free(http->history);
  free(http);
}

static void on_close(uv_handle_t *h) {
  zt__http *http = h->data;
  if (--http->closing == 0) http_free(http);
}

void zt__http_on_event(zt__http *http, const char *job, const json_t *ev) {
  zt__history_on_event(http->history, job, ev, zt_unix_seconds());
}

void zt__http_stop(zt__http *http) {
  if (!http) return;
  /* the poll first: MHD_stop_daemon closes the descriptor it watches */
  http->closing = http->poll_open + http->timer_open;
  if (http->poll_open) uv_close((uv_handle_t *)&http->poll, on_close);
  if (http->timer_open) uv_close((uv_handle_t *)&http->timer, on_close);
  if (http->d) MHD_stop_daemon(http->d);
  http->d = NULL;
  if (!http->closing) http_free(http);
}

/* 127.0.0.0/8 and ::1 (also as ::ffff:127.x.y.z) */
static bool is_loopback(const struct sockaddr_storage *ss) {
  if (ss->ss_family == AF_INET)
    return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) == 127;
  const struct in6_addr *a = &((const struct sockaddr_in6 *)ss)->sin6_addr;
  return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
}

int zt__http_start(zt_server *srv, zt__http **out, char *err, size_t errlen) {
  const zt_server_config *cfg = srv->cfg;
  struct sockaddr_storage ss = {0};
  int rc = uv_ip4_addr(cfg->http_host, cfg->http_port, (struct sockaddr_in *)&ss);
  if (rc < 0) rc = uv_ip6_addr(cfg->http_host, cfg->http_port, (struct sockaddr_in6 *)&ss);
  if (rc < 0) {
    snprintf(err, errlen, "--http: %s is not an IP address", cfg->http_host);
    return -EINVAL;
  }
  zt__http *http = calloc(1, sizeof *http);
  if (!http || !(http->history = zt__history_new())) {
    free(http);
    snprintf(err, errlen, "--http: out of memory");
    return -ENOMEM;
  }
  http->srv = srv;
  http->need_token = !is_loopback(&ss);
  if (http->need_token && !cfg->token) {
    rc = -EINVAL;
    snprintf(err, errlen, "--http %s is not a loopback address: it needs --token-file",
             cfg->http_host);
    goto fail;
  }
  unsigned flags = MHD_USE_EPOLL | MHD_USE_ERROR_LOG | (ss.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0);
  http->d = MHD_start_daemon(
      flags, (uint16_t)cfg->http_port, NULL, NULL, on_request, http,
      MHD_OPTION_EXTERNAL_LOGGER, mhd_log, http,
      MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
      MHD_OPTION_CONNECTION_LIMIT, (unsigned)ZT_TUNE_HTTP_MAX_CONNS,
      MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)ZT_TUNE_HTTP_MAX_CONNS_PER_IP,
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)ZT_TUNE_HTTP_TIMEOUT_S,
      MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)ZT_TUNE_HTTP_REQUEST_MAX,
      MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)ZT_TUNE_LISTEN_BACKLOG,
      MHD_OPTION_STRICT_FOR_CLIENT, (int)1, MHD_OPTION_END);
  if (!http->d) {
    rc = -EADDRNOTAVAIL;
    snprintf(err, errlen, "--http %s:%d: %s", cfg->http_host, cfg->http_port,
             http->last_error[0] ? http->last_error : "cannot listen");
    goto fail;
  }
  const union MHD_DaemonInfo *ep = MHD_get_daemon_info(http->d, MHD_DAEMON_INFO_EPOLL_FD);
  const union MHD_DaemonInfo *port = MHD_get_daemon_info(http->d, MHD_DAEMON_INFO_BIND_PORT);
  http->poll.data = http->timer.data = http;
  if (!ep) {
    rc = -EIO;
    snprintf(err, errlen, "--http: libmicrohttpd gives no epoll descriptor");
    goto fail;
  }
  if ((rc = uv_timer_init(srv->loop, &http->timer)) < 0) goto loop_fail;
  http->timer_open = true;
  if ((rc = uv_poll_init(srv->loop, &http->poll, ep->epoll_fd)) < 0) goto loop_fail;
  http->poll_open = true;
  if ((rc = uv_poll_start(&http->poll, UV_READABLE, on_poll)) < 0) goto loop_fail;
  schedule(http);
  ZT_LOGI("server", "http listening on %s%s%s:%d%s", ss.ss_family == AF_INET6 ? "[" : "",
          cfg->http_host, ss.ss_family == AF_INET6 ? "]" : "", port ? port->port : cfg->http_port,
          http->need_token ? " (bearer token)" : "");
  *out = http;
  return 0;
loop_fail:
  snprintf(err, errlen, "--http: event loop: %s", uv_strerror(rc));
fail:
  zt__http_stop(http);
  return rc;
}
