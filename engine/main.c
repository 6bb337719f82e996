/* ztd: the zt daemon. Parses flags, then hands over to the server (engine/server) until a signal
 * or a shutdown request stops it. Exit status: 0 after a graceful stop, 1 when it cannot start,
 * 2 for a usage error. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/kernels/backend.h"
#include "engine/base/log.h"
#include "engine/base/sizes.h"
#include "engine/server/server.h"
#include "engine/base/tunables.h"
#include "engine/plan/rates.h"
#include "engine/train/calibrate.h"
#include "proto/zt_proto.h"

_Static_assert(ZT_TUNE_MAX_FRAME_DEFAULT == ZT_PROTO_FRAME_MAX_DEFAULT,
               "ztd's default --max-frame is the protocol's");

#ifndef ZT_VERSION
#define ZT_VERSION "unknown"
#endif

static const char usage_text[] =
    "usage: ztd [options]\n"
    "  --socket PATH          Unix socket (default $ZT_SOCKET, else $XDG_RUNTIME_DIR/zt/ztd.sock,\n"
    "                         else /tmp/zt-$UID/ztd.sock)\n"
    "  --state-dir DIR        jobs, checkpoints, logs (default $XDG_DATA_HOME/zt or ~/.local/share/zt)\n"
    "  --backend B            auto | cpu | cuda (auto: cuda when a GPU is found, else cpu)\n"
    "  --gpus LIST            GPUs jobs are scheduled on, e.g. 0,1 (cuda; default 0)\n"
    "  --cpu-ranks N          simulated ranks of the cpu backend, its GPUs for jobs'\n"
    "                         parallel.gpus; each gets --cpu-threads / N threads (default 1)\n"
    "  --gpu-mem-limit SIZE   GPU memory budget per device, e.g. 24GiB\n"
    "  --host-mem-limit SIZE  host memory budget for all jobs, e.g. 64GiB (default: no limit)\n"
    "  --nvme-dir DIR         directory for NVMe-resident state (repeatable: the first is the\n"
    "                         default, and a job's offload.nvme_dir must lie inside one)\n"
    "  --data-root DIR        where jobs of TCP clients may read files (repeatable; none: they\n"
    "                         name no files, stream data only)\n"
    "  --tcp HOST:PORT        also listen on TCP (needs --token-file)\n"
    "  --token-file FILE      secret clients must send in hello (>= 16 bytes, mode 0600); also\n"
    "                         the bearer token --http asks for beyond loopback\n"
    "  --http [HOST:]PORT     serve /metrics (Prometheus) and the dashboard at / over HTTP\n"
    "                         (HOST default 127.0.0.1; another address needs --token-file)\n"
    "  --max-frame SIZE       longest frame accepted (default 64MiB)\n"
    "  --max-queued N         jobs queued at once; a submit over it is refused (default: none)\n"
    "  --max-state-bytes SIZE size of the state dir's jobs at or over which a submit is refused\n"
    "                         (default: none)\n"
    "  --cpu-threads N        threads of the CPU backend (default 0 = all cores)\n"
    "  --log-level L          error | warn | info | debug (default info)\n"
    "  --log-file PATH        append the log to PATH instead of stderr; SIGHUP reopens it\n"
    "  --calibrate            measure this machine's rates for the planner's cost model on\n"
    "                         --backend (--gpus' first GPU), the NVMe tier in the first\n"
    "                         --nvme-dir (else the state dir), write them to the state dir's\n"
    "                         rates.json and exit; with no ztd on the state dir (~20 s)\n"
    "  --calibrate-quick      the same on small sizes, in seconds (tests: noisier figures)\n"
    "  --help, --version\n"
    "SIZE: plain bytes or with a suffix KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB\n"
    "(powers of 1000).\n";

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "ztd: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n(ztd --help lists the options)\n");
  va_end(ap);
  return 2;
}

static int parse_int(const char *s, long lo, long hi, long *out) {
  if (!*s) return -EINVAL;
  errno = 0;
  char *end;
  long v = strtol(s, &end, 10);
  if (errno || *end || v < lo || v > hi) return -EINVAL;
  *out = v;
  return 0;
}

static int parse_gpus(const char *s, zt_server_config *cfg) {
  char buf[1024];
  if (snprintf(buf, sizeof buf, "%s", s) >= (int)sizeof buf || !*buf) return -EINVAL;
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    long v;
    if (parse_int(tok, 0, 1023, &v) < 0 || cfg->n_gpus == ZT_TUNE_MAX_GPUS) return -EINVAL;
    for (int i = 0; i < cfg->n_gpus; i++)
      if (cfg->gpus[i] == v) return -EINVAL;
    cfg->gpus[cfg->n_gpus++] = (int)v;
  }
  return cfg->n_gpus ? 0 : -EINVAL;
}

/* HOST:PORT or [V6HOST]:PORT, the port from min_port on; host is written into buf. */
static int parse_hostport(const char *s, char *buf, size_t buflen, long min_port,
                          const char **host, int *port_out) {
  const char *colon = strrchr(s, ':');
  if (!colon || colon == s) return -EINVAL;
  const char *h = s;
  size_t hlen = (size_t)(colon - s);
  if (h[0] == '[') {
    if (hlen < 3 || h[hlen - 1] != ']') return -EINVAL;
    h++;
    hlen -= 2;
  }
  if (hlen >= buflen) return -EINVAL;
  memcpy(buf, h, hlen);
  buf[hlen] = '\0';
  long port;
  if (parse_int(colon + 1, min_port, 65535, &port) < 0) return -EINVAL;
  *host = buf;
  *port_out = (int)port;
  return 0;
}

