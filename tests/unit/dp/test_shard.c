/* The shard table (offload/shard.h) on the units of both tiny archs and on hand-made units
 * (smaller than the world, empty, not a multiple of anything), for world sizes 1..7 and
 * alignments 1, 4 and 8: every rank's real elements over all units sum to the model, and the
 * padded total is the model plus the padding, which is exactly sum over units of
 * world * chunk - numel, each chunk the smallest multiple of align holding ceil(numel / world);
 * the ranks' ranges of a unit are disjoint and cover it, in the flat, padded and packed layouts;
 * every chunk is aligned; overflow and bad arguments are refused. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "offload/shard.h"
#include "tests/unit/model/mcheck.h"

static int check_table(const zt_shard_unit *units, int nu, int W, size_t align,
                       const char *what) {
  zt_shard_table *t;
  int fails = 0;
  int rc = zt_shard_table_build(&t, units, nu, W, align);
  if (MC_EXPECT(rc == 0, "%s W %d align %zu: build %d", what, W, align, rc)) return 1;
  size_t model = 0, padding = 0, padded = 0, packed = 0;
  for (int u = 0; u < nu; u++) {
    size_t n = units[u].numel, c = t->chunk[u], want = (n + (size_t)W - 1) / (size_t)W;
    want = (want + align - 1) / align * align;
    fails += MC_EXPECT(c == want, "%s W %d align %zu unit %d: chunk %zu, want %zu", what, W,
                       align, u, c, want);
    fails += MC_EXPECT(t->padded_unit[u] == padded, "%s unit %d: padded start %zu, want %zu",
                       what, u, t->padded_unit[u], padded);
    model += n;
    padding += c * (size_t)W - n;
    /* the ranks' chunks in rank order tile [0, W * chunk) of the unit, their real parts
     * [0, numel) */
    size_t covered = 0;
    for (int r = 0; r < W; r++) {
      const zt_shard *s = zt_shard_at(t, u, r);
      fails += MC_EXPECT(s->unit_off == (size_t)r * c && s->count <= c,
                         "%s unit %d rank %d: unit_off %zu count %zu chunk %zu", what, u, r,
                         s->unit_off, s->count, c);
      fails += MC_EXPECT(s->count == (covered < n ? (n - covered < c ? n - covered : c) : 0),
                         "%s unit %d rank %d: count %zu after %zu of %zu", what, u, r,
                         s->count, covered, n);
      covered += s->count;
      fails += MC_EXPECT(s->flat_off == units[u].offset + s->unit_off &&
                         s->padded_off == padded + s->unit_off && s->packed_off == packed,
                         "%s unit %d rank %d: offsets flat %zu padded %zu packed %zu", what, u,
                         r, s->flat_off, s->padded_off, s->packed_off);
      fails += MC_EXPECT(s->padded_off % align == 0 && s->packed_off % align == 0,
                         "%s unit %d rank %d: chunk not aligned to %zu", what, u, r, align);
    }
    fails += MC_EXPECT(covered == n, "%s unit %d: ranks cover %zu of %zu", what, u, covered, n);
    padded += c * (size_t)W;
    packed += c;
  }
  size_t sum = 0;
  for (int r = 0; r < W; r++) sum += t->rank_count[r];
  fails += MC_EXPECT(sum == model && t->numel == model, "%s W %d: ranks hold %zu, model %zu",
                     what, W, sum, model);
  fails += MC_EXPECT(t->padded_total == model + padding && t->padded_total == padded &&
                     t->packed_total * (size_t)W == t->padded_total,
                     "%s W %d: padded %zu = model %zu + padding %zu? packed %zu", what, W,
                     t->padded_total, model, padding, t->packed_total);
  /* every flat element belongs to exactly one (unit, rank) */
  size_t end = 0;
  for (int u = 0; u < nu; u++)
    if (units[u].offset + units[u].numel > end) end = units[u].offset + units[u].numel;
  unsigned char *owner = calloc(end + 1, 1);
  for (int u = 0; u < nu; u++)
    for (int r = 0; r < W; r++) {
      const zt_shard *s = zt_shard_at(t, u, r);
      for (size_t i = 0; i < s->count; i++) owner[s->flat_off + i]++;
    }
  for (int u = 0; u < nu; u++)
    for (size_t i = 0; i < units[u].numel; i++)
      if (MC_EXPECT(owner[units[u].offset + i] == 1, "%s W %d: element %zu owned %d times", what,
                    W, units[u].offset + i, owner[units[u].offset + i])) {
        fails++;
        u = nu;
        break;
      }
  free(owner);
  zt_shard_table_free(t);
  return fails;
}

static int model_units(zt_arch arch, int W, size_t align) {
  zt_model_cfg mc = mc_tiny(arch);
  zt_model *m;
  char err[256];
  if (zt_model_create(&m, &mc, err, sizeof err) < 0) {
    fprintf(stderr, "%s\n", err);
    exit(1);
  }
  int nu = zt_model_num_units(m);
  zt_shard_unit *u = calloc((size_t)nu, sizeof *u);
  for (int i = 0; i < nu; i++)
    u[i] = (zt_shard_unit){zt_model_unit(m, i)->offset, zt_model_unit(m, i)->numel};
  int fails = check_table(u, nu, W, align, zt_arch_name(arch));
  fails += MC_EXPECT(u[nu - 1].offset + u[nu - 1].numel == zt_model_num_params(m),
                     "units do not end at the model's size");
  free(u);
  zt_model_destroy(m);
  return fails;
}

int main(void) {
  int fails = 0;
  static const size_t aligns[] = {1, 4, 8};
  /* a unit of 1, one of 0, one one short of a multiple, one exactly a multiple */
  static const zt_shard_unit odd[] = {{0, 1}, {1, 0}, {1, 167}, {168, 840}, {1008, 5}};
  for (int W = 1; W <= 7; W++)
    for (size_t a = 0; a < sizeof aligns / sizeof aligns[0]; a++) {
      fails += model_units(ZT_ARCH_GPT, W, aligns[a]);
      fails += model_units(ZT_ARCH_ENCODER, W, aligns[a]);
      fails += check_table(odd, 5, W, aligns[a], "odd units");
    }
  zt_shard_table *t = NULL;
  static const zt_shard_unit huge[] = {{0, SIZE_MAX - 3}};
  fails += MC_EXPECT(zt_shard_table_build(&t, huge, 1, 2, 8) == -EOVERFLOW && !t,
                     "an unrepresentable padded size was accepted");
  fails += MC_EXPECT(zt_shard_table_build(&t, odd, 5, 0, 8) == -EINVAL, "world 0 accepted");
  fails += MC_EXPECT(zt_shard_table_build(&t, odd, 5, 2, 0) == -EINVAL, "align 0 accepted");
  fails += MC_EXPECT(zt_shard_table_build(&t, odd, 0, 2, 8) == -EINVAL, "no units accepted");
  zt_shard_table_free(NULL);
  if (fails) {
    fprintf(stderr, "%d failure(s)\n", fails);
    return 1;
  }
  printf("shard table: ok\n");
  return 0;
}
