/* The initial parameters a range at a time, as an offloaded open makes them for a model larger
 * than memory: for every arch (and each llama variant, whose layout and init are checked too),
 * the seeded init of any range of tensors (unit by unit backwards,
 * tensor by tensor into buffers of their own) is bitwise the flat init's; a safetensors file
 * read through zt_model_file a unit at a time backwards (an HF-style file: prefixed names,
 * transposed Conv1D weights, the buffers HF files carry; and a file of two states) is bitwise
 * zt_model_load_states's; the init on the CPU pool is the serial one whatever its threads (and
 * zeros, its file unopened, when a checkpoint will be loaded over it);
 * strict, a prefixed name is missing and an HF buffer unexpected; a
 * tensor whose dtype does not convert is refused at open, named; zt_model_writer, a unit at a
 * time backwards, writes zt_model_save_states's file byte for byte. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/tunables.h"
#include "engine/model/safetensors.h"
#include "engine/train/trainer_internal.h"
#include "tests/unit/model/mcheck.h"

static char dir[512];

static const char *path_of(const char *name) {
  static char p[600];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return p;
}

/* Tensor order is offset order and the units tile it: what a range of units or tensors being
 * one range of the flat layout rests on. */
static int check_layout(const zt_model *m) {
  int fails = 0, nt = zt_model_num_tensors(m), nu = zt_model_num_units(m);
  size_t at = 0;
  for (int i = 0; i < nt; i++) {
    const zt_tensor_info *t = zt_model_tensor(m, i);
    fails += MC_EXPECT(t->offset == at, "tensor %s at %zu, expected %zu", t->name, t->offset, at);
    at = t->offset + t->numel;
  }
  int tensor = 0;
  for (int u = 0; u < nu; u++) {
    const zt_unit_info *ui = zt_model_unit(m, u);
    fails += MC_EXPECT(ui->first_tensor == tensor && ui->n_tensors > 0 &&
                       ui->offset == zt_model_tensor(m, tensor)->offset,
                       "unit %s: tensors from %d (%d), expected from %d", ui->name,
                       ui->first_tensor, ui->n_tensors, tensor);
    tensor += ui->n_tensors;
  }
  return fails + MC_EXPECT(tensor == nt && at == zt_model_num_params(m), "the units hold %d of "
                           "%d tensors, the tensors %zu parameters", tensor, nt, at);
}

static int test_seeded(zt_model_cfg mc) {
  char err[512];
  zt_model *m = NULL;
  zt_arch arch = mc.arch;
  if (zt_model_create(&m, &mc, err, sizeof err) < 0) exit(1);
  size_t n = zt_model_num_params(m);
  int nt = zt_model_num_tensors(m), nu = zt_model_num_units(m), fails = check_layout(m);
  float *flat = malloc(n * sizeof *flat), *r = malloc(n * sizeof *r);
  zt_model_init_params(m, flat);
  memset(r, 0xff, n * sizeof *r);
  for (int u = nu - 1; u >= 0; u--) {
    const zt_unit_info *ui = zt_model_unit(m, u);
    zt_model_init_params_range(m, ui->first_tensor, ui->first_tensor + ui->n_tensors,
                               r + ui->offset);
  }
  fails += MC_EXPECT(!memcmp(flat, r, n * sizeof *r), "%s: the units backwards differ from the "
                     "flat init", zt_arch_name(arch));
  for (int i = nt - 1; i >= 0; i--) {
    const zt_tensor_info *t = zt_model_tensor(m, i);
    float *x = malloc(t->numel * sizeof *x);
    zt_model_init_params_range(m, i, i + 1, x);
    fails += MC_EXPECT(!memcmp(x, flat + t->offset, t->numel * sizeof *x), "%s: tensor %s alone "
                       "differs from the flat init", zt_arch_name(arch), t->name);
    free(x);
  }
  /* the last tensors drawn continue the stream: another seed changes them */
  mc.init_seed++;
  zt_model *m2 = NULL;
  if (zt_model_create(&m2, &mc, err, sizeof err) < 0) exit(1);
  zt_model_init_params_range(m2, 0, nt, r);
  fails += MC_EXPECT(memcmp(flat, r, n * sizeof *r) != 0, "%s: seeds %llu and %llu give the "
                     "same init", zt_arch_name(arch), (unsigned long long)mc.init_seed - 1,
                     (unsigned long long)mc.init_seed);
  zt_model_destroy(m2);
  free(flat);
  free(r);
  zt_model_destroy(m);
  return fails;
}

