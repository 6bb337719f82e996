#!/usr/bin/env python3
"""The limits of the job spec's fields live once in the code (engine/model/model.h's
ZT_MODEL_MAX_*, engine/plan/recipe.h's ZT_TRAIN_MAX_* and offload bounds, engine/plan/dp_plan.h,
engine/job/spec.h's ZT_JOB_*), used by both the checks and the config reader; docs/spec.md's
table of fields must state each. This reads every such #define, and the row of each field it
bounds, and fails when a limit is not in the map below (a new one: map it and document it) or
its value is not in its field's row."""
import os
import re
import sys

HEADERS = ["engine/model/model.h", "engine/plan/recipe.h", "engine/plan/dp_plan.h",
           "engine/job/spec.h"]
LIMIT = re.compile(r"^#define\s+(ZT_(?:MODEL_MAX|TRAIN_MAX|JOB_MAX|OFFLOAD_\w+_MAX|DP_MAX|"
                   r"JOB_NAME_MAX)\w*)\s+(.+?)\s*(?:/\*.*)?$")
# macro -> the fields (rows of docs/spec.md's table) it bounds
FIELDS = {
    "ZT_MODEL_MAX_VOCAB": ["model.vocab"],
    "ZT_MODEL_MAX_SEQ": ["model.seq_len"],
    "ZT_MODEL_MAX_DMODEL": ["model.d_model", "model.n_heads"],
    "ZT_MODEL_MAX_LAYERS": ["model.n_layers"],
    "ZT_MODEL_MAX_DFF": ["model.d_ff"],
    "ZT_MODEL_MAX_PARAMS": ["model"],
    "ZT_MODEL_MAX_HEAD_DIM": ["model.head_dim"],
    "ZT_MODEL_MAX_ROPE_THETA": ["model.rope_theta"],
    "ZT_TRAIN_MAX_STEPS": ["train.steps", "checkpoint.every", "data.eval.every"],
    "ZT_TRAIN_MAX_EPOCHS": ["train.epochs"],
    "ZT_TRAIN_MAX_BATCH": ["train.micro_batch", "train.grad_accum"],
    "ZT_TRAIN_MAX_BATCH_TOKENS": ["train.batch_tokens"],
    "ZT_TRAIN_MAX_LR": ["train.optimizer.lr"],
    "ZT_TRAIN_MAX_GRAD_CLIP": ["train.grad_clip"],
    "ZT_TRAIN_MAX_CKPT_EVERY": ["train.activation_checkpointing.every"],
    "ZT_OFFLOAD_PREFETCH_MAX": ["offload.prefetch"],
    "ZT_OFFLOAD_GRAD_RING_MAX": ["offload.grad_slots"],
    "ZT_DP_MAX_WORLD": ["parallel.gpus"],
    "ZT_JOB_NAME_MAX": ["name"],
    "ZT_JOB_MAX_PEERS": ["parallel.peers"],
    "ZT_JOB_MAX_STREAM_TIMEOUT": ["data.stream_timeout"],
    "ZT_JOB_MAX_EVAL_BATCHES": ["data.eval.batches"],
    "ZT_JOB_MAX_KEEP": ["checkpoint.keep"],
}
NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?(?:e[+-]?\d+)?)(?![\w])")


def value(expr):
    expr = re.sub(r"(\d)(?:ull|ul|u|ll|l)\b", r"\1", expr, flags=re.I)
    if not re.fullmatch(r"[\d\s().e+<*-]+", expr):
        return None
    return float(eval(expr))  # a constant expression of the header


def main(root):
    rows = {}
    for line in open(os.path.join(root, "docs/spec.md"), encoding="utf-8"):
        m = re.match(r"\|\s*`([\w.]+)`\s*\|(.*)", line)
        if m and m.group(1) not in rows:
            rows[m.group(1)] = m.group(2)
    bad = 0
    for h in HEADERS:
        for line in open(os.path.join(root, h), encoding="utf-8"):
            m = LIMIT.match(line)
            if not m:
                continue
            name, v = m.group(1), value(m.group(2))
            if name not in FIELDS:
                print(f"{h}: {name} bounds a field this check does not know: map it to its "
                      f"field(s) in {__file__} and state it in docs/spec.md")
                bad += 1
                continue
            for field in FIELDS[name]:
                row = rows.get(field)
                found = row is not None and any(float(x) == v for x in NUMBER.findall(row))
                if not found:
                    print(f"docs/spec.md: the row of `{field}` does not state {name} "
                          f"({m.group(2)} = {v:g}): {row.strip() if row else 'no such row'}")
                    bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
