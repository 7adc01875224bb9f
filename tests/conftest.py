"""Shared pytest helpers: the repository root and a way to run playbooks through ansible-runner."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def run_playbook(tmp_path, monkeypatch):
    """Run a playbook with ansible-runner (events and artifacts, not scraped stdout).

    ansible-playbook is taken from the interpreter's own venv, however pytest was started.
    """
    ansible_runner = pytest.importorskip("ansible_runner")
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))

    def run(playbook: Path | str, inventory: Path | str, cmdline: str | None = None,
            envvars: dict | None = None, **extravars):
        pdd = tmp_path / "pdd"
        pdd.mkdir(exist_ok=True)
        return ansible_runner.run(
            private_data_dir=str(pdd), playbook=str(playbook), inventory=str(inventory),
            extravars=extravars, quiet=True, cmdline=cmdline,
            envvars={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_FACT_CACHING": "memory",
                     "ANSIBLE_ROLES_PATH": str(ROOT / "roles"), **(envvars or {})})

    return run


def failure_messages(runner) -> list[str]:
    """The msg of every failed task event of an ansible-runner run."""
    return [ev["event_data"]["res"].get("msg", "") for ev in runner.events
            if ev.get("event") == "runner_on_failed"]
