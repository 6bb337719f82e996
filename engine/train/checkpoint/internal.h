/* defines: what the files of engine/train/checkpoint share, and only they: the sequence of
 * state calls a checkpoint call makes, a checkpoint's head, and each file's calls to the
 * others (dir.c: save and load; state.c: pieces and trainer.json's fields; flat.c and
 * per_rank.c: the layouts; probe.c: whether every part sees the directory; sums.c: the
 * checksums of the files' tensors). */
#ifndef ZT_TRAIN_CHECKPOINT_INTERNAL_H
#define ZT_TRAIN_CHECKPOINT_INTERNAL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/train/trainer_internal.h"

#define MANIFEST "manifest.json"

/* Where a checkpoint call is in its sequence of state calls, for its cleanup: a call that
 * fails before the sequence ended, other than inside a state call (whose path handled it),
 * tells a path whose other parts wait for the next piece (trainer_internal.h). */
typedef struct state_seq {
  int next;         /* the first unit not moved yet */
  int failed;       /* a state call failed */
  int shards;       /* a per-rank load began writing the ranks' chunks (load_shards) */
} state_seq;

/* The steps and the loss scaler's state of a checkpoint, checked before anything is written and
 * set once all of it is. */
typedef struct ckpt_head {
  int step, adam_step, good;
  float scale;  /* 0: none (fp32-only versions' checkpoints) */
  int eval_step;     /* the newest evaluation's record (zt_trainer_note_eval); 0: none */
  double eval_loss;
} ckpt_head;

/* state.c */
void zt__ckpt_seq_end(zt_trainer *t, const state_seq *q, int rc);
int zt__ckpt_write_json(const char *path, json_t *j, char *err, size_t errlen);
json_t *zt__ckpt_state_json(const zt_trainer *t, json_t *head);
int zt__ckpt_piece_out(zt_trainer *t, const char *where, int u0, int u1, float *p, float *m,
                       float *v, state_seq *q, char *err, size_t errlen);
int zt__ckpt_piece_in(zt_trainer *t, const char *dir, int u0, int u1, const float *p,
                      const float *m, const float *v, state_seq *q, char *err, size_t errlen);
int zt__ckpt_read_head(const zt_trainer *t, const json_t *j, const char *file, ckpt_head *h,
                       char *err, size_t errlen);
int zt__ckpt_step_in_range(const json_t *step);

/* flat.c */
int zt__ckpt_write_params(zt_trainer *t, const char *path, state_seq *q, json_t **sums,
                          char *err, size_t errlen);
int zt__ckpt_save_flat(zt_trainer *t, const char *tmp, state_seq *q, char *err, size_t errlen);
int zt__ckpt_load_flat(zt_trainer *t, const char *dir, state_seq *q, ckpt_head *h, char *err,
                       size_t errlen);

/* per_rank.c */
int zt__ckpt_save_ranked(zt_trainer *t, const zt_shard_table *tab, int stage, const char *tmp,
                         state_seq *q, char *err, size_t errlen);
int zt__ckpt_load_ranked(zt_trainer *t, const char *dir, const char *file, state_seq *q,
                         ckpt_head *h, char *err, size_t errlen);

/* sums.c: a writer's sums of its n states ({tensor: hex}; NULL when out of memory); sums
 * (stolen) recorded in head as file's; file's sums in head (NULL, and 0, when head has none:
 * a checkpoint from before them; -EINVAL naming path when head has sums but not file's); a
 * tensor's sum against them (0 when sums is NULL; -EBADMSG naming path, the tensor and the
 * word checksum); the warning of a load without sums. */
json_t *zt__ckpt_sums_of_writer(const zt_model_writer *w, const zt_model *m,
                                const char *const *suffix, int n);
int zt__ckpt_sums_add(json_t *head, const char *file, json_t *sums);
int zt__ckpt_sums_file(const json_t *head, const char *path, const char *file,
                       const json_t **sums, char *err, size_t errlen);
int zt__ckpt_sums_check(const json_t *sums, const char *path, const char *tensor, uint64_t got,
                        char *err, size_t errlen);
void zt__ckpt_sums_missing(const char *dir);

/* probe.c */
int zt__ckpt_probe_parts(zt_trainer *t, const char *dir, int save, const char *file, state_seq *q,
                         char *err, size_t errlen);

#endif
