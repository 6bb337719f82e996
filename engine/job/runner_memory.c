/* defines: what a runner reports of its memory (internal.h; called by runner.c): its backends'
 * figures and, offloaded, its tiers and the step's timeline, in the step events and in
 * job->memory, which status and show report (report.c). */
#include <stdio.h>
#include <unistd.h>
#include "engine/kernels/backend.h"
#include "engine/job/internal.h"
#include "engine/train/dp/dp.h"

static int64_t host_rss(void) {
  long pages = 0, resident = 0;
  FILE *f = fopen("/proc/self/statm", "re");
  if (!f) return -1;
  int n = fscanf(f, "%ld %ld", &pages, &resident);
  fclose(f);
  return n == 2 ? (int64_t)resident * sysconf(_SC_PAGE_SIZE) : -1;
}

/* What the job holds now: its backends' figures (zt_backend_mem_stats) summed over its ranks
 * and per device; with offload (os) the device arena, the block the offloaded step
 * sub-allocates, counts as reserved and the pinned host tier as pinned (a parallel job's ranks'
 * host tiers too). NULL: out of memory. */
json_t *zt__runner_memory_json(const runner *r, size_t backend_bytes, const zt_offload_stats *os) {
  uint64_t alloc = 0, peak = 0, reserved = 0, pinned = os ? os->host_pinned : 0, live = 0,
           total = 0;
  json_t *devs = json_array();
  json_t *m = json_pack("{s:s, s:I}", "backend", r->job->jobs->cfg.backend, "backend_bytes",
                        (json_int_t)backend_bytes);
  if (!m || !devs) goto fail;
  for (int i = 0; i < r->n_be; i++) {
    zt_backend_mem b;
    if (zt_backend_mem_stats(&r->ranks[i].be, &b) < 0) continue;
    uint64_t res = b.reserved + (os && i == 0 ? os->arena_budget : 0);
    if (json_array_append_new(devs, json_pack("{s:i, s:I, s:I, s:I}", "device",
                                              r->job->held[i], "allocated",
                                              (json_int_t)b.allocated, "peak", (json_int_t)b.peak,
                                              "reserved", (json_int_t)res)) < 0)
      goto fail;
    alloc += b.allocated;
    peak += b.peak;
    reserved += res;
    pinned += b.host_pinned;
    /* a parallel job's offload host tier, per rank */
    if (r->trainer && r->world > 1) pinned += zt_trainer_dp_host_bytes(r->trainer, r->rank0 + i);
    live += b.allocations;
    total += b.allocations_total;
  }
  json_t *figures = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:o}", "allocated",
                              (json_int_t)alloc, "peak", (json_int_t)peak, "reserved",
                              (json_int_t)reserved, "host_pinned", (json_int_t)pinned,
                              "allocations", (json_int_t)live, "allocations_total",
                              (json_int_t)total, "devices", devs);
  devs = NULL;
  if (!figures || json_object_update(m, figures) < 0) {
    json_decref(figures);
    goto fail;
  }
  json_decref(figures);
  int64_t rss = host_rss();
  if (rss >= 0) json_object_set_new(m, "host_rss", json_integer(rss));
  return m;
fail:
  json_decref(devs);
  json_decref(m);
  return NULL;
}

/* The step just done, from the stats before and after it: the fraction of its wall time each
 * resource was busy (the AdamW pool's per thread), and the fraction the trainer's thread waited
 * on each, as zt_offload_stats times them. NULL when no time passed (a resumed job's first
 * report). */
static json_t *timeline_json(const zt_offload_stats *a, const zt_offload_stats *b) {
  double wall = (double)(b->step_ns - a->step_ns);
  if (wall <= 0) return NULL;
  int threads = b->adam_threads > 0 ? b->adam_threads : 1;
  return json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:{s:f, s:f, s:f}}", "step_s", wall / 1e9,
                   "compute", (double)(b->compute_ns - a->compute_ns) / wall, "h2d",
                   (double)(b->h2d_ns - a->h2d_ns) / wall, "d2h",
                   (double)(b->d2h_ns - a->d2h_ns) / wall, "optimizer",
                   (double)(b->adam_ns - a->adam_ns) / wall / threads, "nvme",
                   (double)(b->nvme_ns - a->nvme_ns) / wall, "waits", "copy",
                   (double)(b->wait_copy_ns - a->wait_copy_ns) / wall, "optimizer",
                   (double)(b->wait_adam_ns - a->wait_adam_ns) / wall, "nvme",
                   (double)(b->wait_nvme_ns - a->wait_nvme_ns) / wall);
}

