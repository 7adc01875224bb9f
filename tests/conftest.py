"""Shared pytest helpers: the repository root and a way to run playbooks through ansible-runner."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

# Several tests load the project's Ansible modules, which import ansible.module_utils. That import
# replaces sys.intern with a patch object, and torch._dynamo (imported later by the trainer tests)
# refuses anything but a function there. Import it once here and put the builtin back.
_intern = sys.intern
import ansible.module_utils.basic  # noqa: E402,F401

sys.intern = _intern

ROOT = Path(__file__).resolve().parents[1]


def load_file(path: Path | str, name: str | None = None):
    """Import a Python file that is not part of a package (a role's module, filter or script)."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