/* --http [HOST:]PORT: a port alone is loopback's; port 0 lets the kernel pick one (logged). */
static int parse_http(const char *s, char *buf, size_t buflen, zt_server_config *cfg) {
  long port;
  if (strchr(s, ':')) return parse_hostport(s, buf, buflen, 0, &cfg->http_host, &cfg->http_port);
  if (parse_int(s, 0, 65535, &port) < 0) return -EINVAL;
  cfg->http_host = "127.0.0.1";
  cfg->http_port = (int)port;
  return 0;
}

/* The token must be a secret: a regular file nobody but its owner can read. */
static int read_token(const char *path, char *tok, size_t toklen, size_t *len, char *why,
                      size_t whylen) {
  int rc = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    snprintf(why, whylen, "%s", strerror(errno));
    return -errno;
  }
  struct stat st;
  if (fstat(fd, &st) < 0) {
    rc = -errno;
    snprintf(why, whylen, "%s", strerror(errno));
    goto out;
  }
  if (!S_ISREG(st.st_mode)) {
    rc = -EINVAL;
    snprintf(why, whylen, "not a regular file");
    goto out;
  }
  if (st.st_mode & (S_IRGRP | S_IROTH | S_IWGRP | S_IWOTH)) {
    rc = -EACCES;
    snprintf(why, whylen, "group or others may read or write it (chmod 600 it)");
    goto out;
  }
  ssize_t n = read(fd, tok, toklen);
  if (n < 0) {
    rc = -errno;
    snprintf(why, whylen, "%s", strerror(errno));
    goto out;
  }
  size_t l = (size_t)n;
  /* A trailing newline (echo > file) is not part of the secret. */
  while (l > 0 && (tok[l - 1] == '\n' || tok[l - 1] == '\r')) l--;
  if (l < ZT_TUNE_TOKEN_MIN || (size_t)n == toklen) {
    rc = -EINVAL;
    snprintf(why, whylen, "the token must be %d to %d bytes", ZT_TUNE_TOKEN_MIN,
             ZT_TUNE_TOKEN_MAX - 1);
    goto out;
  }
  *len = l;
out:
  close(fd);
  return rc;
}

static int default_socket(char *buf, size_t len) {
  const char *env = getenv("ZT_SOCKET");
  if (env && *env) return snprintf(buf, len, "%s", env) < (int)len ? 0 : -ENAMETOOLONG;
  const char *run = getenv("XDG_RUNTIME_DIR");
  int n = run && *run ? snprintf(buf, len, "%s/zt/ztd.sock", run)
                      : snprintf(buf, len, "/tmp/zt-%u/ztd.sock", (unsigned)getuid());
  return n < (int)len ? 0 : -ENAMETOOLONG;
}

