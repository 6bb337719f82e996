/* ztctl without a daemon: usage errors exit 2, a failed connection exits 1 with the documented
 * message, help exits 0, and `tokenize --bytes` writes the documented token file (version 2, a
 * document a TEXT). */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proto/zt_tokens.h"
#include "tests/unit/proto/check.h"

static const char *g_ztctl;
static char g_dir[] = "/tmp/zt-ztctl-test-XXXXXX";
static char g_err_path[256];

/* Runs ztctl with the NULL-terminated arguments; stderr goes to g_err_path. Returns the exit code. */
static int run(const char *arg, ...) {
  const char *argv[32] = {g_ztctl};
  int n = 1;
  va_list ap;
  va_start(ap, arg);
  for (const char *a = arg; a && n < 31; a = va_arg(ap, const char *)) argv[n++] = a;
  va_end(ap);
  argv[n] = NULL;
  pid_t pid = fork();
  if (pid == 0) {
    int null = open("/dev/null", O_WRONLY);
    int err = open(g_err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(null, 1);
    dup2(err, 2);
    execv(g_ztctl, (char *const *)argv);
    _exit(127);
  }
  int status;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static bool stderr_has(const char *text) {
  static char buf[4096];
  FILE *f = fopen(g_err_path, "r");
  if (!f) return false;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  return strstr(buf, text) != NULL;
}

static void test_usage(void) {
  CHECK(run(NULL) == 2);
  CHECK(run("frobnicate", NULL) == 2 && stderr_has("unknown command 'frobnicate'"));
  CHECK(run("--frob", "status", NULL) == 2 && stderr_has("unknown option '--frob'"));
  CHECK(run("--socket", NULL) == 2 && stderr_has("--socket needs a value"));
  CHECK(run("--tcp", "nohostport", "--token-file", "/dev/null", "status", NULL) == 2);
  CHECK(run("--tcp", "host:99999", "--token-file", "/dev/null", "status", NULL) == 2);
  CHECK(run("--tcp", "host:1234", "status", NULL) == 2 && stderr_has("--tcp needs --token-file"));
  CHECK(run("--socket", "/x", "--tcp", "h:1", "--token-file", "/dev/null", "status", NULL) == 2);
  CHECK(run("status", "extra", NULL) == 2);
  CHECK(run("status", "--frob", NULL) == 2);
  CHECK(run("--version", NULL) == 0);
  /* the global options after the command too; with --json the errors are JSON with the code */
  CHECK(run("status", "--socket", "/dev/null", NULL) == 1 &&
        stderr_has("ztctl: ECONNREFUSED: cannot connect to /dev/null"));
  CHECK(run("jobs", "--json", "--socket=/dev/null", NULL) == 1 &&
        stderr_has("{\"error\":{\"code\":\"ECONNREFUSED\",\"message\":\"cannot connect to /dev/null"));
  CHECK(run("show", "--json", NULL) == 2 &&
        stderr_has("{\"error\":{\"code\":\"EINVAL\",\"message\":\"show takes 1 argument"));
  CHECK(run("--json", "frobnicate", NULL) == 2 && stderr_has("\"code\":\"EINVAL\""));
  CHECK(run("status", "--socket", NULL) == 2 && stderr_has("--socket needs a value"));
  /* after "--" an option is the command's: not a global --json (the error is not JSON) */
  CHECK(run("show", "--", "--json", NULL) == 2 && stderr_has("ztctl: ") && !stderr_has("{\"error\""));
  CHECK(run("show", NULL) == 2 && stderr_has("usage: ztctl [OPTIONS] show JOB"));
  CHECK(run("show", "a", "b", NULL) == 2);
  CHECK(run("cancel", NULL) == 2);
  CHECK(run("watch", NULL) == 2);
  CHECK(run("checkpoint", NULL) == 2);
  CHECK(run("export", "j000001", NULL) == 2);
  CHECK(run("submit", NULL) == 2);
  CHECK(run("submit", "a.json", "b.json", NULL) == 2);
  CHECK(run("submit", "a.json", "--wait", "--watch", NULL) == 2);
  CHECK(run("submit", "a.json", "--data", NULL) == 2);
  CHECK(run("tokenize", "in", "out", NULL) == 2 && stderr_has("--bytes"));
  CHECK(run("tokenize", "--bytes", "in", NULL) == 2);
  CHECK(run("help", "nope", NULL) == 2);
  CHECK(run("--help", NULL) == 0);
  CHECK(run("help", NULL) == 0);
  CHECK(run("help", "submit", NULL) == 0);
  CHECK(run("submit", "--help", NULL) == 0);
}

static void test_connect_failure(void) {
  char sock[512];
  snprintf(sock, sizeof sock, "%s/none.sock", g_dir);
  CHECK(run("--socket", sock, "status", NULL) == 1);
  CHECK(stderr_has("ztctl: ENOENT: cannot connect to ") && stderr_has("none.sock"));
  /* a socket file nobody listens on */
  CHECK(run("--socket", "/dev/null", "jobs", NULL) == 1 && stderr_has("ztctl: ECONNREFUSED: cannot connect to /dev/null"));
}

/* Two TEXTs, two documents of a version 2 file: every token a target but each document's
 * first. */
static void test_tokenize(void) {
  char in[512], in2[512], out[512];
  snprintf(in, sizeof in, "%s/text.txt", g_dir);
  snprintf(in2, sizeof in2, "%s/more.txt", g_dir);
  snprintf(out, sizeof out, "%s/text.tok", g_dir);
  static const uint8_t text[] = {'h', 'i', '\n', 0x00, 0xff, 0x80};
  static const uint8_t more[] = {'a', 'b', 'c', 'd', 'e', 'f', 'g'};
  FILE *f = fopen(in, "wb");
  fwrite(text, 1, sizeof text, f);
  fclose(f);
  f = fopen(in2, "wb");
  fwrite(more, 1, sizeof more, f);
  fclose(f);
  CHECK(run("tokenize", "--bytes", in, in2, out, NULL) == 0);
  uint8_t buf[256];
  f = fopen(out, "rb");
  CHECK(f != NULL);
  if (!f) return;
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  zt_tokens_header h = {0};
  zt_tokens_layout l = {0};
  const uint64_t N = sizeof text + sizeof more;
  CHECK(zt_tokens_header_decode(buf, &h) == 0 && zt_tokens_header_decode_v2(buf, &h) == 0);
  CHECK(h.version == 2 && h.token_bytes == 2 && h.vocab == 256 && h.n_tokens == N &&
        h.n_docs == 2);
  CHECK(zt_tokens_layout_of(&h, &l) == 0 && n == l.size);
  if (n != l.size || h.n_tokens != N) return;
  for (size_t i = 0; i < N; i++) {
    uint8_t want = i < sizeof text ? text[i] : more[i - sizeof text];
    CHECK(buf[l.tokens + 2 * i] == want && buf[l.tokens + 2 * i + 1] == 0);
    int bit = buf[l.mask + i / 8] >> (i % 8) & 1;
    CHECK(bit == (i != 0 && i != sizeof text));
  }
  CHECK(buf[l.mask + N / 8] >> (N % 8) == 0); /* no bit past the tokens */
  CHECK(zt__get_le64(buf + l.starts) == 0 && zt__get_le64(buf + l.starts + 8) == sizeof text &&
        zt__get_le64(buf + l.starts + 16) == N);
  char tmp[600];
  snprintf(tmp, sizeof tmp, "%s.tmp", out);
  CHECK(access(tmp, F_OK) != 0);
  /* a missing or an empty input fails (1) naming it and leaves no output behind */
  snprintf(in, sizeof in, "%s/missing.txt", g_dir);
  snprintf(out, sizeof out, "%s/missing.tok", g_dir);
  CHECK(run("tokenize", "--bytes", in2, in, out, NULL) == 1 && access(out, F_OK) != 0);
  snprintf(tmp, sizeof tmp, "%s.tmp", out);
  CHECK(access(tmp, F_OK) != 0);
  snprintf(in, sizeof in, "%s/empty.txt", g_dir);
  fclose(fopen(in, "wb"));
  CHECK(run("tokenize", "--bytes", in2, in, out, NULL) == 1 && access(out, F_OK) != 0 &&
        stderr_has("empty.txt is empty: a document holds at least one token"));
  CHECK(access(tmp, F_OK) != 0);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PATH/TO/ztctl\n", argv[0]);
    return 2;
  }
  g_ztctl = argv[1];
  if (!mkdtemp(g_dir)) return 1;
  snprintf(g_err_path, sizeof g_err_path, "%s/stderr", g_dir);
  test_usage();
  test_connect_failure();
  test_tokenize();
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
  return TEST_DONE();
}
