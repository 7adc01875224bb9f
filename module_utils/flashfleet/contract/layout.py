"""Names inside a run's output directory (`--output-dir`, on hosts /var/lib/flashfleet/runs/<run>/).

    status.json        where the run stands now (status.py)
    metrics.jsonl      one record per optimizer step, evaluation or event (metrics.py)
    checkpoints/       step-NNNNNNNN/ directories (checkpoint.py)
    run.json           what the run keeps across restarts: invocation count, W&B id (runstate.py)
    wandb/             wandb's own directory (offline-run-*/ when WANDB_MODE=offline)
"""

import re

STATUS = "status.json"
METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
RUN_STATE = "run.json"
WANDB = "wandb"  # wandb.init(dir=<run dir>) makes it

# systemd: one template unit, the run's name is the instance.
UNIT_TEMPLATE = "flashfleet-train@.service"
RUN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def unit_name(run: str) -> str:
    """The run's systemd unit, e.g. flashfleet-train@v2.service."""
    return UNIT_TEMPLATE.replace("@", "@" + run)