/* The seeded init on the CPU pool: with 1, 2, 3 and 7 threads, unit by unit and as one piece,
 * it is bitwise the flat serial init, and so are slices at odd places filled in reverse (chunks
 * of the pool cross tensor boundaries: the model has several chunks' worth of parameters). */
static int test_threads(void) {
  char err[512];
  zt_model *m = NULL;
  zt_model_cfg mc = mc_tiny(ZT_ARCH_GPT);
  mc.vocab = 3000;
  mc.d_model = 128;
  mc.n_heads = 4;
  mc.seq_len = 64;
  if (zt_model_create(&m, &mc, err, sizeof err) < 0) exit(1);
  size_t n = zt_model_num_params(m);
  int nu = zt_model_num_units(m), nt = zt_model_num_tensors(m), fails = 0;
  fails += MC_EXPECT(n > 3 * ZT_TUNE_INIT_CHUNK, "%zu parameters: too few for several chunks", n);
  float *flat = malloc(n * sizeof *flat), *r = malloc(n * sizeof *r);
  zt_model_init_params(m, flat);
  static const int threads[] = {1, 2, 3, 7};
  for (size_t k = 0; k < sizeof threads / sizeof threads[0]; k++) {
    zt__trainer_init in;
    fails += MC_EXPECT(zt__trainer_init_open_threads(&in, m, threads[k], err, sizeof err) == 0,
                       "%d threads: %s", threads[k], err);
    fails += MC_EXPECT((in.pool != NULL) == (threads[k] > 1), "%d threads: pool %p", threads[k],
                       (void *)in.pool);
    memset(r, 0xff, n * sizeof *r);
    for (int u = nu - 1; u >= 0; u--)
      fails += MC_EXPECT(zt__trainer_init_read(&in, u, u + 1, r + zt_model_unit(m, u)->offset,
                                               err, sizeof err) == 0, "unit %d: %s", u, err);
    fails += MC_EXPECT(!memcmp(flat, r, n * sizeof *r), "%d threads, unit by unit: differs from "
                       "the serial init", threads[k]);
    memset(r, 0xff, n * sizeof *r);
    fails += MC_EXPECT(zt__trainer_init_read(&in, 0, nu, r, err, sizeof err) == 0, "%s", err);
    fails += MC_EXPECT(!memcmp(flat, r, n * sizeof *r), "%d threads, one piece: differs from the "
                       "serial init", threads[k]);
    zt__trainer_init_close(&in);
  }
  /* the token embedding is N(0, 0.02) with neighbours uncorrelated (the pair's cosine and sine
   * are independent normals): mean, sd and the lag-1 correlation within 6 standard errors */
  const zt_tensor_info *wte = zt_model_tensor(m, 0);
  double sum = 0, sq = 0, lag = 0, k = (double)wte->numel;
  for (size_t i = 0; i < wte->numel; i++) {
    double x = flat[wte->offset + i];
    sum += x;
    sq += x * x;
    if (i) lag += x * flat[wte->offset + i - 1];
  }
  double sd = sqrt(sq / k - (sum / k) * (sum / k)), se = 6.0 / sqrt(k);
  fails += MC_EXPECT(fabs(sum / k) < 0.02 * se && fabs(sd / 0.02 - 1.0) < se &&
                     fabs(lag / (k - 1) / (sd * sd)) < se, "%s: mean %g, sd %g, lag-1 "
                     "correlation %g over %.0f elements", wte->name, sum / k, sd,
                     lag / (k - 1) / (sd * sd), k);
  /* a resume's open (init_loaded): zeros on the pool, the init file not even opened */
  zt_model_cfg lc = mc;
  lc.init_loaded = 1;
  snprintf(lc.init_path, sizeof lc.init_path, "%s", path_of("absent.safetensors"));
  zt_model *lm = NULL;
  if (zt_model_create(&lm, &lc, err, sizeof err) < 0) exit(1);
  zt__trainer_init li;
  memset(r, 0xff, n * sizeof *r);
  fails += MC_EXPECT(zt__trainer_init_open_threads(&li, lm, 3, err, sizeof err) == 0 &&
                     zt__trainer_init_read(&li, 0, nu, r, err, sizeof err) == 0, "init_loaded: %s",
                     err);
  zt__trainer_init_close(&li);
  zt_model_destroy(lm);
  size_t nonzero = 0;
  for (size_t i = 0; i < n; i++) nonzero += r[i] != 0.0f;
  fails += MC_EXPECT(nonzero == 0, "init_loaded: %zu of %zu parameters are not zero", nonzero, n);
  memset(r, 0xff, n * sizeof *r);
  for (size_t stop = n, step = 7919; stop > 0;) {
    size_t begin = stop > step ? stop - step : 0;
    zt_model_init_params_slice(m, 0, nt, r, begin, stop);
    stop = begin;
    step = step * 3 % 100003 + 1;
  }
  fails += MC_EXPECT(!memcmp(flat, r, n * sizeof *r), "odd slices backwards differ from the flat "
                     "init");
  free(flat);
  free(r);
  zt_model_destroy(m);
  return fails;
}

