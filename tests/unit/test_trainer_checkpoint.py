"""Atomic checkpoints: an interrupted save never shadows the previous complete one."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from flashfleet_trainer import checkpoint as ck


def _save(root, step, value, **kw):
    return ck.save_checkpoint(root, step, {"w": torch.full((4,), float(value))}, {"block_size": 4},
                              {"step": step}, **kw)


def test_roundtrip_and_manifest(tmp_path):
    p = _save(tmp_path, 7, 1.5)
    assert p.name == "step-00000007" and ck.is_complete(p)
    w, cfg, st = ck.load_checkpoint(p)
    assert w["w"].tolist() == [1.5] * 4 and cfg == {"block_size": 4} and st["step"] == 7
    data = bytearray((p / ck.WEIGHTS).read_bytes())
    data[-1] ^= 0xFF
    (p / ck.WEIGHTS).write_bytes(bytes(data))  # same size, different content
    assert not ck.is_complete(p) and ck.newest_complete(tmp_path) is None


def test_failure_midway_leaves_previous_and_keeps_evidence(tmp_path):
    _save(tmp_path, 1, 1.0)

    def boom(_tmp):
        raise OSError("disk gone")

    with pytest.raises(OSError):
        _save(tmp_path, 2, 2.0, _before_manifest=boom)
    assert not (tmp_path / "step-00000002").exists()
    assert list(tmp_path.glob(".tmp-step-2-*"))  # nothing is deleted on failure
    newest = ck.newest_complete(tmp_path)
    assert newest.name == "step-00000001"
    assert ck.load_checkpoint(newest)[0]["w"][0].item() == 1.0
    # a directory renamed into place without a manifest is ignored as well
    (tmp_path / "step-00000009").mkdir()
    assert ck.newest_complete(tmp_path).name == "step-00000001"


def test_keep_newest_k(tmp_path):
    for s in range(1, 6):
        _save(tmp_path, s, s, keep=2)
    assert [p.name for p in ck.complete_checkpoints(tmp_path)] == ["step-00000004", "step-00000005"]


def test_sigkill_during_save_leaves_previous_loadable(tmp_path):
    _save(tmp_path, 1, 1.0)
    flag = tmp_path / "in-save"
    code = textwrap.dedent(f"""
        import pathlib, time, torch
        from flashfleet_trainer import checkpoint as ck
        def hang(tmp):
            pathlib.Path({str(flag)!r}).write_text(str(tmp))
            time.sleep(60)
        ck.save_checkpoint(pathlib.Path({str(tmp_path)!r}), 2, {{"w": torch.zeros(4)}}, {{}}, {{"step": 2}},
                           _before_manifest=hang)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.time() + 60
        while not flag.exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert flag.exists(), "the child never reached the middle of its save"
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    assert ck.newest_complete(tmp_path).name == "step-00000001"
    _save(tmp_path, 3, 3.0)  # the next successful save cleans up the dead process's temp dir
    assert not list(tmp_path.glob(".tmp-step-*"))
    assert ck.newest_complete(tmp_path).name == "step-00000003"
