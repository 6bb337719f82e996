/* safetensors: F32 round trip (with a transposed tensor and metadata), exact BF16/F16 conversion,
 * BF16 writing (round to nearest even as dtype.h, a transposed entry, ranges put out of order and
 * read back, a range put twice or a tensor left unfinished refused),
 * every malformed input refused with a message naming the tensor or the cause, and model-level
 * loading (HF "transformer." prefix and buffers accepted; missing, extra, misshapen refused),
 * and tensors of many chunks read and written in pieces in flight, bit for bit. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/kernels/dtype.h"
#include "engine/model/safetensors.h"
#include "tests/unit/model/mcheck.h"

static char dir[600];

static const char *path_of(const char *name) {
  static char p[700];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return p;
}

/* A file from a header and raw data; hlen_override != 0 writes that header length instead. */
static void write_raw(const char *name, const char *hdr, const void *data, size_t len,
                      uint64_t hlen_override) {
  FILE *f = fopen(path_of(name), "wb");
  uint64_t hl = hlen_override ? hlen_override : strlen(hdr);
  uint8_t b[8];
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(hl >> (8 * i));
  fwrite(b, 1, 8, f);
  fwrite(hdr, 1, strlen(hdr), f);
  if (len) fwrite(data, 1, len, f);
  fclose(f);
}

static int test_roundtrip(void) {
  int fails = 0;
  char err[512];
  float a[6] = {1, 2, 3, 4, 5, 6}, b[3] = {-1.5f, 0.25f, 1e-30f};
  /* a holds the internal (3, 2); the file gets its (2, 3) transpose */
  zt_st_entry e[2] = {{.name = "a", .ndim = 2, .shape = {2, 3}, .data = a, .transpose = 1},
                      {.name = "b.bias", .ndim = 1, .shape = {3}, .data = b}};
  const char *meta[2] = {"format", "pt"};
  fails += MC_EXPECT(zt_st_write(path_of("rt.safetensors"), e, 2, meta, 1, err, sizeof err) == 0,
                     "write: %s", err);
  zt_st_file *f;
  if (zt_st_open(&f, path_of("rt.safetensors"), err, sizeof err) < 0) {
    fprintf(stderr, "FAIL open: %s\n", err);
    return 1;
  }
  fails += MC_EXPECT(zt_st_count(f) == 2, "count %d", zt_st_count(f));
  const zt_st_tensor *ta = zt_st_find(f, "a"), *tb = zt_st_find(f, "b.bias");
  fails += MC_EXPECT(ta && tb && ta->dtype == ZT_ST_F32 && ta->shape[0] == 2 && ta->shape[1] == 3,
                     "entries");
  float raw[6], back[6], bb[3];
  const float file_order[6] = {1, 3, 5, 2, 4, 6};
  zt_st_read_f32(f, ta, raw, 0, err, sizeof err);
  zt_st_read_f32(f, ta, back, 1, err, sizeof err);
  zt_st_read_f32(f, tb, bb, 0, err, sizeof err);
  fails += MC_EXPECT(!memcmp(raw, file_order, sizeof raw), "transposed write");
  fails += MC_EXPECT(!memcmp(back, a, sizeof back), "transposed read");
  fails += MC_EXPECT(!memcmp(bb, b, sizeof bb), "vector");
  zt_st_close(f);
  /* the header is padded to 8 bytes, so the data starts aligned */
  FILE *fp = fopen(path_of("rt.safetensors"), "rb");
  uint8_t len8[8];
  fails += MC_EXPECT(fread(len8, 1, 8, fp) == 8 && len8[0] % 8 == 0, "header length %d", len8[0]);
  fclose(fp);
  return fails;
}

