// Flash attention (FlashAttention-2's algorithm) for bf16/fp16 on tensor cores: mma.sync
// m16n8k16 with fp32 accumulators held in registers, operands read from shared memory by
// ldmatrix, tiles brought in by cp.async one tile ahead of their use. Layout of saved and the
// choice of path: see flash_attention.h.
//
// A block has 4 warps, each owning 16 rows of the block's 64 (queries in the forward and the dQ
// kernel, keys in the dK/dV kernel) and every column of the tiles it streams, so the row-wise
// work (softmax statistics) stays inside a warp's quad of lanes and __syncthreads guards only
// the shared tiles. Fragment layouts are those of the PTX ISA for m16n8k16: in an accumulator,
// lane l holds rows l/4 and l/4 + 8, columns 2(l%4) and 2(l%4) + 1 of each 8-column n-tile,
// which is also where an A operand wants them, so the probabilities and dS go from one product
// to the next in registers. Rows past T are loaded as zeros, masked out of every softmax and
// never written.
//
// Roundings, as in the cuBLAS path: the probabilities (unnormalised in the forward, exp(s-m)
// <= 1) and dS are rounded to E for the products that read them; scores, statistics, dP and
// every accumulator are fp32, and each output is rounded once. Exponentials are exp2 of scores
// prescaled by scale * log2(e).
//
// Grouped-query attention: query head h reads kv head h / group (group = NH/NKV) in place. The
// forward and the dQ kernel run a block per query head as for multi-head attention; the dK/dV
// kernel runs a block per (key tile, kv head) that loops over the group's query heads in order,
// each one's query tiles in order, so a shared head's dK and dV are summed over its group in
// registers, in a fixed order, and written once.
//
// Documents (ops.h; pos NULL: one a row): a key tile wholly outside the documents of a block's
// rows is never loaded (the first tile read is the one holding the document start of the
// block's first row, as varlen flash attention does; the last the one holding the document end
// of its last row), and inside a tile a score is masked only where the tile and the warp's rows
// are not all one document (fa_one_doc), so a tile inside one document costs what it did.
//
// Determinism: no atomics. The forward and the dQ kernel own their query rows, the dK/dV kernel
// its key rows (so the backward computes S and dP twice, once in each kernel, the price of
// having no atomics); every sum runs in an order fixed by the shapes.
#include <math.h>
#include <stdint.h>

#include "engine/kernels/cuda/flash_attention.h"
#include "engine/kernels/cuda/lowp.cuh"
#include "engine/kernels/cuda/reduce.cuh"
#include "engine/kernels/docs.h"

#define WARPS 4
#define THREADS (WARPS * 32)
#define ROWS 64 // a block's own rows: 16 per warp
#define LOG2E 1.4426950408889634f

// ---- tensor-core and shared-memory primitives ---------------------------------------------

template <class E> struct fa_mma;
template <> struct fa_mma<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
  }
};
template <> struct fa_mma<__half> {
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&v;
  }
};

static __device__ __forceinline__ uint32_t fa_smem(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

// Four 8x8 matrices of 16-bit elements; lane l gives the address of row l%8 of matrix l/8, and
// register i receives matrix i in the mma fragment layout (transposed with .trans).
static __device__ __forceinline__ void fa_ldsm(uint32_t (&r)[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(fa_smem(p))
               : "memory");
}
static __device__ __forceinline__ void fa_ldsm_t(uint32_t (&r)[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(fa_smem(p))
               : "memory");
}

// 16 bytes global -> shared without registers; src_bytes 0 writes zeros.
static __device__ __forceinline__ void fa_cp16(void *s, const void *g, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(fa_smem(s)), "l"(g),
               "r"(src_bytes)
               : "memory");
}
static __device__ __forceinline__ void fa_cp_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> static __device__ __forceinline__ void fa_cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Row pitch of a tile in shared memory: 16 bytes of padding put the 8 rows an ldmatrix reads in
// 8 different bank groups.
template <int HS> struct fa_pitch {
  static constexpr int LD = HS + 8;
};

