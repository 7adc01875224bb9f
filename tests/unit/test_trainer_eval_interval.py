"""--eval-interval: tau on held-out prompts every N optimizer steps, into metrics.jsonl (contract keys)."""

import pytest
from flashfleet.contract import metrics as contract
from flashfleet_trainer.cli import main as train_main
from flashfleet_trainer.config import EX_CONFIG
from flashfleet_trainer.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_interval_evaluations_land_in_metrics(trainer_argv, tmp_path, capsys, monkeypatch):
    """Every 2 steps of 6, with a time budget so small that the one at step 4 is deferred (the first
    runs: nothing has been spent yet); the final evaluation at step 6 as before."""
    monkeypatch.setattr(Trainer, "EVAL_BUDGET", 1e-9)
    out = tmp_path / "run"
    argv = trainer_argv("--max-steps", "6", "--eval-interval", "2", "--eval-interval-prompts", "1",
                        "--eval-max-new-tokens", "4", "--resume", "never", out=out)
    argv[argv.index("--eval-num-prompts") + 1] = "2"
    assert train_main(argv) == 0
    recs = contract.read(out / "metrics.jsonl")
    evals = [r for r in recs if not contract.is_step(r)]
    assert [(r["step"], r["eval"], r["prompts"]) for r in evals] == [(2, "interval", 1), (6, "final", 2)]
    for r in evals:
        assert set(contract.EVAL_KEYS) <= set(r)
        assert r[contract.TAU] == r["tau_pooled"] == r["tokens"] / r["cycles"] and r["cached"] is True
        assert len(r["accept_rate"]) == 3 and r["eval_s"] > 0
    assert [r["step"] for r in recs if contract.is_step(r)] == [1, 2, 3, 4, 5, 6]  # training went on around it
    printed = capsys.readouterr().out
    assert "interval evaluation at step 2: tau_pooled" in printed
    assert "interval evaluation at step 4 deferred: evaluations used" in printed


def test_eval_interval_range_is_checked(trainer_argv, capsys):
    assert train_main(trainer_argv("--eval-interval", "-1", "--check")) == EX_CONFIG
    assert "--eval-interval -1: must be >= 0" in capsys.readouterr().err
