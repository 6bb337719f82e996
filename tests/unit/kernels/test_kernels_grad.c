/* Every backward op of the CPU backend against central finite differences of its forward.
 *
 * For an op with output out, L = sum(out * R) for a fixed random R, evaluated in double from the
 * fp32 outputs, so dL/dout = R is what the backward receives. Each input element x is moved to
 * x +- h and (L+ - L-) / (x+ - x-) is compared with the analytic gradient. Gradient buffers
 * start from random values and the analytic gradient is (after - before), which also checks
 * that backward ops add into their outputs. Shapes are small and deliberately awkward (no
 * multiple of any tile size). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/ops.h"
#include "tests/unit/kernels/kcheck.h"

/* Relative step: large enough that fp32 rounding of L (~1e-7 relative) divided by 2h stays far
 * below the tolerance, small enough that the h^2 truncation term does too. */
#define FD_STEP 1e-2
#define FD_ATOL 5e-4
#define FD_RTOL 5e-3

static zt_backend be;
static kc_rng rng;

static double dot_r(const float *out, const float *r, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; i++)
    s += (double)out[i] * r[i];
  return s;
}

typedef double (*loss_fn)(void *c);

/* Finite-difference gradient of loss(c) with respect to x[0..n), compared with `analytic`. */
static int check_fd(const char *what, loss_fn loss, void *c, float *x, size_t n,
                    const float *analytic) {
  double *fd = malloc((n ? n : 1) * sizeof(double));
  if (!fd)
    return 1;
  for (size_t i = 0; i < n; i++) {
    float orig = x[i];
    float h = (float)(FD_STEP * fmax(1.0, fabs(orig)));
    float xp = orig + h, xm = orig - h;
    x[i] = xp;
    double lp = loss(c);
    x[i] = xm;
    double lm = loss(c);
    x[i] = orig;
    fd[i] = (lp - lm) / ((double)xp - (double)xm);
  }
  int fail = kc_close(what, analytic, fd, n, FD_ATOL, FD_RTOL);
  free(fd);
  return fail;
}

/* Gradient buffer helpers: start from random values, read back the added part. */
static float *grad_start(size_t n) { return kc_random(&rng, n, -1, 1); }
static float *grad_added(const float *after, const float *before, size_t n) {
  float *d = kc_floats(n);
  for (size_t i = 0; i < n; i++)
    d[i] = after[i] - before[i];
  return d;
}

/* Runs check_fd on one input whose backward result is in g (after) vs g0 (before). */
static int check_input(const char *what, loss_fn loss, void *c, float *x, const float *g,
                       const float *g0, size_t n) {
  float *d = grad_added(g, g0, n);
  int fail = check_fd(what, loss, c, x, n, d);
  free(d);
  return fail;
}

/* ---- embedding ------------------------------------------------------------------------- */
typedef struct emb_case {
  int B, T, C, V;
  int32_t *tok;
  float *wte, *wpe, *out, *r;
} emb_case;

static double emb_loss(void *p) {
  emb_case *c = p;
  be.ops->embedding_fwd(be.ctx, c->out, c->tok, c->wte, c->wpe, c->B, c->T, c->C, NULL);
  return dot_r(c->out, c->r, (size_t)c->B * c->T * c->C);
}

static int test_embedding(int with_wpe) {
  emb_case c = {.B = 3, .T = 5, .C = 7, .V = 4};
  size_t nout = (size_t)c.B * c.T * c.C;
  c.tok = malloc(sizeof(int32_t) * c.B * c.T);
  for (int i = 0; i < c.B * c.T; i++)
    c.tok[i] = kc_int(&rng, c.V); /* 15 positions over 4 tokens: repeats guaranteed */
  c.wte = kc_random(&rng, (size_t)c.V * c.C, -1, 1);
  c.wpe = with_wpe ? kc_random(&rng, (size_t)c.T * c.C, -1, 1) : NULL;
  c.out = kc_floats(nout);
  c.r = kc_random(&rng, nout, -1, 1);
  float *dwte = grad_start((size_t)c.V * c.C), *dwte0 = kc_copy(dwte, (size_t)c.V * c.C);
  float *dwpe = with_wpe ? grad_start((size_t)c.T * c.C) : NULL;
  float *dwpe0 = with_wpe ? kc_copy(dwpe, (size_t)c.T * c.C) : NULL;
  be.ops->embedding_bwd(be.ctx, dwte, dwpe, c.r, c.tok, c.B, c.T, c.C, NULL);
  int fail = check_input(with_wpe ? "embedding dwte (wpe)" : "embedding dwte (no wpe)",
                         emb_loss, &c, c.wte, dwte, dwte0, (size_t)c.V * c.C);
  if (with_wpe)
    fail |= check_input("embedding dwpe", emb_loss, &c, c.wpe, dwpe, dwpe0, (size_t)c.T * c.C);
  free(c.tok), free(c.wte), free(c.wpe), free(c.out), free(c.r);
  free(dwte), free(dwte0), free(dwpe), free(dwpe0);
  return fail;
}

