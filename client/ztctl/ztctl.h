/* ztctl internals: global options, the command table's entry points, shared helpers. */
#ifndef ZTCTL_H
#define ZTCTL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <jansson.h>
#include "client/include/zt/client.h"

/* ZTCTL_INTERRUPTED: stopped by Ctrl-C (SIGINT), as a shell reports a process SIGINT ended. */
enum { ZTCTL_OK = 0, ZTCTL_FAILED = 1, ZTCTL_USAGE = 2, ZTCTL_INTERRUPTED = 130 };

typedef struct ztctl_opts {
  const char *socket_path; /* NULL: the default rule (ZT_SOCKET, XDG_RUNTIME_DIR, /tmp/zt-UID) */
  char *tcp_host;          /* set by --tcp */
  int tcp_port;
  char *token;             /* contents of --token-file */
  bool json;
} ztctl_opts;

typedef int (*ztctl_cmd_fn)(const ztctl_opts *o, int argc, char **argv);

typedef struct ztctl_cmd {
  const char *name;
  const char *args;    /* usage after the command name */
  const char *summary;
  const char *details; /* flags, one per line; may be NULL */
  ztctl_cmd_fn run;
} ztctl_cmd;

const ztctl_cmd *ztctl_cmd_find(const char *name);
/* Prints "ztctl: msg" and the command's usage line to stderr; returns ZTCTL_USAGE. */
int ztctl_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* True when argv[i] is --help/-h (the caller then prints the command's usage). */
bool ztctl_is_help(const char *arg);
int ztctl_print_cmd_usage(const char *cmd, FILE *f);

/* Connects as the options say; on failure prints the error and returns NULL. */
zt_client *ztctl_connect(const ztctl_opts *o);
/* Prints "ztctl: CODE: message" for the client's last failure; returns ZTCTL_FAILED. */
int ztctl_fail(zt_client *c);
/* Prints "ztctl: CODE: message"; returns ZTCTL_FAILED. */
int ztctl_fail_msg(const char *code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A file written to PATH.tmp and renamed over PATH once complete (outfile.c). open and commit
 * return ZTCTL_OK or report the failure; fail reports a write error (errno) and, like abort,
 * removes the temporary file. */
typedef struct ztctl_outfile {
  FILE *f;
  char *tmp;
  const char *path;
} ztctl_outfile;
int ztctl_outfile_open(ztctl_outfile *o, const char *path);
int ztctl_outfile_commit(ztctl_outfile *o);
int ztctl_outfile_fail(ztctl_outfile *o);
void ztctl_outfile_abort(ztctl_outfile *o);

/* Human output. */
void ztctl_print_flat(FILE *f, const json_t *j, const char *prefix);
void ztctl_fmt_bytes(char *buf, size_t cap, double bytes);
void ztctl_fmt_duration(char *buf, size_t cap, double seconds);
void ztctl_fmt_rate(char *buf, size_t cap, double per_s);
/* A job's memory object (step events, show) as text: its figures ("1.0 MiB allocated, peak
 * 1.0 MiB, reserved 1.0 MiB, host pinned 0 B"), or briefly ("1.0 MiB (peak 1.0 MiB, reserved
 * 1.0 MiB)"); an offloaded job's tiers as its plan sized them ("device ..., host ... (...
 * pinned), nvme ..."); its last step's timeline as busy percentages ("gpu 83% h2d 5% d2h 5%
 * cpu-adam 21% nvme 0%"). The last two are "" for a job without them. */
typedef enum ztctl_mem_part {
  ZTCTL_MEM_FIGURES,
  ZTCTL_MEM_BRIEF,
  ZTCTL_MEM_TIERS,
  ZTCTL_MEM_TIMELINE,
} ztctl_mem_part;
void ztctl_fmt_job_memory(char *buf, size_t cap, const json_t *mem, ztctl_mem_part part);

/* Watches job on c, drawing progress; live = redraw a line per step event (on a TTY), else
 * only the summary. Returns ZTCTL_OK when the job ends "done", else ZTCTL_FAILED. */
int ztctl_watch_job(const ztctl_opts *o, zt_client *c, const char *job, bool live);

/* Ctrl-C while a command follows a job: arm (a, b: the connections to cut, either may be NULL)
 * makes SIGINT shut them down (zt_client_interrupt), so that the calls blocked on them return;
 * interrupted says whether it came; disarm restores the default before they are closed. */
void ztctl_sigint_arm(zt_client *a, zt_client *b);
bool ztctl_sigint_came(void);
void ztctl_sigint_disarm(void);

int ztctl_cmd_status(const ztctl_opts *o, int argc, char **argv);
int ztctl_cmd_submit(const ztctl_opts *o, int argc, char **argv);
int ztctl_cmd_plan(const ztctl_opts *o, int argc, char **argv);
int ztctl_cmd_jobs(const ztctl_opts *o, int argc, char **argv);
int ztctl_cmd_show(const ztctl_opts *o, int argc, char **argv);
int ztctl_cmd_watch(const ztctl_opts *o, int argc, char **argv);
int ztctl_cmd_plot(const ztctl_opts *o, int argc, char **argv);
int ztctl_cmd_logs(const ztctl_opts *o, int argc, char **argv);
int ztctl_cmd_cancel(const ztctl_opts *o, int argc, char **argv);
int ztctl_cmd_rm(const ztctl_opts *o, int argc, char **argv);
int ztctl_cmd_resume(const ztctl_opts *o, int argc, char **argv);
int ztctl_cmd_checkpoint(const ztctl_opts *o, int argc, char **argv);
int ztctl_cmd_export(const ztctl_opts *o, int argc, char **argv);
int ztctl_cmd_tokenize(const ztctl_opts *o, int argc, char **argv);
int ztctl_cmd_pack(const ztctl_opts *o, int argc, char **argv);
int ztctl_cmd_shutdown(const ztctl_opts *o, int argc, char **argv);

#endif
