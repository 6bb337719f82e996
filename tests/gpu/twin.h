/* The harness of the gpu tests that hold the CUDA backend against its CPU twin: both backends
 * opened (or the test skipped where there is no device), and device buffers kept on a list so a
 * test section frees them together. */
#ifndef ZT_TESTS_GPU_TWIN_H
#define ZT_TESTS_GPU_TWIN_H

#include <stddef.h>

#include "engine/kernels/ops.h"

/* 0 with both open; 77 (skip, said on stdout) without a CUDA device; 1 if one fails to open. */
int twin_open(zt_backend *cpu, zt_backend *gpu);
void twin_close(zt_backend *cpu, zt_backend *gpu);
/* A device buffer of at least one byte; exits the test when the allocation fails. */
void *twin_dev_alloc(const zt_backend *gpu, size_t bytes);
/* Frees every buffer twin_dev_alloc gave out. */
void twin_dev_free_all(const zt_backend *gpu);

#endif
