"""bench_drafter's FLOP count of a step (`step_flops`) against sums written out by hand on a tiny case."""

import numpy as np
from flashfleet_trainer.data import build_blocks
from flashfleet_trainer.drafter import DrafterConfig
from pytest import approx

from tests.benchmarks.bench_drafter import step_flops


def _cfg(types, window=None):
    return DrafterConfig(hidden_size=8, intermediate_size=12, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                         num_hidden_layers=len(types), target_layer_ids=[0, 1, 2], block_size=4, mask_token_id=9,
                         vocab_size=10, layer_types=types, sliding_window=window)


def _blocks():
    toks = [np.arange(20) % 9, np.arange(30) % 9]
    masks = [np.ones(20, dtype=np.int64), np.ones(30, dtype=np.int64)]
    return build_blocks(toks, masks, [np.array([3, 10]), np.array([6])], 4, 9)


def test_full_attention_counts():
    f = step_flops(_cfg(["full_attention"]), _blocks(), vocab=10)
    rows, t = 3 * 4, 10 + 6  # the context: each sequence up to its last anchor
    layer = 8 * (2 * 2 * 4 + 2 * 1 * 4 + 3 * 12)
    assert f["layers"] * 1e12 == approx(6 * rows * layer)
    assert f["context"] * 1e12 == approx(4 * t * 3 * 8 * 8 + 6 * t * 8 * 2 * 4)
    assert f["loss"] * 1e12 == approx(6 * 3 * 3 * 8 * 10)  # the 3 predicted rows of each block
    seen = sum(4 * (a + 4) for a in (3, 10, 6))  # each row: its context (a entries) and its block (4)
    assert f["attention"] * 1e12 == approx(seen * 2 * 4 * 4 * 3.5)


def test_sliding_window_counts():
    f = step_flops(_cfg(["sliding_attention"], window=5), _blocks(), vocab=10)
    seen = 0
    for a in (3, 10, 6):
        for k in range(4):
            p = a + k
            seen += a - min(max(0, p - 5 + 1), a) + min(k + 1, 5)
    assert f["attention"] * 1e12 == approx(seen * 2 * 4 * 4 * 3.5)
