/* The CUDA backend's buffer sizes (engine/kernels/cuda/sizes.h). */
#include "engine/kernels/cuda/sizes.h"

static size_t align256(size_t x) { return (x + 255) / 256 * 256; }

int zt__cuda_att_chunk_elems(int B, int T, int NH) {
  size_t per = (size_t)NH * T * T * sizeof(float), e = ZT__CUDA_ATT_SCRATCH_BYTES / per;
  return e < 1 ? 1 : e > (size_t)B ? B : (int)e;
}

zt__cuda_lp_layout zt__cuda_att_lp_layout(int B, int T, int NH, size_t es) {
  size_t tt = (size_t)T * T;
  zt__cuda_lp_layout l;
  l.s_off = align256((size_t)B * NH * tt * es);
  l.ds_off = l.s_off + align256((size_t)NH * tt * sizeof(float));
  l.bytes = l.ds_off + (size_t)NH * tt * es;
  return l;
}

zt__cuda_flash_layout zt__cuda_att_flash_layout(zt_dtype dt, int B, int T, int NH, int hs) {
  size_t rows = (size_t)B * NH * T;
  zt__cuda_flash_layout l;
  l.o_off = align256(rows * sizeof(float));
  l.d_off = l.o_off + align256((size_t)B * T * NH * hs * zt_dtype_size(dt));
  l.bytes = l.d_off + rows * sizeof(float);
  return l;
}

bool zt__cuda_flash_supported(zt_dtype dt, int B, int NH, int NKV, int hs) {
  if (dt == ZT_F32 || NH <= 0 || NKV <= 0 || NH % NKV != 0 || B > 65535 || NH > 65535)
    return false;
  return hs == 32 || hs == 64 || hs == 80 || hs == 96 || hs == 128;
}

size_t zt__cuda_flash_saved_bytes(zt_dtype dt, int B, int T, int NH, int NKV, int hs) {
  (void)NKV; /* K and V are read in place: nothing here depends on the kv heads */
  if (B <= 0 || T <= 0)
    return 0;
  return zt__cuda_att_flash_layout(dt, B, T, NH, hs).bytes;
}

size_t zt__cuda_attention_saved_bytes(int B, int T, int NH, int NKV, int hs) {
  if (B <= 0 || T <= 0 || NH <= 0)
    return 0;
  size_t tt = (size_t)T * T;
  return ((size_t)B * NH * tt + (size_t)zt__cuda_att_chunk_elems(B, T, NH) * NH * tt) *
         sizeof(float);
}

size_t zt__cuda_attention_saved_bytes_dt(zt_dtype dt, int B, int T, int NH, int NKV, int hs) {
  if (dt == ZT_F32)
    return zt__cuda_attention_saved_bytes(B, T, NH, NKV, hs);
  if (B <= 0 || T <= 0 || NH <= 0)
    return 0;
  if (zt__cuda_flash_supported(dt, B, NH, NKV, hs))
    return zt__cuda_flash_saved_bytes(dt, B, T, NH, NKV, hs);
  return zt__cuda_att_lp_layout(B, T, NH, zt_dtype_size(dt)).bytes;
}

static const zt_ops k_sizing = {
    .name = "cuda",
    .attention_saved_bytes = zt__cuda_attention_saved_bytes,
    .attention_saved_bytes_dt = zt__cuda_attention_saved_bytes_dt,
};

const zt_ops *zt__cuda_sizing_ops(void) { return &k_sizing; }
