"""The classifier on real failure captures from public trackers (tests/fixtures/evidence/captures.py):
every capture's verdict, cause and action, and that the verdict rests on the quoted lines."""

from __future__ import annotations

import re
from urllib.parse import urlparse

import pytest
from flashfleet import classify as fc

from tests.conftest import ROOT
from tests.fixtures.evidence import captures

CAPTURES = {c["id"]: c for c in captures.CAPTURES}
PLACES = {"journal", "systemd", "kernel", "gpu"}


def test_the_labelled_set():
    assert len(captures.CAPTURES) == len(CAPTURES) >= 25, "ids are unique, and there are at least 25"
    assert {c["category"] for c in captures.CAPTURES} >= {"driver", "cuda", "nccl", "systemd", "import", "data", "native"}
    for c in captures.CAPTURES:
        url = urlparse(c["url"])
        assert url.scheme == "https" and url.netloc, c["id"]
        assert c["lines"] and all(where in PLACES and line.strip() for where, line in c["lines"] if line), c["id"]
        exp = c["expect"]
        assert exp["action"] in fc.ACTIONS, c["id"]
        assert exp["verdict"] in fc.VERDICTS or re.fullmatch(r"gpu-xid-\d+", exp["verdict"]), c["id"]
        assert ("cause" in exp) == (exp["verdict"] == "init-crash"), c["id"]


@pytest.mark.parametrize("cid", sorted(CAPTURES))
def test_capture_verdict(cid):
    capture = CAPTURES[cid]
    exp = capture["expect"]
    result = fc.classify(captures.build(capture))
    assert result["verdict"] == exp["verdict"], result
    assert result["action"] == exp["action"], result
    if "cause" in exp:
        assert result["cause"]["verdict"] == exp["cause"], result
    assert result["next_step"] and result["evidence"], result
    # the verdict rests on the quoted lines, not on the synthesized unit frame
    quoted = [captures.stored_message(where, line).strip()[:40] for where, line in capture["lines"] if line.strip()]
    assert any(q and q in line for q in quoted for line in result["evidence"]), result["evidence"]


def test_the_docs_list_the_counts():
    text = (ROOT / "docs" / "diagnosis.md").read_text()
    for verdict, n in captures.counts().items():
        assert f"| `{verdict}` | {n} |" in text, (verdict, n)
    assert f"{len(captures.CAPTURES)} captures" in text
