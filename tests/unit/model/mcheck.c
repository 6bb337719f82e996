/* Test helpers; see mcheck.h. */
#include "tests/unit/model/mcheck.h"

#include <dirent.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

zt_model_cfg mc_tiny(zt_arch arch) {
  zt_model_cfg c = {.arch = arch, .vocab = 11, .seq_len = 5, .d_model = 8, .n_heads = 2,
                    .n_layers = 2, .d_ff = arch == ZT_ARCH_ENCODER ? 16 : 0, .init_seed = 1234};
  if (arch == ZT_ARCH_LLAMA) {
    c.n_kv_heads = 1;
    c.rms_eps = 1e-5f;
    c.rope_theta = 10000.0f;
    c.tie_embeddings = 1;
  }
  return c;
}

int mc_llama_variants(zt_model_cfg *out, const char **name) {
  zt_model_cfg base = mc_tiny(ZT_ARCH_LLAMA), c;
  int n = 0;
  base.tie_embeddings = 0;
  c = base;  /* GQA 4:2, untied, plain RoPE */
  c.d_model = 16, c.n_heads = 4, c.n_kv_heads = 2;
  name[n] = "llama gqa 4:2", out[n++] = c;
  c = base;  /* Qwen3-like: q/k norm, head_dim 6 != 16 / 4, tied */
  c.d_model = 16, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 6, c.qk_norm = 1;
  c.tie_embeddings = 1;
  name[n] = "llama qk_norm head_dim 6 tied", out[n++] = c;
  c = base;  /* Qwen2-like: q/k/v biases, tied, linear scaling */
  c.n_kv_heads = 2, c.qkv_bias = 1, c.tie_embeddings = 1;
  c.rope_scaling = (zt_rope_scaling){.type = ZT_ROPE_LINEAR, .factor = 2.0f};
  name[n] = "llama qkv_bias linear tied", out[n++] = c;
  c = base;  /* Llama 3.1's scaling, its three bands over head_dim 8's frequencies */
  c.d_model = 16, c.rope_theta = 10000.0f;
  c.rope_scaling = (zt_rope_scaling){.type = ZT_ROPE_LLAMA3, .factor = 8.0f,
                                     .low_freq_factor = 1.0f, .high_freq_factor = 4.0f,
                                     .original_max_position_embeddings = 64};
  name[n] = "llama llama3 rope", out[n++] = c;
  return n;
}

void mc_positions(const zt_backend *be, zt_acts *a, int B, int T) {
  int32_t *pos = zt_acts_positions(a), *h = malloc((size_t)B * (size_t)T * sizeof *h);
  if (!pos || !h) {
    free(h);
    return;
  }
  for (int i = 0; i < B * T; i++) h[i] = i % T;
  be->ops->to_device(be->ctx, pos, h, (size_t)B * (size_t)T * sizeof *h);
  free(h);
}

zt_train_cfg mc_train(int B, int grad_accum) {
  zt_train_cfg c;
  zt_train_cfg_defaults(&c);
  c.steps = 100;
  c.micro_batch = B;
  c.grad_accum = grad_accum;
  return c;
}

uint64_t mc_next(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 0x2545f4914f6cdd1dull;
}

double mc_uniform(uint64_t *s, double lo, double hi) {
  return lo + (hi - lo) * (double)(mc_next(s) >> 11) * 0x1.0p-53;
}

void mc_tokens(uint64_t *s, int32_t *tok, size_t n, int vocab) {
  for (size_t i = 0; i < n; i++) tok[i] = (int32_t)(mc_next(s) % (uint64_t)vocab);
}

const char *mc_tmpdir(void) {
  static char buf[512];
  const char *base = getenv("TMPDIR");
  snprintf(buf, sizeof buf, "%s/ztmodel.XXXXXX", base && *base ? base : "/tmp");
  if (!mkdtemp(buf)) {
    perror("mkdtemp");
    exit(1);
  }
  return buf;
}

int mc_same_file(const char *a, const char *b) {
  FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
  int same = fa && fb;
  while (same) {
    int x = fgetc(fa), y = fgetc(fb);
    same = x == y;
    if (x == EOF) break;
  }
  if (fa) fclose(fa);
  if (fb) fclose(fb);
  return MC_EXPECT(same, "%s and %s differ", a, b);
}

void mc_rmtree(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char p[1024];
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    if (unlink(p) < 0) mc_rmtree(p);
  }
  closedir(d);
  rmdir(dir);
}

zt_backend mc_backend(void) {
  zt_backend be;
  if (zt_backend_cpu_open(&be, 0) < 0) {
    fprintf(stderr, "cannot open the cpu backend\n");
    exit(1);
  }
  return be;
}

/* The sanitizer allocator's interface (sanitizer/allocator_interface.h, which gcc does not ship),
 * weak: NULL in a build without it. */
int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void *, size_t),
                                              void (*free_hook)(const volatile void *))
    __attribute__((weak));
size_t __sanitizer_get_allocated_size(const volatile void *p) __attribute__((weak));

static _Atomic int64_t g_heap_now, g_heap_peak, g_heap_mark;

static void on_malloc(const volatile void *p, size_t n) {
  (void)p;
  int64_t now = atomic_fetch_add(&g_heap_now, (int64_t)n) + (int64_t)n;
  int64_t peak = atomic_load(&g_heap_peak);
  while (now > peak && !atomic_compare_exchange_weak(&g_heap_peak, &peak, now)) {
  }
}

/* called before the block is released, so its size is still known */
static void on_free(const volatile void *p) {
  if (p) atomic_fetch_sub(&g_heap_now, (int64_t)__sanitizer_get_allocated_size(p));
}

int mc_heap_count_start(void) {
  if (!__sanitizer_install_malloc_and_free_hooks || !__sanitizer_get_allocated_size) return -1;
  return __sanitizer_install_malloc_and_free_hooks(on_malloc, on_free) > 0 ? 0 : -1;
}

void mc_heap_mark(void) {
  int64_t now = atomic_load(&g_heap_now);
  atomic_store(&g_heap_mark, now);
  atomic_store(&g_heap_peak, now);
}

int64_t mc_heap_peak(void) { return atomic_load(&g_heap_peak) - atomic_load(&g_heap_mark); }
int64_t mc_heap_now(void) { return atomic_load(&g_heap_now) - atomic_load(&g_heap_mark); }