// Rows [r0, r0 + R) of a (T, ld) matrix whose row 0 starts at g, HS columns, into s (pitch LD);
// rows past T become zeros. vec: g and ld allow 16-byte copies, issued asynchronously (the
// caller commits and waits); otherwise element by element, synchronously.
template <class E, int HS, int R>
static __device__ void fa_load_tile(E *s, const E *g, size_t ld, int r0, int T, bool vec) {
  constexpr int LD = fa_pitch<HS>::LD, VPR = HS / 8;
  if (vec) {
    for (int i = threadIdx.x; i < R * VPR; i += THREADS) {
      int r = i / VPR, c = i % VPR * 8;
      bool in = r0 + r < T;
      fa_cp16(s + r * LD + c, g + (size_t)(in ? r0 + r : 0) * ld + c, in ? 16 : 0);
    }
  } else {
    for (int i = threadIdx.x; i < R * HS; i += THREADS) {
      int r = i / HS, c = i % HS;
      s[r * LD + c] = r0 + r < T ? g[(size_t)(r0 + r) * ld + c] : zt__st<E>(0.0f);
    }
  }
}

// acc[n] (n-tiles of 8 columns, N columns) += X Y^T for a warp's 16 rows: x its rows (16 x HS),
// y the N rows of the other operand (N x HS), both row-major with pitch LD.
template <class E, int HS, int N>
static __device__ __forceinline__ void fa_xyt(float (&acc)[N / 8][4], const E *x, const E *y) {
  constexpr int LD = fa_pitch<HS>::LD;
  int lane = threadIdx.x % 32, mi = lane / 8, mr = lane % 8;
#pragma unroll
  for (int kk = 0; kk < HS / 16; kk++) {
    uint32_t a[4];
    fa_ldsm(a, x + ((mi & 1) * 8 + mr) * LD + kk * 16 + (mi >> 1) * 8);
#pragma unroll
    for (int np = 0; np < N / 16; np++) {
      uint32_t b[4];
      fa_ldsm(b, y + (np * 16 + (mi >> 1) * 8 + mr) * LD + kk * 16 + (mi & 1) * 8);
      fa_mma<E>::run(acc[2 * np], a, b[0], b[1]);
      fa_mma<E>::run(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// acc[n] (HS/8 n-tiles) += P Y for a warp's 16 rows: p the warp's 16 x K values in accumulator
// layout (rounded to E here), y (K x HS, row-major, pitch LD).
template <class E, int HS, int K>
static __device__ __forceinline__ void fa_py(float (&acc)[HS / 8][4], const float (&p)[K / 8][4],
                                             const E *y) {
  constexpr int LD = fa_pitch<HS>::LD;
  int lane = threadIdx.x % 32, mi = lane / 8, mr = lane % 8;
#pragma unroll
  for (int kt = 0; kt < K / 16; kt++) {
    uint32_t a[4] = {fa_mma<E>::pack(p[2 * kt][0], p[2 * kt][1]),
                     fa_mma<E>::pack(p[2 * kt][2], p[2 * kt][3]),
                     fa_mma<E>::pack(p[2 * kt + 1][0], p[2 * kt + 1][1]),
                     fa_mma<E>::pack(p[2 * kt + 1][2], p[2 * kt + 1][3])};
#pragma unroll
    for (int dp = 0; dp < HS / 16; dp++) {
      uint32_t b[4];
      fa_ldsm_t(b, y + (kt * 16 + (mi & 1) * 8 + mr) * LD + dp * 16 + (mi >> 1) * 8);
      fa_mma<E>::run(acc[2 * dp], a, b[0], b[1]);
      fa_mma<E>::run(acc[2 * dp + 1], a, b[2], b[3]);
    }
  }
}

// g[row][col] += acc for a warp's 16 rows starting at row0 (rows >= T skipped), g an (.., ld)
// matrix of E.
template <class E, int HS>
static __device__ void fa_add_rows(E *g, size_t ld, int row0, int T,
                                   const float (&acc)[HS / 8][4]) {
  int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < HS / 8; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int r = row0 + lane / 4 + (e >> 1) * 8, c = n * 8 + 2 * (lane % 4) + (e & 1);
      if (r < T) {
        E *p = g + (size_t)r * ld + c;
        *p = zt__st<E>(zt__ld(*p) + acc[n][e]);
      }
    }
}

// Whether rows [r0, r1] and columns [c0, c1] of a tile (indices below T) lie in one document of
// the row of positions prow: starts never decrease, so the smallest and the largest index
// decide it. No positions: one document.
static __device__ __forceinline__ bool fa_one_doc(const int32_t *prow, int r0, int r1, int c0,
                                                  int c1) {
  return !prow || zt_doc_start(prow, min(r0, c0)) == zt_doc_start(prow, max(r1, c1));
}

// The document start of token i (i < T), -1 past T.
static __device__ __forceinline__ int fa_doc(const int32_t *prow, int i, int T) {
  return i < T ? zt_doc_start(prow, i) : -1;
}

template <int N> static __device__ __forceinline__ void fa_zero(float (&a)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; n++)
    a[n][0] = a[n][1] = a[n][2] = a[n][3] = 0.0f;
}

// ---- forward: one block per (64 queries, head, batch element) -------------------------------
template <int HS> struct fa_fwd_geom {
  static constexpr int BN = 64; // keys per tile
  static constexpr size_t bytes = (size_t)(ROWS + 4 * BN) * fa_pitch<HS>::LD * 2;
};

template <class E, int HS>
static __global__ void __launch_bounds__(THREADS)
    fa_fwd_kernel(E *out, E *o_copy, float *lse, const E *qkv, const int32_t *pos, int T,
                  int NH, int NKV, int causal, float scale_log2, bool vec) {
  constexpr int LD = fa_pitch<HS>::LD, BN = fa_fwd_geom<HS>::BN;
  extern __shared__ __align__(128) unsigned char sm[];
  E *sq = (E *)sm, *sk = sq + ROWS * LD, *sv = sk + 2 * BN * LD; // K and V: two tiles each
  // the causal tiles far down the sequence have the most keys: start them first
  int q0 = (int)(gridDim.x - 1 - blockIdx.x) * ROWS, h = blockIdx.y, b = blockIdx.z;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int row[2] = {q0 + warp * 16 + lane / 4, q0 + warp * 16 + lane / 4 + 8};
  size_t C = (size_t)NH * HS, R = (size_t)(NH + 2 * NKV) * HS;
  const E *qg = qkv + (size_t)b * T * R + (size_t)h * HS;
  const E *kg = qkv + (size_t)b * T * R + C + (size_t)(h / (NH / NKV)) * HS;
  const E *vg = kg + (size_t)NKV * HS;
  const int32_t *prow = pos ? pos + (size_t)b * T : nullptr;
  int qlast = min(T, q0 + ROWS) - 1, wr0 = min(q0 + warp * 16, T - 1), wr1 = min(wr0 + 15, T - 1);
  int drow[2] = {prow ? fa_doc(prow, row[0], T) : 0, prow ? fa_doc(prow, row[1], T) : 0};

  int kend = causal ? qlast + 1
                    : prow ? zt_doc_end(prow, qlast + 1, T, zt_doc_start(prow, qlast)) : T;
  int j0 = prow ? zt_doc_start(prow, q0) / BN : 0, ntiles = (kend + BN - 1) / BN;
  fa_load_tile<E, HS, ROWS>(sq, qg, R, q0, T, vec);
  fa_load_tile<E, HS, BN>(sk + (j0 & 1) * BN * LD, kg, R, j0 * BN, T, vec);
  fa_load_tile<E, HS, BN>(sv + (j0 & 1) * BN * LD, vg, R, j0 * BN, T, vec);
  fa_cp_commit();
  float o[HS / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  fa_zero(o);
  for (int j = j0; j < ntiles; j++) {
    E *kt = sk + (j & 1) * BN * LD, *vt = sv + (j & 1) * BN * LD;
    if (j + 1 < ntiles) { // the next tile into the other buffers while this one computes
      fa_load_tile<E, HS, BN>(sk + ((j + 1) & 1) * BN * LD, kg, R, (j + 1) * BN, T, vec);
      fa_load_tile<E, HS, BN>(sv + ((j + 1) & 1) * BN * LD, vg, R, (j + 1) * BN, T, vec);
      fa_cp_commit();
      fa_cp_wait<1>();
    } else {
      fa_cp_wait<0>();
    }
    __syncthreads();
    float s[BN / 8][4];
    fa_zero(s);
    fa_xyt<E, HS, BN>(s, sq + warp * 16 * LD, kt);
    int k0 = j * BN;
    bool mixed = !fa_one_doc(prow, wr0, wr1, k0, min(k0 + BN, T) - 1);
    bool edge = k0 + BN > T || (causal && k0 + BN > q0 + warp * 16) || mixed;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < BN / 8; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float v = s[n][e] * scale_log2;
        int col = k0 + n * 8 + 2 * (lane % 4) + (e & 1);
        if (edge && (col >= T || (causal && col > row[e >> 1]) ||
                     (mixed && zt_doc_start(prow, col) != drow[e >> 1])))
          v = -INFINITY;
        s[n][e] = v;
        mx[e >> 1] = fmaxf(mx[e >> 1], v);
      }
    float alpha[2], mref[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(ZT__FULL_MASK, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(ZT__FULL_MASK, mx[r], 2));
      float mn = fmaxf(m[r], mx[r]);
      mref[r] = mn == -INFINITY ? 0.0f : mn; // a row with nothing visible yet stays all zero
      alpha[r] = exp2f(m[r] - mref[r]);
      m[r] = mn;
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < BN / 8; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float p = exp2f(s[n][e] - mref[e >> 1]);
        s[n][e] = p;
        sum[e >> 1] += p;
      }
#pragma unroll
    for (int r = 0; r < 2; r++)
      l[r] = l[r] * alpha[r] + sum[r]; // this lane's columns; the quad adds up at the end
#pragma unroll
    for (int n = 0; n < HS / 8; n++) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
    fa_py<E, HS, BN>(o, s, vt);
    __syncthreads(); // every warp is done with this tile's buffers before they are refilled
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
    l[r] += __shfl_xor_sync(ZT__FULL_MASK, l[r], 1);
    l[r] += __shfl_xor_sync(ZT__FULL_MASK, l[r], 2);
  }
#pragma unroll
  for (int n = 0; n < HS / 8; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int i = row[e >> 1];
      if (i < T) {
        size_t at = ((size_t)b * T + i) * C + (size_t)h * HS + n * 8 + 2 * (lane % 4) + (e & 1);
        E v = zt__st<E>(o[n][e] / l[e >> 1]);
        out[at] = v;
        o_copy[at] = v;
      }
    }
  if (lane % 4 == 0)
#pragma unroll
    for (int r = 0; r < 2; r++)
      if (row[r] < T)
        lse[((size_t)b * NH + h) * T + row[r]] = (m[r] + log2f(l[r])) / LOG2E;
}

// ---- backward ----------------------------------------------------------------------------------

// D[(b*NH + h)*T + t] = sum_d dO * O over the head's hs values: one warp per row.
template <class E>
static __global__ void fa_rowdot_kernel(float *D, const E *dout, const E *o, size_t rows, int T,
                                        int C, int NH, int hs) {
  size_t r = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  int lane = threadIdx.x % 32;
  if (r >= rows)
    return;
  int t = (int)(r % T), h = (int)(r / T % NH);
  size_t b = r / T / NH, off = (b * T + t) * C + (size_t)h * hs;
  float acc = 0.0f;
  for (int d = lane; d < hs; d += 32)
    acc += zt__ld(dout[off + d]) * zt__ld(o[off + d]);
  acc = zt__warp_sum(acc);
  if (lane == 0)
    D[r] = acc;
}

// The backward streams tiles of N rows: 32 for head size 128, whose accumulators take more
// registers, else 64.
template <int HS> struct fa_bwd_geom {
  static constexpr int N = HS == 128 ? 32 : 64;
  static constexpr size_t tiles = (size_t)(2 * ROWS + 4 * N) * fa_pitch<HS>::LD * 2;
  static constexpr size_t kv_bytes = tiles + 4 * N * sizeof(float); // + LSE and D, two tiles
  static constexpr size_t q_bytes = tiles;
};

// dK and dV: one block per (64 keys, kv head, batch element), looping over the group's query
// heads in order and, for each, over the query tiles that see its keys; dqkv's k and v rows of
// the block are added to once, at the end.
template <class E, int HS>
static __global__ void __launch_bounds__(THREADS)
    fa_bwd_kv_kernel(E *dqkv, const E *dout, const E *qkv, const float *lse, const float *D,
                     const int32_t *pos, int T, int NH, int NKV, int causal, float scale,
                     float scale_log2, bool vec) {
  constexpr int LD = fa_pitch<HS>::LD, N = fa_bwd_geom<HS>::N;
  extern __shared__ __align__(128) unsigned char sm[];
  E *sk = (E *)sm, *sv = sk + ROWS * LD, *sq = sv + ROWS * LD, *sdo = sq + 2 * N * LD;
  float *slse = (float *)(sdo + 2 * N * LD), *sD = slse + 2 * N; // LSE * log2(e), D
  // the causal key tiles early in the sequence have the most queries and come first already
  int k0 = (int)blockIdx.x * ROWS, g = blockIdx.y, b = blockIdx.z, group = NH / NKV;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int key[2] = {k0 + warp * 16 + lane / 4, k0 + warp * 16 + lane / 4 + 8};
  size_t C = (size_t)NH * HS, R = (size_t)(NH + 2 * NKV) * HS;
  const E *qkv_b = qkv + (size_t)b * T * R, *dout_b = dout + (size_t)b * T * C;
  const E *kg = qkv_b + C + (size_t)g * HS, *vg = kg + (size_t)NKV * HS;
  const int32_t *prow = pos ? pos + (size_t)b * T : nullptr;
  int klast = min(T, k0 + ROWS) - 1, wk0 = min(k0 + warp * 16, T - 1), wk1 = min(wk0 + 15, T - 1);
  int dkey[2] = {prow ? fa_doc(prow, key[0], T) : 0, prow ? fa_doc(prow, key[1], T) : 0};
  // the queries that see the block's keys: from the first key (causal) or its document's start
  // to the end of the last key's document
  int qstart = causal ? k0 : prow ? zt_doc_start(prow, k0) : 0;
  int qend = prow ? zt_doc_end(prow, klast + 1, T, zt_doc_start(prow, klast)) : T;
  int ntiles = (qend - qstart + N - 1) / N;
  // tile it of the loop: query head g*group + it/ntiles, its query tile it%ntiles; its rows,
  // LSE and D into buffer i
  auto load = [&](int i, int it) {
    int h = g * group + it / ntiles, q0 = qstart + it % ntiles * N;
    const float *lg = lse + ((size_t)b * NH + h) * T, *Dg = D + ((size_t)b * NH + h) * T;
    fa_load_tile<E, HS, N>(sq + i * N * LD, qkv_b + (size_t)h * HS, R, q0, T, vec);
    fa_load_tile<E, HS, N>(sdo + i * N * LD, dout_b + (size_t)h * HS, C, q0, T, vec);
    if (threadIdx.x < N) {
      int q = q0 + threadIdx.x;
      slse[i * N + threadIdx.x] = q < T ? lg[q] * LOG2E : 0.0f;
      sD[i * N + threadIdx.x] = q < T ? Dg[q] : 0.0f;
    }
  };

  fa_load_tile<E, HS, ROWS>(sk, kg, R, k0, T, vec);
  fa_load_tile<E, HS, ROWS>(sv, vg, R, k0, T, vec);
  load(0, 0);
  fa_cp_commit();
  float dk[HS / 8][4], dv[HS / 8][4];
  fa_zero(dk);
  fa_zero(dv);
  for (int it = 0; it < group * ntiles; it++) {
    int q0 = qstart + it % ntiles * N, i = it & 1;
    if (it + 1 < group * ntiles) {
      load(i ^ 1, it + 1);
      fa_cp_commit();
      fa_cp_wait<1>();
    } else {
      fa_cp_wait<0>();
    }
    __syncthreads();
    const E *qt = sq + i * N * LD, *dot = sdo + i * N * LD;
    // the warp's 16 keys against the tile's queries: S^T = K Q^T, dP^T = V dO^T
    float st[N / 8][4], dpt[N / 8][4];
    fa_zero(st);
    fa_zero(dpt);
    fa_xyt<E, HS, N>(st, sk + warp * 16 * LD, qt);
    fa_xyt<E, HS, N>(dpt, sv + warp * 16 * LD, dot);
    bool mixed = !fa_one_doc(prow, wk0, wk1, min(q0, T - 1), min(q0 + N, T) - 1);
#pragma unroll
    for (int n = 0; n < N / 8; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int c = n * 8 + 2 * (lane % 4) + (e & 1), q = q0 + c, kr = key[e >> 1];
        float p = q < T && kr < T && (!causal || kr <= q) &&
                          (!mixed || zt_doc_start(prow, q) == dkey[e >> 1])
                      ? exp2f(st[n][e] * scale_log2 - slse[i * N + c])
                      : 0.0f;
        st[n][e] = p;
        dpt[n][e] = p * (dpt[n][e] - sD[i * N + c]) * scale;
      }
    fa_py<E, HS, N>(dv, st, dot); // dV += P^T dO
    fa_py<E, HS, N>(dk, dpt, qt); // dK += dS^T Q
    __syncthreads();              // every warp is done with this tile before it is refilled
  }
  E *dkg = dqkv + (size_t)b * T * R + C + (size_t)g * HS, *dvg = dkg + (size_t)NKV * HS;
  fa_add_rows<E, HS>(dkg, R, k0 + warp * 16, T, dk);
  fa_add_rows<E, HS>(dvg, R, k0 + warp * 16, T, dv);
}

// dQ: one block per (64 queries, head, batch element), looping over the visible key tiles;
// dqkv's q rows of the block are added to once, at the end.
template <class E, int HS>
static __global__ void __launch_bounds__(THREADS)
    fa_bwd_q_kernel(E *dqkv, const E *dout, const E *qkv, const float *lse, const float *D,
                    const int32_t *pos, int T, int NH, int NKV, int causal, float scale,
                    float scale_log2, bool vec) {
  constexpr int LD = fa_pitch<HS>::LD, N = fa_bwd_geom<HS>::N;
  extern __shared__ __align__(128) unsigned char sm[];
  E *sq = (E *)sm, *sdo = sq + ROWS * LD, *sk = sdo + ROWS * LD, *sv = sk + 2 * N * LD;
  int q0 = (int)(gridDim.x - 1 - blockIdx.x) * ROWS, h = blockIdx.y, b = blockIdx.z;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int row[2] = {q0 + warp * 16 + lane / 4, q0 + warp * 16 + lane / 4 + 8};
  size_t C = (size_t)NH * HS, R = (size_t)(NH + 2 * NKV) * HS;
  const E *qg = qkv + (size_t)b * T * R + (size_t)h * HS;
  const E *kg = qkv + (size_t)b * T * R + C + (size_t)(h / (NH / NKV)) * HS;
  const E *vg = kg + (size_t)NKV * HS;
  const E *dog = dout + (size_t)b * T * C + (size_t)h * HS;
  const float *lg = lse + ((size_t)b * NH + h) * T, *Dg = D + ((size_t)b * NH + h) * T;
  float l2[2], Dr[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    l2[r] = row[r] < T ? lg[row[r]] * LOG2E : 0.0f;
    Dr[r] = row[r] < T ? Dg[row[r]] : 0.0f;
  }

  const int32_t *prow = pos ? pos + (size_t)b * T : nullptr;
  int qlast = min(T, q0 + ROWS) - 1, wr0 = min(q0 + warp * 16, T - 1), wr1 = min(wr0 + 15, T - 1);
  int drow[2] = {prow ? fa_doc(prow, row[0], T) : 0, prow ? fa_doc(prow, row[1], T) : 0};

  int kend = causal ? qlast + 1
                    : prow ? zt_doc_end(prow, qlast + 1, T, zt_doc_start(prow, qlast)) : T;
  int j0 = prow ? zt_doc_start(prow, q0) / N : 0, ntiles = (kend + N - 1) / N;
  fa_load_tile<E, HS, ROWS>(sq, qg, R, q0, T, vec);
  fa_load_tile<E, HS, ROWS>(sdo, dog, C, q0, T, vec);
  fa_load_tile<E, HS, N>(sk + (j0 & 1) * N * LD, kg, R, j0 * N, T, vec);
  fa_load_tile<E, HS, N>(sv + (j0 & 1) * N * LD, vg, R, j0 * N, T, vec);
  fa_cp_commit();
  float dq[HS / 8][4];
  fa_zero(dq);
  for (int j = j0; j < ntiles; j++) {
    int k0 = j * N, i = j & 1;
    if (j + 1 < ntiles) {
      fa_load_tile<E, HS, N>(sk + (i ^ 1) * N * LD, kg, R, k0 + N, T, vec);
      fa_load_tile<E, HS, N>(sv + (i ^ 1) * N * LD, vg, R, k0 + N, T, vec);
      fa_cp_commit();
      fa_cp_wait<1>();
    } else {
      fa_cp_wait<0>();
    }
    __syncthreads();
    const E *kt = sk + i * N * LD, *vt = sv + i * N * LD;
    // the warp's 16 queries against the tile's keys: S = Q K^T, dP = dO V^T
    float s[N / 8][4], dp[N / 8][4];
    fa_zero(s);
    fa_zero(dp);
    fa_xyt<E, HS, N>(s, sq + warp * 16 * LD, kt);
    fa_xyt<E, HS, N>(dp, sdo + warp * 16 * LD, vt);
    bool mixed = !fa_one_doc(prow, wr0, wr1, k0, min(k0 + N, T) - 1);
#pragma unroll
    for (int n = 0; n < N / 8; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int col = k0 + n * 8 + 2 * (lane % 4) + (e & 1), r = row[e >> 1];
        float p = r < T && col < T && (!causal || col <= r) &&
                          (!mixed || zt_doc_start(prow, col) == drow[e >> 1])
                      ? exp2f(s[n][e] * scale_log2 - l2[e >> 1])
                      : 0.0f;
        dp[n][e] = p * (dp[n][e] - Dr[e >> 1]) * scale;
      }
    fa_py<E, HS, N>(dq, dp, kt); // dQ += dS K
    __syncthreads();             // every warp is done with this tile before it is refilled
  }
  fa_add_rows<E, HS>(dqkv + (size_t)b * T * R + (size_t)h * HS, R, q0 + warp * 16, T, dq);
}

// ---- host side ---------------------------------------------------------------------------------

// the layout of saved and its size are sizes.c's (plain C, for plans in every build)
typedef zt__cuda_flash_layout fa_layout;

// The 16-byte tile loads need the tensors they read 16-byte aligned (row and head offsets are
// multiples of 8 elements since hs is); the model's arenas are, a test's odd pointer is not.
static bool aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }

// Lets kernel take `bytes` of dynamic shared memory (above the default 48 KiB: an opt-in).
template <class K>
static int allow_smem(zt__cuda_ctx *ctx, K kernel, size_t bytes, const char *what) {
  if (zt__cuda_check_rt(ctx,
                        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)bytes),
                        what, __FILE__, __LINE__) < 0)
    return ctx->err;
  return 0;
}

