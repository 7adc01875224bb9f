"""Hypervisor reboots: one host at a time, and never a busy host unless forced.

The drain check (roles/kernel/tasks/drain.yml) runs for real against this machine with the local
connection; `systemctl` and `pct` are fakes on PATH (a shell script each, reading what they print
from the test's files), because this machine has no Proxmox and no run to find. The reboot itself
cannot run here (no machine to reboot): the test reads the role's task to check it is throttled to
one host and comes after the drain check.
"""

from __future__ import annotations

import os

import pytest
import yaml

from tests.conftest import ROOT, failure_messages, local_inventory, role_play


@pytest.fixture
def busy(tmp_path, monkeypatch):
    """Fake systemctl/pct: write units.txt / pct.txt to make the host busy."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, data in (("systemctl", "units.txt"), ("pct", "pct.txt")):
        tool = bin_dir / name
        tool.write_text(f"#!/bin/sh\ncat {tmp_path / data} 2>/dev/null\nexit 0\n")
        tool.chmod(0o755)
    (tmp_path / "pct.txt").write_text("VMID       Status     Lock         Name\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


def _drain(tmp_path, run_playbook, **extravars):
    playbook = role_play(tmp_path, "kernel", "drain", {"kernel_release": "6.12.48-ff"})
    return run_playbook(playbook, local_inventory(tmp_path, "pve1"), **extravars)


def test_an_idle_host_may_reboot(busy, run_playbook):
    (busy / "pct.txt").write_text("VMID       Status     Lock         Name\n200        stopped                 ct200\n")
    r = _drain(busy, run_playbook)
    assert r.rc == 0, failure_messages(r)


@pytest.mark.parametrize("units, guests, needle", [
    ("flashfleet-train@v2.service loaded active running flashfleet DFlash training run v2\n", "",
     "active runs: flashfleet-train@v2.service"),
    ("", "200        running                 ct200\n201        stopped                 ct201\n",
     "running guests: CT 200"),
])
def test_a_busy_host_is_refused_unless_forced(busy, run_playbook, units, guests, needle):
    (busy / "units.txt").write_text(units)
    (busy / "pct.txt").write_text("VMID       Status     Lock         Name\n" + guests)
    r = _drain(busy, run_playbook)
    assert r.rc != 0
    (msg,) = failure_messages(r)
    assert msg.startswith("pve1: not rebooted into 6.12.48-ff: it is busy (") and needle in msg, msg
    assert "CT 201" not in msg
    assert "-e force_reboot=true" in msg and "stop.yml -e run=NAME" in msg

    r = _drain(busy, run_playbook, force_reboot=True)
    assert r.rc == 0, failure_messages(r)


def test_the_reboot_is_one_host_at_a_time_after_the_drain_check():
    tasks = yaml.safe_load((ROOT / "roles/kernel/tasks/install.yml").read_text())
    (reboot_block,) = [t for t in tasks if t.get("name") == "Reboot into the new kernel"]
    names = [t["name"] for t in reboot_block["block"]]
    reboot = next(t for t in reboot_block["block"] if "ansible.builtin.reboot" in t)
    drain = next(t for t in reboot_block["block"] if t.get("ansible.builtin.include_tasks") == "drain.yml")
    assert reboot["throttle"] == 1
    assert names.index(drain["name"]) < names.index(reboot["name"])
    assert drain["when"] == reboot["when"]
