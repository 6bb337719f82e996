/* engine/base/path.h: a user's path opened the safe way. A FIFO, a directory, a device and a
 * socket where a file is asked (and a file where a directory is) are refused naming the field,
 * the path as given and its type, without an open that could block (the FIFO has no writer);
 * a regular file opens through a symlink; with roots, the resolved path must lie inside one (a
 * symlink out of the root is refused), a path outside is refused the same way whether it
 * exists or not, and no roots at all refuse every path; the checksum helpers round-trip. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "engine/base/checksum.h"
#include "engine/base/path.h"

static int fails;

static void expect(int rc, int want_rc, const char *err, const char *want, const char *what) {
  if (rc != want_rc || (want && !strstr(err, want))) {
    fprintf(stderr, "FAIL %s: rc %d (want %d), \"%s\" (want \"%s\")\n", what, rc, want_rc, err,
            want ? want : "");
    fails++;
  }
}

int main(void) {
  char dir[] = "/tmp/zt-path.XXXXXX", p[PATH_MAX + 128], q[PATH_MAX + 128], root[PATH_MAX + 16];
  char err[2048];
  if (!mkdtemp(dir)) return 1;
  char real[PATH_MAX];
  if (!realpath(dir, real)) return 1;
  snprintf(root, sizeof root, "%s/root", real);
  mkdir(root, 0755);
  int fd;

  snprintf(p, sizeof p, "%s/fifo", dir);
  mkfifo(p, 0600);
  expect(zt_path_open("data.path", p, 0, NULL, &fd, NULL, 0, err, sizeof err), -EINVAL, err,
         "data.path: ", "fifo");
  expect(0, 0, err, "/fifo is a FIFO, not a regular file", "fifo message");
  expect(zt_path_open("data.path", dir, 0, NULL, &fd, NULL, 0, err, sizeof err), -EINVAL, err,
         "is a directory, not a regular file", "directory");
  expect(zt_path_open("x", "/dev/null", 0, NULL, &fd, NULL, 0, err, sizeof err), -EINVAL, err,
         "x: /dev/null is a character device, not a regular file", "device");
  snprintf(p, sizeof p, "%s/sock", dir);
  int s = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%.100s", p);
  bind(s, (struct sockaddr *)&sa, sizeof sa);
  expect(zt_path_open(NULL, p, 0, NULL, &fd, NULL, 0, err, sizeof err), -EINVAL, err,
         "/sock is a socket, not a regular file", "socket");
  close(s);
  snprintf(p, sizeof p, "%s/missing", dir);
  expect(zt_path_open("f", p, 0, NULL, &fd, NULL, 0, err, sizeof err), -ENOENT, err,
         "No such file or directory", "missing");

  /* a regular file, through a symlink; its resolved name */
  snprintf(p, sizeof p, "%s/file", root);
  FILE *f = fopen(p, "w");
  fputs("x", f);
  fclose(f);
  snprintf(q, sizeof q, "%s/link", dir);
  symlink(p, q);
  char res[PATH_MAX] = "";
  expect(zt_path_open("f", q, 0, NULL, &fd, res, sizeof res, err, sizeof err), 0, err, NULL,
         "file by a symlink");
  if (fd < 0 || strcmp(res, p) != 0 || (fcntl(fd, F_GETFL) & O_NONBLOCK) == 0) {
    fprintf(stderr, "FAIL: fd %d, resolved \"%s\" (want \"%s\"), O_NONBLOCK\n", fd, res, p);
    fails++;
  }
  if (fd >= 0) close(fd);
  expect(zt_path_open("d", p, 1, NULL, NULL, NULL, 0, err, sizeof err), -EINVAL, err,
         "is a regular file, not a directory", "file for a directory");
  expect(zt_path_open("d", root, 1, NULL, NULL, NULL, 0, err, sizeof err), 0, err, NULL,
         "directory");

  /* confined */
  const char *dirs[] = {root};
  zt_path_roots in = {.dir = dirs, .n = 1, .what = "ztd --data-root"}, none = {.what = "roots"};
  expect(zt_path_open("f", p, 0, &in, NULL, NULL, 0, err, sizeof err), 0, err, NULL, "inside");
  expect(zt_path_open("f", q, 0, &in, NULL, NULL, 0, err, sizeof err), 0, err, NULL,
         "a link from outside to inside");
  snprintf(q, sizeof q, "%s/out", root);
  snprintf(p, sizeof p, "%s/fifo", dir);
  symlink(p, q);
  expect(zt_path_open("f", q, 0, &in, NULL, NULL, 0, err, sizeof err), -EACCES, err,
         "/root/out is outside ztd --data-root (", "a link out of the root");
  snprintf(p, sizeof p, "%s/missing", dir);
  expect(zt_path_open("f", p, 0, &in, NULL, NULL, 0, err, sizeof err), -EACCES, err,
         "is outside ztd --data-root", "missing outside");
  expect(zt_path_open("f", "/etc/passwd", 0, &in, NULL, NULL, 0, err, sizeof err), -EACCES, err,
         "/etc/passwd is outside", "existing outside");
  snprintf(p, sizeof p, "%s/sub/missing", root);
  expect(zt_path_open("f", p, 0, &in, NULL, NULL, 0, err, sizeof err), -ENOENT, err,
         "No such file", "missing inside");
  snprintf(p, sizeof p, "%s/../x", root);
  expect(zt_path_open("f", p, 0, &in, NULL, NULL, 0, err, sizeof err), -EACCES, err,
         "is outside", "dot-dot out");
  snprintf(p, sizeof p, "%s/file", root);
  expect(zt_path_open("f", p, 0, &none, NULL, NULL, 0, err, sizeof err), -EACCES, err,
         "not allowed: this client may name no such path (no roots)", "no roots");

  /* checksums */
  char hex[ZT_CHECKSUM_HEX];
  uint64_t back = 0, sum = zt_checksum("hello", 5);
  zt_checksum_state *cs = zt_checksum_new();
  zt_checksum_update(cs, "he", 2);
  zt_checksum_update(cs, "llo", 3);
  zt_checksum_hex(sum, hex);
  if (!cs || zt_checksum_digest(cs) != sum || zt_checksum_parse(hex, &back) < 0 || back != sum ||
      zt_checksum_parse("0123", &back) == 0 || zt_checksum_parse("0123456789abcdeg", &back) == 0) {
    fprintf(stderr, "FAIL: checksums\n");
    fails++;
  }
  zt_checksum_free(cs);

  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fails++;
  if (fails) fprintf(stderr, "%d failure(s)\n", fails);
  return fails ? 1 : 0;
}
