"""status.yml through ansible-runner: the table's rows, and that nothing is written anywhere.

No containers: one host reached with the local connection, holding fake runs under a temporary
runs root (v2 training with metrics and a checkpoint, smoke failed; `never` was never started there),
and one unreachable host (a closed port on loopback). systemd is usually not PID 1 here, so the
unit columns are whatever `systemctl show` says; the assertions do not depend on them.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from flashfleet import runstate, statustable
from flashfleet.contract import layout

from tests.conftest import ROOT
from tests.unit.test_contract import make_checkpoint


def _step(step, time):
    return {"time": time, "step": step, "epoch": 0, "loss": 1.0, "target_tokens_per_s": 12345.6,
            "drafter_rows_per_s": 42.25}


def _host(tmp_path: Path) -> tuple[Path, Path]:
    runs_root, config_root = tmp_path / "host" / "runs", tmp_path / "host" / "etc"
    config_root.mkdir(parents=True)
    v2 = runs_root / "v2"
    make_checkpoint(v2 / layout.CHECKPOINTS, 50)
    (v2 / layout.STATUS).write_text(json.dumps({"phase": "training", "step": 60, "epoch": 0,
                                                "newest_checkpoint": str(v2 / "checkpoints/step-00000050")}))
    # An earlier invocation (1 step/s) up to step 55, then a restart from step 50's checkpoint at
    # 0.5 step/s: the ETA uses only the stretch since the restart. Then an evaluation (no loss) and
    # a line cut by a write in progress, which the readers skip.
    lines = [_step(s, 1000.0 + (s - 45)) for s in range(45, 56)]
    lines += [_step(s, 2000.0 + 2 * (s - 51)) for s in range(51, 61)]
    text = "".join(json.dumps(r) + "\n" for r in lines) + json.dumps({"time": 2019.0, "step": 60, "tau": 2.5})
    (v2 / layout.METRICS).write_text(text + '\n{"time": 2020.0, "st')
    (config_root / "v2.json").write_text(json.dumps({"max_steps": 100}))
    smoke = runs_root / "smoke"
    smoke.mkdir()
    (smoke / layout.STATUS).write_text(json.dumps({"phase": "failed", "step": 7, "last_error": "CUDA out of memory"}))
    (smoke / layout.METRICS).write_text(json.dumps(_step(7, 500.0)) + "\n")
    return runs_root, config_root


def _inventory(tmp_path: Path, runs_root: Path, config_root: Path) -> Path:
    inv = tmp_path / "hosts.yml"
    inv.write_text(json.dumps({"all": {
        "vars": {"flashfleet_runs": {"v2": {"trainer": {"max_steps": 999}}, "smoke": {"trainer": {"max_steps": 10}},
                                     "never": {}}},
        "children": {"gpu_nodes": {"hosts": {
            "here": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                     "flashfleet_runs_root": str(runs_root), "flashfleet_config_root": str(config_root)},
            "gone": {"ansible_host": "127.0.0.1", "ansible_port": 9, "ansible_ssh_common_args": "-o ConnectTimeout=2"},
        }}}}}))
    return inv


def _snapshot(root: Path) -> dict:
    return {str(p): (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


@pytest.fixture
def fleet(tmp_path, run_playbook):
    runs_root, config_root = _host(tmp_path)
    runs_dir = tmp_path / "controller-runs"
    (runs_dir / "smoke" / "here").mkdir(parents=True)
    (runs_dir / "smoke" / "here" / "diagnosis.json").write_text(
        json.dumps({"verdict": "cuda-oom", "action": "fix-config", "host": "here"}))
    inventory = _inventory(tmp_path, runs_root, config_root)

    def run(**extravars):
        before = _snapshot(tmp_path / "host"), _snapshot(runs_dir)
        r = run_playbook(ROOT / "status.yml", inventory, envvars={"ANSIBLE_HOST_KEY_CHECKING": "False"},
                         flashfleet_runs_dir=str(runs_dir), **extravars)
        assert (_snapshot(tmp_path / "host"), _snapshot(runs_dir)) == before, "status.yml must write nothing"
        changed = [e for e in r.events if e.get("event") == "runner_on_ok" and e["event_data"]["res"].get("changed")]
        assert changed == []
        return r
    return run


def _rows(runner) -> list[dict]:
    for ev in runner.events:
        data = ev.get("event_data", {})
        if ev.get("event") == "runner_on_ok" and data.get("task") == "Collect the rows of every host":
            return data["res"]["ansible_facts"]["run_status_table_rows"]
    raise AssertionError("no table rows")


def _table(runner) -> list[str]:
    for ev in runner.events:
        data = ev.get("event_data", {})
        if ev.get("event") == "runner_on_ok" and data.get("task") == "Show every run on every host":
            return data["res"]["msg"]
    raise AssertionError("no table")


def test_status_shows_every_run_on_every_host(fleet):
    r = fleet()
    assert r.rc == 0, r.stdout.read()
    rows = {(row["host"], row["run"]): row for row in _rows(r)}
    assert list(rows) == [("here", "never"), ("here", "smoke"), ("here", "v2"),
                          ("gone", "never"), ("gone", "smoke"), ("gone", "v2")]
    v2 = rows["here", "v2"]
    assert (v2["phase"], v2["step"], v2["total_steps"]) == ("training", 60, 100)  # the host's v2.json, not 999
    assert v2["eta_s"] == pytest.approx(80.0)  # 40 steps left at 0.5 step/s since the restart
    assert (v2["target_tokens_per_s"], v2["drafter_rows_per_s"]) == (12345.6, 42.25)
    assert v2["newest_checkpoint"] == "step-00000050" and not v2["died"] and v2["verdict"] is None
    smoke = rows["here", "smoke"]
    assert (smoke["phase"], smoke["step"], smoke["total_steps"]) == ("failed", 7, 10)  # the inventory's
    assert smoke["died"] and (smoke["verdict"], smoke["action"]) == ("cuda-oom", "fix-config")
    assert smoke["eta_s"] is None and smoke["note"] == "CUDA out of memory"
    assert rows["here", "never"]["phase"] == "not-started" and rows["here", "never"]["verdict"] is None
    assert {rows["gone", run]["phase"] for run in ("never", "smoke", "v2")} == {"unreachable"}
    table = _table(r)
    assert table[0].split()[:3] == ["RUN", "HOST", "PHASE"]
    line = next(t for t in table if t.startswith("v2") and " here " in t)
    assert "60/100" in line and "1m20s" in line and "12,346" in line and "42.2" in line and "step-00000050" in line
    assert any(t.startswith("smoke") and "cuda-oom" in t for t in table)
    assert any(t.startswith("ETA:") for t in table)


def test_status_limits_to_one_run_and_asks_for_a_diagnosis(fleet, tmp_path):
    os.remove(tmp_path / "controller-runs" / "smoke" / "here" / "diagnosis.json")
    r = fleet(run="smoke")
    assert r.rc == 0, r.stdout.read()
    rows = _rows(r)
    assert [(row["host"], row["run"]) for row in rows] == [("here", "smoke"), ("gone", "smoke")]
    assert rows[0]["died"] and rows[0]["verdict"] == statustable.NOT_DEAD_HINT


def test_status_rejects_an_unknown_run(tmp_path, fleet):
    r = fleet(run="nope")
    assert r.rc != 0
    hosts = {e["event_data"].get("host") for e in r.events if e.get("event", "").startswith("runner_on_")}
    assert hosts == {"localhost"}


@pytest.mark.parametrize("recent,expected", [
    ([], None), ([[0, 1]], None), ([[0, 1], [10, 6]], 0.5),
    ([[0, 10], [1, 11], [5, 3], [9, 5]], 0.5),  # restart at step 3: only the stretch after it
    ([[0, 1], [0, 2]], None), ([[0, 1], ["x", 2], [4, 3]], 0.5),
])
def test_step_rate(recent, expected):
    assert statustable.step_rate(recent) == expected


def test_duration_and_died():
    assert [statustable.duration(s) for s in (None, 45, 190, 3720, 183600)] == ["?", "45s", "3m10s", "1h02m", "2d03h"]
    assert statustable.died("training", {"LoadState": "loaded", "ActiveState": "inactive"})
    assert not statustable.died("training", {})  # no systemd: status.json alone says it is alive
    assert not statustable.died("completed", {"LoadState": "loaded", "ActiveState": "inactive"})


def test_a_runs_vllm_servers_are_found_and_shown(tmp_path):
    """read_runs lists the run's server units (not another run's whose name starts alike) and
    shows each one's state; the table says how many are up and names the others."""
    calls = []
    listing = ("● flashfleet-vllm@v2-1.service loaded failed failed flashfleet vLLM server v2-1\n"
               "flashfleet-vllm@v2-0.service loaded active running flashfleet vLLM server v2-0\n"
               "flashfleet-vllm@v2-ada-0.service loaded active running flashfleet vLLM server v2-ada-0\n")

    def run(argv, timeout):
        calls.append(argv)
        if argv[1] == "list-units":
            return 0, listing, ""
        name = argv[2]
        active = "failed" if name.endswith("v2-1.service") else "active"
        return 0, f"LoadState=loaded\nActiveState={active}\nSubState=x\nNRestarts=0\n", ""

    states = runstate.read_runs(str(tmp_path), None, ["v2"], run=run)
    assert list(states["v2"]["servers"]) == ["flashfleet-vllm@v2-0.service", "flashfleet-vllm@v2-1.service"]
    assert [a for a in calls if a[1] == "list-units"][0][-1] == layout.vllm_unit_glob("v2")
    row = statustable.run_row("h", "v2", states["v2"])
    assert row["servers"] == "1/2 up; v2-1 failed"
    assert statustable.cells(row)["servers"] == "1/2 up; v2-1 failed"
    assert statustable.servers_cell({}) is None and statustable.cells(statustable._row("h", "x"))["servers"] == "-"
    # systemctl missing (no systemd here): no servers listed, not an error
    states = runstate.read_runs(str(tmp_path), None, ["v2"], run=lambda argv, t: (127, "", "systemctl: not found"))
    assert states["v2"]["servers"] == {}
