"""Ansible ships module_utils/flashfleet with the modules that import it: a host needs nothing of
the project installed. Shown with a real play whose "host" is this machine's system Python, which
has no flashfleet package (the evidence module gathers from a checkpoint written by the trainer's
own contract code)."""

import json
import shutil
import subprocess

import pytest
from flashfleet.contract import checkpoint, layout

from tests.conftest import ROOT
from tests.unit.test_contract import make_checkpoint

SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin")


@pytest.mark.skipif(SYSTEM_PYTHON is None, reason="no /usr/bin/python3 on this machine")
def test_evidence_module_runs_on_a_python_without_the_project(tmp_path, run_playbook, monkeypatch):
    # A PYTHONPATH that names module_utils (a checkout's working environment) would hand the
    # system Python the package this test shows it does not need.
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert subprocess.run([SYSTEM_PYTHON, "-c", "import flashfleet"], capture_output=True).returncode != 0, \
        "the system Python has flashfleet installed: this test would prove nothing"
    out = tmp_path / "runs" / "r1"
    make_checkpoint(out / layout.CHECKPOINTS, 3)
    (out / layout.STATUS).write_text(json.dumps({"phase": "training", "step": 3}))
    play = tmp_path / "play.yml"
    play.write_text(json.dumps([{"hosts": "all", "gather_facts": False, "tasks": [
        {"flashfleet_evidence": {"run": "r1", "output_dir": str(out), "config_dir": str(tmp_path / "etc"),
                                 "venv": str(tmp_path / "venv"), "lock": str(tmp_path / "lock")},
         "register": "gathered"},
        {"ansible.builtin.copy": {"content": "{{ gathered.evidence | to_json }}", "dest": str(tmp_path / "ev.json"),
                                  "mode": "0644"}}]}]))
    inv = tmp_path / "hosts.json"
    inv.write_text(json.dumps({"all": {"hosts": {"here": {"ansible_connection": "local",
                                                          "ansible_python_interpreter": SYSTEM_PYTHON}}}}))
    r = run_playbook(play, inv, envvars={"ANSIBLE_LIBRARY": str(ROOT / "roles/run_diagnosis/library")})
    assert r.status == "successful", [e.get("stdout") for e in r.events if e.get("event") == "runner_on_failed"]
    evidence = json.loads((tmp_path / "ev.json").read_text())
    assert evidence["checkpoints"]["newest"]["name"] == checkpoint.step_dir_name(3)
    assert evidence["status"]["data"]["phase"] == "training"
