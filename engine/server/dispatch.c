/* Requests: one handler per operation of the protocol table (proto/zt_proto.h), indexed by op,
 * so adding an operation is one row there and one handler here. A handler either replies (now or
 * through a zt_pending when the job layer answers later) or returns a negative errno with the
 * message in err, which becomes the error reply. */
#include <unistd.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/backend.h"
#include "engine/base/log.h"
#include "engine/server/server.h"
#include "proto/zt_proto_json.h"

#ifndef ZT_VERSION
#define ZT_VERSION "unknown"
#endif

typedef int (*zt_handler)(zt_conn *c, const zt_request *req, zt_proto_error *err);

/* ---- replies ------------------------------------------------------------------------------ */

static int send_out(zt_conn *c, zt_out *o, bool is_event) {
  size_t len = 0;
  const uint8_t *frame = zt_out_finish(o, &len);
  int rc = frame ? zt__conn_send(c, frame, len, is_event) : -ENOMEM;
  zt_out_close(o);
  return rc;
}

int zt__reply_error(zt_conn *c, uint32_t id, int neg_errno, const char *message) {
  zt_out o;
  zt_out_init(&o);
  zt_out_error(&o, id, neg_errno, message);
  return send_out(c, &o, false);
}

/* Packs {"id", "ok": true, ...fields, ...extra bin field}. */
static int reply_ok_bin(zt_conn *c, uint32_t id, json_t *fields, const char *bin_key,
                        const uint8_t *bin, size_t bin_len) {
  if (fields && !json_is_object(fields)) return -EINVAL;
  size_t n = 2 + (fields ? json_object_size(fields) : 0) + (bin_key ? 1 : 0);
  zt_out o;
  zt_out_init(&o);
  msgpack_pack_map(&o.pk, (uint32_t)n);
  zt_out_kv_u64(&o, "id", id);
  zt_out_kv_bool(&o, "ok", true);
  int rc = 0;
  if (fields) {
    const char *k;
    json_t *v;
    json_object_foreach(fields, k, v) {
      zt_out_str(&o, k);
      rc = zt_proto_pack_json(&o.pk, v);
      if (rc < 0) break;
    }
  }
  if (rc < 0) {
    zt_out_close(&o);
    return zt__reply_error(c, id, -EIO, "could not encode the reply");
  }
  if (bin_key) zt_out_kv_bin(&o, bin_key, bin, bin_len);
  return send_out(c, &o, false);
}

int zt__reply_ok(zt_conn *c, uint32_t id, json_t *fields) {
  return reply_ok_bin(c, id, fields, NULL, NULL, 0);
}

/* Replies with a reply object the handler owns, then releases it; NULL means no memory. */
static int reply_owned(zt_conn *c, uint32_t id, json_t *fields, zt_proto_error *err) {
  if (!fields) return zt_proto_error_set(err, -ENOMEM, "out of memory");
  zt__reply_ok(c, id, fields);
  json_decref(fields);
  return 0;
}

/* ---- shared field readers ----------------------------------------------------------------- */

/* A required field that is absent is a malformed request (EINVAL), not a missing object: ENOENT
 * on the wire means "no such job". */
static int required(int rc) { return rc == -ENOENT ? -EINVAL : rc; }

/* The "job" field as a NUL-terminated id. */
static int get_job(const zt_request *req, char job[ZT_JOB_ID_MAX], zt_proto_error *err) {
  const char *s;
  size_t len;
  int rc = required(zt_msg_get_str(req->body, NULL, "job", true, &s, &len, err));
  if (rc < 0) return rc;
  if (len == 0 || len >= ZT_JOB_ID_MAX || memchr(s, '\0', len))
    return zt_proto_error_set(err, -EINVAL, "job: not a job id");
  memcpy(job, s, len);
  job[len] = '\0';
  return 0;
}

