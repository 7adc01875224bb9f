"""A drafter exported by dflash-export, served by vLLM itself (its CPU build, `make vllm-venv`,
through flashfleet_trainer.vllm_serve_check): what a user serving it sees must be what the
project's evaluator measured. vLLM's greedy output equals the target's own (the evaluator's output
is the target's greedy output, speculation being lossless), vLLM's mean acceptance length equals
dflash-eval's tau on the same prompts within 2%. (An untrained drafter accepted about never, and a
DFlash drafter served beside DFlash 2 ones: tests/unit/test_vllm_serve_dflash2.py, in its engine starts.)

The drafter has two draft layers on the 4-layer target with the default target layers, which were
[1, 1] before vLLM's rule was the trainer's (vLLM refused that drafter at its first request)."""

import json

import pytest
import torch
from flashfleet_trainer import export
from flashfleet_trainer.cli import main as train_main
from flashfleet_trainer.evaluate import load_exported_drafter, load_prompts, speculative_tau
from flashfleet_trainer.target import HiddenStateProducer

from tests.vllm_server import collect_here, need_vllm

pytestmark = pytest.mark.slow
MAX_NEW = 16
PROMPTS = 6


def _train_and_export(tiny, root, name, *extra):
    argv = ["--target-model", str(tiny / "model"), "--data-dir", str(tiny / "data"), "--output-dir",
            str(root / name), "--target-gpus", "cpu", "--drafter-gpus", "cpu", "--block-size", "4",
            "--num-draft-layers", "2", "--token-budget", "256", "--max-seq-len", "32", "--max-batch-size", "8",
            "--max-anchors", "16", "--warmup-ratio", "0.1", "--eval-num-prompts", "0", "--log-interval", "1000",
            *extra]
    assert train_main(argv) == 0
    out = root / f"{name}-export"
    assert export.main([str(root / name), str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def drafters(tmp_path_factory):
    """A target trained until a drafter can learn it (trainer_tiny's is near uniform), with heads of
    32 (vLLM's CPU attention takes no head of 16), and a drafter trained on it."""
    need_vllm()
    from flashfleet_trainer.tiny import build

    root = tmp_path_factory.mktemp("serve")
    tiny = root / "tiny"
    build(tiny, seed=0, vocab=128, hidden=128, layers=4, steps=100, num_seqs=64, prompt_len=8,
          completion_len=24, num_eval=PROMPTS, log=lambda s: None)
    trained = _train_and_export(tiny, root, "trained", "--lr", "3e-3", "--max-steps", "100")
    return tiny, trained


def _evaluator(tiny, drafter_dir, prompts):
    """dflash-eval's figures (tau, each prompt's output) for an exported drafter, in this process."""
    drafter = load_exported_drafter(drafter_dir, tiny / "model")
    producer = HiddenStateProducer(tiny / "model", ["cpu"], drafter.config.target_layer_ids, "cpu")
    trace = []
    res = speculative_tau(producer, drafter, prompts, drafter.config.block_size, MAX_NEW, trace=trace)
    return res["tau"], [t["output"][:MAX_NEW] for t in trace]


def test_vllm_serves_the_export_as_the_evaluator_measured_it(drafters, tmp_path, run_playbook):
    """collect.yml -e export=true -e serve_check=true on a host with vLLM (this machine, local
    connection): the host exports the trained drafter, dflash-eval and vLLM measure it on the run's
    held-out prompts, and both figures come home to serve_check.json and report.html. vLLM's greedy
    outputs are the target's own tokens (this process's evaluator's outputs), and its acceptance
    equals the evaluator's tau within 2% (one vLLM engine start)."""
    torch.set_num_threads(1)
    tiny, trained = drafters
    assert json.loads((trained / "config.json").read_text())["dflash_config"]["target_layer_ids"] == [1, 2]
    prompts = load_prompts(tiny / "data" / "eval" / "prompts.jsonl", PROMPTS)
    tau, outputs = _evaluator(tiny, trained, prompts)
    assert tau > 1.5, tau  # the comparison is about accepted drafts, not only bonus tokens

    r = collect_here(run_playbook, tmp_path, tiny, trained.parent / "trained",
                     run_collect_serve_check_prompts=PROMPTS, run_collect_serve_check_max_new_tokens=MAX_NEW,
                     run_collect_serve_check_dtype="float32")
    run, home = "trained", tmp_path / "runs"
    assert r.rc == 0, r.stdout.read()
    check = json.loads((home / run / "serve_check.json").read_text())
    served = check["vllm"]
    assert served["drafts"] > 0 and served["vllm_version"].startswith("0.32"), served
    assert served["outputs"] == outputs  # greedy and lossless: the target's own tokens
    assert check["dflash_eval"]["tau"] == pytest.approx(tau, rel=1e-6), check  # the export is the run's drafter
    assert served["tau"] == pytest.approx(tau, rel=0.02), (served["tau"], tau)
    report = (home / run / "report.html").read_text()
    assert 'id="serve-check"' in report and f"{served['tau']:.4g}" in report
