/* ztctl export: a job's latest weights as one safetensors file, or with --hf as a Hugging Face
 * directory (zt_client_export_hf). */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "client/ztctl/ztctl.h"

/* "5GB", "200MB", "64KiB", "1000": bytes as save_pretrained's max_shard_size reads them (KB,
 * MB, GB decimal; KiB, MiB, GiB binary; a plain number bytes). 0 when it is not one. */
static uint64_t parse_size(const char *s) {
  static const struct {
    const char *unit;
    uint64_t mul;
  } units[] = {{"", 1},           {"B", 1},           {"KB", 1000},        {"MB", 1000000},
               {"GB", 1000000000}, {"KIB", 1ull << 10}, {"MIB", 1ull << 20}, {"GIB", 1ull << 30}};
  char *end;
  errno = 0;
  if (!isdigit((unsigned char)s[0])) return 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno) return 0;
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
    if (!strcasecmp(end, units[i].unit))
      return v <= UINT64_MAX / units[i].mul ? v * units[i].mul : 0;
  return 0;
}

/* The option's value at argv[*i] (--name VALUE or --name=VALUE), NULL when it is not that
 * option; *missing when its value is. */
static const char *value_of(int argc, char **argv, int *i, const char *name, int *missing) {
  size_t n = strlen(name);
  if (strncmp(argv[*i], name, n)) return NULL;
  if (argv[*i][n] == '=') return argv[*i] + n + 1;
  if (argv[*i][n]) return NULL;
  if (*i + 1 >= argc) {
    *missing = 1;
    return NULL;
  }
  return argv[++*i];
}

static void print_hf(const char *job, const char *dir, const char *listing) {
  json_error_t jerr;
  json_t *j = json_loads(listing, 0, &jerr);
  const json_t *files = json_object_get(j, "files");
  double bytes = 0;
  for (size_t i = 0; i < json_array_size(files); i++)
    bytes += (double)json_integer_value(json_object_get(json_array_get(files, i), "size"));
  char size[32];
  ztctl_fmt_bytes(size, sizeof size, bytes);
  printf("%s: step %lld exported to %s (Hugging Face, %s, %zu files, %s)\n", job,
         (long long)json_integer_value(json_object_get(j, "step")), dir,
         json_string_value(json_object_get(j, "dtype")), json_array_size(files), size);
  const char *note = json_string_value(json_object_get(j, "note"));
  if (note) fprintf(stderr, "ztctl: note: %s\n", note);
  json_decref(j);
}

int ztctl_cmd_export(const ztctl_opts *o, int argc, char **argv) {
  const char *pos[2], *dtype = NULL, *shard_arg = NULL;
  int npos = 0, hf = 0;
  for (int i = 0; i < argc; i++) {
    int missing = 0;
    const char *v;
    if (!strcmp(argv[i], "--hf")) {
      hf = 1;
    } else if ((v = value_of(argc, argv, &i, "--dtype", &missing))) {
      dtype = v;
    } else if ((v = value_of(argc, argv, &i, "--max-shard-size", &missing))) {
      shard_arg = v;
    } else if (missing) {
      return ztctl_usage_error("export", "%s needs a value", argv[i]);
    } else if (argv[i][0] == '-' && argv[i][1]) {
      return ztctl_usage_error("export", "unknown option '%s'", argv[i]);
    } else if (npos == 2) {
      return ztctl_usage_error("export", "export takes 2 arguments, not more");
    } else {
      pos[npos++] = argv[i];
    }
  }
  if (npos != 2) return ztctl_usage_error("export", "export takes 2 arguments, not %d", npos);
  if (!hf && (dtype || shard_arg))
    return ztctl_usage_error("export", "%s goes with --hf", dtype ? "--dtype" : "--max-shard-size");
  if (dtype && strcmp(dtype, "bf16") && strcmp(dtype, "fp32"))
    return ztctl_usage_error("export", "--dtype is bf16 or fp32, not '%s'", dtype);
  uint64_t shard = shard_arg ? parse_size(shard_arg) : 0;
  if (shard_arg && !shard)
    return ztctl_usage_error("export", "--max-shard-size wants a size (5GB, 500MB, 1000000), "
                             "not '%s'", shard_arg);
  zt_client *c = ztctl_connect(o);
  if (!c) return ZTCTL_FAILED;
  int rc = ZTCTL_OK;
  char *listing = NULL;
  if (!hf) {
    rc = zt_client_export(c, pos[0], pos[1]) < 0 ? ztctl_fail(c) : ZTCTL_OK;
    if (rc == ZTCTL_OK && o->json) {
      json_t *j = json_pack("{s:s,s:s}", "job", pos[0], "path", pos[1]);
      char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
      if (s) printf("%s\n", s);
      free(s);
      json_decref(j);
    } else if (rc == ZTCTL_OK) {
      printf("%s: weights written to %s\n", pos[0], pos[1]);
    }
  } else if (zt_client_export_hf(c, pos[0], pos[1], dtype, shard, &listing) < 0) {
    rc = ztctl_fail(c);
  } else if (o->json) {
    json_error_t jerr;
    json_t *j = json_loads(listing, 0, &jerr);
    json_object_set_new(j, "job", json_string(pos[0]));
    json_object_set_new(j, "path", json_string(pos[1]));
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (s) printf("%s\n", s);
    free(s);
    json_decref(j);
  } else {
    print_hf(pos[0], pos[1], listing);
  }
  free(listing);
  zt_client_close(c);
  return rc;
}
