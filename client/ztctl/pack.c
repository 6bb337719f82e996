/* ztctl pack IN.jsonl OUT.tok [--vocab N]: documents of token ids (one JSON object a line,
 * transformers' input_ids with labels or a loss_mask) written as a version 2 token file
 * (proto/zt_tokens.h). Every line is checked before anything is written; the file appears
 * through a temporary file and a rename. */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "client/ztctl/ztctl.h"
#include "proto/zt_tokens.h"

/* labels' "not a target", as transformers writes it */
#define PACK_IGNORE_INDEX (-100)

typedef struct docs {
  uint32_t *tok;
  uint8_t *mask;      /* one byte a token while reading; packed into bits when written */
  uint64_t *starts;   /* n_docs + 1 */
  uint64_t n_tok, cap_tok, n_docs, cap_docs, n_targets;
  uint32_t max_tok;
} docs;

static int grow(docs *d, uint64_t more) {
  if (d->n_tok + more > d->cap_tok) {
    uint64_t cap = d->cap_tok ? d->cap_tok : 4096;
    while (cap < d->n_tok + more) cap *= 2;
    uint32_t *t = realloc(d->tok, cap * sizeof *t);
    if (t) d->tok = t;
    uint8_t *m = t ? realloc(d->mask, cap) : NULL;
    if (!m) return -ENOMEM;
    d->mask = m;
    d->cap_tok = cap;
  }
  if (d->n_docs + 2 > d->cap_docs) {
    uint64_t cap = d->cap_docs ? 2 * d->cap_docs : 1024;
    uint64_t *s = realloc(d->starts, cap * sizeof *s);
    if (!s) return -ENOMEM;
    d->starts = s;
    d->cap_docs = cap;
  }
  return 0;
}

/* One line's document appended to d; ZTCTL_OK or the failure printed with the line's number. */
static int add_line(docs *d, const char *in, uint64_t lineno, const char *line, size_t len,
                    uint64_t vocab) {
  json_error_t je;
  json_t *j = json_loadb(line, len, 0, &je);
  int rc = ZTCTL_FAILED;
  if (!json_is_object(j)) {
    /* the parser's text quotes the line; the column alone says where */
    ztctl_fail_msg("EINVAL", "%s line %llu: not a JSON object (column %d)", in,
                   (unsigned long long)lineno, je.column);
    goto out;
  }
  const json_t *ids = json_object_get(j, "input_ids"), *labels = json_object_get(j, "labels"),
               *mask = json_object_get(j, "loss_mask");
  size_t n = json_array_size(ids);
  if (!json_is_array(ids) || n == 0) {
    ztctl_fail_msg("EINVAL", "%s line %llu: input_ids must be a non-empty array of token ids",
                   in, (unsigned long long)lineno);
    goto out;
  }
  if (labels && mask) {
    ztctl_fail_msg("EINVAL", "%s line %llu: labels and loss_mask both given; give one", in,
                   (unsigned long long)lineno);
    goto out;
  }
  const json_t *m = labels ? labels : mask;
  const char *mname = labels ? "labels" : "loss_mask";
  if (m && (!json_is_array(m) || json_array_size(m) != n)) {
    ztctl_fail_msg("EINVAL", "%s line %llu: %s must be an array as long as input_ids (%zu)", in,
                   (unsigned long long)lineno, mname, n);
    goto out;
  }
  if (grow(d, n) < 0) {
    ztctl_fail_msg("ENOMEM", "out of memory");
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    const json_t *x = json_array_get(ids, i);
    json_int_t v = json_is_integer(x) ? json_integer_value(x) : -1;
    if (v < 0 || (uint64_t)v >= vocab) {
      ztctl_fail_msg("EINVAL", "%s line %llu: input_ids[%zu] is not an integer in [0, %llu)", in,
                     (unsigned long long)lineno, i, (unsigned long long)vocab);
      goto out;
    }
    int counted = 1;
    if (m) {
      const json_t *y = json_array_get(m, i);
      json_int_t w = json_is_integer(y) ? json_integer_value(y) : -2;
      if (labels && w != PACK_IGNORE_INDEX && w != v) {
        /* the target of position i is the token there: labels is input_ids, masked */
        ztctl_fail_msg("EINVAL", "%s line %llu: labels[%zu] is neither -100 nor input_ids[%zu]",
                       in, (unsigned long long)lineno, i, i);
        goto out;
      }
      if (mask && w != 0 && w != 1) {
        ztctl_fail_msg("EINVAL", "%s line %llu: loss_mask[%zu] is neither 0 nor 1", in,
                       (unsigned long long)lineno, i);
        goto out;
      }
      counted = labels ? w != PACK_IGNORE_INDEX : w == 1;
    }
    /* nothing predicts a document's first token */
    if (i == 0) counted = 0;
    d->tok[d->n_tok + i] = (uint32_t)v;
    d->mask[d->n_tok + i] = (uint8_t)counted;
    d->n_targets += (uint64_t)counted;
    if ((uint32_t)v > d->max_tok) d->max_tok = (uint32_t)v;
  }
  d->starts[d->n_docs++] = d->n_tok;
  d->n_tok += n;
  rc = ZTCTL_OK;
out:
  json_decref(j);
  return rc;
}

