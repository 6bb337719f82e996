#include "engine/job/spec.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include "engine/job/data.h"
#include "proto/zt_tokens.h"
#include "engine/kernels/backend.h"
#include "engine/model/safetensors.h"
#include "engine/train/dp/dp.h"
#include "engine/base/json_field.h"
#include "engine/base/path.h"
#include "engine/base/sizes.h"
#include "engine/train/config.h"
#include "offload/nvme_store.h"


static const char *const k_top[] = {"name",       "model",   "train",    "data",
                                    "checkpoint", "offload", "parallel", "log", NULL};
static const char *const k_data_file[] = {"source", "path", "packing", "shuffle", "eval", NULL};
static const char *const k_data_stream[] = {"source", "stream_timeout", "eval", NULL};
static const char *const k_data_eval[] = {"path", "every", "batches", NULL};
static const char *const k_ckpt[] = {"every", "keep", NULL};
static const char *const k_parallel[] = {"gpus", "zero_stage", "peers", NULL};
static const char *const k_log[] = {"tensorboard", NULL};

/* data.eval: {"path": FILE, "every": N, "batches": M}; absent: none. */
static int parse_eval(const json_t *d, zt_job_spec *s, char *err, size_t errlen) {
  const json_t *e;
  int rc;
  s->eval_path[0] = '\0';
  s->eval_every = 0;
  s->eval_batches = 0;
  if ((rc = zt_json_get_object(d, "data", "eval", 0, &e, err, errlen)) < 0 || !e) return rc;
  if ((rc = zt_json_check_keys(e, "data.eval", k_data_eval, err, errlen)) < 0 ||
      (rc = zt_json_get_abs_path(e, "data.eval", "path", s->eval_path, sizeof s->eval_path, err,
                                 errlen)) < 0 ||
      (rc = zt_json_get_int32(e, "data.eval", "every", 0, 0, ZT_TRAIN_MAX_STEPS, 0,
                              &s->eval_every, err, errlen)) < 0)
    return rc;
  return zt_json_get_int32(e, "data.eval", "batches", 0, 1, ZT_JOB_MAX_EVAL_BATCHES, 1,
                           &s->eval_batches, err, errlen);
}

static int parse_data(const json_t *d, zt_job_spec *s, char *err, size_t errlen) {
  int rc;
  const char *src;
  if ((rc = zt_json_get_string(d, "data", "source", NULL, &src, err, errlen)) < 0) return rc;
  if ((rc = parse_eval(d, s, err, errlen)) < 0) return rc;
  if (strcmp(src, "file") == 0) {
    s->source = ZT_DATA_FILE;
    if ((rc = zt_json_check_keys(d, "data", k_data_file, err, errlen)) < 0) return rc;
    const char *packing = NULL;
    if ((rc = zt_json_get_string(d, "data", "packing", "", &packing, err, errlen)) < 0) return rc;
    if (!packing[0]) s->packing = ZT_PACKING_AUTO;
    else if (strcmp(packing, "windows") == 0) s->packing = ZT_PACKING_WINDOWS;
    else if (strcmp(packing, "documents") == 0) s->packing = ZT_PACKING_DOCUMENTS;
    else {
      snprintf(err, errlen, "data.packing must be \"documents\" or \"windows\"");
      return -EINVAL;
    }
    if ((rc = zt_json_get_bool(d, "data", "shuffle", 0, &s->shuffle, err, errlen)) < 0) return rc;
    if (s->shuffle && s->packing == ZT_PACKING_WINDOWS) {
      snprintf(err, errlen, "data.shuffle shuffles documents; data.packing \"windows\" samples "
               "its rows at random already");
      return -EINVAL;
    }
    return zt_json_get_abs_path(d, "data", "path", s->data_path, sizeof s->data_path, err, errlen);
  }
  if (strcmp(src, "stream") == 0) {
    s->source = ZT_DATA_STREAM;
    s->data_path[0] = '\0';
    if ((rc = zt_json_check_keys(d, "data", k_data_stream, err, errlen)) < 0) return rc;
    return zt_json_get_int32(d, "data", "stream_timeout", 0, 0, ZT_JOB_MAX_STREAM_TIMEOUT,
                             ZT_JOB_STREAM_TIMEOUT_DEFAULT, &s->stream_timeout, err, errlen);
  }
  snprintf(err, errlen, "data.source must be \"file\" or \"stream\"");
  return -EINVAL;
}

/* "peers": ["host:port", ...]: where the other daemons' TCP listeners are; checked for shape
 * here, reached when the job starts (engine/job/peers.c). */
static int parse_peers(const json_t *a, zt_job_spec *s, char *err, size_t errlen) {
  if (!a) return 0;
  if (!json_is_array(a) || json_array_size(a) > ZT_JOB_MAX_PEERS) {
    snprintf(err, errlen, "parallel.peers must be an array of at most %d \"host:port\" strings",
             ZT_JOB_MAX_PEERS);
    return -EINVAL;
  }
  for (size_t i = 0; i < json_array_size(a); i++) {
    const char *v = json_string_value(json_array_get(a, i));
    const char *colon = v ? strrchr(v, ':') : NULL;
    char *end = NULL;
    long port = colon ? strtol(colon + 1, &end, 10) : 0;
    if (!colon || colon == v || !colon[1] || *end || port < 1 || port > 65535 ||
        strlen(v) >= ZT_JOB_PEER_MAX) {
      snprintf(err, errlen, "parallel.peers[%zu]: expected \"host:port\" (a peer ztd's --tcp "
               "address), e.g. \"10.0.0.2:7070\"", i);
      return -EINVAL;
    }
    for (size_t k = 0; k < i; k++)
      if (strcmp(s->peers[k], v) == 0) {
        snprintf(err, errlen, "parallel.peers[%zu]: %s is named twice", i, v);
        return -EINVAL;
      }
    snprintf(s->peers[i], sizeof s->peers[i], "%s", v);
  }
  s->n_peers = (int)json_array_size(a);
  return 0;
}

