/* The offloaded step's delayed update (docs/offload.md "Delayed update"): step k's update of the
 * streamed units runs during step k + 1, writing the next buffers, which become current when it
 * lands. */
#include "engine/train/offload/internal.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* The pieces that point into [a, a + bytes) point at the same place of b, and the reverse. */
static void rebase_pieces(off_state *s, const void *a, const void *b, size_t bytes) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  for (int k = 0; k < s->first_piece[s->nu]; k++) {
    uintptr_t h = (uintptr_t)s->pieces[k].host;
    if (h >= x && h < x + bytes)
      s->pieces[k].host = (const void *)(y + (h - x));
    else if (h >= y && h < y + bytes)
      s->pieces[k].host = (const void *)(x + (h - y));
  }
}

/* An update written into the next buffers has finished: they become the current ones, which
 * the streamer fetches from, and the current ones the next update's. */
void zt__off_swap_copies(zt_trainer *t) {
  off_state *s = t->path_state;
  size_t lp_bytes = (zt_model_num_params(t->model) - s->lo) * zt_dtype_size(s->dt);
  if (s->m_nxt) {
    rebase_pieces(s, s->h[ZT_OPT_MASTER], s->m_nxt, s->h_floats * sizeof(float));
    float *m = s->h[ZT_OPT_MASTER];
    s->h[ZT_OPT_MASTER] = s->m_nxt;
    s->m_nxt = m;
  }
  if (s->lp_nxt) {
    rebase_pieces(s, s->lp, s->lp_nxt, lp_bytes);
    uint16_t *l = s->lp;
    s->lp = s->lp_nxt;
    s->lp_nxt = l;
  }
  if (s->scopy_nxt) {
    rebase_pieces(s, s->scopy, s->scopy_nxt, s->scopy_off[s->nu] * sizeof(float));
    float *c = s->scopy;
    s->scopy = s->scopy_nxt;
    s->scopy_nxt = c;
  }
}

/* Starts the pending update's next units: an NVMe unit (zt__off_update_unit waits for its read,
 * then reads the next one ahead), or once they are reached every host unit at once. */
int zt__off_pend_pump(zt_trainer *t) {
  off_state *s = t->path_state;
  int rc = 0;
  if (!s->pend) return 0;
  if (s->pend_next >= s->nh) {
    if ((rc = zt__off_update_unit(t, s->pend_next, &s->pend_hp)) == 0) s->pend_next--;
    return rc;
  }
  while (rc == 0 && s->pend_next >= s->ng)
    if ((rc = zt__off_update_unit(t, s->pend_next, &s->pend_hp)) == 0) s->pend_next--;
  return rc;
}

/* Step k's update deferred: every host unit's started at once when there is no NVMe unit, else
 * the first NVMe unit's read; the walks of step k + 1 start the rest (zt__off_pend_pump). */
int zt__off_pend_start(zt_trainer *t, const zt_adam_hparams *hp, int step) {
  off_state *s = t->path_state;
  s->pend = 1;
  s->pend_hp = *hp;
  s->pend_step = step;
  s->pend_next = s->nu - 1;
  return s->pend_next >= s->nh ? zt_opt_store_read(s->opt, s->pend_next) : zt__off_pend_pump(t);
}

/* Before step k + 1 writes back streamed unit u's gradients over step k's: the pending update
 * of u started and done reading them. */
int zt__off_pend_wait_unit(zt_trainer *t, int u) {
  off_state *s = t->path_state;
  int rc = 0;
  while (rc == 0 && s->pend && s->pend_next >= u) rc = zt__off_pend_pump(t);
  zt_opt_store_wait(s->opt, u);
  return rc;
}

/* Lands the pending update: every unit started and finished (NVMe ones written back), the next
 * buffers made current, the device copies of the stale ones dropped. A failure leaves the state
 * between two steps: broken. */
int zt__off_pend_finish(zt_trainer *t) {
  off_state *s = t->path_state;
  int rc = 0;
  if (!s->pend) return 0;
  while (rc == 0 && s->pend_next >= s->ng) rc = zt__off_pend_pump(t);
  int frc = zt_opt_store_finish(s->opt);
  if (rc == 0) rc = frc;
  s->pend = 0;
  if (rc < 0) {
    s->broken = 1;
    return rc;
  }
  zt__off_swap_copies(t);
  return zt_streamer_invalidate(s->st, -1);
}

/* err for a failure of pend_*: the NVMe store's message or the errno's */
void zt__off_pend_fail(zt_trainer *t, int rc, int step, char *err, size_t errlen) {
  off_state *s = t->path_state;
  snprintf(err, errlen, "step %d: the delayed AdamW update of step %d failed: %s", step,
           s->pend_step, zt_opt_store_error(s->opt, rc));
}
