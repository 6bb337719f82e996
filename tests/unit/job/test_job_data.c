/* The file data source (engine/job/data.h): version 2 token files read and checked (a truncated
 * or inconsistent table, a token past the vocabulary: refused naming the file and the index),
 * the "documents" packing row by row (whole documents, a long one split at row ends with its
 * positions restarting, padding counted in nothing, epochs, the shuffle a permutation fixed by
 * the seed), and "windows" (version 1: the rows of the formula in docs/spec.md; version 2: a
 * target that does not count is -1); the held-out evaluation's rows (the unshuffled packing's
 * first rows, consecutive windows) from a cursor over calls. The files are written here byte by
 * byte, apart from the writers. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine/job/data.h"
#include "proto/zt_tokens.h"
#include "jobtest.h"

#define T 8

/* A version 2 file of docs (lens[d] tokens each, token i of the file = (i * 7 + 1) % 50, token i
 * counted unless i % 3 == 0 or it starts a document). */
static size_t write_v2(const char *path, const int *lens, int n_docs, uint32_t vocab,
                       uint8_t **out) {
  uint64_t n = 0;
  for (int d = 0; d < n_docs; d++) n += (uint64_t)lens[d];
  zt_tokens_header h = {.version = 2, .token_bytes = 2, .vocab = vocab, .n_tokens = n,
                        .n_docs = (uint64_t)n_docs};
  zt_tokens_layout l;
  CHECK(zt_tokens_layout_of(&h, &l) == 0);
  uint8_t *buf = calloc(1, l.size);
  CHECK(buf);
  zt_tokens_header_encode(buf, &h);
  uint64_t at = 0;
  for (int d = 0; d <= n_docs; d++) {
    zt__put_le64(buf + l.starts + 8 * (uint64_t)d, at);
    for (int i = 0; d < n_docs && i < lens[d]; i++, at++) {
      uint32_t tok = (uint32_t)((at * 7 + 1) % 50);
      buf[l.tokens + 2 * at] = (uint8_t)tok;
      if (i > 0 && at % 3 != 0) buf[l.mask + at / 8] |= (uint8_t)(1u << (at % 8));
    }
  }
  jt_write_file(path, buf, l.size);
  *out = buf;
  return l.size;
}

static int32_t tok_at(uint64_t i) { return (int32_t)((i * 7 + 1) % 50); }
static int counted_at(uint64_t i) { return i % 3 != 0; }

/* Row `row` of rows holds [len] tokens of the file from `first` at slot `at`, positions from 0;
 * its last slot's target is the next token when `more` (a fragment), else -1. */
static void check_run(const zt__rows *r, int row, int at, uint64_t first, int len, int more) {
  for (int i = 0; i < len; i++) {
    size_t s = (size_t)row * T + (size_t)(at + i);
    uint64_t t = first + (uint64_t)i;
    CHECK(r->inputs[s] == tok_at(t));
    CHECK(r->positions[s] == i);
    int has_next = i + 1 < len || more;
    CHECK(r->targets[s] == (has_next && counted_at(t + 1) ? tok_at(t + 1) : -1));
  }
}

static void check_pad(const zt__rows *r, int row, int from) {
  for (int i = from; i < T; i++) {
    size_t s = (size_t)row * T + (size_t)i;
    CHECK(r->inputs[s] == -1 && r->targets[s] == -1 && r->positions[s] == i - from);
  }
}

static void expect_refused(const char *path, const char *needle) {
  zt__token_file f;
  char err[1024] = "";
  int rc = zt__token_file_open(&f, "data.path", path, 0, NULL, err, sizeof err);
  if (rc != -EINVAL || !strstr(err, needle) || !strstr(err, path)) {
    fprintf(stderr, "%s: rc %d, '%s' lacks '%s'\n", path, rc, err, needle);
    exit(1);
  }
}

