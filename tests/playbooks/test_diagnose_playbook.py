"""diagnose.yml through ansible-runner: assertions on the play's events and artifacts.

No containers: one host reached with the local connection (this machine, where systemd is usually
not PID 1, so its verdict is whatever the evidence proves) and one unreachable host (a closed
port on loopback: tests never send traffic off this machine). The Molecule `faults` scenario covers real units.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


def _inventory(tmp_path: Path) -> Path:
    inv = tmp_path / "hosts.yml"
    inv.write_text(json.dumps({"all": {
        "vars": {"flashfleet_runs": {"v2": {}, "smoke": {}}},
        "children": {"gpu_nodes": {"hosts": {
            "here": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
            "gone": {"ansible_host": "127.0.0.1", "ansible_port": 9, "ansible_ssh_common_args": "-o ConnectTimeout=2"},
        }}}}}))
    return inv


@pytest.fixture
def run_diagnose(tmp_path, run_playbook):
    def run(**extravars):
        return run_playbook(ROOT / "diagnose.yml", _inventory(tmp_path),
                            envvars={"ANSIBLE_HOST_KEY_CHECKING": "False"}, **extravars)
    return run


def _facts(runner, task: str) -> dict:
    out = {}
    for ev in runner.events:
        data = ev.get("event_data", {})
        if ev.get("event") == "runner_on_ok" and data.get("task") == task:
            out[data["host"]] = data["res"].get("ansible_facts", {})
    return out


def test_diagnose_writes_evidence_and_survives_an_unreachable_host(tmp_path, run_diagnose):
    runs = tmp_path / "runs"
    r = run_diagnose(run="v2", flashfleet_runs_dir=str(runs))
    assert r.rc == 0, r.stdout.read()
    rows = _facts(r, "Record this host's row for the summary")
    assert set(rows) == {"here", "gone"}
    assert rows["gone"]["run_diagnosis_result"]["verdict"] == "unreachable"
    here = rows["here"]["run_diagnosis_result"]
    evidence = json.loads((runs / "v2" / "here" / "evidence.json").read_text())
    diagnosis = json.loads((runs / "v2" / "here" / "diagnosis.json").read_text())
    assert evidence["schema"] == 1 and evidence["run"] == "v2"
    assert diagnosis["verdict"] == here["verdict"]
    assert not (runs / "v2" / "gone").exists()
    summary = json.loads((runs / "v2" / "summary.json").read_text())
    assert [h["host"] for h in summary["hosts"]] == ["here", "gone"]


@pytest.mark.parametrize("extra,needle", [({}, "no run given"), ({"run": "nope"}, 'unknown run "nope"')])
def test_diagnose_rejects_a_missing_or_unknown_run(tmp_path, run_diagnose, extra, needle):
    r = run_diagnose(flashfleet_runs_dir=str(tmp_path / "runs"), **extra)
    assert r.rc != 0
    failed = [e["event_data"]["res"]["msg"] for e in r.events if e.get("event") == "runner_on_failed"]
    assert len(failed) == 1 and needle in failed[0] and "known runs: smoke, v2" in failed[0]
    hosts = {e["event_data"].get("host") for e in r.events if e.get("event", "").startswith("runner_on_")}
    assert hosts == {"localhost"}, "no host may be touched before the run name is valid"
    assert not (tmp_path / "runs").exists()
