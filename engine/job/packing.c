/* The "documents" packing of a token file (engine/job/data.h): an epoch's document order and
 * the rows it makes, rebuilt when a step reaches another epoch; and the held-out evaluation's
 * rows, in the file's order from its start. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/job/data.h"

/* One row of T slots of file f from document k of the order (NULL: the file's) at offset off:
 * written into (x, y, pos) when they are not NULL; advances k and off to where the next row
 * starts. */
static void pack_row(const zt__token_file *f, const uint64_t *order, int T, uint64_t *k,
                     uint64_t *off, int32_t *x, int32_t *y, int32_t *pos) {
  int at = 0;
  while (at < T && *k < f->n_docs) {
    uint64_t d = order ? order[*k] : *k, s = zt__token_file_doc_start(f, d) + *off,
             e = zt__token_file_doc_start(f, d + 1), len = e - s;
    uint64_t take = len;
    if (len > (uint64_t)(T - at)) {
      if (at > 0) break; /* it starts the next row */
      take = (uint64_t)T;
    }
    for (uint64_t i = 0; x && i < take; i++) {
      uint64_t t = s + i;
      x[at + i] = zt__token_file_token(f, t);
      y[at + i] = t + 1 < e && zt__token_file_counted(f, t + 1) ? zt__token_file_token(f, t + 1)
                                                                 : -1;
      pos[at + i] = (int32_t)i;
    }
    at += (int)take;
    if (take == len) {
      (*k)++;
      *off = 0;
    } else {
      *off += take;
    }
  }
  /* padding is a document of its own, so it is attended by nothing real */
  for (int i = at; x && i < T; i++) {
    x[i] = y[i] = -1;
    pos[i] = i - at;
  }
}

/* Epoch e's order: Fisher-Yates driven by splitmix64 of (seed, epoch, i). */
static void order_epoch(zt__packer *p, uint64_t e) {
  uint64_t n = p->f->n_docs;
  for (uint64_t i = 0; i < n; i++) p->order[i] = i;
  if (!p->shuffle) return;
  uint64_t key = zt__splitmix64(p->seed ^ ((e + 1) * 0xD1B54A32D192ED03ull));
  for (uint64_t i = n - 1; i > 0; i--) {
    uint64_t j = zt__splitmix64(key ^ (i * 0x9E3779B97F4A7C15ull)) % (i + 1), t = p->order[i];
    p->order[i] = p->order[j];
    p->order[j] = t;
  }
}

/* Epoch e's order and its rows (where each starts: without row tables only their count). */
static void build_epoch(zt__packer *p, uint64_t e) {
  order_epoch(p, e);
  uint64_t k = 0, off = 0;
  p->n_rows = 0;
  while (k < p->f->n_docs) {
    if (p->row_k) {
      p->row_k[p->n_rows] = k;
      p->row_off[p->n_rows] = off;
    }
    p->n_rows++;
    pack_row(p->f, p->order, p->T, &k, &off, NULL, NULL, NULL);
  }
  p->epoch = e;
}

int zt__packer_rows(const zt__token_file *f, int T, uint64_t seed, int shuffle, int epochs,
                    uint64_t *rows) {
  zt__packer p = {.f = f, .T = T, .seed = seed, .shuffle = shuffle};
  /* unshuffled, every epoch is the file's order: one packing counts them all */
  int packed = shuffle ? epochs : 1;
  *rows = 0;
  if (!(p.order = malloc(f->n_docs * sizeof *p.order))) return -ENOMEM;
  for (int e = 0; e < packed; e++) {
    build_epoch(&p, (uint64_t)e);
    *rows += p.n_rows;
  }
  *rows *= (uint64_t)(epochs / packed);
  free(p.order);
  return 0;
}

/* a row holds a document's start, or T tokens of one, or the short end of a split one */
static uint64_t cap_rows(uint64_t n_docs, uint64_t n_tokens, int T) {
  return 2 * n_docs + n_tokens / (uint64_t)T + 1;
}

size_t zt__packer_bytes(uint64_t n_docs, uint64_t n_tokens, int T) {
  return (size_t)(n_docs + 2 * cap_rows(n_docs, n_tokens, T)) * sizeof(uint64_t);
}

int zt__packer_init(zt__packer *p, const zt__token_file *f, int T, uint64_t seed, int shuffle,
                    int epochs) {
  memset(p, 0, sizeof *p);
  p->f = f;
  p->T = T;
  p->seed = seed;
  p->shuffle = shuffle;
  p->epochs = epochs;
  p->cap_rows = cap_rows(f->n_docs, f->n_tokens, T);
  p->order = malloc(f->n_docs * sizeof *p->order);
  p->row_k = malloc(p->cap_rows * sizeof *p->row_k);
  p->row_off = malloc(p->cap_rows * sizeof *p->row_off);
  if (!p->order || !p->row_k || !p->row_off) {
    zt__packer_close(p);
    return -ENOMEM;
  }
  build_epoch(p, 0);
  return 0;
}

void zt__packer_close(zt__packer *p) {
  free(p->order);
  free(p->row_k);
  free(p->row_off);
  memset(p, 0, sizeof *p);
}

/* Holds the epoch of row r; returns r's index within it, or UINT64_MAX for a row past the
 * last of p->epochs epochs. */
static uint64_t seek_row(zt__packer *p, uint64_t r) {
  if (r < p->epoch_row0) {
    p->epoch_row0 = 0;
    build_epoch(p, 0);
  }
  while (r >= p->epoch_row0 + p->n_rows) {
    if (p->epochs && p->epoch + 1 >= (uint64_t)p->epochs) return UINT64_MAX;
    p->epoch_row0 += p->n_rows;
    build_epoch(p, p->epoch + 1);
  }
  return r - p->epoch_row0;
}

void zt__packer_fill(zt__packer *p, int step, int micros, int B, const zt__rows *out) {
  size_t T = (size_t)p->T;
  uint64_t r0 = (uint64_t)(step - 1) * (uint64_t)micros * (uint64_t)B;
  for (uint64_t i = 0; i < (uint64_t)micros * (uint64_t)B; i++) {
    uint64_t at = seek_row(p, r0 + i);
    /* past the end: from the order's end, which packs nothing but padding */
    uint64_t k = at == UINT64_MAX ? p->f->n_docs : p->row_k[at];
    uint64_t off = at == UINT64_MAX ? 0 : p->row_off[at];
    pack_row(p->f, p->order, p->T, &k, &off, out->inputs + i * T, out->targets + i * T,
             out->positions + i * T);
  }
}

void zt__eval_rows(const zt__token_file *f, int documents, int T, zt__eval_cursor *c,
                   size_t n_rows, const zt__rows *out) {
  uint64_t span = f->n_tokens - (uint64_t)T;
  for (size_t i = 0; i < n_rows; i++) {
    int32_t *x = out->inputs + i * (size_t)T, *y = out->targets + i * (size_t)T,
            *pos = out->positions + i * (size_t)T;
    if (documents) {
      /* past the last document: the file again, as an unshuffled packing's epochs follow */
      if (c->k >= f->n_docs) c->k = c->off = 0;
      pack_row(f, NULL, T, &c->k, &c->off, x, y, pos);
      continue;
    }
    uint64_t start = c->row++ * (uint64_t)T % span;
    for (int t = 0; t < T; t++) {
      uint64_t j = start + (uint64_t)t;
      x[t] = zt__token_file_token(f, j);
      y[t] = zt__token_file_counted(f, j + 1) ? zt__token_file_token(f, j + 1) : -1;
      pos[t] = t;
    }
  }
}
