/* The CPU group (engine/comm/comm.h) against a naive reference: every collective for world
 * sizes 1, 2, 3 and 5, out of place and in place, sizes smaller than the world included; sums
 * bitwise equal to adding in rank order on every rank; calls that do not match are an error on
 * every rank and leave the group usable; abort releases ranks waiting in a collective; bad
 * arguments to the opens. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/comm/comm.h"
#include "tests/unit/model/mcheck.h"

#define MAXW 5

/* Rank r's value at i: distinct per rank, with fractions so that the order of additions
 * matters in fp32. */
static float val(int r, size_t i) {
  return (float)((int)((i * 7 + (size_t)r * 13) % 17) - 8) * 0.37f + (float)r * 1.0e-3f +
         (float)i * 1.0e-7f;
}

/* The sum over ranks at i, added in rank order. */
static float ref_sum(int W, size_t i) {
  float s = val(0, i);
  for (int r = 1; r < W; r++) s += val(r, i);
  return s;
}

typedef struct rank_arg {
  zt_comm c;
  int r, W;
  int fails;
  int (*body)(struct rank_arg *);
} rank_arg;

static void *rank_thread(void *p) {
  rank_arg *a = p;
  a->fails = a->body(a);
  return NULL;
}

/* Runs body on W rank threads of a new group; returns the failures. */
static int run_group(int W, int (*body)(rank_arg *)) {
  zt_comm_cpu_group *g;
  rank_arg a[MAXW];
  pthread_t th[MAXW];
  int fails = 0;
  if (MC_EXPECT(zt_comm_cpu_group_open(&g, W) == 0, "group_open(%d)", W)) return 1;
  for (int r = 0; r < W; r++) {
    a[r] = (rank_arg){.r = r, .W = W, .body = body};
    if (zt_comm_cpu_open(&a[r].c, g, r) < 0 || pthread_create(&th[r], NULL, rank_thread, &a[r])) {
      fprintf(stderr, "cannot start rank %d\n", r);
      exit(1);
    }
  }
  for (int r = 0; r < W; r++) {
    pthread_join(th[r], NULL);
    fails += a[r].fails;
    zt_comm_cpu_close(&a[r].c);
  }
  zt_comm_cpu_group_close(g);
  return fails;
}

static const size_t counts[] = {0, 1, 4, 1001};

static int all_reduce_body(rank_arg *a) {
  int fails = 0;
  const zt_comm_ops *o = a->c.ops;
  for (size_t t = 0; t < sizeof counts / sizeof counts[0]; t++) {
    size_t n = counts[t];
    float *x = malloc((n + 1) * sizeof *x), *y = malloc((n + 1) * sizeof *y);
    for (size_t i = 0; i < n; i++) x[i] = val(a->r, i);
    for (int inplace = 0; inplace < 2; inplace++) {
      float *out = inplace ? x : y;
      if (inplace)
        for (size_t i = 0; i < n; i++) x[i] = val(a->r, i);
      int rc = o->all_reduce(a->c.ctx, x, out, n, NULL);
      fails += MC_EXPECT(rc == 0, "W %d rank %d all_reduce(%zu): %d %s", a->W, a->r, n, rc,
                         o->error_text(a->c.ctx));
      for (size_t i = 0; i < n && rc == 0; i++)
        if (MC_EXPECT(out[i] == ref_sum(a->W, i), "W %d rank %d all_reduce(%zu%s)[%zu] = %.9g, "
                      "rank-order sum %.9g", a->W, a->r, n, inplace ? ", in place" : "", i,
                      (double)out[i], (double)ref_sum(a->W, i))) {
          fails++;
          break;
        }
    }
    free(x);
    free(y);
  }
  return fails;
}

