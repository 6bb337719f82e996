/* defines: a checkpoint's checksums (internal.h: both layouts record and check them) and
 * zt_checkpoint_verify (trainer.h; called by ztd's job layer before it resumes a job or serves
 * an export).
 *
 * Every tensor of every file of a checkpoint is summed as it is written (the writer's bytes,
 * engine/base/checksum.h); trainer.json or manifest.json records the sums under "checksums":
 * {file: {tensor: 16 hex digits}} with "checksum": the algorithm. A load sums each tensor as it
 * reads it and refuses one that differs, naming the file and the tensor; a checkpoint written
 * before the sums were recorded loads with a warning. The safetensors files themselves are the
 * same bytes as without the sums. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/base/checksum.h"
#include "engine/base/log.h"
#include "engine/model/safetensors.h"
#include "engine/train/checkpoint/internal.h"

json_t *zt__ckpt_sums_of_writer(const zt_model_writer *w, const zt_model *m,
                                const char *const *suffix, int n) {
  json_t *o = json_object();
  for (int k = 0; o && k < n; k++)
    for (int i = 0; i < zt_model_num_tensors(m); i++) {
      char name[160], hex[ZT_CHECKSUM_HEX];
      snprintf(name, sizeof name, "%s%s", zt_model_tensor(m, i)->name, suffix[k]);
      zt_checksum_hex(zt_model_writer_sum(w, k, i), hex);
      if (json_object_set_new(o, name, json_string(hex)) < 0) {
        json_decref(o);
        return NULL;
      }
    }
  return o;
}

int zt__ckpt_sums_add(json_t *head, const char *file, json_t *sums) {
  json_t *all = json_object_get(head, "checksums");
  if (!sums) return -ENOMEM;
  if (!all) {
    if (json_object_set_new(head, "checksum", json_string(ZT_CHECKSUM_NAME)) < 0 ||
        json_object_set_new(head, "checksums", all = json_object()) < 0 || !all) {
      json_decref(sums);
      return -ENOMEM;
    }
  }
  return json_object_set_new(all, file, sums) < 0 ? -ENOMEM : 0;
}

int zt__ckpt_sums_file(const json_t *head, const char *path, const char *file,
                       const json_t **sums, char *err, size_t errlen) {
  const json_t *all = json_object_get(head, "checksums");
  const char *algo = json_string_value(json_object_get(head, "checksum"));
  *sums = NULL;
  if (!all) return 0;
  if (!json_is_object(all) || !algo || strcmp(algo, ZT_CHECKSUM_NAME) ||
      !json_is_object(*sums = json_object_get(all, file))) {
    *sums = NULL;
    snprintf(err, errlen, "%s: no %s checksums of %s in its checksums", path, ZT_CHECKSUM_NAME,
             file);
    return -EINVAL;
  }
  return 0;
}

int zt__ckpt_sums_check(const json_t *sums, const char *path, const char *tensor, uint64_t got,
                        char *err, size_t errlen) {
  uint64_t want;
  if (!sums) return 0;
  if (zt_checksum_parse(json_string_value(json_object_get(sums, tensor)), &want) < 0) {
    snprintf(err, errlen, "%s: tensor %s has no checksum in the checkpoint's record", path,
             tensor);
    return -EBADMSG;
  }
  if (want != got) {
    snprintf(err, errlen, "%s: tensor %s: checksum mismatch: its data is not what was written "
             "(the file is corrupt)", path, tensor);
    return -EBADMSG;
  }
  return 0;
}

void zt__ckpt_sums_missing(const char *dir) {
  ZT_LOGW("checkpoint", "%s has no checksums (written before zt recorded them): loaded "
          "unverified", dir);
}

/* The checkpoint's record of its files: the manifest of a per-rank one, else trainer.json. */
static json_t *head_of(const char *dir, char *path, size_t pathlen, char *err, size_t errlen) {
  json_error_t je;
  snprintf(path, pathlen, "%s/" MANIFEST, dir);
  if (access(path, F_OK) != 0) snprintf(path, pathlen, "%s/trainer.json", dir);
  json_t *j = json_load_file(path, 0, &je);
  if (!j || !json_is_object(j)) {
    json_decref(j);
    snprintf(err, errlen, "%s: missing, or not a JSON object", path);
    return NULL;
  }
  return j;
}

/* One file of the checkpoint against its sums: every tensor summed, none missing or extra. */
static int verify_file(const char *dir, const char *file, const json_t *sums, char *err,
                       size_t errlen) {
  char *path = NULL;
  zt_st_file *f = NULL;
  int rc = 0;
  if (strchr(file, '/') || file[0] == '.' || asprintf(&path, "%s/%s", dir, file) < 0) {
    path = NULL;
    snprintf(err, errlen, "%s: checksums of \"%s\", which is not a file of the checkpoint", dir,
             file);
    return -EINVAL;
  }
  if ((rc = zt_st_open(&f, path, err, errlen)) < 0) goto out;
  if ((size_t)zt_st_count(f) != json_object_size(sums)) {
    rc = -EBADMSG;
    snprintf(err, errlen, "%s: holds %d tensors, its checksums name %zu", path, zt_st_count(f),
             json_object_size(sums));
    goto out;
  }
  for (int i = 0; i < zt_st_count(f) && rc == 0; i++) {
    const zt_st_tensor *t = zt_st_tensor_at(f, i);
    uint64_t got;
    if ((rc = zt_st_sum(f, t, &got, err, errlen)) == 0)
      rc = zt__ckpt_sums_check(sums, path, t->name, got, err, errlen);
  }
out:
  zt_st_close(f);
  free(path);
  return rc;
}

int zt_checkpoint_verify(const char *dir, const char *only, char *err, size_t errlen) {
  char path[4200];
  json_t *j = head_of(dir, path, sizeof path, err, errlen);
  if (!j) return -EINVAL;
  const json_t *all = json_object_get(j, "checksums"), *sums;
  int rc = 1;
  if (all) {
    const char *file;
    json_t *v;
    rc = 0;
    if (only) {
      if ((rc = zt__ckpt_sums_file(j, path, only, &sums, err, errlen)) == 0)
        rc = verify_file(dir, only, sums, err, errlen);
    } else {
      json_object_foreach((json_t *)all, file, v) {
        if ((rc = zt__ckpt_sums_file(j, path, file, &sums, err, errlen)) < 0 ||
            (rc = verify_file(dir, file, sums, err, errlen)) < 0)
          break;
      }
    }
  }
  json_decref(j);
  return rc;
}