template <class E, int HS>
static int fwd(zt__cuda_ctx *ctx, fa_layout l, E *out, void *saved, const E *qkv, int B, int T,
               int NH, int NKV, int causal, float scale, const int32_t *pos) {
  constexpr size_t smem = fa_fwd_geom<HS>::bytes;
  float *lse = (float *)saved;
  E *o_copy = (E *)((char *)saved + l.o_off);
  bool vec = aligned16(qkv);
  dim3 grid((unsigned)((T + ROWS - 1) / ROWS), (unsigned)NH, (unsigned)B);
  if (allow_smem(ctx, fa_fwd_kernel<E, HS>, smem, "fa_fwd_kernel smem") < 0)
    return ctx->err;
  fa_fwd_kernel<E, HS><<<grid, THREADS, smem, ctx->stream>>>(out, o_copy, lse, qkv, pos, T, NH,
                                                             NKV, causal, scale * LOG2E, vec);
  return zt__cuda_check_rt(ctx, cudaGetLastError(), "fa_fwd_kernel", __FILE__, __LINE__);
}

template <class E, int HS>
static int bwd(zt__cuda_ctx *ctx, fa_layout l, E *dqkv, const E *dout, const E *qkv,
               const void *saved, int B, int T, int NH, int NKV, int causal, float scale,
               const int32_t *pos) {
  typedef fa_bwd_geom<HS> G;
  const float *lse = (const float *)saved;
  const E *o_copy = (const E *)((const char *)saved + l.o_off);
  // D is the scratch part of saved (flash_attention.h)
  float *D = (float *)((char *)saved + l.d_off);
  size_t rows = (size_t)B * NH * T;
  bool vec = aligned16(qkv) && aligned16(dout);
  dim3 grid((unsigned)((T + ROWS - 1) / ROWS), (unsigned)NH, (unsigned)B);
  dim3 kv_grid((unsigned)((T + ROWS - 1) / ROWS), (unsigned)NKV, (unsigned)B);
  fa_rowdot_kernel<E><<<(unsigned)((rows + 7) / 8), 256, 0, ctx->stream>>>(D, dout, o_copy, rows,
                                                                          T, NH * HS, NH, HS);
  if (zt__cuda_check_rt(ctx, cudaGetLastError(), "fa_rowdot_kernel", __FILE__, __LINE__) < 0)
    return ctx->err;
  if (allow_smem(ctx, fa_bwd_kv_kernel<E, HS>, G::kv_bytes, "fa_bwd_kv_kernel smem") < 0)
    return ctx->err;
  fa_bwd_kv_kernel<E, HS><<<kv_grid, THREADS, G::kv_bytes, ctx->stream>>>(
      dqkv, dout, qkv, lse, D, pos, T, NH, NKV, causal, scale, scale * LOG2E, vec);
  if (zt__cuda_check_rt(ctx, cudaGetLastError(), "fa_bwd_kv_kernel", __FILE__, __LINE__) < 0)
    return ctx->err;
  if (allow_smem(ctx, fa_bwd_q_kernel<E, HS>, G::q_bytes, "fa_bwd_q_kernel smem") < 0)
    return ctx->err;
  fa_bwd_q_kernel<E, HS><<<grid, THREADS, G::q_bytes, ctx->stream>>>(
      dqkv, dout, qkv, lse, D, pos, T, NH, NKV, causal, scale, scale * LOG2E, vec);
  return zt__cuda_check_rt(ctx, cudaGetLastError(), "fa_bwd_q_kernel", __FILE__, __LINE__);
}

