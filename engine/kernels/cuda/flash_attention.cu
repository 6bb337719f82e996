// Flash attention (FlashAttention-2's algorithm) for bf16/fp16 on tensor cores through WMMA
// (16x16x16 fragments, fp32 accumulators). Layout of saved and the choice of path: see
// flash_attention.h.
//
// Tiles of TILE = 64 queries and 64 keys; a block of 4 warps, each warp owning 16 rows of the
// tile (queries in the forward and the dQ kernel, keys in the dK/dV kernel), so the row-wise
// work (softmax statistics, dS) needs only __syncwarp, and __syncthreads guards the tiles that
// all warps share. Rows past T are loaded as zeros, masked out of every softmax and never
// written.
//
// Roundings, as in the cuBLAS path: the probabilities (unnormalised in the forward, exp(s-m)
// <= 1) and dS are rounded to dt for the tensor-core products that read them; scores,
// statistics, dP and every accumulator are fp32, and each output is rounded once.
//
// Determinism: no atomics. The forward and the dQ kernel own their query rows, the dK/dV kernel
// its key rows; every sum runs in an order fixed by the shapes.
#include <math.h>
#include <stdint.h>

#include <mma.h>

#include "engine/kernels/cuda/flash_attention.h"
#include "engine/kernels/cuda/lowp.cuh"
#include "engine/kernels/cuda/reduce.cuh"

using namespace nvcuda;

#define TILE 64
#define WARPS 4
#define THREADS (WARPS * 32)
#define WROWS 16 // rows of a tile per warp: TILE / WARPS

// Shared-memory geometry for head size HS. Row pitches are padded (fewer bank conflicts) and
// keep WMMA's rules: a multiple of 8 elements for 16-bit types, of 4 for fp32, and every
// fragment pointer 32-byte aligned (16-row and 16-column offsets of these pitches are).
__host__ __device__ constexpr size_t fa_r128(size_t x) { return (x + 127) / 128 * 128; }
template <int HS> struct fa_geom {
  static constexpr int LDH = HS + 8;   // q, k, v, dO tiles in dt: TILE x HS
  static constexpr int LDS = TILE + 4; // fp32 scores / dP: TILE x TILE
  static constexpr int LDP = TILE + 8; // P / dS in dt: TILE x TILE
  static constexpr int LDO = HS + 4;   // the forward's fp32 output accumulator: TILE x HS
  static constexpr size_t H = fa_r128((size_t)TILE * LDH * 2);
  static constexpr size_t S = fa_r128((size_t)TILE * LDS * 4);
  static constexpr size_t P = fa_r128((size_t)TILE * LDP * 2);
  static constexpr size_t O = fa_r128((size_t)TILE * LDO * 4);
  static constexpr size_t V = fa_r128((size_t)TILE * 4); // one fp32 per row
  static constexpr size_t fwd_bytes = 3 * H + S + P + O + 2 * V;
  static constexpr size_t kv_bytes = 4 * H + 2 * S + 2 * P + 2 * V;
  static constexpr size_t q_bytes = 4 * H + 2 * S + P + 2 * V;
};

// Rows [r0, r0 + TILE) of an (T, ld) matrix whose row 0 starts at g, HS columns, into s (pitch
// HS + 8); rows past T become zeros. vec: g and ld allow 16-byte loads.
template <class E, int HS>
static __device__ void fa_load_tile(E *s, const E *g, size_t ld, int r0, int T, bool vec) {
  constexpr int LDH = fa_geom<HS>::LDH;
  if (vec) {
    constexpr int PER = 16 / (int)sizeof(E); // elements per 16-byte vector
    constexpr int VPR = HS / PER;
    for (int i = threadIdx.x; i < TILE * VPR; i += THREADS) {
      int r = i / VPR, c = i % VPR * PER;
      int4 x = make_int4(0, 0, 0, 0);
      if (r0 + r < T)
        x = *(const int4 *)(g + (size_t)(r0 + r) * ld + c);
      *(int4 *)(s + r * LDH + c) = x;
    }
  } else {
    for (int i = threadIdx.x; i < TILE * HS; i += THREADS) {
      int r = i / HS, c = i % HS;
      s[r * LDH + c] = r0 + r < T ? g[(size_t)(r0 + r) * ld + c] : zt__st<E>(0.0f);
    }
  }
}

