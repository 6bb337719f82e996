/* ztctl submit: read the spec, resolve a relative data path, submit, and optionally stream a
 * token file into the job (its own connection and thread) while this one watches. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/ztctl/ztctl.h"
#include "proto/zt_tokens.h"

typedef struct feed {
  zt_client *c;     /* the feeder's own connection */
  const char *job;
  int32_t *tokens;  /* the whole token file */
  uint8_t *counted, *starts; /* version 2: a byte a token, its mask bit and whether a document
                                starts there; NULL for version 1 */
  uint64_t n_tokens;
  uint64_t micro_batch, seq_len, batches;
  int rc;           /* ZTCTL_OK or ZTCTL_FAILED */
  atomic_bool stopping; /* the watch is over: a failing push is expected, not news */
} feed;

/* Ctrl-C while ztctl feeds a stream job (ztctl_sigint_arm cuts the connections): the command
 * cancels the job it fed over a new connection, or with --detach leaves it running and says
 * how to cancel it. */
static int interrupted(const ztctl_opts *o, const char *job, bool detach) {
  if (detach) {
    fprintf(stderr, "ztctl: interrupted: job %s keeps running without its data (it fails after "
            "data.stream_timeout with no producer); cancel it with: ztctl cancel %s\n", job, job);
    return ZTCTL_INTERRUPTED;
  }
  zt_client *c = ztctl_connect(o);
  if (!c) return ZTCTL_FAILED;
  int rc = zt_client_cancel(c, job);
  if (rc < 0 && strcmp(zt_client_error_code(c), "EINVAL") != 0) {
    rc = ztctl_fail(c);
  } else {
    /* EINVAL: it had ended already */
    fprintf(stderr, "ztctl: interrupted: %s %s\n", rc < 0 ? "job already ended:" : "cancelled",
            job);
    rc = ZTCTL_INTERRUPTED;
  }
  zt_client_close(c);
  return rc;
}

/* A file-source spec names its data relative to where the user is, not to the daemon. */
static int resolve_data_path(json_t *spec) {
  json_t *data = json_object_get(spec, "data");
  const char *path = json_string_value(json_object_get(data, "path"));
  if (!path || path[0] == '/') return 0;
  char cwd[4096];
  if (!getcwd(cwd, sizeof cwd)) return -errno;
  char *abs = NULL;
  if (asprintf(&abs, "%s/%s", cwd, path) < 0) return -ENOMEM;
  int rc = json_object_set_new(data, "path", json_string(abs)) == 0 ? 0 : -ENOMEM;
  free(abs);
  return rc;
}

