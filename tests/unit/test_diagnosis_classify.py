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
CLASSIFY = PACKAGE / "classify"
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
    if "action" in exp:
        assert result["action"] == exp["action"], result
    assert result["action"] in fc.ACTIONS, result
    assert result["next_step"], result
    if result["verdict"] not in ("not-started", "running", "unknown"):
        assert result["evidence"], "a verdict needs the lines that prove it"


def test_every_verdict_has_a_fixture():
    seen = {v["verdict"] for v in EXPECTED.values()}
    wanted = {v for v in fc.VERDICTS if v != "gpu-xid-<n>"}
    assert wanted <= seen, wanted - seen
    assert any(v.startswith("gpu-xid-") for v in seen)


def test_no_ansible_import():
    for path in sorted(CLASSIFY.glob("*.py")):
        text = path.read_text()
        assert "import ansible" not in text and "from ansible" not in text, path
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


# --- actions, the other evidence, systemd's outcomes (issue: every piece of evidence) ------------


def test_every_action_is_in_the_one_table():
    used = set(fc.VERDICT_ACTIONS.values()) | {a for _, _, a, _ in fc.XID_CATALOG.values()}
    used |= set(fc.RECOVERY_ACTIONS.values()) | {a for *_, a in fc.HINTS} | {a for _, _, a, _ in fc.HOST_SIGNATURES}
    used |= set(fc.EXEC_STEP_ACTIONS.values()) | {a for _, a in fc.NCCL_LAST_ERROR_ACTIONS} - {"cuda-oom", "disk-full"}
    assert used <= set(fc.ACTIONS), used - set(fc.ACTIONS)
    assert set(fc.GPU_ACTION_ORDER) <= set(fc.ACTIONS)
    verdicts = {v for v in fc.VERDICTS if v != "gpu-xid-<n>"}
    assert verdicts <= set(fc.VERDICT_ACTIONS), verdicts - set(fc.VERDICT_ACTIONS)


def test_xid_classes_follow_the_catalog():
    """NVIDIA's Xid catalog buckets: 13/31 restart the application, 48/95/119 reset the GPU, 79 reboot."""
    kinds = {code: (kind, action) for code, (kind, _bucket, action, _m) in fc.XID_CATALOG.items()}
    assert kinds[13] == ("application", "restart-app") and kinds[31] == ("application", "restart-app")
    assert kinds[48] == ("hardware", "reset-gpu") and kinds[95] == ("hardware", "reset-gpu")
    assert kinds[119] == ("hardware", "reset-gpu") and kinds[79] == ("hardware", "reboot-node")
    assert kinds[63][0] == "info" and kinds[94] == ("hardware", "restart-app")
    ev = evidence("handbuilt/gpu-xid-79.json")
    ev["kernel"]["entries"][1]["MESSAGE"] = ev["kernel"]["entries"][1]["MESSAGE"].replace("): 79,", "): 63,")
    out = fc.classify(ev)  # an informational Xid alone is not the cause; it is named
    assert out["verdict"] == "crash" and "Xid 63 (informational" in out["reason"]


def test_the_first_hardware_xid_is_the_root_and_the_others_are_listed():
    out = fc.classify(evidence("handbuilt/gpu-xid-119-first-of-three.json"))
    assert out["verdict"] == "gpu-xid-119" and [x["code"] for x in out["xids"]] == [119, 79, 154]
    assert out["action"] == "reboot-node", "a later Xid 79 / Xid 154 'Node Reboot Required' needs more than a reset"
    assert "Xid 79" in out["reason"] and "Node Reboot Required" in out["reason"]
    ev = evidence("handbuilt/gpu-xid-119-first-of-three.json")
    ev["kernel"]["entries"].reverse()  # now Xid 79 is the first hardware one (154 only states an action)
    out = fc.classify(ev)
    assert out["verdict"] == "gpu-xid-79" and [x["code"] for x in out["xids"]] == [154, 79, 119]


def test_xid_154_states_the_recovery_action():
    ev = evidence("handbuilt/gpu-xid-79.json")
    line = "NVRM: Xid (PCI:0000:c1:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
    ev["kernel"]["entries"] = [dict(ev["kernel"]["entries"][0], MESSAGE=line)]
    out = fc.classify(ev)
    assert out["verdict"] == "gpu-xid-154" and out["action"] == "reset-gpu"
    ev["kernel"]["entries"][0]["MESSAGE"] = line.replace("0x1 (GPU Reset Required)", "0x2 (Node Reboot Required)")
    assert fc.classify(ev)["action"] == "reboot-node"


