"""Shared pytest helpers: the repository root and a way to run playbooks through ansible-runner."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# One torch (OpenMP/BLAS) thread in the test process and the trainers it starts: the tests' models
# are tiny, and on a two-core machine a second thread only adds synchronization (the trainer tests
# measured about 2x faster in wall time with one; docs/benchmarks.md). Set here, before any test
# module imports torch; a value already in the environment is kept. Multi-process trainer runs
# still set their own per-process threads (topology._cpu_threads).
os.environ.setdefault("OMP_NUM_THREADS", "1")


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


def local_inventory(tmp_path: Path, host: str = "here") -> Path:
    """An inventory of one host reached with the local connection, on this interpreter."""
    inventory = tmp_path / "hosts.json"
    inventory.write_text(json.dumps({"all": {"hosts": {host: {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    return inventory


def role_play(tmp_path: Path, role: str, tasks_from: str, role_vars: dict | None = None,
              name: str = "play.yml") -> Path:
    """A playbook that runs one task file of one role on every host (role_vars: the include's vars)."""
    include = {"ansible.builtin.include_role": {"name": role, "tasks_from": tasks_from}}
    if role_vars:
        include["vars"] = role_vars
    playbook = tmp_path / name
    playbook.write_text(json.dumps([{"hosts": "all", "gather_facts": False, "tasks": [include]}]))
    return playbook
