/* SwiGLU, the gated MLP of the Llama family: out = silu(gate) * up, with gate and up the two
 * halves of one matmul's output row (gate_proj | up_proj). silu(g) = g / (1 + exp(-g)), as
 * torch computes it. Every element is its own output, so any split over threads gives the same
 * bits. */
#include <math.h>
#include <stddef.h>

#include "engine/kernels/cpu/cpu.h"

void zt__cpu_swiglu_fwd(void *ctx, float *out, const float *inp, int N, int F) {
  ZT__PARALLEL_FOR(zt__cpu_threads(ctx), (long)N * F > ZT__CPU_PAR_MIN)
  for (int n = 0; n < N; n++) {
    const float *g = inp + (ptrdiff_t)n * 2 * F, *u = g + F;
    float *o = out + (ptrdiff_t)n * F;
    for (int f = 0; f < F; f++)
      o[f] = g[f] / (1.0f + expf(-g[f])) * u[f];
  }
}

/* d gate = dout * up * sig * (1 + g * (1 - sig)) with sig = 1 / (1 + exp(-g));
 * d up = dout * silu(g). */
void zt__cpu_swiglu_bwd(void *ctx, float *dinp, const float *inp, const float *dout, int N,
                        int F) {
  ZT__PARALLEL_FOR(zt__cpu_threads(ctx), (long)N * F > ZT__CPU_PAR_MIN)
  for (int n = 0; n < N; n++) {
    const float *g = inp + (ptrdiff_t)n * 2 * F, *u = g + F;
    const float *d = dout + (ptrdiff_t)n * F;
    float *dg = dinp + (ptrdiff_t)n * 2 * F, *du = dg + F;
    for (int f = 0; f < F; f++) {
      float e = 1.0f + expf(-g[f]);
      float sig = 1.0f / e, silu = g[f] / e;
      dg[f] += d[f] * u[f] * (sig * (1.0f + g[f] * (1.0f - sig)));
      du[f] += d[f] * silu;
    }
  }
}
