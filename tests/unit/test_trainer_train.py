"""End to end on the tiny target: metrics/status/checkpoints, sd_notify, resume, SIGTERM."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from flashfleet_trainer.checkpoint import complete_checkpoints, is_complete
from flashfleet_trainer.cli import main
from flashfleet_trainer.config import parse_args
from flashfleet_trainer.launch import run
from safetensors.torch import load_file

METRIC_KEYS = {"step", "epoch", "time", "loss", "ce", "kl", "lr", "noise", "acc", "accept_proxy",
               "target_tokens_per_s", "drafter_rows_per_s", "peak_mem_bytes"}


def _bind(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(path))
    return s


def _drain(s):
    s.setblocking(False)
    out = []
    while True:
        try:
            out.append(s.recv(4096).decode())
        except BlockingIOError:
            return out


def test_short_run_writes_metrics_status_checkpoints_and_notifies(trainer_argv, trainer_tiny, tmp_path, monkeypatch):
    sock = _bind(tmp_path / "n.sock")
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "n.sock"))
    out = tmp_path / "run"
    argv = trainer_argv("--max-steps", "3", "--save-interval", "2", "--use-soft-labels", "--kl-weight", "0.5",
                        "--eval-num-prompts", "2", "--eval-max-new-tokens", "6", out=out)
    assert main(argv) == 0
    msgs = _drain(sock)
    sock.close()
    assert any(m.startswith("STATUS=loading target") for m in msgs)
    ready = [i for i, m in enumerate(msgs) if m.startswith("READY=1")]
    assert len(ready) == 1 and msgs.count("WATCHDOG=1") == 3
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if "tau" not in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert METRIC_KEYS <= set(r) and len(r["acc"]) == 3 and r["kl"] is not None
    assert steps[0]["noise"] == pytest.approx(0.1) and steps[2]["noise"] < steps[1]["noise"] < 0.1
    assert steps[0]["lr"] > 0
    tau = [r for r in recs if "tau" in r]
    assert len(tau) == 1 and 1.0 <= tau[0]["tau"] <= 4.0
    st = json.loads((out / "status.json").read_text())
    assert st["phase"] == "completed" and st["ready"] and st["step"] == 3 and st["last_error"] is None
    names = [p.name for p in complete_checkpoints(out / "checkpoints")]
    assert names == ["step-00000002", "step-00000003"] and st["newest_checkpoint"].endswith("step-00000003")
    from flashfleet_trainer.drafter import load_drafter

    drafter = load_drafter(out / "checkpoints" / "step-00000003")  # loads standalone for inference
    assert drafter.config.block_size == 4

    # Started again (systemd restarts a unit, or train.yml with a changed flag): nothing is left to
    # train, and READY must still come, or a Type=notify start fails with Result=protocol.
    sock = _bind(tmp_path / "n.sock.2")
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "n.sock.2"))
    assert main(trainer_argv("--max-steps", "3", "--eval-num-prompts", "0", out=out)) == 0
    again = _drain(sock)
    sock.close()
    assert [m for m in again if m.startswith("READY=1")], again
    assert json.loads((out / "status.json").read_text())["step"] == 3


def test_resume_equivalence_and_auto_skips_incomplete(trainer_argv, tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    common = ("--max-steps", "4", "--save-interval", "100", "--grad-accum", "2", "--loss-weighting", "streak")
    assert run(parse_args(trainer_argv(*common, out=straight)), log=lambda s: None) == 0

    def stop_at_2(trainer):
        if trainer.step == 2:
            trainer.request_stop()  # the SIGTERM path: finish the step, save, stop

    assert run(parse_args(trainer_argv(*common, out=split)), log=lambda s: None, on_step=stop_at_2) == 0
    assert json.loads((split / "status.json").read_text())["phase"] == "stopped"
    # a crashed later save must not be picked up by --resume auto
    broken = split / "checkpoints" / "step-00000003"
    broken.mkdir()
    (broken / "drafter.safetensors").write_bytes(b"half")
    logs = []
    assert run(parse_args(trainer_argv(*common, out=split)), log=logs.append) == 0
    assert any("resumed from" in s and "step-00000002" in s for s in logs)
    a = load_file(str(straight / "checkpoints" / "step-00000004" / "drafter.safetensors"))
    b = load_file(str(split / "checkpoints" / "step-00000004" / "drafter.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert (a[k] - b[k]).abs().max().item() < 1e-5, k
    la = [json.loads(x)["loss"] for x in (straight / "metrics.jsonl").read_text().splitlines()]
    lb = [json.loads(x)["loss"] for x in (split / "metrics.jsonl").read_text().splitlines()]
    assert lb == pytest.approx(la, rel=1e-5)


def test_sigterm_saves_and_exits_zero(trainer_argv, tmp_path):
    out = tmp_path / "run"
    sock = _bind(tmp_path / "n.sock")
    env = {**os.environ, "NOTIFY_SOCKET": str(tmp_path / "n.sock")}
    argv = trainer_argv("--max-steps", "100000", "--save-interval", "100000", out=out)
    proc = subprocess.Popen([sys.executable, "-m", "flashfleet_trainer.cli", *argv], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        sock.settimeout(120)
        deadline = time.time() + 120
        while time.time() < deadline:
            if sock.recv(4096).decode().startswith("READY=1"):
                break
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        sock.close()
    log = proc.stdout.read()
    assert rc == 0, log
    st = json.loads((out / "status.json").read_text())
    assert st["phase"] == "stopped" and st["step"] >= 1
    newest = complete_checkpoints(out / "checkpoints")[-1]
    assert is_complete(newest) and st["newest_checkpoint"] == str(newest)
    assert int(newest.name.split("-")[1]) == st["step"]


def test_runtime_crash_is_recorded_then_propagates(trainer_argv, tmp_path, monkeypatch):
    from flashfleet_trainer import trainer

    def boom(self):
        raise RuntimeError("synthetic failure in a step")

    monkeypatch.setattr(trainer.Trainer, "launch_step", boom)
    out = tmp_path / "run"
    with pytest.raises(RuntimeError, match="synthetic"):
        main(trainer_argv("--max-steps", "2", out=out))
    st = json.loads((out / "status.json").read_text())
    assert st["phase"] == "failed" and "synthetic failure" in st["last_error"]


def test_soft_labels_at_kl_weight_0_skip_the_targets_final_state_and_train_as_ce_only(trainer_argv, tmp_path,
                                                                                       monkeypatch):
    """--use-soft-labels with --kl-weight 0 has no teacher term: the target stops at its deepest
    feature layer as in a CE-only run (the feed never asks for the final state), the trainer
    gathers no teacher rows, and the losses are the CE-only run's; a KL weight above 0 asks for it."""
    from flashfleet_trainer.target import HiddenStateProducer

    asked, real = [], HiddenStateProducer.forward_batch

    def spy(self, ids, lengths, want_last=True, **kw):
        asked.append(want_last)
        return real(self, ids, lengths, want_last=want_last, **kw)

    monkeypatch.setattr(HiddenStateProducer, "forward_batch", spy)
    runs = {}
    for name, extra in (("ce", ("--no-use-soft-labels",)), ("kl0", ("--use-soft-labels", "--kl-weight", "0")),
                        ("kl", ("--use-soft-labels", "--kl-weight", "0.5"))):
        asked.clear()  # on the data's labels (the default's argmax labels read the final state too)
        assert main(trainer_argv("--max-steps", "2", "--ce-target", "data", *extra, out=tmp_path / name)) == 0
        recs = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        runs[name] = [r["loss"] for r in recs if "tau" not in r], set(asked)
    assert runs["kl0"] == runs["ce"] and runs["ce"][1] == {False} and len(runs["ce"][0]) == 2
    assert runs["kl"][1] == {True} and runs["kl"][0] != runs["ce"][0]


def test_a_longer_schedule_on_resume_sets_the_lr_of_the_resumed_step(trainer_argv, tmp_path):
    """Resumed with --max-steps raised, the first step after the resume runs at the new schedule's LR
    for its step (it ran at the old one's, 0.0 at the end of a cosine, before), and the start says so."""
    from flashfleet_trainer.trainer import lr_lambda

    out = tmp_path / "run"
    common = ("--save-interval", "3", "--warmup-ratio", "0.2", "--lr", "1e-3")
    assert run(parse_args(trainer_argv(*common, "--max-steps", "3", out=out)), log=lambda s: None) == 0
    logs = []
    assert run(parse_args(trainer_argv(*common, "--max-steps", "5", out=out)), log=logs.append) == 0
    lrs = {r["step"]: r["lr"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "lr" in r}
    schedule = lr_lambda(5, 0.2)
    assert lrs[4] == pytest.approx(1e-3 * schedule(3)) and lrs[5] == pytest.approx(1e-3 * schedule(4))
    assert lrs[4] > 0
    assert any(s.startswith("schedule: 5 steps now, 3 when step-00000003 was saved") for s in logs), logs