/* "parallel": {"gpus": N | "all", "zero_stage": 1 | 2 | 3, "peers": [...]}; "all" is resolved by admission,
 * which knows the daemon's devices. */
static int parse_parallel(const json_t *p, zt_job_spec *s, char *err, size_t errlen) {
  int rc;
  s->gpus = 1;
  s->zero_stage = 1;
  if (!p) return 0;
  if ((rc = zt_json_check_keys(p, "parallel", k_parallel, err, errlen)) < 0) return rc;
  const json_t *g = json_object_get(p, "gpus");
  if (json_is_string(g) && strcmp(json_string_value(g), "all") == 0) {
    s->gpus = ZT_JOB_GPUS_ALL;
  } else if (g && (!json_is_integer(g) || json_integer_value(g) < 1)) {
    snprintf(err, errlen, "parallel.gpus must be a positive integer or \"all\"");
    return -EINVAL;
  } else if ((rc = zt_json_get_int32(p, "parallel", "gpus", 0, 1, ZT_DP_MAX_WORLD, 1, &s->gpus, err,
                             errlen)) < 0) {
    return rc;
  }
  const json_t *z = json_object_get(p, "zero_stage");
  if (z && (!json_is_integer(z) || json_integer_value(z) < 1 || json_integer_value(z) > 3)) {
    snprintf(err, errlen, "parallel.zero_stage must be 1, 2 or 3");
    return -EINVAL;
  }
  if (z) s->zero_stage = (int)json_integer_value(z);
  if ((rc = parse_peers(json_object_get(p, "peers"), s, err, errlen)) < 0) return rc;
  if (s->n_peers && s->gpus == ZT_JOB_GPUS_ALL) {
    snprintf(err, errlen, "parallel.gpus \"all\" with parallel.peers: give the number of GPUs "
             "each daemon runs (every daemon runs as many)");
    return -EINVAL;
  }
  return 0;
}

static int spec_parse(const json_t *j, int read, zt_job_spec *s, char *err, size_t errlen) {
  int rc;
  const json_t *model, *train, *data, *ckpt;
  const char *name;
  memset(s, 0, sizeof *s);
  if (!json_is_object(j)) {
    snprintf(err, errlen, "the job spec must be an object");
    return -EINVAL;
  }
  if ((rc = zt_json_check_keys(j, "", k_top, err, errlen)) < 0) return rc;
  if ((rc = zt_json_get_string(j, "", "name", "", &name, err, errlen)) < 0) return rc;
  size_t nlen = strlen(name);
  int printable = 1;
  for (size_t i = 0; i < nlen; i++) printable &= (unsigned char)name[i] >= 0x20;
  if (nlen > ZT_JOB_NAME_MAX || !printable) {
    snprintf(err, errlen, "name must be at most %d characters without control characters",
             ZT_JOB_NAME_MAX);
    return -EINVAL;
  }
  memcpy(s->name, name, nlen + 1);
  if ((rc = zt_json_get_object(j, "", "model", 1, &model, err, errlen)) < 0 ||
      (rc = read ? zt_config_model_from_json(model, &s->model, err, errlen)
                 : zt_config_model_from_json_unread(model, &s->model, err, errlen)) < 0)
    return rc;
  if ((rc = zt_json_get_object(j, "", "train", 1, &train, err, errlen)) < 0 ||
      (rc = zt_config_train_from_json(train, &s->train, err, errlen)) < 0)
    return rc;
  if ((rc = zt_json_get_object(j, "", "data", 1, &data, err, errlen)) < 0 ||
      (rc = parse_data(data, s, err, errlen)) < 0)
    return rc;
  if (s->train.epochs && s->source == ZT_DATA_STREAM) {
    snprintf(err, errlen, "train.epochs counts passes over data.path's token file; data.source "
             "\"stream\" has no end to count: give train.steps");
    return -EINVAL;
  }
  const json_t *off = json_object_get(j, "offload");
  if (off && !json_is_object(off) && !json_is_false(off)) {
    snprintf(err, errlen, "offload must be an object or false");
    return -EINVAL;
  }
  s->offload_off = json_is_false(off);
  if (json_is_object(off)) {
    s->has_offload = 1;
    if ((rc = zt_config_offload_from_json(off, &s->offload, err, errlen)) < 0) return rc;
  }
  const json_t *par;
  if ((rc = zt_json_get_object(j, "", "parallel", 0, &par, err, errlen)) < 0 ||
      (rc = parse_parallel(par, s, err, errlen)) < 0)
    return rc;
  s->ckpt_every = 0;
  s->ckpt_keep = 2;
  if ((rc = zt_json_get_object(j, "", "checkpoint", 0, &ckpt, err, errlen)) < 0) return rc;
  if (ckpt) {
    if ((rc = zt_json_check_keys(ckpt, "checkpoint", k_ckpt, err, errlen)) < 0 ||
        (rc = zt_json_get_int32(ckpt, "checkpoint", "every", 0, 0, ZT_TRAIN_MAX_STEPS, 0, &s->ckpt_every, err,
                        errlen)) < 0 ||
        (rc = zt_json_get_int32(ckpt, "checkpoint", "keep", 0, 0, ZT_JOB_MAX_KEEP, 2, &s->ckpt_keep, err,
                        errlen)) < 0)
      return rc;
  }
  const json_t *log;
  if ((rc = zt_json_get_object(j, "", "log", 0, &log, err, errlen)) < 0) return rc;
  s->log_tensorboard = 0;
  if (log && ((rc = zt_json_check_keys(log, "log", k_log, err, errlen)) < 0 ||
              (rc = zt_json_get_bool(log, "log", "tensorboard", 0, &s->log_tensorboard, err,
                                     errlen)) < 0))
    return rc;
  return 0;
}

