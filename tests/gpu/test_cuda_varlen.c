/* Attention and learned positions over packed documents (ops.h, "Documents") on the CUDA
 * backend: the flash path (bf16, head sizes 64 and 128, multi-head and grouped-query) and the
 * cuBLAS path (fp32), causal and bidirectional, for three layouts of the rows: one document a
 * row, many short documents (1 to 48 tokens, across the 64-row tiles), and a long document split
 * at a row's end (the next row starts with its tail, positions restarting at 0). Each is checked
 * against the CPU twin with the same positions, and each document against itself run alone in a
 * row of its own length on the GPU. Also: positions 0..T-1 give the bits of positions NULL
 * (forward and backward, both paths), the backward twice gives the same bits, and the
 * embedding with positions (wpe rows read and scattered) matches the CPU twin. Exits 77 without
 * a GPU.
 *
 * Tolerances as in test_cuda_flash.c (u the unit roundoff of bf16, 2^-8): |got - want| <= A u m
 * + R u |want|, m the largest |want| of the compared part (q, k, v apart for gradients): A = R = 4
 * for outputs, A = 16, R = 8 for gradients; fp32 differs only in summation order: 1e-4. A
 * document packed against itself alone, both on the GPU, is held to twice those bounds: each
 * side is within them of the exact values (its keys are the same; only the tiles they fall in,
 * and so the order of the online softmax's sums, differ). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/ops.h"
#include "tests/gpu/twin.h"
#include "tests/unit/kernels/kcheck.h"

static zt_backend cpu, gpu;
static int failures;
static kc_rng rng;

enum { ONE_DOC, SHORT_DOCS, SPLIT_DOC, LAYOUTS };
static const char *layout_name[LAYOUTS] = {"one document", "short documents", "split document"};

/* Positions of B rows of T in layout l; doc_at/doc_len list each document (row-major order) of
 * at most cap; returns their number. */
static int make_layout(int l, int B, int T, int32_t *pos, int *doc_at, int *doc_len, int cap) {
  int nd = 0;
  for (int b = 0; b < B; b++) {
    int t = 0;
    while (t < T) {
      int len = T - t;
      if (l == SHORT_DOCS) len = 1 + kc_int(&rng, 48);
      if (l == SPLIT_DOC) len = b == 0 ? (t == 0 ? 37 : T - t) : (t == 0 ? T / 2 + 3 : 61);
      if (len > T - t) len = T - t;
      if (nd < cap) doc_at[nd] = b * T + t, doc_len[nd] = len, nd++;
      for (int j = 0; j < len; j++) pos[b * T + t + j] = j;
      t += len;
    }
  }
  return nd;
}

static float value(zt_dtype t, const void *base, size_t i) {
  if (t == ZT_F32) return ((const float *)base)[i];
  uint16_t x = ((const uint16_t *)base)[i];
  return t == ZT_BF16 ? zt_bf16_to_f32(x) : zt_f16_to_f32(x);
}

static void *host_random(zt_dtype t, size_t n, float lo, float hi) {
  void *h = calloc(n ? n : 1, zt_dtype_size(t));
  if (!h) exit(1);
  for (size_t i = 0; i < n; i++) {
    float x = lo == hi ? lo : kc_uniform(&rng, lo, hi);
    if (t == ZT_F32) ((float *)h)[i] = x;
    else ((uint16_t *)h)[i] = t == ZT_BF16 ? zt_f32_to_bf16(x) : zt_f32_to_f16(x);
  }
  return h;
}

static void *to_dev(const void *h, size_t bytes) {
  void *d = twin_dev_alloc(&gpu, bytes);
  gpu.ops->to_device(gpu.ctx, d, h, bytes);
  return d;
}

static void *to_host(const void *d, size_t bytes) {
  void *h = malloc(bytes ? bytes : 1);
  if (!h) exit(1);
  gpu.ops->to_host(gpu.ctx, h, d, bytes);
  return h;
}

