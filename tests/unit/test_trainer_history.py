"""One history per run across restarts, on the tiny target (real CPU training): every record
carries its start's invocation, a resume supersedes what the dead start logged after the resumed
checkpoint, the report marks the restart, and wandb (offline, the real package) keeps one run id."""

import json
import re

import pytest
from flashfleet.contract import layout, starts
from flashfleet.contract import metrics as contract
from flashfleet_trainer.config import parse_args
from flashfleet_trainer.errors import ConfigError
from flashfleet_trainer.launch import run


class Crash(RuntimeError):
    pass


def _crash_at(step):
    def on_step(trainer):
        if trainer.step == step:
            raise Crash(f"killed at step {step}")
    return on_step


def _raw(out):
    return [json.loads(x) for x in (out / layout.METRICS).read_text().splitlines()]


def test_resumed_run_has_each_step_once(trainer_argv, tmp_path):
    common = ("--max-steps", "6", "--save-interval", "2")
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert run(parse_args(trainer_argv(*common, out=straight)), log=lambda s: None) == 0
    # dies after step 3 was logged; the newest checkpoint is step 2
    with pytest.raises(Crash):
        run(parse_args(trainer_argv(*common, out=split)), log=lambda s: None, on_step=_crash_at(3))
    assert run(parse_args(trainer_argv(*common, out=split)), log=lambda s: None) == 0

    raw = _raw(split)
    raw_steps = [r["step"] for r in raw if contract.is_step(r)]
    assert raw_steps == [1, 2, 3, 3, 4, 5, 6]  # append-only: the dead start's step 3 is still there
    assert all(isinstance(r[contract.INVOCATION], int) for r in raw)
    history, superseded = contract.read(split / layout.METRICS, superseded=True)
    steps = [r for r in history if contract.is_step(r)]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    assert [r[contract.INVOCATION] for r in steps] == [1, 1, 2, 2, 2, 2]
    assert [(r["step"], r[contract.INVOCATION]) for r in superseded] == [(3, 1)]
    assert contract.read(split / layout.METRICS) == history
    # the kept history is the one an uninterrupted run has (the resumed step 3 replaces the dead one)
    ref = [r["loss"] for r in contract.read(straight / layout.METRICS) if contract.is_step(r)]
    assert [r["loss"] for r in steps] == pytest.approx(ref, rel=1e-5)
    assert contract.restarts(history) == [{contract.INVOCATION: 2, "step": 2}]
    assert starts.read(split / layout.RUN_STATE)[starts.INVOCATION] == 2


def test_supersede_rules():
    def rec(step, inv, **kw):
        return {"step": step, "invocation": inv, **({"loss": 1.0} if not kw else kw)}

    recs = [rec(1, 1), rec(2, 1), rec(3, 1), rec(3, 1, tau=2.0),  # start 1 died after step 3 (checkpoint 1)
            rec(2, 2),  # start 2 resumed from 1 and died before its next save
            rec(3, 3), rec(4, 3), rec(4, 3, tau=2.5),  # start 3 resumed from 2 and finished
            rec(4, 4, tau=2.6)]  # start 4: nothing left to train, evaluated again
    kept, dropped = contract.supersede(recs)
    assert [(r["step"], r["invocation"]) for r in kept if contract.is_step(r)] == [(1, 1), (2, 2), (3, 3), (4, 3)]
    assert [(r["step"], r["invocation"], "tau" in r) for r in dropped] == [
        (2, 1, False), (3, 1, False), (3, 1, True), (4, 3, True)]
    assert [r["tau"] for r in kept if "tau" in r] == [2.6]
    assert contract.restarts(recs) == [{"invocation": 2, "step": 1}, {"invocation": 3, "step": 2}]
    legacy = [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 1.0}]  # a file from before invocations
    assert contract.supersede(legacy) == (legacy, []) and contract.restarts(legacy) == []


def test_damaged_run_state_is_refused_and_kept(trainer_argv, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / layout.RUN_STATE).write_text("{half")
    with pytest.raises(ConfigError, match="run.json"):
        run(parse_args(trainer_argv("--max-steps", "1", out=out)), log=lambda s: None)
    assert (out / layout.RUN_STATE).read_text() == "{half"
    assert not (out / layout.METRICS).exists()


def test_wandb_offline_keeps_one_run_id_across_restarts(trainer_argv, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    out = tmp_path / "run"
    common = ("--max-steps", "4", "--save-interval", "2", "--wandb-project", "flashfleet-test")
    with pytest.raises(Crash):
        run(parse_args(trainer_argv(*common, out=out)), log=lambda s: None, on_step=_crash_at(3))
    first = starts.read(out / layout.RUN_STATE)[starts.WANDB_ID]
    assert run(parse_args(trainer_argv(*common, out=out)), log=lambda s: None) == 0
    assert starts.read(out / layout.RUN_STATE)[starts.WANDB_ID] == first
    runs = sorted((out / layout.WANDB).glob("offline-run-*"))
    assert len(runs) == 2, runs  # one directory per start, both of the one W&B run
    # named offline-run-<time>-<id>, with "-1" after it where both starts fell in the same second
    assert all(re.fullmatch(rf"offline-run-\d{{8}}_\d{{6}}-{re.escape(first)}(-\d+)?", p.name) for p in runs), runs
    assert all((p / f"run-{first}.wandb").is_file() for p in runs)
    # a new run directory of the same name is a new W&B run
    other = tmp_path / "elsewhere" / "run"
    assert run(parse_args(trainer_argv("--max-steps", "1", "--wandb-project", "flashfleet-test", out=other)),
               log=lambda s: None) == 0
    assert starts.read(other / layout.RUN_STATE)[starts.WANDB_ID] != first
