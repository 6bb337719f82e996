/* ztctl: the command-line client of ztd. Global options, the command table, help, connecting. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/ztctl/ztctl.h"
#include "proto/zt_proto.h"

#ifndef ZT_VERSION
#define ZT_VERSION "unknown"
#endif

static const ztctl_cmd g_cmds[] = {
    {"status", "", "daemon version, backend, devices, memory per tier, queue", NULL,
     ztctl_cmd_status},
    {"submit", "SPEC.json [--data FILE [--detach]] [--wait | --watch]",
     "submit a job; prints its id",
     "  --data FILE  stream this token file into the job (a stream job); Ctrl-C meanwhile\n"
     "               cancels the job (exit 130)\n"
     "  --detach     with --data: Ctrl-C leaves the job running (it fails after its\n"
     "               data.stream_timeout without a producer) and says how to cancel it\n"
     "  --wait       wait for the job to end; exit 1 unless it is done\n"
     "  --watch      like --wait, drawing progress\n",
     ztctl_cmd_submit},
    {"plan",
     "SPEC.json [--backend cpu|cuda [--gpus N] [--gpu-mem-limit SIZE] [--host-mem-limit SIZE] "
     "[--nvme-bytes SIZE] [--rates NAME|FILE]]",
     "size a job without submitting it: bytes per tier, or why it cannot fit",
     "  with --backend: for the machine those flags describe (ztd's flag names), not the\n"
     "  daemon's: any ztd plans it, a cpu one included, as a ztd there would\n"
     "  --backend cpu|cuda     its backend\n"
     "  --gpus N               how many GPUs it has (cpu: simulated ranks, ztd --cpu-ranks);\n"
     "                         a count, not ztd --gpus's list of indices; default 1\n"
     "  --gpu-mem-limit SIZE   each GPU's memory, e.g. 24GiB (required for cuda)\n"
     "  --host-mem-limit SIZE  the host memory jobs may take, e.g. 64GiB (required)\n"
     "  --nvme-bytes SIZE      free disk at offload.nvme_dir and the state dir (default: not\n"
     "                         checked)\n"
     "  --rates NAME|FILE      the cost model's rates: default, h200, or a rates file\n"
     "                         (a path: with a '/' or a '.'), read here and sent\n",
     ztctl_cmd_plan},
    {"jobs", "", "list the daemon's jobs", NULL, ztctl_cmd_jobs},
    {"show", "JOB", "one job: state, progress, memory, spec (--json adds every loss)", NULL,
     ztctl_cmd_show},
    {"watch", "JOB", "follow a job's progress until it ends; exit 1 unless it is done",
     "  Ctrl-C stops the watching only: the job goes on (exit 130)\n", ztctl_cmd_watch},
    {"logs", "JOB [-f]", "the job's log: queued, running, checkpoints, the end or the error",
     "  -f, --follow  go on printing what is added until the job ends\n", ztctl_cmd_logs},
    {"plot", "JOB [--height ROWS]", "draw the job's loss curve in the terminal (80 columns)",
     "  --height ROWS  rows of the plot, 4 to 100 (default 16)\n", ztctl_cmd_plot},
    {"cancel", "JOB", "cancel a queued or running job", NULL, ztctl_cmd_cancel},
    {"rm", "JOB", "remove a job that ended (done, failed, cancelled) and its directory", NULL,
     ztctl_cmd_rm},
    {"resume", "JOB --steps N",
     "continue a done or cancelled job from its newest checkpoint to N steps in all",
     "  --steps N  the job's new train.steps (above its step now): the optimizer state, loss\n"
     "             scale and data position carry on, the schedule's horizon becomes N\n",
     ztctl_cmd_resume},
    {"checkpoint", "JOB", "write a checkpoint of a running job now", NULL, ztctl_cmd_checkpoint},
    {"export", "JOB OUT.safetensors | JOB DIR --hf [--dtype bf16|fp32] [--max-shard-size SIZE]",
     "download the job's latest weights: one file, or a Hugging Face directory",
     "  --hf                  a directory transformers' from_pretrained loads: config.json,\n"
     "                        the weights (shards and an index past --max-shard-size), and the\n"
     "                        tokenizer files of the directory the job started from\n"
     "  --dtype bf16|fp32     the weights' dtype (default bf16)\n"
     "  --max-shard-size SIZE the largest shard, e.g. 5GB (the default), 500MB\n",
     ztctl_cmd_export},
    {"tokenize", "--bytes TEXT... OUT",
     "write each TEXT (a file, - for stdin) as a document of a byte-level token file",
     "  --bytes      one token per byte (vocabulary 256, 2-byte tokens)\n", ztctl_cmd_tokenize},
    {"pack", "IN.jsonl OUT [--vocab N]",
     "write documents of token ids (a JSON object a line) as a token file with a loss mask",
     "  a line: {\"input_ids\": [...]} with \"labels\": [...] (-100: not a target, as\n"
     "          transformers) or \"loss_mask\": [0|1...], aligned with input_ids\n"
     "  --vocab N    the vocabulary (default: the largest id + 1); an id >= N is refused\n",
     ztctl_cmd_pack},
    {"shutdown", "", "checkpoint running jobs and stop ztd", NULL, ztctl_cmd_shutdown},
};

static const char g_global_usage[] =
    "usage: ztctl [--socket PATH | --tcp HOST:PORT --token-file FILE] [--json] COMMAND [ARGS]\n"
    "       (the options in brackets may also follow the command)\n";

static const char g_global_details[] =
    "\n"
    "options:\n"
    "  --socket PATH      ztd's Unix socket (default: $ZT_SOCKET, else\n"
    "                     $XDG_RUNTIME_DIR/zt/ztd.sock, else /tmp/zt-$UID/ztd.sock)\n"
    "  --tcp HOST:PORT    connect over TCP instead (needs --token-file)\n"
    "  --token-file FILE  the daemon's token file, for --tcp\n"
    "  --json             print replies as JSON (one object per line)\n"
    "  -h, --help         this text; `ztctl help COMMAND` for one command\n"
    "  --version          ztctl's version and protocol\n"
    "\n"
    "exit status: 0 ok, 1 failed (server error, or the job failed with --wait/--watch), 2 usage,\n"
    "130 interrupted (Ctrl-C)\n";

const ztctl_cmd *ztctl_cmd_find(const char *name) {
  for (size_t i = 0; i < sizeof g_cmds / sizeof g_cmds[0]; i++)
    if (strcmp(g_cmds[i].name, name) == 0) return &g_cmds[i];
  return NULL;
}

bool ztctl_is_help(const char *arg) { return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0; }

int ztctl_print_cmd_usage(const char *cmd, FILE *f) {
  const ztctl_cmd *c = ztctl_cmd_find(cmd);
  if (!c) return ZTCTL_USAGE;
  fprintf(f, "usage: ztctl [OPTIONS] %s%s%s\n  %s\n", c->name, c->args[0] ? " " : "", c->args,
          c->summary);
  if (c->details) fprintf(f, "\n%s", c->details);
  return ZTCTL_OK;
}

static void print_global_usage(FILE *f) {
  fputs(g_global_usage, f);
  fputs("\ncommands:\n", f);
  for (size_t i = 0; i < sizeof g_cmds / sizeof g_cmds[0]; i++)
    fprintf(f, "  %-11s %s\n", g_cmds[i].name, g_cmds[i].summary);
  fputs(g_global_details, f);
}

/* --json anywhere: errors go to stderr as {"error": {"code", "message"}} (usage errors too,
 * code EINVAL, with the usage line). */