// Runs the statement with E the 16-bit storage type of dt and HS the head size.
#define FA_DISPATCH(dt, hs, ...)                                                               \
  do {                                                                                         \
    if ((dt) == ZT_BF16) {                                                                     \
      typedef __nv_bfloat16 E;                                                                 \
      FA_DISPATCH_HS(hs, __VA_ARGS__);                                                         \
    } else {                                                                                   \
      typedef __half E;                                                                        \
      FA_DISPATCH_HS(hs, __VA_ARGS__);                                                         \
    }                                                                                          \
  } while (0)
#define FA_DISPATCH_HS(hs, ...)                                                                \
  do {                                                                                         \
    if ((hs) == 32) {                                                                          \
      constexpr int HS = 32;                                                                   \
      __VA_ARGS__;                                                                             \
    } else if ((hs) == 64) {                                                                   \
      constexpr int HS = 64;                                                                   \
      __VA_ARGS__;                                                                             \
    } else if ((hs) == 80) {                                                                   \
      constexpr int HS = 80;                                                                   \
      __VA_ARGS__;                                                                             \
    } else if ((hs) == 96) {                                                                   \
      constexpr int HS = 96;                                                                   \
      __VA_ARGS__;                                                                             \
    } else {                                                                                   \
      constexpr int HS = 128;                                                                  \
      __VA_ARGS__;                                                                             \
    }                                                                                          \
  } while (0)

