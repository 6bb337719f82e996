/* Listeners and the daemon's lifetime: the Unix socket (and TCP when asked), signals, the
 * graceful stop. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "engine/base/log.h"
#include "engine/server/server.h"
#ifdef ZT_HAVE_HTTP
#include "engine/server/http.h"
#endif

_Static_assert(ZT_TUNE_MAX_GPUS == ZT_JOBS_MAX_GPUS, "--gpus fills zt_jobs_config.gpus");

static void server_maybe_finish(zt_server *srv) {
  if (srv->stopping && srv->jobs_stopped && !srv->conns) uv_stop(srv->loop);
}

void zt__server_conn_gone(zt_server *srv) { server_maybe_finish(srv); }

static void on_flush_timeout(uv_timer_t *t) {
  zt_server *srv = t->data;
  ZT_LOGW("server", "clients did not read their last replies in time; closing them");
  while (srv->conns) zt__conn_close(srv->conns);
}

static void on_jobs_stopped(void *user) {
  zt_server *srv = user;
  srv->jobs_stopped = true;
  ZT_LOGI("server", "jobs stopped; flushing replies");
  for (zt_conn *c = srv->conns, *next; c; c = next) {
    next = c->next;
    zt__conn_close_when_flushed(c);
  }
  if (srv->conns) uv_timer_start(&srv->flush_timer, on_flush_timeout, ZT_TUNE_SHUTDOWN_FLUSH_MS, 0);
  server_maybe_finish(srv);
}

static void unlink_socket(zt_server *srv) {
  if (!srv->socket_bound) return;
  srv->socket_bound = false;
  if (unlink(srv->cfg->socket_path) < 0 && errno != ENOENT)
    ZT_LOGW("server", "unlink %s: %s", srv->cfg->socket_path, strerror(errno));
}

static void http_stop(zt_server *srv) {
#ifdef ZT_HAVE_HTTP
  zt__http_stop(srv->http);
#endif
  srv->http = NULL;
}

/* The job layer's events: the HTTP listener's history keeps the steps, watchers get them all. */
static void on_job_event(void *user, const char *job, json_t *ev) {
#ifdef ZT_HAVE_HTTP
  zt_server *srv = user;
  if (srv->http) zt__http_on_event(srv->http, job, ev);
#endif
  zt__watch_on_event(user, job, ev);
}

void zt__server_stop(zt_server *srv) {
  if (srv->stopping) return;
  srv->stopping = true;
  ZT_LOGI("server", "stopping: no new connections, running jobs checkpoint");
  if (srv->unix_open) uv_close((uv_handle_t *)&srv->unix_listener, NULL);
  if (srv->tcp_open) uv_close((uv_handle_t *)&srv->tcp_listener, NULL);
  srv->unix_open = srv->tcp_open = false;
  http_stop(srv);
  unlink_socket(srv);
  /* No new requests; replies to the ones in flight (a checkpoint, say) still go out. */
  for (zt_conn *c = srv->conns; c; c = c->next) zt__conn_pause(c, ZT_CONN_PAUSE_STOPPING);
  zt_jobs_shutdown(srv->jobs, on_jobs_stopped, srv);
}

static void on_signal(uv_signal_t *s, int signum) {
  zt_server *srv = s->data;
  ZT_LOGI("server", "signal %d", signum);
  zt__server_stop(srv);
}

/* SIGHUP: the log file was rotated (ztd --log-file); without one it changes nothing. */
static void on_hangup(uv_signal_t *s, int signum) {
  int rc = zt_log_reopen();
  if (rc < 0) ZT_LOGW("server", "SIGHUP: reopening the log file: %s", strerror(-rc));
  else ZT_LOGI("server", "SIGHUP: log file reopened");
}

static void on_connection(uv_stream_t *listener, int status, bool is_tcp) {
  zt_server *srv = listener->data;
  if (status < 0) {
    ZT_LOGW("server", "accept: %s", uv_strerror(status));
    return;
  }
  if (srv->stopping) return;
  int rc = zt__conn_accept(srv, listener, is_tcp);
  if (rc < 0) ZT_LOGW("server", "accept: %s", uv_strerror(rc));
}

static void on_unix_connection(uv_stream_t *l, int status) { on_connection(l, status, false); }
static void on_tcp_connection(uv_stream_t *l, int status) { on_connection(l, status, true); }

/* mkdir -p, creating missing directories with `mode`. */
static int make_dirs(const char *path, mode_t mode) {
  char buf[PATH_MAX];
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return -ENAMETOOLONG;
  for (char *p = buf + 1;; p++) {
    if (*p != '/' && *p != '\0') continue;
    char saved = *p;
    *p = '\0';
    if (mkdir(buf, mode) < 0 && errno != EEXIST) return -errno;
    struct stat st;
    if (stat(buf, &st) < 0) return -errno;
    if (!S_ISDIR(st.st_mode)) return -ENOTDIR;
    *p = saved;
    if (saved == '\0') return 0;
  }
}

