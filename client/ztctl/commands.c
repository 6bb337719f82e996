/* The one-request commands: status, jobs, show, cancel, rm, resume, checkpoint, shutdown. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/ztctl/ztctl.h"

/* Checks the positional argument count: exactly n. */
static int want_args(const char *cmd, int argc, char **argv, int n) {
  for (int i = 0; i < argc; i++)
    if (argv[i][0] == '-' && argv[i][1] != '\0')
      return ztctl_usage_error(cmd, "unknown option '%s'", argv[i]);
  if (argc != n)
    return ztctl_usage_error(cmd, "%s takes %d argument%s, not %d", cmd, n, n == 1 ? "" : "s", argc);
  return ZTCTL_OK;
}

/* Prints a reply built here (takes the reference). */
static void print_json(json_t *j) {
  char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
  if (s) printf("%s\n", s);
  free(s);
  json_decref(j);
}

/* Runs one JSON-returning call and prints the reply (raw with --json, else via show_fn). */
typedef int (*json_call)(zt_client *c, const char *job, char **json);
typedef void (*show_fn)(const json_t *reply, const char *job);

static int run_json(const ztctl_opts *o, const char *job, json_call call, show_fn show) {
  int rc = ZTCTL_FAILED;
  char *json = NULL;
  json_t *j = NULL;
  zt_client *c = ztctl_connect(o);
  if (!c) goto out;
  if (call(c, job, &json) < 0) {
    rc = ztctl_fail(c);
    goto out;
  }
  rc = ZTCTL_OK;
  if (o->json) {
    printf("%s\n", json);
    goto out;
  }
  json_error_t jerr;
  j = json_loads(json, 0, &jerr);
  if (!j) {
    rc = ztctl_fail_msg("EPROTO", "reply is not JSON: %s", jerr.text);
    goto out;
  }
  show(j, job);
out:
  json_decref(j);
  free(json);
  zt_client_close(c);
  return rc;
}

static int call_status(zt_client *c, const char *job, char **json) {
  (void)job;
  return zt_client_status(c, json);
}
static int call_jobs(zt_client *c, const char *job, char **json) {
  (void)job;
  return zt_client_jobs(c, json);
}
static int call_show(zt_client *c, const char *job, char **json) { return zt_client_show(c, job, json); }
static int call_checkpoint(zt_client *c, const char *job, char **json) {
  return zt_client_checkpoint(c, job, json);
}

/* "created" is shown as local time when it is a Unix timestamp. */
static void fmt_created(char *buf, size_t cap, const json_t *v) {
  if (json_is_integer(v)) {
    time_t t = (time_t)json_integer_value(v);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(buf, cap, "%Y-%m-%d %H:%M", &tm);
  } else {
    snprintf(buf, cap, "%s", json_is_string(v) ? json_string_value(v) : "-");
  }
}

static const char *str_or_dash(const json_t *o, const char *key) {
  const char *s = json_string_value(json_object_get(o, key));
  return s ? s : "-";
}

static double num(const json_t *o, const char *key) { return json_number_value(json_object_get(o, key)); }

/* A limit of 0 means none was set. */
static void fmt_limit(char *buf, size_t cap, const json_t *mem, const char *key) {
  double v = num(mem, key);
  if (v > 0) ztctl_fmt_bytes(buf, cap, v);
  else snprintf(buf, cap, "none");
}

