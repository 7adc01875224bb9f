"""tests/stages.sh's tiers: `make test` (the gate CI runs) and `make test-full` (the gate plus the
scenarios that run nightly). Every Molecule scenario runs in the full tier exactly once, the gate
is a part of it, and a scenario directory that no stage list names, or a tier of another name,
fails before anything runs."""

import os
import subprocess

from tests.conftest import ROOT

SCENARIOS = sorted(p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml"))


def _stages(tier: str) -> tuple[list[str], list[str]]:
    out = subprocess.run(["bash", "tests/stages.sh"], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "TEST_TIER": tier, "TEST_LIST": "1"}).stdout
    lanes = dict(line.split(": ", 1) for line in out.splitlines())
    return lanes["lane 1"].split(","), lanes["lane 2"].split(",")


def test_the_full_tier_runs_every_scenario_once_and_the_gate_is_part_of_it():
    full1, full2 = _stages("full")
    gate1, gate2 = _stages("gate")
    full = full1 + full2
    assert sorted(s.removeprefix("molecule ") for s in full if s.startswith("molecule ")) == SCENARIOS
    assert len(full) == len(set(full))
    assert set(gate1 + gate2) < set(full) and {"lint", "pytest"} <= set(gate1)
    # the order each lane depends on: lint first; kernel before driver (its .debs); vllm after pytest
    assert full1[0] == gate1[0] == "lint"
    assert full2.index("molecule kernel") < full2.index("molecule driver")
    assert full1.index("pytest") < full1.index("molecule vllm")


def test_a_scenario_in_no_stage_list_is_refused(tmp_path):
    tree = tmp_path / "tree"
    (tree / "tests").mkdir(parents=True)
    (tree / "tests" / "stages.sh").write_text((ROOT / "tests" / "stages.sh").read_text())
    for name in SCENARIOS + ["newone"]:
        (tree / "molecule" / name).mkdir(parents=True)
        (tree / "molecule" / name / "molecule.yml").write_text("---\n")
    res = subprocess.run(["bash", "tests/stages.sh"], cwd=tree, capture_output=True, text=True,
                         env={**os.environ, "TEST_LIST": "1"})
    assert res.returncode == 2 and "scenario 'newone' is in no stage list" in res.stderr, res.stderr
    assert res.stdout == ""


def test_an_unknown_tier_is_refused_naming_the_tiers():
    res = subprocess.run(["bash", "tests/stages.sh"], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "TEST_TIER": "nightly", "TEST_LIST": "1"})
    assert res.returncode == 2 and "unknown TEST_TIER 'nightly'" in res.stderr and "gate or full" in res.stderr
    assert res.stdout == ""
