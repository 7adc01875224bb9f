"""metrics.jsonl: one JSON object per line, appended and flushed by the trainer's main rank.

Every record has `time` (Unix seconds) and `step`. A training-step record (`is_step`) has the
keys of STEP_KEYS; an evaluation record has EVAL_KEYS. Readers (the report, the planner, the
collect role) use these names, never their own copies. Floats that are not finite are null.
"""

import json

# The training step (trainer.train_step). Rates are summed over workers; *_s are seconds.
STEP_KEYS = (
    "step", "epoch", "loss", "ce", "kl", "lr", "noise", "grad_norm",
    "acc",  # per block position: argmax accuracy of the drafter at that position
    "accept_proxy",  # acceptance length implied by `acc` (1 + sum of the running products)
    "rows", "target_tokens",  # draft rows trained and target tokens read this step
    "target_tokens_per_s", "drafter_rows_per_s",  # capacity: rates while busy
    "step_tokens_per_s", "step_rows_per_s",  # delivered: per wall-clock second of the step
    "target_s", "drafter_s", "step_s",
    "queue_occupancy", "target_idle_frac", "drafter_idle_frac", "peak_mem_bytes",
)
# An evaluation (speculative decoding against the target).
EVAL_KEYS = ("step", "tau", "prompts", "cycles")

LOSS, TAU, STEP = "loss", "tau", "step"


def is_step(record: dict) -> bool:
    """A training-step record (evaluations and events have no loss)."""
    return LOSS in record


def read(path, tail_bytes: int | None = None) -> list[dict]:
    """Every record of a metrics.jsonl (of its last `tail_bytes`), skipping lines that do not
    parse (a line cut by a crash or a write in progress). OSError if the file is unreadable."""
    with open(path, "rb") as f:
        if tail_bytes is not None:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - tail_bytes))
        raw = f.read()
    records = []
    for line in raw.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:  # also UnicodeDecodeError
            continue
        if isinstance(rec, dict):
            records.append(rec)
    return records