def test_a_follow_on_xid_that_names_its_cause_points_at_the_root():
    ev = evidence("handbuilt/crash-app-xid-13.json")
    ev["kernel"]["entries"][0]["MESSAGE"] = ("NVRM: Xid (PCI:0000:c1:00): 45, pid=4242, name=python3, Ch 00000001 "
                                             "caused by previous Xid 95")
    out = fc.classify(ev)
    assert out["verdict"] == "gpu-xid-95" and out["action"] == "reset-gpu"


def test_a_config_exit_with_a_host_fault_underneath_names_the_host():
    out = fc.classify(evidence("handbuilt/init-crash-driver-mismatch-config-exit.json"))
    assert out["verdict"] == "init-crash" and out["cause"]["verdict"] == "driver-mismatch"
    assert out["action"] == "fix-driver" and "config error" in out["reason"]
    ev = evidence("handbuilt/init-crash-driver-mismatch-config-exit.json")
    ev["kernel"]["entries"] = []  # without the kernel's word it is the configuration
    out = fc.classify(ev)
    assert out["cause"]["verdict"] == "crash" and out["cause"]["kind"] == "config-error" and out["action"] == "fix-config"


def test_nvml_errors_in_the_gpu_evidence():
    ev = evidence("handbuilt/gpu-unavailable.json")
    ev["gpu"] = {"present": True, "readable": True, "error": None, "csv": "",
                 "gpus": [{"index": "7", "name": "NVIDIA H200", "memory.used": "[GPU requires reset]"}]}
    out = fc.classify(ev)
    assert out["verdict"] == "gpu-unavailable" and out["action"] == "reset-gpu"
    ev["gpu"] = {"present": True, "readable": True, "error": None, "gpus": [{"index": "0", "recovery_action": "None"}]}
    assert fc.classify(ev)["verdict"] == "crash"  # no host finding: the CUDA error itself


def test_a_host_finding_does_not_hide_an_unrelated_exception():
    ev = evidence("handbuilt/crash.json")
    ev["gpu"] = {"present": True, "readable": False, "error": "Failed to initialize NVML: Driver/library version mismatch"}
    out = fc.classify(ev)
    assert out["verdict"] == "crash" and "KeyError" in out["reason"]
    assert "also on this host: driver-mismatch" in out["reason"]
    assert any("nvidia-smi failed" in w for w in out["warnings"])


def test_gpu_trouble_while_running_is_a_warning():
    ev = evidence("handbuilt/running.json")
    ev["gpu"] = {"present": True, "readable": False, "error": "Failed to initialize NVML: Driver/library version mismatch"}
    out = fc.classify(ev)
    assert out["verdict"] == "running" and out["action"] == "none"
    assert any(w.startswith("driver-mismatch while running (fix-driver)") for w in out["warnings"])


def test_multi_line_exceptions_are_kept_whole():
    out = fc.classify(evidence("handbuilt/nccl-error.json"))
    assert "ncclRemoteError" in out["reason"] and "Connection closed by remote peer gpu02" in out["reason"]
    assert any("Last error:" in line for line in out["evidence"])
    assert out["last_error"].startswith("socketProgress: Connection closed")
    out = fc.classify(evidence("handbuilt/init-crash-exception.json"))
    assert "Extra inputs are not permitted" in out["reason"]
    block = fc.exception_block([(None, "Traceback (most recent call last):"), (None, '  File "x.py", line 1, in <module>'),
                                (None, "ValueError: bad"), (None, "second line of the message"),
                                (None, "[2024-03-18 17:38:50,208] torch.distributed.elastic: [ERROR] failed")])
    assert block["text"] == "ValueError: bad / second line of the message"


