"""metrics.jsonl (one record per optimizer step), status.json (where the run stands now) and
run.json (what the run keeps across restarts).

What the files hold, and how status.json is written atomically (a reader never sees half a
file, even after SIGKILL), is the run's contract: `flashfleet.contract.status`, `.metrics`, `.starts`
and `.layout`, which diagnose and collect read too. This file is the trainer's writer for them.
"""

import json
import time
from dataclasses import dataclass
from pathlib import Path

from flashfleet.contract import layout, starts, status
from flashfleet.contract import metrics as contract

from .errors import ConfigError


@dataclass(frozen=True)
class RunStart:
    """This start of the run: its number (1 = the first) and the run's W&B id (run.json)."""

    invocation: int
    wandb_id: str


def begin_run(output_dir, name: str) -> RunStart:
    """One more start of the run (run.json); a damaged run.json is a ConfigError."""
    try:
        state = starts.begin(output_dir, name)
        return RunStart(state[starts.INVOCATION], state[starts.WANDB_ID])
    except starts.StartsError as e:
        raise ConfigError(f"cannot count this start: {e}",
                          f"restore {layout.RUN_STATE} from a backup or move it aside (a new one starts a new history)"
                          ) from e


class Status:
    """The run's status.json. Every update rewrites the whole (small) file atomically."""

    def __init__(self, output_dir: Path | None, pid: int | None = None, keep: bool = False, adopt: tuple = ()):
        """output_dir: None keeps the status in memory only (drafter ranks other than 0, --plan).
        pid: the process systemd watches (the node's main process when ranks are children).
        keep: start from the file on disk (a main process recording how its ranks ended).
        adopt: keys another process owns (the main process's `workers` table): carried over from
        the file on every update instead of being overwritten."""
        self.path = None if output_dir is None else Path(output_dir) / layout.STATUS
        self.adopt = adopt
        self.state = status.new(pid)
        if keep and self.path is not None and self.path.is_file():
            try:
                self.state.update(status.read(self.path))
            except status.StatusError:
                pass

    def update(self, **fields) -> None:
        if "phase" in fields and fields["phase"] not in status.PHASES:
            raise ValueError(f"unknown phase {fields['phase']!r}")
        self.state.update(fields)
        if self.path is None:
            return
        if self.adopt and self.path.is_file():
            try:
                disk = status.read(self.path)
                self.state.update({k: disk[k] for k in self.adopt if k in disk})
            except status.StatusError:
                pass
        status.write(self.path, self.state)

    @classmethod
    def null(cls) -> "Status":
        """A Status kept in memory, never written."""
        return cls(None)


class MetricsLog:
    """Append-only metrics.jsonl; each line is flushed so `tail -f` and a crash both see it.
    Every record carries this start's invocation: its first step supersedes what earlier starts
    logged from that step on (contract.metrics.supersede)."""

    def __init__(self, output_dir: Path | None, invocation: int = 1):
        """output_dir: None writes nothing (drafter ranks other than 0)."""
        self.path = None if output_dir is None else Path(output_dir) / layout.METRICS
        self.invocation = invocation
        self.file = None if self.path is None else open(self.path, "a")

    def write(self, record: dict) -> None:
        if self.file is not None:
            rec = {"time": time.time(), **record, contract.INVOCATION: self.invocation}
            self.file.write(json.dumps(status.clean(rec)) + "\n")
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()

    @classmethod
    def null(cls) -> "MetricsLog":
        return cls(None)
