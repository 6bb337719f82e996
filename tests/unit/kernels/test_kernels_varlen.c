/* Attention and learned positions over packed documents (ops.h, "Documents") on the CPU
 * reference:
 * - the backward against central finite differences of the forward with several documents a
 *   row (lengths 1, 2, 3, 5, a row that starts with the tail of a document), causal and
 *   bidirectional, multi-head and grouped-query; the embedding's dwte and dwpe likewise;
 * - positions 0..T-1 in every row give the bits of positions NULL (forward, saved state,
 *   backward);
 * - each document of a packed row gives, bit for bit, the outputs and input gradients it gives
 *   alone in a row of its own (its sums run over the same keys in the same order);
 * - positions outside [0, t] read nothing outside the row (the sanitizers watch) and give
 *   finite outputs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/ops.h"
#include "tests/unit/kernels/kcheck.h"

#define FD_STEP 1e-2
#define FD_ATOL 5e-4
#define FD_RTOL 5e-3
#define T 13

static zt_backend be;
static kc_rng rng;

/* Two rows of T tokens: row 0 holds documents of 3, 1, 5, 2 and 2 tokens; row 1 the last 4
 * tokens of a document split at the previous row's end (its positions restart at 0, as the
 * packer writes them), then one of 9. */
static const int row_docs[2][6] = {{3, 1, 5, 2, 2, 0}, {4, 9, 0}};

static void fill_positions(int32_t *pos) {
  for (int b = 0; b < 2; b++) {
    int t = 0;
    for (int d = 0; row_docs[b][d]; d++)
      for (int j = 0; j < row_docs[b][d]; j++) pos[b * T + t++] = j;
  }
}

static double dot_r(const float *out, const float *r, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; i++) s += (double)out[i] * r[i];
  return s;
}

static int same_bits(const char *what, const void *a, const void *b, size_t bytes) {
  return KC_EXPECT(!memcmp(a, b, bytes), "%s: bits differ", what);
}

typedef double (*loss_fn)(void *c);

static int check_fd(const char *what, loss_fn loss, void *c, float *x, size_t n,
                    const float *g, const float *g0) {
  double *fd = malloc(n * sizeof(double));
  float *an = kc_floats(n);
  for (size_t i = 0; i < n; i++) {
    float orig = x[i], h = (float)(FD_STEP * fmax(1.0, fabs(orig)));
    float xp = orig + h, xm = orig - h;
    x[i] = xp;
    double lp = loss(c);
    x[i] = xm;
    double lm = loss(c);
    x[i] = orig;
    fd[i] = (lp - lm) / ((double)xp - (double)xm);
    an[i] = g[i] - g0[i];
  }
  int fail = kc_close(what, an, fd, n, FD_ATOL, FD_RTOL);
  free(fd), free(an);
  return fail;
}

/* ---- attention ------------------------------------------------------------------------------ */
typedef struct att_case {
  int B, NH, NKV, hs, causal;
  const int32_t *pos;
  float *qkv, *out, *r;
  void *saved;
} att_case;

static size_t qkv_n(const att_case *c, int tokens) {
  return (size_t)tokens * (c->NH + 2 * c->NKV) * c->hs;
}
static size_t out_n(const att_case *c, int tokens) { return (size_t)tokens * c->NH * c->hs; }

static double att_loss(void *p) {
  att_case *c = p;
  be.ops->attention_fwd(be.ctx, c->out, c->saved, c->qkv, c->B, T, c->NH, c->NKV, c->hs,
                        c->causal, c->pos);
  return dot_r(c->out, c->r, out_n(c, c->B * T));
}

static int test_attention_fd(int NH, int NKV, int hs, int causal, const int32_t *pos) {
  att_case c = {.B = 2, .NH = NH, .NKV = NKV, .hs = hs, .causal = causal, .pos = pos};
  size_t nq = qkv_n(&c, 2 * T), no = out_n(&c, 2 * T);
  c.qkv = kc_random(&rng, nq, -1.5f, 1.5f);
  c.out = kc_floats(no);
  c.r = kc_random(&rng, no, -1, 1);
  c.saved = kc_floats(be.ops->attention_saved_bytes(2, T, NH, NKV, hs) / sizeof(float));
  att_loss(&c);
  float *g = kc_random(&rng, nq, -1, 1), *g0 = kc_copy(g, nq);
  be.ops->attention_bwd(be.ctx, g, c.r, c.qkv, c.saved, 2, T, NH, NKV, hs, causal, pos);
  char what[96];
  snprintf(what, sizeof what, "documents: attention NH=%d NKV=%d hs=%d causal=%d dqkv", NH,
           NKV, hs, causal);
  int fail = check_fd(what, att_loss, &c, c.qkv, nq, g, g0);
  free(c.qkv), free(c.out), free(c.r), free(c.saved), free(g), free(g0);
  return fail;
}