static int job_error(zt_proto_error *err, int rc, const char *msg) {
  return zt_proto_error_set(err, rc < 0 ? rc : -EIO, "%s", msg[0] ? msg : "job layer failure");
}

/* ---- handlers ----------------------------------------------------------------------------- */

static int handle_hello(zt_conn *c, const zt_request *req, zt_proto_error *err) {
  uint64_t version = 0;
  int rc = required(zt_msg_get_u64(req->body, NULL, "version", true, &version, err));
  if (rc < 0) return rc;
  if (version != ZT_PROTO_VERSION)
    return zt_proto_error_set(err, -EPROTO, "client speaks protocol version %" PRIu64
                              ", ztd speaks %d", version, ZT_PROTO_VERSION);
  if (c->is_tcp) {
    const char *tok = NULL;
    size_t tlen = 0;
    rc = zt_msg_get_str(req->body, NULL, "token", false, &tok, &tlen, err);
    if (rc == -EINVAL) return rc;
    char why[160];
    if ((rc = zt__auth_token(c->srv, c->peer, rc < 0 ? NULL : tok, rc < 0 ? 0 : tlen, why,
                             sizeof why)) < 0) {
      zt__reply_error(c, req->id, rc, why);
      zt__conn_close_when_flushed(c);
      return 0;
    }
  }
  zt__conn_authenticated(c);
  json_t *r = json_pack("{s:i, s:s, s:I}", "version", ZT_PROTO_VERSION, "server", "ztd " ZT_VERSION,
                        "max_frame", (json_int_t)c->srv->cfg->max_frame);
  return reply_owned(c, req->id, r, err);
}

static json_t *status_memory(const zt_server_config *cfg, json_t *from_jobs) {
  json_t *mem = json_is_object(from_jobs) ? json_deep_copy(from_jobs) : json_object();
  if (!mem) return NULL;
  int bad = json_object_set_new(mem, "gpu_mem_limit", json_integer((json_int_t)cfg->gpu_mem_limit));
  bad |= json_object_set_new(mem, "host_mem_limit", json_integer((json_int_t)cfg->host_mem_limit));
  bad |= json_object_set_new(mem, "nvme_dir", cfg->nvme_dir ? json_string(cfg->nvme_dir) : json_null());
  if (bad) {
    json_decref(mem);
    return NULL;
  }
  return mem;
}

/* The host (the cpu backend's device, with its thread count) and every CUDA device with its
 * memory, read now. */
static json_t *devices_json(const zt_server_config *cfg) {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int threads = cfg->cpu_threads > 0 ? cfg->cpu_threads : (int)(cores > 0 ? cores : 1);
  json_t *list = json_pack("[{s:s, s:s, s:i}]", "kind", "cpu", "name", "host", "threads", threads);
  zt_device_info dev[ZT_MAX_DEVICES];
  int n = zt_backend_cuda_devices(dev, ZT_MAX_DEVICES);
  for (int i = 0; list && i < n && i < ZT_MAX_DEVICES; i++) {
    json_t *d = json_pack("{s:s, s:i, s:s, s:I, s:I}", "kind", "cuda", "index", dev[i].index,
                          "name", dev[i].name, "mem_total", (json_int_t)dev[i].mem_total,
                          "mem_free", (json_int_t)dev[i].mem_free);
    if (!d || json_array_append_new(list, d) < 0) {
      json_decref(list);
      return NULL;
    }
  }
  return list;
}

static int handle_status(zt_conn *c, const zt_request *req, zt_proto_error *err) {
  const zt_server_config *cfg = c->srv->cfg;
  json_t *js = zt_jobs_status(c->srv->jobs);
  json_t *r = NULL;
  if (!js) goto out;
  json_t *mem = status_memory(cfg, json_object_get(js, "memory"));
  if (!mem) goto out;
  json_t *devices = devices_json(cfg);
  if (!devices) goto out;
  r = json_pack("{s:i, s:s, s:s, s:o, s:O, s:o, s:{s:O*, s:O*}, s:O*}",
                "version", ZT_PROTO_VERSION, "server", "ztd " ZT_VERSION, "backend", cfg->backend,
                "devices", devices, "gpus", json_object_get(js, "gpus"),
                "memory", mem, "queue", "queued", json_object_get(js, "queued"), "running",
                json_object_get(js, "running"), "jobs", json_object_get(js, "jobs"));
out:
  json_decref(js);
  return reply_owned(c, req->id, r, err);
}