/* ---- matmul ----------------------------------------------------------------------------- */
typedef struct mm_case {
  int N, C, OC;
  float *inp, *w, *bias, *out, *r;
} mm_case;

static double mm_loss(void *p) {
  mm_case *c = p;
  be.ops->matmul_fwd(be.ctx, c->out, c->inp, c->w, c->bias, c->N, c->C, c->OC);
  return dot_r(c->out, c->r, (size_t)c->N * c->OC);
}

static int test_matmul(int N, int C, int OC, int with_bias) {
  mm_case c = {.N = N, .C = C, .OC = OC};
  size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
  c.inp = kc_random(&rng, ni, -1, 1);
  c.w = kc_random(&rng, nw, -1, 1);
  c.bias = with_bias ? kc_random(&rng, OC, -1, 1) : NULL;
  c.out = kc_floats(no);
  c.r = kc_random(&rng, no, -1, 1);
  float *dinp = grad_start(ni), *dinp0 = kc_copy(dinp, ni);
  float *dw = grad_start(nw), *dw0 = kc_copy(dw, nw);
  float *db = with_bias ? grad_start(OC) : NULL, *db0 = with_bias ? kc_copy(db, OC) : NULL;
  be.ops->matmul_bwd(be.ctx, dinp, dw, db, c.r, c.inp, c.w, N, C, OC);
  char what[96];
  snprintf(what, sizeof(what), "matmul N=%d C=%d OC=%d bias=%d dinp", N, C, OC, with_bias);
  int fail = check_input(what, mm_loss, &c, c.inp, dinp, dinp0, ni);
  snprintf(what, sizeof(what), "matmul N=%d C=%d OC=%d bias=%d dw", N, C, OC, with_bias);
  fail |= check_input(what, mm_loss, &c, c.w, dw, dw0, nw);
  if (with_bias) {
    snprintf(what, sizeof(what), "matmul N=%d C=%d OC=%d dbias", N, C, OC);
    fail |= check_input(what, mm_loss, &c, c.bias, db, db0, OC);
  }
  free(c.inp), free(c.w), free(c.bias), free(c.out), free(c.r);
  free(dinp), free(dinp0), free(dw), free(dw0), free(db), free(db0);
  return fail;
}

/* ---- layernorm -------------------------------------------------------------------------- */
typedef struct ln_case {
  int N, C;
  float *inp, *w, *b, *out, *mean, *rstd, *r;
} ln_case;

static double ln_loss(void *p) {
  ln_case *c = p;
  be.ops->layernorm_fwd(be.ctx, c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C);
  return dot_r(c->out, c->r, (size_t)c->N * c->C);
}

static int test_layernorm(void) {
  ln_case c = {.N = 5, .C = 13};
  size_t n = (size_t)c.N * c.C;
  c.inp = kc_random(&rng, n, -2, 2);
  c.w = kc_random(&rng, c.C, 0.5f, 1.5f);
  c.b = kc_random(&rng, c.C, -1, 1);
  c.out = kc_floats(n), c.mean = kc_floats(c.N), c.rstd = kc_floats(c.N);
  c.r = kc_random(&rng, n, -1, 1);
  ln_loss(&c); /* mean and rstd for the backward */
  float *dinp = grad_start(n), *dinp0 = kc_copy(dinp, n);
  float *dw = grad_start(c.C), *dw0 = kc_copy(dw, c.C);
  float *db = grad_start(c.C), *db0 = kc_copy(db, c.C);
  be.ops->layernorm_bwd(be.ctx, dinp, dw, db, c.r, c.inp, c.w, c.mean, c.rstd, c.N, c.C);
  int fail = check_input("layernorm dinp", ln_loss, &c, c.inp, dinp, dinp0, n);
  fail |= check_input("layernorm dw", ln_loss, &c, c.w, dw, dw0, c.C);
  fail |= check_input("layernorm db", ln_loss, &c, c.b, db, db0, c.C);
  free(c.inp), free(c.w), free(c.b), free(c.out), free(c.mean), free(c.rstd), free(c.r);
  free(dinp), free(dinp0), free(dw), free(dw0), free(db), free(db0);
  return fail;
}

