"""The verdict's rules (flashfleet.classify.rules.RULES), one by one on recorded evidence: each
fires on evidence of its kind and returns None on evidence of another kind, decides that evidence
in RULES' order, and docs/diagnosis.md's precedence list is RULES (same names, same order)."""

from __future__ import annotations

import copy
import json
import re

import pytest
from flashfleet import classify as fc
from flashfleet.classify import rules

from tests.conftest import ROOT
from tests.fixtures.evidence import captures
from tests.fixtures.evidence import captures_generalization as gen

FIXTURES = ROOT / "tests" / "fixtures" / "evidence"
DOCS = ROOT / "docs" / "diagnosis.md"
BY_NAME = {rule.__name__: rule for rule in rules.RULES}


def evidence(name: str) -> dict:
    """A fixture by name: a file under tests/fixtures/evidence, or `captures:<id>` /
    `generalization:<id>` built from the labelled public captures."""
    kind, _, ident = name.partition(":")
    if kind == "captures":
        return captures.build(next(c for c in captures.CAPTURES if c["id"] == ident))
    if kind == "generalization":
        return gen.build(next(c for c in gen.GENERALIZATION if c["id"] == ident))
    return json.loads((FIXTURES / name).read_text())


def without_kernel_oom(name: str) -> dict:
    """The evidence with the kernel's OOM lines gone (rotated away, or a kernel log not kept)."""
    ev = copy.deepcopy(evidence(name))
    ev["kernel"]["entries"] = [e for e in ev["kernel"]["entries"] if "oom" not in fc.message(e).lower()
                               and "out of memory" not in fc.message(e).lower()]
    return ev


# rule -> (evidence of its kind, the verdict it names, evidence of another kind it must leave alone)
CASES = [
    ("clean_exit", "handbuilt/stopped.json", "stopped", "recorded/killed-by-signal-sigkill.json"),
    ("clean_exit", "recorded/completed-short.json", "completed", "handbuilt/crash.json"),
    ("hardware_xid", "handbuilt/gpu-xid-79.json", "gpu-xid-79", "handbuilt/crash-app-xid-13.json"),
    ("hardware_xid", "captures:xid-48-then-63", "gpu-xid-48", "handbuilt/crash.json"),
    ("kernel_oom_kill", "recorded/cgroup-oom-kill-container-limit.json", "cgroup-oom-kill",
     "recorded/killed-by-signal-sigkill.json"),
    ("kernel_oom_kill", "handbuilt/host-oom-kill.json", "host-oom-kill", "handbuilt/killed-by-signal-other-oom.json"),
    ("systemd_oom_kill", "handbuilt/host-oom-kill.json", "cgroup-oom-kill", "recorded/killed-by-signal-sigkill.json"),
    ("exec_failed", "handbuilt/exec-failed.json", "exec-failed", "handbuilt/start-timeout.json"),
    ("exec_failed", "captures:systemd-226-namespace", "exec-failed", "handbuilt/crash.json"),
    ("start_timeout", "handbuilt/start-timeout.json", "start-timeout", "handbuilt/exec-failed.json"),
    ("cuda_oom", "handbuilt/cuda-oom.json", "cuda-oom", "handbuilt/crash.json"),
    ("cuda_oom", "generalization:cublas-alloc-failed", "cuda-oom", "handbuilt/disk-full.json"),
    ("shm_full", "captures:dataloader-bus-error-shm", "disk-full", "handbuilt/disk-full.json"),
    ("disk_quota", "generalization:quota-open-for-write", "disk-full", "handbuilt/disk-full.json"),
    ("disk_full", "handbuilt/disk-full.json", "disk-full", "captures:dataloader-bus-error-shm"),
    ("short_write", "recorded/disk-full-checkpoint-tmpfs.json", "disk-full", "handbuilt/disk-full.json"),
    ("peer_failure", "recorded/peer-failure-cluster-sigkill.json", "peer-failure", "handbuilt/nccl-timeout.json"),
    ("nccl_timeout", "handbuilt/nccl-timeout.json", "nccl-timeout", "handbuilt/nccl-error.json"),
    ("watchdog_hang", "recorded/watchdog-hang-sigstop.json", "watchdog-hang", "recorded/killed-by-signal-sigkill.json"),
    ("host_finding", "handbuilt/driver-mismatch.json", "driver-mismatch", "handbuilt/crash.json"),
    ("host_finding", "handbuilt/filesystem-error.json", "filesystem-error", "handbuilt/disk-full.json"),
    ("nccl_error", "handbuilt/nccl-error.json", "nccl-error", "handbuilt/crash.json"),
    ("native_crash", "handbuilt/native-crash.json", "native-crash", "handbuilt/crash.json"),
    ("native_crash", "captures:segfault-in-libcuda", "native-crash", "handbuilt/nccl-error.json"),
    ("config_error", "handbuilt/init-crash-config.json", "crash", "handbuilt/crash.json"),
    ("nonfinite_loss", "handbuilt/nonfinite-loss.json", "nonfinite-loss", "handbuilt/init-crash-config.json"),
    ("outside_signal", "recorded/killed-by-signal-sigkill.json", "killed-by-signal", "handbuilt/crash.json"),
    ("outside_signal", "recorded/killed-by-signal-transient-unit.json", "killed-by-signal", "handbuilt/native-crash.json"),
    ("crash", "handbuilt/crash.json", "crash", "handbuilt/stopped.json"),
    ("crash", "recorded/init-crash-corrupt-model.json", "crash", "recorded/completed-short.json"),
    ("unknown", "handbuilt/unknown.json", "unknown", None),
]


