/* The ztd server: listeners (Unix socket, optional TCP with a token), connections with the
 * frame reader and a bounded write queue, the dispatch table over the protocol's operations,
 * and the watcher lists that carry job events to clients. Everything here runs on the one libuv
 * loop thread; the job layer (engine/job/jobs.h) calls back on that thread too. */
#ifndef ZT_SERVER_H
#define ZT_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include <uv.h>

#include "engine/job/jobs.h"
#include "engine/base/tunables.h"
#include "proto/zt_proto.h"

typedef struct zt_server_config {
  const char *socket_path;
  const char *state_dir;
  const char *backend;          /* the backend jobs train on ("cpu") */
  int gpus[ZT_TUNE_MAX_GPUS];   /* --gpus: the GPUs jobs are scheduled on (cuda; none: GPU 0) */
  int n_gpus;
  int cpu_ranks;                /* --cpu-ranks: simulated ranks of the cpu backend */
  uint64_t gpu_mem_limit;       /* 0 = none given */
  uint64_t host_mem_limit;      /* 0 = no limit */
  const char *nvme_dir;         /* NULL = none; else nvme_dirs[0] */
  /* --nvme-dir and --data-root, resolved (engine/job/jobs.h's zt_jobs_config says more) */
  const char *nvme_dirs[ZT_TUNE_MAX_ROOTS];
  int n_nvme_dirs;
  const char *data_roots[ZT_TUNE_MAX_ROOTS];
  int n_data_roots;
  const char *tcp_host;         /* NULL = no TCP listener */
  int tcp_port;
  const char *token;            /* required with tcp_host */
  size_t token_len;
  uint32_t max_frame;
  int cpu_threads;
  const char *http_host;        /* --http: NULL = no HTTP listener (engine/server/http.h) */
  int http_port;                /* 0: one the kernel picks (logged) */
  int max_queued;               /* --max-queued: 0 = no limit */
  uint64_t max_state_bytes;     /* --max-state-bytes: 0 = no limit */
} zt_server_config;

/* Starts listening, serves until SIGTERM/SIGINT or a shutdown request, stops gracefully.
 * Returns 0 after a graceful stop, or a negative errno with a message when ztd cannot start
 * (socket in use, state dir unusable, bad token file ...). */
int zt_server_run(const zt_server_config *cfg, char *err, size_t errlen);

/* ---- internal to engine/server ------------------------------------------------------------ */

typedef struct zt_conn zt_conn;
typedef struct zt_pending zt_pending;
typedef struct zt_watch zt_watch;
typedef struct zt__http zt__http; /* http.h */

/* A TCP peer address that sent wrong tokens (auth.c). */
typedef struct zt_auth_peer {
  char addr[64];
  int failures;                 /* wrong tokens since the last right one */
  uint64_t until_ms;            /* the loop's time until which its hellos are refused */
  uint64_t last_ms;             /* its last failure, for eviction from a full table */
} zt_auth_peer;

typedef struct zt_server {
  uv_loop_t *loop;
  const zt_server_config *cfg;
  uv_pipe_t unix_listener;
  uv_tcp_t tcp_listener;
  bool unix_open, tcp_open, socket_bound;
  uv_signal_t sig_term, sig_int, sig_hup;
  uv_timer_t flush_timer;
  zt_jobs *jobs;
  zt_conn *conns;               /* every open connection */
  zt_watch *watches;            /* subscriptions, see watch.c */
  bool stopping;                /* a graceful stop has begun */
  bool jobs_stopped;            /* the job layer has checkpointed and stopped */
  /* connections per listener [0 unix, 1 tcp], and of those the ones not past their hello */
  int n_conns[2], n_preauth[2];
  bool cap_logged[2];           /* a refusal over a cap is logged once until one fits again */
  zt_auth_peer auth_peers[ZT_TUNE_TOKEN_PEERS];
  int n_auth_peers;
  zt__http *http;               /* the HTTP listener, NULL without --http */
} zt_server;

/* Why a connection is not reading right now (bits; reading resumes when none is left). */
enum {
  ZT_CONN_PAUSE_CREDIT = 1u << 0,  /* a batch waits for room in its job's queue */
  ZT_CONN_PAUSE_WRITES = 1u << 1,  /* the client does not read its replies */
  ZT_CONN_PAUSE_STOPPING = 1u << 2, /* the daemon is stopping: no new requests */
  ZT_CONN_PAUSE_WORKER = 1u << 3,  /* a submit, plan, join or export waits for its worker:
                                      requests stay in order */
};