int main(void) {
  char dir[512], path[600], bad[600];
  jt_tempdir(dir, sizeof dir, "data");
  snprintf(path, sizeof path, "%s/docs.tok", dir);
  snprintf(bad, sizeof bad, "%s/bad.tok", dir);
  int lens[] = {3, 5, 12};
  uint8_t *file;
  size_t size = write_v2(path, lens, 3, 50, &file);

  zt__token_file f;
  char err[1024];
  CHECK(zt__token_file_open(&f, "data.path", path, 1, NULL, err, sizeof err) == 0);
  CHECK(f.version == 2 && f.n_tokens == 20 && f.n_docs == 3 && f.vocab == 50);
  CHECK(zt__token_file_doc_start(&f, 2) == 8 && zt__token_file_doc_start(&f, 3) == 20);

  /* documents: [doc0 doc1] [doc2's first 8] [doc2's last 4, padding], then epoch 1 again */
  int32_t buf[3 * 4 * T];
  zt__rows r = {buf, buf + 4 * T, buf + 2 * 4 * T};
  zt__packer p;
  CHECK(zt__packer_init(&p, &f, T, 7, 0, 0) == 0);
  CHECK(p.epoch == 0 && p.n_rows == 3);
  zt__packer_fill(&p, 1, 2, 2, &r); /* step 1: rows 0..3 */
  check_run(&r, 0, 0, 0, 3, 0);
  check_run(&r, 0, 3, 3, 5, 0);
  check_run(&r, 1, 0, 8, 8, 1);
  check_run(&r, 2, 0, 16, 4, 0);
  check_pad(&r, 2, 4);
  check_run(&r, 3, 0, 0, 3, 0);
  check_run(&r, 3, 3, 3, 5, 0);
  /* a step is a function of its number: step 2 after step 1 and on a new packer agree */
  int32_t again[3 * 4 * T];
  zt__rows r2 = {again, again + 4 * T, again + 2 * 4 * T};
  zt__packer_fill(&p, 2, 2, 2, &r);
  zt__packer q;
  CHECK(zt__packer_init(&q, &f, T, 7, 0, 0) == 0);
  zt__packer_fill(&q, 2, 2, 2, &r2);
  CHECK(memcmp(buf, again, sizeof buf) == 0);
  /* epoch 1 (rows 3..5): step 2's rows 4, 5 are doc2 split, then epoch 2's first */
  check_run(&r, 0, 0, 8, 8, 1);
  check_run(&r, 1, 0, 16, 4, 0);
  check_run(&r, 2, 0, 0, 3, 0);
  /* held-out rows (data.eval): the unshuffled packing's first rows, one cursor over calls,
   * after the last document the first again (row 3) */
  zt__eval_cursor cur = {0, 0, 0};
  zt__packer u;
  CHECK(zt__packer_init(&u, &f, T, 7, 0, 0) == 0);
  zt__packer_fill(&u, 1, 2, 2, &r2);
  zt__eval_rows(&f, 1, T, &cur, 1, &r);
  zt__rows rest = {buf + T, buf + 4 * T + T, buf + 2 * 4 * T + T};
  zt__eval_rows(&f, 1, T, &cur, 3, &rest);
  CHECK(memcmp(buf, again, sizeof buf) == 0);
  zt__packer_close(&u);
  zt__packer_close(&q);
  zt__packer_close(&p);
  zt__token_file_close(&f);

  /* shuffle: every epoch a permutation of the documents, the same for the same seed, another
   * order in some epoch */
  int many[40];
  for (int d = 0; d < 40; d++) many[d] = 1 + d % 5;
  uint8_t *mfile;
  free(file);
  write_v2(path, many, 40, 50, &mfile);
  CHECK(zt__token_file_open(&f, "data.path", path, 1, NULL, err, sizeof err) == 0);
  CHECK(zt__packer_init(&p, &f, T, 11, 1, 0) == 0);
  CHECK(zt__packer_init(&q, &f, T, 11, 1, 0) == 0);
  int moved = 0, differ = 0;
  uint64_t row0 = 0, first[40];
  for (uint64_t e = 0; e < 3; e++) {
    /* one row a step: step row0 + 1 is epoch e's first row */
    int32_t one[3 * T];
    zt__rows r1 = {one, one + T, one + 2 * T};
    zt__packer_fill(&p, (int)row0 + 1, 1, 1, &r1);
    zt__packer_fill(&q, (int)row0 + 1, 1, 1, &r1);
    CHECK(p.epoch == e && q.epoch == e);
    uint64_t seen[40] = {0};
    for (int d = 0; d < 40; d++) {
      CHECK(p.order[d] < 40 && p.order[d] == q.order[d]);
      seen[p.order[d]]++;
      moved += p.order[d] != (uint64_t)d;
      if (e == 0) first[d] = p.order[d];
      else differ += p.order[d] != first[d];
    }
    for (int d = 0; d < 40; d++) CHECK(seen[d] == 1);
    row0 += p.n_rows;
  }
  CHECK(differ > 0);
  CHECK(moved > 0);
  zt__packer_close(&q);
  zt__packer_close(&p);

  /* train.epochs 2: the rows of epochs 0 and 1 (counted without row tables), then padding; up
   * to there the rows of the packer without an end, each document's tokens there twice */
  uint64_t two = 0, one_epoch = 0;
  CHECK(zt__packer_rows(&f, T, 11, 1, 2, &two) == 0);
  CHECK(zt__packer_rows(&f, T, 11, 1, 1, &one_epoch) == 0);
  CHECK(zt__packer_init(&q, &f, T, 11, 1, 0) == 0);
  CHECK(q.n_rows == one_epoch && two > one_epoch && two < 2 * one_epoch + 2);
  uint64_t unshuffled = 0, unshuffled1 = 0;
  CHECK(zt__packer_rows(&f, T, 11, 0, 3, &unshuffled) == 0);
  CHECK(zt__packer_rows(&f, T, 11, 0, 1, &unshuffled1) == 0);
  CHECK(unshuffled == 3 * unshuffled1);
  CHECK(zt__packer_init(&p, &f, T, 11, 1, 2) == 0);
  {
    int32_t e2[3 * 3 * T], e0[3 * 3 * T];
    zt__rows re = {e2, e2 + 3 * T, e2 + 6 * T}, rn = {e0, e0 + 3 * T, e0 + 6 * T};
    uint64_t tokens = 0;
    int steps = (int)((two + 2) / 3); /* 3 rows a step, the last partial */
    for (int st = 1; st <= steps + 1; st++) {
      zt__packer_fill(&p, st, 1, 3, &re);
      zt__packer_fill(&q, st, 1, 3, &rn);
      for (uint64_t i = 0; i < 3; i++) {
        uint64_t row = (uint64_t)(st - 1) * 3 + i;
        if (row < two) {
          CHECK(memcmp(e2 + i * T, e0 + i * T, T * sizeof *e2) == 0);
          CHECK(memcmp(re.positions + i * T, rn.positions + i * T, T * sizeof *e2) == 0);
        } else {
          check_pad(&re, (int)i, 0);
        }
        for (int t = 0; t < T; t++) tokens += re.inputs[i * T + t] >= 0;
      }
    }
    CHECK(tokens == 2 * f.n_tokens);
  }
  zt__packer_close(&q);
  zt__packer_close(&p);

  /* windows' epoch: the rows the file's n_tokens - 1 targets fill; a step's rows from the end
   * on padding */
  CHECK(zt__token_file_epoch_rows(&f, T) == (f.n_tokens - 1) / T);
  {
    int32_t pw[3 * 4 * T];
    zt__rows rp = {pw, pw + 4 * T, pw + 8 * T};
    for (int i = 0; i < 3 * 4 * T; i++) pw[i] = 5;
    zt__rows_pad_from(6, 2, 2, 2, T, &rp); /* rows 4..7: 4 and 5 kept, 6 and 7 padding */
    for (int i = 0; i < 2 * T; i++)
      CHECK(rp.inputs[i] == 5 && rp.targets[i] == 5 && rp.positions[i] == 5);
    check_pad(&rp, 2, 0);
    check_pad(&rp, 3, 0);
    zt__rows_pad_from(100, 2, 2, 2, T, &rp);
    CHECK(rp.inputs[0] == 5);
  }

  /* windows on version 2: rows of the formula, a target that does not count -1 */
  int32_t w[3 * 2 * T];
  zt__rows rw = {w, w + 2 * T, w + 4 * T};
  zt__token_file_windows(&f, 5, 3, 1, 2, T, &rw);
  for (int b = 0; b < 2; b++) {
    uint64_t row = (2 * 1 + 0) * 2 + (uint64_t)b; /* ((step-1) * micros + m) * B + b */
    uint64_t start = zt__splitmix64(5 ^ (row * 0x9E3779B97F4A7C15ull)) % (f.n_tokens - T);
    for (int t = 0; t < T; t++) {
      uint64_t i = start + (uint64_t)t;
      CHECK(w[b * T + t] == tok_at(i) && w[4 * T + b * T + t] == t);
      int c = zt__token_file_counted(&f, i + 1);
      CHECK(w[2 * T + b * T + t] == (c ? tok_at(i + 1) : -1));
    }
  }
  zt__token_file_close(&f);
  free(mfile);

  /* version 1: one document, every token a target */
  snprintf(path, sizeof path, "%s/v1.tok", dir);
  jt_write_tokens(path, 32, 4, 100);
  CHECK(zt__token_file_open(&f, "data.path", path, 1, NULL, err, sizeof err) == 0);
  CHECK(f.version == 1 && f.n_docs == 1 && zt__token_file_counted(&f, 0));
  zt__token_file_windows(&f, 9, 1, 1, 2, T, &rw);
  for (int b = 0; b < 2; b++) {
    uint64_t start = zt__splitmix64(9 ^ ((uint64_t)b * 0x9E3779B97F4A7C15ull)) % (100 - T);
    for (int t = 0; t < T; t++)
      CHECK(w[b * T + t] == zt__token_file_token(&f, start + (uint64_t)t) &&
            w[2 * T + b * T + t] == zt__token_file_token(&f, start + (uint64_t)t + 1));
  }
  /* held-out windows: consecutive, row r from r * T % (N - T), one cursor over calls (rows
   * 0..13: row 12 wraps to 96 % 92 = 4) */
  zt__eval_cursor wc = {0, 0, 0};
  for (uint64_t row = 0; row < 13; row += 2) {
    zt__eval_rows(&f, 0, T, &wc, 2, &rw);
    for (uint64_t b = 0; b < 2; b++) {
      uint64_t start = (row + b) * T % (100 - T);
      for (int t = 0; t < T; t++)
        CHECK(w[b * T + t] == zt__token_file_token(&f, start + (uint64_t)t) &&
              w[2 * T + b * T + t] == zt__token_file_token(&f, start + (uint64_t)t + 1) &&
              w[4 * T + b * T + t] == t);
    }
  }
  zt__token_file_close(&f);

  /* pushed rows: a document starting at index 4 (its first token is no target of the one
   * before, its positions restart), token 6 not counted */
  int32_t pushed[T + 1], pr[3 * T];
  uint8_t marks[T + 1];
  for (int i = 0; i <= T; i++) {
    pushed[i] = 10 + i;
    marks[i] = ZT__MARK_COUNTED;
  }
  marks[4] |= ZT__MARK_START;
  marks[6] = 0;
  zt__rows rp = {pr, pr + T, pr + 2 * T};
  zt__rows_from_pushed(pushed, marks, 1, 1, T, &rp);
  static const int32_t want_y[T] = {11, 12, 13, -1, 15, -1, 17, 18};
  static const int32_t want_pos[T] = {0, 1, 2, 3, 0, 1, 2, 3};
  for (int j = 0; j < T; j++)
    CHECK(pr[j] == 10 + j && pr[T + j] == want_y[j] && pr[2 * T + j] == want_pos[j]);

  /* refusals, each naming the file */
  snprintf(path, sizeof path, "%s/docs.tok", dir);
  size = write_v2(path, lens, 3, 50, &file);
  jt_write_file(bad, file, size - 8);
  expect_refused(bad, "truncated or padded");
  uint8_t *copy = malloc(size);
  CHECK(copy);
  zt_tokens_layout l;
  zt_tokens_header h;
  CHECK(zt_tokens_header_decode(file, &h) == 0 && zt_tokens_header_decode_v2(file, &h) == 0);
  CHECK(zt_tokens_layout_of(&h, &l) == 0);
  memcpy(copy, file, size);
  zt__put_le64(copy + l.starts + 16, 2); /* document 2 starting before document 1 */
  jt_write_file(bad, copy, size);
  expect_refused(bad, "document table: entry 2");
  memcpy(copy, file, size);
  zt__put_le64(copy + l.starts + 24, 19); /* the last start is not the token count */
  jt_write_file(bad, copy, size);
  expect_refused(bad, "document table: entry 3");
  memcpy(copy, file, size);
  copy[l.tokens + 2 * 5] = 60; /* token 5 (document 1's third) past the vocabulary 50 */
  jt_write_file(bad, copy, size);
  expect_refused(bad, "document 1, token 2 (index 5 of the file) is not below the file's "
                      "vocabulary 50");
  memcpy(copy, file, size);
  zt__put_le64(copy + 32, 0); /* no document */
  jt_write_file(bad, copy, size);
  expect_refused(bad, "bad version 2 header");
  free(copy);
  free(file);
  jt_rmtree(dir);
  printf("job_data: ok\n");
  return 0;
}