int zt__job_spec_parse(const json_t *j, zt_job_spec *s, char *err, size_t errlen) {
  return spec_parse(j, 1, s, err, errlen);
}

int zt__job_spec_parse_unread(const json_t *j, zt_job_spec *s, char *err, size_t errlen) {
  return spec_parse(j, 0, s, err, errlen);
}

int zt__job_spec_read_model(zt_job_spec *s, const zt_jobs_config *cfg, int tcp, char *err,
                            size_t errlen) {
  zt_path_roots files = zt__job_roots(cfg, tcp, 0);
  if (!s->model.hf_dir[0] || s->model.hf_type != ZT_HF_NONE) return 0;
  /* confined before anything shows whether the directory or its config.json exists */
  int rc = zt_path_open("model.hf", s->model.hf_dir, 1, &files, NULL, NULL, 0, err, errlen);
  return rc < 0 ? rc : zt_config_model_read_hf(&s->model, err, errlen);
}

/* A generous double-precision count of what the trainer will allocate; it only guards the
 * trainer's size_t arithmetic against overflow for dimensions at their bounds. */
static double rough_bytes(const zt_model_cfg *m, const zt_train_cfg *t) {
  double C = m->d_model, T = m->seq_len, V = m->vocab, L = m->n_layers, B = t->micro_batch;
  double F = m->d_ff ? m->d_ff : 4.0 * C;
  /* llama's heads may be wider than d_model (head_dim) */
  double Q = m->head_dim ? (double)m->n_heads * m->head_dim : C;
  double params = V * C + T * C + L * (4.0 * C * Q + 3.0 * C * F + 16.0 * C);
  double acts = B * T * (L * (16.0 * C + 8.0 * Q + 3.0 * F + (double)m->n_heads * T) + 2.0 * V);
  return 16.0 * params + 8.0 * acts;
}

double zt__jobs_host_limit(const zt_jobs_config *cfg, const char **what) {
  if (cfg->host_mem_limit) {
    *what = "host limit";
    return (double)cfg->host_mem_limit;
  }
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  *what = "this machine has";
  return pages > 0 && page > 0 ? (double)pages * (double)page : 0.0;
}

/* The NVMe files are reserved in full when the job starts (zt_nvme_store_alloc): a directory
 * without room for all of them is refused here, at submit and again at the start, with the
 * numbers, rather than by the first file that does not fit. Space taken by others meanwhile
 * still fails the start, naming that file. */
static int check_nvme_space(const zt_jobs_config *cfg, const char *dir, uint64_t need, char *err,
                            size_t errlen) {
  struct stat st;
  struct statvfs v;
  int rc = 0;
  /* a described machine's disk: its free space as given, nothing of this one read */
  if (cfg->described && cfg->disk_bytes && cfg->disk_bytes < need) {
    char a[32], b[32];
    zt_size_format(a, sizeof a, (double)need);
    zt_size_format(b, sizeof b, (double)cfg->disk_bytes);
    snprintf(err, errlen, "offload.nvme_dir: the target has %s free (target.nvme_bytes %" PRIu64
             "); the job's NVMe tier needs %s (%" PRIu64 " bytes)", b, cfg->disk_bytes, a, need);
    return -ENOSPC;
  }
  if (cfg->described) return 0;
  if (stat(dir, &st) < 0 || statvfs(dir, &v) < 0)
    rc = -errno;
  else if (!S_ISDIR(st.st_mode))
    rc = -ENOTDIR;
  if (rc < 0) {
    snprintf(err, errlen, "offload.nvme_dir: %s: %s", dir, strerror(-rc));
    return rc;
  }
  uint64_t avail = (uint64_t)v.f_bavail * v.f_frsize;
  if (avail < need) {
    char a[32], b[32];
    zt_size_format(a, sizeof a, (double)need);
    zt_size_format(b, sizeof b, (double)avail);
    snprintf(err, errlen, "offload.nvme_dir: %s has %s free (%" PRIu64 " bytes); the job's NVMe "
             "tier needs %s (%" PRIu64 " bytes)", dir, b, avail, a, need);
    return -ENOSPC;
  }
  return 0;
}

