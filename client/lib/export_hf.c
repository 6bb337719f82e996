/* defines: zt_client_export_hf (client/include/zt/client.h): a job's Hugging Face export
 * downloaded into a directory, through export's listing request and then its chunked reads per
 * file (docs/protocol.md, "export"). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/lib/conn.h"

/* As the single-file export: a chunk when the daemon did not say its frame limit, and how often
 * an export replaced under the download (a new checkpoint, another client's export) starts it
 * over before giving up. */
#define CHUNK_DEFAULT (16u << 20)
#define MAX_RESTARTS 8
#define MAX_FILES 4096

typedef struct xfile {
  char name[256];
  uint64_t size;
} xfile;

/* A file name ztd may send: plain, in the directory, not hidden. */
static int plain(const char *s, size_t n) {
  if (n == 0 || n >= sizeof ((xfile *)0)->name || s[0] == '.') return 0;
  for (size_t i = 0; i < n; i++)
    if (s[i] == '/' || s[i] == '\0') return 0;
  return 1;
}

/* The listing: export's name, step, the files; the reply as JSON into *json (NULL: not kept). */
static int list(zt_client *c, const char *job, const char *dtype, uint64_t shard, char *xname,
                size_t xcap, xfile **files, int *n, char **json) {
  zt_out o;
  zt_msg reply;
  zt_out_init(&o);
  uint32_t id = zt__client_begin(c, &o, "export", shard ? 4 : 3);
  zt_out_kv_str(&o, "job", job);
  zt_out_kv_str(&o, "format", "hf");
  zt_out_kv_str(&o, "dtype", dtype);
  if (shard) zt_out_kv_u64(&o, "max_shard_size", shard);
  int rc = zt__client_call(c, &o, id, &reply);
  zt_out_close(&o);
  if (rc < 0) return rc;
  zt_proto_error perr = {0};
  const char *s;
  size_t len;
  const msgpack_object *arr = zt_msg_find(reply.root, "files");
  if (zt_msg_get_str(reply.root, NULL, "export", true, &s, &len, &perr) < 0 || len >= xcap ||
      !arr || arr->type != MSGPACK_OBJECT_ARRAY || arr->via.array.size > MAX_FILES) {
    rc = zt__client_fail(c, -EPROTO, "export reply from ztd lacks its export or files");
    goto out;
  }
  memcpy(xname, s, len);
  xname[len] = '\0';
  *n = (int)arr->via.array.size;
  if (!(*files = calloc((size_t)*n + 1, sizeof **files))) {
    rc = zt__client_fail(c, -ENOMEM, "out of memory");
    goto out;
  }
  for (int i = 0; i < *n; i++) {
    const msgpack_object *f = &arr->via.array.ptr[i];
    if (f->type != MSGPACK_OBJECT_MAP ||
        zt_msg_get_str(f, NULL, "name", true, &s, &len, &perr) < 0 || !plain(s, len) ||
        zt_msg_get_u64(f, NULL, "size", true, &(*files)[i].size, &perr) < 0) {
      rc = zt__client_fail(c, -EPROTO, "export reply from ztd: files[%d] is not a file", i);
      goto out;
    }
    memcpy((*files)[i].name, s, len);
  }
  if (json) rc = zt__client_to_json(c, reply.root, json);
out:
  zt_msg_close(&reply);
  return rc;
}

static int write_all(int fd, const uint8_t *buf, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, buf, len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -errno;
    buf += n;
    len -= (size_t)n;
  }
  return 0;
}

/* One file of the export into path (written whole, fsynced). 1: the export is gone or changed
 * under the download (ask for the list again). */
static int fetch(zt_client *c, const char *job, const char *xname, const xfile *f,
                 const char *path) {
  uint64_t chunk = c->server_max_frame > (8u << 10) ? c->server_max_frame - (4u << 10)
                                                    : CHUNK_DEFAULT;
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644), rc = 0;
  if (fd < 0) return zt__client_fail(c, -errno, "cannot create %s: %s", path, strerror(errno));
  uint64_t offset = 0;
  do {
    zt_out o;
    zt_msg reply;
    zt_out_init(&o);
    uint32_t id = zt__client_begin(c, &o, "export", 5);
    zt_out_kv_str(&o, "job", job);
    zt_out_kv_str(&o, "export", xname);
    zt_out_kv_str(&o, "file", f->name);
    zt_out_kv_u64(&o, "offset", offset);
    zt_out_kv_u64(&o, "length", chunk);
    rc = zt__client_call(c, &o, id, &reply);
    zt_out_close(&o);
    if (rc == -ESTALE) rc = 1;
    if (rc != 0) break;
    zt_proto_error perr;
    const uint8_t *data;
    size_t len;
    uint64_t total;
    if (zt_msg_get_bin(reply.root, NULL, "data", true, &data, &len, &perr) < 0 ||
        zt_msg_get_u64(reply.root, NULL, "total", true, &total, &perr) < 0) {
      rc = zt__client_fail(c, -EPROTO, "export reply from ztd: %s", perr.message);
    } else if (total != f->size) {
      rc = 1;  /* not the file listed: another export took its place */
    } else if (len == 0 && offset < total) {
      rc = zt__client_fail(c, -EPROTO, "ztd sent an empty chunk of %s at offset %llu of %llu",
                           f->name, (unsigned long long)offset, (unsigned long long)total);
    } else if ((rc = write_all(fd, data, len)) < 0) {
      rc = zt__client_fail(c, rc, "writing %s: %s", path, strerror(-rc));
    }
    zt_msg_close(&reply);
    offset += len;
  } while (rc == 0 && offset < f->size);
  if (rc == 0 && fsync(fd) < 0)
    rc = zt__client_fail(c, -errno, "fsync %s: %s", path, strerror(errno));
  if (close(fd) < 0 && rc == 0) rc = zt__client_fail(c, -errno, "%s: %s", path, strerror(errno));
  return rc;
}

