"""Recorded real faults the classifier is known to get wrong (gaps.json), and what the recorded
fixtures say happens next (expected.json's `next_has`).

gaps.json holds, per recorded fixture, the diagnosis a maintainer would give (`verdict`, and
optionally `cause`, `action`, `reason_has`, `next_has`) and what the classifier says today (`says`).
Each is a strict expected failure: once the classifier gets one right the test fails, and the
entry moves to expected.json (and its fault in molecule/faults loses its `gap`).
"""

from __future__ import annotations

import json

import pytest
from flashfleet import classify as fc

from tests.conftest import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "evidence"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
GAPS = json.loads((FIXTURES / "gaps.json").read_text())


def diagnose(name: str) -> dict:
    return fc.classify(json.loads((FIXTURES / name).read_text()))


def mismatches(want: dict, got: dict) -> list[str]:
    """What of `want` the diagnosis `got` does not say."""
    out = []
    if got["verdict"] != want["verdict"]:
        out.append(f"verdict {got['verdict']!r}, not {want['verdict']!r}")
    if "cause" in want and (got.get("cause") or {}).get("verdict") != want["cause"]:
        out.append(f"cause {(got.get('cause') or {}).get('verdict')!r}, not {want['cause']!r}")
    if "action" in want and got["action"] != want["action"]:
        out.append(f"action {got['action']!r}, not {want['action']!r}")
    if "reason_has" in want and want["reason_has"] not in got["reason"]:
        out.append(f"reason {got['reason']!r} lacks {want['reason_has']!r}")
    if "next_has" in want and want["next_has"] not in (got.get("next_step") or ""):
        out.append(f"next step {got.get('next_step')!r} lacks {want['next_has']!r}")
    return out


def test_gaps_are_recorded_fixtures_not_also_expected():
    for name, want in GAPS.items():
        assert name.startswith("recorded/") and (FIXTURES / name).is_file(), name
        assert name not in EXPECTED, f"{name} is in both gaps.json and expected.json"
        assert want.get("gap") and want.get("says"), f"{name}: say what is wrong and what the classifier says"


@pytest.mark.parametrize("name", sorted(GAPS))
@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="a known gap of the classifier (gaps.json); once fixed, move it to expected.json",
)
def test_known_gap(name):
    assert mismatches(GAPS[name], diagnose(name)) == []


@pytest.mark.parametrize("name", sorted(n for n, want in EXPECTED.items() if "next_has" in want))
def test_recorded_next_step(name):
    assert mismatches(EXPECTED[name], diagnose(name)) == []
