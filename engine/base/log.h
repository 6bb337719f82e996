/* One logging call for the whole daemon: level, subsystem, printf format. Thread-safe; lines go
 * to stderr (and the job log where a runner adds one). */
#ifndef ZT_LOG_H
#define ZT_LOG_H

typedef enum zt_log_level {
  ZT_LOG_ERROR = 0,
  ZT_LOG_WARN = 1,
  ZT_LOG_INFO = 2,
  ZT_LOG_DEBUG = 3,
} zt_log_level;

void zt_log_set_level(zt_log_level level);
/* "error" | "warn" | "info" | "debug" -> 0, else -EINVAL */
int zt_log_parse_level(const char *s, zt_log_level *out);
void zt_log(zt_log_level level, const char *subsystem, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define ZT_LOGE(sub, ...) zt_log(ZT_LOG_ERROR, sub, __VA_ARGS__)
#define ZT_LOGW(sub, ...) zt_log(ZT_LOG_WARN, sub, __VA_ARGS__)
#define ZT_LOGI(sub, ...) zt_log(ZT_LOG_INFO, sub, __VA_ARGS__)
#define ZT_LOGD(sub, ...) zt_log(ZT_LOG_DEBUG, sub, __VA_ARGS__)

#endif