// TILE fp32 values per row, v[r0 + r] for r0 + r < T, else 0.
static __device__ void fa_load_rows(float *s, const float *v, int r0, int T) {
  if (threadIdx.x < TILE)
    s[threadIdx.x] = r0 + (int)threadIdx.x < T ? v[r0 + threadIdx.x] : 0.0f;
}

template <class E> using frag_a = wmma::fragment<wmma::matrix_a, 16, 16, 16, E, wmma::row_major>;
template <class E>
using frag_bc = wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::col_major>;
template <class E>
using frag_br = wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::row_major>;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;

// The warp's 16 rows of X Y^T into out (16 x TILE, fp32, pitch LDS): x holds the warp's rows
// (16 x HS, pitch LDH), y the TILE rows (TILE x HS, pitch LDH).
template <class E, int HS>
static __device__ void fa_rows_xyt(float *out, const E *x, const E *y) {
  constexpr int LDH = fa_geom<HS>::LDH, LDS = fa_geom<HS>::LDS;
#pragma unroll
  for (int n = 0; n < TILE / 16; n++) {
    frag_c acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) {
      frag_a<E> a;
      frag_bc<E> b;
      wmma::load_matrix_sync(a, x + kk * 16, LDH);
      wmma::load_matrix_sync(b, y + n * 16 * LDH + kk * 16, LDH);
      wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(out + n * 16, acc, LDS, wmma::mem_row_major);
  }
}

// acc[n] += X Y for the warp: x its 16 rows of a TILE-wide dt matrix (pitch LDP), y (TILE x HS,
// pitch LDH); acc[n] covers columns [16n, 16n + 16).
template <class E, int HS>
static __device__ void fa_rows_xy(frag_c *acc, const E *x, const E *y) {
  constexpr int LDH = fa_geom<HS>::LDH, LDP = fa_geom<HS>::LDP;
#pragma unroll
  for (int kk = 0; kk < TILE / 16; kk++) {
    frag_a<E> a;
    wmma::load_matrix_sync(a, x + kk * 16, LDP);
#pragma unroll
    for (int n = 0; n < HS / 16; n++) {
      frag_br<E> b;
      wmma::load_matrix_sync(b, y + kk * 16 * LDH + n * 16, LDH);
      wmma::mma_sync(acc[n], a, b, acc[n]);
    }
  }
}

// g[row r][c] += acc for the warp's 16 rows (rows from row0; those >= T skipped), through the
// warp's 16 rows of the fp32 staging area st (pitch LDS >= 16).
template <class E, int HS>
static __device__ void fa_add_rows(E *g, size_t ld, int row0, int T, const frag_c *acc,
                                   float *st) {
  constexpr int LDS = fa_geom<HS>::LDS;
  int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < HS / 16; n++) {
    __syncwarp();
    wmma::store_matrix_sync(st, acc[n], LDS, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 16 * 16; e += 32) {
      int r = e / 16, c = e % 16;
      if (row0 + r < T) {
        E *p = g + (size_t)(row0 + r) * ld + n * 16 + c;
        *p = zt__st<E>(zt__ld(*p) + st[r * LDS + c]);
      }
    }
  }
}

