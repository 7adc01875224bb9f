"""metrics.jsonl (one record per optimizer step) and status.json (where the run stands now).

status.json is what `diagnose` and `collect` read first, so it is always written atomically
(temp file, fsync, rename): a reader never sees half a file, even after a crash or SIGKILL.
"""

import datetime as dt
import json
import math
import os
import time
from pathlib import Path

PHASES = ("loading", "training", "saving", "completed", "failed", "stopped")


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def atomic_write_text(path: Path, text: str) -> None:
    """Write text to path via a temp file in the same directory, fsync, rename, fsync the dir."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _clean(value):
    """JSON has no NaN/inf; write null so every line stays parseable by strict readers."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    return value


class Status:
    """The run's status.json. Every update rewrites the whole (small) file atomically."""

    def __init__(self, output_dir: Path, pid: int | None = None, keep: bool = False, adopt: tuple = ()):
        """pid: the process systemd watches (the node's main process when ranks are children).
        keep: start from the file on disk (a main process recording how its ranks ended).
        adopt: keys another process owns (the main process's `workers` table): carried over from
        the file on every update instead of being overwritten."""
        self.path = Path(output_dir) / "status.json"
        self.adopt = adopt
        self.state = {
            "phase": "loading", "step": 0, "epoch": 0, "ready": False, "newest_checkpoint": None,
            "last_error": None, "pid": pid or os.getpid(), "started": utc_now(), "updated": utc_now(),
        }
        if keep and self.path.is_file():
            try:
                self.state.update(json.loads(self.path.read_text()))
            except ValueError:
                pass

    def update(self, **fields) -> None:
        if "phase" in fields and fields["phase"] not in PHASES:
            raise ValueError(f"unknown phase {fields['phase']!r}")
        self.state.update(fields)
        if self.adopt and self.path.is_file():
            try:
                disk = json.loads(self.path.read_text())
                self.state.update({k: disk[k] for k in self.adopt if k in disk})
            except ValueError:
                pass
        self.state["updated"] = utc_now()
        atomic_write_text(self.path, json.dumps(_clean(self.state), indent=1) + "\n")


class MetricsLog:
    """Append-only metrics.jsonl; each line is flushed so `tail -f` and a crash both see it."""

    def __init__(self, output_dir: Path):
        self.path = Path(output_dir) / "metrics.jsonl"
        self.file = open(self.path, "a")

    def write(self, record: dict) -> None:
        record = {"time": time.time(), **record}
        self.file.write(json.dumps(_clean(record)) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()