/* ---- attention -------------------------------------------------------------------------- */
typedef struct att_case {
  int B, T, NH, NKV, hs, causal;
  float *qkv, *out, *r;
  void *saved;
} att_case;

static double att_loss(void *p) {
  att_case *c = p;
  be.ops->attention_fwd(be.ctx, c->out, c->saved, c->qkv, c->B, c->T, c->NH, c->NKV, c->hs,
                        c->causal, NULL);
  return dot_r(c->out, c->r, (size_t)c->B * c->T * c->NH * c->hs);
}

static int test_attention(int NH, int NKV, int hs, int causal) {
  /* T = 11: not a power of two and past the 8-key blocks of the dot products. */
  att_case c = {.B = 2, .T = 11, .NH = NH, .NKV = NKV, .hs = hs, .causal = causal};
  size_t nqkv = (size_t)c.B * c.T * (NH + 2 * NKV) * hs, nout = (size_t)c.B * c.T * NH * hs;
  c.qkv = kc_random(&rng, nqkv, -1.5f, 1.5f);
  c.out = kc_floats(nout);
  c.r = kc_random(&rng, nout, -1, 1);
  c.saved = kc_floats(be.ops->attention_saved_bytes(c.B, c.T, NH, NKV, hs) / sizeof(float));
  att_loss(&c);
  float *dqkv = grad_start(nqkv), *dqkv0 = kc_copy(dqkv, nqkv);
  be.ops->attention_bwd(be.ctx, dqkv, c.r, c.qkv, c.saved, c.B, c.T, NH, NKV, hs, causal, NULL);
  char what[96];
  snprintf(what, sizeof what, "attention NH=%d NKV=%d hs=%d causal=%d dqkv", NH, NKV, hs, causal);
  int fail = check_input(what, att_loss, &c, c.qkv, dqkv, dqkv0, nqkv);
  free(c.qkv), free(c.out), free(c.r), free(c.saved), free(dqkv), free(dqkv0);
  return fail;
}

/* ---- rmsnorm ---------------------------------------------------------------------------- */
typedef struct rms_case {
  int N, H, C;
  ptrdiff_t stride;
  float *inp, *w, *out, *rstd, *r;
} rms_case;

/* The loss reads only the normalised values: the gaps between heads of out stay 0. */
static double rms_loss(void *p) {
  rms_case *c = p;
  be.ops->rmsnorm_fwd(be.ctx, c->out, c->rstd, c->inp, c->w, c->N, c->H, c->C, c->stride,
                      1e-5f);
  return dot_r(c->out, c->r, (size_t)c->N * c->stride);
}

static int test_rmsnorm(int N, int H, int C, ptrdiff_t stride) {
  rms_case c = {.N = N, .H = H, .C = C, .stride = stride};
  size_t n = (size_t)N * stride;
  c.inp = kc_random(&rng, n, -2, 2);
  c.w = kc_random(&rng, C, 0.5f, 1.5f);
  c.out = kc_floats(n), c.rstd = kc_floats((size_t)N * H);
  c.r = kc_random(&rng, n, -1, 1);
  rms_loss(&c); /* rstd for the backward */
  float *dinp = grad_start(n), *dinp0 = kc_copy(dinp, n);
  float *dw = grad_start(C), *dw0 = kc_copy(dw, C);
  be.ops->rmsnorm_bwd(be.ctx, dinp, dw, c.r, c.inp, c.w, c.rstd, N, H, C, stride);
  char what[96];
  snprintf(what, sizeof what, "rmsnorm N=%d H=%d C=%d stride=%td dinp", N, H, C, stride);
  /* the gaps: no gradient there, and dinp must not be touched (FD gives 0 for them) */
  int fail = check_input(what, rms_loss, &c, c.inp, dinp, dinp0, n);
  snprintf(what, sizeof what, "rmsnorm N=%d H=%d C=%d stride=%td dw", N, H, C, stride);
  fail |= check_input(what, rms_loss, &c, c.w, dw, dw0, C);
  free(c.inp), free(c.w), free(c.out), free(c.rstd), free(c.r);
  free(dinp), free(dinp0), free(dw), free(dw0);
  return fail;
}