def test_every_rule_has_a_case():
    assert {name for name, *_ in CASES} == set(BY_NAME)


@pytest.mark.parametrize(("name", "own", "verdict", "other"), CASES, ids=[f"{c[0]}:{c[1]}" for c in CASES])
def test_rule(name, own, verdict, other):
    rule = BY_NAME[name]
    found = rule(fc.last_death(evidence(own)))
    assert found is not None, f"{name} did not fire on {own}"
    assert found.verdict == verdict, found.as_dict()
    assert found.lines and found.action in fc.ACTIONS, found.as_dict()
    if other is not None:
        assert rule(fc.last_death(evidence(other))) is None, f"{name} fired on {other}, evidence of another kind"


@pytest.mark.parametrize(("name", "own", "verdict"), [(n, o, v) for n, o, v, _ in CASES],
                         ids=[f"{c[0]}:{c[1]}" for c in CASES])
def test_rule_decides_its_evidence(name, own, verdict):
    """In RULES' order this rule is the first to fire on its evidence, and classify() says so."""
    ev = without_kernel_oom(own) if name == "systemd_oom_kill" else evidence(own)
    death = fc.last_death(ev)
    first = next(rule for rule in rules.RULES if rule(death) is not None)
    assert first.__name__ == name
    out = fc.classify(ev)
    assert verdict in (out["verdict"], (out.get("cause") or {}).get("verdict")), out


def test_kind_of_finding_config_error():
    found = rules.config_error(fc.last_death(evidence("handbuilt/init-crash-config.json")))
    assert found.extra["kind"] == "config-error" and found.action == "fix-config"


def documented_rules() -> list[str]:
    """The numbered list of "Verdicts and how they are decided": each item opens with its rule's name."""
    text = DOCS.read_text()
    section = text.split("## Verdicts and how they are decided", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\d+\. `(\w+)`", section, re.M)


def test_docs_precedence_list_is_rules():
    assert documented_rules() == [rule.__name__ for rule in rules.RULES]


def test_docs_list_is_numbered_in_order():
    section = DOCS.read_text().split("## Verdicts and how they are decided", 1)[1].split("\n## ", 1)[0]
    numbers = [int(n) for n in re.findall(r"^(\d+)\. `\w+`", section, re.M)]
    assert numbers == list(range(1, len(rules.RULES) + 1))
