"""Saving and loading checkpoints. What a checkpoint is (names, manifest, when it is complete)
is the run's contract, owned by `flashfleet.contract.checkpoint`, which diagnose reads too;
this file adds only what needs torch: writing the payload and loading it back.

A save writes everything into `.tmp-step-<n>-<pid>/`, fsyncs each file, writes the manifest,
fsyncs the directory, writes the completion marker LAST (fsynced, directory fsynced again),
renames it to `step-<n>/` and fsyncs the parent. A process killed at any point leaves either the
old set of complete checkpoints or the old set plus the new one, never a half-written directory
under a `step-*` name. Readers still trust only directories that verify (a disk can lie), so
`--resume auto` can never pick a broken one.

Nothing is deleted in place: pruning (and replacing a re-saved step) first renames the old
directory to `.trash-step-<n>-<pid>/`, then deletes it; a kill in the middle leaves the trash
name, which `prepare` removes at the next start. A step directory newer than the newest one that
verifies is not deleted either: `prepare` names it in a warning line and moves it aside to
`step-<n>.corrupt-<k>/`, so a re-save of that step cannot destroy the evidence.

trainer_state.pt holds only tensors, numbers, strings, lists and dicts, and is loaded with
`torch.load(weights_only=True)`: no pickled code runs on resume.
"""

import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from flashfleet.contract import checkpoint as contract
from flashfleet.contract import messages
from flashfleet.contract.files import fsync_dir, fsync_file
from safetensors.torch import load_file, save_file

from .errors import ConfigError

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
    contract.write_manifest(tmp, step)  # manifest, fsync, the marker last, fsync
    replaced = None
    if final.exists():  # a re-save of the same step (e.g. resumed, then stopped at once)
        problems = contract.verify(final, check_hashes=False)
        if problems:  # evidence: moved aside, never deleted
            aside = root / contract.quarantine_name(root, step)
            os.rename(final, aside)
            _warn(f"checkpoint {final} is not complete ({'; '.join(problems)}): moved aside to {aside.name} "
                  f"before saving step {step} again")
        else:  # the same step, complete: replaced, the old one deleted only once the new one is in place
            replaced = root / contract.trash_dir_name(step, os.getpid())
            os.rename(final, replaced)
    os.rename(tmp, final)
    fsync_dir(root)
    if replaced is not None:
        shutil.rmtree(replaced)
    prune(root, keep)
    return final


def _warn(text: str) -> None:
    print(messages.warning(text), file=sys.stderr, flush=True)


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
    """Keep the newest `keep` complete checkpoints: each older one is renamed to a trash name
    first (atomic), then deleted, so a kill mid-delete leaves no half-deleted `step-*`. Incomplete
    directories are left alone for a human to look at; leftovers of dead processes go."""
    if keep > 0:
        for old in complete_checkpoints(root)[:-keep]:
            trash = old.parent / contract.trash_dir_name(contract.step_of(old.name), os.getpid())
            os.rename(old, trash)
            fsync_dir(old.parent)
            shutil.rmtree(trash)
    clean_leftovers(root)


def clean_leftovers(root: Path) -> list[str]:
    """Delete temp dirs of dead saves and trash dirs of dead prunes (never a `step-*` name, never
    a quarantined one). Returns the names removed."""
    removed = []
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return removed
    for name in names:
        pid = contract.temp_pid(name) or contract.trash_pid(name)
        if pid is not None and pid != os.getpid() and not _pid_alive(pid) and (Path(root) / name).is_dir():
            shutil.rmtree(Path(root) / name, ignore_errors=True)
            removed.append(name)
    return removed


@dataclass
class Found:
    """What a start resumes from, verified in full ONCE (preflight) and passed on to `prepare` and
    the trainer's resume, which then hash nothing again (sha256 of a large drafter's weights and
    optimizer state is seconds to minutes per pass)."""

    root: Path  # the checkpoints directory looked at
    resume: str  # the --resume it answers: "auto" or an explicit path
    path: Path | None  # the checkpoint to load (sizes, sha256, header, marker verified); None: scratch
    newer: list = field(default_factory=list)  # auto: scan entries newer than path, with their problems


def broken_newest(root: Path, verified: Path | None = None) -> tuple[list[dict], Path | None]:
    """([scan entries of the step directories newer than the newest complete one], that one):
    what `prepare` moves aside and what the run then resumes from. One walk from the newest step
    down: each directory is hashed at most once, and the walk stops at the first that verifies.
    `verified`: a directory this start has just verified in full (an explicit --resume): not hashed again."""
    entries = [c for c in contract.scan(root) if not c["in_progress"]]  # sizes and header only
    bad = []
    for c in reversed(entries):
        if not c["problems"] and (verified is None or Path(c["path"]) != Path(verified)):
            c["problems"] = contract.verify(c["path"], check_hashes=True)
        if not c["problems"]:
            return bad[::-1], Path(c["path"])
        bad.append(c)
    return bad[::-1], None