/* Units [0, nu) of state k read backwards, each into its place; compared with want. */
static int read_backwards(const zt_model *m, const zt_model_file *f, int k, const float *want,
                          const char *what) {
  char err[512];
  size_t n = zt_model_num_params(m);
  float *r = malloc(n * sizeof *r);
  int fails = 0;
  memset(r, 0xff, n * sizeof *r);
  for (int u = zt_model_num_units(m) - 1; u >= 0; u--) {
    const zt_unit_info *ui = zt_model_unit(m, u);
    fails += MC_EXPECT(zt_model_file_read(f, k, ui->first_tensor,
                                          ui->first_tensor + ui->n_tensors, r + ui->offset, err,
                                          sizeof err) == 0, "%s: unit %s: %s", what, ui->name,
                       err);
  }
  fails += MC_EXPECT(!memcmp(r, want, n * sizeof *r), "%s: the units read differ", what);
  free(r);
  return fails;
}

static int test_files(void) {
  char err[512];
  zt_model *m = NULL;
  zt_model_cfg mc = mc_tiny(ZT_ARCH_GPT);
  if (zt_model_create(&m, &mc, err, sizeof err) < 0) exit(1);
  size_t n = zt_model_num_params(m);
  int nt = zt_model_num_tensors(m), fails = 0;
  float *p = malloc(n * sizeof *p), *q = malloc(n * sizeof *q);
  zt_model_init_params(m, p);
  for (size_t i = 0; i < n; i++) q[i] = (float)i;
  /* HF-style: prefixed names, Conv1D weights transposed, the head and a mask buffer */
  zt_st_entry *e = calloc((size_t)nt + 2, sizeof *e);
  char (*names)[128] = calloc((size_t)nt, 128);
  float mask[25] = {0};
  for (int i = 0; i < nt; i++) {
    const zt_tensor_info *t = zt_model_tensor(m, i);
    snprintf(names[i], 128, "transformer.%s", t->name);
    e[i] = (zt_st_entry){.name = names[i], .ndim = t->ndim, .shape = {t->shape[0], t->shape[1]},
                         .data = p + t->offset, .transpose = t->transposed};
  }
  e[nt] = (zt_st_entry){.name = "lm_head.weight", .ndim = 2, .shape = {11, 8}, .data = p};
  e[nt + 1] = (zt_st_entry){.name = "transformer.h.0.attn.bias", .ndim = 2, .shape = {5, 5},
                            .data = mask};
  fails += MC_EXPECT(zt_st_write(path_of("hf.safetensors"), e, nt + 2, NULL, 0, err,
                                 sizeof err) == 0, "%s", err);
  static const char *const params[] = {""}, *const two[] = {"", ".exp_avg"};
  zt_model_file *f = NULL;
  int rc = zt_model_file_open(&f, m, path_of("hf.safetensors"), params, 1, 0, err, sizeof err);
  fails += MC_EXPECT(rc == 0, "HF-style open: %s", err);
  if (rc == 0) fails += read_backwards(m, f, 0, p, "HF-style");
  zt_model_file_close(f);
  /* strict (zt's own checkpoints): no prefix, and no buffer beside the states */
  rc = zt_model_file_open(&f, m, path_of("hf.safetensors"), params, 1, ZT_MODEL_FILE_STRICT, err,
                          sizeof err);
  fails += MC_EXPECT(rc == -EINVAL && strstr(err, "tensor wte.weight is missing") && f == NULL,
                     "strict, prefixed names: %d %s", rc, err);
  for (int i = 0; i < nt; i++) snprintf(names[i], 128, "%s", zt_model_tensor(m, i)->name);
  fails += MC_EXPECT(zt_st_write(path_of("head.safetensors"), e, nt + 1, NULL, 0, err,
                                 sizeof err) == 0, "%s", err);
  rc = zt_model_file_open(&f, m, path_of("head.safetensors"), params, 1, 0, err, sizeof err);
  fails += MC_EXPECT(rc == 0, "the head beside the parameters: %s", err);
  zt_model_file_close(f);
  rc = zt_model_file_open(&f, m, path_of("head.safetensors"), params, 1, ZT_MODEL_FILE_STRICT,
                          err, sizeof err);
  fails += MC_EXPECT(rc == -EINVAL && strstr(err, "unexpected tensor lm_head.weight") && f == NULL,
                     "strict, the head beside the parameters: %d %s", rc, err);

  /* two states in the internal layout */
  zt_model_state s[2] = {{"", p}, {".exp_avg", q}};
  fails += MC_EXPECT(zt_model_save_states(m, path_of("two.safetensors"), s, 2, 1, NULL, err,
                                          sizeof err) == 0, "%s", err);
  rc = zt_model_file_open(&f, m, path_of("two.safetensors"), two, 2, 1, err, sizeof err);
  fails += MC_EXPECT(rc == 0, "two states: %s", err);
  if (rc == 0)
    fails += read_backwards(m, f, 1, q, "state 1 of 2") + read_backwards(m, f, 0, p, "state 0");
  zt_model_file_close(f);

  /* the writer, a unit at a time backwards in the checkpoint layout (Conv1D weights transposed
   * through the scratch): zt_model_save_states's file, byte for byte */
  fails += MC_EXPECT(zt_model_save_states(m, path_of("whole.safetensors"), s, 2, 0, "a note", err,
                                          sizeof err) == 0, "%s", err);
  zt_model_writer *w = NULL;
  float *scratch = malloc(n * sizeof *scratch);
  rc = zt_model_writer_open(&w, m, path_of("pieces.safetensors"), two, 2, 0, "a note", err,
                            sizeof err);
  fails += MC_EXPECT(rc == 0, "writer open: %s", err);
  for (int u = zt_model_num_units(m) - 1; rc == 0 && u >= 0; u--) {
    const zt_unit_info *ui = zt_model_unit(m, u);
    for (int k = 0; rc == 0 && k < 2; k++)
      rc = zt_model_writer_put(w, k, ui->first_tensor, ui->first_tensor + ui->n_tensors,
                               s[k].data + ui->offset, scratch, err, sizeof err);
  }
  if (rc == 0) rc = zt_model_writer_finish(w, err, sizeof err);
  fails += MC_EXPECT(rc == 0, "writer: %s", err);
  zt_model_writer_close(w);
  free(scratch);
  fails += mc_same_file(path_of("whole.safetensors"), path_of("pieces.safetensors"));

  /* wte's F32 made I32 (the same size, so the file stays valid): refused at open */
  FILE *fp = fopen(path_of("hf.safetensors"), "r+b");
  char head[4096] = "";
  size_t got = fp ? fread(head, 1, sizeof head - 1, fp) : 0;
  char *wte = got > 8 ? strstr(head + 8, "\"transformer.wte.weight\"") : NULL;
  char *dt = wte ? strstr(wte, "F32") : NULL;
  fails += MC_EXPECT(dt != NULL, "no F32 for wte in the header of %s", path_of("hf.safetensors"));
  if (dt) {
    fseek(fp, dt - head, SEEK_SET);
    fputs("I32", fp);
  }
  if (fp) fclose(fp);
  rc = zt_model_file_open(&f, m, path_of("hf.safetensors"), params, 1, 0, err, sizeof err);
  fails += MC_EXPECT(rc == -EINVAL && strstr(err, "transformer.wte.weight: dtype does not "
                                                   "convert to fp32") && f == NULL,
                     "an I32 tensor: %d %s", rc, err);
  free(e);
  free(names);
  free(p);
  free(q);
  zt_model_destroy(m);
  return fails;
}