/* The job layer creates, checks and locks the state directory itself, one level deep; the
 * default (~/.local/share/zt) may lack its parents on a fresh account. */
static int state_dir_prepare(const char *dir, char *err, size_t errlen) {
  int rc = make_dirs(dir, 0700);
  if (rc < 0) snprintf(err, errlen, "state dir %s: %s", dir, strerror(-rc));
  return rc;
}

/* A socket file left by a ztd that died is removed; one that answers belongs to a live ztd. */
static int socket_claim(const char *path, char *err, size_t errlen) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa.sun_path) {
    snprintf(err, errlen, "socket path %s is longer than %zu bytes", path, sizeof sa.sun_path - 1);
    return -ENAMETOOLONG;
  }
  memcpy(sa.sun_path, path, strlen(path) + 1);
  char parent[sizeof sa.sun_path];
  memcpy(parent, path, strlen(path) + 1); /* shorter than sun_path: checked above */
  char *slash = strrchr(parent, '/');
  if (slash && slash != parent) {
    *slash = '\0';
    int rc = make_dirs(parent, 0700);
    if (rc < 0) {
      snprintf(err, errlen, "socket directory %s: %s", parent, strerror(-rc));
      return rc;
    }
  }
  struct stat st;
  if (lstat(path, &st) < 0) {
    if (errno == ENOENT) return 0;
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return -errno;
  }
  if (!S_ISSOCK(st.st_mode)) {
    snprintf(err, errlen, "%s exists and is not a socket", path);
    return -EEXIST;
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    snprintf(err, errlen, "socket: %s", strerror(errno));
    return -errno;
  }
  int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
  int e = errno;
  close(fd);
  if (rc == 0) {
    snprintf(err, errlen, "another ztd is serving %s", path);
    return -EADDRINUSE;
  }
  if (e != ECONNREFUSED) {
    snprintf(err, errlen, "%s: %s", path, strerror(e));
    return -e;
  }
  ZT_LOGI("server", "removing stale socket %s", path);
  if (unlink(path) < 0 && errno != ENOENT) {
    snprintf(err, errlen, "unlink stale socket %s: %s", path, strerror(errno));
    return -errno;
  }
  return 0;
}

static int listen_unix(zt_server *srv, char *err, size_t errlen) {
  const char *path = srv->cfg->socket_path;
  int rc = uv_pipe_init(srv->loop, &srv->unix_listener, 0);
  if (rc < 0) goto fail;
  srv->unix_open = true;
  srv->unix_listener.data = srv;
  /* Owner-only from the first instant: the socket is the daemon's whole authority. */
  mode_t old = umask(0177);
  rc = uv_pipe_bind(&srv->unix_listener, path);
  umask(old);
  if (rc < 0) goto fail;
  srv->socket_bound = true;
  rc = uv_listen((uv_stream_t *)&srv->unix_listener, ZT_TUNE_LISTEN_BACKLOG, on_unix_connection);
  if (rc < 0) goto fail;
  return 0;
fail:
  snprintf(err, errlen, "listen on %s: %s", path, uv_strerror(rc));
  return rc;
}

static int listen_tcp(zt_server *srv, char *err, size_t errlen) {
  const zt_server_config *cfg = srv->cfg;
  struct sockaddr_storage ss;
  int rc = uv_ip4_addr(cfg->tcp_host, cfg->tcp_port, (struct sockaddr_in *)&ss);
  if (rc < 0) rc = uv_ip6_addr(cfg->tcp_host, cfg->tcp_port, (struct sockaddr_in6 *)&ss);
  if (rc < 0) {
    snprintf(err, errlen, "--tcp: %s is not an IP address", cfg->tcp_host);
    return rc;
  }
  rc = uv_tcp_init(srv->loop, &srv->tcp_listener);
  if (rc < 0) goto fail;
  srv->tcp_open = true;
  srv->tcp_listener.data = srv;
  rc = uv_tcp_bind(&srv->tcp_listener, (const struct sockaddr *)&ss, 0);
  if (rc < 0) goto fail;
  rc = uv_listen((uv_stream_t *)&srv->tcp_listener, ZT_TUNE_LISTEN_BACKLOG, on_tcp_connection);
  if (rc < 0) goto fail;
  ZT_LOGI("server", "listening on tcp %s:%d", cfg->tcp_host, cfg->tcp_port);
  return 0;
fail:
  snprintf(err, errlen, "--tcp %s:%d: %s", cfg->tcp_host, cfg->tcp_port, uv_strerror(rc));
  return rc;
}

