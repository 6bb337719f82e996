/* defines: the probe of a data-parallel part's checkpoint (internal.h; dir.c and per_rank.c ask
 * it) and zt__ckpt_probe_sees (shard_io.h; every part's ranks answer it,
 * engine/train/dp/parts.c).
 *
 * A data-parallel part (dp.h, "Parts") runs only some of its world's ranks. The part holding
 * rank 0 saves and loads; every other part follows in zt_trainer_dp_send_state /
 * _receive_state. Its checkpoints are per rank where every part sees the checkpoint's directory
 * (a filesystem the daemons share at the same path): the save first puts a marker file of a
 * random token (PROBE_FILE) into DIR.tmp and asks the path to probe (zt__train_path.probe),
 * whose collective has every rank check its own view of the path for the token
 * (zt__ckpt_probe_sees); a load's marker is the manifest itself, the token a digest of its bytes.
 * Where all see it, every part's ranks write (read) their own files (per_rank.c), the other
 * parts' through zt__rank_files_open, and the path exchanges their results and the files'
 * sizes for the manifest; the rank-0 part writes the manifest and model.safetensors and swaps
 * DIR.tmp into place only after that verdict. Where some do not, the state goes through the
 * flat layout, gathered into (scattered from) the rank-0 part's files. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "engine/train/checkpoint/internal.h"

/* A part's save: the marker of the probe in its temporary directory (zt__ckpt_probe_parts) */
#define PROBE_FILE "probe"
#define PROBE_TOKEN_LEN 64

/* A load's probe token: the manifest's FNV-1a digest (64 bits) and length, so that a part
 * sees the checkpoint when its view of the path holds a manifest of the same bytes (the same
 * checkpoint: the manifest names every rank's file and size). 0 or -errno. */
static int manifest_token(const char *file, char *token, size_t len) {
  FILE *f = fopen(file, "rbe");
  if (!f) return -errno;
  uint64_t h = 14695981039346656037ull;
  long long n = 0;
  unsigned char buf[16384];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
    for (size_t i = 0; i < got; i++) h = (h ^ buf[i]) * 1099511628211ull;
    n += (long long)got;
  }
  int rc = ferror(f) ? -EIO : 0;
  fclose(f);
  snprintf(token, len, "manifest %016llx %lld", (unsigned long long)h, n);
  return rc;
}

int zt__ckpt_probe_sees(const char *dir, int save, const char *token) {
  char *file = NULL, got[PROBE_TOKEN_LEN];
  int sees = 0;
  if (asprintf(&file, "%s/%s", dir, save ? PROBE_FILE : MANIFEST) < 0) return 0;
  if (save) {
    FILE *f = fopen(file, "rbe");
    size_t n = f ? fread(got, 1, sizeof got - 1, f) : 0;
    got[n] = 0;
    /* and can write its ranks' files there (daemons of other users see a directory they
     * cannot write: the flat layout then, rather than a failed checkpoint) */
    sees = f && n == strlen(token) && !memcmp(got, token, n) && access(dir, W_OK) == 0;
    if (f) fclose(f);
  } else {
    sees = manifest_token(file, got, sizeof got) == 0 && !strcmp(got, token);
  }
  free(file);
  return sees;
}

/* A part holding rank 0 asks every part whether it sees dir as this process does (the path's
 * probe): a save's dir is its temporary directory, given a marker file of a random token for
 * the probe's time; a load's holds the manifest `file`. 1 or 0; a negative errno before the
 * probe (nothing asked: the caller tells the other parts, zt__ckpt_seq_end) or from it
 * (q->failed). */
int zt__ckpt_probe_parts(zt_trainer *t, const char *dir, int save, const char *file, state_seq *q,
                         char *err, size_t errlen) {
  char token[PROBE_TOKEN_LEN], *marker = NULL;
  int rc = 0;
  if (save) {
    unsigned char rnd[16];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
      rc = -errno;
      snprintf(err, errlen, "%s: drawing the probe's random token: %s", dir, strerror(errno));
      return rc;
    }
    for (size_t i = 0; i < sizeof rnd; i++) sprintf(token + 2 * i, "%02x", rnd[i]);
    if (asprintf(&marker, "%s/" PROBE_FILE, dir) < 0) {
      snprintf(err, errlen, "%s: out of memory", dir);
      return -ENOMEM;
    }
    errno = 0;
    int fd = open(marker, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    size_t n = strlen(token);
    if (fd < 0 || write(fd, token, n) != (ssize_t)n) rc = errno ? -errno : -EIO;
    if (fd >= 0 && close(fd) < 0 && rc == 0) rc = -errno;
    if (rc < 0) snprintf(err, errlen, "%s: %s", marker, strerror(-rc));
  } else if ((rc = manifest_token(file, token, sizeof token)) < 0) {
    snprintf(err, errlen, "%s: %s", file, strerror(-rc));
  }
  if (rc == 0 && (rc = t->path->probe(t, dir, save, token, err, errlen)) < 0) q->failed = 1;
  if (marker) {
    unlink(marker);
    free(marker);
  }
  return rc;
}
