"""The GPU quarantine: the GPUs of a host that no run may use until someone clears them.

One file per host, <runs' parent>/.gpu-health/quarantine.json (layout.GPU_HEALTH beside the runs),
keyed by GPU UUID (a GPU keeps its UUID across reboots, driver reloads and index changes):

    {"schema": 1,
     "quarantined": {"GPU-8e1c...": {"uuid", "pci", "name", "reason", "action", "source", "evidence",
                                    "since", "records": [{"at", "reason", "action", "source", "evidence"}, ...]}},
     "cleared": [{... the entry as it was, "cleared_at", "cleared_by"}, ...]}

Writers: a failed health check (source "gpu-check", roles/gpu_health) and diagnose.yml's GPU actions
(source "diagnose": reset-gpu, reboot-node, drain-contact-support). Readers: train.yml's preflight
(refuses a run whose GPUs include one), status.yml, the trainer's --plan (leaves them out).

Never losing a record: every change holds an exclusive lock (flock on quarantine.json.lock), reads
the file, changes it and replaces it atomically (files.atomic_write_text); a second reason for a
GPU already quarantined is appended to its records, and a clear moves the entry, records and all,
to `cleared`. A file that cannot be read is an error, never an empty quarantine: a damaged file
must not let a run onto a GPU that was put aside.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time

from . import layout
from .files import atomic_write_text

SCHEMA = 1
FILE = "quarantine.json"
# The health check's evidence beside it: check-<UTC time>.json (one per check run).
CHECK_PREFIX = "check-"
SOURCES = ("gpu-check", "diagnose")
# diagnose.yml's verdict actions that quarantine the GPU they name (classify.signatures.ACTIONS).
GPU_ACTIONS = ("reset-gpu", "reboot-node", "drain-contact-support")
_UUID = re.compile(r"^(?:GPU-)?([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})$")


class QuarantineError(Exception):
    """The quarantine file cannot be read or a record is malformed; the message names the file."""


def health_dir(runs_root: str) -> str:
    """The host's GPU health directory, beside the runs (runs_root is the runs' parent directory)."""
    return os.path.join(runs_root, layout.GPU_HEALTH)


def path_for(runs_root: str) -> str:
    return os.path.join(health_dir(runs_root), FILE)


def normalize_uuid(uuid: str) -> str:
    """'GPU-<hex>' in lower case, as nvidia-smi prints it; torch's bare form takes the prefix.
    ValueError for anything that is not a GPU UUID."""
    m = _UUID.match(str(uuid).strip())
    if not m:
        raise ValueError(f"{uuid!r} is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, as nvidia-smi -L prints)")
    return "GPU-" + m.group(1).lower()


def _empty() -> dict:
    return {"schema": SCHEMA, "quarantined": {}, "cleared": []}


def read(path: str) -> dict:
    """The quarantine document; an empty one when the file does not exist yet."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        return _empty()
    except OSError as exc:
        raise QuarantineError(f"{path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise QuarantineError(f"{path}: not JSON ({exc}); fix or move it aside after checking its GPUs") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("quarantined"), dict) or not isinstance(doc.get("cleared"), list):
        raise QuarantineError(f"{path}: not a quarantine file (an object with 'quarantined' and 'cleared')")
    return doc


def quarantined(doc: dict) -> dict:
    """{uuid: entry} of the GPUs quarantined now."""
    return doc["quarantined"]


def last_cleared(doc: dict, uuid: str) -> float | None:
    """When the GPU was last cleared (epoch seconds), or None: the health check reads the kernel's
    Xid lines for it only after that (a cleared Xid was dealt with)."""
    times = [c.get("cleared_at_s") for c in doc["cleared"] if isinstance(c, dict) and c.get("uuid") == uuid]
    times = [t for t in times if isinstance(t, (int, float))]
    return max(times) if times else None


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


class _Locked:
    """Exclusive lock on <path>.lock for one read-change-write of the quarantine file."""

    def __init__(self, path: str):
        self.path = path

    def __enter__(self):
        os.makedirs(os.path.dirname(self.path) or ".", mode=0o755, exist_ok=True)
        self.fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return read(self.path)

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _write(path: str, doc: dict) -> None:
    atomic_write_text(path, json.dumps(doc, indent=1, sort_keys=True) + "\n")


def record(path: str, uuid: str, reason: str, source: str, evidence: str, action: str = "", pci: str = "",
           name: str = "", now: float | None = None) -> tuple[dict, bool]:
    """Quarantine a GPU (or add a reason to its quarantine). Returns (its entry, changed): recording
    the same reason, source and evidence again changes nothing (idempotent)."""
    uuid = normalize_uuid(uuid)
    if source not in SOURCES:
        raise ValueError(f"source {source!r} is not one of {SOURCES}")
    if not str(reason).strip():
        raise ValueError("a quarantine needs a reason")
    now = time.time() if now is None else now
    rec = {"at": _utc(now), "reason": str(reason), "action": action, "source": source, "evidence": str(evidence)}
    with _Locked(path) as doc:
        entry = doc["quarantined"].get(uuid)
        if entry is None:
            entry = {"uuid": uuid, "pci": pci, "name": name, "reason": rec["reason"], "action": action,
                     "source": source, "evidence": rec["evidence"], "since": rec["at"], "records": []}
            doc["quarantined"][uuid] = entry
        elif any((r.get("reason"), r.get("source"), r.get("evidence")) == (rec["reason"], source, rec["evidence"])
                 for r in entry.get("records", [])):
            return entry, False
        entry.setdefault("records", []).append(rec)
        _write(path, doc)
        return entry, True


def clear(path: str, uuid: str, by: str, now: float | None = None) -> dict | None:
    """Release a quarantined GPU: its entry moves to `cleared` with when and by whom. None when it
    was not quarantined (nothing changes)."""
    uuid = normalize_uuid(uuid)
    now = time.time() if now is None else now
    with _Locked(path) as doc:
        entry = doc["quarantined"].pop(uuid, None)
        if entry is None:
            return None
        doc["cleared"].append({**entry, "cleared_at": _utc(now), "cleared_at_s": now, "cleared_by": by})
        _write(path, doc)
        return entry


def describe(entry: dict) -> str:
    """One line for a quarantined GPU: which, why, since when, the evidence."""
    more = len(entry.get("records", [])) - 1
    return (f"{entry['uuid']}{' (' + entry['pci'] + ')' if entry.get('pci') else ''}: {entry['reason']} "
            f"[{entry.get('source', '?')}{', action ' + entry['action'] if entry.get('action') else ''}, since "
            f"{entry.get('since', '?')}, evidence {entry.get('evidence') or 'none'}"
            f"{f', {more} more record(s)' if more > 0 else ''}]")