static int reduce_scatter_body(rank_arg *a) {
  int fails = 0;
  const zt_comm_ops *o = a->c.ops;
  for (size_t t = 0; t < 3; t++) {
    size_t c = counts[t] + (t == 2 ? 3 : 0), n = c * (size_t)a->W;
    float *x = malloc((n + 1) * sizeof *x), *y = malloc((c + 1) * sizeof *y);
    for (int inplace = 0; inplace < 2; inplace++) {
      for (size_t i = 0; i < n; i++) x[i] = val(a->r, i);
      float *out = inplace ? x + (size_t)a->r * c : y;
      int rc = o->reduce_scatter(a->c.ctx, x, out, c, NULL);
      fails += MC_EXPECT(rc == 0, "W %d rank %d reduce_scatter(%zu): %d", a->W, a->r, c, rc);
      for (size_t i = 0; i < c && rc == 0; i++) {
        float want = ref_sum(a->W, (size_t)a->r * c + i);
        if (MC_EXPECT(out[i] == want, "W %d rank %d reduce_scatter(%zu%s)[%zu] = %.9g, want "
                      "%.9g", a->W, a->r, c, inplace ? ", in place" : "", i, (double)out[i],
                      (double)want)) {
          fails++;
          break;
        }
      }
    }
    free(x);
    free(y);
  }
  return fails;
}

static int all_gather_body(rank_arg *a) {
  int fails = 0;
  const zt_comm_ops *o = a->c.ops;
  static const size_t sizes[] = {0, 1, 3, 64};
  for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; t++) {
    size_t b = sizes[t], n = b * (size_t)a->W;
    unsigned char *mine = malloc(b + 1), *all = malloc(n + 1);
    for (size_t i = 0; i < b; i++) mine[i] = (unsigned char)(a->r * 31 + (int)i);
    for (int inplace = 0; inplace < 2; inplace++) {
      memset(all, 0xee, n);
      const void *send = mine;
      if (inplace) {
        memcpy(all + (size_t)a->r * b, mine, b);
        send = all + (size_t)a->r * b;
      }
      int rc = o->all_gather(a->c.ctx, send, all, b, NULL);
      fails += MC_EXPECT(rc == 0, "W %d rank %d all_gather(%zu): %d", a->W, a->r, b, rc);
      for (size_t i = 0; i < n && rc == 0; i++) {
        unsigned char want = (unsigned char)((int)(i / b) * 31 + (int)(i % b));
        if (MC_EXPECT(all[i] == want, "W %d rank %d all_gather(%zu%s)[%zu] = %d, want %d",
                      a->W, a->r, b, inplace ? ", in place" : "", i, all[i], want)) {
          fails++;
          break;
        }
      }
    }
    free(mine);
    free(all);
  }
  return fails;
}

static int broadcast_body(rank_arg *a) {
  int fails = 0;
  const zt_comm_ops *o = a->c.ops;
  for (int root = 0; root < a->W; root++)
    for (int inplace = 0; inplace < 2; inplace++) {
      unsigned char send[5], recv[5];
      for (int i = 0; i < 5; i++) send[i] = (unsigned char)(a->r * 10 + i);
      memset(recv, 0, sizeof recv);
      unsigned char *out = inplace ? send : recv;
      int rc = o->broadcast(a->c.ctx, send, out, 5, root, NULL);
      fails += MC_EXPECT(rc == 0, "W %d rank %d broadcast root %d: %d", a->W, a->r, root, rc);
      for (int i = 0; i < 5 && rc == 0; i++)
        if (MC_EXPECT(out[i] == root * 10 + i, "W %d rank %d broadcast(root %d%s)[%d] = %d",
                      a->W, a->r, root, inplace ? ", in place" : "", i, out[i])) {
          fails++;
          break;
        }
    }
  return fails;
}

/* What every rank wrote before the barrier is seen by every rank after it. */
static atomic_int g_arrived[MAXW];

static int barrier_body(rank_arg *a) {
  int fails = 0;
  for (int round = 1; round <= 3; round++) {
    atomic_store(&g_arrived[a->r], round);
    int rc = a->c.ops->barrier(a->c.ctx, NULL);
    fails += MC_EXPECT(rc == 0, "barrier: %d", rc);
    for (int r = 0; r < a->W; r++)
      fails += MC_EXPECT(atomic_load(&g_arrived[r]) >= round, "W %d rank %d: rank %d had not "
                         "reached barrier %d", a->W, a->r, r, round);
    rc = a->c.ops->barrier(a->c.ctx, NULL); /* nobody starts the next round before all checked */
    fails += MC_EXPECT(rc == 0, "barrier: %d", rc);
  }
  return fails;
}

/* Rank 1 calls all_gather where the others call all_reduce; then a NULL buffer; then the
 * group still works. */
