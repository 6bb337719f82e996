/* Following a job: the live progress line, per-event lines when not on a terminal, the summary. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/ztctl/ztctl.h"

/* Without a terminal a line per step would flood logs: print one every so often. */
#define PLAIN_LINE_INTERVAL_S 2.0

typedef struct watch_state {
  const ztctl_opts *o;
  const char *job;
  bool live, tty, line_open, seen_step;
  double start, last_print;
  long long step, steps;
  double loss; /* NAN until a finite loss arrives */
  long long eval_step; /* data.eval: the newest evaluation's step (0 none) and loss */
  double eval_loss;
  char state[32];
  char error[512];
} watch_state;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static double num(const json_t *o, const char *key, double dflt) {
  const json_t *v = json_object_get(o, key);
  return json_is_number(v) ? json_number_value(v) : dflt;
}

static void end_line(watch_state *w) {
  if (w->line_open) fputc('\n', stdout);
  w->line_open = false;
}

/* An offloaded job's line goes on with its tiers and its step's timeline. */
static void step_line(const json_t *ev, char *buf, size_t cap) {
  char rate[32], eta[32], mem[128], tiers[160], timeline[160];
  const json_t *m = json_object_get(ev, "memory");
  ztctl_fmt_rate(rate, sizeof rate, num(ev, "tokens_per_s", 0));
  ztctl_fmt_duration(eta, sizeof eta, num(ev, "eta_s", -1));
  ztctl_fmt_job_memory(mem, sizeof mem, m, ZTCTL_MEM_BRIEF);
  ztctl_fmt_job_memory(tiers, sizeof tiers, m, ZTCTL_MEM_TIERS);
  ztctl_fmt_job_memory(timeline, sizeof timeline, m, ZTCTL_MEM_TIMELINE);
  const json_t *l = json_object_get(ev, "loss");
  char loss[32];
  if (json_is_number(l))
    snprintf(loss, sizeof loss, "%.4f", json_number_value(l));
  else
    snprintf(loss, sizeof loss, "nan");
  snprintf(buf, cap, "step %lld/%lld  loss %s  %s tok/s  ETA %s  mem %s%s%s%s%s",
           (long long)num(ev, "step", 0), (long long)num(ev, "steps", 0), loss, rate, eta, mem,
           tiers[0] ? "  " : "", tiers, timeline[0] ? "  " : "", timeline);
}

static int on_event(const char *event_json, void *user) {
  watch_state *w = user;
  json_t *ev = json_loads(event_json, 0, NULL);
  if (!ev) return 0;
  const char *kind = json_string_value(json_object_get(ev, "event"));
  kind = kind ? kind : "";
  if (strcmp(kind, "step") == 0) {
    w->seen_step = true;
    w->step = (long long)num(ev, "step", (double)w->step);
    w->steps = (long long)num(ev, "steps", (double)w->steps);
    const json_t *l = json_object_get(ev, "loss");
    if (json_is_number(l)) w->loss = json_number_value(l);
  } else if (strcmp(kind, "eval") == 0 && json_is_number(json_object_get(ev, "eval_loss"))) {
    w->eval_step = (long long)num(ev, "step", 0);
    w->eval_loss = num(ev, "eval_loss", NAN);
  } else if (strcmp(kind, "state") == 0 || strcmp(kind, "end") == 0) {
    snprintf(w->state, sizeof w->state, "%s", json_string_value(json_object_get(ev, "state")) ?: "?");
    const char *e = json_string_value(json_object_get(ev, "error"));
    if (e) snprintf(w->error, sizeof w->error, "%s", e);
  }
  bool end = strcmp(kind, "end") == 0;
  if (w->o->json) {
    if (w->live || end) {
      printf("%s\n", event_json);
      fflush(stdout);
    }
  } else if (w->live) {
    char line[640];
    double t = now_s();
    if (strcmp(kind, "step") == 0) {
      step_line(ev, line, sizeof line);
      if (w->tty) {
        printf("\r%s\033[K", line);
        w->line_open = true;
        fflush(stdout);
      } else if (t - w->last_print >= PLAIN_LINE_INTERVAL_S || w->step == w->steps) {
        printf("%s\n", line);
        fflush(stdout);
        w->last_print = t;
      }
    } else if (strcmp(kind, "state") == 0) {
      end_line(w);
      printf("%s: %s%s%s\n", w->job, w->state, w->error[0] ? ": " : "", w->error);
      fflush(stdout);
    } else if (strcmp(kind, "eval") == 0) {
      end_line(w);
      printf("%s: eval after step %lld: loss %.4f over %lld targets\n", w->job,
             (long long)num(ev, "step", 0), num(ev, "eval_loss", NAN),
             (long long)num(ev, "tokens", 0));
      fflush(stdout);
    } else if (strcmp(kind, "checkpoint") == 0) {
      end_line(w);
      printf("%s: checkpoint at step %lld: %s\n", w->job, (long long)num(ev, "step", 0),
             json_string_value(json_object_get(ev, "path")) ?: "-");
      fflush(stdout);
    } else if (strcmp(kind, "resume") == 0) {
      end_line(w);
      printf("%s: %s\n", w->job, json_string_value(json_object_get(ev, "message")) ?: "resumed");
      fflush(stdout);
    }
  }
  json_decref(ev);
  return 0;
}

