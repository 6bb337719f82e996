/* The planner: every combination the policy allows (optimizer tier x params' home x
 * checkpointing) is costed with the most resident units that fit the device; the fastest that
 * fits every budget wins. Bytes and transfers follow the accounting in planner.h. */
#include "engine/plan/planner.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "offload/device_arena.h"
#include "offload/host_arena.h"
#include "offload/nvme_store.h"

const char *zt_tier_name(zt_tier t) {
  switch (t) {
  case ZT_TIER_DEVICE: return "device";
  case ZT_TIER_HOST: return "host";
  case ZT_TIER_NVME: return "nvme";
  }
  return "?";
}

const char *zt_plan_kind_name(zt_plan_kind k) {
  static const char *const names[ZT_PLAN_KINDS] = {"master", "moments", "params", "grads", "acts", "staging"};
  return (unsigned)k < ZT_PLAN_KINDS ? names[k] : "?";
}

static size_t fp_dev(size_t b) { return b ? zt_dev_arena_footprint(b) : 0; }
static size_t fp_host(size_t b) { return b ? zt_host_arena_footprint(b) : 0; }
static size_t fp_nvme(size_t b) { return (b + ZT_NVME_ALIGN - 1) / ZT_NVME_ALIGN * ZT_NVME_ALIGN; }

