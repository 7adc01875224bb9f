"""metrics.jsonl: one JSON object per line, appended and flushed by the trainer's main rank.

Every record has `time` (Unix seconds), `step` and INVOCATION (which start of the run wrote it:
1, 2, ... counted in the run directory's run.json, `contract.starts`). A training-step record
(`is_step`) has the keys of STEP_KEYS; an evaluation record has EVAL_KEYS. Readers (the report,
the planner, the collect role, diagnose) use these names, never their own copies. Floats that
are not finite are null.

One history across restarts. The file stays append-only: an rsync `--append-verify` copy on the
controller stays a prefix of it, and nothing a dead start wrote is ever deleted. A start that
resumed from the checkpoint of step s logs step s + 1 first, so its first training step
SUPERSEDES every record of an earlier start at that step or later (those steps were trained
again); of two evaluations at one step the newer start's wins. `read` returns the history (each
step once); `read(..., superseded=True)` returns (history, superseded records) for whoever wants
the evidence; `restarts` says where each later start resumed. A file from before invocations
(records without one) is read as it is.
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
    "queue_occupancy", "target_idle_frac", "drafter_idle_frac",
    "drafter_serve_frac",  # of drafter_idle_frac, the part their own replicas served (--drafter-serves-target)
    "peak_mem_bytes",
)
# A DFlash 2 run's step records also have these (flashfleet_trainer.dflash2.selector_loss): the
# selector's loss, its teacher-forced accuracy over the rows whose label is among the unary top-k,
# and how often it is (candidate recall at k).
SELECTOR_KEYS = ("selector_loss", "selector_acc", "candidate_recall")
# An evaluation (speculative decoding against the target; flashfleet_trainer.evaluate): `eval` is
# "interval" (every --eval-interval steps) or "final"; tau_pooled = all committed tokens / all
# cycles (`tau` is the same number), tau_prompt_mean = the mean of per-prompt tau (the published
# figure); accept_rate per block position 1..B-1; eval_s its wall time. With several prompt sets
# the record also has `sets` {name: the same figures}. The train/serve guard: TRAIN_TAU = 1 + the
# mean accept_proxy of the newest training steps (the tau the training accuracy implies), TRAIN_ACC1
# their mean accuracy at block position 1 (null without steps); TAU_GAP_WARNING null, or the
# warning (messages.tau_gap) when position 1, right in training, is rarely accepted served: labels
# shifted against the positions the drafter is served at.
TRAIN_TAU, TRAIN_ACC1, TAU_GAP_WARNING = "train_tau_proxy", "train_acc_pos1", "tau_gap_warning"
# What every tau was measured with: temperature (0 = greedy), top_p (1 = all), top_k (0 = all),
# draft_sample_method (when sampling: drafts drawn from the drafter's distribution, or its argmax as
# vLLM serves by default) and thinking, the chat template's switch the prompts were rendered with
# ("on", "off", or null: token-id prompts, or a template without the switch). Records from before
# top_k, draft_sample_method and thinking lack them.
EVAL_SETTINGS = ("temperature", "top_p", "top_k", "draft_sample_method", "thinking")
EVAL_KEYS = (
    "step", "tau", "tau_pooled", "tau_prompt_mean", "accept_rate", "prompts", "cycles", "tokens", "block_size",
    *EVAL_SETTINGS, "cached", "eval", "eval_s", TRAIN_TAU, TRAIN_ACC1, TAU_GAP_WARNING,
)

LOSS, TAU, STEP = "loss", "tau", "step"
INVOCATION = "invocation"  # on every record: the start of the run that wrote it (1 = the first)


def settings_label(record: dict) -> str:
    """An evaluation record's EVAL_SETTINGS in a few words, for the report and the logs:
    "greedy, thinking off", "T 1, top-p 0.95, top-k 20" (defaults left out; thinking only when the
    prompts were rendered with it); "?" for a record without a usable temperature."""
    def num(key, default):
        v = record.get(key, default)
        return v if isinstance(v, int | float) and not isinstance(v, bool) else None

    t, top_p, top_k = num("temperature", None), num("top_p", 1), num("top_k", 0)
    if t is None:
        return "?"
    words = ["greedy"] if t == 0 else [f"T {t:g}"]
    if t != 0 and top_p != 1:
        words.append(f"top-p {top_p:g}" if top_p is not None else "top-p ?")
    if t != 0 and top_k != 0:
        words.append(f"top-k {top_k:g}" if top_k is not None else "top-k ?")
    if t != 0 and record.get("draft_sample_method") == "greedy":
        words.append("greedy drafts")
    if record.get("thinking") in ("on", "off"):
        words.append(f"thinking {record['thinking']}")
    return ", ".join(words)


def is_step(record: dict) -> bool:
    """A training-step record (evaluations and events have no loss)."""
    return LOSS in record


def _inv(record: dict) -> int:
    v = record.get(INVOCATION)
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def _step(record: dict):
    v = record.get(STEP)
    return v if isinstance(v, int | float) and not isinstance(v, bool) else None


def first_steps(records: list[dict]) -> dict[int, int]:
    """{invocation: the first training step it logged}."""
    first = {}
    for r in records:
        if is_step(r) and _step(r) is not None:
            first[_inv(r)] = min(first.get(_inv(r), r[STEP]), r[STEP])
    return first


def restarts(records: list[dict]) -> list[dict]:
    """Where each start after the first resumed: [{invocation, step}] (step: the resumed
    checkpoint's, one before the start's first training step), in invocation order."""
    first = first_steps(records)
    return [{INVOCATION: inv, STEP: first[inv] - 1} for inv in sorted(first)[1:]]


def supersede(records: list[dict]) -> tuple[list[dict], list[dict]]:
    """(history, superseded), both in file order (see the module docstring)."""
    first = first_steps(records)
    newest_eval = {}  # step -> the newest invocation that evaluated at it
    for r in records:
        if TAU in r and _step(r) is not None:
            newest_eval[r[STEP]] = max(newest_eval.get(r[STEP], _inv(r)), _inv(r))
    kept, dropped = [], []
    for r in records:
        step, inv = _step(r), _inv(r)
        cut = min((f for i, f in first.items() if i > inv), default=float("inf"))  # a later start's first step
        gone = step is not None and (step >= cut or (TAU in r and newest_eval[step] > inv))
        (dropped if gone else kept).append(r)
    return kept, dropped


def read(path, tail_bytes: int | None = None, superseded: bool = False):
    """The history of a metrics.jsonl (of its last `tail_bytes`): every record in file order,
    those a later start superseded left out, skipping lines that do not parse (a line cut by a
    crash or a write in progress). superseded=True: (history, superseded records).
    OSError if the file is unreadable."""
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
    history, dropped = supersede(records)
    return (history, dropped) if superseded else history