int zt__jobs_devices(const zt_jobs_config *cfg, int *ids) {
  int cuda = strcmp(cfg->backend, "cuda") == 0;
  int n = cuda ? (cfg->n_gpus > 0 ? cfg->n_gpus : 1) : (cfg->cpu_ranks > 0 ? cfg->cpu_ranks : 1);
  if (n > ZT_JOBS_MAX_GPUS) n = ZT_JOBS_MAX_GPUS;
  for (int i = 0; ids && i < n; i++) ids[i] = !cuda ? i : cfg->n_gpus > 0 ? cfg->gpus[i] : 0;
  return n;
}

int zt__jobs_rank_threads(const zt_jobs_config *cfg) {
  if (cfg->cpu_ranks <= 1) return cfg->cpu_threads;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int total = cfg->cpu_threads > 0 ? cfg->cpu_threads : (int)(cores > 0 ? cores : 1);
  return total / cfg->cpu_ranks > 0 ? total / cfg->cpu_ranks : 1;
}

zt_train_cfg zt__job_rank_train_cfg(const zt_job_spec *s) {
  zt_train_cfg tc = s->train;
  if (tc.ckpt_every == ZT_CKPT_AUTO) tc.ckpt_every = 0;
  return tc;
}

/* A device the daemon trains on: the smallest of its GPUs' memory (or --gpu-mem-limit) for
 * cuda, since a job may get any of them; the host's limit for the cpu backend. A described
 * machine's GPUs have gpu_mem_limit. */
static double device_limit(const zt_jobs_config *cfg, const char **what) {
  if (strcmp(cfg->backend, "cuda") != 0) return zt__jobs_host_limit(cfg, what);
  if (cfg->described) {
    *what = "GPU limit";
    return (double)cfg->gpu_mem_limit;
  }
  zt_device_info dev[ZT_MAX_DEVICES];
  int n = zt_backend_cuda_devices(dev, ZT_MAX_DEVICES), ids[ZT_JOBS_MAX_GPUS];
  int owned = zt__jobs_devices(cfg, ids);
  double limit = 0.0;
  for (int i = 0; i < owned; i++)
    if (ids[i] < n && ids[i] < ZT_MAX_DEVICES &&
        (limit == 0.0 || (double)dev[ids[i]].mem_total < limit))
      limit = (double)dev[ids[i]].mem_total;
  *what = owned > 1 ? "its smallest GPU has" : "the GPU has";
  if (cfg->gpu_mem_limit && (double)cfg->gpu_mem_limit < limit) {
    limit = (double)cfg->gpu_mem_limit;
    *what = "GPU limit";
  }
  return limit;
}

double zt__jobs_device_budget(const zt_jobs_config *cfg, const char **what) {
  if (strcmp(cfg->backend, "cuda") == 0) return device_limit(cfg, what);
  *what = "GPU limit";
  return (double)cfg->gpu_mem_limit;
}

static int too_big(double need, double limit, const char *what, const char *part,
                   const zt_jobs_config *cfg, char *err, size_t errlen) {
  if (limit <= 0 || need <= limit) return 0;
  char a[32], b[32];
  zt_size_format(a, sizeof a, need);
  zt_size_format(b, sizeof b, limit);
  snprintf(err, errlen, "job needs %s %s on the %s backend; %s %s", a, part, cfg->backend, what,
           b);
  return -ENOMEM;
}

/* The runner's data in host memory: the packer's tables (s->data_bytes) and the step's rows
 * (runner.c's alloc_rows: inputs, targets and positions; a stream's pushed rows of T + 1 tokens
 * and their marks beside them). The token file is mapped read-only, page cache the kernel may
 * take back: not counted. */
static double data_host_bytes(const zt_job_spec *s, double *rows) {
  double n = (double)zt__job_world(s) * s->train.grad_accum * s->train.micro_batch;
  *rows = 3.0 * n * s->model.seq_len * sizeof(int32_t);
  if (s->source == ZT_DATA_STREAM) *rows += n * (s->model.seq_len + 1) * (sizeof(int32_t) + 1);
  return (double)s->data_bytes + *rows;
}

/* The data's host memory on top of the job's other host bytes (*host, which gets the sum):
 * refused with the numbers where the two together exceed the host limit. */
static int check_data_host(const zt_job_spec *s, const zt_jobs_config *cfg, size_t *host,
                           char *err, size_t errlen) {
  const char *what;
  double rows, data = data_host_bytes(s, &rows), others = (double)*host;
  double limit = zt__jobs_host_limit(cfg, &what);
  if (limit > 0 && others + data > limit) {
    char a[32], b[32], c[32], d[32], e[32], l[32];
    zt_size_format(a, sizeof a, others + data);
    zt_size_format(b, sizeof b, others);
    zt_size_format(c, sizeof c, data);
    zt_size_format(d, sizeof d, (double)s->data_bytes);
    zt_size_format(e, sizeof e, rows);
    zt_size_format(l, sizeof l, limit);
    snprintf(err, errlen, "job needs %s of host memory on the %s backend: %s for training and "
             "%s for its data (the packed documents' tables %s, the step's rows %s); %s %s", a,
             cfg->backend, b, c, d, e, what, l);
    return -ENOMEM;
  }
  *host = (size_t)(others + data);
  return 0;
}

