"""The evidence classifier on recorded/hand-built evidence: every verdict, and the ambiguous cases."""

from __future__ import annotations

import ast
import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from flashfleet import classify as fc
from flashfleet.contract import messages

from tests.conftest import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "evidence"
PACKAGE = ROOT / "module_utils" / "flashfleet"
CLASSIFY = PACKAGE / "classify.py"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())


def evidence(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_verdict(name):
    exp = EXPECTED[name]
    result = fc.classify(evidence(name))
    assert result["verdict"] == exp["verdict"], result
    if "cause" in exp:
        assert result["cause"]["verdict"] == exp["cause"], result
    if "reason_has" in exp:
        assert exp["reason_has"] in result["reason"], result
    assert result["next_step"], result
    if result["verdict"] not in ("not-started", "running", "unknown"):
        assert result["evidence"], "a verdict needs the lines that prove it"


def test_every_verdict_has_a_fixture():
    seen = {v["verdict"] for v in EXPECTED.values()}
    wanted = {v for v in fc.VERDICTS if v != "gpu-xid-<n>"}
    assert wanted <= seen, wanted - seen
    assert any(v.startswith("gpu-xid-") for v in seen)


def test_no_ansible_import():
    text = CLASSIFY.read_text()
    assert "import ansible" not in text and "from ansible" not in text
    # nothing in the package imports Ansible: the controller and the trainer import it without it
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            assert not any(n == "ansible" or n.startswith("ansible.") for n in names), path


def test_the_classifier_matches_the_trainers_messages():
    """The config-error and peer-failure lines come from the contract the trainer prints from."""
    ev = evidence("handbuilt/init-crash-config.json")
    for e in ev["journal"]["entries"]:
        if "config error" in fc.message(e):
            e["MESSAGE"] = messages.config_error("--max-seq-len 0 is not positive", "give a positive length")
    out = fc.classify(ev)
    assert out["verdict"] == "init-crash" and out["cause"]["kind"] == "config-error"
    assert "--max-seq-len 0" in out["reason"]
    ev = evidence("handbuilt/crash.json")
    line = messages.also_went_first(messages.error("node 0: drafter rank 0 exited with code 1"), 1, "node 1 stopped")
    ev["journal"]["entries"].insert(-2, dict(ev["journal"]["entries"][-3], MESSAGE=line))
    out = fc.classify(ev)
    assert out["verdict"] == "peer-failure" and out["reason"].startswith("node 0: drafter rank 0 exited")
    assert "node 1 went first: node 1 stopped" in out["reason"]


# --- the ambiguous cases of issue 6, as pairs on the same evidence --------------------------


def test_sigkill_with_and_without_an_oom_line_naming_the_run():
    named = fc.classify(evidence("handbuilt/cgroup-oom-kill.json"))
    assert named["verdict"] == "cgroup-oom-kill"
    assert any("Memory cgroup out of memory" in line for line in named["evidence"])
    bare = evidence("handbuilt/cgroup-oom-kill.json")
    bare["kernel"]["entries"] = []
    assert fc.classify(bare)["verdict"] == "killed-by-signal"
    other = fc.classify(evidence("handbuilt/killed-by-signal-other-oom.json"))
    assert other["verdict"] == "killed-by-signal"


def test_oom_tied_by_pid_alone():
    ev = evidence("handbuilt/host-oom-kill.json")
    for e in ev["kernel"]["entries"]:
        e["MESSAGE"] = re.sub(r"task_memcg=[^,]*", "task_memcg=/user.slice", e["MESSAGE"])
    ev["unit_props"]["properties"]["Result"] = "signal"
    out = fc.classify(ev)
    assert out["verdict"] == "host-oom-kill"
    assert "was the run's" in out["reason"]


def test_application_xid_vs_hardware_xid():
    app = fc.classify(evidence("handbuilt/crash-app-xid-13.json"))
    hw = fc.classify(evidence("handbuilt/gpu-xid-79.json"))
    assert app["verdict"] == "crash" and "illegal memory access" in app["reason"]
    assert hw["verdict"] == "gpu-xid-79" and "drain" in hw["next_step"]
    # the same application evidence with a hardware code becomes a hardware verdict
    ev = evidence("handbuilt/crash-app-xid-13.json")
    ev["kernel"]["entries"][0]["MESSAGE"] = ev["kernel"]["entries"][0]["MESSAGE"].replace("): 13,", "): 94,")
    assert fc.classify(ev)["verdict"] == "gpu-xid-94"


def test_xid_outside_the_window_is_ignored():
    ev = evidence("handbuilt/gpu-xid-79.json")
    for e in ev["kernel"]["entries"]:
        e["__REALTIME_TIMESTAMP"] = str(int(e["__REALTIME_TIMESTAMP"]) - 86400 * 10**6)
    assert fc.classify(ev)["verdict"] == "crash"


def test_crash_before_ready_vs_after():
    after = evidence("handbuilt/crash.json")
    assert fc.classify(after)["verdict"] == "crash"
    before = copy.deepcopy(after)
    before["journal"]["entries"] = [e for e in before["journal"]["entries"]
                                    if not e["MESSAGE"].__str__().startswith("Started ")]
    before["status"]["data"]["ready"] = False
    out = fc.classify(before)
    assert out["verdict"] == "init-crash"
    assert out["cause"]["verdict"] == "crash" and "KeyError" in out["reason"]


def test_init_crash_names_the_exception_and_the_drift():
    out = fc.classify(evidence("handbuilt/init-crash-exception.json"))
    assert "ValidationError: 1 validation error for Settings" in out["reason"]
    assert "wandb" in out["next_step"]
    assert any("venv drift: wandb" in w for w in out["warnings"])


def test_unreadable_kernel_log_and_sigkill():
    out = fc.classify(evidence("handbuilt/killed-by-signal-kernel-unreadable.json"))
    assert out["verdict"] == "killed-by-signal"
    assert "kernel log unreadable" in out["reason"] and "OOM not ruled out" in out["reason"]
    assert "no OOM" not in out["reason"]


def test_hardware_xid_before_ready_is_named_as_cause():
    out = fc.classify(evidence("handbuilt/init-crash-gpu-xid-48.json"))
    assert out["verdict"] == "init-crash"
    assert out["cause"]["verdict"] == "gpu-xid-48"
    assert "drain" in out["next_step"]


# --- readers -------------------------------------------------------------------------------------


def test_message_forms():
    assert fc.message({"MESSAGE": "plain"}) == "plain"
    assert fc.message({"MESSAGE": list(b"caf\xc3\xa9")}) == "café"
    assert "\ufffd" in fc.message({"MESSAGE": [0x61, 0xFF]})
    assert fc.message({"MESSAGE": ["a", "b"]}) == "a\nb"
    assert fc.message({}) == ""


def test_systemd_timestamps():
    assert fc.parse_systemd_time("@1764525600.5") == 1764525600.5
    assert fc.parse_systemd_time("Sun 2025-11-30 18:00:00 UTC") == 1764525600.0
    assert fc.parse_systemd_time("") is None and fc.parse_systemd_time("n/a") is None


def test_text_only_manager_lines_still_parse():
    """Entries without the structured EXIT_CODE fields (older exports) are read from MESSAGE."""
    ev = evidence("handbuilt/killed-by-signal.json")
    for e in ev["journal"]["entries"]:
        for k in ("EXIT_CODE", "EXIT_STATUS", "UNIT_RESULT", "MESSAGE_ID"):
            e.pop(k, None)
    ev["unit_props"]["properties"].update(ExecMainCode="0", ExecMainStatus="0", Result="success",
                                          ExecMainExitTimestamp="")
    assert fc.classify(ev)["verdict"] == "killed-by-signal"


def test_cli_prints_table_and_json(tmp_path):
    run = tmp_path / "v2"
    for host, fx in (("gpu01", "cuda-oom"), ("gpu02", "running")):
        (run / host).mkdir(parents=True)
        (run / host / "evidence.json").write_text((FIXTURES / "handbuilt" / f"{fx}.json").read_text())
    commands = [[sys.executable, "-m", "flashfleet.classify"]]
    script = Path(sys.executable).parent / "flashfleet-classify"  # the console script, where installed
    if script.exists():
        commands.append([str(script)])
    for cmd in commands:
        res = subprocess.run([*cmd, str(run)], capture_output=True, text=True, check=True)
        assert "cuda-oom" in res.stdout and "running" in res.stdout and "host" in res.stdout.splitlines()[0]
        res = subprocess.run([*cmd, "--json", str(run / "gpu01" / "evidence.json")],
                             capture_output=True, text=True, check=True)
        assert json.loads(res.stdout)["verdict"] == "cuda-oom"


def test_status_times_as_the_trainer_writes_them():
    """status.json carries ISO 8601 UTC times (`2026-11-30T18:56:34Z`); older ones unix seconds."""
    assert fc.status_time("2026-11-30T18:56:34Z") == 1796064994.0
    assert fc.status_time(1796064994) == fc.status_time("1796064994") == 1796064994.0
    assert fc.status_time("yesterday") is None and fc.status_time(None) is None
    ev = evidence("handbuilt/running.json")
    ev["status"]["data"]["updated"] = "2026-11-30T18:56:34Z"
    ev["collected_at"] = 1796064994.0 + 7
    result = fc.classify(ev)
    assert result["verdict"] == "running" and "status updated 7 s ago" in result["reason"]


def test_torch_short_write_is_disk_full_only_when_the_filesystem_is_full():
    """torch.save on a full disk says `unexpected pos`, not Errno 28 (seen in the faults scenario)."""
    ev = evidence("handbuilt/disk-full.json")
    torch_line = "RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 468736 vs 468624"
    replaced = 0
    for entry in ev["journal"]["entries"]:
        text = fc.message(entry)
        if "No space left" in text or "Errno 28" in text:
            entry["MESSAGE"] = torch_line
            replaced += 1
    assert replaced
    ev["disk"]["checkpoints"] = {"path": "/r/checkpoints", "realpath": "/scratch/c", "free_bytes": 900 * 1024,
                                 "total_bytes": 128 * 2**20}
    full = fc.classify(ev)
    assert full["verdict"] == "disk-full" and "came up short" in full["reason"] and "/scratch/c" in full["reason"]
    ev["disk"]["checkpoints"]["free_bytes"] = 100 * 2**20
    roomy = fc.classify(ev)
    assert roomy["verdict"] == "crash" and "unexpected pos" in roomy["reason"]
    assert "came up short" in roomy["next_step"]


def test_oom_of_another_container_on_the_same_kernel_is_not_tied_by_time():
    """Containers share the kernel log: an OOM kill in another container's cgroup, even at the
    same second as the unit's SIGKILL, is not this run's."""
    ev = evidence("handbuilt/cgroup-oom-kill-container.json")
    assert fc.classify(ev)["verdict"] == "cgroup-oom-kill"
    own = fc.host_memcg(ev)
    ev["cgroup"]["own"] = ["4:memory:/libpod_parent/libpod-someoneelse", "0::/libpod_parent/libpod-someoneelse"]
    result = fc.classify(ev)
    if own is None or not own.startswith("/libpod_parent/libpod-someoneelse"):
        assert result["verdict"] == "killed-by-signal", result
    assert fc.host_memcg({"cgroup": {"own": ["0::/"]}}) is None
    assert fc.host_memcg({"cgroup": {"own": ["9:name=systemd:/a/b/init.scope", "4:memory:/a/b"]}}) == "/a/b"
    assert fc.memcg_in_host("/a/b/system.slice/x.service", "/a/b") and not fc.memcg_in_host("/a/bc", "/a/b")


def test_running_again_after_a_manual_relaunch_is_not_called_a_restart():
    """Recorded: the unit was started again with train.yml after an earlier invocation was killed
    (NRestarts=0), so the reason must not say it restarted."""
    ev = evidence("recorded/running-healthy.json")
    assert ev["unit_props"]["properties"]["NRestarts"] == "0"
    result = fc.classify(ev)
    assert result["verdict"] == "running" and "restarted" not in result["reason"]
    invocations = fc.split_invocations(ev["journal"]["entries"])
    if len(invocations) > 1:  # recorded on a node where an earlier verify had killed this run
        assert "earlier invocation ended: killed-by-signal" in result["reason"]
        # and that death keeps its time, for naming the first host of a multi-node run
        assert result["previous"]["ended_at"] == invocations[-2].exit_ts is not None
