/* Who may talk to ztd (DESIGN.md "Wire protocol"; issue "Hardening"): the TCP token, checked in
 * constant time, and a per-peer backoff after failed tokens so that guessing is slow and a burst
 * of guesses is one log line. Called by dispatch.c's hello handler; the table lives in the
 * server (loop thread only). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "engine/base/log.h"
#include "engine/server/server.h"

/* Time depends on the lengths only, never on where the contents first differ. */
static bool token_equal(const char *got, size_t got_len, const char *want, size_t want_len) {
  volatile unsigned char acc = (unsigned char)(got_len != want_len);
  for (size_t i = 0; i < want_len; i++)
    acc |= (unsigned char)((i < got_len ? got[i] : 0) ^ want[i]);
  return acc == 0;
}

static zt_auth_peer *peer_of(zt_server *srv, const char *addr, bool add) {
  zt_auth_peer *oldest = NULL;
  for (int i = 0; i < srv->n_auth_peers; i++) {
    zt_auth_peer *p = &srv->auth_peers[i];
    if (!strcmp(p->addr, addr)) return p;
    if (!oldest || p->last_ms < oldest->last_ms) oldest = p;
  }
  if (!add) return NULL;
  zt_auth_peer *p = srv->n_auth_peers < ZT_TUNE_TOKEN_PEERS ? &srv->auth_peers[srv->n_auth_peers++]
                                                            : oldest;
  memset(p, 0, sizeof *p);
  snprintf(p->addr, sizeof p->addr, "%s", addr);
  return p;
}

int zt__auth_token(zt_server *srv, const char *peer, const char *tok, size_t tlen, char *why,
                   size_t whylen) {
  uint64_t now = uv_now(srv->loop);
  zt_auth_peer *p = peer_of(srv, peer, false);
  if (p && now < p->until_ms) {
    snprintf(why, whylen, "token: too many wrong tokens from %s; retry in %llu s", peer,
             (unsigned long long)((p->until_ms - now + 999) / 1000));
    return -EAGAIN;
  }
  /* Clients send the file's contents; a trailing newline is not part of the secret. */
  while (tlen > 0 && (tok[tlen - 1] == '\n' || tok[tlen - 1] == '\r')) tlen--;
  const zt_server_config *cfg = srv->cfg;
  if (tok && token_equal(tok, tlen, cfg->token, cfg->token_len)) {
    if (p) p->failures = 0;
    return 0;
  }
  if (!(p = peer_of(srv, peer, true))) return -EACCES;
  p->last_ms = now;
  if (++p->failures <= ZT_TUNE_TOKEN_FREE_FAILURES) {
    ZT_LOGW("server", "TCP client %s refused: wrong or missing token", peer);
  } else {
    int k = p->failures - ZT_TUNE_TOKEN_FREE_FAILURES - 1;
    uint64_t ms = ZT_TUNE_TOKEN_BACKOFF_MS;
    while (k-- > 0 && ms < ZT_TUNE_TOKEN_BACKOFF_MAX_MS) ms *= 2;
    if (ms > ZT_TUNE_TOKEN_BACKOFF_MAX_MS) ms = ZT_TUNE_TOKEN_BACKOFF_MAX_MS;
    p->until_ms = now + ms;
    ZT_LOGW("server", "TCP client %s refused: %d wrong tokens; its hellos are refused for %llu "
            "ms", peer, p->failures, (unsigned long long)ms);
  }
  snprintf(why, whylen, "token: wrong or missing");
  return -EACCES;
}
