/* ztctl tokenize --bytes TEXT... OUT: the byte-level tokenizer (vocabulary 256), each TEXT one
 * document of a version 2 token file (proto/zt_tokens.h) whose every token counts in the loss
 * but a document's first (nothing predicts it, as every writer marks it). The tokens are
 * streamed to the file as they are read; the header, which needs their count, is written last;
 * the file appears through a temporary file and a rename. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "client/ztctl/ztctl.h"
#include "proto/zt_tokens.h"

static int write_pad8(FILE *f, uint64_t written) {
  static const uint8_t zero[8];
  size_t n = (size_t)(zt__tokens_pad8(written) - written);
  return fwrite(zero, 1, n, f) == n ? 0 : -1;
}

/* One TEXT's bytes appended as 2-byte tokens; its count in *n. ZTCTL_OK, the failure printed
 * (the input named), or -1 for a write that failed (errno kept). */
static int append_text(FILE *out, const char *in_name, uint64_t *n) {
  FILE *in = strcmp(in_name, "-") == 0 ? stdin : fopen(in_name, "rb");
  if (!in) return ztctl_fail_msg("ENOENT", "cannot open %s: %s", in_name, strerror(errno));
  uint8_t ibuf[65536], obuf[2 * 65536];
  size_t got;
  int rc = ZTCTL_OK;
  *n = 0;
  while ((got = fread(ibuf, 1, sizeof ibuf, in)) > 0) {
    for (size_t i = 0; i < got; i++) {
      obuf[2 * i] = ibuf[i];
      obuf[2 * i + 1] = 0;
    }
    if (fwrite(obuf, 2, got, out) != got) {
      rc = -1;
      break;
    }
    *n += got;
  }
  if (rc == ZTCTL_OK && ferror(in))
    rc = ztctl_fail_msg("EIO", "reading %s: %s", in_name, strerror(errno));
  else if (rc == ZTCTL_OK && *n == 0)
    rc = ztctl_fail_msg("EINVAL", "%s is empty: a document holds at least one token", in_name);
  int e = errno;
  if (in != stdin) fclose(in);
  errno = e;
  return rc;
}

/* The mask of n tokens: every bit set but those of the documents' first tokens (starts). */
static int write_mask(FILE *f, uint64_t n, const uint64_t *starts, int n_docs) {
  uint8_t buf[4096];
  size_t fill = 0;
  int d = 0;
  for (uint64_t b = 0; b < (n + 7) / 8; b++) {
    uint8_t bits = n - 8 * b >= 8 ? 0xff : (uint8_t)((1u << (n - 8 * b)) - 1);
    for (; d < n_docs && starts[d] < 8 * (b + 1); d++) bits &= (uint8_t)~(1u << (starts[d] % 8));
    buf[fill++] = bits;
    if (fill == sizeof buf || b + 1 == (n + 7) / 8) {
      if (fwrite(buf, 1, fill, f) != fill) return -1;
      fill = 0;
    }
  }
  return 0;
}

static int tokenize_bytes(char *const *ins, int n_docs, const char *out_path, uint64_t *count) {
  uint64_t *starts = malloc(((size_t)n_docs + 1) * sizeof *starts);
  if (!starts) return ztctl_fail_msg("ENOMEM", "out of memory");
  ztctl_outfile out;
  int rc = ztctl_outfile_open(&out, out_path);
  if (rc != ZTCTL_OK) {
    free(starts);
    return rc;
  }
  /* the header's place, written once the counts are known */
  uint8_t hdr[ZT_TOKENS_V2_HEADER_BYTES] = {0}, buf[8];
  if (fwrite(hdr, 1, sizeof hdr, out.f) != sizeof hdr) goto fail;
  *count = 0;
  for (int d = 0; d < n_docs; d++) {
    uint64_t n;
    starts[d] = *count;
    if ((rc = append_text(out.f, ins[d], &n)) < 0) goto fail;
    if (rc != ZTCTL_OK) goto abort;
    *count += n;
  }
  starts[n_docs] = *count;
  if (write_pad8(out.f, 2 * *count) < 0 || write_mask(out.f, *count, starts, n_docs) < 0 ||
      write_pad8(out.f, (*count + 7) / 8) < 0)
    goto fail;
  for (int d = 0; d <= n_docs; d++) {
    zt__put_le64(buf, starts[d]);
    if (fwrite(buf, 1, 8, out.f) != 8) goto fail;
  }
  zt_tokens_header h = {.version = ZT_TOKENS_VERSION_DOCS, .token_bytes = 2, .vocab = 256,
                        .n_tokens = *count, .n_docs = (uint64_t)n_docs};
  zt_tokens_header_encode(hdr, &h);
  if (fseek(out.f, 0, SEEK_SET) != 0 || fwrite(hdr, 1, sizeof hdr, out.f) != sizeof hdr)
    goto fail;
  free(starts);
  return ztctl_outfile_commit(&out);
fail:
  free(starts);
  return ztctl_outfile_fail(&out);
abort:
  free(starts);
  ztctl_outfile_abort(&out);
  return rc;
}

int ztctl_cmd_tokenize(const ztctl_opts *o, int argc, char **argv) {
  bool bytes = false;
  char **pos = calloc((size_t)argc + 1, sizeof *pos);
  int npos = 0, rc;
  if (!pos) return ztctl_fail_msg("ENOMEM", "out of memory");
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--bytes") == 0)
      bytes = true;
    else if (argv[i][0] == '-' && argv[i][1] != '\0') {
      free(pos);
      return ztctl_usage_error("tokenize", "unknown option '%s'", argv[i]);
    } else
      pos[npos++] = argv[i];
  }
  if (!bytes) rc = ztctl_usage_error("tokenize", "only the byte-level tokenizer exists: pass --bytes");
  else if (npos < 2) rc = ztctl_usage_error("tokenize", "tokenize needs TEXT... and OUT");
  else rc = ZTCTL_OK;
  uint64_t count = 0;
  const char *out = npos ? pos[npos - 1] : NULL;
  if (rc == ZTCTL_OK) rc = tokenize_bytes(pos, npos - 1, out, &count);
  if (rc == ZTCTL_OK) {
    if (o->json)
      printf("{\"documents\":%d,\"tokens\":%llu,\"vocab\":256}\n", npos - 1,
             (unsigned long long)count);
    else
      printf("%s: %d document%s, %llu tokens (byte-level, vocab 256)\n", out, npos - 1,
             npos == 2 ? "" : "s", (unsigned long long)count);
  }
  free(pos);
  return rc;
}