/* The spec of a submit or plan request: {spec: map} or {spec_json: str}, as a new reference. */
static int request_spec(const zt_request *req, json_t **out, zt_proto_error *err) {
  json_t *spec = NULL;
  const msgpack_object *map = NULL;
  const char *text = NULL;
  size_t text_len = 0;
  int rc = zt_msg_get_map(req->body, NULL, "spec", false, &map, err);
  if (rc == -EINVAL) return rc;
  if (rc == -ENOENT) {
    rc = zt_msg_get_str(req->body, NULL, "spec_json", false, &text, &text_len, err);
    if (rc == -EINVAL) return rc;
    if (rc == -ENOENT) return zt_proto_error_set(err, -EINVAL, "spec: missing (send spec or spec_json)");
    json_error_t jerr;
    spec = json_loadb(text, text_len, JSON_REJECT_DUPLICATES, &jerr);
    if (!spec)
      return zt_proto_error_set(err, -EINVAL, "spec_json: line %d: %s", jerr.line, jerr.text);
    if (!json_is_object(spec)) {
      json_decref(spec);
      return zt_proto_error_set(err, -EINVAL, "spec_json: not a JSON object");
    }
  } else {
    spec = zt_proto_to_json(map, err);
    if (!spec) return err->code < 0 ? err->code : -EINVAL;
  }
  *out = spec;
  return 0;
}

/* The job layer answers a submit, plan or join once a worker has checked the files the spec
 * names, a batch once it is queued (credit) and a checkpoint once written. */
static void on_async_done(void *owner, int rc, json_t *reply, const char *message) {
  zt_pending *p = owner;
  zt_conn *c = p->conn;
  uint32_t id = p->id;
  zt_proto_op op = p->op;
  /* the reply is queued before the request leaves the pending list: a half-closed client's
   * connection closes once its last pending reply is out (a failed write may have closed it,
   * and dropped p, already) */
  if (rc < 0) {
    zt__reply_error(c, id, rc, message && message[0] ? message : "failed");
  } else {
    if (op == ZT_OP_SUBMIT || op == ZT_OP_JOIN)
      ZT_LOGI("server", "job %s %s", json_string_value(json_object_get(reply, "job")),
              op == ZT_OP_SUBMIT ? "submitted" : "joined as a part");
    zt__reply_ok(c, id, reply);
  }
  zt__conn_pending_drop(c, p);
  if (op == ZT_OP_BATCH) zt__conn_resume(c, ZT_CONN_PAUSE_CREDIT);
  if (op == ZT_OP_SUBMIT || op == ZT_OP_PLAN || op == ZT_OP_JOIN)
    zt__conn_resume(c, ZT_CONN_PAUSE_WORKER);
}

/* A request the job layer answers through on_async_done: start(jobs, spec, done, owner, msg)
 * with the request's pending entry as the owner. */
