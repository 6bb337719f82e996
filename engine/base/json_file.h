/* defines: a JSON file replaced atomically (temp file, fsync, rename, fsync of the directory),
 * so a reader sees the old file or the new one, never a part. Called by engine/job's store
 * (spec.json, status.json, plan.json) and engine/plan/rates.c (rates.json, ztd --calibrate). */
#ifndef ZT_BASE_JSON_FILE_H
#define ZT_BASE_JSON_FILE_H

#include <stddef.h>
#include <jansson.h>

/* dir/name replaced by j (indented, keys sorted) through dir/.name.tmp: 0, or -errno with
 * err naming the file (dir/name) or the directory. */
int zt_json_write_file(const char *dir, const char *name, const json_t *j, char *err,
                       size_t errlen);
/* fsync of a directory (a rename in it made durable): 0 or -errno. */
int zt_fsync_dir(const char *dir);

#endif