static int test_half_types(void) {
  int fails = 0;
  char err[512];
  /* F16: 1, -2, 0.5, 65504, 2^-24 (smallest subnormal), 2^-15 (subnormal), -0, inf;
   * BF16: 1, -3, 0.5, 2^-133 (subnormal) */
  const uint16_t h[8] = {0x3c00, 0xc000, 0x3800, 0x7bff, 0x0001, 0x0200, 0x8000, 0x7c00};
  const float hf[8] = {1, -2, 0.5f, 65504, 0x1p-24f, 0x1p-15f, -0.0f, INFINITY};
  const uint16_t bf[4] = {0x3f80, 0xc040, 0x3f00, 0x0001};
  const float bff[4] = {1, -3, 0.5f, 0x1p-133f};
  uint8_t data[24];
  memcpy(data, h, 16);
  memcpy(data + 16, bf, 8);
  write_raw("half.safetensors",
            "{\"h\":{\"dtype\":\"F16\",\"shape\":[8],\"data_offsets\":[0,16]},"
            "\"b\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[16,24]},"
            "\"__metadata__\":{\"x\":\"y\"}}",
            data, sizeof data, 0);
  zt_st_file *f;
  if (zt_st_open(&f, path_of("half.safetensors"), err, sizeof err) < 0) {
    fprintf(stderr, "FAIL open: %s\n", err);
    return 1;
  }
  float out[8];
  fails += MC_EXPECT(zt_st_read_f32(f, zt_st_find(f, "h"), out, 0, err, sizeof err) == 0, "%s", err);
  fails += MC_EXPECT(!memcmp(out, hf, sizeof hf), "F16 conversion");
  fails += MC_EXPECT(zt_st_read_f32(f, zt_st_find(f, "b"), out, 0, err, sizeof err) == 0, "%s", err);
  fails += MC_EXPECT(!memcmp(out, bff, sizeof bff), "BF16 conversion");
  zt_st_close(f);
  return fails;
}

/* The BF16 writer: the bits dtype.h's rounding gives (ties to even both ways, the carry into the
 * exponent, FLT_MAX to inf, NaN to 0x7fc0, a subnormal, -0, up and down), a transposed entry, an entry put in
 * two ranges in reverse order beside an F32 one, and what the reader's range returns. */