static int handle_spec_async(zt_conn *c, const zt_request *req, zt_proto_op op,
                             zt_proto_error *err) {
  json_t *spec = NULL, *part = NULL, *target = NULL;
  const msgpack_object *map = NULL;
  int rc = request_spec(req, &spec, err);
  if (rc < 0) return rc;
  /* plan's "target": the machine to plan for; a job runs on this daemon's own */
  rc = zt_msg_get_map(req->body, NULL, "target", false, &map, err);
  if (rc == 0 && op != ZT_OP_PLAN)
    rc = zt_proto_error_set(err, -EINVAL, "target: only plan takes a target (%s runs the job "
                            "on this daemon's machine)", op == ZT_OP_SUBMIT ? "submit" : "join");
  if (rc == 0 && !(target = zt_proto_to_json(map, err)))
    rc = err->code < 0 ? err->code : -EINVAL;
  if (rc < 0 && rc != -ENOENT) {
    json_decref(spec);
    return rc;
  }
  if (op == ZT_OP_JOIN) {
    rc = required(zt_msg_get_map(req->body, NULL, "part", true, &map, err));
    if (rc == 0 && !(part = zt_proto_to_json(map, err))) rc = err->code < 0 ? err->code : -EINVAL;
    if (rc < 0) {
      json_decref(spec);
      json_decref(target);
      return rc;
    }
  }
  zt_pending *p = zt__conn_pending_add(c, req->id, op);
  if (!p) {
    json_decref(spec);
    json_decref(part);
    json_decref(target);
    return zt_proto_error_set(err, -ENOMEM, "out of memory");
  }
  /* the connection's next request waits for this answer, as it did when admission ran here */
  zt__conn_pause(c, ZT_CONN_PAUSE_WORKER);
  char msg[512] = "";
  zt_jobs *jobs = c->srv->jobs;
  /* a part belongs to its connection: it ends if the connection closes */
  /* a TCP client's job reaches only the directories the daemon allows it (--data-root) */
  int tcp = c->is_tcp;
  rc = op == ZT_OP_SUBMIT ? zt_jobs_submit(jobs, spec, tcp, on_async_done, p, msg, sizeof msg)
       : op == ZT_OP_PLAN ? zt_jobs_plan(jobs, spec, target, tcp, on_async_done, p, msg,
                                         sizeof msg)
                          : zt_jobs_join(jobs, spec, part, c, tcp, on_async_done, p, msg,
                                         sizeof msg);
  json_decref(spec);
  json_decref(part);
  json_decref(target);
  if (rc < 0) {
    zt__conn_pending_drop(c, p);
    zt__conn_resume(c, ZT_CONN_PAUSE_WORKER);
    return job_error(err, rc, msg);
  }
  return 0;
}

static int handle_submit(zt_conn *c, const zt_request *req, zt_proto_error *err) {
  return handle_spec_async(c, req, ZT_OP_SUBMIT, err);
}

static int handle_plan(zt_conn *c, const zt_request *req, zt_proto_error *err) {
  return handle_spec_async(c, req, ZT_OP_PLAN, err);
}

/* A coordinator's request to run a part of its job here: {spec: map, part: map}. */
static int handle_join(zt_conn *c, const zt_request *req, zt_proto_error *err) {
  return handle_spec_async(c, req, ZT_OP_JOIN, err);
}

static int handle_jobs(zt_conn *c, const zt_request *req, zt_proto_error *err) {
  return reply_owned(c, req->id, zt_jobs_list(c->srv->jobs), err);
}

static int handle_show(zt_conn *c, const zt_request *req, zt_proto_error *err) {
  char job[ZT_JOB_ID_MAX];
  int rc = get_job(req, job, err);
  if (rc < 0) return rc;
  char msg[256] = "";
  json_t *r = zt_jobs_show(c->srv->jobs, job, &rc, msg, sizeof msg);
  if (!r) return job_error(err, rc, msg);
  return reply_owned(c, req->id, r, err);
}

