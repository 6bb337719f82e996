/* Helpers shared by the model and trainer tests: tiny configurations, a seeded token generator,
 * the failure macro and a scratch directory. */
#ifndef ZT_TESTS_MODEL_MCHECK_H
#define ZT_TESTS_MODEL_MCHECK_H

#include <stdint.h>
#include <stdio.h>

#include "engine/kernels/ops.h"
#include "engine/model/model.h"
#include "engine/train/trainer.h"

/* Prints "FAIL file:line: ..." and returns 1 when cond is false. */
#define MC_EXPECT(cond, ...)                                                                   \
  ((cond) ? 0 : (fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__),                          \
                 fprintf(stderr, __VA_ARGS__), fputc('\n', stderr), 1))

/* V 11, T 5, C 8, NH 2, L 2 (d_ff 16 for the encoder so its default 2048 stays out of a tiny test;
 * llama: 1 kv head, rms_eps 1e-5, rope_theta 1e4, tied as Llama 3.2 1B). */
zt_model_cfg mc_tiny(zt_arch arch);
/* Tiny llamas covering the variants (GQA, q/k norm with head_dim != d_model / n_heads, qkv bias,
 * tied and untied, each RoPE scaling), at most MC_LLAMA_VARIANTS, with a name each; returns how
 * many. */
#define MC_LLAMA_VARIANTS 4
int mc_llama_variants(zt_model_cfg *out, const char **name);
/* The positions of B rows of T tokens (0..T-1 each: one document a row) into a's buffer. */
void mc_positions(const zt_backend *be, zt_acts *a, int B, int T);
zt_train_cfg mc_train(int B, int grad_accum);

/* xorshift64*: the same numbers on every machine. */
uint64_t mc_next(uint64_t *s);
double mc_uniform(uint64_t *s, double lo, double hi);
/* n tokens in [0, vocab). */
void mc_tokens(uint64_t *s, int32_t *tok, size_t n, int vocab);

/* mkdtemp under $TMPDIR (or /tmp); returns a static buffer, exits the test on failure. */
const char *mc_tmpdir(void);
/* Removes dir and the files (and one level of subdirectories) in it. */
void mc_rmtree(const char *dir);
/* 0 when the two files hold the same bytes, else 1 with a message naming them. */
int mc_same_file(const char *a, const char *b);

zt_backend mc_backend(void);

/* The process's heap, counted through the sanitizer allocator's hooks (the ASan build tests run
 * in): every thread's malloc and free. mc_heap_count_start installs the hooks (once, before what
 * is measured): 0, or -1 where the allocator has none (a build without ASan; the test skips).
 * mc_heap_mark resets the peak to the bytes allocated now; mc_heap_peak is the most allocated at
 * once since the mark, above what was allocated at the mark. */
int mc_heap_count_start(void);
void mc_heap_mark(void);
int64_t mc_heap_peak(void);
/* The bytes allocated now, above what was allocated at the mark. */
int64_t mc_heap_now(void);

#endif
