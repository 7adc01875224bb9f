"""Fixtures of the trainer tests (test_trainer_*.py): tiny target + data built once per session."""

import pytest


@pytest.fixture(scope="session")
def trainer_tiny(tmp_path_factory):
    """A tiny Qwen3 target and data sampled from it (seconds on 2 cores), shared by trainer tests."""
    from flashfleet_trainer.tiny import build

    out = tmp_path_factory.mktemp("tiny")
    build(out, seed=0, vocab=128, hidden=64, layers=4, steps=30, num_seqs=48, prompt_len=8, completion_len=24,
          num_eval=3, log=lambda s: None)
    return out


def tiny_argv(tiny, out, *extra) -> list[str]:
    """A small, fast dflash-train argv for the tiny assets at `tiny`, writing to `out` (extra flags appended)."""
    return ["--target-model", str(tiny / "model"), "--data-dir", str(tiny / "data"),
            "--output-dir", str(out), "--target-gpus", "cpu", "--drafter-gpus", "cpu",
            "--block-size", "4", "--num-draft-layers", "1", "--token-budget", "256", "--max-seq-len", "32",
            "--max-batch-size", "8", "--max-anchors", "16", "--lr", "1e-3", "--warmup-ratio", "0.1",
            "--noise-start", "0.1", "--noise-end", "0.01", "--eval-num-prompts", "0", *extra]


@pytest.fixture
def trainer_argv(trainer_tiny, tmp_path):
    """A function returning a small, fast dflash-train argv for the tiny assets (extra flags appended)."""

    def argv(*extra, out=None):
        return tiny_argv(trainer_tiny, out or tmp_path / "run", *extra)
    return argv


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models in one torch thread: a second only adds synchronization (~10x slower on a busy
    two-core machine). Use with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
