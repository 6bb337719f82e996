/* defines: what the per-rank checkpoint layout (per_rank.c, probe.c) offers a data-parallel
 * trainer (engine/train/dp): the io through which its ranks move their own files, and a part's
 * side of the probe and of its ranks' files. trainer_internal.h includes it for the step
 * path's save_shards / load_shards. */
#ifndef ZT_TRAIN_CHECKPOINT_SHARD_IO_H
#define ZT_TRAIN_CHECKPOINT_SHARD_IO_H

#include <stddef.h>

#include "engine/model/model.h"
#include "offload/shard.h"

/* A per-rank checkpoint's files (per_rank.c), as a data-parallel trainer that runs every rank
 * of its world moves each rank's own chunks (zt__train_path.save_shards / load_shards): on the
 * rank's thread, every rank at once. begin comes before the rank's first chunk; then, in unit
 * order, for each unit where the rank has elements (its zt_shard's count), put (a save: the
 * rank's chunk of the fp32 parameters, AdamW m and v, count floats each, valid during the call)
 * or get (a load: fills them); then end, also after a failure (ok 0: close without finishing).
 * Each returns 0 or a negative errno with a message naming the file in err. A data-parallel part
 * (dp.h, "Parts") moves its own ranks' files through such an io while the other parts move
 * theirs through their own (zt__rank_files_open). */
typedef struct zt__shard_io {
  void *arg;
  int (*begin)(void *arg, int rank, char *err, size_t errlen);
  int (*put)(void *arg, int rank, int unit, const float *p, const float *m, const float *v,
             char *err, size_t errlen);
  int (*get)(void *arg, int rank, int unit, float *p, float *m, float *v, char *err,
             size_t errlen);
  int (*end)(void *arg, int rank, int ok, char *err, size_t errlen);
  /* A save: each rank's finished file's size (world entries, for the manifest): end sets its
   * rank's; a part sets the other parts' ranks' from what they exchanged. NULL for a load. */
  long long *bytes;
  /* Rank `rank`'s file, for a message about a rank of another part (NULL: none). */
  const char *(*path)(void *arg, int rank);
} zt__shard_io;

/* A data-parallel part without rank 0 following a per-rank save or load
 * (engine/train/dp/parts.c): its side
 * of the probe, and its ranks' files in the probed directory, through the same code as the
 * part holding rank 0 uses. zt__ckpt_probe_sees: 1 when dir, as this process sees it, holds
 * the token (save: dir's marker file holds it and this process may write into dir; load:
 * dir's manifest has that digest), else 0.
 * zt__rank_files_open fills io for the files of tab's layout in dir: a save's
 * rank-R.safetensors (io.bytes set), a load's named by dir's manifest, whose layout must be
 * tab's; 0, or -ENOMEM / -EINVAL (the manifest) with a message. Close after a failed open too;
 * NULL is a no-op. */
int zt__ckpt_probe_sees(const char *dir, int save, const char *token);
typedef struct zt__rank_files zt__rank_files;
int zt__rank_files_open(zt__rank_files **x, zt__shard_io *io, const zt_model *m,
                        const zt_shard_table *tab, int zero_stage, const char *dir, int save,
                        char *err, size_t errlen);
void zt__rank_files_close(zt__rank_files *x);

#endif