/* Four lines a person reads at a glance; --json has every field. */
static void show_status(const json_t *j, const char *job) {
  (void)job;
  const json_t *mem = json_object_get(j, "memory");
  const json_t *queue = json_object_get(j, "queue");
  printf("%s (protocol %lld), backend %s\n", str_or_dash(j, "server"),
         (long long)json_integer_value(json_object_get(j, "version")), str_or_dash(j, "backend"));
  printf("devices:");
  size_t i;
  const json_t *d;
  const char *sep = " ";
  json_array_foreach(json_object_get(j, "devices"), i, d) {
    if (!strcmp(str_or_dash(d, "kind"), "cuda")) {
      char total[32], free_b[32];
      ztctl_fmt_bytes(total, sizeof total, num(d, "mem_total"));
      ztctl_fmt_bytes(free_b, sizeof free_b, num(d, "mem_free"));
      printf("%scuda:%lld %s, %s (%s free)", sep, (long long)json_integer_value(json_object_get(d, "index")),
             str_or_dash(d, "name"), total, free_b);
    } else {
      printf("%s%s (%lld threads)", sep, str_or_dash(d, "name"),
             (long long)json_integer_value(json_object_get(d, "threads")));
    }
    sep = "; ";
  }
  char used[32], host[32], gpu[32];
  ztctl_fmt_bytes(used, sizeof used, num(mem, "backend_bytes"));
  fmt_limit(host, sizeof host, mem, "host_mem_limit");
  fmt_limit(gpu, sizeof gpu, mem, "gpu_mem_limit");
  const char *nvme = json_string_value(json_object_get(mem, "nvme_dir"));
  printf("\nmemory: %s in use by jobs on %s; limits: host %s, gpu %s; nvme dir %s\n", used,
         str_or_dash(mem, "backend"), host, gpu, nvme ? nvme : "none");
  /* per device of the job set: now, the highest any job reached, and the driver's view */
  json_array_foreach(json_object_get(mem, "devices"), i, d) {
    char alloc[32], peak[32], res[32], total[32], free_b[32];
    ztctl_fmt_bytes(alloc, sizeof alloc, num(d, "allocated"));
    ztctl_fmt_bytes(peak, sizeof peak, num(d, "peak"));
    ztctl_fmt_bytes(res, sizeof res, num(d, "reserved"));
    int cuda = !strcmp(str_or_dash(d, "kind"), "cuda");
    printf("  %s %lld: %s allocated by jobs, peak %s, reserved %s", cuda ? "cuda" : "cpu rank",
           (long long)json_integer_value(json_object_get(d, "device")), alloc, peak, res);
    if (json_is_number(json_object_get(d, "total"))) {
      ztctl_fmt_bytes(total, sizeof total, num(d, "total"));
      ztctl_fmt_bytes(free_b, sizeof free_b, num(d, "free"));
      printf("; %s total, %s free", total, free_b);
    }
    printf("\n");
  }
  const json_t *h = json_object_get(mem, "host");
  if (json_is_object(h)) {
    char pinned[32], alloc[32], limit[32];
    ztctl_fmt_bytes(pinned, sizeof pinned, num(h, "pinned"));
    ztctl_fmt_bytes(alloc, sizeof alloc, num(h, "allocated"));
    ztctl_fmt_bytes(limit, sizeof limit, num(h, "limit"));
    printf("  host: %s pinned by jobs, %s allocated by cpu jobs, limit %s\n", pinned, alloc, limit);
  }
  /* the device set jobs are scheduled on, with the job holding each (cpu: simulated ranks) */
  printf("%s:", strcmp(str_or_dash(j, "backend"), "cuda") ? "ranks" : "gpus");
  sep = " ";
  json_array_foreach(json_object_get(j, "gpus"), i, d) {
    const char *holder = json_string_value(json_object_get(d, "job"));
    printf("%s%lld %s", sep, (long long)json_integer_value(json_object_get(d, "index")),
           holder ? holder : "free");
    sep = ", ";
  }
  printf("\njobs: %lld running, %lld queued, %lld in all\n",
         (long long)json_integer_value(json_object_get(queue, "running")),
         (long long)json_integer_value(json_object_get(queue, "queued")),
         (long long)json_integer_value(json_object_get(j, "jobs")));
}

int ztctl_cmd_status(const ztctl_opts *o, int argc, char **argv) {
  int rc = want_args("status", argc, argv, 0);
  return rc != ZTCTL_OK ? rc : run_json(o, NULL, call_status, show_status);
}

