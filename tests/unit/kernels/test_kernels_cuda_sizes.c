/* The cuda backend's attention sizes, which plans of cuda jobs are made with in every build (a
 * CPU-only one and a CPU daemon included: engine/kernels/cuda/sizes.c, through
 * zt_backend_ops_of("cuda")), against the layouts the CUDA ops use, written out here from their
 * definitions: fp32's probabilities and the backward's dP scratch of as many elements as fit
 * 16 MiB; bf16/fp16 flash attention's LSE | a copy of O | D, each part 256-byte aligned, for
 * head sizes 32, 64, 80, 96, 128; the other head sizes' P in dt | S/dS fp32 | dS in dt. A shape
 * whose B or T is 0 saves nothing. */
#include <stdio.h>
#include <string.h>

#include "engine/kernels/backend.h"
#include "tests/unit/kernels/kcheck.h"

static size_t a256(size_t x) { return (x + 255) / 256 * 256; }

static size_t want_f32(int B, int T, int NH) {
  size_t tt = (size_t)T * T, per = (size_t)NH * tt * 4, e = ((size_t)16 << 20) / per;
  if (e < 1) e = 1;
  if (e > (size_t)B) e = (size_t)B;
  return ((size_t)B * NH * tt + e * NH * tt) * 4;
}

static size_t want_flash(size_t es, int B, int T, int NH, int hs) {
  size_t rows = (size_t)B * NH * T;
  return a256(rows * 4) + a256((size_t)B * T * NH * hs * es) + rows * 4;
}

static size_t want_lp(size_t es, int B, int T, int NH) {
  size_t tt = (size_t)T * T;
  return a256((size_t)B * NH * tt * es) + a256((size_t)NH * tt * 4) + (size_t)NH * tt * es;
}

int main(void) {
  const zt_ops *o = zt_backend_ops_of("cuda");
  int fail = 0;
  if (KC_EXPECT(o && !strcmp(o->name, "cuda") && o->attention_saved_bytes &&
                    o->attention_saved_bytes_dt,
                "zt_backend_ops_of(\"cuda\") has no sizing entries"))
    return 1;
  /* B, T, NH, NKV, hs: GPT-2 small at 1024 and 8 rows, a llama GQA block, a head size flash
   * does not cover (48), one whose (T,T) exceeds the scratch (T 4096), odd sizes */
  static const int shapes[][5] = {{8, 1024, 12, 12, 64}, {2, 2048, 32, 8, 128}, {4, 512, 8, 8, 48},
                                  {1, 4096, 16, 16, 64}, {3, 17, 5, 5, 80},    {5, 100, 6, 2, 96},
                                  {7, 33, 4, 4, 32},     {2, 64, 3, 3, 24}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    int B = shapes[i][0], T = shapes[i][1], NH = shapes[i][2], NKV = shapes[i][3];
    int hs = shapes[i][4];
    int flash = hs == 32 || hs == 64 || hs == 80 || hs == 96 || hs == 128;
    size_t f32 = want_f32(B, T, NH);
    fail |= KC_EXPECT(o->attention_saved_bytes(B, T, NH, NKV, hs) == f32,
                      "fp32 B %d T %d NH %d hs %d: %zu, want %zu", B, T, NH, hs,
                      o->attention_saved_bytes(B, T, NH, NKV, hs), f32);
    fail |= KC_EXPECT(o->attention_saved_bytes_dt(ZT_F32, B, T, NH, NKV, hs) == f32,
                      "fp32 typed B %d T %d NH %d hs %d", B, T, NH, hs);
    for (int k = 0; k < 2; k++) {
      zt_dtype dt = k ? ZT_F16 : ZT_BF16;
      size_t want = flash ? want_flash(2, B, T, NH, hs) : want_lp(2, B, T, NH);
      size_t got = o->attention_saved_bytes_dt(dt, B, T, NH, NKV, hs);
      fail |= KC_EXPECT(got == want, "%s B %d T %d NH %d NKV %d hs %d: %zu, want %zu (%s)",
                        zt_dtype_name(dt), B, T, NH, NKV, hs, got, want,
                        flash ? "flash" : "cuBLAS path");
    }
  }
  fail |= KC_EXPECT(o->attention_saved_bytes(0, 16, 2, 2, 64) == 0 &&
                        o->attention_saved_bytes_dt(ZT_BF16, 4, 0, 2, 2, 64) == 0 &&
                        o->attention_saved_bytes_dt(ZT_F16, 0, 16, 2, 2, 48) == 0,
                    "an empty shape saves bytes");
  if (!fail) printf("kernels_cuda_sizes: ok\n");
  return fail;
}
