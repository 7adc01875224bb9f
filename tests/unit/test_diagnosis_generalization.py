"""The classifier on failures it was not written for (tests/fixtures/evidence/captures_generalization.py,
issue 40): every capture's verdict, cause and action, that the verdict rests on a quoted line, that
the gatherer keeps every quoted kernel line, and the rules the set taught (the trainer's own error
line, "unrecognised failure", systemd's clean-exit signals)."""

from __future__ import annotations

from urllib.parse import urlparse

import pytest
from flashfleet import classify as fc
from flashfleet import evidence as fe
from flashfleet.contract import messages

from tests.conftest import ROOT
from tests.fixtures.evidence import captures
from tests.fixtures.evidence import captures_generalization as gen

CASES = {c["id"]: c for c in gen.GENERALIZATION}
PLACES = {"journal", "systemd", "kernel", "gpu"}


def test_the_generalization_set():
    assert len(gen.GENERALIZATION) == len(CASES) >= 40, "ids are unique, and there are at least 40"
    assert not set(CASES) & {c["id"] for c in captures.CAPTURES}, "new cases, not the written-from set's"
    for c in gen.GENERALIZATION:
        url = urlparse(c["url"])
        assert url.scheme == "https" and url.netloc, c["id"]
        assert c["lines"] and all(where in PLACES and line.strip() for where, line in c["lines"]), c["id"]
        exp = c["expect"]
        assert exp["action"] in fc.ACTIONS, c["id"]
        assert exp["verdict"] in fc.VERDICTS or exp["verdict"].startswith("gpu-xid-"), c["id"]
        assert ("cause" in exp) == (exp["verdict"] == "init-crash"), c["id"]
    # the vocabulary the set needed is the classifier's now
    assert set(gen.NEW_VERDICTS) <= set(fc.VERDICTS) and set(gen.NEW_ACTIONS) <= set(fc.ACTIONS)


@pytest.mark.parametrize("cid", sorted(CASES))
def test_generalization_capture(cid):
    capture = CASES[cid]
    exp = capture["expect"]
    result = fc.classify(gen.build(capture))
    assert (result["verdict"], result["action"]) == (exp["verdict"], exp["action"]), result
    if "cause" in exp:
        assert result["cause"]["verdict"] == exp["cause"], result
    assert result["next_step"] and result["evidence"], result
    # the verdict rests on the quoted lines, and never says "no traceback" while they hold a cause
    quoted = [captures.stored_message(where, line).strip()[:40] for where, line in capture["lines"]]
    assert any(q and q in line for q in quoted for line in result["evidence"]), result["evidence"]
    assert "no traceback" not in result["reason"], result["reason"]


@pytest.mark.parametrize("cid", sorted(c["id"] for c in gen.GENERALIZATION if any(w == "kernel" for w, _ in c["lines"])))
def test_the_gatherer_keeps_the_kernel_lines(cid):
    """evidence.KERNEL_INTEREST keeps filesystem errors, read-only remounts, PCIe AER and NVRM lines."""
    for where, line in CASES[cid]["lines"]:
        if where == "kernel":
            assert fe.kernel_interesting(captures.kernel_message(line)), line
    assert fe.kernel_interesting("cgroup: fork rejected by pids controller in /system.slice/x.service")


def test_the_docs_record_the_scores():
    text = (ROOT / "docs" / "diagnosis.md").read_text()
    right, rows = gen.score(fc)
    assert f"{len(rows)} captures" in text and f"**{right}/{len(rows)}**" in text
    assert "**5/42**" in text, "the score before the rules changed, the figure that matters"
    for verdict, n in gen.counts().items():
        assert f"| `{verdict}` | {n} |" in text, (verdict, n)


def _journal_only(lines, ready=True, exit_=("exited", 1)):
    return gen.build({"id": "t", "url": "https://example.org", "lines": [("journal", x) for x in lines],
                      "frame": {"ready": ready, "exit": exit_}})


def test_the_trainers_own_error_line_is_the_cause():
    line = messages.error("node 0: drafter rank 1 (pid 4300, cuda:1) was killed by signal 9")
    result = fc.classify(_journal_only(["loading shard 3/4", line]))
    assert result["verdict"] == "crash" and line in result["reason"], result
    assert "no traceback" not in result["reason"]


def test_an_unknown_failure_is_quoted_and_said_to_be_unrecognised():
    result = fc.classify(_journal_only(["step 4000 loss 1.93", "ncclCommAbort: peer went away, giving up",
                                        "shutting down"]))
    assert result["verdict"] == "crash" and result["action"] == "investigate", result
    assert result["reason"].startswith("unrecognised failure: ncclCommAbort: peer went away, giving up"), result


def test_an_outside_sigterm_is_not_restarted_under_on_failure():
    capture = CASES["systemd-sigterm-clean-exit"]
    result = fc.classify(gen.build(capture))
    assert "does not restart the unit" in result["reason"] and "train.yml" in result["next_step"], result
    ev = gen.build(capture)
    ev["unit_props"]["properties"]["Restart"] = "always"  # always restarts it: nothing to add
    assert "does not restart" not in fc.classify(ev)["reason"]
