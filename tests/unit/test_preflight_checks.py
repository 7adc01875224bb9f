"""preflight.CHECKS is the order of the start's checks, and docs/trainer.md lists that order: the
list between its markers equals the tuple (name and the first line of each check's docstring), so a
check added, moved or renamed in only one of them fails here. Every check is small (at most 40
lines) and documented; `preflight` only runs the tuple."""

from __future__ import annotations

import inspect
import re

from flashfleet_trainer import preflight as pf

from tests.conftest import ROOT

DOC = ROOT / "docs" / "trainer.md"


def _documented() -> list[tuple[str, str]]:
    text = DOC.read_text()
    block = text.split("<!-- preflight-checks:begin")[1].split("<!-- preflight-checks:end -->")[0]
    return re.findall(r"^\d+\. `(\w+)`: (.+)$", block, re.M)


def test_the_docs_list_the_checks_in_their_order():
    expected = [(c.__name__, c.__doc__.strip().splitlines()[0]) for c in pf.CHECKS]
    assert _documented() == expected, "docs/trainer.md's preflight list differs from preflight.CHECKS: update it"


def test_each_check_is_small_and_says_what_it_checks():
    for check in pf.CHECKS:
        lines = len(inspect.getsource(check).splitlines())
        assert lines <= 40, f"{check.__name__} is {lines} lines: split it"
        assert check.__doc__, f"{check.__name__} has no docstring"
        assert list(inspect.signature(check).parameters) == ["cfg", "f"]


def test_preflight_only_runs_the_tuple():
    assert len(inspect.getsource(pf.preflight).splitlines()) < 20
