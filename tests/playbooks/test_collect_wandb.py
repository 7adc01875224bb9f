"""collect.yml brings the offline W&B runs home (real wandb, offline mode: two starts of one run
id), and refuses `-e wandb_sync=true` in one line when the controller has no W&B credentials."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from flashfleet.contract import layout

from tests.conftest import ROOT, failure_messages

pytest.importorskip("matplotlib")
pytest.importorskip("wandb")

RUN_ID = "v2-0123456789ab"


def _offline_starts(out: Path, tmp_path: Path) -> None:
    """Two starts of the run, as the trainer makes them: wandb.init(id=..., resume='allow') offline."""
    code = textwrap.dedent(f"""
        import wandb
        run = wandb.init(project="flashfleet-test", id={RUN_ID!r}, resume="allow", dir={str(out)!r})
        run.log({{"loss": 1.0}}, step=1)
        run.finish()
    """)
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONSOLE": "off",
           "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"), "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache")}
    for _ in range(2):
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)


def test_collect_brings_offline_wandb_runs_home(tmp_path, run_playbook):
    out = tmp_path / "host-out"
    out.mkdir()
    (out / layout.STATUS).write_text(json.dumps({"phase": "completed", "step": 1, "ready": True}))
    (out / layout.RUN_STATE).write_text(json.dumps({"invocation": 2, "wandb_id": RUN_ID, "created": "x"}))
    _offline_starts(out, tmp_path)
    there = sorted(p.name for p in (out / layout.WANDB).glob("offline-run-*"))
    assert len(there) == 2 and all(n.endswith(RUN_ID) for n in there)

    inv = tmp_path / "hosts.yml"
    inv.write_text(json.dumps({"all": {"vars": {"flashfleet_runs": {"v2": {}}}, "children": {"gpu_nodes": {"hosts": {
        "here": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}}}))
    home = tmp_path / "runs" / "v2" / "here"
    env = {"HOME": str(tmp_path / "home"), "WANDB_API_KEY": ""}
    (tmp_path / "home").mkdir()
    runner = run_playbook(ROOT / "collect.yml", inv, envvars=env, run="v2", flashfleet_runs_dir=str(tmp_path / "runs"),
                          run_collect_output_dir=str(out), run_collect_use_rsync="false")
    assert runner.rc == 0, runner.stdout.read()
    assert sorted(p.name for p in (home / layout.WANDB).glob("offline-run-*")) == there
    for name in there:
        assert (home / layout.WANDB / name / f"run-{RUN_ID}.wandb").read_bytes() == \
            (out / layout.WANDB / name / f"run-{RUN_ID}.wandb").read_bytes()
    assert json.loads((home / layout.RUN_STATE).read_text())["wandb_id"] == RUN_ID

    runner = run_playbook(ROOT / "collect.yml", inv, envvars=env, run="v2", flashfleet_runs_dir=str(tmp_path / "runs"),
                          run_collect_output_dir=str(out), run_collect_use_rsync="false", wandb_sync=True)
    assert runner.rc != 0
    said = [e["event_data"]["res"]["msg"] for e in runner.events if e.get("event") == "runner_on_ok"
            and e["event_data"].get("task") == "Say which offline W&B runs will be synced"]
    assert said == ["wandb sync: " + ", ".join(there) + " "], said  # the run is over: every start
    msgs = failure_messages(runner)
    assert any("wandb_sync=true needs W&B credentials" in m and "WANDB_API_KEY" in m for m in msgs), msgs