static int handle_batch(zt_conn *c, const zt_request *req, zt_proto_error *err) {
  char job[ZT_JOB_ID_MAX];
  int rc = get_job(req, job, err);
  if (rc < 0) return rc;
  const uint8_t *bin;
  size_t len;
  rc = required(zt_msg_get_bin(req->body, NULL, "tokens", true, &bin, &len, err));
  if (rc < 0) return rc;
  if (len == 0 || len % 4)
    return zt_proto_error_set(err, -EINVAL, "tokens: %zu bytes is not a whole number of int32", len);
  /* The wire carries little-endian int32 at any alignment; the job layer gets native ones. */
  size_t n = len / 4;
  int32_t *tokens = malloc(len);
  if (!tokens) return zt_proto_error_set(err, -ENOMEM, "out of memory");
  for (size_t i = 0; i < n; i++) {
    const uint8_t *b = bin + 4 * i;
    tokens[i] = (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                          (uint32_t)b[3] << 24);
  }
  /* a byte a token, as many as the tokens (docs/protocol.md) */
  const uint8_t *marks[2] = {NULL, NULL};
  static const char *const mark_names[2] = {"loss_mask", "doc_starts"};
  for (int k = 0; k < 2; k++) {
    size_t mlen = 0;
    rc = zt_msg_get_bin(req->body, NULL, mark_names[k], false, &marks[k], &mlen, err);
    if (rc == -ENOENT) continue;
    if (rc < 0) {
      free(tokens);
      return rc;
    }
    if (marks[k] && mlen != n) {
      free(tokens);
      return zt_proto_error_set(err, -EINVAL, "%s: %zu bytes for %zu tokens (one a token)",
                                mark_names[k], mlen, n);
    }
  }
  zt_pending *p = zt__conn_pending_add(c, req->id, ZT_OP_BATCH);
  if (!p) {
    free(tokens);
    return zt_proto_error_set(err, -ENOMEM, "out of memory");
  }
  /* No request is read until this batch has credit; done may run before push_batch returns. */
  zt__conn_pause(c, ZT_CONN_PAUSE_CREDIT);
  char msg[256] = "";
  rc = zt_jobs_push_batch(c->srv->jobs, job, tokens, marks[0], marks[1], n, c, on_async_done, p,
                          msg, sizeof msg);
  free(tokens);
  if (rc < 0) {
    zt__conn_pending_drop(c, p);
    zt__conn_resume(c, ZT_CONN_PAUSE_CREDIT);
    return job_error(err, rc, msg);
  }
  return 0;
}

/* The "end" event of a job that already ended, or NULL while it still runs (or on no memory). */
static json_t *end_event_if_terminal(json_t *show, const char *job) {
  const char *state = json_string_value(json_object_get(show, "state"));
  bool terminal = state && (!strcmp(state, zt_job_state_name(ZT_JOB_DONE)) ||
                            !strcmp(state, zt_job_state_name(ZT_JOB_FAILED)) ||
                            !strcmp(state, zt_job_state_name(ZT_JOB_CANCELLED)));
  if (!terminal) return NULL;
  json_t *ev = json_pack("{s:s, s:s, s:s}", "event", "end", "job", job, "state", state);
  json_t *error = json_object_get(show, "error");
  if (ev && error) json_object_set(ev, "error", error);
  return ev;
}

static int handle_watch(zt_conn *c, const zt_request *req, zt_proto_error *err) {
  char job[ZT_JOB_ID_MAX];
  int rc = get_job(req, job, err);
  if (rc < 0) return rc;
  char msg[256] = "";
  json_t *show = zt_jobs_show(c->srv->jobs, job, &rc, msg, sizeof msg);
  if (!show) return job_error(err, rc, msg);
  /* A job that already ended has no events left: its watcher gets the end at once. */
  json_t *end = end_event_if_terminal(show, job);
  json_decref(show);
  if (!end) {
    rc = zt__watch_add(c->srv, c, job);
    if (rc < 0) return zt_proto_error_set(err, rc, "out of memory");
  }
  zt__reply_ok(c, req->id, NULL);
  if (end) {
    zt__watch_send_event(c, end);
    json_decref(end);
  }
  return 0;
}