/* got against want (n values of type t), parts q|k|v of a qkv row when qn > 0. */
static void compare(const char *what, zt_dtype t, const void *got, const void *want, size_t n,
                    double A, double R, size_t qn, size_t kvn) {
  double maxw[3] = {0}, maxall = 0, worst = 0;
  size_t nbad = 0, bad = 0;
  for (size_t i = 0; i < n; i++) {
    size_t col = qn ? i % (qn + 2 * kvn) : 0;
    int p = !qn ? 0 : col < qn ? 0 : col < qn + kvn ? 1 : 2;
    maxw[p] = fmax(maxw[p], fabs(value(t, want, i)));
    maxall = fmax(maxall, fabs(value(t, want, i)));
  }
  for (size_t i = 0; i < n; i++) {
    size_t col = qn ? i % (qn + 2 * kvn) : 0;
    int p = !qn ? 0 : col < qn ? 0 : col < qn + kvn ? 1 : 2;
    double w = value(t, want, i), g = value(t, got, i), err = fabs(g - w);
    double tol = A * fmax(maxw[p], 1e-3 * maxall) + R * fabs(w);
    if (!(err <= tol) && nbad++ == 0) bad = i;
    if (tol > 0) worst = fmax(worst, err / tol);
  }
  printf("%-78s %s worst %.2f of tol  %s\n", what, zt_dtype_name(t), worst, nbad ? "FAIL" : "ok");
  if (nbad) {
    fprintf(stderr, "FAIL %s: %zu of %zu out of tolerance; first [%zu]: got %.9g want %.9g\n",
            what, nbad, n, bad, (double)value(t, got, bad), (double)value(t, want, bad));
    failures++;
  }
}

static void same_bits(const char *what, const void *x, const void *y, size_t bytes) {
  int same = !memcmp(x, y, bytes);
  printf("%-78s %s\n", what, same ? "bitwise equal" : "DIFFERENT (FAIL)");
  if (!same) {
    fprintf(stderr, "FAIL %s: results differ\n", what);
    failures++;
  }
}

static double u_of(zt_dtype dt) { return dt == ZT_F32 ? 0 : 0x1p-8; }

/* Forward, then backward from a zero dqkv, on the GPU; out and dqkv come back to the host. */
static void gpu_run(zt_dtype dt, const void *qkv_d, const void *dout_d, const int32_t *pos_d,
                    int B, int T, int NH, int NKV, int hs, int causal, void **out, void **dqkv) {
  size_t es = zt_dtype_size(dt), n = (size_t)B * T * NH * hs;
  size_t nq = (size_t)B * T * (NH + 2 * NKV) * hs;
  void *o = twin_dev_alloc(&gpu, n * es), *d = twin_dev_alloc(&gpu, nq * es);
  void *saved = twin_dev_alloc(&gpu, gpu.ops->attention_saved_bytes_dt(dt, B, T, NH, NKV, hs));
  gpu.ops->zero(gpu.ctx, d, nq * es);
  gpu.ops->attention_fwd_dt(gpu.ctx, dt, o, saved, qkv_d, B, T, NH, NKV, hs, causal, pos_d);
  gpu.ops->attention_bwd_dt(gpu.ctx, dt, d, dout_d, qkv_d, saved, B, T, NH, NKV, hs, causal,
                            pos_d);
  *out = to_host(o, n * es);
  *dqkv = to_host(d, nq * es);
}

