/* The trainer's state, shared by trainer.c (the step) and checkpoint.c (save/load). */
#ifndef ZT_TRAIN_TRAINER_INTERNAL_H
#define ZT_TRAIN_TRAINER_INTERNAL_H

#include "engine/train/loss_scale.h"
#include "engine/train/trainer.h"

struct zt_trainer {
  zt_model *model;
  zt_train_cfg tc;
  zt_backend be;
  float *params, *grads, *m, *v;  /* backend buffers in the flat layout */
  void *params_lp;                /* the bf16/fp16 compute copy; NULL in fp32 */
  zt_acts *acts;
  int32_t *h_tok, *h_tgt;         /* host staging for one micro-batch's inputs and targets */
  int step;                       /* steps completed, skipped ones included */
  int adam_step;                  /* AdamW's t of the last update (== step unless fp16 skipped) */
  zt_loss_scaler scaler;          /* fp16 only */
};

#endif
