#include "engine/train/loss_scale.h"

void zt_loss_scaler_init(zt_loss_scaler *s) {
  s->scale = ZT_LOSS_SCALE_INIT;
  s->growth_interval = ZT_LOSS_SCALE_INTERVAL;
  s->good_steps = 0;
}

void zt_loss_scaler_update(zt_loss_scaler *s, int found_inf) {
  if (found_inf) {
    s->scale *= ZT_LOSS_SCALE_BACKOFF;
    s->good_steps = 0;
    return;
  }
  if (++s->good_steps == s->growth_interval) {
    s->scale *= ZT_LOSS_SCALE_GROWTH;
    s->good_steps = 0;
  }
}
