"""A playbook test leaves the pytest process as it found it: run_playbook runs ansible-runner in a
child process, so Ansible is never imported here (its import patches sys.intern, which torch's
compiler then refuses) and ansible_runner.run's SIGINT/SIGTERM handlers are never installed here.
tests/conftest.py checks every test for Ansible left imported; this checks run_playbook itself."""

from __future__ import annotations

import json
import signal
import sys

from tests.conftest import local_inventory


def test_a_playbook_run_leaves_no_ansible_and_no_signal_handlers_in_the_pytest_process(tmp_path, run_playbook):
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    intern = sys.intern
    playbook = tmp_path / "p.yml"
    playbook.write_text(json.dumps([{"hosts": "all", "gather_facts": False, "tasks": [
        {"ansible.builtin.command": {"argv": ["true"]}}, {"ansible.builtin.debug": {"msg": "{{ 1 + 1 }} done"}}]}]))
    r = run_playbook(playbook, local_inventory(tmp_path))
    assert r.rc == 0 and r.status == "successful", r.stdout.read()
    assert [ev["event_data"]["res"]["msg"] for ev in r.events if ev.get("event") == "runner_on_ok"
            and ev["event_data"]["task_action"] == "ansible.builtin.debug"] == ["2 done"]
    assert not [m for m in sys.modules if m == "ansible" or m.startswith("ansible.")]
    assert sys.intern is intern and type(sys.intern).__name__ == "builtin_function_or_method"
    assert {s: signal.getsignal(s) for s in handlers} == handlers