static int load_tokens(const char *path, feed *f) {
  int rc = ZTCTL_FAILED;
  uint8_t *raw = NULL;
  FILE *fp = fopen(path, "rb");
  if (!fp) return ztctl_fail_msg("ENOENT", "cannot open %s: %s", path, strerror(errno));
  if (fseek(fp, 0, SEEK_END) < 0) goto io;
  long size = ftell(fp);
  if (size < 0 || fseek(fp, 0, SEEK_SET) < 0) goto io;
  raw = malloc((size_t)size + 1);
  if (!raw) {
    rc = ztctl_fail_msg("ENOMEM", "cannot hold %s (%ld bytes) in memory", path, size);
    goto out;
  }
  if (fread(raw, 1, (size_t)size, fp) != (size_t)size) goto io;
  zt_tokens_header h;
  if (size < ZT_TOKENS_HEADER_BYTES || zt_tokens_header_decode(raw, &h) < 0) {
    rc = ztctl_fail_msg("EINVAL", "%s is not a token file (see ztctl tokenize)", path);
    goto out;
  }
  zt_tokens_layout l = {.tokens = ZT_TOKENS_HEADER_BYTES};
  if (h.version == ZT_TOKENS_VERSION) {
    f->n_tokens = ((uint64_t)size - ZT_TOKENS_HEADER_BYTES) / h.token_bytes;
  } else if (size < ZT_TOKENS_V2_HEADER_BYTES || zt_tokens_header_decode_v2(raw, &h) < 0 ||
             zt_tokens_layout_of(&h, &l) < 0 || l.size != (uint64_t)size) {
    rc = ztctl_fail_msg("EINVAL", "%s is not a whole version 2 token file (see docs/spec.md)",
                        path);
    goto out;
  } else {
    f->n_tokens = h.n_tokens;
  }
  if (f->n_tokens < f->seq_len + 1) {
    rc = ztctl_fail_msg("EINVAL", "%s holds %llu tokens, fewer than seq_len + 1 = %llu", path,
                        (unsigned long long)f->n_tokens, (unsigned long long)(f->seq_len + 1));
    goto out;
  }
  f->tokens = malloc(f->n_tokens * sizeof *f->tokens);
  if (!f->tokens) {
    rc = ztctl_fail_msg("ENOMEM", "out of memory");
    goto out;
  }
  const uint8_t *p = raw + l.tokens;
  for (uint64_t i = 0; i < f->n_tokens; i++)
    f->tokens[i] = h.token_bytes == 2 ? (int32_t)(p[2 * i] | p[2 * i + 1] << 8)
                                      : (int32_t)zt__get_le32(p + 4 * i);
  if (h.version == ZT_TOKENS_VERSION_DOCS) {
    /* the daemon checks the bytes it is sent; a table out of order here only marks fewer
     * starts */
    f->counted = malloc(f->n_tokens);
    f->starts = calloc(f->n_tokens, 1);
    if (!f->counted || !f->starts) {
      rc = ztctl_fail_msg("ENOMEM", "out of memory");
      goto out;
    }
    for (uint64_t i = 0; i < f->n_tokens; i++) f->counted[i] = raw[l.mask + i / 8] >> (i % 8) & 1;
    for (uint64_t d = 0; d < h.n_docs; d++) {
      uint64_t s = zt__get_le64(raw + l.starts + 8 * d);
      if (s < f->n_tokens) f->starts[s] = 1;
    }
  }
  rc = ZTCTL_OK;
  goto out;
io:
  rc = ztctl_fail_msg("EIO", "reading %s: %s", path, strerror(errno));
out:
  free(raw);
  fclose(fp);
  return rc;
}

/* Micro-batch b: rows are consecutive windows of T+1 tokens at stride T, wrapping at the end;
 * a version 2 file's mask and document starts go with them. */
static void fill_batch(const feed *f, uint64_t b, int32_t *out, uint8_t *mask, uint8_t *starts) {
  uint64_t T = f->seq_len;
  for (uint64_t r = 0; r < f->micro_batch; r++) {
    uint64_t start = ((b * f->micro_batch + r) % f->n_tokens) * T % f->n_tokens;
    for (uint64_t t = 0; t <= T; t++) {
      uint64_t i = (start + t) % f->n_tokens;
      out[r * (T + 1) + t] = f->tokens[i];
      if (f->counted) {
        mask[r * (T + 1) + t] = f->counted[i];
        /* the wrap from the file's end to its start begins a document too */
        starts[r * (T + 1) + t] = f->starts[i];
      }
    }
  }
}

static void *feed_run(void *arg) {
  feed *f = arg;
  size_t n = (size_t)(f->micro_batch * (f->seq_len + 1));
  int32_t *buf = malloc(n * sizeof *buf);
  uint8_t *mask = malloc(2 * n), *starts = mask ? mask + n : NULL;
  f->rc = ZTCTL_FAILED;
  if (!buf || !mask) {
    free(buf);
    free(mask);
    ztctl_fail_msg("ENOMEM", "out of memory");
    return NULL;
  }
  uint64_t b = 0;
  for (; b < f->batches; b++) {
    fill_batch(f, b, buf, mask, starts);
    if (zt_client_push_batch_docs(f->c, f->job, buf, f->counted ? mask : NULL,
                                  f->counted ? starts : NULL, n) < 0)
      break;
  }
  if (b == f->batches) {
    f->rc = ZTCTL_OK;
  } else if (!atomic_load(&f->stopping) && !ztctl_sigint_came()) {
    fprintf(stderr, "ztctl: batch %llu of %llu: %s: %s\n", (unsigned long long)b + 1,
            (unsigned long long)f->batches, zt_client_error_code(f->c), zt_client_error_message(f->c));
    /* a job left without its data would wait for ever: stop it (a no-op if it already ended) */
    if (zt_client_cancel(f->c, f->job) == 0) fprintf(stderr, "ztctl: cancelled %s\n", f->job);
  }
  free(buf);
  free(mask);
  return NULL;
}

