"""Labels, the strict block mask, packing, anchors and the data schema."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from flashfleet_trainer.attention import block_attention_inputs
from flashfleet_trainer.data import (
    anchor_candidates,
    build_blocks,
    check_schema,
    pack_epoch,
    sample_anchors,
    spread_anchors,
)
from flashfleet_trainer.drafter import DFlashDrafter, DrafterConfig, drafter_hidden
from flashfleet_trainer.errors import ConfigError
from flashfleet_trainer.loss import IGNORE
from flashfleet_trainer.target import default_target_layers, layer_ids_problem

MASK = 99


def test_labels_are_the_token_at_anchor_plus_k_and_supervised():
    x = np.arange(100, 112)  # token at position p is 100 + p
    m = np.array([0, 0, 0, 1, 1, 1, 1, 1, 0, 1, 1, 1])
    b = build_blocks([x], [m], [np.array([3, 9])], block_size=4, mask_token_id=MASK)
    # block at anchor 3: positions 3,4,5,6 -> input [103, M, M, M], labels [-, 104, 105, 106]
    assert b.input_ids[0].tolist() == [103, MASK, MASK, MASK]
    assert b.labels[0].tolist() == [IGNORE, 104, 105, 106]
    # anchor 9: positions 10, 11 exist and are supervised, 12 is past the end
    assert b.labels[1].tolist() == [IGNORE, 110, 111, IGNORE]
    # the teacher distribution for label k comes from position anchor + k - 1
    assert b.teacher_pos[0].tolist() == [3, 3, 4, 5]
    b2 = build_blocks([x], [m], [np.array([5])], block_size=5, mask_token_id=MASK)
    assert b2.labels[0].tolist() == [IGNORE, 106, 107, IGNORE, 109]  # position 8 is not supervised


def test_anchor_candidates_need_supervised_anchor_and_next_token():
    m = np.array([0, 1, 1, 1, 0, 1, 1, 0, 1])
    assert anchor_candidates(m).tolist() == [1, 2, 5]


def test_mask_is_strictly_before_anchor_and_block_local():
    seq = torch.tensor([0, 0, 1])
    anchor = torch.tensor([2, 5, 3])
    ctx_seq, ctx_pos, block_pos, mask = block_attention_inputs(seq, anchor, 3)
    t = len(ctx_seq)
    assert block_pos.tolist() == [2, 3, 4, 5, 6, 7, 3, 4, 5]
    for row in range(9):
        j = row // 3
        seen = {(int(ctx_seq[c]), int(ctx_pos[c])) for c in range(t) if mask[row, c]}
        assert seen == {(int(seq[j]), p) for p in range(int(anchor[j]))}  # kv < anchor, own sequence only
        blocks_seen = {(c - t) // 3 for c in range(t, t + 9) if mask[row, c]}
        assert blocks_seen == {j}
        assert mask[row, t + 3 * j: t + 3 * j + 3].all()  # bidirectional inside the block


def _tiny_drafter():
    cfg = DrafterConfig(hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1,
                        head_dim=8, num_hidden_layers=1, target_layer_ids=[0, 1], block_size=4, mask_token_id=3,
                        vocab_size=20)
    torch.manual_seed(0)
    return DFlashDrafter(cfg).eval(), torch.randn(20, 16)


def test_drafter_sees_anchor_minus_one_but_not_anchor():
    """Functional off-by-one check: features at the anchor and after must not matter, at anchor-1 must."""
    drafter, embed = _tiny_drafter()
    x = np.arange(10) % 20
    blocks = build_blocks([x], [np.ones(10)], [np.array([5])], 4, 3)
    feats = torch.randn(1, 10, 32)
    with torch.no_grad():
        base = drafter_hidden(drafter, embed, feats, blocks)
        later = feats.clone()
        later[0, 5:] += 10.0
        assert torch.allclose(base, drafter_hidden(drafter, embed, later, blocks), atol=1e-6)
        before = feats.clone()
        before[0, 4] += 10.0
        assert not torch.allclose(base, drafter_hidden(drafter, embed, before, blocks), atol=1e-3)


def test_blocks_do_not_see_each_other():
    drafter, embed = _tiny_drafter()
    x = np.arange(12) % 20
    feats = torch.randn(1, 12, 32)
    with torch.no_grad():
        both = drafter_hidden(drafter, embed, feats, build_blocks([x], [np.ones(12)], [np.array([2, 7])], 4, 3))
        alone = drafter_hidden(drafter, embed, feats, build_blocks([x], [np.ones(12)], [np.array([7])], 4, 3))
    assert torch.allclose(both[1], alone[0], atol=1e-5)


def test_default_target_layers():
    assert default_target_layers(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layers(64, 5) == [1, 16, 31, 46, 61]  # Qwen3.6-27B: as before the rule
    assert default_target_layers(4, 1) == [2]
    assert default_target_layers(4, 2) == [1, 2]  # was [1, 1]: vLLM refuses that drafter at its first request
    for n_layers in range(2, 80):
        for n_draft in range(1, 9):
            try:
                ids = default_target_layers(n_layers, n_draft)
            except ValueError as e:
                assert n_draft > n_layers - 1 and "too shallow" in str(e), (n_layers, n_draft)
                continue
            assert len(ids) == n_draft and layer_ids_problem(ids) is None, (n_layers, n_draft, ids)
            assert 0 <= ids[0] and ids[-1] <= n_layers - 1, (n_layers, n_draft, ids)
    assert "not strictly ascending" in layer_ids_problem([2, 1]) and layer_ids_problem([1, 1])


def test_packing_respects_budget_and_batch_size_and_covers_each_sequence_once():
    lengths = np.array([5, 9, 3, 7, 7, 2, 10, 1, 6])
    batches = pack_epoch(lengths, seed=1, epoch=0, token_budget=12, max_batch_size=3)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(len(lengths)))
    for b in batches:
        assert len(b) <= 3 and lengths[b].sum() <= 12
    assert batches == pack_epoch(lengths, seed=1, epoch=0, token_budget=12, max_batch_size=3)
    assert batches != pack_epoch(lengths, seed=1, epoch=1, token_budget=12, max_batch_size=3)


def test_anchor_spread_and_sampling():
    assert spread_anchors([10, 30, 0], 8) == [2, 6, 0]
    assert spread_anchors([1, 2], 8) == [1, 2]  # everything fits: take all
    assert sum(spread_anchors([3, 3, 3], 4)) == 4
    masks = [np.array([0, 0, 1, 1, 1, 1, 1, 1, 1, 1]), np.array([1] * 30), np.zeros(6)]
    anchors = sample_anchors(masks, 12, torch.Generator().manual_seed(0))
    assert sum(len(a) for a in anchors) == 12 and len(anchors[2]) == 0
    for a, m in zip(anchors, masks, strict=True):
        assert list(a) == sorted(set(a.tolist()))  # sorted, without replacement
        assert all(m[p] == 1 and m[p + 1] == 1 for p in a)
    assert len(anchors[1]) > len(anchors[0])  # spread by supervised length


def test_schema_check_rejects_text_and_accepts_ids(tmp_path):
    pq.write_table(pa.table({"input_ids": [[1, 2, 3]], "loss_mask": [[0, 1, 1]]}), tmp_path / "a.parquet")
    assert check_schema(tmp_path)[1] == 1
    bad = tmp_path / "bad"
    bad.mkdir()
    pq.write_table(pa.table({"text": ["hello"]}), bad / "a.parquet")
    with pytest.raises(ConfigError, match="input_ids"):
        check_schema(bad)