/* ---- rope ------------------------------------------------------------------------------- */
typedef struct rope_case {
  int N, H, hs;
  ptrdiff_t stride;
  float *x, *y, *inv_freq, *r;
  int32_t *pos;
} rope_case;

static double rope_loss(void *p) {
  rope_case *c = p;
  size_t n = (size_t)c->N * c->stride;
  memcpy(c->y, c->x, n * sizeof(float));
  be.ops->rope_fwd(be.ctx, c->y, c->inv_freq, c->pos, c->N, c->H, c->hs, c->stride);
  return dot_r(c->y, c->r, n);
}

/* rope_bwd maps dL/dy = R to dL/dx in place (it does not add). H heads of 6 in rows of 20. */
static int test_rope(void) {
  rope_case c = {.N = 5, .H = 3, .hs = 6, .stride = 20};
  size_t n = (size_t)c.N * c.stride;
  int32_t pos[5] = {0, 3, 1, 1000, 7};
  c.pos = pos;
  c.x = kc_random(&rng, n, -2, 2), c.y = kc_floats(n), c.r = kc_random(&rng, n, -1, 1);
  c.inv_freq = kc_random(&rng, c.hs / 2, 0.01f, 1.0f);
  float *g = kc_copy(c.r, n);
  be.ops->rope_bwd(be.ctx, g, c.inv_freq, c.pos, c.N, c.H, c.hs, c.stride);
  int fail = check_fd("rope dx", rope_loss, &c, c.x, n, g);
  free(c.x), free(c.y), free(c.r), free(c.inv_freq), free(g);
  return fail;
}

/* ---- swiglu ----------------------------------------------------------------------------- */
typedef struct swiglu_case {
  int N, F;
  float *inp, *out, *r;
} swiglu_case;

static double swiglu_loss(void *p) {
  swiglu_case *c = p;
  be.ops->swiglu_fwd(be.ctx, c->out, c->inp, c->N, c->F);
  return dot_r(c->out, c->r, (size_t)c->N * c->F);
}

static int test_swiglu(void) {
  swiglu_case c = {.N = 6, .F = 23};
  size_t n = (size_t)c.N * c.F;
  c.inp = kc_random(&rng, 2 * n, -4, 4);
  c.out = kc_floats(n);
  c.r = kc_random(&rng, n, -1, 1);
  float *d = grad_start(2 * n), *d0 = kc_copy(d, 2 * n);
  be.ops->swiglu_bwd(be.ctx, d, c.inp, c.r, c.N, c.F);
  int fail = check_input("swiglu dinp (gate | up)", swiglu_loss, &c, c.inp, d, d0, 2 * n);
  free(c.inp), free(c.out), free(c.r), free(d), free(d0);
  return fail;
}

/* ---- pointwise -------------------------------------------------------------------------- */
typedef struct pw_case {
  int relu;
  size_t n;
  float *inp, *out, *r;
} pw_case;

static double pw_loss(void *p) {
  pw_case *c = p;
  if (c->relu)
    be.ops->relu_fwd(be.ctx, c->out, c->inp, c->n);
  else
    be.ops->gelu_fwd(be.ctx, c->out, c->inp, c->n);
  return dot_r(c->out, c->r, c->n);
}

static int test_pointwise(int relu) {
  pw_case c = {.relu = relu, .n = 257};
  c.inp = kc_random(&rng, c.n, -4, 4);
  /* keep ReLU inputs away from the kink, where the difference quotient is meaningless */
  for (size_t i = 0; i < c.n; i++)
    if (fabsf(c.inp[i]) < 0.1f)
      c.inp[i] = c.inp[i] < 0 ? -0.1f : 0.1f;
  c.out = kc_floats(c.n);
  c.r = kc_random(&rng, c.n, -1, 1);
  float *d = grad_start(c.n), *d0 = kc_copy(d, c.n);
  if (relu)
    be.ops->relu_bwd(be.ctx, d, c.inp, c.r, c.n);
  else
    be.ops->gelu_bwd(be.ctx, d, c.inp, c.r, c.n);
  int fail = check_input(relu ? "relu dinp" : "gelu dinp", pw_loss, &c, c.inp, d, d0, c.n);
  free(c.inp), free(c.out), free(c.r), free(d), free(d0);
  return fail;
}