/* train.X / model.X as a positive integer, from the daemon's normalised spec, else the file's. */
static uint64_t spec_uint(const json_t *daemon_spec, const json_t *file_spec, const char *section,
                          const char *key, uint64_t dflt) {
  const json_t *specs[2] = {daemon_spec, file_spec};
  for (int i = 0; i < 2; i++) {
    const json_t *v = json_object_get(json_object_get(specs[i], section), key);
    if (json_is_integer(v) && json_integer_value(v) > 0) return (uint64_t)json_integer_value(v);
  }
  return dflt;
}

/* Reads the batch shape: show's spec has the daemon's defaults filled in. */
static int batch_shape(zt_client *c, const char *job, const json_t *file_spec, feed *f) {
  char *json = NULL;
  if (zt_client_show(c, job, &json) < 0) return ztctl_fail(c);
  json_t *shown = json_loads(json, 0, NULL);
  free(json);
  const json_t *dspec = json_object_get(shown, "spec");
  f->micro_batch = spec_uint(dspec, file_spec, "train", "micro_batch", 0);
  f->seq_len = spec_uint(dspec, file_spec, "model", "seq_len", 0);
  uint64_t steps = spec_uint(dspec, file_spec, "train", "steps", 0);
  uint64_t accum = spec_uint(dspec, file_spec, "train", "grad_accum", 1);
  /* a step of a job on several ranks takes grad_accum micro-batches for each: parallel.gpus
   * on this daemon and as many on each of its peers */
  uint64_t ranks = spec_uint(dspec, file_spec, "parallel", "gpus", 1) *
                   (1 + json_array_size(json_object_get(json_object_get(dspec, "parallel"),
                                                        "peers")));
  json_decref(shown);
  if (!f->micro_batch || !f->seq_len || !steps)
    return ztctl_fail_msg("EINVAL", "job %s: the spec lacks train.micro_batch, model.seq_len or "
                          "train.steps, needed to stream --data", job);
  f->batches = steps * accum * ranks;
  return ZTCTL_OK;
}

int ztctl_cmd_submit(const ztctl_opts *o, int argc, char **argv) {
  const char *spec_path = NULL, *data_path = NULL;
  bool wait = false, watch = false, detach = false;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--wait") == 0) {
      wait = true;
    } else if (strcmp(argv[i], "--detach") == 0) {
      detach = true;
    } else if (strcmp(argv[i], "--watch") == 0) {
      watch = true;
    } else if (strcmp(argv[i], "--data") == 0) {
      if (i + 1 >= argc) return ztctl_usage_error("submit", "--data needs a FILE");
      data_path = argv[++i];
    } else if (strncmp(argv[i], "--data=", 7) == 0) {
      data_path = argv[i] + 7;
    } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
      return ztctl_usage_error("submit", "unknown option '%s'", argv[i]);
    } else if (spec_path) {
      return ztctl_usage_error("submit", "one SPEC.json only ('%s' is extra)", argv[i]);
    } else {
      spec_path = argv[i];
    }
  }
  if (!spec_path) return ztctl_usage_error("submit", "submit needs a SPEC.json");
  if (wait && watch) return ztctl_usage_error("submit", "--wait and --watch exclude each other");
  if (detach && !data_path)
    return ztctl_usage_error("submit", "--detach is for --data (what Ctrl-C does to the job fed)");

  int rc = ZTCTL_FAILED;
  char *text = NULL;
  zt_client *c = NULL;
  feed f = {.rc = ZTCTL_OK};
  pthread_t feeder;
  bool feeding = false;
  json_error_t jerr;
  json_t *spec = json_load_file(spec_path, 0, &jerr);
  if (!spec) {
    rc = ztctl_fail_msg("EINVAL", "%s: %s (line %d, column %d)", spec_path, jerr.text, jerr.line,
                        jerr.column);
    goto out;
  }
  if (resolve_data_path(spec) < 0 || !(text = json_dumps(spec, JSON_COMPACT))) {
    rc = ztctl_fail_msg("ENOMEM", "cannot prepare the spec");
    goto out;
  }
  if (!(c = ztctl_connect(o))) goto out;
  char job[ZT_CLIENT_JOB_ID_MAX];
  if (zt_client_submit_json(c, text, job) < 0) {
    rc = ztctl_fail(c);
    goto out;
  }
  if (o->json) {
    json_t *reply = json_pack("{s:s}", "job", job);
    char *line = reply ? json_dumps(reply, JSON_COMPACT) : NULL;
    printf("%s\n", line ? line : "{}");
    free(line);
    json_decref(reply);
  } else {
    printf("%s\n", job);
  }
  fflush(stdout);
  rc = ZTCTL_OK;
  if (data_path) {
    f.job = job;
    if ((rc = batch_shape(c, job, spec, &f)) != ZTCTL_OK) goto out;
    if ((rc = load_tokens(data_path, &f)) != ZTCTL_OK) goto out;
    if (!wait && !watch) {
      f.c = c;
      ztctl_sigint_arm(c, NULL);
      feed_run(&f);
      ztctl_sigint_disarm();
      rc = ztctl_sigint_came() ? interrupted(o, job, detach) : f.rc;
      goto out;
    }
    if (!(f.c = ztctl_connect(o))) {
      rc = ZTCTL_FAILED;
      goto out;
    }
    ztctl_sigint_arm(c, f.c);
    int err = pthread_create(&feeder, NULL, feed_run, &f);
    if (err) {
      rc = ztctl_fail_msg("EAGAIN", "cannot start the feeder thread: %s", strerror(err));
      goto out;
    }
    feeding = true;
  }
  if (wait || watch) rc = ztctl_watch_job(o, c, job, watch);
  if (feeding) {
    /* a job that ended early may leave the feeder blocked on credit: cut its connection */
    if (rc != ZTCTL_OK) {
      atomic_store(&f.stopping, true);
      zt_client_interrupt(f.c);
    }
    pthread_join(feeder, NULL);
    if (rc == ZTCTL_OK) rc = f.rc;
    ztctl_sigint_disarm();
    if (ztctl_sigint_came()) rc = interrupted(o, job, detach);
  }
