/* Packed documents through the whole model (gpt, the encoder, the llama variants), with fp32
 * and with bf16 activations: a document's loss and parameter gradients when packed in a row
 * between two other documents (their targets not counted) equal, bit for bit, those of the
 * document alone at the start of a row padded with a document of ignored targets. On the CPU backend every sum the
 * document's values enter runs over the same values in the same order wherever it sits (the
 * matmuls sum down the rows in order, attention over the document's keys in order, the other
 * tokens contribute exact zeros), so no tolerance is needed. Also: every row's positions
 * default to 0..T-1 (zt_acts_open) and give the bits of positions staged as 0..T-1. */
#include <stdlib.h>
#include <string.h>

#include "engine/model/arch.h"
#include "tests/unit/model/mcheck.h"

#define T 16
#define DOC 6 /* the document compared; packed after 4 tokens of another, then 6 of a third */
#define AT 4

typedef struct result {
  double loss;
  int counted;
  float *g;
} result;

/* One forward and backward of one row on the CPU backend from parameters p, activations (and
 * the matmuls' compute copy of p) of type dt. */
static int run(const zt_model *m, zt_dtype dt, const float *p, const int32_t *tok,
               const int32_t *tgt, const int32_t *pos, result *r) {
  char err[256];
  zt_backend be = mc_backend();
  const zt_ops *o = be.ops;
  zt_acts *a = NULL;
  size_t n = zt_model_num_params(m);
  if (zt_acts_open_dt(&a, m, &be, 1, 0, dt, err, sizeof err) < 0) {
    fprintf(stderr, "FAIL acts: %s\n", err);
    return 1;
  }
  float *dp = o->alloc(be.ctx, n * sizeof(float)), *dg = o->alloc(be.ctx, n * sizeof(float));
  void *lp = o->alloc(be.ctx, n * zt_dtype_size(dt));
  o->to_device(be.ctx, dp, p, n * sizeof(float));
  o->cast(be.ctx, lp, dt, dp, ZT_F32, n);
  o->zero(be.ctx, dg, n * sizeof(float));
  o->to_device(be.ctx, zt_acts_tokens(a), tok, T * sizeof *tok);
  o->to_device(be.ctx, zt_acts_targets(a), tgt, T * sizeof *tgt);
  if (pos) o->to_device(be.ctx, zt_acts_positions(a), pos, T * sizeof *pos);
  zt_model_forward_dt(m, a, dp, lp);
  zt_model_loss(m, a, 1.0f);
  zt_model_backward_dt(m, a, dp, lp, dg);
  int fail = MC_EXPECT(zt_acts_loss(a, &r->loss, &r->counted) == 0, "no loss");
  r->g = malloc(n * sizeof(float));
  o->to_host(be.ctx, r->g, dg, n * sizeof(float));
  o->free(be.ctx, dp);
  o->free(be.ctx, dg);
  o->free(be.ctx, lp);
  zt_acts_close(a);
  zt_backend_cpu_close(&be);
  return fail;
}

static int same(const zt_model *m, const char *what, const result *x, const result *y) {
  int fail = MC_EXPECT(x->counted == y->counted && !memcmp(&x->loss, &y->loss, sizeof x->loss),
                       "%s: loss %.17g over %d vs %.17g over %d", what, x->loss, x->counted,
                       y->loss, y->counted);
  for (int i = 0; i < zt_model_num_tensors(m); i++) {
    const zt_tensor_info *t = zt_model_tensor(m, i);
    size_t k = 0;
    while (k < t->numel && !memcmp(&x->g[t->offset + k], &y->g[t->offset + k], sizeof(float)))
      k++;
    fail |= MC_EXPECT(k == t->numel, "%s: gradient of %s differs at %zu (%.9g vs %.9g)", what,
                      t->name, k, x->g[t->offset + k], y->g[t->offset + k]);
  }
  return fail;
}

static int check(zt_model_cfg cfg, const char *arch, zt_dtype dt) {
  char err[256], what[96];
  snprintf(what, sizeof what, "%s %s", arch, zt_dtype_name(dt));
  zt_model *m = NULL;
  cfg.seq_len = T;
  if (zt_model_create(&m, &cfg, err, sizeof err) < 0) {
    fprintf(stderr, "FAIL create %s: %s\n", what, err);
    return 1;
  }
  size_t n = zt_model_num_params(m);
  float *p = malloc(n * sizeof *p);
  uint64_t s = 7 + (uint64_t)cfg.arch;
  for (size_t i = 0; i < n; i++) p[i] = (float)mc_uniform(&s, -0.5, 0.5);

  /* the document: its tokens, and its own next tokens as targets (the last has none) */
  int32_t doc[DOC], packed[T], alone[T], tgt_p[T], tgt_a[T], pos_p[T], pos_a[T];
  mc_tokens(&s, doc, DOC, cfg.vocab);
  mc_tokens(&s, packed, T, cfg.vocab);
  for (int i = 0; i < T; i++) {
    tgt_p[i] = tgt_a[i] = -1;
    alone[i] = 0;
    pos_p[i] = i < AT ? i : i < AT + DOC ? i - AT : i - AT - DOC;
    pos_a[i] = i < DOC ? i : i - DOC;
  }
  for (int i = 0; i < DOC; i++) {
    packed[AT + i] = alone[i] = doc[i];
    tgt_p[AT + i] = tgt_a[i] = i + 1 < DOC ? doc[i + 1] : -1;
  }
  result rp, ra, rd, ri;
  int fail = run(m, dt, p, packed, tgt_p, pos_p, &rp);
  fail |= run(m, dt, p, alone, tgt_a, pos_a, &ra);
  fail |= MC_EXPECT(rp.counted == DOC - 1, "%s: %d targets counted", what, rp.counted);
  char w[160];
  snprintf(w, sizeof w, "%s: the document packed vs alone", what);
  fail |= same(m, w, &rp, &ra);

  /* the defaults are one document a row, 0..T-1, as staged by hand */
  int32_t ident[T];
  for (int i = 0; i < T; i++) ident[i] = i;
  fail |= run(m, dt, p, packed, tgt_p, NULL, &rd);
  fail |= run(m, dt, p, packed, tgt_p, ident, &ri);
  snprintf(w, sizeof w, "%s: default positions vs 0..T-1", what);
  fail |= same(m, w, &rd, &ri);
  /* and the packing matters: one document a row lets the others' tokens in */
  fail |= MC_EXPECT(memcmp(&rd.loss, &rp.loss, sizeof rd.loss) != 0,
                    "%s: the same loss with and without document boundaries", what);
  if (!fail) printf("%s: packed = alone, bitwise (loss %.9g)\n", what, rp.loss / rp.counted);
  free(rp.g), free(ra.g), free(rd.g), free(ri.g), free(p);
  zt_model_destroy(m);
  return fail;
}

int main(void) {
  zt_model_cfg v[MC_LLAMA_VARIANTS];
  const char *name[MC_LLAMA_VARIANTS];
  int nv = mc_llama_variants(v, name), fail = 0;
  for (int k = 0; k < 2; k++) {
    zt_dtype dt = k ? ZT_BF16 : ZT_F32;
    fail |= check(mc_tiny(ZT_ARCH_GPT), "gpt", dt);
    fail |= check(mc_tiny(ZT_ARCH_ENCODER), "encoder", dt);
    for (int i = 0; i < nv; i++) fail |= check(v[i], name[i], dt);
  }
  return fail;
}