static int cmp_size_desc(const void *a, const void *b) {
  size_t x = *(const size_t *)a, y = *(const size_t *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* What one evaluation needs besides the input: device footprints sorted, largest first. */
typedef struct sizes {
  size_t *param_fp_desc, *grad_fp_desc;
  size_t max_master, max_param;
  int held;
} sizes;

static size_t largest(const size_t *desc, int n, int k) {
  size_t s = 0;
  for (int i = 0; i < k && i < n; i++) s += desc[i];
  return s;
}

static int shared(const zt_plan_unit *u, zt_tier master, zt_tier home) {
  return u->param_bytes == u->master_bytes && master == home;
}

/* Bytes of every tier for one combination with k resident units (k ignored when not streamed). */
static void account(const zt_plan_input *in, const sizes *sz, zt_plan *p) {
  zt_tier opt = p->tier[ZT_KIND_MASTER], home = p->tier[ZT_KIND_PARAMS];
  int n = in->n_units;
  memset(p->bytes, 0, sizeof p->bytes);
  p->bytes[ZT_TIER_DEVICE][ZT_KIND_ACTS] = fp_dev(p->ckpt ? in->act_ckpt_bytes : in->act_bytes);
  for (int i = 0; i < n; i++) {
    const zt_plan_unit *u = &in->units[i];
    int sh = shared(u, opt, home);
    if (opt == ZT_TIER_DEVICE) {
      p->bytes[ZT_TIER_DEVICE][ZT_KIND_MASTER] += fp_dev(u->master_bytes);
      p->bytes[ZT_TIER_DEVICE][ZT_KIND_MOMENTS] += 2 * fp_dev(u->master_bytes);
      p->bytes[ZT_TIER_DEVICE][ZT_KIND_GRADS] += fp_dev(u->grad_bytes);
      if (!sh) p->bytes[ZT_TIER_DEVICE][ZT_KIND_PARAMS] += fp_dev(u->param_bytes);
      continue;
    }
    p->bytes[ZT_TIER_HOST][ZT_KIND_GRADS] += fp_host(u->master_bytes);
    if (opt == ZT_TIER_HOST) {
      p->bytes[ZT_TIER_HOST][ZT_KIND_MASTER] += fp_host(u->master_bytes);
      p->bytes[ZT_TIER_HOST][ZT_KIND_MOMENTS] += 2 * fp_host(u->master_bytes);
    } else {
      p->bytes[ZT_TIER_NVME][ZT_KIND_MASTER] += fp_nvme(u->master_bytes);
      p->bytes[ZT_TIER_NVME][ZT_KIND_MOMENTS] += 2 * fp_nvme(u->master_bytes);
    }
    if (!sh && home == ZT_TIER_HOST) p->bytes[ZT_TIER_HOST][ZT_KIND_PARAMS] += fp_host(u->param_bytes);
    if (!sh && home == ZT_TIER_NVME) p->bytes[ZT_TIER_NVME][ZT_KIND_PARAMS] += fp_nvme(u->param_bytes);
  }
  if (opt != ZT_TIER_DEVICE) {
    p->streamer_device_bytes = largest(sz->param_fp_desc, n, p->resident_units) +
                               largest(sz->grad_fp_desc, n, sz->held + 1);
    p->bytes[ZT_TIER_DEVICE][ZT_KIND_PARAMS] = largest(sz->param_fp_desc, n, p->resident_units);
    p->bytes[ZT_TIER_DEVICE][ZT_KIND_GRADS] = largest(sz->grad_fp_desc, n, sz->held + 1);
    size_t staging = 0;
    if (home == ZT_TIER_NVME) staging += (size_t)(sz->held + in->prefetch_depth) * fp_host(sz->max_param);
    if (opt == ZT_TIER_NVME) staging += ZT_PLAN_OPT_STAGING * 3 * fp_host(sz->max_master);
    p->bytes[ZT_TIER_HOST][ZT_KIND_STAGING] = staging;
  }
  for (int t = 0; t < ZT_TIERS; t++) {
    p->total[t] = 0;
    for (int k = 0; k < ZT_PLAN_KINDS; k++) p->total[t] += p->bytes[t][k];
  }
}

static double dmax(double a, double b) { return a > b ? a : b; }

/* Seconds to bring b parameter bytes to the device from their home (NVMe reads pipeline with
 * the copy: the slower of the two). */
static double fetch_s(const zt_plan_input *in, zt_tier home, double b) {
  double t = b / in->cost.h2d_bytes_per_s;
  if (home == ZT_TIER_NVME) t = dmax(t, b / in->cost.nvme_read_bytes_per_s);
  return t;
}

/* Transfers and time of one step for the combination in p. */
static void estimate(const zt_plan_input *in, zt_plan *p) {
  zt_tier opt = p->tier[ZT_KIND_MASTER], home = p->tier[ZT_KIND_PARAMS];
  int n = in->n_units, k = p->resident_units, A = in->grad_accum;
  double params = 0, compute = 0, fwd_total = 0, bwd_last = 0;
  uint64_t fetches = 0, h2d = 0, d2h = 0;
  for (int i = 0; i < n; i++) params += (double)in->units[i].master_bytes / 4.0;
  for (int m = 0; m < A; m++) {
    double fwd = 0, bwd = 0;
    for (int i = 0; i < n; i++) {
      const zt_plan_unit *u = &in->units[i];
      double recompute = p->ckpt && u->checkpointable ? u->fwd_s : 0;
      compute += u->fwd_s + u->bwd_s + recompute;
      if (!p->streamed) {
        fwd += u->fwd_s;
        bwd += u->bwd_s + recompute;
        continue;
      }
      /* forward: the first micro-batch fetches everything; later ones what the backward let go
       * (the units past the first k); a companion that fell out comes back for its partner */
      uint64_t f = (m == 0 || i >= k) ? u->param_bytes : 0;
      uint64_t nf = f ? 1 : 0;
      int c = u->companion;
      if (c >= 0 && c < i - k + 1) {
        f += in->units[c].param_bytes;
        nf++;
      }
      /* backward: the last k units are still there; the partner's gradients go back too */
      uint64_t b = i < n - k ? u->param_bytes : 0;
      uint64_t g = u->grad_bytes + (c >= 0 ? in->units[c].grad_bytes : 0);
      fetches += nf + (b ? 1 : 0);
      h2d += f + b;
      d2h += g;
      /* nothing comes before the step's first fetch to hide it under */
      if (m == 0 && i == 0) fwd += u->fwd_s + fetch_s(in, home, (double)f);
      else fwd += dmax(u->fwd_s, fetch_s(in, home, (double)f));
      bwd += dmax(dmax(u->bwd_s + recompute, fetch_s(in, home, (double)b)),
                  (double)g / in->cost.d2h_bytes_per_s);
    }
    fwd_total += fwd + bwd;
    bwd_last = bwd;
  }
  p->fetches = fetches;
  p->h2d_bytes = h2d;
  p->d2h_bytes = d2h;
  p->nvme_read_bytes = home == ZT_TIER_NVME ? h2d : 0;
  p->nvme_write_bytes = 0;
  for (int i = 0; i < n; i++) {
    const zt_plan_unit *u = &in->units[i];
    if (opt == ZT_TIER_NVME) {
      p->nvme_read_bytes += 3 * (uint64_t)u->master_bytes;
      p->nvme_write_bytes += 3 * (uint64_t)u->master_bytes;
    }
    if (home == ZT_TIER_NVME && !shared(u, opt, home)) p->nvme_write_bytes += u->param_bytes;
  }
  double opt_s;
  if (opt == ZT_TIER_DEVICE) {
    opt_s = params / in->cost.dev_adam_params_per_s;
  } else {
    /* CPU AdamW of a unit starts as soon as its gradients are final: it hides under the rest of
     * the last backward, NVMe traffic of the optimizer state with it; but the unit the backward
     * ends on (unit 0) can only be updated after it, its gradients back first */
    const zt_plan_unit *u0 = &in->units[0];
    double scale = params > 0 ? (double)u0->master_bytes / 4.0 / params : 0;
    double t = params / in->cost.cpu_adam_params_per_s;
    t = dmax(t, (double)p->nvme_write_bytes / in->cost.nvme_write_bytes_per_s);
    if (opt == ZT_TIER_NVME) t = dmax(t, 3.0 * params * 4.0 / in->cost.nvme_read_bytes_per_s);
    double tail = (double)u0->grad_bytes / in->cost.d2h_bytes_per_s + t * scale;
    opt_s = dmax(t - bwd_last, tail);
  }
  p->compute_s = compute;
  p->optimizer_s = opt_s;
  p->step_s = fwd_total + opt_s;
}

static int fail(char *err, size_t errlen, int rc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t errlen, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return rc;
}

static const char *human(size_t b, char *buf, size_t len) {
  const double KiB = 1024.0, MiB = KiB * 1024, GiB = MiB * 1024;
  if (b >= GiB) snprintf(buf, len, "%.1f GiB", (double)b / GiB);
  else if (b >= MiB) snprintf(buf, len, "%.1f MiB", (double)b / MiB);
  else if (b >= KiB) snprintf(buf, len, "%.1f KiB", (double)b / KiB);
  else snprintf(buf, len, "%zu bytes", b);
  return buf;
}

static int check_input(const zt_plan_input *in, char *err, size_t errlen) {
  if (in->n_units <= 0 || !in->units) return fail(err, errlen, -EINVAL, "plan: no units");
  if (in->grad_accum < 1) return fail(err, errlen, -EINVAL, "plan: grad_accum must be >= 1");
  if (in->prefetch_depth < 0) return fail(err, errlen, -EINVAL, "plan: prefetch_depth must be >= 0");
  if (in->ckpt < -1 || in->ckpt > 1) return fail(err, errlen, -EINVAL, "plan: ckpt must be -1, 0 or 1");
  if (in->optimizer < ZT_TIER_AUTO || in->optimizer > ZT_TIER_NVME)
    return fail(err, errlen, -EINVAL, "plan: optimizer tier out of range");
  if (in->params < ZT_TIER_AUTO || in->params > ZT_TIER_NVME)
    return fail(err, errlen, -EINVAL, "plan: params tier out of range");
  const zt_plan_cost *c = &in->cost;
  const struct { const char *name; double v; } rates[] = {
      {"h2d_bytes_per_s", c->h2d_bytes_per_s}, {"d2h_bytes_per_s", c->d2h_bytes_per_s},
      {"nvme_read_bytes_per_s", c->nvme_read_bytes_per_s}, {"nvme_write_bytes_per_s", c->nvme_write_bytes_per_s},
      {"cpu_adam_params_per_s", c->cpu_adam_params_per_s}, {"dev_adam_params_per_s", c->dev_adam_params_per_s}};
  for (size_t i = 0; i < sizeof rates / sizeof rates[0]; i++)
    if (!(rates[i].v > 0) || isinf(rates[i].v))
      return fail(err, errlen, -EINVAL, "plan: cost.%s must be a positive number", rates[i].name);
  for (int i = 0; i < in->n_units; i++) {
    const zt_plan_unit *u = &in->units[i];
    if (!u->master_bytes || !u->param_bytes || u->master_bytes % 4)
      return fail(err, errlen, -EINVAL, "plan: unit %d (%s): master_bytes (a multiple of 4) and param_bytes must be > 0", i, u->name);
    if (u->companion >= in->n_units || u->companion == i || u->companion < -1)
      return fail(err, errlen, -EINVAL, "plan: unit %d (%s): companion %d out of range", i, u->name, u->companion);
    if (!(u->fwd_s >= 0) || !(u->bwd_s >= 0) || isinf(u->fwd_s) || isinf(u->bwd_s))
      return fail(err, errlen, -EINVAL, "plan: unit %d (%s): compute times must be >= 0", i, u->name);
  }
  return 0;
}

/* The smallest need seen per tier among combinations that fit the tiers before it, for the
 * refusal message. */
typedef struct shortfall {
  size_t dev, host, nvme;
  int dev_units, host_fit_dev, nvme_fit;
  zt_tier host_opt;
} shortfall;

int zt_plan_make(const zt_plan_input *in, zt_plan *out, char *err, size_t errlen) {
  char dummy[8];
  if (!err || !errlen) {
    err = dummy;
    errlen = sizeof dummy;
  }
  err[0] = 0;
  int rc = check_input(in, err, errlen);
  if (rc < 0) return rc;
  int n = in->n_units;
  sizes sz = {0};
  sz.held = 1;
  for (int i = 0; i < n; i++) {
    if (in->units[i].companion >= 0) sz.held = 2;
    if (in->units[i].master_bytes > sz.max_master) sz.max_master = in->units[i].master_bytes;
    if (in->units[i].param_bytes > sz.max_param) sz.max_param = in->units[i].param_bytes;
  }
  sz.param_fp_desc = malloc((size_t)n * sizeof(size_t));
  sz.grad_fp_desc = malloc((size_t)n * sizeof(size_t));
  if (!sz.param_fp_desc || !sz.grad_fp_desc) {
    rc = fail(err, errlen, -ENOMEM, "plan: out of memory");
    goto out;
  }
  for (int i = 0; i < n; i++) {
    sz.param_fp_desc[i] = fp_dev(in->units[i].param_bytes);
    sz.grad_fp_desc[i] = fp_dev(in->units[i].grad_bytes);
  }
  qsort(sz.param_fp_desc, (size_t)n, sizeof(size_t), cmp_size_desc);
  qsort(sz.grad_fp_desc, (size_t)n, sizeof(size_t), cmp_size_desc);
  int min_k = sz.held + in->prefetch_depth < n ? sz.held + in->prefetch_depth : n;

  shortfall sf = {.dev = SIZE_MAX, .host = SIZE_MAX, .nvme = SIZE_MAX};
  int found = 0;
  zt_plan best = {0};
  for (int opt = ZT_TIER_DEVICE; opt <= ZT_TIER_NVME; opt++) {
    if (in->optimizer != ZT_TIER_AUTO && in->optimizer != opt) continue;
    for (int home = ZT_TIER_DEVICE; home <= ZT_TIER_NVME; home++) {
      /* the optimizer on the device keeps the params there; off it, params have a host or NVMe
       * home, and a "device" policy asks for all of them resident */
      if ((opt == ZT_TIER_DEVICE) != (home == ZT_TIER_DEVICE)) continue;
      if (in->params != ZT_TIER_AUTO && in->params != home && !(in->params == ZT_TIER_DEVICE && home == ZT_TIER_HOST))
        continue;
      for (int ckpt = 0; ckpt <= 1; ckpt++) {
        if (in->ckpt >= 0 && in->ckpt != ckpt) continue;
        zt_plan p = {0};
        p.tier[ZT_KIND_MASTER] = p.tier[ZT_KIND_MOMENTS] = (zt_tier)opt;
        p.tier[ZT_KIND_PARAMS] = (zt_tier)home;
        p.tier[ZT_KIND_GRADS] = opt == ZT_TIER_DEVICE ? ZT_TIER_DEVICE : ZT_TIER_HOST;
        p.tier[ZT_KIND_ACTS] = ZT_TIER_DEVICE;
        p.tier[ZT_KIND_STAGING] = ZT_TIER_HOST;
        p.ckpt = ckpt;
        p.streamed = opt != ZT_TIER_DEVICE;
        p.prefetch_depth = in->prefetch_depth;
        p.max_acquired = sz.held;
        /* the most resident units that fit: device bytes only grow with k */
        int lo = !p.streamed || in->params == ZT_TIER_DEVICE ? n : min_k;
        int fit = 0;
        for (int k = n; k >= lo; k--) {
          p.resident_units = k;
          account(in, &sz, &p);
          if (p.total[ZT_TIER_DEVICE] <= in->device_budget) {
            fit = 1;
            break;
          }
        }
        if (!fit) {
          if (p.total[ZT_TIER_DEVICE] < sf.dev) {
            sf.dev = p.total[ZT_TIER_DEVICE];
            sf.dev_units = p.resident_units;
          }
          continue;
        }
        if (p.total[ZT_TIER_HOST] > in->host_budget) {
          if (p.total[ZT_TIER_HOST] < sf.host) {
            sf.host = p.total[ZT_TIER_HOST];
            sf.host_opt = (zt_tier)opt;
          }
          continue;
        }
        if (p.total[ZT_TIER_NVME] > in->nvme_budget) {
          if (p.total[ZT_TIER_NVME] < sf.nvme) sf.nvme = p.total[ZT_TIER_NVME];
          continue;
        }
        estimate(in, &p);
        if (!found || p.step_s < best.step_s) best = p;
        found = 1;
      }
    }
  }
  if (found) {
    *out = best;
    rc = 0;
    goto out;
  }
  char a[32], b[32];
  rc = -ENOMEM;
  if (sf.nvme != SIZE_MAX)
    fail(err, errlen, rc, "plan: needs at least %s (%zu bytes) of NVMe space for the optimizer state or parameters; budget %s (%zu bytes)",
         human(sf.nvme, a, sizeof a), sf.nvme, human(in->nvme_budget, b, sizeof b), in->nvme_budget);
  else if (sf.host != SIZE_MAX)
    fail(err, errlen, rc, "plan: needs at least %s (%zu bytes) of host memory with the optimizer state on the %s; budget %s (%zu bytes)",
         human(sf.host, a, sizeof a), sf.host, zt_tier_name(sf.host_opt), human(in->host_budget, b, sizeof b), in->host_budget);
  else if (sf.dev != SIZE_MAX)
    fail(err, errlen, rc, "plan: needs at least %s (%zu bytes) of device memory for %d unit%s in flight; budget %s (%zu bytes)",
         human(sf.dev, a, sizeof a), sf.dev, sf.dev_units, sf.dev_units == 1 ? "" : "s",
         human(in->device_budget, b, sizeof b), in->device_budget);
  else
    rc = fail(err, errlen, -EINVAL, "plan: the policy allows no combination (optimizer %s, params %s)",
              in->optimizer == ZT_TIER_AUTO ? "auto" : zt_tier_name((zt_tier)in->optimizer),
              in->params == ZT_TIER_AUTO ? "auto" : zt_tier_name((zt_tier)in->params));
out:
  free(sz.param_fp_desc);
  free(sz.grad_fp_desc);
  return rc;
}

/* ---- rendering ------------------------------------------------------------------------------- */

typedef struct sink {
  char *buf;
  size_t len, pos;
} sink;

static void put(sink *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sink *s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int w = vsnprintf(s->pos < s->len ? s->buf + s->pos : NULL, s->pos < s->len ? s->len - s->pos : 0, fmt, ap);
  va_end(ap);
  if (w > 0) s->pos += (size_t)w;
}

static int finish(sink *s) {
  if (s->len) s->buf[s->pos < s->len ? s->pos : s->len - 1] = 0;
  return s->pos > INT32_MAX ? INT32_MAX : (int)s->pos;
}

int zt_plan_render_text(const zt_plan *p, const zt_plan_input *in, char *buf, size_t len) {
  sink s = {buf, len, 0};
  char a[32], b[32], c[32];
  put(&s, "optimizer state (fp32 master, m, v) on the %s; gradients to the %s; ", zt_tier_name(p->tier[ZT_KIND_MASTER]),
      zt_tier_name(p->tier[ZT_KIND_GRADS]));
  if (p->streamed)
    put(&s, "params streamed from the %s, %d of %d units resident, prefetch %d",
        zt_tier_name(p->tier[ZT_KIND_PARAMS]), p->resident_units, in->n_units, p->prefetch_depth);
  else
    put(&s, "params on the device");
  put(&s, "; activation checkpointing %s\n", p->ckpt ? "on" : "off");
  put(&s, "%-8s %14s %14s %14s\n", "", "device", "host", "nvme");
  for (int k = 0; k < ZT_PLAN_KINDS; k++)
    put(&s, "%-8s %14s %14s %14s\n", zt_plan_kind_name((zt_plan_kind)k), human(p->bytes[0][k], a, sizeof a),
        human(p->bytes[1][k], b, sizeof b), human(p->bytes[2][k], c, sizeof c));
  put(&s, "%-8s %14s %14s %14s\n", "total", human(p->total[0], a, sizeof a), human(p->total[1], b, sizeof b),
      human(p->total[2], c, sizeof c));
  put(&s, "budget   %14s %14s %14s\n", human(in->device_budget, a, sizeof a), human(in->host_budget, b, sizeof b),
      human(in->nvme_budget, c, sizeof c));
  put(&s, "per step (%d micro-batch%s): %llu unit fetches, H2D %s, D2H %s", in->grad_accum,
      in->grad_accum == 1 ? "" : "es", (unsigned long long)p->fetches, human(p->h2d_bytes, a, sizeof a),
      human(p->d2h_bytes, b, sizeof b));
  put(&s, ", NVMe read %s, write %s\n", human(p->nvme_read_bytes, a, sizeof a), human(p->nvme_write_bytes, b, sizeof b));
  put(&s, "estimated step %.3f s (compute %.3f s, optimizer not hidden %.3f s)\n", p->step_s, p->compute_s,
      p->optimizer_s);
  return finish(&s);
}

int zt_plan_render_json(const zt_plan *p, const zt_plan_input *in, char *buf, size_t len) {
  sink s = {buf, len, 0};
  put(&s, "{\"optimizer\":\"%s\",\"params\":\"%s\",\"grads\":\"%s\",\"ckpt\":%s,\"streamed\":%s,",
      zt_tier_name(p->tier[ZT_KIND_MASTER]), zt_tier_name(p->tier[ZT_KIND_PARAMS]), zt_tier_name(p->tier[ZT_KIND_GRADS]),
      p->ckpt ? "true" : "false", p->streamed ? "true" : "false");
  put(&s, "\"n_units\":%d,\"resident_units\":%d,\"prefetch_depth\":%d,\"max_acquired\":%d,\"streamer_device_bytes\":%zu,",
      in->n_units, p->resident_units, p->prefetch_depth, p->max_acquired, p->streamer_device_bytes);
  put(&s, "\"bytes\":{");
  for (int t = 0; t < ZT_TIERS; t++) {
    put(&s, "%s\"%s\":{", t ? "," : "", zt_tier_name((zt_tier)t));
    for (int k = 0; k < ZT_PLAN_KINDS; k++) put(&s, "\"%s\":%zu,", zt_plan_kind_name((zt_plan_kind)k), p->bytes[t][k]);
    put(&s, "\"total\":%zu}", p->total[t]);
  }
  put(&s, "},\"budget\":{\"device\":%zu,\"host\":%zu,\"nvme\":%zu},", in->device_budget, in->host_budget, in->nvme_budget);
  put(&s, "\"per_step\":{\"micro_batches\":%d,\"fetches\":%llu,\"h2d_bytes\":%llu,\"d2h_bytes\":%llu,"
          "\"nvme_read_bytes\":%llu,\"nvme_write_bytes\":%llu},",
      in->grad_accum, (unsigned long long)p->fetches, (unsigned long long)p->h2d_bytes,
      (unsigned long long)p->d2h_bytes, (unsigned long long)p->nvme_read_bytes, (unsigned long long)p->nvme_write_bytes);
  put(&s, "\"estimate_s\":{\"step\":%.6g,\"compute\":%.6g,\"optimizer\":%.6g}}", p->step_s, p->compute_s, p->optimizer_s);
  return finish(&s);
}
