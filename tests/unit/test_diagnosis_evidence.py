"""The evidence gatherer (flashfleet.evidence, the flashfleet_evidence module's logic): its parsers
on recorded text, what the contract decides for it (checkpoints, locks), and gather() end to end
against stub commands."""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path

import pytest
from flashfleet import classify as fc
from flashfleet import evidence as fe
from flashfleet.contract import checkpoint, locks

# systemd 252, `systemctl show -p ... --timestamp=unix` after `kill -9` of the main process
SYSTEMCTL_SHOW = """Type=notify
Restart=on-failure
NotifyAccess=main
WatchdogUSec=5min
RestartPreventExitStatus=78
OOMPolicy=stop
MemoryMax=infinity
LoadState=loaded
ActiveState=failed
SubState=failed
Result=signal
ExecMainCode=2
ExecMainStatus=9
ExecMainPID=812
MainPID=0
NRestarts=0
InvocationID=6c1e0d6b2f0a4d5c9e8f7a6b5c4d3e21
ExecMainStartTimestamp=@1764525600.000000
ExecMainExitTimestamp=@1764527101.000000
ControlGroup=
StatusText=step 1400
FragmentPath=/etc/systemd/system/flashfleet-train@.service
"""

JOURNAL = "\n".join(json.dumps(e) for e in [
    {"__REALTIME_TIMESTAMP": "1764525600000000", "_PID": "1", "_SYSTEMD_UNIT": "init.scope",
     "UNIT": "flashfleet-train@v2.service", "INVOCATION_ID": "6c1e0d6b2f0a4d5c9e8f7a6b5c4d3e21",
     "MESSAGE_ID": "7d4958e842da4a758f6c1cdc7b36dcc5", "PRIORITY": "6",
     "MESSAGE": "Starting flashfleet-train@v2.service - flashfleet DFlash training run v2..."},
    {"__REALTIME_TIMESTAMP": "1764525655000000", "_PID": "1", "_SYSTEMD_UNIT": "init.scope",
     "UNIT": "flashfleet-train@v2.service", "INVOCATION_ID": "6c1e0d6b2f0a4d5c9e8f7a6b5c4d3e21",
     "MESSAGE_ID": "39f53479d3a045ac8e11786248231fbf", "PRIORITY": "6",
     "MESSAGE": "Started flashfleet-train@v2.service - flashfleet DFlash training run v2."},
    {"__REALTIME_TIMESTAMP": "1764526000000000", "_PID": "812", "_SYSTEMD_UNIT": "flashfleet-train@v2.service",
     "_SYSTEMD_INVOCATION_ID": "6c1e0d6b2f0a4d5c9e8f7a6b5c4d3e21", "PRIORITY": "6",
     "MESSAGE": [115, 116, 101, 112, 32, 255]},
    {"__REALTIME_TIMESTAMP": "1764527101000000", "_PID": "1", "_SYSTEMD_UNIT": "init.scope",
     "UNIT": "flashfleet-train@v2.service", "INVOCATION_ID": "6c1e0d6b2f0a4d5c9e8f7a6b5c4d3e21",
     "MESSAGE_ID": "98e322203f7a4ed290d09fe03c09fe15", "PRIORITY": "4", "EXIT_CODE": "killed", "EXIT_STATUS": "9",
     "MESSAGE": "flashfleet-train@v2.service: Main process exited, code=killed, status=9/KILL"},
    {"__REALTIME_TIMESTAMP": "1764527101000100", "_PID": "1", "_SYSTEMD_UNIT": "init.scope",
     "UNIT": "flashfleet-train@v2.service", "INVOCATION_ID": "6c1e0d6b2f0a4d5c9e8f7a6b5c4d3e21",
     "MESSAGE_ID": "d9b373ed55a64feb8242e02dbe79a49c", "PRIORITY": "4", "UNIT_RESULT": "signal",
     "MESSAGE": "flashfleet-train@v2.service: Failed with result 'signal'."},
]) + "\nnot json\n"

