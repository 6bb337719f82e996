/* The shard table of ZeRO partitioning: each unit's flat parameter range split into `world`
 * equal chunks, one per rank.
 *
 * Per unit, not one split of the whole flat buffer: the unit is the grain at which the step
 * works (its backward finishes its gradients, its forward needs its parameters), so a unit's
 * gradients are reduce-scattered, and its parameters all-gathered, as soon as that happens, by
 * one collective in which every rank holds one chunk. Collectives want equal chunks (NCCL's
 * reduce-scatter and all-gather take one count), so a unit of n elements gets chunks of
 * chunk = ceil(n / world) rounded up to `align` elements; the unit padded to world * chunk is
 * the unit in the padded layout, with zeros past its n elements. A chunk's real elements
 * (count) can be fewer than chunk, or none for the last ranks of a small unit.
 *
 * Three layouts hold a chunk:
 * - the flat layout (the model's: checkpoints, zt_trainer_get_state): flat_off, count elements;
 * - the padded layout (a full copy of the parameters or gradients that collectives run on in
 *   place: unit u at padded_off[u], its world chunks back to back): padded_off;
 * - the rank's packed shard buffer (its chunks of every unit back to back, packed_total
 *   elements, the same for every rank): packed_off.
 * With `align` a multiple of 16 bytes' worth of the smallest element type in use, every chunk
 * of every layout starts 16-byte aligned when the buffer does. */
#ifndef ZT_OFFLOAD_SHARD_H
#define ZT_OFFLOAD_SHARD_H

#include <stddef.h>

/* A unit's range in the flat layout. */
typedef struct zt_shard_unit {
  size_t offset, numel;
} zt_shard_unit;

/* Rank r's chunk of unit u. */
typedef struct zt_shard {
  size_t unit_off;   /* first element in the unit: r * chunk (may be past numel) */
  size_t count;      /* real elements, <= chunk; the rest of the chunk is padding */
  size_t flat_off;   /* first element in the flat layout: the unit's offset + unit_off (read
                        only with count > 0) */
  size_t padded_off; /* first element in the padded layout */
  size_t packed_off; /* first element in the rank's packed shard buffer */
} zt_shard;

/* Read-only after zt_shard_table_build. */
typedef struct zt_shard_table {
  int n_units, world;
  size_t align;
  size_t *chunk;         /* per unit: elements of each rank's chunk */
  size_t *padded_unit;   /* per unit: its first element in the padded layout */
  size_t padded_total;   /* the padded layout: sum over units of world * chunk */
  size_t packed_total;   /* a rank's packed shard buffer: sum over units of chunk */
  size_t numel;          /* the units' elements, padding excluded */
  size_t max_chunk;      /* the largest chunk */
  size_t max_padded;     /* the largest unit in the padded layout (world * chunk) */
  size_t *rank_count;    /* per rank: its real elements over all units */
  zt_shard *shards;      /* [u * world + r] */
} zt_shard_table;

/* world >= 1, align >= 1. 0, -EINVAL or -ENOMEM; -EOVERFLOW if the padded sizes overflow. */
int zt_shard_table_build(zt_shard_table **t, const zt_shard_unit *units, int n_units, int world,
                         size_t align);
void zt_shard_table_free(zt_shard_table *t);

static inline const zt_shard *zt_shard_at(const zt_shard_table *t, int unit, int rank) {
  return &t->shards[(size_t)unit * (size_t)t->world + (size_t)rank];
}

#endif
