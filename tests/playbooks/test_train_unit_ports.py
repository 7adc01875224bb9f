"""A port of a run's vLLM server that another process holds on the host is refused before anything
is installed (roles/train_unit/tasks/ports_check.yml, in the run's preflight): that server would
answer the run's trainer in place of the run's own, which cannot bind. The controller compares
ports within a run only; this is the host's side, across runs and anything else listening.

A play on this machine (local connection) runs the task file with a real listener on one port;
`systemctl` is absent here, so no server of the run counts as running (every port is tried).
"""

from __future__ import annotations

import socket

import pytest
from flashfleet.plan.run import SERVER_BIND

from tests.conftest import ROOT, failure_messages, local_inventory


@pytest.fixture
def listener():
    """A real TCP listener on a free loopback port, closed after the test."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # free once closed; nothing else here binds it meanwhile


def _check(tmp_path, run_playbook, ports):
    playbook = tmp_path / "ports.yml"
    playbook.write_text("""
- hosts: all
  gather_facts: false
  tasks:
    - ansible.builtin.include_tasks: "{{ tasks_file }}"
""")
    servers = [{"port": p, "gpus": str(i), "bind": SERVER_BIND} for i, p in enumerate(ports)]  # as the plan gives them
    return run_playbook(playbook, local_inventory(tmp_path), tasks_file=str(ROOT / "roles/train_unit/tasks/ports_check.yml"),
                        train_unit_run="v2", train_unit_vllm_servers=servers,
                        train_unit_vllm_units=[f"flashfleet-vllm@v2-{i}.service" for i in range(len(ports))])


def test_a_port_another_process_holds_is_refused_naming_it(tmp_path, run_playbook, listener):
    free = _free_port()
    r = _check(tmp_path, run_playbook, [free, listener])
    assert r.rc != 0
    [msg] = failure_messages(r)
    assert f"port(s) {listener} are held by another process" in msg
    assert str(free) not in msg.split("held by")[0], "a free port is not a clash"
    assert "Fix: give the run's servers free ports in flashfleet_runs.v2.vllm.servers" in msg


def test_free_ports_and_a_run_without_servers_pass(tmp_path, run_playbook):
    assert _check(tmp_path, run_playbook, [_free_port(), _free_port()]).rc == 0
    assert _check(tmp_path, run_playbook, []).rc == 0