static void test_attention(zt_dtype dt, int B, int T, int NH, int NKV, int hs, int causal,
                           int layout) {
  double u = u_of(dt);
  double Ao = dt == ZT_F32 ? 1e-4 : 4 * u, Ag = dt == ZT_F32 ? 1e-4 : 16 * u;
  double Rg = dt == ZT_F32 ? 1e-4 : 8 * u;
  size_t es = zt_dtype_size(dt), row = (size_t)(NH + 2 * NKV) * hs, C = (size_t)NH * hs;
  size_t n = (size_t)B * T * C, nq = (size_t)B * T * row, qn = C, kvn = (size_t)NKV * hs;
  char tag[160], what[200];
  snprintf(tag, sizeof tag, "%s B=%d T=%d hs=%d NH=%d NKV=%d causal=%d", layout_name[layout], B,
           T, hs, NH, NKV, causal);
  int32_t *pos = malloc((size_t)B * T * sizeof *pos);
  int cap = B * T, *at = malloc(cap * sizeof *at), *len = malloc(cap * sizeof *len);
  int nd = make_layout(layout, B, T, pos, at, len, cap);
  void *qkv = host_random(dt, nq, -1, 1), *dout = host_random(dt, n, -1, 1);
  void *qkv_d = to_dev(qkv, nq * es), *dout_d = to_dev(dout, n * es);
  int32_t *pos_d = to_dev(pos, (size_t)B * T * sizeof *pos);

  /* the CPU twin with the same positions */
  void *out_c = host_random(dt, n, 0, 0), *dq_c = host_random(dt, nq, 0, 0);
  void *saved_c = calloc(1, cpu.ops->attention_saved_bytes_dt(dt, B, T, NH, NKV, hs));
  if (!saved_c) exit(1);
  cpu.ops->attention_fwd_dt(cpu.ctx, dt, out_c, saved_c, qkv, B, T, NH, NKV, hs, causal, pos);
  cpu.ops->attention_bwd_dt(cpu.ctx, dt, dq_c, dout, qkv, saved_c, B, T, NH, NKV, hs, causal,
                            pos);
  void *out_g, *dq_g, *out_g2, *dq_g2;
  gpu_run(dt, qkv_d, dout_d, pos_d, B, T, NH, NKV, hs, causal, &out_g, &dq_g);
  snprintf(what, sizeof what, "fwd vs cpu %s", tag);
  compare(what, dt, out_g, out_c, n, Ao, Ao, 0, 0);
  snprintf(what, sizeof what, "bwd vs cpu %s", tag);
  compare(what, dt, dq_g, dq_c, nq, Ag, Rg, qn, kvn);
  gpu_run(dt, qkv_d, dout_d, pos_d, B, T, NH, NKV, hs, causal, &out_g2, &dq_g2);
  snprintf(what, sizeof what, "fwd+bwd twice %s", tag);
  same_bits(what, dq_g, dq_g2, nq * es);
  free(out_g2), free(dq_g2);

  if (layout == ONE_DOC) { /* 0..T-1 against NULL */
    gpu_run(dt, qkv_d, dout_d, NULL, B, T, NH, NKV, hs, causal, &out_g2, &dq_g2);
    snprintf(what, sizeof what, "fwd positions 0..T-1 = NULL %s", tag);
    same_bits(what, out_g, out_g2, n * es);
    snprintf(what, sizeof what, "bwd positions 0..T-1 = NULL %s", tag);
    same_bits(what, dq_g, dq_g2, nq * es);
    free(out_g2), free(dq_g2);
  }

  /* each document alone: its slice of qkv and dout as a row of its own (the first 12 and the
   * last of a layout of many) */
  int fails_before = failures;
  for (int k = 0; k < nd; k++) {
    if (k >= 12 && k != nd - 1) continue;
    void *oa, *da;
    gpu_run(dt, (char *)qkv_d + (size_t)at[k] * row * es, (char *)dout_d + (size_t)at[k] * C * es,
            NULL, 1, len[k], NH, NKV, hs, causal, &oa, &da);
    double Ao2 = 2 * Ao, Ag2 = 2 * Ag, Rg2 = 2 * Rg;
    snprintf(what, sizeof what, "  document %d (%d tokens at %d) packed vs alone: fwd", k,
             len[k], at[k]);
    compare(what, dt, (char *)out_g + (size_t)at[k] * C * es, oa, (size_t)len[k] * C, Ao2, Ao2,
            0, 0);
    snprintf(what, sizeof what, "  document %d (%d tokens at %d) packed vs alone: bwd", k,
             len[k], at[k]);
    compare(what, dt, (char *)dq_g + (size_t)at[k] * row * es, da, (size_t)len[k] * row, Ag2,
            Rg2, qn, kvn);
    free(oa), free(da);
  }
  printf("%s: %d documents, %s\n", tag, nd, failures == fails_before ? "ok" : "FAIL");
  free(pos), free(at), free(len), free(qkv), free(dout), free(out_c), free(dq_c), free(saved_c);
  free(out_g), free(dq_g);
  twin_dev_free_all(&gpu);
}

