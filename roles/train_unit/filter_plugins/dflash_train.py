"""Jinja filters: dflash-train's own defaults where the role needs one, read from the trainer's one
definition of its settings (flashfleet_trainer.config.RunConfig, from the installed project), so
that the role passes a run's settings through without writing a second default of its own.

    {{ 'drafter_gpus' | dflash_train_default }}     '0', as `dflash-train` without --drafter-gpus
    {{ spec.trainer | dflash_train_setting('target_gpus') }}   the run's value, else the trainer's default
"""

from __future__ import annotations

import functools
import importlib

from ansible.errors import AnsibleFilterError


@functools.cache
def _defaults() -> dict:
    try:
        config = importlib.import_module("flashfleet_trainer.config")
    except ImportError as e:
        raise AnsibleFilterError(
            f"dflash_train_default: cannot import flashfleet_trainer.config ({e}). Fix: run ansible-playbook from "
            "the project's venv (make venv installs the project into .venv)") from None
    return {name: f.default for name, f in config.FIELDS.items()}


def dflash_train_default(dest):
    """dflash-train's default for the flag whose dest name is `dest`, e.g. 'target_gpus' -> '0'."""
    defaults = _defaults()
    if dest not in defaults:
        raise AnsibleFilterError(f"dflash_train_default: dflash-train has no flag with dest {dest!r}")
    return defaults[dest]


def dflash_train_setting(trainer, dest):
    """A run's `trainer` entry's value for `dest`, or dflash-train's default where the entry leaves it out."""
    trainer = trainer or {}
    return trainer[dest] if dest in trainer else dflash_train_default(dest)


class FilterModule:
    def filters(self):
        return {"dflash_train_default": dflash_train_default, "dflash_train_setting": dflash_train_setting}