def test_native_crashes_name_the_library():
    out = fc.classify(evidence("handbuilt/native-crash.json"))
    assert out["verdict"] == "native-crash" and out["library"].startswith("libcuda.so")
    ev = evidence("handbuilt/native-crash.json")  # another process's segfault is not the run's
    ev["kernel"]["entries"][0]["MESSAGE"] = ev["kernel"]["entries"][0]["MESSAGE"].replace("python3[4242]", "Xorg[991]")
    ev["unit_props"]["properties"].update(ExecMainCode="1", ExecMainStatus="1", Result="exit-code")
    assert fc.classify(ev)["verdict"] == "crash"
    ev = evidence("handbuilt/crash.json")  # a Python exception first: the abort after it is its teardown
    ev["journal"]["entries"].insert(-2, dict(ev["journal"]["entries"][-3], MESSAGE="terminate called without an active exception"))
    assert fc.classify(ev)["verdict"] == "crash"
    app = [(1.0, "terminate called after throwing an instance of 'c10::Error'"),
           (1.0, "  what():  CUDA error: an illegal memory access was encountered")]
    nat = fc.native_crash(app, [], {}, set())
    assert "c10::Error" in nat["message"] and "illegal memory access" in nat["message"]


def test_systemd_start_outcomes():
    out = fc.classify(evidence("handbuilt/start-limit-hit.json"))
    assert out["verdict"] == "start-limit-hit" and out["action"] == "reset-failed"
    assert "reset-failed" in out["next_step"] and "restarts on failure" not in out["next_step"]
    assert out["cause"]["verdict"] == "crash" and "KeyError" in out["cause"]["reason"]
    out = fc.classify(evidence("handbuilt/start-timeout.json"))
    assert out["verdict"] == "start-timeout" and "TimeoutStartSec (30min)" in out["reason"]
    assert "start_timeout_s" in out["next_step"]
    out = fc.classify(evidence("handbuilt/exec-failed.json"))
    assert out["verdict"] == "exec-failed" and out["exec_step"] == "EXEC" and out["action"] == "fix-venv"
    ev = evidence("handbuilt/stopped.json")  # a stop that timed out is a stop, not a start timeout
    ev["unit_props"]["properties"].update(Result="timeout", ExecMainCode="2", ExecMainStatus="9",
                                          ExecMainStartTimestamp=f"@{1764525600:.6f}",
                                          ExecMainExitTimestamp=f"@{1764525600 + 3100:.6f}")
    assert fc.classify(ev)["verdict"] == "stopped"


def test_the_table_shows_the_action():
    rows = [fc.classify(evidence("handbuilt/gpu-xid-79.json")), {"host": "gone", "verdict": "unreachable"}]
    lines = fc.table(rows).splitlines()
    assert lines[0].split()[:3] == ["host", "verdict", "action"]
    assert "reboot-node" in lines[1] and "check-host" in lines[2]


def test_nonfinite_loss_is_its_own_verdict():
    """The trainer's own stop on a NaN loss (messages.nonfinite_loss, exit EX_NONFINITE) is named as
    such, with the config action, not as a crash."""
    from flashfleet.contract import messages

    ev = copy.deepcopy(evidence("handbuilt/crash.json"))
    entries = ev["journal"]["entries"]
    line = messages.nonfinite_loss(4990, float("nan"))
    for e in entries:
        if e.get("MESSAGE") == "KeyError: 'input_ids'":
            e["MESSAGE"] = line
        elif isinstance(e.get("MESSAGE"), str) and "status=1/FAILURE" in e["MESSAGE"]:
            e["MESSAGE"] = e["MESSAGE"].replace("status=1/FAILURE", f"status={messages.EX_NONFINITE}/DATAERR")
    ev["status"]["data"]["last_error"] = line.removeprefix(messages.ERROR_PREFIX)
    d = fc.classify(ev)
    assert d["verdict"] == "nonfinite-loss" and d["action"] == "fix-config", d
    assert "non-finite loss nan at optimizer step 4990" in d["reason"]


def test_a_dead_vllm_target_server_points_at_the_servers_units():
    """The last line of the trainer's traceback when its vLLM target server went (as
    tests/unit/test_vllm_target.py's killed server makes it): the action names the server units."""
    ev = evidence("handbuilt/crash.json")
    line = (f"flashfleet_trainer.config.UnreachableServerError: {messages.TARGET_SERVER} http://127.0.0.1:8100 "
            "unreachable or failed during /v1/completions (URLError: <urlopen error [Errno 111] Connection refused>)")
    for e in ev["journal"]["entries"]:
        if e["MESSAGE"] == "KeyError: 'input_ids'":
            e["MESSAGE"] = line
    out = fc.classify(ev)
    assert out["verdict"] == "crash" and out["action"] == "check-target-server", out
    assert "flashfleet-vllm@" in out["next_step"] and "http://127.0.0.1:8100" in out["reason"], out
