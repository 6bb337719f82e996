/* Elementwise ops: GELU (tanh approximation), ReLU, add, scale. Each element is its own output,
 * so any split over threads gives the same bits. */
#include <math.h>
#include <stddef.h>

#include "engine/kernels/cpu/cpu.h"

/* sqrt(2/pi) and the cubic coefficient of the tanh approximation (GPT-2, torch 'tanh'). */
#define GELU_SCALE 0.7978845608028654f
#define GELU_CUBIC 0.044715f

void zt__cpu_gelu_fwd(void *ctx, float *out, const float *inp, size_t n) {
  ZT__PARALLEL_FOR(zt__cpu_threads(ctx), n > ZT__CPU_PAR_MIN)
  for (size_t i = 0; i < n; i++) {
    float x = inp[i];
    float cube = GELU_CUBIC * x * x * x;
    out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + cube)));
  }
}

void zt__cpu_gelu_bwd(void *ctx, float *dinp, const float *inp, const float *dout, size_t n) {
  ZT__PARALLEL_FOR(zt__cpu_threads(ctx), n > ZT__CPU_PAR_MIN)
  for (size_t i = 0; i < n; i++) {
    float x = inp[i];
    float th = tanhf(GELU_SCALE * (x + GELU_CUBIC * x * x * x));
    /* sech^2 as 1 - tanh^2: coshf would overflow for large |x| */
    float sech2 = 1.0f - th * th;
    float local = 0.5f * (1.0f + th) +
                  0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * GELU_CUBIC * x * x);
    dinp[i] += local * dout[i];
  }
}

void zt__cpu_relu_fwd(void *ctx, float *out, const float *inp, size_t n) {
  ZT__PARALLEL_FOR(zt__cpu_threads(ctx), n > ZT__CPU_PAR_MIN)
  for (size_t i = 0; i < n; i++)
    out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

void zt__cpu_relu_bwd(void *ctx, float *dinp, const float *inp, const float *dout, size_t n) {
  ZT__PARALLEL_FOR(zt__cpu_threads(ctx), n > ZT__CPU_PAR_MIN)
  for (size_t i = 0; i < n; i++)
    dinp[i] += inp[i] > 0.0f ? dout[i] : 0.0f;
}

void zt__cpu_add(void *ctx, float *out, const float *a, const float *b, size_t n) {
  ZT__PARALLEL_FOR(zt__cpu_threads(ctx), n > ZT__CPU_PAR_MIN)
  for (size_t i = 0; i < n; i++)
    out[i] = a[i] + b[i];
}

void zt__cpu_scale(void *ctx, float *x, float s, size_t n) {
  ZT__PARALLEL_FOR(zt__cpu_threads(ctx), n > ZT__CPU_PAR_MIN)
  for (size_t i = 0; i < n; i++)
    x[i] *= s;
}
