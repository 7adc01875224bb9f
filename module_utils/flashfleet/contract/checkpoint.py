"""Checkpoints under <output-dir>/checkpoints/: names, the manifest, and what "complete" means.

    step-00001200/drafter.safetensors   trainable drafter weights
                  config.json           drafter config: enough to rebuild it for inference
                  trainer_state.pt      optimizer, scheduler, RNG, data position
                  manifest.json         {"format": 1, "step": n,
                                        "files": {name: {"size": bytes, "sha256": hex}}}
                  COMPLETE              the completion marker, written LAST, after every file
                                        above and the directory are fsynced: {"format": 2, "step": n}

The trainer writes a checkpoint into `.tmp-step-<n>-<pid>/` and renames it to `step-<n>/` once
the marker is on disk, so a `step-*` directory is never half-written by a save; even so, every
reader (the trainer's resume, diagnose) trusts a directory only when `verify` finds no problem,
and a directory without its marker is never complete (checkpoints written before the marker
existed, format 1, are therefore not resumed: docs/contract.md).

Other names under checkpoints/, none of which any reader takes for a checkpoint:
    .tmp-step-<n>-<pid>/       a save in progress (or a dead one's leftover)
    .trash-step-<n>-<pid>/     a pruned or replaced checkpoint being deleted: pruning renames
                               first, so a kill mid-delete leaves this, cleaned at the next start
    step-<n>.corrupt-<k>/      a step directory that did not verify, moved aside at a start
                               (never deleted, never overwritten: k is the first free number)
"""

import json
import os
import re

from . import files, safetensors

WEIGHTS, CONFIG, STATE, MANIFEST = "drafter.safetensors", "config.json", "trainer_state.pt", "manifest.json"
MARKER = "COMPLETE"
PAYLOAD = (WEIGHTS, CONFIG, STATE)
MANIFEST_FORMAT = 1
MARKER_FORMAT = 2  # the checkpoint format: 2 = with the completion marker
TEMP_PREFIX = ".tmp-step-"
TRASH_PREFIX = ".trash-step-"
STEP_DIR_RE = re.compile(r"^step-(\d{8})$")
TEMP_DIR_RE = re.compile(r"^\.tmp-step-(\d+)-(\d+)$")
TRASH_DIR_RE = re.compile(r"^\.trash-step-(\d+)-(\d+)$")
QUARANTINE_RE = re.compile(r"^step-(\d{8})\.corrupt-(\d+)$")


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def step_of(name: str) -> int | None:
    """The step of a `step-NNNNNNNN` directory name, None for any other name."""
    m = STEP_DIR_RE.match(name)
    return int(m.group(1)) if m else None


def temp_dir_name(step: int, pid: int) -> str:
    return f"{TEMP_PREFIX}{step}-{pid}"


def temp_pid(name: str) -> int | None:
    """The writer's pid of a save in progress (`.tmp-step-<n>-<pid>`), None for any other name."""
    m = TEMP_DIR_RE.match(name)
    return int(m.group(2)) if m else None


def trash_dir_name(step: int, pid: int) -> str:
    return f"{TRASH_PREFIX}{step}-{pid}"


def trash_pid(name: str) -> int | None:
    """The pid that renamed a checkpoint for deletion (`.trash-step-<n>-<pid>`), None otherwise."""
    m = TRASH_DIR_RE.match(name)
    return int(m.group(2)) if m else None


def quarantine_name(root, step: int) -> str:
    """A free `step-<n>.corrupt-<k>` name under root (k = 1, 2, ...): nothing is ever overwritten."""
    k = 1
    while os.path.lexists(os.path.join(root, f"{step_dir_name(step)}.corrupt-{k}")):
        k += 1
    return f"{step_dir_name(step)}.corrupt-{k}"