// ---- forward: one block per (query tile, head, batch element) --------------------------------
template <class E, int HS>
static __global__ void __launch_bounds__(THREADS)
    fa_fwd_kernel(E *out, E *o_copy, float *lse, const E *qkv, int T, int C, int NH, int causal,
                  float scale, bool vec) {
  typedef fa_geom<HS> G;
  extern __shared__ __align__(128) unsigned char sm[];
  E *sq = (E *)sm, *sk = (E *)(sm + G::H), *sv = (E *)(sm + 2 * G::H);
  float *ss = (float *)(sm + 3 * G::H);
  E *sp = (E *)(sm + 3 * G::H + G::S);
  float *so = (float *)(sm + 3 * G::H + G::S + G::P);
  float *sm_max = (float *)(sm + 3 * G::H + G::S + G::P + G::O);
  float *sm_sum = (float *)(sm + 3 * G::H + G::S + G::P + G::O + G::V);
  // the causal tiles far down the sequence have the most keys: start them first
  int q0 = (int)(gridDim.x - 1 - blockIdx.x) * TILE, h = blockIdx.y, b = blockIdx.z;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32, w0 = warp * WROWS;
  size_t C3 = 3 * (size_t)C;
  const E *qg = qkv + (size_t)b * T * C3 + (size_t)h * HS, *kg = qg + C, *vg = qg + 2 * (size_t)C;

  fa_load_tile<E, HS>(sq, qg, C3, q0, T, vec);
  for (int i = threadIdx.x; i < TILE * G::LDO; i += THREADS)
    so[i] = 0.0f;
  if (threadIdx.x < TILE) {
    sm_max[threadIdx.x] = -INFINITY;
    sm_sum[threadIdx.x] = 0.0f;
  }
  int kend = causal ? min(T, q0 + TILE) : T;
  for (int k0 = 0; k0 < kend; k0 += TILE) {
    __syncthreads(); // every warp is done with the previous K and V tiles
    fa_load_tile<E, HS>(sk, kg, C3, k0, T, vec);
    fa_load_tile<E, HS>(sv, vg, C3, k0, T, vec);
    __syncthreads();
    fa_rows_xyt<E, HS>(ss + w0 * G::LDS, sq + w0 * G::LDH, sk);
    __syncwarp();
    // online softmax of the warp's rows: lanes 2r' and 2r'+1 share row w0 + r', each taking
    // every other score of the tile (fixed order: the pair's sums combine with one shuffle)
    {
      int r = w0 + lane / 2, half = lane % 2, i = q0 + r;
      const float *srow = ss + r * G::LDS;
      float mx = -INFINITY;
      for (int c = half; c < TILE; c += 2) {
        int j = k0 + c;
        if (j < T && (!causal || j <= i))
          mx = fmaxf(mx, srow[c] * scale);
      }
      mx = fmaxf(mx, __shfl_xor_sync(ZT__FULL_MASK, mx, 1));
      // m_new is finite: key 0 of the first tile is visible from every row (padding rows
      // past T included); the first tile's alpha is exp(-inf) = 0
      float m_old = sm_max[r], m_new = fmaxf(m_old, mx);
      float alpha = expf(m_old - m_new), sum = 0.0f;
      for (int c = half; c < TILE; c += 2) {
        int j = k0 + c;
        float p = j < T && (!causal || j <= i) ? expf(srow[c] * scale - m_new) : 0.0f;
        sum += p;
        sp[r * G::LDP + c] = zt__st<E>(p);
      }
      sum += __shfl_xor_sync(ZT__FULL_MASK, sum, 1);
      for (int d = half; d < HS; d += 2)
        so[r * G::LDO + d] *= alpha;
      __syncwarp(); // both lanes of the pair have read the old statistics
      if (half == 0) {
        sm_max[r] = m_new;
        sm_sum[r] = sm_sum[r] * alpha + sum;
      }
    }
    __syncwarp();
    // O += P V for the warp's rows, the accumulator living in shared memory
#pragma unroll
    for (int n = 0; n < HS / 16; n++) {
      frag_c acc;
      float *o = so + w0 * G::LDO + n * 16;
      wmma::load_matrix_sync(acc, o, G::LDO, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < TILE / 16; kk++) {
        frag_a<E> a;
        frag_br<E> bv;
        wmma::load_matrix_sync(a, sp + w0 * G::LDP + kk * 16, G::LDP);
        wmma::load_matrix_sync(bv, sv + kk * 16 * G::LDH + n * 16, G::LDH);
        wmma::mma_sync(acc, a, bv, acc);
      }
      wmma::store_matrix_sync(o, acc, G::LDO, wmma::mem_row_major);
    }
  }
  __syncwarp();
  for (int r = w0; r < w0 + WROWS; r++) {
    int i = q0 + r;
    if (i >= T)
      break;
    float inv = 1.0f / sm_sum[r];
    size_t row = ((size_t)b * T + i) * C + (size_t)h * HS;
    for (int d = lane; d < HS; d += 32) {
      E o = zt__st<E>(so[r * G::LDO + d] * inv);
      out[row + d] = o;
      o_copy[row + d] = o;
    }
    if (lane == 0)
      lse[((size_t)b * NH + h) * T + i] = sm_max[r] + logf(sm_sum[r]);
  }
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

// The probability of query i on key j recomputed from the score s and the query's LSE l; 0
// where the key is masked or either row lies past T.
static __device__ __forceinline__ float fa_p(float s, float l, int i, int j, int T, int causal,
                                             float scale) {
  return i < T && j < T && (!causal || j <= i) ? expf(s * scale - l) : 0.0f;
}

// dK and dV: one block per (key tile, head, batch element), looping over the query tiles that
// see its keys; dqkv's k and v rows of the tile are added to once, at the end.
template <class E, int HS>
static __global__ void __launch_bounds__(THREADS)
    fa_bwd_kv_kernel(E *dqkv, const E *dout, const E *qkv, const float *lse, const float *D,
                     int T, int C, int NH, int causal, float scale, bool vec) {
  typedef fa_geom<HS> G;
  extern __shared__ __align__(128) unsigned char sm[];
  E *sk = (E *)sm, *sv = (E *)(sm + G::H), *sq = (E *)(sm + 2 * G::H);
  E *sdo = (E *)(sm + 3 * G::H);
  float *ss = (float *)(sm + 4 * G::H), *sdp = (float *)(sm + 4 * G::H + G::S);
  E *spt = (E *)(sm + 4 * G::H + 2 * G::S), *sdst = (E *)(sm + 4 * G::H + 2 * G::S + G::P);
  float *slse = (float *)(sm + 4 * G::H + 2 * G::S + 2 * G::P);
  float *sD = (float *)(sm + 4 * G::H + 2 * G::S + 2 * G::P + G::V);
  // the causal key tiles early in the sequence have the most queries and come first already
  int k0 = (int)blockIdx.x * TILE, h = blockIdx.y, b = blockIdx.z;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32, w0 = warp * WROWS;
  size_t C3 = 3 * (size_t)C;
  const E *qg = qkv + (size_t)b * T * C3 + (size_t)h * HS, *kg = qg + C, *vg = qg + 2 * (size_t)C;
  const E *dog = dout + (size_t)b * T * C + (size_t)h * HS;
  const float *lg = lse + ((size_t)b * NH + h) * T, *Dg = D + ((size_t)b * NH + h) * T;

  fa_load_tile<E, HS>(sk, kg, C3, k0, T, vec);
  fa_load_tile<E, HS>(sv, vg, C3, k0, T, vec);
  frag_c dk[HS / 16], dv[HS / 16];
#pragma unroll
  for (int n = 0; n < HS / 16; n++) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }
  for (int q0 = causal ? k0 : 0; q0 < T; q0 += TILE) {
    __syncthreads(); // every warp is done with the previous query tile
    fa_load_tile<E, HS>(sq, qg, C3, q0, T, vec);
    fa_load_tile<E, HS>(sdo, dog, C, q0, T, vec);
    fa_load_rows(slse, lg, q0, T);
    fa_load_rows(sD, Dg, q0, T);
    __syncthreads();
    // the warp's 16 keys against the tile's queries: S^T = K Q^T, dP^T = V dO^T
    fa_rows_xyt<E, HS>(ss + w0 * G::LDS, sk + w0 * G::LDH, sq);
    fa_rows_xyt<E, HS>(sdp + w0 * G::LDS, sv + w0 * G::LDH, sdo);
    __syncwarp();
    for (int e = lane; e < WROWS * TILE; e += 32) {
      int r = w0 + e / TILE, c = e % TILE;
      float p = fa_p(ss[r * G::LDS + c], slse[c], q0 + c, k0 + r, T, causal, scale);
      spt[r * G::LDP + c] = zt__st<E>(p);
      sdst[r * G::LDP + c] = zt__st<E>(p * (sdp[r * G::LDS + c] - sD[c]) * scale);
    }
    __syncwarp();
    // dV += P^T dO, dK += dS^T Q
    fa_rows_xy<E, HS>(dv, spt + w0 * G::LDP, sdo);
    fa_rows_xy<E, HS>(dk, sdst + w0 * G::LDP, sq);
  }
  // the staging area is the warp's own rows of ss, which no other warp reads
  E *dkg = dqkv + (size_t)b * T * C3 + (size_t)h * HS + C, *dvg = dkg + C;
  fa_add_rows<E, HS>(dkg, C3, k0 + w0, T, dk, ss + w0 * G::LDS);
  fa_add_rows<E, HS>(dvg, C3, k0 + w0, T, dv, ss + w0 * G::LDS);
}

