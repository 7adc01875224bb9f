"""A step launched before the previous one is read (Trainer.LAUNCH_AHEAD) trains exactly as one
step at a time: the same records and weights; steps that are saved or evaluated, the last step and
a stop drain the queue first, so a checkpoint holds the weights of its own step."""

import json

import pytest
import torch
from flashfleet_trainer.config import parse_args
from flashfleet_trainer.launch import run
from flashfleet_trainer.trainer import Trainer
from safetensors.torch import load_file

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LAUNCH, READ = Trainer.launch_step, Trainer.read_step  # the real ones, whatever a test patched before
COMPARED = ("step", "loss", "ce", "kl", "grad_norm", "acc", "accept_proxy", "rows", "target_tokens", "epoch", "lr",
            "noise")


def _train(argv, out, monkeypatch, ahead, on_step=None):
    monkeypatch.setattr(Trainer, "LAUNCH_AHEAD", ahead)
    order = []  # ("launch", n) / ("read", n) as they happened

    def launch(self):
        s = LAUNCH(self)
        order.append(("launch", s.step))
        return s

    def read(self, s):
        order.append(("read", s.step))
        return READ(self, s)

    monkeypatch.setattr(Trainer, "launch_step", launch)
    monkeypatch.setattr(Trainer, "read_step", read)
    assert run(parse_args(argv(out=out)), log=lambda s: None, on_step=on_step) == 0
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    saved = {p.name: load_file(str(p / "drafter.safetensors")) for p in sorted((out / "checkpoints").glob("step-*"))}
    return [{k: r.get(k) for k in COMPARED} for r in recs], saved, order


@pytest.mark.parametrize("device", ["cpu", pytest.param("0", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA: where launching ahead is on by default"))])
def test_steps_launched_ahead_equal_one_at_a_time(device, trainer_argv, tmp_path, monkeypatch):
    argv = lambda out: trainer_argv("--max-steps", "7", "--grad-accum", "2", "--save-interval", "3",  # noqa: E731
                                    "--use-soft-labels", "--loss-weighting", "streak",
                                    "--target-gpus", device, "--drafter-gpus", device, out=out)
    one, saved_one, order_one = _train(argv, tmp_path / "one", monkeypatch, ahead=False)
    ahead, saved_ahead, order = _train(argv, tmp_path / "ahead", monkeypatch, ahead=True)
    assert [r["step"] for r in one] == list(range(1, 8))
    assert order_one == [(w, n) for n in range(1, 8) for w in ("launch", "read")]
    # Step n+1 queued before step n is read, except after the saved steps 3 and 6 and the last, 7.
    assert order == [("launch", 1), ("launch", 2), ("read", 1), ("launch", 3), ("read", 2), ("read", 3),
                     ("launch", 4), ("launch", 5), ("read", 4), ("launch", 6), ("read", 5), ("read", 6),
                     ("launch", 7), ("read", 7)], order
    assert sorted(saved_ahead) == sorted(saved_one) == ["step-00000003", "step-00000006", "step-00000007"]
    if device == "cpu":
        assert ahead == one  # exactly: the same floats
        for name in saved_one:
            for k in saved_one[name]:
                assert torch.equal(saved_ahead[name][k], saved_one[name][k]), (name, k)
    else:  # the same kernels on the same inputs, queued at another moment
        for a, b in zip(ahead, one, strict=True):
            assert a.keys() == b.keys() and all(
                a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6) for k in a if isinstance(a[k], float)), (a, b)
        for name in saved_one:
            for k in saved_one[name]:
                torch.testing.assert_close(saved_ahead[name][k], saved_one[name][k], rtol=1e-4, atol=1e-6)


def test_a_stop_finishes_the_queued_step_and_saves_it(trainer_argv, tmp_path, monkeypatch):
    """SIGTERM's path while step 3 is already queued behind step 2: step 3 runs, is read and saved;
    nothing is launched after it, and the run ends as stopped."""
    argv = lambda out: trainer_argv("--max-steps", "6", "--save-interval", "100", out=out)  # noqa: E731

    def stop_at_2(trainer):
        if trainer.step == 3:  # step 2 is being read, 3 queued
            trainer.request_stop()

    recs, saved, order = _train(argv, tmp_path / "run", monkeypatch, ahead=True, on_step=stop_at_2)
    assert order[-3:] == [("launch", 3), ("read", 2), ("read", 3)], order
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert list(saved) == ["step-00000003"]
    st = json.loads((tmp_path / "run" / "status.json").read_text())
    assert st["phase"] == "stopped" and st["step"] == 3