def quarantined(root) -> list[str]:
    """Names of the checkpoints moved aside under root, oldest step first."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    return sorted((n for n in names if QUARANTINE_RE.match(n)),
                  key=lambda n: tuple(int(g) for g in QUARANTINE_RE.match(n).groups()))


def write_manifest(path, step: int) -> dict:
    """Complete checkpoint directory `path`: hash the payload files (already fsynced by the
    writer), write manifest.json, fsync it and the directory, then write the marker LAST and
    fsync it and the directory again. A directory without the marker is never complete."""
    manifest = {"format": MANIFEST_FORMAT, "step": step,
                "files": {name: {"size": os.path.getsize(os.path.join(path, name)),
                                 "sha256": files.sha256(os.path.join(path, name))} for name in PAYLOAD}}
    _write_synced(os.path.join(path, MANIFEST), json.dumps(manifest, indent=1) + "\n")
    files.fsync_dir(path)
    _write_synced(os.path.join(path, MARKER), json.dumps({"format": MARKER_FORMAT, "step": step}) + "\n")
    files.fsync_dir(path)
    return manifest


def _write_synced(target, text: str) -> None:
    with open(target, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def verify(path, check_hashes: bool = True) -> list[str]:
    """What is wrong with checkpoint directory `path`; [] means complete. Sizes always, sha256
    when `check_hashes`, and the weights' safetensors header always (cheap, catches truncation)."""
    try:
        with open(os.path.join(path, MANIFEST)) as f:
            manifest = json.load(f)
        listed = manifest["files"]
        if set(listed) != set(PAYLOAD):
            return [f"{MANIFEST} lists {sorted(listed)}, not {list(PAYLOAD)}"]
    except OSError as exc:
        return [f"no {MANIFEST} ({exc.strerror or exc})"]
    except (ValueError, KeyError, TypeError) as exc:
        return [f"{MANIFEST} is not a manifest ({exc})"]
    if not os.path.isfile(os.path.join(path, MARKER)):
        return [f"no {MARKER} marker (a save that never finished, or a checkpoint of format 1, "
                "written before the marker existed, which is not resumed)"]
    problems = []
    for name in PAYLOAD:
        fpath = os.path.join(path, name)
        try:
            size = os.path.getsize(fpath)
            want = int(listed[name]["size"])
        except OSError as exc:
            problems.append(f"{name}: {exc.strerror or exc}")
            continue
        except (KeyError, TypeError, ValueError):
            problems.append(f"{name}: no size in the manifest")
            continue
        if size != want:
            problems.append(f"{name}: {size} bytes, manifest says {want}")
        elif check_hashes and files.sha256(fpath) != listed[name].get("sha256"):
            problems.append(f"{name}: sha256 differs from the manifest")
    if not problems:
        _tensors, errs = safetensors.read_header(os.path.join(path, WEIGHTS))
        problems += [f"{WEIGHTS}: {e}" for e in errs]
    return problems


def scan(root, check_hashes: bool = False) -> list[dict]:
    """Every `step-*` directory and save in progress under root, oldest step first:
    {"name", "path", "step", "in_progress", "pid", "problems"} ([] problems = complete)."""
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        path = os.path.join(root, name)
        if not os.path.isdir(path):
            continue
        step, pid = step_of(name), temp_pid(name)
        if step is not None:
            out.append({"name": name, "path": path, "step": step, "in_progress": False, "pid": None,
                        "problems": verify(path, check_hashes)})
        elif pid is not None:
            out.append({"name": name, "path": path, "step": int(TEMP_DIR_RE.match(name).group(1)),
                        "in_progress": True, "pid": pid, "problems": ["save in progress (or died during one)"]})
    return sorted(out, key=lambda c: (c["step"], c["in_progress"]))


def complete(root, check_hashes: bool = False) -> list[str]:
    """Paths of the complete checkpoints under root, oldest first."""
    return [c["path"] for c in scan(root, check_hashes) if not c["in_progress"] and not c["problems"]]


def newest_complete(root) -> str | None:
    """The newest checkpoint that verifies fully (sizes, sha256, header); None if there is none."""
    for path in reversed(complete(root)):
        if not verify(path, check_hashes=True):
            return path
    return None