static int test_bf16_write(void) {
  int fails = 0;
  char err[512];
  const float v[12] = {1.0f + 0x1p-8f,  1.0f + 3 * 0x1p-8f, -(1.0f + 0x1p-8f), 1.0f + 0x1p-7f,
                       0x1.fffffep127f, NAN,                INFINITY,          -0.0f,
                       0x1p-130f,       0x1.ff8p-1f,        3.14159265f,       -(1.0f + 3 * 0x1p-9f)};
  const uint16_t want[12] = {0x3f80, 0x3f82, 0xbf80, 0x3f81, 0x7f80, 0x7fc0,
                             0x7f80, 0x8000, 0x0008, 0x3f80, 0x4049, 0xbf81};
  for (int i = 0; i < 12; i++)
    fails += MC_EXPECT(zt_f32_to_bf16(v[i]) == want[i], "dtype.h: bf16(%a) = %#x, expected %#x",
                       (double)v[i], zt_f32_to_bf16(v[i]), want[i]);
  float t[6] = {1, 2, 3, 4, 5, 6}, f32[3] = {0.1f, 0.2f, 0.3f};
  zt_st_entry e[3] = {{.name = "v", .ndim = 2, .shape = {3, 4}, .dtype = ZT_ST_BF16},
                      {.name = "t", .ndim = 2, .shape = {2, 3}, .data = t, .transpose = 1,
                       .dtype = ZT_ST_BF16},
                      {.name = "f", .ndim = 1, .shape = {3}, .data = f32}};
  zt_st_writer *w = NULL;
  fails += MC_EXPECT(zt_st_writer_open(&w, path_of("bf.safetensors"), e, 3, NULL, 0, err,
                                       sizeof err) == 0, "open: %s", err);
  if (!w) return fails + 1;
  /* v in two ranges, the second half first; a range past the end and one put again refused */
  fails += MC_EXPECT(zt_st_writer_put_range(w, 0, 7, 5, v + 7, err, sizeof err) == 0, "%s", err);
  fails += MC_EXPECT(zt_st_writer_put_range(w, 0, 10, 3, v, err, sizeof err) == -EINVAL &&
                     strstr(err, "tensor v"), "a range past the end: %s", err);
  fails += MC_EXPECT(zt_st_writer_finish(w, err, sizeof err) == -EINVAL &&
                     strstr(err, "tensor v was never written whole"), "unfinished: %s", err);
  fails += MC_EXPECT(zt_st_writer_put_range(w, 0, 0, 7, v, err, sizeof err) == 0, "%s", err);
  fails += MC_EXPECT(zt_st_writer_put_range(w, 0, 0, 1, v, err, sizeof err) == -EINVAL,
                     "a range put twice");
  const float t_file[6] = {1, 3, 5, 2, 4, 6};
  fails += MC_EXPECT(zt_st_writer_put(w, 1, t_file, err, sizeof err) == 0, "%s", err);
  fails += MC_EXPECT(zt_st_writer_put(w, 2, f32, err, sizeof err) == 0, "%s", err);
  fails += MC_EXPECT(zt_st_writer_finish(w, err, sizeof err) == 0, "finish: %s", err);
  zt_st_writer_close(w);
  /* zt_st_write makes the same file of the same entries (t transposed from memory) */
  e[0].data = v;
  fails += MC_EXPECT(zt_st_write(path_of("bf2.safetensors"), e, 3, NULL, 0, err, sizeof err) == 0,
                     "write: %s", err);
  zt_st_file *f = NULL, *f2 = NULL;
  if (zt_st_open(&f, path_of("bf.safetensors"), err, sizeof err) < 0 ||
      zt_st_open(&f2, path_of("bf2.safetensors"), err, sizeof err) < 0) {
    fprintf(stderr, "FAIL open: %s\n", err);
    zt_st_close(f);
    return fails + 1;
  }
  const zt_st_tensor *tv = zt_st_find(f, "v"), *tt = zt_st_find(f, "t"), *tf = zt_st_find(f, "f");
  fails += MC_EXPECT(tv && tt && tf && tv->dtype == ZT_ST_BF16 && tt->dtype == ZT_ST_BF16 &&
                     tf->dtype == ZT_ST_F32 && tv->end - tv->begin == 24 && tt->shape[0] == 2,
                     "header");
  float back[12], mid[4], tb[6], fb[3];
  fails += MC_EXPECT(zt_st_read_f32(f, tv, back, 0, err, sizeof err) == 0, "%s", err);
  for (int i = 0; i < 12; i++) {
    float x = zt_bf16_to_f32(want[i]);
    fails += MC_EXPECT(!memcmp(&back[i], &x, 4), "element %d reads %a, expected %a", i,
                       (double)back[i], (double)x);
  }
  fails += MC_EXPECT(zt_st_read_f32_range(f, tv, 4, 4, mid, err, sizeof err) == 0 &&
                     !memcmp(mid, back + 4, sizeof mid), "a range of the elements");
  fails += MC_EXPECT(zt_st_read_f32_range(f, tv, 9, 4, mid, err, sizeof err) == -EINVAL &&
                     strstr(err, "outside its 12"), "a range past the end: %s", err);
  fails += MC_EXPECT(zt_st_read_f32(f, tt, tb, 1, err, sizeof err) == 0 && !memcmp(tb, t, sizeof t),
                     "transposed BF16");
  fails += MC_EXPECT(zt_st_read_f32(f, tf, fb, 0, err, sizeof err) == 0 &&
                     !memcmp(fb, f32, sizeof fb), "the F32 entry beside them");
  zt_st_close(f);
  zt_st_close(f2);
  FILE *a = fopen(path_of("bf.safetensors"), "rb"), *b = fopen(path_of("bf2.safetensors"), "rb");
  char ba[512], bb[512];
  size_t na = fread(ba, 1, sizeof ba, a), nb = fread(bb, 1, sizeof bb, b);
  fclose(a);
  fclose(b);
  fails += MC_EXPECT(na == nb && na < sizeof ba && !memcmp(ba, bb, na),
                     "the writer in pieces and zt_st_write make the same bytes");
  e[2].dtype = ZT_ST_F16;
  fails += MC_EXPECT(zt_st_write(path_of("f16.safetensors"), e, 3, NULL, 0, err, sizeof err) ==
                     -EINVAL && strstr(err, "F32 and BF16 only"), "F16 output refused: %s", err);
  return fails;
}