/* Forward and backward of qkv (B rows of T) into out, saved, dqkv (dqkv from zero). */
static void att_run(const att_case *c, const float *qkv, const float *dout, const int32_t *pos,
                    int B, int Tr, float *out, void *saved, float *dqkv) {
  memset(dqkv, 0, qkv_n(c, B * Tr) * sizeof(float));
  be.ops->attention_fwd(be.ctx, out, saved, qkv, B, Tr, c->NH, c->NKV, c->hs, c->causal, pos);
  be.ops->attention_bwd(be.ctx, dqkv, dout, qkv, saved, B, Tr, c->NH, c->NKV, c->hs, c->causal,
                        pos);
}

static int test_attention_bits(int NH, int NKV, int hs, int causal, const int32_t *pos) {
  att_case c = {.NH = NH, .NKV = NKV, .hs = hs, .causal = causal};
  size_t nq = qkv_n(&c, 2 * T), no = out_n(&c, 2 * T);
  size_t sb = be.ops->attention_saved_bytes(2, T, NH, NKV, hs);
  float *qkv = kc_random(&rng, nq, -1.5f, 1.5f), *dout = kc_random(&rng, no, -1, 1);
  float *o1 = kc_floats(no), *o2 = kc_floats(no), *d1 = kc_floats(nq), *d2 = kc_floats(nq);
  void *s1 = kc_floats(sb / sizeof(float)), *s2 = kc_floats(sb / sizeof(float));
  int32_t ident[2 * T];
  for (int i = 0; i < 2 * T; i++) ident[i] = i % T;
  char what[128];
  int fail = 0;

  att_run(&c, qkv, dout, NULL, 2, T, o1, s1, d1);
  att_run(&c, qkv, dout, ident, 2, T, o2, s2, d2);
  snprintf(what, sizeof what, "NH=%d NKV=%d causal=%d: positions 0..T-1 vs NULL", NH, NKV,
           causal);
  fail |= same_bits(what, o1, o2, no * sizeof(float));
  fail |= same_bits(what, s1, s2, sb);
  fail |= same_bits(what, d1, d2, nq * sizeof(float));

  /* each document alone in a row of its own length, against its slice of the packed rows */
  att_run(&c, qkv, dout, pos, 2, T, o1, s1, d1);
  for (int b = 0; b < 2; b++) {
    int t0 = 0;
    for (int d = 0; row_docs[b][d]; t0 += row_docs[b][d], d++) {
      int len = row_docs[b][d];
      size_t q0 = qkv_n(&c, b * T + t0), oo = out_n(&c, b * T + t0);
      size_t sa = be.ops->attention_saved_bytes(1, len, NH, NKV, hs);
      float *so = kc_floats(sa / sizeof(float) + 1), *oa = kc_floats(out_n(&c, len));
      float *da = kc_floats(qkv_n(&c, len));
      att_run(&c, qkv + q0, dout + oo, NULL, 1, len, oa, so, da);
      snprintf(what, sizeof what, "NH=%d NKV=%d causal=%d: row %d document %d (%d tokens) alone",
               NH, NKV, causal, b, d, len);
      fail |= same_bits(what, o1 + oo, oa, out_n(&c, len) * sizeof(float));
      fail |= same_bits(what, d1 + q0, da, qkv_n(&c, len) * sizeof(float));
      free(so), free(oa), free(da);
    }
  }
  free(qkv), free(dout), free(o1), free(o2), free(d1), free(d2), free(s1), free(s2);
  return fail;
}

/* Positions no packer writes (negative, past the token, a document's counting broken) stay
 * inside the row: the sanitizers would report a read outside it; the outputs stay finite. */
static int test_attention_malformed(void) {
  att_case c = {.NH = 2, .NKV = 1, .hs = 4};
  size_t nq = qkv_n(&c, 2 * T), no = out_n(&c, 2 * T);
  size_t sb = be.ops->attention_saved_bytes(2, T, 2, 1, 4);
  float *qkv = kc_random(&rng, nq, -1, 1), *dout = kc_random(&rng, no, -1, 1);
  float *o = kc_floats(no), *d = kc_floats(nq);
  void *s = kc_floats(sb / sizeof(float));
  int32_t bad[2 * T];
  for (int i = 0; i < 2 * T; i++) bad[i] = i % 3 ? -7 + i : 1000 * i;
  int fail = 0;
  for (c.causal = 0; c.causal < 2; c.causal++) {
    att_run(&c, qkv, dout, bad, 2, T, o, s, d);
    int finite = 1;
    for (size_t i = 0; i < no; i++) finite &= isfinite(o[i]) != 0;
    for (size_t i = 0; i < nq; i++) finite &= isfinite(d[i]) != 0;
    fail |= KC_EXPECT(finite, "malformed positions (causal %d): non-finite output", c.causal);
  }
  free(qkv), free(dout), free(o), free(d), free(s);
  return fail;
}

