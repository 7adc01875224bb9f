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


def test_a_checkpoint_without_its_marker_is_ignored_by_trainer_and_diagnose(tmp_path):
    """The marker is written last: a step directory with every file and a matching manifest but no
    marker (a save killed between the two, or a format-1 checkpoint) is not complete for the
    trainer's resume nor for diagnose's evidence (both read flashfleet.contract.checkpoint)."""
    from flashfleet import evidence
    from flashfleet.contract import checkpoint as contract

    _save(tmp_path, 1, 1.0)
    p2 = _save(tmp_path, 2, 2.0)
    marker = p2 / contract.MARKER
    assert marker.is_file() and ck.newest_complete(tmp_path) == p2
    assert sorted(f.name for f in p2.iterdir()) == sorted([*contract.PAYLOAD, contract.MANIFEST, contract.MARKER])
    marker.unlink()
    assert ck.newest_complete(tmp_path).name == "step-00000001"
    assert "no COMPLETE marker" in contract.verify(p2)[0]
    state = evidence.checkpoint_state(str(tmp_path), checksum=True)
    assert state["newest"]["name"] == "step-00000001"
    assert [c["name"] for c in state["incomplete"]] == ["step-00000002"]
    with pytest.raises(ValueError, match="COMPLETE"):
        ck.load_checkpoint(p2)


def test_kill_mid_prune_leaves_trash_that_the_next_start_cleans(tmp_path):
    """Pruning renames first: a kill during the delete leaves `.trash-step-*` of a dead pid (here
    made by hand, half deleted), never a half-deleted `step-*`; prepare() removes it."""
    from flashfleet.contract import checkpoint as contract

    for s in (1, 2, 3):
        _save(tmp_path, s, s, keep=3)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    trash = tmp_path / contract.trash_dir_name(1, dead.pid)
    os.rename(tmp_path / "step-00000001", trash)
    (trash / ck.WEIGHTS).unlink()  # the delete got this far
    assert [p.name for p in ck.complete_checkpoints(tmp_path)] == ["step-00000002", "step-00000003"]
    assert ck.prepare(tmp_path, log=lambda s: None) == []
    assert not trash.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000002", "step-00000003"]
    w, _cfg, st = ck.load_checkpoint(ck.newest_complete(tmp_path))
    assert st["step"] == 3 and w["w"][0].item() == 3.0
    _save(tmp_path, 4, 4.0, keep=2)  # a prune leaves no trash behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000003", "step-00000004"]


def test_corrupt_newest_is_moved_aside_loudly_never_deleted(tmp_path, capsys):
    from flashfleet.contract import checkpoint as contract
    from flashfleet.contract import messages

    _save(tmp_path, 1, 1.0)
    bad = _save(tmp_path, 2, 2.0)
    data = bytearray((bad / ck.WEIGHTS).read_bytes())
    data[-1] ^= 0xFF
    (bad / ck.WEIGHTS).write_bytes(bytes(data))
    kept = (bad / ck.WEIGHTS).read_bytes()
    moved = ck.prepare(tmp_path, log=lambda s: None)
    err = capsys.readouterr().err.strip().splitlines()
    assert [p.name for p in moved] == ["step-00000002.corrupt-1"] and not bad.exists()
    assert len(err) == 1 and err[0].startswith(messages.WARNING_PREFIX)
    assert str(bad) in err[0] and "sha256 differs" in err[0] and "resuming from step-00000001" in err[0]
    assert (moved[0] / ck.WEIGHTS).read_bytes() == kept
    assert contract.quarantined(tmp_path) == ["step-00000002.corrupt-1"]
    # the run re-saves step 2: the quarantined copy stays; a second bad step 2 gets the next name
    _save(tmp_path, 2, 2.5)
    assert (moved[0] / ck.WEIGHTS).read_bytes() == kept
    (tmp_path / "step-00000002" / contract.MARKER).unlink()
    _save(tmp_path, 2, 2.75)
    assert "moved aside to step-00000002.corrupt-2" in capsys.readouterr().err
    assert contract.quarantined(tmp_path) == ["step-00000002.corrupt-1", "step-00000002.corrupt-2"]
    assert ck.load_checkpoint(tmp_path / "step-00000002")[0]["w"][0].item() == 2.75


def test_trainer_state_loads_without_pickle(tmp_path):
    """weights_only=True: a state holding an arbitrary object is refused, not executed."""
    import pickle

    p = _save(tmp_path, 1, 1.0)
    torch.save({"step": 1, "evil": ck.Path("x")}, p / ck.STATE)
    from flashfleet.contract import checkpoint as contract

    contract.write_manifest(p, 1)
    with pytest.raises(pickle.UnpicklingError):
        ck.load_checkpoint(p)


def test_cuda_rng_restore_is_a_no_op_without_states():
    assert ck.restore_cuda_rng(None) == 0
    if not torch.cuda.is_available():
        assert ck.restore_cuda_rng([torch.zeros(8, dtype=torch.uint8)]) == 0