/* An asynchronous request (submit, plan, join, export, batch, checkpoint) waiting for the job layer's done callback; it is
 * the `owner` handed to the job layer so that each reply finds its request id. */
struct zt_pending {
  zt_conn *conn;
  uint32_t id;
  zt_proto_op op;
  zt_pending *next;
};

struct zt_conn {
  zt_server *srv;
  union {
    uv_handle_t handle;
    uv_stream_t stream;
    uv_pipe_t pipe;
    uv_tcp_t tcp;
  } h;
  bool is_tcp;
  bool hello_done;
  bool eof;                     /* the client half-closed: close once pending replies are out */
  bool closing;                 /* uv_close has been called */
  bool close_when_flushed;      /* framing lost or the daemon stops: close once replies are out */
  bool reading;                 /* uv_read_start is in effect */
  bool in_consume;              /* a resume from inside dispatch must not re-enter the reader */
  unsigned pause;
  zt_frame_reader reader;
  uint8_t *stash;               /* bytes read but not parsed when reading paused */
  size_t stash_off, stash_len;
  size_t wq_bytes;              /* bytes handed to uv_write and not yet written */
  zt_pending *pending;
  zt_conn *prev, *next;
  uv_timer_t hello_timer;       /* closes a connection that does not say hello in time */
  int handles;                  /* libuv handles still to close before the struct is freed */
  char peer[64];                /* TCP: the peer's address, for the token backoff and the log */
  uint8_t rbuf[ZT_TUNE_READ_CHUNK];
};

/* conn.c */
int zt__conn_accept(zt_server *srv, uv_stream_t *listener, bool is_tcp);
/* The hello was accepted: frames up to --max-frame, the hello timer stops. */
void zt__conn_authenticated(zt_conn *c);
/* A pending request finished: a half-closed connection may close now. */
void zt__conn_pending_done(zt_conn *c);
/* Queues a finished frame (takes a copy). A reply is always queued; an event (is_event) is
 * refused and the connection dropped when the write queue is over its cap. */
int zt__conn_send(zt_conn *c, const uint8_t *frame, size_t len, bool is_event);
void zt__conn_pause(zt_conn *c, unsigned why);
void zt__conn_resume(zt_conn *c, unsigned why);
/* Closes now (pending writes are dropped) or once the write queue is empty. */
void zt__conn_close(zt_conn *c);
void zt__conn_close_when_flushed(zt_conn *c);
zt_pending *zt__conn_pending_add(zt_conn *c, uint32_t id, zt_proto_op op);
/* Unlinks and frees p (after its reply was sent or its request failed). */
void zt__conn_pending_drop(zt_conn *c, zt_pending *p);

/* auth.c: the token a TCP client's hello gives, from peer (its address): 0; -EACCES (wrong or
 * missing: counted against the peer); -EAGAIN while the peer is backing off. why says it. */
int zt__auth_token(zt_server *srv, const char *peer, const char *tok, size_t tlen, char *why,
                   size_t whylen);

/* dispatch.c: one complete frame body from c. */
void zt__dispatch(zt_conn *c, const uint8_t *body, size_t len);
/* Replies: {"id", "ok": true, ...fields} (fields may be NULL) and the error form. */
int zt__reply_ok(zt_conn *c, uint32_t id, json_t *fields);
int zt__reply_error(zt_conn *c, uint32_t id, int neg_errno, const char *message);

/* server.c: begins the graceful stop (used by SIGTERM/SIGINT and the shutdown request). */
void zt__server_stop(zt_server *srv);
/* A connection finished closing: the stop may be complete. */
void zt__server_conn_gone(zt_server *srv);

/* watch.c */
int zt__watch_add(zt_server *srv, zt_conn *c, const char *job);
void zt__watch_drop_conn(zt_server *srv, zt_conn *c);
void zt__watch_free_all(zt_server *srv);
/* The job layer's zt_jobs_event_cb: fans the event out to the job's watchers. */
void zt__watch_on_event(void *user, const char *job, json_t *event);
/* Packs a JSON event into a frame and sends it to one connection. */
int zt__watch_send_event(zt_conn *c, json_t *event);

#endif