out:
  if (f.c != c) zt_client_close(f.c);
  zt_client_close(c);
  free(f.tokens);
  free(f.counted);
  free(f.starts);
  free(text);
  json_decref(spec);
  return rc;
}

/* plan's flags of the machine to plan for, by ztd's flag names, and the target's field each
 * fills (docs/protocol.md "plan"): the values go as given, the daemon checks them. */
static const char *const k_target_flags[][2] = {
    {"--backend", "backend"},           {"--gpus", "gpus"},
    {"--gpu-mem-limit", "gpu_mem_limit"}, {"--host-mem-limit", "host_mem_limit"},
    {"--nvme-bytes", "nvme_bytes"},     {"--rates", "rates"}};
#define N_TARGET_FLAGS (sizeof k_target_flags / sizeof k_target_flags[0])

/* One target flag's value into *target (made on the first): --gpus a count where it reads as
 * one, --rates a built-in set's name or (a value with a '/' or a '.') a JSON rates file, read
 * here and sent inline. ZTCTL_OK or the failure printed. */
static int target_set(json_t **target, const char *key, const char *v) {
  json_t *val;
  char *end;
  long n = strtol(v, &end, 10);
  if (!strcmp(key, "gpus") && v[0] && !*end) {
    val = json_integer(n);
  } else if (!strcmp(key, "rates") && strpbrk(v, "/.")) {
    json_error_t jerr;
    if (!(val = json_load_file(v, JSON_REJECT_DUPLICATES, &jerr)))
      return ztctl_fail_msg("EINVAL", "--rates %s: %s (line %d, column %d)", v, jerr.text,
                            jerr.line, jerr.column);
  } else {
    val = json_string(v);
  }
  if (!*target) *target = json_object();
  if (!val || !*target || json_object_set_new(*target, key, val) < 0)
    return ztctl_fail_msg("ENOMEM", "out of memory");
  return ZTCTL_OK;
}

/* "planned for: cuda, 1 GPU of 24 GiB, host 64 GiB, NVMe 500 GB, rates h200" */
static void print_target(const json_t *t) {
  char gpu[32], host[32], nvme[32];
  long long gpus = json_integer_value(json_object_get(t, "gpus"));
  int cuda = !strcmp(json_string_value(json_object_get(t, "backend")) ?: "", "cuda");
  ztctl_fmt_bytes(host, sizeof host, json_number_value(json_object_get(t, "host_mem_limit")));
  printf("planned for: %s, %lld %s%s", cuda ? "cuda" : "cpu", gpus,
         cuda ? "GPU" : "simulated rank", gpus == 1 ? "" : "s");
  if (json_object_get(t, "gpu_mem_limit")) {
    ztctl_fmt_bytes(gpu, sizeof gpu, json_number_value(json_object_get(t, "gpu_mem_limit")));
    printf(" of %s", gpu);
  }
  printf(", host %s", host);
  if (json_object_get(t, "nvme_bytes")) {
    ztctl_fmt_bytes(nvme, sizeof nvme, json_number_value(json_object_get(t, "nvme_bytes")));
    printf(", NVMe %s free", nvme);
  }
  printf(", rates %s\n", json_string_value(json_object_get(t, "rates")) ?: "?");
}

