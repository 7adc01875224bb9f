"""collect.yml through ansible-runner: files land in runs/<run>/<host>/, a second run adds only what is new."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest
from flashfleet.contract import checkpoint

from tests.conftest import ROOT

pytest.importorskip("matplotlib")


def _host_output(tmp_path: Path) -> Path:
    out = tmp_path / "host-out"
    ck = out / "checkpoints" / "step-00000002"  # a complete checkpoint, as the trainer writes one
    ck.mkdir(parents=True)
    header = json.dumps({"w": {"dtype": "F32", "shape": [25], "data_offsets": [0, 100]}}).encode()
    (ck / checkpoint.WEIGHTS).write_bytes(struct.pack("<Q", len(header)) + header + b"x" * 100)
    (ck / checkpoint.CONFIG).write_text("{}")
    (ck / checkpoint.STATE).write_bytes(b"s" * 10)
    checkpoint.write_manifest(str(ck), 2)
    (out / "status.json").write_text(json.dumps({"phase": "training", "step": 2, "ready": True}))
    (out / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "loss": 2.0 / s, "ce": 1.5 / s, "kl": 0.5 / s, "lr": 1e-4 * s, "noise": 0.1,
                    "acc": [0.8, 0.6], "accept_proxy": 1.5, "target_tokens_per_s": 900.0,
                    "drafter_rows_per_s": 30.0, "peak_mem_bytes": 2**28}) + "\n" for s in (1, 2)))
    return out


def _run(tmp_path: Path, out: Path, run_playbook):
    inv = tmp_path / "hosts.yml"
    inv.write_text(json.dumps({"all": {"vars": {"flashfleet_runs": {"v2": {}}}, "children": {"gpu_nodes": {"hosts": {
        "here": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}}}))
    return run_playbook(ROOT / "collect.yml", inv, run="v2", flashfleet_runs_dir=str(tmp_path / "runs"),
                        run_collect_output_dir=str(out), run_collect_use_rsync="false")


def _changed(runner) -> dict[str, bool]:
    return {e["event_data"]["task"]: e["event_data"]["res"].get("changed", False)
            for e in runner.events if e.get("event") == "runner_on_ok" and e["event_data"].get("host") == "here"}


def test_collect_fetches_then_adds_only_new(tmp_path, run_playbook):
    out = _host_output(tmp_path)
    first = _run(tmp_path, out, run_playbook)
    assert first.rc == 0, first.stdout.read()
    home = tmp_path / "runs" / "v2" / "here"
    for name in ("metrics.jsonl", "status.json", "journal.json", "diagnosis.json", "evidence.json",
                 "checkpoints/step-00000002/manifest.json"):
        assert (home / name).is_file(), name
    assert not (home / "checkpoints" / "step-00000002" / checkpoint.WEIGHTS).exists(), "checkpoints only on request"
    report = (tmp_path / "runs" / "v2" / "report.html").read_text()
    assert report.count("data:image/png;base64,") >= 5
    c1 = _changed(first)
    assert c1["Fetch status.json"] and c1["Fetch metrics.jsonl (no rsync on one end)"]

    with (out / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 3, "loss": 0.5}) + "\n")
    second = _run(tmp_path, out, run_playbook)
    assert second.rc == 0
    c2 = _changed(second)
    assert not c2["Fetch status.json"], "unchanged files are not fetched again"
    assert c2["Fetch metrics.jsonl (no rsync on one end)"]
    assert (home / "metrics.jsonl").read_text().count("\n") == 3
