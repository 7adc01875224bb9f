"""The classifier on the open-world set (tests/fixtures/evidence/captures_open_world.py): real
failure texts of kinds no other fixture set holds. The set's shape; a score that may only rise
(right never below AFTER_RIGHT_FLOOR, confident-wrong never above AFTER_CONFIDENT_WRONG_CEILING);
and one test per case, expected to fail (strictly) for the cases in KNOWN_MISSES, so that a case
the classifier learns must leave that list."""

from __future__ import annotations

import json
from urllib.parse import urlparse

import pytest
from flashfleet import classify as fc

from tests.fixtures.evidence import captures, captures_generalization, handbuilt, server_captures
from tests.fixtures.evidence import captures_open_world as ow

CASES = {c["id"]: c for c in ow.OPEN_WORLD}
PLACES = {"journal", "systemd", "kernel", "gpu"}

# The cases the classifier gets wrong (not right by ow.judge). Remove an id when it is fixed.
KNOWN_MISSES = (
    "enoent-training-annotations",
    "hf-hub-429-rate-limited",
)


def _other_ids() -> set[str]:
    ids = {c["id"] for c in captures.CAPTURES} | {c["id"] for c in captures_generalization.GENERALIZATION}
    ids |= {c["id"] for c in server_captures.SERVER_CAPTURES}
    ids |= {p.stem for p in (ow.HERE / "handbuilt").glob("*.json")}
    ids |= {name for name in dir(handbuilt) if not name.startswith("_")}
    return ids


def test_the_open_world_set():
    assert len(ow.OPEN_WORLD) == len(CASES) >= 40, "ids are unique, and there are at least 40"
    assert not set(CASES) & _other_ids(), "new cases, not another set's"
    for c in ow.OPEN_WORLD:
        url = urlparse(c["url"])
        assert url.scheme == "https" and url.netloc, c["id"]
        assert c["lines"] and all(where in PLACES and line.strip() for where, line in c["lines"]), c["id"]
        assert ow.keys(c) and all(k.strip() for k in ow.keys(c)), c["id"]
        exp = c["expect"]
        assert exp["action"] in fc.ACTIONS, c["id"]
        assert exp["verdict"] in fc.VERDICTS or exp["verdict"].startswith("gpu-xid-"), c["id"]
        assert ("cause" in exp) == (exp["verdict"] == "init-crash"), c["id"]
        if "cause" in exp:
            assert exp["cause"] in fc.VERDICTS or exp["cause"].startswith("gpu-xid-"), c["id"]
    assert set(ow.NEW_LABEL_NOTES) <= set(CASES) and set(ow.BETTER_LABELS) <= set(ow.NEW_LABEL_NOTES)
    assert set(KNOWN_MISSES) <= set(CASES) and len(set(KNOWN_MISSES)) == len(KNOWN_MISSES)


def test_the_before_score_is_recorded():
    stored = json.loads((ow.HERE / "open_world_score.json").read_text())
    assert stored["commit"] == ow.BEFORE_COMMIT
    assert (stored["right"], stored["confident_wrong"]) == (ow.BEFORE_RIGHT, ow.BEFORE_CONFIDENT_WRONG)
    assert {c["id"] for c in stored["cases"]} == set(CASES)
    assert ow.AFTER_RIGHT_FLOOR >= ow.BEFORE_RIGHT and ow.AFTER_CONFIDENT_WRONG_CEILING <= ow.BEFORE_CONFIDENT_WRONG


def test_the_score_never_falls():
    right, wrong, rows = ow.score(fc)
    assert right >= ow.AFTER_RIGHT_FLOOR, [c["id"] for c, _r, ok, _w in rows if not ok]
    assert wrong <= ow.AFTER_CONFIDENT_WRONG_CEILING, [c["id"] for c, _r, _ok, w in rows if w]


@pytest.mark.parametrize("cid", [pytest.param(cid, marks=pytest.mark.xfail(strict=True, reason="known miss"))
                                 if cid in KNOWN_MISSES else cid for cid in sorted(CASES)])
def test_open_world_case(cid):
    capture = CASES[cid]
    result = fc.classify(ow.build(capture))
    right, _wrong = ow.judge(capture, result, fc.VERDICTS)
    assert right, (capture["expect"], result["verdict"], result.get("cause"), result["action"], result["reason"])
