/* defines: zt__metrics_text (http.h; called by http.c for GET /metrics): the daemon and its
 * jobs in the Prometheus text format 0.0.4. Daemon-wide figures come from the job layer's
 * status (queue, device and host memory) and the server's connection counts; a job's state,
 * step, loss and newest eval loss from its list; what a running job's last step reported (lr, grad norm, tokens/s,
 * step time, MFU, memory per tier, bytes moved per link, the offload timeline) from the
 * history's newest point, so a figure means what the step event's field means
 * (docs/protocol.md "watch"). The names are listed in docs/service.md. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/server/http.h"

#ifndef ZT_VERSION
#define ZT_VERSION "unknown"
#endif

static void family(FILE *f, const char *name, const char *type, const char *help) {
  fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value: backslash, double quote and newline escaped. */
static void label_value(FILE *f, const char *v) {
  fputc('"', f);
  for (; v && *v; v++) {
    if (*v == '\\' || *v == '"') fputc('\\', f);
    if (*v == '\n') fputs("\\n", f);
    else fputc(*v, f);
  }
  fputc('"', f);
}

static void value(FILE *f, double v) {
  if (isnan(v)) fputs(" NaN\n", f);
  else if (isinf(v)) fputs(v > 0 ? " +Inf\n" : " -Inf\n", f);
  else fprintf(f, " %.17g\n", v);
}

/* name{k1="v1",k2="v2"[,extra_key="extra"]} v */
static void sample(FILE *f, const char *name, const char *const *labels, const char *extra_key,
                   const char *extra, double v) {
  fputs(name, f);
  char sep = '{';
  for (; labels && labels[0]; labels += 2) {
    fprintf(f, "%c%s=", sep, labels[0]);
    label_value(f, labels[1]);
    sep = ',';
  }
  if (extra_key) {
    fprintf(f, "%c%s=", sep, extra_key);
    label_value(f, extra);
    sep = ',';
  }
  if (sep == ',') fputc('}', f);
  value(f, v);
}

static double num(const json_t *o, const char *key) {
  return json_number_value(json_object_get(o, key));
}

static void daemon_figures(FILE *f, zt_server *srv, const json_t *st, unsigned http_conns) {
  const char *info[] = {"version", ZT_VERSION, "backend", srv->cfg->backend, NULL};
  family(f, "zt_build_info", "gauge", "ztd's version and backend (always 1)");
  sample(f, "zt_build_info", info, NULL, NULL, 1);
  family(f, "zt_queue_jobs", "gauge", "jobs queued and running now");
  sample(f, "zt_queue_jobs", NULL, "state", "queued", num(st, "queued"));
  sample(f, "zt_queue_jobs", NULL, "state", "running", num(st, "running"));
  family(f, "zt_jobs_known", "gauge", "jobs the daemon lists, in every state");
  sample(f, "zt_jobs_known", NULL, NULL, NULL, num(st, "jobs"));
  family(f, "zt_connections", "gauge", "open connections per listener");
  sample(f, "zt_connections", NULL, "listener", "unix", srv->n_conns[0]);
  if (srv->cfg->tcp_host) sample(f, "zt_connections", NULL, "listener", "tcp", srv->n_conns[1]);
  sample(f, "zt_connections", NULL, "listener", "http", http_conns);

  /* per device jobs are scheduled on (docs/protocol.md "status") */
  static const char *const dev_figs[][3] = {
      {"allocated", "zt_device_allocated_bytes", "bytes running jobs have allocated on the device"},
      {"reserved", "zt_device_reserved_bytes", "bytes running jobs have reserved on the device"},
      {"peak", "zt_device_peak_bytes", "the most any job allocated on the device since ztd started"},
      {"total", "zt_device_total_bytes", "the device's memory (cuda)"},
      {"free", "zt_device_free_bytes", "the device's free memory by the driver (cuda)"},
  };
  const json_t *mem = json_object_get(st, "memory");
  const json_t *devs = json_object_get(mem, "devices");
  for (size_t k = 0; k < sizeof dev_figs / sizeof dev_figs[0]; k++) {
    int declared = 0;
    size_t i;
    const json_t *d;
    json_array_foreach(devs, i, d) {
      if (!json_is_number(json_object_get(d, dev_figs[k][0]))) continue;
      if (!declared++) family(f, dev_figs[k][1], "gauge", dev_figs[k][2]);
      char index[24];
      snprintf(index, sizeof index, "%lld", (long long)json_integer_value(json_object_get(d, "device")));
      const char *labels[] = {"device", index, "kind", json_string_value(json_object_get(d, "kind")),
                              NULL};
      sample(f, dev_figs[k][1], labels, NULL, NULL, num(d, dev_figs[k][0]));
    }
  }
  const json_t *host = json_object_get(mem, "host");
  family(f, "zt_host_pinned_bytes", "gauge", "page-locked host memory running jobs hold");
  sample(f, "zt_host_pinned_bytes", NULL, NULL, NULL, num(host, "pinned"));
  family(f, "zt_host_allocated_bytes", "gauge", "host memory cpu-backend jobs have allocated");
  sample(f, "zt_host_allocated_bytes", NULL, NULL, NULL, num(host, "allocated"));
  family(f, "zt_host_limit_bytes", "gauge", "the host memory jobs are admitted against");
  sample(f, "zt_host_limit_bytes", NULL, NULL, NULL, num(host, "limit"));
}

