"""A start verifies the checkpoint it resumes from in full ONCE (preflight), and passes the result
on to `prepare` and the trainer's resume: sha256 of a large drafter's weights and optimizer state
is seconds to minutes per pass. Counted by wrapping the one hash function every full verification
goes through (flashfleet.contract.files.sha256), from the start up to the end of its first step."""

import shutil
from collections import Counter
from pathlib import Path

import pytest
from flashfleet.contract import checkpoint as contract
from flashfleet.contract import files
from flashfleet_trainer.config import parse_args
from flashfleet_trainer.errors import ConfigError
from flashfleet_trainer.launch import run

from tests.unit.conftest import tiny_argv

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def trained(trainer_tiny, tmp_path_factory):
    """A run of 2 steps with checkpoints step 1 and 2, trained once for the module (copied per test)."""
    out = tmp_path_factory.mktemp("trained") / "run"
    assert run(parse_args(tiny_argv(trainer_tiny, out, "--max-steps", "2", "--save-interval", "1")),
               log=lambda s: None) == 0
    assert [Path(p).name for p in contract.complete(out / "checkpoints")] == ["step-00000001", "step-00000002"]
    return out


@pytest.fixture
def start(trained, trainer_tiny, tmp_path, monkeypatch):
    """start(*flags, fresh=False) -> (Counter of hashes per checkpoint directory name, log lines): one start of
    a copy of the trained run, to step 3, hashes counted up to the end of its first step."""
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    seen, at_first_step = Counter(), []
    real = files.sha256

    def counting(path):
        p = Path(path)
        if p.parent.parent == out / "checkpoints" and p.name == contract.WEIGHTS:
            seen[p.parent.name] += 1  # one full verification (or a save's manifest) of that directory
        return real(path)

    monkeypatch.setattr(files, "sha256", counting)

    def on_step(_trainer):
        if not at_first_step:
            at_first_step.append(Counter(seen))

    def go(*flags, fresh=False):
        if fresh:  # a new copy of the trained run (the start before saved a step 3)
            shutil.rmtree(out)
            shutil.copytree(trained, out)
        logs = []
        seen.clear()
        at_first_step.clear()
        assert run(parse_args(go.argv(*flags)), log=logs.append, on_step=on_step) == 0
        return (at_first_step[0] if at_first_step else Counter(seen)), logs

    go.out, go.seen = out, seen
    go.argv = lambda *flags: tiny_argv(trainer_tiny, out, "--max-steps", "3", "--save-interval", "1000", *flags)
    return go


def test_auto_start_hashes_the_newest_once(start):
    seen, logs = start()
    assert seen == {"step-00000002": 1}, seen  # step 1 is never read
    assert any("resumed from" in s and "step-00000002" in s for s in logs)


def test_broken_newest_hashed_once_moved_aside_and_the_one_below_resumed(start):
    weights = start.out / "checkpoints" / "step-00000002" / contract.WEIGHTS
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size: only the sha256 finds it
    weights.write_bytes(bytes(data))
    seen, logs = start()
    assert seen == {"step-00000002": 1, "step-00000001": 1}, seen
    aside = start.out / "checkpoints" / "step-00000002.corrupt-1"
    assert (aside / contract.WEIGHTS).read_bytes() == bytes(data)  # kept, never deleted
    assert any("resumed from" in s and "step-00000001" in s for s in logs)


def test_explicit_resume_hashed_once_and_still_verified(start):
    newest = start.out / "checkpoints" / "step-00000002"
    seen, logs = start("--resume", str(newest))
    assert seen == {"step-00000002": 1}, seen
    assert any("resumed from" in s and "step-00000002" in s for s in logs)
    one = start.out / "checkpoints" / "step-00000001"
    seen, logs = start("--resume", str(one), fresh=True)
    # the newest is still verified (once) at a start: a broken one is moved aside whatever --resume says
    assert seen == {"step-00000001": 1, "step-00000002": 1}, seen
    assert any("resumed from" in s and "step-00000001" in s for s in logs)
    state = one / contract.STATE
    data = bytearray(state.read_bytes())
    data[-1] ^= 0xFF
    state.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match="not a complete checkpoint.*sha256 differs"):
        start("--resume", str(one))


def test_check_reports_the_broken_newest_and_hashes_each_once(start):
    weights = start.out / "checkpoints" / "step-00000002" / contract.WEIGHTS
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    logs = []
    assert run(parse_args(start.argv("--check")), log=logs.append) == 0
    assert start.seen == {"step-00000002": 1, "step-00000001": 1}, start.seen
    warn = [s for s in logs if "WARNING checkpoint" in s]
    assert len(warn) == 1 and "step-00000002" in warn[0] and "sha256 differs" in warn[0]
    assert "step-00000002.corrupt-1 (kept, never deleted)" in warn[0]
    assert any("checkpoints: resumes from" in s and "step-00000001" in s for s in logs)
    assert weights.is_file()  # --check moves nothing
