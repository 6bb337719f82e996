#include "engine/base/log.h"
#include "engine/base/check.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static zt_log_level g_level = ZT_LOG_INFO;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static const char *const g_names[] = {"error", "warn", "info", "debug"};

static char g_path[PATH_MAX];

void zt_log_set_level(zt_log_level level) { g_level = level; }

int zt_log_open_file(const char *path) {
  if (strlen(path) >= sizeof g_path) return -ENAMETOOLONG;
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
  if (fd < 0) return -errno;
  /* under the lock: no line is cut between the two files */
  pthread_mutex_lock(&g_lock);
  int rc = dup2(fd, STDERR_FILENO) < 0 ? -errno : 0;
  pthread_mutex_unlock(&g_lock);
  close(fd);
  if (rc == 0 && path != g_path) memcpy(g_path, path, strlen(path) + 1);
  return rc;
}

int zt_log_reopen(void) { return g_path[0] ? zt_log_open_file(g_path) : 0; }

int zt_log_parse_level(const char *s, zt_log_level *out) {
  for (int i = 0; i <= ZT_LOG_DEBUG; i++) {
    if (strcmp(s, g_names[i]) == 0) {
      *out = (zt_log_level)i;
      return 0;
    }
  }
  return -EINVAL;
}

void zt_log(zt_log_level level, const char *subsystem, const char *fmt, ...) {
  if (level > g_level) return;
  struct timeval tv;
  gettimeofday(&tv, NULL);
  struct tm tm;
  gmtime_r(&tv.tv_sec, &tm);
  char line[1024];
  int n = snprintf(line, sizeof line, "%02d:%02d:%02d.%03d %-5s %-8s ", tm.tm_hour, tm.tm_min,
                   tm.tm_sec, (int)(tv.tv_usec / 1000), g_names[level], subsystem);
  va_list ap;
  va_start(ap, fmt);
  if (n > 0 && (size_t)n < sizeof line) vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&g_lock);
  fprintf(stderr, "%s\n", line);
  pthread_mutex_unlock(&g_lock);
}

int zt_check_fail(const char *sub, const char *file, int line, const char *call, int code,
                  const char *why, char *text, size_t textlen) {
  zt_log(ZT_LOG_ERROR, sub, "%s:%d: %s: %s", file, line, call, why);
  if (text && textlen) snprintf(text, textlen, "%s:%d: %s: %s", file, line, call, why);
  return code;
}