static int handle_cancel(zt_conn *c, const zt_request *req, zt_proto_error *err) {
  char job[ZT_JOB_ID_MAX];
  int rc = get_job(req, job, err);
  if (rc < 0) return rc;
  char msg[256] = "";
  rc = zt_jobs_cancel(c->srv->jobs, job, msg, sizeof msg);
  if (rc < 0) return job_error(err, rc, msg);
  json_t *show = zt_jobs_show(c->srv->jobs, job, &rc, msg, sizeof msg);
  if (!show) return job_error(err, rc, msg);
  json_t *r = json_pack("{s:O}", "state", json_object_get(show, "state"));
  json_decref(show);
  return reply_owned(c, req->id, r, err);
}

static int handle_rm(zt_conn *c, const zt_request *req, zt_proto_error *err) {
  char job[ZT_JOB_ID_MAX];
  int rc = get_job(req, job, err);
  if (rc < 0) return rc;
  char msg[256] = "";
  if ((rc = zt_jobs_rm(c->srv->jobs, job, msg, sizeof msg)) < 0) return job_error(err, rc, msg);
  return reply_owned(c, req->id, json_pack("{s:s}", "job", job), err);
}

static int handle_resume(zt_conn *c, const zt_request *req, zt_proto_error *err) {
  char job[ZT_JOB_ID_MAX];
  uint64_t steps = 0;
  int rc = get_job(req, job, err);
  if (rc < 0) return rc;
  if ((rc = required(zt_msg_get_u64(req->body, NULL, "steps", true, &steps, err))) < 0) return rc;
  if (steps > INT64_MAX) steps = INT64_MAX;
  char msg[256] = "";
  json_t *r = NULL;
  if ((rc = zt_jobs_resume(c->srv->jobs, job, (int64_t)steps, c->is_tcp, &r, msg, sizeof msg)) < 0)
    return job_error(err, rc, msg);
  return reply_owned(c, req->id, r, err);
}

static int handle_checkpoint(zt_conn *c, const zt_request *req, zt_proto_error *err) {
  char job[ZT_JOB_ID_MAX];
  int rc = get_job(req, job, err);
  if (rc < 0) return rc;
  zt_pending *p = zt__conn_pending_add(c, req->id, ZT_OP_CHECKPOINT);
  if (!p) return zt_proto_error_set(err, -ENOMEM, "out of memory");
  char msg[256] = "";
  rc = zt_jobs_checkpoint(c->srv->jobs, job, on_async_done, p, msg, sizeof msg);
  if (rc < 0) {
    zt__conn_pending_drop(c, p);
    return job_error(err, rc, msg);
  }
  return 0;
}

/* An optional string field as a NUL-terminated one of fewer than cap bytes: 0, -ENOENT when
 * absent, -EINVAL. */
static int get_name(const zt_request *req, const char *key, char *out, size_t cap,
                    zt_proto_error *err) {
  const char *s;
  size_t len;
  int rc = zt_msg_get_str(req->body, NULL, key, false, &s, &len, err);
  if (rc < 0) return rc;
  if (len == 0 || len >= cap || memchr(s, '\0', len))
    return zt_proto_error_set(err, -EINVAL, "%s: not a name of at most %zu bytes", key, cap - 1);
  memcpy(out, s, len);
  out[len] = '\0';
  return 0;
}

/* {job, format: "hf", dtype?, max_shard_size?}: the files of a Hugging Face export, answered
 * once the job layer has made them. */