// dQ: one block per (query tile, head, batch element), looping over the visible key tiles;
// dqkv's q rows of the tile are added to once, at the end.
template <class E, int HS>
static __global__ void __launch_bounds__(THREADS)
    fa_bwd_q_kernel(E *dqkv, const E *dout, const E *qkv, const float *lse, const float *D,
                    int T, int C, int NH, int causal, float scale, bool vec) {
  typedef fa_geom<HS> G;
  extern __shared__ __align__(128) unsigned char sm[];
  E *sq = (E *)sm, *sdo = (E *)(sm + G::H), *sk = (E *)(sm + 2 * G::H);
  E *sv = (E *)(sm + 3 * G::H);
  float *ss = (float *)(sm + 4 * G::H), *sdp = (float *)(sm + 4 * G::H + G::S);
  E *sds = (E *)(sm + 4 * G::H + 2 * G::S);
  float *slse = (float *)(sm + 4 * G::H + 2 * G::S + G::P);
  float *sD = (float *)(sm + 4 * G::H + 2 * G::S + G::P + G::V);
  int q0 = (int)(gridDim.x - 1 - blockIdx.x) * TILE, h = blockIdx.y, b = blockIdx.z;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32, w0 = warp * WROWS;
  size_t C3 = 3 * (size_t)C;
  const E *qg = qkv + (size_t)b * T * C3 + (size_t)h * HS, *kg = qg + C, *vg = qg + 2 * (size_t)C;
  const E *dog = dout + (size_t)b * T * C + (size_t)h * HS;
  const float *lg = lse + ((size_t)b * NH + h) * T, *Dg = D + ((size_t)b * NH + h) * T;

  fa_load_tile<E, HS>(sq, qg, C3, q0, T, vec);
  fa_load_tile<E, HS>(sdo, dog, C, q0, T, vec);
  fa_load_rows(slse, lg, q0, T);
  fa_load_rows(sD, Dg, q0, T);
  frag_c dq[HS / 16];
#pragma unroll
  for (int n = 0; n < HS / 16; n++)
    wmma::fill_fragment(dq[n], 0.0f);
  int kend = causal ? min(T, q0 + TILE) : T;
  for (int k0 = 0; k0 < kend; k0 += TILE) {
    __syncthreads(); // every warp is done with the previous K and V tiles
    fa_load_tile<E, HS>(sk, kg, C3, k0, T, vec);
    fa_load_tile<E, HS>(sv, vg, C3, k0, T, vec);
    __syncthreads();
    // the warp's 16 queries against the tile's keys: S = Q K^T, dP = dO V^T
    fa_rows_xyt<E, HS>(ss + w0 * G::LDS, sq + w0 * G::LDH, sk);
    fa_rows_xyt<E, HS>(sdp + w0 * G::LDS, sdo + w0 * G::LDH, sv);
    __syncwarp();
    for (int e = lane; e < WROWS * TILE; e += 32) {
      int r = w0 + e / TILE, c = e % TILE;
      float p = fa_p(ss[r * G::LDS + c], slse[r], q0 + r, k0 + c, T, causal, scale);
      sds[r * G::LDP + c] = zt__st<E>(p * (sdp[r * G::LDS + c] - sD[r]) * scale);
    }
    __syncwarp();
    // dQ += dS K
    fa_rows_xy<E, HS>(dq, sds + w0 * G::LDP, sk);
  }
  fa_add_rows<E, HS>(dqkv + (size_t)b * T * C3 + (size_t)h * HS, C3, q0 + w0, T, dq,
                     ss + w0 * G::LDS);
}

