/* Reading the fields of a JSON object (jansson) with errors that name the field by its full
 * path ("train.optimizer.lr must be a number in (0, 10]"). The job spec (engine/job/spec.c) and
 * the config reader (engine/train/config.c) read every field through these. Each returns 0 or
 * -EINVAL with the message in err. */
#ifndef ZT_BASE_JSON_FIELD_H
#define ZT_BASE_JSON_FIELD_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

/* "path.key", or "key" when path is "". */
void zt_json_field(char *out, size_t n, const char *path, const char *key);
/* Every key of obj must be in allowed (NULL-terminated): else "unknown field 'path.key'". */
int zt_json_check_keys(const json_t *obj, const char *path, const char *const *allowed,
                       char *err, size_t errlen);
/* *out = the member (an object), or NULL when absent and not required. */
int zt_json_get_object(const json_t *obj, const char *path, const char *key, int required,
                       const json_t **out, char *err, size_t errlen);
/* An integer in [min, max]; dflt when absent and not required. */
int zt_json_get_int(const json_t *obj, const char *path, const char *key, int required,
                    int64_t min, int64_t max, int64_t dflt, int64_t *out, char *err,
                    size_t errlen);
int zt_json_get_int32(const json_t *obj, const char *path, const char *key, int required,
                      int min, int max, int dflt, int *out, char *err, size_t errlen);
/* v a number in [lo, hi] (open ends where lo_open / hi_open), stored as a float: a value that
 * would round to 0 or overflow there is refused, not stored as 0 or inf. field names it. */
int zt_json_check_num(const json_t *v, const char *field, double lo, int lo_open, double hi,
                      int hi_open, float *out, char *err, size_t errlen);
/* The member as zt_json_check_num reads it; dflt when absent. */
int zt_json_get_num(const json_t *obj, const char *path, const char *key, double lo, int lo_open,
                    double hi, int hi_open, float dflt, float *out, char *err, size_t errlen);
/* A string without NUL bytes; dflt when absent (dflt NULL: required). The string is obj's. */
int zt_json_get_string(const json_t *obj, const char *path, const char *key, const char *dflt,
                       const char **out, char *err, size_t errlen);
/* A required absolute path shorter than outlen, copied into out. */
int zt_json_get_abs_path(const json_t *obj, const char *path, const char *key, char *out,
                         size_t outlen, char *err, size_t errlen);
/* true or false; dflt when absent. */
int zt_json_get_bool(const json_t *obj, const char *path, const char *key, int dflt, int *out,
                     char *err, size_t errlen);
/* A byte count: a non-negative integer or a size string (engine/base/sizes.h: "512MiB",
 * "55GB"); dflt when absent. */
int zt_json_get_size(const json_t *obj, const char *path, const char *key, uint64_t dflt,
                     uint64_t *out, char *err, size_t errlen);

#endif