static int export_hf_list(zt_conn *c, const zt_request *req, const char *job,
                          zt_proto_error *err) {
  char format[8], dtype[8] = "bf16";
  uint64_t shard = 0;
  int rc = get_name(req, "format", format, sizeof format, err);
  if (rc < 0 || strcmp(format, "hf"))
    return zt_proto_error_set(err, -EINVAL, "format must be \"hf\"");
  if ((rc = get_name(req, "dtype", dtype, sizeof dtype, err)) == -EINVAL ||
      (rc == 0 && strcmp(dtype, "bf16") && strcmp(dtype, "fp32")))
    return zt_proto_error_set(err, -EINVAL, "dtype must be \"bf16\" or \"fp32\"");
  rc = zt_msg_get_u64(req->body, NULL, "max_shard_size", false, &shard, err);
  if (rc == -EINVAL) return rc;
  if (rc == 0 && shard == 0)
    return zt_proto_error_set(err, -EINVAL, "max_shard_size must be at least 1 byte");
  zt_pending *p = zt__conn_pending_add(c, req->id, ZT_OP_EXPORT);
  if (!p) return zt_proto_error_set(err, -ENOMEM, "out of memory");
  char msg[256] = "";
  rc = zt_jobs_export_hf(c->srv->jobs, job, dtype, shard, on_async_done, p, msg, sizeof msg);
  if (rc < 0) {
    zt__conn_pending_drop(c, p);
    return job_error(err, rc, msg);
  }
  return 0;
}

/* The job layer answers an export once a worker has read the chunk (and, first, verified the
 * checkpoint's checksums). */
static void on_export_done(void *owner, int rc, const uint8_t *data, size_t len, uint64_t total,
                           uint64_t step, const char *message) {
  zt_pending *p = owner;
  zt_conn *c = p->conn;
  if (rc < 0) {
    zt__reply_error(c, p->id, rc, message && message[0] ? message : "failed");
  } else {
    json_t *r = json_pack("{s:I, s:I}", "total", (json_int_t)total, "step", (json_int_t)step);
    if (r) reply_ok_bin(c, p->id, r, "data", data, len);
    else zt__reply_error(c, p->id, -ENOMEM, "out of memory");
    json_decref(r);
  }
  zt__conn_pending_drop(c, p);
  zt__conn_resume(c, ZT_CONN_PAUSE_WORKER);
}

static int handle_export(zt_conn *c, const zt_request *req, zt_proto_error *err) {
  char job[ZT_JOB_ID_MAX], xname[72], file[256];
  int rc = get_job(req, job, err);
  if (rc < 0) return rc;
  if (zt_msg_find(req->body, "format")) return export_hf_list(c, req, job, err);
  int hf = get_name(req, "export", xname, sizeof xname, err);
  if (hf == -EINVAL) return hf;
  if (hf == 0 && (rc = required(get_name(req, "file", file, sizeof file, err))) < 0) return rc;
  uint64_t offset = 0;
  uint64_t cap = c->srv->cfg->max_frame - ZT_TUNE_EXPORT_ENVELOPE;
  uint64_t length = cap;
  rc = zt_msg_get_u64(req->body, NULL, "offset", false, &offset, err);
  if (rc == -EINVAL) return rc;
  rc = zt_msg_get_u64(req->body, NULL, "length", false, &length, err);
  if (rc == -EINVAL) return rc;
  if (length > cap) length = cap;
  char msg[256] = "";
  if (hf == 0) {
    /* a file of a Hugging Face export: made and checked by the worker that built it */
    uint8_t *data = NULL;
    size_t len = 0;
    uint64_t total = 0, step = 0;
    rc = zt_jobs_export_hf_chunk(c->srv->jobs, job, xname, file, offset, length, &data, &len,
                                 &total, &step, msg, sizeof msg);
    if (rc < 0) return job_error(err, rc, msg);
    json_t *r = json_pack("{s:I, s:I}", "total", (json_int_t)total, "step", (json_int_t)step);
    if (!r) {
      free(data);
      return zt_proto_error_set(err, -ENOMEM, "out of memory");
    }
    reply_ok_bin(c, req->id, r, "data", data, len);
    json_decref(r);
    free(data);
    return 0;
  }
  zt_pending *p = zt__conn_pending_add(c, req->id, ZT_OP_EXPORT);
  if (!p) return zt_proto_error_set(err, -ENOMEM, "out of memory");
  zt__conn_pause(c, ZT_CONN_PAUSE_WORKER);
  rc = zt_jobs_export(c->srv->jobs, job, offset, length, on_export_done, p, msg, sizeof msg);
  if (rc < 0) {
    zt__conn_pending_drop(c, p);
    zt__conn_resume(c, ZT_CONN_PAUSE_WORKER);
    return job_error(err, rc, msg);
  }
  return 0;
}