# platform.md: a container limit exceeded, as dmesg prints it (default format and --time-format iso)
DMESG_MONO = (
    "[ 5021.118230] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=libpod-5d1c,mems_allowed=0,"
    "oom_memcg=/libpod_parent/libpod-5d1c,task_memcg=/libpod_parent/libpod-5d1c,task=python3,pid=811234,uid=0\n"
    "[ 5021.118301] Memory cgroup out of memory: Killed process 811234 (python3) total-vm:412000kB, "
    "anon-rss:64960kB, file-rss:2048kB, shmem-rss:0kB, UID:0 pgtables:900kB oom_score_adj:0\n"
    "[ 5030.000001] eth0: renamed from veth1234\n"
)
DMESG_ISO = "2025-11-30T18:25:01,118230+00:00 Memory cgroup out of memory: Killed process 811234 (python3) total-vm:1kB\n"


def test_parse_systemctl_show():
    props = fe.parse_systemctl_show(SYSTEMCTL_SHOW)
    assert props["Result"] == "signal" and props["ExecMainCode"] == "2" and props["ExecMainStatus"] == "9"
    assert props["ControlGroup"] == "" and props["StatusText"] == "step 1400"
    assert fc.parse_systemd_time(props["ExecMainExitTimestamp"]) == 1764527101.0


def test_parse_journal_json_and_byte_messages():
    entries = fe.parse_journal_json(JOURNAL)
    assert len(entries) == 5
    assert fe.journal_message(entries[2]) == "step \ufffd"
    assert fe.parse_journal_json(JOURNAL, limit=2) == entries[-2:]


def test_parse_dmesg_lines():
    lines = [fe.parse_dmesg_line(x, boot_time=1764521580.0) for x in DMESG_MONO.splitlines()]
    assert lines[0]["__REALTIME_TIMESTAMP"] == str(int((1764521580.0 + 5021.118230) * 1e6))
    assert lines[1]["MESSAGE"].startswith("Memory cgroup out of memory: Killed process 811234")
    assert [fe.kernel_interesting(e["MESSAGE"]) for e in lines] == [True, True, False]
    iso = fe.parse_dmesg_line(DMESG_ISO.strip())
    assert iso["__REALTIME_TIMESTAMP"] == "1764527101118230"
    assert fe.parse_dmesg_line("<4>[   1.5] NVRM: loading")["MESSAGE"] == "NVRM: loading"
    assert fe.parse_dmesg_line("   ") is None


def test_parse_lock_and_drift():
    lock = ("# locked by uv\nwandb==0.31.0 \\\n    --hash=sha256:abc\npydantic==2.14.4  # via wandb\n"
            "torch==2.13.0+cpu ; sys_platform == 'linux'\nuvicorn[standard]==0.30.0\n-e .\n")
    pins = locks.parse(lock)
    assert pins == {"wandb": "0.31.0", "pydantic": "2.14.4", "torch": "2.13.0+cpu", "uvicorn": "0.30.0"}
    drift, missing, unlocked = fe.venv_drift(pins, {"wandb": "0.27.0", "Pydantic": "2.14.4", "torch": "2.13.0+cpu",
                                                    "pip": "25.0"})
    assert drift == [{"name": "wandb", "locked": "0.31.0", "installed": "0.27.0"}]
    assert missing == ["uvicorn"]
    assert unlocked == ["pip"]


def test_a_local_version_pin_compares_per_pep_440():
    """`==2.13.0+cpu` wants exactly that build; `==2.13.0` accepts any local build of 2.13.0."""
    pins = locks.parse("torch==2.13.0+cpu\nnumpy==2.3.1\n")
    drift, missing, _ = fe.venv_drift(pins, {"torch": "2.13.0", "numpy": "2.3.1+local"})
    assert drift == [{"name": "torch", "locked": "2.13.0+cpu", "installed": "2.13.0"}] and missing == []
    drift, _, _ = fe.venv_drift(pins, {"torch": "2.13.0+cu128", "numpy": "2.3.1"})
    assert drift == [{"name": "torch", "locked": "2.13.0+cpu", "installed": "2.13.0+cu128"}]
    assert fe.venv_drift(pins, {"torch": "2.13.0+cpu", "numpy": "2.3.1"})[0] == []