static int default_state_dir(char *buf, size_t len) {
  const char *data = getenv("XDG_DATA_HOME");
  if (data && *data) return snprintf(buf, len, "%s/zt", data) < (int)len ? 0 : -ENAMETOOLONG;
  const char *home = getenv("HOME");
  if (!home || !*home) {
    struct passwd *pw = getpwuid(getuid());
    home = pw ? pw->pw_dir : NULL;
  }
  if (!home) return -ENOENT;
  return snprintf(buf, len, "%s/.local/share/zt", home) < (int)len ? 0 : -ENAMETOOLONG;
}

enum {
  OPT_SOCKET = 256, OPT_STATE_DIR, OPT_BACKEND, OPT_GPUS, OPT_GPU_MEM, OPT_HOST_MEM, OPT_NVME,
  OPT_TCP, OPT_TOKEN, OPT_MAX_FRAME, OPT_CPU_THREADS, OPT_CPU_RANKS, OPT_LOG_LEVEL, OPT_HELP,
  OPT_VERSION, OPT_HTTP, OPT_LOG_FILE, OPT_DATA_ROOT, OPT_MAX_QUEUED, OPT_MAX_STATE,
  OPT_CALIBRATE, OPT_CALIBRATE_QUICK,
};

/* --nvme-dir and --data-root: an existing directory, kept resolved (symlinks followed) so that
 * the job layer compares resolved paths with it. */
static int add_dir(const char *flag, const char *arg, char store[][PATH_MAX], const char **list,
                   int *n) {
  struct stat st;
  if (*n == ZT_TUNE_MAX_ROOTS)
    return usage_error("%s: at most %d of them", flag, ZT_TUNE_MAX_ROOTS);
  if (!realpath(arg, store[*n]) || stat(store[*n], &st) < 0 || !S_ISDIR(st.st_mode))
    return usage_error("%s %s: not a directory", flag, arg);
  list[*n] = store[*n];
  (*n)++;
  return 0;
}

/* ztd --calibrate: the rates measured (engine/train/calibrate.c) into state_dir/rates.json,
 * which a ztd started on that state dir then plans by. The state dir's lock is held meanwhile,
 * so a running ztd's jobs neither share the machine being measured nor see a daemon start. */
static int calibrate(const zt_server_config *cfg, int quick) {
  const char *dir = cfg->state_dir;
  char path[PATH_MAX + 32], err[1024] = "", when[32];
  struct stat st;
  int fd = -1, rc = 1;
  if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
    fprintf(stderr, "ztd --calibrate: state dir %s: %s\n", dir, strerror(errno));
    return 1;
  }
  if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
    fprintf(stderr, "ztd --calibrate: state dir %s: not a directory\n", dir);
    return 1;
  }
  snprintf(path, sizeof path, "%s/ztd.lock", dir);
  if ((fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0) {
    fprintf(stderr, "ztd --calibrate: state dir %s is not writable: %s\n", dir, strerror(errno));
    return 1;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
    fprintf(stderr, "ztd --calibrate: state dir %s is in use by a running ztd; stop it first "
            "(its jobs would share the machine being measured)\n", dir);
    goto out;
  }
  zt_calibrate_cfg c = {.backend = cfg->backend, .device = cfg->n_gpus ? cfg->gpus[0] : 0,
                        .cpu_threads = cfg->cpu_threads,
                        .nvme_dir = cfg->nvme_dir ? cfg->nvme_dir : dir, .quick = quick};
  printf("ztd --calibrate: backend %s", c.backend);
  if (!strcmp(c.backend, "cuda")) printf(" (GPU %d)", c.device);
  printf(", NVMe tier in %s, into %s/%s\n", c.nvme_dir, dir, ZT_PLAN_RATES_FILE);
  fflush(stdout);
  zt_plan_rates r;
  if (zt_calibrate_run(&c, stdout, &r, err, sizeof err) < 0) {
    fprintf(stderr, "ztd --calibrate: %s\n", err);
    goto out;
  }
  time_t now = time(NULL);
  struct tm tm;
  strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
  if (zt_plan_rates_save(dir, &r, when, c.backend, err, sizeof err) < 0) {
    fprintf(stderr, "ztd --calibrate: %s\n", err);
    goto out;
  }
  printf("ztd --calibrate: wrote %s/%s (rates \"%s\", measured %s); a ztd started on this "
         "state dir plans by them\n", dir, ZT_PLAN_RATES_FILE, r.name, when);
  rc = 0;
out:
  close(fd); /* the lock with it */
  return rc;
}

