"""The GPU health plays on this machine (local connection), with stand-in `nvidia-smi`, `dcgmi` and
`journalctl` on PATH that print the recorded outputs (tests/fixtures/gpu_health) and a stand-in
trainer python that prints the recorded probe:

- gpu_check.yml passes a healthy host and fails (quarantining the GPU, evidence beside it) on a Xid
  since boot;
- diagnose's GPU action (run_diagnosis tasks/quarantine.yml) quarantines the GPU its verdict names;
  train.yml's GPU step (gpu_health preflight, which train_unit's preflight includes) then refuses a
  run on it, naming it, why and how to clear it; `clear_quarantine` re-runs the check and releases
  it; the next launch passes, and again without a change (idempotent);
- status.yml's step prints the quarantined GPUs.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest
import yaml

from tests.conftest import ROOT, failure_messages, local_inventory, role_play
from tests.unit.test_gpu_health import UUID0, UUID1, XID79

FIX = ROOT / "tests/fixtures/gpu_health"


@pytest.fixture
def host(tmp_path):
    """A stand-in GPU host: bin/ with the stand-ins, rec/ with what they print, runs/ the runs root."""
    rec, bin_dir = tmp_path / "rec", tmp_path / "bin"
    shutil.copytree(FIX, rec, ignore=shutil.ignore_patterns("README.md"))
    bin_dir.mkdir()
    stands = {
        # -q: the report; --query-gpu=index (train_unit's count): one index per GPU of the report
        "nvidia-smi": f'if [ "$1" = -q ]; then cat {rec}/nvidia-smi-q.txt; '
                      f'else grep -c "^GPU " {rec}/nvidia-smi-q.txt | xargs seq 0 1 | head -n -1; fi',
        "dcgmi": f"cat {rec}/dcgmi-diag.txt",
        "journalctl": f"cat {rec}/kernel-log.txt",
        "python": f"cat {rec}/probe.json",
    }
    for name, body in stands.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return {"rec": rec, "bin": bin_dir, "runs": tmp_path / "runs", "tmp": tmp_path}


def _env(host) -> dict:
    return {"PATH": f"{host['bin']}{os.pathsep}{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}"}


def _quarantined(host) -> dict:
    path = host["runs"] / ".gpu-health" / "quarantine.json"
    return json.loads(path.read_text())["quarantined"] if path.exists() else {}


def _gpu_check(host, run_playbook, **extra):
    return run_playbook(ROOT / "gpu_check.yml", local_inventory(host["tmp"]), envvars=_env(host),
                        flashfleet_hosts="all", ansible_become=False, gpu_health_runs_root=str(host["runs"]),
                        gpu_health_python=str(host["bin"] / "python"), **extra)


def _msgs(r, task: str) -> list:
    return [ev["event_data"]["res"].get("msg") for ev in r.events
            if ev.get("event") == "runner_on_ok" and ev["event_data"].get("task") == task]


def test_gpu_check_passes_a_healthy_host_and_prints_a_row_per_gpu(host, run_playbook):
    r = _gpu_check(host, run_playbook, level=1)
    assert r.rc == 0, failure_messages(r)
    [lines] = _msgs(r, "Show one row per GPU")
    assert lines[0] == f"GPU 0 {UUID0} NVIDIA H100 80GB HBM3: OK" and lines[1].startswith(f"GPU 1 {UUID1}")
    assert "2 GPU(s), level 1" in lines[-1] and "0 quarantined" in lines[-1]
    assert _quarantined(host) == {}


def test_gpu_check_quarantines_a_gpu_with_a_xid_since_boot(host, run_playbook):
    with open(host["rec"] / "kernel-log.txt", "a") as f:
        f.write(XID79 + "\n")
    r = _gpu_check(host, run_playbook, level=1)
    assert r.rc != 0
    [msg] = failure_messages(r)
    assert f"GPU 0 {UUID0} NVIDIA H100 80GB HBM3: FAIL: Xid: 1 since boot needing reboot-node" in msg
    held = _quarantined(host)
    assert list(held) == [UUID0] and os.path.exists(held[UUID0]["evidence"])


def _play(host, name: str, tasks_from: str, role: str = "gpu_health", **role_vars):
    return role_play(host["tmp"], role, tasks_from, role_vars, name=name)


def _preflight(host, run_playbook, **extra):
    play = _play(host, "preflight.yml", "preflight", gpu_health_run="v2", gpu_health_gpus=[0, 1],
                 gpu_health_runs_root=str(host["runs"]), gpu_health_python=str(host["bin"] / "python"))
    return run_playbook(play, local_inventory(host["tmp"]), envvars=_env(host), **extra)


def test_a_diagnosed_xid_quarantines_the_gpu_and_the_next_launch_is_refused_until_cleared(host, run_playbook):
    diagnosis = {"verdict": "gpu-xid-79", "action": "reboot-node", "pci": "0000:2a:00",
                 "reason": "NVIDIA Xid 79 (GPU has fallen off the bus) on GPU 0000:2a:00",
                 "xids": [{"code": 79, "pci": "0000:2a:00", "action": "reboot-node"}]}
    play = _play(host, "diagnosed.yml", "quarantine.yml", role="run_diagnosis", run_diagnosis_run="v2",
                 run_diagnosis_runs_dir=str(host["tmp"] / "home"), run_diagnosis_diagnosis=diagnosis,
                 gpu_health_runs_root=str(host["runs"]))
    r = run_playbook(play, local_inventory(host["tmp"]), envvars=_env(host), ansible_become=False)
    assert r.rc == 0, failure_messages(r)
    held = _quarantined(host)
    assert list(held) == [UUID1] and held[UUID1]["source"] == "diagnose" and held[UUID1]["action"] == "reboot-node"
    assert held[UUID1]["evidence"].endswith("home/v2/here/evidence.json (on the controller)")

    refused = _preflight(host, run_playbook)
    assert refused.rc != 0
    [msg] = failure_messages(refused)
    assert f"here: run v2 uses quarantined GPU(s): GPU 1 {UUID1} (00000000:2A:00.0): gpu-xid-79: NVIDIA Xid 79" in msg
    assert f"-e run=v2 -e clear_quarantine={UUID1}` (the check runs again first" in msg

    cleared = _preflight(host, run_playbook, gpu_health_clear=UUID1)
    assert cleared.rc == 0, failure_messages(cleared)
    assert _quarantined(host) == {}
    [shown] = _msgs(cleared, "Show the run's GPU health")
    assert shown[-1].startswith("GPU health of run v2: 2 GPU(s) in ") and shown[-1].endswith(f"released {UUID1}")

    again = _preflight(host, run_playbook)
    assert again.rc == 0, failure_messages(again)
    assert not [ev for ev in again.events if ev.get("event") == "runner_on_ok" and ev["event_data"]["res"].get("changed")]


def test_a_gpu_action_for_a_gpu_the_host_lacks_quarantines_nothing(host, run_playbook):
    diagnosis = {"verdict": "crash", "action": "investigate", "reason": "a Python exception", "xids": []}
    play = _play(host, "crash.yml", "quarantine.yml", role="run_diagnosis", run_diagnosis_run="v2",
                 run_diagnosis_runs_dir=str(host["tmp"]), run_diagnosis_diagnosis=diagnosis,
                 gpu_health_runs_root=str(host["runs"]))
    assert run_playbook(play, local_inventory(host["tmp"]), envvars=_env(host), ansible_become=False).rc == 0
    assert _quarantined(host) == {}, "a verdict without a GPU action quarantines nothing"


def test_status_shows_the_quarantined_gpus(host, run_playbook):
    from flashfleet.contract import quarantine

    quarantine.record(str(host["runs"] / ".gpu-health" / "quarantine.json"), UUID0, "gpu-xid-48: DBE", "diagnose",
                      "runs/v2/here/evidence.json", action="reset-gpu")
    playbook = host["tmp"] / "status.yml"
    playbook.write_text(yaml.safe_dump([
        {"hosts": "all", "gather_facts": False, "tasks": [{"ansible.builtin.include_role": {
            "name": "gpu_health", "tasks_from": "read"}, "vars": {"gpu_health_runs_root": str(host["runs"])}}]},
        {"hosts": "all", "gather_facts": False, "tasks": [{"ansible.builtin.include_role": {
            "name": "gpu_health", "tasks_from": "summary"}, "vars": {"gpu_health_hosts": ["here"]}}]}]))
    r = run_playbook(playbook, local_inventory(host["tmp"]), envvars=_env(host))
    assert r.rc == 0, failure_messages(r)
    [lines] = _msgs(r, "Show the quarantined GPUs of every host")
    assert lines == [f"here: {UUID0}: gpu-xid-48: DBE [diagnose, action reset-gpu, since "
                     f"{lines[0].split('since ')[1].split(',')[0]}, evidence runs/v2/here/evidence.json]"]


def test_train_units_preflight_runs_the_gpu_step_on_the_runs_gpus():
    tasks = yaml.safe_load((ROOT / "roles/train_unit/tasks/preflight.yml").read_text())
    [step] = [t for t in tasks if t.get("ansible.builtin.include_role", {}).get("name") == "gpu_health"]
    assert step["ansible.builtin.include_role"]["tasks_from"] == "preflight"
    assert step["vars"]["gpu_health_gpus"] == "{{ train_unit_gpu_wanted | unique | sort }}"
    assert step["when"] == "train_unit_gpu_wanted | length > 0"
    count = next(i for i, t in enumerate(tasks) if t.get("name") == "Check the topology's GPUs exist")
    assert tasks.index(step) > count, "the GPUs are counted before they are checked"