/* Tensors larger than a chunk (ZT_ST_CHUNK_BYTES), so that reads and writes go as several pieces
 * in flight and the conversion on several threads (engine/base/pio.h): BF16 (2-D, odd shape,
 * read plain, transposed and by a range across chunks) and F32 read back bit for bit, their
 * checksums as summed on the way equal to zt_st_sum's; the file cut short fails naming it. */
static int test_large(void) {
  int fails = 0;
  char err[512];
  size_t R = 2503, C = 4001, n = R * C;  /* 20 MB of BF16, 40 MB of F32 */
  float *x = malloc(n * 4), *back = malloc(n * 4);
  if (!x || !back) return 1;
  for (size_t i = 0; i < n; i++) x[i] = (float)((int)(i * 2654435761u % 200003u) - 100000) * 0x1p-10f;
  zt_st_entry e[2] = {{.name = "h", .ndim = 2, .shape = {(int64_t)R, (int64_t)C}, .data = x,
                       .dtype = ZT_ST_BF16},
                      {.name = "f", .ndim = 1, .shape = {(int64_t)n}, .data = x}};
  fails += MC_EXPECT(zt_st_write(path_of("big.safetensors"), e, 2, NULL, 0, err, sizeof err) == 0,
                     "write: %s", err);
  zt_st_file *f = NULL;
  if (zt_st_open(&f, path_of("big.safetensors"), err, sizeof err) < 0) {
    fprintf(stderr, "FAIL open: %s\n", err);
    return fails + 1;
  }
  const zt_st_tensor *th = zt_st_find(f, "h"), *tf = zt_st_find(f, "f");
  uint64_t s1 = 0, s2 = 1;
  fails += MC_EXPECT(zt_st_read_f32_sum(f, th, back, 0, &s1, err, sizeof err) == 0 &&
                     zt_st_sum(f, th, &s2, err, sizeof err) == 0 && s1 == s2, "BF16 sum: %s", err);
  size_t bad = n;
  for (size_t i = 0; i < n && bad == n; i++) {
    float want = zt_bf16_to_f32(zt_f32_to_bf16(x[i]));
    if (memcmp(&back[i], &want, 4)) bad = i;
  }
  fails += MC_EXPECT(bad == n, "BF16 element %zu", bad);
  fails += MC_EXPECT(zt_st_read_f32(f, th, back, 1, err, sizeof err) == 0, "%s", err);
  bad = n;
  for (size_t r = 0; r < R && bad == n; r++)
    for (size_t c = 0; c < C; c++) {
      float want = zt_bf16_to_f32(zt_f32_to_bf16(x[r * C + c]));
      if (memcmp(&back[c * R + r], &want, 4)) {
        bad = r * C + c;
        break;
      }
    }
  fails += MC_EXPECT(bad == n, "transposed BF16 element %zu", bad);
  size_t first = 3 * n / 7, k = n / 2;
  fails += MC_EXPECT(zt_st_read_f32_range(f, th, first, k, back, err, sizeof err) == 0, "%s", err);
  bad = k;
  for (size_t i = 0; i < k && bad == k; i++) {
    float want = zt_bf16_to_f32(zt_f32_to_bf16(x[first + i]));
    if (memcmp(&back[i], &want, 4)) bad = i;
  }
  fails += MC_EXPECT(bad == k, "a range across chunks: element %zu", bad);
  s1 = 0, s2 = 1;
  fails += MC_EXPECT(zt_st_read_f32_sum(f, tf, back, 0, &s1, err, sizeof err) == 0 &&
                     zt_st_sum(f, tf, &s2, err, sizeof err) == 0 && s1 == s2 &&
                     !memcmp(back, x, n * 4), "F32 read back: %s", err);
  /* cut inside the F32 tensor after the open: the read fails naming the file and the tensor;
   * a fresh open refuses the header's offsets */
  fails += MC_EXPECT(truncate(path_of("big.safetensors"), (off_t)(n * 2 + n * 3)) == 0, "truncate");
  int rc = zt_st_read_f32(f, tf, back, 0, err, sizeof err);
  fails += MC_EXPECT(rc == -EIO && strstr(err, "big.safetensors") && strstr(err, "tensor f") &&
                     strstr(err, "shorter"), "a file cut under the reader: %d %s", rc, err);
  zt_st_close(f);
  f = NULL;
  rc = zt_st_open(&f, path_of("big.safetensors"), err, sizeof err);
  fails += MC_EXPECT(rc == -EINVAL && strstr(err, "big.safetensors"), "a cut file: %d %s", rc, err);
  zt_st_close(f);
  free(x);
  free(back);
  return fails;
}