// ---- host side ---------------------------------------------------------------------------------

static size_t align256(size_t x) { return (x + 255) / 256 * 256; }

typedef struct fa_layout {
  size_t o_off, d_off, bytes;
} fa_layout;

static fa_layout layout(zt_dtype dt, int B, int T, int C, int NH) {
  size_t rows = (size_t)B * NH * T;
  fa_layout l;
  l.o_off = align256(rows * sizeof(float));
  l.d_off = l.o_off + align256((size_t)B * T * C * zt_dtype_size(dt));
  l.bytes = l.d_off + rows * sizeof(float);
  return l;
}

extern "C" bool zt__cuda_flash_supported(zt_dtype dt, int B, int C, int NH) {
  if (dt == ZT_F32 || NH <= 0 || C <= 0 || C % NH != 0 || B > 65535 || NH > 65535)
    return false;
  int hs = C / NH;
  return hs == 32 || hs == 64 || hs == 128;
}

extern "C" size_t zt__cuda_flash_saved_bytes(zt_dtype dt, int B, int T, int C, int NH) {
  if (B <= 0 || T <= 0)
    return 0;
  return layout(dt, B, T, C, NH).bytes;
}

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
               int C, int NH, int causal, float scale) {
  typedef fa_geom<HS> G;
  float *lse = (float *)saved;
  E *o_copy = (E *)((char *)saved + l.o_off);
  bool vec = aligned16(qkv);
  dim3 grid((unsigned)((T + TILE - 1) / TILE), (unsigned)NH, (unsigned)B);
  if (allow_smem(ctx, fa_fwd_kernel<E, HS>, G::fwd_bytes, "fa_fwd_kernel smem") < 0)
    return ctx->err;
  fa_fwd_kernel<E, HS><<<grid, THREADS, G::fwd_bytes, ctx->stream>>>(out, o_copy, lse, qkv, T, C,
                                                                      NH, causal, scale, vec);
  return zt__cuda_check_rt(ctx, cudaGetLastError(), "fa_fwd_kernel", __FILE__, __LINE__);
}

