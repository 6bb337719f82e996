/* The offload configuration as the "offload" object of a spec file (docs/spec.md). */
#ifndef ZT_TRAIN_OFFLOAD_JSON_H
#define ZT_TRAIN_OFFLOAD_JSON_H

#include <jansson.h>

#include "engine/train/offload/offload.h"

/* Starts from zt_offload_cfg_defaults, overrides the keys present, then checks; unknown keys
 * and bad values are refused naming the field ("offload.gpu_budget must be ..."). */
int zt_offload_cfg_from_json(const json_t *o, zt_offload_cfg *c, char *err, size_t errlen);
/* The "offload" object of the spec file at path: *present 0 (and c the defaults) without one. */
int zt_offload_spec_load(const char *path, zt_offload_cfg *c, int *present, char *err,
                         size_t errlen);

#endif