/* The daemon's sizing of a spec, without queueing it: for its own machine, or with target
 * flags for the one they describe. */
int ztctl_cmd_plan(const ztctl_opts *o, int argc, char **argv) {
  const char *spec_path = NULL;
  int rc = ZTCTL_FAILED;
  char *text = NULL, *reply = NULL, *target_text = NULL;
  zt_client *c = NULL;
  json_t *plan = NULL, *spec = NULL, *target = NULL;
  json_error_t jerr;
  for (int i = 0; i < argc; i++) {
    size_t f = 0, len;
    const char *v = NULL;
    for (; f < N_TARGET_FLAGS; f++) {
      len = strlen(k_target_flags[f][0]);
      if (!strcmp(argv[i], k_target_flags[f][0]) && i + 1 < argc) {
        v = argv[++i];
        break;
      }
      if (!strncmp(argv[i], k_target_flags[f][0], len) && argv[i][len] == '=') {
        v = argv[i] + len + 1;
        break;
      }
      if (!strcmp(argv[i], k_target_flags[f][0])) {
        rc = ztctl_usage_error("plan", "%s needs a value", argv[i]);
        goto out;
      }
    }
    if (v) {
      if ((rc = target_set(&target, k_target_flags[f][1], v)) != ZTCTL_OK) goto out;
    } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
      rc = ztctl_usage_error("plan", "unknown option '%s'", argv[i]);
      goto out;
    } else if (spec_path) {
      rc = ztctl_usage_error("plan", "one SPEC.json only ('%s' is extra)", argv[i]);
      goto out;
    } else {
      spec_path = argv[i];
    }
  }
  if (!spec_path) {
    rc = ztctl_usage_error("plan", "plan takes one SPEC.json");
    goto out;
  }
  rc = ZTCTL_FAILED;
  if (!(spec = json_load_file(spec_path, 0, &jerr))) {
    rc = ztctl_fail_msg("EINVAL", "%s: %s (line %d, column %d)", spec_path, jerr.text, jerr.line,
                        jerr.column);
    goto out;
  }
  if (resolve_data_path(spec) < 0 || !(text = json_dumps(spec, JSON_COMPACT)) ||
      (target && !(target_text = json_dumps(target, JSON_COMPACT)))) {
    rc = ztctl_fail_msg("ENOMEM", "cannot prepare the spec");
    goto out;
  }
  if (!(c = ztctl_connect(o))) goto out;
  if (zt_client_plan_target_json(c, text, target_text, &reply) < 0) {
    rc = ztctl_fail(c);
    goto out;
  }
  rc = ZTCTL_OK;
  if (o->json) {
    printf("%s\n", reply);
    goto out;
  }
  if (!(plan = json_loads(reply, 0, &jerr))) {
    rc = ztctl_fail_msg("EPROTO", "reply is not JSON: %s", jerr.text);
    goto out;
  }
  char need[32], host[32], dev[32];
  const json_t *off = json_object_get(plan, "offload");
  if (json_object_get(plan, "target")) print_target(json_object_get(plan, "target"));
  ztctl_fmt_bytes(need, sizeof need, json_number_value(json_object_get(plan, "backend_bytes")));
  printf("fits: %s, %.2f M parameters, %s on the %s backend\n",
         json_string_value(json_object_get(plan, "arch")),
         json_number_value(json_object_get(plan, "params")) / 1e6, need,
         json_string_value(json_object_get(plan, "backend")));
  const json_t *par = json_object_get(plan, "parallel");
  long long world = json_integer_value(json_object_get(par, "world"));
  if (world > 1) {
    char rank[32];
    size_t peers = json_array_size(json_object_get(par, "peers"));
    ztctl_fmt_bytes(rank, sizeof rank,
                    json_number_value(json_array_get(json_object_get(par, "rank_bytes"), 0)));
    printf("parallel: %lld ranks, ZeRO stage %lld, %s on each", world,
           (long long)json_integer_value(json_object_get(par, "zero_stage")), rank);
    if (peers)
      printf(" (%lld here, as many on each of %zu peers)",
             (long long)json_integer_value(json_object_get(par, "gpus")), peers);
    printf("\n");
  }
  const json_t *batch = json_object_get(plan, "batch");
  if (batch)
  {
    long long tokens = json_integer_value(json_object_get(batch, "tokens"));
    long long mb = json_integer_value(json_object_get(batch, "micro_batch"));
    long long ga = json_integer_value(json_object_get(batch, "grad_accum"));
    long long rows = mb * ga * (world > 0 ? world : 1);
    printf("batch: %lld tokens a step = train.micro_batch %lld x train.grad_accum %lld x %lld "
           "rank(s) x model.seq_len %lld\n", tokens, mb, ga, world, rows ? tokens / rows : 0);
  }
  char tables[32];
  ztctl_fmt_bytes(host, sizeof host, json_number_value(json_object_get(plan, "host_bytes")));
  ztctl_fmt_bytes(tables, sizeof tables,
                  json_number_value(json_object_get(plan, "data_table_bytes")));
  printf("host: %s while it runs (the packed documents' tables %s)\n", host, tables);
  long long epochs = json_integer_value(json_object_get(plan, "epochs"));
  if (epochs)
    printf("steps: %lld (train.epochs %lld of data.path, the last step's rows past them "
           "padding)\n", (long long)json_integer_value(json_object_get(plan, "steps")), epochs);
  else
    printf("steps: %lld\n", (long long)json_integer_value(json_object_get(plan, "steps")));
  const char *why = json_string_value(json_object_get(plan, "offloaded_by_default"));
  if (why) printf("offloaded by default (\"offload\": false opts out): %s\n", why);
  if (off && world > 1) {
    /* each rank's placement (engine/job/dp_placement.c) */
    ztctl_fmt_bytes(host, sizeof host,
                    json_number_value(json_object_get(off, "host_bytes_per_rank")));
    int every = (int)json_integer_value(json_object_get(off, "ckpt_every"));
    char ckpt[32] = "none";
    if (every) snprintf(ckpt, sizeof ckpt, "every %d block(s)", every);
    /* optimizer nvme: the rest's masters, m and v in each rank's files */
    double nvb = json_number_value(json_object_get(off, "nvme_bytes_per_rank"));
    char nv[64] = "";
    if (nvb > 0) {
      char b[32];
      ztctl_fmt_bytes(b, sizeof b, nvb);
      snprintf(nv, sizeof nv, " and NVMe files of %s", b);
    }
    /* the micro-batches' order the ranks walk (docs/offload.md "Unit-major micro-batches") */
    const char *order = json_string_value(json_object_get(off, "order"));
    printf("offload: each rank keeps the optimizer of %d of %d units on its GPU and the rest's "
           "in a host tier of %s%s; parameters on the %s; activation checkpointing %s%s\n",
           (int)json_integer_value(json_object_get(off, "gpu_units")),
           (int)json_integer_value(json_object_get(off, "units")), host, nv,
           json_string_value(json_object_get(off, "params")), ckpt,
           order && !strcmp(order, "unit") ? "; micro-batches walked unit by unit" : "");
  } else if (off) {
    char act[32], units[32], arena[32], nvme[32], sums[32];
    ztctl_fmt_bytes(host, sizeof host, json_number_value(json_object_get(off, "host_bytes")));
    ztctl_fmt_bytes(dev, sizeof dev, json_number_value(json_object_get(off, "device_bytes")));
    ztctl_fmt_bytes(act, sizeof act, json_number_value(json_object_get(off, "act_bytes")));
    ztctl_fmt_bytes(units, sizeof units,
                    json_number_value(json_object_get(off, "gpu_unit_bytes")));
    ztctl_fmt_bytes(arena, sizeof arena, json_number_value(json_object_get(off, "arena_bytes")));
    ztctl_fmt_bytes(nvme, sizeof nvme, json_number_value(json_object_get(off, "nvme_bytes")));
    ztctl_fmt_bytes(sums, sizeof sums, json_number_value(json_object_get(off, "dsum_bytes")));
    int every = (int)json_integer_value(json_object_get(off, "ckpt_every"));
    char ckpt[32] = "none";
    if (every) snprintf(ckpt, sizeof ckpt, "every %d block(s)", every);
    printf("offload: device %s = activations %s + %d of %d units with their optimizer on the "
           "device %s + gradient sums %s + streaming arena %s\n", dev, act,
           (int)json_integer_value(json_object_get(off, "gpu_units")),
           (int)json_integer_value(json_object_get(off, "units")), units, sums, arena);
    int n_units = (int)json_integer_value(json_object_get(off, "units"));
    int gpu_units = (int)json_integer_value(json_object_get(off, "gpu_units"));
    int host_units = (int)json_integer_value(json_object_get(off, "host_units"));
    printf("offload: host tier %s (the optimizer of %d units), NVMe files %s (of %d units); "
           "parameters between uses on the %s; the step's gradient sums on the %s; activation "
           "checkpointing %s; estimated %.3f s/step\n", host, host_units, nvme,
           n_units - gpu_units - host_units, json_string_value(json_object_get(off, "params")),
           !strcmp(json_string_value(json_object_get(off, "grads")) ?: "", "gpu") ? "device"
                                                                                : "host",
           ckpt,
           json_number_value(json_object_get(off, "est_step_s")));
    char h2d[32], d2h[32], io[32];
    ztctl_fmt_bytes(h2d, sizeof h2d, json_number_value(json_object_get(off, "h2d_bytes")));
    ztctl_fmt_bytes(d2h, sizeof d2h, json_number_value(json_object_get(off, "d2h_bytes")));
    ztctl_fmt_bytes(io, sizeof io, json_number_value(json_object_get(off, "nvme_step_bytes")));
    printf("offload: expected per step: %s to the device, %s to the host, %s of NVMe I/O\n",
           h2d, d2h, io);
    /* the cost model's queues: the one busy nearest the step's time bounds it */
    const json_t *est = json_object_get(off, "est");
    if (est)
      printf("offload: estimated busy per step: compute %.0f ms, to the device %.0f ms, to the "
             "host %.0f ms, CPU AdamW %.0f ms, NVMe %.0f ms, the runner %.0f ms\n",
             1e3 * json_number_value(json_object_get(est, "compute_s")),
             1e3 * json_number_value(json_object_get(est, "h2d_s")),
             1e3 * json_number_value(json_object_get(est, "d2h_s")),
             1e3 * json_number_value(json_object_get(est, "adam_s")),
             1e3 * json_number_value(json_object_get(est, "nvme_s")),
             1e3 * json_number_value(json_object_get(est, "runner_s")));
  }
  /* what a submit stores as jobs/<id>/plan.json (docs/offload.md "The stored plan") */
  const json_t *stored = json_object_get(plan, "plan");
  if (stored) {
    const json_t *bud = json_object_get(stored, "budgets");
    char gpu[32] = "none", hb[32] = "none", nb[32] = "none";
    if (json_integer_value(json_object_get(bud, "gpu")))
      ztctl_fmt_bytes(gpu, sizeof gpu, json_number_value(json_object_get(bud, "gpu")));
    if (json_integer_value(json_object_get(bud, "host")))
      ztctl_fmt_bytes(hb, sizeof hb, json_number_value(json_object_get(bud, "host")));
    if (json_integer_value(json_object_get(bud, "nvme")))
      ztctl_fmt_bytes(nb, sizeof nb, json_number_value(json_object_get(bud, "nvme")));
    printf("plan (stored as plan.json, reused by the runner and after a restart): ckpt_every "
           "%d, params %s, order %s, gpu_units %d, host_units %d, grad_slots %d, grads %s; "
           "made under gpu_budget %s, host_budget %s, nvme_budget %s\n",
           (int)json_integer_value(json_object_get(stored, "ckpt_every")),
           json_string_value(json_object_get(stored, "params")) ?: "?",
           json_string_value(json_object_get(stored, "order")) ?: "?",
           (int)json_integer_value(json_object_get(stored, "gpu_units")),
           (int)json_integer_value(json_object_get(stored, "host_units")),
           (int)json_integer_value(json_object_get(stored, "grad_slots")),
           json_string_value(json_object_get(stored, "grads")) ?: "?", gpu, hb, nb);
  }
out:
  json_decref(plan);
  json_decref(spec);
  json_decref(target);
  free(reply);
  free(text);
  free(target_text);
  zt_client_close(c);
  return rc;
}