/* An offloaded job's plan p against this daemon: its device side must fit the device, its host
 * tier the host (with the device side too on the cpu backend, whose device is host memory),
 * its files nvme_dir. */
static int plan_fits(const zt_job_spec *s, const zt_jobs_config *cfg,
                     const zt_offload_placement *p, zt__job_needs *needs, char *err,
                     size_t errlen) {
  zt_offload_plan plan = zt_offload_plan_summary(p);
  const char *what;
  int rc, on_cpu = strcmp(cfg->backend, "cpu") == 0;
  /* a checkpoint's staging comes on top of the host tier (zt_trainer_checkpoint_bytes); it also
   * covers the open's, which streams the initial state through one staging of the largest
   * unit's parameters while no checkpoint runs (engine/train/offload/open.c, write_initial_state) */
  double host = (double)plan.host_bytes + (double)zt_checkpoint_estimate_bytes(&s->model) +
                (on_cpu ? (double)plan.device_bytes : 0);
  /* each limit before its `what` is read: the order of a call's arguments is unspecified */
  double limit = zt__jobs_host_limit(cfg, &what);
  if ((rc = too_big(host, limit, what, "of host memory (offload host tier)", cfg, err,
                    errlen)) < 0) {
    if (!s->offload.nvme_dir[0] && s->offload.optimizer == ZT_PLACE_AUTO) {
      size_t n = strlen(err);
      snprintf(err + n, errlen - n, ": set offload.nvme_dir (and offload.host_budget) to keep "
               "on NVMe the optimizer state the host cannot hold");
    }
    return rc;
  }
  if (!on_cpu || cfg->gpu_mem_limit) {
    limit = zt__jobs_device_budget(cfg, &what);
    if ((rc = too_big((double)plan.device_bytes, limit, what,
                      "of device memory (offload device side)", cfg, err, errlen)) < 0)
      return rc;
  }
  if (plan.nvme_bytes &&
      (rc = check_nvme_space(cfg, s->offload.nvme_dir, plan.nvme_bytes, err, errlen)) < 0)
    return rc;
  needs->backend_bytes = needs->rank_bytes = plan.device_bytes;
  needs->host_bytes = (size_t)host;
  needs->plan = *p;
  needs->has_plan = 1;
  return check_data_host(s, cfg, &needs->host_bytes, err, errlen);
}

/* An offloaded job: the planner's search (zt_offload_plan_make) refuses a gpu_budget too small
 * with the numbers; then the plan against the daemon (plan_fits). */
static int check_offload(const zt_job_spec *s, const zt_jobs_config *cfg, zt__job_needs *needs,
                         char *err, size_t errlen) {
  zt_offload_placement p;
  int rc = zt_offload_plan_make(&s->model, &s->train, &s->offload,
                                zt_backend_ops_of(cfg->backend), &p, err, errlen);
  return rc < 0 ? rc : plan_fits(s, cfg, &p, needs, err, errlen);
}

int zt__job_spec_check_plan(const zt_job_spec *s, const zt_jobs_config *cfg,
                            const zt_offload_placement *plan, zt__job_needs *needs, char *err,
                            size_t errlen) {
  const zt_ops *ops = zt_backend_ops_of(cfg->backend);
  zt_offload_placement p;
  zt_model *m = NULL;
  int rc;
  if ((rc = zt_offload_supported(ops->name, &s->train, &s->offload, err, errlen)) < 0 ||
      (rc = zt_model_create(&m, &s->model, err, errlen)) < 0)
    return rc;
  rc = zt_offload_plan_check(m, &s->train, &s->offload, ops, plan, &p, err, errlen);
  zt_model_destroy(m);
  return rc < 0 ? rc : plan_fits(s, cfg, &p, needs, err, errlen);
}

void zt__job_ranks_text(const zt_job_spec *s, char *out, size_t outlen) {
  if (s->n_peers)
    snprintf(out, outlen, "%d ranks (parallel.gpus %d on each of %d daemons)", zt__job_world(s),
             s->gpus, 1 + s->n_peers);
  else
    snprintf(out, outlen, "parallel.gpus %d", s->gpus);
}