static bool g_json_errors;

static void json_error(const char *code, const char *message, const char *usage) {
  json_t *e = json_pack("{s:{s:s, s:s}}", "error", "code", code, "message", message);
  if (e && usage) json_object_set_new(json_object_get(e, "error"), "usage", json_string(usage));
  char *text = e ? json_dumps(e, JSON_COMPACT) : NULL;
  fprintf(stderr, "%s\n", text ? text : "{\"error\": {\"code\": \"ENOMEM\", \"message\": \"out of memory\"}}");
  free(text);
  json_decref(e);
}

int ztctl_usage_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  char msg[1024];
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (g_json_errors) {
    char usage[512];
    const ztctl_cmd *c = cmd ? ztctl_cmd_find(cmd) : NULL;
    if (c) snprintf(usage, sizeof usage, "ztctl [OPTIONS] %s%s%s", c->name, c->args[0] ? " " : "", c->args);
    json_error("EINVAL", msg, c ? usage : NULL);
    return ZTCTL_USAGE;
  }
  fprintf(stderr, "ztctl: %s\n", msg);
  if (cmd && ztctl_cmd_find(cmd)) {
    const ztctl_cmd *c = ztctl_cmd_find(cmd);
    fprintf(stderr, "usage: ztctl [OPTIONS] %s%s%s\n", c->name, c->args[0] ? " " : "", c->args);
  } else {
    fputs(g_global_usage, stderr);
  }
  return ZTCTL_USAGE;
}

