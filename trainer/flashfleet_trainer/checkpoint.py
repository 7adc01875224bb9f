"""Saving and loading checkpoints. What a checkpoint is (names, manifest, when it is complete)
is the run's contract, owned by `flashfleet.contract.checkpoint`, which diagnose reads too;
this file adds only what needs torch: writing the payload and loading it back.

A save writes everything into `.tmp-step-<n>-<pid>/`, fsyncs each file, writes the manifest
LAST, fsyncs the directory, renames it to `step-<n>/` and fsyncs the parent. A process killed
at any point leaves either the old set of complete checkpoints or the old set plus the new one,
never a half-written directory under a `step-*` name. Readers still trust only directories that
verify (a disk can lie), so `--resume auto` can never pick a broken one.
"""

import json
import os
import shutil
from pathlib import Path

import torch
from flashfleet.contract import checkpoint as contract
from flashfleet.contract.files import fsync_dir, fsync_file
from safetensors.torch import load_file, save_file

WEIGHTS, CONFIG, STATE, MANIFEST = contract.WEIGHTS, contract.CONFIG, contract.STATE, contract.MANIFEST
step_dir_name = contract.step_dir_name


def save_checkpoint(root: Path, step: int, weights: dict, config: dict, trainer_state: dict,
                    keep: int = 3, _before_manifest=None) -> Path:
    """Write checkpoint `step` atomically under root and prune to the newest `keep` complete ones.

    `_before_manifest` is a test hook called after the payload files exist and before the
    manifest: raising there simulates a crash in the middle of a save.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(step)
    tmp = root / contract.temp_dir_name(step, os.getpid())
    if tmp.exists():
        shutil.rmtree(tmp)  # our own leftover from an earlier failed attempt in this process
    tmp.mkdir()
    save_file({k: v.detach().contiguous().cpu() for k, v in weights.items()}, str(tmp / WEIGHTS))
    (tmp / CONFIG).write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")
    torch.save(trainer_state, tmp / STATE)
    for name in contract.PAYLOAD:
        fsync_file(tmp / name)
    if _before_manifest is not None:
        _before_manifest(tmp)
    contract.write_manifest(tmp, step)
    fsync_dir(tmp)
    if final.exists():  # a re-save of the same step (e.g. resumed, then stopped at once)
        shutil.rmtree(final)
    os.rename(tmp, final)
    fsync_dir(root)
    prune(root, keep)
    return final


def is_complete(path: Path, check_hashes: bool = True) -> bool:
    """True iff the checkpoint at path verifies (contract.verify finds no problem)."""
    return not contract.verify(path, check_hashes)


def complete_checkpoints(root: Path, check_hashes: bool = False) -> list[Path]:
    """Complete `step-*` directories under root, oldest first."""
    return [Path(p) for p in contract.complete(root, check_hashes)]


def newest_complete(root: Path) -> Path | None:
    """The newest checkpoint that verifies fully (sizes and sha256); None if there is none."""
    path = contract.newest_complete(root)
    return None if path is None else Path(path)


def prune(root: Path, keep: int) -> None:
    """Keep the newest `keep` complete checkpoints. Incomplete directories are left alone for a
    human to look at, except temp dirs of processes that no longer exist (dead saves)."""
    if keep > 0:
        for old in complete_checkpoints(root)[:-keep]:
            shutil.rmtree(old)
    for entry in contract.scan(root):
        if entry["in_progress"] and entry["pid"] != os.getpid() and not _pid_alive(entry["pid"]):
            shutil.rmtree(entry["path"], ignore_errors=True)


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
    problems = contract.verify(path)
    if problems:
        raise ValueError(f"{path} is not a complete checkpoint: {'; '.join(problems)}")
    weights = load_file(str(path / WEIGHTS), device=str(map_location))
    config = json.loads((path / CONFIG).read_text())
    state = torch.load(path / STATE, map_location=map_location, weights_only=False)
    return weights, config, state
