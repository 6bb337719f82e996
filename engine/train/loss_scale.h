/* Dynamic loss scaling for fp16 training, with torch.cuda.amp.GradScaler's defaults and rules:
 * the loss gradient is multiplied by the scale (65536 at start); a step whose gradients hold an
 * inf or nan is skipped and the scale halves; after 2000 consecutive clean steps it doubles. */
#ifndef ZT_TRAIN_LOSS_SCALE_H
#define ZT_TRAIN_LOSS_SCALE_H

#define ZT_LOSS_SCALE_INIT 65536.0f
#define ZT_LOSS_SCALE_GROWTH 2.0f
#define ZT_LOSS_SCALE_BACKOFF 0.5f
#define ZT_LOSS_SCALE_INTERVAL 2000

typedef struct zt_loss_scaler {
  float scale;
  int growth_interval; /* clean steps in a row before the scale grows */
  int good_steps;      /* clean steps since the scale last changed (GradScaler's growth tracker) */
} zt_loss_scaler;

/* GradScaler(): init_scale 65536, growth_interval 2000. */
void zt_loss_scaler_init(zt_loss_scaler *s);
/* GradScaler.update() after a step: found_inf != 0 backs off, else counts towards growth. */
void zt_loss_scaler_update(zt_loss_scaler *s, int found_inf);

#endif
