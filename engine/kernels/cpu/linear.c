/* Linear layers: out (N,OC) = inp (N,C) @ w (OC,C)^T + bias and its backward.
 *
 * All three products (forward, dinp, dw) are one blocked kernel, gemm() below, in the form
 *   C[i][j] = init[j] + sum_k A(i,k) * B(k,j)
 * with A and B read through strides, so that each product is a choice of strides rather than
 * its own loop nest. Each output element is one fp32 accumulation in increasing k, whatever the
 * blocking and the thread count, so every result is the plain sequential dot product and
 * bitwise reproducible. */
#include <stddef.h>

#include "engine/kernels/cpu/cpu.h"

/* The register tile is MR rows by NR columns (NR contiguous floats the compiler turns into
 * vector lanes; MR independent accumulator rows hide the add latency). A task covers MC rows of
 * one NR-wide column panel; the panel of B it needs is copied, KC rows at a time, into a
 * contiguous buffer (KC*NR floats = 16 KiB, L1-resident) whatever B's layout is. */
#define MR 4
#define NR 16
#define KC 256
#define MC 64

typedef struct gemm_args {
  float *c; /* C (m, nj) with row stride ldc */
  ptrdiff_t ldc;
  const float *a; /* A(i,k) = a[i*a_si + k*a_sk] */
  ptrdiff_t a_si, a_sk;
  const float *b; /* B(k,j) = b[k*b_sk + j*b_sj] */
  ptrdiff_t b_sk, b_sj;
  const float *init; /* start value of column j's sums (the bias), NULL for 0 */
  int accumulate;    /* 1: C += result (backward); 0: C = result */
  int m, nj, k;
} gemm_args;

static inline int min_int(int a, int b) { return a < b ? a : b; }

/* acc (MR,NR) += A rows ar[0..MR) (kc values each, stride a_sk) times the packed panel bp. */
static inline void gemm_micro(int kc, const float *const ar[MR], ptrdiff_t a_sk,
                              const float *bp, float *acc_io) {
  float acc[MR][NR];
  for (int r = 0; r < MR; r++)
    for (int j = 0; j < NR; j++)
      acc[r][j] = acc_io[r * NR + j];
  for (int kk = 0; kk < kc; kk++) {
    const float *brow = bp + (size_t)kk * NR;
    for (int r = 0; r < MR; r++) {
      float av = ar[r][kk * a_sk];
      for (int j = 0; j < NR; j++)
        acc[r][j] += av * brow[j];
    }
  }
  for (int r = 0; r < MR; r++)
    for (int j = 0; j < NR; j++)
      acc_io[r * NR + j] = acc[r][j];
}

/* One task: rows [i0, i0+MC) x columns [j0, j0+NR) of C. */
static void gemm_tile(const gemm_args *g, int i0, int j0) {
  int mc = min_int(MC, g->m - i0);
  int nr = min_int(NR, g->nj - j0);
  float part[MC * NR]; /* the running sums of this tile across the KC chunks */
  float bp[KC * NR];

  for (int i = 0; i < MC; i++)
    for (int j = 0; j < NR; j++)
      part[i * NR + j] = (g->init && j < nr) ? g->init[j0 + j] : 0.0f;

  for (int k0 = 0; k0 < g->k; k0 += KC) {
    int kc = min_int(KC, g->k - k0);
    /* Columns past nj are packed as zeros; their sums are computed and dropped, which keeps
     * the micro-kernel free of edge cases. */
    for (int kk = 0; kk < kc; kk++) {
      const float *bsrc = g->b + (ptrdiff_t)(k0 + kk) * g->b_sk + (ptrdiff_t)j0 * g->b_sj;
      for (int j = 0; j < NR; j++)
        bp[kk * NR + j] = j < nr ? bsrc[(ptrdiff_t)j * g->b_sj] : 0.0f;
    }
    for (int ir = 0; ir < mc; ir += MR) {
      /* Rows past the end reuse the last row (in bounds); their sums land in part rows that
       * are never stored. */
      const float *ar[MR];
      for (int r = 0; r < MR; r++) {
        int i = i0 + min_int(ir + r, mc - 1);
        ar[r] = g->a + (ptrdiff_t)i * g->a_si + (ptrdiff_t)k0 * g->a_sk;
      }
      gemm_micro(kc, ar, g->a_sk, bp, part + (size_t)ir * NR);
    }
  }

  for (int i = 0; i < mc; i++) {
    float *crow = g->c + (ptrdiff_t)(i0 + i) * g->ldc + j0;
    if (g->accumulate)
      for (int j = 0; j < nr; j++)
        crow[j] += part[i * NR + j];
    else
      for (int j = 0; j < nr; j++)
        crow[j] = part[i * NR + j];
  }
}