def test_a_lock_that_does_not_parse_is_a_recorded_problem(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    lock = venv / "flashfleet.lock"
    lock.write_text("wandb==0.31.0\nwandb>=0.30\n")
    out = fe.gather_venv(fe.Host(), str(venv), str(lock))
    assert out["readable"] is False and out["drift"] == [] and out["checked"] == 0
    assert str(lock) in out["error"] and "line 2" in out["error"] and "wandb>=0.30" in out["error"]
    lock.write_text("# nothing pinned\n")
    assert "no pins" in fe.gather_venv(fe.Host(), str(venv), str(lock))["error"]


def test_memory_events_and_nvidia_smi():
    assert fe.parse_memory_events("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n")["oom_kill"] == 1
    assert fe.parse_memory_events("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")["oom_kill"] == 3
    fields = ("index", "name", "pci.bus_id")
    rows = fe.parse_nvidia_smi_csv("0, NVIDIA H200, 00000000:19:00.0\n1, NVIDIA H200, 00000000:3B:00.0\n", fields)
    assert rows[1] == {"index": "1", "name": "NVIDIA H200", "pci.bus_id": "00000000:3B:00.0"}


def _safetensors(path: Path, data_len: int, claimed: int | None = None):
    header = json.dumps({"w": {"dtype": "F32", "shape": [data_len // 4], "data_offsets": [0, claimed or data_len]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * data_len)


def _checkpoint(d: Path, step: int, data_len: int = 64, claimed: int | None = None, sums: str | None = "x"):
    """A checkpoint as the trainer writes it (checkpoint.write_manifest); `sums` replaces the
    manifest's sha256 values (sizes stay right), None keeps the real ones."""
    d.mkdir(parents=True)
    _safetensors(d / checkpoint.WEIGHTS, data_len, claimed)
    (d / checkpoint.CONFIG).write_text('{"block_size": 4}')
    (d / checkpoint.STATE).write_bytes(b"state" * 10)
    manifest = checkpoint.write_manifest(str(d), step)
    if sums is not None:
        for entry in manifest["files"].values():
            entry["sha256"] = sums
        (d / checkpoint.MANIFEST).write_text(json.dumps(manifest))


def test_checkpoint_state(tmp_path):
    ck = tmp_path / "checkpoints"
    for step, good in ((1000, True), (2000, True), (3000, False)):
        _checkpoint(ck / checkpoint.step_dir_name(step), step, 64, None if good else 128)
    (ck / "step-00004000").mkdir()  # no manifest: not complete
    (ck / checkpoint.temp_dir_name(5000, 4242)).mkdir()  # a save in progress, as the trainer names it
    state = fe.checkpoint_state(str(ck))
    assert state["newest"]["name"] == "step-00002000"
    assert state["newest"]["safetensors_ok"] is True and state["newest"]["bytes"] > 64
    assert [c["name"] for c in state["incomplete"]] == ["step-00003000", "step-00004000"]
    # the weights' header claims 128 data bytes, the file has 64 (the contract's header check)
    assert "drafter.safetensors" in state["incomplete"][0]["problems"][0]
    assert "outside the 64-byte data" in state["incomplete"][0]["problems"][0]
    assert state["incomplete"][0]["safetensors_ok"] is False
    assert "no manifest.json" in state["incomplete"][1]["problems"][0]
    assert state["in_progress"][0]["name"] == ".tmp-step-5000-4242"
    assert state["in_progress"][0]["step"] == 5000 and state["in_progress"][0]["pid"] == 4242
    assert fe.checkpoint_state(str(tmp_path / "none"))["readable"] is False
    with_sum = fe.checkpoint_state(str(ck), checksum=True)
    assert with_sum["newest"] is None  # the manifests' "x" sums do not match


def test_a_checkpoint_with_truncated_weights_is_incomplete(tmp_path):
    """Truncated after its manifest was written (sizes differ), or before (the manifest agrees with
    the short file, the safetensors header does not): incomplete either way, never the newest."""
    ck = tmp_path / "checkpoints"
    _checkpoint(ck / "step-00000100", 100, 4096, sums=None)
    _checkpoint(ck / "step-00000200", 200, 4096, sums=None)
    weights = ck / "step-00000200" / checkpoint.WEIGHTS
    full = weights.stat().st_size
    with weights.open("r+b") as f:
        f.truncate(full - 1000)
    state = fe.checkpoint_state(str(ck))
    assert [c["name"] for c in state["complete"]] == ["step-00000100"]
    assert state["newest"]["name"] == "step-00000100"
    bad = state["incomplete"][0]
    assert bad["name"] == "step-00000200" and not bad["ok"]
    assert bad["problems"] == [f"drafter.safetensors: {full - 1000} bytes, manifest says {full}"]

    checkpoint.write_manifest(str(ck / "step-00000200"), 200)  # a manifest of the short file
    state = fe.checkpoint_state(str(ck), checksum=True)
    bad = state["incomplete"][0]
    assert bad["name"] == "step-00000200" and bad["safetensors_ok"] is False
    assert any("drafter.safetensors:" in p and "outside" in p for p in bad["problems"]), bad
    assert state["newest"]["name"] == "step-00000100"


def _stub(bindir: Path, name: str, body: str):
    path = bindir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


@pytest.fixture
def stubbed_host(tmp_path, monkeypatch):
    """systemctl/journalctl/dmesg stubs that replay the recorded text above; dmesg is restricted."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (tmp_path / "show.txt").write_text(SYSTEMCTL_SHOW)
    (tmp_path / "journal.json").write_text(JOURNAL)
    _stub(bindir, "systemctl", f'cat "{tmp_path}/show.txt"\n')
    _stub(bindir, "journalctl", f'case "$*" in *-k*) exit 0;; esac\ncat "{tmp_path}/journal.json"\n')
    _stub(bindir, "dmesg", 'echo "dmesg: read kernel buffer failed: Operation not permitted" >&2\nexit 1\n')
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    out = tmp_path / "out"
    (out / "checkpoints").mkdir(parents=True)
    (out / "status.json").write_text(json.dumps({"phase": "training", "step": 1400, "ready": True, "pid": 812,
                                                 "started": 1764525600.0, "updated": 1764527100.0}))
    (out / "metrics.jsonl").write_text('{"step": 1399}\n{"step": 1400, "loss": 2.5}\n{"trunc')
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / "flashfleet.lock").write_text("pytest==0.0.1\nno-such-package==1.0\n")
    return {"run": "v2", "output_dir": str(out), "venv": str(venv), "config_dir": str(tmp_path / "etc"),
            "lock": str(venv / "flashfleet.lock"), "shm": str(tmp_path)}


def test_gather_end_to_end_unreadable_kernel(stubbed_host):
    ev = fe.gather(stubbed_host)
    assert ev["unit_props"]["properties"]["Result"] == "signal"
    assert len(ev["journal"]["entries"]) == 5
    assert ev["kernel"]["readable"] is False
    assert "Operation not permitted" in ev["kernel"]["error"]
    assert ev["metrics"]["last"] == {"step": 1400, "loss": 2.5}
    assert ev["venv"]["readable"] and ev["venv"]["drift"][0]["name"] == "pytest"
    assert ev["venv"]["missing"] == ["no-such-package"]
    assert ev["disk"]["output_dir"]["free_bytes"] > 0
    assert ev["elapsed_s"] < 10
    json.dumps(ev)  # the fixture format is plain JSON
    verdict = fc.classify(ev)
    assert verdict["verdict"] == "killed-by-signal"
    assert "kernel log unreadable, OOM not ruled out" in verdict["reason"]


def test_gather_reads_dmesg_when_the_journal_has_no_kernel_lines(stubbed_host, tmp_path):
    bindir = Path(os.environ["PATH"].split(":")[0])
    (tmp_path / "dmesg.txt").write_text(DMESG_ISO.replace("18:25:01", "18:25:00"))
    _stub(bindir, "dmesg", f'cat "{tmp_path}/dmesg.txt"\n')
    ev = fe.gather(stubbed_host)
    assert ev["kernel"]["readable"] and ev["kernel"]["source"] == "dmesg"
    assert len(ev["kernel"]["entries"]) == 1
    verdict = fc.classify(ev)
    assert verdict["verdict"] == "cgroup-oom-kill" and "tied by time" in verdict["reason"]


def test_disk_state_follows_checkpoints_to_another_filesystem(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    assert "checkpoints" not in fe.disk_state(str(run), str(tmp_path))
    (run / "checkpoints").mkdir()
    assert "checkpoints" not in fe.disk_state(str(run), str(tmp_path)), "same filesystem: nothing extra"
    (run / "checkpoints").rmdir()
    if os.stat("/dev/shm").st_dev == os.stat(str(run)).st_dev:
        pytest.skip("/dev/shm is on the same filesystem as the test's tmp dir here")
    (run / "checkpoints").symlink_to("/dev/shm")
    disk = fe.disk_state(str(run), "/dev/shm")
    assert disk["checkpoints"]["realpath"] == "/dev/shm"
    assert disk["checkpoints"]["free_bytes"] == disk["shm"]["free_bytes"]


def test_run_window_starts_at_the_status_files_iso_time():
    status = {"data": {"started": "2026-11-30T18:56:34Z"}}
    assert fe.run_window_start({"properties": {}}, {"entries": []}, status) == 1796064994.0 - 60
    assert fe.run_window_start({"properties": {}}, {"entries": []}, {"data": {"started": 1796064994}}) == 1796064994.0 - 60


def test_gather_records_an_unparseable_lock_and_goes_on(stubbed_host):
    Path(stubbed_host["lock"]).write_text("pytest==0.0.1\n<<<<<<< HEAD\n")
    ev = fe.gather(stubbed_host)
    assert ev["venv"]["readable"] is False and "line 2 is not a name==version pin" in ev["venv"]["error"]
    assert ev["unit_props"]["readable"] and ev["metrics"]["last"] == {"step": 1400, "loss": 2.5}
    assert fc.classify(ev)["verdict"] == "killed-by-signal"


def test_gather_wants_the_host_paths_and_a_valid_run_name(stubbed_host):
    for key in ("output_dir", "config_dir", "venv", "lock"):
        with pytest.raises(fe.EvidenceError, match=key):
            fe.gather({k: v for k, v in stubbed_host.items() if k != key})
    with pytest.raises(fe.EvidenceError, match="invalid run name"):
        fe.gather(dict(stubbed_host, run="../etc"))


def test_gather_reads_status_through_the_contract(stubbed_host):
    status = Path(stubbed_host["output_dir"]) / "status.json"
    status.write_text('{"phase": "exploding", "step": 3}')
    ev = fe.gather(stubbed_host)
    assert ev["status"]["readable"] is False and "unknown phase 'exploding'" in ev["status"]["error"]
    assert ev["status"]["data"] is None
    status.unlink()
    ev = fe.gather(stubbed_host)
    assert ev["status"]["readable"] is False and str(status) in ev["status"]["error"]


def test_gather_servers_finds_the_runs_units_only():
    """The run's vLLM server units come from systemd's list (another run named alike is not taken),
    each with its record and journal; without systemctl the servers are unreadable, not absent."""
    class FakeHost:
        def __init__(self):
            self.asked = []

        def run(self, argv, timeout=None):
            self.asked.append(argv)
            if argv[:2] == ["systemctl", "list-units"]:
                return 0, ("● flashfleet-vllm@v2-1.service loaded failed failed flashfleet vLLM server\n"
                           "  flashfleet-vllm@v2-ada-0.service loaded active running flashfleet vLLM server\n"), ""
            if argv[:2] == ["systemctl", "show"]:
                return 0, "ActiveState=failed\nResult=signal\n", ""
            return 0, JOURNAL, ""

    host = FakeHost()
    got = fe.gather_servers(host, "v2", 100)
    assert got["readable"] and [u["unit"] for u in got["units"]] == ["flashfleet-vllm@v2-1.service"]
    unit = got["units"][0]
    assert unit["unit_props"]["properties"]["Result"] == "signal" and len(unit["journal"]["entries"]) == 5
    assert ["journalctl", "-u", "flashfleet-vllm@v2-1.service"] in [a[:3] for a in host.asked]

    class NoSystemd:
        def run(self, argv, timeout=None):
            return 127, "", "systemctl: not found"

    assert fe.gather_servers(NoSystemd(), "v2", 100) == {"readable": False, "error": "systemctl: not found", "units": []}


def test_a_dead_server_is_a_warning_while_the_trainer_runs():
    """The trainer still runs (it waits for a restarting server): the host's verdict stays running
    and the dead server is named in a warning."""
    base = json.loads((Path(__file__).parents[1] / "fixtures/evidence/handbuilt/running.json").read_text())
    dead = json.loads((Path(__file__).parents[1] / "fixtures/evidence/handbuilt/server-kv-cache.json").read_text())
    base["servers"] = dead["servers"]
    out = fc.classify(base)
    assert out["verdict"] == "running"
    assert any(w.startswith("vLLM server down: server-kv-cache: flashfleet-vllm@v2-0.service") for w in out["warnings"])


def test_a_busy_servers_earlier_death_is_kept_beyond_the_journals_tail():
    """A server that restarted and served on pushes its death out of the last N entries: systemd's
    messages about it and the output of its last failed invocation are gathered beside the tail
    (reproduced on real systemd: a tail of 50 lines lost a SIGKILL that these queries keep)."""
    unit, dead, alive = "flashfleet-vllm@v2-0.service", "d" * 32, "a" * 32

    def entry(t, msg, pid="1", inv=dead, **fields):
        e = {"__REALTIME_TIMESTAMP": str(t * 1_000_000), "_PID": pid, "MESSAGE": msg, **fields}
        e.update({"INVOCATION_ID": inv, "UNIT": unit, "_SYSTEMD_UNIT": "init.scope"} if pid == "1"
                 else {"_SYSTEMD_INVOCATION_ID": inv, "_SYSTEMD_UNIT": unit})
        return e

    manager = [entry(1, f"Started {unit}.", MESSAGE_ID=fc.MID_STARTED),
               entry(5, f"{unit}: Main process exited, code=killed, status=9/KILL", EXIT_CODE="killed", EXIT_STATUS="9",
                     MESSAGE_ID=fc.MID_PROCESS_EXIT),
               entry(5, f"{unit}: Failed with result 'signal'.", UNIT_RESULT="signal", MESSAGE_ID=fc.MID_RESULT),
               entry(9, f"Started {unit}.", inv=alive, MESSAGE_ID=fc.MID_STARTED)]
    output = [entry(4, "ERROR engine: the last words", pid="77")]
    tail = [entry(100 + i, "tick", pid="88", inv=alive) for i in range(4)]

    class FakeHost:
        def run(self, argv, timeout=None):
            text = {"-u": tail, "_PID=1": manager, f"_SYSTEMD_INVOCATION_ID={dead}": output}[argv[1]]
            return 0, "\n".join(json.dumps(e) for e in text), ""

    got = fe.gather_server_journal(FakeHost(), unit, 4)  # the tail: ticks only
    assert [e["MESSAGE"] for e in got["entries"]][:3] == [f"Started {unit}.", "ERROR engine: the last words",
                                                           f"{unit}: Main process exited, code=killed, status=9/KILL"]
    props = {"ActiveState": "active", "SubState": "running", "InvocationID": alive}
    server = {"unit": unit, "unit_props": {"properties": props}, "journal": got}
    (death,) = fc.server_deaths({"servers": {"units": [server]}, "kernel": {}})
    assert death.verdict == "server-died" and "signal 9/KILL" in death.reason and death.extra["up_again"]