/* parallel.gpus against the daemon's device set, and what several ranks cannot do yet. */
static int check_parallel(const zt_job_spec *s, const zt_jobs_config *cfg, char *err,
                          size_t errlen) {
  int owned = zt__jobs_devices(cfg, NULL), cuda = strcmp(cfg->backend, "cuda") == 0;
  int W = zt__job_world(s);
  if (s->gpus > owned && cfg->described) {
    snprintf(err, errlen, "parallel.gpus %d is more than the target's %d (target.gpus)", s->gpus,
             owned);
    return -EINVAL;
  }
  if (s->gpus > owned) {
    snprintf(err, errlen, "parallel.gpus %d is more than the %d %s%s %s (ztd %s)", s->gpus,
             owned, cuda ? "GPU" : "simulated rank", owned == 1 ? "" : "s",
             cuda ? "this daemon owns" : "of this cpu daemon", cuda ? "--gpus" : "--cpu-ranks");
    return -EINVAL;
  }
  if (W > ZT_DP_MAX_WORLD) {
    snprintf(err, errlen, "parallel: %d GPUs on each of %d daemons make %d ranks, more than %d",
             s->gpus, 1 + s->n_peers, W, ZT_DP_MAX_WORLD);
    return -EINVAL;
  }
  if (W == 1) return 0;
  char ranks[96];
  zt__job_ranks_text(s, ranks, sizeof ranks);
  /* the parts on the peers would have to evaluate with it */
  if (s->eval_path[0] && s->n_peers > 0) {
    snprintf(err, errlen, "data.eval with %s is not supported yet: held-out evaluation runs on "
             "the ranks of one daemon", ranks);
    return -ENOTSUP;
  }
  /* every rank runs the same loss scaler on the same overflow verdicts; a part resumed on a
   * peer would not have it */
  if (s->train.precision == ZT_F16 && s->n_peers > 0) {
    snprintf(err, errlen, "train.precision \"fp16\" with %s and parallel.peers is not "
             "supported yet; use bf16", ranks);
    return -ENOTSUP;
  }
  if (s->n_peers > 0) {
    if (!cfg->peer_token) {
      snprintf(err, errlen, "parallel.peers needs ztd started with --token-file: the "
               "coordinator authenticates to its peers with its own token (the daemons of a job "
               "share one token file)");
      return -EINVAL;
    }
    /* the daemons' ranks meet only through NCCL: the CPU group lives inside one process */
    if (!cuda) {
      snprintf(err, errlen, "parallel.peers needs a cuda ztd: the ranks of a job spanning "
               "daemons communicate through NCCL; this daemon runs the %s backend", cfg->backend);
      return -ENOTSUP;
    }
  }
#ifndef ZT_HAVE_NCCL
  /* this build's lack, not a described machine's */
  if (cuda && !cfg->described) {
    snprintf(err, errlen, "%s needs NCCL, which this build of ztd lacks", ranks);
    return -ENOTSUP;
  }
#endif
  return 0;
}

zt_path_roots zt__job_roots(const zt_jobs_config *cfg, int tcp, int dirs) {
  if (dirs)
    return (zt_path_roots){.any = !tcp && cfg->n_nvme_dirs == 0, .dir = cfg->nvme_dirs,
                           .n = cfg->n_nvme_dirs, .what = "ztd --nvme-dir"};
  return (zt_path_roots){.any = !tcp, .dir = cfg->data_roots, .n = cfg->n_data_roots,
                         .what = "ztd --data-root"};
}

zt_data_packing zt__job_packing_of(zt_data_packing p, uint32_t version) {
  if (p != ZT_PACKING_AUTO) return p;
  return version == ZT_TOKENS_VERSION_DOCS ? ZT_PACKING_DOCUMENTS : ZT_PACKING_WINDOWS;
}

/* A token file of the job: its header and tables (zt__token_file_open), its vocabulary within
 * the model's, enough tokens for a window where it is packed in windows: *packing (AUTO: made
 * the file's own); *table_bytes (where not NULL) the packer's tables of its documents, 0 for
 * windows. */
static int check_token_file(const zt_job_spec *s, const char *field, const char *path,
                            const zt_path_roots *files, zt_data_packing *packing,
                            size_t *table_bytes, char *err, size_t errlen) {
  zt__token_file tf;
  int rc = zt__token_file_open(&tf, field, path, 0, files, err, errlen);
  if (rc < 0) return rc;
  uint32_t vocab = tf.vocab;
  uint64_t n = tf.n_tokens;
  *packing = zt__job_packing_of(*packing, tf.version);
  if (table_bytes && *packing == ZT_PACKING_DOCUMENTS)
    *table_bytes = zt__packer_bytes(tf.n_docs, n, s->model.seq_len);
  zt__token_file_close(&tf);
  if (vocab > (uint32_t)s->model.vocab) {
    snprintf(err, errlen, "%s: %s: token vocabulary %u is larger than model.vocab %d", field,
             path, vocab, s->model.vocab);
    return -EINVAL;
  }
  if (*packing == ZT_PACKING_WINDOWS && n < (uint64_t)s->model.seq_len + 1) {
    snprintf(err, errlen, "%s: %s: holds %llu tokens; model.seq_len %d needs at least %d", field,
             path, (unsigned long long)n, s->model.seq_len, s->model.seq_len + 1);
    return -EINVAL;
  }
  return 0;
}

