"""Atomic checkpoints: a directory either is complete and verified, or it is ignored.

Layout under <output-dir>/checkpoints/:
    step-00001200/drafter.safetensors   trainable drafter weights (safetensors)
                  config.json           drafter config: enough to rebuild it for inference
                  trainer_state.pt      optimizer, scheduler, RNG, data position
                  manifest.json         written LAST: file names, sizes, sha256

A save writes everything into `.tmp-step-<n>-<pid>/`, fsyncs each file and the directory,
renames it to `step-<n>/` and fsyncs the parent. A process killed at any point leaves either
the old set of complete checkpoints or the old set plus the new one, never a half-written
directory under a `step-*` name. Even so, readers trust only directories whose manifest exists
and matches the files (a disk can still lie), so `--resume auto` can never pick a broken one.
"""

import hashlib
import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .metrics import fsync_dir

WEIGHTS, CONFIG, STATE, MANIFEST = "drafter.safetensors", "config.json", "trainer_state.pt", "manifest.json"


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def save_checkpoint(root: Path, step: int, weights: dict, config: dict, trainer_state: dict,
                    keep: int = 3, _before_manifest=None) -> Path:
    """Write checkpoint `step` atomically under root and prune to the newest `keep` complete ones.

    `_before_manifest` is a test hook called after the payload files exist and before the
    manifest: raising there simulates a crash in the middle of a save.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(step)
    tmp = root / f".tmp-step-{step}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)  # our own leftover from an earlier failed attempt in this process
    tmp.mkdir()
    save_file({k: v.detach().contiguous().cpu() for k, v in weights.items()}, str(tmp / WEIGHTS))
    (tmp / CONFIG).write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")
    torch.save(trainer_state, tmp / STATE)
    for name in (WEIGHTS, CONFIG, STATE):
        _fsync_file(tmp / name)
    if _before_manifest is not None:
        _before_manifest(tmp)
    files = {name: {"size": (tmp / name).stat().st_size, "sha256": _sha256(tmp / name)}
             for name in (WEIGHTS, CONFIG, STATE)}
    (tmp / MANIFEST).write_text(json.dumps({"format": 1, "step": step, "files": files}, indent=1) + "\n")
    _fsync_file(tmp / MANIFEST)
    fsync_dir(tmp)
    if final.exists():  # a re-save of the same step (e.g. resumed, then stopped at once)
        shutil.rmtree(final)
    os.rename(tmp, final)
    fsync_dir(root)
    prune(root, keep)
    return final


def is_complete(path: Path, check_hashes: bool = True) -> bool:
    """True iff path has a manifest and every listed file exists with that size (and sha256)."""
    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        files = manifest["files"]
        if set(files) != {WEIGHTS, CONFIG, STATE}:
            return False
        for name, meta in files.items():
            f = path / name
            if f.stat().st_size != meta["size"]:
                return False
            if check_hashes and _sha256(f) != meta["sha256"]:
                return False
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False


def complete_checkpoints(root: Path, check_hashes: bool = False) -> list[Path]:
    """Complete `step-*` directories under root, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    dirs = sorted(p for p in root.glob("step-*") if p.is_dir())
    return [p for p in dirs if is_complete(p, check_hashes)]


def newest_complete(root: Path) -> Path | None:
    """The newest checkpoint that verifies fully (sizes and sha256); None if there is none."""
    for path in reversed(complete_checkpoints(root, check_hashes=False)):
        if is_complete(path, check_hashes=True):
            return path
    return None


def prune(root: Path, keep: int) -> None:
    """Keep the newest `keep` complete checkpoints. Incomplete directories are left alone for a
    human to look at, except temp dirs of processes that no longer exist (dead saves)."""
    if keep > 0:
        for old in complete_checkpoints(root)[:-keep]:
            shutil.rmtree(old)
    for tmp in Path(root).glob(".tmp-step-*-*"):
        pid = int(tmp.name.rsplit("-", 1)[1])
        if pid != os.getpid() and not _pid_alive(pid):
            shutil.rmtree(tmp, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def load_checkpoint(path: Path, map_location="cpu") -> tuple[dict, dict, dict]:
    """(weights, config, trainer_state) of a complete checkpoint; raises if it is not complete."""
    path = Path(path)
    if not is_complete(path):
        raise ValueError(f"{path} is not a complete checkpoint (manifest missing or mismatched)")
    weights = load_file(str(path / WEIGHTS), device=str(map_location))
    config = json.loads((path / CONFIG).read_text())
    state = torch.load(path / STATE, map_location=map_location, weights_only=False)
    return weights, config, state