/* Refused with want and the file's name in the message, and none of the values read from the
 * file (leak: one of them, NULL for none): a file that is not what it should be is not quoted. */
static int refused(const char *name, const char *hdr, size_t data_len, uint64_t hlen,
                   const char *want, const char *leak) {
  char err[512] = "";
  uint8_t data[64] = {0};
  write_raw(name, hdr, data, data_len, hlen);
  zt_st_file *f = NULL;
  int rc = zt_st_open(&f, path_of(name), err, sizeof err);
  zt_st_close(f);
  return MC_EXPECT(rc == -EINVAL && strstr(err, want) && strstr(err, name) &&
                       (!leak || !strstr(err + strlen(path_of(name)), leak)),
                   "%s: rc %d, message \"%s\" should name \"%s\" and the file, without \"%s\"",
                   name, rc, err, want, leak ? leak : "");
}

static int test_bad_files(void) {
  int fails = 0;
  char err[512];
  const char *ok1 = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  {  /* cut below the 8-byte header length */
    FILE *f = fopen(path_of("short.safetensors"), "wb");
    fwrite("abc", 1, 3, f);
    fclose(f);
    zt_st_file *sf;
    fails += MC_EXPECT(zt_st_open(&sf, path_of("short.safetensors"), err, sizeof err) == -EINVAL &&
                       strstr(err, "not a safetensors file (bad header)") &&
                       !strstr(err, "3 bytes"), "3-byte file: %s", err);
  }
  fails += refused("hlen.safetensors", ok1, 8, 1000, "not a safetensors file (bad header)", "1000");
  fails += refused("json.safetensors", "{\"w\": [1, 2", 8, 0,
                   "not a safetensors file (bad header)", "[1");
  fails += refused("trunc.safetensors", ok1, 4, 0,
                   "tensor w: data_offsets out of the file's data section", "8");
  fails += refused("range.safetensors",
                   "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 8, 0,
                   "tensor w: data_offsets out of the file's data section", "16");
  fails += refused("size.safetensors",
                   "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, 0,
                   "tensor w: data_offsets do not span its shape x dtype", "12");
  fails += refused("overlap.safetensors",
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, 0,
                   "overlap", NULL);
  fails += refused("dtype.safetensors",
                   "{\"w\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 0,
                   "tensor w: unknown dtype", "Q4");
  fails += refused("shape.safetensors",
                   "{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, 0,
                   "tensor w: shape[0]", "-2");
  /* a known dtype that does not convert is refused at read time */
  write_raw("i64.safetensors", "{\"w\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}",
            "\0\0\0\0\0\0\0\0", 8, 0);
  zt_st_file *f;
  float x[2];
  fails += MC_EXPECT(zt_st_open(&f, path_of("i64.safetensors"), err, sizeof err) == 0, "%s", err);
  fails += MC_EXPECT(zt_st_read_f32(f, zt_st_find(f, "w"), x, 0, err, sizeof err) == -EINVAL &&
                     strstr(err, "tensor w"), "I64 read: %s", err);
  zt_st_close(f);
  return fails;
}