/* ---- embedding ------------------------------------------------------------------------------ */
typedef struct emb_case {
  int B, C, V;
  int32_t *tok;
  const int32_t *pos;
  float *wte, *wpe, *out, *r;
} emb_case;

static double emb_loss(void *p) {
  emb_case *c = p;
  be.ops->embedding_fwd(be.ctx, c->out, c->tok, c->wte, c->wpe, c->B, T, c->C, c->pos);
  return dot_r(c->out, c->r, (size_t)c->B * T * c->C);
}

static int test_embedding(const int32_t *pos) {
  emb_case c = {.B = 2, .C = 5, .V = 4, .pos = pos};
  size_t nout = (size_t)c.B * T * c.C, nte = (size_t)c.V * c.C, npe = (size_t)T * c.C;
  int32_t tok[2 * T];
  for (int i = 0; i < 2 * T; i++) tok[i] = kc_int(&rng, c.V);
  c.tok = tok;
  c.wte = kc_random(&rng, nte, -1, 1);
  c.wpe = kc_random(&rng, npe, -1, 1);
  c.out = kc_floats(nout);
  c.r = kc_random(&rng, nout, -1, 1);
  float *gte = kc_random(&rng, nte, -1, 1), *gte0 = kc_copy(gte, nte);
  float *gpe = kc_random(&rng, npe, -1, 1), *gpe0 = kc_copy(gpe, npe);
  be.ops->embedding_bwd(be.ctx, gte, gpe, c.r, c.tok, c.B, T, c.C, pos);
  int fail = check_fd("documents: embedding dwte", emb_loss, &c, c.wte, nte, gte, gte0);
  fail |= check_fd("documents: embedding dwpe", emb_loss, &c, c.wpe, npe, gpe, gpe0);

  /* the forward reads wpe row pos[t]: each token's output, computed by hand */
  emb_loss(&c);
  for (int i = 0; i < 2 * T && !fail; i++)
    for (int k = 0; k < c.C; k++)
      fail |= KC_EXPECT(c.out[(size_t)i * c.C + k] ==
                            c.wte[(size_t)tok[i] * c.C + k] + c.wpe[(size_t)pos[i] * c.C + k],
                        "embedding token %d channel %d: not wte[tok] + wpe[pos]", i, k);

  /* positions 0..T-1 against NULL, forward and backward */
  int32_t ident[2 * T];
  for (int i = 0; i < 2 * T; i++) ident[i] = i % T;
  float *o1 = kc_floats(nout), *o2 = kc_floats(nout);
  float *p1 = kc_copy(gpe0, npe), *p2 = kc_copy(gpe0, npe);
  float *e1 = kc_copy(gte0, nte), *e2 = kc_copy(gte0, nte);
  be.ops->embedding_fwd(be.ctx, o1, tok, c.wte, c.wpe, 2, T, c.C, NULL);
  be.ops->embedding_fwd(be.ctx, o2, tok, c.wte, c.wpe, 2, T, c.C, ident);
  be.ops->embedding_bwd(be.ctx, e1, p1, c.r, tok, 2, T, c.C, NULL);
  be.ops->embedding_bwd(be.ctx, e2, p2, c.r, tok, 2, T, c.C, ident);
  fail |= same_bits("embedding positions 0..T-1 vs NULL: out", o1, o2, nout * sizeof(float));
  fail |= same_bits("embedding positions 0..T-1 vs NULL: dwpe", p1, p2, npe * sizeof(float));
  fail |= same_bits("embedding positions 0..T-1 vs NULL: dwte", e1, e2, nte * sizeof(float));
  free(c.wte), free(c.wpe), free(c.out), free(c.r), free(gte), free(gte0), free(gpe);
  free(gpe0), free(o1), free(o2), free(p1), free(p2), free(e1), free(e2);
  return fail;
}

int main(void) {
  if (zt_backend_cpu_open(&be, 0) < 0) return 1;
  kc_seed(&rng, 20261202);
  int32_t pos[2 * T];
  fill_positions(pos);
  int fail = 0;
  for (int causal = 0; causal < 2; causal++) {
    fail |= test_attention_fd(2, 2, 3, causal, pos);
    fail |= test_attention_fd(4, 2, 3, causal, pos);
    fail |= test_attention_bits(2, 2, 3, causal, pos);
    fail |= test_attention_bits(6, 2, 9, causal, pos); /* groups of 3, an odd head size */
  }
  fail |= test_attention_malformed();
  fail |= test_embedding(pos);
  zt_backend_cpu_close(&be);
  if (!fail) printf("all document checks passed\n");
  return fail;
}
