"""Scaling the trainer on CPU: target worker processes feeding data-parallel drafter ranks (gloo),
a dead worker ending the run, SIGTERM across ranks, two nodes on one machine, and --plan."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from flashfleet_trainer.checkpoint import complete_checkpoints
from flashfleet_trainer.cli import main
from flashfleet_trainer.config import EX_CONFIG, parse_devices
from safetensors.torch import load_file


def _metrics(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _start(argv, tmp_path):
    """dflash-train as a real process with a real sd_notify socket (the unit's view)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "n.sock"))
    env = {**os.environ, "NOTIFY_SOCKET": str(tmp_path / "n.sock")}
    proc = subprocess.Popen([sys.executable, "-m", "flashfleet_trainer.cli", *argv], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, sock


def _wait_ready(sock, proc, timeout=120):
    sock.settimeout(2)
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        try:
            if sock.recv(4096).decode().startswith("READY=1"):
                return
        except TimeoutError:
            pass
    raise AssertionError(f"no READY=1 (rc {proc.poll()}): {proc.stderr.read() if proc.poll() is not None else ''}")


def _workers(out):
    return json.loads((out / "status.json").read_text())["workers"]


def test_cpu_devices_may_repeat_gpu_indices_may_not():
    assert parse_devices("cpu,cpu", "--target-gpus") == ["cpu", "cpu"]
    assert parse_devices("0,1", "--target-gpus") == ["cuda:0", "cuda:1"]
    with pytest.raises(Exception, match="distinct"):
        parse_devices("1,1", "--target-gpus")


def test_two_targets_two_drafters_match_one_plus_one(trainer_argv, tmp_path):
    """Same seed and data: 1+1 accumulating 2 micro-batches = 2+2 with one each (same blocks, same
    averaged gradient), so the loss trajectory and the weights agree."""
    one, two = tmp_path / "one", tmp_path / "two"
    common = ("--max-steps", "3", "--use-soft-labels", "--save-interval", "100")
    assert main(trainer_argv(*common, "--grad-accum", "2", out=one)) == 0
    assert main(trainer_argv(*common, "--grad-accum", "1", "--target-gpus", "cpu,cpu", "--drafter-gpus", "cpu,cpu",
                             out=two)) == 0
    a, b = _metrics(one), _metrics(two)
    assert [r["step"] for r in b] == [1, 2, 3]
    assert [r["loss"] for r in b] == pytest.approx([r["loss"] for r in a], rel=1e-4)
    assert [r["rows"] for r in b] == [r["rows"] for r in a]
    for r in b:
        for k in ("target_tokens_per_s", "drafter_rows_per_s", "queue_occupancy", "target_idle_frac",
                  "drafter_idle_frac"):
            assert r[k] is not None and r[k] >= 0, k
        assert 0 <= r["queue_occupancy"] <= 1 and 0 <= r["target_idle_frac"] <= 1
    wa = load_file(str(one / "checkpoints" / "step-00000003" / "drafter.safetensors"))
    wb = load_file(str(two / "checkpoints" / "step-00000003" / "drafter.safetensors"))
    for k in wa:
        assert (wa[k] - wb[k]).abs().max().item() < 1e-4, k
    st = json.loads((two / "status.json").read_text())
    assert st["phase"] == "completed" and st["step"] == 3 and st["pid"] == os.getpid()
    assert [w["role"] for w in st["workers"]] == ["target worker"] * 2 + ["drafter rank"] * 2
    assert [p.name for p in complete_checkpoints(two / "checkpoints")] == ["step-00000003"]  # rank 0 only


def test_dead_target_worker_ends_the_run_with_a_clear_error(trainer_argv, tmp_path):
    out = tmp_path / "run"
    argv = trainer_argv("--max-steps", "100000", "--save-interval", "100000", "--target-gpus", "cpu,cpu",
                        "--drafter-gpus", "cpu", out=out)
    proc, sock = _start(argv, tmp_path)
    try:
        _wait_ready(sock, proc)
        victim = [w for w in _workers(out) if w["role"] == "target worker" and w["index"] == 1][0]
        os.kill(victim["pid"], signal.SIGKILL)
        t0 = time.time()
        rc = proc.wait(30)
        took = time.time() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sock.close()
    err = proc.stderr.read()
    assert rc == 1 and took < 15, err
    line = [x for x in err.splitlines() if x.startswith("flashfleet-train: error:")]
    assert line and "target worker 1" in line[0] and str(victim["pid"]) in line[0] and "SIGKILL" in line[0], err
    st = json.loads((out / "status.json").read_text())
    assert st["phase"] == "failed" and "target worker 1" in st["last_error"]
    for w in st["workers"]:  # nothing left behind
        with pytest.raises(ProcessLookupError):
            os.kill(w["pid"], 0)


def test_sigterm_stops_all_ranks_at_one_step_and_rank0_saves(trainer_argv, tmp_path):
    """systemd sends SIGTERM to every process of the unit; ranks agree on the step to stop after."""
    out = tmp_path / "run"
    argv = trainer_argv("--max-steps", "100000", "--save-interval", "100000", "--drafter-gpus", "cpu,cpu",
                        out=out)
    proc, sock = _start(argv, tmp_path)
    try:
        _wait_ready(sock, proc)
        for pid in [proc.pid] + [w["pid"] for w in _workers(out)]:
            os.kill(pid, signal.SIGTERM)
        rc = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sock.close()
    assert rc == 0, proc.stderr.read()
    st = json.loads((out / "status.json").read_text())
    assert st["phase"] == "stopped" and st["step"] >= 1
    assert complete_checkpoints(out / "checkpoints")[-1].name == f"step-{st['step']:08d}"


def test_two_nodes_rendezvous_on_one_machine(trainer_argv, tmp_path):
    """Two dflash-train processes, --nnodes 2, one c10d store: one checkpoint stream, on node 0."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for node in (0, 1):
        argv = trainer_argv("--max-steps", "2", "--nnodes", "2", "--node-rank", str(node), "--rdzv-endpoint",
                            f"127.0.0.1:{port}", "--rdzv-timeout", "60", out=tmp_path / f"node{node}")
        procs.append(subprocess.Popen([sys.executable, "-m", "flashfleet_trainer.cli", *argv],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        rcs = [p.wait(120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    logs = [p.stdout.read() for p in procs]
    assert rcs == [0, 0], logs
    assert "all 2 nodes joined" in logs[1]
    assert [r["step"] for r in _metrics(tmp_path / "node0")] == [1, 2]
    assert not (tmp_path / "node1" / "checkpoints").exists() and not (tmp_path / "node1" / "metrics.jsonl").exists()


def test_rendezvous_needs_an_endpoint(trainer_argv, capsys):
    monkey_env = {k: os.environ.pop(k) for k in ("MASTER_ADDR", "MASTER_PORT") if k in os.environ}
    try:
        assert main(trainer_argv("--nnodes", "2", "--check")) == EX_CONFIG
    finally:
        os.environ.update(monkey_env)
    assert "--rdzv-endpoint" in capsys.readouterr().err


def test_plan_prints_a_split(trainer_argv, capsys):
    assert main(trainer_argv("--plan", "--plan-steps", "2", "--target-gpus", "cpu,cpu",
                             "--drafter-gpus", "cpu,cpu")) == 0
    out = capsys.readouterr().out
    assert "tokens/s" in out and "rows/s" in out
    assert "plan:   1 target + 3 drafter" in out and "plan:   3 target + 1 drafter" in out
    best = [x for x in out.splitlines() if x.startswith("plan: best split of 4 device(s)")]
    assert best and "--target-gpus cpu" in best[0] and "--drafter-gpus cpu" in best[0]