int ztctl_fail_msg(const char *code, const char *fmt, ...) {
  va_list ap;
  char msg[4096];
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (g_json_errors) json_error(code, msg, NULL);
  else fprintf(stderr, "ztctl: %s: %s\n", code, msg);
  return ZTCTL_FAILED;
}

int ztctl_fail(zt_client *c) {
  return ztctl_fail_msg(zt_client_error_code(c), "%s", zt_client_error_message(c));
}

zt_client *ztctl_connect(const ztctl_opts *o) {
  zt_client *c = NULL;
  int rc;
  if (o->tcp_host) {
    rc = zt_client_connect_tcp(&c, o->tcp_host, o->tcp_port, o->token);
  } else if (o->socket_path) {
    rc = zt_client_connect_unix(&c, o->socket_path);
  } else {
    /* the daemon picks its default socket by the same rule */
    char path[4096];
    const char *env = getenv("ZT_SOCKET"), *xdg = getenv("XDG_RUNTIME_DIR");
    if (env && env[0])
      snprintf(path, sizeof path, "%s", env);
    else if (xdg && xdg[0])
      snprintf(path, sizeof path, "%s/zt/ztd.sock", xdg);
    else
      snprintf(path, sizeof path, "/tmp/zt-%u/ztd.sock", (unsigned)getuid());
    rc = zt_client_connect_unix(&c, path);
  }
  if (rc < 0) {
    ztctl_fail(c);
    zt_client_close(c);
    return NULL;
  }
  return c;
}

/* Reads the token file; surrounding whitespace (a trailing newline) is not part of the token. */
static int read_token(const char *path, char **out) {
  FILE *f = fopen(path, "rb");
  if (!f) return ztctl_fail_msg("EACCES", "cannot read token file %s: %s", path, strerror(errno));
  char buf[4096];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) buf[--n] = '\0';
  *out = strdup(buf);
  return *out ? ZTCTL_OK : ztctl_fail_msg("ENOMEM", "out of memory");
}

/* The transport options go together: ZTCTL_OK, or the usage error. */
static int check_transport(const ztctl_opts *o, const char *token_file) {
  if (o->tcp_host && o->socket_path)
    return ztctl_usage_error(NULL, "--socket and --tcp exclude each other");
  if (o->tcp_host && !token_file) return ztctl_usage_error(NULL, "--tcp needs --token-file");
  if (token_file && !o->tcp_host) return ztctl_usage_error(NULL, "--token-file goes with --tcp");
  return ZTCTL_OK;
}

/* --name VALUE or --name=VALUE at argv[*i]; returns the value or NULL when argv[*i] is not it. */
static const char *opt_value(int argc, char **argv, int *i, const char *name, bool *missing) {
  size_t n = strlen(name);
  const char *a = argv[*i];
  if (strncmp(a, name, n) != 0) return NULL;
  if (a[n] == '=') return a + n + 1;
  if (a[n] != '\0') return NULL;
  if (*i + 1 >= argc) {
    *missing = true;
    return NULL;
  }
  return argv[++*i];
}

/* One global option at argv[*i] (--json, --socket, --tcp, --token-file, with their values):
 * 1 when it was one (*i past its value), 0 when argv[*i] is not one, or a ztctl exit code
 * (negated) after a usage error. */