static void show_jobs(const json_t *j, const char *job) {
  (void)job;
  const json_t *list = json_object_get(j, "jobs");
  printf("%-10s %-20s %-10s %-8s %13s %10s %10s  %s\n", "JOB", "NAME", "STATE", "ARCH", "STEP",
         "LOSS", "EVAL", "CREATED");
  size_t i;
  json_t *r;
  json_array_foreach(list, i, r) {
    char step[32], loss[32], eval[32], created[32];
    snprintf(step, sizeof step, "%lld/%lld", (long long)json_integer_value(json_object_get(r, "step")),
             (long long)json_integer_value(json_object_get(r, "steps")));
    const json_t *l = json_object_get(r, "loss");
    if (json_is_number(l))
      snprintf(loss, sizeof loss, "%.4f", json_number_value(l));
    else
      snprintf(loss, sizeof loss, "-");
    /* the newest held-out evaluation's loss (data.eval) */
    const json_t *e = json_object_get(r, "eval_loss");
    if (json_is_number(e))
      snprintf(eval, sizeof eval, "%.4f", json_number_value(e));
    else
      snprintf(eval, sizeof eval, "-");
    fmt_created(created, sizeof created, json_object_get(r, "created"));
    printf("%-10s %-20s %-10s %-8s %13s %10s %10s  %s\n", str_or_dash(r, "job"),
           str_or_dash(r, "name"), str_or_dash(r, "state"), str_or_dash(r, "arch"), step, loss,
           eval, created);
  }
}

int ztctl_cmd_jobs(const ztctl_opts *o, int argc, char **argv) {
  int rc = want_args("jobs", argc, argv, 0);
  return rc != ZTCTL_OK ? rc : run_json(o, NULL, call_jobs, show_jobs);
}

/* The loss history is summarised (count, first, last), the times are local; --json prints all
 * of it as the daemon sent it. */
static void show_job(const json_t *j, const char *job) {
  (void)job;
  json_t *copy = json_deep_copy(j);
  if (!copy) return;
  static const char *const times[] = {"created", "started", "ended"};
  for (size_t k = 0; k < sizeof times / sizeof times[0]; k++) {
    const json_t *t = json_object_get(copy, times[k]);
    if (!json_is_integer(t)) continue;
    time_t sec = (time_t)json_integer_value(t);
    struct tm tm;
    char buf[64];
    localtime_r(&sec, &tm);
    strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S %Z", &tm);
    json_object_set_new(copy, times[k], json_string(buf));
  }
  const json_t *losses = json_object_get(copy, "losses");
  const json_t *spec = json_object_get(copy, "spec");
  size_t n = json_array_size(losses);
  /* seven digits, as the figures above: the spec's float32 fields as they were written */
  char *spec_text = spec ? json_dumps(spec, JSON_COMPACT | JSON_REAL_PRECISION(7)) : NULL;
  if (losses) {
    if (n > 0 && json_is_number(json_array_get(losses, 0)) && json_is_number(json_array_get(losses, n - 1)))
      printf("losses: %zu steps, first %.4f, last %.4f\n", n,
             json_number_value(json_array_get(losses, 0)), json_number_value(json_array_get(losses, n - 1)));
    else
      printf("losses: %zu steps\n", n);
  }
  /* data.eval: [[step, loss], ...] */
  const json_t *evals = json_object_get(copy, "evals");
  size_t ne = json_array_size(evals);
  if (ne > 0)
    printf("evals: %zu, last after step %lld, loss %.4f\n", ne,
           (long long)json_integer_value(json_array_get(json_array_get(evals, ne - 1), 0)),
           json_number_value(json_array_get(json_array_get(evals, ne - 1), 1)));
  json_object_del(copy, "losses");
  json_object_del(copy, "evals");
  json_object_del(copy, "spec");
  json_t *mem = json_incref(json_object_get(copy, "memory"));
  json_object_del(copy, "memory");
  ztctl_print_flat(stdout, copy, "");
  if (mem) {
    char line[256], planned[32];
    ztctl_fmt_job_memory(line, sizeof line, mem, ZTCTL_MEM_FIGURES);
    ztctl_fmt_bytes(planned, sizeof planned, num(mem, "backend_bytes"));
    /* the plan's bytes only while the job holds them */
    printf("memory: %s on the %s backend%s%s\n", line, str_or_dash(mem, "backend"),
           num(mem, "backend_bytes") > 0 ? ", planned " : "",
           num(mem, "backend_bytes") > 0 ? planned : "");
    ztctl_fmt_job_memory(line, sizeof line, mem, ZTCTL_MEM_TIERS);
    if (line[0]) printf("offload: %s\n", line);
    ztctl_fmt_job_memory(line, sizeof line, mem, ZTCTL_MEM_TIMELINE);
    if (line[0]) printf("timeline of the last step: %s\n", line);
    json_decref(mem);
  }
  if (spec_text) printf("spec: %s\n", spec_text);
  free(spec_text);
  json_decref(copy);
}

