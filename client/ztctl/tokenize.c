/* ztctl tokenize --bytes: the byte-level tokenizer (vocabulary 256), written as a token file
 * (proto/zt_tokens.h) through a temporary file and a rename. */
#include <errno.h>
#include <string.h>

#include "client/ztctl/ztctl.h"
#include "proto/zt_tokens.h"

static int tokenize_bytes(FILE *in, const char *in_name, const char *out_path, uint64_t *count) {
  ztctl_outfile out;
  int rc = ztctl_outfile_open(&out, out_path);
  if (rc != ZTCTL_OK) return rc;
  uint8_t hdr[ZT_TOKENS_HEADER_BYTES];
  zt_tokens_header h = {.version = ZT_TOKENS_VERSION, .token_bytes = 2, .vocab = 256};
  zt_tokens_header_encode(hdr, &h);
  if (fwrite(hdr, 1, sizeof hdr, out.f) != sizeof hdr) return ztctl_outfile_fail(&out);
  uint8_t ibuf[65536], obuf[2 * 65536];
  size_t n;
  *count = 0;
  while ((n = fread(ibuf, 1, sizeof ibuf, in)) > 0) {
    for (size_t i = 0; i < n; i++) {
      obuf[2 * i] = ibuf[i];
      obuf[2 * i + 1] = 0;
    }
    if (fwrite(obuf, 2, n, out.f) != n) return ztctl_outfile_fail(&out);
    *count += n;
  }
  if (ferror(in)) {
    rc = ztctl_fail_msg("EIO", "reading %s: %s", in_name, strerror(errno));
    ztctl_outfile_abort(&out);
    return rc;
  }
  return ztctl_outfile_commit(&out);
}

int ztctl_cmd_tokenize(const ztctl_opts *o, int argc, char **argv) {
  bool bytes = false;
  const char *pos[2];
  int npos = 0;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--bytes") == 0)
      bytes = true;
    else if (argv[i][0] == '-' && argv[i][1] != '\0')
      return ztctl_usage_error("tokenize", "unknown option '%s'", argv[i]);
    else if (npos == 2)
      return ztctl_usage_error("tokenize", "tokenize takes TEXT and OUT ('%s' is extra)", argv[i]);
    else
      pos[npos++] = argv[i];
  }
  if (!bytes) return ztctl_usage_error("tokenize", "only the byte-level tokenizer exists: pass --bytes");
  if (npos != 2) return ztctl_usage_error("tokenize", "tokenize needs TEXT and OUT");
  FILE *in = strcmp(pos[0], "-") == 0 ? stdin : fopen(pos[0], "rb");
  if (!in) return ztctl_fail_msg("ENOENT", "cannot open %s: %s", pos[0], strerror(errno));
  uint64_t count = 0;
  int rc = tokenize_bytes(in, pos[0], pos[1], &count);
  if (in != stdin) fclose(in);
  if (rc == ZTCTL_OK) {
    if (o->json)
      printf("{\"tokens\":%llu,\"vocab\":256}\n", (unsigned long long)count);
    else
      printf("%s: %llu tokens (byte-level, vocab 256)\n", pos[1], (unsigned long long)count);
  }
  return rc;
}