static void gemm(int nt, const gemm_args *g) {
  if (g->m <= 0 || g->nj <= 0)
    return;
  long row_blocks = (g->m + MC - 1) / MC;
  long col_blocks = (g->nj + NR - 1) / NR;
  long tasks = row_blocks * col_blocks;
  /* Consecutive tasks share a row block, so a thread's A rows stay in cache across panels.
   * Below a megaflop the team costs more than it saves. */
  ZT__PARALLEL_FOR(nt, 2.0 * g->m * g->nj * g->k > 1e6)
  for (long t = 0; t < tasks; t++)
    gemm_tile(g, (int)(t / col_blocks) * MC, (int)(t % col_blocks) * NR);
}

void zt__cpu_matmul_fwd(void *ctx, float *out, const float *inp, const float *w,
                        const float *bias, int N, int C, int OC) {
  /* out[n][o] = bias[o] + sum_c inp[n][c] * w[o][c] */
  gemm_args g = {.c = out, .ldc = OC, .a = inp, .a_si = C, .a_sk = 1, .b = w, .b_sk = 1,
                 .b_sj = C, .init = bias, .accumulate = 0, .m = N, .nj = OC, .k = C};
  gemm(zt__cpu_threads(ctx), &g);
}

/* dbias[o] += sum_n dout[n][o]: parallel over blocks of channels, each summed down n in order. */
#define BIAS_BLOCK 64
static void bias_bwd(int nt, float *dbias, const float *dout, int N, int OC) {
  int blocks = (OC + BIAS_BLOCK - 1) / BIAS_BLOCK;
  ZT__PARALLEL_FOR(nt, (long)N * OC > ZT__CPU_PAR_MIN)
  for (int blk = 0; blk < blocks; blk++) {
    int o0 = blk * BIAS_BLOCK;
    int ob = min_int(BIAS_BLOCK, OC - o0);
    float acc[BIAS_BLOCK] = {0};
    for (int n = 0; n < N; n++) {
      const float *row = dout + (ptrdiff_t)n * OC + o0;
      for (int j = 0; j < ob; j++)
        acc[j] += row[j];
    }
    for (int j = 0; j < ob; j++)
      dbias[o0 + j] += acc[j];
  }
}

void zt__cpu_matmul_bwd(void *ctx, float *dinp, float *dw, float *dbias, const float *dout,
                        const float *inp, const float *w, int N, int C, int OC) {
  int nt = zt__cpu_threads(ctx);
  if (dinp) {
    /* dinp[n][c] += sum_o dout[n][o] * w[o][c] */
    gemm_args g = {.c = dinp, .ldc = C, .a = dout, .a_si = OC, .a_sk = 1, .b = w, .b_sk = C,
                   .b_sj = 1, .accumulate = 1, .m = N, .nj = C, .k = OC};
    gemm(nt, &g);
  }
  /* dw[o][c] += sum_n dout[n][o] * inp[n][c] */
  gemm_args g = {.c = dw, .ldc = C, .a = dout, .a_si = 1, .a_sk = OC, .b = inp, .b_sk = C,
                 .b_sj = 1, .accumulate = 1, .m = OC, .nj = C, .k = N};
  gemm(nt, &g);
  if (dbias)
    bias_bwd(nt, dbias, dout, N, OC);
}