/* A llama's layout as model.h and llama.c promise it: Hugging Face's names in HF's order of a
 * block's vectors then matrices, q|k|v and gate|up (and the biases) consecutive, lm_head only
 * untied, decay on the matrices, what each tensor's ops read; and its init: norms 1, biases 0,
 * the matrices and the embedding N(0, 0.02). */
static int test_llama(zt_model_cfg mc, const char *what) {
  char err[512];
  zt_model *m = NULL;
  if (zt_model_create(&m, &mc, err, sizeof err) < 0) {
    fprintf(stderr, "FAIL %s: %s\n", what, err);
    return 1;
  }
  int fails = 0, nt = zt_model_num_tensors(m), nu = zt_model_num_units(m);
  int hs = mc.head_dim ? mc.head_dim : mc.d_model / mc.n_heads;
  int64_t C = mc.d_model, Q = (int64_t)mc.n_heads * hs, KV = (int64_t)mc.n_kv_heads * hs;
  int64_t F = zt_model_d_ff(m);
  fails += MC_EXPECT(nu == mc.n_layers + 2 && zt_model_head_reads_embed(m) == mc.tie_embeddings,
                     "%s: %d units, head reads the embedding %d", what, nu,
                     zt_model_head_reads_embed(m));
  const zt_tensor_info *e = zt_model_tensor(m, 0);
  fails += MC_EXPECT(!strcmp(e->name, "model.embed_tokens.weight") && e->decay &&
                     e->reads == (ZT_READS_F32 | (mc.tie_embeddings ? ZT_READS_LP : 0)),
                     "%s: the embedding %s (reads %u)", what, e->name, e->reads);
  const zt_unit_info *b0 = zt_model_unit(m, 1);
  struct {
    const char *name;
    int64_t s0, s1;
    int on;
  } want[] = {{"input_layernorm.weight", C, 0, 1},
              {"post_attention_layernorm.weight", C, 0, 1},
              {"self_attn.q_norm.weight", hs, 0, mc.qk_norm},
              {"self_attn.k_norm.weight", hs, 0, mc.qk_norm},
              {"self_attn.q_proj.bias", Q, 0, mc.qkv_bias},
              {"self_attn.k_proj.bias", KV, 0, mc.qkv_bias},
              {"self_attn.v_proj.bias", KV, 0, mc.qkv_bias},
              {"self_attn.q_proj.weight", Q, C, 1},
              {"self_attn.k_proj.weight", KV, C, 1},
              {"self_attn.v_proj.weight", KV, C, 1},
              {"self_attn.o_proj.weight", C, Q, 1},
              {"mlp.gate_proj.weight", F, C, 1},
              {"mlp.up_proj.weight", F, C, 1},
              {"mlp.down_proj.weight", C, F, 1}};
  int k = b0->first_tensor;
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    if (!want[i].on) continue;
    const zt_tensor_info *t = zt_model_tensor(m, k++);
    char nm[96];
    snprintf(nm, sizeof nm, "model.layers.0.%s", want[i].name);
    int mat = want[i].s1 != 0;
    fails += MC_EXPECT(!strcmp(t->name, nm) && t->shape[0] == want[i].s0 &&
                       t->ndim == (mat ? 2 : 1) && (!mat || t->shape[1] == want[i].s1) &&
                       !t->transposed && t->decay == mat &&
                       t->reads == (mat ? ZT_READS_LP : ZT_READS_F32),
                       "%s: block tensor %s [%lld, %lld], expected %s [%lld, %lld]", what,
                       t->name, (long long)t->shape[0], (long long)t->shape[1], nm,
                       (long long)want[i].s0, (long long)want[i].s1);
  }
  fails += MC_EXPECT(k == b0->first_tensor + b0->n_tensors, "%s: block 0 has %d tensors", what,
                     b0->n_tensors);
  const zt_unit_info *h = zt_model_unit(m, nu - 1);
  fails += MC_EXPECT(!strcmp(zt_model_tensor(m, h->first_tensor)->name, "model.norm.weight") &&
                     h->n_tensors == (mc.tie_embeddings ? 1 : 2) &&
                     (mc.tie_embeddings ||
                      !strcmp(zt_model_tensor(m, h->first_tensor + 1)->name, "lm_head.weight")),
                     "%s: the head's tensors", what);
  size_t n = zt_model_num_params(m);
  float *p = malloc(n * sizeof *p);
  zt_model_init_params(m, p);
  double sq = 0;
  size_t drawn = 0;
  for (int i = 0; i < nt; i++) {
    const zt_tensor_info *t = zt_model_tensor(m, i);
    int norm = strstr(t->name, "norm") != NULL, bias = strstr(t->name, ".bias") != NULL;
    for (size_t j = 0; j < t->numel; j++) {
      float x = p[t->offset + j];
      if (norm || bias) {
        fails += MC_EXPECT(x == (norm ? 1.0f : 0.0f), "%s: %s[%zu] = %g", what, t->name, j,
                           (double)x);
        if (x != (norm ? 1.0f : 0.0f)) break;
      } else {
        sq += (double)x * x;
        drawn++;
      }
    }
  }
  double sd = sqrt(sq / (double)drawn);
  fails += MC_EXPECT(sd > 0.019 && sd < 0.021, "%s: the matrices' init has sd %.4f over %zu "
                     "values, expected 0.02", what, sd, drawn);
  free(p);
  zt_model_destroy(m);
  return fails + test_seeded(mc);
}

int main(void) {
  snprintf(dir, sizeof dir, "%s", mc_tmpdir());
  int fails = test_seeded(mc_tiny(ZT_ARCH_GPT)) + test_seeded(mc_tiny(ZT_ARCH_ENCODER)) +
              test_files() + test_threads();
  zt_model_cfg v[MC_LLAMA_VARIANTS];
  const char *name[MC_LLAMA_VARIANTS];
  for (int i = 0, nv = mc_llama_variants(v, name); i < nv; i++) {
    v[i].vocab = 512;  /* enough draws for the sd to be 0.02 within 5% */
    fails += test_llama(v[i], name[i]);
  }
  mc_rmtree(dir);
  if (fails) {
    fprintf(stderr, "%d failure(s)\n", fails);
    return 1;
  }
  printf("init ranges: ok\n");
  return 0;
}
