/* Checkpoints carry a checksum of every tensor of every file (train/checkpoint/sums.c), in both
 * layouts: a plain trainer's flat checkpoint (trainer.json) and a W 2 data-parallel trainer's
 * per-rank one (manifest.json). For each, the record names every file and zt_checkpoint_verify
 * passes; 16 bytes flipped in a tensor's data of a file make zt_checkpoint_verify and
 * zt_trainer_load fail (-EBADMSG) naming the file, a tensor and the word checksum (the per-rank
 * file read by its own rank, and re-sharded into a plain trainer); the same checkpoint with the
 * record's checksums removed (as written before them) verifies as "none" (1) and loads, and the
 * restored file loads again. */
#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/train/trainer.h"
#include "tests/unit/dp/dptest.h"
#include "tests/unit/model/mcheck.h"

/* Flips 16 bytes of path's data section at `at` bytes into it (XOR 0xff; twice restores). */
static int flip(const char *path, long at) {
  FILE *f = fopen(path, "r+b");
  uint8_t len8[8], b[16];
  uint64_t hlen = 0;
  if (!f || fread(len8, 1, 8, f) != 8) return -1;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len8[i];
  long off = (long)(8 + hlen) + at;
  int rc = fseek(f, off, SEEK_SET) == 0 && fread(b, 1, 16, f) == 16 ? 0 : -1;
  for (int i = 0; i < 16; i++) b[i] ^= 0xff;
  if (rc == 0) rc = fseek(f, off, SEEK_SET) == 0 && fwrite(b, 1, 16, f) == 16 ? 0 : -1;
  fclose(f);
  return rc;
}

/* The record's copy without "checksum" and "checksums" written to `record` (its original kept
 * in `saved`, malloc'd JSON text), or it put back. */
static char *strip_sums(const char *record) {
  json_error_t je;
  json_t *j = json_load_file(record, 0, &je);
  char *saved = j ? json_dumps(j, JSON_PRESERVE_ORDER) : NULL;
  if (j) {
    json_object_del(j, "checksum");
    json_object_del(j, "checksums");
    json_dump_file(j, record, JSON_PRESERVE_ORDER);
  }
  json_decref(j);
  return saved;
}

static void put_back(const char *record, char *saved) {
  FILE *f = fopen(record, "w");
  if (f) {
    fputs(saved, f);
    fclose(f);
  }
  free(saved);
}

static int expect_bad(int rc, const char *err, const char *file, const char *what) {
  return MC_EXPECT(rc == -EBADMSG && strstr(err, file) && strstr(err, "tensor ") &&
                       strstr(err, "checksum"),
                   "%s: rc %d \"%s\": want -EBADMSG naming %s, a tensor and checksum", what, rc,
                   err, file);
}

/* The checkpoint dir (its record `record`, one of its files `file`) against a fresh trainer
 * from open(): verified, refused when the file is corrupt, accepted without sums. */
static int check_dir(const char *dir, const char *record, const char *file,
                     zt_trainer *(*open)(void *), void (*close)(zt_trainer *, void *),
                     void *arg, const char *what) {
  char err[1024] = "", path[1024], rec[1024];
  int fails = 0;
  snprintf(path, sizeof path, "%s/%s", dir, file);
  snprintf(rec, sizeof rec, "%s/%s", dir, record);
  json_error_t je;
  json_t *j = json_load_file(rec, 0, &je);
  fails += MC_EXPECT(j && !strcmp(json_string_value(json_object_get(j, "checksum")) ?: "", "xxh3-64") &&
                         json_object_get(json_object_get(j, "checksums"), file),
                     "%s: %s records no checksums of %s", what, record, file);
  json_decref(j);
  fails += MC_EXPECT(zt_checkpoint_verify(dir, NULL, err, sizeof err) == 0, "%s: verify: %s",
                     what, err);
  zt_trainer *t = open(arg);
  fails += MC_EXPECT(zt_trainer_load(t, dir, err, sizeof err) == 0, "%s: load: %s", what, err);
  close(t, arg);

  fails += MC_EXPECT(flip(path, 4) == 0, "%s: flip %s", what, path);
  fails += expect_bad(zt_checkpoint_verify(dir, NULL, err, sizeof err), err, file, what);
  fails += expect_bad(zt_checkpoint_verify(dir, file, err, sizeof err), err, file, what);
  t = open(arg);
  fails += expect_bad(zt_trainer_load(t, dir, err, sizeof err), err, file, what);
  close(t, arg);

  /* as written before the sums: nothing to check, a warning */
  char *saved = strip_sums(rec);
  fails += MC_EXPECT(saved && zt_checkpoint_verify(dir, NULL, err, sizeof err) == 1,
                     "%s: without checksums verify is not 1: %s", what, err);
  t = open(arg);
  fails += MC_EXPECT(zt_trainer_load(t, dir, err, sizeof err) == 0,
                     "%s: load without checksums: %s", what, err);
  close(t, arg);
  if (saved) put_back(rec, saved);
  fails += MC_EXPECT(flip(path, 4) == 0, "%s: flip back", what);
  t = open(arg);
  fails += MC_EXPECT(zt_trainer_load(t, dir, err, sizeof err) == 0, "%s: restored: %s", what,
                     err);
  close(t, arg);
  return fails;
}

