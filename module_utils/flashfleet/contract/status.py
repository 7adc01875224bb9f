"""status.json: where a run stands now. The trainer writes it atomically; diagnose, collect and
train.yml's wait read it (`from_json` in playbooks, `read` here).

    phase              one of PHASES
    step, epoch        the newest optimizer step and epoch
    ready              true once the first optimizer step is done (the unit's READY=1)
    newest_checkpoint  path of the newest complete checkpoint, or null
    last_error         the one-line reason a run failed, or null
    pid                the process systemd watches (the node's main process)
    started, updated   UTC ISO-8601 times
    workers            (multi-process runs) how each rank process ended
    load               the target's load (phase "loading" and after): LOAD_KEYS, measured by the
                       trainer (flashfleet_trainer.loadwatch) from the shard pages it has read

The load and the unit's start timeout. While the target loads, the trainer sends systemd
EXTEND_TIMEOUT_USEC=<LOAD_STALL_S> each time the load has progressed (more of the shards read
since the last look, every LOAD_TICK_S): a slow load keeps extending TimeoutStartSec, a stuck
one stops, and systemd fails the start LOAD_STALL_S after the last progress (or at
TimeoutStartSec, whichever is later). LOAD_STALL_ENV in the unit's environment overrides it.
"""

import datetime as dt
import json
import math
import os

from . import files

LOAD = "load"
LOAD_KEYS = ("shards_loaded", "shards_total", "bytes_loaded", "bytes_total", "elapsed_s", "done")
LOAD_STALL_S = 300  # no progress for this long: the load is stuck (seconds)
LOAD_TICK_S = 10  # how often the trainer looks at the load's progress (seconds)
LOAD_STALL_ENV = "FLASHFLEET_LOAD_STALL_S"

PHASES = ("loading", "training", "saving", "completed", "failed", "stopped")
FINAL_PHASES = ("completed", "failed", "stopped")  # a run in one of these is over


class StatusError(ValueError):
    """status.json is missing, unreadable or not a status record."""


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def new(pid: int | None = None) -> dict:
    """The record a run starts from."""
    now = utc_now()
    return {"phase": "loading", "step": 0, "epoch": 0, "ready": False, "newest_checkpoint": None,
            "last_error": None, "pid": pid or os.getpid(), "started": now, "updated": now}


def clean(value):
    """JSON has no NaN/inf: null instead, so every strict reader can parse what was written."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    return value


def write(path, state: dict) -> None:
    """Write a status record atomically (stamping `updated`); refuses an unknown phase."""
    if state.get("phase") not in PHASES:
        raise ValueError(f"unknown phase {state.get('phase')!r} (one of {', '.join(PHASES)})")
    state["updated"] = utc_now()
    files.atomic_write_text(path, json.dumps(clean(state), indent=1) + "\n")


def read(path) -> dict:
    """The status record at path; StatusError names the file and what is wrong with it."""
    data = files.load_json(path, StatusError)
    if not isinstance(data, dict):
        raise StatusError(f"{path}: not a JSON object")
    if data.get("phase") not in PHASES:
        raise StatusError(f"{path}: unknown phase {data.get('phase')!r}")
    return data
