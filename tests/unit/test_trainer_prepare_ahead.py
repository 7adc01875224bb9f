"""The host work of a micro-batch prepared ahead (while the previous one runs) trains exactly as
preparing it in-line: same anchors, same noise (one generator, consumed in the same order), same
steps; and the sequence of micro-batches is the one `upcoming` gives, at any rank."""

import json

import pytest
import torch
from flashfleet_trainer.config import parse_args
from flashfleet_trainer.launch import run
from flashfleet_trainer.trainer import Rank, Trainer
from safetensors.torch import load_file

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PREPARE = Trainer.prepare
COMPARED = ("loss", "ce", "kl", "grad_norm", "acc", "accept_proxy", "rows", "target_tokens", "epoch", "noise")


def _train(argv, out, monkeypatch, ahead):
    monkeypatch.setattr(Trainer, "PREPARE_AHEAD", ahead)
    keys = []  # every micro-batch prepare() built, in order
    real = PREPARE

    def spy(self, epoch, index, idx):
        keys.append((epoch, index))
        return real(self, epoch, index, idx)

    monkeypatch.setattr(Trainer, "prepare", spy)
    assert run(parse_args(argv(out=out)), log=lambda s: None) == 0
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: r.get(k) for k in COMPARED} for r in recs], keys, load_file(str(out / "checkpoints" / "step-00000004" / "drafter.safetensors"))


def test_prepared_ahead_steps_equal_the_inline_ones(trainer_argv, tmp_path, monkeypatch):
    # noise on (tiny_argv), soft labels: the generator feeds the anchors and then the noise
    argv = lambda out: trainer_argv("--max-steps", "4", "--grad-accum", "2", "--save-interval", "100",  # noqa: E731
                                    "--use-soft-labels", "--loss-weighting", "streak", out=out)
    inline, k_inline, w_inline = _train(argv, tmp_path / "inline", monkeypatch, ahead=False)
    ahead, k_ahead, w_ahead = _train(argv, tmp_path / "ahead", monkeypatch, ahead=True)
    assert len(inline) == 4
    assert ahead == inline  # exactly: the same floats
    for k in w_inline:
        assert torch.equal(w_inline[k], w_ahead[k]), k
    # each micro-batch was prepared once, ahead of it (the last one ahead of a step never taken)
    assert len(k_inline) == 8 and len(set(k_inline)) == 8
    assert k_ahead[:-1] == k_inline and len(k_ahead) == 9


@pytest.mark.parametrize("rank,world", [(0, 1), (0, 2), (1, 2), (2, 3)])
def test_looking_ahead_keeps_the_sequence_and_finds_this_ranks_next(rank, world, monkeypatch):
    t = Trainer.__new__(Trainer)
    t.r, t.prepared = Rank(rank=rank, world=world), None
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
