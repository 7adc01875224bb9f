"""--eval-interval: tau on held-out prompts every N optimizer steps, into metrics.jsonl (contract keys)."""

import pytest
from flashfleet.contract import metrics as contract
from flashfleet.contract.messages import EX_CONFIG
from flashfleet_trainer.cli import main as train_main
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


def test_every_tau_is_recorded_with_its_sampling_and_thinking(trainer_argv, tmp_path, capsys, monkeypatch):
    """--eval-temperature/-top-p/-top-k/-thinking reach the evaluation (message prompts rendered
    with the switch by the target's tokenizer, a stand-in here: the tiny target has none) and are
    recorded beside tau: in metrics.jsonl, W&B and the log line."""
    from flashfleet_trainer import evaluate, wandb_compat

    class Tok:  # one id per character; thinking off adds the empty think block
        chat_template = "{% if enable_thinking is false %}<think></think>{% endif %}"

        def apply_chat_template(self, messages, add_generation_prompt, tokenize, enable_thinking):
            text = "".join(m["content"] for m in messages) + ("" if enable_thinking else "<think></think>")
            return [ord(c) % 100 for c in text]

    monkeypatch.setattr(evaluate, "_tokenizer_of", lambda target_model: Tok())
    logged = []
    monkeypatch.setattr(wandb_compat.WandbRun, "log", lambda self, record, step: logged.append(record))
    prompts = tmp_path / "chat.jsonl"
    prompts.write_text('{"messages": [{"role": "user", "content": "a question"}]}\n')
    out = tmp_path / "run"
    argv = trainer_argv("--max-steps", "2", "--eval-interval", "0", "--eval-prompts", str(prompts),
                        "--eval-max-new-tokens", "4", "--eval-temperature", "1", "--eval-top-p", "0.9",
                        "--eval-top-k", "5", "--eval-draft-sample-method", "greedy", "--eval-thinking", "off",
                        "--resume", "never", out=out)
    argv[argv.index("--eval-num-prompts") + 1] = "1"
    assert train_main(argv) == 0
    (rec,) = [r for r in contract.read(out / "metrics.jsonl") if not contract.is_step(r)]
    settings = {"temperature": 1.0, "top_p": 0.9, "top_k": 5, "draft_sample_method": "greedy", "thinking": "off"}
    assert {k: rec[k] for k in contract.EVAL_SETTINGS} == settings and set(contract.EVAL_KEYS) <= set(rec)
    (wb,) = [r for r in logged if "tau_pooled" in r]
    assert (wb["eval_temperature"], wb["eval_top_p"], wb["eval_top_k"], wb["eval_greedy_drafts"],
            wb["eval_thinking"]) == (1.0, 0.9, 5, 1, 0)
    assert "final evaluation at step 2: tau_pooled" in capsys.readouterr().out
    assert contract.settings_label(rec) == "T 1, top-p 0.9, top-k 5, greedy drafts, thinking off"


def test_eval_interval_range_is_checked(trainer_argv, capsys):
    assert train_main(trainer_argv("--eval-interval", "-1", "--check")) == EX_CONFIG
    assert "--eval-interval -1: must be >= 0" in capsys.readouterr().err


def test_interval_evaluations_of_a_multi_process_run(trainer_argv, tmp_path, capfd):
    """One target worker feeding two gloo drafter ranks (the incident's layout, small): the interval
    evaluations run in the worker, with each step's weights, while the ranks train on, and land in
    rank 0's metrics.jsonl before the final one. Budget left at its default: the first evaluation
    always runs (nothing spent yet), and a worker's is counted at its share of the target time."""
    out = tmp_path / "run"
    argv = trainer_argv("--max-steps", "6", "--eval-interval", "2", "--eval-interval-prompts", "1",
                        "--eval-max-new-tokens", "4", "--save-interval", "100", "--target-gpus", "cpu",
                        "--drafter-gpus", "cpu,cpu", out=out)
    argv[argv.index("--eval-num-prompts") + 1] = "1"
    assert train_main(argv) == 0
    recs = contract.read(out / "metrics.jsonl")
    evals = [r for r in recs if not contract.is_step(r)]
    assert evals and evals[0]["step"] == 2 and evals[-1]["eval"] == "final" and evals[-1]["step"] == 6
    interval = [r for r in evals if r["eval"] == "interval"]
    assert interval and all(r["step"] in (2, 4) for r in interval)
    for r in interval:
        assert set(contract.EVAL_KEYS) <= set(r)
        assert r[contract.TAU] == r["tokens"] / r["cycles"] and r["prompts"] == 1 and r["eval_s"] > 0
        assert r[contract.TRAIN_TAU] is not None  # the guard's window: training steps before it
    assert [r["step"] for r in recs if contract.is_step(r)] == [1, 2, 3, 4, 5, 6]
    assert "interval evaluation at step 2: tau_pooled" in capfd.readouterr().out  # rank 0's process


class _ServedElsewhere:
    """The in-process feed seen as a rank sees vLLM's (vllm_target.VllmFeed): features arrive, but
    no replica is in this process to evaluate with, and no worker to hand an evaluation to."""

    def __init__(self, inner):
        self.inner = inner

    def start(self, data, upcoming):
        self.inner.start(data, upcoming)

    def get(self, key, idx):
        return self.inner.get(key, idx)

    def close(self, wait=True):
        self.inner.close(wait)


def test_a_rank_fed_by_servers_borrows_a_replica_for_each_interval_evaluation(trainer_argv, tmp_path, capsys):
    """With the target in vLLM the rank borrows a replica onto its own device for each interval
    evaluation, as the final evaluation does, and lets it go after (mid-run the drafter's device
    holds only what --check counted)."""
    from flashfleet_trainer.config import parse_args
    from flashfleet_trainer.feed import InProcessFeed
    from flashfleet_trainer.preflight import preflight
    from flashfleet_trainer.trainer import run_rank

    out = tmp_path / "run"
    args = parse_args(trainer_argv("--max-steps", "4", "--eval-interval", "2", "--eval-interval-prompts", "1",
                                   "--eval-max-new-tokens", "4", "--save-interval", "100", out=out))
    facts = preflight(args)
    out.mkdir()
    producers = []
    orig = Trainer.interval_eval

    def watch(self, *a):
        orig(self, *a)
        producers.append(self.producer)

    Trainer.interval_eval = watch
    try:
        feed = _ServedElsewhere(InProcessFeed(args, facts, "cpu", lambda s: None))
        assert run_rank(args, facts, log=print, feed=feed) == "completed"
    finally:
        Trainer.interval_eval = orig
    evals = [r for r in contract.read(out / "metrics.jsonl") if not contract.is_step(r)]
    assert [(r["step"], r["eval"]) for r in evals] == [(2, "interval")]
    assert producers == [None]  # released after the evaluation