/* ---- cross-entropy ---------------------------------------------------------------------- */
#define IGNORE (-100)

typedef struct ce_case {
  int N, V, V_alloc;
  float *logits;
  int32_t *targets;
} ce_case;

static double ce_loss(void *p) {
  ce_case *c = p;
  double loss;
  int count;
  be.ops->crossentropy_fwd(be.ctx, c->logits, c->targets, c->N, c->V, c->V_alloc, IGNORE,
                           &loss, &count);
  return loss;
}

static int test_crossentropy(void) {
  ce_case c = {.N = 6, .V = 11, .V_alloc = 16};
  size_t n = (size_t)c.N * c.V_alloc;
  c.logits = kc_random(&rng, n, -3, 3);
  c.targets = malloc(sizeof(int32_t) * c.N);
  for (int i = 0; i < c.N; i++)
    c.targets[i] = kc_int(&rng, c.V);
  c.targets[1] = IGNORE;
  c.targets[4] = IGNORE;
  const float dscale = 0.37f;

  float *g = kc_copy(c.logits, n); /* padding holds random values: they must come out zero */
  double loss_fb, loss_f;
  int count_fb, count_f;
  be.ops->crossentropy_fwd_bwd(be.ctx, g, c.targets, c.N, c.V, c.V_alloc, IGNORE, dscale,
                               &loss_fb, &count_fb);
  be.ops->crossentropy_fwd(be.ctx, c.logits, c.targets, c.N, c.V, c.V_alloc, IGNORE, &loss_f,
                           &count_f);
  int fail = KC_EXPECT(count_fb == 4 && count_f == 4, "counted %d/%d, want 4", count_fb, count_f);
  fail |= KC_EXPECT(loss_fb == loss_f, "fused loss %.17g != forward loss %.17g", loss_fb, loss_f);

  /* The analytic gradient of loss_sum is g / dscale; the FD covers ignored rows and padding
   * columns too, where it is exactly zero. */
  float *unscaled = kc_floats(n);
  for (size_t i = 0; i < n; i++)
    unscaled[i] = g[i] / dscale;
  fail |= check_fd("crossentropy dlogits", ce_loss, &c, c.logits, n, unscaled);
  for (int row = 0; row < c.N; row++)
    for (int j = 0; j < c.V_alloc; j++)
      if ((c.targets[row] == IGNORE || j >= c.V) && g[(size_t)row * c.V_alloc + j] != 0.0f) {
        fail |= KC_EXPECT(0, "crossentropy: row %d col %d not zeroed", row, j);
        row = c.N;
        break;
      }
  free(c.logits), free(c.targets), free(g), free(unscaled);
  return fail;
}

int main(void) {
  if (zt_backend_cpu_open(&be, 0) < 0)
    return 1;
  kc_seed(&rng, 20240601);
  int fail = 0;
  fail |= test_embedding(1);
  fail |= test_embedding(0);
  fail |= test_matmul(7, 19, 21, 1);
  fail |= test_matmul(9, 5, 33, 0);
  fail |= test_matmul(3, 37, 2, 1);
  fail |= test_layernorm();
  fail |= test_attention(2, 2, 3, 1);
  fail |= test_attention(2, 2, 3, 0);
  fail |= test_attention(4, 2, 3, 1);
  fail |= test_attention(6, 2, 2, 0);
  fail |= test_rmsnorm(5, 1, 13, 13);
  fail |= test_rmsnorm(4, 3, 5, 3 * 5 + 4);
  fail |= test_rope();
  fail |= test_swiglu();
  fail |= test_pointwise(0);
  fail |= test_pointwise(1);
  fail |= test_crossentropy();
  zt_backend_cpu_close(&be);
  if (!fail)
    printf("all gradient checks passed\n");
  return fail;
}
