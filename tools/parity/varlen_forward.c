/* zt's side of tools/parity/varlen_parity.py: the loss of a packed batch under a Hugging Face
 * directory's weights, forward (and, for the chunked llama head that computes its loss there,
 * backward) on the cpu or cuda backend in fp32.
 *
 *   varlen_forward HF_DIR BATCH [cpu|cuda]
 *
 * BATCH is little-endian int32: B, T, then B*T tokens, B*T targets (-1: not counted) and B*T
 * positions in their documents (ops.h, "Documents"). Prints one line
 * "loss_sum S counted N loss L" (S and L with 17 digits); exits 1 with the reason on stderr. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine/kernels/backend.h"
#include "engine/model/hf.h"
#include "engine/model/model.h"

static int32_t *read_batch(const char *path, int *B, int *T) {
  FILE *f = fopen(path, "rb");
  int32_t bt[2], *d = NULL;
  if (!f) return NULL;
  if (fread(bt, sizeof bt, 1, f) == 1 && bt[0] > 0 && bt[1] > 0 && bt[0] < 4096 &&
      bt[1] < 1 << 20) {
    size_t n = (size_t)3 * bt[0] * bt[1];
    d = malloc(n * sizeof *d);
    if (d && fread(d, sizeof *d, n, f) != n) {
      free(d);
      d = NULL;
    }
    *B = bt[0], *T = bt[1];
  }
  fclose(f);
  return d;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s HF_DIR BATCH [cpu|cuda]\n", argv[0]);
    return 1;
  }
  char err[512] = "out of memory";
  int B = 0, T = 0, rc = 1;
  int32_t *batch = read_batch(argv[2], &B, &T);
  if (!batch) {
    fprintf(stderr, "%s: not a batch file (B, T, tokens, targets, positions)\n", argv[2]);
    return 1;
  }
  zt_model_cfg cfg;
  zt_model *m = NULL;
  zt_backend be = {0};
  zt_acts *a = NULL;
  float *params = NULL, *dp = NULL, *dg = NULL;
  if (zt_hf_config_read(argv[1], T, &cfg, err, sizeof err) < 0 ||
      zt_model_create(&m, &cfg, err, sizeof err) < 0)
    goto fail;
  size_t n = zt_model_num_params(m);
  if (!(params = malloc(n * sizeof *params))) goto fail;
  zt_model_state st = {.suffix = "", .data = params};
  if (zt_model_load_states(m, argv[1], &st, 1, 0, err, sizeof err) < 0 ||
      zt_backend_open(&be, argc > 3 ? argv[3] : "cpu", 0, 0, err, sizeof err) < 0 ||
      zt_acts_open(&a, m, &be, B, 0, err, sizeof err) < 0)
    goto fail;
  const zt_ops *o = be.ops;
  size_t N = (size_t)B * T;
  dp = o->alloc(be.ctx, n * sizeof(float));
  dg = o->alloc(be.ctx, n * sizeof(float));
  if (!dp || !dg) goto fail;
  o->to_device(be.ctx, dp, params, n * sizeof(float));
  o->zero(be.ctx, dg, n * sizeof(float));
  o->to_device(be.ctx, zt_acts_tokens(a), batch, N * sizeof(int32_t));
  o->to_device(be.ctx, zt_acts_targets(a), batch + N, N * sizeof(int32_t));
  o->to_device(be.ctx, zt_acts_positions(a), batch + 2 * N, N * sizeof(int32_t));
  zt_model_forward(m, a, dp);
  zt_model_loss(m, a, 1.0f);
  zt_model_backward(m, a, dp, dg);
  double sum = 0;
  int counted = 0;
  if (zt_acts_loss(a, &sum, &counted) < 0 || o->sync(be.ctx) < 0 || counted <= 0) {
    snprintf(err, sizeof err, "no loss (%d targets counted): %s", counted, o->error_text(be.ctx));
    goto fail;
  }
  printf("loss_sum %.17g counted %d loss %.17g\n", sum, counted, sum / counted);
  rc = 0;
fail:
  if (rc) fprintf(stderr, "varlen_forward: %s\n", err);
  if (dp) be.ops->free(be.ctx, dp);
  if (dg) be.ops->free(be.ctx, dg);
  zt_acts_close(a);
  if (be.ops) zt_backend_close(&be);
  zt_model_destroy(m);
  free(params);
  free(batch);
  return rc;
}