/* A figure of running jobs' newest points: `obj` the point's member holding it (NULL: the
 * point itself), one sample per key with the label `label` naming it (NULL: one key, no
 * label). Absent and null figures give no sample. */
typedef struct job_figure {
  const char *name, *help, *obj, *label;
  const char *keys[6];
} job_figure;

static const job_figure g_figures[] = {
    {"zt_job_lr", "the learning rate of the job's last step", NULL, NULL, {"lr"}},
    {"zt_job_grad_norm", "the global gradient norm of the last step, before clipping", NULL, NULL,
     {"grad_norm"}},
    {"zt_job_loss_scale", "the fp16 loss scale after the last step (1 otherwise)", NULL, NULL,
     {"loss_scale"}},
    {"zt_job_tokens_per_second", "tokens a second of the last step", NULL, NULL, {"tokens_per_s"}},
    {"zt_job_step_seconds", "the wall time of the last step", NULL, NULL, {"step_s"}},
    {"zt_job_mfu_ratio", "model flops utilisation of the last step: 6*N*tokens/s over the "
     "devices' nominal peak", NULL, NULL, {"mfu"}},
    {"zt_job_memory_bytes", "the job's memory per tier after its last step", "memory", "tier",
     {"device", "device_peak", "host_pinned", "nvme"}},
    {"zt_job_step_moved_bytes", "bytes the last step moved per link (offloaded jobs)", "moved",
     "link", {"h2d", "d2h", "nvme_read", "nvme_written"}},
    {"zt_job_timeline_busy_ratio", "the share of the last step each resource was busy "
     "(offloaded jobs)", "timeline", "resource", {"compute", "h2d", "d2h", "optimizer", "nvme"}},
};

/* The member of the point a figure's keys are in (the point itself when obj is NULL); the
 * timeline's waits, one level deeper, have their own family below. */
static const json_t *figure_obj(const json_t *point, const char *obj) {
  return obj ? json_object_get(point, obj) : point;
}