int main(int argc, char **argv) {
  static const struct option opts[] = {
      {"socket", required_argument, NULL, OPT_SOCKET},
      {"state-dir", required_argument, NULL, OPT_STATE_DIR},
      {"backend", required_argument, NULL, OPT_BACKEND},
      {"gpus", required_argument, NULL, OPT_GPUS},
      {"gpu-mem-limit", required_argument, NULL, OPT_GPU_MEM},
      {"host-mem-limit", required_argument, NULL, OPT_HOST_MEM},
      {"nvme-dir", required_argument, NULL, OPT_NVME},
      {"data-root", required_argument, NULL, OPT_DATA_ROOT},
      {"max-queued", required_argument, NULL, OPT_MAX_QUEUED},
      {"max-state-bytes", required_argument, NULL, OPT_MAX_STATE},
      {"tcp", required_argument, NULL, OPT_TCP},
      {"token-file", required_argument, NULL, OPT_TOKEN},
      {"max-frame", required_argument, NULL, OPT_MAX_FRAME},
      {"cpu-threads", required_argument, NULL, OPT_CPU_THREADS},
      {"cpu-ranks", required_argument, NULL, OPT_CPU_RANKS},
      {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
      {"help", no_argument, NULL, OPT_HELP},
      {"version", no_argument, NULL, OPT_VERSION},
      {"http", required_argument, NULL, OPT_HTTP},
      {"log-file", required_argument, NULL, OPT_LOG_FILE},
      {"calibrate", no_argument, NULL, OPT_CALIBRATE},
      {"calibrate-quick", no_argument, NULL, OPT_CALIBRATE_QUICK},
      {NULL, 0, NULL, 0},
  };
  static char socket_buf[PATH_MAX], state_buf[PATH_MAX], host_buf[256], http_buf[256],
      token[ZT_TUNE_TOKEN_MAX];
  static char nvme_buf[ZT_TUNE_MAX_ROOTS][PATH_MAX], root_buf[ZT_TUNE_MAX_ROOTS][PATH_MAX];
  zt_server_config cfg = {.max_frame = ZT_TUNE_MAX_FRAME_DEFAULT};
  const char *backend = "auto";
  const char *token_file = NULL, *log_file = NULL;
  int calibrating = 0;
  uint64_t size;
  long n;
  int opt, rc;
  opterr = 0;
  while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (opt) {
    case OPT_SOCKET:
      cfg.socket_path = optarg;
      break;
    case OPT_STATE_DIR:
      cfg.state_dir = optarg;
      break;
    case OPT_BACKEND:
      if (strcmp(optarg, "auto") && strcmp(optarg, "cpu") && strcmp(optarg, "cuda"))
        return usage_error("--backend %s: expected auto, cpu or cuda", optarg);
      backend = optarg;
      break;
    case OPT_GPUS:
      if (parse_gpus(optarg, &cfg) < 0)
        return usage_error("--gpus %s: expected distinct GPU indices such as 0,1", optarg);
      break;
    case OPT_GPU_MEM:
    case OPT_HOST_MEM:
    case OPT_MAX_FRAME:
      if (zt_size_parse(optarg, &size) < 0 || size == 0)
        return usage_error("%s %s: expected a size such as 24GiB, 512MiB or 4096",
                           opt == OPT_GPU_MEM ? "--gpu-mem-limit"
                           : opt == OPT_HOST_MEM ? "--host-mem-limit" : "--max-frame",
                           optarg);
      if (opt == OPT_GPU_MEM) cfg.gpu_mem_limit = size;
      if (opt == OPT_HOST_MEM) cfg.host_mem_limit = size;
      if (opt == OPT_MAX_FRAME) {
        if (size < ZT_TUNE_MAX_FRAME_MIN || size > ZT_TUNE_MAX_FRAME_MAX)
          return usage_error("--max-frame %s: must be between 64KiB and 1GiB", optarg);
        cfg.max_frame = (uint32_t)size;
      }
      break;
    case OPT_NVME:
      if (add_dir("--nvme-dir", optarg, nvme_buf, cfg.nvme_dirs, &cfg.n_nvme_dirs)) return 2;
      cfg.nvme_dir = cfg.nvme_dirs[0];
      break;
    case OPT_MAX_QUEUED:
      if (parse_int(optarg, 1, 1000000, &n) < 0)
        return usage_error("--max-queued %s: expected a count from 1 to 1000000", optarg);
      cfg.max_queued = (int)n;
      break;
    case OPT_MAX_STATE:
      if (zt_size_parse(optarg, &size) < 0 || size == 0)
        return usage_error("--max-state-bytes %s: expected a size such as 500GiB", optarg);
      cfg.max_state_bytes = size;
      break;
    case OPT_DATA_ROOT:
      if (add_dir("--data-root", optarg, root_buf, cfg.data_roots, &cfg.n_data_roots)) return 2;
      break;
    case OPT_TCP:
      if (parse_hostport(optarg, host_buf, sizeof host_buf, 1, &cfg.tcp_host, &cfg.tcp_port) < 0)
        return usage_error("--tcp %s: expected HOST:PORT, e.g. 127.0.0.1:7070", optarg);
      break;
    case OPT_TOKEN:
      token_file = optarg;
      break;
    case OPT_LOG_FILE:
      log_file = optarg;
      break;
    case OPT_CALIBRATE:
    case OPT_CALIBRATE_QUICK:
      calibrating = opt == OPT_CALIBRATE ? 1 : 2;
      break;
    case OPT_HTTP:
#ifndef ZT_HAVE_HTTP
      return usage_error("--http: this ztd was built without its HTTP listener (meson option "
                         "http, which needs libmicrohttpd; static_deps builds have none)");
#endif
      if (parse_http(optarg, http_buf, sizeof http_buf, &cfg) < 0)
        return usage_error("--http %s: expected [HOST:]PORT, e.g. 9090 or 0.0.0.0:9090", optarg);
      break;
    case OPT_CPU_THREADS:
      if (parse_int(optarg, 0, 4096, &n) < 0)
        return usage_error("--cpu-threads %s: expected a count from 0 (all cores) to 4096",
                           optarg);
      cfg.cpu_threads = (int)n;
      break;
    case OPT_CPU_RANKS:
      if (parse_int(optarg, 1, ZT_TUNE_MAX_GPUS, &n) < 0)
        return usage_error("--cpu-ranks %s: expected a count from 1 to %d", optarg,
                           ZT_TUNE_MAX_GPUS);
      cfg.cpu_ranks = (int)n;
      break;
    case OPT_LOG_LEVEL: {
      zt_log_level lvl;
      if (zt_log_parse_level(optarg, &lvl) < 0)
        return usage_error("--log-level %s: expected error, warn, info or debug", optarg);
      zt_log_set_level(lvl);
      break;
    }
    case OPT_HELP:
      fputs(usage_text, stdout);
      return 0;
    case OPT_VERSION:
      printf("ztd %s (protocol %d)\n", ZT_VERSION, ZT_PROTO_VERSION);
      return 0;
    default:
      return usage_error("%s: unknown option or missing value",
                         optind > 0 && optind <= argc ? argv[optind - 1] : "?");
    }
  }
  if (optind < argc) return usage_error("unexpected argument %s", argv[optind]);
  if (cfg.tcp_host && !token_file) return usage_error("--tcp needs --token-file");
  /* a non-loopback --http without it is refused by the listener (engine/server/http.c) */
  if (token_file && !cfg.tcp_host && !cfg.http_host)
    return usage_error("--token-file is only used with --tcp or --http");
  if (token_file) {
    char why[256];
    if (read_token(token_file, token, sizeof token, &cfg.token_len, why, sizeof why) < 0)
      return usage_error("--token-file %s: %s", token_file, why);
    cfg.token = token;
  }
  if (!cfg.socket_path) {
    if (default_socket(socket_buf, sizeof socket_buf) < 0)
      return usage_error("the default socket path is too long; use --socket");
    cfg.socket_path = socket_buf;
  }
  if (!cfg.state_dir) {
    if (default_state_dir(state_buf, sizeof state_buf) < 0)
      return usage_error("no default state dir (HOME unset); use --state-dir");
    cfg.state_dir = state_buf;
  }
  /* auto: the GPU when this build has CUDA and the driver shows one, else the CPU. Jobs are
   * scheduled on the GPUs of --gpus (0 by default), or on the cpu backend's simulated ranks. */
  int n_dev = zt_backend_cuda_devices(NULL, 0);
  if (!strcmp(backend, "cuda") && !zt_backend_have_cuda()) {
    fprintf(stderr, "ztd: --backend cuda: this build of zt has no CUDA support\n");
    return 1;
  }
  if (!strcmp(backend, "cuda") && n_dev == 0) {
    fprintf(stderr, "ztd: --backend cuda: no CUDA device found\n");
    return 1;
  }
  cfg.backend = !strcmp(backend, "auto") ? (n_dev > 0 ? "cuda" : "cpu") : backend;
  if (!strcmp(cfg.backend, "cpu") && cfg.n_gpus > 0) {
    /* a usage error when asked for; otherwise what this machine lacks */
    fprintf(stderr, "ztd: --gpus: the cpu backend has no GPUs (%s); its jobs run parallel.gpus "
            "as simulated ranks, up to --cpu-ranks\n",
            !strcmp(backend, "cpu") ? "--backend cpu" : "no CUDA device found");
    return !strcmp(backend, "cpu") ? 2 : 1;
  }
  if (!strcmp(cfg.backend, "cuda") && cfg.cpu_ranks > 0) {
    fprintf(stderr, "ztd: --cpu-ranks: the cuda backend's ranks are its GPUs; use --gpus\n");
    return 2;
  }
  if (!strcmp(cfg.backend, "cpu") && cfg.cpu_ranks == 0) cfg.cpu_ranks = ZT_TUNE_CPU_RANKS_DEFAULT;
  for (int i = 0; i < cfg.n_gpus; i++) {
    if (!strcmp(cfg.backend, "cuda") && cfg.gpus[i] >= n_dev) {
      fprintf(stderr, "ztd: --gpus: GPU %d does not exist (%d found)\n", cfg.gpus[i], n_dev);
      return 1;
    }
  }
  if (log_file && (rc = zt_log_open_file(log_file)) < 0) {
    fprintf(stderr, "ztd: --log-file %s: %s\n", log_file, strerror(-rc));
    return 1;
  }
  if (calibrating) return calibrate(&cfg, calibrating == 2);
  /* The cost model's rates of this machine, where a calibration (or its operator) left them:
   * read before any thread plans; none where the state dir is not there yet (or is no
   * directory, which zt_server_run reports). */
  char rates_path[4200], err_rates[4400];
  zt_plan_rates rates;
  snprintf(rates_path, sizeof rates_path, "%s/rates.json", cfg.state_dir);
  if ((rc = zt_plan_rates_load(rates_path, &rates, err_rates, sizeof err_rates)) == 0) {
    zt_plan_rates_use(&rates);
    zt_log(ZT_LOG_INFO, "plan", "cost model rates \"%s\" from %s", rates.name, rates_path);
  } else if (rc != -ENOENT && rc != -ENOTDIR) {
    fprintf(stderr, "ztd: %s\n", err_rates);
    return 1;
  }
  /* A client that hangs up mid-reply must not kill the daemon. */
  signal(SIGPIPE, SIG_IGN);
  char err[512] = "";
  rc = zt_server_run(&cfg, err, sizeof err);
  if (rc < 0) {
    fprintf(stderr, "ztd: %s\n", err[0] ? err : strerror(-rc));
    return 1;
  }
  return 0;
}
