/* defines: the document spans of a row of tokens from their positions (ops.h, "Documents").
 * Called by the attention and embedding ops of both backends, in host and device code, so that
 * every backend reads a row's documents, and any malformed positions, the same way. */
#ifndef ZT_KERNELS_DOCS_H
#define ZT_KERNELS_DOCS_H

#include <stdint.h>

#ifdef __CUDACC__
#define ZT_DOCS_FN static __host__ __device__ __forceinline__
#else
#define ZT_DOCS_FN static inline
#endif

/* The first token of token t's document in a row of positions pos: t - pos[t], the position
 * clamped into [0, t] so that no input points outside the row. */
ZT_DOCS_FN int zt_doc_start(const int32_t *pos, int t) {
  int p = pos[t];
  return p < 0 ? t : p > t ? 0 : t - p;
}

/* The first token in [lo, hi) outside the document that starts at s (hi when there is none),
 * given that token lo - 1 is in it. Starts never decrease along a row, so a binary search
 * finds it; on a malformed row it still returns a token in [lo, hi]. */
ZT_DOCS_FN int zt_doc_end(const int32_t *pos, int lo, int hi, int s) {
  if (lo < hi && zt_doc_start(pos, hi - 1) == s)
    return hi; /* the common case, a document to the end of the range, in one read */
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if (zt_doc_start(pos, mid) == s)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

#endif