static int write_all(FILE *f, const void *p, size_t n) { return fwrite(p, 1, n, f) == n ? 0 : -1; }

static int write_pad8(FILE *f, uint64_t written) {
  static const uint8_t zero[8];
  return write_all(f, zero, (size_t)(zt__tokens_pad8(written) - written));
}

static int write_docs(const docs *d, uint32_t vocab, const char *out_path) {
  ztctl_outfile out;
  int rc = ztctl_outfile_open(&out, out_path);
  if (rc != ZTCTL_OK) return rc;
  zt_tokens_header h = {.version = ZT_TOKENS_VERSION_DOCS, .token_bytes = vocab <= 65536 ? 2 : 4,
                        .vocab = vocab, .n_tokens = d->n_tok, .n_docs = d->n_docs};
  uint8_t hdr[ZT_TOKENS_V2_HEADER_BYTES], buf[8];
  zt_tokens_header_encode(hdr, &h);
  if (write_all(out.f, hdr, sizeof hdr) < 0) return ztctl_outfile_fail(&out);
  for (uint64_t i = 0; i < d->n_tok; i++) {
    zt__put_le32(buf, d->tok[i]);
    if (write_all(out.f, buf, h.token_bytes) < 0) return ztctl_outfile_fail(&out);
  }
  if (write_pad8(out.f, d->n_tok * h.token_bytes) < 0) return ztctl_outfile_fail(&out);
  for (uint64_t i = 0; i < d->n_tok; i += 8) {
    uint8_t bits = 0;
    for (uint64_t b = 0; b < 8 && i + b < d->n_tok; b++) bits |= (uint8_t)(d->mask[i + b] << b);
    if (write_all(out.f, &bits, 1) < 0) return ztctl_outfile_fail(&out);
  }
  if (write_pad8(out.f, (d->n_tok + 7) / 8) < 0) return ztctl_outfile_fail(&out);
  for (uint64_t k = 0; k <= d->n_docs; k++) {
    zt__put_le64(buf, k < d->n_docs ? d->starts[k] : d->n_tok);
    if (write_all(out.f, buf, 8) < 0) return ztctl_outfile_fail(&out);
  }
  return ztctl_outfile_commit(&out);
}

int ztctl_cmd_pack(const ztctl_opts *o, int argc, char **argv) {
  const char *pos[2];
  int npos = 0;
  uint64_t vocab = 0;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--vocab") == 0) {
      char *end;
      if (i + 1 == argc) return ztctl_usage_error("pack", "--vocab needs a number");
      errno = 0;
      unsigned long long v = strtoull(argv[++i], &end, 10);
      if (errno || *end || v == 0 || v > UINT32_MAX)
        return ztctl_usage_error("pack", "--vocab must be an integer in [1, %u]", UINT32_MAX);
      vocab = v;
    } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
      return ztctl_usage_error("pack", "unknown option '%s'", argv[i]);
    } else if (npos == 2) {
      return ztctl_usage_error("pack", "pack takes IN.jsonl and OUT ('%s' is extra)", argv[i]);
    } else {
      pos[npos++] = argv[i];
    }
  }
  if (npos != 2) return ztctl_usage_error("pack", "pack needs IN.jsonl and OUT");
  FILE *in = strcmp(pos[0], "-") == 0 ? stdin : fopen(pos[0], "rb");
  if (!in) return ztctl_fail_msg("ENOENT", "cannot open %s: %s", pos[0], strerror(errno));
  docs d = {0};
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  uint64_t lineno = 0;
  int rc = ZTCTL_OK;
  while (rc == ZTCTL_OK && (len = getline(&line, &cap, in)) >= 0) {
    lineno++;
    size_t n = (size_t)len;
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' ')) n--;
    if (n == 0) continue;
    rc = add_line(&d, pos[0], lineno, line, n, vocab ? vocab : (uint64_t)UINT32_MAX);
  }
  if (rc == ZTCTL_OK && ferror(in)) rc = ztctl_fail_msg("EIO", "reading %s: %s", pos[0],
                                                        strerror(errno));
  if (rc == ZTCTL_OK && d.n_docs == 0)
    rc = ztctl_fail_msg("EINVAL", "%s holds no document", pos[0]);
  uint32_t v = vocab ? (uint32_t)vocab : d.max_tok + 1;
  if (rc == ZTCTL_OK) rc = write_docs(&d, v, pos[1]);
  if (rc == ZTCTL_OK) {
    if (o->json)
      printf("{\"documents\":%llu,\"tokens\":%llu,\"targets\":%llu,\"vocab\":%u}\n",
             (unsigned long long)d.n_docs, (unsigned long long)d.n_tok,
             (unsigned long long)d.n_targets, v);
    else
      printf("%s: %llu documents, %llu tokens (%llu targets), vocab %u\n", pos[1],
             (unsigned long long)d.n_docs, (unsigned long long)d.n_tok,
             (unsigned long long)d.n_targets, v);
  }
  if (in != stdin) fclose(in);
  free(line);
  free(d.tok);
  free(d.mask);
  free(d.starts);
  return rc;
}
