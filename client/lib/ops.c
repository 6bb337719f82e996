/* The public calls of libztclient (client/include/zt/client.h), one request each. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "client/lib/conn.h"
#include "proto/zt_proto_json.h"

/* Export chunk asked for when the daemon did not announce its frame limit; it caps it anyway. */
#define EXPORT_CHUNK_DEFAULT (16u << 20)
/* A checkpoint landing mid-download restarts it; give up if the job keeps checkpointing. */
#define EXPORT_MAX_RESTARTS 8

static zt_client *client_new(void) {
  zt_client *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->fd = -1;
  c->next_id = 1;
  zt_frame_reader_init(&c->rd, ZT__CLIENT_REPLY_MAX);
  return c;
}

int zt_client_connect_unix(zt_client **out, const char *socket_path) {
  int rc = 0;
  zt_client *c = *out = client_new();
  if (!c) return -ENOMEM;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(socket_path) >= sizeof sa.sun_path) {
    rc = zt__client_fail(c, -ENAMETOOLONG, "socket path too long: %s", socket_path);
    goto out;
  }
  strcpy(sa.sun_path, socket_path);
  c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c->fd < 0) {
    rc = zt__client_fail(c, -errno, "socket: %s", strerror(errno));
    goto out;
  }
  if (connect(c->fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
    rc = zt__client_fail(c, -errno, "cannot connect to %s: %s", socket_path, strerror(errno));
    goto out;
  }
  rc = zt__client_hello(c, NULL);
out:
  if (rc < 0 && c->fd >= 0) {
    close(c->fd);
    c->fd = -1;
  }
  return rc;
}