int zt__job_spec_check_files(zt_job_spec *s, const zt_jobs_config *cfg, int tcp, char *err,
                             size_t errlen) {
  int rc;
  s->data_bytes = 0;
  zt_path_roots files = zt__job_roots(cfg, tcp, 0), dirs = zt__job_roots(cfg, tcp, 1);
  /* a Hugging Face directory: every tensor of every shard checked now (names, shapes, dtypes;
   * the headers only), not at the job's start */
  if (s->model.hf_dir[0]) {
    static const char *const params[] = {""};
    zt_model *m = NULL;
    zt_model_file *f = NULL;
    char why[512];
    if ((rc = zt_path_open("model.hf", s->model.hf_dir, 1, &files, NULL, NULL, 0, err,
                           errlen)) < 0)
      return rc;
    if ((rc = zt_model_create(&m, &s->model, why, sizeof why)) == 0)
      rc = zt_model_file_open(&f, m, s->model.hf_dir, params, 1, 0, why, sizeof why);
    zt_model_file_close(f);
    zt_model_destroy(m);
    if (rc < 0) {
      snprintf(err, errlen, "model.hf: %s", why);
      return rc;
    }
  }
  if (s->model.init_path[0]) {
    /* a safetensors file by its header (its tensors are the trainer's to match) */
    zt_st_file *st = NULL;
    char why[ZT_PATH_MAX + 256];
    /* model.init.job's file is the daemon's own (admission.c), not the client's */
    const char *field = s->model.init_job[0] ? "model.init.job" : "model.init.safetensors";
    if ((rc = zt_path_open(field, s->model.init_path, 0, s->model.init_job[0] ? NULL : &files,
                           NULL, NULL, 0, err, errlen)) < 0)
      return rc;
    rc = zt_st_open(&st, s->model.init_path, why, sizeof why);
    zt_st_close(st);
    if (rc < 0) {
      snprintf(err, errlen, "%s: %s", field, why);
      return rc;
    }
  }
  /* a directory the job may not use is refused even where its plan puts nothing there */
  if (s->has_offload && s->offload.nvme_dir[0] && !dirs.any &&
      (rc = zt_path_open("offload.nvme_dir", s->offload.nvme_dir, 1, &dirs, NULL, NULL, 0, err,
                         errlen)) < 0)
    return rc;
  zt_data_packing packing = s->packing;
  if (s->source == ZT_DATA_FILE &&
      (rc = check_token_file(s, "data.path", s->data_path, &files, &packing, &s->data_bytes,
                              err, errlen)) < 0)
    return rc;
  /* held-out rows packed as the training's (a stream job's: as their own file's version says) */
  if (s->source == ZT_DATA_STREAM) packing = ZT_PACKING_AUTO;
  if (s->eval_path[0] &&
      (rc = check_token_file(s, "data.eval.path", s->eval_path, &files, &packing, NULL, err,
                             errlen)) < 0)
    return rc;
  return 0;
}

/* The two consumers of a job on the device, for a refusal: its activations and the rest
 * (parameters, gradients, AdamW state), "activations 20.1 GiB + model state 8.7 GiB". */
static const char *consumers(const zt_job_spec *s, const zt_ops *ops, double need, char *out,
                             size_t outlen) {
  zt_model *m = NULL;
  char why[256], a[32], b[32];
  out[0] = 0;
  if (zt_model_create(&m, &s->model, why, sizeof why) < 0) return out;
  int ck = s->train.ckpt_every == ZT_CKPT_AUTO ? 0 : s->train.ckpt_every;
  double acts = (double)zt_acts_size_dt(m, ops, s->train.micro_batch, ck, s->train.precision);
  zt_model_destroy(m);
  zt_size_format(a, sizeof a, acts);
  zt_size_format(b, sizeof b, need - acts);
  snprintf(out, outlen, "activations %s + parameters, gradients and AdamW state %s", a, b);
  return out;
}