static void job_figures(FILE *f, const json_t *list, const zt__history *h) {
  static const char *const per_job[][3] = {
      {"zt_job_step", "gauge", "optimizer steps the job has done"},
      {"zt_job_steps", "gauge", "optimizer steps the job is to do"},
      {"zt_job_loss", "gauge", "the loss of the job's last step"},
      {"zt_job_eval_loss", "gauge", "the mean loss of the job's newest held-out evaluation "
       "(data.eval)"},
      {"zt_job_eval_step", "gauge", "the step the job's newest held-out evaluation followed"},
  };
  size_t i;
  const json_t *j;
  family(f, "zt_job_info", "gauge", "a job's state and architecture (always 1)");
  json_array_foreach(list, i, j) {
    const char *labels[] = {"job", json_string_value(json_object_get(j, "job")), "name",
                            json_string_value(json_object_get(j, "name")), "state",
                            json_string_value(json_object_get(j, "state")), "arch",
                            json_string_value(json_object_get(j, "arch")), NULL};
    sample(f, "zt_job_info", labels, NULL, NULL, 1);
  }
  for (size_t k = 0; k < sizeof per_job / sizeof per_job[0]; k++) {
    family(f, per_job[k][0], per_job[k][1], per_job[k][2]);
    json_array_foreach(list, i, j) {
      const json_t *v = json_object_get(j, per_job[k][0] + strlen("zt_job_"));
      if (!json_is_number(v)) continue;
      const char *labels[] = {"job", json_string_value(json_object_get(j, "job")), "name",
                              json_string_value(json_object_get(j, "name")), NULL};
      sample(f, per_job[k][0], labels, NULL, NULL, json_number_value(v));
    }
  }
  /* what the last step of each running job reported */
  for (size_t k = 0; k < sizeof g_figures / sizeof g_figures[0]; k++) {
    const job_figure *fig = &g_figures[k];
    family(f, fig->name, "gauge", fig->help);
    json_array_foreach(list, i, j) {
      const char *id = json_string_value(json_object_get(j, "job"));
      const char *state = json_string_value(json_object_get(j, "state"));
      const json_t *point = zt__history_last(h, id);
      if (!point || !state || strcmp(state, "running") != 0) continue;
      const json_t *o = figure_obj(point, fig->obj);
      const char *labels[] = {"job", id, "name", json_string_value(json_object_get(j, "name")),
                              NULL};
      for (int q = 0; q < 6 && fig->keys[q]; q++) {
        const json_t *v = json_object_get(o, fig->keys[q]);
        if (json_is_number(v))
          sample(f, fig->name, labels, fig->label, fig->label ? fig->keys[q] : NULL,
                 json_number_value(v));
      }
    }
  }
  family(f, "zt_job_timeline_wait_ratio", "gauge", "the share of the last step the trainer "
         "waited on each resource (offloaded jobs)");
  json_array_foreach(list, i, j) {
    const char *id = json_string_value(json_object_get(j, "job"));
    const char *state = json_string_value(json_object_get(j, "state"));
    const json_t *w = json_object_get(json_object_get(zt__history_last(h, id), "timeline"), "waits");
    if (!w || !state || strcmp(state, "running") != 0) continue;
    const char *labels[] = {"job", id, "name", json_string_value(json_object_get(j, "name")), NULL};
    static const char *const waits[] = {"copy", "optimizer", "nvme"};
    for (int q = 0; q < 3; q++)
      if (json_is_number(json_object_get(w, waits[q])))
        sample(f, "zt_job_timeline_wait_ratio", labels, "resource", waits[q], num(w, waits[q]));
  }
}

char *zt__metrics_text(zt_server *srv, const zt__history *h, unsigned http_conns, size_t *len) {
  char *text = NULL;
  *len = 0;
  json_t *st = zt_jobs_status(srv->jobs);
  json_t *list = zt_jobs_list(srv->jobs);
  FILE *f = st && list ? open_memstream(&text, len) : NULL;
  if (f) {
    daemon_figures(f, srv, st, http_conns);
    job_figures(f, json_object_get(list, "jobs"), h);
    if (fclose(f) != 0) {
      free(text);
      text = NULL;
    }
  }
  json_decref(st);
  json_decref(list);
  return text;
}