template <class E, int HS>
static int bwd(zt__cuda_ctx *ctx, fa_layout l, E *dqkv, const E *dout, const E *qkv,
               const void *saved, int B, int T, int C, int NH, int causal, float scale) {
  typedef fa_geom<HS> G;
  const float *lse = (const float *)saved;
  const E *o_copy = (const E *)((const char *)saved + l.o_off);
  // D is the scratch part of saved (flash_attention.h)
  float *D = (float *)((char *)saved + l.d_off);
  size_t rows = (size_t)B * NH * T;
  bool vec = aligned16(qkv) && aligned16(dout);
  dim3 grid((unsigned)((T + TILE - 1) / TILE), (unsigned)NH, (unsigned)B);
  fa_rowdot_kernel<E><<<(unsigned)((rows + 7) / 8), 256, 0, ctx->stream>>>(D, dout, o_copy, rows,
                                                                          T, C, NH, HS);
  if (zt__cuda_check_rt(ctx, cudaGetLastError(), "fa_rowdot_kernel", __FILE__, __LINE__) < 0)
    return ctx->err;
  if (allow_smem(ctx, fa_bwd_kv_kernel<E, HS>, G::kv_bytes, "fa_bwd_kv_kernel smem") < 0)
    return ctx->err;
  fa_bwd_kv_kernel<E, HS><<<grid, THREADS, G::kv_bytes, ctx->stream>>>(
      dqkv, dout, qkv, lse, D, T, C, NH, causal, scale, vec);
  if (zt__cuda_check_rt(ctx, cudaGetLastError(), "fa_bwd_kv_kernel", __FILE__, __LINE__) < 0)
    return ctx->err;
  if (allow_smem(ctx, fa_bwd_q_kernel<E, HS>, G::q_bytes, "fa_bwd_q_kernel smem") < 0)
    return ctx->err;
  fa_bwd_q_kernel<E, HS><<<grid, THREADS, G::q_bytes, ctx->stream>>>(dqkv, dout, qkv, lse, D, T,
                                                                     C, NH, causal, scale, vec);
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
    } else {                                                                                   \
      constexpr int HS = 128;                                                                  \
      __VA_ARGS__;                                                                             \
    }                                                                                          \
  } while (0)

extern "C" int zt__cuda_flash_fwd(zt__cuda_ctx *ctx, zt_dtype dt, void *out, void *saved,
                                  const void *qkv, int B, int T, int C, int NH, int causal) {
  int hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  fa_layout l = layout(dt, B, T, C, NH);
  FA_DISPATCH(dt, hs,
              fwd<E, HS>(ctx, l, (E *)out, saved, (const E *)qkv, B, T, C, NH, causal, scale));
  return ctx->err;
}

extern "C" int zt__cuda_flash_bwd(zt__cuda_ctx *ctx, zt_dtype dt, void *dqkv, const void *dout,
                                  const void *qkv, const void *saved, int B, int T, int C,
                                  int NH, int causal) {
  int hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  fa_layout l = layout(dt, B, T, C, NH);
  FA_DISPATCH(dt, hs,
              bwd<E, HS>(ctx, l, (E *)dqkv, (const E *)dout, (const E *)qkv, saved, B, T, C, NH,
                         causal, scale));
  return ctx->err;
}
