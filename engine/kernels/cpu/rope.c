/* Rotary position embedding, transformers' rotate_half convention: dimension i of a head turns
 * with dimension i + hs/2 by the angle pos * inv_freq[i] (not adjacent pairs). The angle is the
 * fp32 product, as transformers forms it; cos and sin are evaluated in double and rounded to
 * fp32 (transformers' fp32 cos/sin agree within an ulp), which any libm and the CUDA twin give
 * alike. Every (token, head) row is its own output, so threads split tokens. */
#include <math.h>
#include <stddef.h>

#include "engine/kernels/cpu/cpu.h"

/* dir = 1 rotates by +a (forward), -1 by -a (backward: the transpose of the rotation). */
static void rope(void *ctx, float *x, const float *inv_freq, const int32_t *pos, int N, int H,
                 int hs, ptrdiff_t stride, int dir) {
  int half = hs / 2;
  ZT__PARALLEL_FOR(zt__cpu_threads(ctx), (long)N * H * hs > ZT__CPU_PAR_MIN)
  for (int n = 0; n < N; n++) {
    float p = (float)pos[n];
    for (int i = 0; i < half; i++) {
      float a = p * inv_freq[i];
      float c = (float)cos((double)a), s = (float)sin((double)a);
      if (dir < 0)
        s = -s;
      for (int h = 0; h < H; h++) {
        float *xh = x + (ptrdiff_t)n * stride + (ptrdiff_t)h * hs;
        float x1 = xh[i], x2 = xh[i + half];
        xh[i] = x1 * c - x2 * s;
        xh[i + half] = x2 * c + x1 * s;
      }
    }
  }
}

void zt__cpu_rope_fwd(void *ctx, float *x, const float *inv_freq, const int32_t *pos, int N,
                      int H, int hs, ptrdiff_t stride) {
  rope(ctx, x, inv_freq, pos, N, H, hs, stride, 1);
}

void zt__cpu_rope_bwd(void *ctx, float *dx, const float *inv_freq, const int32_t *pos, int N,
                      int H, int hs, ptrdiff_t stride) {
  rope(ctx, dx, inv_freq, pos, N, H, hs, stride, -1);
}
