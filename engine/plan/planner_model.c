/* The planner's view of a model: unit sizes from engine/model/model.h's public API, activation
 * bytes from zt_acts_size for the backend that will run it. */
#include "engine/plan/planner.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "engine/model/model.h"

int zt_plan_units_from_model(const zt_model *m, const zt_ops *ops, size_t param_elem_bytes,
                             int micro_batch, double device_flops_per_s, zt_plan_unit *units,
                             int cap, size_t *act_bytes, size_t *act_ckpt_bytes) {
  if (!m || !ops || !units || param_elem_bytes == 0 || micro_batch < 1 || device_flops_per_s < 0)
    return -EINVAL;
  int n = zt_model_num_units(m);
  if (n > cap) return -ENOSPC;
  const zt_model_cfg *cfg = zt_model_cfg_of(m);
  int embed = -1;
  for (int i = 0; i < n; i++)
    if (strcmp(zt_model_unit(m, i)->name, "embed") == 0) embed = i;
  double tokens = (double)micro_batch * cfg->seq_len;
  for (int i = 0; i < n; i++) {
    const zt_unit_info *ui = zt_model_unit(m, i);
    zt_plan_unit *u = &units[i];
    memset(u, 0, sizeof *u);
    snprintf(u->name, sizeof u->name, "%s", ui->name);
    u->master_bytes = ui->numel * sizeof(float);
    u->param_bytes = ui->numel * param_elem_bytes;
    u->grad_bytes = ui->numel * sizeof(float);
    if (device_flops_per_s > 0) {
      u->fwd_s = 2.0 * (double)ui->numel * tokens / device_flops_per_s;
      u->bwd_s = 4.0 * (double)ui->numel * tokens / device_flops_per_s;
    }
    u->checkpointable = strncmp(ui->name, "block.", 6) == 0;
    /* a tied head (gpt, a tied llama) reads the token embedding, which lives in the embedding
     * unit */
    u->companion = zt_model_head_reads_embed(m) && strcmp(ui->name, "head") == 0 ? embed : -1;
  }
  size_t a = zt_acts_size(m, ops, micro_batch, 0), ac = zt_acts_size(m, ops, micro_batch, 1);
  if (!a || !ac) return -ENOMEM;
  *act_bytes = a;
  *act_ckpt_bytes = ac;
  return n;
}