static int global_opt(int argc, char **argv, int *i, ztctl_opts *o, const char **token_file) {
  bool missing = false;
  const char *v;
  if (strcmp(argv[*i], "--json") == 0) {
    o->json = true;
  } else if ((v = opt_value(argc, argv, i, "--socket", &missing))) {
    o->socket_path = v;
  } else if ((v = opt_value(argc, argv, i, "--token-file", &missing))) {
    *token_file = v;
  } else if ((v = opt_value(argc, argv, i, "--tcp", &missing))) {
    const char *colon = strrchr(v, ':');
    char *end;
    long port = colon ? strtol(colon + 1, &end, 10) : 0;
    if (!colon || colon == v || colon[1] == '\0' || *end || port <= 0 || port > 65535)
      return -ztctl_usage_error(NULL, "--tcp wants HOST:PORT, not '%s'", v);
    free(o->tcp_host);
    o->tcp_host = strndup(v, (size_t)(colon - v));
    o->tcp_port = (int)port;
  } else if (missing) {
    return -ztctl_usage_error(NULL, "%s needs a value", argv[*i]);
  } else {
    return 0;
  }
  return 1;
}

int main(int argc, char **argv) {
  ztctl_opts o = {0};
  const char *token_file = NULL;
  int i = 1, rc = ZTCTL_USAGE, g;
  char **rest = NULL;
  /* errors are JSON from the first one on when --json is anywhere before "--" */
  for (int k = 1; k < argc && strcmp(argv[k], "--") != 0; k++)
    if (strcmp(argv[k], "--json") == 0) g_json_errors = true;
  for (; i < argc && argv[i][0] == '-'; i++) {
    if (ztctl_is_help(argv[i])) {
      print_global_usage(stdout);
      rc = ZTCTL_OK;
      goto out;
    } else if (strcmp(argv[i], "--version") == 0) {
      printf("ztctl %s (protocol %d)\n", ZT_VERSION, ZT_PROTO_VERSION);
      rc = ZTCTL_OK;
      goto out;
    } else if ((g = global_opt(argc, argv, &i, &o, &token_file)) < 0) {
      rc = -g;
      goto out;
    } else if (g == 0) {
      rc = ztctl_usage_error(NULL, "unknown option '%s'", argv[i]);
      goto out;
    }
  }
  if (i >= argc) {
    rc = ztctl_usage_error(NULL, "no command given (see ztctl --help)");
    goto out;
  }
  const char *name = argv[i];
  if (strcmp(name, "help") == 0) {
    if (i + 1 >= argc) {
      print_global_usage(stdout);
      rc = ZTCTL_OK;
    } else if (ztctl_print_cmd_usage(argv[i + 1], stdout) != ZTCTL_OK) {
      rc = ztctl_usage_error(NULL, "unknown command '%s'", argv[i + 1]);
    } else {
      rc = ZTCTL_OK;
    }
    goto out;
  }
  const ztctl_cmd *cmd = ztctl_cmd_find(name);
  if (!cmd) {
    rc = ztctl_usage_error(NULL, "unknown command '%s' (see ztctl --help)", name);
    goto out;
  }
  for (int k = i + 1; k < argc; k++) {
    if (strcmp(argv[k], "--") == 0) break;
    if (ztctl_is_help(argv[k])) {
      rc = ztctl_print_cmd_usage(name, stdout);
      goto out;
    }
  }
  /* the global options may follow the command too (`ztctl show JOB --json`): they are taken
   * out of its arguments, up to a "--" */
  if (!(rest = calloc((size_t)argc, sizeof *rest))) {
    rc = ztctl_fail_msg("ENOMEM", "out of memory");
    goto out;
  }
  int n_rest = 0;
  for (int k = i + 1; k < argc; k++) {
    if (strcmp(argv[k], "--") == 0) {
      while (k < argc) rest[n_rest++] = argv[k++];
      break;
    }
    if ((g = global_opt(argc, argv, &k, &o, &token_file)) < 0) {
      rc = -g;
      goto out;
    }
    if (g == 0) rest[n_rest++] = argv[k];
  }
  if ((rc = check_transport(&o, token_file)) != ZTCTL_OK) goto out;
  if (token_file && (rc = read_token(token_file, &o.token)) != ZTCTL_OK) goto out;
  rc = cmd->run(&o, n_rest, rest);
out:
  free(rest);
  free(o.tcp_host);
  free(o.token);
  return rc;
}