/* A weights file save_pretrained would write: model.safetensors, its index, a shard. */
static int weights_name(const char *s) {
  unsigned a, b;
  char tail[16];
  return !strcmp(s, "model.safetensors") || !strcmp(s, "model.safetensors.index.json") ||
         (strlen(s) == 32 && sscanf(s, "model-%5u-of-%5u.%15s", &a, &b, tail) == 3 &&
          !strcmp(tail, "safetensors"));
}

/* The weights files of an earlier export in dir that this one did not write: a stale
 * model.safetensors beside a new index would be loaded instead of the index's shards. */
static int remove_stale(zt_client *c, const char *dir, const xfile *files, int n) {
  DIR *d = opendir(dir);
  if (!d) return zt__client_fail(c, -errno, "%s: %s", dir, strerror(errno));
  struct dirent *e;
  int rc = 0;
  while (rc == 0 && (e = readdir(d))) {
    if (!weights_name(e->d_name)) continue;
    int ours = 0;
    for (int i = 0; i < n && !ours; i++) ours = !strcmp(files[i].name, e->d_name);
    if (!ours && unlinkat(dirfd(d), e->d_name, 0) < 0)
      rc = zt__client_fail(c, -errno, "removing %s/%s: %s", dir, e->d_name, strerror(errno));
  }
  closedir(d);
  return rc;
}

static int fsync_dir(zt_client *c, const char *dir) {
  int rc = 0, fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || fsync(fd) < 0)
    rc = zt__client_fail(c, -errno, "fsync %s: %s", dir, strerror(errno));
  if (fd >= 0) close(fd);
  return rc;
}

int zt_client_export_hf(zt_client *c, const char *job, const char *dir, const char *dtype,
                        uint64_t max_shard_size, char **json_out) {
  char xname[128], *json = NULL;
  xfile *files = NULL;
  int n = 0, rc = 0, restarts = 0;
  size_t plen = strlen(dir) + sizeof files->name + 8;
  char *path = malloc(plen), *tmp = malloc(plen);
  if (json_out) *json_out = NULL;
  if (!path || !tmp) {
    rc = zt__client_fail(c, -ENOMEM, "out of memory");
    goto out;
  }
  struct stat st;
  if (mkdir(dir, 0755) < 0 && (errno != EEXIST || stat(dir, &st) < 0 || !S_ISDIR(st.st_mode))) {
    rc = zt__client_fail(c, errno == EEXIST ? -ENOTDIR : -errno, "cannot make directory %s: %s",
                         dir, errno == EEXIST ? "a file is there" : strerror(errno));
    goto out;
  }
  for (;;) {
    /* what an earlier listing's download left */
    for (int i = 0; i < n; i++) {
      snprintf(tmp, plen, "%s/%s.tmp", dir, files[i].name);
      unlink(tmp);
    }
    free(files);
    free(json);
    files = NULL;
    json = NULL;
    n = 0;
    if ((rc = list(c, job, dtype ? dtype : "bf16", max_shard_size, xname, sizeof xname, &files,
                   &n, json_out ? &json : NULL)) < 0)
      goto out;
    int i = 0;
    for (; i < n; i++) {
      snprintf(tmp, plen, "%s/%s.tmp", dir, files[i].name);
      if ((rc = fetch(c, job, xname, &files[i], tmp)) != 0) break;
    }
    if (rc < 0) goto out;
    if (i == n) break;
    if (++restarts > MAX_RESTARTS) {
      rc = zt__client_fail(c, -EAGAIN, "job %s's export was replaced %d times during the "
                           "download", job, MAX_RESTARTS);
      goto out;
    }
  }
  /* in the listing's order: config.json, last, makes the directory look complete */
  for (int i = 0; i < n; i++) {
    snprintf(tmp, plen, "%s/%s.tmp", dir, files[i].name);
    snprintf(path, plen, "%s/%s", dir, files[i].name);
    if (rename(tmp, path) < 0) {
      rc = zt__client_fail(c, -errno, "rename %s to %s: %s", tmp, path, strerror(errno));
      goto out;
    }
  }
  if ((rc = remove_stale(c, dir, files, n)) < 0 || (rc = fsync_dir(c, dir)) < 0) goto out;
  if (json_out) {
    *json_out = json;
    json = NULL;
  }
out:
  /* a download cut short leaves no half file behind */
  for (int i = 0; rc < 0 && tmp && i < n; i++) {
    snprintf(tmp, plen, "%s/%s.tmp", dir, files[i].name);
    unlink(tmp);
  }
  free(files);
  free(json);
  free(path);
  free(tmp);
  return rc;
}
