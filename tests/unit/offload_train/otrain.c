/* The offloaded trainer's tests' shared pieces (tests/unit/offload_train/otrain.h). */
#include "tests/unit/offload_train/otrain.h"

#include "tests/unit/model/mcheck.h"

int ot_open(zt_trainer **t, const zt_model_cfg *mc, const zt_train_cfg *tc,
            const zt_offload_cfg *oc, const zt_backend *be, zt_offload_order order, char *err,
            size_t errlen) {
  zt_offload_cfg c = *oc;
  if (!c.order) c.order = order;
  err[0] = 0;
  zt_offload_placement p;
  int rc = zt_offload_plan_make(mc, tc, &c, be->ops, &p, err, errlen);
  return rc < 0 ? rc : zt_trainer_open_offload(t, mc, tc, &c, &p, be, err, errlen);
}

int ot_run(zt_trainer *t, const int32_t *tok, size_t per, int from, int to, zt_step_result *res,
           const char *what) {
  char err[512];
  for (int i = from; i < to; i++) {
    err[0] = 0;
    int rc = zt_trainer_step(t, tok + (size_t)i * per, &res[i], err, sizeof err);
    if (MC_EXPECT(rc == 0, "%s: step %d: %s", what, i + 1, err)) return 1;
  }
  return 0;
}

size_t ot_min_budget(const zt_model_cfg *mc, const zt_train_cfg *tc, zt_offload_cfg oc,
                     const zt_backend *be, zt_offload_order order) {
  char err[512];
  zt_trainer *t = NULL;
  oc.optimizer = ZT_PLACE_HOST;
  oc.host_units = -1;
  oc.host_budget = 0;
  oc.params = ZT_PLACE_GPU;
  oc.gpu_budget = 0;
  if (ot_open(&t, mc, tc, &oc, be, order, err, sizeof err) < 0) return 0;
  zt_offload_stats st;
  zt_trainer_offload_stats(t, &st);
  zt_trainer_close(t);
  size_t lo = st.act_bytes, hi = st.device_budget; /* lo fails, hi opens */
  oc.params = ZT_PLACE_HOST;
  while (hi - lo > 1) {
    oc.gpu_budget = lo + (hi - lo) / 2;
    if (ot_open(&t, mc, tc, &oc, be, order, err, sizeof err) == 0) {
      hi = oc.gpu_budget;
      zt_trainer_close(t);
    } else {
      lo = oc.gpu_budget;
    }
  }
  return hi;
}