/* A job that ended before we watched sent no step events: ask for its final numbers (and its
 * newest evaluation's). */
static void fill_from_show(watch_state *w, zt_client *c) {
  char *json = NULL;
  if (zt_client_show(c, w->job, &json) < 0) return;
  json_t *j = json_loads(json, 0, NULL);
  free(json);
  if (!j) return;
  w->step = (long long)num(j, "step", 0);
  w->steps = (long long)num(j, "steps", 0);
  const json_t *l = json_object_get(j, "loss");
  if (json_is_number(l)) w->loss = json_number_value(l);
  if (json_is_number(json_object_get(j, "eval_loss"))) {
    w->eval_step = (long long)num(j, "eval_step", 0);
    w->eval_loss = num(j, "eval_loss", NAN);
  }
  json_decref(j);
}

int ztctl_watch_job(const ztctl_opts *o, zt_client *c, const char *job, bool live) {
  watch_state w = {.o = o, .job = job, .live = live, .tty = isatty(STDOUT_FILENO) == 1,
                   .loss = NAN, .start = now_s()};
  int rc = zt_client_watch(c, job, on_event, &w);
  end_line(&w);
  /* a cut connection after Ctrl-C is no failure to report: the caller says what happened */
  if (rc < 0) return ztctl_sigint_came() ? ZTCTL_FAILED : ztctl_fail(c);
  if (!o->json) {
    if (!w.seen_step) fill_from_show(&w, c);
    char wall[32], loss[32], eval[64] = "";
    ztctl_fmt_duration(wall, sizeof wall, now_s() - w.start);
    if (isfinite(w.loss))
      snprintf(loss, sizeof loss, "%.4f", w.loss);
    else
      snprintf(loss, sizeof loss, "-");
    if (w.eval_step > 0)
      snprintf(eval, sizeof eval, ", eval loss %.4f (step %lld)", w.eval_loss, w.eval_step);
    printf("%s %s: %lld/%lld steps, final loss %s%s, wall %s%s%s\n", job, w.state, w.step,
           w.steps, loss, eval, wall, w.error[0] ? ": " : "", w.error);
  }
  return strcmp(w.state, "done") == 0 ? ZTCTL_OK : ZTCTL_FAILED;
}

static volatile sig_atomic_t g_sigint;
static zt_client *volatile g_cut[2];

/* shutdown(2) is async-signal-safe: all zt_client_interrupt does */
static void on_sigint(int sig) {
  (void)sig;
  g_sigint = 1;
  for (int i = 0; i < 2; i++) zt_client_interrupt(g_cut[i]);
}

void ztctl_sigint_arm(zt_client *a, zt_client *b) {
  struct sigaction sa = {.sa_handler = on_sigint};
  sigemptyset(&sa.sa_mask);
  g_cut[0] = a;
  g_cut[1] = b;
  sigaction(SIGINT, &sa, NULL);
}

bool ztctl_sigint_came(void) { return g_sigint != 0; }

void ztctl_sigint_disarm(void) {
  signal(SIGINT, SIG_DFL);
  g_cut[0] = g_cut[1] = NULL;
}

/* Ctrl-C only stops the watching: the job goes on. */
int ztctl_cmd_watch(const ztctl_opts *o, int argc, char **argv) {
  for (int i = 0; i < argc; i++)
    if (argv[i][0] == '-' && argv[i][1] != '\0')
      return ztctl_usage_error("watch", "unknown option '%s'", argv[i]);
  if (argc != 1) return ztctl_usage_error("watch", "watch takes 1 argument, not %d", argc);
  zt_client *c = ztctl_connect(o);
  if (!c) return ZTCTL_FAILED;
  ztctl_sigint_arm(c, NULL);
  int rc = ztctl_watch_job(o, c, argv[0], true);
  ztctl_sigint_disarm();
  if (ztctl_sigint_came()) {
    fprintf(stderr, "ztctl: interrupted: stopped watching %s; it goes on (ztctl cancel %s stops "
            "it)\n", argv[0], argv[0]);
    rc = ZTCTL_INTERRUPTED;
  }
  zt_client_close(c);
  return rc;
}