def prepare(root: Path, log=print, found: Found | None = None) -> list[Path]:
    """At a start that passed preflight (never at --check): clean leftovers of dead saves and
    prunes, and move every step directory newer than the newest complete one aside, loudly.
    `found`: what preflight verified for --resume auto under this root (nothing is hashed again);
    without it the directory is verified here. Returns the quarantined paths."""
    root = Path(root)
    if not root.is_dir():
        return []
    for name in clean_leftovers(root):  # .tmp-/.trash- names only: never among found.newer
        log(f"removed {root / name} (left by a save or prune that was killed)")
    if _answers(found, root, "auto"):
        bad, good = found.newer, found.path
    else:  # an explicit --resume still has a broken newest moved aside; its own path is not hashed again
        bad, good = broken_newest(root, found.path if found is not None else None)
    moved = []
    for c in bad:
        dest = root / contract.quarantine_name(root, c["step"])
        os.rename(c["path"], dest)
        fsync_dir(root)
        _warn(f"checkpoint {c['path']} is not complete ({'; '.join(c['problems'])}): moved aside to "
              f"{dest.name}, resuming from {good.name if good else 'scratch (no complete checkpoint)'}")
        moved.append(dest)
    return moved


def drafter_differences(mine: dict, theirs: dict) -> list[str]:
    """Fields of two drafter configs (DrafterConfig.to_dict) that change what the weights mean,
    not only their shapes (a sliding layer and a full one hold tensors of the same shape)."""
    if theirs.get("drafter_kind", "dflash") != mine.get("drafter_kind", "dflash"):
        return ["drafter_kind"]  # another kind of drafter: its DFlash 2 fields differ as a consequence
    return [k for k in ("hidden_size", "num_hidden_layers", "target_layer_ids", "block_size", "vocab_size",
                        "layer_types", "sliding_window", "num_attention_heads", "num_key_value_heads", "head_dim",
                        "intermediate_size", "mask_token_id", "conv_kernel_size", "conv_group_size",
                        "selector_rank", "selector_top_k")
            if theirs.get(k) != mine.get(k)] + [
        k for k in ("sliding_window_non_causal",)  # False in a checkpoint from before the field
        if theirs.get(k, False) != mine.get(k, False)]


def restore_cuda_rng(states) -> int:
    """Restore the saved per-device CUDA RNG states where CUDA is present (as many devices as both
    the checkpoint and this process have); returns how many were restored."""
    if not states or not torch.cuda.is_available():
        return 0
    n = min(len(states), torch.cuda.device_count())
    for i in range(n):
        torch.cuda.set_rng_state(states[i], device=i)
    return n


def load_state(path: Path) -> dict:
    """trainer_state.pt, memory-mapped (preflight reads a few numbers of it, not the optimizer)."""
    return torch.load(Path(path) / STATE, map_location="cpu", weights_only=True, mmap=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _answers(found: Found | None, root: Path, resume: str) -> bool:
    """True iff `found` was verified for this checkpoints root and this --resume."""
    return found is not None and Path(found.root) == Path(root) and found.resume == resume


def resume_checkpoint(resume: str, root: Path, found: Found | None = None):
    """(path, (weights, config, trainer_state)) of the checkpoint `--resume` names (auto: the
    newest complete one under root), or None for none / `never`. `found`: preflight's result for
    this root and --resume; its path is loaded without hashing again, anything else is verified in
    full here (callers that skip preflight). An explicit path that does not verify is a ConfigError."""
    if resume == "never":
        return None
    if _answers(found, root, resume):
        return None if found.path is None else (found.path, load_checkpoint(found.path, verified=True))
    if resume == "auto":
        path = newest_complete(root)
        return None if path is None else (path, load_checkpoint(path, verified=True))
    path = Path(resume)
    problems = contract.verify(path, check_hashes=True)
    if problems:
        raise ConfigError(f"--resume {path} is not a complete checkpoint ({problems[0]})",
                          "pass --resume auto or a complete checkpoints/step-XXXXXXXX")
    return path, load_checkpoint(path, verified=True)


def load_checkpoint(path: Path, map_location="cpu", verified: bool = False) -> tuple[dict, dict, dict]:
    """(weights, config, trainer_state) of a complete checkpoint; raises if it is not complete.
    `verified`: the caller has just verified it in full (sizes, sha256, header), so it is not
    hashed again."""
    path = Path(path)
    problems = [] if verified else contract.verify(path)
    if problems:
        raise ValueError(f"{path} is not a complete checkpoint: {'; '.join(problems)}")
    weights = load_file(str(path / WEIGHTS), device=str(map_location))
    config = json.loads((path / CONFIG).read_text())
    state = torch.load(path / STATE, map_location=map_location, weights_only=True)
    return weights, config, state
