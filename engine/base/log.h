/* One logging call for the whole daemon: level, subsystem, printf format. Thread-safe; lines go
 * to stderr (and the job log where a runner adds one), which zt_log_open_file can point at a
 * file (ztd --log-file) and zt_log_reopen open again (SIGHUP, after a rotation). */
#ifndef ZT_LOG_H
#define ZT_LOG_H

typedef enum zt_log_level {
  ZT_LOG_ERROR = 0,
  ZT_LOG_WARN = 1,
  ZT_LOG_INFO = 2,
  ZT_LOG_DEBUG = 3,
} zt_log_level;

void zt_log_set_level(zt_log_level level);
/* Appends stderr to path from now on (created 0640; so do the libraries' own messages). 0 or
 * -errno. */
int zt_log_open_file(const char *path);
/* Opens the file of zt_log_open_file again (a rotation moved it away): 0, or -errno with the
 * old file kept; 0 without a file. */
int zt_log_reopen(void);
/* "error" | "warn" | "info" | "debug" -> 0, else -EINVAL */
int zt_log_parse_level(const char *s, zt_log_level *out);
void zt_log(zt_log_level level, const char *subsystem, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define ZT_LOGE(sub, ...) zt_log(ZT_LOG_ERROR, sub, __VA_ARGS__)
#define ZT_LOGW(sub, ...) zt_log(ZT_LOG_WARN, sub, __VA_ARGS__)
#define ZT_LOGI(sub, ...) zt_log(ZT_LOG_INFO, sub, __VA_ARGS__)
#define ZT_LOGD(sub, ...) zt_log(ZT_LOG_DEBUG, sub, __VA_ARGS__)

#endif