int zt__job_spec_check_resources(const zt_job_spec *s, const zt_jobs_config *cfg,
                                 zt__job_needs *needs, char *err, size_t errlen) {
  int rc;
  needs->has_plan = 0;
  /* The CPU reference runs bf16/fp16 (to test them), but slower than fp32 and with no memory
   * saved that a job would want; TF32 is a tensor-core mode. */
  const char *runs = cfg->described ? "the target runs" : "this daemon runs";
  if (strcmp(cfg->backend, "cuda") != 0 && s->train.precision != ZT_F32) {
    snprintf(err, errlen, "train.precision \"%s\" needs the cuda backend; %s the %s backend",
             zt_dtype_name(s->train.precision), runs, cfg->backend);
    return -EINVAL;
  }
  if (strcmp(cfg->backend, "cuda") != 0 && s->train.tf32) {
    snprintf(err, errlen, "train.tf32 needs the cuda backend; %s the %s backend", runs,
             cfg->backend);
    return -EINVAL;
  }
  if ((rc = check_parallel(s, cfg, err, errlen)) < 0) return rc;
  const char *what;
  int W = zt__job_world(s), on_cpu = strcmp(cfg->backend, "cuda") != 0;
  if (s->has_offload && W == 1) return check_offload(s, cfg, needs, err, errlen);
  double limit = device_limit(cfg, &what);
  const zt_ops *ops = zt_backend_ops_of(cfg->backend);
  /* per rank; the whole model's rough count guards the estimate's arithmetic */
  double need = rough_bytes(&s->model, &s->train), host_tier = 0;
  if (need < 0x1p56 && W == 1) {
    need = (double)zt_trainer_estimate_bytes(&s->model, &s->train, ops);
  } else if (need < 0x1p56) {
    zt_train_cfg tc = zt__job_rank_train_cfg(s);
    zt_dp_cfg dpc = zt__job_dp_cfg(s, 0, 0);
    need = (double)zt_dp_estimate_rank_bytes(&s->model, &tc, &dpc, ops);
    /* this daemon's ranks' host tiers, and a checkpoint's staging beside them: the larger of
     * the flat layout's and every rank's at once (per-rank checkpoints, also of a job over
     * several daemons where every daemon sees the coordinator's checkpoint directory) */
    host_tier = (double)zt_dp_estimate_host_bytes(&s->model, &tc, &dpc) * s->gpus;
    if (host_tier > 0) host_tier += (double)zt_checkpoint_estimate_bytes_dp(&s->model, W);
    /* optimizer nvme: this daemon's ranks' files, reserved in full at the start */
    uint64_t nvme = zt_dp_estimate_nvme_bytes(&s->model, &tc, &dpc);
    if (nvme && nvme != UINT64_MAX &&
        (rc = check_nvme_space(cfg, s->offload.nvme_dir, nvme * (uint64_t)s->gpus, err,
                                 errlen)) < 0)
      return rc;
  }
  /* --gpu-mem-limit on the cpu backend: each simulated device's budget, as a GPU's would be */
  if (on_cpu && cfg->gpu_mem_limit && need > (double)cfg->gpu_mem_limit) {
    char a[32], b[32], r[128];
    zt_size_format(a, sizeof a, need);
    zt_size_format(b, sizeof b, (double)cfg->gpu_mem_limit);
    snprintf(err, errlen, "job needs %s per %s on the cpu backend%s%s%s; GPU limit %s", a,
             W == 1 ? "device" : "rank's device", W == 1 ? " (" : "",
             W == 1 ? consumers(s, ops, need, r, sizeof r) : "", W == 1 ? ")" : "", b);
    return -ENOMEM;
  }
  /* the cpu backend's ranks all live in host memory */
  double on_device = on_cpu ? need * W : need;
  if (limit > 0 && on_device > limit) {
    char a[32], b[32], r[128], ranks[96];
    zt__job_ranks_text(s, ranks, sizeof ranks);
    zt_size_format(a, sizeof a, on_device);
    zt_size_format(b, sizeof b, limit);
    zt_size_format(r, sizeof r, need);
    if (W == 1)
      snprintf(err, errlen, "job needs %s on the %s backend (%s); %s %s", a, cfg->backend,
               consumers(s, ops, need, r, sizeof r), what, b);
    else if (on_cpu)
      snprintf(err, errlen, "job needs %s on the cpu backend (%d ranks of %s: parallel.gpus "
               "%d, zero_stage %d); %s %s", a, W, r, W, s->zero_stage, what, b);
    else
      snprintf(err, errlen, "job needs %s per GPU on the cuda backend (%s, zero_stage %d); %s %s",
               a, ranks, s->zero_stage, what, b);
    return -ENOMEM;
  }
  if (host_tier > 0) {
    double host = host_tier + (on_cpu ? on_device : 0);
    limit = zt__jobs_host_limit(cfg, &what);
    if ((rc = too_big(host, limit, what, "of host memory (the ranks' offload host tiers)", cfg,
                      err, errlen)) < 0)
      return rc;
  }
  needs->rank_bytes = (size_t)need;
  needs->backend_bytes = (size_t)need * (size_t)s->gpus; /* this daemon's ranks */
  needs->host_bytes = (size_t)host_tier + (on_cpu ? needs->backend_bytes : 0);
  return check_data_host(s, cfg, &needs->host_bytes, err, errlen);
}

json_t *zt__job_spec_to_json(const zt_job_spec *s) {
  json_t *data = s->source == ZT_DATA_FILE
                     ? json_pack("{s:s, s:s}", "source", "file", "path", s->data_path)
                     : json_pack("{s:s, s:i}", "source", "stream", "stream_timeout",
                                 s->stream_timeout);
  if (data && s->source == ZT_DATA_FILE && s->packing != ZT_PACKING_AUTO)
    json_object_set_new(data, "packing", json_string(s->packing == ZT_PACKING_DOCUMENTS
                                                         ? "documents" : "windows"));
  if (data && s->source == ZT_DATA_FILE && s->shuffle)
    json_object_set_new(data, "shuffle", json_true());
  if (data && s->eval_path[0])
    json_object_set_new(data, "eval", json_pack("{s:s, s:i, s:i}", "path", s->eval_path, "every",
                                                 s->eval_every, "batches", s->eval_batches));
  json_t *out = json_pack("{s:s, s:o, s:o, s:o, s:{s:i, s:i}, s:{s:b}}", "name", s->name,
                          "model", zt_config_model_to_json(&s->model), "train",
                          zt_config_train_to_json(&s->train), "data", data, "checkpoint",
                          "every", s->ckpt_every, "keep", s->ckpt_keep, "log", "tensorboard",
                          s->log_tensorboard);
  json_t *par = out ? json_pack("{s:i, s:i}", "gpus", s->gpus, "zero_stage", s->zero_stage)
                   : NULL;
  json_t *peers = s->n_peers ? json_array() : NULL;
  for (int i = 0; peers && i < s->n_peers; i++)
    json_array_append_new(peers, json_string(s->peers[i]));
  if (par && peers) json_object_set_new(par, "peers", peers);
  else json_decref(peers);
  if (out) json_object_set_new(out, "parallel", par);
  if (out && s->has_offload) json_object_set_new(out, "offload", zt_config_offload_to_json(&s->offload));
  if (out && s->offload_off) json_object_set_new(out, "offload", json_false());
  return out;
}

int zt_job_spec_load(const char *path, zt_job_spec *s, char *err, size_t errlen) {
  json_error_t je;
  json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
  if (!j) {
    snprintf(err, errlen, "%s:%d: %s", path, je.line, je.text);
    return -EINVAL;
  }
  int rc = zt__job_spec_parse(j, s, err, errlen);
  json_decref(j);
  return rc;
}