/* Model-level: HF GPT-2 naming accepted; missing / extra / misshapen tensors refused. */
static int test_model_files(void) {
  int fails = 0;
  char err[512];
  zt_model *m;
  zt_model_cfg mc = mc_tiny(ZT_ARCH_GPT);
  zt_model_create(&m, &mc, err, sizeof err);
  size_t n = zt_model_num_params(m);
  int nt = zt_model_num_tensors(m);
  float *p = malloc(n * 4), *q = malloc(n * 4);
  zt_model_init_params(m, p);
  /* an HF-like file: prefixed names, the tied head and the attention mask buffers */
  zt_st_entry *e = calloc((size_t)nt + 3, sizeof *e);
  char (*names)[128] = calloc((size_t)nt, 128);
  float mask[25] = {0};
  for (int i = 0; i < nt; i++) {
    const zt_tensor_info *t = zt_model_tensor(m, i);
    snprintf(names[i], 128, "transformer.%s", t->name);
    e[i] = (zt_st_entry){.name = names[i], .ndim = t->ndim, .shape = {t->shape[0], t->shape[1]},
                         .data = p + t->offset, .transpose = t->transposed};
  }
  e[nt] = (zt_st_entry){.name = "lm_head.weight", .ndim = 2, .shape = {11, 8}, .data = p};
  e[nt + 1] = (zt_st_entry){.name = "transformer.h.0.attn.bias", .ndim = 2, .shape = {5, 5}, .data = mask};
  e[nt + 2] = (zt_st_entry){.name = "transformer.h.1.attn.masked_bias", .ndim = 1, .shape = {1}, .data = mask};
  fails += MC_EXPECT(zt_st_write(path_of("hf.safetensors"), e, nt + 3, NULL, 0, err, sizeof err) == 0, "%s", err);
  zt_model_state s = {"", q};
  fails += MC_EXPECT(zt_model_load_states(m, path_of("hf.safetensors"), &s, 1, 0, err, sizeof err) == 0,
                     "HF-style load: %s", err);
  fails += MC_EXPECT(!memcmp(p, q, n * 4), "HF-style load changed values");

  /* missing: drop the last tensor */
  zt_st_write(path_of("missing.safetensors"), e, nt - 1, NULL, 0, err, sizeof err);
  fails += MC_EXPECT(zt_model_load_states(m, path_of("missing.safetensors"), &s, 1, 0, err, sizeof err) == -EINVAL &&
                     strstr(err, "tensor ln_f.bias is missing"), "missing: %s", err);
  /* extra: a third layer */
  e[nt] = (zt_st_entry){.name = "h.2.ln_1.weight", .ndim = 1, .shape = {8}, .data = p};
  zt_st_write(path_of("extra.safetensors"), e, nt + 1, NULL, 0, err, sizeof err);
  fails += MC_EXPECT(zt_model_load_states(m, path_of("extra.safetensors"), &s, 1, 0, err, sizeof err) == -EINVAL &&
                     strstr(err, "unexpected tensor h.2.ln_1.weight"), "extra: %s", err);
  /* wrong shape: c_attn stored in our (3C, C) layout instead of HF's (C, 3C) */
  for (int i = 0; i < nt; i++)
    if (strstr(e[i].name, "h.0.attn.c_attn.weight")) {
      e[i].shape[0] = 24;
      e[i].shape[1] = 8;
      e[i].transpose = 0;
    }
  zt_st_write(path_of("shape.safetensors"), e, nt, NULL, 0, err, sizeof err);
  fails += MC_EXPECT(zt_model_load_states(m, path_of("shape.safetensors"), &s, 1, 0, err, sizeof err) == -EINVAL &&
                     strstr(err, "h.0.attn.c_attn.weight has shape [24, 8], expected [8, 24]"),
                     "shape: %s", err);
  free(e);
  free(names);
  free(p);
  free(q);
  zt_model_destroy(m);
  return fails;
}

int main(void) {
  snprintf(dir, sizeof dir, "%s", mc_tmpdir());
  int fails = test_roundtrip() + test_half_types() + test_bf16_write() + test_bad_files() + test_model_files() +
              test_large();
  mc_rmtree(dir);
  return fails ? 1 : 0;
}