typedef struct opener {
  zt_model_cfg mc;
  zt_train_cfg tc;
  zt_backend be;
  dpt_ranks x;
  int W;
} opener;

static zt_trainer *open_plain(void *arg) {
  opener *o = arg;
  if (zt_backend_cpu_open(&o->be, 1) < 0) exit(1);
  return dpt_open_plain(&o->mc, &o->tc, &o->be);
}

static void close_plain(zt_trainer *t, void *arg) {
  zt_trainer_close(t);
  zt_backend_cpu_close(&((opener *)arg)->be);
}

static zt_trainer *open_dp(void *arg) {
  opener *o = arg;
  zt_dp_cfg dc = {.world = o->W, .zero_stage = 1};
  dpt_ranks_open(&o->x, o->W);
  return dpt_open_dp_cfg(&o->mc, &o->tc, &o->x, &dc);
}

static void close_dp(zt_trainer *t, void *arg) {
  zt_trainer_close(t);
  dpt_ranks_close(&((opener *)arg)->x);
}

int main(void) {
  int fails = 0;
  char err[1024], flat[600], ranked[600];
  const char *dir = mc_tmpdir();
  snprintf(flat, sizeof flat, "%s/flat", dir);
  snprintf(ranked, sizeof ranked, "%s/ranked", dir);
  opener o = {.mc = dpt_model_cfg(ZT_ARCH_GPT), .W = 2};
  int32_t *tok = dpt_tokens(&o.mc, 2, 5);
  size_t per = dpt_step_tokens(&o.mc, 2);
  dpt_run run;

  /* flat: a plain trainer after one step of two micro-batches */
  o.tc = dpt_train_cfg(2, 1.0f, ZT_F32);
  zt_trainer *t = open_plain(&o);
  fails += dpt_run_steps(t, tok, per, 0, 1, &run, "plain");
  fails += MC_EXPECT(zt_trainer_save(t, flat, err, sizeof err) == 0, "plain save: %s", err);
  close_plain(t, &o);
  fails += check_dir(flat, "trainer.json", "model.safetensors", open_plain, close_plain, &o, "flat model");
  fails += check_dir(flat, "trainer.json", "optimizer.safetensors", open_plain, close_plain, &o,
                     "flat optimizer");

  /* per-rank: W 2, each rank one micro-batch a step */
  o.tc = dpt_train_cfg(1, 1.0f, ZT_F32);
  t = open_dp(&o);
  fails += dpt_run_steps(t, tok, per, 0, 1, &run, "W 2");
  fails += MC_EXPECT(zt_trainer_save(t, ranked, err, sizeof err) == 0, "W 2 save: %s", err);
  close_dp(t, &o);
  fails += check_dir(ranked, "manifest.json", "rank-1.safetensors", open_dp, close_dp, &o,
                     "per-rank rank 1");
  /* re-sharded into a plain trainer: the ranks' files read a piece at a time */
  o.tc = dpt_train_cfg(2, 1.0f, ZT_F32);
  fails += check_dir(ranked, "manifest.json", "rank-0.safetensors", open_plain, close_plain, &o,
                     "per-rank into plain");
  fails += MC_EXPECT(zt_checkpoint_verify(ranked, "model.safetensors", err, sizeof err) == 0,
                     "per-rank model.safetensors: %s", err);

  free(tok);
  mc_rmtree(dir);
  if (fails) fprintf(stderr, "%d failure(s)\n", fails);
  return fails ? 1 : 0;
}
