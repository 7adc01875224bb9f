"""bench_drafter --prefetch: each step gets the micro-batch (anchors, blocks, layouts) it would have built itself;
launching ahead (the default), step n+1 is queued before step n is read, and every step is read once, in order.

The prefetch builds step n+1's host work right after step n is launched, while it runs; the bench's numbers
are comparable with and without it only if the steps see the same micro-batches. The GPU step is
stubbed out (it needs a real-shape drafter); the host work is the real one.
"""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.benchmarks.bench_drafter import Bench


def _bench(prefetch, launch_ahead=True):
    b = Bench.__new__(Bench)  # no drafter, no GPU tensors: only what the host work reads
    b.a = SimpleNamespace(prefetch=prefetch, launch_ahead=launch_ahead, anchors=12, block_size=4, seq_len=70)
    b.dev, b.attn_impl = "cpu", "flex"
    rng = np.random.default_rng(0)
    b.tokens = [rng.integers(0, 90, size=n) for n in (50, 70)]
    b.masks = [np.ones(len(t), dtype=np.int64) for t in b.tokens]
    b.cfg = SimpleNamespace(mask_token_id=99, layer_types=["sliding_attention", "full_attention"], sliding_window=8)
    return b


@pytest.mark.parametrize("prefetch,launch_ahead", [(True, True), (False, True), (True, False)])
def test_steps_get_their_own_micro_batches(prefetch, launch_ahead):
    b = _bench(prefetch, launch_ahead)
    seen, order = [], []

    def launch(i, region=None, prepared=None):
        assert (prepared is not None) == prefetch
        p = prepared if prepared is not None else b.prepare(i)
        seen.append((i, p.gen.initial_seed(), p))
        order.append(("launch", i))
        return i

    def read(i):
        order.append(("read", i))
        return i, 0.0, 0.0, 0.0

    b.launch, b.read = launch, read
    res = b.steps(5, 4)
    assert [i for i, _, _ in seen] == [5, 6, 7, 8] and [r[0] for r in res] == [5, 6, 7, 8]
    if launch_ahead:
        assert order == [("launch", 5), ("launch", 6), ("read", 5), ("launch", 7), ("read", 6), ("launch", 8),
                         ("read", 7), ("read", 8)], order
    else:
        assert order == [(w, i) for i in range(5, 9) for w in ("launch", "read")], order
    for i, seed, p in seen:
        want = _bench(False).prepare(i)
        assert seed == 1000 + i
        assert torch.equal(p.blocks.input_ids, want.blocks.input_ids) and torch.equal(p.blocks.anchor, want.blocks.anchor)
        # what the trainer prepares too: a layout per layer type of these blocks, the teacher's positions
        assert set(p.layouts) == {"sliding_attention", "full_attention"}
        assert all(torch.equal(p.layouts[t]["lo"], want.layouts[t]["lo"]) for t in p.layouts)
        assert torch.equal(p.tpos, want.tpos) and int(p.tpos.max()) <= b.a.seq_len - 1
    # different steps draw different anchors (the prefetch does not hand one step's batch to the next)
    assert not torch.equal(seen[0][2].blocks.anchor, seen[1][2].blocks.anchor)