int ztctl_cmd_show(const ztctl_opts *o, int argc, char **argv) {
  int rc = want_args("show", argc, argv, 1);
  return rc != ZTCTL_OK ? rc : run_json(o, argv[0], call_show, show_job);
}

static void show_checkpoint(const json_t *j, const char *job) {
  printf("%s: checkpoint at step %lld: %s\n", job,
         (long long)json_integer_value(json_object_get(j, "step")), str_or_dash(j, "path"));
}

int ztctl_cmd_checkpoint(const ztctl_opts *o, int argc, char **argv) {
  int rc = want_args("checkpoint", argc, argv, 1);
  return rc != ZTCTL_OK ? rc : run_json(o, argv[0], call_checkpoint, show_checkpoint);
}

int ztctl_cmd_cancel(const ztctl_opts *o, int argc, char **argv) {
  int rc = want_args("cancel", argc, argv, 1);
  if (rc != ZTCTL_OK) return rc;
  zt_client *c = ztctl_connect(o);
  if (!c) return ZTCTL_FAILED;
  rc = zt_client_cancel(c, argv[0]) < 0 ? ztctl_fail(c) : ZTCTL_OK;
  if (rc == ZTCTL_OK && o->json)
    print_json(json_pack("{s:s,s:s}", "job", argv[0], "state", "cancelled"));
  else if (rc == ZTCTL_OK)
    printf("%s: cancelled\n", argv[0]);
  zt_client_close(c);
  return rc;
}

int ztctl_cmd_rm(const ztctl_opts *o, int argc, char **argv) {
  int rc = want_args("rm", argc, argv, 1);
  if (rc != ZTCTL_OK) return rc;
  zt_client *c = ztctl_connect(o);
  if (!c) return ZTCTL_FAILED;
  rc = zt_client_rm(c, argv[0]) < 0 ? ztctl_fail(c) : ZTCTL_OK;
  if (rc == ZTCTL_OK && o->json)
    print_json(json_pack("{s:s,s:b}", "job", argv[0], "removed", 1));
  else if (rc == ZTCTL_OK)
    printf("%s: removed\n", argv[0]);
  zt_client_close(c);
  return rc;
}

int ztctl_cmd_resume(const ztctl_opts *o, int argc, char **argv) {
  const char *job = NULL;
  long long steps = 0;
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
      char *end;
      steps = strtoll(argv[++i], &end, 10);
      if (*end || steps < 1) return ztctl_usage_error("resume", "--steps wants a positive count");
    } else if (argv[i][0] == '-' && argv[i][1]) {
      return ztctl_usage_error("resume", "unknown option '%s'", argv[i]);
    } else if (job) {
      return ztctl_usage_error("resume", "resume takes 1 argument");
    } else {
      job = argv[i];
    }
  }
  if (!job || !steps) return ztctl_usage_error("resume", "resume takes JOB --steps N");
  zt_client *c = ztctl_connect(o);
  if (!c) return ZTCTL_FAILED;
  char *json = NULL;
  int rc = zt_client_resume(c, job, (uint64_t)steps, &json) < 0 ? ztctl_fail(c) : ZTCTL_OK;
  json_t *j = rc == ZTCTL_OK ? json_loads(json, 0, NULL) : NULL;
  if (rc == ZTCTL_OK && o->json)
    printf("%s\n", json);
  else if (rc == ZTCTL_OK)
    printf("%s: queued to train to step %lld from its checkpoint at step %lld\n", job, steps,
           (long long)json_integer_value(json_object_get(j, "from_step")));
  json_decref(j);
  free(json);
  zt_client_close(c);
  return rc;
}

int ztctl_cmd_shutdown(const ztctl_opts *o, int argc, char **argv) {
  int rc = want_args("shutdown", argc, argv, 0);
  if (rc != ZTCTL_OK) return rc;
  zt_client *c = ztctl_connect(o);
  if (!c) return ZTCTL_FAILED;
  rc = zt_client_shutdown(c) < 0 ? ztctl_fail(c) : ZTCTL_OK;
  if (rc == ZTCTL_OK) printf(o->json ? "{}\n" : "ztd is shutting down\n");
  zt_client_close(c);
  return rc;
}