int zt_client_connect_tcp(zt_client **out, const char *host, int port, const char *token) {
  int rc = 0;
  struct addrinfo *res = NULL;
  zt_client *c = *out = client_new();
  if (!c) return -ENOMEM;
  if (port <= 0 || port > 65535) {
    rc = zt__client_fail(c, -EINVAL, "bad TCP port %d", port);
    goto out;
  }
  char service[8];
  snprintf(service, sizeof service, "%d", port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
  int gai = getaddrinfo(host, service, &hints, &res);
  if (gai != 0) {
    rc = zt__client_fail(c, -EHOSTUNREACH, "cannot resolve %s: %s", host, gai_strerror(gai));
    goto out;
  }
  int err = ECONNREFUSED;
  for (struct addrinfo *a = res; a; a = a->ai_next) {
    c->fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (c->fd < 0) {
      err = errno;
      continue;
    }
    if (connect(c->fd, a->ai_addr, a->ai_addrlen) == 0) break;
    err = errno;
    close(c->fd);
    c->fd = -1;
  }
  if (c->fd < 0) {
    rc = zt__client_fail(c, -err, "cannot connect to %s:%d: %s", host, port, strerror(err));
    goto out;
  }
  /* requests are small and each waits for its reply: do not let Nagle hold them back */
  int one = 1;
  setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  rc = zt__client_hello(c, token ? token : "");
out:
  if (res) freeaddrinfo(res);
  if (rc < 0 && c->fd >= 0) {
    close(c->fd);
    c->fd = -1;
  }
  return rc;
}

void zt_client_close(zt_client *c) {
  if (!c) return;
  if (c->fd >= 0) close(c->fd);
  zt_frame_reader_close(&c->rd);
  free(c);
}

const char *zt_client_error_code(const zt_client *c) { return c ? c->code : "ENOMEM"; }
const char *zt_client_error_message(const zt_client *c) { return c ? c->message : "out of memory"; }

/* A request whose only fields are an optional job id; the reply as JSON when json_out is set. */
static int simple_call(zt_client *c, const char *op, const char *job, char **json_out) {
  zt_out o;
  zt_msg reply;
  zt_out_init(&o);
  uint32_t id = zt__client_begin(c, &o, op, job ? 1 : 0);
  if (job) zt_out_kv_str(&o, "job", job);
  int rc = zt__client_call(c, &o, id, &reply);
  zt_out_close(&o);
  if (rc < 0) return rc;
  if (json_out) rc = zt__client_to_json(c, reply.root, json_out);
  zt_msg_close(&reply);
  return rc;
}

/* An op on a job with one unsigned number (resume's steps, logs' offset); its reply as JSON
 * where json_out is given. */
static int job_u64_call(zt_client *c, const char *op, const char *job, const char *key,
                        uint64_t v, char **json_out) {
  zt_out o;
  zt_msg reply;
  zt_out_init(&o);
  uint32_t id = zt__client_begin(c, &o, op, 2);
  zt_out_kv_str(&o, "job", job);
  zt_out_kv_u64(&o, key, v);
  int rc = zt__client_call(c, &o, id, &reply);
  zt_out_close(&o);
  if (rc < 0) return rc;
  if (json_out) rc = zt__client_to_json(c, reply.root, json_out);
  zt_msg_close(&reply);
  return rc;
}

int zt_client_status(zt_client *c, char **json_out) { return simple_call(c, "status", NULL, json_out); }
int zt_client_jobs(zt_client *c, char **json_out) { return simple_call(c, "jobs", NULL, json_out); }
int zt_client_show(zt_client *c, const char *job, char **json_out) {
  return simple_call(c, "show", job, json_out);
}
int zt_client_cancel(zt_client *c, const char *job) { return simple_call(c, "cancel", job, NULL); }
int zt_client_rm(zt_client *c, const char *job) { return simple_call(c, "rm", job, NULL); }
int zt_client_resume(zt_client *c, const char *job, uint64_t steps, char **json_out) {
  return job_u64_call(c, "resume", job, "steps", steps, json_out);
}
int zt_client_checkpoint(zt_client *c, const char *job, char **json_out) {
  return simple_call(c, "checkpoint", job, json_out);
}
int zt_client_shutdown(zt_client *c) { return simple_call(c, "shutdown", NULL, NULL); }

int zt_client_logs(zt_client *c, const char *job, uint64_t offset, char **json_out) {
  return job_u64_call(c, "logs", job, "offset", offset, json_out);
}

/* Sends a submit whose spec the caller packs; copies the new job id. */
static int submit_packed(zt_client *c, zt_out *o, uint32_t id, char job_id[ZT_CLIENT_JOB_ID_MAX]) {
  zt_msg reply;
  int rc = zt__client_call(c, o, id, &reply);
  if (rc < 0) return rc;
  const char *job;
  size_t len;
  if (zt_msg_get_str(reply.root, NULL, "job", true, &job, &len, NULL) < 0 ||
      len >= ZT_CLIENT_JOB_ID_MAX) {
    rc = zt__client_fail(c, -EPROTO, "submit reply from ztd has no usable 'job'");
  } else {
    memcpy(job_id, job, len);
    job_id[len] = '\0';
  }
  zt_msg_close(&reply);
  return rc;
}

/* Packs a JSON object text as the request's field `key`; 0 or the client's failure. */
static int pack_object(zt_client *c, zt_out *o, const char *key, const char *text) {
  json_error_t jerr;
  json_t *obj = json_loads(text, 0, &jerr);
  int rc = 0;
  if (!obj)
    return zt__client_fail(c, -EINVAL, "%s is not valid JSON: %s (line %d, column %d)", key,
                           jerr.text, jerr.line, jerr.column);
  if (!json_is_object(obj)) rc = zt__client_fail(c, -EINVAL, "%s must be a JSON object", key);
  zt_out_str(o, key);
  if (!rc && zt_proto_pack_json(&o->pk, obj) < 0)
    rc = zt__client_fail(c, -ENOMEM, "out of memory packing the %s", key);
  json_decref(obj);
  return rc;
}

static int pack_spec(zt_client *c, zt_out *o, const char *spec_json) {
  return pack_object(c, o, "spec", spec_json);
}

int zt_client_submit_json(zt_client *c, const char *spec_json, char job_id[ZT_CLIENT_JOB_ID_MAX]) {
  zt_out o;
  zt_out_init(&o);
  uint32_t id = zt__client_begin(c, &o, "submit", 1);
  int rc = pack_spec(c, &o, spec_json);
  if (!rc) rc = submit_packed(c, &o, id, job_id);
  zt_out_close(&o);
  return rc;
}

int zt_client_join(zt_client *c, const char *spec_json, const char *part_json,
                   char job_id[ZT_CLIENT_JOB_ID_MAX]) {
  zt_out o;
  zt_out_init(&o);
  uint32_t id = zt__client_begin(c, &o, "join", 2);
  int rc = pack_spec(c, &o, spec_json);
  if (!rc) rc = pack_object(c, &o, "part", part_json);
  if (!rc) rc = submit_packed(c, &o, id, job_id);
  zt_out_close(&o);
  return rc;
}

int zt_client_plan_json(zt_client *c, const char *spec_json, char **json_out) {
  return zt_client_plan_target_json(c, spec_json, NULL, json_out);
}

int zt_client_plan_target_json(zt_client *c, const char *spec_json, const char *target_json,
                               char **json_out) {
  zt_out o;
  zt_msg reply;
  zt_out_init(&o);
  uint32_t id = zt__client_begin(c, &o, "plan", target_json ? 2 : 1);
  int rc = pack_spec(c, &o, spec_json);
  if (!rc && target_json) rc = pack_object(c, &o, "target", target_json);
  if (!rc) rc = zt__client_call(c, &o, id, &reply);
  zt_out_close(&o);
  if (rc < 0) return rc;
  rc = zt__client_to_json(c, reply.root, json_out);
  zt_msg_close(&reply);
  return rc;
}

int zt_client_submit_msgpack(zt_client *c, const void *spec, size_t len,
                             char job_id[ZT_CLIENT_JOB_ID_MAX]) {
  zt_proto_error perr;
  zt_msg m;
  int rc = zt_msg_decode(&m, spec, len, &perr);
  zt_msg_close(&m);
  if (rc < 0) return zt__client_fail(c, rc, "spec: %s", perr.message);
  zt_out o;
  zt_out_init(&o);
  uint32_t id = zt__client_begin(c, &o, "submit", 1);
  zt_out_str(&o, "spec");
  /* the spec is already one well-formed msgpack map: append its bytes as the value */
  o.pk.callback(o.pk.data, spec, len);
  rc = submit_packed(c, &o, id, job_id);
  zt_out_close(&o);
  return rc;
}

int zt_client_push_batch(zt_client *c, const char *job, const int32_t *tokens, size_t n_tokens) {
  return zt_client_push_batch_docs(c, job, tokens, NULL, NULL, n_tokens);
}

int zt_client_push_batch_docs(zt_client *c, const char *job, const int32_t *tokens,
                              const uint8_t *loss_mask, const uint8_t *doc_starts,
                              size_t n_tokens) {
  int rc = 0;
  zt_out o;
  zt_msg reply;
  uint8_t *le = NULL;
  zt_out_init(&o);
  if (n_tokens > UINT32_MAX / 4) {
    rc = zt__client_fail(c, -EMSGSIZE, "batch of %zu tokens is too large for one frame", n_tokens);
    goto out;
  }
  uint32_t id = zt__client_begin(c, &o, "batch", 2 + (loss_mask != NULL) + (doc_starts != NULL));
  zt_out_kv_str(&o, "job", job);
  if (loss_mask) zt_out_kv_bin(&o, "loss_mask", loss_mask, n_tokens);
  if (doc_starts) zt_out_kv_bin(&o, "doc_starts", doc_starts, n_tokens);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  zt_out_kv_bin(&o, "tokens", tokens, n_tokens * 4);
#else
  le = malloc(n_tokens * 4 + 1);
  if (!le) {
    rc = zt__client_fail(c, -ENOMEM, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < n_tokens; i++) {
    uint32_t v = (uint32_t)tokens[i];
    le[4 * i] = (uint8_t)v, le[4 * i + 1] = (uint8_t)(v >> 8);
    le[4 * i + 2] = (uint8_t)(v >> 16), le[4 * i + 3] = (uint8_t)(v >> 24);
  }
  zt_out_kv_bin(&o, "tokens", le, n_tokens * 4);
#endif
  rc = zt__client_call(c, &o, id, &reply);
  if (rc == 0) zt_msg_close(&reply);
out:
  free(le);
  zt_out_close(&o);
  return rc;
}

int zt_client_watch(zt_client *c, const char *job, zt_watch_cb cb, void *user) {
  int rc = simple_call(c, "watch", job, NULL);
  if (rc < 0) return rc;
  size_t joblen = strlen(job);
  for (;;) {
    zt_msg m;
    rc = zt__client_read(c, &m);
    if (rc < 0) return rc;
    const char *ev, *evjob;
    size_t evlen, evjoblen;
    if (zt_msg_get_str(m.root, NULL, "event", false, &ev, &evlen, NULL) < 0 ||
        zt_msg_get_str(m.root, NULL, "job", false, &evjob, &evjoblen, NULL) < 0 ||
        evjoblen != joblen || memcmp(evjob, job, joblen) != 0) {
      zt_msg_close(&m);
      continue;
    }
    bool end = evlen == 3 && memcmp(ev, "end", 3) == 0;
    char *json = NULL;
    rc = zt__client_to_json(c, m.root, &json);
    zt_msg_close(&m);
    if (rc < 0) return rc;
    int stop = cb(json, user);
    free(json);
    if (stop) return stop;
    if (end) return 0;
  }
}

/* Writes all of buf at the file's current position. */
static int write_all(int fd, const uint8_t *buf, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, buf, len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -errno;
    buf += n;
    len -= (size_t)n;
  }
  return 0;
}

/* One export request; on success the reply stays open for the caller to read data from. */
static int export_chunk(zt_client *c, const char *job, uint64_t offset, uint64_t length,
                        zt_msg *reply, const uint8_t **data, size_t *len, uint64_t *total,
                        uint64_t *step) {
  zt_out o;
  zt_out_init(&o);
  uint32_t id = zt__client_begin(c, &o, "export", 3);
  zt_out_kv_str(&o, "job", job);
  zt_out_kv_u64(&o, "offset", offset);
  zt_out_kv_u64(&o, "length", length);
  int rc = zt__client_call(c, &o, id, reply);
  zt_out_close(&o);
  if (rc < 0) return rc;
  zt_proto_error perr;
  if (zt_msg_get_bin(reply->root, NULL, "data", true, data, len, &perr) < 0 ||
      zt_msg_get_u64(reply->root, NULL, "total", true, total, &perr) < 0 ||
      zt_msg_get_u64(reply->root, NULL, "step", true, step, &perr) < 0) {
    zt_msg_close(reply);
    return zt__client_fail(c, -EPROTO, "export reply from ztd: %s", perr.message);
  }
  return 0;
}

int zt_client_export(zt_client *c, const char *job, const char *out_path) {
  int rc = 0, fd = -1;
  char *tmp = NULL;
  if (asprintf(&tmp, "%s.tmp", out_path) < 0) {
    tmp = NULL;
    return zt__client_fail(c, -ENOMEM, "out of memory");
  }
  fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    rc = zt__client_fail(c, -errno, "cannot create %s: %s", tmp, strerror(errno));
    goto out;
  }
  uint64_t chunk = c->server_max_frame > (8u << 10) ? c->server_max_frame - (4u << 10)
                                                    : EXPORT_CHUNK_DEFAULT;
  uint64_t offset = 0, total = 0, want_step = 0;
  int restarts = 0;
  bool first = true;
  do {
    zt_msg reply;
    const uint8_t *data;
    size_t len;
    uint64_t step;
    rc = export_chunk(c, job, offset, chunk, &reply, &data, &len, &total, &step);
    if (rc < 0) goto out;
    if (!first && step != want_step) {
      /* a newer checkpoint replaced the file under us: start over on the new one */
      zt_msg_close(&reply);
      if (++restarts > EXPORT_MAX_RESTARTS) {
        rc = zt__client_fail(c, -EAGAIN, "job %s checkpointed %d times during the export", job,
                             EXPORT_MAX_RESTARTS);
        goto out;
      }
      if (ftruncate(fd, 0) < 0 || lseek(fd, 0, SEEK_SET) < 0) {
        rc = zt__client_fail(c, -errno, "%s: %s", tmp, strerror(errno));
        goto out;
      }
      offset = 0;
      first = true;
      continue;
    }
    first = false;
    want_step = step;
    if (len == 0 && offset < total) {
      zt_msg_close(&reply);
      rc = zt__client_fail(c, -EPROTO, "ztd sent an empty export chunk at offset %llu of %llu",
                           (unsigned long long)offset, (unsigned long long)total);
      goto out;
    }
    rc = write_all(fd, data, len);
    zt_msg_close(&reply);
    if (rc < 0) {
      rc = zt__client_fail(c, rc, "writing %s: %s", tmp, strerror(-rc));
      goto out;
    }
    offset += len;
  } while (offset < total);
  if (fsync(fd) < 0) {
    rc = zt__client_fail(c, -errno, "fsync %s: %s", tmp, strerror(errno));
    goto out;
  }
  close(fd);
  fd = -1;
  if (rename(tmp, out_path) < 0) {
    rc = zt__client_fail(c, -errno, "rename %s to %s: %s", tmp, out_path, strerror(errno));
    goto out;
  }
out:
  if (fd >= 0) close(fd);
  if (rc < 0) unlink(tmp);
  free(tmp);
  return rc;
}

void zt_client_interrupt(zt_client *c) {
  if (c && c->fd >= 0) shutdown(c->fd, SHUT_RDWR);
}