/* wte[tok] + wpe[pos] and its backward, fp32 and bf16 outputs, against the CPU twin. */
static void test_embedding(zt_dtype dt) {
  const int B = 3, T = 300, C = 96, V = 50;
  size_t es = zt_dtype_size(dt), rows = (size_t)B * T;
  int32_t *pos = malloc(rows * sizeof *pos), *tok = malloc(rows * sizeof *tok);
  int *at = malloc(rows * sizeof *at), *len = malloc(rows * sizeof *len);
  make_layout(SHORT_DOCS, B, T, pos, at, len, (int)rows);
  for (size_t i = 0; i < rows; i++) tok[i] = kc_int(&rng, V);
  float *wte = host_random(ZT_F32, (size_t)V * C, -1, 1), *wpe = host_random(ZT_F32, T * C, -1, 1);
  void *dout = host_random(dt, rows * C, -1, 1), *out = host_random(dt, rows * C, 0, 0);
  float *dwte = host_random(ZT_F32, (size_t)V * C, -1, 1);
  float *dwpe = host_random(ZT_F32, T * C, -1, 1);
  void *tok_d = to_dev(tok, rows * 4), *pos_d = to_dev(pos, rows * 4);
  void *wte_d = to_dev(wte, (size_t)V * C * 4), *wpe_d = to_dev(wpe, (size_t)T * C * 4);
  void *dout_d = to_dev(dout, rows * C * es), *out_d = twin_dev_alloc(&gpu, rows * C * es);
  void *dwte_d = to_dev(dwte, (size_t)V * C * 4), *dwpe_d = to_dev(dwpe, (size_t)T * C * 4);
  cpu.ops->embedding_fwd_dt(cpu.ctx, dt, out, tok, wte, wpe, B, T, C, pos);
  gpu.ops->embedding_fwd_dt(gpu.ctx, dt, out_d, tok_d, wte_d, wpe_d, B, T, C, pos_d);
  cpu.ops->embedding_bwd_dt(cpu.ctx, dt, dwte, dwpe, dout, tok, B, T, C, pos);
  gpu.ops->embedding_bwd_dt(gpu.ctx, dt, dwte_d, dwpe_d, dout_d, tok_d, B, T, C, pos_d);
  void *g = to_host(out_d, rows * C * es);
  same_bits(dt == ZT_F32 ? "embedding fwd with positions = cpu (fp32)"
                         : "embedding fwd with positions = cpu (bf16)",
            g, out, rows * C * es);
  free(g);
  /* the same adds in the same order on both sides: dwte and dwpe to the bit */
  g = to_host(dwte_d, (size_t)V * C * 4);
  same_bits("embedding bwd with positions dwte = cpu", g, dwte, (size_t)V * C * 4);
  free(g);
  g = to_host(dwpe_d, (size_t)T * C * 4);
  same_bits("embedding bwd with positions dwpe = cpu", g, dwpe, (size_t)T * C * 4);
  free(g);
  free(pos), free(tok), free(at), free(len), free(wte), free(wpe), free(dout), free(out);
  free(dwte), free(dwpe);
  twin_dev_free_all(&gpu);
}

int main(void) {
  int rc = twin_open(&cpu, &gpu);
  if (rc) return rc;
  kc_seed(&rng, 20261202);
  for (int layout = 0; layout < LAYOUTS; layout++)
    for (int causal = 0; causal < 2; causal++) {
      /* flash: hs 64 multi-head, hs 128 grouped-query, hs 64 with the llama 3 8B grouping */
      test_attention(ZT_BF16, 2, 300, 4, 4, 64, causal, layout);
      test_attention(ZT_BF16, 2, 517, 8, 2, 128, causal, layout);
      test_attention(ZT_BF16, 1, 260, 32, 8, 64, causal, layout);
      /* cuBLAS: fp32, multi-head and grouped-query */
      test_attention(ZT_F32, 2, 300, 4, 4, 64, causal, layout);
      test_attention(ZT_F32, 2, 200, 8, 2, 128, causal, layout);
    }
  test_embedding(ZT_F32);
  test_embedding(ZT_BF16);
  rc = gpu.ops->sync(gpu.ctx);
  if (rc < 0) {
    fprintf(stderr, "FAIL: backend error %d: %s\n", rc, gpu.ops->error_text(gpu.ctx));
    failures++;
  }
  twin_close(&cpu, &gpu);
  printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
