/* defines: the CUDA backend's buffer sizes as plain arithmetic: what attention keeps between its
 * forward and backward (its `saved`) on the cuBLAS path and the flash path, and the layouts the
 * ops cut it into. No CUDA header, compiled into every build (engine/kernels/meson.build), so a
 * build without the toolkit and a CPU daemon size cuda jobs as a GPU does. Called by the CUDA
 * ops (attention.c, flash_attention.cu) and, through the op table, by the planner. */
#ifndef ZT_KERNELS_CUDA_SIZES_H
#define ZT_KERNELS_CUDA_SIZES_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The fp32 backward's dP scratch at the end of saved: as many batch elements' (NH,T,T) at a
 * time as fit these bytes, at least one. */
#define ZT__CUDA_ATT_SCRATCH_BYTES ((size_t)16 << 20)

/* The elements whose dP the fp32 backward's scratch holds at once. */
int zt__cuda_att_chunk_elems(int B, int T, int NH);

/* The typed cuBLAS path's saved: P (B,NH,T,T) in dt | S/dS (NH,T,T) fp32 at s_off | dS
 * (NH,T,T) in dt at ds_off (es: dt's bytes). */
typedef struct zt__cuda_lp_layout {
  size_t s_off, ds_off, bytes;
} zt__cuda_lp_layout;
zt__cuda_lp_layout zt__cuda_att_lp_layout(int B, int T, int NH, size_t es);

/* The flash path's saved: LSE (B,NH,T) fp32 | O (B,T,NH*hs) in dt at o_off | D (B,NH,T) fp32
 * at d_off (engine/kernels/cuda/flash_attention.h). */
typedef struct zt__cuda_flash_layout {
  size_t o_off, d_off, bytes;
} zt__cuda_flash_layout;
zt__cuda_flash_layout zt__cuda_att_flash_layout(zt_dtype dt, int B, int T, int NH, int hs);

/* Whether the flash kernels cover the shape: dt bf16 or fp16, hs of 32, 64, 80, 96 or 128,
 * NH a multiple of NKV, B and NH within a grid dimension. */
bool zt__cuda_flash_supported(zt_dtype dt, int B, int NH, int NKV, int hs);
size_t zt__cuda_flash_saved_bytes(zt_dtype dt, int B, int T, int NH, int NKV, int hs);

/* The op table's sizing entries (ops.h, attention_saved_bytes[_dt]). */
size_t zt__cuda_attention_saved_bytes(int B, int T, int NH, int NKV, int hs);
size_t zt__cuda_attention_saved_bytes_dt(zt_dtype dt, int B, int T, int NH, int NKV, int hs);

/* The cuda op table of a build without the toolkit: its name and sizing entries alone, which
 * is all a plan reads (zt_backend_ops_of). */
const zt_ops *zt__cuda_sizing_ops(void);

#ifdef __cplusplus
}
#endif

#endif
