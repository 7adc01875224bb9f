"""Every entry of the layers' catalogues (flashfleet.classify.catalogues), tested by being written:
an evidence document is synthesized from the entry alone (its sample line where the layer prints
it, inside a unit's frame), and classify() must give the entry's verdict and action and quote its key
fact. No case here is written by hand: a new entry is a new test."""

from __future__ import annotations

import re

import pytest
from flashfleet import classify as fc
from flashfleet import evidence as fe
from flashfleet.classify import catalogues
from flashfleet.classify.signatures import RE_EXCEPTION

from tests.conftest import ROOT
from tests.fixtures.evidence import captures

_TB = "Traceback (most recent call last):"
_FRAME = '  File "/srv/venv/lib/python3.12/site-packages/flashfleet_trainer/trainer.py", line 412, in main'
RE_STATUS = re.compile(r"code=(?P<code>exited|killed|dumped), status=(?P<status>\d+)")


def synthesize(entry: catalogues.Entry) -> dict:
    """The evidence of a run that died of this entry and of nothing else."""
    frame = {"ready": True, "exit": ("exited", 1)}
    lines = [(entry.where, entry.sample)]
    if entry.where == "journal" and RE_EXCEPTION.match(entry.sample):
        lines = [("journal", _TB), ("journal", _FRAME), ("journal", entry.sample)]
    elif entry.where == "systemd":
        m = RE_STATUS.search(entry.sample)
        if m:  # the unit's record carries the same exit
            frame["exit"] = (m["code"], int(m["status"]))
        elif "exit" in entry.extra:
            frame["exit"] = entry.extra["exit"]
        if entry.layer == "systemd-result":
            frame["result"] = entry.name
            if frame["exit"] is None:  # systemd never ran the trainer: no exit, only the result
                frame["props"] = {"Result": entry.name}
            # a start that timed out, or a notify unit's exit before READY, never got READY
            frame["ready"] = entry.name not in ("timeout", "protocol", "resources", "exec-condition",
                                                "skip-condition")
    return captures.build({"id": f"{entry.layer}-{entry.name}", "url": entry.source, "lines": lines,
                           "frame": frame})


def _said(result: dict) -> str:
    return " ".join([result["reason"], result.get("next_step") or "", *result["evidence"]])


@pytest.mark.parametrize("entry", catalogues.ALL, ids=[f"{e.layer}:{e.name}" for e in catalogues.ALL])
def test_entry(entry):
    result = fc.classify(synthesize(entry))
    got = result["cause"] if result["verdict"] == "init-crash" else result
    # an entry whose line asks nothing of anyone (an informational Xid) leaves a death to be investigated
    action = "investigate" if entry.action == "none" else entry.action
    assert (got["verdict"], got["action"]) == (entry.verdict, action), (result["reason"], result["action"])
    assert entry.fact in _said(result), result["reason"]


def test_every_entry_proves_a_known_verdict_and_action():
    for e in catalogues.ALL:
        assert e.verdict in fc.VERDICTS or re.fullmatch(r"gpu-xid-\d+", e.verdict), e
        assert e.action in fc.ACTIONS, e
        assert e.source and e.meaning, e


def test_the_gatherer_keeps_every_kernel_entrys_line():
    """evidence.KERNEL_INTEREST filters the kernel log on the host: a family it dropped would never
    reach the rules."""
    for e in catalogues.ALL:
        if e.where == "kernel":
            assert fe.kernel_interesting(captures.kernel_message(e.sample)), e.sample


def test_no_entry_is_hidden_by_another_of_its_catalogue():
    """Within one catalogue, an entry's sample is found by its own pattern only: the lookup takes the
    first match, so a broader pattern before it would hide it."""
    for name, entries in catalogues.CATALOGUES.items():
        for e in entries:
            others = [o.name for o in entries if o is not e and o.where == e.where and o.pattern.search(e.sample)]
            assert not others, f"{name}: {e.name}'s sample is also found by {others}"


def test_names_are_unique_within_a_catalogue():
    for name, entries in catalogues.CATALOGUES.items():
        names = [(e.layer, e.name) for e in entries]
        assert len(names) == len(set(names)), name


def test_the_docs_keep_the_catalogue_sizes():
    """docs/diagnosis.md's table is what `python -m flashfleet.classify.catalogues` prints."""
    text = (ROOT / "docs" / "diagnosis.md").read_text()
    for name, n, _verdicts in catalogues.sizes():
        assert re.search(rf"^\| `{name}` \| {n} \|", text, re.M), (name, n)
