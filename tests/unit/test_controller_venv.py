"""After `make venv`, the controller venv is exactly requirements/controller.lock: the same drift
check (flashfleet.contract.locks) that hosts get from the python_env role."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from flashfleet.contract import locks

from tests.conftest import ROOT

# Not in the lock on purpose: the project itself (installed editable after the sync) and the
# installer `python3 -m venv` seeds.
NOT_LOCKED = ("flashfleet", "pip")


@pytest.mark.skipif(Path(sys.prefix).resolve() != (ROOT / ".venv").resolve(),
                    reason="runs in the project's own .venv (made by `make venv`)")
def test_controller_venv_matches_its_lock():
    out = subprocess.run([sys.executable, "-c", locks.LIST_INSTALLED_SCRIPT], capture_output=True, text=True,
                         check=True)
    locked = locks.parse((ROOT / "requirements" / "controller.lock").read_text())
    drift = locks.compare(locked, json.loads(out.stdout), ignore=NOT_LOCKED)
    assert not drift, "\n" + locks.table(drift) + "\nfix: make venv (re-syncs the venv to the lock)"


@pytest.mark.skipif(Path(sys.prefix).resolve() != (ROOT / ".venv").resolve(),
                    reason="runs in the project's own .venv (made by `make venv`)")
def test_controller_lock_is_complete():
    """`uv pip sync` installs only what is locked: every requirement of every locked package must be
    locked too (a lock made by `pip freeze` leaves setuptools out, which torch needs)."""
    uv = Path(sys.executable).parent / "uv"
    out = subprocess.run([str(uv), "pip", "check", "--python", sys.executable], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
