"""The host work of a micro-batch prepared ahead (while the previous one runs) trains exactly as
preparing it in-line: same anchors, same noise (one generator, consumed in the same order), same
steps; and the sequence of micro-batches is the one `upcoming` gives, at any rank."""

import json

import pytest
import torch
from flashfleet_trainer.config import parse_args
from flashfleet_trainer.launch import run
from flashfleet_trainer.trainer import Prepared, Rank, Trainer
from safetensors.torch import load_file

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PREPARE, TO_DEVICE = Trainer.prepare, Prepared.to_device  # the real ones, whatever a test patched before
COMPARED = ("loss", "ce", "kl", "grad_norm", "acc", "accept_proxy", "rows", "target_tokens", "epoch", "noise")


def _train(argv, out, monkeypatch, ahead):
    monkeypatch.setattr(Trainer, "PREPARE_AHEAD", ahead)
    keys, queued = [], []  # every micro-batch prepare() built, in order; those queued on the device ahead
    real, real_to_device = PREPARE, TO_DEVICE

    def spy(self, epoch, index, idx):
        keys.append((epoch, index))
        return real(self, epoch, index, idx)

    def spy_to_device(self, device):
        queued.append(self.key)
        return real_to_device(self, device)

    monkeypatch.setattr(Trainer, "prepare", spy)
    monkeypatch.setattr(Prepared, "to_device", spy_to_device)
    assert run(parse_args(argv(out=out)), log=lambda s: None) == 0
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    weights = load_file(str(out / "checkpoints" / "step-00000004" / "drafter.safetensors"))
    return [{k: r.get(k) for k in COMPARED} for r in recs], keys, weights, queued


@pytest.mark.parametrize("device", ["cpu", pytest.param("0", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA: the flex attention queued on the device ahead"))])
def test_prepared_ahead_steps_equal_the_inline_ones(device, trainer_argv, tmp_path, monkeypatch):
    # noise on (tiny_argv), soft labels: the generator feeds the anchors and then the noise
    argv = lambda out: trainer_argv("--max-steps", "4", "--grad-accum", "2", "--save-interval", "100",  # noqa: E731
                                    "--use-soft-labels", "--loss-weighting", "streak",
                                    "--target-gpus", device, "--drafter-gpus", device, out=out)
    inline, k_inline, w_inline, q_inline = _train(argv, tmp_path / "inline", monkeypatch, ahead=False)
    ahead, k_ahead, w_ahead, q_ahead = _train(argv, tmp_path / "ahead", monkeypatch, ahead=True)
    assert len(inline) == 4
    if device == "cpu":
        assert ahead == inline  # exactly: the same floats
        for k in w_inline:
            assert torch.equal(w_inline[k], w_ahead[k]), k
    else:  # the same kernels on the same inputs; the attention only built at another moment
        for a, b in zip(ahead, inline, strict=True):
            assert a.keys() == b.keys() and all(
                a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6) for k in a if isinstance(a[k], float)), (a, b)
        for k in w_inline:
            torch.testing.assert_close(w_ahead[k], w_inline[k], rtol=1e-4, atol=1e-6)
    # each micro-batch was prepared once, ahead of it (the last one ahead of a step never taken)
    assert len(k_inline) == 8 and len(set(k_inline)) == 8
    assert k_ahead[:-1] == k_inline and len(k_ahead) == 9
    # on CUDA every micro-batch prepared ahead (all but the first) had its attention queued then
    assert q_inline == [] and q_ahead == (k_ahead[1:] if device != "cpu" else []), (q_inline, q_ahead, k_ahead)


@pytest.mark.parametrize("rank,world", [(0, 1), (0, 2), (1, 2), (2, 3)])
def test_looking_ahead_keeps_the_sequence_and_finds_this_ranks_next(rank, world, monkeypatch):
    t = Trainer.__new__(Trainer)
    t.r, t.prepared, t.dev = Rank(rank=rank, world=world), None, "cpu"
    t.upcoming = iter([(0, i, [i]) for i in range(40)])
    import collections

    t.ahead = collections.deque()
    monkeypatch.setattr(Trainer, "prepare", lambda self, e, i, idx: (e, i))
    seen = []
    for g in range(30):
        item = t.next_micro_batch()
        seen.append(item[1])
        if g % world == rank:
            assert t.prepared in (None, (0, g))  # what was prepared ahead is this micro-batch
            t.prepare_next(g)
            assert t.prepared == (0, g + world)  # this rank's next one
    assert seen == list(range(30))