static void close_any(uv_handle_t *h, void *arg) {
  if (!uv_is_closing(h)) uv_close(h, NULL);
}

int zt_server_run(const zt_server_config *cfg, char *err, size_t errlen) {
  uv_loop_t loop;
  zt_server srv = {.loop = &loop, .cfg = cfg};
  bool loop_ok = false;
  /* A write past RLIMIT_FSIZE (a checkpoint, a job's NVMe file) must fail that job with EFBIG,
   * not kill the daemon with every job in it. */
  signal(SIGXFSZ, SIG_IGN);
  int rc = state_dir_prepare(cfg->state_dir, err, errlen);
  if (rc < 0) goto out;
  rc = socket_claim(cfg->socket_path, err, errlen);
  if (rc < 0) goto out;
  rc = uv_loop_init(&loop);
  if (rc < 0) {
    snprintf(err, errlen, "event loop: %s", uv_strerror(rc));
    goto out;
  }
  loop_ok = true;
  rc = listen_unix(&srv, err, errlen);
  if (rc < 0) goto out;
  if (cfg->tcp_host) {
    rc = listen_tcp(&srv, err, errlen);
    if (rc < 0) goto out;
  }
  /* how the parts this daemon coordinates name it: the host, and the TCP address if any */
  char name[512], host[256] = "?";
  gethostname(host, sizeof host - 1);
  if (cfg->tcp_host) snprintf(name, sizeof name, "ztd on %s (%s:%d)", host, cfg->tcp_host, cfg->tcp_port);
  else snprintf(name, sizeof name, "ztd on %s", host);
  zt_jobs_config jc = {
      .loop = &loop,
      .state_dir = cfg->state_dir,
      .backend = cfg->backend,
      .cpu_threads = cfg->cpu_threads,
      .n_gpus = cfg->n_gpus,
      .cpu_ranks = cfg->cpu_ranks,
      .host_mem_limit = cfg->host_mem_limit,
      .gpu_mem_limit = cfg->gpu_mem_limit,
      .nvme_dir = cfg->nvme_dir,
      .nvme_dirs = cfg->nvme_dirs,
      .n_nvme_dirs = cfg->n_nvme_dirs,
      .data_roots = cfg->data_roots,
      .n_data_roots = cfg->n_data_roots,
      .batch_queue_depth = ZT_TUNE_BATCH_QUEUE_DEPTH,
      .max_queued = cfg->max_queued,
      .max_state_bytes = cfg->max_state_bytes,
      .peer_token = cfg->tcp_host ? cfg->token : NULL,
      .name = name,
      .on_event = on_job_event,
      .user = &srv,
  };
  memcpy(jc.gpus, cfg->gpus, sizeof jc.gpus);
  rc = zt_jobs_open(&srv.jobs, &jc, err, errlen);
  if (rc < 0) goto out;
#ifdef ZT_HAVE_HTTP
  if (cfg->http_host && (rc = zt__http_start(&srv, &srv.http, err, errlen)) < 0) goto out;
#endif
  if ((rc = uv_timer_init(&loop, &srv.flush_timer)) < 0 ||
      (rc = uv_signal_init(&loop, &srv.sig_term)) < 0 ||
      (rc = uv_signal_init(&loop, &srv.sig_int)) < 0 ||
      (rc = uv_signal_init(&loop, &srv.sig_hup)) < 0) {
    snprintf(err, errlen, "event loop: %s", uv_strerror(rc));
    goto out;
  }
  srv.flush_timer.data = srv.sig_term.data = srv.sig_int.data = srv.sig_hup.data = &srv;
  if ((rc = uv_signal_start(&srv.sig_term, on_signal, SIGTERM)) < 0 ||
      (rc = uv_signal_start(&srv.sig_int, on_signal, SIGINT)) < 0 ||
      (rc = uv_signal_start(&srv.sig_hup, on_hangup, SIGHUP)) < 0) {
    snprintf(err, errlen, "signals: %s", uv_strerror(rc));
    goto out;
  }
  ZT_LOGI("server", "serving %s (state %s, backend %s)", cfg->socket_path, cfg->state_dir,
          cfg->backend);
  uv_run(&loop, UV_RUN_DEFAULT);
  rc = 0;
out:
  unlink_socket(&srv);
  http_stop(&srv);
  /* Connections first: closing one hands its pending requests back to the job layer. */
  while (srv.conns) zt__conn_close(srv.conns);
  if (srv.jobs) zt_jobs_close(srv.jobs);
  srv.jobs = NULL;
  if (loop_ok) {
    uv_walk(&loop, close_any, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    zt__watch_free_all(&srv);
    if (uv_loop_close(&loop) < 0) ZT_LOGW("server", "event loop closed with handles open");
  }
  return rc;
}