static int mismatch_body(rank_arg *a) {
  int fails = 0;
  const zt_comm_ops *o = a->c.ops;
  float x[4] = {1, 2, 3, 4}, y[4];
  int rc = a->r == 1 ? o->all_gather(a->c.ctx, x, y, 4, NULL)
                     : o->all_reduce(a->c.ctx, x, y, 4, NULL);
  fails += MC_EXPECT(rc == -EINVAL && strstr(o->error_text(a->c.ctx), "rank 1 called all_gather")
                     && strstr(o->error_text(a->c.ctx), "rank 0 called all_reduce"),
                     "rank %d: mismatch gave %d '%s'", a->r, rc, o->error_text(a->c.ctx));
  rc = o->all_reduce(a->c.ctx, a->r == a->W - 1 ? NULL : x, y, 4, NULL);
  fails += MC_EXPECT(rc == -EINVAL && strstr(o->error_text(a->c.ctx), "NULL buffer"),
                     "rank %d: NULL buffer gave %d '%s'", a->r, rc, o->error_text(a->c.ctx));
  rc = o->broadcast(a->c.ctx, x, y, 4, a->W, NULL);
  fails += MC_EXPECT(rc == -EINVAL && strstr(o->error_text(a->c.ctx), "root"),
                     "rank %d: bad root gave %d '%s'", a->r, rc, o->error_text(a->c.ctx));
  rc = o->all_reduce(a->c.ctx, x, y, 4, NULL);
  fails += MC_EXPECT(rc == 0 && y[3] == 4.0f * (float)a->W, "rank %d: all_reduce after the "
                     "errors: %d, %g", a->r, rc, (double)y[3]);
  return fails;
}

/* The last rank aborts instead of joining a barrier; the others, waiting in it, are released
 * with -ECANCELED, and so is every later call. */
static int abort_body(rank_arg *a) {
  int fails = 0;
  const zt_comm_ops *o = a->c.ops;
  if (a->r == a->W - 1) o->abort(a->c.ctx);
  else fails += MC_EXPECT(o->barrier(a->c.ctx, NULL) == -ECANCELED, "rank %d: barrier after "
                          "abort did not fail", a->r);
  float x = 1, y;
  fails += MC_EXPECT(o->all_reduce(a->c.ctx, &x, &y, 1, NULL) == -ECANCELED,
                     "rank %d: all_reduce after abort did not fail", a->r);
  return fails;
}

static int opens(void) {
  int fails = 0;
  zt_comm_cpu_group *g;
  zt_comm c, d;
  fails += MC_EXPECT(zt_comm_cpu_group_open(&g, 0) == -EINVAL, "world 0 accepted");
  fails += MC_EXPECT(zt_comm_cpu_group_open(&g, ZT_COMM_CPU_MAX_WORLD + 1) == -EINVAL,
                     "world past the limit accepted");
  if (MC_EXPECT(zt_comm_cpu_group_open(&g, 2) == 0, "group_open(2)")) return fails + 1;
  fails += MC_EXPECT(zt_comm_cpu_open(&c, g, 2) == -EINVAL, "rank 2 of 2 accepted");
  fails += MC_EXPECT(zt_comm_cpu_open(&c, g, 1) == 0, "rank 1 refused");
  fails += MC_EXPECT(c.ops->rank(c.ctx) == 1 && c.ops->world(c.ctx) == 2, "rank/world");
  fails += MC_EXPECT(zt_comm_cpu_open(&d, g, 1) == -EINVAL, "rank 1 taken twice");
  zt_comm_cpu_close(&c);
  fails += MC_EXPECT(zt_comm_cpu_open(&d, g, 1) == 0, "rank 1 not free after close");
  zt_comm_cpu_close(&d);
  zt_comm_cpu_group_close(g);
  return fails;
}

int main(void) {
  static const int worlds[] = {1, 2, 3, 5};
  int fails = opens();
  for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++) {
    int W = worlds[w];
    fails += run_group(W, all_reduce_body);
    fails += run_group(W, reduce_scatter_body);
    fails += run_group(W, all_gather_body);
    fails += run_group(W, broadcast_body);
    fails += run_group(W, barrier_body);
    for (int r = 0; r < MAXW; r++) atomic_store(&g_arrived[r], 0);
  }
  fails += run_group(3, mismatch_body);
  fails += run_group(3, abort_body);
  if (fails) {
    fprintf(stderr, "%d failure(s)\n", fails);
    return 1;
  }
  printf("comm cpu: ok\n");
  return 0;
}
