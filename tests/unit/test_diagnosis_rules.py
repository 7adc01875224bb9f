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
from flashfleet.classify.output import hint_action

from tests.conftest import ROOT
from tests.fixtures.evidence import captures
from tests.fixtures.evidence import captures_generalization as gen
from tests.fixtures.evidence import captures_open_world as open_world

FIXTURES = ROOT / "tests" / "fixtures" / "evidence"
DOCS = ROOT / "docs" / "diagnosis.md"
BY_NAME = {rule.__name__: rule for rule in rules.RULES}


def evidence(name: str) -> dict:
    """A fixture by name: a file under tests/fixtures/evidence, or `captures:<id>` /
    `generalization:<id>` / `open-world:<id>` built from the labelled public captures."""
    kind, _, ident = name.partition(":")
    if kind == "captures":
        return captures.build(next(c for c in captures.CAPTURES if c["id"] == ident))
    if kind == "generalization":
        return gen.build(next(c for c in gen.GENERALIZATION if c["id"] == ident))
    if kind == "open-world":
        return captures.build(next(c for c in open_world.OPEN_WORLD if c["id"] == ident))
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
    ("clean_exit", "recorded/stopped-outside-sigterm.json", "stopped", "recorded/killed-by-signal-sigkill.json"),
    ("clean_exit", "recorded/killed-by-signal-outside-sighup.json", "killed-by-signal", "handbuilt/crash.json"),
    ("hardware_xid", "handbuilt/gpu-xid-79.json", "gpu-xid-79", "handbuilt/crash-app-xid-13.json"),
    ("hardware_xid", "captures:xid-48-then-63", "gpu-xid-48", "handbuilt/crash.json"),
    ("kernel_family", "handbuilt/host-hardware-error.json", "host-hardware-error", "handbuilt/crash.json"),
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
    ("layer_catalogue", "open-world:estale-log-write", "filesystem-error", "handbuilt/crash.json"),
    ("outside_signal", "recorded/killed-by-signal-sigkill.json", "killed-by-signal", "handbuilt/crash.json"),
    ("outside_signal", "recorded/killed-by-signal-transient-unit.json", "killed-by-signal", "handbuilt/native-crash.json"),
    ("crash", "handbuilt/crash.json", "crash", "handbuilt/stopped.json"),
    ("crash", "recorded/init-crash-corrupt-model.json", "crash", "recorded/completed-short.json"),
    ("crash", "recorded/init-crash-nproc-arrow-pool.json", "crash", "recorded/stopped-outside-sigterm.json"),
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


def with_stop_job(name: str) -> dict:
    """The evidence with systemd's stop job logged before the invocation's clean end, as `systemctl stop` does."""
    ev = copy.deepcopy(evidence(name))
    entries = ev["journal"]["entries"]
    end = max(i for i, e in enumerate(entries) if fc.message(e).endswith(": Deactivated successfully."))
    stopping = dict(entries[end], MESSAGE=f"Stopping {entries[end]['UNIT']} - flashfleet DFlash training run...",
                    MESSAGE_ID=fc.MID_STOPPING, JOB_TYPE="stop")
    entries.insert(end, stopping)
    return ev


def test_clean_exit_says_whether_the_stop_came_through_systemd():
    """A clean stop (status.json phase=stopped) with systemd's clean end and no stop job in the journal came
    from outside systemd; with the stop job, or where the journal does not show the end, it is systemd's."""
    outside = rules.clean_exit(fc.last_death(evidence("recorded/stopped-outside-sigterm.json")))
    assert outside.verdict == "stopped" and "outside" in outside.reason and "does not restart" in outside.reason
    assert "train.yml" in outside.next_step and "who sent the signal" in outside.next_step
    asked = rules.clean_exit(fc.last_death(with_stop_job("recorded/stopped-outside-sigterm.json")))
    assert asked.verdict == "stopped" and asked.reason == "stopped through systemd (clean exit)"
    unread = copy.deepcopy(evidence("recorded/stopped-outside-sigterm.json"))
    unread["journal"] = {"readable": False, "error": "no permission", "entries": []}
    assert rules.clean_exit(fc.last_death(unread)).reason == "stopped through systemd (clean exit)"
    assert rules.clean_exit(fc.last_death(evidence("handbuilt/stopped.json"))).reason == (
        "stopped through systemd (clean exit)")


def test_clean_exit_reads_a_clean_end_mid_training_as_a_signal_from_outside():
    """Result=success, no stop job and status.json still training: a signal systemd counts as clean (SIGHUP,
    SIGINT, SIGTERM, SIGPIPE) from outside, which Restart=on-failure does not restart; not under Restart=always,
    not with a stop job, not without status.json."""
    name = "recorded/killed-by-signal-outside-sighup.json"
    found = rules.clean_exit(fc.last_death(evidence(name)))
    assert found.verdict == "killed-by-signal" and "SIGHUP" in found.reason
    assert "Restart=on-failure does not restart" in found.reason and "train.yml" in found.next_step
    assert any("Deactivated successfully" in line for line in found.lines), found.lines
    always = copy.deepcopy(evidence(name))
    always["unit_props"]["properties"]["Restart"] = "always"
    assert "does not restart" not in rules.clean_exit(fc.last_death(always)).reason
    assert rules.clean_exit(fc.last_death(with_stop_job(name))).verdict == "stopped"
    no_status = copy.deepcopy(evidence(name))
    no_status["status"] = {"readable": False, "error": "missing", "data": None}
    assert rules.clean_exit(fc.last_death(no_status)) is None
    assert fc.classify(no_status)["verdict"] == "unknown"


@pytest.mark.parametrize("line", [
    "pyarrow.lib.ArrowException: Unknown error: Failed to launch worker thread: Resource temporarily unavailable",
    "RuntimeError: can't start new thread",
    "libgomp: Thread creation failed: Resource temporarily unavailable",
    "OpenBLAS blas_thread_init: pthread_create failed for thread 1 of 8: Resource temporarily unavailable",
    'thread \'main\' panicked: failed to spawn thread: Os { code: 11, kind: WouldBlock, message: "Resource '
    'temporarily unavailable" }',
    "could not create thread: EAGAIN",
], ids=["pyarrow", "python", "libgomp", "openblas", "rust", "eagain"])
def test_crash_reads_a_thread_that_could_not_start_as_the_task_limit(line):
    hint, action = hint_action(line)
    assert action == "fix-config" and "task limit" in hint and "LimitNPROC" in hint


@pytest.mark.parametrize("line", [
    "BlockingIOError: [Errno 11] Resource temporarily unavailable",
    "zmq.error.Again: Resource temporarily unavailable",
    "OSError: [Errno 11] Resource temporarily unavailable: '/dev/nvidia0'",
    "starting thread pool with 8 workers",
    'File "/usr/lib/python3.11/threading.py", line 957, in start',
], ids=["blocking-io", "zmq-again", "device-eagain", "thread-pool-log", "threading-frame"])
def test_crash_leaves_other_eagain_to_other_hints(line):
    hint, _ = hint_action(line)
    assert hint is None or "task limit" not in hint


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
