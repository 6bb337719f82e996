/* The shard table (offload/shard.h): arithmetic only, done once when a job starts. */
#include "offload/shard.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

void zt_shard_table_free(zt_shard_table *t) {
  if (!t) return;
  free(t->chunk);
  free(t->padded_unit);
  free(t->rank_count);
  free(t->shards);
  free(t);
}

/* a + b into *sum, 0 or -EOVERFLOW */
static int add(size_t a, size_t b, size_t *sum) {
  if (a > SIZE_MAX - b) return -EOVERFLOW;
  *sum = a + b;
  return 0;
}

int zt_shard_table_build(zt_shard_table **out, const zt_shard_unit *units, int n_units,
                         int world, size_t align) {
  *out = NULL;
  if (!units || n_units < 1 || world < 1 || align < 1) return -EINVAL;
  zt_shard_table *t = calloc(1, sizeof *t);
  if (!t) return -ENOMEM;
  size_t nu = (size_t)n_units, W = (size_t)world;
  int rc = 0;
  t->n_units = n_units;
  t->world = world;
  t->align = align;
  t->chunk = calloc(nu, sizeof *t->chunk);
  t->padded_unit = calloc(nu, sizeof *t->padded_unit);
  t->rank_count = calloc(W, sizeof *t->rank_count);
  t->shards = nu <= SIZE_MAX / W ? calloc(nu * W, sizeof *t->shards) : NULL;
  if (!t->chunk || !t->padded_unit || !t->rank_count || !t->shards) {
    rc = -ENOMEM;
    goto out;
  }
  for (size_t u = 0; u < nu; u++) {
    size_t n = units[u].numel;
    /* ceil(n / W), then up to a multiple of align, without overflowing */
    size_t c = n / W + (n % W != 0);
    if (c % align && (rc = add(c, align - c % align, &c)) < 0) goto out;
    if (c > SIZE_MAX / W) {
      rc = -EOVERFLOW;
      goto out;
    }
    t->chunk[u] = c;
    t->padded_unit[u] = t->padded_total;
    for (size_t r = 0; r < W; r++) {
      size_t uo = r * c, count = uo < n ? (n - uo < c ? n - uo : c) : 0;
      t->shards[u * W + r] = (zt_shard){.unit_off = uo,
                                        .count = count,
                                        .flat_off = units[u].offset + uo,
                                        .padded_off = t->padded_total + uo,
                                        .packed_off = t->packed_total};
      t->rank_count[r] += count;
    }
    if ((rc = add(t->padded_total, c * W, &t->padded_total)) < 0 ||
        (rc = add(t->packed_total, c, &t->packed_total)) < 0 ||
        (rc = add(t->numel, n, &t->numel)) < 0)
      goto out;
    if (c > t->max_chunk) t->max_chunk = c;
    if (c * W > t->max_padded) t->max_padded = c * W;
  }
  *out = t;
  t = NULL;
out:
  zt_shard_table_free(t);
  return rc;
}
