"""Bad input stops a role before it touches the host, with a message that names the problem.

Each case runs the real role against this machine through ansible-runner with the local
connection, in check mode as a second guard: every case must fail in validation, so nothing is
installed here.
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.conftest import ROOT, failure_messages


def _play(tmp_path, role: str, tasks_from: str = "main") -> tuple:
    inventory = tmp_path / "hosts.json"
    inventory.write_text(json.dumps({"all": {"children": {"gpu_nodes": {"hosts": {"here": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}}}))
    playbook = tmp_path / "play.yml"
    playbook.write_text(f"""
- hosts: gpu_nodes
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: {role}
        tasks_from: {tasks_from}
""")
    return playbook, inventory


@pytest.mark.parametrize("role, extravars, needle", [
    ("python_env", {"python_env_profile": "gpu"}, "python_env_profile 'gpu' is unknown; known profiles: cpu, cuda"),
    ("python_env", {"python_env_profiles": {"cpu": 1}}, "python_env_profiles"),
    ("python_env", {"python_env_base_python": "/nonexistent/python3"}, "is missing or does not run"),
    ("python_env", {"python_env_min_python": "9.0"}, "the trainer needs Python >= 9.0"),
    ("build_toolchain", {"build_toolchain_python": "/nonexistent/python"}, "does not run"),
    ("build_toolchain", {"build_toolchain_packages": {"gcc": 1}}, "build_toolchain_packages"),
    ("local_node", {"local_node_containers": [{"name": "a", "ssh_port": 22}]}, "ssh ports >= 1024"),
    ("local_node", {"local_node_containers": [{"name": "a"}]}, "ssh_port"),
])
def test_bad_input_fails_early_and_names_the_problem(tmp_path, run_playbook, role, extravars, needle):
    playbook, inventory = _play(tmp_path, role)
    extravars.setdefault("local_node_ssh_key", str(tmp_path / "key"))
    r = run_playbook(playbook, inventory, cmdline="--check", **extravars)
    assert r.rc != 0
    messages = "\n".join(failure_messages(r))
    assert needle in messages, messages
    changed = [ev for ev in r.events if ev.get("event") == "runner_on_ok" and ev["event_data"]["res"].get("changed")]
    assert changed == [], "validation must not change anything"


def test_a_lock_that_does_not_parse_stops_python_env(tmp_path, run_playbook):
    root = tmp_path / "project"
    (root / "requirements").mkdir(parents=True)
    (root / "requirements/node-cpu.lock").write_text("torch==2.13.0\nwandb>=0.19\n")
    playbook, inventory = _play(tmp_path, "python_env")
    r = run_playbook(playbook, inventory, cmdline="--check", python_env_project_root=str(root))
    messages = "\n".join(failure_messages(r))
    assert r.rc != 0
    assert "not a lock" in messages and "wandb>=0.19" in messages and "make lock" in messages


def test_the_repository_lock_passes_validation(tmp_path, run_playbook):
    """The same checks accept the real lock and this machine's Python (so the cases above fail for their reason)."""
    playbook, inventory = _play(tmp_path, "python_env", tasks_from="validate")
    r = run_playbook(playbook, inventory, cmdline="--check", python_env_base_python=sys.executable)
    assert r.rc == 0, "\n".join(failure_messages(r))
    assert (ROOT / "requirements/node-cpu.lock").exists()
