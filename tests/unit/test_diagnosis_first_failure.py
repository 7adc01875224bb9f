"""Which host of a multi-node run died first: the classifier orders failures by unit exit time."""

from __future__ import annotations

from tests.conftest import ROOT, load_file

classify = load_file(ROOT / "roles/run_diagnosis/files/flashfleet_classify.py")


def test_the_earliest_failed_exit_goes_first_whatever_the_row_order():
    rows = [
        {"host": "node-a", "verdict": "crash", "ended_at": 1700000030.0},
        {"host": "node-b", "verdict": "killed-by-signal", "ended_at": 1700000001.5},
        {"host": "node-c", "verdict": "running", "ended_at": 1690000000.0},
    ]
    assert classify.first_failure(rows) == {"host": "node-b", "verdict": "killed-by-signal", "ended_at": 1700000001.5}
    assert classify.first_failure(list(reversed(rows)))["host"] == "node-b"


def test_no_failure_or_no_exit_time_means_no_answer():
    assert classify.first_failure([{"host": "a", "verdict": "running", "ended_at": 1.0},
                                   {"host": "b", "verdict": "completed", "ended_at": 2.0}]) is None
    assert classify.first_failure([{"host": "a", "verdict": "crash", "ended_at": None}]) is None


def test_classify_reports_the_units_exit_time():
    evidence = {"run": "r", "host": "h", "unit_props": {"readable": True, "properties": {
        "LoadState": "loaded", "ActiveState": "failed", "SubState": "failed", "Result": "signal",
        "ExecMainCode": "2", "ExecMainStatus": "9",
        "ExecMainStartTimestamp": "Mon 2026-11-30 18:00:00 UTC",
        "ExecMainExitTimestamp": "Mon 2026-11-30 18:05:00 UTC"}}}
    result = classify.classify(evidence)
    assert result["ended_at"] == classify.parse_systemd_time("Mon 2026-11-30 18:05:00 UTC")
    assert result["ended_at"] is not None
