"""Which host of a multi-node run died first: the classifier orders failures by unit exit time."""

from __future__ import annotations

from flashfleet import classify


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


def test_a_restarted_host_counts_with_the_death_before_its_restart():
    """Both units restarted after the failure (Restart=on-failure): each row is `running` with the
    death before it; the earlier of those deaths went first."""
    rows = [
        {"host": "node-a", "verdict": "running", "ended_at": None,
         "previous": {"verdict": "crash", "ended_at": 1700000003.2}},
        {"host": "node-b", "verdict": "running", "ended_at": None,
         "previous": {"verdict": "killed-by-signal", "ended_at": 1700000000.9}},
        {"host": "node-c", "verdict": "running", "ended_at": None, "previous": None},
    ]
    assert classify.first_failure(rows) == {"host": "node-b", "verdict": "killed-by-signal", "ended_at": 1700000000.9}
    rows[0]["previous"]["ended_at"] = 1699999999.0
    assert classify.first_failure(rows)["host"] == "node-a"


def test_exit_times_keep_their_microseconds():
    """Units of one run fail within the same second; `--timestamp=us+utc` keeps them apart."""
    a = classify.parse_systemd_time("Mon 2026-11-30 21:03:23.120000 UTC")
    b = classify.parse_systemd_time("Mon 2026-11-30 21:03:23.870000 UTC")
    assert a is not None and b is not None and abs((b - a) - 0.75) < 1e-6


def test_a_host_that_names_another_as_first_is_never_first():
    """Clocks that disagree by a second must not make the echo the cause: a peer-failure row says
    itself that another host went first."""
    rows = [{"host": "node-a", "verdict": "peer-failure", "ended_at": 1700000000.0},
            {"host": "node-b", "verdict": "killed-by-signal", "ended_at": 1700000000.8}]
    assert classify.first_failure(rows)["host"] == "node-b"
    assert classify.first_failure(rows[:1]) is None