/* {job, offset?, length?}: a piece of the job's log; its text (at most 4 bytes a byte of the
 * file) fits a frame. */
static int handle_logs(zt_conn *c, const zt_request *req, zt_proto_error *err) {
  char job[ZT_JOB_ID_MAX];
  int rc = get_job(req, job, err);
  if (rc < 0) return rc;
  uint64_t offset = 0, length = ZT_TUNE_LOG_CHUNK;
  if ((rc = zt_msg_get_u64(req->body, NULL, "offset", false, &offset, err)) == -EINVAL ||
      (rc = zt_msg_get_u64(req->body, NULL, "length", false, &length, err)) == -EINVAL)
    return rc;
  uint64_t cap = (c->srv->cfg->max_frame - ZT_TUNE_EXPORT_ENVELOPE) / 4;
  if (length > cap) length = cap;
  char msg[ZT_JOB_ID_MAX + 4200] = "";
  json_t *r = zt_jobs_log(c->srv->jobs, job, offset, length, &rc, msg, sizeof msg);
  if (!r) return job_error(err, rc, msg);
  return reply_owned(c, req->id, r, err);
}

static int handle_shutdown(zt_conn *c, const zt_request *req, zt_proto_error *err) {
  ZT_LOGI("server", "shutdown requested by a client");
  zt__reply_ok(c, req->id, NULL);
  zt__server_stop(c->srv);
  return 0;
}

static const zt_handler handlers[ZT_OP__COUNT] = {
#define ZT_X(name, NAME, summary) [ZT_OP_##NAME] = handle_##name,
    ZT_PROTO_OPS(ZT_X)
#undef ZT_X
};

/* The request id, when the frame has a usable one, so that even a bad request's error reply
 * reaches the right caller (0 otherwise). */
static uint32_t best_effort_id(const zt_msg *m) {
  if (!m->root || m->root->type != MSGPACK_OBJECT_MAP) return 0;
  const msgpack_object *id = zt_msg_find(m->root, "id");
  if (id && id->type == MSGPACK_OBJECT_POSITIVE_INTEGER && id->via.u64 <= UINT32_MAX)
    return (uint32_t)id->via.u64;
  return 0;
}

void zt__dispatch(zt_conn *c, const uint8_t *body, size_t len) {
  zt_msg m;
  memset(&m, 0, sizeof m);
  zt_proto_error err = {0};
  zt_request req = {0};
  int rc = zt_msg_decode(&m, body, len, &err);
  if (rc < 0) {
    zt__reply_error(c, 0, rc, err.message[0] ? err.message : "malformed frame");
    return;
  }
  rc = required(zt_request_parse(&m, &req, &err));
  if (rc < 0) {
    zt__reply_error(c, best_effort_id(&m), rc, err.message[0] ? err.message : "bad request");
    goto out;
  }
  if (!c->hello_done && req.op != ZT_OP_HELLO) {
    zt__reply_error(c, req.id, -EPROTO, "send hello first");
    goto out;
  }
  zt_handler h = (req.op > ZT_OP_UNKNOWN && req.op < ZT_OP__COUNT) ? handlers[req.op] : NULL;
  if (!h) {
    zt__reply_error(c, req.id, -EOPNOTSUPP, "unknown op");
    goto out;
  }
  ZT_LOGD("server", "request %u %s", req.id, zt_proto_op_name(req.op));
  rc = h(c, &req, &err);
  if (rc < 0) zt__reply_error(c, req.id, rc, err.message[0] ? err.message : "failed");
out:
  zt_msg_close(&m);
}