extern "C" int zt__cuda_flash_fwd(zt__cuda_ctx *ctx, zt_dtype dt, void *out, void *saved,
                                  const void *qkv, int B, int T, int NH, int NKV, int hs,
                                  int causal, const int32_t *pos) {
  float scale = 1.0f / sqrtf((float)hs);
  fa_layout l = zt__cuda_att_flash_layout(dt, B, T, NH, hs);
  FA_DISPATCH(dt, hs,
              fwd<E, HS>(ctx, l, (E *)out, saved, (const E *)qkv, B, T, NH, NKV, causal, scale,
                         pos));
  return ctx->err;
}

extern "C" int zt__cuda_flash_bwd(zt__cuda_ctx *ctx, zt_dtype dt, void *dqkv, const void *dout,
                                  const void *qkv, const void *saved, int B, int T, int NH,
                                  int NKV, int hs, int causal, const int32_t *pos) {
  float scale = 1.0f / sqrtf((float)hs);
  fa_layout l = zt__cuda_att_flash_layout(dt, B, T, NH, hs);
  FA_DISPATCH(dt, hs,
              bwd<E, HS>(ctx, l, (E *)dqkv, (const E *)dout, (const E *)qkv, saved, B, T, NH,
                         NKV, causal, scale, pos));
  return ctx->err;
}