/* The offloaded step's own figures; with the stats of the step before (prev), its timeline. */
json_t *zt__runner_offload_json(const runner *r, const zt_offload_stats *os,
                                const zt_offload_stats *prev) {
  json_t *o = json_pack(
      "{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:i, s:i, s:s, s:s}",
      "device_budget",
      (json_int_t)os->device_budget, "arena_budget", (json_int_t)os->arena_budget, "arena_peak",
      (json_int_t)os->arena_peak, "host_bytes", (json_int_t)os->host_bytes, "host_pinned",
      (json_int_t)os->host_pinned, "nvme_bytes", (json_int_t)r->nvme_bytes, "bytes_h2d",
      (json_int_t)os->bytes_h2d, "bytes_d2h", (json_int_t)os->bytes_d2h, "nvme_bytes_read",
      (json_int_t)os->nvme_bytes_read, "nvme_bytes_written", (json_int_t)os->nvme_bytes_written,
      "adam_overlapped", (json_int_t)os->adam_overlapped, "gpu_units", os->gpu_units,
      "ckpt_every", os->ckpt_every, "params", zt_offload_place_name(os->params), "grads",
      zt_offload_place_name(os->grads));
  json_t *tl = prev ? timeline_json(prev, os) : NULL;
  if (o && tl) json_object_set_new(o, "timeline", tl);
  else json_decref(tl);
  /* what the step moved over each link: the counters' growth since the step before (a
   * resumed job's first report has none) */
  if (o && prev && os->step_ns > prev->step_ns)
    json_object_set_new(o, "step_bytes", json_pack(
        "{s:I, s:I, s:I, s:I}", "h2d", (json_int_t)(os->bytes_h2d - prev->bytes_h2d), "d2h",
        (json_int_t)(os->bytes_d2h - prev->bytes_d2h), "nvme_read",
        (json_int_t)(os->nvme_bytes_read - prev->nvme_bytes_read), "nvme_written",
        (json_int_t)(os->nvme_bytes_written - prev->nvme_bytes_written)));
  return o;
}

/* job->memory, what status and show report: a copy of mem (NULL: left as it was). */
void zt__runner_publish_memory(runner *r, const json_t *mem) {
  json_t *copy = mem ? json_deep_copy(mem) : NULL;
  if (!copy) return;
  pthread_mutex_lock(&r->job->jobs->mu);
  json_decref(r->job->memory);
  r->job->memory = copy;
  pthread_mutex_unlock(&r->job->jobs->mu);
}

/* After the trainer: what the job left on its backends (nothing, unless it leaked) and their
 * peaks; an offloaded job's tiers and timeline as its last step reported them. */
void zt__runner_publish_closed(runner *r) {
  json_t *left = zt__runner_memory_json(r, 0, NULL);
  pthread_mutex_lock(&r->job->jobs->mu);
  json_t *off = json_object_get(r->job->memory, "offload");
  if (left && off) json_object_set(left, "offload", off);
  pthread_mutex_unlock(&r->job->jobs->mu);
  zt__runner_publish_memory(r, left);
  json_decref(left);
}

/* Once the trainer is open, before the first step: what it took. */
void zt__runner_publish_opened(runner *r) {
  const zt_job_spec *s = &r->job->spec;
  zt_offload_stats os;
  int off = s->has_offload && zt_trainer_offload_stats(r->trainer, &os) == 0;
  json_t *mem = zt__runner_memory_json(r, zt_trainer_backend_bytes(r->trainer), off ? &os : NULL);
  if (mem && off) json_object_set_new(mem, "offload", zt__runner_offload_json(r, &os, NULL));
  zt__runner_publish_memory(r, mem);
  json_decref(mem);
}
