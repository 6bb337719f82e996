/* libztclient: talk to a running ztd over its Unix socket or TCP.
 * Every call returns 0 (or a count) on success and a negative errno on failure; after a failure
 * zt_client_error_code()/zt_client_error_message() say what the server (or the transport) said.
 * A zt_client is one connection; it is not thread-safe (use one per thread).
 * Replies are handed over as JSON text (malloc'd, free with free()). */
#ifndef ZT_CLIENT_H
#define ZT_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ZT_CLIENT_JOB_ID_MAX 64

typedef struct zt_client zt_client;

/* Connects and performs the hello exchange (protocol version check). On failure *c is still set
 * (NULL only when out of memory) so that the error can be read; close it with zt_client_close. */
int zt_client_connect_unix(zt_client **c, const char *socket_path);
/* TCP: token is the contents of the daemon's token file (required by the daemon). */
int zt_client_connect_tcp(zt_client **c, const char *host, int port, const char *token);
void zt_client_close(zt_client *c);
/* The one call that may come from another thread: shuts the connection down so that a call
 * blocked in another thread (a watch, a batch waiting for credit) returns -ECONNRESET. The owner
 * still closes the handle. */
void zt_client_interrupt(zt_client *c);

/* "EINVAL", "ECONNREFUSED", ... and the message of the last failure ("" if none). */
const char *zt_client_error_code(const zt_client *c);
const char *zt_client_error_message(const zt_client *c);

/* The daemon's status reply as JSON: version, backend, devices, memory (per device: allocated by
 * jobs, peak, reserved, the driver's total and free; the host: pinned, limit), gpus (the
 * devices jobs are scheduled on, each with the job holding it), queue. */
int zt_client_status(zt_client *c, char **json_out);
/* Submit a job spec (JSON text, or a msgpack-encoded map); job_id receives the new id. */
int zt_client_submit_json(zt_client *c, const char *spec_json, char job_id[ZT_CLIENT_JOB_ID_MAX]);
int zt_client_submit_msgpack(zt_client *c, const void *spec, size_t len,
                             char job_id[ZT_CLIENT_JOB_ID_MAX]);
/* Daemon to daemon: asks this ztd to run a part of a job that spans daemons (the caller is the
 * coordinator, docs/protocol.md "join"): spec is the job's normalised spec, part names the ranks
 * and the NCCL group ({"world", "rank0", "nccl_id", "resume_step", "coordinator"}). job_id gets
 * the part's job id here. The part ends if this connection closes while it runs. */
int zt_client_join(zt_client *c, const char *spec_json, const char *part_json,
                   char job_id[ZT_CLIENT_JOB_ID_MAX]);
/* Validates and sizes a spec (JSON text) as submit would, without queueing it: json_out gets
 * {"backend", "arch", "params", "backend_bytes", "parallel": {"gpus", "zero_stage", "rank_bytes":
 * [per rank]}[, "offload": {"host_bytes", "device_bytes", "nvme_bytes", ... the plan:
 * docs/protocol.md}]};
 * a job that cannot fit fails with the daemon's ENOMEM and its numbers. */
int zt_client_plan_json(zt_client *c, const char *spec_json, char **json_out);
/* The same for another machine: target_json (NULL: the daemon's own) describes it,
 * {"backend": "cpu" | "cuda", "gpus"?, "gpu_mem_limit", "host_mem_limit", "nvme_bytes"?,
 * "rates"?} (sizes as ztd's flags take them, "24GiB", or byte counts; docs/protocol.md
 * "plan"); the daemon plans as one started with those flags would, its own devices and limits
 * untouched, and the reply's "target" says what it planned for. */
int zt_client_plan_target_json(zt_client *c, const char *spec_json, const char *target_json,
                               char **json_out);
/* {"jobs": [...]} */
int zt_client_jobs(zt_client *c, char **json_out);
/* One job, including "losses": [...] (the per-step loss history) and "memory" (allocated, peak,
 * reserved, host_pinned, per device; offloaded: its tiers and timeline: docs/protocol.md). */
int zt_client_show(zt_client *c, const char *job, char **json_out);
/* Pushes one micro-batch (micro_batch * (seq_len + 1) tokens) into a stream job. Blocks until the
 * daemon has room for it (credit), so a fast producer cannot grow the daemon's memory. */
int zt_client_push_batch(zt_client *c, const char *job, const int32_t *tokens, size_t n_tokens);
/* The same with a byte a token (each NULL: not sent): loss_mask 1 = the token counts as a target
 * (NULL: every token does), doc_starts 1 = the token starts a document within its row, whose
 * positions restart there and whose first token is no target (NULL: a row is one document).
 * ztd refuses another byte than 0 or 1 naming the field, the row and the index. */
int zt_client_push_batch_docs(zt_client *c, const char *job, const int32_t *tokens,
                              const uint8_t *loss_mask, const uint8_t *doc_starts,
                              size_t n_tokens);

/* Called for every event of the watched job, as JSON text. Return non-zero to stop watching. */
typedef int (*zt_watch_cb)(const char *event_json, void *user);
/* Streams the job's events (state changes, per-step loss/throughput/memory) until the job ends
 * (returns 0), the callback stops it (returns its value), or the connection fails (-errno).
 * The connection is dedicated to the watch while it lasts. */
int zt_client_watch(zt_client *c, const char *job, zt_watch_cb cb, void *user);

int zt_client_cancel(zt_client *c, const char *job);
/* Removes a job that ended and its directory on the daemon (EBUSY for a queued or running one). */
int zt_client_rm(zt_client *c, const char *job);
/* Continues a job that ended done or cancelled from its newest checkpoint to `steps` steps in
 * all (queued again; the schedule's horizon becomes steps); json_out (optional) gets the reply
 * (job, state, steps, from_step). */
int zt_client_resume(zt_client *c, const char *job, uint64_t steps, char **json_out);
/* Asks a running job to checkpoint now and waits for it; json_out (optional) gets the reply
 * (step, path). */
int zt_client_checkpoint(zt_client *c, const char *job, char **json_out);
/* Downloads the job's latest weights into a local .safetensors file (written atomically). */
int zt_client_export(zt_client *c, const char *job, const char *out_path);
/* A piece of the job's log from byte `offset`: {"data": text, "offset": where the next piece
 * starts, "size": the log's bytes now, "state": the job's}; read on until offset reaches size. */
int zt_client_logs(zt_client *c, const char *job, uint64_t offset, char **json_out);
/* The job's latest checkpoint as a Hugging Face directory in dir (made if absent), as ztd
 * converts it: config.json, model.safetensors or shards of at most max_shard_size bytes (0: ztd's
 * 5 GB) with model.safetensors.index.json, and the tokenizer files of the directory the job
 * started from. dtype "bf16" (NULL too) or "fp32". Waits while ztd makes the files (minutes for
 * a large model); each is downloaded whole before any is put in place, config.json last, and
 * the weights files of an earlier export in dir that this one lacks are removed, as
 * save_pretrained does. json_out (optional) gets the listing: {"export", "step", "dtype",
 * "files": [{"name", "size"}, ...], "note"?}. */
int zt_client_export_hf(zt_client *c, const char *job, const char *dir, const char *dtype,
                        uint64_t max_shard_size, char **json_out);
/* Graceful stop: running jobs checkpoint, then ztd exits. */
int zt_client_shutdown(zt_client *c);

#ifdef __cplusplus
}
#endif

#endif
