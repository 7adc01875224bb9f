"""run.json, the run's starts: what a run keeps across its restarts. The trainer's main rank updates it (atomically)
once per start, before loading anything; the report and collect read it.

    invocation   how many times the trainer has started on this run directory (1 = the first);
                 every metrics record carries the number of the start that wrote it
    created      UTC time of the first start
    wandb_id     the W&B run id every start passes to wandb.init(id=..., resume="allow"):
                 derived from the run name, the run directory and `created`, so a restart continues
                 the same W&B run while a new run directory of the same name gets a new one
"""

import hashlib
import json
import os
import re

from . import files, layout
from .status import utc_now

INVOCATION, CREATED, WANDB_ID = "invocation", "created", "wandb_id"
WANDB_ID_MAX = 64  # W&B run ids: letters, digits, '-' and '_', short


class StartsError(ValueError):
    """run.json is unreadable or not a run starts record."""


def wandb_id(name: str, output_dir, created: str) -> str:
    """`<name>-<12 hex>`: readable in the W&B UI, unique to this run directory and its first start."""
    digest = hashlib.sha256(f"{name}\0{os.path.abspath(output_dir)}\0{created}".encode()).hexdigest()[:12]
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-")[:WANDB_ID_MAX - 13] or "run"
    return f"{slug}-{digest}"


def read(path) -> dict:
    """The starts record at path; StartsError names the file and what is wrong."""
    data = files.load_json(path, StartsError)
    if not isinstance(data, dict) or not isinstance(data.get(INVOCATION), int) or not data.get(WANDB_ID):
        raise StartsError(f"{path}: not a run starts record (needs an integer {INVOCATION} and a {WANDB_ID})")
    return data


def begin(output_dir, name: str) -> dict:
    """Count one more start of the run in output_dir (creating run.json on the first) and return
    the record. A damaged run.json raises StartsError and is left as it is."""
    path = os.path.join(output_dir, layout.RUN_STATE)
    if os.path.exists(path):
        state = read(path)
        state[INVOCATION] += 1
    else:
        created = utc_now()
        state = {INVOCATION: 1, CREATED: created, WANDB_ID: wandb_id(name, output_dir, created)}
    files.atomic_write_text(path, json.dumps(state, indent=1) + "\n")
    return state
