"""The classifier on real failure captures from public trackers (tests/fixtures/evidence/captures.py):
every capture's verdict, cause and action, and that the verdict rests on the quoted lines."""

from __future__ import annotations

import re
from urllib.parse import urlparse

import pytest
from flashfleet import classify as fc

from tests.conftest import ROOT
from tests.fixtures.evidence import captures, server_captures

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


# ---- vLLM target servers (server_captures.py: collected before the server rules were written) --

SERVERS = {c["id"]: c for c in server_captures.SERVER_CAPTURES}


def test_the_server_set():
    assert len(server_captures.SERVER_CAPTURES) == len(SERVERS) >= 30
    per = server_captures.counts()
    assert set(per) == {"server-oom", "server-kv-cache", "server-nccl", "server-not-ready", "server-died"}
    assert all(v["cases"] >= 3 for v in per.values()), per
    for c in server_captures.SERVER_CAPTURES:
        assert ("url" in c) != ("origin" in c), c["id"]
        assert c.get("url", "https://").startswith("https://") and c.get("origin", "recorded: ").startswith("recorded: ")
        assert c["lines"] and all(where in {"server", "server-systemd", "kernel", "journal"} for where, _ in c["lines"])
        assert c["expect"]["action"] in fc.ACTIONS and c["expect"]["verdict"] in fc.VERDICTS, c["id"]


@pytest.mark.parametrize("cid", sorted(SERVERS))
def test_server_capture_verdict(cid):
    capture = SERVERS[cid]
    result = fc.classify(captures.build_server(capture))
    assert (result["verdict"], result["action"]) == (capture["expect"]["verdict"], capture["expect"]["action"]), result
    assert result["server"] == "flashfleet-vllm@v2-0.service" and result["trainer"]["verdict"] in ("crash", "not-started")
    # the server's own lines, not only the synthesized frame, carry a verdict named by a signature
    if result["verdict"] in ("server-oom", "server-kv-cache", "server-nccl"):
        quoted = [line.strip()[:40] for where, line in capture["lines"] if where == "server"]
        assert any(q and q in e for q in quoted for e in result["evidence"]), result["evidence"]
